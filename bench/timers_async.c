/*
 * timers, libasync: start N one-shot timers with spread-out delays (10..110 s,
 * so none fires), then cancel them all in start order. Two passes on one
 * runtime: the first ("cold") also pays for growing the library's timer
 * storage; the second ("warm") reuses it and is the headline figure. Checks
 * that every id is valid (non-zero, cancellable exactly once) and that
 * nothing fires.
 *
 * usage: timers_async [n=1000000]
 */
#include "bench.h"

#include "async.h"

static uint64_t delay_ms(long i) { return 10000 + ((uint64_t)i * 2654435761u) % 100000; }

static async_runtime_t *rt;
static uint64_t *ids;

static void pass(long n, double *start_ns, double *cancel_ns) {
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++) {
        ids[i] = async_runtime_add_timer(rt, delay_ms(i), 0, (uintptr_t)i + 1);
        if (ids[i] == 0) FAIL("add_timer %ld: %s", i, async_strerror(async_last_error()));
    }
    uint64_t t1 = now_ns();
    for (long i = 0; i < n; i++)
        if (async_runtime_cancel_timer(rt, ids[i]) != 0)
            FAIL("cancel_timer %ld: %s", i, async_strerror(async_last_error()));
    uint64_t t2 = now_ns();
    *start_ns = (double)(t1 - t0) / (double)n;
    *cancel_ns = (double)(t2 - t1) / (double)n;
}

int main(int argc, char **argv) {
    long n = arg_long(argc, argv, 1, 1000000);
    ids = malloc((size_t)n * sizeof *ids);
    if (!ids) FAIL("out of memory");
    memset(ids, 0xff, (size_t)n * sizeof *ids); /* our own array: fault it in before the clock starts */
    rt = async_runtime_init();
    if (!rt) FAIL("async_runtime_init: %s", async_strerror(async_last_error()));

    double cold_start, cold_cancel, start, cancel;
    pass(n, &cold_start, &cold_cancel);
    pass(n, &start, &cancel);

    io_event_t ev[4];
    if (async_runtime_wait(rt, ev, 4, 0) > 0) FAIL("an event arrived after every timer was cancelled");
    if (async_runtime_cancel_timer(rt, ids[0]) == 0) FAIL("a cancelled timer could be cancelled again");
    async_runtime_deinit(rt);
    free(ids);
    printf("ok=1 timers=%ld start_ns=%.1f cancel_ns=%.1f ns_per_op=%.1f cold_ns_per_op=%.1f\n", n, start, cancel,
           (start + cancel) / 2, (cold_start + cold_cancel) / 2);
    return 0;
}
