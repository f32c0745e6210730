/*
 * http_server — an HTTP/1.1 server on fibers: keep-alive, pipelining,
 * bounded requests, idle timeouts, and a graceful stop on SIGTERM/SIGINT.
 * Every request (any method, any path) gets "Hello, World!" (HEAD: the
 * head only). See docs/EXAMPLES.md.
 *
 * usage: http_server [--host ADDR] [--port N] [--workers N] [--idle-ms MS]
 *                    [--drain-ms MS] [--max-head BYTES] [--max-body BYTES]
 *                    [--backlog N] [--tls-cert PEM --tls-key PEM]
 *
 * --tls-cert/--tls-key (HTTPS) exist when it was built with OpenSSL
 * (examples/fiber_tls); the certificate file may hold a chain.
 *
 * It prints "listening on ADDR:PORT" on stdout once it accepts (--port 0:
 * a free port), and exits 0 after a graceful stop.
 */
#define _GNU_SOURCE 1
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "async.h"
#include "server.h"

#ifdef HTTP_SERVER_TLS
#include <openssl/err.h>
#include <openssl/ssl.h>
#endif

struct app {
    server_config_t cfg;
    int workers;
    const char *tls_cert, *tls_key;
    async_sched_t *sched;
    server_t server;
    async_scope_t *signals; /* the fibers waiting for SIGINT and SIGTERM */
    int failed;
};

static void usage(void)
{
    fprintf(stderr, "usage: http_server [--host ADDR] [--port N] [--workers N] [--idle-ms MS] [--drain-ms MS]\n"
                    "                   [--max-head BYTES] [--max-body BYTES] [--backlog N]\n"
#ifdef HTTP_SERVER_TLS
                    "                   [--tls-cert PEM --tls-key PEM]\n"
#endif
    );
    exit(2);
}

/* A decimal in [lo, hi], or the usage message. */
static long long number(const char *opt, const char *s, long long lo, long long hi)
{
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "http_server: %s wants a number from %lld to %lld\n", opt, lo, hi);
        usage();
    }
    return v;
}

static void parse_args(struct app *a, int argc, char **argv)
{
    a->cfg = (server_config_t){.host = "127.0.0.1", .port = 8080, .idle_ms = 10000, .drain_ms = 5000};
    a->workers = 1;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0)
            usage();
        if (!v)
            usage();
        i++;
        if (strcmp(o, "--host") == 0)
            a->cfg.host = v;
        else if (strcmp(o, "--port") == 0)
            a->cfg.port = (int)number(o, v, 0, 65535);
        else if (strcmp(o, "--workers") == 0)
            a->workers = (int)number(o, v, 1, 256);
        else if (strcmp(o, "--idle-ms") == 0)
            a->cfg.idle_ms = (int)number(o, v, 1, INT_MAX);
        else if (strcmp(o, "--drain-ms") == 0)
            a->cfg.drain_ms = (int)number(o, v, 0, INT_MAX);
        else if (strcmp(o, "--max-head") == 0)
            a->cfg.limits.max_head = (size_t)number(o, v, 64, 1 << 20);
        else if (strcmp(o, "--max-body") == 0)
            a->cfg.limits.max_body = (uint64_t)number(o, v, 1, LLONG_MAX);
        else if (strcmp(o, "--backlog") == 0)
            a->cfg.backlog = (int)number(o, v, 0, INT_MAX);
#ifdef HTTP_SERVER_TLS
        else if (strcmp(o, "--tls-cert") == 0)
            a->tls_cert = v;
        else if (strcmp(o, "--tls-key") == 0)
            a->tls_key = v;
#endif
        else
            usage();
    }
    if (!a->tls_cert != !a->tls_key) {
        fprintf(stderr, "http_server: --tls-cert and --tls-key go together\n");
        usage();
    }
}

