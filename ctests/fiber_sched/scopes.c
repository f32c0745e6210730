/* Scopes: cancelling a scope cancels the fibers of it and of every scope
 * below it, not those above or beside; a fiber spawned into a cancelled
 * scope (or a scope created inside one) starts cancelled; a join waits until
 * every fiber below has returned, with a timeout, also while the joiner is
 * cancelled or its scheduler shuts down, and refuses to wait for itself;
 * destroy refuses a scope that is not empty; handles of destroyed scopes
 * (and of a destroyed scheduler's) are BADHANDLE; 10k fibers in nested
 * scopes cancelled at once all return; scope calls racing the scheduler's
 * destroy, and joins racing the scope's own destroy, never crash; a
 * destroyed scope's handle is never issued again. */
#include <pthread.h>
#include <stdatomic.h>

#include "fibers.h"

static atomic_int sc_cancelled, sc_other;

/* Sleeps for an hour; counts how the sleep ended. */
static void hour_sleeper(void *arg) {
    (void)arg;
    if (async_fiber_sleep(3600 * 1000) == -1 && async_last_error() == ASYNC_E_CANCELLED)
        atomic_fetch_add(&sc_cancelled, 1);
    else
        atomic_fetch_add(&sc_other, 1);
}

/* root > mid > leaf, and side beside mid: cancelling mid ends the fibers of
 * mid and leaf only; cancelling root ends the rest. */
CASE(scope_cancel_subtree) { // valgrind
    async_sched_t *s = sched_new(2);
    async_scope_t *root = async_scope_create(s, NULL, -1);
    CHECK(root != NULL);
    async_scope_t *mid = async_scope_create(s, root, -1), *side = async_scope_create(s, root, -1);
    async_scope_t *leaf = async_scope_create(s, mid, -1);
    CHECK(mid && side && leaf);
    async_scope_t *sc[4] = {root, mid, side, leaf};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 3; k++) CHECK(async_scope_spawn(sc[i], hour_sleeper, NULL, 0) != NULL);
    sched_wait_parked(s, 12);
    CHECK_EQ(async_scope_cancel(mid), 0);
    CHECK_EQ(async_scope_join(mid, BOUND_MS), 0);
    CHECK_EQ(atomic_load(&sc_cancelled), 6);
    CHECK_FAIL(async_scope_join(root, 0) == -1, ASYNC_E_TIMEDOUT);
    CHECK_FAIL(async_scope_join(root, 50) == -1, ASYNC_E_TIMEDOUT);
    sched_wait_parked(s, 6);
    CHECK_EQ(async_scope_cancel(mid), 0); /* idempotent */
    CHECK_EQ(async_scope_cancel(root), 0);
    CHECK_EQ(async_scope_join(root, BOUND_MS), 0);
    CHECK_EQ(async_scope_join(root, 0), 0);
    CHECK_EQ(atomic_load(&sc_cancelled), 12);
    CHECK_EQ(atomic_load(&sc_other), 0);
    /* only empty scopes without child scopes go */
    CHECK_FAIL(async_scope_destroy(root) == -1, ASYNC_E_BUSY);
    CHECK_FAIL(async_scope_destroy(mid) == -1, ASYNC_E_BUSY);
    CHECK_EQ(async_scope_destroy(leaf), 0);
    CHECK_EQ(async_scope_destroy(mid), 0);
    CHECK_EQ(async_scope_destroy(side), 0);
    CHECK_EQ(async_scope_destroy(root), 0);
    CHECK_FAIL(async_scope_destroy(root) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_scope_cancel(leaf) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_scope_join(mid, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_scope_spawn(side, nop_fiber, NULL, 0) == NULL, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_scope_create(s, root, -1) == NULL, ASYNC_E_BADHANDLE);
    async_sched_destroy(s);
}

static atomic_int late_rc, late_err, late_ran;
static void late_fiber(void *arg) {
    (void)arg;
    atomic_store(&late_ran, 1);
    atomic_store(&late_rc, async_fiber_sleep(1000));
    atomic_store(&late_err, async_last_error());
}

/* After a scope's cancel: a fiber spawned into it runs and its first park
 * fails; a scope created inside it starts cancelled too. */
