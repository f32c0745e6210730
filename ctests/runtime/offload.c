/* async_runtime_submit_work / async_runtime_cancel_work: every item's result
 * comes back as one completion (key and data intact, exactly once); an item
 * cancelled before it started never runs and sends nothing; a cancel racing
 * the start has exactly one outcome; a runtime deinitialised meanwhile gets
 * nothing, and each of its items is either run or dropped (drop called once,
 * telling which); the pool runs at most 64 items at once and at most
 * ASYNC_WORK_MAX_QUEUED wait for a thread. Bad arguments get their errors. */
#include "check.h"
#include "rt.h"

#include <pthread.h>
#include <stdatomic.h>

#define POOL_THREADS 64 /* async.h: the pool's size */

/* Collects completions of rt until `want` came or bound_ms passed; counts
 * each key (an index below nkeys) in seen[], checks data == data_of(key). */
static int collect(async_runtime_t *rt, int want, int bound_ms, _Atomic int *seen, int nkeys,
                   uintptr_t (*data_of)(uintptr_t))
{
    io_event_t ev[256];
    int got = 0, i, n;
    double t0 = now_ms();
    while (got < want && now_ms() - t0 < bound_ms) {
        n = async_runtime_wait(rt, ev, 256, 100);
        CHECK(n >= 0);
        for (i = 0; i < n; i++) {
            CHECK_EQ(ev[i].event_type, ASYNC_EVENT_COMPLETION);
            CHECK_EQ(ev[i].fd, -1);
            CHECK(ev[i].completion_key < (uintptr_t)nkeys);
            CHECK_EQ(ev[i].data, data_of(ev[i].completion_key));
            atomic_fetch_add(&seen[ev[i].completion_key], 1);
            got++;
        }
    }
    return got;
}

/* ---- exactly once ---------------------------------------------------------- */

static uintptr_t twice_plus_one(void *arg)
{
    return (uintptr_t)arg * 2 + 1;
}

static uintptr_t data_twice_plus_one(uintptr_t key)
{
    return key * 2 + 1;
}

#define ONCE_ITEMS 5000

CASE(work_delivered_once) // poll
{
    static _Atomic int seen[ONCE_ITEMS];
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    uint64_t id, last = 0;
    int i;
    for (i = 0; i < ONCE_ITEMS; i++) {
        id = async_runtime_submit_work(rt, twice_plus_one, (void *)(uintptr_t)i, (uintptr_t)i, NULL);
        CHECK(id != 0);
        CHECK(id > last); /* never reused */
        last = id;
    }
    CHECK_EQ(collect(rt, ONCE_ITEMS, 60000, seen, ONCE_ITEMS, data_twice_plus_one), ONCE_ITEMS);
    for (i = 0; i < ONCE_ITEMS; i++) CHECK_EQ(atomic_load(&seen[i]), 1);
    /* nothing more comes, and a finished item cannot be cancelled */
    CHECK_EQ(async_runtime_wait(rt, ev, 4, 50), 0);
    CHECK_FAIL(async_runtime_cancel_work(rt, last) == -1, ASYNC_E_NOTFOUND);
    async_runtime_deinit(rt);
}

/* The result is posted after everything fn posted itself (same thread). */
static async_runtime_t *g_order_rt;

static uintptr_t post_then_return(void *arg)
{
    CHECK_EQ(async_runtime_post_completion(g_order_rt, 1, (uintptr_t)arg), 0);
    return (uintptr_t)arg;
}

CASE(work_result_after_own_posts) // poll
{
    io_event_t ev[2];
    int i, n, got = 0;
    g_order_rt = mkrt();
    for (i = 0; i < 200; i++) {
        CHECK(async_runtime_submit_work(g_order_rt, post_then_return, (void *)(uintptr_t)i, 2, NULL) != 0);
        got = 0;
        while (got < 2) {
            n = async_runtime_wait(g_order_rt, ev + got, 2 - got, 10000);
            CHECK(n > 0);
            got += n;
        }
        CHECK_EQ(ev[0].completion_key, 1);
        CHECK_EQ(ev[1].completion_key, 2);
        CHECK_EQ(ev[0].data, (uintptr_t)i);
        CHECK_EQ(ev[1].data, (uintptr_t)i);
    }
    async_runtime_deinit(g_order_rt);
}

