/* Workers whose proc does not return: one that ends by pthread_exit or by
 * cancellation is STOPPED with a NULL result; procs that ignore the stop
 * request (blocked in read(2), in a queue or runtime wait, or spinning on
 * timer calls) time their joiners out, stay STOPPING, are destroyed at once,
 * wake when their queue or runtime goes, and the process still exits
 * cleanly with some of them running. */
#include "check.h"
#include "rt.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

/* ---- workers that end without returning ----------------------------------- */

static int fd_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

/* Worker calls are C and do not wait for the Go runtime, which starts in the
 * background when the library loads and opens descriptors of its own (its
 * poller): one of them could take a stop descriptor's number just after it
 * is closed. A runtime call waits for that start; make one first. */
static void go_started(void) {
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    async_runtime_deinit(rt);
}

/* Joins w (bounded), checks it is STOPPED with a NULL result, destroys it and
 * waits (bounded) for its stop descriptor to be closed. */
static void finish_worker(async_worker_t *w) {
    int fd = async_worker_stop_fd(w);
    CHECK(fd >= 0);
    CHECK(async_worker_join(w, 10000));
    CHECK_EQ(async_worker_get_state(w), ASYNC_WORKER_STOPPED);
    async_clear_error();
    CHECK(async_worker_result(w) == NULL);
    CHECK_ERR(ASYNC_OK);
    async_worker_destroy(w);
    double t0 = now_ms();
    while (fd_open(fd)) {
        if (now_ms() - t0 > 10000) {
            fprintf(stderr, "the stop descriptor %d is still open 10 s after destroy\n", fd);
            CHECK(!fd_open(fd));
        }
        sleep_ms(1);
    }
}

static void *exits(void *ctx) {
    (void)ctx;
    pthread_exit((void *)7);
    return NULL;
}

CASE(worker_pthread_exit) {
    go_started();
    for (int i = 0; i < 3; i++) {
        async_worker_t *w = async_worker_create(exits, NULL, 0);
        CHECK(w != NULL);
        finish_worker(w);
    }
}

static atomic_int spinning;

static void *waits_for_cancel(void *ctx) {
    (void)ctx;
    atomic_store(&spinning, 1);
    for (;;) {
        pthread_testcancel();
        /* Under TSan the cancel acts in pthread_testcancel only: a thread
         * cancelled inside a call TSan intercepts (nanosleep) leaves that
         * interceptor's state behind, and TSan then misses the locks of
         * the worker's cleanup (false races). */
        if (ASYNC_TEST_TSAN)
            sched_yield();
        else
            sleep_ms(1);
    }
    return NULL;
}

CASE(worker_cancel) {
    go_started();
    atomic_store(&spinning, 0);
    async_worker_t *w = async_worker_create(waits_for_cancel, NULL, 0);
    CHECK(w != NULL);
    double t0 = now_ms();
    while (!atomic_load(&spinning)) {
        CHECK(now_ms() - t0 < 10000);
        sleep_ms(1);
    }
    CHECK_EQ(pthread_cancel(async_worker_get_native_handle(w)), 0);
    finish_worker(w);
}

/* --- a worker that never stops ----------------------------------------- */
/*
 * Procs that ignore the stop request: one blocked in read(2) forever, one
 * blocked in async_queue_dequeue_wait(-1), one in async_runtime_wait(-1),
 * one spinning on add_timer/cancel_timer on another runtime. Checked: join
 * times out (TIMEDOUT, also for a second joiner), state stays STOPPING,
 * destroy returns at once and invalidates the handle; destroying the queue /
 * runtime they block in wakes those two (CLOSED) and after its runtime's
 * deinit the spinner gets BADHANDLE on every call; the library keeps
 * working; and the process exits cleanly with the read(2) proc and the
 * spinner still running.
 */

static int g_never_pipe[2];
static async_queue_t *g_never_q;
static async_runtime_t *g_never_rt, *g_never_rt2;
static atomic_int g_never_qerr, g_never_rterr, g_never_badposts, g_never_started;

static void *never_read(void *ctx)
{
    char c;
    (void)ctx;
    atomic_fetch_add(&g_never_started, 1);
    for (;;)
        if (read(g_never_pipe[0], &c, 1) == 0)
            sleep_ms(1000);
    return NULL;
}

static void *never_queue(void *ctx)
{
    uint64_t v;
    (void)ctx;
    atomic_fetch_add(&g_never_started, 1);
    /* The stop ends this wait (ASYNC_E_CANCELLED: a worker's own queue waits
     * are stoppable, worker/stop.c); the proc still ignores it. */
    while (async_queue_dequeue_wait(g_never_q, &v, sizeof v, NULL, -1)) {
    }
    atomic_store(&g_never_qerr, async_last_error());
    for (;;)
        sleep_ms(1000); /* and still never returns */
    return NULL;
}

static void *never_wait(void *ctx)
{
    io_event_t ev[4];
    (void)ctx;
    atomic_fetch_add(&g_never_started, 1);
    for (;;) {
        if (async_runtime_wait(g_never_rt, ev, 4, -1) >= 0)
            continue;
        if (async_last_error() != ASYNC_E_BUSY)
            break;
        sleep_ms(1); /* lost a race with the main thread's probe: again */
    }
    atomic_store(&g_never_rterr, async_last_error());
    for (;;)
        sleep_ms(1000);
    return NULL;
}