CASE(scope_spawn_after_cancel) {
    async_sched_t *s = sched_new(2);
    async_scope_t *a = async_scope_create(s, NULL, -1);
    CHECK_EQ(async_scope_cancel(a), 0);
    CHECK(async_scope_spawn(a, late_fiber, NULL, 0) != NULL);
    CHECK_EQ(async_scope_join(a, BOUND_MS), 0);
    CHECK_EQ(atomic_load(&late_ran), 1);
    CHECK_EQ(atomic_load(&late_rc), -1);
    CHECK_EQ(atomic_load(&late_err), ASYNC_E_CANCELLED);
    async_scope_t *b = async_scope_create(s, a, -1);
    CHECK(b != NULL);
    atomic_store(&late_rc, 0);
    CHECK(async_scope_spawn(b, late_fiber, NULL, 0) != NULL);
    CHECK_EQ(async_scope_join(a, BOUND_MS), 0);
    CHECK_EQ(atomic_load(&late_rc), -1);
    CHECK_EQ(async_scope_destroy(b), 0);
    CHECK_EQ(async_scope_destroy(a), 0);
    async_sched_destroy(s);
}

/* Bad arguments and handles: BADHANDLE, INVAL; scopes left at the
 * scheduler's destroy are freed with it (their handles BADHANDLE). */
