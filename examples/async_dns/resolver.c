/*
 * resolver.c — see resolver.h.
 *
 * How exactly-once is guaranteed
 * ------------------------------
 * A request's state lives in a slot owned by the loop thread alone. Every way
 * a request can end — its lookup's result, its timer, dns_cancel, destroy —
 * runs on the loop thread and goes through finish(), which ends the request
 * only if the slot still holds that request's id, frees the slot, and then
 * calls the callback. Whatever comes second (a result after a timeout, a
 * timer after a result, a second cancel) finds the slot empty or holding
 * another id and is ignored. There is no lock because there is no race: the
 * pool never changes a request's state, it only hands back results.
 *
 * The lookups run on libasync's pool: async_runtime_submit_work runs
 * lookup_run there and delivers the job as a completion with the resolver's
 * key (exactly once). At most `workers` jobs of a resolver are on the pool
 * at once; the others wait in the backlog, a FIFO on the loop thread. A job
 * whose request ended while it waited (in the backlog, or on the pool before
 * it started: async_runtime_cancel_work) is dropped unrun.
 *
 * Why a stuck resolver cannot hang anything
 * -----------------------------------------
 * The loop never waits for the pool: submissions never block, results come
 * back as completions, and timeouts are runtime timers on the loop. Destroy
 * waits at most shutdown_grace_ms for lookups still running and then leaves
 * them. A job is shared by two owners, the loop and the pool, and freed by
 * whichever lets go last (refs); what a running lookup reads besides its
 * job (the resolver function, `stopping`) lives in `struct shared`, which
 * each job on the pool keeps alive. So a lookup that returns from
 * getaddrinfo minutes after destroy finds valid memory, and its completion
 * (posted to the runtime, which the caller ignores after destroy, or
 * dropped by libasync if the runtime is gone) is never read.
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

/* What the lookups share with the loop; freed by whoever drops the last
 * reference (the resolver's, and one per job on the pool). */
struct shared {
    atomic_uint refs;
    atomic_bool stopping;
    atomic_uint on_pool; /* this resolver's jobs the pool holds */
    dns_resolve_fn resolve;
    void *resolve_arg;
};

/* One lookup. refs: the loop's (until its result is handled, or destroy)
 * plus the pool's (from submit until lookup_run ends, or the job is
 * cancelled or dropped unrun). */
struct job {
    atomic_uint refs;
    struct shared *sh;
    uint64_t id;
    uint64_t work_id; /* async_runtime_submit_work's id; 0 while in the backlog */
    uint32_t slot;
    dns_kind_t kind;
    int error;
    struct job *prev, *next; /* the loop's list of jobs on the pool */
    dns_answer_t answer;
    char query[DNS_MAX_QUERY];
};

struct slot {
    uint64_t id; /* 0: free */
    uint64_t timer;
    int64_t start_us;
    dns_kind_t kind;
    void *user;
    struct job *job;
    char query[DNS_MAX_QUERY];
};

struct dns_resolver {
    async_runtime_t *rt;
    uintptr_t key;
    dns_callback_t callback;
    void *cb_arg;
    dns_config_t cfg;
    struct shared *sh;
    struct slot *slots;
    uint32_t *free_slots; /* a stack of free slot indices */
    unsigned nfree;
    struct job **backlog; /* a ring of max_inflight + workers jobs */
    unsigned backlog_cap, backlog_head, backlog_len;
    struct job *pool_jobs; /* jobs on the pool whose result the loop has not handled */
    unsigned running;      /* how many */
    uint64_t seq;
    bool closing;
    dns_stats_t stats;
};

static atomic_uint g_on_pool; /* jobs of every resolver the pool holds */

