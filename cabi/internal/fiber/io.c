//go:build !windows

/* fd waits for fibers: one poller per scheduler (poller.h; epoll on Linux),
 * one-shot registrations.
 *
 * Each fd number gets a record (kept for the scheduler's life) holding at
 * most one parked reader and one parked writer, and no readiness: a wait
 * tries the syscall (or poll(2) with timeout 0), and only if that would block
 * parks, arming the fd for its direction. Readiness kept across parks would
 * outlive what it describes: a HUP or ERR seen on one file would still be
 * "ready" for the next file with the same number (or, for an ICMP error on a
 * UDP socket, after the error was read), and every park would return at once
 * for ever. The arm asks the kernel instead, which knows the file's state
 * now. A park also ends with ASYNC_E_TIMEDOUT once its deadline has passed,
 * whatever the fd reports, so a wait on an fd that keeps reporting HUP or
 * ERR while its syscall says EAGAIN still ends on time (and every round
 * of it parks, so the worker runs its other fibers meanwhile).
 *
 * Registration: the fd is added once and re-armed by every park with
 * EPOLL_CTL_MOD (one system call, under the record's lock, for the
 * directions its waiters want); ENOENT means the number is not registered
 * (first wait, or the fd was closed and its number reused: the kernel drops a
 * registration when the file's last reference goes), and then it is added.
 * Arming checks the file's current readiness, so a wait never misses what is
 * already there, whatever the record believes. That lets a read skip its first
 * attempt when the previous read on this (stream) fd drained it (returned
 * less than asked): it parks at once, and the arm reports data that came in
 * meanwhile. An event disarms the fd; if a waiter of the other direction
 * remains, the poller re-arms it.
 *
 * Owned fds (async_fiber_fd_open; async_fiber_accept on a fiber, on a
 * listening socket its scheduler owns): the fd is
 * registered once, edge-triggered for both directions (la_poller_own), and
 * no park touches the poller again. The record counts the events dispatched
 * per direction (sin, sout): a call reads the count before its syscall, and
 * when the syscall says EAGAIN it parks only if the count is unchanged
 * (under the record's lock, where the event bumps it and claims the
 * waiter), so an edge that came between the syscall and the park is not
 * lost: every arrival after the syscall's check makes a later event. The
 * read hint is kept as "the last short read saw count n": while the count
 * is still n nothing came since (or its event is on its way and wakes the
 * park), so the read parks at once; only for TCP, where a short read means
 * the queue was empty (a Unix socket stops at ancillary data, a packet pipe
 * at a packet), and off for good once urgent data (EPOLLPRI) was seen (a
 * read stops at its mark). Ownership ends only through the library
 * (async_fiber_close, or the scheduler's end): the registration goes, gen
 * is bumped and the parked fibers wake with ASYNC_E_CLOSED; a call that
 * began before (its gen is older) fails with ASYNC_E_CLOSED instead of
 * parking. A number closed with close(2) behind the library's back keeps a
 * stale "owned" record: async_fiber_fd_open (the poller then says the
 * number is not registered) and async_fiber_accept (a number the kernel
 * just handed out) take such a record over. The owner of each number is
 * also kept process-wide (owner_slot: the scheduler's handle), so that
 * async_fiber_close finds it from any thread, and two schedulers cannot
 * own one number. Fibers of other schedulers and plain threads use the
 * one-shot path (their records are not owned) or poll(2).
 *
 * errno is read only inside the small noinline sys_* helpers: after a park
 * the fiber may run on another thread, and gcc may cache errno's address. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#include "fiber_int.h"

#ifndef POLLRDHUP
/* Linux only: elsewhere a peer's half-close shows as POLLIN (a read returns
 * 0), and CLOSE comes only with POLLHUP. */
#define POLLRDHUP 0
#endif

#define LA_FD_CHUNK 1024
#define LA_FD_CHUNKS 4096 /* fds below 4M */

struct la_fdrec {
    la_spin_t lk;
    int fd;                /* the number (set by the first park) */
    la_waiter_t *rw, *ww;  /* parked reader / writer */
    _Atomic char drained;  /* hint: the last fiber read returned less than asked */
    _Atomic char stream;   /* read hint usable: stream socket or pipe (at ADD) */
    /* owned fds (see the top); owned, gen, sin and sout change under lk */
    _Atomic char owned;         /* registered edge-triggered for good */
    _Atomic char tcp;           /* owned: the read hint is usable */
    _Atomic unsigned gen;       /* bumped when an ownership ends */
    _Atomic unsigned sin, sout; /* owned: events dispatched per direction */
    _Atomic unsigned dseq;      /* owned: sin before the last short read */
};

/* What a call saw of its fd's record before its syscall (owned fds), and
 * what its first look saw. Start it zeroed (LA_FDSNAP_START). */
typedef struct {
    la_fdrec_t *r;
    int owned;
    unsigned gen, sin, sout;
    int taken; /* fd_snap ran before in this call */
    int began; /* the call's first look saw the fd owned, with gen bgen */
    unsigned bgen;
} la_fdsnap_t;
#define LA_FDSNAP_START {0}

/* Takes a fresh look. Returns 1 if the ownership the call began under has
 * ended since (async_fiber_close, or the number taken over): the call fails
 * with ASYNC_E_CLOSED. Every look after the first must check this: a call
 * that was not parked when the close came (it was running its syscall, or
 * was just woken) would otherwise find the fd plain, park on it the one-shot
 * way, and the close(2) that follows would drop that registration silently:
 * the fiber would wait for its timeout, or for ever. */
static int fd_snap(la_fdrec_t *r, la_fdsnap_t *sn) {
    sn->r = r;
    sn->owned = r && atomic_load(&r->owned);
    if (sn->owned) {
        sn->gen = atomic_load(&r->gen);
        sn->sin = atomic_load(&r->sin);
        sn->sout = atomic_load(&r->sout);
    }
    if (!sn->taken) {
        sn->taken = 1;
        sn->began = sn->owned;
        sn->bgen = sn->gen;
        return 0;
    }
    return sn->began && atomic_load(&r->gen) != sn->bgen;
}

