/*
 * async_dns — resolve the names given as arguments, concurrently, with the
 * resolver module (resolver.h) on a libasync event loop.
 *
 * usage: async_dns [-r] [-t TIMEOUT_MS] [-w WORKERS] [-j MAX_INFLIGHT] NAME...
 *   -r  reverse lookups: each NAME is a numeric address
 *   -t  per-lookup timeout (default 5000 ms)
 *   -w  lookups running at once on libasync's pool (default 4)
 *   -j  lookups in flight at once (default 256); the rest wait their turn
 *
 * Prints one line per name as answers arrive (so in completion order):
 *   localhost: 127.0.0.1 ::1 (0.4 ms)
 *   foo..bar: failed: Name or service not known (0.1 ms)
 * Exit status: 0 if every name resolved, 1 otherwise, 2 on bad usage,
 * 130 when interrupted (Ctrl-C cancels whatever is still in flight).
 */
#define _GNU_SOURCE 1
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "async.h"
#include "resolver.h"

#define KEY_DNS 1

struct cli {
    dns_resolver_t *resolver;
    dns_kind_t kind;
    unsigned timeout_ms;
    char **names;
    int nnames;
    int next;      /* the next name to submit */
    int answered;  /* names told a terminal state (or refused) */
    int failures;
};

static volatile sig_atomic_t g_interrupted;
static async_runtime_t *volatile g_rt;

static void on_sigint(int sig)
{
    (void)sig;
    g_interrupted = 1;
    if (g_rt)
        async_runtime_wakeup(g_rt); /* async-signal-safe */
}

/* Submits names while the resolver accepts them; the rest are submitted from
 * the callback as slots free up. */
static void submit_more(struct cli *c)
{
    while (c->next < c->nnames) {
        const char *name = c->names[c->next];
        if (dns_submit(c->resolver, c->kind, name, c->timeout_ms, NULL) != 0) {
            c->next++;
            continue;
        }
        if (errno == EBUSY)
            return; /* full: wait for an answer */
        printf("%s: refused: %s\n", name, strerror(errno));
        c->next++;
        c->answered++;
        c->failures++;
    }
}

static void on_result(const dns_result_t *res, void *arg)
{
    struct cli *c = arg;
    c->answered++;
    if (res->state == DNS_RESOLVED && res->kind == DNS_FORWARD) {
        printf("%s:", res->query);
        for (int i = 0; i < res->answer->naddrs; i++)
            printf(" %s", res->answer->addrs[i]);
        printf(" (%.1f ms)\n", res->elapsed_ms);
    } else if (res->state == DNS_RESOLVED) {
        printf("%s: %s (%.1f ms)\n", res->query, res->answer->host, res->elapsed_ms);
    } else if (res->state == DNS_FAILED) {
        printf("%s: failed: %s (%.1f ms)\n", res->query, res->answer->message, res->elapsed_ms);
        c->failures++;
    } else {
        printf("%s: %s after %.0f ms\n", res->query, dns_state_name(res->state), res->elapsed_ms);
        c->failures++;
    }
    fflush(stdout);
    if (!g_interrupted)
        submit_more(c);
}

static void usage(void)
{
    fprintf(stderr, "usage: async_dns [-r] [-t TIMEOUT_MS] [-w WORKERS] [-j MAX_INFLIGHT] NAME...\n");
}

static bool parse_opt(const char *s, unsigned *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > 3600000)
        return false;
    *out = (unsigned)v;
    return true;
}

int main(int argc, char **argv)
{
    struct cli c = {.kind = DNS_FORWARD};
    dns_config_t cfg = {0};
    int i = 1;
    for (; i < argc && argv[i][0] == '-' && argv[i][1] != '\0'; i++) {
        const char *opt = argv[i];
        unsigned *target = NULL;
        if (strcmp(opt, "-r") == 0) {
            c.kind = DNS_REVERSE;
            continue;
        } else if (strcmp(opt, "--") == 0) {
            i++;
            break;
        } else if (strcmp(opt, "-t") == 0) {
            target = &c.timeout_ms;
        } else if (strcmp(opt, "-w") == 0) {
            target = &cfg.workers;
        } else if (strcmp(opt, "-j") == 0) {
            target = &cfg.max_inflight;
        }
        if (target == NULL || i + 1 >= argc || !parse_opt(argv[i + 1], target) ||
            (target == &cfg.workers && *target > 1024) || (target == &cfg.max_inflight && *target > 100000)) {
            fprintf(stderr, "async_dns: bad option '%s%s%s'\n", opt, i + 1 < argc ? " " : "",
                    i + 1 < argc ? argv[i + 1] : "");
            usage();
            return 2;
        }
        i++;
    }
    if (i >= argc) {
        usage();
        return 2;
    }
    c.names = argv + i;
    c.nnames = argc - i;

    async_runtime_t *rt = async_runtime_init();
    if (rt == NULL) {
        fprintf(stderr, "async_dns: async_runtime_init: %s\n", async_strerror(async_last_error()));
        return 1;
    }
    c.resolver = dns_resolver_create(rt, KEY_DNS, &cfg, on_result, &c);
    if (c.resolver == NULL) {
        fprintf(stderr, "async_dns: cannot create the resolver: %s\n", strerror(errno));
        async_runtime_deinit(rt);
        return 1;
    }
    g_rt = rt;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    submit_more(&c);
    io_event_t evs[64];
    while (c.answered < c.nnames && !g_interrupted) {
        int n = async_runtime_wait(rt, evs, 64, -1);
        if (n < 0) {
            fprintf(stderr, "async_dns: async_runtime_wait: %s\n", async_strerror(async_last_error()));
            break;
        }
        for (int k = 0; k < n; k++)
            dns_resolver_handle_event(c.resolver, &evs[k]); /* the resolver's are the only events */
    }

    /* Lookups still in flight (on Ctrl-C) are told CANCELLED and printed;
     * a getaddrinfo that is stuck is detached after the grace period. */
    dns_resolver_destroy(c.resolver);
    g_rt = NULL;
    async_runtime_deinit(rt);
    for (; c.next < c.nnames; c.next++) /* never submitted */
        printf("%s: not started\n", c.names[c.next]);
    /* Answers that could not be written (a full disk, a reader gone with
     * SIGPIPE ignored) are lost: say so, and never exit 0 for them. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "async_dns: writing the answers failed: %s\n", strerror(errno));
        return g_interrupted ? 130 : 1;
    }
    if (g_interrupted)
        return 130;
    return c.failures == 0 && c.answered == c.nnames ? 0 : 1;
}