/* ---- a gate that holds pool threads ---------------------------------------- */

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_open;
static atomic_int gate_started, gate_ran;

static uintptr_t gated(void *arg)
{
    atomic_fetch_add(&gate_started, 1);
    pthread_mutex_lock(&gate_mu);
    while (!gate_open) pthread_cond_wait(&gate_cv, &gate_mu);
    pthread_mutex_unlock(&gate_mu);
    atomic_fetch_add(&gate_ran, 1);
    return (uintptr_t)arg;
}

static void gate_set(int open)
{
    pthread_mutex_lock(&gate_mu);
    gate_open = open;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

static uintptr_t data_is_key(uintptr_t key)
{
    return key;
}

/* Returns once every item submitted before has finished (its post or drop
 * included): the pool's 64 threads all run items submitted after them. */
static void pool_barrier(void)
{
    static _Atomic int seen[POOL_THREADS];
    async_runtime_t *rt = mkrt();
    int i;
    gate_set(0);
    atomic_store(&gate_started, 0);
    for (i = 0; i < POOL_THREADS; i++) {
        atomic_store(&seen[i], 0);
        CHECK(async_runtime_submit_work(rt, gated, (void *)(uintptr_t)i, (uintptr_t)i, NULL) != 0);
    }
    wait_count_within(&gate_started, POOL_THREADS, 60000, "barrier items started");
    gate_set(1);
    CHECK_EQ(collect(rt, POOL_THREADS, 60000, seen, POOL_THREADS, data_is_key), POOL_THREADS);
    async_runtime_deinit(rt);
}

/* ---- cancellation ------------------------------------------------------------ */

CASE(work_cancel_queued) // poll
{
    static _Atomic int seen[POOL_THREADS + 10];
    async_runtime_t *rt = mkrt(), *other = mkrt();
    uint64_t ids[10], running;
    io_event_t ev[4];
    int i;
    gate_set(0);
    atomic_store(&gate_started, 0);
    atomic_store(&gate_ran, 0);
    /* every pool thread held: what comes after waits in the queue */
    running = 0;
    for (i = 0; i < POOL_THREADS; i++) {
        running = async_runtime_submit_work(rt, gated, (void *)(uintptr_t)i, (uintptr_t)i, NULL);
        CHECK(running != 0);
    }
    wait_count_within(&gate_started, POOL_THREADS, 30000, "gated items started");
    for (i = 0; i < 10; i++) {
        ids[i] = async_runtime_submit_work(rt, gated, (void *)(uintptr_t)(POOL_THREADS + i),
                                           (uintptr_t)(POOL_THREADS + i), NULL);
        CHECK(ids[i] != 0);
    }
    /* a started item cannot be cancelled; nor an item of another runtime */
    CHECK_FAIL(async_runtime_cancel_work(rt, running) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_cancel_work(other, ids[0]) == -1, ASYNC_E_NOTFOUND);
    /* the even ones are cancelled, once */
    for (i = 0; i < 10; i += 2) CHECK_EQ(async_runtime_cancel_work(rt, ids[i]), 0);
    for (i = 0; i < 10; i += 2) CHECK_FAIL(async_runtime_cancel_work(rt, ids[i]) == -1, ASYNC_E_NOTFOUND);
    CHECK_EQ(atomic_load(&gate_started), POOL_THREADS);
    gate_set(1);
    CHECK_EQ(collect(rt, POOL_THREADS + 5, 60000, seen, POOL_THREADS + 10, data_is_key), POOL_THREADS + 5);
    CHECK_EQ(async_runtime_wait(rt, ev, 4, 50), 0);
    for (i = 0; i < POOL_THREADS + 10; i++)
        CHECK_EQ(atomic_load(&seen[i]), i < POOL_THREADS || (i - POOL_THREADS) % 2 ? 1 : 0);
    CHECK_EQ(atomic_load(&gate_ran), POOL_THREADS + 5); /* the cancelled ones never ran */
    CHECK_EQ(async_runtime_wait(other, ev, 4, 0), 0);
    async_runtime_deinit(other);
    async_runtime_deinit(rt);
}

static atomic_int race_ran;

static uintptr_t count_run(void *arg)
{
    atomic_fetch_add(&race_ran, 1);
    return (uintptr_t)arg;
}

#define RACE_ROUNDS 3000

/* Submit, then cancel at once, while the pool is idle: the cancel meets the
 * item queued, being taken, or running. Cancelled: it never ran and nothing
 * comes; not cancelled: its completion comes once. */
CASE(work_cancel_racing_start) // poll adversarial
{
    static _Atomic int seen[RACE_ROUNDS];
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int i, cancelled = 0, rc;
    uint64_t id;
    atomic_store(&race_ran, 0);
    for (i = 0; i < RACE_ROUNDS; i++) {
        id = async_runtime_submit_work(rt, count_run, (void *)(uintptr_t)i, (uintptr_t)i, NULL);
        CHECK(id != 0);
        if (i % 7 == 3) sleep_us(i % 50); /* vary where the cancel lands */
        rc = async_runtime_cancel_work(rt, id);
        if (rc == 0) {
            cancelled++;
            atomic_store(&seen[i], 100); /* must stay: no completion */
        } else {
            CHECK_ERR(ASYNC_E_NOTFOUND);
        }
    }
    CHECK_EQ(collect(rt, RACE_ROUNDS - cancelled, 60000, seen, RACE_ROUNDS, data_is_key), RACE_ROUNDS - cancelled);
    CHECK_EQ(async_runtime_wait(rt, ev, 4, 50), 0);
    for (i = 0; i < RACE_ROUNDS; i++) CHECK(atomic_load(&seen[i]) == 1 || atomic_load(&seen[i]) == 100);
    CHECK_EQ(atomic_load(&race_ran), RACE_ROUNDS - cancelled);
    printf("%d of %d cancelled before they started\n", cancelled, RACE_ROUNDS);
    async_runtime_deinit(rt);
}

/* ---- deinit meanwhile ------------------------------------------------------ */

#define DEINIT_ITEMS 400

typedef struct {
    _Atomic int ran;     /* fn returned */
    _Atomic int dropped; /* drop calls */
    _Atomic int drop_ran;
    _Atomic int delivered;
    _Atomic int done; /* ran or dropped unrun */
} item_t;

static item_t items[DEINIT_ITEMS];

static uintptr_t item_run(void *arg)
{
    item_t *it = arg;
    int k = (int)(it - items);
    if (k % 5 == 0) sleep_us(200);
    atomic_fetch_add(&it->ran, 1);
    return (uintptr_t)k;
}

static void item_drop(void *arg, uintptr_t result, int ran)
{
    item_t *it = arg;
    int k = (int)(it - items);
    atomic_fetch_add(&it->dropped, 1);
    atomic_store(&it->drop_ran, ran);
    CHECK_EQ(result, ran ? (uintptr_t)k : 0);
    CHECK_EQ(atomic_load(&it->ran), ran);
}

/* Rounds of: submit, take some completions, deinit with items queued and
 * running; then every item either ran (and was delivered, or posted into
 * the closed runtime, or dropped with ran 1) or was dropped unrun, exactly
 * one of those, and a delivered one was never dropped. */
CASE(work_deinit_racing) // poll adversarial timeout=120
{
    int round, i, k, n, unrun = 0, late = 0, delivered = 0;
    io_event_t ev[64];
    for (round = 0; round < 20; round++) {
        async_runtime_t *rt = mkrt();
        memset(items, 0, sizeof items);
        for (i = 0; i < DEINIT_ITEMS; i++)
            CHECK(async_runtime_submit_work(rt, item_run, &items[i], (uintptr_t)i, item_drop) != 0);
        for (k = 0; k < round % 4; k++) {
            n = async_runtime_wait(rt, ev, 64, 1);
            CHECK(n >= 0);
            for (i = 0; i < n; i++) {
                CHECK(ev[i].completion_key < DEINIT_ITEMS);
                CHECK_EQ(ev[i].data, ev[i].completion_key);
                atomic_fetch_add(&items[ev[i].completion_key].delivered, 1);
            }
        }
        async_runtime_deinit(rt);
        /* every item settles: ran, or dropped unrun */
        double t0 = now_ms();
        for (i = 0; i < DEINIT_ITEMS; i++) {
            while (!atomic_load(&items[i].ran) && !atomic_load(&items[i].dropped)) {
                CHECK(now_ms() - t0 < 60000);
                sleep_us(200);
            }
        }
        pool_barrier(); /* and every drop after a late run has returned */
        for (i = 0; i < DEINIT_ITEMS; i++) {
            item_t *it = &items[i];
            CHECK(atomic_load(&it->dropped) <= 1);
            CHECK(atomic_load(&it->ran) <= 1);
            CHECK(atomic_load(&it->delivered) <= 1);
            if (atomic_load(&it->delivered)) CHECK_EQ(atomic_load(&it->dropped), 0);
            if (!atomic_load(&it->ran)) CHECK(atomic_load(&it->dropped) == 1 && atomic_load(&it->drop_ran) == 0);
            unrun += !atomic_load(&it->ran);
            late += atomic_load(&it->dropped) && atomic_load(&it->drop_ran);
            delivered += atomic_load(&it->delivered);
        }
    }
    printf("%d delivered, %d dropped unrun, %d dropped after running\n", delivered, unrun, late);
}

/* ---- the pool full ----------------------------------------------------------- */

CASE(work_pool_full) // timeout=180
{
    static _Atomic int seen[POOL_THREADS + ASYNC_WORK_MAX_QUEUED + 1];
    const int total = POOL_THREADS + ASYNC_WORK_MAX_QUEUED;
    async_runtime_t *rt = mkrt();
    uint64_t id, first_queued = 0;
    io_event_t ev[4];
    int i;
    gate_set(0);
    atomic_store(&gate_started, 0);
    atomic_store(&gate_ran, 0);
    for (i = 0; i < POOL_THREADS; i++)
        CHECK(async_runtime_submit_work(rt, gated, (void *)(uintptr_t)i, (uintptr_t)i, NULL) != 0);
    wait_count_within(&gate_started, POOL_THREADS, 30000, "gated items started");
    for (i = POOL_THREADS; i < total; i++) {
        id = async_runtime_submit_work(rt, gated, (void *)(uintptr_t)i, (uintptr_t)i, NULL);
        CHECK(id != 0);
        if (!first_queued) first_queued = id;
    }
    /* the queue is full; the pool did not grow past its size */
    CHECK_FAIL(async_runtime_submit_work(rt, gated, NULL, 0, NULL) == 0, ASYNC_E_FULL);
    CHECK_EQ(atomic_load(&gate_started), POOL_THREADS);
    /* a cancel makes room for one */
    CHECK_EQ(async_runtime_cancel_work(rt, first_queued), 0);
    CHECK(async_runtime_submit_work(rt, gated, (void *)(uintptr_t)total, (uintptr_t)total, NULL) != 0);
    CHECK_FAIL(async_runtime_submit_work(rt, gated, NULL, 0, NULL) == 0, ASYNC_E_FULL);
    gate_set(1);
    CHECK_EQ(collect(rt, total, 120000, seen, total + 1, data_is_key), total);
    CHECK_EQ(async_runtime_wait(rt, ev, 4, 50), 0);
    for (i = 0; i <= total; i++) CHECK_EQ(atomic_load(&seen[i]), i == POOL_THREADS ? 0 : 1);
    async_runtime_deinit(rt);
}

/* ---- bad arguments ------------------------------------------------------------ */

CASE(work_bad_args) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[2];
    uint64_t id;
    CHECK_FAIL(async_runtime_submit_work(rt, NULL, NULL, 1, NULL) == 0, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_submit_work(NULL, count_run, NULL, 1, NULL) == 0, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_submit_work((async_runtime_t *)(uintptr_t)0x77, count_run, NULL, 1, NULL) == 0,
               ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_cancel_work(NULL, 1) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_cancel_work(rt, 0) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_cancel_work(rt, UINT64_MAX) == -1, ASYNC_E_NOTFOUND);
    id = async_runtime_submit_work(rt, count_run, (void *)(uintptr_t)9, 9, NULL);
    CHECK(id != 0);
    CHECK_EQ(async_runtime_wait(rt, ev, 2, 10000), 1);
    CHECK_EQ(ev[0].completion_key, 9);
    CHECK_FAIL(async_runtime_cancel_work(rt, id) == -1, ASYNC_E_NOTFOUND);
    async_runtime_deinit(rt);
    CHECK_FAIL(async_runtime_submit_work(rt, count_run, NULL, 1, NULL) == 0, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_cancel_work(rt, id) == -1, ASYNC_E_BADHANDLE);
}

TEST_MAIN()
