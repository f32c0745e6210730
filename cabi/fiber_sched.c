//go:build !windows

/* The M:N fiber scheduler: worker pthreads, run queues with work stealing,
 * parking, timers, the per-scheduler epoll, shutdown, stats. See fiber.h for
 * the parking protocol.
 *
 * Run queues: each worker owns a bounded ring (owner pushes at the tail,
 * owner and thieves take at the head with a CAS), plus a LIFO slot
 * ("runnext") for the fiber it just readied, taken at most 3 times in a row.
 * Overflow and wake-ups from other threads go to a global mutex-protected
 * list, checked every 61 dispatches and whenever the local queue is empty.
 * An idle worker spins a few stealing rounds, then parks: the first idle
 * worker blocks in epoll_wait (timeout = next timer), the others on a
 * condvar. Work made runnable while some worker is idle and none is spinning
 * wakes one of them.
 *
 * TLS is read only through the noinline accessors below: a fiber may resume
 * on another thread after any switch. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "fiber.h"
#include "fiber_int.h"

/* ---- time ------------------------------------------------------------------ */

uint64_t la_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t la_deadline(int timeout_ms) {
    if (timeout_ms < 0) return 0;
    return la_now_ns() + (uint64_t)timeout_ms * 1000000u;
}

int la_reason_err(int reason) {
    switch (reason) {
    case LA_W_READY: return 0;
    case LA_W_TIMEDOUT: return ASYNC_E_TIMEDOUT;
    case LA_W_CANCELLED: return ASYNC_E_CANCELLED;
    case LA_W_CLOSED: return ASYNC_E_CLOSED;
    default: return ASYNC_E_INTERNAL;
    }
}

/* ---- TLS accessors ----------------------------------------------------------- */

/* initial-exec: a load at a fixed offset instead of a __tls_get_addr call
 * (the Go runtime in this library already needs static TLS). */
static __thread la_wk_t *tls_wk __attribute__((tls_model("initial-exec")));

LA_NOINLINE la_wk_t *la_current_worker(void) {
    __asm__ volatile("" ::: "memory");
    return tls_wk;
}

LA_NOINLINE la_fiber_t *la_current_fiber(void) {
    __asm__ volatile("" ::: "memory");
    la_wk_t *w = tls_wk;
    return w && !w->in_trap ? w->cur : NULL;
}

/* The last-error slot of the running fiber (also during a trap), or NULL. */
LA_NOINLINE int *la_fiber_error_slot(void) {
    __asm__ volatile("" ::: "memory");
    la_wk_t *w = tls_wk;
    return w && w->cur ? &w->cur->last_error : NULL;
}

LA_NOINLINE int *la_fiber_os_error_slot(void) {
    __asm__ volatile("" ::: "memory");
    la_wk_t *w = tls_wk;
    return w && w->cur ? &w->cur->last_os_error : NULL;
}

la_sched_t *la_fiber_sched(la_fiber_t *f) { return f->s; }

/* For the fault handler (async-signal-safe): the lowest address of the guard
 * page of the fiber running on this thread, or 0. */
uintptr_t la_sig_current_stack(uint64_t *id) {
    la_wk_t *w = tls_wk;
    if (!w || !w->cur || w->in_trap) return 0;
    *id = w->cur->id;
    return (uintptr_t)w->cur->stack.base;
}

/* ---- run queues ------------------------------------------------------------ */

static void global_put_list(la_sched_t *s, la_fiber_t *first, la_fiber_t *last, size_t n) {
    last->next = NULL;
    pthread_mutex_lock(&s->gmu);
    if (s->gtail)
        s->gtail->next = first;
    else
        s->ghead = first;
    s->gtail = last;
    atomic_fetch_add(&s->glen, n);
    pthread_mutex_unlock(&s->gmu);
}

static void global_put(la_sched_t *s, la_fiber_t *f) { global_put_list(s, f, f, 1); }

/* Moves half of the ring plus f to the global queue (ring full). */
static int runq_put_slow(la_wk_t *w, la_fiber_t *f, uint32_t h, uint32_t t) {
    uint32_t n = (t - h) / 2;
    la_fiber_t *batch[LA_RUNQ / 2 + 1];
    for (uint32_t i = 0; i < n; i++)
        batch[i] = atomic_load_explicit(&w->ring[(h + i) % LA_RUNQ], memory_order_relaxed);
    if (!atomic_compare_exchange_strong_explicit(&w->head, &h, h + n, memory_order_release, memory_order_relaxed))
        return 0;
    batch[n] = f;
    for (uint32_t i = 0; i < n; i++) batch[i]->next = batch[i + 1];
    global_put_list(w->s, batch[0], f, n + 1);
    return 1;
}

static void runq_put(la_wk_t *w, la_fiber_t *f) {
    for (;;) {
        uint32_t h = atomic_load_explicit(&w->head, memory_order_acquire);
        uint32_t t = atomic_load_explicit(&w->tail, memory_order_relaxed);
        if (t - h < LA_RUNQ) {
            atomic_store_explicit(&w->ring[t % LA_RUNQ], f, memory_order_relaxed);
            atomic_store_explicit(&w->tail, t + 1, memory_order_release);
            return;
        }
        if (runq_put_slow(w, f, h, t)) return;
    }
}

/* With one worker nobody steals: its queue needs no locked instructions. */
static inline int solo(la_wk_t *w) { return w->s->nw == 1; }

static la_fiber_t *runq_get(la_wk_t *w) {
    if (solo(w)) {
        uint32_t h = atomic_load_explicit(&w->head, memory_order_relaxed);
        if (atomic_load_explicit(&w->tail, memory_order_relaxed) == h) return NULL;
        la_fiber_t *f = atomic_load_explicit(&w->ring[h % LA_RUNQ], memory_order_relaxed);
        atomic_store_explicit(&w->head, h + 1, memory_order_relaxed);
        return f;
    }
    for (;;) {
        uint32_t h = atomic_load_explicit(&w->head, memory_order_acquire);
        uint32_t t = atomic_load_explicit(&w->tail, memory_order_relaxed);
        if (t == h) return NULL;
        la_fiber_t *f = atomic_load_explicit(&w->ring[h % LA_RUNQ], memory_order_relaxed);
        if (atomic_compare_exchange_strong_explicit(&w->head, &h, h + 1, memory_order_release,
                                                    memory_order_relaxed))
            return f;
    }
}

static int runq_empty(la_wk_t *w) {
    uint32_t h = atomic_load_explicit(&w->head, memory_order_acquire);
    uint32_t t = atomic_load_explicit(&w->tail, memory_order_acquire);
    return t == h && !atomic_load_explicit(&w->runnext, memory_order_acquire);
}

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

