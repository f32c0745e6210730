/*
 * The cost of the C boundary, for reading the other rows:
 *   c_call_ns:     a call answered by the C half of cabi (async_last_error);
 *   go_call_ns:    a trivial call that enters Go, on a warm thread:
 *                  async_runtime_cancel_timer on a deinitialized runtime,
 *                  which the Go export answers with BADHANDLE after its
 *                  handle lookup (the queue call used before is C now);
 *   first_call_us: the first call into Go made by a new thread (the Go
 *                  runtime attaches the thread), median of 9 threads;
 *   post_ns:       one uncontended async_runtime_post_completion with no
 *                  waiter (so it never needs a wake), in batches of 1000
 *                  drained between batches.
 *
 * usage: cgo_async [calls=2000000]
 */
#include "bench.h"

#include <pthread.h>

#include "async.h"

static async_runtime_t *rt, *dead;
static uint64_t first_call_ns;

static int go_call(void) { return async_runtime_cancel_timer(dead, 1) == -1; }

static void *fresh_thread(void *arg) {
    (void)arg;
    uint64_t t0 = now_ns();
    (void)go_call();
    first_call_ns = now_ns() - t0;
    return NULL;
}

int main(int argc, char **argv) {
    long n = arg_long(argc, argv, 1, 2000000);
    rt = async_runtime_init();
    dead = async_runtime_init();
    if (!rt || !dead) FAIL("async_runtime_init: %s", async_strerror(async_last_error()));
    async_runtime_deinit(dead);

    volatile int sink = 0;
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++) sink += async_last_error();
    uint64_t t1 = now_ns();
    for (long i = 0; i < n; i++) sink += go_call();
    uint64_t t2 = now_ns();
    if (sink != n || async_last_error() != ASYNC_E_BADHANDLE)
        FAIL("cancel_timer on a deinitialized runtime: %s", async_strerror(async_last_error()));

    uint64_t firsts[9];
    for (int i = 0; i < 9; i++) {
        pthread_t th;
        pthread_create(&th, NULL, fresh_thread, NULL);
        pthread_join(th, NULL);
        firsts[i] = first_call_ns;
    }

    /* Posts in batches of 1000, each drained (untimed) before the next, so
     * the figure is the steady-state cost of a post, not of a growing backlog. */
    long batches = n / 4000 + 1, posts = 0;
    uint64_t post_time = 0;
    io_event_t ev[256];
    for (long b = 0; b < batches; b++) {
        uint64_t t3 = now_ns();
        for (long i = 0; i < 1000; i++)
            if (async_runtime_post_completion(rt, 1, (uintptr_t)i) != 0)
                FAIL("post_completion: %s", async_strerror(async_last_error()));
        post_time += now_ns() - t3;
        posts += 1000;
        long got = 0;
        for (int idle = 0; got < 1000 && idle < 100;) {
            int k = async_runtime_wait(rt, ev, 256, idle ? 10 : 0); /* 0 may also mean "interrupted" */
            if (k < 0) FAIL("async_runtime_wait: %s", async_strerror(async_last_error()));
            idle = k == 0 ? idle + 1 : 0;
            got += k;
        }
        if (got != 1000) FAIL("%ld of 1000 completions delivered", got);
    }
    async_runtime_deinit(rt);
    printf("ok=1 c_call_ns=%.1f go_call_ns=%.1f first_call_us=%.1f post_ns=%.1f\n", (double)(t1 - t0) / (double)n,
           (double)(t2 - t1) / (double)n, (double)percentile(firsts, 9, 50) / 1e3, (double)post_time / (double)posts);
    return 0;
}
