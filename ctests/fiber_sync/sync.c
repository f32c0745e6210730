/* Fiber mutexes, condition variables and fiber-local storage (issue 14 item
 * 6; cabi/internal/fiber/sync.c, fls.c). One case per ctest test (group
 * fiber_sync, see CMakeLists.txt). Fibers and plain threads share the same
 * objects; every wait is bounded, so a lost wake-up fails a case instead of
 * hanging it. */
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"

#define LONG_MS 20000 /* "forever" for a wait that a correct library ends */


/* Waits until n fibers of s are parked; fails after 30 s. */

/* Waits until *v >= n; fails after 30 s. */
static void wait_at_least(atomic_int *v, int n, const char *what) {
    double t0 = now_ms();
    while (atomic_load(v) < n) {
        if (now_ms() - t0 > 30000) {
            fprintf(stderr, "%s: %d after 30 s, expected %d\n", what, atomic_load(v), n);
            CHECK(atomic_load(v) >= n);
        }
        sleep_ms(1);
    }
}

/* The thread the caller runs on now, read in a function of its own (a fiber
 * may move between calls). */
__attribute__((noinline)) static pthread_t cur_thread(void) {
    __asm__ volatile("" ::: "memory");
    return pthread_self();
}

/* Yields (sleeping now and then) until the calling fiber runs on a thread
 * other than `from`; 1 if it moved. */
static int move_off(pthread_t from) {
    for (int i = 0; i < 20000; i++) {
        if (!pthread_equal(cur_thread(), from)) return 1;
        if (i % 16 == 15)
            async_fiber_sleep(1);
        else
            async_fiber_yield();
    }
    return 0;
}

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

static void t_mutex_badinput(void) {
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
    join_within(t, LONG_MS, "lock_other");
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

static void t_mutex_owner_fiber(void) {
    async_sched_t *s = sched_new(4);
    g_m = async_mutex_create();
    CHECK(g_m != NULL);
    CHECK(async_fiber_spawn(s, owner_fiber, NULL, 0) != NULL);
    wait_at_least(&g_flag, 1, "owner locked");
    CHECK_FAIL(async_mutex_unlock(g_m) == -1, ASYNC_E_STATE); /* a plain thread is not the owner */
    async_fiber_t *o = async_fiber_spawn(s, other_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(o != NULL);
    CHECK_EQ(async_fiber_join(o, LONG_MS), 0);
    atomic_store(&g_flag, 2);
    wait_at_least(&g_done, 1, "owner unlocked");
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
        CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
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
            CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
        }
        critical(0);
        CHECK_EQ(async_mutex_unlock(g_m), 0);
    }
    return NULL;
}

static void t_mutex_contention(void) {
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
    CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
    g_order[g_norder++] = i;
    CHECK_EQ(async_mutex_unlock(g_m), 0);
}

/* Lockers queued one after the other get the mutex in that order. */
static void t_mutex_fifo(void) {
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
        CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
    }
    CHECK_EQ(async_mutex_unlock(g_m), 0);
}

static void barger_b(void *arg) {
    (void)arg;
    CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
    atomic_store(&g_b_at, atomic_load(&g_a_rounds));
    CHECK_EQ(async_mutex_unlock(g_m), 0);
}

