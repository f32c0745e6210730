/* No libasync function is a cancellation point: a thread whose
 * pthread_cancel is pending makes every runtime call (wakeup, post that
 * rings, waits of timeout 0, signal and queue rings, all calls in a row),
 * spawns a fiber that kicks a sleeping worker, logs, unwatches a signal and
 * stops a worker, and each call completes and leaves its object working;
 * the cancel acts at the thread's next cancellation point. */
#include "check.h"
#include "rt.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#if defined(__linux__)
#include <sys/eventfd.h>
#endif

/* ---- pthread_cancel: no libasync function is a cancellation point ------------ */

enum { CX_WAKEUP, CX_POST_RING, CX_WAIT0, CX_WAIT0_WOKEN, CX_SIGNAL_RING, CX_QUEUE_RING };

typedef struct {
    async_runtime_t *rt;
    async_queue_t *q;
    int what;
    atomic_int returned; /* the call came back (the cancel did not act inside) */
    int rc;
} cx_t;

static void *cx_thread(void *arg)
{
    cx_t *c = arg;
    CHECK_EQ(pthread_setcanceltype(PTHREAD_CANCEL_DEFERRED, NULL), 0);
    io_event_t ev[4];
    /* The cancel is pending before the call: it must act at the thread's
     * next cancellation point outside libasync, not inside. */
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    switch (c->what) {
    case CX_WAKEUP: c->rc = async_runtime_wakeup(c->rt); break;
    case CX_POST_RING: c->rc = async_runtime_post_completion(c->rt, 11, 12); break;
    case CX_WAIT0:
    case CX_WAIT0_WOKEN: c->rc = async_runtime_wait(c->rt, ev, 4, 0); break;
    case CX_SIGNAL_RING: c->rc = raise(SIGRTMIN + 4); break;
    case CX_QUEUE_RING: c->rc = async_queue_enqueue(c->q, "m", 1) ? 0 : -1; break;
    }
    atomic_store(&c->returned, 1);
    pthread_testcancel();
    return NULL;
}

static void *deinit_thread(void *arg)
{
    async_runtime_deinit(arg);
    return NULL;
}

static void cancel_case(int what)
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    int p[2];
    CHECK_EQ(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
    /* a registered fd: a wait(0) polls the fds */
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0);
    waitres_t w = {rt, -2, 0};
    pthread_t wt = 0;
    int sleeper = what == CX_POST_RING || what == CX_SIGNAL_RING || what == CX_QUEUE_RING;
    async_queue_t *q = NULL;
    if (what == CX_QUEUE_RING) {
        /* the SIGNAL_ON_DATA post of an enqueue runs under the queue's lock */
        q = async_queue_create(4, 8, ASYNC_QUEUE_SIGNAL_ON_DATA);
        CHECK(q);
        CHECK_EQ(async_queue_attach(q, rt, 77), 0);
    }
    if (what == CX_SIGNAL_RING)
        CHECK_EQ(async_runtime_add_signal(rt, SIGRTMIN + 4, 5), 0);
    if (sleeper) {
        /* the loop asleep: a post or a signal rings the doorbell */
        start_thread(&wt, timed_wait, &w);
        async_runtime_stats_t st;
        double t0 = now_ms();
        do {
            sleep_ms(2);
            CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
            CHECK(now_ms() - t0 < 10000);
        } while (st.iterations == 0 && now_ms() - t0 < 100); /* give it time to sleep */
    }
    if (what == CX_WAIT0_WOKEN)
        CHECK_EQ(async_runtime_wakeup(rt), 0);
    cx_t c;
    c.rt = rt;
    c.q = q;
    c.what = what;
    atomic_store(&c.returned, 0);
    c.rc = -2;
    pthread_t th;
    start_thread(&th, cx_thread, &c);
    join_within(th, 10000, "cancelled thread");
    if (!atomic_load(&c.returned))
        fprintf(stderr, "the pending cancel acted inside the libasync call\n");
    CHECK(atomic_load(&c.returned));
    CHECK(c.rc >= 0);
    if (sleeper)
        join_within(wt, 15000, "waiter");
    if (q) {
        /* The queue is not wedged either: its lock is free. */
        char buf[8];
        size_t len = 0;
        CHECK(async_queue_dequeue(q, buf, sizeof buf, &len));
        CHECK(async_queue_enqueue(q, "n", 1));
        async_queue_destroy(q);
    }
    /* The runtime is not wedged: a wait is not BUSY, deinit returns. */
    io_event_t ev[8];
    CHECK(async_runtime_wait(rt, ev, 8, 0) >= 0);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    pthread_t dt;
    start_thread(&dt, deinit_thread, rt);
    join_within(dt, 10000, "deinit");
    close_pair(p);
}

