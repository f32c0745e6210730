/* The M:N fiber scheduler: worker pthreads, run queues with work stealing,
 * parking, timers, the per-scheduler fd poller, shutdown, stats. See fiber.h for
 * the parking protocol.
 *
 * Run queues: each worker owns a bounded ring (owner pushes at the tail,
 * owner and thieves take at the head with a CAS), plus a LIFO slot
 * ("runnext") for the fiber it just readied, taken at most 3 times in a row.
 * Overflow goes to a global mutex-protected list; wake-ups from threads
 * outside the scheduler to a lock-free inbox (a stack taken whole by one
 * exchange); both are checked every 61 dispatches and whenever the local
 * queue is empty.
 * An idle worker spins (looks for work with pauses) for up to LA_SPIN_NS if
 * fewer than half of the busy workers already do, and only while some other
 * worker is busy (its ring is what a spinner takes from; every fourth sweep
 * it also polls the fds without blocking when nobody sits in the poller),
 * then parks: the first idle
 * worker blocks in the fd poller (poller.h; timeout = next timer), the others
 * on a condvar. Work made runnable while some worker is idle and none is
 * spinning wakes one of them (wake_one), which counts as spinning until it
 * has looked: so a hand-off to a worker that spins costs no system call, and
 * a burst of readies costs one wake-up. A spinner leaves another worker's
 * LIFO slot alone until it has sat there LA_NEXT_STALE_NS (a pair of fibers
 * handing off to each other stays on one worker).
 *
 * TLS is read only through the noinline accessors below: a fiber may resume
 * on another thread after any switch.
 *
 * The files: sched.c (TLS, run queues, waking idle workers, readying,
 * parking, the worker loop: the dispatch path in one unit), sched_idle.c
 * (spinning and sleeping), sched_fibers.c (fiber records, stacks, lists). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fiber.h"
#include "fiber_int.h"

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

/* Room in w's ring for a poll's worth of readied fibers (LA_POLL_MAX):
 * more would spill the oldest half of the ring to the global queue, where
 * a busy worker takes one every 61 dispatches, behind everything readied
 * after them (the tail of the TCP echo's round trips). A busy worker's
 * periodic poll waits for room, LA_POLL_SKIPS times at most. */
#define LA_POLL_SKIPS 4
static inline int runq_room(la_wk_t *w) {
    uint32_t h = atomic_load_explicit(&w->head, memory_order_relaxed);
    return atomic_load_explicit(&w->tail, memory_order_relaxed) - h <= LA_RUNQ - LA_POLL_MAX;
}

static void wake_idle(la_sched_t *s);

/* Takes up to a fair share of the global queue: one to run, the rest into
 * w's ring. */
la_fiber_t *la_global_get(la_sched_t *s, la_wk_t *w, int max) {
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
    /* The fibers were out of sight (off the global queue, not in the ring
     * yet): a worker that looked meanwhile may have gone to sleep. */
    if (n > 1 && s->nw > 1) wake_idle(s);
    return f;
}

/* Takes every fiber readied from outside s (la_ready_on) with one exchange,
 * oldest first: one to run, a fair share (as global_get) into w's ring, and
 * the rest, if any, to the global queue (one lock per batch), where the
 * other workers find them. */
la_fiber_t *la_inbox_get(la_sched_t *s, la_wk_t *w) {
    if (!atomic_load_explicit(&s->inbox, memory_order_relaxed)) return NULL;
    la_fiber_t *l = atomic_exchange_explicit(&s->inbox, NULL, memory_order_acquire);
    la_fiber_t *fifo = NULL;
    size_t n = 0;
    while (l) {
        la_fiber_t *nx = l->next;
        l->next = fifo;
        fifo = l;
        l = nx;
        n++;
    }
    if (!fifo) return NULL;
    size_t share = n / (size_t)s->nw + 1;
    if (share > LA_RUNQ / 2) share = LA_RUNQ / 2;
    la_fiber_t *r = fifo->next;
    for (size_t i = 1; i < share && r; i++) {
        la_fiber_t *nx = r->next; /* runq_put may relink r (overflow) */
        runq_put(w, r);
        r = nx;
    }
    if (r) {
        la_fiber_t *last = r;
        size_t k = 1;
        while (last->next) {
            last = last->next;
            k++;
        }
        global_put_list(s, r, last, k);
    }
    /* as in global_get: the batch was out of sight while it moved */
    if (fifo->next && s->nw > 1) wake_idle(s);
    return fifo;
}

/* ---- idle workers ------------------------------------------------------------ */

void la_kick_poller(la_sched_t *s) { la_poller_kick(&s->poller); }

