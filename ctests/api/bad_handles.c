/* Bad-handle matrix: every public function that takes a handle, called with
 * NULL, destroyed, bogus and wrong-type handles, fails with
 * ASYNC_E_BADHANDLE (and the documented return value) and never crashes. */
#include "check.h"
#include "rt.h"

#include <pthread.h>
#include <unistd.h>

static int g_pipe[2];

/* --- the three matrices ------------------------------------------------- */

static void queue_matrix(async_queue_t *q, async_runtime_t *good_rt)
{
    int v = 7;
    char buf[16];
    size_t n = 12345;
    async_queue_stats_t st;
    double t0;
    CHECK_FAIL(!async_queue_enqueue(q, &v, sizeof v), ASYNC_E_BADHANDLE);
    CHECK_FAIL(!async_queue_enqueue_wait(q, &v, sizeof v, 0), ASYNC_E_BADHANDLE);
    t0 = now_ms();
    CHECK_FAIL(!async_queue_enqueue_wait(q, &v, sizeof v, -1), ASYNC_E_BADHANDLE); /* does not block */
    CHECK_FAIL(!async_queue_dequeue(q, buf, sizeof buf, &n), ASYNC_E_BADHANDLE);
    CHECK_FAIL(!async_queue_dequeue_wait(q, buf, sizeof buf, &n, 0), ASYNC_E_BADHANDLE);
    CHECK_FAIL(!async_queue_dequeue_wait(q, buf, sizeof buf, &n, -1), ASYNC_E_BADHANDLE);
    CHECK(now_ms() - t0 < 5000);
    CHECK_FAIL(async_queue_is_empty(q) == true, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_queue_is_full(q) == false, ASYNC_E_BADHANDLE);
    async_clear_error();
    async_queue_clear(q);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    memset(&st, 0xAB, sizeof st);
    async_clear_error();
    async_queue_get_stats(q, &st);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    CHECK_QUEUE_STATS(st, 0, 0, 0, 0, 0, 0);
    CHECK_FAIL(async_queue_attach(q, good_rt, 1) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_queue_attach(q, NULL, 0) == -1, ASYNC_E_BADHANDLE);
    async_clear_error();
    async_queue_destroy(q);
    CHECK_ERR(ASYNC_E_BADHANDLE);
}

static void worker_matrix(async_worker_t *w)
{
    double t0 = now_ms();
    CHECK_FAIL(!async_worker_join(w, 0), ASYNC_E_BADHANDLE);
    CHECK_FAIL(!async_worker_join(w, 50), ASYNC_E_BADHANDLE);
    CHECK_FAIL(!async_worker_join(w, -1), ASYNC_E_BADHANDLE); /* does not block */
    CHECK(now_ms() - t0 < 5000);
    CHECK_FAIL(async_worker_should_stop(w) == true, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_worker_get_state(w) == ASYNC_WORKER_STOPPED, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_worker_result(w) == NULL, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_worker_stop_fd(w) == -1, ASYNC_E_BADHANDLE);
    {
        pthread_t t, zero;
        memset(&t, 0x5A, sizeof t);
        memset(&zero, 0, sizeof zero);
        async_clear_error();
        t = async_worker_get_native_handle(w);
        CHECK_ERR(ASYNC_E_BADHANDLE);
        CHECK(memcmp(&t, &zero, sizeof t) == 0);
    }
    async_clear_error();
    async_worker_signal_stop(w);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    async_clear_error();
    async_worker_destroy(w);
    CHECK_ERR(ASYNC_E_BADHANDLE);
}

