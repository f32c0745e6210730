/*
 * resolver.c — see resolver.h.
 *
 * How exactly-once is guaranteed
 * ------------------------------
 * A request's state lives in a slot owned by the loop thread alone. Every way
 * a request can end — a worker's reply, its timer, dns_cancel, destroy — runs
 * on the loop thread and goes through finish(), which ends the request only
 * if the slot still holds that request's id, frees the slot, and then calls
 * the callback. Whatever comes second (a reply after a timeout, a timer after
 * a reply, a second cancel) finds the slot empty or holding another id and is
 * ignored. There is no lock because there is no race: workers never change a
 * request's state, they only send replies.
 *
 * Workers read one thing the loop writes: live[slot], the id currently in
 * flight in each slot (an atomic). A worker that takes a job whose request
 * already ended skips it, so cancelled or timed-out lookups do not waste a
 * worker. The check is only an optimisation; correctness never depends on it.
 *
 * Why a stuck resolver cannot hang anything
 * -----------------------------------------
 * The loop never waits for a worker: jobs go out through a queue that fails
 * at once when full (EBUSY), replies come back through a queue attached to the
 * runtime, and timeouts are runtime timers on the loop. At destroy, workers
 * that do not return within shutdown_grace_ms are detached. Everything a
 * worker touches lives in `struct shared`, which is reference-counted (one
 * reference per worker plus one for the resolver), so a detached worker that
 * returns from getaddrinfo minutes later still finds valid memory, sees
 * `stopping`, and exits without calling back. Queue handles it might still use
 * are destroyed by then; libasync fails such calls with ASYNC_E_BADHANDLE
 * instead of crashing.
 */
#define _GNU_SOURCE 1
#include "resolver.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* Loop -> workers. id 0 asks a worker to exit. */
struct job {
    uint64_t id;
    uint32_t slot;
    uint32_t kind;
    char query[DNS_MAX_QUERY];
};

/* Workers -> loop. */
struct reply {
    uint64_t id;
    uint32_t slot;
    int error;
    dns_answer_t answer;
};

/* What workers share with the loop; freed by whoever drops the last reference. */
struct shared {
    atomic_uint refs;
    atomic_bool stopping;
    atomic_ullong skipped;
    async_queue_t *jobs;
    async_queue_t *replies;
    dns_resolve_fn resolve;
    void *resolve_arg;
    unsigned nslots;
    _Atomic uint64_t live[]; /* per slot: the id in flight there, 0 if none */
};

struct slot {
    uint64_t id; /* 0: free */
    uint64_t timer;
    int64_t start_us;
    dns_kind_t kind;
    void *user;
    char query[DNS_MAX_QUERY];
};

struct dns_resolver {
    async_runtime_t *rt;
    uintptr_t key;
    dns_callback_t callback;
    void *cb_arg;
    dns_config_t cfg;
    struct shared *sh;
    async_worker_t **workers;
    unsigned nworkers;
    struct slot *slots;
    uint32_t *free_slots; /* a stack of free slot indices */
    unsigned nfree;
    uint64_t seq;
    bool closing;
    dns_stats_t stats;
};

static atomic_uint g_live_workers;

unsigned dns_live_workers(void)
{
    return atomic_load(&g_live_workers);
}

const char *dns_state_name(dns_state_t state)
{
    switch (state) {
    case DNS_RESOLVED:
        return "resolved";
    case DNS_FAILED:
        return "failed";
    case DNS_TIMED_OUT:
        return "timed out";
    case DNS_CANCELLED:
        return "cancelled";
    }
    return "?";
}

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---------------------------------------------------------------------- */
/* The default resolver                                                    */
/* ---------------------------------------------------------------------- */

static void set_message(dns_answer_t *a, int rc)
{
    if (rc == EAI_SYSTEM) {
        char buf[96];
        snprintf(a->message, sizeof a->message, "%s", strerror_r(errno, buf, sizeof buf));
    } else {
        snprintf(a->message, sizeof a->message, "%s", gai_strerror(rc));
    }
}