/* Takes up to a fair share of the global queue: one to run, the rest into
 * w's ring. */
static la_fiber_t *global_get(la_sched_t *s, la_wk_t *w, int max) {
    if (atomic_load_explicit(&s->glen, memory_order_acquire) == 0) return NULL;
    pthread_mutex_lock(&s->gmu);
    size_t len = atomic_load(&s->glen);
    if (len == 0) {
        pthread_mutex_unlock(&s->gmu);
        return NULL;
    }
    size_t n = len / (size_t)s->nw + 1;
    if (n > len) n = len;
    if (n > (size_t)max) n = (size_t)max;
    la_fiber_t *f = s->ghead;
    s->ghead = f->next;
    la_fiber_t *rest = s->ghead;
    for (size_t i = 1; i < n; i++) s->ghead = s->ghead->next;
    if (!s->ghead) s->gtail = NULL;
    atomic_fetch_sub(&s->glen, n);
    pthread_mutex_unlock(&s->gmu);
    for (size_t i = 1; i < n; i++) {
        la_fiber_t *nx = rest->next;
        runq_put(w, rest);
        rest = nx;
    }
    return f;
}

/* ---- idle workers ------------------------------------------------------------ */

static void kick_poller(la_sched_t *s) {
    uint64_t one = 1;
    ssize_t r = write(s->evfd, &one, sizeof one);
    (void)r;
}

static void wake_one(la_sched_t *s) {
    pthread_mutex_lock(&s->imu);
    if (s->nsleep > s->wakeups) {
        s->wakeups++;
        pthread_cond_signal(&s->icv);
    } else if (s->poller_active && !s->poll_kicked) {
        s->poll_kicked = 1;
        kick_poller(s);
    }
    pthread_mutex_unlock(&s->imu);
}

/* Called after work was made runnable. */
static void wake_idle(la_sched_t *s) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&s->nspinning) == 0 && atomic_load(&s->nidle) > 0) wake_one(s);
}

static int timers_due(la_sched_t *s) {
    uint64_t d = atomic_load_explicit(&s->next_deadline, memory_order_acquire);
    return d != UINT64_MAX && d <= la_now_ns();
}

static int has_work(la_sched_t *s) {
    if (atomic_load(&s->glen) > 0) return 1;
    for (int i = 0; i < s->nw; i++)
        if (!runq_empty(&s->wks[i])) return 1;
    return timers_due(s);
}

/* ---- readying fibers ----------------------------------------------------------- */

/* w: the calling thread's worker (la_current_worker()), or NULL. */
static void ready_on(la_wk_t *w, la_fiber_t *f, int lifo) {
    la_sched_t *s = f->s;
    if (w && w->s == s) {
        if (lifo) {
            la_fiber_t *old;
            if (solo(w)) {
                old = atomic_load_explicit(&w->runnext, memory_order_relaxed);
                atomic_store_explicit(&w->runnext, f, memory_order_relaxed);
            } else {
                old = atomic_exchange(&w->runnext, f);
            }
            if (old) runq_put(w, old);
        } else {
            runq_put(w, f);
        }
        /* The only worker is this busy one: nobody to wake. */
        if (s->nw == 1) return;
    } else {
        /* A thread outside s (a plain thread, another scheduler's worker)
         * pins s: once f is queued it may run and return, and destroy may
         * proceed; it waits for refs before it frees s. f, readied but not
         * queued yet, keeps live > 0 (so s alive) until the pin is taken. */
        atomic_fetch_add(&s->refs, 1);
        global_put(s, f);
    }
    wake_idle(s);
    if (!(w && w->s == s)) atomic_fetch_sub(&s->refs, 1);
}

/* lifo: run it next on this worker (a wake-up by a running fiber); else at
 * the tail of the run queue. */
static void fiber_wake_q(la_fiber_t *f, int lifo) {
    for (;;) {
        int st = atomic_load(&f->state);
        if (st == LA_FS_PARKED) {
            if (atomic_compare_exchange_strong(&f->state, &st, LA_FS_RUNNABLE)) {
                ready_on(la_current_worker(), f, lifo);
                return;
            }
        } else if (st == LA_FS_PARKING) {
            if (atomic_compare_exchange_strong(&f->state, &st, LA_FS_NOTIFIED)) return;
        } else {
            return; /* not parked (cannot happen for a claimed registered waiter) */
        }
    }
}

void la_fiber_wake(la_fiber_t *f) { fiber_wake_q(f, 1); }

/* ---- timers (a min-heap of parked fibers by deadline) ---------------------------- */

static void heap_swap(la_fiber_t **h, int i, int j) {
    la_fiber_t *t = h[i];
    h[i] = h[j];
    h[j] = t;
    h[i]->heap_idx = i;
    h[j]->heap_idx = j;
}

static void heap_up(la_fiber_t **h, int i) {
    while (i > 0) {
        int p = (i - 1) / 2;
        if (h[p]->deadline <= h[i]->deadline) break;
        heap_swap(h, i, p);
        i = p;
    }
}

static void heap_down(la_fiber_t **h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l]->deadline < h[m]->deadline) m = l;
        if (r < n && h[r]->deadline < h[m]->deadline) m = r;
        if (m == i) break;
        heap_swap(h, i, m);
        i = m;
    }
}

static void heap_remove(la_sched_t *s, int i) {
    la_fiber_t **h = s->heap;
    int last = --s->hlen;
    h[i]->heap_idx = -1;
    if (i != last) {
        h[i] = h[last];
        h[i]->heap_idx = i;
        heap_down(h, last, i);
        heap_up(h, i);
    }
    atomic_store(&s->next_deadline, s->hlen ? h[0]->deadline : UINT64_MAX);
}

void la_timer_add(la_sched_t *s, la_fiber_t *f, uint64_t deadline) {
    pthread_mutex_lock(&s->tmu);
    if (s->hlen == s->hcap) {
        size_t nc = s->hcap ? s->hcap * 2 : 256;
        la_fiber_t **nh = realloc(s->heap, nc * sizeof *nh);
        if (!nh) {
            /* Out of memory: fire at once rather than hang. */
            pthread_mutex_unlock(&s->tmu);
            int z = 0;
            if (atomic_compare_exchange_strong(&f->claim, &z, LA_W_TIMEDOUT)) la_fiber_wake(f);
            return;
        }
        s->heap = nh;
        s->hcap = nc;
    }
    f->deadline = deadline;
    f->heap_idx = (int)s->hlen;
    s->heap[s->hlen++] = f;
    heap_up(s->heap, f->heap_idx);
    int earliest = s->heap[0] == f;
    atomic_store(&s->next_deadline, s->heap[0]->deadline);
    pthread_mutex_unlock(&s->tmu);
    if (earliest) {
        pthread_mutex_lock(&s->imu);
        if (s->poller_active && !s->poll_kicked) {
            s->poll_kicked = 1;
            kick_poller(s);
        }
        pthread_mutex_unlock(&s->imu);
    }
}

