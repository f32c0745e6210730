/* pthread_cancel of a thread (a plain thread or an async_worker's) asleep
 * inside a libasync wait (channel receive, mutex lock, queue dequeue,
 * runtime wait, fiber sleep, signal wait) does not act there: the wait
 * completes when its event comes (the result reaches the thread), the
 * cancel acts at the thread's next cancellation point, and the object still
 * works (no waiter record of the dead thread left, no lock held, no BUSY
 * runtime). */
#include "check.h"
#include "proc.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

enum { CW_CHAN, CW_MUTEX, CW_QUEUE, CW_RUNTIME, CW_SLEEP, CW_SIGNAL };
static struct {
    int what;
    async_chan_t *c;
    async_mutex_t *m;
    async_queue_t *q;
    async_runtime_t *rt;
    atomic_int tid, rc, value, after, held, release;
    pthread_t holder;
} cw;

/* Holds cw.m until cw.release (a mutex is unlocked by its owner). */
static void *cw_holder(void *arg)
{
    (void)arg;
    CHECK_EQ(async_mutex_lock(cw.m, -1), 0);
    atomic_store(&cw.held, 1);
    while (!atomic_load(&cw.release))
        sleep_ms(1);
    CHECK_EQ(async_mutex_unlock(cw.m), 0);
    return NULL;
}

/* The waiting thread: one blocking call, its result, then a cancellation
 * point (where the cancel must act). Not instrumented by ASan: the
 * cancellation's unwinding skips ASan's unpoisoning of this frame's
 * redzones, and ASan's own thread teardown then writes over them (a false
 * stack-buffer-overflow in sigaltstack). */
__attribute__((no_sanitize_address)) static void *cw_proc(void *arg)
{
    (void)arg;
    atomic_store(&cw.tid, (int)gettid());
    int rc = -1, v = 0;
    switch (cw.what) {
    case CW_CHAN:
        rc = async_chan_recv(cw.c, &v, -1);
        break;
    case CW_MUTEX:
        rc = async_mutex_lock(cw.m, -1);
        v = 1;
        break;
    case CW_QUEUE: {
        size_t n = 0;
        rc = async_queue_dequeue_wait(cw.q, &v, sizeof v, &n, -1) ? 0 : -1;
        break;
    }
    case CW_RUNTIME: {
        io_event_t ev[2];
        rc = async_runtime_wait(cw.rt, ev, 2, -1);
        v = rc == 1 ? (int)ev[0].data : -1;
        break;
    }
    case CW_SLEEP:
        rc = async_fiber_sleep(1000);
        v = 1;
        break;
    case CW_SIGNAL:
        rc = async_fiber_wait_signal(SIGRTMIN + 4, -1);
        v = rc == 1 ? 4242 : -1;
        rc = rc == 1 ? 0 : rc;
        break;
    }
    atomic_store(&cw.rc, rc);
    atomic_store(&cw.value, v);
    pthread_testcancel(); /* the cancel acts here */
    atomic_store(&cw.after, 1);
    return NULL;
}

static void *cw_worker_proc(void *arg) { return cw_proc(arg); }

/* The event the waiter waits for, from a helper thread (a wait that never
 * ends shows as a failed join). */
static void *cw_complete(void *arg)
{
    (void)arg;
    int v = 4242;
    switch (cw.what) {
    case CW_CHAN:
        CHECK_EQ(async_chan_send(cw.c, &v, 5000), 0);
        break;
    case CW_MUTEX:
        atomic_store(&cw.release, 1);
        join_within(cw.holder, 10000, "mutex holder");
        break;
    case CW_QUEUE:
        CHECK(async_queue_enqueue(cw.q, &v, sizeof v));
        break;
    case CW_RUNTIME:
        CHECK_EQ(async_runtime_post_completion(cw.rt, 1, (uintptr_t)v), 0);
        break;
    case CW_SLEEP:
        break;
    case CW_SIGNAL: {
        union sigval sv = {0};
        CHECK_EQ(sigqueue(getpid(), SIGRTMIN + 4, sv), 0);
        break;
    }
    }
    return NULL;
}

/* 0 if inconclusive: the call had returned before the cancel was sent
 * (only a sleep can: it ends by itself). */
