/* The C half of async_runtime (package rt): the runtime's C record, the
 * completion path (completions.c) and the wait's C part (wait.c). Not
 * installed. */
#ifndef LA_RT_H
#define LA_RT_H

#include "base.h"

/* The op of la_go_rt_fd (runtime.go): what it does to fd's registration
 * (rt/api.c; compat/classic.c's modify with a new context). */
typedef enum {
    LA_RT_FD_ADD = 0,
    LA_RT_FD_MODIFY = 1,
    LA_RT_FD_REMOVE = 2,
    LA_RT_FD_MODIFY_CTX = 3, /* events and context */
} la_rt_fd_op_t;

/* The signal-safe doorbell of a runtime (the first member of its C side). */
enum { LA_DOORBELL_EVENTFD = 1, LA_DOORBELL_PIPE = 2, LA_DOORBELL_IOCP = 3 /* port.DoorbellIOCP */ };
typedef struct {
    int fd;
    int kind;
} la_doorbell_t;

/* Signals a runtime can watch: 1..LA_SIG_N-1 (sigwatch.c). */
#define LA_SIG_N 65

/* The C side of a runtime, the C object of its handle (completions.c). */
typedef struct {
    uintptr_t key, data;
    uint32_t type; /* ASYNC_EVENT_COMPLETION or ASYNC_EVENT_SIGNAL */
} la_pair_t;
typedef struct la_cprod la_cprod_t;
/* boundary.Shared (internal/boundary), field for field: the state the wait's C fast path shares
 * with Go (libasync/runtime.go). */
typedef struct {
    _Atomic int32_t sleeping;  /* 1 while the loop may block */
    _Atomic int32_t gowork;    /* 1: Go may have work ready (Post, timers) */
    _Atomic int32_t skipped;   /* fd polls skipped in a row */
    _Atomic int32_t rawfd;     /* the poller descriptor the wait sleeps on (epoll) */
    _Atomic int32_t wakereq;   /* 1: a wakeup (async_runtime_wakeup) no wait has taken yet */
    int32_t pad_;              /* the int64 fields below stay 8-aligned on every ABI */
    _Atomic int64_t last_poll; /* ns since start of the last fd poll */
    _Atomic int64_t next_due;  /* no timer due before this (ns since start) */
    _Atomic int64_t nfds;      /* fds registered */
    _Atomic uint64_t reg_seq;  /* bumped by every fd add, modify and remove */
    _Atomic int64_t wake_at;   /* when the sleeping wait wakes by itself (ns since start) */
    int64_t start;             /* the clock origin: CLOCK_MONOTONIC ns (Go's nanotime) */
    /* Counters for async_runtime_get_stats (stats.c), read from any thread. */
    _Atomic int64_t idle_ns;   /* ns the waiter spent blocked in the poller (timeout != 0); waiter only */
    _Atomic int64_t timers;    /* timers armed (Go, under its timer lock) */
    _Atomic uint64_t rings;    /* doorbell writes by posts and timers that found the waiter asleep */
    _Atomic uint64_t wakeups;  /* async_runtime_wakeup calls that rang the doorbell */
} la_shared_t;
/* The fd map (fdmap.c): what the C wait needs to translate an epoll record of
 * a live registration without Go: the registration's id (the record's high
 * data word), its context and its RegSeq. Go writes it (under the runtime's
 * registration lock, through libasync's RegObserver); the waiter reads it
 * under a per-entry sequence lock. Chunks are allocated on first use and
 * freed when the record is recycled (no waiter left). */
#define LA_FDMAP_CHUNK 4096
#define LA_FDMAP_CHUNKS 512 /* fds below 2^21; others go through Go */
typedef struct {
    _Atomic uint32_t ver; /* odd while being written */
    _Atomic uint32_t live;
    _Atomic int32_t id;
    _Atomic uint64_t seq;
    _Atomic uintptr_t ctx;
} la_fdent_t;
typedef struct {
    la_fdent_t *_Atomic chunk[LA_FDMAP_CHUNKS];
    _Atomic int broken; /* a chunk could not be allocated: Go translates all */
} la_fdmap_t;

