/* async_fiber_blocking: runs a function on a pool of plain threads while the
 * calling fiber parks. The pool is process-wide, grows on demand up to
 * LA_BLOCKING_MAX threads, and a thread idle for LA_BLOCKING_IDLE_S seconds
 * exits. A submission starts a thread whenever the jobs queued (its own
 * included) outnumber the idle threads: an idle thread that was signalled
 * but has not woken yet still counts as idle, and it is already promised to
 * a job queued before. Comparing with "no thread idle" instead let one idle
 * thread absorb a burst: the jobs ran one at a time, and jobs that wait for
 * each other deadlocked well below the limit. Such parks are not cancelled
 * by a scheduler shutdown: fn may use the fiber's stack, so the fiber waits
 * for it to return. A job that finds no idle thread and whose thread cannot
 * be started (EAGAIN: RLIMIT_NPROC, threads-max, no memory for a stack) is
 * refused with ASYNC_E_NOMEM: queued behind busy threads it could wait for
 * ever for a job that waits for it, and run in place it would run as the
 * fiber on its small stack. The same pool runs the detached jobs of
 * async_runtime_submit_work (work.c), which no fiber waits for. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#include "fiber_int.h"

#define LA_BLOCKING_MAX 64
#define LA_BLOCKING_IDLE_S 10

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static pthread_once_t cv_once = PTHREAD_ONCE_INIT;
static la_pool_job_t *head, *tail;
static int nthreads, nidle, nqueued; /* nqueued: jobs on the list */
/* The fiber whose job this pool thread runs (NULL between jobs): the waits
 * that need that fiber to return (async_sched_run, _shutdown, _destroy of
 * its scheduler, a join of it) would wait for themselves there. */
static __thread la_fiber_t *tls_served;

la_fiber_t *la_blocking_served(void) {
    return tls_served;
}

static void init_cv(void) {
    la_cond_init_mono(&cv);
}

static void *pool_main(void *unused) {
    (void)unused;
    la_block_sigpipe();
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!head) {
            struct timespec ts = la_cond_abstime(la_now_ns() + (uint64_t)LA_BLOCKING_IDLE_S * 1000000000u);
            nidle++;
            int r = la_cond_timedwait_mono(&cv, &mu, &ts);
            nidle--;
            if (r == ETIMEDOUT && !head) {
                nthreads--;
                pthread_mutex_unlock(&mu);
                return NULL;
            }
        }
        la_pool_job_t *j = head;
        head = j->next;
        if (!head) tail = NULL;
        nqueued--;
        pthread_mutex_unlock(&mu);
        la_waiter_t *w = j->w; /* a detached job's fn may free j */
        tls_served = w ? w->f : NULL;
        j->fn(j->arg);
        tls_served = NULL;
        if (w) la_waiter_wake(w, LA_W_READY); /* j lives on the fiber's stack */
        pthread_mutex_lock(&mu);
    }
}

/* Unlinks job from the queue if it is still there (under mu); 1 if it was. */
static int unlink_job(la_pool_job_t *job) {
    la_pool_job_t **pp = &head, *prev = NULL;
    while (*pp && *pp != job) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp) return 0;
    *pp = job->next;
    nqueued--;
    if (tail == job) tail = prev;
    return 1;
}

int la_pool_push(la_pool_job_t *job, int *os_err) {
    pthread_once(&cv_once, init_cv);
    job->next = NULL;
    pthread_mutex_lock(&mu);
    if (tail)
        tail->next = job;
    else
        head = job;
    tail = job;
    nqueued++;
    /* Each idle thread takes one queued job; a thread busy now may take
     * another later, but only grown threads guarantee that jobs up to the
     * limit run at once (they may wait for each other). */
    int spawn = nqueued > nidle && nthreads < LA_BLOCKING_MAX;
    if (spawn) nthreads++;
    if (nidle) pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    if (!spawn) return 0;
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&th, &attr, pool_main, NULL);
    pthread_attr_destroy(&attr);
    if (!err) return 0;
    /* No thread for the job. Left queued it would wait for a busy thread to
     * finish, which may be waiting for it (jobs may wait for each other).
     * It is refused instead, unless a thread has taken it meanwhile. */
    pthread_mutex_lock(&mu);
    nthreads--;
    int found = unlink_job(job);
    pthread_mutex_unlock(&mu);
    if (!found) return 0;
    *os_err = err;
    return err == EAGAIN ? ASYNC_E_NOMEM : ASYNC_E_SYS;
}

la_pool_job_t *la_pool_unqueue(int (*match)(const la_pool_job_t *, const void *), const void *ctx) {
    la_pool_job_t *j;
    pthread_mutex_lock(&mu);
    for (j = head; j && !match(j, ctx); j = j->next) {
    }
    if (j) unlink_job(j);
    pthread_mutex_unlock(&mu);
    return j;
}

int async_fiber_blocking(void (*fn)(void *), void *arg) {
    LA_ENTRY(-1);
    if (!fn) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    la_fiber_t *f = la_current_fiber();
    if (!f) {
        fn(arg);
        return 0;
    }
    la_waiter_t w;
    la_fiber_note(f, LA_WAIT_BLOCKING, (uint64_t)(uintptr_t)fn);
    la_park_prepare(f, LA_PK_BLOCKING); /* never fails for this kind */
    w.f = f;
    w.claim = &f->claim;
    la_pool_job_t job = {fn, arg, &w, NULL};
    int os_err = 0, rc = la_pool_push(&job, &os_err);
    if (rc) {
        /* fn was not run: run in place it would run on the fiber's small
         * stack, as the fiber, blocking its worker */
        atomic_store(&f->claim, LA_W_IDLE);
        atomic_store(&f->state, LA_FS_RUNNING);
        atomic_store(&f->park_kind, LA_PK_NORMAL);
        atomic_store_explicit(&f->wait_what, LA_WAIT_NONE, memory_order_relaxed);
        if (rc == ASYNC_E_SYS)
            la_set_error_os(ASYNC_E_SYS, os_err);
        else
            la_set_error(rc);
        return -1;
    }
    la_park_commit(f);
    atomic_store(&f->park_kind, LA_PK_NORMAL);
    return 0;
}