static void runtime_matrix(async_runtime_t *rt)
{
    io_event_t ev[4];
    double t0 = now_ms();
    CHECK_FAIL(async_runtime_add(rt, g_pipe[0], ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_modify(rt, g_pipe[0], ASYNC_EVENT_READ) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_remove(rt, g_pipe[0]) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_wait(rt, ev, 4, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_wait(rt, ev, 4, 50) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_wait(rt, ev, 4, -1) == -1, ASYNC_E_BADHANDLE); /* does not block */
    CHECK(now_ms() - t0 < 5000);
    CHECK_FAIL(async_runtime_post_completion(rt, 1, 2) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_wakeup(rt) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_add_timer(rt, 10, 0, 1) == 0, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_cancel_timer(rt, 1) == -1, ASYNC_E_BADHANDLE);
    async_clear_error();
    async_runtime_deinit(rt);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    /* attaching a good queue to a bad runtime (NULL means detach: valid) */
    if (rt != NULL) {
        async_queue_t *q = async_queue_create(2, 2, ASYNC_QUEUE_SIGNAL_ON_DATA);
        CHECK(q != NULL);
        CHECK_FAIL(async_queue_attach(q, rt, 1) == -1, ASYNC_E_BADHANDLE);
        CHECK(async_queue_enqueue(q, "x", 1)); /* the queue is unaffected */
        async_queue_destroy(q);
    }
}

/* --- live objects that must survive the bad calls ------------------------ */

typedef struct {
    async_queue_t *q;
    async_worker_t *w;
    async_runtime_t *rt;
} live_t;

static void live_make(live_t *l)
{
    CHECK(pipe(g_pipe) == 0);
    l->q = async_queue_create(4, 16, ASYNC_QUEUE_SIGNAL_ON_DATA);
    l->rt = async_runtime_init();
    l->w = async_worker_create(run_until_stopped, (void *)(uintptr_t)0x77, 0);
    CHECK(l->q && l->rt && l->w);
}

/* The good objects still work after all the bad calls, then go away. */
static void live_check_and_free(live_t *l)
{
    io_event_t ev[4];
    int v = 5, n, got = 0;
    double t0 = now_ms();
    CHECK(async_queue_enqueue(l->q, &v, sizeof v));
    CHECK_EQ(async_queue_attach(l->q, l->rt, 3), 0);
    CHECK_EQ(async_runtime_post_completion(l->rt, 4, 4), 0);
    while (got < 2 && now_ms() - t0 < 10000) {
        n = async_runtime_wait(l->rt, ev, 4, 100);
        CHECK(n >= 0);
        got += n;
    }
    CHECK_EQ(got, 2);
    CHECK_EQ(async_runtime_wait(l->rt, ev, 4, 0), 0);
    v = 0;
    CHECK(async_queue_dequeue(l->q, &v, sizeof v, NULL));
    CHECK_EQ(v, 5);
    CHECK_EQ(async_worker_get_state(l->w), ASYNC_WORKER_RUNNING);
    async_worker_signal_stop(l->w);
    CHECK(async_worker_join(l->w, 10000));
    CHECK(async_worker_result(l->w) == (void *)(uintptr_t)0x77);
    async_worker_destroy(l->w);
    async_queue_destroy(l->q);
    async_runtime_deinit(l->rt);
    close_pair(g_pipe);
}

/* ---------------------------------------------------------------------- */

CASE(bad_handle_null)
{
    live_t l;
    live_make(&l);
    queue_matrix(NULL, l.rt);
    worker_matrix(NULL);
    runtime_matrix(NULL);
    live_check_and_free(&l);
}

static void *quick_proc(void *ctx)
{
    return ctx;
}

CASE(bad_handle_destroyed)
{
    live_t l;
    async_queue_t *q = async_queue_create(4, 16, ASYNC_QUEUE_SIGNAL_ON_DATA);
    async_runtime_t *rt = async_runtime_init();
    async_worker_t *w = async_worker_create(quick_proc, NULL, 0);
    CHECK(q && rt && w);
    CHECK(async_worker_join(w, 10000));
    async_queue_destroy(q);
    async_runtime_deinit(rt);
    async_worker_destroy(w);
    live_make(&l);
    queue_matrix(q, l.rt);
    worker_matrix(w);
    runtime_matrix(rt);
    live_check_and_free(&l);
}

CASE(bad_handle_destroyed_reuse)
{
    /* a destroyed handle stays invalid after new objects are created */
    async_queue_t *q1, *q2;
    async_runtime_t *r1, *r2;
    async_worker_t *w1, *w2;
    q1 = async_queue_create(2, 2, (async_queue_flags_t)0);
    CHECK(q1 != NULL);
    async_queue_destroy(q1);
    q2 = async_queue_create(2, 2, (async_queue_flags_t)0);
    CHECK(q2 != NULL);
    CHECK(q2 != q1);
    CHECK_FAIL(!async_queue_enqueue(q1, "a", 1), ASYNC_E_BADHANDLE);
    CHECK(async_queue_is_empty(q2));
    r1 = async_runtime_init();
    CHECK(r1 != NULL);
    async_runtime_deinit(r1);
    r2 = async_runtime_init();
    CHECK(r2 != NULL);
    CHECK(r2 != r1);
    CHECK_FAIL(async_runtime_post_completion(r1, 1, 1) == -1, ASYNC_E_BADHANDLE);
    w1 = async_worker_create(quick_proc, NULL, 0);
    CHECK(w1 != NULL);
    CHECK(async_worker_join(w1, 10000));
    async_worker_destroy(w1);
    w2 = async_worker_create(quick_proc, NULL, 0);
    CHECK(w2 != NULL);
    CHECK(w2 != w1);
    CHECK_FAIL(async_worker_stop_fd(w1) == -1, ASYNC_E_BADHANDLE);
    CHECK(async_worker_join(w2, 10000));
    async_worker_destroy(w2);
    async_queue_destroy(q2);
    async_runtime_deinit(r2);
}

CASE(bad_handle_bogus)
{
    live_t l;
    uintptr_t vals[] = {0x12345678, 1, 8, 0xFFFF, (uintptr_t)-1, (uintptr_t)-4096, (uintptr_t)0xDEADBEEF00ull};
    size_t i;
    live_make(&l);
    for (i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        queue_matrix((async_queue_t *)vals[i], l.rt);
        worker_matrix((async_worker_t *)vals[i]);
        runtime_matrix((async_runtime_t *)vals[i]);
    }
    live_check_and_free(&l);
}

CASE(bad_handle_stack_pointer)
{
    live_t l;
    uint64_t junk[64];
    memset(junk, 0x5A, sizeof junk);
    live_make(&l);
    queue_matrix((async_queue_t *)(void *)junk, l.rt);
    worker_matrix((async_worker_t *)(void *)junk);
    runtime_matrix((async_runtime_t *)(void *)junk);
    /* heap memory too */
    {
        void *heap = calloc(1, 256);
        CHECK(heap != NULL);
        queue_matrix((async_queue_t *)heap, l.rt);
        worker_matrix((async_worker_t *)heap);
        runtime_matrix((async_runtime_t *)heap);
        free(heap);
    }
    live_check_and_free(&l);
}

/* The live objects are all still valid after `what`. */
static void live_intact(const live_t *l, const char *what)
{
    async_queue_stats_t st;
    uint64_t id;
    async_queue_get_stats(l->q, &st);
    if (st.capacity != 4)
        fprintf(stderr, "the live queue was destroyed by %s\n", what);
    CHECK_EQ(st.capacity, 4);
    if (async_worker_get_state(l->w) != ASYNC_WORKER_RUNNING)
        fprintf(stderr, "the live worker was destroyed by %s\n", what);
    CHECK_EQ(async_worker_get_state(l->w), ASYNC_WORKER_RUNNING);
    id = async_runtime_add_timer(l->rt, 60000, 0, 1);
    if (id == 0)
        fprintf(stderr, "the live runtime was destroyed by %s\n", what);
    CHECK(id != 0);
    CHECK_EQ(async_runtime_cancel_timer(l->rt, id), 0);
}

CASE(bad_handle_wrong_type)
{
    /* a live handle of one type passed where another type is expected */
    live_t l;
    live_make(&l);
    queue_matrix((async_queue_t *)(void *)l.rt, l.rt);
    live_intact(&l, "the queue functions given the runtime handle");
    queue_matrix((async_queue_t *)(void *)l.w, l.rt);
    live_intact(&l, "the queue functions given the worker handle");
    worker_matrix((async_worker_t *)(void *)l.q);
    live_intact(&l, "the worker functions given the queue handle");
    worker_matrix((async_worker_t *)(void *)l.rt);
    live_intact(&l, "the worker functions given the runtime handle");
    runtime_matrix((async_runtime_t *)(void *)l.q);
    live_intact(&l, "the runtime functions given the queue handle");
    runtime_matrix((async_runtime_t *)(void *)l.w);
    live_intact(&l, "the runtime functions given the worker handle");
    /* the objects used as wrong types were not touched */
    live_check_and_free(&l);
}

TEST_MAIN()
