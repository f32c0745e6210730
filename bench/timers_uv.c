/*
 * timers, libuv peer: uv_timer_init + uv_timer_start for N timers with the
 * same delays as timers_async, then uv_timer_stop on each in start order;
 * two passes over the same handles, like timers_async: the first ("cold")
 * also faults in the freshly allocated handles, the second ("warm") is the
 * headline figure.
 *
 * usage: timers_uv [n=1000000]
 */
#include "bench.h"

#include <uv.h>

static uint64_t delay_ms(long i) { return 10000 + ((uint64_t)i * 2654435761u) % 100000; }
static void on_timer(uv_timer_t *t) { (void)t; }
static void on_close(uv_handle_t *h) { (void)h; }

static uv_loop_t *loop;
static uv_timer_t *t;

static void pass(long n, double *start_ns, double *cancel_ns) {
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++) {
        uv_timer_init(loop, &t[i]);
        if (uv_timer_start(&t[i], on_timer, delay_ms(i), 0) != 0) FAIL("uv_timer_start %ld", i);
    }
    uint64_t t1 = now_ns();
    for (long i = 0; i < n; i++)
        if (uv_timer_stop(&t[i]) != 0) FAIL("uv_timer_stop %ld", i);
    uint64_t t2 = now_ns();
    *start_ns = (double)(t1 - t0) / (double)n;
    *cancel_ns = (double)(t2 - t1) / (double)n;
    for (long i = 0; i < n; i++) uv_close((uv_handle_t *)&t[i], on_close);
    uv_run(loop, UV_RUN_DEFAULT); /* closes them (untimed), so the next pass can init them again */
}

int main(int argc, char **argv) {
    long n = arg_long(argc, argv, 1, 1000000);
    t = calloc((size_t)n, sizeof *t);
    if (!t) FAIL("out of memory");
    loop = uv_default_loop();

    double cold_start, cold_cancel, start, cancel;
    pass(n, &cold_start, &cold_cancel);
    pass(n, &start, &cancel);
    free(t);
    printf("ok=1 timers=%ld start_ns=%.1f cancel_ns=%.1f ns_per_op=%.1f cold_ns_per_op=%.1f\n", n, start, cancel,
           (start + cancel) / 2, (cold_start + cold_cancel) / 2);
    return 0;
}