/* fd_snap in a call's retry loop: 1 (ASYNC_E_CLOSED recorded) if the call
 * must end. */
static int fd_snap_closed(la_fdrec_t *r, la_fdsnap_t *sn) {
    if (!fd_snap(r, sn)) return 0;
    la_set_error(ASYNC_E_CLOSED);
    return 1;
}


int la_io_init(la_sched_t *s) {
    pthread_mutex_init(&s->fdmu, NULL);
    s->fdchunks = calloc(LA_FD_CHUNKS, sizeof *s->fdchunks);
    return s->fdchunks ? 0 : -1;
}

static void owners_drop(la_sched_t *s);

void la_io_free(la_sched_t *s) {
    if (!s->fdchunks) return;
    owners_drop(s);
    for (size_t i = 0; i < LA_FD_CHUNKS; i++) free(atomic_load(&s->fdchunks[i]));
    free(s->fdchunks);
    s->fdchunks = NULL;
    pthread_mutex_destroy(&s->fdmu);
}

static la_fdrec_t *fdrec(la_sched_t *s, int fd) {
    if (fd < 0 || fd >= LA_FD_CHUNK * LA_FD_CHUNKS) return NULL;
    size_t ci = (size_t)fd / LA_FD_CHUNK;
    la_fdrec_t *c = atomic_load_explicit(&s->fdchunks[ci], memory_order_acquire);
    if (!c) {
        pthread_mutex_lock(&s->fdmu);
        c = atomic_load(&s->fdchunks[ci]);
        if (!c) {
            c = calloc(LA_FD_CHUNK, sizeof *c);
            if (c) atomic_store_explicit(&s->fdchunks[ci], c, memory_order_release);
        }
        pthread_mutex_unlock(&s->fdmu);
        if (!c) return NULL;
    }
    return &c[(size_t)fd % LA_FD_CHUNK];
}

#if defined(LA_URING)
/* 1 if the call may go through io_uring (io_uring.c decides the rest): the
 * caller is a fiber of an io_uring scheduler, and fd is not owned by it.
 * Owned descriptors keep their registered epoll path on an io_uring
 * scheduler too (async_fiber_close must reach the fibers parked on them,
 * and accept on an owned listener hands out owned fds): io_uring serves the
 * plain ones. An epoll scheduler's call stops at the first test (no look at
 * the fd table). Allocates nothing. */
static int uring_here(int fd) {
    la_fiber_t *f = la_current_fiber();
    if (!f || !f->s->uring) return 0;
    if (fd < 0 || fd >= LA_FD_CHUNK * LA_FD_CHUNKS) return 1;
    la_fdrec_t *c = atomic_load_explicit(&f->s->fdchunks[(size_t)fd / LA_FD_CHUNK], memory_order_acquire);
    return !(c && atomic_load_explicit(&c[(size_t)fd % LA_FD_CHUNK].owned, memory_order_relaxed));
}
#endif

LA_NOINLINE static int sys_arm(la_sched_t *s, la_fdrec_t *r, unsigned want);

static unsigned arm_mask(la_fdrec_t *r) { return (r->rw ? LA_PF_IN : 0u) | (r->ww ? LA_PF_OUT : 0u); }

/* Called by whichever worker polled. */
/* A hint from the poller (poller_epoll.c) about the event it dispatches
 * next: the parked reader's waiter record (on its fiber's stack, usually a
 * cache miss by now) is fetched while this event is handled. rw is read
 * without the lock: a stale value only makes a useless prefetch, and a
 * prefetch never faults. (Going one step deeper, the claim word the waiter
 * points to, made the dispatch slower: that read waits for the waiter.) */
void la_io_prefetch(void *rec) {
    la_fdrec_t *r = rec;
    la_waiter_t *w = __atomic_load_n(&r->rw, __ATOMIC_RELAXED);
    if (w) __builtin_prefetch(w, 1);
}