int dns_resolve_system(dns_kind_t kind, const char *query, dns_answer_t *answer, void *arg)
{
    (void)arg;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (kind == DNS_REVERSE)
        hints.ai_flags = AI_NUMERICHOST; /* the query must be an address */
    int rc = getaddrinfo(query, NULL, &hints, &res);
    if (rc != 0) {
        set_message(answer, rc);
        return rc;
    }
    if (kind == DNS_REVERSE) {
        rc = getnameinfo(res->ai_addr, res->ai_addrlen, answer->host, sizeof answer->host, NULL, 0, NI_NAMEREQD);
        if (rc != 0)
            set_message(answer, rc);
        freeaddrinfo(res);
        return rc;
    }
    for (struct addrinfo *ai = res; ai && answer->naddrs < DNS_MAX_ADDRS; ai = ai->ai_next) {
        char text[DNS_ADDR_LEN];
        const void *bin = ai->ai_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr
                                                    : (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr;
        if ((ai->ai_family != AF_INET && ai->ai_family != AF_INET6) ||
            !inet_ntop(ai->ai_family, bin, text, sizeof text))
            continue;
        bool dup = false;
        for (int i = 0; i < answer->naddrs && !dup; i++)
            dup = strcmp(answer->addrs[i], text) == 0;
        if (!dup)
            memcpy(answer->addrs[answer->naddrs++], text, sizeof text);
    }
    freeaddrinfo(res);
    if (answer->naddrs == 0) {
        snprintf(answer->message, sizeof answer->message, "no IPv4 or IPv6 address");
        return EAI_NONAME;
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Workers                                                                 */
/* ---------------------------------------------------------------------- */

static void shared_release(struct shared *sh)
{
    if (atomic_fetch_sub(&sh->refs, 1) == 1)
        free(sh);
}

static void *worker_main(void *arg)
{
    struct shared *sh = arg;
    struct job job;
    struct reply rep;
    size_t n;

    while (!atomic_load(&sh->stopping)) {
        /* Sleeps until a job arrives: no timer, no polling. At shutdown
         * async_worker_signal_stop ends the wait (ASYNC_E_CANCELLED). */
        if (!async_queue_dequeue_wait(sh->jobs, &job, sizeof job, &n, -1))
            break;
        if (atomic_load(&sh->live[job.slot]) != job.id) {
            atomic_fetch_add(&sh->skipped, 1); /* ended while queued */
            continue;
        }
        memset(&rep, 0, sizeof rep);
        rep.id = job.id;
        rep.slot = job.slot;
        rep.error = sh->resolve((dns_kind_t)job.kind, job.query, &rep.answer, sh->resolve_arg);
        if (atomic_load(&sh->stopping))
            break; /* possibly detached: tell no one */
        /* BLOCK_WRITER: waits while the loop is behind; fails once stopped. */
        if (!async_queue_enqueue(sh->replies, &rep, sizeof rep))
            break;
    }
    shared_release(sh);
    atomic_fetch_sub(&g_live_workers, 1);
    return NULL;
}

/* ---------------------------------------------------------------------- */
/* The loop side                                                           */
/* ---------------------------------------------------------------------- */

/* Ends request `id` in slot i with `state` — only if it is still in flight —
 * and tells the callback. The only place a request ends. */
static void finish(dns_resolver_t *r, uint32_t i, uint64_t id, dns_state_t state, int error,
                   const dns_answer_t *answer)
{
    struct slot *s = &r->slots[i];
    if (s->id == 0 || s->id != id)
        return; /* already ended: nothing to tell */
    if (state != DNS_TIMED_OUT) /* a fired one-shot timer is gone already */
        async_runtime_cancel_timer(r->rt, s->timer);

    char query[DNS_MAX_QUERY]; /* the callback may reuse the slot */
    memcpy(query, s->query, sizeof query);
    dns_result_t res = {.id = id,
                        .state = state,
                        .kind = s->kind,
                        .query = query,
                        .user = s->user,
                        .error = state == DNS_FAILED ? error : 0,
                        .answer = (state == DNS_RESOLVED || state == DNS_FAILED) ? answer : NULL,
                        .elapsed_ms = (double)(mono_us() - s->start_us) / 1000.0};

    atomic_store(&r->sh->live[i], 0);
    s->id = 0;
    s->timer = 0;
    r->free_slots[r->nfree++] = i;
    r->stats.inflight--;
    switch (state) {
    case DNS_RESOLVED:
        r->stats.resolved++;
        break;
    case DNS_FAILED:
        r->stats.failed++;
        break;
    case DNS_TIMED_OUT:
        r->stats.timed_out++;
        break;
    case DNS_CANCELLED:
        r->stats.cancelled++;
        break;
    }
    r->callback(&res, r->cb_arg);
}

static void drain_replies(dns_resolver_t *r)
{
    struct reply rep;
    size_t n;
    while (!r->closing && async_queue_dequeue(r->sh->replies, &rep, sizeof rep, &n)) {
        if (rep.slot >= r->sh->nslots || r->slots[rep.slot].id != rep.id) {
            r->stats.late_results++; /* timed out or cancelled before the worker finished */
            continue;
        }
        finish(r, rep.slot, rep.id, rep.error == 0 ? DNS_RESOLVED : DNS_FAILED, rep.error, &rep.answer);
    }
}

bool dns_resolver_handle_event(dns_resolver_t *r, const io_event_t *ev)
{
    if (r == NULL || ev->fd != -1 || ev->completion_key != r->key)
        return false;
    if (ev->event_type & ASYNC_EVENT_COMPLETION) {
        drain_replies(r);
    } else if (ev->event_type & ASYNC_EVENT_TIMER) {
        for (uint32_t i = 0; i < r->sh->nslots; i++) {
            /* compared as uintptr_t: on 32-bit platforms ev->data holds a truncated id */
            if (r->slots[i].id != 0 && (uintptr_t)r->slots[i].timer == ev->data) {
                finish(r, i, r->slots[i].id, DNS_TIMED_OUT, 0, NULL);
                break;
            }
        }
    }
    return true;
}

uint64_t dns_submit(dns_resolver_t *r, dns_kind_t kind, const char *query, unsigned timeout_ms, void *user)
{
    size_t len = query ? strlen(query) : 0;
    if (r == NULL || len == 0 || len >= DNS_MAX_QUERY || (kind != DNS_FORWARD && kind != DNS_REVERSE)) {
        errno = EINVAL;
        return 0;
    }
    if (r->closing) {
        errno = ESHUTDOWN;
        return 0;
    }
    if (r->nfree == 0) {
        r->stats.rejected_busy++;
        errno = EBUSY;
        return 0;
    }
    uint32_t i = r->free_slots[r->nfree - 1];
    uint64_t id = ++r->seq * r->sh->nslots + i + 1; /* never 0, never reused; slot = (id - 1) % nslots */
    int64_t start_us = mono_us(); /* before the timer starts: elapsed_ms >= the timeout when it fires */
    uint64_t timer = async_runtime_add_timer(r->rt, timeout_ms ? timeout_ms : r->cfg.timeout_ms, 0, r->key);
    if (timer == 0) {
        errno = ENOMEM;
        return 0;
    }
    struct job job = {.id = id, .slot = i, .kind = (uint32_t)kind};
    memcpy(job.query, query, len + 1);
    atomic_store(&r->sh->live[i], id); /* before a worker can see the job */
    if (!async_queue_enqueue(r->sh->jobs, &job, offsetof(struct job, query) + len + 1)) {
        int e = async_last_error();
        atomic_store(&r->sh->live[i], 0);
        async_runtime_cancel_timer(r->rt, timer);
        if (e == ASYNC_E_FULL)
            r->stats.rejected_busy++;
        errno = e == ASYNC_E_FULL ? EBUSY : ENOMEM;
        return 0;
    }
    r->nfree--;
    struct slot *s = &r->slots[i];
    s->id = id;
    s->timer = timer;
    s->start_us = start_us;
    s->kind = kind;
    s->user = user;
    memcpy(s->query, query, len + 1);
    r->stats.submitted++;
    r->stats.inflight++;
    return id;
}

int dns_cancel(dns_resolver_t *r, uint64_t id)
{
    if (r == NULL || id == 0) {
        errno = ENOENT;
        return -1;
    }
    uint32_t i = (uint32_t)((id - 1) % r->sh->nslots);
    if (r->slots[i].id != id) {
        errno = ENOENT;
        return -1;
    }
    finish(r, i, id, DNS_CANCELLED, 0, NULL);
    return 0;
}

void dns_resolver_get_stats(const dns_resolver_t *r, dns_stats_t *stats)
{
    *stats = r->stats;
    stats->skipped = atomic_load(&r->sh->skipped);
}

void dns_resolver_destroy(dns_resolver_t *r)
{
    if (r == NULL)
        return;
    struct shared *sh = r->sh;

    /* 1. Everyone still waiting hears CANCELLED, exactly once. A callback
     * that submits now is refused (ESHUTDOWN), so none is left behind. */
    r->closing = true;
    for (uint32_t i = 0; r->slots && i < sh->nslots; i++)
        if (r->slots[i].id != 0)
            finish(r, i, r->slots[i].id, DNS_CANCELLED, 0, NULL);

    /* 2. Stop the workers. The stop ends their own queue waits: an idle one
     * in dequeue_wait and one blocked handing in a reply both wake with
     * ASYNC_E_CANCELLED (no stop message needed). The flag covers a worker
     * inside the resolver function. */
    atomic_store(&sh->stopping, true);
    if (sh->jobs)
        async_queue_clear(sh->jobs); /* pending jobs belong to cancelled requests */
    for (unsigned w = 0; w < r->nworkers; w++)
        async_worker_signal_stop(r->workers[w]);
    if (sh->replies) {
        async_queue_attach(sh->replies, NULL, 0);
        async_queue_destroy(sh->replies);
    }

    /* 3. Join within the grace period; detach whoever is still stuck inside
     * the resolver function (async_worker_destroy on a running worker). */
    int64_t deadline = mono_us() + (int64_t)r->cfg.shutdown_grace_ms * 1000;
    for (unsigned w = 0; w < r->nworkers; w++) {
        int64_t left_ms = (deadline - mono_us()) / 1000;
        async_worker_join(r->workers[w], left_ms > 0 ? (int)left_ms : 0);
        async_worker_destroy(r->workers[w]);
    }
    if (sh->jobs)
        async_queue_destroy(sh->jobs);

    free(r->workers);
    free(r->slots);
    free(r->free_slots);
    free(r);
    shared_release(sh); /* freed now, or by the last detached worker */
}

dns_resolver_t *dns_resolver_create(async_runtime_t *rt, uintptr_t key, const dns_config_t *config,
                                    dns_callback_t callback, void *cb_arg)
{
    dns_config_t cfg = {0};
    if (config)
        cfg = *config;
    if (cfg.workers == 0)
        cfg.workers = 4;
    if (cfg.max_inflight == 0)
        cfg.max_inflight = 256;
    if (cfg.timeout_ms == 0)
        cfg.timeout_ms = 5000;
    if (cfg.shutdown_grace_ms == 0)
        cfg.shutdown_grace_ms = 1000;
    if (cfg.resolve == NULL)
        cfg.resolve = dns_resolve_system;
    if (rt == NULL || callback == NULL || cfg.workers > 1024 || cfg.max_inflight > 1u << 20 ||
        cfg.shutdown_grace_ms > INT32_MAX) {
        errno = EINVAL;
        return NULL;
    }

    dns_resolver_t *r = calloc(1, sizeof *r);
    struct shared *sh = calloc(1, sizeof *sh + cfg.max_inflight * sizeof sh->live[0]);
    if (r == NULL || sh == NULL) {
        free(r);
        free(sh);
        errno = ENOMEM;
        return NULL;
    }
    atomic_init(&sh->refs, 1);
    sh->resolve = cfg.resolve;
    sh->resolve_arg = cfg.resolve_arg;
    sh->nslots = cfg.max_inflight;
    r->sh = sh;
    r->rt = rt;
    r->key = key;
    r->callback = callback;
    r->cb_arg = cb_arg;
    r->cfg = cfg;
    r->slots = calloc(cfg.max_inflight, sizeof *r->slots);
    r->free_slots = calloc(cfg.max_inflight, sizeof *r->free_slots);
    r->workers = calloc(cfg.workers, sizeof *r->workers);
    if (r->slots == NULL || r->free_slots == NULL || r->workers == NULL) {
        dns_resolver_destroy(r);
        errno = ENOMEM;
        return NULL;
    }
    for (unsigned i = 0; i < cfg.max_inflight; i++)
        r->free_slots[r->nfree++] = cfg.max_inflight - 1 - i; /* slot 0 is used first */

    /* Jobs: room for every slot plus one per worker, so a submit that fails
     * FULL means stale jobs are piling up behind stuck workers. */
    sh->jobs = async_queue_create(cfg.max_inflight + cfg.workers, sizeof(struct job), 0);
    sh->replies = async_queue_create(cfg.max_inflight, sizeof(struct reply),
                                     ASYNC_QUEUE_BLOCK_WRITER | ASYNC_QUEUE_SIGNAL_ON_DATA);
    if (sh->jobs == NULL || sh->replies == NULL || async_queue_attach(sh->replies, rt, key) != 0) {
        dns_resolver_destroy(r);
        errno = EAGAIN;
        return NULL;
    }
    for (unsigned w = 0; w < cfg.workers; w++) {
        atomic_fetch_add(&sh->refs, 1);
        atomic_fetch_add(&g_live_workers, 1);
        r->workers[w] = async_worker_create(worker_main, sh, 0);
        if (r->workers[w] == NULL) {
            atomic_fetch_sub(&sh->refs, 1);
            atomic_fetch_sub(&g_live_workers, 1);
            dns_resolver_destroy(r);
            errno = EAGAIN;
            return NULL;
        }
        r->nworkers++;
    }
    return r;
}
