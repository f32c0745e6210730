/*
 * resolver.h — an asynchronous name resolver for a libasync event loop.
 *
 * A module a driver can copy (resolver.h + resolver.c). The loop thread
 * submits lookups; libasync's pool runs a blocking resolver function
 * (getaddrinfo/getnameinfo by default, or any function you plug in) through
 * async_runtime_submit_work, and each result comes back to the loop as a
 * completion.
 *
 * Guarantee: every accepted request reaches exactly one terminal state —
 * RESOLVED, FAILED, TIMED_OUT or CANCELLED — and the callback is called
 * exactly once for it, on the loop thread. A rejected submission (return 0)
 * never gets a callback.
 *
 * Threading: every function here must be called from the loop thread (the
 * thread calling async_runtime_wait on the runtime given to
 * dns_resolver_create), except dns_live_workers(). The callback runs on the
 * loop thread too, from dns_resolver_handle_event(), dns_cancel() or
 * dns_resolver_destroy(). It may call dns_submit() and dns_cancel(), but not
 * dns_resolver_destroy().
 */
#ifndef DNS_RESOLVER_H
#define DNS_RESOLVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "async.h"

#define DNS_MAX_QUERY 256  /* longest query (host name or numeric address) + 1 */
#define DNS_MAX_ADDRS 8    /* addresses kept per answer */
#define DNS_ADDR_LEN 46    /* INET6_ADDRSTRLEN */
#define DNS_HOST_LEN 256   /* longest host name kept for a reverse lookup */

typedef enum {
    DNS_FORWARD = 0, /* name -> addresses (getaddrinfo) */
    DNS_REVERSE = 1  /* numeric address -> name (getnameinfo) */
} dns_kind_t;

typedef enum {
    DNS_RESOLVED = 0,
    DNS_FAILED = 1,
    DNS_TIMED_OUT = 2,
    DNS_CANCELLED = 3
} dns_state_t;

/* What a resolver function produces. */
typedef struct {
    int naddrs;                              /* DNS_FORWARD: addresses found (at most DNS_MAX_ADDRS) */
    char addrs[DNS_MAX_ADDRS][DNS_ADDR_LEN]; /* numeric, e.g. "127.0.0.1", "::1"; duplicates removed */
    char host[DNS_HOST_LEN];                 /* DNS_REVERSE: the name found */
    char message[128];                       /* on failure: why, for humans */
} dns_answer_t;

/* A pluggable resolver: blocks as long as it likes, runs on a thread of
 * libasync's pool. Fills *answer and returns 0 on success, or returns a
 * nonzero code (the default uses getaddrinfo's EAI_* codes) and may set
 * answer->message. It must be thread-safe: several lookups run at once. */
typedef int (*dns_resolve_fn)(dns_kind_t kind, const char *query, dns_answer_t *answer, void *arg);

/* The default: getaddrinfo (AF_UNSPEC, SOCK_STREAM) or getnameinfo
 * (NI_NAMEREQD). */
int dns_resolve_system(dns_kind_t kind, const char *query, dns_answer_t *answer, void *arg);

/* Delivered to the callback exactly once per accepted request. The pointer is
 * valid only during the call. */
typedef struct {
    uint64_t id;
    dns_state_t state;
    dns_kind_t kind;
    const char *query;
    void *user;           /* as given to dns_submit */
    int error;            /* FAILED: the resolver's code; otherwise 0 */
    const dns_answer_t *answer; /* RESOLVED and FAILED: the answer; otherwise NULL */
    double elapsed_ms;    /* from dns_submit to this call */
} dns_result_t;

typedef void (*dns_callback_t)(const dns_result_t *result, void *cb_arg);

typedef struct {
    unsigned workers;         /* lookups of this resolver running at once on libasync's pool (default 4;
                                 the pool itself runs at most 64); the rest wait in the backlog */
    unsigned max_inflight;    /* accepted requests not yet terminal (default 256); beyond: busy */
    unsigned timeout_ms;      /* default per-request timeout (default 5000) */
    unsigned shutdown_grace_ms; /* how long destroy waits for lookups still running (default 1000) */
    dns_resolve_fn resolve;   /* default dns_resolve_system */
    void *resolve_arg;
} dns_config_t;

typedef struct dns_resolver dns_resolver_t;

typedef struct {
    uint64_t submitted, resolved, failed, timed_out, cancelled;
    uint64_t rejected_busy;  /* dns_submit refused with EBUSY */
    uint64_t late_results;   /* results that arrived after their request had ended (discarded) */
    uint64_t skipped;        /* lookups dropped unrun: cancelled or timed out while queued */
    unsigned inflight;
} dns_stats_t;

/* Creates a resolver whose events arrive on `rt` with completion_key `key`
 * (both its results and its timers use that key; choose a key nothing else
 * uses). config may be NULL (defaults); zero fields take their defaults.
 * Returns NULL with errno set (EINVAL, ENOMEM). */
dns_resolver_t *dns_resolver_create(async_runtime_t *rt, uintptr_t key, const dns_config_t *config,
                                    dns_callback_t callback, void *cb_arg);

/* Ends the resolver. Every request still in flight is told CANCELLED (exactly
 * once, before this returns). Lookups not started yet never start; lookups
 * still inside the resolver function get up to shutdown_grace_ms to return;
 * any that do not are left to finish on their own later: they touch nothing
 * but their own reference-counted state and never call back. So a
 * getaddrinfo stuck for minutes never hangs the caller. Call it before
 * async_runtime_deinit of rt. Afterwards the runtime may still return
 * completions with `key` (one per lookup that was running): ignore them. */
void dns_resolver_destroy(dns_resolver_t *r);

/* Starts a lookup. timeout_ms 0 takes the configured default. Returns the
 * request id (never 0), or 0 with errno set and no callback ever:
 *   EINVAL  query NULL, empty or longer than DNS_MAX_QUERY-1, or bad kind;
 *   EBUSY   max_inflight requests are in flight, or the backlog is full
 *           (all `workers` lookups stuck), or libasync's pool queue is full;
 *   ESHUTDOWN  called from a callback run by dns_resolver_destroy;
 *   ENOMEM  a libasync call failed (timer, pool) or no memory. */
uint64_t dns_submit(dns_resolver_t *r, dns_kind_t kind, const char *query, unsigned timeout_ms, void *user);

/* Cancels a request: its callback runs now, with DNS_CANCELLED, before this
 * returns 0. Returns -1 with errno ENOENT if the id is not in flight (unknown,
 * or already told). A lookup not started yet never starts; one already
 * running finishes in the background and its result is discarded. */
int dns_cancel(dns_resolver_t *r, uint64_t id);

/* Feed every event from async_runtime_wait here. Returns true if the event
 * was the resolver's (then the caller ignores it). */
bool dns_resolver_handle_event(dns_resolver_t *r, const io_event_t *ev);

void dns_resolver_get_stats(const dns_resolver_t *r, dns_stats_t *stats);

/* How many lookups (of every resolver, destroyed ones included) libasync's
 * pool still holds, queued or running. Thread-safe. For tests and
 * diagnostics. */
unsigned dns_live_workers(void);

const char *dns_state_name(dns_state_t state);

#endif /* DNS_RESOLVER_H */
