//go:build !windows

/* Owned fds (io.c tells the design): async_fiber_fd_open and
 * async_fiber_close, the process-wide owner of each fd number, and the end
 * of an ownership (its parked fibers wake with ASYNC_E_CLOSED). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fiber_int.h"

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

/* close(2) without its cancellation point: glibc acts on a pending deferred
 * cancel before the system call, and async_fiber_close from a host thread
 * whose cancel is pending must not unwind with the ownership dropped and
 * the fd still open (no libasync call is a cancellation point,
 * include/async.h). */
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
    la_fdrec_set_rw(r, NULL);
    r->ww = NULL;
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

/* The host's bug made visible: an owned fd's file was closed with close(2)
 * (or replaced with dup2), found when its number is owned again. Logged
 * after every lock is let go (the hook is the host's code). */
static void report_closed_behind(int fd) {
    la_log(ASYNC_LOG_WARN, "fd %d: owned descriptor was closed with close(2), not async_fiber_close", fd);
}

/* Makes fd owned by s (see the top). fresh: the kernel just handed the
 * number out (accept), so an owner it still has is stale. 0 or an
 * async_err_t. */
static int own_fd_locked(la_sched_t *s, la_fdrec_t *r, int fd, int fresh);

int la_io_own_fd(la_sched_t *s, int fd, int fresh) {
    la_fdrec_t *r = la_fdrec(s, fd);
    if (!r) return fd < 0 ? ASYNC_E_BADFD : ASYNC_E_NOMEM;
    int was = -1;
    int e = fresh ? 0 : la_io_nonblock_undoable(fd, &was); /* accept made it non-blocking */
    if (e) return la_io_map_errno(-e);
    int rc = own_fd_locked(s, r, fd, fresh);
    /* a failed call leaves the file as it found it */
    if (rc && was != -1) la_io_setfl(fd, was);
    return rc;
}

/* la_io_own_fd once fd is non-blocking. */
static int own_fd_locked(la_sched_t *s, la_fdrec_t *r, int fd, int fresh) {
    int e, closed_behind = 0;
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
            la_fdrec_t *orec = la_fdrec(o, fd);
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
            if (stale && orec && disown_rec(o, orec, fd, 0)) closed_behind = 1;
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
    if (atomic_load_explicit(&r->owned, memory_order_relaxed)) {
        disown_locked(r, wake);
        closed_behind = 1;
    }
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
    if (closed_behind) report_closed_behind(fd);
    return rc;
}

/* The scheduler's end: the fds it owns stay open, owned by nobody (their
 * registrations go with the poller). */
void la_io_owners_drop(la_sched_t *s) {
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
        s = la_sched_use(sh);
        if (!s) return -1;
    } else {
        la_fiber_t *f = la_current_fiber();
        if (!f) {
            la_set_error(ASYNC_E_STATE);
            return -1;
        }
        s = f->s;
        atomic_fetch_add(&s->refs, 1);
    }
    int rc = fd < 0 ? ASYNC_E_BADFD : la_io_own_fd(s, fd, 0);
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
            la_fdrec_t *r = la_fdrec(o, fd);
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
        la_set_error(la_io_map_errno(-e));
        return -1;
    }
    return 0;
}
