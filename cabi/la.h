/* Internal declarations shared by the C half of cabi. Not installed. */
#ifndef LA_INTERNAL_H
#define LA_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "async.h"

/* Handles
 * -------
 * Every handle is an integer disguised as a pointer:
 *   bits  0..23  slot index (from 1; the table holds at most 2^24 slots)
 *   bits 24..31  type (LA_T_*)
 *   bits 32..63  generation of the slot (1..2^32-1)
 * A slot's generation grows by one per handle it carries; a slot whose
 * generation is exhausted is never used again, so a handle value is issued
 * at most once per process and a stale handle never validates again.
 * The slot table lives in C memory that is never freed, so validating any
 * value (NULL, stale, forged, of another type) is a few loads and never
 * dereferences memory the caller handed us. */
#define LA_IDX_BITS 24
#define LA_IDX_MASK ((1u << LA_IDX_BITS) - 1)
/* The slot index of handle h. */
static inline uint32_t la_handle_idx(uint64_t h) { return (uint32_t)h & LA_IDX_MASK; }
enum { LA_T_QUEUE = 1, LA_T_WORKER = 2, LA_T_RUNTIME = 3, LA_T_SCHED = 4, LA_T_FIBER = 5, LA_T_CHAN = 6 };

typedef struct {
    _Atomic uint64_t tag;  /* the live handle value, 0 when free */
    _Atomic uint32_t refs; /* short-lived readers of obj (see la_handle_get) */
    uint32_t gen;          /* last generation used (under the table lock or by
                            * the slot's reserver); UINT32_MAX: exhausted */
    void *obj;             /* C-side object, may be NULL */
} la_slot_t;

uint64_t la_handle_alloc(int type, void *obj);
/* Invalidates h, waits for readers of its slot to leave, frees the slot.
 * Returns the object, or NULL if h was not live. */
void *la_handle_free(uint64_t h, int type);
/* la_handle_free in two steps, for objects recycled with their slot:
 * la_handle_retire invalidates h (and waits for its readers) but keeps the
 * slot reserved; la_handle_reuse publishes a new handle (new generation) in
 * a reserved slot (when the slot's generations are exhausted it releases the
 * slot and allocates another: the caller takes the slot index from the
 * returned handle); la_handle_release returns a reserved slot to the table. */
void *la_handle_retire(uint64_t h, int type);
uint64_t la_handle_reuse(uint32_t idx, int type, void *obj);
void la_handle_release(uint32_t idx);
/* Validates h and pins its slot: the object stays valid until
 * la_handle_put(). NULL if h is not a live handle of that type. */
void *la_handle_get(uint64_t h, int type, la_slot_t **slot);
void la_handle_put(la_slot_t *slot);
/* h's object without pinning: NULL unless h was live during the call. For
 * objects that are never freed (only recycled as the same type), which the
 * caller checks again under its own lock (the queues, queue.c). */
void *la_handle_peek(uint64_t h, int type);
/* 1 if h is a live handle of that type (no pinning). */
int la_handle_live(uint64_t h, int type);

/* The signal-safe doorbell of a runtime (the first member of its C side). */
enum { LA_DOORBELL_EVENTFD = 1, LA_DOORBELL_PIPE = 2, LA_DOORBELL_IOCP = 3 /* port.DoorbellIOCP */ };
typedef struct {
    int fd;
    int kind;
} la_doorbell_t;

/* The C side of a runtime, the C object of its handle (completions.c). */
typedef struct {
    uintptr_t key, data;
} la_pair_t;
typedef struct la_cprod la_cprod_t;
/* libasync.Shared, field for field: the state the wait's C fast path shares
 * with Go (runtime.go). */
typedef struct {
    _Atomic int32_t sleeping;  /* 1 while the loop may block */
    _Atomic int32_t gowork;    /* 1: Go may have work ready (Post, timers) */
    _Atomic int32_t skipped;   /* fd polls skipped in a row */
    _Atomic int32_t rawfd;     /* the poller descriptor the wait sleeps on (epoll) */
    _Atomic int64_t last_poll; /* ns since start of the last fd poll */
    _Atomic int64_t next_due;  /* no timer due before this (ns since start) */
    _Atomic int64_t nfds;      /* fds registered */
    _Atomic uint64_t reg_seq;  /* bumped by every fd add, modify and remove */
    _Atomic int64_t wake_at;   /* when the sleeping wait wakes by itself (ns since start) */
    int64_t start;             /* the clock origin: CLOCK_MONOTONIC ns (Go's nanotime) */
} la_shared_t;
typedef struct la_rtc {
    la_doorbell_t bell;        /* first: async_runtime_wakeup reads it as la_doorbell_t */
    la_shared_t sh;
    _Atomic int32_t waiting;   /* 1 while a thread is in async_runtime_wait */
    int raw;                   /* 1: the wait sleeps in C on sh.rawfd (rtwait.c) */
    uintptr_t token;           /* names the Go object of the runtime to Go */
    unsigned rot;              /* which source a wait serves first */
    _Atomic int closed;
    struct la_postq *q;        /* the completion queue of this incarnation */
    struct la_rtc *free_next;
} la_rtc_t;
la_rtc_t *la_rtc_new(int fd, int kind);
void la_rtc_close(la_rtc_t *r);
void la_rtc_recycle(la_rtc_t *r);
int la_rtc_pending(la_rtc_t *r);
la_shared_t *la_rtc_shared(la_rtc_t *r);
int32_t *la_rtc_wait_flag(la_rtc_t *r);
int la_rtc_take(la_rtc_t *r, la_pair_t *out, int max);
/* la_rtc_take straight into the caller's events (completion events). */
int la_rtc_take_events(la_rtc_t *r, io_event_t *out, int max);
/* async_runtime_wait's body (rtwait.c); returns an async_err_t. */
int la_rt_wait(uint64_t h, io_event_t *events, int max, int timeout, int *out);
/* Fd records one step of the C-driven wait hands to Go at most. */
#define LA_RAW_MAX 256

/* async_runtime_post_completion without Go: returns an async_err_t. */
int la_rt_post(uint64_t h, uintptr_t key, uintptr_t data);

/* The C API's queue (queue.c); each returns an async_err_t. */
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

/* Errors and fork detection. */
/* Records the calling thread's (or fiber's) last error. la_set_error keeps
 * the OS error noted by la_note_os_error for ASYNC_E_SYS and clears it for
 * any other code; la_set_error_os sets both (os ignored unless code is
 * ASYNC_E_SYS). Every ASYNC_E_SYS is recorded with its errno this way. */
void la_set_error(int code);
void la_set_error_os(int code, int os);
void la_note_os_error(int os);
extern _Atomic int la_forked;

#define LA_H(p) ((uint64_t)(uintptr_t)(p))

#endif
