/*
 * test_http_server — tests of the http_server example and its parser.
 *
 * usage: test_http_server CASE PATH-TO-http_server
 *
 * Each case but "parse" starts the server as a child process on a free
 * port of 127.0.0.1 and talks to it over loopback with plain blocking
 * sockets; the server is stopped with SIGTERM and must exit 0. Timing
 * checks are only semantic bounds (a timeout never fires early; a stop
 * ends within its drain bound plus a generous margin). Exit 77: skipped.
 */
#include "../console_worker/child.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <strings.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "http_parse.h"

#ifdef HTTP_SERVER_TLS
#include <openssl/pem.h>

#include "fiber_tls.h"
#endif

#define WAIT_MS 20000
#define SKIP 77

static const char *g_server;
static struct child g_child;
static unsigned g_port;

/* ---------------------------------------------------------------------- */
/* The server process                                                      */
/* ---------------------------------------------------------------------- */

/* A failed case must not leave the server running. */
static void kill_server(void)
{
    if (g_child.pid > 0 && !g_child.reaped)
        kill(g_child.pid, SIGKILL);
}

/* Starts the server with the extra options (NULL-terminated). */
static void server_up(const char *opt, ...)
{
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)g_server;
    argv[n++] = "--port";
    argv[n++] = "0";
    va_list ap;
    va_start(ap, opt);
    for (const char *o = opt; o && n < 31; o = va_arg(ap, const char *))
        argv[n++] = (char *)o;
    va_end(ap);
    argv[n] = NULL;
    child_start(&g_child, argv, CHILD_PIPE, NULL);
    g_port = child_port(&g_child);
}

/* SIGTERM, then the server must exit 0 within timeout_ms. */
static void server_down(int timeout_ms)
{
    REQUIRE(kill(g_child.pid, SIGTERM) == 0);
    child_require_clean_exit(&g_child, timeout_ms);
    child_free(&g_child);
}

/* ---------------------------------------------------------------------- */
/* A client connection                                                     */
/* ---------------------------------------------------------------------- */

struct cl {
    int fd;
    void *tls; /* fiber_tls_t * for HTTPS (used on this plain thread) */
    size_t len;
    char buf[1 << 16];
};

struct resp {
    int status;
    int close;  /* "Connection: close" */
    long clen;  /* Content-Length, -1 without */
    char body[256];
};

