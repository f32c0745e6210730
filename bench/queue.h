/*
 * The queue protocol shared by queue_*.c: P producer threads each enqueue N
 * 16-byte messages {producer, sequence}; the main thread dequeues them all,
 * blocking when the queue is empty (producers block when it is full). The
 * consumer checks that every message arrives exactly once and in order per
 * producer. Each program defines q_setup/q_put/q_get.
 */
#ifndef QUEUE_BENCH_H
#define QUEUE_BENCH_H

#include "bench.h"

#include <pthread.h>

#define QCAP 1024

typedef struct {
    uint64_t producer;
    uint64_t seq;
} msg_t;

static long producers, per_producer;
static pthread_barrier_t start_line;

static void q_setup(void);
static void q_thread_start(void);  /* once per producer thread, before the clock starts */
static void q_put(const msg_t *m); /* blocks while full */
static void q_get(msg_t *m);       /* blocks while empty; FAILs after a long silence */

static void *q_producer(void *arg) {
    msg_t m = {(uint64_t)(uintptr_t)arg, 0};
    q_thread_start();
    pthread_barrier_wait(&start_line);
    for (long i = 1; i <= per_producer; i++) {
        m.seq = (uint64_t)i;
        q_put(&m);
    }
    return NULL;
}

static int q_run(int argc, char **argv) {
    producers = arg_long(argc, argv, 1, 1);
    per_producer = arg_long(argc, argv, 2, 500000);
    if (producers > 64) FAIL("at most 64 producers");
    q_setup();
    pthread_barrier_init(&start_line, NULL, (unsigned)producers + 1);
    pthread_t th[64];
    for (long p = 0; p < producers; p++) pthread_create(&th[p], NULL, q_producer, (void *)(uintptr_t)(p + 1));
    uint64_t next[65];
    for (int p = 0; p <= 64; p++) next[p] = 1;
    uint64_t total = (uint64_t)producers * (uint64_t)per_producer, sum = 0;

    pthread_barrier_wait(&start_line);
    uint64_t t0 = now_ns();
    for (uint64_t got = 0; got < total; got++) {
        msg_t m;
        q_get(&m);
        if (m.producer < 1 || m.producer > (uint64_t)producers || m.seq != next[m.producer])
            FAIL("lost, duplicated or reordered message (producer %llu seq %llu)", (unsigned long long)m.producer,
                 (unsigned long long)m.seq);
        next[m.producer]++;
        sum += m.seq;
    }
    uint64_t t1 = now_ns();
    for (long p = 0; p < producers; p++) pthread_join(th[p], NULL);
    uint64_t want = (uint64_t)producers * ((uint64_t)per_producer * (uint64_t)(per_producer + 1) / 2);
    if (sum != want) FAIL("checksum %llu, expected %llu", (unsigned long long)sum, (unsigned long long)want);
    double secs = (double)(t1 - t0) / 1e9;
    printf("ok=1 msgs=%llu secs=%.4f msgs_per_s=%.0f\n", (unsigned long long)total, secs, (double)total / secs);
    return 0;
}

#endif