static void *never_post(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&g_never_started, 1);
    for (;;) {
        uint64_t id = async_runtime_add_timer(g_never_rt2, 1000000, 0, 1);
        if (id == 0 || async_runtime_cancel_timer(g_never_rt2, id) != 0) {
            CHECK(async_last_error() == ASYNC_E_BADHANDLE || async_last_error() == ASYNC_E_CLOSED);
            atomic_fetch_add(&g_never_badposts, 1);
        }
        sched_yield();
    }
    return NULL;
}

static void *joiner(void *w)
{
    double t0 = now_ms();
    bool ok = async_worker_join((async_worker_t *)w, 300);
    CHECK(!ok);
    /* the worker may be destroyed meanwhile: either error is fine, no crash, no hang */
    CHECK(async_last_error() == ASYNC_E_TIMEDOUT || async_last_error() == ASYNC_E_BADHANDLE);
    CHECK(now_ms() - t0 < 10000);
    return NULL;
}

CASE(worker_never_stops)
{
    void *(*procs[4])(void *) = {never_read, never_queue, never_wait, never_post};
    async_worker_t *w[4];
    pthread_t jt;
    double t0;
    int i;
    CHECK(pipe(g_never_pipe) == 0);
    g_never_q = async_queue_create(4, sizeof(uint64_t), (async_queue_flags_t)0);
    g_never_rt = mkrt();
    g_never_rt2 = mkrt();
    CHECK(g_never_q != NULL);
    for (i = 0; i < 4; i++) {
        w[i] = async_worker_create(procs[i], NULL, 0);
        CHECK(w[i] != NULL);
    }
    /* let them block: all four procs began, and the runtime waiter is inside
     * its wait (a wait of ours fails with BUSY); the queue reader has the
     * joins below (> 400 ms) to reach its call before the queue goes away */
    t0 = now_ms();
    while (atomic_load(&g_never_started) < 4) {
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(1);
    }
    for (;;) {
        io_event_t ev[1];
        int n = async_runtime_wait(g_never_rt, ev, 1, 0);
        if (n == -1 && async_last_error() == ASYNC_E_BUSY)
            break;
        CHECK_EQ(n, 0);
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(1);
    }
    for (i = 0; i < 4; i++) {
        struct pollfd pfd;
        async_worker_signal_stop(w[i]);
        CHECK_EQ(async_worker_get_state(w[i]), ASYNC_WORKER_STOPPING);
        CHECK(async_worker_should_stop(w[i]));
        pfd.fd = async_worker_stop_fd(w[i]);
        pfd.events = POLLIN;
        CHECK(pfd.fd >= 0);
        CHECK_EQ(poll(&pfd, 1, 0), 1);
        t0 = now_ms();
        CHECK_FAIL(!async_worker_join(w[i], 0), ASYNC_E_TIMEDOUT);
        CHECK_FAIL(!async_worker_join(w[i], 100), ASYNC_E_TIMEDOUT);
        CHECK(now_ms() - t0 >= 99);
        CHECK_FAIL(async_worker_result(w[i]) == NULL, ASYNC_E_STATE);
        CHECK_EQ(async_worker_get_state(w[i]), ASYNC_WORKER_STOPPING);
    }
    /* destroy while another thread is joining */
    start_thread(&jt, joiner, w[0]);
    sleep_ms(20);
    for (i = 0; i < 4; i++) {
        t0 = now_ms();
        async_clear_error();
        async_worker_destroy(w[i]);
        CHECK_ERR(ASYNC_OK);
        CHECK(now_ms() - t0 < 5000); /* never blocks (a generous bound) */
        CHECK_FAIL(async_worker_get_state(w[i]) == ASYNC_WORKER_STOPPED, ASYNC_E_BADHANDLE);
        CHECK_FAIL(!async_worker_join(w[i], 0), ASYNC_E_BADHANDLE);
        CHECK_FAIL(async_worker_stop_fd(w[i]) == -1, ASYNC_E_BADHANDLE);
    }
    join_within(jt, 10000, "the joiner");
    /* the objects they hang in can still be destroyed: they wake */
    async_queue_destroy(g_never_q);
    async_runtime_deinit(g_never_rt);
    async_runtime_deinit(g_never_rt2);
    t0 = now_ms();
    while ((atomic_load(&g_never_qerr) == 0 || atomic_load(&g_never_rterr) == 0 ||
            atomic_load(&g_never_badposts) < 10) &&
           now_ms() - t0 < 10000)
        sleep_ms(5);
    CHECK_EQ(atomic_load(&g_never_qerr), ASYNC_E_CANCELLED); /* at the stop, before the destroy */
    CHECK_EQ(atomic_load(&g_never_rterr), ASYNC_E_CLOSED);
    CHECK(atomic_load(&g_never_badposts) >= 10);
    /* the library still works around them */
    {
        async_runtime_t *rt = mkrt();
        io_event_t ev[2];
        CHECK_EQ(async_runtime_post_completion(rt, 7, 8), 0);
        CHECK_EQ(collect_events(rt, ev, 2, 5000, 1), 1);
        CHECK(ev[0].completion_key == 7 && ev[0].data == 8);
        async_runtime_deinit(rt);
    }
    /* return with the read(2) proc and the spinner still running: exit must be clean */
}

TEST_MAIN()
