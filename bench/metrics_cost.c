/* What the loop metrics cost the loop (docs/PERFORMANCE.md, "Loop metrics"):
 * single-threaded, so that an instruction count under callgrind is stable
 * on a loaded machine. Three loops, each timed and printed per op:
 *   post+wait: N completions posted, then drained with wait(256, 0);
 *   poll:      N wait(0) calls that return nothing (one fd registered);
 *   timers:    N one-shot 0 ms timers added, then drained.
 * An optional second argument runs only one of them: post, poll or timers.
 * Build against a libasync.so and run, e.g.:
 *   gcc -O2 -Iinclude bench/metrics_cost.c -Lout -lasync -Wl,-rpath,out -o metrics_cost
 *   valgrind --tool=callgrind --callgrind-out-file=/dev/null ./metrics_cost 200000
 * (compare the total instruction count "Collected" of two builds; the
 * difference between N = 200000 and N = 100000, divided by 100000, is the
 * count per op without the start-up). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "async.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    const char *only = argc > 2 ? argv[2] : "";
    long np = !*only || !strcmp(only, "post") ? n : 0, nq = !*only || !strcmp(only, "poll") ? n : 0,
         nt = !*only || !strcmp(only, "timers") ? n : 0;
    async_runtime_t *rt = async_runtime_init();
    if (!rt) return 1;
    static io_event_t ev[256];
    double t0 = now_s();
    for (long i = 0; i < np; i++)
        if (async_runtime_post_completion(rt, 1, (uintptr_t)i) != 0) return 1;
    long got = 0;
    while (got < np) {
        int k = async_runtime_wait(rt, ev, 256, 0);
        if (k < 0) return 1;
        got += k;
    }
    double t1 = now_s();
    int p[2];
    if (pipe(p) != 0 || async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL) != 0) return 1;
    for (long i = 0; i < nq; i++)
        if (async_runtime_wait(rt, ev, 256, 0) != 0) return 1;
    double t2 = now_s();
    for (long i = 0; i < nt; i++)
        if (!async_runtime_add_timer(rt, 0, 0, 1)) return 1;
    got = 0;
    while (got < nt) {
        int k = async_runtime_wait(rt, ev, 256, 0);
        if (k < 0) return 1;
        got += k;
    }
    double t3 = now_s();
    printf("post+wait %.1f ns/op  poll %.1f ns/op  timers %.1f ns/op\n", (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9,
           (t3 - t2) / n * 1e9);
    async_runtime_deinit(rt);
    return 0;
}
