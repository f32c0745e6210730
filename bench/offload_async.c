/*
 * offload, libasync: async_runtime_submit_work runs the function on
 * libasync's pool; its result comes back as a completion from
 * async_runtime_wait (offload.h has the protocol).
 *
 * usage: offload_async [latency_samples=20000] [throughput_items=500000]
 */
#include "offload.h"

#include <async.h>

static uintptr_t echo(void *arg) {
    return (uintptr_t)arg;
}

static void submit(async_runtime_t *rt, long i) {
    if (async_runtime_submit_work(rt, echo, (void *)(uintptr_t)i, (uintptr_t)i, NULL) == 0)
        FAIL("async_runtime_submit_work: %s", async_strerror(async_last_error()));
}

int main(int argc, char **argv) {
    offload_setup(argc, argv);
    async_runtime_t *rt = async_runtime_init();
    if (!rt) FAIL("async_runtime_init: %s", async_strerror(async_last_error()));
    io_event_t ev[IN_FLIGHT];

    for (long i = 0; i < WARMUP + n_samples; i++) {
        uint64_t t0 = now_ns();
        submit(rt, i);
        if (async_runtime_wait(rt, ev, 1, -1) != 1 || ev[0].data != (uintptr_t)i) FAIL("latency: item %ld lost", i);
        if (i >= WARMUP) samples[i - WARMUP] = now_ns() - t0;
    }

    long next = 0, done = 0;
    uint64_t t0 = now_ns();
    for (; next < IN_FLIGHT && next < n_items; next++) submit(rt, next);
    while (done < n_items) {
        int n = async_runtime_wait(rt, ev, IN_FLIGHT, -1);
        if (n < 0) FAIL("async_runtime_wait: %s", async_strerror(async_last_error()));
        for (int k = 0; k < n; k++) {
            offload_seen((long)ev[k].completion_key, ev[k].data);
            done++;
            if (next < n_items) submit(rt, next++);
        }
    }
    uint64_t took = now_ns() - t0;
    async_runtime_deinit(rt);
    offload_report(took);
    return 0;
}