/* rcvbuf: SO_RCVBUF before the connect (it bounds the window); 0 leaves the default. */
static int cl_connect_rcvbuf(int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    if (rcvbuf > 0)
        REQUIRE(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) == 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    struct timeval tv = {WAIT_MS / 1000, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int cl_connect_raw(void)
{
    return cl_connect_rcvbuf(0);
}

static struct cl *cl_open(void)
{
    struct cl *c = calloc(1, sizeof *c);
    REQUIRE(c != NULL);
    c->fd = cl_connect_raw();
    if (c->fd < 0)
        FAIL("connect to port %u: %s", g_port, strerror(errno));
    return c;
}

static void cl_close(struct cl *c)
{
    close(c->fd);
    free(c);
}

static void send_bytes(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            FAIL("send: %s", strerror(errno));
        p += w;
        n -= (size_t)w;
    }
}

static void cl_send(struct cl *c, const char *s)
{
#ifdef HTTP_SERVER_TLS
    if (c->tls) {
        REQUIRE(fiber_tls_write(c->tls, s, strlen(s), WAIT_MS) == (ssize_t)strlen(s));
        return;
    }
#endif
    send_bytes(c->fd, s, strlen(s));
}

/* Reads more into c->buf; false at end of stream (or a reset). */
static bool cl_fill(struct cl *c)
{
    REQUIRE(c->len < sizeof c->buf);
#ifdef HTTP_SERVER_TLS
    if (c->tls) {
        ssize_t n = fiber_tls_read(c->tls, c->buf + c->len, sizeof c->buf - c->len, WAIT_MS);
        if (n < 0 && fiber_tls_error(c->tls) == ASYNC_E_TIMEDOUT)
            FAIL("no answer within %d ms", WAIT_MS);
        if (n <= 0)
            return false;
        c->len += (size_t)n;
        return true;
    }
#endif
    for (;;) {
        ssize_t n = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            FAIL("no answer within %d ms", WAIT_MS);
        if (n <= 0)
            return false;
        c->len += (size_t)n;
        return true;
    }
}

static void cl_consume(struct cl *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
}

/* Reads one response (no body if head_only); false at end of stream before
 * its first byte. */
static bool cl_response(struct cl *c, struct resp *r, bool head_only)
{
    memset(r, 0, sizeof *r);
    r->clen = -1;
    char *end;
    for (;;) {
        c->buf[c->len < sizeof c->buf ? c->len : sizeof c->buf - 1] = '\0';
        if ((end = memmem(c->buf, c->len, "\r\n\r\n", 4)))
            break;
        if (!cl_fill(c)) {
            if (c->len == 0)
                return false;
            FAIL("end of stream inside a response head: %.*s", (int)c->len, c->buf);
        }
    }
    size_t head = (size_t)(end - c->buf) + 4;
    REQUIRE(sscanf(c->buf, "HTTP/1.1 %d ", &r->status) == 1);
    for (char *l = strstr(c->buf, "\r\n") + 2; l < end; l = strstr(l, "\r\n") + 2) {
        if (strncasecmp(l, "Content-Length:", 15) == 0)
            r->clen = strtol(l + 15, NULL, 10);
        if (strncasecmp(l, "Connection: close\r\n", 19) == 0)
            r->close = 1;
    }
    cl_consume(c, head);
    REQUIRE(r->clen >= 0 && r->clen < (long)sizeof r->body);
    if (head_only)
        return true;
    while (c->len < (size_t)r->clen)
        if (!cl_fill(c))
            FAIL("end of stream inside a body");
    memcpy(r->body, c->buf, (size_t)r->clen);
    cl_consume(c, (size_t)r->clen);
    return true;
}

/* The next response must have this status (and be a 200 "Hello"). */
static struct resp cl_expect(struct cl *c, int status, bool head_only)
{
    struct resp r;
    if (!cl_response(c, &r, head_only))
        FAIL("connection closed, %d expected", status);
    if (r.status != status)
        FAIL("status %d, %d expected", r.status, status);
    if (status == 200 && !head_only)
        REQUIRE(strcmp(r.body, HTTP_OK_BODY) == 0);
    if (status != 200)
        REQUIRE(r.close);
    return r;
}

/* The server must close the connection (nothing more comes). */
static void cl_expect_eof(struct cl *c)
{
    if (c->len)
        FAIL("unexpected bytes: %.*s", (int)c->len, c->buf);
    if (cl_fill(c))
        FAIL("unexpected bytes, end of stream expected: %.*s", (int)c->len, c->buf);
}

static const char *GET = "GET / HTTP/1.1\r\nHost: test\r\n\r\n";

/* ---------------------------------------------------------------------- */
/* The parser                                                              */
/* ---------------------------------------------------------------------- */

static int parse(const char *s, http_request_t *r, const http_limits_t *lim)
{
    return http_parse_request(s, strlen(s), lim, r);
}

static void expect_status(const char *s, int status, const http_limits_t *lim)
{
    http_request_t r;
    int got = parse(s, &r, lim);
    if (got != HTTP_PARSE_ERROR || r.status != status)
        FAIL("\"%.40s...\": result %d status %d, %d expected", s, got, r.status, status);
}

static void case_parse(void)
{
    http_request_t r;
    const char *req = "GET /a?b HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n";
    for (size_t i = 0; i < strlen(req); i++) /* every prefix needs more */
        REQUIRE(http_parse_request(req, i, NULL, &r) == HTTP_PARSE_NEED_MORE);
    REQUIRE(parse(req, &r, NULL) == HTTP_PARSE_COMPLETE);
    REQUIRE(r.method == HTTP_GET && r.minor == 1 && r.keep_alive && r.nheaders == 2);
    REQUIRE(r.head_len == strlen(req) && r.target_len == 4 && memcmp(r.target, "/a?b", 4) == 0);
    REQUIRE(parse("\r\nHEAD / HTTP/1.0\nConnection: Keep-Alive\n\n", &r, NULL) == HTTP_PARSE_COMPLETE);
    REQUIRE(r.method == HTTP_HEAD && r.minor == 0 && r.keep_alive);
    REQUIRE(parse("GET / HTTP/1.0\r\n\r\n", &r, NULL) == HTTP_PARSE_COMPLETE && !r.keep_alive);
    REQUIRE(parse("GET / HTTP/1.1\r\nHost: x\r\nConnection: te, Close\r\n\r\n", &r, NULL) == HTTP_PARSE_COMPLETE);
    REQUIRE(!r.keep_alive);
    REQUIRE(parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET", &r, NULL) ==
            HTTP_PARSE_COMPLETE);
    REQUIRE(r.method == HTTP_POST && r.content_length == 5 && r.head_len == 47);
    REQUIRE(parse("PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\ncontent-length: 7\r\n\r\n", &r, NULL) ==
            HTTP_PARSE_COMPLETE);
    REQUIRE(r.method == HTTP_OTHER && r.content_length == 7);

    expect_status("GARBAGE\r\n\r\n", 400, NULL);
    expect_status("GET  / HTTP/1.1\r\nHost: x\r\n\r\n", 400, NULL);
    expect_status("GET / HTTP/1.1\r\n\r\n", 400, NULL); /* no Host */
    expect_status("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, NULL);
    expect_status("GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400, NULL);
    expect_status("GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400, NULL);
    expect_status("GET / HTTP/1.1\r\nHost: x\rY: z\r\n\r\n", 400, NULL);
    expect_status("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n", 400, NULL);
    expect_status("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, NULL);
    expect_status("GET / HTTP/1\r\n\r\n", 400, NULL);
    expect_status("GET / HTTP/2.0\r\n\r\n", 505, NULL);
    expect_status("GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 501, NULL);
    expect_status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413, NULL);
    http_limits_t small = {.max_head = 64, .max_headers = 2, .max_body = 10};
    expect_status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n", 413, &small);
    REQUIRE(parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n", &r, &small) == HTTP_PARSE_COMPLETE);
    expect_status("GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\nB: 2\r\n\r\n", 431, &small);
    char line[128];
    snprintf(line, sizeof line, "GET /%070d HTTP/1.1\r\n", 0);
    expect_status(line, 414, &small); /* cut before its end: still the request line */
    snprintf(line, sizeof line, "GET / HTTP/1.1\r\nHost: x\r\nA: %060d", 0);
    expect_status(line, 431, &small);

    size_t n;
    const char *ok = http_ok_response(1000000000, 1, 0, &n);
    REQUIRE(n == strlen(ok) && strstr(ok, "Date: Sun, 09 Sep 2001 01:46:40 GMT\r\n"));
    REQUIRE(strstr(ok, "Connection: keep-alive\r\n") && strstr(ok, "\r\n\r\n" HTTP_OK_BODY));
    ok = http_ok_response(1000000000, 0, 1, &n);
    REQUIRE(strstr(ok, "Connection: close\r\n") && strcmp(ok + n - 4, "\r\n\r\n") == 0);
    char err[256];
    REQUIRE(http_error_response(err, sizeof err, 431, 0) > 0 && strstr(err, "HTTP/1.1 431 "));
    REQUIRE(http_error_response(err, 16, 431, 0) == 0);
}

/* ---------------------------------------------------------------------- */
/* Cases against the server                                                */
/* ---------------------------------------------------------------------- */

static void case_keep_alive(void)
{
    server_up(NULL);
    struct cl *c = cl_open();
    for (int i = 0; i < 3; i++) { /* one connection, several requests */
        cl_send(c, GET);
        struct resp r = cl_expect(c, 200, false);
        REQUIRE(!r.close);
    }
    cl_send(c, "HEAD /x HTTP/1.1\r\nHost: t\r\n\r\n");
    REQUIRE(cl_expect(c, 200, true).clen == (long)strlen(HTTP_OK_BODY));
    cl_send(c, "POST /form HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\nhello world");
    cl_expect(c, 200, false);
    static char big[200000]; /* a body longer than the server's buffer is skipped */
    memset(big, 'b', sizeof big);
    int hn = snprintf(big, 128, "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n", (size_t)100000);
    big[hn] = 'b';
    send_bytes(c->fd, big, (size_t)hn + 100000);
    cl_expect(c, 200, false);
    cl_send(c, GET);
    cl_expect(c, 200, false);
    cl_send(c, "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    REQUIRE(cl_expect(c, 200, false).close);
    cl_expect_eof(c);
    cl_close(c);

    c = cl_open(); /* HTTP/1.0: closed after the answer unless asked */
    cl_send(c, "GET / HTTP/1.0\r\n\r\n");
    REQUIRE(cl_expect(c, 200, false).close);
    cl_expect_eof(c);
    cl_close(c);
    c = cl_open();
    cl_send(c, "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    REQUIRE(!cl_expect(c, 200, false).close);
    cl_send(c, "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    REQUIRE(!cl_expect(c, 200, false).close);
    cl_close(c);
    server_down(WAIT_MS);
}

static void case_pipelining(void)
{
    server_up(NULL);
    struct cl *c = cl_open();
    /* 300 requests in one write (their answers fill more than one output
     * buffer), GET and HEAD mixed: answered in order, so each HEAD answer
     * comes where a HEAD was sent (no body: a mix-up breaks the framing). */
    enum { N = 300 };
    static char all[N * 64];
    size_t len = 0;
    for (int i = 0; i < N; i++)
        len += (size_t)snprintf(all + len, sizeof all - len, "%s /%d HTTP/1.1\r\nHost: t\r\n%s\r\n",
                                i % 3 == 1 ? "HEAD" : "GET", i, i == N - 1 ? "Connection: close\r\n" : "");
    send_bytes(c->fd, all, len);
    for (int i = 0; i < N; i++) {
        struct resp r = cl_expect(c, 200, i % 3 == 1);
        REQUIRE(r.close == (i == N - 1));
    }
    cl_expect_eof(c);
    cl_close(c);

    c = cl_open(); /* a head split across writes, after a complete one */
    char two[256];
    snprintf(two, sizeof two, "%sGET / HTTP/1.1\r\nHo", GET);
    cl_send(c, two);
    cl_expect(c, 200, false);
    usleep(50 * 1000);
    cl_send(c, "st: t\r\n\r\n");
    cl_expect(c, 200, false);
    cl_close(c);
    server_down(WAIT_MS);
}

static void case_malformed(void)
{
    server_up(NULL);
    struct cl *c = cl_open(); /* the good request before it is answered, then 400, then the close */
    char s[256];
    snprintf(s, sizeof s, "%sGARBAGE\r\n\r\n%s", GET, GET);
    cl_send(c, s);
    cl_expect(c, 200, false);
    cl_expect(c, 400, false);
    cl_expect_eof(c);
    cl_close(c);
    const char *bad[] = {"\x01\x02\x03\r\n\r\n", "GET / HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n",
                         "GET / HTTP/1.1\r\n\r\n", "GET / HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = cl_open();
        cl_send(c, bad[i]);
        cl_expect(c, 400, false);
        cl_expect_eof(c);
        cl_close(c);
    }
    server_down(WAIT_MS);
}

static void case_oversized_headers(void)
{
    server_up("--max-head", "4096", NULL);
    static char big[16384];
    int n = snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: t\r\n");
    for (int i = 0; i < 60; i++) /* 60 headers of 100 bytes: 6000 bytes > 4096 */
        n += snprintf(big + n, sizeof big - (size_t)n, "X-Pad-%02d: %088d\r\n", i, 0);
    n += snprintf(big + n, sizeof big - (size_t)n, "\r\n");
    struct cl *c = cl_open();
    send_bytes(c->fd, big, (size_t)n);
    cl_expect(c, 431, false);
    cl_expect_eof(c);
    cl_close(c);

    n = snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: t\r\n"); /* too many header lines */
    for (int i = 0; i < 70; i++)
        n += snprintf(big + n, sizeof big - (size_t)n, "X-%d: y\r\n", i);
    n += snprintf(big + n, sizeof big - (size_t)n, "\r\n");
    c = cl_open();
    send_bytes(c->fd, big, (size_t)n);
    cl_expect(c, 431, false);
    cl_expect_eof(c);
    cl_close(c);

    memset(big, 'a', 5000); /* a request line longer than the limit */
    memcpy(big, "GET /", 5);
    c = cl_open();
    send_bytes(c->fd, big, 5000);
    cl_expect(c, 414, false);
    cl_expect_eof(c);
    cl_close(c);

    c = cl_open(); /* just under the limit: answered */
    n = snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: t\r\nX-Pad: %04000d\r\n\r\n", 0);
    REQUIRE(n < 4096);
    send_bytes(c->fd, big, (size_t)n);
    cl_expect(c, 200, false);
    cl_close(c);
    server_down(WAIT_MS);
}

static void case_oversized_body(void)
{
    server_up("--max-body", "1000", NULL);
    struct cl *c = cl_open();
    cl_send(c, "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n");
    cl_expect(c, 413, false);
    cl_expect_eof(c);
    cl_close(c);
    c = cl_open(); /* with part of the body sent: the answer still arrives, then the close */
    char s[2048];
    int n = snprintf(s, sizeof s, "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5000000000\r\n\r\n");
    memset(s + n, 'x', sizeof s - (size_t)n);
    send_bytes(c->fd, s, sizeof s);
    cl_expect(c, 413, false);
    cl_expect_eof(c);
    cl_close(c);
    c = cl_open(); /* at the limit: answered */
    n = snprintf(s, sizeof s, "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n");
    memset(s + n, 'x', 1000);
    send_bytes(c->fd, s, (size_t)n + 1000);
    cl_expect(c, 200, false);
    cl_close(c);
    server_down(WAIT_MS);
}

/* A Content-Length past 2^64 is 413 with any --max-body, the largest too:
 * the digits never wrap to a small length (the bytes after the head would
 * be taken for the next request). */
static void case_content_length_past_uint64(void)
{
    http_limits_t lim = {.max_head = 8192, .max_headers = 64, .max_body = INT64_MAX};
    static const char *const lengths[] = {"18446744073709551616", "18446744073709551617", "36893488147419103232",
                                          "18446744073709551615", "9223372036854775808",
                                          "184467440737095516160000"};
    char s[256];
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        snprintf(s, sizeof s, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\n\r\n", lengths[i]);
        expect_status(s, 413, &lim);
    }
    http_request_t r;
    REQUIRE(parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 9223372036854775807\r\n\r\n", &r, &lim) ==
            HTTP_PARSE_COMPLETE);
    REQUIRE(r.content_length == INT64_MAX);

    server_up("--max-body", "9223372036854775807", NULL);
    struct cl *c = cl_open();
    cl_send(c, "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 18446744073709551616\r\n\r\n"
               "GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    cl_expect(c, 413, false);
    cl_expect_eof(c);
    cl_close(c);
    server_down(WAIT_MS);
}

static void case_unsupported(void)
{
    server_up(NULL);
    struct cl *c = cl_open();
    cl_send(c, "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    cl_expect(c, 501, false);
    cl_expect_eof(c);
    cl_close(c);
    c = cl_open();
    cl_send(c, "GET / HTTP/2.0\r\nHost: t\r\n\r\n");
    cl_expect(c, 505, false);
    cl_expect_eof(c);
    cl_close(c);
    server_down(WAIT_MS);
}

static void case_slow_client(void)
{
    server_up("--idle-ms", "5000", NULL);
    struct cl *c = cl_open();
    for (int round = 0; round < 2; round++) { /* 1 byte every 10 ms: within the idle timeout */
        for (const char *p = GET; *p; p++) {
            send_bytes(c->fd, p, 1);
            usleep(10 * 1000);
        }
        cl_expect(c, 200, false);
    }
    cl_close(c);
    server_down(WAIT_MS);
}

static void case_idle_timeout(void)
{
    enum { IDLE = 300 };
    server_up("--idle-ms", "300", NULL);
    struct cl *silent = cl_open(), *used = cl_open(), *trickle = cl_open();
    int64_t t0 = now_us();
    cl_send(used, GET);
    cl_expect(used, 200, false);
    cl_expect_eof(silent); /* sent nothing */
    REQUIRE(now_us() - t0 >= (IDLE - 20) * 1000); /* never early (the server's clock is coarse: a few ms) */
    cl_expect_eof(used); /* idle after its answer */
    /* A head that keeps coming, one byte every 50 ms, but never ends: the
     * idle timeout bounds the whole head, so it is closed all the same. */
    int64_t start = now_us();
    bool closed = false;
    for (int i = 0; i < 400 && !closed; i++) {
        if (send(trickle->fd, i == 0 ? "G" : "a", 1, MSG_NOSIGNAL) < 0) {
            closed = true;
            break;
        }
        struct pollfd p = {.fd = trickle->fd, .events = POLLIN};
        if (poll(&p, 1, 50) == 1) {
            char b;
            REQUIRE(recv(trickle->fd, &b, 1, 0) <= 0); /* no answer: the end of the stream (or a reset) */
            closed = true;
        }
    }
    if (!closed)
        FAIL("a head trickling in was not closed after %lld ms", (long long)(now_us() - start) / 1000);
    cl_close(silent);
    cl_close(used);
    cl_close(trickle);
    server_down(WAIT_MS);
}

/* Waits until the server has read every byte c sent: the receive queue of
 * the server's side of the connection, in /proc/net/tcp, is empty. */
static void wait_server_read(struct cl *c)
{
    struct sockaddr_in me;
    socklen_t len = sizeof me;
    REQUIRE(getsockname(c->fd, (struct sockaddr *)&me, &len) == 0);
    unsigned want_remote = ntohs(me.sin_port);
    int64_t deadline = now_us() + WAIT_MS * 1000LL;
    for (;;) {
        FILE *f = fopen("/proc/net/tcp", "r");
        REQUIRE(f != NULL);
        char line[512];
        bool found = false, drained = false;
        while (fgets(line, sizeof line, f)) {
            unsigned lport, rport, txq, rxq;
            if (sscanf(line, " %*d: %*x:%x %*x:%x %*x %x:%x", &lport, &rport, &txq, &rxq) == 4 && lport == g_port &&
                rport == want_remote) {
                found = true;
                drained = rxq == 0;
            }
        }
        fclose(f);
        if (found && drained)
            return;
        if (now_us() > deadline)
            FAIL("the server did not read the bytes sent (%s)", found ? "still queued" : "no socket");
        usleep(10 * 1000);
    }
}

static void case_shutdown(void)
{
    enum { DRAIN = 2000 };
    server_up("--drain-ms", "2000", "--idle-ms", "60000", NULL);
    struct cl *idle = cl_open(), *inflight = cl_open(), *stuck = cl_open();
    cl_send(idle, GET);
    cl_expect(idle, 200, false);
    cl_send(inflight, "GET / HTTP/1.1\r\nHost: t\r\n");
    cl_send(stuck, "GET / HTTP/1.1\r\n");
    wait_server_read(inflight); /* the partial heads are in the server's buffers: in flight, not idle */
    wait_server_read(stuck);
    int64_t t0 = now_us();
    REQUIRE(kill(g_child.pid, SIGTERM) == 0);
    cl_expect_eof(idle); /* idle keep-alive: closed at once */
    int fd = cl_connect_raw(); /* the listener is closed before the idle connections are */
    if (fd >= 0)
        FAIL("a connection was accepted after the stop began");
    REQUIRE(errno == ECONNREFUSED);
    cl_send(inflight, "\r\n"); /* the request in flight completes: answered, with "Connection: close" */
    REQUIRE(cl_expect(inflight, 200, false).close);
    cl_expect_eof(inflight);
    cl_expect_eof(stuck); /* cancelled when the drain time is over */
    int64_t stuck_us = now_us() - t0;
    REQUIRE(stuck_us >= (DRAIN - 50) * 1000);
    child_require_clean_exit(&g_child, WAIT_MS);
    int64_t exit_us = now_us() - t0;
    if (exit_us > (DRAIN + 10000) * 1000LL)
        FAIL("the server took %lld ms to exit after SIGTERM (drain %d ms)", (long long)exit_us / 1000, DRAIN);
    child_free(&g_child);
    cl_close(idle);
    cl_close(inflight);
    cl_close(stuck);
}

/* A request whose body is still coming when the stop begins is in flight:
 * its answer says "Connection: close", and a request the client pipelined
 * after that body is not answered. */
static void case_shutdown_body_in_flight(void)
{
    server_up("--drain-ms", "20000", "--idle-ms", "60000", NULL);
    struct cl *idle = cl_open(), *body = cl_open(), *piped = cl_open();
    cl_send(idle, GET);
    cl_expect(idle, 200, false);
    cl_send(body, "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nab");
    cl_send(piped, "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nab");
    wait_server_read(body);
    wait_server_read(piped);
    REQUIRE(kill(g_child.pid, SIGTERM) == 0);
    cl_expect_eof(idle); /* the stop has begun */
    cl_send(body, "cdefghij");
    REQUIRE(cl_expect(body, 200, false).close);
    cl_expect_eof(body);
    cl_send(piped, "cdefghij");
    cl_send(piped, GET);
    REQUIRE(cl_expect(piped, 200, false).close);
    cl_expect_eof(piped);
    child_require_clean_exit(&g_child, WAIT_MS);
    child_free(&g_child);
    cl_close(idle);
    cl_close(body);
    cl_close(piped);
}

/* net.ipv4.tcp_wmem's maximum: the most a socket's send buffer grows to (4 MiB if unknown). */
static long tcp_wmem_max(void)
{
    long wmem_max = 4 << 20;
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_wmem", "r");
    if (f) {
        REQUIRE(fscanf(f, "%*d %*d %ld", &wmem_max) == 1);
        fclose(f);
    }
    return wmem_max;
}

/* A client with a small window (rcvbuf) that sends request after request, each on its own, GET and HEAD
 * alternating (request i is a HEAD when i is odd), and reads no answer until it has sent more requests than the
 * kernel can hold answers for (net.ipv4.tcp_wmem's maximum), or until its sends stall because the server
 * stopped reading (it waits for room). Returns the client; *sent: the requests sent whole; req/len/off: the
 * last request and how much of it went out (off > 0: cut, its rest not sent yet). */
static struct cl *stall_client(int rcvbuf, int *sent, char req[64], size_t *len, size_t *off)
{
    const int n = (int)(tcp_wmem_max() / 100); /* answers of 140 bytes or more */
    struct cl *c = calloc(1, sizeof *c);
    REQUIRE(c != NULL);
    c->fd = cl_connect_rcvbuf(rcvbuf);
    REQUIRE(c->fd >= 0);
    int flags = fcntl(c->fd, F_GETFL);
    REQUIRE(fcntl(c->fd, F_SETFL, flags | O_NONBLOCK) == 0);
    *sent = 0;
    *len = *off = 0;
    while (*sent < n) {
        *len = (size_t)snprintf(req, 64, "%s /%d HTTP/1.1\r\nHost: t\r\n\r\n", *sent % 2 ? "HEAD" : "GET", *sent);
        ssize_t w = send(c->fd, req, *len, MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break; /* the server stopped reading (it is waiting for room) */
        REQUIRE(w > 0);
        if ((size_t)w < *len) {
            *off = (size_t)w;
            break;
        }
        (*sent)++;
        usleep(20); /* each request alone in the server's read, mostly */
    }
    REQUIRE(fcntl(c->fd, F_SETFL, flags) == 0);
    return c;
}

/* The server answers each request of a stalled client as its socket fills up, until the answers find too
 * little room or none; those wait in the server and then come out whole and in order, GET and HEAD
 * alternating (an answer lost, doubled or cut breaks the framing). */
static void case_stalled_reader(void)
{
    server_up("--idle-ms", "60000", NULL);
    char req[64];
    size_t len, off;
    int sent;
    struct cl *c = stall_client(4096, &sent, req, &len, &off);
    for (int got = 0; got < sent; got++)
        cl_expect(c, 200, got % 2 == 1);
    if (off > 0) {
        send_bytes(c->fd, req + off, len - off);
        cl_expect(c, 200, sent % 2 == 1);
    }
    REQUIRE(c->len == 0);
    cl_close(c);
    server_down(WAIT_MS);
}

/* A stop that begins while answers wait for room in a stalled client's socket, with more of its requests
 * unread behind them: once the client reads, every answer the server made reaches it whole and in order,
 * and the connection ends with a clean end of stream after the last whole answer (no reset that would drop
 * answers still queued in the server's socket). Requests the server did not take are not answered. */
static void case_shutdown_stalled_reader(void)
{
    /* The requests left unread come to about an eighth of tcp_wmem's maximum; the server's close reads up to
     * 1 MiB of them (server.c, LINGER_BYTES) before it gives up on the client. */
    if (tcp_wmem_max() > (6 << 20)) {
        fprintf(stderr, "SKIP: net.ipv4.tcp_wmem's maximum is above 6 MiB\n");
        exit(SKIP);
    }
    server_up("--drain-ms", "20000", "--idle-ms", "60000", NULL);
    struct cl *idle = cl_open();
    cl_send(idle, GET);
    cl_expect(idle, 200, false);
    char req[64];
    size_t len, off;
    int sent;
    struct cl *c = stall_client(4096, &sent, req, &len, &off);
    REQUIRE(sent > 0);
    REQUIRE(kill(g_child.pid, SIGTERM) == 0);
    cl_expect_eof(idle); /* the stop has begun */
    int got = 0;
    struct resp r;
    for (;;) {
        errno = 0;
        if (!cl_response(c, &r, got % 2 == 1))
            break;
        if (r.status != 200)
            FAIL("answer %d: status %d", got, r.status);
        if (got % 2 == 0 && strcmp(r.body, HTTP_OK_BODY) != 0)
            FAIL("answer %d: body \"%s\"", got, r.body);
        got++;
        if (r.close)
            break;
    }
    if (errno == ECONNRESET)
        FAIL("the connection was reset after %d whole answers", got);
    if (r.close)
        cl_expect_eof(c);
    REQUIRE(got >= 1 && got <= sent);
    cl_close(c);
    child_require_clean_exit(&g_child, WAIT_MS);
    child_free(&g_child);
    cl_close(idle);
}

static void case_workers_2(void)
{
    server_up("--workers", "2", NULL);
    enum { CONNS = 64, ROUNDS = 30, DEPTH = 4 };
    struct cl *cs[CONNS];
    for (int i = 0; i < CONNS; i++)
        cs[i] = cl_open();
    char batch[512];
    size_t len = 0;
    for (int d = 0; d < DEPTH; d++)
        len += (size_t)snprintf(batch + len, sizeof batch - len, "%s", d == 1 ? "HEAD / HTTP/1.1\r\nHost: t\r\n\r\n" : GET);
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < CONNS; i++)
            send_bytes(cs[i]->fd, batch, len);
        for (int i = 0; i < CONNS; i++)
            for (int d = 0; d < DEPTH; d++)
                cl_expect(cs[i], 200, d == 1);
    }
    for (int i = 0; i < CONNS; i++)
        cl_close(cs[i]);
    server_down(WAIT_MS);
}

#ifdef HTTP_SERVER_TLS
/* Writes a PEM file made by write(f, obj) into a temporary path. */
static void pem_file(char *path, int (*write)(FILE *, void *), void *obj)
{
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    FILE *f = fdopen(fd, "w");
    REQUIRE(f && write(f, obj) == 1 && fclose(f) == 0);
}

static int write_key(FILE *f, void *k) { return PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL); }
static int write_cert(FILE *f, void *x) { return PEM_write_X509(f, x); }

/* HTTPS: a self-signed certificate for 127.0.0.1; the client trusts it,
 * checks the name, and is served over TLS with keep-alive and pipelining. */
static void case_https(void)
{
    EVP_PKEY *key;
    X509 *cert;
    REQUIRE(fiber_tls_self_signed("127.0.0.1", 1, &key, &cert) == 0);
    char kpath[] = "/tmp/http_server_key_XXXXXX", cpath[] = "/tmp/http_server_cert_XXXXXX";
    pem_file(kpath, write_key, key);
    pem_file(cpath, write_cert, cert);
    server_up("--tls-cert", cpath, "--tls-key", kpath, NULL);
    unlink(kpath);
    unlink(cpath);
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    REQUIRE(ctx && X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), cert) == 1);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    struct cl *c = cl_open();
    c->tls = fiber_tls_create(ctx, c->fd);
    REQUIRE(c->tls != NULL);
    if (fiber_tls_connect(c->tls, "127.0.0.1", WAIT_MS) < 0)
        FAIL("TLS handshake: %s %s", fiber_tls_strerror(fiber_tls_error(c->tls)), fiber_tls_error_detail(c->tls));
    cl_send(c, GET);
    cl_expect(c, 200, false);
    char two[128];
    snprintf(two, sizeof two, "%s%s", GET, "HEAD / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    cl_send(c, two);
    cl_expect(c, 200, false);
    REQUIRE(cl_expect(c, 200, true).close);
    cl_expect_eof(c); /* the server's close_notify */
    fiber_tls_destroy(c->tls);
    cl_close(c);

    c = cl_open(); /* a client speaking plain HTTP to it gets no answer, only the close */
    cl_send(c, GET);
    REQUIRE(!cl_fill(c) || c->len == 0 || c->buf[0] != 'H');
    cl_close(c);
    SSL_CTX_free(ctx);
    EVP_PKEY_free(key);
    X509_free(cert);
    server_down(WAIT_MS);
}
#endif

/* Raises the soft descriptor limit to the hard one; false if that stays
 * below want. */
static bool fd_limit_at_least(rlim_t want)
{
    struct rlimit rl;
    REQUIRE(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    rl.rlim_cur = rl.rlim_max;
    REQUIRE(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    return rl.rlim_cur >= want;
}

/* Under ThreadSanitizer every fiber of the server has a TSan context of its
 * own, and TSan allows 8128 of them with the threads: 4000 connections. */
#if defined(__SANITIZE_THREAD__)
#define CONNS_10K 4000
#else
#define CONNS_10K 10000
#endif

static void case_conns_10k(void)
{
    enum { CONNS = CONNS_10K };
    if (!fd_limit_at_least(CONNS + 100)) { /* the server raises its own the same way */
        fprintf(stderr, "SKIP: the hard descriptor limit is below %d\n", CONNS + 100);
        exit(SKIP);
    }
    server_up("--idle-ms", "120000", NULL);
    int *fds = calloc(CONNS, sizeof *fds);
    static char buf[4096];
    REQUIRE(fds != NULL);
    for (int i = 0; i < CONNS; i++) { /* each one served once, then kept open */
        fds[i] = cl_connect_raw();
        if (fds[i] < 0)
            FAIL("connection %d: %s", i, strerror(errno));
        send_bytes(fds[i], GET, strlen(GET));
    }
    size_t resp_len;
    (void)http_ok_response(time(NULL), 1, 0, &resp_len); /* every answer has this length */
    for (int round = 0; round < 2; round++) {
        if (round == 1) /* all open at once: each is served again */
            for (int i = 0; i < CONNS; i++)
                send_bytes(fds[i], GET, strlen(GET));
        for (int i = 0; i < CONNS; i++) {
            size_t got = 0;
            while (got < resp_len) {
                ssize_t n = recv(fds[i], buf + got, resp_len - got, 0);
                if (n <= 0)
                    FAIL("connection %d, round %d: %s", i, round, n == 0 ? "closed" : strerror(errno));
                got += (size_t)n;
            }
            REQUIRE(strncmp(buf, "HTTP/1.1 200 OK\r\n", 17) == 0);
            REQUIRE(memcmp(buf + resp_len - strlen(HTTP_OK_BODY), HTTP_OK_BODY, strlen(HTTP_OK_BODY)) == 0);
        }
    }
    for (int i = 0; i < CONNS; i++)
        close(fds[i]);
    free(fds);
    server_down(60000);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {
        {"parse", case_parse},
        {"keep_alive", case_keep_alive},
        {"pipelining", case_pipelining},
        {"malformed", case_malformed},
        {"oversized_headers", case_oversized_headers},
        {"oversized_body", case_oversized_body},
        {"unsupported", case_unsupported},
        {"content_length_past_uint64", case_content_length_past_uint64},
        {"slow_client", case_slow_client},
        {"stalled_reader", case_stalled_reader},
        {"idle_timeout", case_idle_timeout},
        {"shutdown", case_shutdown},
        {"shutdown_body_in_flight", case_shutdown_body_in_flight},
        {"shutdown_stalled_reader", case_shutdown_stalled_reader},
        {"workers_2", case_workers_2},
        {"conns_10k", case_conns_10k},
#ifdef HTTP_SERVER_TLS
        {"https", case_https},
#endif
    };
    if (argc < 2)
        FAIL("usage: test_http_server CASE PATH-TO-http_server");
    signal(SIGPIPE, SIG_IGN);
    atexit(kill_server);
    g_server = argc > 2 ? argv[2] : NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (strcmp(argv[1], cases[i].name) == 0) {
            if (!g_server && cases[i].fn != case_parse)
                FAIL("this case needs the path of http_server");
            cases[i].fn();
            printf("ok %s\n", argv[1]);
            return 0;
        }
    FAIL("unknown case %s", argv[1]);
}
