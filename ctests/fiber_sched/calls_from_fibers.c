/* libasync's other calls made from fibers: a queue's blocking enqueue and
 * dequeue park the fiber (not its worker) and a plain thread's enqueue wakes
 * it; runtime completions and timers, queue stats work from many fibers on
 * many workers at once.
 * scripts/cross.sh builds this file for Windows and runs its cases under
 * wine. */
#include <pthread.h>
#include <stdatomic.h>

#include "fibers.h"

/* ---- queues: blocking enqueue and dequeue park the fiber ------------------ */

typedef struct {
    async_queue_t *q;
    int n;
    long sum;
} qctx_t;

static void q_producer(void *arg) {
    qctx_t *x = arg;
    for (int i = 1; i <= x->n; i++) CHECK(async_queue_enqueue(x->q, &i, sizeof i)); /* BLOCK_WRITER: parks */
}

static void q_consumer(void *arg) {
    qctx_t *x = arg;
    for (int i = 1; i <= x->n; i++) {
        int v = 0;
        size_t sz = 0;
        CHECK(async_queue_dequeue_wait(x->q, &v, sizeof v, &sz, -1));
        CHECK_EQ(sz, sizeof v);
        CHECK_EQ(v, i);
        x->sum += v;
    }
}

static atomic_int q_timeout_phase; /* 1: the timeout checks are done */

static void q_timeout(void *arg) {
    async_queue_t *q = arg;
    int v;
    double t0 = now_ms();
    CHECK_FAIL(!async_queue_dequeue_wait(q, &v, sizeof v, NULL, 30), ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 29.9);
    CHECK_FAIL(!async_queue_dequeue_wait(q, &v, sizeof v, NULL, -7), ASYNC_E_INVAL);
    atomic_store(&q_timeout_phase, 1);
    /* a message from a plain thread wakes the fiber */
    CHECK(async_queue_dequeue_wait(q, &v, sizeof v, NULL, 10000));
    CHECK_EQ(v, 99);
}

CASE(queue_park) { // valgrind
    /* one worker: a fiber blocked in the queue would deadlock the producer */
    async_sched_t *s = sched_new(1);
    qctx_t x = {async_queue_create(1, sizeof(int), ASYNC_QUEUE_BLOCK_WRITER), 20000, 0};
    CHECK(x.q);
    CHECK(async_fiber_spawn(s, q_consumer, &x, 0));
    CHECK(async_fiber_spawn(s, q_producer, &x, 0));
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(x.sum, 20000L * 20001 / 2);
    async_sched_worker_stats_t ws;
    async_sched_stats_t st;
    CHECK_EQ(async_sched_get_stats(s, &st, &ws, 1), 1);
    CHECK(ws.parks > 1000); /* they parked, not spun */
    async_queue_t *q = async_queue_create(4, sizeof(int), 0);
    async_fiber_t *f = async_fiber_spawn(s, q_timeout, q, ASYNC_FIBER_JOINABLE);
    /* enqueue only once the fiber is parked in its last wait: earlier, the
     * message would end its 30 ms wait that must time out */
    for (double t0 = now_ms(); !atomic_load(&q_timeout_phase); sleep_ms(2)) CHECK(now_ms() - t0 < 60000);
    sched_wait_parked(s, 1);
    int v = 99;
    CHECK(async_queue_enqueue(q, &v, sizeof v));
    CHECK_EQ(async_fiber_join(f, -1), 0);
    async_queue_destroy(q);
    async_queue_destroy(x.q);
    async_sched_destroy(s);
}

typedef struct {
    async_queue_t *q;
    async_runtime_t *rt;
    atomic_long posted, timers_ok;
} api_ctx_t;

static void api_fiber(void *arg) {
    api_ctx_t *x = arg;
    for (int i = 0; i < 200; i++) {
        int v = i;
        if (async_queue_enqueue(x->q, &v, sizeof v)) {
            int out;
            /* someone else may have taken it: either is fine */
            (void)async_queue_dequeue(x->q, &out, sizeof out, NULL);
        }
        CHECK_EQ(async_runtime_post_completion(x->rt, 7, (uintptr_t)i), 0);
        atomic_fetch_add(&x->posted, 1);
        uint64_t id = async_runtime_add_timer(x->rt, 100000, 0, 9);
        CHECK(id != 0);
        CHECK_EQ(async_runtime_cancel_timer(x->rt, id), 0);
        CHECK_FAIL(async_runtime_cancel_timer(x->rt, id) == -1, ASYNC_E_NOTFOUND);
        atomic_fetch_add(&x->timers_ok, 1);
        async_queue_stats_t qs;
        async_queue_get_stats(x->q, &qs);
        CHECK_EQ(qs.capacity, 64);
        if (i % 10 == 0) async_fiber_yield();
    }
}

CASE(api_stress) { // valgrind
    enum { F = 200 };
    async_sched_t *s = sched_new(4);
    api_ctx_t x;
    x.q = async_queue_create(64, sizeof(int), 0);
    x.rt = async_runtime_init();
    CHECK(x.q && x.rt);
    atomic_init(&x.posted, 0);
    atomic_init(&x.timers_ok, 0);
    for (int i = 0; i < F; i++) CHECK(async_fiber_spawn(s, api_fiber, &x, 0));
    long got = 0;
    io_event_t ev[256];
    double t0 = now_ms();
    while (got < F * 200L && now_ms() - t0 < 60000) {
        int n = async_runtime_wait(x.rt, ev, 256, 100);
        CHECK(n >= 0);
        for (int i = 0; i < n; i++) {
            CHECK(ev[i].event_type == ASYNC_EVENT_COMPLETION);
            CHECK_EQ(ev[i].completion_key, 7);
            got++;
        }
    }
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(got, F * 200L);
    CHECK_EQ(atomic_load(&x.posted), F * 200L);
    CHECK_EQ(atomic_load(&x.timers_ok), F * 200L);
    async_sched_worker_stats_t ws[4];
    async_sched_stats_t st;
    CHECK_EQ(async_sched_get_stats(s, &st, ws, 4), 4);
    for (int i = 0; i < 4; i++) printf("worker %d ran %llu\n", i, (unsigned long long)ws[i].fibers_run);
    async_runtime_deinit(x.rt);
    async_queue_destroy(x.q);
    async_sched_destroy(s);
}

TEST_MAIN()
