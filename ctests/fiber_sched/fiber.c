/* Fiber scheduler tests: one case per ctest test (see CMakeLists.txt).
 * ASYNC_TEST_FULL=1 runs the full-size echo test (10k connections).
 * scripts/cross.sh also builds this file for Windows (mingw-w64) and runs
 * there, under wine, the cases outside the #if !defined(_WIN32) blocks (those
 * use pipes, int fds, fork; scripts/win_fiber.c has the Windows versions). */
#include <pthread.h>
#include <stdatomic.h>
#if !defined(_WIN32)
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#endif

#include "check.h"


/* Waits until n fibers of s are parked (the stats count a fiber once it has
 * registered its wait and switched away): a test that must act on a parked
 * fiber waits for this instead of sleeping and hoping. Fails after 60 s. */

/* ---- basics ------------------------------------------------------------------ */

static atomic_long yields_counted;
static atomic_int fibers_done;

static void yielder(void *arg) {
    (void)arg;
    for (int i = 0; i < 1000; i++) {
        atomic_fetch_add(&yields_counted, 1);
        async_fiber_yield();
    }
    atomic_fetch_add(&fibers_done, 1);
}

static void t_yield_100x1000(void) {
    async_sched_t *s = sched_new(0);
    for (int i = 0; i < 100; i++) CHECK(async_fiber_spawn(s, yielder, NULL, 0) != NULL);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&yields_counted), 100000);
    CHECK_EQ(atomic_load(&fibers_done), 100);
    async_sched_stats_t st;
    async_sched_worker_stats_t ws[64];
    int n = async_sched_get_stats(s, &st, ws, 64);
    CHECK(n >= 1);
    CHECK_EQ(st.fibers_spawned, 100);
    CHECK_EQ(st.fibers_finished, 100);
    CHECK_EQ(st.fibers_runnable + st.fibers_running + st.fibers_parked + st.fibers_done_unjoined, 0);
    uint64_t run = 0;
    for (int i = 0; i < n; i++) run += ws[i].fibers_run;
    CHECK(run >= 100100); /* every fiber resumed after each yield, plus its start */
    async_sched_destroy(s);
}

static int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

typedef struct {
    int in, out;
} fib_job_t;

static void fib_fiber(void *arg) {
    fib_job_t *j = arg;
    int r = fib(j->in);
    for (int i = 0; i < 10; i++) async_fiber_yield();
    j->out = r;
}

static void t_fib_100k(void) {
    enum { N = 100000 };
    async_sched_t *s = sched_new(0);
    fib_job_t *jobs = calloc(N, sizeof *jobs);
    async_fiber_t **fs = calloc(N, sizeof *fs);
    CHECK(jobs && fs);
    for (int i = 0; i < N; i++) {
        jobs[i].in = 20 - (i % 3);
        jobs[i].out = -1;
        fs[i] = async_fiber_spawn(s, fib_fiber, &jobs[i], ASYNC_FIBER_JOINABLE);
        CHECK(fs[i] != NULL);
    }
    for (int i = 0; i < N; i++) CHECK_EQ(async_fiber_join(fs[i], -1), 0);
    int expect[3] = {fib(20), fib(19), fib(18)};
    for (int i = 0; i < N; i++) CHECK_EQ(jobs[i].out, expect[i % 3]);
    /* joined handles are gone */
    CHECK_FAIL(async_fiber_join(fs[0], 0) == -1, ASYNC_E_BADHANDLE);
    async_sched_stats_t st;
    async_sched_worker_stats_t ws[256];
    int n = async_sched_get_stats(s, &st, ws, 256);
    CHECK_EQ(n, st.workers);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += ws[i].fibers_started;
    CHECK_EQ(total, N);
    for (int i = 0; i < n; i++) {
        double even = (double)total / n;
        printf("worker %d: started %llu run %llu steals %llu parks %llu\n", i,
               (unsigned long long)ws[i].fibers_started, (unsigned long long)ws[i].fibers_run,
               (unsigned long long)ws[i].steals, (unsigned long long)ws[i].parks);
        /* Every worker takes a real share. How big a share is partly the
         * OS's choice: on a loaded machine one worker thread gets less CPU
         * (seen: 33k of 100k on 2 workers at load 7), hence a third of an
         * even share, not half; no work distribution at all gives ~0. */
        CHECK((double)ws[i].fibers_started >= even / 3 && (double)ws[i].fibers_started <= even * 3);
    }
    async_sched_destroy(s);
    free(jobs);
    free(fs);
}

static atomic_int sleepers_in, sleepers_most; /* fibers inside async_fiber_sleep now, and at most */

static void sleeper(void *arg) {
    double t0 = now_ms();
    int now = atomic_fetch_add(&sleepers_in, 1) + 1, most = atomic_load(&sleepers_most);
    while (now > most && !atomic_compare_exchange_weak(&sleepers_most, &most, now)) {
    }
    CHECK_EQ(async_fiber_sleep(50), 0);
    atomic_fetch_sub(&sleepers_in, 1);
    *(double *)arg = now_ms() - t0;
}

static void t_sleep(void) {
    async_sched_t *s = sched_new(2);
    double el[20];
    for (int i = 0; i < 20; i++) CHECK(async_fiber_spawn(s, sleeper, &el[i], 0));
    double t0 = now_ms();
    CHECK_EQ(async_sched_run(s), 0);
    double total = now_ms() - t0;
    for (int i = 0; i < 20; i++) CHECK(el[i] >= 49.9);
    printf("20 fibers slept 50 ms in %.0f ms, up to %d at once\n", total, atomic_load(&sleepers_most));
    /* they slept concurrently: more at once than the 2 workers (a sleep that
     * blocked its worker allows 2); counted, as time proves nothing here */
    CHECK(atomic_load(&sleepers_most) > 2);
    CHECK(total < 5000); /* and did not hang */
    /* plain thread: sleeps the thread */
    t0 = now_ms();
    CHECK_EQ(async_fiber_sleep(20), 0);
    CHECK(now_ms() - t0 >= 19.9);
    async_sched_destroy(s);
}

typedef struct {
    async_sched_t *s;
    atomic_int step;
    atomic_int release; /* the children return only once it is set */
    async_fiber_t *self_seen;
    int err_seen;
} ctx_t;

static void child(void *arg) {
    ctx_t *c = arg;
    /* not a fixed sleep: on a loaded host the parent may be descheduled for
     * longer than any sleep between its spawn and its join(k, 0) */
    while (!atomic_load(&c->release)) async_fiber_sleep(1);
    atomic_store(&c->step, 1);
}

static void parent(void *arg) {
    ctx_t *c = arg;
    c->self_seen = async_fiber_current();
    CHECK(c->self_seen != NULL);
    async_fiber_t *k = async_fiber_spawn(c->s, child, c, ASYNC_FIBER_JOINABLE);
    CHECK(k);
    CHECK_FAIL(async_fiber_join(k, 0) == -1, ASYNC_E_TIMEDOUT);
    CHECK_FAIL(async_fiber_join(c->self_seen, -1) == -1, ASYNC_E_STATE); /* itself */
    atomic_store(&c->release, 1);
    async_fiber_t *nj = async_fiber_spawn(c->s, child, c, 0);
    CHECK(nj);
    /* not joinable: INVAL, or BADHANDLE if it already ran on the other worker */
    CHECK(async_fiber_join(nj, -1) == -1);
    CHECK(async_last_error() == ASYNC_E_INVAL || async_last_error() == ASYNC_E_BADHANDLE);
    CHECK_EQ(async_fiber_join(k, -1), 0);
    CHECK_EQ(atomic_load(&c->step), 1);
    /* per-fiber last error survives a park (and a move to another worker) */
    async_queue_destroy(NULL);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    async_fiber_sleep(5);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    async_clear_error();
    CHECK_ERR(ASYNC_OK);
    CHECK_FAIL(async_sched_run(c->s) == -1, ASYNC_E_STATE);
}

