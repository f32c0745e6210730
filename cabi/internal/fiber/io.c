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
 * errno is read only inside the small noinline sys_* helpers: after a park
 * the fiber may run on another thread, and gcc may cache errno's address. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

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
};


int la_io_init(la_sched_t *s) {
    pthread_mutex_init(&s->fdmu, NULL);
    s->fdchunks = calloc(LA_FD_CHUNKS, sizeof *s->fdchunks);
    return s->fdchunks ? 0 : -1;
}

void la_io_free(la_sched_t *s) {
    if (!s->fdchunks) return;
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

LA_NOINLINE static int sys_arm(la_sched_t *s, la_fdrec_t *r, unsigned want);

static unsigned arm_mask(la_fdrec_t *r) { return (r->rw ? LA_PF_IN : 0u) | (r->ww ? LA_PF_OUT : 0u); }

/* Called by whichever worker polled. */
void la_io_event(void *ctx, void *p, unsigned ev) {
    la_sched_t *s = ctx;
    la_fdrec_t *r = p;
    la_waiter_t *wake[2] = {NULL, NULL};
    la_spin_lock(&r->lk);
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
    /* the event disarmed the fd: re-arm for a waiter still there (rare) */
    if (r->rw || r->ww) sys_arm(s, r, arm_mask(r));
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
    if (timeout != 0) la_nocancel_enter(&cs); /* not a cancellation point (base.h) */
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

LA_NOINLINE static ssize_t sys_read(int fd, void *buf, size_t n) {
    ssize_t r = recv(fd, buf, n, MSG_DONTWAIT);
    if (r >= 0) return r;
    if (errno != ENOTSOCK) return -errno;
    int e = sys_nonblock(fd);
    if (e) return e;
    r = read(fd, buf, n);
    return r >= 0 ? r : -errno;
}

/* write(2) to a non-socket (a pipe, say) without SIGPIPE: a write to a pipe
 * whose reader closed raises SIGPIPE at the writing thread (on a host thread
 * the default action, or the Go runtime's handler, kills the process). The
 * signal is blocked around the write, and the one the write raised is taken
 * back with sigtimedwait, unless one was already pending before (that one
 * is the host's: it stays). The thread's own pending signals are taken
 * before the process's, so a SIGPIPE sent to the process meanwhile stays
 * too. Fiber workers block SIGPIPE for good (worker_main): there only the
 * take-back runs, and only after EPIPE. */
LA_NOINLINE static ssize_t sys_write_nosigpipe(int fd, const void *buf, size_t n) {
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
    ssize_t r = send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) return r;
    if (errno != ENOTSOCK) return -errno;
    int e = sys_nonblock(fd);
    if (e) return e;
    return sys_write_nosigpipe(fd, buf, n);
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
static int check_timeout(int timeout_ms);

static int io_args(async_fd_t fd, const void *buf, size_t n, int timeout_ms, ssize_t *early) {
    *early = -1;
    if (check_timeout(timeout_ms)) return 1;
    if (!buf && n > 0) {
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
    la_waiter_t w;
    la_spin_lock(&r->lk);
    if (((dirs & 1) && r->rw) || ((dirs & 2) && r->ww)) {
        la_spin_unlock(&r->lk);
        return ASYNC_E_BUSY;
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
    la_fiber_note(f, LA_WAIT_FD, (uint64_t)(uint32_t)fd | (uint64_t)(dirs & 3) << 32);
    int rc = la_waiter_init(&w, LA_PK_NORMAL);
    if (rc) {
        la_spin_unlock(&r->lk);
        return rc;
    }
    if (dirs & 1) r->rw = &w;
    if (dirs & 2) r->ww = &w;
    la_spin_unlock(&r->lk);
    atomic_fetch_add(&s->nfdwait, 1);
    int why = la_waiter_wait(&w, deadline);
    atomic_fetch_sub(&s->nfdwait, 1);
    la_spin_lock(&r->lk);
    if (r->rw == &w) r->rw = NULL;
    if (r->ww == &w) r->ww = NULL;
    la_spin_unlock(&r->lk);
    return la_reason_err(why);
}

static int check_timeout(int timeout_ms) {
    if (timeout_ms < -1) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    return 0;
}

static int ms_left(uint64_t deadline) {
    if (!deadline) return -1;
    uint64_t now = la_now_ns();
    if (now >= deadline) return 0;
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/* Waits (thread or fiber) until fd is ready for dir; 0 or an async_err_t. */
static int wait_dir(int fd, int dir, uint64_t deadline, int timeout_ms) {
    if (timeout_ms == 0) return ASYNC_E_TIMEDOUT;
    la_fiber_t *f = la_current_fiber();
    if (f) return fd_park(f, fd, dir ? 2 : 1, deadline);
    int r = sys_poll1(fd, dir ? POLLOUT : POLLIN, ms_left(deadline));
    if (r == -EINTR) return 0;
    if (r < 0) return map_errno(-r);
    if (r == 0) return ASYNC_E_TIMEDOUT;
    return 0;
}

static uint32_t from_poll(int re) {
    uint32_t ev = 0;
    if (re & POLLIN) ev |= ASYNC_EVENT_READ;
    if (re & POLLOUT) ev |= ASYNC_EVENT_WRITE;
    if (re & POLLERR) ev |= ASYNC_EVENT_ERROR;
    if (re & (POLLHUP | POLLRDHUP)) ev |= ASYNC_EVENT_CLOSE;
    return ev;
}

/* ---- public API ------------------------------------------------------------- */

int async_fiber_wait_fd(async_fd_t fd, uint32_t events, int timeout_ms) {
    LA_ENTRY(-1);
    if (check_timeout(timeout_ms)) return -1;
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
        do r = sys_poll1(fd, pev, ms_left(deadline));
        while (r == -EINTR);
        if (r < 0) {
            la_set_error(map_errno(-r));
            return -1;
        }
        if (r == 0) {
            la_set_error(ASYNC_E_TIMEDOUT);
            return -1;
        }
        return (int)from_poll(r);
    }
    for (;;) {
        int r = sys_poll1(fd, pev, 0);
        if (r < 0) {
            la_set_error(map_errno(-r));
            return -1;
        }
        if (r > 0) return (int)from_poll(r);
        if (timeout_ms == 0) {
            la_set_error(ASYNC_E_TIMEDOUT);
            return -1;
        }
        int rc = fd_park(f, fd, (int)(events & (ASYNC_EVENT_READ | ASYNC_EVENT_WRITE)), deadline);
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
    uint64_t deadline = la_deadline(timeout_ms);
    la_fiber_t *f = la_current_fiber();
    la_fdrec_t *rec = f ? fdrec(f->s, fd) : NULL;
    /* The last read drained this stream: wait first (see the top). */
    if (rec && timeout_ms != 0 && atomic_load_explicit(&rec->stream, memory_order_relaxed) &&
        atomic_load_explicit(&rec->drained, memory_order_relaxed)) {
        int rc = wait_dir(fd, 0, deadline, timeout_ms);
        /* Other errors (the number now names another kind of file, say):
         * the read below reports what applies. */
        if (rc == ASYNC_E_TIMEDOUT || rc == ASYNC_E_CANCELLED || rc == ASYNC_E_BUSY) {
            la_set_error(rc);
            return -1;
        }
    }
    for (;;) {
        ssize_t r = sys_read(fd, buf, n);
        if (r >= 0) {
            if (rec) atomic_store_explicit(&rec->drained, (char)(r > 0 && (size_t)r < n), memory_order_relaxed);
            return r;
        }
        if (r == -EINTR) continue;
        if (r != -EAGAIN && r != -EWOULDBLOCK) {
            la_set_error(map_errno((int)-r));
            return -1;
        }
        int rc = wait_dir(fd, 0, deadline, timeout_ms);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
}

ssize_t async_fiber_write(async_fd_t fd, const void *buf, size_t n, int timeout_ms) {
    LA_ENTRY(-1);
    ssize_t early;
    if (io_args(fd, buf, n, timeout_ms, &early)) return early;
    uint64_t deadline = la_deadline(timeout_ms);
    size_t done = 0;
    while (done < n) {
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
        int rc = wait_dir(fd, 1, deadline, timeout_ms);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
    return (ssize_t)n;
}

async_fd_t async_fiber_accept(async_fd_t lfd, struct sockaddr *addr, socklen_t *len, int timeout_ms) {
    LA_ENTRY(-1);
    if (check_timeout(timeout_ms)) return -1;
    if ((addr && !len) || lfd < 0) {
        la_set_error(lfd < 0 ? ASYNC_E_BADFD : ASYNC_E_INVAL);
        return -1;
    }
    uint64_t deadline = la_deadline(timeout_ms);
    for (;;) {
        int r = sys_accept(lfd, addr, len);
        if (r >= 0) return r;
        if (r == -EINTR || r == -ECONNABORTED) continue;
        if (r != -EAGAIN && r != -EWOULDBLOCK) {
            la_set_error(r == -EMFILE || r == -ENFILE ? ASYNC_E_NOMEM : map_errno(-r));
            return -1;
        }
        int rc = wait_dir(lfd, 0, deadline, timeout_ms);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
}

int async_fiber_connect(async_fd_t fd, const struct sockaddr *addr, socklen_t len, int timeout_ms) {
    LA_ENTRY(-1);
    if (check_timeout(timeout_ms)) return -1;
    if (!addr) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    if (fd < 0) {
        la_set_error(ASYNC_E_BADFD);
        return -1;
    }
    int r = sys_connect(fd, addr, len);
    if (r == 0) return 0;
    if (r != -EINPROGRESS && r != -EINTR) {
        la_set_error(map_errno(-r));
        return -1;
    }
    uint64_t deadline = la_deadline(timeout_ms);
    for (;;) {
        int rc = wait_dir(fd, 1, deadline, timeout_ms);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
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