static void t_mutex_no_starvation(void) {
    async_sched_t *s = sched_new(1);
    g_m = async_mutex_create();
    atomic_store(&g_flag, 0);
    CHECK(async_fiber_spawn(s, barger_a, s, 0) != NULL);
    wait_at_least(&g_flag, 1, "A locked");
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

static void t_mutex_timeout(void) {
    async_sched_t *s = sched_new(2);
    g_m = async_mutex_create();
    CHECK_EQ(async_mutex_lock(g_m, -1), 0);
    async_fiber_t *f = async_fiber_spawn(s, timeout_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    CHECK_EQ(async_fiber_join(f, LONG_MS), 0);
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    CHECK_EQ(async_mutex_trylock(g_m), 0); /* free: nobody was handed it */
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    /* timeout against unlock, many times */
    atomic_store(&g_done, 0);
    for (int i = 0; i < 300; i++) {
        CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
        CHECK(async_fiber_spawn(s, race_fiber, NULL, 0) != NULL);
        if (i % 3) sleep_ms(1);
        CHECK_EQ(async_mutex_unlock(g_m), 0);
        wait_at_least(&g_done, i + 1, "race_fiber");
        CHECK_EQ(async_mutex_trylock(g_m), 0);
        CHECK_EQ(async_mutex_unlock(g_m), 0);
    }
    printf("racing waiters that got the mutex: %d of 300\n", atomic_load(&g_rc_lock));
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    async_mutex_destroy(g_m);
}

/* ---- condition variables: producer / consumer with signal only ------------------------- */

#define PC_CAP 4
#define PC_PRODUCERS 6 /* 4 fibers + 2 threads */
#define PC_CONSUMERS 6
#define PC_ITEMS 3000 /* per producer */

static async_cond_t *g_not_empty, *g_not_full;
static int g_buf[PC_CAP], g_head, g_count, g_prod_done;
static long g_sum, g_taken;

static void produce(int base) {
    for (int i = 1; i <= PC_ITEMS; i++) {
        CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
        while (g_count == PC_CAP) CHECK_EQ(async_cond_wait(g_not_full, g_m, LONG_MS), 0);
        g_buf[(g_head + g_count) % PC_CAP] = base + i;
        g_count++;
        CHECK_EQ(async_cond_signal(g_not_empty), 0);
        CHECK_EQ(async_mutex_unlock(g_m), 0);
    }
    CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
    if (++g_prod_done == PC_PRODUCERS) CHECK_EQ(async_cond_broadcast(g_not_empty), 0);
    CHECK_EQ(async_mutex_unlock(g_m), 0);
}

static void consume(void) {
    for (;;) {
        CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
        while (g_count == 0 && g_prod_done < PC_PRODUCERS)
            CHECK_EQ(async_cond_wait(g_not_empty, g_m, LONG_MS), 0); /* a lost signal times out */
        if (g_count == 0) {
            CHECK_EQ(async_mutex_unlock(g_m), 0);
            return;
        }
        g_sum += g_buf[g_head];
        g_head = (g_head + 1) % PC_CAP;
        g_count--;
        g_taken++;
        CHECK_EQ(async_cond_signal(g_not_full), 0);
        CHECK_EQ(async_mutex_unlock(g_m), 0);
    }
}

static void prod_fiber(void *arg) { produce((int)(intptr_t)arg); }
static void *prod_thread(void *arg) {
    produce((int)(intptr_t)arg);
    return NULL;
}
static void cons_fiber(void *arg) {
    (void)arg;
    consume();
}
static void *cons_thread(void *arg) {
    (void)arg;
    consume();
    return NULL;
}

static void t_cond_prodcons(void) {
    async_sched_t *s = sched_new(4);
    g_m = async_mutex_create();
    g_not_empty = async_cond_create();
    g_not_full = async_cond_create();
    CHECK(g_m && g_not_empty && g_not_full);
    pthread_t th[4];
    int nth = 0;
    for (int p = 0; p < PC_PRODUCERS; p++) {
        int base = p * 100000;
        if (p < 4)
            CHECK(async_fiber_spawn(s, prod_fiber, (void *)(intptr_t)base, 0) != NULL);
        else
            start_thread(&th[nth++], prod_thread, (void *)(intptr_t)base);
    }
    for (int c = 0; c < PC_CONSUMERS; c++) {
        if (c < 4)
            CHECK(async_fiber_spawn(s, cons_fiber, NULL, 0) != NULL);
        else
            start_thread(&th[nth++], cons_thread, NULL);
    }
    for (int i = 0; i < nth; i++) join_within(th[i], 60000, "prodcons thread");
    CHECK_EQ(async_sched_run(s), 0);
    long want = 0;
    for (int p = 0; p < PC_PRODUCERS; p++) want += (long)p * 100000 * PC_ITEMS + (long)PC_ITEMS * (PC_ITEMS + 1) / 2;
    printf("taken %ld, sum %ld\n", g_taken, g_sum);
    CHECK_EQ(g_taken, (long)PC_PRODUCERS * PC_ITEMS);
    CHECK_EQ(g_sum, want);
    async_sched_destroy(s);
    async_cond_destroy(g_not_empty);
    async_cond_destroy(g_not_full);
    async_mutex_destroy(g_m);
}

/* ---- signal wakes one, broadcast wakes all ------------------------------------------------ */

#define BC_FIBERS 12
#define BC_THREADS 3
static async_cond_t *g_c;
static int g_nwait, g_go;
static atomic_int g_woken;

static void bc_wait(void) {
    CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
    g_nwait++;
    int seen = g_go;
    while (g_go == seen) CHECK_EQ(async_cond_wait(g_c, g_m, LONG_MS), 0);
    atomic_fetch_add(&g_woken, 1);
    CHECK_EQ(async_mutex_unlock(g_m), 0);
}

static void bc_fiber(void *arg) {
    (void)arg;
    bc_wait();
}
static void *bc_thread(void *arg) {
    (void)arg;
    bc_wait();
    return NULL;
}

/* Locks g_m once n callers have registered (they wait on g_c: they release
 * g_m only inside cond_wait). */
static void lock_when_waiting(int n) {
    double t0 = now_ms();
    for (;;) {
        CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
        if (g_nwait >= n) return;
        CHECK_EQ(async_mutex_unlock(g_m), 0);
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(1);
    }
}

static void t_cond_broadcast(void) {
    async_sched_t *s = sched_new(4);
    g_m = async_mutex_create();
    g_c = async_cond_create();
    pthread_t th[BC_THREADS];
    int n = BC_FIBERS + BC_THREADS;
    for (int i = 0; i < BC_FIBERS; i++) CHECK(async_fiber_spawn(s, bc_fiber, NULL, 0) != NULL);
    for (int i = 0; i < BC_THREADS; i++) start_thread(&th[i], bc_thread, NULL);
    /* signal: exactly one wakes per signal (the predicate changes once, for
     * everybody: each signalled waiter sees it; the others stay parked) */
    lock_when_waiting(n);
    CHECK_EQ(async_cond_signal(g_c), 0);
    g_go++;
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    wait_at_least(&g_woken, 1, "signal");
    sleep_ms(50);
    CHECK_EQ(atomic_load(&g_woken), 1); /* a second wake-up would show here */
    /* broadcast: the remaining n - 1 wake */
    CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
    CHECK_EQ(async_cond_broadcast(g_c), 0);
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    wait_at_least(&g_woken, n, "broadcast");
    for (int i = 0; i < BC_THREADS; i++) join_within(th[i], LONG_MS, "bc_thread");
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(async_cond_signal(g_c), 0); /* nobody waits: nothing happens */
    CHECK_EQ(async_cond_broadcast(g_c), 0);
    async_sched_destroy(s);
    async_cond_destroy(g_c);
    async_mutex_destroy(g_m);
}

/* A signal is never lost to a waiter whose timeout fires at the same moment:
 * with a short-timeout waiter ahead of a long one, one signal always wakes
 * one of them with 0. */
static atomic_int g_ok_short, g_ok_long, g_short_done;

static void short_waiter(void *arg) {
    CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
    g_nwait++;
    int rc = async_cond_wait(g_c, g_m, 1 + (int)(intptr_t)arg);
    if (rc == 0) atomic_fetch_add(&g_ok_short, 1);
    else CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_EQ(async_mutex_unlock(g_m), 0); /* owned again, also after a timeout */
    atomic_fetch_add(&g_short_done, 1);
}

static void long_waiter(void *arg) {
    (void)arg;
    CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
    g_nwait++;
    int rc = async_cond_wait(g_c, g_m, 5000);
    if (rc == 0) atomic_fetch_add(&g_ok_long, 1);
    else CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_EQ(async_mutex_unlock(g_m), 0);
}

static void t_cond_timeout(void) {
    async_sched_t *s = sched_new(2);
    g_m = async_mutex_create();
    g_c = async_cond_create();
    /* a plain timeout; m is owned again on return */
    CHECK_EQ(async_mutex_lock(g_m, -1), 0);
    double t0 = now_ms();
    CHECK_FAIL(async_cond_wait(g_c, g_m, 30) == -1, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 29);
    CHECK_FAIL(async_mutex_lock(g_m, 0) == -1, ASYNC_E_STATE); /* we own it */
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    int rounds = 200, lost = 0, short_timed_out = 0;
    for (int r = 0; r < rounds; r++) {
        atomic_store(&g_ok_short, 0);
        atomic_store(&g_ok_long, 0);
        atomic_store(&g_short_done, 0);
        g_nwait = 0;
        async_fiber_t *a = async_fiber_spawn(s, short_waiter, (void *)(intptr_t)(r % 3), ASYNC_FIBER_JOINABLE);
        lock_when_waiting(1);
        CHECK_EQ(async_mutex_unlock(g_m), 0);
        async_fiber_t *b = async_fiber_spawn(s, long_waiter, NULL, ASYNC_FIBER_JOINABLE);
        CHECK(a && b);
        lock_when_waiting(2);
        CHECK_EQ(async_mutex_unlock(g_m), 0);
        CHECK_EQ(async_cond_signal(g_c), 0); /* races the short timeout */
        CHECK_EQ(async_fiber_join(a, LONG_MS), 0);
        int sent = 1;
        if (atomic_load(&g_ok_short)) { /* a took it: one more for b */
            CHECK_EQ(async_cond_signal(g_c), 0);
            sent++;
        }
        CHECK_EQ(async_fiber_join(b, LONG_MS), 0); /* b waits 5 s for a lost signal */
        if (atomic_load(&g_ok_short) + atomic_load(&g_ok_long) != sent || !atomic_load(&g_ok_long)) lost++;
        else if (sent == 1) short_timed_out++;
    }
    printf("rounds where the signal was lost: %d of %d (the short waiter timed out in %d)\n", lost, rounds,
           short_timed_out);
    CHECK_EQ(lost, 0);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    async_cond_destroy(g_c);
    async_mutex_destroy(g_m);
}

/* cond_wait takes the mutex back before it returns: with the mutex held by
 * another, a timed-out wait returns only after that one unlocks. */
static void *hold_then_release(void *arg) {
    (void)arg;
    CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
    atomic_store(&g_flag, 1);
    sleep_ms(100);
    atomic_store(&g_flag, 2);
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    return NULL;
}

static void relock_fiber(void *arg) {
    (void)arg;
    CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
    pthread_t t;
    start_thread(&t, hold_then_release, NULL); /* blocks on g_m until the wait releases it */
    CHECK_FAIL(async_cond_wait(g_c, g_m, 20) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(atomic_load(&g_flag), 2); /* the holder had unlocked */
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    join_within(t, LONG_MS, "holder"); /* short: it has unlocked */
}

static void t_cond_relock(void) {
    async_sched_t *s = sched_new(2);
    g_m = async_mutex_create();
    g_c = async_cond_create();
    atomic_store(&g_flag, 0);
    async_fiber_t *f = async_fiber_spawn(s, relock_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    CHECK_EQ(async_fiber_join(f, LONG_MS), 0);
    async_sched_destroy(s);
    async_cond_destroy(g_c);
    async_mutex_destroy(g_m);
}

/* ---- destroy racing waiters ------------------------------------------------------------ */

static atomic_int g_closed, g_other;

static void mutex_waiter(void) {
    int rc = async_mutex_lock(g_m, LONG_MS);
    if (rc == 0) {
        atomic_fetch_add(&g_other, 1); /* got it before the destroy: unlock may fail BADHANDLE */
        if (async_mutex_unlock(g_m) != 0) CHECK_ERR(ASYNC_E_BADHANDLE);
    } else if (async_last_error() == ASYNC_E_CLOSED || async_last_error() == ASYNC_E_BADHANDLE) {
        atomic_fetch_add(&g_closed, 1);
    } else {
        CHECK_ERR(ASYNC_E_CLOSED);
    }
    atomic_fetch_add(&g_done, 1);
}
static void mw_fiber(void *arg) {
    (void)arg;
    mutex_waiter();
}
static void *mw_thread(void *arg) {
    (void)arg;
    mutex_waiter();
    return NULL;
}

static void cond_waiter(void) {
    CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
    g_nwait++;
    CHECK_FAIL(async_cond_wait(g_c, g_m, LONG_MS) == -1, ASYNC_E_CLOSED);
    CHECK_EQ(async_mutex_unlock(g_m), 0); /* owned again */
    atomic_fetch_add(&g_closed, 1);
    atomic_fetch_add(&g_done, 1);
}
static void cw_fiber(void *arg) {
    (void)arg;
    cond_waiter();
}
static void *cw_thread(void *arg) {
    (void)arg;
    cond_waiter();
    return NULL;
}

static void gone_waiter(void *arg) {
    (void)arg;
    CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
    g_nwait++;
    CHECK_FAIL(async_cond_wait(g_c, g_m, LONG_MS) == -1, ASYNC_E_BADHANDLE); /* m is gone */
    CHECK_FAIL(async_mutex_unlock(g_m) == -1, ASYNC_E_BADHANDLE);
    atomic_fetch_add(&g_done, 1);
}

static void t_destroy_waiters(void) {
    async_sched_t *s = sched_new(4);
    /* a locked mutex with parked fibers and blocked threads */
    g_m = async_mutex_create();
    CHECK_EQ(async_mutex_lock(g_m, -1), 0);
    pthread_t th[2];
    for (int i = 0; i < 8; i++) CHECK(async_fiber_spawn(s, mw_fiber, NULL, 0) != NULL);
    for (int i = 0; i < 2; i++) start_thread(&th[i], mw_thread, NULL);
    sched_wait_parked(s, 8);
    sleep_ms(20); /* the threads block (not observable; either way they fail) */
    async_mutex_destroy(g_m);
    CHECK_FAIL(async_mutex_unlock(g_m) == -1, ASYNC_E_BADHANDLE); /* the owner's unlock */
    for (int i = 0; i < 2; i++) join_within(th[i], LONG_MS, "mw_thread");
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&g_closed), 10);
    CHECK_EQ(atomic_load(&g_other), 0);

    /* a condition variable with waiters */
    atomic_store(&g_closed, 0);
    g_m = async_mutex_create();
    g_c = async_cond_create();
    g_nwait = 0;
    for (int i = 0; i < 8; i++) CHECK(async_fiber_spawn(s, cw_fiber, NULL, 0) != NULL);
    for (int i = 0; i < 2; i++) start_thread(&th[i], cw_thread, NULL);
    lock_when_waiting(10);
    async_cond_destroy(g_c); /* with m held: they wake, then wait for m */
    sleep_ms(10);
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    for (int i = 0; i < 2; i++) join_within(th[i], LONG_MS, "cw_thread");
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&g_closed), 10);
    async_mutex_destroy(g_m);

    /* the mutex destroyed while a signalled cond waiter needs it back */
    g_m = async_mutex_create();
    g_c = async_cond_create();
    g_nwait = 0;
    atomic_store(&g_done, 0);
    CHECK(async_fiber_spawn(s, gone_waiter, NULL, 0) != NULL);
    lock_when_waiting(1);
    CHECK_EQ(async_cond_signal(g_c), 0); /* it wakes and waits for m (or finds it gone) */
    sleep_ms(20);
    async_mutex_destroy(g_m);
    CHECK_FAIL(async_mutex_unlock(g_m) == -1, ASYNC_E_BADHANDLE);
    wait_at_least(&g_done, 1, "gone_waiter");
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    async_cond_destroy(g_c);
}