/* The counters of async_runtime_get_stats that the waiter keeps (wait.c):
 * only the thread in async_runtime_wait writes them (relaxed load + store,
 * no read-modify-write); any thread reads them (relaxed loads). */
typedef struct {
    _Atomic uint64_t iterations;
    _Atomic uint64_t events_total;
    _Atomic uint64_t events[ASYNC_RUNTIME_STATS_EVENT_KINDS];
} la_rtstats_t;

typedef struct la_rtc {
    la_doorbell_t bell;        /* first: async_runtime_wakeup reads it as la_doorbell_t */
    la_shared_t sh;
    _Atomic int32_t waiting;   /* 1 while a thread is in async_runtime_wait */
    int raw;                   /* 1: the wait sleeps in C on sh.rawfd (wait.c) */
    uintptr_t token;           /* names the Go object of the runtime to Go */
    unsigned rot;              /* which source a wait serves first */
    la_fdmap_t fdmap;          /* fdmap.c */
    _Atomic int closed;
    unsigned bell_unread; /* bell edges the waiter did not read (wait.c) */
    struct la_postq *q;        /* the completion queue of this incarnation */
    /* Signals (sigwatch.c): bit s-1 of sigon: this runtime watches signal s
     * (key in sigkey[s]); the process's handler adds to sigpend[s] and sets
     * bit s-1 of sigmask; take (completions.c) hands them out. Reset by
     * la_rtc_new. */
    _Atomic uint64_t sigon;
    _Atomic uint64_t sigmask;
    _Atomic uintptr_t sigkey[LA_SIG_N];
    _Atomic uintptr_t sigpend[LA_SIG_N];
    struct la_rtc *free_next;
    char pad[64];              /* the waiter's counters on lines of their own (posters read sh) */
    la_rtstats_t st;           /* zeroed by la_rtc_new */
} la_rtc_t;
la_rtc_t *la_rtc_new(int fd, int kind);
void la_rtc_close(la_rtc_t *r);
void la_rtc_recycle(la_rtc_t *r);
int la_rtc_pending(la_rtc_t *r);
/* Completions posted and not yet taken (approximate while posts run). Any
 * thread, with r's handle pinned. */
uint64_t la_rtc_pending_count(la_rtc_t *r);
la_shared_t *la_rtc_shared(la_rtc_t *r);
int32_t *la_rtc_wait_flag(la_rtc_t *r);
int la_rtc_take(la_rtc_t *r, la_pair_t *out, int max);
/* la_rtc_take straight into the caller's events: the SIGNAL events of
 * watched signals first, then completion events. */
int la_rtc_take_events(la_rtc_t *r, io_event_t *out, int max);
/* The fd map (fdmap.c). set/del: Go, under the registration lock; get: the
 * waiter; 1 and the entry if fd has a live, readable entry. reset: frees it
 * (the record's last user is gone). */
void la_fdmap_set(la_rtc_t *r, int fd, int32_t id, uintptr_t ctx, uint64_t seq);
void la_fdmap_del(la_rtc_t *r, int fd, uint64_t seq);
int la_fdmap_get(la_rtc_t *r, int fd, int32_t *id, uintptr_t *ctx, uint64_t *seq);
void la_fdmap_reset(la_rtc_t *r);
/* async_runtime_wait's body (wait.c); returns an async_err_t. */
int la_rt_wait(uint64_t h, io_event_t *events, int max, int timeout, int *out);
/* Fd records one poll of the C-driven wait harvests (and hands to Go) at most. */
#define LA_RAW_MAX 256

/* Signals (sigwatch.c). la_sig_take: up to max signal events of r (loop
 * thread, under the completion lock), into pairs or events. la_sig_forget:
 * drops every watch of the runtime handle h (after its deinit). */
int la_sig_take(la_rtc_t *r, la_pair_t *out, io_event_t *ev, int max);
void la_sig_forget(uint64_t h);

/* async_runtime_post_completion without Go: returns an async_err_t. */
int la_rt_post(uint64_t h, uintptr_t key, uintptr_t data);

#endif