void la_io_event(void *ctx, void *p, unsigned ev) {
    la_sched_t *s = ctx;
    la_fdrec_t *r = p;
    la_waiter_t *wake[2] = {NULL, NULL};
    la_spin_lock(&r->lk);
    int owned = atomic_load_explicit(&r->owned, memory_order_relaxed);
    if (owned) {
        /* relaxed: a park compares the counts under lk (the unlock
         * publishes them); an unlocked look that reads an older count only
         * sends the caller to that locked compare */
        if (ev & LA_PF_IN)
            atomic_store_explicit(&r->sin, atomic_load_explicit(&r->sin, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
        if (ev & LA_PF_OUT)
            atomic_store_explicit(&r->sout, atomic_load_explicit(&r->sout, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
        if (ev & LA_PF_PRI) atomic_store_explicit(&r->tcp, 0, memory_order_relaxed);
    }
    if (r->rw && (ev & LA_PF_IN) && la_waiter_claim(r->rw, LA_W_READY)) {
        wake[0] = r->rw;
        if (r->ww == r->rw) r->ww = NULL;
        r->rw = NULL;
    }
    if (r->ww && (ev & LA_PF_OUT) && la_waiter_claim(r->ww, LA_W_READY)) {
        wake[1] = r->ww;
        if (r->rw == r->ww) r->rw = NULL;
        r->ww = NULL;
    }
    /* the event disarmed a one-shot fd: re-arm for a waiter still there (rare) */
    if (!owned && (r->rw || r->ww)) sys_arm(s, r, arm_mask(r));
    la_spin_unlock(&r->lk);
    /* claimed fibers cannot run before these calls: they are still alive */
    if (wake[0]) la_waiter_signal(wake[0]);
    if (wake[1]) la_waiter_signal(wake[1]);
}

/* ---- syscalls that report -errno ----------------------------------------- */

/* 1 if reads of fd drain it when they return less than asked. */
LA_NOINLINE static int sys_is_stream(int fd) {
    int type = 0;
    socklen_t len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0) return type == SOCK_STREAM;
    struct stat st;
    return errno == ENOTSOCK && fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

/* (Re)arms r->fd for want (one shot); the poller adds it when it is not
 * registered, and then the read hint is learned. */
LA_NOINLINE static int sys_arm(la_sched_t *s, la_fdrec_t *r, unsigned want) {
    int added = 0;
    int e = la_poller_arm(&s->poller, r->fd, want, r, &added);
    if (e == 0 && added) atomic_store_explicit(&r->stream, (char)sys_is_stream(r->fd), memory_order_relaxed);
    return e;
}

LA_NOINLINE static int sys_poll1(int fd, short events, int timeout) {
    struct pollfd p = {.fd = fd, .events = events, .revents = 0};
    int r, cs = LA_CANCEL_KEPT;
    /* not a cancellation point (base.h): poll(2) is one also with timeout
     * 0, where a host thread's pending cancel acted in
     * async_fiber_wait_fd(fd, ev, 0) (a worker thread is never cancelled) */
    if (timeout != 0 || !la_current_worker()) la_nocancel_enter(&cs);
    do r = poll(&p, 1, timeout);
    while (r < 0 && errno == EINTR && timeout == 0);
    if (r < 0) r = -errno;
    la_nocancel_leave(&cs);
    if (r < 0) return r;
    if (r == 0) return 0;
    if (p.revents & POLLNVAL) return -EBADF;
    return p.revents ? p.revents : 0;
}

/* 0 if fd is an open descriptor, else -errno (EBADF). */
LA_NOINLINE static int sys_fd_open(int fd) { return fcntl(fd, F_GETFD) < 0 ? -errno : 0; }

LA_NOINLINE static int sys_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) return -errno;
    if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -errno;
    return 0;
}

/* sys_nonblock that says whether it set the flag (*was: the flags before,
 * -1 if it did not change them), for a caller that may have to undo it. */
LA_NOINLINE static int sys_nonblock_undoable(int fd, int *was) {
    *was = -1;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) return -errno;
    if (fl & O_NONBLOCK) return 0;
    if (fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -errno;
    *was = fl;
    return 0;
}

LA_NOINLINE static void sys_setfl(int fd, int fl) {
    int e = errno;
    (void)fcntl(fd, F_SETFL, fl);
    errno = e;
}

/* A socket's non-blocking receive and send. On a worker thread (a fiber's
 * call) through syscall(2): libc's recv and send are cancellation points,
 * and each brackets the call with two atomic updates of the thread's
 * cancellation state (four locked instructions per echo round trip, about
 * 0.05 µs); a worker is never cancelled. On a plain thread the libc calls,
 * cancellation points as async.h says. */
#if defined(__linux__) && defined(SYS_recvfrom) && defined(SYS_sendto)
static inline ssize_t sock_recv(int fd, void *buf, size_t n) {
    if (la_current_worker()) return (ssize_t)syscall(SYS_recvfrom, fd, buf, n, MSG_DONTWAIT, NULL, NULL);
    return recv(fd, buf, n, MSG_DONTWAIT);
}
static inline ssize_t sock_send(int fd, const void *buf, size_t n) {
    if (la_current_worker())
        return (ssize_t)syscall(SYS_sendto, fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL, NULL, (socklen_t)0);
    return send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
}
#else
static inline ssize_t sock_recv(int fd, void *buf, size_t n) { return recv(fd, buf, n, MSG_DONTWAIT); }
static inline ssize_t sock_send(int fd, const void *buf, size_t n) {
    return send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
}
#endif

LA_NOINLINE static ssize_t sys_read(int fd, void *buf, size_t n) {
    ssize_t r = sock_recv(fd, buf, n);
    if (r >= 0) return r;
    if (errno != ENOTSOCK) return -errno;
    int e = sys_nonblock(fd);
    if (e) return e;
    r = read(fd, buf, n);
    if (r >= 0) return r;
    e = errno;
    /* A terminal's hang-up reads as EIO on Linux (a pty master whose slave
     * side is closed), where a pipe or socket reads 0: it is the end of
     * file async.h promises for a peer's hang-up. Only with the hang-up
     * (POLLHUP) there: an EIO without it (a background read on an orphaned
     * process group's terminal) stays an error. */
    if (e == EIO && isatty(fd)) {
        int re = sys_poll1(fd, POLLIN, 0);
        if (re > 0 && (re & POLLHUP)) return 0;
    }
    return -e;
}

/* write(2) to a non-socket (a pipe, say) without SIGPIPE: a write to a pipe
 * whose reader closed raises SIGPIPE at the writing thread (on a host thread
 * the default action, or the Go runtime's handler, kills the process). The
 * signal is blocked around the write, and the one the write raised is taken
 * back with sigtimedwait, unless one was already pending before (that one
 * is the host's: it stays). The thread's own pending signals are taken
 * before the process's, so a SIGPIPE sent to the process meanwhile stays
 * too. Fiber workers block SIGPIPE for good (worker_main): there only the
 * take-back runs, and only after EPIPE. Also async_sched_dump's writes
 * (tools.c), from any thread and from its signal handler: the calls it makes
 * (pthread_sigmask, sigpending, sigtimedwait) are system calls, safe there. */
LA_NOINLINE ssize_t la_write_nosigpipe(int fd, const void *buf, size_t n) {
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    int restore = 0, pending_before = 0;
    if (!la_current_worker()) {
        if (pthread_sigmask(SIG_BLOCK, &pipe_set, &old) != 0) return -EINVAL;
        if (!sigismember(&old, SIGPIPE)) {
            /* it was deliverable here: none can be pending for this thread */
            restore = 1;
        } else {
            sigset_t p;
            pending_before = sigpending(&p) == 0 && sigismember(&p, SIGPIPE);
        }
    }
    ssize_t r = write(fd, buf, n);
    int err = r < 0 ? errno : 0;
    if (err == EPIPE && !pending_before) {
#if defined(__APPLE__)
        /* no sigtimedwait: sigwait returns at once for a pending signal */
        sigset_t p;
        int sig;
        if (sigpending(&p) == 0 && sigismember(&p, SIGPIPE)) sigwait(&pipe_set, &sig);
#else
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR) {
        }
#endif
    }
    if (restore) pthread_sigmask(SIG_SETMASK, &old, NULL);
    return r >= 0 ? r : -err;
}

LA_NOINLINE static ssize_t sys_write(int fd, const void *buf, size_t n) {
    ssize_t r = sock_send(fd, buf, n);
    if (r >= 0) return r;
    if (errno != ENOTSOCK) return -errno;
    int e = sys_nonblock(fd);
    if (e) return e;
    return la_write_nosigpipe(fd, buf, n);
}

LA_NOINLINE static int sys_accept(int fd, struct sockaddr *a, socklen_t *l) {
    int e = sys_nonblock(fd);
    if (e) return e;
#if defined(__APPLE__)
    /* no accept4: the flags are set after (a fork + exec on another thread
     * in between may inherit the descriptor, as with any darwin accept) */
    int r = accept(fd, a, l);
    if (r < 0) return -errno;
    fcntl(r, F_SETFD, FD_CLOEXEC);
    fcntl(r, F_SETFL, fcntl(r, F_GETFL) | O_NONBLOCK);
    return r;
#else
    int r = accept4(fd, a, l, SOCK_NONBLOCK | SOCK_CLOEXEC);
    return r >= 0 ? r : -errno;
#endif
}

LA_NOINLINE static int sys_connect(int fd, const struct sockaddr *a, socklen_t l) {
    int e = sys_nonblock(fd);
    if (e) return e;
    int r = connect(fd, a, l);
    return r == 0 ? 0 : -errno;
}

LA_NOINLINE static int sys_sockerr(int fd) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return -errno;
    return -err;
}