void la_timer_del(la_sched_t *s, la_fiber_t *f) {
    pthread_mutex_lock(&s->tmu);
    if (f->heap_idx >= 0) heap_remove(s, f->heap_idx);
    pthread_mutex_unlock(&s->tmu);
}

/* Fires due timers; returns how many fibers it woke. */
static int timers_run(la_sched_t *s) {
    if (!timers_due(s)) return 0;
    uint64_t now = la_now_ns();
    la_fiber_t *woken[64];
    int n = 0;
    pthread_mutex_lock(&s->tmu);
    while (s->hlen && s->heap[0]->deadline <= now && n < 64) {
        la_fiber_t *f = s->heap[0];
        heap_remove(s, 0);
        int z = 0;
        if (atomic_compare_exchange_strong(&f->claim, &z, LA_W_TIMEDOUT)) woken[n++] = f;
    }
    pthread_mutex_unlock(&s->tmu);
    for (int i = 0; i < n; i++) la_fiber_wake(woken[i]);
    return n;
}

/* ---- parking ------------------------------------------------------------------- */

int la_park_prepare(la_fiber_t *f, int kind) {
    /* Wakers find f only through structures it registers in after this
     * (under their locks), except cancel_all, which finds it in its list: the
     * seq_cst store of claim publishes kind and state to whoever reads claim
     * == WAITING, and orders it before the load of shutdown (cancel_all
     * stores shutdown before it reads claim): one of the two sees the other. */
    atomic_store_explicit(&f->park_kind, kind, memory_order_relaxed);
    atomic_store_explicit(&f->state, LA_FS_PARKING, memory_order_relaxed);
    atomic_store(&f->claim, LA_W_WAITING);
    if (kind != LA_PK_BLOCKING && atomic_load(&f->s->shutdown)) {
        atomic_store(&f->claim, LA_W_IDLE);
        atomic_store(&f->state, LA_FS_RUNNING);
        return ASYNC_E_CANCELLED;
    }
    return 0;
}

static void asan_leave(la_fiber_t *f, la_wk_t *w, int exiting) {
    if (__sanitizer_start_switch_fiber)
        __sanitizer_start_switch_fiber(exiting ? NULL : &f->asan_fake, w->stk_bottom, w->stk_size);
}

static void asan_arrive(la_fiber_t *f) {
    if (__sanitizer_finish_switch_fiber) {
        la_wk_t *w = la_current_worker();
        __sanitizer_finish_switch_fiber(f ? f->asan_fake : NULL, &w->stk_bottom, &w->stk_size);
    }
}

/* Switches from the running fiber to its worker's loop with `action`. */
static void switch_out(la_fiber_t *f, int action) {
    la_wk_t *w = la_current_worker();
    w->action = action;
    asan_leave(f, w, action == LA_ACT_EXIT);
    la_ctx_switch(&f->sp, w->loop_sp);
    asan_arrive(f);
}

void la_park_commit(la_fiber_t *f) { switch_out(f, LA_ACT_PARK); }