/* Wakes one sleeping worker to look for work. The waker takes a unit of
 * nspinning for it (only if nobody is spinning), which the woken worker
 * inherits: until it has looked, further readies wake nobody (one wake-up,
 * not one per readied fiber, while a sleeper is on its way). */
static void wake_one(la_sched_t *s) {
    int zero = 0;
    if (!atomic_compare_exchange_strong(&s->nspinning, &zero, 1)) return;
    pthread_mutex_lock(&s->imu);
    if (s->nsleep > s->wakeups) {
        s->wakeups++;
        pthread_cond_signal(&s->icv);
    } else if (la_poller_busy(s) && !s->poll_spin) {
        s->poll_spin = 1;
        if (!s->poll_kicked) {
            s->poll_kicked = 1;
            la_kick_poller(s);
        }
    } else {
        /* every idle worker is already woken (or leaving idle_park under
         * imu, where it checks for work after nidle++) */
        atomic_fetch_sub(&s->nspinning, 1);
    }
    pthread_mutex_unlock(&s->imu);
}

/* Called after work was made runnable (the work is published before the
 * fence; a worker that stops spinning or goes idle publishes that before its
 * fence and then looks at every queue: one of the two sees the other). */
static void wake_idle(la_sched_t *s) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&s->nspinning, memory_order_relaxed) == 0 &&
        atomic_load_explicit(&s->nidle, memory_order_relaxed) > 0)
        wake_one(s);
}

/* ---- readying fibers ----------------------------------------------------------- */

