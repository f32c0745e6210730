/* Waiters: one parking protocol for fibers and plain threads (fiber.h).
 * On a fiber a waiter parks the fiber (la_park_prepare/commit); on a plain
 * thread it sleeps on its own monotonic condition variable. */
#include <errno.h>
#include <stdint.h>
#include <time.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#elif defined(_WIN32)
#include <winsock2.h> /* before windows.h */
#include <windows.h>  /* WaitOnAddress (-lsynchronization) */
#elif defined(__APPLE__)
/* darwin's futex: libSystem's __ulock calls (what libc++'s atomic wait uses
 * since macOS 10.12); not in the SDK headers. */
extern int __ulock_wait(uint32_t op, void *addr, uint64_t value, uint32_t timeout_us);
extern int __ulock_wake(uint32_t op, void *addr, uint64_t wake_value);
#define LA_UL_COMPARE_AND_WAIT 1
#endif

#include "fiber_int.h"

/* The async_err_t of a wake-up reason. */
int la_reason_err(int reason) {
    switch (reason) {
    case LA_W_READY: return 0;
    case LA_W_TIMEDOUT: return ASYNC_E_TIMEDOUT;
    case LA_W_CANCELLED: return ASYNC_E_CANCELLED;
    case LA_W_CLOSED: return ASYNC_E_CLOSED;
    case LA_W_STOPPED: return ASYNC_E_CANCELLED;
    default: return ASYNC_E_INTERNAL;
    }
}

/* ---- worker parking ------------------------------------------------------------ */
/* A worker thread's stoppable wait sleeps on p->seq (a futex) instead of a
 * condition variable: a waker that won the claim bumps seq and wakes it, and
 * so does la_wpark_stop, which takes no lock and is async-signal-safe. The
 * sleeper reads seq before it looks at the claim and the stop flag (all
 * seq_cst), so a claim or stop it did not see comes with a bump after its
 * read: the futex wait then returns at once. */

static __thread la_wpark_t *wpark_self;

void la_wpark_set_self(la_wpark_t *p) { wpark_self = p; }

la_wpark_t *la_wpark_self(void) { return wpark_self; }

static void wpark_kick(la_wpark_t *p) {
    atomic_fetch_add(&p->seq, 1);
#if defined(__linux__)
    syscall(SYS_futex, &p->seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
#elif defined(_WIN32)
    WakeByAddressAll((void *)&p->seq);
#elif defined(__APPLE__)
    __ulock_wake(LA_UL_COMPARE_AND_WAIT, (void *)&p->seq, 0);
#endif
}

int la_wpark_stop(la_wpark_t *p) {
    if (atomic_exchange(&p->stop, 1) != 0) return 0;
    wpark_kick(p);
    return 1;
}

int la_waiter_wake_later(la_waiter_t *w, int reason, la_wpark_t **kick) {
    if (!w->park || *kick) return la_waiter_wake(w, reason);
    if (!la_waiter_claim(w, reason)) return 0;
    atomic_fetch_add(&w->park->pins, 1);
    *kick = w->park;
    return 1;
}

void la_wpark_kick_unpin(la_wpark_t *p) {
    wpark_kick(p);
    atomic_fetch_sub(&p->pins, 1);
}

void la_wpark_drain(la_wpark_t *p) {
    while (atomic_load(&p->pins) != 0) sched_yield();
}

/* Sleeps while p->seq is still seq or until deadline (monotonic ns, 0:
 * none); 1 if the deadline passed. Spurious returns are fine. */
static int wpark_sleep(la_wpark_t *p, uint32_t seq, uint64_t deadline) {
#if defined(__linux__)
    struct timespec ts, *tp = NULL;
    if (deadline) {
        if (la_now_ns() >= deadline) return 1;
        ts.tv_sec = (time_t)(deadline / 1000000000u);
        ts.tv_nsec = (long)(deadline % 1000000000u);
        tp = &ts;
    }
    /* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC time. */
    long r = syscall(SYS_futex, &p->seq, FUTEX_WAIT_BITSET_PRIVATE, seq, tp, NULL, FUTEX_BITSET_MATCH_ANY);
    return r != 0 && errno == ETIMEDOUT;
#elif defined(_WIN32)
    DWORD ms = INFINITE;
    if (deadline) {
        uint64_t now = la_now_ns();
        if (now >= deadline) return 1;
        uint64_t left = (deadline - now + 999999u) / 1000000u;
        ms = left >= INFINITE ? INFINITE - 1 : (DWORD)left;
    }
    WaitOnAddress((volatile void *)&p->seq, &seq, sizeof seq, ms);
    return deadline && la_now_ns() >= deadline;
#elif defined(__APPLE__)
    uint32_t us = 0; /* 0: no timeout */
    if (deadline) {
        uint64_t now = la_now_ns();
        if (now >= deadline) return 1;
        uint64_t left = (deadline - now + 999) / 1000;
        us = left > UINT32_MAX ? UINT32_MAX : (uint32_t)left;
    }
    int r = __ulock_wait(LA_UL_COMPARE_AND_WAIT, (void *)&p->seq, seq, us);
    return r < 0 && errno == ETIMEDOUT;
#else
    /* No futex: look again every millisecond (a kick or a stop is seen
     * within one). */
    (void)p, (void)seq;
    if (deadline && la_now_ns() >= deadline) return 1;
    struct timespec t = {0, 1000000};
    nanosleep(&t, NULL);
    return deadline && la_now_ns() >= deadline;
#endif
}

/* ---- waiters ------------------------------------------------------------------- */

int la_waiter_init_park(la_waiter_t *w, la_wpark_t *p) {
    w->f = NULL;
    w->park = p;
    w->signalled = 0;
    w->claim = &w->tclaim;
    atomic_store(&w->tclaim, LA_W_WAITING);
    if (atomic_load(&p->stop)) return ASYNC_E_CANCELLED;
    return 0;
}

int la_waiter_init(la_waiter_t *w, int kind) {
    la_fiber_t *f = la_current_fiber();
    w->f = f;
    w->park = NULL;
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
    if (w->park) {
        wpark_kick(w->park);
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
    if (w->f) return la_fiber_park_until(w->f, deadline);
    /* A plain thread: not a cancellation point (base.h, "cancellation"):
     * a cancel acting in the sleep would leave this record, on the dead
     * thread's stack, linked in the object's list. */
    int cs = LA_CANCEL_KEPT;
    if (w->park) {
        la_wpark_t *p = w->park;
        int r;
        for (;;) {
            uint32_t seq = atomic_load(&p->seq);
            int c = atomic_load(w->claim);
            if (c != LA_W_WAITING) {
                r = c;
                break;
            }
            if (atomic_load(&p->stop)) {
                if (la_waiter_claim(w, LA_W_STOPPED)) {
                    r = LA_W_STOPPED;
                    break;
                }
                continue; /* a waker claimed it first: its wake-up counts */
            }
            la_nocancel_enter(&cs); /* the fallback sleep is nanosleep */
            if (wpark_sleep(p, seq, deadline)) {
                if (la_waiter_claim(w, LA_W_TIMEDOUT)) {
                    r = LA_W_TIMEDOUT;
                    break;
                }
                deadline = 0; /* claimed by a waker meanwhile: the claim is read next */
            }
        }
        la_nocancel_leave(&cs);
        return r;
    }
    la_nocancel_enter(&cs);
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
    la_nocancel_leave(&cs);
    return atomic_load(w->claim);
}

void la_waiter_done(la_waiter_t *w) {
    if (w->f || w->park) return;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}