void la_fiber_trap(void (*fn)(void *), void *arg) {
    la_fiber_t *f = la_current_fiber();
    la_wk_t *w = la_current_worker();
    w->trap_fn = fn;
    w->trap_arg = arg;
    switch_out(f, LA_ACT_TRAP);
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
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
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
    struct timespec ts;
    if (deadline) {
        ts.tv_sec = (time_t)(deadline / 1000000000u);
        ts.tv_nsec = (long)(deadline % 1000000000u);
    }
    pthread_mutex_lock(&w->mu);
    while (!w->signalled) {
        if (!deadline) {
            pthread_cond_wait(&w->cv, &w->mu);
        } else if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT && !w->signalled) {
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

/* ---- the worker loop ------------------------------------------------------------ */

/* ---- fiber records, stacks and lists ---------------------------------------------
 * A worker keeps the records and stacks its fibers released (LA_FCACHE,
 * LA_SCACHE): spawning and finishing on a worker take no shared lock and call
 * no allocator. A cached record keeps its handle slot reserved (retired: old
 * handles are BADHANDLE), so reusing it publishes a new generation there. */

static void flist_add(la_flist_t *l, la_fiber_t *f) {
    f->home = l;
    f->all_prev = NULL;
    la_spin_lock(&l->lk);
    f->all_next = l->head;
    if (l->head) l->head->all_prev = f;
    l->head = f;
    la_spin_unlock(&l->lk);
}

static void flist_del(la_fiber_t *f) {
    la_flist_t *l = f->home;
    la_spin_lock(&l->lk);
    if (f->all_prev)
        f->all_prev->all_next = f->all_next;
    else
        l->head = f->all_next;
    if (f->all_next) f->all_next->all_prev = f->all_prev;
    la_spin_unlock(&l->lk);
}

static la_flist_t *flist_at(la_sched_t *s, int i) { return i < s->nw ? &s->wks[i].fl : &s->fl; }

/* w: a worker of f's scheduler running this code, or NULL. */
static void stack_release(la_sched_t *s, la_wk_t *w, la_stack_t *st) {
    if (!w) {
        la_stack_put(s->pool, st);
        return;
    }
    la_stack_own(st, 0);
    if (w->nscache == LA_SCACHE) {
        la_stack_put_many(s->pool, w->scache + LA_SCACHE / 2, LA_SCACHE / 2);
        w->nscache = LA_SCACHE / 2;
    }
    w->scache[w->nscache++] = *st;
}

static int stack_take(la_sched_t *s, la_wk_t *w, la_stack_t *st, uint64_t id) {
    if (!w) return la_stack_get(s->pool, st, id);
    if (w->nscache == 0) {
        int n = la_stack_get_many(s->pool, w->scache, LA_SCACHE / 2);
        if (n < 0) return -n;
        w->nscache = n;
    }
    *st = w->scache[--w->nscache];
    la_stack_own(st, id);
    return 0;
}

/* s->live counts the live fibers plus the units workers hold in reserve
 * (w->lease): a spawn on a worker takes a unit from its reserve and an exit
 * puts one back, so neither touches the shared counter. A worker returns its
 * reserve before it looks for work elsewhere or sleeps, so live reaches 0
 * (and wait_idle wakes) once no fiber is live and the workers are idle. */
#define LA_LEASE 64

static void live_drop(la_sched_t *s, int64_t n) {
    if (atomic_fetch_sub(&s->live, n) == n) {
        pthread_mutex_lock(&s->fmu);
        pthread_cond_broadcast(&s->fcv);
        pthread_mutex_unlock(&s->fmu);
    }
}

static void live_sub(la_sched_t *s, la_wk_t *w, int64_t n) {
    w->lease -= n;
    live_drop(s, n);
}

static void live_take(la_wk_t *w) {
    if (w->lease == 0) {
        atomic_fetch_add(&w->s->live, LA_LEASE);
        w->lease = LA_LEASE;
    }
    w->lease--;
}

/* Invalidates f's handle and frees (or caches, w as above) the record; f is
 * off its list and its stack is released. */
static void fiber_release(la_fiber_t *f, la_wk_t *w) {
    la_handle_retire(f->handle, LA_T_FIBER);
    if (w && w->nfcache < LA_FCACHE) {
        f->next = w->fcache;
        w->fcache = f;
        w->nfcache++;
        return;
    }
    la_handle_release(f->hidx);
    free(f);
}

static _Atomic uint64_t next_fiber_id = 1;

static uint64_t new_fiber_id(la_wk_t *w) {
    if (!w) return atomic_fetch_add(&next_fiber_id, 1);
    if (w->id_next == w->id_end) {
        w->id_next = atomic_fetch_add(&next_fiber_id, 256);
        w->id_end = w->id_next + 256;
    }
    return w->id_next++;
}

/* A new record with a stack and a live handle (state NEW), or NULL with *rc. */
static la_fiber_t *fiber_new(la_sched_t *s, la_wk_t *w, int *rc) {
    la_fiber_t *f = w ? w->fcache : NULL;
    uint32_t hidx = 0;
    if (f) {
        w->fcache = f->next;
        w->nfcache--;
        hidx = f->hidx;
        /* what a fresh record has as 0 (the rest is set below or before use) */
        f->asan_fake = NULL;
        f->last_error = 0;
        f->last_os_error = 0;
        f->jlk = (la_spin_t){0};
        f->done = 0;
        atomic_store_explicit(&f->joining, 0, memory_order_relaxed);
        atomic_store_explicit(&f->park_kind, 0, memory_order_relaxed);
        f->joiner = NULL;
        f->wk = NULL;
    } else if (!(f = calloc(1, sizeof *f))) {
        *rc = ASYNC_E_NOMEM;
        return NULL;
    }
    f->s = s;
    f->heap_idx = -1;
    f->id = new_fiber_id(w);
    atomic_store_explicit(&f->claim, LA_W_IDLE, memory_order_relaxed);
    if ((*rc = stack_take(s, w, &f->stack, f->id)) != 0) goto fail;
    f->sp = la_ctx_make(f->stack.base + s->page + f->stack.size - LA_STACK_TOP_RESERVE, f);
    f->handle = hidx ? la_handle_reuse(hidx, LA_T_FIBER, f) : la_handle_alloc(LA_T_FIBER, f);
    if (!f->handle) {
        stack_release(s, w, &f->stack);
        *rc = ASYNC_E_NOMEM;
        goto fail;
    }
    f->hidx = la_handle_idx(f->handle);
    return f;
fail:
    if (hidx) la_handle_release(hidx);
    free(f);
    return NULL;
}

static void fiber_finish(la_wk_t *w, la_fiber_t *f) {
    la_sched_t *s = w->s;
    la_stack_check(s->pool, &f->stack, f->id);
    stack_release(s, w, &f->stack);
    LA_BUMP(w->n_finished);
    int joinable = (f->flags & ASYNC_FIBER_JOINABLE) != 0;
    if (!joinable) {
        flist_del(f);
        fiber_release(f, w);
    } else {
        la_spin_lock(&f->jlk);
        f->done = 1;
        /* The joiner goes to the tail of the queue: the fibers queued before
         * it (often its other children) run first and it finds them done. */
        la_waiter_t *jw = f->joiner;
        if (jw && la_waiter_claim(jw, LA_W_READY)) {
            if (jw->f)
                fiber_wake_q(jw->f, 0);
            else
                la_waiter_signal(jw);
        }
        la_spin_unlock(&f->jlk);
        /* The last touch: a joiner that sees DONE frees f. */
        atomic_store_explicit(&f->state, LA_FS_DONE, memory_order_release);
    }
    if (++w->lease > 2 * LA_LEASE) live_sub(s, w, LA_LEASE);
}

static void run_fiber(la_wk_t *w, la_fiber_t *f) {
    la_sched_t *s = w->s;
    w->cur = f;
    f->wk = w;
    atomic_store_explicit(&f->state, LA_FS_RUNNING, memory_order_relaxed);
    LA_BUMP(w->n_run);
    /* canary mode: never resume a fiber on a stack something overwrote */
    la_stack_check(s->pool, &f->stack, f->id);
    for (;;) {
        if (__sanitizer_start_switch_fiber)
            __sanitizer_start_switch_fiber(&w->asan_fake, f->stack.base + s->page, f->stack.size);
        la_ctx_switch(&w->loop_sp, f->sp);
        if (__sanitizer_finish_switch_fiber) __sanitizer_finish_switch_fiber(w->asan_fake, NULL, NULL);
        if (w->action != LA_ACT_TRAP) break;
        w->in_trap = 1;
        w->trap_fn(w->trap_arg);
        w->in_trap = 0;
    }
    w->cur = NULL;
    switch (w->action) {
    case LA_ACT_YIELD:
        la_stack_check(s->pool, &f->stack, f->id);
        atomic_store(&f->state, LA_FS_RUNNABLE);
        runq_put(w, f);
        break;
    case LA_ACT_PARK: {
        la_stack_check(s->pool, &f->stack, f->id);
        LA_BUMP(w->n_park);
        int st = LA_FS_PARKING;
        if (!atomic_compare_exchange_strong(&f->state, &st, LA_FS_PARKED)) {
            /* NOTIFIED: woken before it finished parking */
            atomic_store(&f->state, LA_FS_RUNNABLE);
            runq_put(w, f);
        }
        break;
    }
    case LA_ACT_EXIT:
        fiber_finish(w, f);
        break;
    }
}

/* Drains the eventfd and dispatches fd events; returns the number of fd
 * events. */
static int poll_events(la_sched_t *s, int timeout_ms) {
    struct epoll_event evs[128];
    int n = epoll_wait(s->epfd, evs, 128, timeout_ms);
    int nfd = 0;
    for (int i = 0; i < n; i++) {
        if (evs[i].data.ptr == NULL) {
            uint64_t v;
            ssize_t r = read(s->evfd, &v, sizeof v);
            (void)r;
            continue;
        }
        la_io_event(s, evs[i].data.ptr, evs[i].events);
        nfd++;
    }
    return nfd;
}

static void idle_park(la_wk_t *w) {
    la_sched_t *s = w->s;
    pthread_mutex_lock(&s->imu);
    atomic_fetch_add(&s->nidle, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (has_work(s) || atomic_load(&s->stopping)) {
        atomic_fetch_sub(&s->nidle, 1);
        pthread_mutex_unlock(&s->imu);
        return;
    }
    if (!s->poller_active) {
        s->poller_active = 1;
        pthread_mutex_unlock(&s->imu);
        int timeout = -1;
        uint64_t d = atomic_load(&s->next_deadline);
        if (d != UINT64_MAX) {
            uint64_t now = la_now_ns();
            timeout = d <= now ? 0 : (int)((d - now + 999999) / 1000000);
        }
        poll_events(s, timeout);
        pthread_mutex_lock(&s->imu);
        s->poller_active = 0;
        s->poll_kicked = 0;
        atomic_fetch_sub(&s->nidle, 1);
        pthread_mutex_unlock(&s->imu);
        timers_run(s);
        return;
    }
    s->nsleep++;
    while (!s->wakeups && !atomic_load(&s->stopping)) pthread_cond_wait(&s->icv, &s->imu);
    s->nsleep--;
    if (s->wakeups) s->wakeups--;
    atomic_fetch_sub(&s->nidle, 1);
    pthread_mutex_unlock(&s->imu);
}

static la_fiber_t *take_next(la_wk_t *w) {
    la_fiber_t *f = atomic_load_explicit(&w->runnext, memory_order_relaxed);
    if (!f) return NULL;
    if (solo(w)) {
        atomic_store_explicit(&w->runnext, NULL, memory_order_relaxed);
        return f;
    }
    return atomic_exchange(&w->runnext, NULL);
}

static la_fiber_t *local_get(la_wk_t *w) {
    if (w->lifo_streak < 3) {
        la_fiber_t *f = take_next(w);
        if (f) {
            w->lifo_streak++;
            return f;
        }
    }
    w->lifo_streak = 0;
    la_fiber_t *f = runq_get(w);
    if (f) return f;
    return take_next(w);
}

static uint32_t rnd(la_wk_t *w) {
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return (uint32_t)w->rng;
}

static la_fiber_t *find_work(la_wk_t *w) {
    la_sched_t *s = w->s;
    for (;;) {
        if (atomic_load_explicit(&s->stopping, memory_order_relaxed)) return NULL;
        la_fiber_t *f;
        if (++w->tick % 61 == 0) {
            if ((f = global_get(s, w, 1))) return f;
            timers_run(s);
            if (atomic_load(&s->nfdwait) > 0 && !s->poller_active) poll_events(s, 0);
        }
        if ((f = local_get(w))) return f;
        if (w->lease) live_sub(s, w, w->lease);
        if ((f = global_get(s, w, LA_RUNQ / 2))) return f;
        if (timers_run(s) > 0) continue;
        if (atomic_load(&s->nfdwait) > 0 && !s->poller_active && poll_events(s, 0) > 0) continue;
        if (s->nw > 1) {
            atomic_fetch_add(&s->nspinning, 1);
            for (int round = 0; round < 4 && !f; round++) {
                uint32_t start = rnd(w);
                for (int i = 0; i < s->nw && !f; i++) {
                    la_wk_t *v = &s->wks[(start + (uint32_t)i) % (uint32_t)s->nw];
                    if (v == w) continue;
                    f = runq_steal(w, v, round == 3);
                }
                if (!f && atomic_load(&s->glen)) f = global_get(s, w, LA_RUNQ / 2);
            }
            atomic_fetch_sub(&s->nspinning, 1);
            if (f) {
                LA_BUMP(w->n_steal);
                wake_idle(s);
                return f;
            }
        }
        idle_park(w);
    }
}

static void *worker_main(void *arg) {
    la_wk_t *w = arg;
    tls_wk = w;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    void *alt = NULL;
    la_sig_thread_init(&alt);
    la_fiber_t *f;
    while ((f = find_work(w))) run_fiber(w, f);
    la_sig_thread_fini(alt);
    tls_wk = NULL;
    return NULL;
}

/* The first code of every fiber, on its own stack (from la_ctx_trampoline). */
__attribute__((noreturn, used)) void la_fiber_main(la_fiber_t *f);
void la_fiber_main(la_fiber_t *f) {
    asan_arrive(NULL);
    LA_BUMP(la_current_worker()->n_started);
    f->fn(f->arg);
    switch_out(f, LA_ACT_EXIT);
    abort();
}

void *la_ctx_make(void *hi, void *arg) {
    uintptr_t top = (uintptr_t)hi & ~(uintptr_t)15;
#if defined(__x86_64__)
    /* [mxcsr|fpucw] r15 r14 r13 r12 rbx rbp ret, see fiber_switch_amd64.S */
    uint64_t *sp = (uint64_t *)top - 8;
    memset(sp, 0, 8 * sizeof *sp);
    ((uint32_t *)sp)[0] = 0x1F80; /* MXCSR default */
    ((uint16_t *)sp)[2] = 0x037F; /* x87 control word default */
    sp[4] = (uint64_t)(uintptr_t)arg; /* r12 */
    sp[7] = (uint64_t)(uintptr_t)la_ctx_trampoline;
    return sp;
#elif defined(__aarch64__)
    uint64_t *sp = (uint64_t *)(top - 176);
    memset(sp, 0, 176);
    sp[0] = (uint64_t)(uintptr_t)arg;               /* x19 */
    sp[11] = (uint64_t)(uintptr_t)la_ctx_trampoline; /* x30 */
    return sp;
#else
#error "fibers: unsupported architecture"
#endif
}

/* ---- configuration -------------------------------------------------------------- */

static int default_workers(void) {
    const char *e = getenv("ASYNC_WORKERS");
    if (e && *e) {
        int n = atoi(e);
        if (n > 0 && n <= LA_MAX_WORKERS) return n;
    }
    int n = 1;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    /* cgroup v2 quota */
    FILE *fp = fopen("/proc/self/cgroup", "r");
    if (fp) {
        char line[512], path[600];
        while (fgets(line, sizeof line, fp)) {
            if (strncmp(line, "0::", 3) != 0) continue;
            line[strcspn(line, "\n")] = 0;
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/cpu.max", line + 3);
            FILE *q = fopen(path, "r");
            if (q) {
                char quota[64];
                long period = 0;
                if (fscanf(q, "%63s %ld", quota, &period) == 2 && strcmp(quota, "max") != 0 && period > 0) {
                    long qv = atol(quota);
                    int lim = (int)((qv + period - 1) / period);
                    if (lim >= 1 && lim < n) n = lim;
                }
                fclose(q);
            }
        }
        fclose(fp);
    }
    if (n < 1) n = 1;
    if (n > LA_MAX_WORKERS) n = LA_MAX_WORKERS;
    return n;
}

static size_t default_stack(void) {
    const char *e = getenv("ASYNC_FIBER_STACK_KB");
    if (e && *e) {
        long kb = atol(e);
        if (kb >= 16 && kb <= 1024 * 1024) return (size_t)kb * 1024;
    }
    return 64 * 1024;
}

/* ---- handles -------------------------------------------------------------------- */

la_sched_t *la_sched_get(async_sched_t *h) {
    la_slot_t *slot;
    la_sched_t *s = la_handle_get(LA_H(h), LA_T_SCHED, &slot);
    if (!s) return NULL;
    atomic_fetch_add(&s->refs, 1);
    la_handle_put(slot);
    return s;
}

void la_sched_put(la_sched_t *s) { atomic_fetch_sub(&s->refs, 1); }

#define LA_FORK_CHECK(fail)                                                                                  \
    do {                                                                                                     \
        if (atomic_load_explicit(&la_forked, memory_order_relaxed)) {                                        \
            la_set_error(ASYNC_E_FORKED);                                                                    \
            return fail;                                                                                     \
        }                                                                                                    \
    } while (0)

/* ---- public API: scheduler -------------------------------------------------------- */

static void sched_free(la_sched_t *s) {
    if (s->epfd >= 0) close(s->epfd);
    if (s->evfd >= 0) close(s->evfd);
    la_io_free(s);
    la_stackpool_free(s->pool);
    free(s->heap);
    pthread_mutex_destroy(&s->gmu);
    pthread_mutex_destroy(&s->imu);
    pthread_cond_destroy(&s->icv);
    pthread_mutex_destroy(&s->tmu);
    pthread_mutex_destroy(&s->fmu);
    pthread_cond_destroy(&s->fcv);
    free(s->wks);
    free(s);
}

async_sched_t *async_sched_create(const async_sched_config_t *cfg) {
    LA_FORK_CHECK(NULL);
    int nw = cfg && cfg->workers ? cfg->workers : default_workers();
    size_t ss = cfg && cfg->stack_size ? cfg->stack_size : default_stack();
    int gm = cfg ? cfg->guard_mode : 0;
    if (nw < 0 || nw > LA_MAX_WORKERS || gm < 0 || gm > 3 || ss < 16 * 1024 || ss > ((size_t)1 << 30)) {
        la_set_error(ASYNC_E_INVAL);
        return NULL;
    }
    int sig_err = la_sig_install();
    if (sig_err != 0) {
        la_set_error_os(ASYNC_E_SYS, sig_err);
        return NULL;
    }
    la_sched_t *s = calloc(1, sizeof *s);
    if (!s) {
        la_set_error(ASYNC_E_NOMEM);
        return NULL;
    }
    s->epfd = s->evfd = -1;
    s->nw = nw;
    s->page = (size_t)sysconf(_SC_PAGESIZE);
    pthread_mutex_init(&s->gmu, NULL);
    pthread_mutex_init(&s->imu, NULL);
    pthread_cond_init(&s->icv, NULL);
    pthread_mutex_init(&s->tmu, NULL);
    pthread_mutex_init(&s->fmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->fcv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_store(&s->next_deadline, UINT64_MAX);
    s->wks = aligned_alloc(64, sizeof(la_wk_t) * (size_t)nw);
    s->pool = la_stackpool_new(ss, gm);
    if (!s->wks || !s->pool || la_io_init(s) != 0) {
        sched_free(s);
        la_set_error(ASYNC_E_NOMEM);
        return NULL;
    }
    memset(s->wks, 0, sizeof(la_wk_t) * (size_t)nw);
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    int fd_err = errno;
    s->evfd = s->epfd < 0 ? -1 : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->epfd < 0 || s->evfd < 0) {
        if (s->epfd >= 0) fd_err = errno;
        sched_free(s);
        la_set_error_os(ASYNC_E_SYS, fd_err);
        return NULL;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->evfd, &ev) != 0) {
        int e = errno;
        sched_free(s);
        la_set_error_os(ASYNC_E_SYS, e);
        return NULL;
    }
    /* Check that a stack can be made with this guard mode now, not later. */
    la_stack_t probe;
    int rc = la_stack_get(s->pool, &probe, 0);
    if (rc) {
        sched_free(s);
        la_set_error(rc);
        return NULL;
    }
    la_stack_put(s->pool, &probe);
    s->handle = la_handle_alloc(LA_T_SCHED, s);
    if (!s->handle) {
        sched_free(s);
        la_set_error(ASYNC_E_NOMEM);
        return NULL;
    }
    for (int i = 0; i < nw; i++) {
        la_wk_t *w = &s->wks[i];
        w->s = s;
        w->idx = i;
        w->rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    }
    int started = 0, th_err = 0;
    for (; started < nw; started++) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 1u << 20);
        int err = pthread_create(&s->wks[started].th, &attr, worker_main, &s->wks[started]);
        pthread_attr_destroy(&attr);
        if (err) {
            th_err = err;
            break;
        }
    }
    if (started < nw) {
        atomic_store(&s->stopping, 1);
        pthread_mutex_lock(&s->imu);
        pthread_cond_broadcast(&s->icv);
        pthread_mutex_unlock(&s->imu);
        kick_poller(s);
        for (int i = 0; i < started; i++) pthread_join(s->wks[i].th, NULL);
        la_handle_free(s->handle, LA_T_SCHED);
        sched_free(s);
        la_set_error_os(ASYNC_E_SYS, th_err);
        return NULL;
    }
    return (async_sched_t *)(uintptr_t)s->handle;
}