static int map_errno(int e) {
    switch (e) {
    case EBADF:
    case ENOTSOCK:
    case EPERM: return ASYNC_E_BADFD;
    case ENOMEM:
    case ENOBUFS: return ASYNC_E_NOMEM;
    case EINVAL: return ASYNC_E_INVAL;
    case ETIMEDOUT: return ASYNC_E_TIMEDOUT;
    case EPIPE:
    case ECONNRESET:
    case ECONNREFUSED: return ASYNC_E_CLOSED;
    default: la_note_os_error(e); return ASYNC_E_SYS;
    }
}

/* For io_uring.c: one mapping, one SO_ERROR read (errno read only in the
 * noinline helper, see the top). */
int la_io_map_errno(int e) { return map_errno(e); }
int la_io_sockerr(int fd) { return sys_sockerr(fd); }
ssize_t la_io_read_now(int fd, void *buf, size_t n) { return sys_read(fd, buf, n); }

/* A read or write of 0 bytes: 0 at once on an open fd (a socket's recv or
 * send of 0 bytes may say EAGAIN, which must not make the call wait for data
 * or room it does not need), else an error. Takes nothing: a datagram stays
 * queued. 0 or -1 with the error set. */
static int zero_len(int fd) {
    int e = sys_fd_open(fd);
    if (e) {
        la_set_error(map_errno(-e));
        return -1;
    }
    return 0;
}

/* The argument checks async_fiber_read and async_fiber_write share: 1 with
 * *early set (-1 with the error recorded, or 0 for a 0-byte call on an open
 * fd) when the call ends here. */

static int io_args(async_fd_t fd, const void *buf, size_t n, int timeout_ms, ssize_t *early) {
    *early = -1;
    if (la_check_timeout(timeout_ms)) return 1;
    /* NULL with bytes to move, or more than the ssize_t result can tell
     * (adversarial pass 8: the kernel's EFAULT came back as ASYNC_E_SYS) */
    if ((!buf && n > 0) || n > (size_t)SSIZE_MAX) {
        la_set_error(ASYNC_E_INVAL);
        return 1;
    }
    if (fd < 0) {
        la_set_error(ASYNC_E_BADFD);
        return 1;
    }
    if (n == 0) {
        *early = zero_len(fd);
        return 1;
    }
    return 0;
}

/* ---- parking on an fd ------------------------------------------------------ */

/* The common end of fd_park and owned_park: called with r->lk held (and
 * the record checked), parks the current fiber as r's waiter for dirs until
 * a wake, the deadline or a cancellation, and unlinks it. A waker of an
 * owned record (event or close) unlinks the waiter it claims under the lock;
 * a plain record's waiters are always unlinked here. 0 or an async_err_t. */
static int park_locked(la_fiber_t *f, la_fdrec_t *r, int fd, int dirs, uint64_t deadline, int owned) {
    la_waiter_t w;
    la_fiber_note(f, LA_WAIT_FD, (uint64_t)(uint32_t)fd | (uint64_t)(dirs & 3) << 32);
    int rc = la_waiter_init(&w, LA_PK_NORMAL);
    if (rc) {
        la_spin_unlock(&r->lk);
        return rc;
    }
    if (dirs & 1) r->rw = &w;
    if (dirs & 2) r->ww = &w;
    la_spin_unlock(&r->lk);
    la_fdwait_add(f, 1);
    int why = la_waiter_wait(&w, deadline);
    la_fdwait_add(f, -1);
    if (!owned || (why != LA_W_READY && why != LA_W_CLOSED)) {
        la_spin_lock(&r->lk);
        if (r->rw == &w) r->rw = NULL;
        if (r->ww == &w) r->ww = NULL;
        la_spin_unlock(&r->lk);
    }
    return la_reason_err(why);
}

/* Parks the current fiber until fd is ready for dirs (1 read, 2 write, 3
 * either) or the deadline. Returns 0 (maybe ready: retry the syscall) or an
 * async_err_t. */
