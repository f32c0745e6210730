/*
 * fd readiness wake latency, the floor: the loop thread blocks in
 * epoll_wait(-1) on the read end of a pipe; the sender writes one byte.
 *
 * usage: fdlatency_epoll [samples=3000]
 */
#define _GNU_SOURCE
#include "fdlatency.h"

#include <sys/epoll.h>

int main(int argc, char **argv) {
    fdlatency_setup(argc, argv);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) FAIL("epoll_create1: %s", strerror(errno));
    struct epoll_event e = {.events = EPOLLIN, .data.fd = pfd[0]};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, pfd[0], &e) != 0) FAIL("epoll_ctl: %s", strerror(errno));
    pthread_t th = start_sender();
    for (int done = 0; !done;) {
        struct epoll_event out[8];
        int n = epoll_wait(ep, out, 8, 5000);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) FAIL("epoll_wait: %s", n == 0 ? "a wake was lost" : strerror(errno));
        uint64_t t0 = atomic_load(&shared_t0);
        for (int i = 0; i < n && !done; i++) {
            if (out[i].data.fd != pfd[0] || !(out[i].events & EPOLLIN)) FAIL("unexpected event");
            done = record_sample(t0);
            char c;
            if (read(pfd[0], &c, 1) != 1) FAIL("pipe read: %s", strerror(errno));
        }
    }
    pthread_join(th, NULL);
    print_latency();
    return 0;
}