/* Waits until no fiber is live; deadline 0 = forever. 0 or ASYNC_E_TIMEDOUT. */
static int wait_idle(la_sched_t *s, uint64_t deadline) {
    int rc = 0;
    struct timespec ts = {0, 0};
    if (deadline) {
        ts.tv_sec = (time_t)(deadline / 1000000000u);
        ts.tv_nsec = (long)(deadline % 1000000000u);
    }
    pthread_mutex_lock(&s->fmu);
    while (atomic_load(&s->live) > 0) {
        if (!deadline) {
            pthread_cond_wait(&s->fcv, &s->fmu);
        } else if (pthread_cond_timedwait(&s->fcv, &s->fmu, &ts) == ETIMEDOUT && atomic_load(&s->live) > 0) {
            rc = ASYNC_E_TIMEDOUT;
            break;
        }
    }
    pthread_mutex_unlock(&s->fmu);
    return rc;
}

static int on_fiber_of(la_sched_t *s) {
    la_wk_t *w = la_current_worker();
    return w && w->s == s;
}

int async_sched_run(async_sched_t *sh) {
    LA_FORK_CHECK(-1);
    la_sched_t *s = la_sched_get(sh);
    if (!s) {
        la_set_error(ASYNC_E_BADHANDLE);
        return -1;
    }
    if (la_current_worker()) {
        la_sched_put(s);
        la_set_error(ASYNC_E_STATE);
        return -1;
    }
    wait_idle(s, 0);
    la_sched_put(s);
    return 0;
}

