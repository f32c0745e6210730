//go:build darwin || freebsd || netbsd || openbsd || dragonfly || (linux && la_kqueue)

/* The fiber poller on kqueue (poller.h): darwin and the BSDs; on Linux only
 * for tests, with libkqueue (-tags la_kqueue, see kqueue_linux.go).
 *
 * kqueue watches (fd, filter) pairs: a direction is one knote, EVFILT_READ
 * for LA_PF_IN and EVFILT_WRITE for LA_PF_OUT, registered with EV_DISPATCH,
 * so that an event disables its knote (it stays registered) like
 * EPOLLONESHOT disarms an fd. Arming mirrors the epoll backend's
 * EPOLL_CTL_MOD-then-ADD: one kevent call (EV_RECEIPT) enables the knotes of
 * the wanted directions and disables the other one; ENOENT for a wanted one
 * means the fd has no such knote (first arm, or the file was closed, which
 * drops its knotes, and the number reused), and then it is added (*added).
 * Unlike EPOLLONESHOT, an event disables only its own direction: the other
 * one stays armed, and its event comes later (io.c's la_io_event takes
 * events for directions without a waiter as no-ops, and re-arms what is
 * still waited for).
 *
 * Events: EVFILT_READ -> IN, EVFILT_WRITE -> OUT, as kqueue reports EOF (a
 * hang-up) and a pending socket error on the filter that was asked for; an
 * EOF with an error (fflags) reports both directions, as EPOLLERR does.
 *
 * The doorbell: EVFILT_USER (darwin, FreeBSD, NetBSD >= 10, libkqueue)
 * where it exists, else a non-blocking pipe. The kqueue and the pipe are
 * close-on-exec (fcntl: darwin has no kqueue1/pipe2). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <sys/event.h>
#include <sys/time.h>
#include <unistd.h>

#include "fiber.h"
#include "poller.h"

#if defined(EVFILT_USER) && !defined(LA_KQ_PIPE)
#define LA_KQ_USER 1
#endif

static void cloexec(int fd) { fcntl(fd, F_SETFD, FD_CLOEXEC); }

int la_poller_open(la_poller_t *p) {
    p->bell = p->bell_w = -1;
    p->fd = kqueue();
    if (p->fd < 0) return -1;
    cloexec(p->fd);
    struct kevent kev;
#if defined(LA_KQ_USER)
    EV_SET(&kev, 0, EVFILT_USER, EV_ADD | EV_CLEAR, 0, 0, NULL);
#else
    int fds[2];
    if (pipe(fds) != 0) goto fail;
    p->bell = fds[0];
    p->bell_w = fds[1];
    for (int i = 0; i < 2; i++) {
        cloexec(fds[i]);
        fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
    }
    EV_SET(&kev, p->bell, EVFILT_READ, EV_ADD, 0, 0, NULL);
#endif
    if (kevent(p->fd, &kev, 1, NULL, 0, NULL) != 0) goto fail;
    return 0;
fail:;
    int e = errno;
    la_poller_close(p);
    errno = e;
    return -1;
}

void la_poller_close(la_poller_t *p) {
    if (p->fd >= 0) close(p->fd);
    if (p->bell >= 0) close(p->bell);
    if (p->bell_w >= 0) close(p->bell_w);
    p->fd = p->bell = p->bell_w = -1;
}

void la_poller_kick(la_poller_t *p) {
#if defined(LA_KQ_USER)
    struct kevent kev;
    EV_SET(&kev, 0, EVFILT_USER, 0, NOTE_TRIGGER, 0, NULL);
    kevent(p->fd, &kev, 1, NULL, 0, NULL);
#else
    char b = 'k';
    ssize_t r = write(p->bell_w, &b, 1); /* EAGAIN: the pipe already rings */
    (void)r;
#endif
}

/* Applies n changes; errs[i] gets each one's errno (0: done). 0, or -errno
 * when kevent itself failed. */
static int apply(int kq, struct kevent *ch, int n, int *errs) {
#if defined(EV_RECEIPT)
    struct kevent out[2];
    for (int i = 0; i < n; i++) ch[i].flags |= EV_RECEIPT;
    struct timespec zero = {0, 0};
    int k;
    do k = kevent(kq, ch, n, out, n, &zero);
    while (k < 0 && errno == EINTR);
    if (k < 0) return -errno;
    for (int i = 0; i < n; i++) errs[i] = 0;
    /* receipts come in change order; match them by filter to be safe */
    for (int j = 0; j < k; j++)
        for (int i = 0; i < n; i++)
            if (out[j].filter == ch[i].filter && (out[j].flags & EV_ERROR)) errs[i] = (int)out[j].data;
#else
    for (int i = 0; i < n; i++) {
        int k;
        do k = kevent(kq, &ch[i], 1, NULL, 0, NULL);
        while (k < 0 && errno == EINTR);
        errs[i] = k == 0 ? 0 : errno;
    }
#endif
    return 0;
}

