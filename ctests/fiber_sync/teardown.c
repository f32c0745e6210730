/* Mutexes and condition variables torn down under their waiters: destroy
 * wakes every waiter (fiber or thread) with ASYNC_E_CLOSED (ASYNC_E_BADHANDLE
 * for a call that starts after the destroy), destroy racing
 * lock, wait and signal, scheduler shutdown cancels the waits of its
 * fibers, and in a forked child every call fails at once with
 * ASYNC_E_FORKED. Every wait is bounded. */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>

#include "fibers.h"

static async_mutex_t *g_m;
static async_cond_t *g_c;
static int g_nwait;
static atomic_int g_done, g_flag;
static async_fiber_key_t g_key;

/* ---- destroy racing waiters ------------------------------------------------------------ */

static atomic_int g_closed, g_other;

static void mutex_waiter(void) {
    int rc = async_mutex_lock(g_m, BOUND_MS);
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

FIBER_AND_THREAD(mw, mutex_waiter)

static void cond_waiter(void) {
    CHECK_EQ(async_mutex_lock(g_m, BOUND_MS), 0);
    g_nwait++;
    CHECK_FAIL(async_cond_wait(g_c, g_m, BOUND_MS) == -1, ASYNC_E_CLOSED);
    CHECK_EQ(async_mutex_unlock(g_m), 0); /* owned again */
    atomic_fetch_add(&g_closed, 1);
    atomic_fetch_add(&g_done, 1);
}

FIBER_AND_THREAD(cw, cond_waiter)

static void gone_waiter(void *arg) {
    (void)arg;
    CHECK_EQ(async_mutex_lock(g_m, BOUND_MS), 0);
    g_nwait++;
    CHECK_FAIL(async_cond_wait(g_c, g_m, BOUND_MS) == -1, ASYNC_E_BADHANDLE); /* m is gone */
    CHECK_FAIL(async_mutex_unlock(g_m) == -1, ASYNC_E_BADHANDLE);
    atomic_fetch_add(&g_done, 1);
}

CASE(destroy_waiters) {
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
    for (int i = 0; i < 2; i++) join_within(th[i], BOUND_MS, "mw_thread");
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
    lock_when_waiting(g_m, &g_nwait, 10);
    async_cond_destroy(g_c); /* with m held: they wake, then wait for m */
    sleep_ms(10);
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    for (int i = 0; i < 2; i++) join_within(th[i], BOUND_MS, "cw_thread");
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&g_closed), 10);
    async_mutex_destroy(g_m);

    /* the mutex destroyed while a signalled cond waiter needs it back */
    g_m = async_mutex_create();
    g_c = async_cond_create();
    g_nwait = 0;
    atomic_store(&g_done, 0);
    CHECK(async_fiber_spawn(s, gone_waiter, NULL, 0) != NULL);
    lock_when_waiting(g_m, &g_nwait, 1);
    CHECK_EQ(async_cond_signal(g_c), 0); /* it wakes and waits for m (or finds it gone) */
    sleep_ms(20);
    async_mutex_destroy(g_m);
    CHECK_FAIL(async_mutex_unlock(g_m) == -1, ASYNC_E_BADHANDLE);
    wait_count_within(&g_done, 1, 30000, "gone_waiter");
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

CASE(destroy_race) {
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
        wait_count_within(&g_done, 8, 30000, "churn");
    }
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
}

/* ---- shutdown -------------------------------------------------------------------------- */

static atomic_int g_lock_rc, g_wait_rc;

static void sd_locker(void *arg) {
    (void)arg;
    CHECK_FAIL(async_mutex_lock(g_m, BOUND_MS) == -1, ASYNC_E_CANCELLED);
    atomic_store(&g_lock_rc, 1);
}

static void sd_waiter(void *arg) {
    (void)arg;
    CHECK_EQ(async_mutex_lock(g_m, BOUND_MS), 0);
    g_nwait++;
    CHECK_FAIL(async_cond_wait(g_c, g_m, BOUND_MS) == -1, ASYNC_E_CANCELLED);
    CHECK_EQ(async_mutex_unlock(g_m), 0); /* owned again, though cancelled */
    atomic_store(&g_wait_rc, 1);
}

CASE(shutdown) {
    async_sched_t *s = sched_new(2);
    g_m = async_mutex_create();
    g_c = async_cond_create();
    g_nwait = 0;
    CHECK(async_fiber_spawn(s, sd_waiter, NULL, 0) != NULL);
    lock_when_waiting(g_m, &g_nwait, 1); /* the main thread holds m; sd_waiter parks on c */
    spawn_until_parked(s, sd_locker, NULL, 2);
    CHECK_FAIL(async_sched_shutdown(s, 0) == -1, ASYNC_E_TIMEDOUT);
    double t0 = now_ms();
    while (!atomic_load(&g_lock_rc)) {
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(1);
    }
    sleep_ms(20);
    CHECK_EQ(atomic_load(&g_wait_rc), 0); /* cancelled, but waiting for m */
    CHECK_EQ(async_mutex_unlock(g_m), 0);
    CHECK_EQ(async_sched_shutdown(s, BOUND_MS), 0);
    CHECK_EQ(atomic_load(&g_wait_rc), 1);
    /* later waits are cancelled at once */
    async_sched_destroy(s);
    async_cond_destroy(g_c);
    async_mutex_destroy(g_m);
}

/* ---- fork: every call fails at once with ASYNC_E_FORKED in the child ------------------ */

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

CASE(forked) {
    g_m = async_mutex_create();
    g_c = async_cond_create();
    CHECK_EQ(async_fiber_key_create(&g_key, NULL), 0);
    pthread_t t;
    start_thread(&t, hold_forever, NULL);
    join_within(t, BOUND_MS, "hold_forever");
    pid_t pid = fork_flushed();
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

TEST_MAIN()
