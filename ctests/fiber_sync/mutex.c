/* Fiber mutexes (async_mutex_t), shared by fibers and plain threads: bad
 * input and ownership checks, the owner is the fiber (not its thread, which
 * may change while it holds the lock), mutual exclusion under contention
 * from fibers and threads, FIFO hand-off (no waiter starves), and timed
 * locks. Every wait is bounded, so a lost wake-up fails a case instead of
 * hanging it. */
#include <pthread.h>
#include <stdatomic.h>

#include "fibers.h"

/* ---- mutex: bad input and ownership ---------------------------------------------- */

static void *lock_other(void *arg) {
    async_mutex_t *m = arg;
    CHECK_FAIL(async_mutex_trylock(m) == -1, ASYNC_E_BUSY);
    CHECK_FAIL(async_mutex_lock(m, 0) == -1, ASYNC_E_BUSY);
    double t0 = now_ms();
    CHECK_FAIL(async_mutex_lock(m, 30) == -1, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 29);
    CHECK_FAIL(async_mutex_unlock(m) == -1, ASYNC_E_STATE); /* not the owner */
    return NULL;
}

CASE(mutex_badinput) {
    async_mutex_t *m = async_mutex_create();
    CHECK(m != NULL);
    CHECK_FAIL(async_mutex_lock(NULL, -1) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_mutex_trylock(NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_mutex_unlock(NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_mutex_lock((async_mutex_t *)(uintptr_t)0xdeadbeefcafeull, -1) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_mutex_lock(m, -2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_mutex_unlock(m) == -1, ASYNC_E_STATE); /* unlocked */
    /* a handle of another type */
    async_cond_t *c = async_cond_create();
    CHECK(c != NULL);
    CHECK_FAIL(async_mutex_lock((async_mutex_t *)c, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_cond_signal((async_cond_t *)m) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_cond_wait(c, NULL, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_cond_wait(NULL, m, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_cond_wait(c, m, 10) == -1, ASYNC_E_STATE); /* m not owned */

    CHECK_EQ(async_mutex_lock(m, -1), 0);
    CHECK_FAIL(async_mutex_lock(m, -1) == -1, ASYNC_E_STATE); /* not recursive, no self-deadlock */
    CHECK_FAIL(async_mutex_trylock(m) == -1, ASYNC_E_STATE);
    CHECK_FAIL(async_cond_wait(c, m, -2) == -1, ASYNC_E_INVAL);
    pthread_t t;
    start_thread(&t, lock_other, m);
    join_within(t, BOUND_MS, "lock_other");
    CHECK_EQ(async_mutex_unlock(m), 0);
    CHECK_FAIL(async_mutex_unlock(m) == -1, ASYNC_E_STATE);
    CHECK_EQ(async_mutex_trylock(m), 0);
    CHECK_EQ(async_mutex_unlock(m), 0);

    async_mutex_destroy(m);
    CHECK_FAIL(async_mutex_lock(m, -1) == -1, ASYNC_E_BADHANDLE); /* stale */
    CHECK_FAIL(async_mutex_unlock(m) == -1, ASYNC_E_BADHANDLE);
    async_clear_error();
    async_mutex_destroy(m);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    async_clear_error();
    async_mutex_destroy(NULL);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    async_cond_destroy(c);
    CHECK_FAIL(async_cond_signal(c) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_cond_broadcast(c) == -1, ASYNC_E_BADHANDLE);
    async_clear_error();
    async_cond_destroy(c);
    CHECK_ERR(ASYNC_E_BADHANDLE);
}

/* ---- the owner is the fiber, not its thread ------------------------------------------- */

static async_mutex_t *g_m;
static atomic_int g_flag, g_moved, g_done;

static void owner_fiber(void *arg) {
    (void)arg;
    CHECK_EQ(async_mutex_lock(g_m, -1), 0);
    atomic_store(&g_flag, 1); /* the main thread tries to unlock now */
    while (atomic_load(&g_flag) != 2) async_fiber_sleep(1);
    atomic_store(&g_moved, move_off(cur_thread()));
    CHECK_EQ(async_mutex_unlock(g_m), 0); /* from another thread: still the owner */
    atomic_store(&g_done, 1);
}

static void other_fiber(void *arg) {
    (void)arg;
    CHECK_FAIL(async_mutex_unlock(g_m) == -1, ASYNC_E_STATE);
    CHECK_FAIL(async_mutex_trylock(g_m) == -1, ASYNC_E_BUSY);
}

CASE(mutex_owner_fiber) {
    async_sched_t *s = sched_new(4);
    g_m = async_mutex_create();
    CHECK(g_m != NULL);
    CHECK(async_fiber_spawn(s, owner_fiber, NULL, 0) != NULL);
    wait_count_within(&g_flag, 1, 30000, "owner locked");
    CHECK_FAIL(async_mutex_unlock(g_m) == -1, ASYNC_E_STATE); /* a plain thread is not the owner */
    async_fiber_t *o = async_fiber_spawn(s, other_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(o != NULL);
    CHECK_EQ(async_fiber_join(o, BOUND_MS), 0);
    atomic_store(&g_flag, 2);
    wait_count_within(&g_done, 1, 30000, "owner unlocked");
    CHECK_EQ(async_sched_run(s), 0);
    printf("owner fiber moved to another thread: %d\n", atomic_load(&g_moved));
    CHECK_EQ(async_mutex_trylock(g_m), 0);
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    async_sched_destroy(s);
    async_mutex_destroy(g_m);
}

/* ---- mutual exclusion under contention ------------------------------------------------ */

#define CONT_FIBERS 200
#define CONT_THREADS 4
#define CONT_ITERS 500

static long g_counter;    /* plain, incremented only under g_m */
static int g_inside;      /* plain: 1 while someone holds g_m */
static atomic_int g_moves; /* lock holders that resumed on another thread */

/* park: 0 none, 1 yield, 2 sleep (a timer wakes it, often on another worker) */
static void critical(int park) {
    CHECK_EQ(g_inside, 0);
    g_inside = 1;
    long v = g_counter;
    if (park) {
        pthread_t before = cur_thread();
        if (park == 2) /* hold the mutex across a switch and maybe a move */
            async_fiber_sleep(1);
        else
            async_fiber_yield();
        if (!pthread_equal(before, cur_thread())) atomic_fetch_add(&g_moves, 1);
    }
    g_counter = v + 1;
    CHECK_EQ(g_inside, 1);
    g_inside = 0;
}

static void cont_fiber(void *arg) {
    (void)arg;
    for (int i = 0; i < CONT_ITERS; i++) {
        CHECK_EQ(async_mutex_lock(g_m, BOUND_MS), 0);
        critical(i % 100 == 0 ? 2 : i % 8 == 0);
        CHECK_EQ(async_mutex_unlock(g_m), 0);
        if (i % 4 == 0) async_fiber_yield();
    }
}

static void *cont_thread(void *arg) {
    (void)arg;
    for (int i = 0; i < CONT_ITERS; i++) {
        if (i % 3 == 0) {
            while (async_mutex_trylock(g_m) != 0) {
                CHECK_ERR(ASYNC_E_BUSY);
                sched_yield();
            }
        } else {
            CHECK_EQ(async_mutex_lock(g_m, BOUND_MS), 0);
        }
        critical(0);
        CHECK_EQ(async_mutex_unlock(g_m), 0);
    }
    return NULL;
}

CASE(mutex_contention) {
    async_sched_t *s = sched_new(4);
    g_m = async_mutex_create();
    CHECK(g_m != NULL);
    pthread_t th[CONT_THREADS];
    for (int i = 0; i < CONT_FIBERS; i++) CHECK(async_fiber_spawn(s, cont_fiber, NULL, 0) != NULL);
    for (int i = 0; i < CONT_THREADS; i++) start_thread(&th[i], cont_thread, NULL);
    for (int i = 0; i < CONT_THREADS; i++) join_within(th[i], 60000, "cont_thread");
    CHECK_EQ(async_sched_run(s), 0);
    printf("counter %ld, holders moved %d\n", g_counter, atomic_load(&g_moves));
    CHECK_EQ(g_counter, (long)(CONT_FIBERS + CONT_THREADS) * CONT_ITERS);
    async_sched_destroy(s);
    async_mutex_destroy(g_m);
}

/* ---- FIFO hand-off -------------------------------------------------------------------- */

#define FIFO_N 16
static int g_order[FIFO_N], g_norder;

static void fifo_fiber(void *arg) {
    int i = (int)(intptr_t)arg;
    CHECK_EQ(async_mutex_lock(g_m, BOUND_MS), 0);
    g_order[g_norder++] = i;
    CHECK_EQ(async_mutex_unlock(g_m), 0);
}

/* Lockers queued one after the other get the mutex in that order. */
CASE(mutex_fifo) {
    async_sched_t *s = sched_new(4);
    g_m = async_mutex_create();
    CHECK_EQ(async_mutex_lock(g_m, -1), 0);
    for (int i = 0; i < FIFO_N; i++) {
        CHECK(async_fiber_spawn(s, fifo_fiber, (void *)(intptr_t)i, 0) != NULL);
        sched_wait_parked(s, (size_t)i + 1);
    }
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(g_norder, FIFO_N);
    for (int i = 0; i < FIFO_N; i++) CHECK_EQ(g_order[i], i);
    async_sched_destroy(s);
    async_mutex_destroy(g_m);
}

/* A fiber that unlocks and locks again at once, without yielding, cannot
 * starve a waiter: with one worker a barging mutex would let it keep the
 * lock for all its rounds; hand-off gives it to the waiter at the first. */
static atomic_int g_b_at, g_a_rounds;

static void barger_a(void *arg) {
    async_sched_t *s = arg;
    CHECK_EQ(async_mutex_lock(g_m, -1), 0);
    atomic_store(&g_flag, 1);
    /* wait until B is parked on g_m (stats see it; this fiber runs) */
    async_sched_stats_t st;
    for (int i = 0; i < 100000; i++) {
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        if (st.fibers_parked == 1) break;
        async_fiber_yield();
    }
    CHECK_EQ(st.fibers_parked, 1);
    for (int r = 1; r <= 100; r++) {
        atomic_store(&g_a_rounds, r);
        CHECK_EQ(async_mutex_unlock(g_m), 0);
        CHECK_EQ(async_mutex_lock(g_m, BOUND_MS), 0);
    }
    CHECK_EQ(async_mutex_unlock(g_m), 0);
}

static void barger_b(void *arg) {
    (void)arg;
    CHECK_EQ(async_mutex_lock(g_m, BOUND_MS), 0);
    atomic_store(&g_b_at, atomic_load(&g_a_rounds));
    CHECK_EQ(async_mutex_unlock(g_m), 0);
}

CASE(mutex_no_starvation) {
    async_sched_t *s = sched_new(1);
    g_m = async_mutex_create();
    atomic_store(&g_flag, 0);
    CHECK(async_fiber_spawn(s, barger_a, s, 0) != NULL);
    wait_count_within(&g_flag, 1, 30000, "A locked");
    CHECK(async_fiber_spawn(s, barger_b, NULL, 0) != NULL);
    CHECK_EQ(async_sched_run(s), 0);
    printf("B got the mutex at A's unlock %d (of 100)\n", atomic_load(&g_b_at));
    CHECK_EQ(atomic_load(&g_b_at), 1);
    async_sched_destroy(s);
    async_mutex_destroy(g_m);
}

/* ---- timeouts -------------------------------------------------------------------------- */

static atomic_int g_rc_lock;

static void timeout_fiber(void *arg) {
    (void)arg;
    double t0 = now_ms();
    CHECK_FAIL(async_mutex_lock(g_m, 40) == -1, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 39);
    CHECK_FAIL(async_mutex_unlock(g_m) == -1, ASYNC_E_STATE); /* not handed to a timed-out waiter */
}

/* A waiter whose timeout races the unlock: it owns the mutex if and only if
 * its lock returned 0; the mutex is never left owned by nobody's call. */
static void race_fiber(void *arg) {
    (void)arg;
    int rc = async_mutex_lock(g_m, 1);
    if (rc == 0) {
        CHECK_EQ(async_mutex_unlock(g_m), 0);
    } else {
        CHECK_ERR(ASYNC_E_TIMEDOUT);
        CHECK_FAIL(async_mutex_unlock(g_m) == -1, ASYNC_E_STATE);
    }
    atomic_fetch_add(&g_rc_lock, rc == 0);
    atomic_fetch_add(&g_done, 1);
}

CASE(mutex_timeout) {
    async_sched_t *s = sched_new(2);
    g_m = async_mutex_create();
    CHECK_EQ(async_mutex_lock(g_m, -1), 0);
    async_fiber_t *f = async_fiber_spawn(s, timeout_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    CHECK_EQ(async_fiber_join(f, BOUND_MS), 0);
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    CHECK_EQ(async_mutex_trylock(g_m), 0); /* free: nobody was handed it */
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    /* timeout against unlock, many times */
    atomic_store(&g_done, 0);
    for (int i = 0; i < 300; i++) {
        CHECK_EQ(async_mutex_lock(g_m, BOUND_MS), 0);
        CHECK(async_fiber_spawn(s, race_fiber, NULL, 0) != NULL);
        if (i % 3) sleep_ms(1);
        CHECK_EQ(async_mutex_unlock(g_m), 0);
        wait_count_within(&g_done, i + 1, 30000, "race_fiber");
        CHECK_EQ(async_mutex_trylock(g_m), 0);
        CHECK_EQ(async_mutex_unlock(g_m), 0);
    }
    printf("racing waiters that got the mutex: %d of 300\n", atomic_load(&g_rc_lock));
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    async_mutex_destroy(g_m);
}

TEST_MAIN()
