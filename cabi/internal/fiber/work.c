/* async_runtime_submit_work / async_runtime_cancel_work: a function run on
 * the blocking pool (blocking.c) as a detached job, its result posted to a
 * runtime as a completion.
 *
 * An item is one malloc'd record, owned by the pool's queue while it waits
 * and by the pool thread once it starts; whoever removes it from the queue
 * (the thread that starts it, or a cancel) frees it, so it is freed exactly
 * once and a cancel and a start cannot both win. The runtime is only named
 * by its handle: a pool thread checks that it is live before running fn and
 * learns from the post that it is gone, so a deinit needs no list of items
 * and never waits for one. The queued count (work_queued) bounds what waits
 * for a thread (ASYNC_WORK_MAX_QUEUED); it is taken at submit and given back
 * when the item leaves the queue. */
#include <stdlib.h>
#include <time.h>

#include "fiber_int.h"

typedef struct {
    la_pool_job_t job; /* first: the pool hands work_run the record */
    uint64_t h;        /* the runtime */
    uint64_t id;
    async_work_fn fn;
    void *arg;
    uintptr_t key;
    async_work_drop_fn drop;
} la_work_t;

static _Atomic uint64_t work_seq;
static _Atomic int work_queued;

static void work_sleep_1ms(void) {
#if defined(_WIN32)
    Sleep(1);
#else
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
#endif
}

/* Posts the result until it is posted or the runtime is gone (then 0). */
static int work_post(la_work_t *w, uintptr_t result) {
    for (;;) {
        if (async_runtime_post_completion((async_runtime_t *)(uintptr_t)w->h, w->key, result) == 0) return 1;
        if (async_last_error() != ASYNC_E_NOMEM) return 0;
        work_sleep_1ms();
    }
}

static void work_run(void *p) {
    la_work_t *w = p;
    atomic_fetch_sub(&work_queued, 1);
    if (!la_handle_live(w->h, LA_T_RUNTIME)) {
        if (w->drop) w->drop(w->arg, 0, 0);
    } else {
        uintptr_t result = w->fn(w->arg);
        if (!work_post(w, result) && w->drop) w->drop(w->arg, result, 1);
    }
    free(w);
}

uint64_t async_runtime_submit_work(async_runtime_t *rt, async_work_fn fn, void *arg, uintptr_t key,
                                   async_work_drop_fn drop) {
    LA_ENTRY(0);
    if (!fn) {
        la_set_error(ASYNC_E_INVAL);
        return 0;
    }
    if (!la_handle_live(LA_H(rt), LA_T_RUNTIME)) {
        la_set_error(ASYNC_E_BADHANDLE);
        return 0;
    }
    if (atomic_fetch_add(&work_queued, 1) >= ASYNC_WORK_MAX_QUEUED) {
        atomic_fetch_sub(&work_queued, 1);
        la_set_error(ASYNC_E_FULL);
        return 0;
    }
    la_work_t *w = malloc(sizeof *w);
    if (!w) {
        atomic_fetch_sub(&work_queued, 1);
        la_set_error(ASYNC_E_NOMEM);
        return 0;
    }
    w->job.fn = work_run;
    w->job.arg = w;
    w->job.w = NULL;
    w->h = LA_H(rt);
    w->id = atomic_fetch_add(&work_seq, 1) + 1;
    w->fn = fn;
    w->arg = arg;
    w->key = key;
    w->drop = drop;
    uint64_t id = w->id; /* w may be run and freed once pushed */
    int os_err = 0, rc = la_pool_push(&w->job, &os_err);
    if (rc) {
        atomic_fetch_sub(&work_queued, 1);
        free(w);
        if (rc == ASYNC_E_SYS)
            la_set_error_os(ASYNC_E_SYS, os_err);
        else
            la_set_error(rc);
        return 0;
    }
    return id;
}

typedef struct {
    uint64_t h, id;
} la_work_ref_t;

static int work_match(const la_pool_job_t *j, const void *ctx) {
    const la_work_ref_t *ref = ctx;
    const la_work_t *w = (const la_work_t *)j;
    return j->fn == work_run && w->id == ref->id && w->h == ref->h;
}

int async_runtime_cancel_work(async_runtime_t *rt, uint64_t work_id) {
    LA_ENTRY(-1);
    if (!la_handle_live(LA_H(rt), LA_T_RUNTIME)) {
        la_set_error(ASYNC_E_BADHANDLE);
        return -1;
    }
    la_work_ref_t ref = {LA_H(rt), work_id};
    la_pool_job_t *j = work_id ? la_pool_unqueue(work_match, &ref) : NULL;
    if (!j) {
        la_set_error(ASYNC_E_NOTFOUND);
        return -1;
    }
    atomic_fetch_sub(&work_queued, 1);
    free(j);
    return 0;
}
