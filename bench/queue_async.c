/*
 * queue, libasync: async_queue with BLOCK_WRITER (producers block when full)
 * and async_queue_dequeue_wait on the consumer.
 *
 * usage: queue_async [producers=1] [per_producer=500000]
 */
#include "queue.h"

#include "async.h"

static async_queue_t *q;

static void q_setup(void) {
    q = async_queue_create(QCAP, sizeof(msg_t), ASYNC_QUEUE_BLOCK_WRITER);
    if (!q) FAIL("async_queue_create: %s", async_strerror(async_last_error()));
}

/* Enter Go once so the first-call cost is paid before the clock starts. */
static void q_thread_start(void) { (void)async_queue_is_empty(NULL); }

static void q_put(const msg_t *m) {
    if (!async_queue_enqueue(q, m, sizeof *m)) FAIL("enqueue: %s", async_strerror(async_last_error()));
}

static void q_get(msg_t *m) {
    size_t size = 0;
    if (!async_queue_dequeue_wait(q, m, sizeof *m, &size, 5000))
        FAIL("dequeue_wait: %s", async_strerror(async_last_error()));
    if (size != sizeof *m) FAIL("dequeued %zu bytes, expected %zu", size, sizeof *m);
}

int main(int argc, char **argv) {
    int rc = q_run(argc, argv);
    async_queue_stats_t st;
    async_queue_get_stats(q, &st);
    if (st.enqueue_count != st.dequeue_count || st.current_size != 0 || st.dropped_count != 0)
        FAIL("stats disagree: enq=%llu deq=%llu size=%zu dropped=%llu", (unsigned long long)st.enqueue_count,
             (unsigned long long)st.dequeue_count, st.current_size, (unsigned long long)st.dropped_count);
    async_queue_destroy(q);
    return rc;
}