#ifdef HTTP_SERVER_TLS
/* The server's TLS settings: TLS 1.2 or later, the certificate (chain) and key. */
static int tls_setup(struct app *a)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx || !SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) ||
        SSL_CTX_use_certificate_chain_file(ctx, a->tls_cert) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, a->tls_key, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
        char err[256];
        ERR_error_string_n(ERR_get_error(), err, sizeof err);
        fprintf(stderr, "http_server: TLS certificate %s, key %s: %s\n", a->tls_cert, a->tls_key, err);
        SSL_CTX_free(ctx);
        return -1;
    }
    a->cfg.tls = ctx;
    return 0;
}
#endif

/* Each connection holds a descriptor: allow as many as the hard limit. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

struct sigwait {
    struct app *app;
    int signo;
};

/* Returns when its signal arrives (and cancels the other waiter), or when
 * the other waiter cancelled it. */
static void on_signal(void *arg)
{
    struct sigwait *w = arg;
    if (async_fiber_wait_signal(w->signo, -1) < 0)
        return;
    fprintf(stderr, "http_server: %s: stopping\n", strsignal(w->signo));
    async_scope_cancel(w->app->signals);
}

/* The main fiber: starts the server, waits for a signal, stops it. */
static void app_main(void *arg)
{
    struct app *a = arg;
    async_fiber_set_name(NULL, "http-main");
    if (server_start(&a->server, a->sched, &a->cfg) < 0) {
        a->failed = 1;
        return;
    }
    const char *h = a->cfg.host && *a->cfg.host ? a->cfg.host : "0.0.0.0";
    printf(strchr(h, ':') ? "listening on [%s]:%d%s\n" : "listening on %s:%d%s\n", h, a->server.port,
           a->cfg.tls ? " (https)" : "");
    fflush(stdout);
    struct sigwait ws[2] = {{a, SIGINT}, {a, SIGTERM}};
    a->signals = async_scope_create(a->sched, NULL, -1);
    if (!a->signals || !async_scope_spawn(a->signals, on_signal, &ws[0], 0) ||
        !async_scope_spawn(a->signals, on_signal, &ws[1], 0)) {
        fprintf(stderr, "http_server: %s\n", async_strerror(async_last_error()));
        a->failed = 1;
    } else {
        async_scope_join(a->signals, -1); /* until one signal came */
    }
    if (a->signals) {
        async_scope_cancel(a->signals);
        async_scope_join(a->signals, -1);
        async_scope_destroy(a->signals);
    }
    server_stop(&a->server);
}

int main(int argc, char **argv)
{
    static struct app a;
    parse_args(&a, argc, argv);
#ifdef HTTP_SERVER_TLS
    if (a.tls_cert && tls_setup(&a) < 0)
        return 1;
#endif
    raise_fd_limit();
    /* Counted from now on, not acted on: the default action would end the process before the drain. Ignored
     * before the watch, so that the action the unwatch at the end puts back is "ignore": a second signal
     * during the teardown does not end the process either. */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    if (async_fiber_watch_signal(SIGINT) < 0 || async_fiber_watch_signal(SIGTERM) < 0) {
        fprintf(stderr, "http_server: watch signals: %s\n", async_strerror(async_last_error()));
        return 1;
    }
    async_sched_config_t sc = {.workers = a.workers};
    a.sched = async_sched_create(&sc);
    if (!a.sched) {
        fprintf(stderr, "http_server: scheduler: %s\n", async_strerror(async_last_error()));
        return 1;
    }
    if (!async_fiber_spawn(a.sched, app_main, &a, 0)) {
        fprintf(stderr, "http_server: spawn: %s\n", async_strerror(async_last_error()));
        a.failed = 1;
    }
    async_sched_run(a.sched); /* until every fiber returned: after the stop */
    async_sched_destroy(a.sched);
    async_fiber_unwatch_signal(SIGINT);
    async_fiber_unwatch_signal(SIGTERM);
#ifdef HTTP_SERVER_TLS
    SSL_CTX_free(a.cfg.tls);
#endif
    return a.failed ? 1 : 0;
}
