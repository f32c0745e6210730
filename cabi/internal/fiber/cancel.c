/* Cancellation of one fiber, shields and per-fiber deadlines (include/async.h
 * "Cancellation, scopes and deadlines"; docs/FIBERS.md).
 *
 * A cancel is a sticky bit (LA_CTL_CANCEL in f->ctl) set before the
 * canceller looks at f's claim: a park that begins later sees the bit (its
 * seq_cst store of claim comes before its load of ctl, sched.c
 * la_park_prepare), a park already published is ended by the canceller's
 * CAS of claim 0 -> CANCELLED. Whether a park may be ended depends on its
 * kind (fiber.h): the canceller reads the kind and CASes the claim under
 * f->clk, and every park of a kind other than NORMAL publishes kind and
 * claim under clk, so the kind it read is the kind of the park it ends (a
 * NORMAL park that follows a non-NORMAL one is published without clk, but
 * it is cancellable anyway). A park that backs out after its claim was
 * published takes clk first, so a canceller's wake-up of that park is over
 * before the fiber parks again.
 *
 * A shield (a depth counter, the fiber's own) turns the fiber's NORMAL parks
 * into SHIELDED ones: only shutdown ends those, and no deadline applies but
 * the call's own. A deadline (f->dl: the earliest of the fiber's own and its
 * scope's) fails a park that begins after it with ASYNC_E_TIMEDOUT and bounds
 * every park that begins before it (la_park_deadline). */
#include "fiber_int.h"

int la_park_back_out(la_fiber_t *f, int rc) {
    la_spin_lock(&f->clk);
    atomic_store(&f->claim, LA_W_IDLE);
    atomic_store(&f->state, LA_FS_RUNNING);
    la_spin_unlock(&f->clk);
    atomic_store_explicit(&f->wait_what, LA_WAIT_NONE, memory_order_relaxed);
    return rc;
}

/* No park began: f runs on with its last claim; returns rc. */
static int park_refused(la_fiber_t *f, int rc) {
    atomic_store_explicit(&f->wait_what, LA_WAIT_NONE, memory_order_relaxed);
    return rc;
}

int la_park_prepare_slow(la_fiber_t *f, int kind) {
    int c = atomic_load(&f->ctl);
    if (kind == LA_PK_NORMAL && (c & LA_CTL_SHIELD)) kind = LA_PK_SHIELDED;
    if (kind == LA_PK_NORMAL) {
        if (c & LA_CTL_CANCEL) return park_refused(f, ASYNC_E_CANCELLED);
        if ((c & LA_CTL_DEADLINE) && la_now_ns() >= f->dl) return park_refused(f, ASYNC_E_TIMEDOUT);
        atomic_store_explicit(&f->park_kind, kind, memory_order_relaxed);
        atomic_store_explicit(&f->state, LA_FS_PARKING, memory_order_relaxed);
        atomic_store(&f->claim, LA_W_WAITING);
        if (atomic_load(&f->ctl) & LA_CTL_CANCEL) return la_park_back_out(f, ASYNC_E_CANCELLED);
    } else {
        la_spin_lock(&f->clk);
        atomic_store_explicit(&f->park_kind, kind, memory_order_relaxed);
        atomic_store_explicit(&f->state, LA_FS_PARKING, memory_order_relaxed);
        atomic_store(&f->claim, LA_W_WAITING);
        la_spin_unlock(&f->clk);
    }
    if (kind != LA_PK_BLOCKING && atomic_load(&f->s->shutdown)) return la_park_back_out(f, ASYNC_E_CANCELLED);
    return 0;
}

uint64_t la_park_deadline(la_fiber_t *f, uint64_t deadline) {
    if (atomic_load_explicit(&f->park_kind, memory_order_relaxed) != LA_PK_NORMAL) return deadline;
    return !deadline || f->dl < deadline ? f->dl : deadline;
}

void la_fiber_cancel_park(la_fiber_t *f, int shutdown) {
    /* not parked: a park that begins later sees the request (stored before
     * this load) */
    if (atomic_load(&f->claim) != LA_W_WAITING) return;
    la_spin_lock(&f->clk);
    int z = LA_W_WAITING;
    if (atomic_load(&f->claim) == z) {
        int k = atomic_load_explicit(&f->park_kind, memory_order_relaxed);
        if ((k == LA_PK_NORMAL || (shutdown && k == LA_PK_SHIELDED)) &&
            atomic_compare_exchange_strong(&f->claim, &z, LA_W_CANCELLED))
            la_fiber_wake(f);
    }
    la_spin_unlock(&f->clk);
}

void la_fiber_cancel(la_fiber_t *f) {
    atomic_fetch_or(&f->ctl, LA_CTL_CANCEL);
    la_fiber_cancel_park(f, 0);
}

void la_fiber_deadline_update(la_fiber_t *f) {
    uint64_t sdl = f->scope ? la_scope_deadline(f->scope) : 0;
    uint64_t d = f->odl;
    if (sdl && (!d || sdl < d)) d = sdl;
    f->dl = d;
    if (d)
        atomic_fetch_or(&f->ctl, LA_CTL_DEADLINE);
    else
        atomic_fetch_and(&f->ctl, ~LA_CTL_DEADLINE);
}

/* ---- public API -------------------------------------------------------------- */

int async_fiber_cancel(async_fiber_t *fh) {
    LA_ENTRY(-1);
    la_slot_t *slot;
    la_fiber_t *f = la_handle_get(LA_H(fh), LA_T_FIBER, &slot);
    if (!f) {
        la_set_error(ASYNC_E_BADHANDLE);
        return -1;
    }
    /* The slot keeps f's record from being released (or reused). */
    la_fiber_cancel(f);
    la_handle_put(slot);
    return 0;
}

int async_fiber_cancelled(void) {
    /* in a child forked on a fiber: no fibers (as async_fiber_current) */
    if (atomic_load_explicit(&la_forked, memory_order_relaxed)) return 0;
    la_fiber_t *f = la_current_fiber();
    if (!f) return 0;
    return (atomic_load(&f->ctl) & LA_CTL_CANCEL) || atomic_load(&f->s->shutdown);
}

int async_fiber_shield_begin(void) {
    LA_ENTRY(-1);
    la_fiber_t *f = la_current_fiber();
    if (!f) {
        la_set_error(ASYNC_E_STATE);
        return -1;
    }
    if (f->shield == INT32_MAX) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    if (f->shield++ == 0) atomic_fetch_or(&f->ctl, LA_CTL_SHIELD);
    return 0;
}

int async_fiber_shield_end(void) {
    LA_ENTRY(-1);
    la_fiber_t *f = la_current_fiber();
    if (!f || f->shield == 0) {
        la_set_error(ASYNC_E_STATE);
        return -1;
    }
    if (--f->shield == 0) atomic_fetch_and(&f->ctl, ~LA_CTL_SHIELD);
    return 0;
}

int async_fiber_set_deadline(int timeout_ms) {
    LA_ENTRY(-1);
    if (la_check_timeout(timeout_ms)) return -1;
    la_fiber_t *f = la_current_fiber();
    if (!f) {
        la_set_error(ASYNC_E_STATE);
        return -1;
    }
    f->odl = la_deadline(timeout_ms);
    la_fiber_deadline_update(f);
    return 0;
}
