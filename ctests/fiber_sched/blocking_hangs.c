/* Shutdown while a fiber's async_fiber_blocking call hangs: the parked
 * fibers end with ASYNC_E_CANCELLED, shutdown with a timeout returns
 * ASYNC_E_TIMEDOUT (the blocking job cannot be interrupted), new spawns fail,
 * and once the job returns the fiber unwinds and shutdown and destroy
 * complete. */
#include "check.h"
#include "rt.h"

#include <pthread.h>
#include <stdatomic.h>

static void nop_fiber(void *a) { (void)a; }

/* --- a blocking call on a fiber that hangs --------------------------------- */
/*
 * One fiber sits in async_fiber_blocking() on a function that blocks until
 * the test releases it; 20 others are parked (channel, sleep, fd wait, join).
 * Checked: async_sched_shutdown with a timeout returns TIMEDOUT (the blocking
 * job is not interruptible, as documented) but every parked fiber has
 * returned with CANCELLED; new spawns fail with CANCELLED; once the job is
 * released the fiber unwinds (its next park is CANCELLED) and shutdown
 * returns 0; destroy completes.
 */

static struct {
    int gate[2], fdwait[2];
    async_chan_t *ch;
    atomic_int cancelled, blocking_done, after_blocking_err;
    async_fiber_t *sleeper;
} bh;

static void bh_hang(void *a)
{
    char c;
    (void)a;
    CHECK(read(bh.gate[0], &c, 1) == 1); /* blocks until released */
}

static void bh_blocker(void *a)
{
    (void)a;
    CHECK_EQ(async_fiber_blocking(bh_hang, NULL), 0);
    atomic_store(&bh.blocking_done, 1);
    async_clear_error();
    CHECK_EQ(async_fiber_sleep(1), -1);
    atomic_store(&bh.after_blocking_err, async_last_error());
}

static void bh_parker(void *a)
{
    int i = (int)(intptr_t)a, v, rc;
    if (i == 2) /* one waiter per fd and one joiner per fiber at a time */
        rc = async_fiber_wait_fd(bh.fdwait[0], ASYNC_EVENT_READ, -1);
    else if (i == 3)
        rc = async_fiber_join(bh.sleeper, -1);
    else if (i % 2)
        rc = async_fiber_sleep(3600 * 1000);
    else
        rc = async_chan_recv(bh.ch, &v, -1);
    CHECK_EQ(rc, -1);
    CHECK_ERR(ASYNC_E_CANCELLED);
    atomic_fetch_add(&bh.cancelled, 1);
}

static void bh_long_sleep(void *a)
{
    (void)a;
    CHECK_FAIL(async_fiber_sleep(3600 * 1000) == -1, ASYNC_E_CANCELLED);
}

CASE(fiber_blocking_hangs)
{
    async_sched_config_t cfg = {2, 0, 0};
    async_sched_t *s = async_sched_create(&cfg);
    async_sched_stats_t st;
    double t0;
    int i;
    CHECK(s != NULL);
    CHECK(pipe(bh.gate) == 0 && pipe(bh.fdwait) == 0);
    bh.ch = async_chan_create(0, sizeof(int));
    CHECK(bh.ch != NULL);
    bh.sleeper = async_fiber_spawn(s, bh_long_sleep, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(bh.sleeper != NULL);
    CHECK(async_fiber_spawn(s, bh_blocker, NULL, 0));
    for (i = 0; i < 20; i++)
        CHECK(async_fiber_spawn(s, bh_parker, (void *)(intptr_t)i, 0));
    t0 = now_ms();
    for (;;) { /* all parked */
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        if (st.fibers_parked == 22 || now_ms() - t0 > 30000)
            break;
        sleep_ms(5);
    }
    CHECK_EQ(st.fibers_parked, 22);
    t0 = now_ms();
    CHECK_FAIL(async_sched_shutdown(s, 300) == -1, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 299);
    /* the 20 parked fibers were woken with CANCELLED; on a loaded host they
     * may still be unwinding when the 300 ms are over */
    t0 = now_ms();
    while (atomic_load(&bh.cancelled) < 20 && now_ms() - t0 < 30000)
        sleep_ms(2);
    CHECK_EQ(atomic_load(&bh.cancelled), 20);
    CHECK_EQ(atomic_load(&bh.blocking_done), 0);
    CHECK_FAIL(async_fiber_spawn(s, nop_fiber, NULL, 0) == NULL, ASYNC_E_CANCELLED);
    CHECK(write(bh.gate[1], "g", 1) == 1); /* release the hung call */
    CHECK_EQ(async_sched_shutdown(s, 10000), 0);
    CHECK_EQ(atomic_load(&bh.blocking_done), 1);
    CHECK_EQ(atomic_load(&bh.after_blocking_err), ASYNC_E_CANCELLED);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    async_chan_destroy(bh.ch);
    close_pair(bh.gate);
    close_pair(bh.fdwait);
}

TEST_MAIN()
