/*
 * Stand-in request parser for bench/http_epoll.c until
 * examples/http_server/http_parse.{c,h} exists: a GET without a body, keep-alive
 * unless HTTP/1.0 or "Connection: close".
 */
#ifndef HTTP_BENCH_PARSE_H
#define HTTP_BENCH_PARSE_H

#include <stdio.h>
#include <string.h>

#define HB_DONE 0
#define HB_NEED_MORE (-1)
#define HB_MAX_RESPONSE 256
#define HB_BODY "Hello, World!\n"

static inline int hb_parse(const char *p, size_t n, size_t *used, int *keep) {
    const char *end = memmem(p, n, "\r\n\r\n", 4);
    if (!end) return HB_NEED_MORE;
    *used = (size_t)(end + 4 - p);
    if (n < 4 || memcmp(p, "GET ", 4) != 0) return 400;
    const char *eol = memchr(p, '\r', *used);
    *keep = !(eol && eol - p >= 8 && memcmp(eol - 8, "HTTP/1.0", 8) == 0) &&
            !memmem(p, *used, "\r\nConnection: close\r\n", 21);
    return HB_DONE;
}

static inline size_t hb_response(char *out, size_t cap, int status, int keep) {
    int n = snprintf(out, cap, "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n%s\r\n%s", status,
                     status == 200 ? "OK" : "Error", status == 200 ? strlen(HB_BODY) : 0,
                     keep ? "" : "Connection: close\r\n", status == 200 ? HB_BODY : "");
    return n < 0 ? 0 : (size_t)n;
}

#endif
