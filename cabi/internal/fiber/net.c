/* Server helpers that hold on every platform (include/async.h "Server
 * helpers"): async_sockaddr_parse and async_fiber_read_full, built on
 * async_fiber_read. net_posix.c and io_windows.c have the socket calls. */
#if !defined(_WIN32)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#endif
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "fiber_int.h"

/* The scope of "fe80::1%eth0": an interface name or a number. 0 if unknown. */
static int parse_scope(const char *s, uint32_t *out) {
    if (!*s) return 0;
    char *end = NULL;
    unsigned long v = strtoul(s, &end, 10);
    if (end && *end == '\0' && v <= UINT32_MAX && s[0] >= '0' && s[0] <= '9') {
        *out = (uint32_t)v;
        return 1;
    }
#if !defined(_WIN32)
    unsigned idx = if_nametoindex(s);
    if (idx) {
        *out = idx;
        return 1;
    }
#endif
    return 0;
}

/* An IPv6 text, perhaps in brackets and with a %scope, into a6. 0 if not. */
static int parse_v6(const char *host, struct sockaddr_in6 *a6) {
    char buf[INET6_ADDRSTRLEN + 64];
    size_t n = strlen(host);
    if (n >= sizeof buf) return 0;
    if (host[0] == '[') {
        if (n < 3 || host[n - 1] != ']') return 0;
        memcpy(buf, host + 1, n - 2);
        buf[n - 2] = '\0';
    } else {
        memcpy(buf, host, n + 1);
    }
    char *pct = strchr(buf, '%');
    uint32_t scope = 0;
    if (pct) {
        *pct = '\0';
        if (!parse_scope(pct + 1, &scope)) return 0;
    }
    if (inet_pton(AF_INET6, buf, &a6->sin6_addr) != 1) return 0;
    a6->sin6_scope_id = scope;
    return 1;
}

int async_sockaddr_parse(const char *host, int port, struct sockaddr_storage *out, socklen_t *len) {
    LA_ENTRY(-1);
    if (!out || !len || port < 0 || port > 65535) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    memset(out, 0, sizeof *out);
    struct sockaddr_in *a4 = (struct sockaddr_in *)out;
    if (!host || !*host) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        a4->sin_addr.s_addr = htonl(INADDR_ANY);
        *len = (socklen_t)sizeof *a4;
        return 0;
    }
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *len = (socklen_t)sizeof *a4;
        return 0;
    }
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)out;
    memset(out, 0, sizeof *out);
    if (parse_v6(host, a6)) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *len = (socklen_t)sizeof *a6;
        return 0;
    }
    memset(out, 0, sizeof *out);
    la_set_error(ASYNC_E_INVAL);
    return -1;
}

ssize_t async_fiber_read_full(async_fd_t fd, void *buf, size_t n, size_t *got, int timeout_ms) {
    if (got) *got = 0;
    LA_ENTRY(-1);
    if (la_check_timeout(timeout_ms)) return -1;
    if (n == 0 || !buf) return async_fiber_read(fd, buf, n, timeout_ms); /* its checks and answer */
    /* one deadline for the whole call: each read gets what is left of it */
    uint64_t deadline = la_deadline(timeout_ms);
    size_t done = 0;
    while (done < n) {
        int left = timeout_ms <= 0 ? timeout_ms : la_ms_left(deadline);
        ssize_t r = async_fiber_read(fd, (char *)buf + done, n - done, left);
        if (r < 0) break; /* its error stays recorded */
        if (r == 0) return (ssize_t)done;
        done += (size_t)r;
        if (got) *got = done;
    }
    if (done == n) return (ssize_t)n;
    return -1;
}