int la_poller_arm(la_poller_t *p, int fd, unsigned want, void *rec, int *added) {
    static const short filt[2] = {EVFILT_READ, EVFILT_WRITE};
    static const unsigned dir[2] = {LA_PF_IN, LA_PF_OUT};
    struct kevent ch[2];
    int errs[2];
    la_tsan_release(rec); /* to the thread its event reaches (la_poller_wait) */
    *added = 0;
    for (int i = 0; i < 2; i++)
        EV_SET(&ch[i], (uintptr_t)fd, filt[i], (want & dir[i]) ? EV_ENABLE : EV_DISABLE, 0, 0, rec);
    int e = apply(p->fd, ch, 2, errs);
    if (e) return e;
    struct kevent add[2];
    int nadd = 0;
    for (int i = 0; i < 2; i++) {
        if (!(want & dir[i])) continue; /* a missing knote is disabled enough */
        if (errs[i] == 0) continue;
        if (errs[i] != ENOENT) return -errs[i];
        EV_SET(&add[nadd], (uintptr_t)fd, filt[i], EV_ADD | EV_ENABLE | EV_DISPATCH, 0, 0, rec);
        nadd++;
    }
    if (nadd == 0) return 0;
    e = apply(p->fd, add, nadd, errs);
    if (e) return e;
    for (int i = 0; i < nadd; i++)
        if (errs[i]) return -errs[i];
    *added = 1;
    return 0;
}

/* An owned fd (poller.h): EV_CLEAR knotes for both directions, which
 * report each change of readiness once and stay enabled. A knote left by
 * la_poller_arm (EV_DISPATCH) is deleted first, so that its flags go. */
int la_poller_own(la_poller_t *p, int fd, void *rec, int replace) {
    static const short filt[2] = {EVFILT_READ, EVFILT_WRITE};
    struct kevent ch[2];
    int errs[2];
    int e;
    la_tsan_release(rec); /* to the thread its events reach (la_poller_wait) */
    if (!replace) {
        EV_SET(&ch[0], (uintptr_t)fd, EVFILT_READ, EV_ENABLE, 0, 0, rec);
        if ((e = apply(p->fd, ch, 1, errs))) return e;
        if (errs[0] == 0) return -EEXIST;
    }
    for (int i = 0; i < 2; i++) EV_SET(&ch[i], (uintptr_t)fd, filt[i], EV_DELETE, 0, 0, NULL);
    if ((e = apply(p->fd, ch, 2, errs))) return e;
    for (int i = 0; i < 2; i++) EV_SET(&ch[i], (uintptr_t)fd, filt[i], EV_ADD | EV_ENABLE | EV_CLEAR, 0, 0, rec);
    if ((e = apply(p->fd, ch, 2, errs))) return e;
    for (int i = 0; i < 2; i++)
        if (errs[i]) return -errs[i];
    return 0;
}

int la_poller_disown(la_poller_t *p, int fd) {
    static const short filt[2] = {EVFILT_READ, EVFILT_WRITE};
    struct kevent ch[2];
    int errs[2];
    for (int i = 0; i < 2; i++) EV_SET(&ch[i], (uintptr_t)fd, filt[i], EV_DELETE, 0, 0, NULL);
    int e = apply(p->fd, ch, 2, errs);
    if (e) return e;
    return errs[0] && errs[1] ? -errs[0] : 0;
}

int la_poller_wait(la_poller_t *p, int timeout_ms, void (*fn)(void *ctx, void *rec, unsigned got), void *ctx,
                   int *rang) {
    struct kevent evs[LA_POLL_MAX];
    struct timespec ts, *tp = NULL;
    if (timeout_ms >= 0) {
        ts.tv_sec = timeout_ms / 1000;
        ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
        tp = &ts;
    }
    int n = kevent(p->fd, NULL, 0, evs, LA_POLL_MAX, tp);
    int nfd = 0;
    if (rang) *rang = 0;
    for (int i = 0; i < n; i++) {
        void *rec = (void *)(intptr_t)evs[i].udata;
        if (rec) la_tsan_acquire(rec); /* what arm and own handed over */
        if (rec == NULL) {
            if (rang) *rang = 1;
#if !defined(LA_KQ_USER)
            char buf[64];
            while (read(p->bell, buf, sizeof buf) > 0) {
            }
#endif
            continue;
        }
        unsigned got = evs[i].filter == EVFILT_WRITE ? LA_PF_OUT : LA_PF_IN;
        if ((evs[i].flags & EV_ERROR) || ((evs[i].flags & EV_EOF) && evs[i].fflags != 0)) got = LA_PF_IN | LA_PF_OUT;
        fn(ctx, rec, got);
        nfd++;
    }
    return nfd;
}
