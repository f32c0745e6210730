/*
 * wake latency, physical floor: the loop thread blocks in epoll_wait on an
 * eventfd (the design of a Linux event loop); the sender writes the eventfd.
 *
 * usage: latency_efd [samples=3000]
 */
#include "latency.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

static int efd;

static void sender_thread_start(void) {}

static void send_wake(uint64_t t0) {
    (void)t0;
    uint64_t one = 1;
    if (write(efd, &one, sizeof one) != (ssize_t)sizeof one) FAIL("eventfd write: %s", strerror(errno));
}

int main(int argc, char **argv) {
    latency_setup(argc, argv);
    efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (efd < 0 || ep < 0) FAIL("eventfd/epoll: %s", strerror(errno));
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = 1};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, efd, &e) != 0) FAIL("epoll_ctl: %s", strerror(errno));
    pthread_t th = start_sender();
    for (int done = 0; !done;) {
        struct epoll_event out[8];
        int n = epoll_wait(ep, out, 8, 5000);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) FAIL("epoll_wait: %s", n == 0 ? "a wake was lost" : strerror(errno));
        uint64_t v;
        if (read(efd, &v, sizeof v) != (ssize_t)sizeof v) FAIL("eventfd read: %s", strerror(errno));
        done = record_sample(atomic_load(&shared_t0));
    }
    pthread_join(th, NULL);
    print_latency();
    return 0;
}