static int fd_park(la_fiber_t *f, int fd, int dirs, uint64_t deadline) {
    la_sched_t *s = f->s;
    la_fdrec_t *r = fdrec(s, fd);
    if (!r) return fd < 0 ? ASYNC_E_BADFD : ASYNC_E_NOMEM;
    /* A deadline already passed ends the wait, even if the fd keeps
     * reporting a condition (HUP, ERR) that its syscall does not clear. */
    if (deadline && la_now_ns() >= deadline) return ASYNC_E_TIMEDOUT;
    la_spin_lock(&r->lk);
    if (((dirs & 1) && r->rw) || ((dirs & 2) && r->ww)) {
        la_spin_unlock(&r->lk);
        return ASYNC_E_BUSY;
    }
    if (atomic_load_explicit(&r->owned, memory_order_relaxed)) {
        /* owned since the caller looked: retry, it takes the owned path */
        la_spin_unlock(&r->lk);
        return 0;
    }
    /* Arm for our directions and those of a waiter already parked (under
     * the lock: the kernel's mask follows the record's waiters). */
    r->fd = fd;
    unsigned want = arm_mask(r) | ((dirs & 1) ? LA_PF_IN : 0u) | ((dirs & 2) ? LA_PF_OUT : 0u);
    int e = sys_arm(s, r, want);
    if (e) {
        la_spin_unlock(&r->lk);
        return e == -ENOMEM || e == -ENOSPC ? ASYNC_E_NOMEM : ASYNC_E_BADFD;
    }
    return park_locked(f, r, fd, dirs, deadline, 0);
}

/* Parks the current fiber on its scheduler's owned record sn->r until an
 * event for dirs newer than sn's counts, the end of the ownership or the
 * deadline; no poller call. Returns 0 (retry the syscall: maybe ready, or
 * the fd is no longer owned and the retry takes the other path) or an
 * async_err_t (ASYNC_E_CLOSED: the fd was closed through the library since
 * sn was taken). */
static int owned_park(la_fiber_t *f, int fd, int dirs, const la_fdsnap_t *sn, uint64_t deadline) {
    la_fdrec_t *r = sn->r;
    if (deadline && la_now_ns() >= deadline) return ASYNC_E_TIMEDOUT;
    la_spin_lock(&r->lk);
    if (atomic_load_explicit(&r->gen, memory_order_relaxed) != sn->gen) {
        la_spin_unlock(&r->lk);
        return ASYNC_E_CLOSED;
    }
    if (!atomic_load_explicit(&r->owned, memory_order_relaxed) ||
        ((dirs & 1) && atomic_load_explicit(&r->sin, memory_order_relaxed) != sn->sin) ||
        ((dirs & 2) && atomic_load_explicit(&r->sout, memory_order_relaxed) != sn->sout)) {
        la_spin_unlock(&r->lk);
        return 0;
    }
    if (((dirs & 1) && r->rw) || ((dirs & 2) && r->ww)) {
        la_spin_unlock(&r->lk);
        return ASYNC_E_BUSY;
    }
    return park_locked(f, r, fd, dirs, deadline, 1);
}

/* Waits (thread or fiber) until fd is ready for dir; sn: what the caller
 * saw of the fd's record before its syscall. 0 or an async_err_t. */
static int wait_dir(int fd, int dir, uint64_t deadline, int timeout_ms, const la_fdsnap_t *sn) {
    if (timeout_ms == 0) return ASYNC_E_TIMEDOUT;
    la_fiber_t *f = la_current_fiber();
    if (f && sn->owned) return owned_park(f, fd, dir ? 2 : 1, sn, deadline);
    if (f) return fd_park(f, fd, dir ? 2 : 1, deadline);
    int r = sys_poll1(fd, dir ? POLLOUT : POLLIN, la_ms_left(deadline));
    if (r == -EINTR) return 0;
    if (r < 0) return map_errno(-r);
    if (r == 0) return ASYNC_E_TIMEDOUT;
    return 0;
}

/* The events for async_fiber_wait_fd from poll's revents re; asked: the
 * caller's events. A hang-up is READ|CLOSE when READ was asked: a read does
 * not wait then (it returns 0, or the error), whether or not the kernel also
 * says POLLIN (a socket does, an empty pipe or a hung-up terminal does
 * not); the Windows path says the same. */
static uint32_t from_poll(int re, uint32_t asked) {
    uint32_t ev = 0;
    if (re & POLLIN) ev |= ASYNC_EVENT_READ;
    if (re & POLLOUT) ev |= ASYNC_EVENT_WRITE;
    if (re & POLLERR) ev |= ASYNC_EVENT_ERROR;
    if (re & (POLLHUP | POLLRDHUP)) ev |= ASYNC_EVENT_CLOSE | (asked & ASYNC_EVENT_READ);
    return ev;
}

/* ---- owned fds ------------------------------------------------------------ */

/* The owner of every fd number (the handle of the scheduler that owns it,
 * 0: none), process-wide: changed under own_mu, which is taken before any
 * record's lock. */
static pthread_mutex_t own_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(uint64_t *) own_chunks[LA_FD_CHUNKS];

static uint64_t *owner_slot(int fd, int create) {
    if (fd < 0 || fd >= LA_FD_CHUNK * LA_FD_CHUNKS) return NULL;
    size_t ci = (size_t)fd / LA_FD_CHUNK;
    uint64_t *c = atomic_load_explicit(&own_chunks[ci], memory_order_acquire);
    if (!c && create) {
        c = calloc(LA_FD_CHUNK, sizeof *c); /* under own_mu */
        if (c) atomic_store_explicit(&own_chunks[ci], c, memory_order_release);
    }
    return c ? &c[(size_t)fd % LA_FD_CHUNK] : NULL;
}

/* 1 if fd is a TCP socket (the owned read hint, see the top). */
LA_NOINLINE static int sys_is_tcp(int fd) {
#if defined(__linux__) && defined(SO_PROTOCOL)
    int proto = 0;
    socklen_t len = sizeof proto;
    return getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) == 0 && proto == IPPROTO_TCP;
#else
    (void)fd;
    return 0; /* no EPOLLPRI to tell urgent data: no hint */
#endif
}