unsigned dns_live_workers(void)
{
    return atomic_load(&g_on_pool);
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
/* Jobs on the pool                                                        */
/* ---------------------------------------------------------------------- */

static void shared_release(struct shared *sh)
{
    if (atomic_fetch_sub(&sh->refs, 1) == 1)
        free(sh);
}

static void job_release(struct job *j)
{
    if (atomic_fetch_sub(&j->refs, 1) == 1)
        free(j);
}

/* The pool lets go of j (it ran, or never will). */
static void job_leave_pool(struct job *j)
{
    struct shared *sh = j->sh;
    atomic_fetch_sub(&sh->on_pool, 1);
    atomic_fetch_sub(&g_on_pool, 1);
    job_release(j);
    shared_release(sh);
}

/* On a pool thread: the lookup. Its result is the job itself, handed to the
 * loop as the completion's data. */
static uintptr_t lookup_run(void *arg)
{
    struct job *j = arg;
    if (!atomic_load(&j->sh->stopping))
        j->error = j->sh->resolve(j->kind, j->query, &j->answer, j->sh->resolve_arg);
    job_leave_pool(j); /* the loop's reference keeps j while the result travels */
    return (uintptr_t)j;
}

/* The runtime was deinitialised first: nothing is delivered. A job that ran
 * has left the pool already. */
static void lookup_drop(void *arg, uintptr_t result, int ran)
{
    (void)result;
    if (!ran)
        job_leave_pool(arg);
}

/* Puts j on the pool; 0, or -1 with libasync's error. */
static int job_submit(dns_resolver_t *r, struct job *j)
{
    atomic_fetch_add(&j->refs, 1);
    atomic_fetch_add(&r->sh->refs, 1);
    atomic_fetch_add(&r->sh->on_pool, 1);
    atomic_fetch_add(&g_on_pool, 1);
    j->work_id = async_runtime_submit_work(r->rt, lookup_run, j, r->key, lookup_drop);
    if (j->work_id == 0) {
        job_leave_pool(j);
        return -1;
    }
    j->prev = NULL;
    j->next = r->pool_jobs;
    if (r->pool_jobs)
        r->pool_jobs->prev = j;
    r->pool_jobs = j;
    r->running++;
    return 0;
}

/* j's result was handled, or it was cancelled before it started: off the
 * loop's list. */
static void job_unlist(dns_resolver_t *r, struct job *j)
{
    if (j->prev)
        j->prev->next = j->next;
    else
        r->pool_jobs = j->next;
    if (j->next)
        j->next->prev = j->prev;
    r->running--;
}

/* Takes j off the pool if it has not started there (it is then dropped
 * unrun); 1 if it was. */
static int job_cancel(dns_resolver_t *r, struct job *j)
{
    if (j->work_id == 0 || async_runtime_cancel_work(r->rt, j->work_id) != 0)
        return 0;
    job_unlist(r, j);
    job_leave_pool(j);
    job_release(j);
    r->stats.skipped++;
    return 1;
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
    if (s->job) /* its lookup has not started yet: it never will */
        job_cancel(r, s->job);

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

    s->id = 0;
    s->timer = 0;
    s->job = NULL;
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

/* Moves jobs from the backlog to the pool while fewer than `workers` run
 * there; a job whose request ended while it waited is dropped unrun. */
static void dispatch(dns_resolver_t *r)
{
    while (!r->closing && r->backlog_len > 0 && r->running < r->cfg.workers) {
        struct job *j = r->backlog[r->backlog_head];
        r->backlog_head = (r->backlog_head + 1) % r->backlog_cap;
        r->backlog_len--;
        struct slot *s = &r->slots[j->slot];
        if (s->id != j->id) {
            r->stats.skipped++; /* ended while queued */
            job_release(j);
            continue;
        }
        if (job_submit(r, j) != 0) { /* the pool refused it: the request fails */
            dns_answer_t a;
            uint32_t i = j->slot;
            memset(&a, 0, sizeof a);
            snprintf(a.message, sizeof a.message, "libasync: %s", async_strerror(async_last_error()));
            s->job = NULL;
            job_release(j);
            finish(r, i, s->id, DNS_FAILED, EAI_AGAIN, &a);
        }
    }
}

/* A lookup's result (the completion lookup_run's job came in). */
static void handle_result(dns_resolver_t *r, struct job *j)
{
    job_unlist(r, j);
    struct slot *s = &r->slots[j->slot];
    if (s->id == j->id) {
        s->job = NULL;
        finish(r, j->slot, j->id, j->error == 0 ? DNS_RESOLVED : DNS_FAILED, j->error, &j->answer);
    } else {
        r->stats.late_results++; /* timed out or cancelled before its lookup returned */
    }
    job_release(j);
    dispatch(r);
}

bool dns_resolver_handle_event(dns_resolver_t *r, const io_event_t *ev)
{
    if (r == NULL || ev->fd != -1 || ev->completion_key != r->key)
        return false;
    if (ev->event_type & ASYNC_EVENT_COMPLETION) {
        handle_result(r, (struct job *)ev->data);
    } else if (ev->event_type & ASYNC_EVENT_TIMER) {
        for (uint32_t i = 0; i < r->cfg.max_inflight; i++) {
            /* compared as uintptr_t: on 32-bit platforms ev->data holds a truncated id */
            if (r->slots[i].id != 0 && (uintptr_t)r->slots[i].timer == ev->data) {
                finish(r, i, r->slots[i].id, DNS_TIMED_OUT, 0, NULL);
                break;
            }
        }
        dispatch(r); /* a lookup taken off the pool made room */
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
    if (r->nfree == 0 || r->backlog_len == r->backlog_cap) {
        r->stats.rejected_busy++;
        errno = EBUSY;
        return 0;
    }
    struct job *j = calloc(1, sizeof *j);
    if (j == NULL) {
        errno = ENOMEM;
        return 0;
    }
    uint32_t i = r->free_slots[r->nfree - 1];
    uint64_t id = ++r->seq * r->cfg.max_inflight + i + 1; /* never 0, never reused; slot = (id - 1) % max_inflight */
    int64_t start_us = mono_us(); /* before the timer starts: elapsed_ms >= the timeout when it fires */
    uint64_t timer = async_runtime_add_timer(r->rt, timeout_ms ? timeout_ms : r->cfg.timeout_ms, 0, r->key);
    if (timer == 0) {
        free(j);
        errno = ENOMEM;
        return 0;
    }
    atomic_init(&j->refs, 1);
    j->sh = r->sh;
    j->id = id;
    j->slot = i;
    j->kind = kind;
    memcpy(j->query, query, len + 1);
    if (r->running < r->cfg.workers && r->backlog_len == 0) {
        if (job_submit(r, j) != 0) {
            int e = async_last_error();
            async_runtime_cancel_timer(r->rt, timer);
            job_release(j);
            if (e == ASYNC_E_FULL)
                r->stats.rejected_busy++;
            errno = e == ASYNC_E_FULL ? EBUSY : ENOMEM;
            return 0;
        }
    } else {
        r->backlog[(r->backlog_head + r->backlog_len++) % r->backlog_cap] = j;
    }
    r->nfree--;
    struct slot *s = &r->slots[i];
    s->id = id;
    s->timer = timer;
    s->start_us = start_us;
    s->kind = kind;
    s->user = user;
    s->job = j;
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
    uint32_t i = (uint32_t)((id - 1) % r->cfg.max_inflight);
    if (r->slots[i].id != id) {
        errno = ENOENT;
        return -1;
    }
    finish(r, i, id, DNS_CANCELLED, 0, NULL);
    dispatch(r); /* a lookup taken off the pool made room */
    return 0;
}

void dns_resolver_get_stats(const dns_resolver_t *r, dns_stats_t *stats)
{
    *stats = r->stats;
}

void dns_resolver_destroy(dns_resolver_t *r)
{
    if (r == NULL)
        return;
    struct shared *sh = r->sh;

    /* 1. Everyone still waiting hears CANCELLED, exactly once (a job that
     * has not started on the pool is taken off it). A callback that submits
     * now is refused (ESHUTDOWN), so none is left behind. */
    r->closing = true;
    for (uint32_t i = 0; r->slots && i < r->cfg.max_inflight; i++)
        if (r->slots[i].id != 0)
            finish(r, i, r->slots[i].id, DNS_CANCELLED, 0, NULL);

    /* 2. The backlog never reached the pool; the lookups still running are
     * left to the pool, which frees them when they return (their results
     * are never read). A lookup not started yet skips the resolver. */
    atomic_store(&sh->stopping, true);
    for (; r->backlog_len > 0; r->backlog_len--) {
        job_release(r->backlog[r->backlog_head]);
        r->backlog_head = (r->backlog_head + 1) % r->backlog_cap;
    }
    while (r->pool_jobs) {
        struct job *j = r->pool_jobs;
        if (!job_cancel(r, j)) {
            job_unlist(r, j);
            job_release(j);
        }
    }

    /* 3. Give the running lookups the grace period to return, then leave
     * them (a getaddrinfo stuck for minutes never hangs the caller). */
    int64_t deadline = mono_us() + (int64_t)r->cfg.shutdown_grace_ms * 1000;
    while (atomic_load(&sh->on_pool) > 0 && mono_us() < deadline) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }

    free(r->slots);
    free(r->free_slots);
    free(r->backlog);
    free(r);
    shared_release(sh); /* freed now, or by the last lookup to return */
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
    struct shared *sh = calloc(1, sizeof *sh);
    if (r == NULL || sh == NULL) {
        free(r);
        free(sh);
        errno = ENOMEM;
        return NULL;
    }
    atomic_init(&sh->refs, 1);
    sh->resolve = cfg.resolve;
    sh->resolve_arg = cfg.resolve_arg;
    r->sh = sh;
    r->rt = rt;
    r->key = key;
    r->callback = callback;
    r->cb_arg = cb_arg;
    r->cfg = cfg;
    /* Backlog: room for every slot plus one per worker, so a submit that
     * fails EBUSY with slots free means stale jobs are piling up behind
     * stuck lookups. */
    r->backlog_cap = cfg.max_inflight + cfg.workers;
    r->slots = calloc(cfg.max_inflight, sizeof *r->slots);
    r->free_slots = calloc(cfg.max_inflight, sizeof *r->free_slots);
    r->backlog = calloc(r->backlog_cap, sizeof *r->backlog);
    if (r->slots == NULL || r->free_slots == NULL || r->backlog == NULL) {
        dns_resolver_destroy(r);
        errno = ENOMEM;
        return NULL;
    }
    for (unsigned i = 0; i < cfg.max_inflight; i++)
        r->free_slots[r->nfree++] = cfg.max_inflight - 1 - i; /* slot 0 is used first */
    return r;
}