CASE(cancel_wakeup) { cancel_case(CX_WAKEUP); } // poll adversarial
CASE(cancel_post_ring) { cancel_case(CX_POST_RING); } // poll adversarial
CASE(cancel_wait0) { cancel_case(CX_WAIT0); } // poll adversarial
CASE(cancel_wait0_woken) { cancel_case(CX_WAIT0_WOKEN); } // poll adversarial
CASE(cancel_signal_ring) { cancel_case(CX_SIGNAL_RING); } // poll adversarial
CASE(cancel_queue_ring) { cancel_case(CX_QUEUE_RING); } // poll adversarial

/* Every runtime call, made by a thread whose cancel is pending, comes back
 * (the thread makes no libc cancellation point of its own meanwhile). */
typedef struct {
    int rfd;
    atomic_int step;
} cxall_t;

static void *cx_all(void *arg)
{
    cxall_t *c = arg;
    io_event_t ev[4];
    async_runtime_stats_t st;
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    async_runtime_t *rt = async_runtime_init();
    atomic_store(&c->step, 1);
    if (!rt)
        return NULL;
    async_runtime_add(rt, c->rfd, ASYNC_EVENT_READ, NULL);
    async_runtime_modify(rt, c->rfd, ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE);
    uint64_t id = async_runtime_add_timer(rt, 0, 0, 1);
    async_runtime_add_timer(rt, 100000, 0, 2);
    async_runtime_add_signal(rt, SIGRTMIN + 5, 3);
    atomic_store(&c->step, 2);
    async_runtime_post_completion(rt, 4, 5);
    async_runtime_wakeup(rt);
    async_runtime_wait(rt, ev, 4, 0);
    async_runtime_wait(rt, ev, 4, 1);
    async_runtime_wait(rt, ev, 4, 0);
    async_runtime_get_stats(rt, &st, sizeof st);
    atomic_store(&c->step, 3);
    async_runtime_cancel_timer(rt, id);
    async_runtime_remove_signal(rt, SIGRTMIN + 5);
    async_runtime_remove(rt, c->rfd);
    async_runtime_deinit(rt);
    atomic_store(&c->step, 4);
    pthread_testcancel();
    return NULL;
}

/* A fiber spawned from a host thread whose cancel is pending, onto a
 * scheduler whose only worker sleeps in the fd poller: the spawn kicks the
 * poller (a write to its doorbell), which must not be a cancellation point
 * (fiber/poller_epoll.c used libc's write). */
static atomic_int cxk_ran, cxk_step;
static void cxk_fiber(void *arg)
{
    (void)arg;
    atomic_store(&cxk_ran, 1);
}
static void *cxk_thread(void *arg)
{
    async_sched_t *s = arg;
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    atomic_store(&cxk_step, 1);
    async_fiber_spawn(s, cxk_fiber, NULL, 0);
    atomic_store(&cxk_step, 2);
    pthread_testcancel();
    return NULL;
}

CASE(cancel_fiber_kick) // poll adversarial
{
    async_sched_config_t cfg = {.workers = 1};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s != NULL);
    for (int round = 0; round < 20; round++) {
        atomic_store(&cxk_ran, 0);
        atomic_store(&cxk_step, 0);
        usleep(20000); /* the worker goes back to sleep in the poller */
        pthread_t th;
        start_thread(&th, cxk_thread, s);
        join_within(th, 20000, "cancelled thread");
        if (atomic_load(&cxk_step) != 2)
            fprintf(stderr, "round %d: the pending cancel acted inside async_fiber_spawn\n", round);
        CHECK_EQ(atomic_load(&cxk_step), 2);
        for (int i = 0; i < 20000 && !atomic_load(&cxk_ran); i++)
            usleep(1000);
        CHECK_EQ(atomic_load(&cxk_ran), 1);
    }
    async_sched_destroy(s);
}