/* close(2) is a cancellation point: glibc acts on a pending deferred cancel
 * before the system call, so async_fiber_close from a host thread whose
 * cancel is pending unwound with the ownership already dropped and the fd
 * still open (no libasync call is a cancellation point, include/async.h). */
LA_NOINLINE static int sys_close(int fd) {
    int cs = LA_CANCEL_KEPT;
    la_nocancel_enter(&cs);
    int r = close(fd) == 0 || errno == EINTR ? 0 : -errno;
    la_nocancel_leave(&cs);
    return r;
}

/* Ends the ownership of r (under its lock): calls that began before fail
 * with ASYNC_E_CLOSED instead of parking (gen), and the fibers parked on it
 * are claimed into wake[] for wake_closed. */
static void disown_locked(la_fdrec_t *r, la_waiter_t *wake[2]) {
    atomic_store(&r->owned, 0);
    atomic_store(&r->gen, atomic_load_explicit(&r->gen, memory_order_relaxed) + 1);
    atomic_store_explicit(&r->drained, 0, memory_order_relaxed);
    wake[0] = wake[1] = NULL;
    if (r->rw && la_waiter_claim(r->rw, LA_W_CLOSED)) wake[0] = r->rw;
    if (r->ww && r->ww != r->rw && la_waiter_claim(r->ww, LA_W_CLOSED)) wake[1] = r->ww;
    r->rw = r->ww = NULL;
}

/* Signals the waiters disown_locked claimed (after the record's lock). */
static void wake_closed(la_waiter_t *wake[2]) {
    if (wake[0]) la_waiter_signal(wake[0]);
    if (wake[1]) la_waiter_signal(wake[1]);
}

/* Ends the ownership of r (s's record of fd), if any: the registration goes
 * (del), and what waits wakes with ASYNC_E_CLOSED. 1 if it was owned. */
static int disown_rec(la_sched_t *s, la_fdrec_t *r, int fd, int del) {
    la_waiter_t *wake[2];
    la_spin_lock(&r->lk);
    if (!atomic_load_explicit(&r->owned, memory_order_relaxed)) {
        la_spin_unlock(&r->lk);
        return 0;
    }
    if (del) la_poller_disown(&s->poller, fd);
    disown_locked(r, wake);
    la_spin_unlock(&r->lk);
    wake_closed(wake);
    return 1;
}

static int own_err(int e) {
    switch (e) {
    case -ENOMEM:
    case -ENOSPC: return ASYNC_E_NOMEM;
    case -EBADF:
    case -EPERM:
    case -EINVAL: return ASYNC_E_BADFD;
    default: la_note_os_error(-e); return ASYNC_E_SYS;
    }
}

/* Makes fd owned by s (see the top). fresh: the kernel just handed the
 * number out (accept), so an owner it still has is stale. 0 or an
 * async_err_t. */
static int own_fd_locked(la_sched_t *s, la_fdrec_t *r, int fd, int fresh);

static int own_fd(la_sched_t *s, int fd, int fresh) {
    la_fdrec_t *r = fdrec(s, fd);
    if (!r) return fd < 0 ? ASYNC_E_BADFD : ASYNC_E_NOMEM;
    int was = -1;
    int e = fresh ? 0 : sys_nonblock_undoable(fd, &was); /* accept made it non-blocking */
    if (e) return map_errno(-e);
    int rc = own_fd_locked(s, r, fd, fresh);
    /* a failed call leaves the file as it found it */
    if (rc && was != -1) sys_setfl(fd, was);
    return rc;
}

/* own_fd once fd is non-blocking. */
static int own_fd_locked(la_sched_t *s, la_fdrec_t *r, int fd, int fresh) {
    int e;
    int tcp = sys_is_tcp(fd);
    int rc = 0;
    pthread_mutex_lock(&own_mu);
    uint64_t *slot = owner_slot(fd, 1);
    if (!slot) {
        pthread_mutex_unlock(&own_mu);
        return ASYNC_E_NOMEM;
    }
    uint64_t cur = *slot;
    if (cur && cur != s->handle) {
        la_sched_t *o = la_sched_get((async_sched_t *)(uintptr_t)cur);
        if (o) {
            la_fdrec_t *orec = fdrec(o, fd);
            /* Is the file o owns still behind the number? Fresh: no (the
             * kernel just handed the number out). Else ask o's poller:
             * registering the number there fails with EEXIST while o's
             * registration lives (it goes with the file's last close); if
             * it succeeds, the file was closed with close(2) behind o's
             * back, and the registration just made is taken back. */
            int stale = fresh;
            if (!fresh && orec) {
                la_spin_lock(&orec->lk);
                if (!atomic_load_explicit(&orec->owned, memory_order_relaxed)) {
                    stale = 1;
                } else if (la_poller_own(&o->poller, fd, orec, 0) == 0) {
                    la_poller_disown(&o->poller, fd);
                    stale = 1;
                }
                la_spin_unlock(&orec->lk);
            }
            /* o's parked fibers (if any) wait for a file that is gone */
            if (stale && orec) disown_rec(o, orec, fd, 0);
            la_sched_put(o);
            if (!stale) {
                pthread_mutex_unlock(&own_mu);
                return ASYNC_E_EXISTS;
            }
        }
    }
    la_waiter_t *wake[2] = {NULL, NULL};
    la_spin_lock(&r->lk);
    e = la_poller_own(&s->poller, fd, r, fresh || !atomic_load_explicit(&r->owned, memory_order_relaxed));
    if (e == -EEXIST) {
        /* still registered: truly owned */
        la_spin_unlock(&r->lk);
        pthread_mutex_unlock(&own_mu);
        return ASYNC_E_EXISTS;
    }
    /* Owned but not registered (or fresh): the file behind the number was
     * closed with close(2) and its registration went with it. What waits
     * for the old file wakes with ASYNC_E_CLOSED. */
    if (atomic_load_explicit(&r->owned, memory_order_relaxed)) disown_locked(r, wake);
    if (e == 0) {
        r->fd = fd;
        atomic_store_explicit(&r->tcp, (char)tcp, memory_order_relaxed);
        atomic_store_explicit(&r->drained, 0, memory_order_relaxed);
        atomic_store(&r->owned, 1);
        *slot = s->handle;
    } else {
        rc = own_err(e);
        *slot = 0;
    }
    la_spin_unlock(&r->lk);
    pthread_mutex_unlock(&own_mu);
    wake_closed(wake);
    return rc;
}

