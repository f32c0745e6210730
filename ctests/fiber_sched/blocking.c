/* async_fiber_blocking: the function runs on another thread while the
 * worker stays free for other fibers (many run in parallel); on a plain
 * thread it runs inline. A function run for a fiber of s that calls a wait
 * needing that very fiber (async_sched_run(s), async_sched_shutdown(s, -1),
 * async_sched_destroy(s), a join of the fiber) fails with ASYNC_E_STATE
 * (shutdown starts and returns 0 without waiting); it may still join another
 * fiber of s and shut down and destroy another scheduler.
 * scripts/cross.sh builds this file for Windows and runs its cases under
 * wine, except those inside #if !defined(_WIN32). */
#include <pthread.h>
#include <stdatomic.h>

#include "fibers.h"

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

CASE(blocking) { // valgrind
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

#if !defined(_WIN32)

/* ---- a blocking function waiting for its own fiber ------------------------
 * A function async_fiber_blocking runs for a fiber of s calls a wait of s
 * that needs that very fiber to return: async_sched_run,
 * async_sched_shutdown(s, -1), async_sched_destroy, async_fiber_join of the
 * fiber itself. Each would wait for ever (the fiber waits for the function,
 * the function for the fiber): they fail with ASYNC_E_STATE, or (shutdown)
 * start the shutdown and return 0 without waiting, as on a worker. */

static async_sched_t *bs_s;
static async_fiber_t *_Atomic bs_f;
static atomic_int bs_rc = 99, bs_err;
static atomic_int bs_which;

static void bs_job(void *arg)
{
    int rc = 0;
    (void)arg;
    async_clear_error();
    switch (atomic_load(&bs_which)) {
    case 0:
        rc = async_sched_run(bs_s);
        break;
    case 1:
        rc = async_sched_shutdown(bs_s, -1);
        break;
    case 2:
        async_sched_destroy(bs_s);
        rc = async_last_error() ? -1 : 0;
        break;
    default:
        rc = async_fiber_join(bs_f, -1);
        break;
    }
    atomic_store(&bs_err, async_last_error());
    atomic_store(&bs_rc, rc);
}

static void bs_fiber(void *arg)
{
    (void)arg;
    while (bs_f == NULL)
        async_fiber_yield();
    CHECK_EQ(async_fiber_blocking(bs_job, NULL), 0);
}

static void blocking_self(int which, int want_rc, int want_err)
{
    double t0;
    atomic_store(&bs_which, which);
    bs_s = sched_new(2);
    bs_f = async_fiber_spawn(bs_s, bs_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(bs_f != NULL);
    t0 = now_ms();
    while (atomic_load(&bs_rc) == 99) {
        if (now_ms() - t0 > 10000) {
            fprintf(stderr, "the call in the blocking job did not return (deadlock)\n");
            CHECK(atomic_load(&bs_rc) != 99);
        }
        sleep_ms(1);
    }
    CHECK_EQ(atomic_load(&bs_rc), want_rc);
    CHECK_EQ(atomic_load(&bs_err), want_err);
    CHECK_EQ(async_fiber_join(bs_f, 10000), 0);
    async_sched_destroy(bs_s);
}

CASE(blocking_self_run) { blocking_self(0, -1, ASYNC_E_STATE); } // adversarial
CASE(blocking_self_shutdown) { blocking_self(1, 0, ASYNC_OK); } // adversarial
CASE(blocking_self_destroy) { blocking_self(2, -1, ASYNC_E_STATE); } // adversarial
CASE(blocking_self_join) { blocking_self(3, -1, ASYNC_E_STATE); } // adversarial

/* ---- a blocking function waiting for other fibers and schedulers ------------
 * The check above is narrow: a blocking function still joins another fiber
 * of its own scheduler, and shuts down and destroys another scheduler. */
static async_fiber_t *bo_g;
static async_sched_t *bo_s2;
static atomic_int bo_res = 99;
static void bo_sleeper(void *arg)
{
    (void)arg;
    async_fiber_sleep(20);
}
static void bo_job(void *arg)
{
    (void)arg;
    atomic_store(&bo_res, async_fiber_join(bo_g, 10000));
    CHECK_EQ(async_sched_shutdown(bo_s2, 10000), 0);
    async_clear_error();
    async_sched_destroy(bo_s2);
    CHECK_ERR(ASYNC_OK);
}
static void bo_fiber(void *arg)
{
    (void)arg;
    CHECK_EQ(async_fiber_blocking(bo_job, NULL), 0);
}
CASE(blocking_other) // adversarial
{
    async_sched_t *s = sched_new(2);
    bo_s2 = sched_new(1);
    CHECK(async_fiber_spawn(bo_s2, bo_sleeper, NULL, 0) != NULL);
    bo_g = async_fiber_spawn(s, bo_sleeper, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(bo_g != NULL);
    CHECK(async_fiber_spawn(s, bo_fiber, NULL, 0) != NULL);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&bo_res), 0);
    async_sched_destroy(s);
}

#endif /* !_WIN32 */

TEST_MAIN()
