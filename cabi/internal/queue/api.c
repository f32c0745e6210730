/* The public queue functions of include/async.h: the entry check (LA_ENTRY)
 * and the last-error slot around the C queue (queue.c). Pure C: no Go
 * crossing. Waits park a calling fiber. */
#include <string.h>

#include "fiber.h"
#include "queue.h"

async_queue_t *async_queue_create(size_t capacity, size_t max_msg_size, async_queue_flags_t flags) {
    LA_ENTRY(NULL);
    la_ensure_go_poller(); /* the first one starts Go's poller (base/gopoller.go) */
    uint64_t h = 0;
    if (!la_ok(la_q_create(capacity, max_msg_size, (unsigned)flags, &h))) return NULL;
    return (async_queue_t *)(uintptr_t)h;
}

void async_queue_destroy(async_queue_t *queue) {
    LA_ENTRY();
    la_ok(la_q_destroy(LA_H(queue)));
}

bool async_queue_enqueue(async_queue_t *queue, const void *data, size_t size) {
    LA_ENTRY(false);
    /* Only a full queue looks at the flag (queue.c reads it under its
     * lock): a BLOCK_WRITER queue waits then. */
    return la_ok(la_q_enqueue(LA_H(queue), data, size, LA_Q_FULL_BY_FLAG, -1));
}

bool async_queue_enqueue_wait(async_queue_t *queue, const void *data, size_t size, int timeout_ms) {
    LA_ENTRY(false);
    return la_ok(la_q_enqueue(LA_H(queue), data, size, LA_Q_FULL_WAIT, timeout_ms));
}

bool async_queue_dequeue(async_queue_t *queue, void *buffer, size_t buffer_size, size_t *out_size) {
    LA_ENTRY(false);
    return la_ok(la_q_dequeue(LA_H(queue), buffer, buffer_size, out_size, 0));
}

bool async_queue_dequeue_wait(async_queue_t *queue, void *buffer, size_t buffer_size, size_t *out_size,
                              int timeout_ms) {
    LA_ENTRY(false);
    return la_ok(la_q_dequeue(LA_H(queue), buffer, buffer_size, out_size, timeout_ms));
}

bool async_queue_is_empty(const async_queue_t *queue) {
    LA_ENTRY(true);
    int r = 1;
    if (!la_ok(la_q_query(LA_H(queue), LA_Q_IS_EMPTY, &r))) return true;
    return r != 0;
}

bool async_queue_is_full(const async_queue_t *queue) {
    LA_ENTRY(false);
    int r = 0;
    if (!la_ok(la_q_query(LA_H(queue), LA_Q_IS_FULL, &r))) return false;
    return r != 0;
}

void async_queue_clear(async_queue_t *queue) {
    LA_ENTRY();
    la_ok(la_q_clear(LA_H(queue)));
}

void async_queue_get_stats(const async_queue_t *queue, async_queue_stats_t *stats) {
    /* zeroed before the fork guard: every failure leaves *stats zeroed */
    if (stats) memset(stats, 0, sizeof *stats);
    LA_ENTRY();
    if (!stats) {
        la_set_error(ASYNC_E_INVAL);
        return;
    }
    if (!la_ok(la_q_stats(LA_H(queue), stats))) memset(stats, 0, sizeof *stats);
}

int async_queue_attach(async_queue_t *queue, async_runtime_t *rt, uintptr_t completion_key) {
    LA_ENTRY(-1);
    return la_ok(la_q_attach(LA_H(queue), LA_H(rt), completion_key)) ? 0 : -1;
}

