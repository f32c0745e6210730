/* Waiters: one parking protocol for fibers and plain threads (fiber.h).
 * On a fiber a waiter parks the fiber (la_park_prepare/commit); on a plain
 * thread it sleeps on its own monotonic condition variable. */
#include <errno.h>
#include <time.h>

#include "fiber_int.h"

/* The async_err_t of a wake-up reason. */
int la_reason_err(int reason) {
    switch (reason) {
    case LA_W_READY: return 0;
    case LA_W_TIMEDOUT: return ASYNC_E_TIMEDOUT;
    case LA_W_CANCELLED: return ASYNC_E_CANCELLED;
    case LA_W_CLOSED: return ASYNC_E_CLOSED;
    default: return ASYNC_E_INTERNAL;
    }
}

/* ---- waiters ------------------------------------------------------------------- */

int la_waiter_init(la_waiter_t *w, int kind) {
    la_fiber_t *f = la_current_fiber();
    w->f = f;
    w->signalled = 0;
    if (f) {
        w->claim = &f->claim;
        return la_park_prepare(f, kind);
    }
    w->claim = &w->tclaim;
    atomic_store(&w->tclaim, LA_W_WAITING);
    pthread_mutex_init(&w->mu, NULL);
    la_cond_init_mono(&w->cv);
    return 0;
}

int la_waiter_claim(la_waiter_t *w, int reason) {
    int z = LA_W_WAITING;
    return atomic_compare_exchange_strong(w->claim, &z, reason);
}

void la_waiter_signal(la_waiter_t *w) {
    if (w->f) {
        la_fiber_wake(w->f);
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->signalled = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int la_waiter_wake(la_waiter_t *w, int reason) {
    if (!la_waiter_claim(w, reason)) return 0;
    la_waiter_signal(w);
    return 1;
}

int la_waiter_wait(la_waiter_t *w, uint64_t deadline) {
    if (w->f) {
        la_fiber_t *f = w->f;
        la_sched_t *s = f->s;
        if (deadline) la_timer_add(s, f, deadline);
        la_park_commit(f);
        int r = atomic_load(&f->claim);
        if (deadline && r != LA_W_TIMEDOUT) la_timer_del(s, f);
        return r;
    }
    struct timespec ts = {0, 0};
    if (deadline) ts = la_cond_abstime(deadline);
    pthread_mutex_lock(&w->mu);
    while (!w->signalled) {
        if (!deadline) {
            pthread_cond_wait(&w->cv, &w->mu);
        } else if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT && !w->signalled) {
            if (la_now_ns() < deadline) { /* the cv's clock is not la_now_ns's (la_cond_abstime) */
                ts = la_cond_abstime(deadline);
                continue;
            }
            if (la_waiter_claim(w, LA_W_TIMEDOUT)) break;
            deadline = 0; /* claimed by a waker: its signal comes soon */
        }
    }
    pthread_mutex_unlock(&w->mu);
    return atomic_load(w->claim);
}

void la_waiter_done(la_waiter_t *w) {
    if (w->f) return;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}
