//go:build linux && !la_kqueue

/* The fiber poller on Linux (poller.h): epoll with EPOLLONESHOT
 * registrations (EPOLLET ones for owned fds), an eventfd as the doorbell.
 *
 * The doorbell is edge-triggered: every kick (a write) is a new edge, so the
 * polling worker does not read it to sleep again; a kick costs the kicker
 * its write and the poller nothing more. Its counter grows by one per kick
 * and is read every LA_BELL_DRAIN edges, far below its 2^64 - 2 limit. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "poller.h"
#include "fiber_int.h"

#define LA_IN_BITS (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)
#define LA_OUT_BITS (EPOLLOUT | EPOLLHUP | EPOLLERR)
#define LA_BELL_DRAIN 4096u

int la_poller_open(la_poller_t *p) {
    p->fd = epoll_create1(EPOLL_CLOEXEC);
    p->bell = p->fd < 0 ? -1 : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    atomic_init(&p->bell_unread, 0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.ptr = NULL};
    if (p->fd < 0 || p->bell < 0 || epoll_ctl(p->fd, EPOLL_CTL_ADD, p->bell, &ev) != 0) {
        int e = errno;
        la_poller_close(p);
        errno = e;
        return -1;
    }
    return 0;
}

void la_poller_close(la_poller_t *p) {
    if (p->fd >= 0) close(p->fd);
    if (p->bell >= 0) close(p->bell);
    p->fd = p->bell = -1;
}

void la_poller_kick(la_poller_t *p) {
    uint64_t one = 1;
    ssize_t r = la_write_nc(p->bell, &one, sizeof one); /* not a cancellation point (base.h) */
    (void)r;
}

int la_poller_arm(la_poller_t *p, int fd, unsigned want, void *rec, int *added) {
    uint32_t events = ((want & LA_PF_IN) ? (uint32_t)(EPOLLIN | EPOLLRDHUP) : 0) |
                      ((want & LA_PF_OUT) ? (uint32_t)EPOLLOUT : 0);
    struct epoll_event ev = {.events = events | EPOLLONESHOT, .data.ptr = rec};
    la_tsan_release(rec); /* to the thread its event reaches (la_poller_wait) */
    *added = 0;
    if (epoll_ctl(p->fd, EPOLL_CTL_MOD, fd, &ev) == 0) return 0;
    if (errno != ENOENT) return -errno;
    if (epoll_ctl(p->fd, EPOLL_CTL_ADD, fd, &ev) != 0) return -errno;
    *added = 1;
    return 0;
}

int la_poller_own(la_poller_t *p, int fd, void *rec, int replace) {
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI | EPOLLET, .data.ptr = rec};
    la_tsan_release(rec); /* to the thread its events reach (la_poller_wait) */
    if (epoll_ctl(p->fd, EPOLL_CTL_ADD, fd, &ev) == 0) return 0;
    if (errno != EEXIST || !replace) return -errno;
    return epoll_ctl(p->fd, EPOLL_CTL_MOD, fd, &ev) == 0 ? 0 : -errno;
}

int la_poller_disown(la_poller_t *p, int fd) {
    struct epoll_event ev = {0};
    return epoll_ctl(p->fd, EPOLL_CTL_DEL, fd, &ev) == 0 ? 0 : -errno;
}

int la_poller_wait(la_poller_t *p, int timeout_ms, void (*fn)(void *ctx, void *rec, unsigned got), void *ctx,
                   int *rang) {
    struct epoll_event evs[LA_POLL_MAX];
    int n = epoll_wait(p->fd, evs, LA_POLL_MAX, timeout_ms);
    int nfd = 0;
    if (rang) *rang = 0;
    if (__tsan_acquire) /* what la_poller_arm and la_poller_own handed over */
        for (int i = 0; i < n; i++)
            if (evs[i].data.ptr) __tsan_acquire(evs[i].data.ptr);
    for (int i = 0; i < n; i++) {
        /* what the next events' dispatch touches, fetched while this one is
         * handled: the record two ahead, the waiter of the next (io.c) */
        if (i + 2 < n) __builtin_prefetch(evs[i + 2].data.ptr, 1);
        if (fn == la_io_event && i + 1 < n && evs[i + 1].data.ptr) la_io_prefetch(evs[i + 1].data.ptr);
        if (evs[i].data.ptr == NULL) {
            if (rang) *rang = 1;
            if (atomic_fetch_add_explicit(&p->bell_unread, 1, memory_order_relaxed) + 1 >= LA_BELL_DRAIN) {
                uint64_t v;
                ssize_t r = la_read_nc(p->bell, &v, sizeof v);
                (void)r;
                atomic_store_explicit(&p->bell_unread, 0, memory_order_relaxed);
            }
            continue;
        }
        uint32_t e = evs[i].events;
        fn(ctx, evs[i].data.ptr,
           ((e & (LA_IN_BITS | EPOLLPRI)) ? LA_PF_IN : 0u) | ((e & LA_OUT_BITS) ? LA_PF_OUT : 0u) |
               ((e & EPOLLPRI) ? LA_PF_PRI : 0u));
        nfd++;
    }
    return nfd;
}
