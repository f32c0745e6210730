/*
 * http_parse.h — an HTTP/1.x request parser over a byte buffer, and the
 * fixed responses of the http_server example (also used by the raw epoll
 * server of bench/, so both send the same bytes for the same requests).
 *
 * The parser never allocates and never copies: it looks at buf[0..len) and
 * says whether a whole request head (request line and headers, up to the
 * empty line) is there. Call it again with more bytes when it needs more;
 * it keeps no state between calls, so a caller buffers the partial head
 * (at most limits.max_head bytes) and parses from its start again. A head
 * comes in few reads in practice, so the rescans cost little.
 *
 * A request body is not part of the head: after HTTP_PARSE_COMPLETE the
 * next req.content_length bytes after the head are the body (skip or read
 * them), then the next request starts. Bodies with Transfer-Encoding
 * (chunked) are refused with 501 Not Implemented.
 *
 * Usage (pipelined requests: parse in a loop while there are bytes):
 *
 *     http_request_t req;
 *     int r = http_parse_request(buf + pos, len - pos, &limits, &req);
 *     if (r == HTTP_PARSE_NEED_MORE) ... read more (head cut at max_head: an error comes);
 *     if (r == HTTP_PARSE_ERROR)     ... answer req.status (http_error_response), close;
 *     if (r == HTTP_PARSE_COMPLETE)  ... pos += req.head_len, skip req.content_length bytes,
 *                                        answer with http_ok_response(...)
 */
#ifndef HTTP_PARSE_H
#define HTTP_PARSE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    HTTP_PARSE_ERROR = -1,   /* bad request: req->status tells the status to answer (then close) */
    HTTP_PARSE_NEED_MORE = 0, /* the head is not complete yet and within the limits */
    HTTP_PARSE_COMPLETE = 1  /* a whole head: req is filled */
};

/* Bounds a parse enforces. A zero field takes the default. */
typedef struct {
    size_t max_head;     /* request line + headers + empty line, bytes (default 8192): 431 past it (414 if the
                          * request line alone is longer) */
    int max_headers;     /* header lines (default 64): 431 past it */
    uint64_t max_body;   /* Content-Length (default 1 MiB): 413 past it */
} http_limits_t;

#define HTTP_DEFAULT_MAX_HEAD 8192
#define HTTP_DEFAULT_MAX_HEADERS 64
#define HTTP_DEFAULT_MAX_BODY (1024u * 1024u)

typedef enum { HTTP_GET, HTTP_HEAD, HTTP_POST, HTTP_OTHER } http_method_t;

/* One parsed request head. The pointers point into the parsed buffer. */
typedef struct {
    http_method_t method;
    const char *method_str; /* the method token as sent */
    size_t method_len;
    const char *target;     /* the request target ("/", "/a?b", "*", an absolute URI) */
    size_t target_len;
    int minor;              /* 1 for HTTP/1.1, 0 for HTTP/1.0 */
    int keep_alive;         /* 1: the connection stays open after the answer (HTTP/1.1 unless "Connection:
                             * close"; HTTP/1.0 only with "Connection: keep-alive") */
    uint64_t content_length; /* body bytes after the head (0 without Content-Length) */
    size_t head_len;        /* bytes of the head, the empty line included (leading empty lines too) */
    int nheaders;
    int status;             /* HTTP_PARSE_ERROR: the status to answer (400, 413, 414, 431, 501, 505) */
} http_request_t;

/* Parses the head at buf[0..len). Returns HTTP_PARSE_COMPLETE (req filled),
 * HTTP_PARSE_NEED_MORE (nothing filled but req->status = 0), or
 * HTTP_PARSE_ERROR with req->status:
 *   400 malformed request line, header line, Content-Length (not digits, two different values), a bare CR,
 *       obsolete line folding, an HTTP/1.1 request without exactly one Host header;
 *   413 Content-Length above limits->max_body;
 *   414 a request line longer than max_head;
 *   431 a head longer than max_head, or more than max_headers header lines;
 *   501 a Transfer-Encoding header (chunked bodies are not supported);
 *   505 a version other than HTTP/1.0 and HTTP/1.1 (HTTP/2.0, HTTP/0.9 style "HTTP/1" is 400).
 * Lines end with CRLF or a bare LF. limits NULL takes the defaults.
 * Thread-safe (no state); never allocates. */
int http_parse_request(const char *buf, size_t len, const http_limits_t *limits, http_request_t *req);

/* The reason phrase of a status this file produces ("OK", "Bad Request",
 * ...; "Error" for others). */
const char *http_reason(int status);

/* The body of every 200 answer. */
#define HTTP_OK_BODY "Hello, World!\n"

/* The 200 answer to a request: status line, Server, Date (now, cached per
 * second per thread), Content-Type, Content-Length, Connection (keep-alive
 * or close) and, unless head_only (a HEAD request), HTTP_OK_BODY. Returns
 * a pointer to thread-local bytes (valid until this thread's next call
 * with another second: copy them before a fiber parks, since it may
 * resume on another thread) and their length in *len (at most
 * HTTP_OK_MAX). Never allocates. */
#define HTTP_OK_MAX 192
const char *http_ok_response(time_t now, int keep_alive, int head_only, size_t *len);

/* Writes the error answer for status (a short text body, "Connection:
 * close") into out (cap bytes; 256 are always enough) and returns its
 * length, or 0 if cap is too small. Never allocates. */
size_t http_error_response(char *out, size_t cap, int status, time_t now);

/* Formats t as an IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT", 29 bytes)
 * into out (30 bytes with the NUL). */
void http_date(char out[30], time_t t);

#ifdef __cplusplus
}
#endif

#endif /* HTTP_PARSE_H */
