/*
 * TCP echo server, raw epoll peer: one thread, level-triggered epoll, one
 * static buffer; each readable connection gets one read() and the bytes go
 * straight back with one send(). A send that cannot take everything (never
 * seen with these message sizes) keeps the rest in a per-connection buffer
 * and waits for EPOLLOUT.
 *
 * usage: echo_epoll   (see echo.h)
 */
#include "echo.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>

typedef struct {
    char *pending;
    size_t len;
} conn_t;

static conn_t *conns; /* by fd */
static int nconns;
static char buf[65536];

static void drop(int ep, int fd) {
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    free(conns[fd].pending);
    conns[fd] = (conn_t){0};
}

/* Sends data[0..n) on fd; keeps what does not fit. -1 if the peer is gone. */
static int send_all(int ep, int fd, const char *data, size_t n) {
    conn_t *c = &conns[fd];
    ssize_t w = send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno != EAGAIN) return -1;
    if (w < 0) w = 0;
    if ((size_t)w == n) return 0;
    char *p = realloc(c->pending, c->len + n - (size_t)w);
    if (!p) return -1;
    memcpy(p + c->len, data + w, n - (size_t)w);
    c->pending = p;
    c->len += n - (size_t)w;
    struct epoll_event ev = {.events = EPOLLOUT, .data.fd = fd}; /* read again once flushed */
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
    return 0;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    int lfd = echo_listen();
    nconns = echo_max_fds();
    conns = calloc((size_t)nconns, sizeof *conns);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    fcntl(lfd, F_SETFL, O_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd}, evs[512];
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    for (;;) {
        int n = epoll_wait(ep, evs, 512, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == lfd) {
                int c;
                while ((c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    if (c >= nconns) {
                        close(c);
                        continue;
                    }
                    echo_nodelay(c);
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
                }
                continue;
            }
            conn_t *c = &conns[fd];
            if (evs[i].events & EPOLLOUT) {
                ssize_t w = send(fd, c->pending, c->len, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (w < 0 && errno != EAGAIN) {
                    drop(ep, fd);
                    continue;
                }
                if (w > 0) {
                    memmove(c->pending, c->pending + w, c->len - (size_t)w);
                    c->len -= (size_t)w;
                }
                if (c->len == 0) {
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = fd};
                    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &cev);
                }
            }
            if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
                if (c->len) continue; /* flush first */
                ssize_t r = read(fd, buf, sizeof buf);
                if (r > 0) {
                    if (send_all(ep, fd, buf, (size_t)r) != 0) drop(ep, fd);
                } else if (r == 0 || errno != EAGAIN) {
                    drop(ep, fd);
                }
            }
        }
    }
}