static void cancel_all(la_sched_t *s) {
    atomic_store(&s->shutdown, 1);
    for (int i = 0; i <= s->nw; i++) {
        la_flist_t *l = flist_at(s, i);
        la_spin_lock(&l->lk);
        for (la_fiber_t *f = l->head; f; f = f->all_next) {
            int z = LA_W_WAITING;
            if (atomic_load(&f->claim) != z || atomic_load(&f->park_kind) == LA_PK_BLOCKING) continue;
            if (atomic_compare_exchange_strong(&f->claim, &z, LA_W_CANCELLED)) la_fiber_wake(f);
        }
        la_spin_unlock(&l->lk);
    }
}

int async_sched_shutdown(async_sched_t *sh, int timeout_ms) {
    LA_FORK_CHECK(-1);
    if (timeout_ms < -1) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    la_sched_t *s = la_sched_get(sh);
    if (!s) {
        la_set_error(ASYNC_E_BADHANDLE);
        return -1;
    }
    cancel_all(s);
    int rc = 0;
    if (!on_fiber_of(s) && !la_current_worker()) {
        if (timeout_ms != 0) rc = wait_idle(s, timeout_ms < 0 ? 0 : la_deadline(timeout_ms));
        else if (atomic_load(&s->live) > 0) rc = ASYNC_E_TIMEDOUT;
    }
    la_sched_put(s);
    if (rc) {
        la_set_error(rc);
        return -1;
    }
    return 0;
}

