/*
 * The wake-latency protocol shared by latency_*.c: a sender thread sleeps
 * GAP_US so the loop thread is idle (blocked in its wait), takes a
 * timestamp, wakes the loop through the mechanism under test and waits for
 * the loop to acknowledge. The loop thread records now - timestamp as soon as
 * it runs again. Only the mechanism differs between the programs.
 *
 * Each program defines send_wake(t0) and runs loop_until_done() on the main
 * thread, calling record_sample(t0) for each wake it sees.
 */
#ifndef LATENCY_H
#define LATENCY_H

#include "bench.h"

#include <pthread.h>
#include <stdatomic.h>

#define WARMUP 200
#define GAP_US 100

static long n_samples;
static uint64_t *samples;
static atomic_long acked;
static _Atomic uint64_t shared_t0;

static void send_wake(uint64_t t0);
static void sender_thread_start(void); /* runs once on the sender thread before the first sample */

static void *sender(void *arg) {
    (void)arg;
    sender_thread_start();
    long total = WARMUP + n_samples;
    for (long i = 0; i < total; i++) {
        sleep_us(GAP_US);
        uint64_t t0 = now_ns();
        atomic_store(&shared_t0, t0);
        send_wake(t0);
        while (atomic_load(&acked) <= i) sleep_us(10);
    }
    return NULL;
}

/* Starts the sender thread (the caller joins it once every sample is in). */
static pthread_t start_sender(void) {
    pthread_t th;
    if (pthread_create(&th, NULL, sender, NULL) != 0) FAIL("pthread_create failed");
    return th;
}

/* Called by the loop thread for each wake; returns 1 once every sample is in. */
static int record_sample(uint64_t t0) {
    uint64_t t1 = now_ns();
    long i = atomic_load(&acked);
    if (i >= WARMUP) samples[i - WARMUP] = t1 - t0;
    atomic_store(&acked, i + 1);
    return i + 1 >= WARMUP + n_samples;
}

static void print_latency(void) {
    uint64_t p50 = percentile(samples, (size_t)n_samples, 50);
    uint64_t p90 = percentile(samples, (size_t)n_samples, 90);
    uint64_t p99 = percentile(samples, (size_t)n_samples, 99);
    printf("ok=1 samples=%ld p50_us=%.2f p90_us=%.2f p99_us=%.2f\n", n_samples, (double)p50 / 1e3,
           (double)p90 / 1e3, (double)p99 / 1e3);
}

static void latency_setup(int argc, char **argv) {
    n_samples = arg_long(argc, argv, 1, 3000);
    samples = calloc((size_t)n_samples, sizeof *samples);
    if (!samples) FAIL("out of memory");
}

#endif
