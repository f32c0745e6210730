/* Timeouts at the edges: async_fiber_sleep(UINT64_MAX) parks without
 * overflow and shutdown cancels it; INT_MAX timeouts wait and wake on close;
 * rendezvous sends and receives with timeouts 0 and 1 racing each other:
 * every success counted once, none lost; mutex lockers with timeouts 0 and
 * 1: the hand-off is never lost. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>

#include "fibers.h"

/* ---- sleep with a huge value ------------------------------------------ */

static atomic_int sleep_rc = 99;
static atomic_int sleep_err;
static void sleep_huge_fiber(void *arg)
{
    (void)arg;
    int rc = async_fiber_sleep(UINT64_MAX);
    atomic_store(&sleep_err, async_last_error());
    atomic_store(&sleep_rc, rc);
}

CASE(sleep_huge) // adversarial
{
    async_sched_t *s = sched_new(1);
    async_fiber_t *f = async_fiber_spawn(s, sleep_huge_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    sched_wait_parked(s, 1);
    sleep_ms(100);
    CHECK_EQ(atomic_load(&sleep_rc), 99);
    CHECK_EQ(async_sched_shutdown(s, 10000), 0);
    CHECK_EQ(atomic_load(&sleep_rc), -1);
    CHECK_EQ(atomic_load(&sleep_err), ASYNC_E_CANCELLED);
    CHECK_EQ(async_fiber_join(f, 0), 0);
    async_sched_destroy(s);
}

/* ---- INT_MAX timeouts still wait, and wake on close -------------------- */

static async_chan_t *intmax_c;
static void *intmax_thread(void *arg)
{
    int v;
    (void)arg;
    async_clear_error();
    if (async_chan_recv(intmax_c, &v, INT_MAX) != -1 || async_last_error() != ASYNC_E_CLOSED)
        return (void *)1;
    return NULL;
}

CASE(timeout_intmax) // adversarial
{
    pthread_t t;
    void *r;
    async_mutex_t *m = async_mutex_create();
    intmax_c = async_chan_create(1, sizeof(int));
    CHECK(intmax_c != NULL);
    start_thread(&t, intmax_thread, NULL);
    sleep_ms(100);
    async_chan_close(intmax_c);
    join_within(t, 10000, "recv INT_MAX");
    (void)r;
    CHECK_EQ(async_mutex_lock(m, INT_MAX), 0);
    CHECK_EQ(async_mutex_unlock(m), 0);
    async_mutex_destroy(m);
    async_chan_destroy(intmax_c);
}

/* ---- rendezvous send with timeouts races receivers: no loss, no dup ---- */

#define RV_N 20000
static async_chan_t *rv_c;
static atomic_long rv_sent_sum, rv_recv_sum, rv_sent_n, rv_recv_n;
static atomic_int rv_done;

static void *rv_sender(void *arg)
{
    long base = (long)(intptr_t)arg;
    long i;
    for (i = 1; i <= RV_N; i++) {
        long v = base + i;
        if (async_chan_send(rv_c, &v, (int)(i % 2)) == 0) {
            atomic_fetch_add(&rv_sent_sum, v);
            atomic_fetch_add(&rv_sent_n, 1);
        }
    }
    return NULL;
}

static void *rv_receiver(void *arg)
{
    long i;
    (void)arg;
    for (i = 0; !atomic_load(&rv_done); i++) {
        long v;
        if (async_chan_recv(rv_c, &v, (int)(i % 2)) == 0) {
            atomic_fetch_add(&rv_recv_sum, v);
            atomic_fetch_add(&rv_recv_n, 1);
        }
    }
    return NULL;
}

CASE(rendezvous_timeouts) // adversarial
{
    pthread_t s1, s2, r1, r2;
    long v;
    rv_c = async_chan_create(0, sizeof(long));
    CHECK(rv_c != NULL);
    start_thread(&s1, rv_sender, (void *)(intptr_t)0);
    start_thread(&s2, rv_sender, (void *)(intptr_t)1000000);
    start_thread(&r1, rv_receiver, NULL);
    start_thread(&r2, rv_receiver, NULL);
    join_within(s1, 120000, "sender");
    join_within(s2, 120000, "sender");
    atomic_store(&rv_done, 1);
    join_within(r1, 120000, "receiver");
    join_within(r2, 120000, "receiver");
    CHECK_FAIL(async_chan_recv(rv_c, &v, 0) == -1, ASYNC_E_EMPTY);
    printf("sent %ld recv %ld\n", (long)rv_sent_n, (long)rv_recv_n);
    CHECK_EQ(atomic_load(&rv_sent_n), atomic_load(&rv_recv_n));
    CHECK_EQ(atomic_load(&rv_sent_sum), atomic_load(&rv_recv_sum));
    async_chan_destroy(rv_c);
}

/* ---- mutex with timeouts: the hand-off is never lost ------------------- */

static async_mutex_t *mt_m;
static atomic_long mt_in;

static void *mt_thread(void *arg)
{
    long i;
    (void)arg;
    for (i = 0; i < 20000; i++) {
        if (async_mutex_lock(mt_m, (int)(i % 2)) == 0) {
            if (atomic_fetch_add(&mt_in, 1) != 0)
                abort();
            atomic_fetch_sub(&mt_in, 1);
            CHECK_EQ(async_mutex_unlock(mt_m), 0);
        }
    }
    return NULL;
}

CASE(mutex_timeouts) // adversarial
{
    pthread_t t[4];
    int i;
    mt_m = async_mutex_create();
    CHECK(mt_m != NULL);
    for (i = 0; i < 4; i++)
        start_thread(&t[i], mt_thread, NULL);
    for (i = 0; i < 4; i++)
        join_within(t[i], 120000, "locker");
    CHECK_EQ(async_mutex_trylock(mt_m), 0);
    CHECK_EQ(async_mutex_unlock(mt_m), 0);
    async_mutex_destroy(mt_m);
}

TEST_MAIN()
