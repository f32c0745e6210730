//go:build !windows

/* Parking a fiber on an fd (io.c tells the design): one-shot parks that arm
 * the poller, parks on owned records that wait for an event count to move,
 * and the wait of a call that would block (a plain thread polls). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>

#include "fiber_int.h"

/* ---- parking on an fd ------------------------------------------------------ */

/* The common end of la_io_fd_park and la_io_owned_park: called with r->lk held (and
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
    if (dirs & 1) la_fdrec_set_rw(r, &w);
    if (dirs & 2) r->ww = &w;
    la_spin_unlock(&r->lk);
    la_fdwait_add(f, 1);
    int why = la_waiter_wait(&w, deadline);
    la_fdwait_add(f, -1);
    if (!owned || (why != LA_W_READY && why != LA_W_CLOSED)) {
        la_spin_lock(&r->lk);
        if (r->rw == &w) la_fdrec_set_rw(r, NULL);
        if (r->ww == &w) r->ww = NULL;
        la_spin_unlock(&r->lk);
    }
    return la_reason_err(why);
}

/* Parks the current fiber until fd is ready for dirs (1 read, 2 write, 3
 * either) or the deadline. Returns 0 (maybe ready: retry the syscall) or an
 * async_err_t. */
int la_io_fd_park(la_fiber_t *f, int fd, int dirs, uint64_t deadline) {
    la_sched_t *s = f->s;
    la_fdrec_t *r = la_fdrec(s, fd);
    if (!r) return fd < 0 ? ASYNC_E_BADFD : ASYNC_E_NOMEM;
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
    unsigned want = la_io_arm_mask(r) | ((dirs & 1) ? LA_PF_IN : 0u) | ((dirs & 2) ? LA_PF_OUT : 0u);
    int e = la_io_arm(s, r, want);
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
int la_io_owned_park(la_fiber_t *f, int fd, int dirs, const la_fdsnap_t *sn, uint64_t deadline) {
    la_fdrec_t *r = sn->r;
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

/* The deadline of a call's next wait, in *dl (LA_DL_UNSET before its
 * first): taken from the clock at the first wait (timeout_ms > 0 ms away:
 * not passed), checked at a later one. 0, or ASYNC_E_TIMEDOUT: it has
 * passed, which ends the call even if the fd keeps reporting a condition
 * (HUP, ERR) that its syscall does not clear. */
int la_io_next_deadline(uint64_t *dl, int timeout_ms) {
    if (*dl == LA_DL_UNSET) {
        *dl = la_deadline(timeout_ms);
        return 0;
    }
    return *dl && la_now_ns() >= *dl ? ASYNC_E_TIMEDOUT : 0;
}

/* Waits (thread or fiber) until fd is ready for dir; sn: what the caller
 * saw of the fd's record before its syscall; *dl: the call's deadline
 * (la_io_next_deadline). 0 or an async_err_t. */
int la_io_wait_dir(int fd, int dir, uint64_t *dl, int timeout_ms, const la_fdsnap_t *sn) {
    if (timeout_ms == 0 || la_io_next_deadline(dl, timeout_ms)) return ASYNC_E_TIMEDOUT;
    uint64_t deadline = *dl;
    la_fiber_t *f = la_current_fiber();
    if (f && sn->owned) return la_io_owned_park(f, fd, dir ? 2 : 1, sn, deadline);
    if (f) return la_io_fd_park(f, fd, dir ? 2 : 1, deadline);
    int r = la_io_poll1(fd, dir ? POLLOUT : POLLIN, la_ms_left(deadline));
    if (r == -EINTR) return 0;
    if (r < 0) return la_io_map_errno(-r);
    if (r == 0) return ASYNC_E_TIMEDOUT;
    return 0;
}
