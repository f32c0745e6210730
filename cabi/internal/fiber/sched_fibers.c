/* Fiber records, stacks and lists of the scheduler (sched.c tells the
 * design): the per-worker caches of records, stacks and fiber ids, the
 * live-fiber count with its per-worker lease, the lists of live fibers,
 * and the first frame of a new fiber's stack (la_ctx_make). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "fiber.h"
#include "fiber_int.h"

/* ---- fiber records, stacks and lists ---------------------------------------------
 * A worker keeps the records and stacks its fibers released (LA_FCACHE,
 * LA_SCACHE): spawning and finishing on a worker take no shared lock and call
 * no allocator. A cached record keeps its handle slot reserved (retired: old
 * handles are BADHANDLE), so reusing it publishes a new generation there. */

void la_flist_add(la_flist_t *l, la_fiber_t *f) {
    f->home = l;
    f->all_prev = NULL;
    la_spin_lock(&l->lk);
    f->all_next = l->head;
    if (l->head) l->head->all_prev = f;
    l->head = f;
    la_spin_unlock(&l->lk);
}

void la_flist_del(la_fiber_t *f) {
    la_flist_t *l = f->home;
    la_spin_lock(&l->lk);
    if (f->all_prev)
        f->all_prev->all_next = f->all_next;
    else
        l->head = f->all_next;
    if (f->all_next) f->all_next->all_prev = f->all_prev;
    la_spin_unlock(&l->lk);
}

la_flist_t *la_flist_at(la_sched_t *s, int i) { return i < s->nw ? &s->wks[i].fl : &s->fl; }

/* w: a worker of f's scheduler running this code, or NULL. */
void la_stack_release(la_sched_t *s, la_wk_t *w, la_stack_t *st) {
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

void la_live_drop(la_sched_t *s, int64_t n) {
    if (atomic_fetch_sub(&s->live, n) == n) {
        pthread_mutex_lock(&s->fmu);
        pthread_cond_broadcast(&s->fcv);
        pthread_mutex_unlock(&s->fmu);
    }
}

void la_live_take(la_wk_t *w) {
    if (w->lease == 0) {
        atomic_fetch_add(&w->s->live, LA_LEASE);
        w->lease = LA_LEASE;
    }
    w->lease--;
}

/* Invalidates f's handle and frees (or caches, w as above) the record; f is
 * off its list and its stack is released. */
void la_fiber_release(la_fiber_t *f, la_wk_t *w) {
    la_timer_forget(f->s, f);
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

/* A zeroed fiber record on a cache-line boundary: its hot fields (the
 * first two lines, fiber.h) are then two lines, not three. Freed with
 * free(). */
static la_fiber_t *fiber_alloc(void) {
#if defined(_WIN32)
    return calloc(1, sizeof(la_fiber_t));
#else
    void *p = NULL;
    if (posix_memalign(&p, 64, sizeof(la_fiber_t)) != 0) return NULL;
    memset(p, 0, sizeof(la_fiber_t));
    return p;
#endif
}

/* A new record with a stack and a live handle (state NEW), or NULL with *rc. */
la_fiber_t *la_fiber_new(la_sched_t *s, la_wk_t *w, int *rc) {
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
        /* cancellation and deadlines (cancel.c) */
        atomic_store_explicit(&f->ctl, 0, memory_order_relaxed);
        f->clk = (la_spin_t){0};
        f->shield = 0;
        f->dl = f->odl = 0;
        f->name[0] = 0;
        atomic_store_explicit(&f->wait_what, LA_WAIT_NONE, memory_order_relaxed);
    } else if (!(f = fiber_alloc())) {
        *rc = ASYNC_E_NOMEM;
        return NULL;
    }
    f->s = s;
    f->id = new_fiber_id(w);
    atomic_store_explicit(&f->claim, LA_W_IDLE, memory_order_relaxed);
    if ((*rc = stack_take(s, w, &f->stack, f->id)) != 0) goto fail;
    f->sp = la_ctx_make(f->stack.base + s->page + f->stack.size - LA_STACK_TOP_RESERVE, f);
    f->handle = hidx ? la_handle_reuse(hidx, LA_T_FIBER, f) : la_handle_alloc(LA_T_FIBER, f);
    if (!f->handle) {
        la_stack_release(s, w, &f->stack);
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

uint64_t la_fiber_coarse_now(la_fiber_t *f) {
    la_wk_t *w = f->wk;
    return w && w->coarse ? w->coarse : la_coarse_ns();
}

void *la_ctx_make(void *hi, void *arg) {
    uintptr_t top = (uintptr_t)hi & ~(uintptr_t)15;
#if defined(_WIN32) && defined(__x86_64__)
    (void)top;
    return la_ctx_make_win64(hi, arg); /* stacks_windows.c: the TIB fields too */
#elif defined(__x86_64__)
    /* [mxcsr|fpucw] r15 r14 r13 r12 rbx rbp ret, see switch_amd64.S */
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
