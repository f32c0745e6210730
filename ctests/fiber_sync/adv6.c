/* test_adv6.c — adversarial pass 6 (docs/RELIABILITY.md, "Adversarial pass
 * 6"): fiber synchronisation and lifecycle, read against include/async.h.
 *
 * Found broken (each failed before its fix):
 *   blocking_self_run, _shutdown, _destroy, _join
 *                     a function run by async_fiber_blocking for a fiber of s
 *                     calls async_sched_run(s), async_sched_shutdown(s, -1),
 *                     async_sched_destroy(s), or joins that fiber: each hung
 *                     for good; now ASYNC_E_STATE (shutdown: starts, returns 0).
 *                     blocking_other: the same job still joins another fiber
 *                     and destroys another scheduler (passed before too).
 *   dump_epipe, dump_signal_epipe
 *                     async_sched_dump (a plain thread) and the dump-on-signal
 *                     handler writing to a pipe whose reader left: SIGPIPE
 *                     killed the process; now ASYNC_E_SYS / EPIPE, no signal.
 * Documentation (passed before; the header said otherwise):
 *   shutdown_nowait   after async_sched_shutdown only waits are cancelled: a
 *                     call that completes at once still does.
 * Attacks that held (kept as regression cases):
 *   key_reuse         a value set under a deleted key never shows under a
 *                     later key (2048 create/delete cycles, thread and fiber).
 *   sleep_huge        async_fiber_sleep(UINT64_MAX) parks (no overflow), and
 *                     shutdown cancels it.
 *   select_self       a select with send and recv on one rendezvous channel
 *                     does not match itself.
 *   badargs           NULL / zero / huge counts, sizes and timeouts, wrong
 *                     handle types: the documented errors.
 *   timeout_intmax    INT_MAX timeouts wait (no overflow) and wake on close.
 *   rendezvous_timeouts  sends and receives with timeouts 0/1 racing on a
 *                     rendezvous channel: every success once, none lost.
 *   mutex_timeouts    lockers with timeouts 0/1: the hand-off is never lost.
 *   chan_destroy_race destroy racing send/recv/select/close from threads and
 *                     fibers on 2 workers.
 *   dtor_api          fiber-key destructors that yield, sleep, spawn, join,
 *                     name and set values again: 4 rounds, on fibers and threads.
 *   join_variants     join self, twice, bad timeouts, INT_MAX, after destroy.
 */
#include "check.h"

#include <limits.h>
#include <signal.h>
#include <stdatomic.h>

/* --- probe: keys reused ------------------------------------------------------ */

static atomic_int key_dtor_calls;
static void key_dtor(void *v) { (void)v; atomic_fetch_add(&key_dtor_calls, 1); }

/* A value set under a deleted key must not show up under a later key. */
static void key_reuse_body(void)
{
    async_fiber_key_t k1, k2;
    int i;
    static int val;
    CHECK_EQ(async_fiber_key_create(&k1, key_dtor), 0);
    CHECK_EQ(async_fiber_setspecific(k1, &val), 0);
    CHECK_EQ(async_fiber_key_delete(k1), 0);
    for (i = 0; i < 2048; i++) {
        CHECK_EQ(async_fiber_key_create(&k2, key_dtor), 0);
        async_clear_error();
        CHECK(async_fiber_getspecific(k2) == NULL);
        CHECK_ERR(ASYNC_OK);
        CHECK_EQ(async_fiber_key_delete(k2), 0);
    }
}

static void key_reuse_fiber(void *arg)
{
    (void)arg;
    key_reuse_body();
}

