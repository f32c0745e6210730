/* The scheduler's stats as a host reads them while fibers run: a fiber
 * counted parked has switched away with its wait registered, so a wake that
 * needs a waiter (a send of 0 ms on an unbuffered channel, a condition
 * variable's signal) finds it the moment the count shows it. */
#include <stdatomic.h>

#include "fibers.h"

#define ROUNDS 2000

static atomic_int got;

/* Receives ROUNDS values, one per park, from an unbuffered channel. */
static void receiver(void *arg)
{
    async_chan_t *ch = arg;
    for (int i = 0; i < ROUNDS; i++) {
        int v = -1;
        if (async_chan_recv(ch, &v, BOUND_MS) != 0 || v != i)
            return;
        atomic_fetch_add(&got, 1);
    }
}

static void parked_count_means_registered(int workers)
{
    async_sched_t *s = sched_new(workers);
    async_chan_t *ch = async_chan_create(0, sizeof(int));
    CHECK(ch != NULL);
    atomic_store(&got, 0);
    CHECK(async_fiber_spawn(s, receiver, ch, 0) != NULL);
    for (int i = 0; i < ROUNDS; i++) {
        sched_spin_parked(s, 1);
        /* a send that never waits: it needs the receiver linked already */
        CHECK_EQ(async_chan_send(ch, &i, 0), 0);
        wait_count(&got, i + 1, "the receiver took the value");
    }
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    async_chan_destroy(ch);
}

CASE(parked_count_means_registered_1w) { parked_count_means_registered(1); }

CASE(parked_count_means_registered_2w) { parked_count_means_registered(2); }

/* The same with a condition variable, whose signal is not taken under the
 * waiter's mutex: a signal sent before the waiter is queued wakes nobody. */
static async_mutex_t *cv_m;
static async_cond_t *cv_c;
static atomic_int cv_gen; /* the round the main thread signalled */

static void cond_waiter(void *arg)
{
    (void)arg;
    CHECK_EQ(async_mutex_lock(cv_m, -1), 0);
    for (int i = 0; i < ROUNDS; i++) {
        while (atomic_load(&cv_gen) <= i)
            if (async_cond_wait(cv_c, cv_m, BOUND_MS) != 0)
                break;
        atomic_fetch_add(&got, 1);
    }
    CHECK_EQ(async_mutex_unlock(cv_m), 0);
}

static void parked_count_means_queued_on_cond(int workers)
{
    async_sched_t *s = sched_new(workers);
    cv_m = async_mutex_create();
    cv_c = async_cond_create();
    CHECK(cv_m != NULL && cv_c != NULL);
    atomic_store(&got, 0);
    atomic_store(&cv_gen, 0);
    CHECK(async_fiber_spawn(s, cond_waiter, NULL, 0) != NULL);
    for (int i = 0; i < ROUNDS; i++) {
        sched_spin_parked(s, 1);
        atomic_store(&cv_gen, i + 1);
        CHECK_EQ(async_cond_signal(cv_c), 0);
        /* a lost signal leaves the waiter parked until its timeout */
        wait_count_within(&got, i + 1, 5000, "the signalled waiter woke");
    }
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    async_cond_destroy(cv_c);
    async_mutex_destroy(cv_m);
}

CASE(parked_count_means_queued_on_cond_1w) { parked_count_means_queued_on_cond(1); }

CASE(parked_count_means_queued_on_cond_2w) { parked_count_means_queued_on_cond(2); }

TEST_MAIN()