/* Destroy against lockers and waiters that come and go with timeouts, many
 * rounds (ASan: no waiter touches a freed object). */
static void churn_fiber(void *arg) {
    (void)arg;
    async_mutex_t *m = g_m;
    async_cond_t *c = g_c;
    for (int i = 0; i < 50; i++) {
        if (async_mutex_lock(m, 1) != 0) {
            int e = async_last_error();
            CHECK(e == ASYNC_E_TIMEDOUT || e == ASYNC_E_CLOSED || e == ASYNC_E_BADHANDLE);
            if (e != ASYNC_E_TIMEDOUT) break;
            continue;
        }
        int rc = async_cond_wait(c, m, 1);
        int e = async_last_error();
        CHECK(rc == 0 || e == ASYNC_E_TIMEDOUT || e == ASYNC_E_CLOSED || e == ASYNC_E_BADHANDLE);
        /* owned again unless m is gone (BADHANDLE for c alone: still owned) */
        if (async_mutex_unlock(m) != 0) CHECK_ERR(ASYNC_E_BADHANDLE);
        async_cond_signal(c);
    }
    atomic_fetch_add(&g_done, 1);
}

static void t_destroy_race(void) {
    async_sched_t *s = sched_new(4);
    for (int r = 0; r < 100; r++) {
        g_m = async_mutex_create();
        g_c = async_cond_create();
        atomic_store(&g_done, 0);
        for (int i = 0; i < 8; i++) CHECK(async_fiber_spawn(s, churn_fiber, NULL, 0) != NULL);
        if (r % 2) sleep_ms(1);
        if (r % 3) {
            async_cond_destroy(g_c);
            async_mutex_destroy(g_m);
        } else {
            async_mutex_destroy(g_m);
            async_cond_destroy(g_c);
        }
        wait_at_least(&g_done, 8, "churn");
    }
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
}

