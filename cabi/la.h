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
 *   bits  0..31  slot index (from 1)
 *   bits 32..39  type (LA_T_*)
 *   bits 40..63  generation of the slot
 * The slot table lives in C memory that is never freed, so validating any
 * value (NULL, stale, forged, of another type) is a few loads and never
 * dereferences memory the caller handed us. */
enum { LA_T_QUEUE = 1, LA_T_WORKER = 2, LA_T_RUNTIME = 3, LA_T_SCHED = 4, LA_T_FIBER = 5, LA_T_CHAN = 6 };

typedef struct {
    _Atomic uint64_t tag;  /* the live handle value, 0 when free */
    _Atomic uint32_t refs; /* short-lived readers of obj (see la_handle_get) */
    uint32_t gen;          /* last generation used (under the table lock) */
    void *obj;             /* C-side object, may be NULL */
} la_slot_t;

uint64_t la_handle_alloc(int type, void *obj);
/* Invalidates h, waits for readers of its slot to leave, frees the slot.
 * Returns the object, or NULL if h was not live. */
void *la_handle_free(uint64_t h, int type);
/* la_handle_free in two steps, for objects recycled with their slot:
 * la_handle_retire invalidates h (and waits for its readers) but keeps the
 * slot reserved; la_handle_reuse publishes a new handle (new generation) in
 * a reserved slot; la_handle_release returns a reserved slot to the table. */
void *la_handle_retire(uint64_t h, int type);
uint64_t la_handle_reuse(uint32_t idx, int type, void *obj);
void la_handle_release(uint32_t idx);
/* Validates h and pins its slot: the object stays valid until
 * la_handle_put(). NULL if h is not a live handle of that type. */
void *la_handle_get(uint64_t h, int type, la_slot_t **slot);
void la_handle_put(la_slot_t *slot);
/* 1 if h is a live handle of that type (no pinning). */
int la_handle_live(uint64_t h, int type);

/* The signal-safe doorbell of a runtime (the first member of its C side). */
enum { LA_DOORBELL_EVENTFD = 1, LA_DOORBELL_PIPE = 2 };
typedef struct {
    int fd;
    int kind;
} la_doorbell_t;

/* The C side of a runtime, the C object of its handle (completions.c). */
typedef struct {
    uintptr_t key, data;
} la_pair_t;
typedef struct la_cprod la_cprod_t;
typedef struct la_rtc {
    la_doorbell_t bell;        /* first: async_runtime_wakeup reads it as la_doorbell_t */
    _Atomic int32_t sleeping;  /* 1 while the loop may block (shared with Go) */
    _Atomic int closed;
    pthread_mutex_t mu;        /* the producer list */
    la_cprod_t *prods, *cursor;
    struct la_rtc *free_next;
} la_rtc_t;
la_rtc_t *la_rtc_new(int fd, int kind);
void la_rtc_close(la_rtc_t *r);
void la_rtc_recycle(la_rtc_t *r);
int la_rtc_pending(la_rtc_t *r);
int32_t *la_rtc_sleep_flag(la_rtc_t *r);
int la_rtc_take(la_rtc_t *r, la_pair_t *out, int max);
/* The C-driven wait (rtwait.c, cabi/main.go): what Go asks C to sleep on. */
typedef struct {
    int done;       /* 1: the wait is over (result in *out / the return code) */
    int ms;         /* sleep up to this long (-1 forever) */
    int fd;         /* on this poller descriptor (epoll) */
    int rawcap;     /* records that fit in raw */
    void *raw;      /* where the poller's records go */
    uintptr_t token;
} la_sleep_t;
/* async_runtime_wait's body; returns an async_err_t. */
int la_go_rt_wait(uint64_t h, io_event_t *events, int max, int timeout, int *out);

/* async_runtime_post_completion without Go: returns an async_err_t. */
int la_rt_post(uint64_t h, uintptr_t key, uintptr_t data);

/* Errors and fork detection. */
void la_set_error(int code);
extern _Atomic int la_forked;

#define LA_H(p) ((uint64_t)(uintptr_t)(p))

#endif
