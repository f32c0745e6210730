/*
 * completions, libasync: P producer threads each post N completions
 * (key = producer, data = sequence number) to one runtime; the main thread
 * waits and drains. Checks that every payload arrives exactly once and in
 * order per producer; counts write syscalls (eventfd wakes) per message.
 *
 * usage: completions_async [producers=4] [per_producer=250000]
 */
#include "bench.h"

#include <pthread.h>
#include <stdbool.h>

#include "async.h"

static async_runtime_t *rt;
static long per_producer;
static pthread_barrier_t start_line;
static volatile int post_failed;

static void *producer(void *arg) {
    uintptr_t key = (uintptr_t)arg;
    /* Enter Go once (an invalid handle is a cheap way) so the thread-attach
     * cost of a first call is paid before the clock starts. */
    (void)async_queue_is_empty(NULL);
    pthread_barrier_wait(&start_line);
    for (long i = 1; i <= per_producer; i++) {
        if (async_runtime_post_completion(rt, key, (uintptr_t)i) != 0) {
            post_failed = async_last_error();
            break;
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    long producers = arg_long(argc, argv, 1, 4);
    per_producer = arg_long(argc, argv, 2, 250000);
    if (producers > 64) FAIL("at most 64 producers");

    rt = async_runtime_init();
    if (!rt) FAIL("async_runtime_init: %s", async_strerror(async_last_error()));
    pthread_barrier_init(&start_line, NULL, (unsigned)producers + 1);
    pthread_t th[64];
    for (long p = 0; p < producers; p++) pthread_create(&th[p], NULL, producer, (void *)(uintptr_t)(p + 1));

    uint64_t next[65];
    for (int p = 0; p <= 64; p++) next[p] = 1;
    uint64_t total = (uint64_t)producers * (uint64_t)per_producer, got = 0, sum = 0;
    io_event_t ev[256];
    long waits = 0;

    pthread_barrier_wait(&start_line);
    long long w0 = proc_syscw();
    uint64_t t0 = now_ns();
    uint64_t last = t0;
    while (got < total) {
        int n = async_runtime_wait(rt, ev, 256, 5000);
        if (n < 0) FAIL("async_runtime_wait: %s", async_strerror(async_last_error()));
        if (n == 0) { /* timeout, or a signal interrupted the wait */
            if (now_ns() - last >= 5000000000u)
                FAIL("lost payloads: %llu of %llu delivered, then 5 s of silence", (unsigned long long)got,
                     (unsigned long long)total);
            continue;
        }
        last = now_ns();
        waits++;
        for (int i = 0; i < n; i++) {
            uintptr_t k = ev[i].completion_key;
            if (ev[i].event_type != ASYNC_EVENT_COMPLETION || ev[i].fd != -1 || k < 1 || k > (uintptr_t)producers)
                FAIL("unexpected event type=%u key=%lu", ev[i].event_type, (unsigned long)k);
            if (ev[i].data != next[k])
                FAIL("producer %lu: got seq %lu, expected %lu (lost, duplicated or reordered)", (unsigned long)k,
                     (unsigned long)ev[i].data, (unsigned long)next[k]);
            next[k]++;
            sum += ev[i].data;
            got++;
        }
    }
    uint64_t t1 = now_ns();
    for (long p = 0; p < producers; p++) pthread_join(th[p], NULL);
    long long w1 = proc_syscw(); /* after the joins: a post's wake may follow its payload */
    if (post_failed) FAIL("post_completion failed: %s", async_strerror(post_failed));
    /* Nothing more may arrive. */
    int extra = async_runtime_wait(rt, ev, 256, 0);
    if (extra != 0) FAIL("%d events after the last payload", extra);
    uint64_t want = (uint64_t)producers * ((uint64_t)per_producer * (uint64_t)(per_producer + 1) / 2);
    if (sum != want) FAIL("checksum %llu, expected %llu", (unsigned long long)sum, (unsigned long long)want);
    async_runtime_deinit(rt);

    double secs = (double)(t1 - t0) / 1e9;
    printf("ok=1 msgs=%llu secs=%.4f msgs_per_s=%.0f wakes_per_msg=%.6f waits_per_msg=%.6f\n",
           (unsigned long long)total, secs, (double)total / secs,
           w0 >= 0 ? (double)(w1 - w0) / (double)total : -1.0, (double)waits / (double)total);
    return 0;
}