/* ---- shutdown -------------------------------------------------------------------------- */

static atomic_int g_lock_rc, g_wait_rc;

static void sd_locker(void *arg) {
    (void)arg;
    CHECK_FAIL(async_mutex_lock(g_m, LONG_MS) == -1, ASYNC_E_CANCELLED);
    atomic_store(&g_lock_rc, 1);
}

static void sd_waiter(void *arg) {
    (void)arg;
    CHECK_EQ(async_mutex_lock(g_m, LONG_MS), 0);
    g_nwait++;
    CHECK_FAIL(async_cond_wait(g_c, g_m, LONG_MS) == -1, ASYNC_E_CANCELLED);
    CHECK_EQ(async_mutex_unlock(g_m), 0); /* owned again, though cancelled */
    atomic_store(&g_wait_rc, 1);
}

static void t_shutdown(void) {
    async_sched_t *s = sched_new(2);
    g_m = async_mutex_create();
    g_c = async_cond_create();
    g_nwait = 0;
    CHECK(async_fiber_spawn(s, sd_waiter, NULL, 0) != NULL);
    lock_when_waiting(1); /* the main thread holds m; sd_waiter parks on c */
    CHECK(async_fiber_spawn(s, sd_locker, NULL, 0) != NULL);
    sched_wait_parked(s, 2);
    CHECK_FAIL(async_sched_shutdown(s, 0) == -1, ASYNC_E_TIMEDOUT);
    double t0 = now_ms();
    while (!atomic_load(&g_lock_rc)) {
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(1);
    }
    sleep_ms(20);
    CHECK_EQ(atomic_load(&g_wait_rc), 0); /* cancelled, but waiting for m */
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    CHECK_EQ(async_sched_shutdown(s, LONG_MS), 0);
    CHECK_EQ(atomic_load(&g_wait_rc), 1);
    /* later waits are cancelled at once */
    async_sched_destroy(s);
    async_cond_destroy(g_c);
    async_mutex_destroy(g_m);
}