CASE(scope_bad_args) {
    async_sched_t *s = sched_new(1), *s2 = sched_new(1);
    CHECK_FAIL(async_scope_create(NULL, NULL, -1) == NULL, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_scope_create(s, NULL, -2) == NULL, ASYNC_E_INVAL);
    async_scope_t *a = async_scope_create(s, NULL, -1);
    CHECK(a != NULL);
    CHECK_FAIL(async_scope_create(s2, a, -1) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_scope_create(s, (async_scope_t *)s, -1) == NULL, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_scope_cancel(NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_scope_join((async_scope_t *)s, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_scope_join(a, -2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_scope_destroy(NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_scope_spawn(a, NULL, NULL, 0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_scope_spawn(a, nop_fiber, NULL, 0x100) == NULL, ASYNC_E_INVAL);
    async_scope_t *b = async_scope_create(s, a, 1000);
    async_fiber_t *f = async_scope_spawn(b, nop_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    CHECK_EQ(async_scope_join(a, BOUND_MS), 0);
    CHECK_EQ(async_fiber_join(f, 0), 0); /* joinable ones still need their join */
    async_sched_destroy(s);
    CHECK_FAIL(async_scope_join(a, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_scope_destroy(b) == -1, ASYNC_E_BADHANDLE);
    async_sched_destroy(s2);
}

static async_scope_t *self_scope;
static atomic_int self_rc, self_err;
static void joins_own_scope(void *arg) {
    (void)arg;
    atomic_store(&self_rc, async_scope_join(self_scope, 1000));
    atomic_store(&self_err, async_last_error());
}

/* A fiber joining its own scope (or one above it) fails at once. */
CASE(scope_join_self) {
    async_sched_t *s = sched_new(2);
    async_scope_t *top = async_scope_create(s, NULL, -1);
    self_scope = top;
    async_scope_t *in = async_scope_create(s, top, -1);
    CHECK(async_scope_spawn(in, joins_own_scope, NULL, 0) != NULL);
    CHECK_EQ(async_scope_join(top, BOUND_MS), 0);
    CHECK_EQ(atomic_load(&self_rc), -1);
    CHECK_EQ(atomic_load(&self_err), ASYNC_E_STATE);
    async_sched_destroy(s);
}

/* ---- a parent tears down after its children ---------------------------- */

typedef struct {
    async_scope_t *sc;
    int *shared; /* what the children use; the parent frees it after the join */
    atomic_int children_done, parent_rc, parent_err, freed_early;
    atomic_int kids_in;
} family_t;

static void child_uses_state(void *arg) {
    family_t *fa = arg;
    atomic_fetch_add(&fa->kids_in, 1);
    /* ignores its cancellation for a while: still uses the shared state */
    async_fiber_shield_begin();
    async_fiber_sleep(200);
    async_fiber_shield_end();
    if (fa->shared[0] != 42) atomic_store(&fa->freed_early, 1);
    atomic_fetch_add(&fa->children_done, 1);
}

static void parent_fiber(void *arg) {
    family_t *fa = arg;
    fa->shared = malloc(sizeof(int));
    fa->shared[0] = 42;
    for (int i = 0; i < 4; i++) CHECK(async_scope_spawn(fa->sc, child_uses_state, fa, 0) != NULL);
    while (atomic_load(&fa->kids_in) < 4) async_fiber_yield();
    CHECK_EQ(async_scope_cancel(fa->sc), 0);
    /* this fiber is cancelled meanwhile: the join waits on regardless */
    atomic_store(&fa->parent_rc, async_scope_join(fa->sc, BOUND_MS));
    atomic_store(&fa->parent_err, async_last_error());
    CHECK_EQ(atomic_load(&fa->children_done), 4);
    fa->shared[0] = 0;
    free(fa->shared);
}

/* A cancelled parent fiber joins the scope of its (shielded, slow)
 * children: the join returns only once all returned, so the parent frees
 * their state safely. */
CASE(scope_join_while_cancelled) { // valgrind
    async_sched_t *s = sched_new(2);
    family_t fa;
    memset(&fa, 0, sizeof fa);
    fa.sc = async_scope_create(s, NULL, -1);
    async_fiber_t *p = async_fiber_spawn(s, parent_fiber, &fa, ASYNC_FIBER_JOINABLE);
    wait_count(&fa.kids_in, 4, "children started");
    CHECK_EQ(async_fiber_cancel(p), 0);
    CHECK_EQ(async_fiber_join(p, BOUND_MS), 0);
    CHECK_EQ(atomic_load(&fa.parent_rc), 0);
    CHECK_EQ(atomic_load(&fa.children_done), 4);
    CHECK_EQ(atomic_load(&fa.freed_early), 0);
    CHECK_EQ(async_scope_destroy(fa.sc), 0);
    async_sched_destroy(s);
}

static atomic_int sd_parent_rc, sd_kids_done;
static async_scope_t *sd_scope;
static void sd_kid(void *arg) {
    (void)arg;
    async_fiber_sleep(3600 * 1000); /* ended by the shutdown */
    atomic_fetch_add(&sd_kids_done, 1);
}
static void sd_parent(void *arg) {
    (void)arg;
    for (int i = 0; i < 8; i++) CHECK(async_scope_spawn(sd_scope, sd_kid, NULL, 0) != NULL);
    atomic_store(&sd_parent_rc, async_scope_join(sd_scope, BOUND_MS) == 0 && atomic_load(&sd_kids_done) == 8);
}

/* Shutdown during a scope join: the children are cancelled and return, the
 * join returns 0 (not CANCELLED). */
CASE(scope_join_through_shutdown) {
    async_sched_t *s = sched_new(2);
    sd_scope = async_scope_create(s, NULL, -1);
    spawn_until_parked(s, sd_parent, NULL, 9);
    CHECK_EQ(async_sched_shutdown(s, BOUND_MS), 0);
    CHECK_EQ(atomic_load(&sd_parent_rc), 1);
    async_sched_destroy(s);
}

/* ---- 10k fibers in nested scopes --------------------------------------- */

#define NEST 10
/* TSan counts every fiber that ran as a thread and allows 8128 of them */
#define PER_SCOPE (ASYNC_TEST_TSAN ? 400 : 1000)
static async_chan_t *never_c;
static void parked_on_chan(void *arg) {
    (void)arg;
    int v;
    if (async_chan_recv(never_c, &v, -1) == -1 && async_last_error() == ASYNC_E_CANCELLED)
        atomic_fetch_add(&sc_cancelled, 1);
    else
        atomic_fetch_add(&sc_other, 1);
}

/* 10,000 fibers (4,000 under TSan) parked (sleeps and channel receives) in
 * 10 nested scopes on 16 workers: one cancel of the outermost ends them all, the join sees
 * every one returned. */
CASE(scope_cancel_10k_nested) { // uring stress timeout=300
    async_sched_config_t cfg = {16, 16 * 1024, 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s != NULL);
    never_c = async_chan_create(1, sizeof(int));
    atomic_store(&sc_cancelled, 0);
    async_scope_t *sc[NEST];
    for (int i = 0; i < NEST; i++) CHECK((sc[i] = async_scope_create(s, i ? sc[i - 1] : NULL, -1)) != NULL);
    for (int i = 0; i < NEST; i++)
        for (int k = 0; k < PER_SCOPE; k++)
            CHECK(async_scope_spawn(sc[i], k % 2 ? hour_sleeper : parked_on_chan, NULL, 0) != NULL);
    sched_wait_parked(s, NEST * PER_SCOPE);
    CHECK_EQ(async_scope_cancel(sc[0]), 0);
    CHECK_EQ(async_scope_join(sc[0], 60000), 0);
    CHECK_EQ(atomic_load(&sc_cancelled), NEST * PER_SCOPE);
    CHECK_EQ(atomic_load(&sc_other), 0);
    for (int i = NEST - 1; i >= 0; i--) CHECK_EQ(async_scope_destroy(sc[i]), 0);
    async_chan_destroy(never_c);
    async_sched_destroy(s);
}

/* ---- races with the scheduler's destroy -------------------------------- */

static atomic_int rd_stop;
static _Atomic(async_scope_t *) rd_sc[4];
static void *rd_hammer(void *arg) {
    int id = *(int *)arg;
    unsigned n = 0;
    while (!atomic_load(&rd_stop)) {
        async_scope_t *sc = rd_sc[n++ % 4];
        int rc;
        switch ((n + (unsigned)id) % 4) {
        case 0: rc = async_scope_spawn(sc, hour_sleeper, NULL, 0) ? 0 : -1; break;
        case 1: rc = async_scope_cancel(sc); break;
        case 2: rc = async_scope_join(sc, 1); break;
        default: rc = async_scope_destroy(sc); break;
        }
        int e = async_last_error();
        CHECK(rc == 0 || e == ASYNC_E_BADHANDLE || e == ASYNC_E_TIMEDOUT || e == ASYNC_E_BUSY ||
              e == ASYNC_E_CANCELLED);
    }
    return NULL;
}

/* Spawns, cancels, joins and destroys of scopes from 3 threads racing
 * async_sched_destroy: each call succeeds or fails with its documented
 * error, never a crash (ASan). */
CASE(scope_races_destroy) { // adversarial timeout=120
    for (int round = 0; round < 20; round++) {
        async_sched_t *s = sched_new(4);
        rd_sc[0] = async_scope_create(s, NULL, -1);
        rd_sc[1] = async_scope_create(s, rd_sc[0], 5);
        rd_sc[2] = async_scope_create(s, rd_sc[1], -1);
        rd_sc[3] = async_scope_create(s, NULL, -1);
        atomic_store(&rd_stop, 0);
        pthread_t t[3];
        int ids[3] = {0, 1, 2};
        for (int i = 0; i < 3; i++) start_thread(&t[i], rd_hammer, &ids[i]);
        sleep_ms(2 + round % 5);
        async_sched_destroy(s);
        atomic_store(&rd_stop, 1);
        for (int i = 0; i < 3; i++) join_within(t[i], BOUND_MS, "hammer");
        for (int i = 0; i < 4; i++) CHECK_FAIL(async_scope_cancel(rd_sc[i]) == -1, ASYNC_E_BADHANDLE);
    }
}

/* ---- a cancel racing a growing tree ------------------------------------ */

#define TREE_DEPTH 11
static async_scope_t *tree_scope;
static atomic_int tree_spawned, tree_ended_ok, tree_bad;

static void tree_node(void *arg) {
    uintptr_t depth = (uintptr_t)arg;
    atomic_fetch_add(&tree_spawned, 1);
    if (depth < TREE_DEPTH)
        for (int i = 0; i < 2; i++)
            if (!async_scope_spawn(tree_scope, tree_node, (void *)(depth + 1), 0)) atomic_fetch_add(&tree_bad, 1);
    int rc = async_fiber_sleep(3600 * 1000);
    if (rc == -1 && async_last_error() == ASYNC_E_CANCELLED)
        atomic_fetch_add(&tree_ended_ok, 1);
    else
        atomic_fetch_add(&tree_bad, 1);
}

/* Fibers of a scope spawn two children each into it (4095 in all) while
 * the scope is cancelled from a thread: the spawns made after the cancel
 * start cancelled, the join sees every fiber returned, each cancelled. */
CASE(scope_cancel_races_spawns) { // adversarial timeout=120
    for (int round = 0; round < 5; round++) {
        async_sched_t *s = sched_new(16);
        atomic_store(&tree_spawned, 0);
        atomic_store(&tree_ended_ok, 0);
        tree_scope = async_scope_create(s, NULL, -1);
        CHECK(async_scope_spawn(tree_scope, tree_node, (void *)(uintptr_t)1, 0) != NULL);
        while (atomic_load(&tree_spawned) < 50 * (round + 1)) {
        }
        CHECK_EQ(async_scope_cancel(tree_scope), 0);
        CHECK_EQ(async_scope_join(tree_scope, 60000), 0);
        CHECK_EQ(atomic_load(&tree_spawned), (1 << TREE_DEPTH) - 1);
        CHECK_EQ(atomic_load(&tree_ended_ok), (1 << TREE_DEPTH) - 1);
        CHECK_EQ(atomic_load(&tree_bad), 0);
        CHECK_EQ(async_scope_destroy(tree_scope), 0);
        async_sched_destroy(s);
    }
}

/* Joins from threads and fibers wait on a scope whose last fibers return
 * while its destroy is retried until it succeeds, 300 rounds: each join
 * returns 0 (it saw the scope empty) or ASYNC_E_BADHANDLE (the scope was
 * gone), and nothing touches the freed scope. */
static atomic_int jd_bad, jd_fiber_joins;
static void jd_naps(void *arg) {
    (void)arg;
    async_fiber_sleep(1);
}
static void *jd_join(void *arg) {
    if (async_scope_join(arg, -1) != 0 && async_last_error() != ASYNC_E_BADHANDLE) atomic_fetch_add(&jd_bad, 1);
    return NULL;
}
static void jd_join_fiber(void *arg) {
    jd_join(arg);
    atomic_fetch_add(&jd_fiber_joins, 1);
}

CASE(scope_join_races_scope_destroy) { // adversarial timeout=120
    async_sched_t *s = sched_new(4);
    for (int r = 0; r < 300; r++) {
        async_scope_t *sc = async_scope_create(s, NULL, -1);
        CHECK(sc != NULL);
        for (int i = 0; i < 3; i++) CHECK(async_scope_spawn(sc, jd_naps, NULL, 0) != NULL);
        pthread_t t[2];
        for (int i = 0; i < 2; i++) start_thread(&t[i], jd_join, sc);
        for (int i = 0; i < 2; i++) CHECK(async_fiber_spawn(s, jd_join_fiber, sc, 0) != NULL);
        if (r % 3 == 0) CHECK_EQ(async_scope_cancel(sc), 0);
        while (async_scope_destroy(sc) != 0) {
            CHECK_ERR(ASYNC_E_BUSY);
            sched_yield();
        }
        for (int i = 0; i < 2; i++) join_within(t[i], BOUND_MS, "scope joiner");
    }
    wait_count(&jd_fiber_joins, 600, "fiber joiners");
    CHECK_EQ(atomic_load(&jd_bad), 0);
    sched_finish(s, BOUND_MS);
}

/* A destroyed scope's handle is never issued again: 100,000 scopes created
 * after 1,000 destroyed ones all differ from them, and the old handles
 * stay ASYNC_E_BADHANDLE for every scope call. */
CASE(scope_handles_never_reissued) { // adversarial
    enum { OLD = 1000 };
    static async_scope_t *old[OLD];
    async_sched_t *s = sched_new(1);
    for (int i = 0; i < OLD; i++) {
        CHECK((old[i] = async_scope_create(s, NULL, -1)) != NULL);
        CHECK_EQ(async_scope_destroy(old[i]), 0);
    }
    for (int i = 0; i < 100000; i++) {
        async_scope_t *sc = async_scope_create(s, NULL, -1);
        CHECK(sc != NULL);
        for (int k = 0; k < OLD; k++) CHECK(sc != old[k]);
        CHECK_EQ(async_scope_destroy(sc), 0);
    }
    for (int k = 0; k < OLD; k += 97) {
        CHECK_EQ(async_scope_cancel(old[k]), -1);
        CHECK_ERR(ASYNC_E_BADHANDLE);
        CHECK_EQ(async_scope_join(old[k], 0), -1);
        CHECK_ERR(ASYNC_E_BADHANDLE);
        CHECK(async_scope_spawn(old[k], nop_fiber, NULL, 0) == NULL);
        CHECK_ERR(ASYNC_E_BADHANDLE);
        CHECK(async_scope_create(s, old[k], -1) == NULL);
        CHECK_ERR(ASYNC_E_BADHANDLE);
        CHECK_EQ(async_scope_destroy(old[k]), -1);
        CHECK_ERR(ASYNC_E_BADHANDLE);
    }
    sched_finish(s, BOUND_MS);
}

TEST_MAIN()
