/* The public scheduler and fiber functions of include/async.h: create, run,
 * shutdown, destroy and stats of a scheduler; spawn, current, yield, sleep
 * and join of fibers. The machinery they drive is sched.c's. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(_WIN32)
#include <winsock2.h> /* before windows.h (async.h includes it) */
#include <windows.h>
#endif

#include "fiber_int.h"

/* ---- handles -------------------------------------------------------------------- */

la_sched_t *la_sched_get(async_sched_t *h) {
    la_slot_t *slot;
    la_sched_t *s = la_handle_get(LA_H(h), LA_T_SCHED, &slot);
    if (!s) return NULL;
    atomic_fetch_add(&s->refs, 1);
    la_handle_put(slot);
    return s;
}

la_sched_t *la_sched_use(async_sched_t *h) {
    la_sched_t *s = la_sched_get(h);
    if (!s) la_set_error(ASYNC_E_BADHANDLE);
    return s;
}

void la_sched_put(la_sched_t *s) { atomic_fetch_sub(&s->refs, 1); }

/* ---- public API: scheduler -------------------------------------------------------- */

/* Tells the workers to stop, wakes the sleeping and the polling one, and
 * joins the first n (not a cancellation point: base.h). */
static void stop_workers(la_sched_t *s, int n) {
    atomic_store(&s->stopping, 1);
    pthread_mutex_lock(&s->imu);
    pthread_cond_broadcast(&s->icv);
    pthread_mutex_unlock(&s->imu);
    la_kick_poller(s);
    int cs = LA_CANCEL_KEPT;
    la_nocancel_enter(&cs);
    for (int i = 0; i < n; i++) pthread_join(s->wks[i].th, NULL);
    la_nocancel_leave(&cs);
}

static void sched_free(la_sched_t *s) {
    /* close(2) of the rings, the poller and its doorbell is a cancellation
     * point, and no libasync call is one: cancellation stays off, so that a
     * host thread with a deferred cancel pending frees all of s and its
     * descriptors. */
    int cs = LA_CANCEL_KEPT;
    la_nocancel_enter(&cs);
#if defined(LA_URING)
    la_uring_close(s); /* no op in flight: every fiber waited for its CQE */
#endif
    la_poller_close(&s->poller);
    la_io_free(s);
    la_stackpool_free(s->pool);
    free(s->heap);
    free(s->tpos);
    pthread_mutex_destroy(&s->gmu);
    pthread_mutex_destroy(&s->imu);
    pthread_cond_destroy(&s->icv);
    pthread_mutex_destroy(&s->tmu);
    pthread_mutex_destroy(&s->fmu);
    pthread_cond_destroy(&s->fcv);
    pthread_mutex_destroy(&s->scmu);
#if defined(_WIN32)
    _aligned_free(s->wks);
#else
    free(s->wks);
#endif
    free(s);
    la_nocancel_leave(&cs);
}