/* w: the calling thread's worker (la_current_worker()), or NULL. */
void la_ready_on(la_wk_t *w, la_fiber_t *f, int lifo) {
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
        la_fiber_t *h = atomic_load_explicit(&s->inbox, memory_order_relaxed);
        do f->next = h;
        while (!atomic_compare_exchange_weak_explicit(&s->inbox, &h, f, memory_order_release, memory_order_relaxed));
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
                la_ready_on(la_current_worker(), f, lifo);
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

/* ---- parking ------------------------------------------------------------------- */

int la_park_prepare(la_fiber_t *f, int kind) {
    /* Parks of another kind, and a fiber with a cancel, a deadline or a
     * shield: cancel.c. */
    if (kind != LA_PK_NORMAL || atomic_load_explicit(&f->ctl, memory_order_relaxed))
        return la_park_prepare_slow(f, kind);
    /* Wakers find f only through structures it registers in after this
     * (under their locks), except the cancellers, which find it by its
     * handle, its scope or its scheduler's lists: the seq_cst store of claim
     * publishes kind and state to whoever reads claim == WAITING, and orders
     * it before the loads of ctl and shutdown (a canceller stores those
     * before it reads claim): one of the two sees the other. */
    atomic_store_explicit(&f->park_kind, kind, memory_order_relaxed);
    atomic_store_explicit(&f->state, LA_FS_PARKING, memory_order_relaxed);
    atomic_store(&f->claim, LA_W_WAITING);
    if (atomic_load(&f->ctl) | atomic_load(&f->s->shutdown)) return la_park_back_out(f, ASYNC_E_CANCELLED);
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

/* TSan (in TSan hosts): the context switches with the stack, right before
 * la_ctx_switch. Flags 0: each switch is a release by the side that leaves
 * and an acquire by the one that resumes, so a fiber resumed on another
 * worker sees what it did before (the run queues order the workers). */
static inline void tsan_switch(void *to) {
    if (__tsan_switch_to_fiber) __tsan_switch_to_fiber(to, 0);
}

/* Switches from the running fiber to its worker's loop with `action`. */
void la_switch_out(la_fiber_t *f, int action) {
    la_wk_t *w = la_current_worker();
    w->action = action;
    asan_leave(f, w, action == LA_ACT_EXIT);
    tsan_switch(w->tsan_self);
    la_ctx_switch(&f->sp, w->loop_sp);
    asan_arrive(f);
}

void la_park_commit(la_fiber_t *f) {
    la_switch_out(f, LA_ACT_PARK);
    /* what it waited on is history now (a park that records nothing shows
     * no stale kind in a dump) */
    atomic_store_explicit(&f->wait_what, LA_WAIT_NONE, memory_order_relaxed);
}

void la_fiber_trap(void (*fn)(void *), void *arg) {
    la_fiber_t *f = la_current_fiber();
    la_wk_t *w = la_current_worker();
    w->trap_fn = fn;
    w->trap_arg = arg;
    la_switch_out(f, LA_ACT_TRAP);
}

/* ---- the worker loop ------------------------------------------------------------ */

/* The end of a fiber that returned: its stack goes back (w's cache), a
 * detached record is released, a joinable one marked DONE (its joiner woken). */
static void fiber_finish(la_wk_t *w, la_fiber_t *f) {
    la_sched_t *s = w->s;
    la_stack_check(s->pool, &f->stack, f->id);
    if (f->tsan_fiber) { /* (switched out of it for good) */
        __tsan_destroy_fiber(f->tsan_fiber);
        f->tsan_fiber = NULL;
    }
#if defined(_WIN32)
    la_stack_win_exit(&f->stack, f->sp, s->page); /* the stack's commit so far */
#endif
    la_stack_release(s, w, &f->stack);
    LA_BUMP(w->n_finished);
    int joinable = (f->flags & ASYNC_FIBER_JOINABLE) != 0;
    if (!joinable) {
        if (f->scope) la_scope_fiber_exit(f); /* its stack is free: a scope join may return */
        la_flist_del(f);
        la_fiber_release(f, w);
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
        /* after done: a join that a scope's join let through finds f done */
        if (f->scope) la_scope_fiber_exit(f);
        /* The last touch: a joiner that sees DONE frees f. */
        atomic_store_explicit(&f->state, LA_FS_DONE, memory_order_release);
    }
    if (++w->lease > 2 * LA_LEASE) la_live_sub(s, w, LA_LEASE);
}

/* One worker: the fibers in its ring stay there until it takes them (no
 * thief, and a runnable fiber cannot finish), so it may look ahead. The
 * fiber after next: its record; the next one: the top of its stack, which
 * the switch into it pops and the park it resumes in returns through. Both are fetched while f runs. */
#define LA_PREFETCH_MIN_RUNQ 4
static inline void prefetch_ahead(la_wk_t *w) {
    uint32_t h = atomic_load_explicit(&w->head, memory_order_relaxed);
    uint32_t n = atomic_load_explicit(&w->tail, memory_order_relaxed) - h;
    /* A short queue's fibers ran a moment ago: still cached, and a fiber
     * that yields to one other pays nothing for this look. */
    if (n < LA_PREFETCH_MIN_RUNQ) return;
    {
        const char *an = (const char *)atomic_load_explicit(&w->ring[(h + 1) % LA_RUNQ], memory_order_relaxed);
        __builtin_prefetch(an, 1);
        __builtin_prefetch(an + 64, 1); /* the record's hot fields: two lines (fiber.h) */
    }
    {
        la_fiber_t *nx = atomic_load_explicit(&w->ring[h % LA_RUNQ], memory_order_relaxed);
        const char *sp = nx->sp;
        /* the saved registers and the frames of the park it returns into */
        for (int k = 0; k < 6; k++) __builtin_prefetch(sp + 64 * k, 1);
    }
}

static void run_fiber(la_wk_t *w, la_fiber_t *f) {
    la_sched_t *s = w->s;
    if (solo(w)) prefetch_ahead(w);
    w->cur = f;
    __atomic_store_n(&f->wk, w, __ATOMIC_RELAXED);
    if ((++w->coarse_tick & 15) == 0) w->coarse = la_coarse_ns();
    atomic_store_explicit(&f->state, LA_FS_RUNNING, memory_order_relaxed);
    LA_BUMP(w->n_run);
    atomic_store_explicit(&w->run_id, f->id, memory_order_relaxed);
    /* canary mode: never resume a fiber on a stack something overwrote */
    la_stack_check(s->pool, &f->stack, f->id);
    if (__tsan_create_fiber && !f->tsan_fiber) f->tsan_fiber = __tsan_create_fiber(0);
    for (;;) {
        if (__sanitizer_start_switch_fiber)
            __sanitizer_start_switch_fiber(&w->asan_fake, f->stack.base + s->page, f->stack.size);
        tsan_switch(f->tsan_fiber);
        la_ctx_switch(&w->loop_sp, f->sp);
        if (__sanitizer_finish_switch_fiber) __sanitizer_finish_switch_fiber(w->asan_fake, NULL, NULL);
        if (w->action != LA_ACT_TRAP) break;
        w->in_trap = 1;
        w->trap_fn(w->trap_arg);
        w->in_trap = 0;
    }
    atomic_store_explicit(&w->run_id, 0, memory_order_relaxed);
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

/* A non-blocking poll of the fds by a worker that is not the poller (a busy
 * or a spinning one, which saw no poller: poller_active read without imu).
 * The doorbell is in the same poller set: if that worker is preempted after
 * its look, another one may become the poller meanwhile and be kicked
 * (wake_one, an earlier timer), and the kick is then taken here. A kick
 * taken here is rung again while there is a poller: the poller must wake
 * for every kick, or it sleeps on (until an fd event or its timeout: for
 * ever without either) holding a wake_one's spinning unit, and no later
 * ready wakes anybody. */
int la_poll_now(la_sched_t *s) {
    int rang = 0;
    int n = la_poll_events(s, 0, &rang);
    if (rang) {
        pthread_mutex_lock(&s->imu);
        if (la_poller_busy(s)) la_kick_poller(s);
        pthread_mutex_unlock(&s->imu);
    }
    return n;
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

la_fiber_t *la_local_get(la_wk_t *w) {
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

static la_fiber_t *find_work(la_wk_t *w) {
    la_sched_t *s = w->s;
    la_fiber_t *f = NULL;
    int spinning = 0; /* this worker holds a unit of s->nspinning */
    for (;;) {
        if (atomic_load_explicit(&s->stopping, memory_order_relaxed)) {
            f = NULL;
            break;
        }
        if (++w->tick % 61 == 0) {
            /* The fibers a poll (or a reap of the other rings) readies need
             * room in the ring (runq_room); without it, wait, but at the
             * latest every LA_POLL_SKIPS-th time: a ring kept full by
             * runnable fibers (many yielding ones) must not shut out the
             * fd waiters. */
            int take = runq_room(w) || ++w->poll_skips >= LA_POLL_SKIPS;
            if (take) w->poll_skips = 0;
#if defined(LA_URING)
            if (w->ur) { /* a busy worker submits too, and reaps what sleeping workers' rings got */
                la_uring_flush(w->ur, 16);
                if (s->nw > 1 && take) la_uring_reap_others(s, w->ur);
            }
#endif
            /* Timers and fds first, before a fiber is taken: the global
             * queue may never run empty (a ring overflowing with yielding
             * fibers), and the sleepers and fd waiters among those fibers
             * must still be woken. */
            la_timers_run(s);
            if (take && la_fd_waiters(s) && !la_poller_busy(s)) la_poll_now(s);
            /* Both queues: the inbox (the fibers spawned or readied from
             * outside) gets its look even while the global queue never
             * runs empty and the ring never runs dry. */
            la_fiber_t *g = la_global_get(s, w, 1), *in = la_inbox_get(s, w);
            if (g && in) runq_put(w, in);
            if ((f = g ? g : in)) break;
        }
        if ((f = la_local_get(w))) {
#if defined(LA_URING)
            /* the SQEs of fibers that just parked must not wait behind f
             * (which may compute for long) while another worker is free */
            if (w->ur && s->nw > 1) la_uring_before_run(s, w->ur);
#endif
            break;
        }
#if defined(LA_URING)
        /* out of local work: submit the SQEs its fibers wrote, reap */
        if (w->ur && (la_uring_flush(w->ur, LA_RUNQ / 2) > 0 || (s->nw > 1 && la_uring_reap_others(s, w->ur) > 0)))
            continue;
#endif
        if (w->lease) la_live_sub(s, w, w->lease);
        if ((f = la_global_get(s, w, LA_RUNQ / 2)) || (f = la_inbox_get(s, w))) break;
        if (la_timers_run(s) > 0) continue;
        if (la_fd_waiters(s) && !la_poller_busy(s) && la_poll_now(s) > 0) continue;
        if (s->nw > 1) {
            if (!spinning) spinning = la_spin_begin(s);
            if ((f = la_spin(w, spinning))) {
                LA_BUMP(w->n_steal);
                if (!spinning) wake_idle(s); /* (a spinner: below) */
                break;
            }
            if (spinning) {
                /* then idle_park's nidle++, fence, has_work() */
                atomic_fetch_sub(&s->nspinning, 1);
                spinning = 0;
            }
        }
        if (spinning) { /* (one worker: a wake_one's unit) */
            atomic_fetch_sub(&s->nspinning, 1);
            spinning = 0;
        }
        spinning = la_idle_park(w);
    }
    /* The last spinner found work: there may be more, let another look. */
    if (spinning && atomic_fetch_sub(&s->nspinning, 1) == 1 && f) wake_idle(s);
    return f;
}

void *la_worker_main(void *arg) {
    la_wk_t *w = arg;
    tls_wk = w;
    if (__tsan_get_current_fiber) w->tsan_self = __tsan_get_current_fiber();
    la_block_sigpipe();
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
    if (f->fls) la_fls_fiber_exit(f); /* before anyone sees f done */
    la_switch_out(f, LA_ACT_EXIT);
    abort();
}