/* ---- public API ------------------------------------------------------------- */

/* The scheduler's end: the fds it owns stay open, owned by nobody (their
 * registrations go with the poller). */
static void owners_drop(la_sched_t *s) {
    pthread_mutex_lock(&own_mu);
    for (size_t ci = 0; ci < LA_FD_CHUNKS; ci++) {
        la_fdrec_t *c = atomic_load(&s->fdchunks[ci]);
        if (!c) continue;
        for (size_t i = 0; i < LA_FD_CHUNK; i++) {
            if (!atomic_load_explicit(&c[i].owned, memory_order_relaxed)) continue;
            uint64_t *slot = owner_slot((int)(ci * LA_FD_CHUNK + i), 0);
            if (slot && *slot == s->handle) *slot = 0;
        }
    }
    pthread_mutex_unlock(&own_mu);
}

int async_fiber_fd_open(async_sched_t *sh, async_fd_t fd) {
    LA_ENTRY(-1);
    la_sched_t *s;
    if (sh) {
        s = la_sched_get(sh);
        if (!s) {
            la_set_error(ASYNC_E_BADHANDLE);
            return -1;
        }
    } else {
        la_fiber_t *f = la_current_fiber();
        if (!f) {
            la_set_error(ASYNC_E_STATE);
            return -1;
        }
        s = f->s;
        atomic_fetch_add(&s->refs, 1);
    }
    int rc = fd < 0 ? ASYNC_E_BADFD : own_fd(s, fd, 0);
    la_sched_put(s);
    if (rc) {
        la_set_error(rc);
        return -1;
    }
    return 0;
}

int async_fiber_close(async_fd_t fd) {
    LA_ENTRY(-1);
    if (fd < 0) {
        la_set_error(ASYNC_E_BADFD);
        return -1;
    }
    pthread_mutex_lock(&own_mu);
    uint64_t *slot = owner_slot(fd, 0);
    if (slot && *slot) {
        la_sched_t *o = la_sched_get((async_sched_t *)(uintptr_t)*slot);
        *slot = 0;
        if (o) {
            la_fdrec_t *r = fdrec(o, fd);
            if (r) disown_rec(o, r, fd, 1);
#if defined(LA_URING)
            /* calls that went to a ring before fd was owned (io_uring.c):
             * not parked here, and their ops keep the file open */
            la_uring_cancel_fd(o, fd);
#endif
            la_sched_put(o);
        }
    }
    pthread_mutex_unlock(&own_mu);
    int e = sys_close(fd);
    if (e) {
        la_set_error(map_errno(-e));
        return -1;
    }
    return 0;
}

