/* Fiber-local storage (async_fiber_key_t): values follow their fiber across
 * workers, destructors run once per non-NULL value when a fiber or thread
 * ends (also destructors that set values again, or that yield, sleep,
 * spawn, join and name fibers: bounded rounds), a value set under a deleted
 * key never shows under a later key, and bad input. */
#include <pthread.h>
#include <stdatomic.h>

#include "fibers.h"

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

CASE(fls_migrate) {
    CHECK_EQ(async_fiber_key_create(&g_key, count_dtor), 0);
    async_sched_t *s = sched_new(4);
    CHECK_EQ(async_fiber_setspecific(g_key, (void *)&g_key), 0); /* the main thread's */
    for (intptr_t i = 0; i < FLS_FIBERS; i++) CHECK(async_fiber_spawn(s, fls_fiber, (void *)i, 0) != NULL);
    pthread_t t;
    start_thread(&t, fls_thread, (void *)&t);
    CHECK_EQ(async_sched_run(s), 0);
    join_within(t, BOUND_MS, "fls_thread"); /* its exit runs the destructor once */
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

CASE(fls_destructors) {
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
            CHECK_EQ(async_fiber_join(f[0], BOUND_MS), 0);
            f[0] = NULL;
            CHECK_EQ(atomic_load(&g_calls[0]), 2); /* ran (twice: it set again) before join returned */
        }
    }
    for (int i = 0; i < DT_FIBERS; i++) {
        if (!f[i]) continue;
        CHECK_EQ(async_fiber_join(f[i], BOUND_MS), 0);
        CHECK_EQ(atomic_load(&g_calls[i]), i % 3 == 0 ? 2 : 1); /* before join returned */
    }
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&g_dtor_calls), DT_FIBERS); /* key2: one each */
    /* a key deleted while fibers hold values of it: no destructor for them */
    for (int i = 0; i < 20; i++) CHECK(async_fiber_spawn(s, dead_fiber, NULL, 0) != NULL);
    wait_count_within(&g_dead_set, 20, 30000, "dead key values set");
    CHECK_EQ(async_fiber_key_delete(g_dead_key), 0);
    atomic_store(&g_deleted, 1);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&g_dead_calls), 0);
    CHECK_EQ(atomic_load(&g_dtor_wrong), 0);
    async_sched_destroy(s);
    CHECK_EQ(async_fiber_key_delete(g_key), 0);
    CHECK_EQ(async_fiber_key_delete(g_key2), 0);
}

CASE(fls_badinput) {
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

/* ---- keys reused ------------------------------------------------------ */

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

CASE(fls_key_reuse) // adversarial
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

/* ---- destructors that use the API ----------------------------------- */

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

CASE(fls_destructor_api) // adversarial
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

TEST_MAIN()