/* ---- fiber-local storage ------------------------------------------------------------------ */

static async_fiber_key_t g_key;
static atomic_int g_fls_moved, g_dtor_calls, g_dtor_wrong;

#define FLS_FIBERS 64

static void fls_fiber(void *arg) {
    intptr_t i = (intptr_t)arg;
    CHECK(async_fiber_getspecific(g_key) == NULL);
    CHECK_EQ(async_fiber_setspecific(g_key, (void *)(i + 1)), 0);
    if (move_off(cur_thread())) atomic_fetch_add(&g_fls_moved, 1);
    CHECK(async_fiber_getspecific(g_key) == (void *)(i + 1));
    async_fiber_sleep(1);
    CHECK(async_fiber_getspecific(g_key) == (void *)(i + 1));
    CHECK_EQ(async_fiber_setspecific(g_key, NULL), 0); /* no destructor for NULL */
    CHECK(async_fiber_getspecific(g_key) == NULL);
}

static void *fls_thread(void *arg) {
    CHECK(async_fiber_getspecific(g_key) == NULL); /* its own values */
    CHECK_EQ(async_fiber_setspecific(g_key, arg), 0);
    sleep_ms(5);
    CHECK(async_fiber_getspecific(g_key) == arg);
    return NULL;
}

static void count_dtor(void *v) {
    (void)v;
    atomic_fetch_add(&g_dtor_calls, 1);
}