static void t_key_reuse(void)
{
    async_sched_t *s = sched_new(1);
    async_fiber_t *f;
    key_reuse_body();
    f = async_fiber_spawn(s, key_reuse_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    CHECK_EQ(async_fiber_join(f, 10000), 0);
    async_sched_destroy(s);
    CHECK_EQ(atomic_load(&key_dtor_calls), 0);
}

/* --- probe: sleep with a huge value ------------------------------------------ */

static atomic_int sleep_rc = 99;
static atomic_int sleep_err;
static void sleep_huge_fiber(void *arg)
{
    (void)arg;
    int rc = async_fiber_sleep(UINT64_MAX);
    atomic_store(&sleep_err, async_last_error());
    atomic_store(&sleep_rc, rc);
}

static void t_sleep_huge(void)
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

/* --- probe: select with one channel twice (send + recv, rendezvous) ---------- */

static void t_select_self(void)
{
    async_chan_t *c = async_chan_create(0, sizeof(int));
    int v = 7, out = 0;
    async_chan_op_t ops[2];
    CHECK(c != NULL);
    memset(ops, 0, sizeof ops);
    ops[0].chan = c;
    ops[0].dir = ASYNC_CHAN_SEND;
    ops[0].elem = &v;
    ops[1].chan = c;
    ops[1].dir = ASYNC_CHAN_RECV;
    ops[1].elem = &out;
    CHECK_FAIL(async_chan_select(ops, 2, 0) == -1, ASYNC_E_TIMEDOUT);
    CHECK_FAIL(async_chan_select(ops, 2, 50) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(out, 0);
    async_chan_destroy(c);
}

/* --- probe: bad arguments ---------------------------------------------------- */

static void t_badargs(void)
{
    async_chan_t *c = async_chan_create(1, 4);
    async_chan_op_t ops[65];
    async_sched_t *s = sched_new(1);
    async_sched_stats_t st;
    async_sched_worker_stats_t ws[2];
    int v = 0;
    CHECK(c != NULL);
    memset(ops, 0, sizeof ops);
    CHECK_FAIL(async_chan_select(NULL, 1, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_select(ops, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_select(ops, 65, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_select(ops, SIZE_MAX, 0) == -1, ASYNC_E_INVAL);
    ops[0].chan = c;
    ops[0].dir = ASYNC_CHAN_RECV;
    CHECK_FAIL(async_chan_select(ops, 1, -2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_select(ops, 1, INT_MIN) == -1, ASYNC_E_INVAL);
    ops[0].dir = 0;
    CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_INVAL);
    ops[0].dir = ASYNC_CHAN_SEND;
    CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_INVAL);
    ops[0].chan = NULL;
    ops[0].elem = &v;
    CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_BADHANDLE);
    ops[0].chan = (async_chan_t *)s;
    CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_chan_send(c, NULL, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_send(c, &v, -2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_recv(c, &v, INT_MIN) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(1, 0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(1, (1u << 20) + 1) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create((1u << 24) + 1, 1) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(SIZE_MAX, 1) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(SIZE_MAX, SIZE_MAX) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(1u << 24, 1u << 20) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(s, NULL, NULL, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(s, &st, NULL, 1) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(s, &st, ws, -1) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(NULL, &st, NULL, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_sched_shutdown(s, -2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_dump(s, -1) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_set_name(NULL, "x") == -1, ASYNC_E_STATE);
    CHECK_FAIL(async_fiber_get_name(NULL, NULL, 0) == -1, ASYNC_E_STATE);
    CHECK_FAIL(async_fiber_blocking(NULL, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_join(NULL, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_join((async_fiber_t *)c, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_sched_run((async_sched_t *)c) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_key_create(NULL, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_key_delete(0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_setspecific(12345, &v) == -1, ASYNC_E_BADHANDLE);
    async_sched_destroy(s);
    async_chan_destroy(c);
}

/* --- probe: INT_MAX timeouts still wait, and wake on close -------------------- */

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

static void t_timeout_intmax(void)
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

/* --- probe: rendezvous send with timeouts races receivers: no loss, no dup ---- */

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

static void t_rendezvous_timeouts(void)
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

/* --- probe: mutex with timeouts: the hand-off is never lost ------------------- */

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

static void t_mutex_timeouts(void)
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

/* --- probe: chan destroy racing everything ------------------------------------ */

static async_chan_t *volatile dr_c;
static atomic_int dr_stop;

static void *dr_user(void *arg)
{
    long k = (long)(intptr_t)arg;
    while (!atomic_load(&dr_stop)) {
        async_chan_t *c = dr_c;
        long v = 1;
        async_chan_op_t ops[3];
        switch (k % 4) {
        case 0:
            async_chan_send(c, &v, 1);
            break;
        case 1:
            async_chan_recv(c, &v, 1);
            break;
        case 2:
            memset(ops, 0, sizeof ops);
            ops[0].chan = c;
            ops[0].dir = ASYNC_CHAN_RECV;
            ops[1].chan = c;
            ops[1].dir = ASYNC_CHAN_SEND;
            ops[1].elem = &v;
            ops[2].chan = c;
            ops[2].dir = ASYNC_CHAN_RECV;
            async_chan_select(ops, 3, 1);
            break;
        default:
            async_chan_close(c);
            async_chan_try_send(c, &v);
            async_chan_try_recv(c, &v);
            break;
        }
    }
    return NULL;
}

static void dr_fiber(void *arg) { dr_user(arg); }

static void t_chan_destroy_race(void)
{
    pthread_t t[4];
    async_sched_t *s = sched_new(2);
    int i;
    double t0;
    dr_c = async_chan_create(0, sizeof(long));
    for (i = 0; i < 4; i++)
        start_thread(&t[i], dr_user, (void *)(intptr_t)i);
    for (i = 0; i < 8; i++)
        CHECK(async_fiber_spawn(s, dr_fiber, (void *)(intptr_t)i, 0) != NULL);
    t0 = now_ms();
    for (i = 0; now_ms() - t0 < 2000; i++) {
        async_chan_t *old = dr_c;
        dr_c = async_chan_create((size_t)(i % 3), sizeof(long));
        CHECK(dr_c != NULL);
        async_chan_destroy(old);
    }
    atomic_store(&dr_stop, 1);
    for (i = 0; i < 4; i++)
        join_within(t[i], 30000, "user");
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    async_chan_destroy(dr_c);
}

/* --- probe: destructors that use the API ----------------------------------- */

static async_fiber_key_t dk;
static atomic_int dk_rounds;
static async_sched_t *dk_s;
static void dk_child(void *arg) { (void)arg; }
static void dk_dtor(void *v)
{
    int n = atomic_fetch_add(&dk_rounds, 1);
    async_fiber_t *f;
    (void)v;
    async_fiber_yield();
    if (async_fiber_current() != NULL) {
        CHECK_EQ(async_fiber_sleep(1), 0);
        f = async_fiber_spawn(dk_s, dk_child, NULL, ASYNC_FIBER_JOINABLE);
        CHECK(f != NULL);
        CHECK_EQ(async_fiber_join(f, 10000), 0);
        CHECK_EQ(async_fiber_set_name(NULL, "dtor"), 0);
    }
    if (n < 10)
        CHECK_EQ(async_fiber_setspecific(dk, (void *)1), 0);
}

static void dk_fiber(void *arg)
{
    (void)arg;
    CHECK_EQ(async_fiber_setspecific(dk, (void *)1), 0);
}

static void *dk_thread(void *arg)
{
    (void)arg;
    CHECK_EQ(async_fiber_setspecific(dk, (void *)1), 0);
    return NULL;
}

static void t_dtor_api(void)
{
    async_fiber_t *f;
    pthread_t t;
    dk_s = sched_new(2);
    CHECK_EQ(async_fiber_key_create(&dk, dk_dtor), 0);
    f = async_fiber_spawn(dk_s, dk_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    CHECK_EQ(async_fiber_join(f, 30000), 0);
    CHECK_EQ(atomic_load(&dk_rounds), 4);
    start_thread(&t, dk_thread, NULL);
    join_within(t, 30000, "thread");
    CHECK_EQ(atomic_load(&dk_rounds), 8);
    async_sched_destroy(dk_s);
}

/* --- probe: join variants ---------------------------------------------------- */

static async_fiber_t *volatile self_f;
static atomic_int self_err;
static void join_self_fiber(void *arg)
{
    (void)arg;
    while (self_f == NULL)
        async_fiber_yield();
    async_clear_error();
    if (async_fiber_join(async_fiber_current(), 0) == -1)
        atomic_store(&self_err, async_last_error());
    async_clear_error();
    if (async_fiber_join(async_fiber_current(), -1) == -1 && async_last_error() != atomic_load(&self_err))
        atomic_store(&self_err, -async_last_error());
}

static void nop_fiber(void *arg) { (void)arg; }

static void t_join_variants(void)
{
    async_sched_t *s = sched_new(2);
    async_fiber_t *f = async_fiber_spawn(s, join_self_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    self_f = f;
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

/* --- blocking_self_*: a function async_fiber_blocking runs for a fiber of s
 * calls the waits of s that need that very fiber to return: async_sched_run,
 * async_sched_shutdown(s, -1), async_sched_destroy, async_fiber_join of the
 * fiber itself. They hung for good (the fiber waits for the function, the
 * function for the fiber); now they fail with ASYNC_E_STATE, or (shutdown)
 * start the shutdown and return 0 without waiting, as on a worker. ------- */

static async_sched_t *bs_s;
static async_fiber_t *volatile bs_f;
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

static void t_blocking_self_run(void) { blocking_self(0, -1, ASYNC_E_STATE); }
static void t_blocking_self_shutdown(void) { blocking_self(1, 0, ASYNC_OK); }
static void t_blocking_self_destroy(void) { blocking_self(2, -1, ASYNC_E_STATE); }
static void t_blocking_self_join(void) { blocking_self(3, -1, ASYNC_E_STATE); }

/* --- shutdown_nowait: after async_sched_shutdown, only waits are cancelled:
 * a call that completes at once still does (the header said "every later
 * one" fails, and that a fiber that yields can be stopped). A documentation
 * item: this passed before the header was fixed. ---------------------------- */

static atomic_int sn_go, sn_bad, sn_ready;
static void sn_nop(void *arg) { (void)arg; }

#define SN_EXPECT(expr, want_rc, want_err)                                                                     \
    do {                                                                                                       \
        int sn_rc_;                                                                                            \
        async_clear_error();                                                                                   \
        sn_rc_ = (expr);                                                                                       \
        if (sn_rc_ != (want_rc) || async_last_error() != (want_err)) {                                         \
            fprintf(stderr, "%s: %d (error %d), expected %d (error %d)\n", #expr, sn_rc_, async_last_error(),  \
                    (int)(want_rc), (int)(want_err));                                                          \
            atomic_fetch_add(&sn_bad, 1);                                                                      \
        }                                                                                                      \
    } while (0)

static void sn_fiber(void *arg)
{
    async_sched_t *s = arg;
    async_chan_t *c = async_chan_create(2, sizeof(int));
    async_mutex_t *m = async_mutex_create();
    async_mutex_t *held = async_mutex_create();
    async_cond_t *cv = async_cond_create();
    async_fiber_t *done;
    int v = 5;
    async_chan_op_t op;
    CHECK(c && m && held && cv);
    done = async_fiber_spawn(s, sn_nop, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(done != NULL);
    CHECK_EQ(async_mutex_trylock(held), 0);
    CHECK_EQ(async_fiber_join(done, -1), 0);
    done = async_fiber_spawn(s, sn_nop, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(done != NULL);
    atomic_store(&sn_ready, 1);
    while (!atomic_load(&sn_go))
        async_fiber_yield();
    /* completes at once */
    SN_EXPECT(async_chan_send(c, &v, -1), 0, ASYNC_OK);
    SN_EXPECT(async_chan_recv(c, &v, -1), 0, ASYNC_OK);
    SN_EXPECT(async_chan_send(c, &v, -1), 0, ASYNC_OK);
    memset(&op, 0, sizeof op);
    op.chan = c;
    op.dir = ASYNC_CHAN_RECV;
    op.elem = &v;
    SN_EXPECT(async_chan_select(&op, 1, -1), 0, ASYNC_OK);
    SN_EXPECT(async_mutex_lock(m, -1), 0, ASYNC_OK);
    SN_EXPECT(async_fiber_join(done, -1), 0, ASYNC_OK);
    /* has to wait */
    SN_EXPECT(async_cond_wait(cv, m, -1), -1, ASYNC_E_CANCELLED);
    SN_EXPECT(async_mutex_unlock(m), 0, ASYNC_OK);
    SN_EXPECT(async_chan_recv(c, &v, -1), -1, ASYNC_E_CANCELLED);
    SN_EXPECT(async_chan_select(&op, 1, -1), -1, ASYNC_E_CANCELLED);
    SN_EXPECT(async_fiber_sleep(0), -1, ASYNC_E_CANCELLED);
    async_chan_destroy(c);
    async_mutex_destroy(m);
    async_mutex_destroy(held);
    async_cond_destroy(cv);
}

static void t_shutdown_nowait(void)
{
    async_sched_t *s = sched_new(2);
    double t0 = now_ms();
    CHECK(async_fiber_spawn(s, sn_fiber, s, 0) != NULL);
    while (!atomic_load(&sn_ready)) {
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(1);
    }
    for (;;) { /* the joinable nop has returned: its join completes at once */
        async_sched_stats_t st;
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        if (st.fibers_done_unjoined == 1)
            break;
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(1);
    }
    CHECK_FAIL(async_sched_shutdown(s, 0) == -1, ASYNC_E_TIMEDOUT);
    atomic_store(&sn_go, 1);
    CHECK_EQ(async_sched_shutdown(s, 30000), 0);
    CHECK_EQ(atomic_load(&sn_bad), 0);
    async_sched_destroy(s);
}

/* --- dump_epipe*: async_sched_dump (and the dump-on-signal handler) to a
 * pipe whose reader is gone killed the process with SIGPIPE on a plain
 * thread; the header promises ASYNC_E_SYS (EPIPE). ------------------------- */

static void de_sleeper(void *arg)
{
    (void)arg;
    async_fiber_sleep(60000);
}

static void t_dump_epipe(void)
{
    async_sched_t *s = sched_new(1);
    int p[2];
    CHECK(async_fiber_spawn(s, de_sleeper, NULL, 0) != NULL);
    CHECK_EQ(pipe(p), 0);
    close(p[0]);
    CHECK_FAIL(async_sched_dump(s, p[1]) == -1, ASYNC_E_SYS);
    CHECK_EQ(async_last_os_error(), EPIPE);
    /* no SIGPIPE left pending for the host either */
    {
        sigset_t pend;
        CHECK_EQ(sigpending(&pend), 0);
        CHECK(!sigismember(&pend, SIGPIPE));
    }
    close(p[1]);
    async_sched_destroy(s);
}

static void t_dump_signal_epipe(void)
{
    async_sched_t *s = sched_new(1);
    int p[2];
    CHECK(async_fiber_spawn(s, de_sleeper, NULL, 0) != NULL);
    CHECK_EQ(pipe(p), 0);
    close(p[0]);
    CHECK_EQ(async_sched_dump_on_signal(s, SIGUSR2, p[1]), 0);
    CHECK_EQ(raise(SIGUSR2), 0);
    CHECK_EQ(raise(SIGUSR2), 0);
    CHECK_EQ(async_sched_dump_on_signal(s, 0, 0), 0);
    close(p[1]);
    async_sched_destroy(s);
}

/* blocking_other: the check is narrow: a blocking job still joins another
 * fiber of its own scheduler, and shuts down and destroys another scheduler. */
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
static void t_blocking_other(void)
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

static const test_case_t cases[] = {
    T(key_reuse), // adversarial
    T(sleep_huge), // adversarial
    T(select_self), // adversarial
    T(badargs), // adversarial
    T(timeout_intmax), // adversarial
    T(rendezvous_timeouts), // adversarial
    T(mutex_timeouts), // adversarial
    T(chan_destroy_race), // adversarial
    T(dtor_api), // adversarial
    T(join_variants), // adversarial
    T(blocking_self_run), // adversarial
    T(blocking_self_shutdown), // adversarial
    T(blocking_self_destroy), // adversarial
    T(blocking_self_join), // adversarial
    T(blocking_other), // adversarial
    T(shutdown_nowait), // adversarial
    T(dump_epipe), // adversarial
    T(dump_signal_epipe), // adversarial
};

TEST_MAIN(cases)
