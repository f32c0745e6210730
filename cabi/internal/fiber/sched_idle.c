/* The idle side of the worker loop (sched.c tells the design): a worker out
 * of local work spins (steals from the other workers' rings, takes from
 * the global queue and the inbox, polls the fds now and then) for up to
 * LA_SPIN_NS, then sleeps, the first idle worker in the fd poller, the
 * others on a condition variable. */
#define _GNU_SOURCE
#include <pthread.h>

#include "fiber_int.h"

/* ---- a sleeper's last look ------------------------------------------------------ */

/* 1 if w's ring and LIFO slot are empty. */
static int runq_empty(la_wk_t *w) {
    uint32_t h = atomic_load_explicit(&w->head, memory_order_acquire);
    uint32_t t = atomic_load_explicit(&w->tail, memory_order_acquire);
    return t == h && !atomic_load_explicit(&w->runnext, memory_order_acquire);
}

/* 1 if s has a runnable fiber anywhere, or a due timer: a worker about to
 * sleep (counted idle) looks once more. */
static int has_work(la_sched_t *s) {
    if (atomic_load(&s->glen) > 0 || atomic_load(&s->inbox)) return 1;
    for (int i = 0; i < s->nw; i++)
        if (!runq_empty(&s->wks[i])) return 1;
    return la_timers_due(s);
}

/* ---- spinning ------------------------------------------------------------------- */

/* Steals half of v's ring into w's (empty) ring; returns one fiber. */
static la_fiber_t *runq_steal(la_wk_t *w, la_wk_t *v, int take_next) {
    uint32_t wt = atomic_load_explicit(&w->tail, memory_order_relaxed);
    for (;;) {
        uint32_t h = atomic_load_explicit(&v->head, memory_order_acquire);
        uint32_t t = atomic_load_explicit(&v->tail, memory_order_acquire);
        uint32_t n = t - h;
        n -= n / 2;
        if (n == 0) {
            if (!take_next) return NULL;
            la_fiber_t *f = atomic_load_explicit(&v->runnext, memory_order_acquire);
            if (f && atomic_compare_exchange_strong(&v->runnext, &f, NULL)) return f;
            return NULL;
        }
        if (n > LA_RUNQ / 2) continue; /* inconsistent snapshot */
        for (uint32_t i = 0; i < n; i++) {
            la_fiber_t *f = atomic_load_explicit(&v->ring[(h + i) % LA_RUNQ], memory_order_relaxed);
            atomic_store_explicit(&w->ring[(wt + i) % LA_RUNQ], f, memory_order_relaxed);
        }
        if (atomic_compare_exchange_strong_explicit(&v->head, &h, h + n, memory_order_acq_rel,
                                                    memory_order_relaxed)) {
            la_fiber_t *f = atomic_load_explicit(&w->ring[(wt + n - 1) % LA_RUNQ], memory_order_relaxed);
            if (n > 1) atomic_store_explicit(&w->tail, wt + n - 1, memory_order_release);
            return f;
        }
    }
}

static uint32_t rnd(la_wk_t *w) {
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return (uint32_t)w->rng;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield" ::: "memory");
#else
    __asm__ volatile("" ::: "memory");
#endif
}

/* How long an idle worker keeps looking for work before it sleeps: while it
 * looks (nspinning > 0) readying a fiber wakes nobody, so a hand-off to a
 * busy scheduler costs no system call. Bounded: with no work the CPU goes
 * back to ~0 after this long. */
#define LA_SPIN_NS 50000
/* A fiber in another worker's LIFO slot is that worker's next fiber (often
 * the partner of the fiber it runs, which is about to park): a spinning
 * worker takes it only once it has sat there this long with that worker
 * still running the same fiber, so a pair keeps its worker (and caches)
 * and no hand-off bounces between threads. */
#define LA_NEXT_STALE_NS 4000
#define LA_SPIN_SEEN 32 /* victims (the first ones) whose LIFO slot is watched */

/* Looks for work in the other workers' rings, the global queue and the inbox.
 * bounded == 0: one sweep that also takes LIFO slots (before sleeping);
 * else repeated sweeps for up to LA_SPIN_NS (less once no other worker is
 * busy), then that final sweep. */
