/* The C API's queue (package queue). Not installed. */
#ifndef LA_QUEUE_H
#define LA_QUEUE_H

#include "base.h"

/* queue.c; each returns an async_err_t. */
int la_q_create(size_t capacity, size_t max_msg, unsigned flags, uint64_t *out);
int la_q_destroy(uint64_t h);
/* When full (and not DROP_OLDEST): wait 0 fails with FULL, 1 waits up to
 * timeout_ms (-1 forever), -1 waits forever only on a BLOCK_WRITER queue. */
int la_q_enqueue(uint64_t h, const void *data, size_t size, int wait, int timeout_ms);
int la_q_dequeue(uint64_t h, void *buf, size_t size, size_t *out_size, int timeout_ms);
int la_q_query(uint64_t h, int what, int *out); /* what 0: is_empty, 1: is_full */
int la_q_clear(uint64_t h);
int la_q_stats(uint64_t h, async_queue_stats_t *st);
int la_q_attach(uint64_t h, uint64_t rt, uintptr_t key);

#endif