CASE(cancel_all_calls) // poll adversarial
{
    int p[2];
    CHECK_EQ(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
    CHECK_EQ(write(p[1], "x", 1), 1); /* readable: the waits find it */
    cxall_t c;
    c.rfd = p[0];
    atomic_store(&c.step, 0);
    pthread_t th;
    start_thread(&th, cx_all, &c);
    join_within(th, 20000, "cancelled thread");
    if (atomic_load(&c.step) != 4)
        fprintf(stderr, "the pending cancel acted after step %d\n", atomic_load(&c.step));
    CHECK_EQ(atomic_load(&c.step), 4);
    close_pair(p);
}

/* The one line logged for an unknown ASYNC_BACKEND (stderr, the default
 * log writer) is written by a thread whose cancel is pending: the write
 * must not act on it (it runs inside a Go call). */
static void *cx_init(void *arg)
{
    atomic_int *step = arg;
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    async_runtime_t *rt = async_runtime_init();
    atomic_store(step, rt ? 2 : 1);
    pthread_testcancel();
    return NULL;
}

CHILD(cancel_log_child)
{
    /* A Go call first, so that the one below is not the process's first. */
    CHECK_FAIL(async_runtime_add_timer(NULL, 1, 0, 0) == 0, ASYNC_E_BADHANDLE);
    atomic_int step = 0;
    pthread_t th;
    start_thread(&th, cx_init, &step);
    join_within(th, 20000, "cancelled thread");
    if (atomic_load(&step) != 1)
        fprintf(stderr, "the pending cancel acted inside async_runtime_init (step %d)\n", atomic_load(&step));
    CHECK_EQ(atomic_load(&step), 1);
}

CASE(cancel_log) // poll adversarial
{
    char out[4096];
    int st = run_self_case_out("cancel_log_child", "ASYNC_BACKEND=nope", out, sizeof out);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
    CHECK(strstr(out, "ASYNC_BACKEND") != NULL);
}

/* The last async_fiber_unwatch_signal of a signal, from a thread whose
 * cancel is pending: it writes a byte under the process-wide signal lock,
 * which async_runtime_deinit and async_runtime_add_signal take too. */
static void *cx_unwatch(void *arg)
{
    atomic_int *step = arg;
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    int rc = async_fiber_unwatch_signal(SIGRTMIN + 7);
    atomic_store(step, rc == 0 ? 1 : 2);
    pthread_testcancel();
    return NULL;
}

static void *rt_signal_cycle(void *arg)
{
    (void)arg;
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    CHECK_EQ(async_runtime_add_signal(rt, SIGRTMIN + 7, 1), 0);
    async_runtime_deinit(rt);
    return NULL;
}

CASE(cancel_unwatch) // poll adversarial
{
    CHECK_EQ(async_fiber_watch_signal(SIGRTMIN + 7), 0);
    atomic_int step = 0;
    pthread_t th;
    start_thread(&th, cx_unwatch, &step);
    join_within(th, 10000, "cancelled thread");
    if (atomic_load(&step) != 1)
        fprintf(stderr, "the pending cancel acted inside async_fiber_unwatch_signal\n");
    CHECK_EQ(atomic_load(&step), 1);
    /* The signal lock is free: a runtime's watch and deinit go through. */
    start_thread(&th, rt_signal_cycle, NULL);
    join_within(th, 10000, "add_signal and deinit");
}

/* async_worker_signal_stop from a thread whose cancel is pending: the stop
 * descriptor must still become readable (the worker's proc waits for it in
 * async_runtime_wait, as the header suggests). */
static atomic_int stopfd_seen;

static void *stopfd_proc(void *ctx)
{
    async_worker_t **self = ctx;
    while (!atomic_load((atomic_intptr_t *)self))
        sched_yield();
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    int fd = async_worker_stop_fd(*self);
    CHECK(fd >= 0);
    CHECK_EQ(async_runtime_add(rt, fd, ASYNC_EVENT_READ, NULL), 0);
    io_event_t ev[4];
    double t0 = now_ms();
    while (now_ms() - t0 < 5000) {
        int n = async_runtime_wait(rt, ev, 4, 500);
        CHECK(n >= 0);
        if (n > 0 && ev[0].fd == fd) {
            atomic_fetch_or(&stopfd_seen, 1);
            break;
        }
    }
    async_runtime_remove(rt, fd);
    async_runtime_deinit(rt);
    return NULL;
}

static void *cx_stop(void *arg)
{
    async_worker_t *w = arg;
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    async_worker_signal_stop(w);
    atomic_fetch_or(&stopfd_seen, 2);
    pthread_testcancel();
    return NULL;
}

CASE(cancel_worker_stop) // poll adversarial
{
    static async_worker_t *_Atomic self;
    atomic_store(&self, NULL);
    async_worker_t *w = async_worker_create(stopfd_proc, (void *)&self, 0);
    CHECK(w);
    atomic_store(&self, w);
    sleep_ms(50); /* the proc reaches its wait */
    pthread_t th;
    start_thread(&th, cx_stop, w);
    join_within(th, 10000, "cancelled thread");
    if (!(atomic_load(&stopfd_seen) & 2))
        fprintf(stderr, "the pending cancel acted inside async_worker_signal_stop\n");
    CHECK(atomic_load(&stopfd_seen) & 2);
    CHECK(async_worker_join(w, 15000));
    if (!(atomic_load(&stopfd_seen) & 1))
        fprintf(stderr, "the worker's stop descriptor never became readable\n");
    CHECK(atomic_load(&stopfd_seen) & 1);
    async_worker_destroy(w);
}

TEST_MAIN()