LA_NOINLINE la_fiber_t *la_spin(la_wk_t *w, int bounded) {
    la_sched_t *s = w->s;
#if defined(LA_URING)
    if (bounded && s->uring) la_uring_submit_others(s, w->ur); /* counted: see idle_park */
#endif
    la_fiber_t *seen[LA_SPIN_SEEN]; /* a LIFO slot's fiber when first seen */
    uint64_t seen_run[LA_SPIN_SEEN], seen_t[LA_SPIN_SEEN];
    int nseen = s->nw < LA_SPIN_SEEN ? s->nw : LA_SPIN_SEEN;
    for (int i = 0; i < nseen; i++) seen[i] = NULL;
    uint64_t t0 = 0;
    uint32_t stale = 0; /* bit per watched victim: take its LIFO slot */
    for (uint32_t round = 0;; round++) {
        la_fiber_t *f = NULL;
        uint32_t start = rnd(w);
        for (int i = 0; i < s->nw && !f; i++) {
            uint32_t vi = (start + (uint32_t)i) % (uint32_t)s->nw;
            la_wk_t *v = &s->wks[vi];
            if (v == w) continue;
            f = runq_steal(w, v, !bounded || (vi < LA_SPIN_SEEN && (stale >> vi & 1)));
        }
        if (!f) f = la_global_get(s, w, LA_RUNQ / 2);
        if (!f) f = la_inbox_get(s, w);
        if (!f && la_timers_due(s) && la_timers_run(s) > 0) f = la_local_get(w);
        if (!f && (round & 3) == 3 && la_fd_waiters(s) && !la_poller_busy(s) && la_poll_now(s) > 0)
            f = la_local_get(w);
        if (f || !bounded || atomic_load_explicit(&s->stopping, memory_order_relaxed)) return f;
        if ((round & 3) == 3) {
            uint64_t now = la_now_ns();
            if (!t0) t0 = now;
            if (now - t0 >= LA_SPIN_NS) bounded = 0; /* the final sweep */
            /* Every other worker idle (asleep or in the poller): no ring
             * will fill while it looks, and work from the poller, the inbox
             * or a timer wakes a sleeper. Spinning then only burns a CPU
             * (docs/PERFORMANCE.md: an echo server's idle worker after
             * each burst of fd events). */
            if (atomic_load_explicit(&s->nidle, memory_order_relaxed) >= s->nw - 1) bounded = 0;
            stale = 0;
            for (int i = 0; i < nseen; i++) {
                la_wk_t *v = &s->wks[i];
                if (v == w) continue;
                la_fiber_t *nx = atomic_load_explicit(&v->runnext, memory_order_relaxed);
                uint64_t nr = atomic_load_explicit(&v->n_run, memory_order_relaxed);
                if (!nx || nx != seen[i] || nr != seen_run[i]) {
                    seen[i] = nx;
                    seen_run[i] = nr;
                    seen_t[i] = now;
                } else if (now - seen_t[i] >= LA_NEXT_STALE_NS) {
                    stale |= (uint32_t)1 << i;
                }
            }
        }
        for (int k = 0; k < 32; k++) cpu_relax();
    }
}

/* ---- sleeping ------------------------------------------------------------------- */

/* Sleeps until woken (or, as the poller, until an fd event or the next
 * timer). Returns 1 if a waker handed this worker a unit of nspinning
 * (wake_one): it then looks for work as a spinning worker. */
LA_NOINLINE int la_idle_park(la_wk_t *w) {
    la_sched_t *s = w->s;
    pthread_mutex_lock(&s->imu);
    atomic_fetch_add(&s->nidle, 1);
    atomic_thread_fence(memory_order_seq_cst);
#if defined(LA_URING)
    /* counted idle: the busy workers' pending SQEs are ours to submit
     * (la_uring_before_run) */
    if (s->uring && s->nw > 1) la_uring_submit_others(s, w->ur);
#endif
    if (has_work(s) || atomic_load(&s->stopping)) {
        atomic_fetch_sub(&s->nidle, 1);
        pthread_mutex_unlock(&s->imu);
        return 0;
    }
    if (!la_poller_busy(s)) {
        atomic_store_explicit(&s->poller_active, 1, memory_order_relaxed);
        pthread_mutex_unlock(&s->imu);
        /* capped (la_ms_left): a deadline however far away is a finite
         * timeout, never a negative one (sleep for ever) */
        uint64_t d = atomic_load(&s->next_deadline);
        int timeout = d == UINT64_MAX ? -1 : la_ms_left(d ? d : 1);
        la_poll_events(s, timeout, NULL);
        w->coarse = la_coarse_ns();
        pthread_mutex_lock(&s->imu);
        atomic_store_explicit(&s->poller_active, 0, memory_order_relaxed);
        s->poll_kicked = 0;
        int spin = s->poll_spin;
        s->poll_spin = 0;
        atomic_fetch_sub(&s->nidle, 1);
        pthread_mutex_unlock(&s->imu);
        la_timers_run(s);
        return spin;
    }
    s->nsleep++;
    while (!s->wakeups && !atomic_load(&s->stopping)) pthread_cond_wait(&s->icv, &s->imu);
    s->nsleep--;
    int spin = 0;
    if (s->wakeups) {
        s->wakeups--;
        spin = 1;
    }
    atomic_fetch_sub(&s->nidle, 1);
    pthread_mutex_unlock(&s->imu);
    w->coarse = la_coarse_ns();
    return spin;
}