int async_fiber_wait_fd(async_fd_t fd, uint32_t events, int timeout_ms) {
    LA_ENTRY(-1);
    if (la_check_timeout(timeout_ms)) return -1;
    if (events == 0 || (events & ~(ASYNC_EVENT_READ | ASYNC_EVENT_WRITE))) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    if (fd < 0) {
        la_set_error(ASYNC_E_BADFD);
        return -1;
    }
    short pev = (short)(((events & ASYNC_EVENT_READ) ? POLLIN | POLLRDHUP : 0) |
                        ((events & ASYNC_EVENT_WRITE) ? POLLOUT : 0));
    la_fiber_t *f = la_current_fiber();
    uint64_t deadline = la_deadline(timeout_ms);
    if (!f) {
        int r;
        do r = sys_poll1(fd, pev, la_ms_left(deadline));
        while (r == -EINTR);
        if (r < 0) {
            la_set_error(map_errno(-r));
            return -1;
        }
        if (r == 0) {
            la_set_error(ASYNC_E_TIMEDOUT);
            return -1;
        }
        return (int)from_poll(r, events);
    }
    la_fdrec_t *rec = fdrec(f->s, fd);
    la_fdsnap_t sn = LA_FDSNAP_START;
    for (;;) {
        if (fd_snap_closed(rec, &sn)) return -1;
        int r = sys_poll1(fd, pev, 0);
        if (r < 0) {
            la_set_error(map_errno(-r));
            return -1;
        }
        if (r > 0) return (int)from_poll(r, events);
        if (timeout_ms == 0) {
            la_set_error(ASYNC_E_TIMEDOUT);
            return -1;
        }
        int dirs = (int)(events & (ASYNC_EVENT_READ | ASYNC_EVENT_WRITE));
        int rc = sn.owned ? owned_park(f, fd, dirs, &sn, deadline) : fd_park(f, fd, dirs, deadline);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
}

ssize_t async_fiber_read(async_fd_t fd, void *buf, size_t n, int timeout_ms) {
    LA_ENTRY(-1);
    ssize_t early;
    if (io_args(fd, buf, n, timeout_ms, &early)) return early;
#if defined(LA_URING)
    if (uring_here(fd) && la_uring_read(fd, buf, n, timeout_ms, &early)) return early; /* io_uring.c */
#endif
    uint64_t deadline = la_deadline(timeout_ms);
    la_fiber_t *f = la_current_fiber();
    la_fdrec_t *rec = f ? fdrec(f->s, fd) : NULL;
    la_fdsnap_t sn = LA_FDSNAP_START;
    fd_snap(rec, &sn);
    /* The last read drained this stream: wait first (see the top). */
    if (rec && timeout_ms != 0 && atomic_load_explicit(&rec->drained, memory_order_relaxed) &&
        (sn.owned ? atomic_load_explicit(&rec->tcp, memory_order_relaxed) &&
                        atomic_load_explicit(&rec->dseq, memory_order_relaxed) == sn.sin
                  : atomic_load_explicit(&rec->stream, memory_order_relaxed))) {
        int rc = wait_dir(fd, 0, deadline, timeout_ms, &sn);
        /* Other errors (the number now names another kind of file, say):
         * the read below reports what applies. */
        if (rc == ASYNC_E_TIMEDOUT || rc == ASYNC_E_CANCELLED || rc == ASYNC_E_BUSY || rc == ASYNC_E_CLOSED) {
            la_set_error(rc);
            return -1;
        }
        if (fd_snap_closed(rec, &sn)) return -1;
    }
    for (;;) {
        ssize_t r = sys_read(fd, buf, n);
        if (r >= 0) {
            if (rec) {
                int drained = r > 0 && (size_t)r < n;
                if (drained && sn.owned) atomic_store_explicit(&rec->dseq, sn.sin, memory_order_relaxed);
                atomic_store_explicit(&rec->drained, (char)drained, memory_order_relaxed);
            }
            return r;
        }
        if (r == -EINTR) continue;
        if (r != -EAGAIN && r != -EWOULDBLOCK) {
            la_set_error(map_errno((int)-r));
            return -1;
        }
        int rc = wait_dir(fd, 0, deadline, timeout_ms, &sn);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
        if (fd_snap_closed(rec, &sn)) return -1;
    }
}

ssize_t async_fiber_write(async_fd_t fd, const void *buf, size_t n, int timeout_ms) {
    LA_ENTRY(-1);
    ssize_t early;
    if (io_args(fd, buf, n, timeout_ms, &early)) return early;
    size_t done = 0;
#if defined(LA_URING)
    if (uring_here(fd) && la_uring_write(fd, buf, n, timeout_ms, &early, &done)) return early; /* io_uring.c */
#endif
    uint64_t deadline = la_deadline(timeout_ms);
    la_fiber_t *f = la_current_fiber();
    la_fdrec_t *rec = f ? fdrec(f->s, fd) : NULL;
    la_fdsnap_t sn = LA_FDSNAP_START;
    while (done < n) {
        if (fd_snap_closed(rec, &sn)) return -1;
        ssize_t r = sys_write(fd, (const char *)buf + done, n - done);
        if (r >= 0) {
            done += (size_t)r;
            continue;
        }
        if (r == -EINTR) continue;
        if (r != -EAGAIN && r != -EWOULDBLOCK) {
            la_set_error(map_errno((int)-r));
            return -1;
        }
        int rc = wait_dir(fd, 1, deadline, timeout_ms, &sn);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
    return (ssize_t)n;
}

async_fd_t async_fiber_accept(async_fd_t lfd, struct sockaddr *addr, socklen_t *len, int timeout_ms) {
    LA_ENTRY(-1);
    if (la_check_timeout(timeout_ms)) return -1;
    if ((addr && !len) || lfd < 0) {
        la_set_error(lfd < 0 ? ASYNC_E_BADFD : ASYNC_E_INVAL);
        return -1;
    }
#if defined(LA_URING)
    int ur;
    if (uring_here(lfd) && la_uring_accept(lfd, addr, len, timeout_ms, &ur)) return ur; /* io_uring.c */
#endif
    uint64_t deadline = la_deadline(timeout_ms);
    la_fiber_t *f = la_current_fiber();
    la_fdrec_t *rec = f ? fdrec(f->s, lfd) : NULL;
    la_fdsnap_t sn = LA_FDSNAP_START;
    for (;;) {
        if (fd_snap_closed(rec, &sn)) return -1;
        int r = sys_accept(lfd, addr, len);
        if (r >= 0) {
            /* accepted on a socket this scheduler owns: owned too (the
             * kernel just handed the number out, so a stale owner goes);
             * if it cannot be registered it stays a plain descriptor */
            if (sn.owned) own_fd(f->s, r, 1);
            return r;
        }
        if (r == -EINTR || r == -ECONNABORTED) continue;
        if (r != -EAGAIN && r != -EWOULDBLOCK) {
            la_set_error(r == -EMFILE || r == -ENFILE ? ASYNC_E_NOMEM : map_errno(-r));
            return -1;
        }
        int rc = wait_dir(lfd, 0, deadline, timeout_ms, &sn);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
}

int async_fiber_connect(async_fd_t fd, const struct sockaddr *addr, socklen_t len, int timeout_ms) {
    LA_ENTRY(-1);
    if (la_check_timeout(timeout_ms)) return -1;
    if (!addr) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    if (fd < 0) {
        la_set_error(ASYNC_E_BADFD);
        return -1;
    }
#if defined(LA_URING)
    int ur;
    if (uring_here(fd) && la_uring_connect(fd, addr, len, timeout_ms, &ur)) return ur; /* io_uring.c */
#endif
    la_fiber_t *f = la_current_fiber();
    la_fdrec_t *rec = f ? fdrec(f->s, fd) : NULL;
    la_fdsnap_t sn = LA_FDSNAP_START;
    fd_snap(rec, &sn);
    int r = sys_connect(fd, addr, len);
    if (r == 0) return 0;
    /* EALREADY: a connect of this socket is in progress (one that timed out,
     * or the host's own non-blocking one): wait for its result as for ours
     * (adversarial pass 8: it failed with ASYNC_E_SYS) */
    if (r != -EINPROGRESS && r != -EINTR && r != -EALREADY) {
        la_set_error(map_errno(-r));
        return -1;
    }
    uint64_t deadline = la_deadline(timeout_ms);
    for (;;) {
        int rc = wait_dir(fd, 1, deadline, timeout_ms, &sn);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
        if (fd_snap_closed(rec, &sn)) return -1;
        int pr = sys_poll1(fd, POLLOUT, 0);
        if (pr < 0) {
            la_set_error(map_errno(-pr));
            return -1;
        }
        if (pr == 0) continue;
        int e = sys_sockerr(fd);
        if (e == 0) return 0;
        la_set_error(map_errno(-e));
        return -1;
    }
}
