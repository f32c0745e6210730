/* Spawning, joining, yielding and sleeping fibers: every spawned fiber runs
 * and finishes, yields resume it, sleeps park it (not its worker), join
 * waits for a joinable fiber (with a timeout, never on itself, not on a
 * detached one, never twice), async_fiber_current names the running fiber,
 * each fiber keeps its own last error across parks, and several schedulers
 * run at once with fibers of one spawning on another.
 * scripts/cross.sh builds this file for Windows and runs its cases under
 * wine, except those inside #if !defined(_WIN32). */
#include <pthread.h>
#include <stdatomic.h>
#include <limits.h>

#include "fibers.h"

/* 100 fibers yield 1000 times each: every yield resumes its fiber, and the
 * stats count every spawn, finish and resume. */
CASE(yield_100x1000) { // valgrind
    async_sched_t *s = sched_new(0);
    for (int i = 0; i < 100; i++) CHECK(async_fiber_spawn(s, yielder, NULL, 0) != NULL);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&yields_counted), 100000);
    CHECK_EQ(atomic_load(&yielders_done), 100);
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

CASE(sleep) { // valgrind
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

CASE(spawn_join_current) { // valgrind
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

CASE(several_scheds) { // valgrind
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

#if !defined(_WIN32)

/* ---- join variants ---------------------------------------------------- */

static _Atomic(async_fiber_t *) self_f; /* set by the main thread once the fiber may join itself */
static atomic_int self_err;
static void join_self_fiber(void *arg)
{
    (void)arg;
    while (atomic_load(&self_f) == NULL)
        async_fiber_yield();
    async_clear_error();
    if (async_fiber_join(async_fiber_current(), 0) == -1)
        atomic_store(&self_err, async_last_error());
    async_clear_error();
    if (async_fiber_join(async_fiber_current(), -1) == -1 && async_last_error() != atomic_load(&self_err))
        atomic_store(&self_err, -async_last_error());
}

CASE(join_variants) // adversarial
{
    async_sched_t *s = sched_new(2);
    async_fiber_t *f = async_fiber_spawn(s, join_self_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    atomic_store(&self_f, f);
    CHECK_EQ(async_fiber_join(f, 10000), 0);
    CHECK_EQ(atomic_load(&self_err), ASYNC_E_STATE);
    CHECK_FAIL(async_fiber_join(f, 0) == -1, ASYNC_E_BADHANDLE);
    f = async_fiber_spawn(s, nop_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    CHECK_FAIL(async_fiber_join(f, -2) == -1, ASYNC_E_INVAL);
    CHECK_EQ(async_fiber_join(f, INT_MAX), 0);
    f = async_fiber_spawn(s, nop_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    CHECK_FAIL(async_fiber_join(f, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_set_name(f, "x") == -1, ASYNC_E_BADHANDLE);
}

#endif /* !_WIN32 */

TEST_MAIN()