static void t_spawn_join_current(void) {
    CHECK(async_fiber_current() == NULL);
    ctx_t c = {0};
    c.s = sched_new(2);
    async_fiber_t *p = async_fiber_spawn(c.s, parent, &c, ASYNC_FIBER_JOINABLE);
    CHECK(p);
    CHECK_EQ(async_fiber_join(p, 10000), 0);
    CHECK(c.self_seen == p);
    /* the plain thread's error slot was not touched by the fiber */
    async_clear_error();
    async_queue_destroy(NULL);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    async_sched_destroy(c.s);
}

static void nop(void *arg) { (void)arg; }

static void t_badinput(void) {
    CHECK_FAIL(async_fiber_spawn(NULL, nop, NULL, 0) == NULL, ASYNC_E_BADHANDLE);
    async_sched_config_t bad = {-1, 0, 0};
    CHECK_FAIL(async_sched_create(&bad) == NULL, ASYNC_E_INVAL);
    async_sched_config_t bad2 = {1, 100, 0};
    CHECK_FAIL(async_sched_create(&bad2) == NULL, ASYNC_E_INVAL);
    async_sched_config_t bad3 = {1, 0, 9};
    CHECK_FAIL(async_sched_create(&bad3) == NULL, ASYNC_E_INVAL);
    async_sched_t *s = sched_new(1);
    CHECK_FAIL(async_fiber_spawn(s, NULL, NULL, 0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_spawn(s, nop, NULL, 0x80) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_join(NULL, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_join((async_fiber_t *)s, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_sched_run((async_sched_t *)(uintptr_t)12345) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_sched_shutdown(s, -2) == -1, ASYNC_E_INVAL);
    async_sched_stats_t st;
    CHECK_FAIL(async_sched_get_stats(s, NULL, NULL, 0) == -1, ASYNC_E_INVAL);
    CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
    CHECK_EQ(st.workers, 1);
    CHECK_EQ(st.stack_size, 64 * 1024);
    CHECK(st.guard_mode >= 1 && st.guard_mode <= 3);
    async_sched_destroy(s);
    CHECK_FAIL(async_sched_run(s) == -1, ASYNC_E_BADHANDLE);
    async_sched_destroy(s); /* ignored */
    CHECK_ERR(ASYNC_E_BADHANDLE);
}

static void t_guard_modes(void) {
    for (int m = 1; m <= 3; m++) {
        async_sched_config_t cfg = {1, 32 * 1024, m};
        async_sched_t *s = async_sched_create(&cfg);
        if (!s && m == 1 && async_last_error() == ASYNC_E_NOTSUP) {
            printf("madvise guards unsupported here\n");
            continue;
        }
        CHECK(s);
        atomic_store(&yields_counted, 0);
        atomic_store(&fibers_done, 0);
        for (int i = 0; i < 10; i++) CHECK(async_fiber_spawn(s, yielder, NULL, 0));
        CHECK_EQ(async_sched_run(s), 0);
        CHECK_EQ(atomic_load(&fibers_done), 10);
        async_sched_stats_t st;
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        CHECK_EQ(st.guard_mode, m);
        CHECK_EQ(st.stack_size, 32 * 1024);
        async_sched_destroy(s);
    }
}

/* several schedulers at once, a fiber of one spawning on another */
typedef struct {
    async_sched_t *other;
    atomic_int *counter;
} cross_t;

static void count_fiber(void *arg) {
    atomic_fetch_add((atomic_int *)arg, 1);
    async_fiber_yield();
    atomic_fetch_add((atomic_int *)arg, 1);
}

static void cross_spawner(void *arg) {
    cross_t *c = arg;
    for (int i = 0; i < 100; i++) CHECK(async_fiber_spawn(c->other, count_fiber, c->counter, 0));
    async_fiber_sleep(1);
}

static void t_several_scheds(void) {
    enum { K = 4 };
    async_sched_t *s[K];
    atomic_int counters[K];
    cross_t cx[K];
    for (int i = 0; i < K; i++) {
        s[i] = sched_new(2);
        atomic_init(&counters[i], 0);
    }
    for (int i = 0; i < K; i++) {
        cx[i].other = s[(i + 1) % K];
        cx[i].counter = &counters[(i + 1) % K];
        for (int j = 0; j < 10; j++) CHECK(async_fiber_spawn(s[i], cross_spawner, &cx[i], 0));
    }
    /* run each until idle: a scheduler may receive more fibers after it was
     * idle once, so loop until every counter is complete */
    for (int round = 0; round < 100; round++) {
        for (int i = 0; i < K; i++) CHECK_EQ(async_sched_run(s[i]), 0);
        int ok = 1;
        for (int i = 0; i < K; i++) ok &= atomic_load(&counters[i]) == 2000;
        if (ok) break;
    }
    for (int i = 0; i < K; i++) CHECK_EQ(atomic_load(&counters[i]), 2000);
    for (int i = 0; i < K; i++) async_sched_destroy(s[i]);
}

/* ---- channels ------------------------------------------------------------------- */

typedef struct {
    async_chan_t *c;
    long n;
    long bad;
} pipe_ctx_t;

static void int_producer(void *arg) {
    pipe_ctx_t *p = arg;
    for (long i = 0; i < p->n; i++) CHECK_EQ(async_chan_send(p->c, &i, -1), 0);
    async_chan_close(p->c);
}

static void int_consumer(void *arg) {
    pipe_ctx_t *p = arg;
    long v, expect = 0;
    while (async_chan_recv(p->c, &v, -1) == 0) {
        if (v != expect) p->bad++;
        expect++;
    }
    CHECK_ERR(ASYNC_E_CLOSED);
    CHECK_EQ(expect, p->n);
}

static void exchange(size_t cap, long n) {
    async_sched_t *s = sched_new(2);
    pipe_ctx_t p = {async_chan_create(cap, sizeof(long)), n, 0};
    CHECK(p.c);
    double t0 = now_ms();
    CHECK(async_fiber_spawn(s, int_consumer, &p, 0));
    CHECK(async_fiber_spawn(s, int_producer, &p, 0));
    CHECK_EQ(async_sched_run(s), 0);
    printf("cap %zu: %ld ints in %.0f ms\n", cap, n, now_ms() - t0);
    CHECK_EQ(p.bad, 0);
    async_chan_destroy(p.c);
    async_sched_destroy(s);
}

static void t_chan_1m_buffered(void) { exchange(64, 1000000); }
static void t_chan_1m_rendezvous(void) { exchange(0, 1000000); }

typedef struct {
    async_chan_t *c;
    atomic_int closed_seen;
    atomic_int got;
} close_ctx_t;

static void recv_until_closed(void *arg) {
    close_ctx_t *x = arg;
    int v;
    for (;;) {
        if (async_chan_recv(x->c, &v, -1) == 0) {
            atomic_fetch_add(&x->got, 1);
            continue;
        }
        CHECK_ERR(ASYNC_E_CLOSED);
        atomic_fetch_add(&x->closed_seen, 1);
        return;
    }
}

static void t_chan_close(void) {
    async_sched_t *s = sched_new(2);
    /* parked receivers on a rendezvous channel all wake with CLOSED */
    close_ctx_t x = {async_chan_create(0, sizeof(int)), 0, 0};
    for (int i = 0; i < 50; i++) CHECK(async_fiber_spawn(s, recv_until_closed, &x, 0));
    sched_wait_parked(s, 50);
    int v = 7;
    CHECK_EQ(async_chan_send(x.c, &v, 1000), 0); /* a plain thread sends to a fiber */
    async_chan_close(x.c);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&x.closed_seen), 50);
    CHECK_EQ(atomic_load(&x.got), 1);
    CHECK_FAIL(async_chan_send(x.c, &v, -1) == -1, ASYNC_E_CLOSED);
    CHECK_FAIL(async_chan_try_recv(x.c, &v) == -1, ASYNC_E_CLOSED);
    async_chan_destroy(x.c);
    CHECK_FAIL(async_chan_send(x.c, &v, 0) == -1, ASYNC_E_BADHANDLE);

    /* a buffered channel drains before reporting CLOSED */
    async_chan_t *b = async_chan_create(4, sizeof(int));
    for (int i = 0; i < 4; i++) CHECK_EQ(async_chan_try_send(b, &i), 0);
    CHECK_FAIL(async_chan_try_send(b, &v) == -1, ASYNC_E_FULL);
    CHECK_FAIL(async_chan_send(b, &v, 20) == -1, ASYNC_E_TIMEDOUT);
    async_chan_close(b);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ(async_chan_recv(b, &v, -1), 0);
        CHECK_EQ(v, i);
    }
    CHECK_FAIL(async_chan_recv(b, &v, -1) == -1, ASYNC_E_CLOSED);
    async_chan_destroy(b);
    /* empty */
    b = async_chan_create(1, 3);
    char e3[3];
    CHECK_FAIL(async_chan_try_recv(b, e3) == -1, ASYNC_E_EMPTY);
    double t0 = now_ms();
    CHECK_FAIL(async_chan_recv(b, e3, 30) == -1, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 29.9);
    async_chan_destroy(b);
    /* destroy wakes a parked receiver too */
    x.c = async_chan_create(2, sizeof(int));
    atomic_store(&x.closed_seen, 0);
    CHECK(async_fiber_spawn(s, recv_until_closed, &x, 0));
    sched_wait_parked(s, 1); /* a recv that began after the destroy would see BADHANDLE */
    async_chan_destroy(x.c);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&x.closed_seen), 1);
    /* bad input */
    CHECK_FAIL(async_chan_create(1, 0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create((size_t)1 << 30, 8) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_send(NULL, &v, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_chan_recv((async_chan_t *)s, &v, 0) == -1, ASYNC_E_BADHANDLE);
    b = async_chan_create(1, sizeof(int));
    CHECK_FAIL(async_chan_send(b, NULL, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_send(b, &v, -5) == -1, ASYNC_E_INVAL);
    async_chan_destroy(b);
    async_chan_close(NULL);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    async_sched_destroy(s);
}

typedef struct {
    async_chan_t *a, *b, *quit;
    long from_a, from_b;
    int quit_seen;
} sel_ctx_t;

static void selector(void *arg) {
    sel_ctx_t *x = arg;
    long va, vb;
    for (;;) {
        async_chan_op_t ops[3] = {
            {x->a, ASYNC_CHAN_RECV, &va, -1}, {x->b, ASYNC_CHAN_RECV, &vb, -1}, {x->quit, ASYNC_CHAN_RECV, NULL, -1}};
        int i = async_chan_select(ops, 3, -1);
        CHECK(i >= 0 && i < 3);
        CHECK_EQ(ops[i].status, 0);
        if (i == 0) x->from_a += va;
        if (i == 1) x->from_b += vb;
        if (i == 2) {
            x->quit_seen = 1;
            return;
        }
    }
}

static void sel_sender(void *arg) {
    async_chan_t *c = arg;
    for (long i = 1; i <= 1000; i++) CHECK_EQ(async_chan_send(c, &i, -1), 0);
}

static void t_chan_select(void) {
    async_sched_t *s = sched_new(2);
    sel_ctx_t x = {async_chan_create(0, sizeof(long)), async_chan_create(3, sizeof(long)),
                   async_chan_create(0, 1), 0, 0, 0};
    async_fiber_t *sf = async_fiber_spawn(s, selector, &x, ASYNC_FIBER_JOINABLE);
    async_fiber_t *s1 = async_fiber_spawn(s, sel_sender, x.a, ASYNC_FIBER_JOINABLE);
    async_fiber_t *s2 = async_fiber_spawn(s, sel_sender, x.b, ASYNC_FIBER_JOINABLE);
    CHECK(sf && s1 && s2);
    CHECK_EQ(async_fiber_join(s1, -1), 0);
    CHECK_EQ(async_fiber_join(s2, -1), 0);
    char q = 1;
    CHECK_EQ(async_chan_send(x.quit, &q, -1), 0); /* rendezvous: the selector took it */
    CHECK_EQ(async_fiber_join(sf, -1), 0);
    CHECK_EQ(x.from_a, 500500);
    CHECK_EQ(x.from_b, 500500);
    CHECK_EQ(x.quit_seen, 1);

    /* nothing ready: timeout 0 and a short timeout, from a plain thread */
    long v = 42, r = 0;
    async_chan_op_t ops[2] = {{x.a, ASYNC_CHAN_SEND, &v, -1}, {x.b, ASYNC_CHAN_RECV, &r, -1}};
    CHECK_FAIL(async_chan_select(ops, 2, 0) == -1, ASYNC_E_TIMEDOUT);
    double t0 = now_ms();
    CHECK_FAIL(async_chan_select(ops, 2, 30) == -1, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 29.9);
    /* a buffered element makes the recv ready */
    long seven = 7;
    CHECK_EQ(async_chan_send(x.b, &seven, 0), 0);
    CHECK_EQ(async_chan_select(ops, 2, -1), 1);
    CHECK_EQ(r, 7);
    CHECK_EQ(ops[1].status, 0);
    /* a select that sends: a fiber receives on a */
    pipe_ctx_t p = {x.a, 1, 0};
    async_fiber_t *rf = async_fiber_spawn(s, int_consumer, &p, ASYNC_FIBER_JOINABLE);
    long zero = 0;
    ops[0].elem = &zero;
    CHECK_EQ(async_chan_select(ops, 2, 5000), 0);
    async_chan_close(x.a);
    CHECK_EQ(async_fiber_join(rf, -1), 0);
    CHECK_EQ(p.bad, 0);
    /* closed channel: the op completes with status CLOSED */
    CHECK_EQ(async_chan_select(ops, 2, -1), 0);
    CHECK_EQ(ops[0].status, ASYNC_E_CLOSED);
    /* bad input */
    CHECK_FAIL(async_chan_select(NULL, 1, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_select(ops, 0, 0) == -1, ASYNC_E_INVAL);
    ops[1].dir = 9;
    CHECK_FAIL(async_chan_select(ops, 2, 0) == -1, ASYNC_E_INVAL);
    ops[1].dir = ASYNC_CHAN_RECV;
    ops[1].chan = NULL;
    CHECK_FAIL(async_chan_select(ops, 2, 0) == -1, ASYNC_E_BADHANDLE);
    async_chan_destroy(x.a);
    async_chan_destroy(x.b);
    async_chan_destroy(x.quit);
    async_sched_destroy(s);
}

/* many fibers select on shared channels against many senders: every value
 * is received exactly once */
typedef struct {
    async_chan_t *c[4];
    async_chan_t *done;
    atomic_long sum;
    atomic_long count;
} fan_t;

static void fan_recv(void *arg) {
    fan_t *x = arg;
    long v;
    for (;;) {
        async_chan_op_t ops[5];
        for (int i = 0; i < 4; i++) ops[i] = (async_chan_op_t){x->c[i], ASYNC_CHAN_RECV, &v, -1};
        ops[4] = (async_chan_op_t){x->done, ASYNC_CHAN_RECV, NULL, -1};
        int i = async_chan_select(ops, 5, -1);
        CHECK(i >= 0);
        if (i == 4) {
            CHECK_EQ(ops[4].status, ASYNC_E_CLOSED);
            return;
        }
        CHECK_EQ(ops[i].status, 0);
        atomic_fetch_add(&x->sum, v);
        atomic_fetch_add(&x->count, 1);
    }
}

static fan_t *fan_g;
static void fan_send(void *arg) {
    long base = (long)(intptr_t)arg;
    for (long i = 1; i <= 2000; i++) {
        long v = base * 2000 + i;
        CHECK_EQ(async_chan_send(fan_g->c[i % 4], &v, -1), 0);
    }
}

static void t_chan_select_stress(void) {
    async_sched_t *s = sched_new(0);
    fan_t x;
    for (int i = 0; i < 4; i++) x.c[i] = async_chan_create(i, sizeof(long)); /* capacities 0..3 */
    x.done = async_chan_create(0, 1);
    atomic_init(&x.sum, 0);
    atomic_init(&x.count, 0);
    fan_g = &x;
    async_fiber_t *rs[16], *ss[16];
    for (int i = 0; i < 16; i++) CHECK((rs[i] = async_fiber_spawn(s, fan_recv, &x, ASYNC_FIBER_JOINABLE)));
    for (int i = 0; i < 16; i++)
        CHECK((ss[i] = async_fiber_spawn(s, fan_send, (void *)(intptr_t)i, ASYNC_FIBER_JOINABLE)));
    for (int i = 0; i < 16; i++) CHECK_EQ(async_fiber_join(ss[i], -1), 0);
    /* all sent; wait until received, then release the receivers */
    for (double t0 = now_ms(); atomic_load(&x.count) < 32000 && now_ms() - t0 < 60000;) sleep_ms(2);
    async_chan_close(x.done);
    for (int i = 0; i < 16; i++) CHECK_EQ(async_fiber_join(rs[i], -1), 0);
    CHECK_EQ(atomic_load(&x.count), 32000);
    long expect = 0;
    for (long b = 0; b < 16; b++)
        for (long i = 1; i <= 2000; i++) expect += b * 2000 + i;
    CHECK_EQ(atomic_load(&x.sum), expect);
    for (int i = 0; i < 4; i++) async_chan_destroy(x.c[i]);
    async_chan_destroy(x.done);
    async_sched_destroy(s);
}

#if !defined(_WIN32) /* pipes, socketpair, int fds */
/* ---- fds ------------------------------------------------------------------------- */

typedef struct {
    int fd;
    int msgs;
    int bad;
    int eof;
} pipe_end_t;

enum { MSG = 16 };

static void pipe_writer(void *arg) {
    pipe_end_t *e = arg;
    char m[MSG];
    for (int i = 0; i < 1000; i++) {
        memset(m, 'a' + i % 26, MSG);
        memcpy(m, &i, sizeof i);
        CHECK_EQ(async_fiber_write(e->fd, m, MSG, -1), MSG);
        if (i % 100 == 0) async_fiber_yield();
    }
    close(e->fd);
}

static void pipe_reader(void *arg) {
    pipe_end_t *e = arg;
    char buf[MSG * 8];
    size_t have = 0;
    for (;;) {
        ssize_t n = async_fiber_read(e->fd, buf + have, sizeof buf - have, -1);
        CHECK(n >= 0);
        if (n == 0) break;
        have += (size_t)n;
        size_t off = 0;
        for (; have - off >= MSG; off += MSG) {
            int seq;
            memcpy(&seq, buf + off, sizeof seq);
            if (seq != e->msgs || buf[off + MSG - 1] != 'a' + seq % 26) e->bad++;
            e->msgs++;
        }
        memmove(buf, buf + off, have - off);
        have -= off;
    }
    e->eof = have == 0;
    close(e->fd);
}

static void t_pipes(void) {
    async_sched_t *s = sched_new(2);
    pipe_end_t r[2], w[2];
    for (int i = 0; i < 2; i++) {
        int p[2];
        CHECK_EQ(pipe(p), 0);
        r[i] = (pipe_end_t){p[0], 0, 0, 0};
        w[i] = (pipe_end_t){p[1], 0, 0, 0};
        CHECK(async_fiber_spawn(s, pipe_reader, &r[i], 0));
        CHECK(async_fiber_spawn(s, pipe_writer, &w[i], 0));
    }
    CHECK_EQ(async_sched_run(s), 0);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(r[i].msgs, 1000);
        CHECK_EQ(r[i].bad, 0);
        CHECK_EQ(r[i].eof, 1);
    }
    async_sched_destroy(s);
}

typedef struct {
    int fd;
    int result;
    int err;
} wait_ctx_t;

static void wait_reader(void *arg) {
    wait_ctx_t *x = arg;
    x->result = async_fiber_wait_fd(x->fd, ASYNC_EVENT_READ, -1);
    x->err = async_last_error();
}

static void wait_short(void *arg) {
    wait_ctx_t *x = arg;
    x->result = async_fiber_wait_fd(x->fd, ASYNC_EVENT_READ, 30);
    x->err = async_last_error();
}

static void t_wait_fd(void) {
    async_sched_t *s = sched_new(2);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    /* timeout */
    wait_ctx_t a = {p[0], 0, 0};
    async_fiber_t *f = async_fiber_spawn(s, wait_short, &a, ASYNC_FIBER_JOINABLE);
    CHECK_EQ(async_fiber_join(f, -1), 0);
    CHECK_EQ(a.result, -1);
    CHECK_EQ(a.err, ASYNC_E_TIMEDOUT);
    /* a parked reader wakes on data; a second reader of the same fd is BUSY */
    a.result = 0;
    f = async_fiber_spawn(s, wait_reader, &a, ASYNC_FIBER_JOINABLE);
    sched_wait_parked(s, 1); /* the first reader holds the fd before the second one asks */
    wait_ctx_t b = {p[0], 0, 0};
    async_fiber_t *g = async_fiber_spawn(s, wait_short, &b, ASYNC_FIBER_JOINABLE);
    CHECK_EQ(async_fiber_join(g, -1), 0);
    CHECK_EQ(b.result, -1);
    CHECK_EQ(b.err, ASYNC_E_BUSY);
    CHECK_EQ(write(p[1], "x", 1), 1);
    CHECK_EQ(async_fiber_join(f, -1), 0);
    CHECK(a.result > 0 && (a.result & ASYNC_EVENT_READ));
    /* level semantics: the byte is still there, so a new wait returns at once */
    a.result = 0;
    f = async_fiber_spawn(s, wait_short, &a, ASYNC_FIBER_JOINABLE);
    CHECK_EQ(async_fiber_join(f, -1), 0);
    CHECK(a.result & ASYNC_EVENT_READ);
    /* plain thread: poll */
    CHECK(async_fiber_wait_fd(p[0], ASYNC_EVENT_READ, 0) & ASYNC_EVENT_READ);
    CHECK(async_fiber_wait_fd(p[1], ASYNC_EVENT_WRITE, -1) & ASYNC_EVENT_WRITE);
    char c;
    CHECK_EQ(read(p[0], &c, 1), 1);
    CHECK_FAIL(async_fiber_wait_fd(p[0], ASYNC_EVENT_READ, 10) == -1, ASYNC_E_TIMEDOUT);
    /* hang-up is reported */
    close(p[1]);
    /* an empty pipe whose writer is gone: poll says POLLHUP alone, and a
     * read returns 0 at once: READ|CLOSE, as on every platform */
    CHECK_EQ(async_fiber_wait_fd(p[0], ASYNC_EVENT_READ, -1), (int)(ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE));
    a.result = 0;
    f = async_fiber_spawn(s, wait_reader, &a, ASYNC_FIBER_JOINABLE);
    CHECK_EQ(async_fiber_join(f, -1), 0);
    CHECK_EQ(a.result, (int)(ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE));
    close(p[0]);
    /* bad input */
    CHECK_FAIL(async_fiber_wait_fd(-1, ASYNC_EVENT_READ, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_wait_fd(0, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_wait_fd(0, 0x40, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_wait_fd(0, ASYNC_EVENT_READ, -3) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_read(-1, &c, 1, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_read(0, NULL, 1, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_write(-1, &c, 1, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_accept(-1, NULL, NULL, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_connect(3, NULL, 0, 0) == -1, ASYNC_E_INVAL);
    async_sched_destroy(s);
}

/* fd numbers reused behind the scheduler's back: a read of a drained stream
 * parks before trying (its fd stays registered), so after close() the same
 * number naming another file must still be watched: data already there, data
 * that comes later, and a regular file that cannot be watched at all. */
typedef struct {
    int fd, peer; /* fd: the number the reader fiber uses */
    int step;     /* how far the fiber got */
    int err;
} reuse_t;

static void *late_writer(void *arg) {
    reuse_t *x = arg;
    sleep_ms(30);
    ssize_t r = write(x->peer, "late", 4);
    (void)r;
    return NULL;
}

static void reuse_fiber(void *arg) {
    reuse_t *x = arg;
    char buf[64];
    int sp[2];
    pthread_t th;
    /* 1: a stream socket the fiber parked on (so it is registered) and then
     * drained */
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0) return;
    x->peer = sp[1];
    if (pthread_create(&th, NULL, late_writer, x) != 0) return;
    ssize_t n = async_fiber_read(sp[0], buf, sizeof buf, 5000);
    pthread_join(th, NULL);
    if (n != 4) goto fail;
    x->step = 1;
    /* 2: close it; a pipe takes the number, with data already in */
    int num = sp[0];
    close(sp[0]);
    close(sp[1]);
    int p[2];
    if (pipe(p) != 0) return;
    if (p[0] != num) {
        if (dup2(p[0], num) != num) return;
        close(p[0]);
    }
    if (write(p[1], "xyz", 3) != 3) return;
    if (async_fiber_read(num, buf, sizeof buf, 5000) != 3 || memcmp(buf, "xyz", 3) != 0) goto fail;
    x->step = 2;
    /* 3: the same number, data arriving while the reader is parked */
    x->fd = num;
    x->peer = p[1];
    if (pthread_create(&th, NULL, late_writer, x) != 0) return;
    n = async_fiber_read(num, buf, sizeof buf, 5000);
    pthread_join(th, NULL);
    if (n != 4 || memcmp(buf, "late", 4) != 0) goto fail;
    x->step = 3;
    /* 4: a regular file on that number (not pollable) reads normally */
    close(num);
    close(p[1]);
    FILE *tf = tmpfile();
    if (!tf || fwrite("file", 1, 4, tf) != 4 || fflush(tf) != 0) return;
    if (fileno(tf) != num && dup2(fileno(tf), num) != num) return;
    if (lseek(num, 0, SEEK_SET) != 0) return;
    if (async_fiber_read(num, buf, sizeof buf, 5000) != 4 || memcmp(buf, "file", 4) != 0) goto fail;
    if (fileno(tf) != num) close(num);
    fclose(tf);
    x->step = 4;
    return;
fail:
    x->err = async_last_error();
}

static void t_fd_reuse(void) {
    async_sched_t *s = sched_new(1);
    reuse_t x = {-1, -1, 0, 0};
    CHECK(async_fiber_spawn(s, reuse_fiber, &x, 0));
    CHECK_EQ(async_sched_run(s), 0);
    if (x.step != 4) fprintf(stderr, "stopped after step %d: %s\n", x.step, async_strerror(x.err));
    CHECK_EQ(x.step, 4);
    async_sched_destroy(s);
}

/* echo: N client fibers x M messages against one acceptor + a fiber per
 * connection */
typedef struct {
    int lfd;
    int nconn;
    int msgs;
    struct sockaddr_in addr;
    atomic_int ok_clients;
    atomic_int served;
    atomic_int failures;
    async_sched_t *s;
} echo_t;

static echo_t *echo_g;

static void echo_conn(void *arg) {
    int fd = (int)(intptr_t)arg;
    char buf[512];
    for (;;) {
        ssize_t n = async_fiber_read(fd, buf, sizeof buf, -1);
        if (n <= 0) break;
        if (async_fiber_write(fd, buf, (size_t)n, -1) != n) {
            atomic_fetch_add(&echo_g->failures, 1);
            break;
        }
    }
    close(fd);
    atomic_fetch_add(&echo_g->served, 1);
}

static void echo_acceptor(void *arg) {
    echo_t *e = arg;
    for (int i = 0; i < e->nconn; i++) {
        int fd = async_fiber_accept(e->lfd, NULL, NULL, -1);
        if (fd < 0) {
            fprintf(stderr, "accept: %s\n", async_strerror(async_last_error()));
            atomic_fetch_add(&e->failures, 1);
            return;
        }
        CHECK(async_fiber_spawn(e->s, echo_conn, (void *)(intptr_t)fd, 0));
    }
}

static void echo_client(void *arg) {
    echo_t *e = arg;
    uint32_t id = (uint32_t)(uintptr_t)async_fiber_current();
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || async_fiber_connect(fd, (struct sockaddr *)&e->addr, sizeof e->addr, -1) != 0) {
        fprintf(stderr, "connect: %s\n", async_strerror(async_last_error()));
        atomic_fetch_add(&e->failures, 1);
        if (fd >= 0) close(fd);
        return;
    }
    char out[100], in[100];
    for (int m = 0; m < e->msgs; m++) {
        size_t len = 1 + (size_t)((id + (uint32_t)m) % sizeof out);
        for (size_t i = 0; i < len; i++) out[i] = (char)(id * 31u + (uint32_t)m * 7u + (uint32_t)i);
        if (async_fiber_write(fd, out, len, -1) != (ssize_t)len) goto fail;
        size_t got = 0;
        while (got < len) {
            ssize_t n = async_fiber_read(fd, in + got, len - got, -1);
            if (n <= 0) goto fail;
            got += (size_t)n;
        }
        if (memcmp(in, out, len) != 0) goto fail;
    }
    close(fd);
    atomic_fetch_add(&e->ok_clients, 1);
    return;
fail:
    fprintf(stderr, "client failed: %s\n", async_strerror(async_last_error()));
    atomic_fetch_add(&e->failures, 1);
    close(fd);
}

static int listen_loopback(struct sockaddr_in *addr, int backlog) {
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(lfd >= 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    memset(addr, 0, sizeof *addr);
    addr->sin_family = AF_INET;
    addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(lfd, (struct sockaddr *)addr, sizeof *addr), 0);
    socklen_t al = sizeof *addr;
    CHECK_EQ(getsockname(lfd, (struct sockaddr *)addr, &al), 0);
    CHECK_EQ(listen(lfd, backlog), 0);
    return lfd;
}


static void t_echo(void) {
    const char *full = getenv("ASYNC_TEST_FULL");
    int nconn = full && *full == '1' ? 10000 : 2000;
    int fds = raise_nofile(2 * nconn + 256);
    if (fds < 2 * nconn + 256) {
        nconn = (fds - 256) / 2;
        printf("RLIMIT_NOFILE %d: scaled to %d connections\n", fds, nconn);
        CHECK(nconn >= 100);
    }
    echo_t e = {0};
    e.nconn = nconn;
    e.msgs = 100;
    e.lfd = listen_loopback(&e.addr, 4096);
    e.s = sched_new(0);
    echo_g = &e;
    double t0 = now_ms();
    CHECK(async_fiber_spawn(e.s, echo_acceptor, &e, 0));
    for (int i = 0; i < nconn; i++) CHECK(async_fiber_spawn(e.s, echo_client, &e, 0));
    CHECK_EQ(async_sched_run(e.s), 0);
    printf("echo: %d connections x %d messages in %.0f ms\n", nconn, e.msgs, now_ms() - t0);
    CHECK_EQ(atomic_load(&e.failures), 0);
    CHECK_EQ(atomic_load(&e.ok_clients), nconn);
    CHECK_EQ(atomic_load(&e.served), nconn);
    close(e.lfd);
    async_sched_destroy(e.s);
}

/* connect errors, accept timeout, write to a closed peer (no SIGPIPE) */
static void net_errors_fiber(void *arg) {
    (void)arg;
    struct sockaddr_in addr;
    int lfd = listen_loopback(&addr, 16);
    CHECK_FAIL(async_fiber_accept(lfd, NULL, NULL, 20) == -1, ASYNC_E_TIMEDOUT);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK_EQ(async_fiber_connect(c, (struct sockaddr *)&addr, sizeof addr, 5000), 0);
    struct sockaddr_in peer;
    socklen_t pl = sizeof peer;
    int a = async_fiber_accept(lfd, (struct sockaddr *)&peer, &pl, 5000);
    CHECK(a >= 0);
    CHECK_EQ(pl, sizeof peer);
    CHECK(fcntl(a, F_GETFL) & O_NONBLOCK);
    close(a);
    char buf[4096];
    memset(buf, 1, sizeof buf);
    int failed = 0;
    for (int i = 0; i < 1000 && !failed; i++) failed = async_fiber_write(c, buf, sizeof buf, 5000) < 0;
    CHECK(failed);
    CHECK_ERR(ASYNC_E_CLOSED);
    close(c);
    close(lfd);
    /* refused */
    c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK_FAIL(async_fiber_connect(c, (struct sockaddr *)&addr, sizeof addr, 5000) == -1, ASYNC_E_CLOSED);
    close(c);
    /* a pipe whose reader is gone: EPIPE, not SIGPIPE */
    int p[2];
    CHECK_EQ(pipe(p), 0);
    close(p[0]);
    CHECK_FAIL(async_fiber_write(p[1], "x", 1, -1) == -1, ASYNC_E_CLOSED);
    close(p[1]);
}

static void t_net_errors(void) {
    async_sched_t *s = sched_new(2);
    async_fiber_t *f = async_fiber_spawn(s, net_errors_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK_EQ(async_fiber_join(f, -1), 0);
    async_sched_destroy(s);
}

#endif /* !_WIN32 */

/* ---- blocking offload ------------------------------------------------------------ */

typedef struct {
    pthread_t caller, ran_on;
    int slept;
} blk_t;

static atomic_int blk_inside, blk_most; /* calls inside blocking_sleep now, and at most */

static void blocking_sleep(void *arg) {
    blk_t *b = arg;
    b->ran_on = pthread_self();
    int now = atomic_fetch_add(&blk_inside, 1) + 1, most = atomic_load(&blk_most);
    while (now > most && !atomic_compare_exchange_weak(&blk_most, &most, now)) {
    }
    sleep_ms(100);
    atomic_fetch_sub(&blk_inside, 1);
    b->slept = 1;
}

static atomic_int ticker_stop;
static atomic_long ticks;

static void ticker(void *arg) {
    (void)arg;
    while (!atomic_load(&ticker_stop)) {
        atomic_fetch_add(&ticks, 1);
        async_fiber_sleep(1);
    }
}

static void blocking_fiber(void *arg) {
    blk_t *b = arg;
    b->caller = pthread_self();
    CHECK_EQ(async_fiber_blocking(blocking_sleep, b), 0);
    CHECK_EQ(b->slept, 1);
}

static void t_blocking(void) {
    enum { N = 20 };
    async_sched_t *s = sched_new(2);
    CHECK(async_fiber_spawn(s, ticker, NULL, 0));
    blk_t b[N];
    memset(b, 0, sizeof b);
    async_fiber_t *fs[N];
    double t0 = now_ms();
    for (int i = 0; i < N; i++) CHECK((fs[i] = async_fiber_spawn(s, blocking_fiber, &b[i], ASYNC_FIBER_JOINABLE)));
    long ticks0 = atomic_load(&ticks);
    for (int i = 0; i < N; i++) CHECK_EQ(async_fiber_join(fs[i], -1), 0);
    double el = now_ms() - t0;
    long ticked = atomic_load(&ticks) - ticks0;
    printf("%d blocking 100 ms calls in %.0f ms, up to %d at once; ticker ran %ld times meanwhile\n", N, el,
           atomic_load(&blk_most), ticked);
    /* they ran in parallel, not one after another on the 2 workers: counted,
     * not timed (the elapsed time says nothing on a slow or loaded host) */
    CHECK(atomic_load(&blk_most) > 2);
    CHECK(ticked > 0);       /* the workers stayed free for other fibers */
    for (int i = 0; i < N; i++) {
        CHECK(b[i].slept);
        CHECK(!pthread_equal(b[i].caller, b[i].ran_on));
    }
    atomic_store(&ticker_stop, 1);
    CHECK_EQ(async_sched_run(s), 0);
    /* plain thread: inline */
    blk_t p = {pthread_self(), 0, 0};
    CHECK_EQ(async_fiber_blocking(blocking_sleep, &p), 0);
    CHECK(pthread_equal(p.ran_on, pthread_self()));
    CHECK_FAIL(async_fiber_blocking(NULL, NULL) == -1, ASYNC_E_INVAL);
    async_sched_destroy(s);
}

/* ---- library calls from fibers ------------------------------------------------------ */

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

static void t_queue_park(void) {
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

static void t_api_stress(void) {
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

/* ---- scale, migration, shutdown ---------------------------------------------------- */

static void park_on_chan(void *arg) {
    int v;
    CHECK_FAIL(async_chan_recv((async_chan_t *)arg, &v, -1) == -1, ASYNC_E_CLOSED);
}

static void t_parked_100k(void) {
    enum { N = 100000 };
    async_sched_config_t cfg = {0, 32 * 1024, 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    async_chan_t *c = async_chan_create(0, sizeof(int));
    for (int i = 0; i < N; i++) CHECK(async_fiber_spawn(s, park_on_chan, c, 0));
    sched_wait_parked(s, N);
    async_chan_close(c);
    async_sched_stats_t st;
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
    CHECK_EQ(st.fibers_finished, N);
    async_chan_destroy(c);
    async_sched_destroy(s);
}

typedef struct {
    pthread_t seen[64];
    int nseen;
} mig_t;

/* pthread_self() is a "const" function: gcc may reuse its value across a
 * park, which is exactly what must not happen on a fiber. */
__attribute__((noinline)) static pthread_t thread_now(void) {
    __asm__ volatile("" ::: "memory");
    return pthread_self();
}

static void migrant(void *arg) {
    mig_t *m = arg;
    for (int i = 0; i < 60; i++) {
        pthread_t me = thread_now();
        int known = 0;
        for (int j = 0; j < m->nseen; j++) known |= pthread_equal(m->seen[j], me);
        if (!known && m->nseen < 64) m->seen[m->nseen++] = me;
        if (i % 2)
            async_fiber_sleep(1);
        else
            async_fiber_yield();
    }
}

/* Fibers do move between workers. Not promised for any one run: on a
 * loaded machine the OS may keep the other workers off the CPU for the whole
 * run (seen: 1 run in ~60 with other builds on both cores), so a run in
 * which nothing moved is repeated (5 tries). */
static void t_migration(void) {
    enum { F = 64 };
    int moved = 0;
    for (int attempt = 0; attempt < 5 && moved == 0; attempt++) {
        async_sched_t *s = sched_new(4);
        static mig_t m[F];
        memset(m, 0, sizeof m);
        for (int i = 0; i < F; i++) CHECK(async_fiber_spawn(s, migrant, &m[i], 0));
        CHECK_EQ(async_sched_run(s), 0);
        int maxseen = 0;
        for (int i = 0; i < F; i++) {
            moved += m[i].nseen > 1;
            if (m[i].nseen > maxseen) maxseen = m[i].nseen;
        }
        printf("%d of %d fibers ran on more than one thread (max %d threads)\n", moved, F, maxseen);
        CHECK(maxseen <= 4);
        async_sched_destroy(s);
    }
    CHECK(moved > 0);
}

#if !defined(_WIN32) /* pipes, socketpair */
/* shutdown: one fiber parked in each kind of wait */
enum { W_SLEEP, W_RECV, W_SEND, W_SELECT, W_WAITFD, W_READ, W_WRITE, W_ACCEPT, W_JOIN, W_QDEQ, W_QENQ, W_NKINDS };
static const char *wait_names[W_NKINDS] = {"sleep", "recv", "send", "select", "wait_fd", "read",
                                           "write", "accept", "join", "queue_dequeue", "queue_enqueue"};

typedef struct {
    int kind;
    atomic_int returned;
    int err;
    int rc;
    double t;
} sd_t;

static struct {
    async_chan_t *empty, *full;
    int pipe_r, pipe2_r, sock_w, lfd;
    async_fiber_t *sleeper;
    async_queue_t *qempty, *qfull;
} sdw;

static void long_sleeper(void *arg) {
    (void)arg;
    async_fiber_sleep(3600 * 1000);
}

static void sd_waiter(void *arg) {
    sd_t *x = arg;
    int v = 0;
    char buf[64];
    int rc = 0;
    switch (x->kind) {
    case W_SLEEP: rc = async_fiber_sleep(3600 * 1000); break;
    case W_RECV: rc = async_chan_recv(sdw.empty, &v, -1); break;
    case W_SEND: rc = async_chan_send(sdw.full, &v, -1); break;
    case W_SELECT: {
        async_chan_op_t ops[2] = {{sdw.empty, ASYNC_CHAN_RECV, &v, 0}, {sdw.full, ASYNC_CHAN_SEND, &v, 0}};
        rc = async_chan_select(ops, 2, -1);
        break;
    }
    case W_WAITFD: rc = async_fiber_wait_fd(sdw.pipe2_r, ASYNC_EVENT_READ, -1); break;
    case W_READ: rc = (int)async_fiber_read(sdw.pipe_r, buf, sizeof buf, -1); break;
    case W_WRITE: {
        static char big[1 << 20];
        rc = (int)async_fiber_write(sdw.sock_w, big, sizeof big, -1);
        break;
    }
    case W_ACCEPT: rc = async_fiber_accept(sdw.lfd, NULL, NULL, -1); break;
    case W_JOIN: rc = async_fiber_join(sdw.sleeper, -1); break;
    case W_QDEQ: rc = async_queue_dequeue_wait(sdw.qempty, &v, sizeof v, NULL, -1) ? 0 : -1; break;
    case W_QENQ: rc = async_queue_enqueue_wait(sdw.qfull, &v, sizeof v, -1) ? 0 : -1; break;
    }
    x->rc = rc;
    x->err = async_last_error();
    x->t = now_ms();
    atomic_fetch_add(&x->returned, 1);
    /* a new park after shutdown fails at once */
    CHECK_FAIL(async_fiber_sleep(1000) == -1, ASYNC_E_CANCELLED);
}

static void blocking_nap(void *arg) {
    sleep_ms(200);
    *(int *)arg = 1;
}

static void sd_blocking(void *arg) {
    int *done = arg;
    CHECK_EQ(async_fiber_blocking(blocking_nap, done), 0); /* not cancelled */
    CHECK_EQ(*done, 1);
}

static void t_shutdown_waits(void) {
    async_sched_t *s = sched_new(2);
    sdw.empty = async_chan_create(1, sizeof(int));
    sdw.full = async_chan_create(1, sizeof(int));
    int one = 1;
    CHECK_EQ(async_chan_send(sdw.full, &one, 0), 0);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    sdw.pipe_r = p[0];
    int p2[2];
    CHECK_EQ(pipe(p2), 0);
    sdw.pipe2_r = p2[0];
    int sp[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
    sdw.sock_w = sp[0];
    struct sockaddr_in addr;
    sdw.lfd = listen_loopback(&addr, 4);
    sdw.sleeper = async_fiber_spawn(s, long_sleeper, NULL, ASYNC_FIBER_JOINABLE);
    sdw.qempty = async_queue_create(1, sizeof(int), 0);
    sdw.qfull = async_queue_create(1, sizeof(int), 0);
    CHECK(async_queue_enqueue(sdw.qfull, &one, sizeof one));
    sd_t x[W_NKINDS];
    memset(x, 0, sizeof x);
    for (int k = 0; k < W_NKINDS; k++) {
        x[k].kind = k;
        CHECK(async_fiber_spawn(s, sd_waiter, &x[k], 0));
    }
    int bdone = 0;
    CHECK(async_fiber_spawn(s, sd_blocking, &bdone, 0));
    sched_wait_parked(s, W_NKINDS + 2);
    for (int k = 0; k < W_NKINDS; k++) {
        if (atomic_load(&x[k].returned)) fprintf(stderr, "wait %s returned early: rc %d err %d\n", wait_names[k], x[k].rc, x[k].err);
        CHECK_EQ(atomic_load(&x[k].returned), 0);
    }
    double t0 = now_ms();
    CHECK_EQ(async_sched_shutdown(s, 10000), 0);
    for (int k = 0; k < W_NKINDS; k++) {
        if (x[k].rc != -1 || x[k].err != ASYNC_E_CANCELLED || atomic_load(&x[k].returned) != 1)
            fprintf(stderr, "wait %s: rc %d err %d\n", wait_names[k], x[k].rc, x[k].err);
        CHECK_EQ(x[k].rc, -1);
        CHECK_EQ(x[k].err, ASYNC_E_CANCELLED);
        CHECK_EQ(atomic_load(&x[k].returned), 1);
        CHECK(x[k].t >= t0);
    }
    CHECK_EQ(bdone, 1);
    CHECK_FAIL(async_fiber_spawn(s, nop, NULL, 0) == NULL, ASYNC_E_CANCELLED);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(async_sched_shutdown(s, 0), 0); /* idempotent */
    async_sched_destroy(s); /* frees the unjoined (cancelled-join) sleeper */
    close(p[0]);
    close(p[1]);
    close(p2[0]);
    close(p2[1]);
    close(sp[0]);
    close(sp[1]);
    close(sdw.lfd);
    async_chan_destroy(sdw.empty);
    async_chan_destroy(sdw.full);
    async_queue_destroy(sdw.qempty);
    async_queue_destroy(sdw.qfull);
}

#endif /* !_WIN32 */

/* a fiber that never parks: shutdown times out, then it finishes */
static atomic_int spin_stop;
static void spinner(void *arg) {
    (void)arg;
    while (!atomic_load(&spin_stop)) sleep_ms(1); /* blocks its worker: allowed, just bad */
}

static void t_shutdown_timeout(void) {
    async_sched_t *s = sched_new(2);
    CHECK(async_fiber_spawn(s, spinner, NULL, 0));
    sleep_ms(20);
    CHECK_FAIL(async_sched_shutdown(s, 50) == -1, ASYNC_E_TIMEDOUT);
    atomic_store(&spin_stop, 1);
    CHECK_EQ(async_sched_shutdown(s, -1), 0);
    async_sched_destroy(s);
}

#if !defined(_WIN32) /* fork, signals */
/* ---- stack overflow (in a child process) -------------------------------------------- */

static char self_exe[4096];

/* ~1 KiB frames until about 1 KiB below the bottom of the 32 KiB stack: in
 * the guard modes this hits the guard page; in canary mode the overflow
 * stays in the slot's own spare page and is found at the next switch. */
__attribute__((noinline)) static int recurse(char *limit, int depth) {
    volatile char buf[1024];
    memset((char *)buf, depth, sizeof buf);
    if ((char *)buf > limit) return recurse(limit, depth + 1) + buf[depth % 1024];
    async_fiber_yield(); /* canary mode: detected at this switch */
    return buf[0];
}

static void deep(void *arg) {
    (void)arg;
    char top;
    /* computed as an integer: the limit lies outside any object on purpose */
    printf("%d\n", recurse((char *)((uintptr_t)&top - 33 * 1024), 0));
}

static void t_overflow_child(void) {
    const char *m = getenv("ASYNC_TEST_GUARD");
    async_sched_config_t cfg = {1, 32 * 1024, m ? atoi(m) : 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    CHECK(async_fiber_spawn(s, deep, NULL, 0));
    async_sched_run(s);
    printf("survived\n");
    exit(0);
}

static void t_overflow(void) {
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    CHECK(n > 0);
    self_exe[n] = 0;
    for (int mode = 1; mode <= 3; mode++) {
        if (mode == 1 && getenv("ASYNC_TEST_EMULATOR")) {
            printf("mode 1 skipped: qemu-user accepts MADV_GUARD_INSTALL but ignores it\n");
            continue;
        }
        int p[2];
        CHECK_EQ(pipe(p), 0);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            dup2(p[1], 2);
            close(p[0]);
            char ms[8];
            snprintf(ms, sizeof ms, "%d", mode);
            setenv("ASYNC_TEST_GUARD", ms, 1);
            /* under a user-mode emulator (qemu-user without binfmt) the
             * child must be started through it: ASYNC_TEST_EMULATOR */
            const char *emu = getenv("ASYNC_TEST_EMULATOR");
            if (emu && *emu)
                execlp(emu, emu, self_exe, "overflow_child", (char *)NULL);
            else
                execl(self_exe, self_exe, "overflow_child", (char *)NULL);
            _exit(127);
        }
        close(p[1]);
        char out[4096];
        size_t have = 0;
        ssize_t r;
        while ((r = read(p[0], out + have, sizeof out - 1 - have)) > 0) have += (size_t)r;
        out[have] = 0;
        close(p[0]);
        int status;
        CHECK_EQ(waitpid(pid, &status, 0), pid);
        printf("mode %d: status %#x: %s", mode, status, out);
        fflush(stdout);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
            fprintf(stderr, "could not re-execute %s (emulated? set ASYNC_TEST_EMULATOR)\n", self_exe);
        CHECK(strstr(out, "libasync: fiber stack overflow in fiber ") != NULL);
        /* the whole line: id, how, and the advice (stack_report.c) */
        CHECK(strstr(out, "; raise async_sched_config_t.stack_size or ASYNC_FIBER_STACK_KB)\n") != NULL);
        /* every mode aborts after the report (the SIGSEGV after a canary
         * report seen before is gone: docs/RELIABILITY.md) */
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    }
}

#endif /* !_WIN32 */

static const test_case_t cases[] = {
    T(yield_100x1000),
    T(fib_100k), // timeout=120
    T(sleep),
    T(spawn_join_current),
    T(badinput),
    T(guard_modes),
    T(several_scheds),
    T(chan_1m_buffered),
    T(chan_1m_rendezvous),
    T(chan_close),
    T(chan_select),
    T(chan_select_stress),
#if !defined(_WIN32)
    T(pipes), // uring
    T(wait_fd), // uring
    T(fd_reuse), // uring
    T(echo), // uring timeout=180
    T(net_errors), // uring
#endif
    T(blocking),
    T(queue_park),
    T(api_stress),
    T(parked_100k), // timeout=120
    T(migration), // uring
#if !defined(_WIN32)
    T(shutdown_waits), // uring
#endif
    T(shutdown_timeout), // uring
#if !defined(_WIN32)
    T(overflow),
    /* run by t_overflow in a child process, not a test of its own */
    {"overflow_child", t_overflow_child},
#endif
};

TEST_MAIN(cases)