static void t_fls_migrate(void) {
    CHECK_EQ(async_fiber_key_create(&g_key, count_dtor), 0);
    async_sched_t *s = sched_new(4);
    CHECK_EQ(async_fiber_setspecific(g_key, (void *)&g_key), 0); /* the main thread's */
    for (intptr_t i = 0; i < FLS_FIBERS; i++) CHECK(async_fiber_spawn(s, fls_fiber, (void *)i, 0) != NULL);
    pthread_t t;
    start_thread(&t, fls_thread, (void *)&t);
    CHECK_EQ(async_sched_run(s), 0);
    join_within(t, LONG_MS, "fls_thread"); /* its exit runs the destructor once */
    CHECK(async_fiber_getspecific(g_key) == (void *)&g_key); /* untouched by fibers and threads */
    printf("fibers moved to another thread: %d of %d\n", atomic_load(&g_fls_moved), FLS_FIBERS);
    CHECK(atomic_load(&g_fls_moved) > 0);
    CHECK_EQ(atomic_load(&g_dtor_calls), 1); /* the thread's value only */
    async_sched_destroy(s);
    CHECK_EQ(async_fiber_key_delete(g_key), 0);
}

/* Destructors: once per non-NULL value, on the fiber itself, before join
 * returns; values set again by a destructor get another round; a deleted
 * key's values get none. */
#define DT_FIBERS 300
static atomic_int g_calls[DT_FIBERS];
static async_fiber_key_t g_key2, g_dead_key;

typedef struct {
    int idx;
    async_fiber_t *self;
    int again; /* the destructor sets a value once more */
} dt_val_t;

static void dt_dtor(void *v) {
    dt_val_t *d = v;
    if (async_fiber_current() != d->self) atomic_fetch_add(&g_dtor_wrong, 1);
    if (async_fiber_getspecific(g_key) != NULL) atomic_fetch_add(&g_dtor_wrong, 1); /* cleared first */
    atomic_fetch_add(&g_calls[d->idx], 1);
    async_fiber_yield(); /* a destructor may switch (and move) */
    if (d->again) {
        d->again = 0;
        CHECK_EQ(async_fiber_setspecific(g_key, d), 0);
        return;
    }
    free(d);
}

