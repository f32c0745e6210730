/*
 * HTTP/1.1 server, raw epoll peer of examples/http_server for the http rows:
 * one thread, level-triggered epoll, the same request parser and the same
 * response bytes as the example. Each readable connection gets one read()
 * into its input buffer; every complete request in the buffer is parsed and
 * answered in order, the answers of one read go out with one send() (a
 * remainder that does not fit waits for EPOLLOUT, reading stops meanwhile).
 * A request that cannot be parsed is answered with its error status and the
 * connection is closed once that answer is out, as is a "Connection: close"
 * one. No allocation per request: one state record per connection.
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

#include "http_bench_parse.h"

#define IN_CAP 8192
#define OUT_CAP 65536

typedef struct {
    size_t in_len, out_len, out_off;
    int closing;  /* close once out is flushed */
    int want_out; /* watching EPOLLOUT instead of EPOLLIN */
    char in[IN_CAP];
    char *out; /* OUT_CAP bytes, allocated with the connection */
} conn_t;

static conn_t **conns; /* by fd */
static int max_fds;
static int ep;

static void drop(int fd) {
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    if (conns[fd]) free(conns[fd]->out);
    free(conns[fd]);
    conns[fd] = NULL;
}

static void watch(int fd, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.fd = fd};
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
}

/* Sends what is pending; 1 if all of it went, 0 if some waits for EPOLLOUT,
 * -1 if the connection is gone. */
static int flush_out(int fd, conn_t *c) {
    while (c->out_off < c->out_len) {
        ssize_t w = send(fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) return 0;
        if (w <= 0) return -1;
        c->out_off += (size_t)w;
    }
    c->out_len = c->out_off = 0;
    return 1;
}

/* Answers every complete request in c->in (in order) into c->out, keeps the
 * incomplete rest at the start of c->in. */
static void answer_all(conn_t *c) {
    size_t off = 0;
    while (!c->closing && off < c->in_len) {
        if (OUT_CAP - c->out_len < HB_MAX_RESPONSE) break; /* the rest once this is out */
        size_t used = 0;
        int keep = 0;
        int st = hb_parse(c->in + off, c->in_len - off, &used, &keep);
        if (st == HB_NEED_MORE) {
            if (c->in_len - off == IN_CAP) st = 431; /* the buffer is full and holds no complete request */
            else break;
        }
        c->out_len += hb_response(c->out + c->out_len, OUT_CAP - c->out_len, st == HB_DONE ? 200 : st,
                                  st == HB_DONE && keep);
        if (st != HB_DONE || !keep) c->closing = 1;
        off += used;
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
}

/* Answers what c->in holds and sends it, as long as that makes progress;
 * then waits for the next read, or for room to send the rest. */
static void serve(int fd, conn_t *c) {
    for (;;) {
        size_t before = c->in_len;
        answer_all(c);
        int f = flush_out(fd, c);
        if (f < 0 || (f == 1 && c->closing)) return drop(fd);
        if (f == 0) {
            if (!c->want_out) watch(fd, EPOLLOUT);
            c->want_out = 1;
            return;
        }
        if (c->in_len == 0 || c->in_len == before) break;
    }
    if (c->want_out) watch(fd, EPOLLIN);
    c->want_out = 0;
}

static void on_readable(int fd) {
    conn_t *c = conns[fd];
    ssize_t r = read(fd, c->in + c->in_len, IN_CAP - c->in_len);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) return drop(fd);
    c->in_len += (size_t)r;
    serve(fd, c);
}

static void on_writable(int fd) {
    conn_t *c = conns[fd];
    int f = flush_out(fd, c);
    if (f < 0 || (f == 1 && c->closing)) return drop(fd);
    if (f == 1) serve(fd, c); /* requests that waited for room */
}

static void on_accept(int lfd) {
    int fd;
    while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        conn_t *c = fd < max_fds ? malloc(sizeof *c) : NULL;
        char *out = c ? malloc(OUT_CAP) : NULL;
        if (!out) {
            free(c);
            close(fd);
            continue;
        }
        c->in_len = c->out_len = c->out_off = 0;
        c->closing = c->want_out = 0;
        c->out = out;
        conns[fd] = c;
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
        fputs(HB_BODY, stdout);
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
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == lfd)
                on_accept(lfd);
            else if (conns[fd] && (evs[i].events & EPOLLOUT))
                on_writable(fd);
            else if (conns[fd])
                on_readable(fd);
        }
    }
}