void async_sched_destroy(async_sched_t *sh) {
    LA_FORK_CHECK();
    la_sched_t *s = la_sched_get(sh);
    if (!s) {
        la_set_error(ASYNC_E_BADHANDLE);
        return;
    }
    if (la_current_worker()) {
        la_sched_put(s);
        la_set_error(ASYNC_E_STATE);
        return;
    }
    int z = 0;
    if (!atomic_compare_exchange_strong(&s->destroying, &z, 1)) {
        la_sched_put(s); /* another destroy runs */
        la_set_error(ASYNC_E_BADHANDLE);
        return;
    }
    /* The order matters (docs/RELIABILITY.md, "Scheduler lifecycle"):
     * 1. shutdown: from here spawns fail with CANCELLED and parks are
     *    cancelled; 2. every fiber accepted before returns (live reaches 0,
     *    a plain spawn's unit included); 3. the handle dies: later calls get
     *    BADHANDLE; 4. the callers that pinned s leave (joins that began
     *    before destroying was set finish and free their fiber, the others
     *    back off); only then do the workers stop and the records go. */
    cancel_all(s);
    wait_idle(s, 0);
    la_handle_free(s->handle, LA_T_SCHED);
    la_sched_put(s);
    while (atomic_load(&s->refs) != 0) sched_yield();
    atomic_store(&s->stopping, 1);
    pthread_mutex_lock(&s->imu);
    pthread_cond_broadcast(&s->icv);
    pthread_mutex_unlock(&s->imu);
    kick_poller(s);
    for (int i = 0; i < s->nw; i++) pthread_join(s->wks[i].th, NULL);
    /* Joinable fibers nobody joined, and the workers' caches. */
    for (int i = 0; i <= s->nw; i++) {
        la_flist_t *l = flist_at(s, i);
        la_spin_lock(&l->lk);
        la_fiber_t *f = l->head;
        l->head = NULL;
        la_spin_unlock(&l->lk);
        while (f) {
            la_fiber_t *nx = f->all_next;
            fiber_release(f, NULL);
            f = nx;
        }
    }
    for (int i = 0; i < s->nw; i++) {
        la_wk_t *w = &s->wks[i];
        while (w->fcache) {
            la_fiber_t *f = w->fcache;
            w->fcache = f->next;
            la_handle_release(f->hidx);
            free(f);
        }
        w->nfcache = 0;
        w->nscache = 0; /* the pool's arenas go with the pool */
    }
    sched_free(s);
}

int async_sched_get_stats(async_sched_t *sh, async_sched_stats_t *out, async_sched_worker_stats_t *per_worker,
                          int max_workers) {
    LA_FORK_CHECK(-1);
    if (!out || max_workers < 0 || (max_workers > 0 && !per_worker)) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    memset(out, 0, sizeof *out);
    la_sched_t *s = la_sched_get(sh);
    if (!s) {
        la_set_error(ASYNC_E_BADHANDLE);
        return -1;
    }
    out->workers = s->nw;
    out->stack_size = la_stackpool_stack_size(s->pool);
    out->guard_mode = la_stackpool_guard_mode(s->pool);
    /* finished before spawned: a fiber counted finished was counted spawned */
    for (int i = 0; i < s->nw; i++)
        out->fibers_finished += atomic_load_explicit(&s->wks[i].n_finished, memory_order_acquire);
    out->fibers_spawned = atomic_load(&s->spawned);
    for (int i = 0; i < s->nw; i++)
        out->fibers_spawned += atomic_load_explicit(&s->wks[i].n_spawned, memory_order_acquire);
    for (int i = 0; i <= s->nw; i++) {
        la_flist_t *l = flist_at(s, i);
        la_spin_lock(&l->lk);
        for (la_fiber_t *f = l->head; f; f = f->all_next) {
            switch (atomic_load(&f->state)) {
            case LA_FS_NEW:
            case LA_FS_RUNNABLE:
            case LA_FS_NOTIFIED: out->fibers_runnable++; break;
            case LA_FS_RUNNING: out->fibers_running++; break;
            case LA_FS_PARKING:
            case LA_FS_PARKED: out->fibers_parked++; break;
            case LA_FS_DONE: out->fibers_done_unjoined++; break;
            }
        }
        la_spin_unlock(&l->lk);
    }
    int n = max_workers < s->nw ? max_workers : s->nw;
    for (int i = 0; i < n; i++) {
        la_wk_t *w = &s->wks[i];
        per_worker[i].fibers_run = atomic_load_explicit(&w->n_run, memory_order_relaxed);
        per_worker[i].fibers_started = atomic_load_explicit(&w->n_started, memory_order_relaxed);
        per_worker[i].steals = atomic_load_explicit(&w->n_steal, memory_order_relaxed);
        per_worker[i].parks = atomic_load_explicit(&w->n_park, memory_order_relaxed);
    }
    la_sched_put(s);
    return n;
}

/* ---- public API: fibers ------------------------------------------------------------ */