async_sched_t *async_sched_create(const async_sched_config_t *cfg) {
    LA_ENTRY(NULL);
    la_ensure_go_poller(); /* the first one starts Go's poller (base/gopoller.go) */
    int nw = cfg && cfg->workers ? cfg->workers : la_default_workers();
    size_t ss = cfg && cfg->stack_size ? cfg->stack_size : la_default_stack();
    int gm = cfg ? cfg->guard_mode : LA_GUARD_AUTO;
    if (nw < 0 || nw > LA_MAX_WORKERS || gm < LA_GUARD_AUTO || gm > LA_GUARD_CANARY || ss < 16 * 1024 || ss > ((size_t)1 << 30)) {
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
    s->poller.fd = s->poller.bell = -1;
    s->nw = nw;
#if defined(_WIN32)
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    s->page = si.dwPageSize;
#else
    s->page = (size_t)sysconf(_SC_PAGESIZE);
#endif
    pthread_mutex_init(&s->gmu, NULL);
    pthread_mutex_init(&s->imu, NULL);
    pthread_cond_init(&s->icv, NULL);
    pthread_mutex_init(&s->tmu, NULL);
    pthread_mutex_init(&s->fmu, NULL);
    la_cond_init_mono(&s->fcv);
    pthread_mutex_init(&s->scmu, NULL);
    atomic_store(&s->next_deadline, UINT64_MAX);
#if defined(_WIN32) /* no aligned_alloc in msvcrt */
    s->wks = _aligned_malloc(sizeof(la_wk_t) * (size_t)nw, 64);
#else
    s->wks = aligned_alloc(64, sizeof(la_wk_t) * (size_t)nw);
#endif
    s->pool = la_stackpool_new(ss, gm);
    if (!s->wks || !s->pool || la_io_init(s) != 0) {
        sched_free(s);
        la_set_error(ASYNC_E_NOMEM);
        return NULL;
    }
    memset(s->wks, 0, sizeof(la_wk_t) * (size_t)nw);
    if (la_poller_open(&s->poller) != 0) {
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
#if defined(LA_URING)
    if (la_default_fiber_io_uring()) la_uring_open(s); /* else, or when refused: the poller */
#endif
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
        int err = pthread_create(&s->wks[started].th, &attr, la_worker_main, &s->wks[started]);
        pthread_attr_destroy(&attr);
        if (err) {
            th_err = err;
            break;
        }
    }
    if (started < nw) {
        stop_workers(s, started);
        la_handle_free(s->handle, LA_T_SCHED);
        sched_free(s);
        la_set_error_os(ASYNC_E_SYS, th_err);
        return NULL;
    }
    la_tools_sched_created(s);
    return (async_sched_t *)(uintptr_t)s->handle;
}

/* Waits until no fiber is live; deadline 0 = forever. 0 or ASYNC_E_TIMEDOUT. */
static int wait_idle(la_sched_t *s, uint64_t deadline) {
    int rc = 0, cs = LA_CANCEL_KEPT;
    struct timespec ts = {0, 0};
    if (deadline) ts = la_cond_abstime(deadline);
    la_nocancel_enter(&cs); /* not a cancellation point (base.h) */
    pthread_mutex_lock(&s->fmu);
    while (atomic_load(&s->live) > 0) {
        if (!deadline) {
            pthread_cond_wait(&s->fcv, &s->fmu);
        } else if (pthread_cond_timedwait(&s->fcv, &s->fmu, &ts) == ETIMEDOUT && atomic_load(&s->live) > 0) {
            if (la_now_ns() < deadline) { /* the cv's clock is not la_now_ns's (la_cond_abstime) */
                ts = la_cond_abstime(deadline);
                continue;
            }
            rc = ASYNC_E_TIMEDOUT;
            break;
        }
    }
    pthread_mutex_unlock(&s->fmu);
    la_nocancel_leave(&cs);
    return rc;
}

static int on_fiber_of(la_sched_t *s) {
    la_wk_t *w = la_current_worker();
    return w && w->s == s;
}

/* On a pool thread running an async_fiber_blocking job for a fiber of s:
 * that fiber stays live until the job returns, so a wait for s's fibers to
 * return would wait for itself. */
static int serving_fiber_of(la_sched_t *s) {
    la_fiber_t *f = la_blocking_served();
    return f && f->s == s;
}

int async_sched_run(async_sched_t *sh) {
    LA_ENTRY(-1);
    la_sched_t *s = la_sched_use(sh);
    if (!s) return -1;
    if (la_current_worker() || serving_fiber_of(s)) {
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
        la_flist_t *l = la_flist_at(s, i);
        la_spin_lock(&l->lk);
        for (la_fiber_t *f = l->head; f; f = f->all_next) la_fiber_cancel_park(f, 1);
        la_spin_unlock(&l->lk);
    }
}

int async_sched_shutdown(async_sched_t *sh, int timeout_ms) {
    LA_ENTRY(-1);
    if (timeout_ms < -1) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    la_sched_t *s = la_sched_use(sh);
    if (!s) return -1;
    cancel_all(s);
    int rc = 0;
    if (!on_fiber_of(s) && !la_current_worker() && !serving_fiber_of(s)) {
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
    LA_ENTRY();
    la_sched_t *s = la_sched_use(sh);
    if (!s) return;
    if (la_current_worker() || la_on_stall_monitor() || serving_fiber_of(s)) {
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
    la_scopes_free(s); /* every fiber returned, every call on s left */
    la_tools_sched_gone(s);
    stop_workers(s, s->nw);
    /* Joinable fibers nobody joined, and the workers' caches. */
    for (int i = 0; i <= s->nw; i++) {
        la_flist_t *l = la_flist_at(s, i);
        la_spin_lock(&l->lk);
        la_fiber_t *f = l->head;
        l->head = NULL;
        la_spin_unlock(&l->lk);
        while (f) {
            la_fiber_t *nx = f->all_next;
            la_fiber_release(f, NULL);
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
    LA_ENTRY(-1);
    if (!out || max_workers < 0 || (max_workers > 0 && !per_worker)) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    memset(out, 0, sizeof *out);
    la_sched_t *s = la_sched_use(sh);
    if (!s) return -1;
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
        la_flist_t *l = la_flist_at(s, i);
        la_spin_lock(&l->lk);
        for (la_fiber_t *f = l->head; f; f = f->all_next) {
            switch (atomic_load(&f->state)) {
            case LA_FS_NEW:
            case LA_FS_RUNNABLE:
            case LA_FS_NOTIFIED: out->fibers_runnable++; break;
            case LA_FS_RUNNING:
            case LA_FS_PARKING: out->fibers_running++; break; /* on its way into a park, still on its worker */
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
    LA_ENTRY(NULL);
    return la_fiber_spawn_in(sh, 0, fn, arg, flags);
}

async_fiber_t *la_fiber_spawn_in(async_sched_t *sh, uint64_t scope, void (*fn)(void *), void *arg, unsigned flags) {
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
        if (!(s = la_sched_use(sh))) return NULL;
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
        f = la_fiber_new(s, w, &rc);
    if (f && scope && (rc = la_scope_enter(s, scope, f)) != 0) {
        la_stack_release(s, w, &f->stack);
        la_fiber_release(f, w);
        f = NULL;
    }
    if (!f) {
        if (!w) {
            la_live_drop(s, 1);
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
        la_live_take(w);
        LA_BUMP(w->n_spawned);
    } else {
        atomic_fetch_add(&s->spawned, 1);
    }
    la_flist_add(w ? &w->fl : &s->fl, f);
    la_ready_on(w, f, 0);
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
    la_switch_out(f, LA_ACT_YIELD);
}

int async_fiber_sleep(uint64_t ms) {
    LA_ENTRY(-1);
    la_fiber_t *f = la_current_fiber();
    if (ms > (uint64_t)INT32_MAX * 1000u) ms = (uint64_t)INT32_MAX * 1000u;
    uint64_t deadline = la_now_ns() + ms * 1000000u;
    if (!f) {
        int cs = LA_CANCEL_KEPT; /* not a cancellation point (base.h) */
        la_nocancel_enter(&cs);
#if defined(_WIN32)
        for (uint64_t now; (now = la_now_ns()) < deadline;) {
            uint64_t left = (deadline - now + 999999) / 1000000;
            Sleep(left > 0x7FFFFFFFu ? 0x7FFFFFFFu : (DWORD)left);
        }
#elif defined(__APPLE__)
        /* no clock_nanosleep: relative sleeps until the monotonic deadline */
        for (uint64_t now; (now = la_now_ns()) < deadline;) {
            uint64_t left = deadline - now;
            struct timespec rel = {(time_t)(left / 1000000000u), (long)(left % 1000000000u)};
            nanosleep(&rel, NULL);
        }
#else
        struct timespec ts = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
#endif
        la_nocancel_leave(&cs);
        return 0;
    }
    la_fiber_note(f, LA_WAIT_SLEEP, deadline);
    int rc = la_park_prepare(f, LA_PK_NORMAL);
    if (rc != 0) {
        la_set_error(rc);
        return -1;
    }
    /* the fiber's deadline, when earlier, ends the sleep with TIMEDOUT */
    uint64_t until = deadline;
    if (atomic_load_explicit(&f->ctl, memory_order_relaxed) & LA_CTL_DEADLINE) until = la_park_deadline(f, deadline);
    la_timer_add(f->s, f, until);
    la_park_commit(f);
    int r = atomic_load(&f->claim);
    if (r != LA_W_TIMEDOUT) {
        la_timer_del(f->s, f);
        la_set_error(la_reason_err(r));
        return -1;
    }
    if (until < deadline) {
        la_set_error(ASYNC_E_TIMEDOUT);
        return -1;
    }
    return 0;
}

int async_fiber_join(async_fiber_t *fh, int timeout_ms) {
    LA_ENTRY(-1);
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
    else if (f == la_current_fiber() || f == la_blocking_served()) rc = ASYNC_E_STATE;
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
            } else if ((la_fiber_note(la_current_fiber(), LA_WAIT_JOIN, f->id),
                        rc = la_waiter_init(&w, LA_PK_NORMAL)) == 0) {
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
    la_flist_del(f);
    cw = la_current_worker(); /* we may have moved */
    la_fiber_release(f, cw && cw->s == s ? cw : NULL);
    if (pin) la_sched_put(s);
    return 0;
}