static int cancel_case(int what, int on_worker)
{
    memset(&cw, 0, sizeof cw);
    cw.what = what;
    atomic_store(&cw.rc, -99); /* set by the waiter when its call returns */
    CHECK((cw.c = async_chan_create(0, sizeof(int))) != NULL);
    CHECK((cw.m = async_mutex_create()) != NULL);
    if (what == CW_MUTEX) {
        start_thread(&cw.holder, cw_holder, NULL);
        while (!atomic_load(&cw.held))
            sleep_ms(1);
    }
    CHECK((cw.q = async_queue_create(4, sizeof(int), 0)) != NULL);
    CHECK((cw.rt = async_runtime_init()) != NULL);
    if (what == CW_SIGNAL)
        CHECK_EQ(async_fiber_watch_signal(SIGRTMIN + 4), 0);
    pthread_t th;
    async_worker_t *w = NULL;
    if (on_worker) {
        CHECK((w = async_worker_create(cw_worker_proc, NULL, 0)) != NULL);
        th = async_worker_get_native_handle(w);
    } else {
        start_thread(&th, cw_proc, NULL);
    }
    /* asleep in the call for 3 samples in a row (it sleeps nowhere else) */
    double t0 = now_ms();
    for (int streak = 0; streak < 3;) {
        int tid = atomic_load(&cw.tid);
        streak = tid && thread_asleep(tid) ? streak + 1 : 0;
        CHECK(now_ms() - t0 < 10000);
        sleep_ms(5);
    }
    CHECK_EQ(pthread_cancel(th), 0);
    int early = atomic_load(&cw.rc) != -99;
    CHECK(!early || what == CW_SLEEP);
    sleep_ms(20); /* let a cancel that wrongly acts inside the call do so */
    pthread_t helper;
    start_thread(&helper, cw_complete, NULL);
    join_within(helper, 10000, "the waiter's event");
    if (on_worker) {
        CHECK(async_worker_join(w, 10000));
        async_worker_destroy(w);
    } else {
        join_within(th, 10000, "cancelled waiter");
    }
    if (early) { /* a loaded machine: the sleep ended before the cancel */
        async_runtime_deinit(cw.rt);
        async_queue_destroy(cw.q);
        async_chan_destroy(cw.c);
        async_mutex_destroy(cw.m);
        return 0;
    }
    /* the call completed with its result; the cancel acted after it */
    CHECK_EQ(atomic_load(&cw.after), 0);
    switch (what) {
    case CW_CHAN:
    case CW_QUEUE:
    case CW_RUNTIME:
    case CW_SIGNAL:
        CHECK_EQ(atomic_load(&cw.rc), what == CW_RUNTIME ? 1 : 0);
        CHECK_EQ(atomic_load(&cw.value), 4242);
        break;
    case CW_MUTEX:
    case CW_SLEEP:
        CHECK_EQ(atomic_load(&cw.rc), 0);
        CHECK_EQ(atomic_load(&cw.value), 1);
        break;
    }
    /* the objects still work */
    int v = 1;
    CHECK_FAIL(async_chan_send(cw.c, &v, 50) == -1, ASYNC_E_TIMEDOUT); /* no receiver left behind */
    if (what != CW_MUTEX) { /* (there the dead thread owns it) */
        CHECK_EQ(async_mutex_lock(cw.m, 1000), 0);
        CHECK_EQ(async_mutex_unlock(cw.m), 0);
    }
    CHECK(async_queue_enqueue(cw.q, &v, sizeof v));
    CHECK(async_queue_dequeue_wait(cw.q, &v, sizeof v, NULL, 1000));
    io_event_t ev[2];
    CHECK(async_runtime_wait(cw.rt, ev, 2, 0) >= 0); /* not BUSY */
    if (what == CW_SIGNAL) {
        union sigval sv = {0};
        CHECK_EQ(sigqueue(getpid(), SIGRTMIN + 4, sv), 0);
        CHECK_EQ(async_fiber_wait_signal(SIGRTMIN + 4, 5000), 1);
        CHECK_EQ(async_fiber_unwatch_signal(SIGRTMIN + 4), 0);
    }
    async_runtime_deinit(cw.rt);
    async_queue_destroy(cw.q);
    async_chan_destroy(cw.c);
    if (what != CW_MUTEX)
        async_mutex_destroy(cw.m);
    return 1;
}

CASE(cancel_chan_recv) { cancel_case(CW_CHAN, 0); } // poll adversarial
CASE(cancel_chan_recv_worker) { cancel_case(CW_CHAN, 1); } // poll adversarial
CASE(cancel_mutex_lock) { cancel_case(CW_MUTEX, 0); } // poll adversarial
CASE(cancel_queue_dequeue) { cancel_case(CW_QUEUE, 0); } // poll adversarial
CASE(cancel_queue_dequeue_worker) { cancel_case(CW_QUEUE, 1); } // poll adversarial
CASE(cancel_runtime_wait) { cancel_case(CW_RUNTIME, 0); } // poll adversarial
CASE(cancel_runtime_wait_worker) { cancel_case(CW_RUNTIME, 1); } // poll adversarial
CASE(cancel_signal_wait) { cancel_case(CW_SIGNAL, 0); } // poll adversarial
CASE(cancel_sleep) // poll adversarial
{
    int tries = 0;
    while (!cancel_case(CW_SLEEP, 0))
        CHECK(++tries < 5);
}

TEST_MAIN()