static atomic_int g_dead_calls, g_dead_set, g_deleted;

static void dead_dtor(void *v) {
    (void)v;
    atomic_fetch_add(&g_dead_calls, 1);
}

static void dead_fiber(void *arg) {
    (void)arg;
    CHECK_EQ(async_fiber_setspecific(g_dead_key, (void *)1), 0);
    atomic_fetch_add(&g_dead_set, 1);
    for (int i = 0; i < 30000 && !atomic_load(&g_deleted); i++) async_fiber_sleep(1);
    CHECK(atomic_load(&g_deleted));
}

static void k2_dtor(void *v) {
    /* may run before or after dt_dtor: both keys' values are there */
    atomic_fetch_add(&g_dtor_calls, 1);
    (void)v;
}

static void dt_fiber(void *arg) {
    dt_val_t *d = malloc(sizeof *d);
    CHECK(d != NULL);
    d->idx = (int)(intptr_t)arg;
    d->self = async_fiber_current();
    d->again = d->idx % 3 == 0;
    CHECK_EQ(async_fiber_setspecific(g_key, d), 0);
    CHECK_EQ(async_fiber_setspecific(g_key2, (void *)1), 0);
    async_fiber_yield();
}

static void t_fls_destructors(void) {
    CHECK_EQ(async_fiber_key_create(&g_key, dt_dtor), 0);
    CHECK_EQ(async_fiber_key_create(&g_key2, k2_dtor), 0);
    CHECK_EQ(async_fiber_key_create(&g_dead_key, dead_dtor), 0);
    async_sched_t *s = sched_new(4);
    async_fiber_t *f[DT_FIBERS];
    /* the dead key is deleted while fibers hold values of it */
    for (int i = 0; i < DT_FIBERS; i++) {
        f[i] = async_fiber_spawn(s, dt_fiber, (void *)(intptr_t)i, ASYNC_FIBER_JOINABLE);
        CHECK(f[i] != NULL);
        if (i == 10) {
            CHECK_EQ(async_fiber_join(f[0], LONG_MS), 0);
            f[0] = NULL;
            CHECK_EQ(atomic_load(&g_calls[0]), 2); /* ran (twice: it set again) before join returned */
        }
    }
    for (int i = 0; i < DT_FIBERS; i++) {
        if (!f[i]) continue;
        CHECK_EQ(async_fiber_join(f[i], LONG_MS), 0);
        CHECK_EQ(atomic_load(&g_calls[i]), i % 3 == 0 ? 2 : 1); /* before join returned */
    }
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&g_dtor_calls), DT_FIBERS); /* key2: one each */
    /* a key deleted while fibers hold values of it: no destructor for them */
    for (int i = 0; i < 20; i++) CHECK(async_fiber_spawn(s, dead_fiber, NULL, 0) != NULL);
    wait_at_least(&g_dead_set, 20, "dead key values set");
    CHECK_EQ(async_fiber_key_delete(g_dead_key), 0);
    atomic_store(&g_deleted, 1);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&g_dead_calls), 0);
    CHECK_EQ(atomic_load(&g_dtor_wrong), 0);
    async_sched_destroy(s);
    CHECK_EQ(async_fiber_key_delete(g_key), 0);
    CHECK_EQ(async_fiber_key_delete(g_key2), 0);
}

