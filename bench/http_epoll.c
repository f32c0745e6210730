/*
 * HTTP/1.1 server, raw epoll peer of examples/http_server for the http rows:
 * one thread, level-triggered epoll, the same request parser and the same
 * response bytes as the example (examples/http_server/http_parse.c). Each
 * readable connection gets one read() into a static buffer (behind what it
 * kept from before); every complete request there is parsed and answered in
 * order into a static output buffer, sent with one send() per read (per
 * 64 KiB of answers). A connection keeps only what outlives the event: an
 * incomplete request, and answers the socket did not take (then it waits for
 * EPOLLOUT and reads nothing meanwhile). A request that cannot be parsed is
 * answered with its error status and the connection closed once that is out,
 * as for "Connection: close"; a request body is skipped. Nothing is allocated
 * per request.
 *
 * usage: http_epoll port     listens on 127.0.0.1:port (0: any), prints "port=N"
 *        http_epoll --body   prints the body every answer carries
 */
#include "bench.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http_parse.h"

#define IN_CAP HTTP_DEFAULT_MAX_HEAD /* the largest request head */
#define OUT_CAP 65536                 /* answers collected before a send */
#define MAX_ANSWER 256                /* http_ok_response's or http_error_response's */

/* Per connection only what outlives one readable event. */
typedef struct {
    char *rest;     /* input not answered yet (IN_CAP bytes once needed) */
    char *pending;  /* answers the socket did not take yet */
    size_t rest_len, pend_len, pend_off;
    uint64_t skip; /* body bytes of the last request still to come */
    int closing;  /* close once everything is sent */
    int want_out; /* watching EPOLLOUT instead of EPOLLIN */
} conn_t;

static conn_t *conns; /* by fd */
static int max_fds;
static int ep;
static char inbuf[IN_CAP], outbuf[OUT_CAP];
static time_t now; /* read once per epoll_wait */

static void drop(int fd) {
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    free(conns[fd].rest);
    free(conns[fd].pending);
    conns[fd] = (conn_t){0};
}

static void watch(int fd, conn_t *c, int out) {
    if (c->want_out == out) return;
    struct epoll_event ev = {.events = out ? EPOLLOUT : EPOLLIN, .data.fd = fd};
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
    c->want_out = out;
}

/* Sends data[0..n); what the socket does not take goes to c->pending.
 * 1: all sent, 0: some is pending, -1: the connection is gone. */
static int send_or_keep(int fd, conn_t *c, const char *data, size_t n) {
    ssize_t w = send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno != EAGAIN && errno != EINTR) return -1;
    if (w < 0) w = 0;
    if ((size_t)w == n) return 1;
    char *p = realloc(c->pending, c->pend_len + n - (size_t)w);
    if (!p) return -1;
    memcpy(p + c->pend_len, data + w, n - (size_t)w);
    c->pending = p;
    c->pend_len += n - (size_t)w;
    return 0;
}

/* Keeps in[0..n) for the next event. 0, or -1 out of memory. */
static int keep_rest(conn_t *c, const char *in, size_t n) {
    c->rest_len = n;
    if (n == 0) return 0;
    if (!c->rest && !(c->rest = malloc(IN_CAP))) return -1;
    memmove(c->rest, in, n);
    return 0;
}

/* Answers every complete request in inbuf[0..len), in order, with one send
 * per OUT_CAP of answers; keeps the rest of the input (an incomplete request,
 * or complete ones waiting until the pending answers are out). */
static void process(int fd, conn_t *c, size_t len) {
    size_t off = 0, out = 0;
    int sent = 1;
    while (off < len && !c->closing) {
        if (c->skip) { /* a body: not looked at */
            size_t n = len - off < c->skip ? len - off : (size_t)c->skip;
            off += n;
            c->skip -= n;
            continue;
        }
        if (OUT_CAP - out < MAX_ANSWER) {
            sent = send_or_keep(fd, c, outbuf, out);
            out = 0;
            if (sent <= 0) break;
        }
        http_request_t req;
        int r = http_parse_request(inbuf + off, len - off, NULL, &req);
        if (r == HTTP_PARSE_NEED_MORE && len - off < IN_CAP) break;
        if (r == HTTP_PARSE_COMPLETE) {
            size_t n;
            const char *ok = http_ok_response(now, req.keep_alive, req.method == HTTP_HEAD, &n);
            memcpy(outbuf + out, ok, n);
            out += n;
            off += req.head_len;
            c->skip = req.content_length;
            c->closing = !req.keep_alive;
        } else { /* an error, or IN_CAP bytes without a whole head */
            out += http_error_response(outbuf + out, OUT_CAP - out, r == HTTP_PARSE_ERROR ? req.status : 431, now);
            c->closing = 1;
            off = len;
        }
    }
    if (out && sent > 0) sent = send_or_keep(fd, c, outbuf, out);
    if (sent < 0 || keep_rest(c, inbuf + off, len - off) != 0) return drop(fd);
    if (sent == 0) return watch(fd, c, 1);
    if (c->closing) return drop(fd);
    watch(fd, c, 0);
}

static void on_readable(int fd, conn_t *c) {
    size_t n = c->rest_len;
    if (n) memcpy(inbuf, c->rest, n);
    ssize_t r = read(fd, inbuf + n, IN_CAP - n);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) return drop(fd);
    process(fd, c, n + (size_t)r);
}

static void on_writable(int fd, conn_t *c) {
    while (c->pend_off < c->pend_len) {
        ssize_t w = send(fd, c->pending + c->pend_off, c->pend_len - c->pend_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (w <= 0) return drop(fd);
        c->pend_off += (size_t)w;
    }
    c->pend_len = c->pend_off = 0;
    if (c->rest_len) memcpy(inbuf, c->rest, c->rest_len); /* requests that waited for room */
    process(fd, c, c->rest_len);
}

static void on_accept(int lfd) {
    int fd;
    while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        if (fd >= max_fds) {
            close(fd);
            continue;
        }
        conns[fd] = (conn_t){0};
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
}

static int listen_on(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        FAIL("listen on 127.0.0.1:%d: %s", port, strerror(errno));
    printf("port=%d\n", ntohs(a.sin_port));
    fflush(stdout);
    return fd;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--body") == 0) { /* for bench/http_load.sh: the body to expect */
        fputs(HTTP_OK_BODY, stdout);
        return 0;
    }
    int port = argc > 1 ? atoi(argv[1]) : 0;
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
    max_fds = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 1 << 20 ? 1 << 20 : (int)rl.rlim_cur;
    conns = calloc((size_t)max_fds, sizeof *conns);
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (!conns || ep < 0) FAIL("out of memory");
    int lfd = listen_on(port);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd}, evs[512];
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    for (;;) {
        int n = epoll_wait(ep, evs, 512, -1);
        now = time(NULL);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == lfd)
                on_accept(lfd);
            else if (conns[fd].want_out)
                on_writable(fd, &conns[fd]);
            else
                on_readable(fd, &conns[fd]);
        }
    }
}