async_fiber_t *async_fiber_spawn(async_sched_t *sh, void (*fn)(void *), void *arg, unsigned flags) {
    LA_FORK_CHECK(NULL);
    if (!fn || (flags & ~(unsigned)ASYNC_FIBER_JOINABLE)) {
        la_set_error(ASYNC_E_INVAL);
        return NULL;
    }
    /* On a fiber of sh (the common case) the scheduler cannot go away under
     * us (this fiber is live): a tag check replaces pinning it. */
    la_wk_t *w = la_current_worker();
    la_sched_t *s;
    if (w && w->s->handle == LA_H(sh) && la_handle_live(LA_H(sh), LA_T_SCHED)) {
        s = w->s;
    } else {
        w = NULL;
        if (!(s = la_sched_get(sh))) {
            la_set_error(ASYNC_E_BADHANDLE);
            return NULL;
        }
    }
    int rc = 0;
    la_fiber_t *f = NULL;
    /* A plain caller (s pinned) takes its unit of s->live before it looks at
     * shutdown; destroy sets shutdown before it waits for live to reach 0
     * (both seq_cst): either destroy waits for this fiber or this spawn sees
     * the shutdown. A fiber of s holds destroy off by being live itself. */
    if (!w) atomic_fetch_add(&s->live, 1);
    if (atomic_load(&s->shutdown))
        rc = ASYNC_E_CANCELLED;
    else
        f = fiber_new(s, w, &rc);
    if (!f) {
        if (!w) {
            live_drop(s, 1);
            la_sched_put(s);
        }
        la_set_error(rc);
        return NULL;
    }
    f->fn = fn;
    f->arg = arg;
    f->flags = flags;
    uint64_t h = f->handle;
    atomic_store_explicit(&f->state, LA_FS_RUNNABLE, memory_order_relaxed);
    if (w) {
        live_take(w);
        LA_BUMP(w->n_spawned);
    } else {
        atomic_fetch_add(&s->spawned, 1);
    }
    flist_add(w ? &w->fl : &s->fl, f);
    ready_on(w, f, 0);
    if (!w) la_sched_put(s);
    return (async_fiber_t *)(uintptr_t)h;
}

/* In a child forked on a fiber, the forking thread's copy still says it
 * runs that fiber (of a scheduler whose workers do not exist there): the
 * child has no fibers, so both calls below treat it as a plain thread. The
 * flag is read on every call (la_current_fiber is not inlined, so no TLS
 * address is cached across a switch). */
async_fiber_t *async_fiber_current(void) {
    if (atomic_load_explicit(&la_forked, memory_order_relaxed)) return NULL;
    la_fiber_t *f = la_current_fiber();
    return f ? (async_fiber_t *)(uintptr_t)f->handle : NULL;
}

void async_fiber_yield(void) {
    la_fiber_t *f = atomic_load_explicit(&la_forked, memory_order_relaxed) ? NULL : la_current_fiber();
    if (!f) {
        sched_yield();
        return;
    }
    switch_out(f, LA_ACT_YIELD);
}

int async_fiber_sleep(uint64_t ms) {
    LA_FORK_CHECK(-1);
    la_fiber_t *f = la_current_fiber();
    if (ms > (uint64_t)INT32_MAX * 1000u) ms = (uint64_t)INT32_MAX * 1000u;
    uint64_t deadline = la_now_ns() + ms * 1000000u;
    if (!f) {
        struct timespec ts = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
        return 0;
    }
    if (la_park_prepare(f, LA_PK_NORMAL) != 0) {
        la_set_error(ASYNC_E_CANCELLED);
        return -1;
    }
    la_timer_add(f->s, f, deadline);
    la_park_commit(f);
    int r = atomic_load(&f->claim);
    if (r != LA_W_TIMEDOUT) {
        la_timer_del(f->s, f);
        la_set_error(la_reason_err(r));
        return -1;
    }
    return 0;
}

int async_fiber_join(async_fiber_t *fh, int timeout_ms) {
    LA_FORK_CHECK(-1);
    if (timeout_ms < -1) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    la_slot_t *slot;
    la_fiber_t *f = la_handle_get(LA_H(fh), LA_T_FIBER, &slot);
    if (!f) {
        la_set_error(ASYNC_E_BADHANDLE);
        return -1;
    }
    int rc = 0;
    if (!(f->flags & ASYNC_FIBER_JOINABLE)) rc = ASYNC_E_INVAL;
    else if (f == la_current_fiber()) rc = ASYNC_E_STATE;
    else {
        int z = 0;
        if (!atomic_compare_exchange_strong(&f->joining, &z, 1)) rc = ASYNC_E_BUSY;
    }
    la_sched_t *s = f->s;
    /* A plain thread (or another scheduler's fiber) keeps s alive while it
     * waits; a fiber of s does by being live. */
    la_wk_t *cw = la_current_worker();
    int pin = !(cw && cw->s == s);
    if (!rc && pin) {
        /* destroy sets destroying before it waits for refs to reach 0 (both
         * seq_cst): either it waits for this join or this join backs off
         * (the handle is being freed) while the slot still holds f. */
        atomic_fetch_add(&s->refs, 1);
        if (atomic_load(&s->destroying)) {
            atomic_fetch_sub(&s->refs, 1);
            atomic_store(&f->joining, 0);
            rc = ASYNC_E_BADHANDLE;
        }
    }
    la_handle_put(slot);
    if (rc) {
        la_set_error(rc);
        return -1;
    }
    /* We are f's only joiner: f stays allocated until we free it. DONE is
     * fiber_finish's last touch of f; done (under jlk) comes just before. */
    if (atomic_load_explicit(&f->state, memory_order_acquire) != LA_FS_DONE) {
        la_waiter_t w;
        la_spin_lock(&f->jlk);
        if (!f->done) {
            if (timeout_ms == 0) {
                rc = ASYNC_E_TIMEDOUT;
            } else if ((rc = la_waiter_init(&w, LA_PK_NORMAL)) == 0) {
                f->joiner = &w;
                la_spin_unlock(&f->jlk);
                int r = la_waiter_wait(&w, la_deadline(timeout_ms));
                la_spin_lock(&f->jlk);
                f->joiner = NULL;
                la_waiter_done(&w);
                rc = la_reason_err(r);
            }
        }
        la_spin_unlock(&f->jlk);
        if (!rc)
            while (atomic_load_explicit(&f->state, memory_order_acquire) != LA_FS_DONE) sched_yield();
    }
    if (rc) {
        atomic_store(&f->joining, 0);
        if (pin) la_sched_put(s);
        la_set_error(rc);
        return -1;
    }
    flist_del(f);
    cw = la_current_worker(); /* we may have moved */
    fiber_release(f, cw && cw->s == s ? cw : NULL);
    if (pin) la_sched_put(s);
    return 0;
}
