/*
 * The offload protocol shared by offload_*.c: a trivial function (it returns
 * its argument) run off the loop thread on the library's pool, its result
 * handed back to the loop. Two passes on the loop thread:
 *   latency: one item at a time, the next submitted when the previous one's
 *            result reached the loop: submit-to-completion time per item
 *            (after WARMUP items);
 *   throughput: IN_FLIGHT items in flight, each completion submitting the
 *            next, until `items` completed: items per second.
 * Each program checks that every item came back once with its own value.
 *
 * usage: offload_* [latency_samples=20000] [throughput_items=500000]
 */
#ifndef OFFLOAD_H
#define OFFLOAD_H

#include "bench.h"

#define WARMUP 1000
#define IN_FLIGHT 256

static long n_samples, n_items;
static uint64_t *samples;
static unsigned char *seen; /* per throughput item: completions seen */

static void offload_setup(int argc, char **argv) {
    n_samples = arg_long(argc, argv, 1, 20000);
    n_items = arg_long(argc, argv, 2, 500000);
    samples = calloc((size_t)n_samples, sizeof *samples);
    seen = calloc((size_t)n_items, 1);
    if (!samples || !seen) FAIL("out of memory");
}

/* Item i of the throughput pass came back with value v. */
static void offload_seen(long i, uintptr_t v) {
    if (i < 0 || i >= n_items || v != (uintptr_t)i) FAIL("item %ld came back with %lu", i, (unsigned long)v);
    if (seen[i]++) FAIL("item %ld came back twice", i);
}

static void offload_report(uint64_t throughput_ns) {
    for (long i = 0; i < n_items; i++)
        if (seen[i] != 1) FAIL("item %ld came back %d times", i, seen[i]);
    uint64_t p50 = percentile(samples, (size_t)n_samples, 50);
    uint64_t p99 = percentile(samples, (size_t)n_samples, 99);
    printf("ok=1 samples=%ld p50_us=%.2f p99_us=%.2f items=%ld items_per_s=%.0f\n", n_samples, (double)p50 / 1e3,
           (double)p99 / 1e3, n_items, (double)n_items * 1e9 / (double)throughput_ns);
}

#endif
