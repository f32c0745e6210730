/*
 * completions, libuv peer: the usual libuv way to hand work results to a loop
 * thread. P producer threads push nodes (key = producer, data = sequence) on
 * a lock-free (Treiber) stack and call uv_async_send(); the loop's async
 * callback takes the whole stack with one exchange, reverses it to restore
 * the order and consumes it. Nodes are preallocated (and touched before the
 * clock starts), so the peer pays no malloc. Same checks and wake counting as completions_async.
 *
 * usage: completions_uv [producers=4] [per_producer=250000]
 */
#include "bench.h"

#include <pthread.h>
#include <stdatomic.h>
#include <uv.h>

struct node {
    struct node *next;
    uintptr_t key;
    uintptr_t data;
};

static _Atomic(struct node *) head;
static uv_async_t async_handle;
static long producers, per_producer;
static struct node *nodes;
static pthread_barrier_t start_line;

static uint64_t next_seq[65], got, total, sum, t_done;
static long callbacks;
static const char *error;

static void *producer(void *arg) {
    uintptr_t key = (uintptr_t)arg;
    struct node *mine = nodes + (key - 1) * (uintptr_t)per_producer;
    pthread_barrier_wait(&start_line);
    for (long i = 0; i < per_producer; i++) {
        struct node *n = &mine[i];
        n->key = key;
        n->data = (uintptr_t)i + 1;
        struct node *old = atomic_load_explicit(&head, memory_order_relaxed);
        do {
            n->next = old;
        } while (!atomic_compare_exchange_weak_explicit(&head, &old, n, memory_order_release, memory_order_relaxed));
        uv_async_send(&async_handle);
    }
    return NULL;
}

static void on_async(uv_async_t *h) {
    callbacks++;
    struct node *list = atomic_exchange_explicit(&head, NULL, memory_order_acquire);
    struct node *rev = NULL;
    while (list) { /* LIFO -> FIFO */
        struct node *nx = list->next;
        list->next = rev;
        rev = list;
        list = nx;
    }
    for (struct node *n = rev; n; n = n->next) {
        if (n->key < 1 || n->key > (uintptr_t)producers || n->data != next_seq[n->key]) {
            error = "lost, duplicated or reordered payload";
            uv_stop(h->loop);
            return;
        }
        next_seq[n->key]++;
        sum += n->data;
        got++;
    }
    if (got == total) {
        t_done = now_ns();
        uv_stop(h->loop);
    }
}

int main(int argc, char **argv) {
    producers = arg_long(argc, argv, 1, 4);
    per_producer = arg_long(argc, argv, 2, 250000);
    if (producers > 64) FAIL("at most 64 producers");
    total = (uint64_t)producers * (uint64_t)per_producer;
    nodes = calloc(total, sizeof *nodes);
    if (!nodes) FAIL("out of memory");
    memset(nodes, 0xff, total * sizeof *nodes); /* fault the pages in before the clock starts */
    for (int p = 0; p <= 64; p++) next_seq[p] = 1;

    uv_loop_t *loop = uv_default_loop();
    uv_async_init(loop, &async_handle, on_async);
    pthread_barrier_init(&start_line, NULL, (unsigned)producers + 1);
    pthread_t th[64];
    for (long p = 0; p < producers; p++) pthread_create(&th[p], NULL, producer, (void *)(uintptr_t)(p + 1));

    pthread_barrier_wait(&start_line);
    long long w0 = proc_syscw();
    uint64_t t0 = now_ns();
    uv_run(loop, UV_RUN_DEFAULT);
    for (long p = 0; p < producers; p++) pthread_join(th[p], NULL);
    long long w1 = proc_syscw(); /* after the joins: a post's wake may follow its payload */
    if (error) FAIL("%s", error);
    if (got != total) FAIL("%llu of %llu delivered", (unsigned long long)got, (unsigned long long)total);
    uint64_t want = (uint64_t)producers * ((uint64_t)per_producer * (uint64_t)(per_producer + 1) / 2);
    if (sum != want) FAIL("checksum %llu, expected %llu", (unsigned long long)sum, (unsigned long long)want);
    uv_close((uv_handle_t *)&async_handle, NULL);
    uv_run(loop, UV_RUN_DEFAULT);

    double secs = (double)(t_done - t0) / 1e9;
    printf("ok=1 msgs=%llu secs=%.4f msgs_per_s=%.0f wakes_per_msg=%.6f waits_per_msg=%.6f\n",
           (unsigned long long)total, secs, (double)total / secs,
           w0 >= 0 ? (double)(w1 - w0) / (double)total : -1.0, (double)callbacks / (double)total);
    free(nodes);
    return 0;
}