static void t_fls_badinput(void) {
    async_fiber_key_t k;
    CHECK_FAIL(async_fiber_key_create(NULL, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_key_delete(0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_setspecific(0, &k) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_getspecific(0) == NULL, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_getspecific(~(async_fiber_key_t)0) == NULL, ASYNC_E_BADHANDLE);
    CHECK_EQ(async_fiber_key_create(&k, NULL), 0);
    async_clear_error();
    CHECK(async_fiber_getspecific(k) == NULL);
    CHECK_ERR(ASYNC_OK); /* NULL value: no error */
    CHECK_EQ(async_fiber_setspecific(k, &k), 0);
    CHECK(async_fiber_getspecific(k) == &k);
    CHECK_EQ(async_fiber_key_delete(k), 0);
    CHECK_FAIL(async_fiber_key_delete(k) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_getspecific(k) == NULL, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_setspecific(k, &k) == -1, ASYNC_E_BADHANDLE);
    /* a new key on the same index starts at NULL; the stale key stays dead */
    async_fiber_key_t k2;
    CHECK_EQ(async_fiber_key_create(&k2, NULL), 0);
    CHECK(k2 != k);
    async_clear_error();
    CHECK(async_fiber_getspecific(k2) == NULL);
    CHECK_ERR(ASYNC_OK);
    CHECK_FAIL(async_fiber_getspecific(k) == NULL, ASYNC_E_BADHANDLE);
    CHECK_EQ(async_fiber_key_delete(k2), 0);
    /* exhaustion */
    static async_fiber_key_t all[1024];
    int n = 0;
    while (n < 1024 && async_fiber_key_create(&all[n], NULL) == 0) n++;
    CHECK_EQ(n, 1024);
    CHECK_FAIL(async_fiber_key_create(&k, NULL) == -1, ASYNC_E_NOMEM);
    for (int i = 0; i < n; i++) CHECK_EQ(async_fiber_setspecific(all[i], &all[i]), 0);
    for (int i = 0; i < n; i++) CHECK(async_fiber_getspecific(all[i]) == &all[i]);
    for (int i = 0; i < n; i++) CHECK_EQ(async_fiber_key_delete(all[i]), 0);
    CHECK_EQ(async_fiber_key_create(&k, NULL), 0);
    CHECK_EQ(async_fiber_key_delete(k), 0);
}

/* ---- fork: every call fails at once with ASYNC_E_FORKED in the child ------------------ */

#include <sys/wait.h>

#define CHILD_FORKED(n, expr)                                                                                  \
    do {                                                                                                       \
        async_clear_error();                                                                                   \
        if (!(expr) || async_last_error() != ASYNC_E_FORKED) _exit(n);                                         \
    } while (0)

static void *hold_forever(void *arg) {
    (void)arg;
    CHECK_EQ(async_mutex_lock(g_m, -1), 0);
    atomic_store(&g_flag, 1);
    return NULL; /* ends owning it: a lock in the parent would wait for ever */
}

static void t_forked(void) {
    g_m = async_mutex_create();
    g_c = async_cond_create();
    CHECK_EQ(async_fiber_key_create(&g_key, NULL), 0);
    pthread_t t;
    start_thread(&t, hold_forever, NULL);
    join_within(t, LONG_MS, "hold_forever");
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        double t0 = now_ms();
        CHILD_FORKED(10, async_mutex_lock(g_m, -1) == -1);
        CHILD_FORKED(11, async_mutex_trylock(g_m) == -1);
        CHILD_FORKED(12, async_mutex_unlock(g_m) == -1);
        CHILD_FORKED(13, async_cond_wait(g_c, g_m, -1) == -1);
        CHILD_FORKED(14, async_cond_signal(g_c) == -1);
        CHILD_FORKED(15, async_cond_broadcast(g_c) == -1);
        CHILD_FORKED(16, async_mutex_create() == NULL);
        CHILD_FORKED(17, async_cond_create() == NULL);
        async_fiber_key_t k;
        CHILD_FORKED(18, async_fiber_key_create(&k, NULL) == -1);
        CHILD_FORKED(19, async_fiber_setspecific(g_key, &k) == -1);
        CHILD_FORKED(20, async_fiber_getspecific(g_key) == NULL);
        CHILD_FORKED(21, async_fiber_key_delete(g_key) == -1);
        CHILD_FORKED(22, (async_mutex_destroy(g_m), 1));
        CHILD_FORKED(23, (async_cond_destroy(g_c), 1));
        if (now_ms() - t0 > 10000) _exit(30);
        _exit(0);
    }
    int st = 0;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fprintf(stderr, "child status %#x\n", st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* the parent's objects are untouched */
    CHECK_FAIL(async_mutex_trylock(g_m) == -1, ASYNC_E_BUSY);
    CHECK_EQ(async_fiber_key_delete(g_key), 0);
    async_mutex_destroy(g_m);
    async_cond_destroy(g_c);
}

static const test_case_t cases[] = {
    T(mutex_badinput),
    T(mutex_owner_fiber),
    T(mutex_contention),
    T(mutex_fifo),
    T(mutex_no_starvation),
    T(mutex_timeout),
    T(cond_prodcons),
    T(cond_broadcast),
    T(cond_timeout),
    T(cond_relock),
    T(destroy_waiters),
    T(destroy_race),
    T(shutdown),
    T(fls_migrate),
    T(fls_destructors),
    T(fls_badinput),
    T(forked),
};

TEST_MAIN(cases)
