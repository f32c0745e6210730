/* The C API's queue (package queue). Not installed. */
#ifndef LA_QUEUE_H
#define LA_QUEUE_H

#include "base.h"

/* queue.c; each returns an async_err_t. */
int la_q_create(size_t capacity, size_t max_msg, unsigned flags, uint64_t *out);
int la_q_destroy(uint64_t h);
/* What an enqueue does when the queue is full (and not DROP_OLDEST). */
typedef enum {
    LA_Q_FULL_FAIL = 0,    /* fails with ASYNC_E_FULL */
    LA_Q_FULL_WAIT = 1,    /* waits up to timeout_ms (-1: for ever) */
    LA_Q_FULL_BY_FLAG = 2, /* waits (as LA_Q_FULL_WAIT) on a BLOCK_WRITER queue, else fails */
} la_q_full_t;
int la_q_enqueue(uint64_t h, const void *data, size_t size, la_q_full_t full, int timeout_ms);
int la_q_dequeue(uint64_t h, void *buf, size_t size, size_t *out_size, int timeout_ms);
/* What la_q_query tells (*out: 1 or 0). */
typedef enum { LA_Q_IS_EMPTY, LA_Q_IS_FULL } la_q_query_t;
int la_q_query(uint64_t h, la_q_query_t what, int *out);
int la_q_clear(uint64_t h);
int la_q_stats(uint64_t h, async_queue_stats_t *st);
int la_q_attach(uint64_t h, uint64_t rt, uintptr_t key);

#endif
