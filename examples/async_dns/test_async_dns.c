/*
 * test_async_dns — tests of the resolver module and the async_dns CLI.
 *
 * usage: test_async_dns CASE [PATH-TO-async_dns]
 * CASE: many | hang | cancel | busy | shutdown | fail | cli
 *
 * No network is needed: lookups use localhost, the names in /etc/hosts,
 * numeric addresses, names that cannot exist, and an injected resolver
 * function (test_resolve) that can hang on a gate, fail, or answer at once.
 * Timing checks are only generous semantic bounds (a timeout never fires
 * early; a hung lookup does not hold up the others).
 */
#include "../console_worker/child.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>

#include "async.h"
#include "resolver.h"

#define KEY_DNS 7
#define KEY_TICK 8
#define WAIT_MS 20000

/* ---------------------------------------------------------------------- */
/* The injected resolver                                                   */
/* ---------------------------------------------------------------------- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static bool g_gate_open;
static atomic_int g_started; /* calls that entered test_resolve */
static atomic_int g_hanging; /* calls waiting on the gate right now */
static char g_called[4096][48];
static int g_ncalled;

static void gate_set(bool open)
{
    pthread_mutex_lock(&g_mu);
    g_gate_open = open;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static bool was_called(const char *q)
{
    pthread_mutex_lock(&g_mu);
    bool found = false;
    for (int i = 0; i < g_ncalled && !found; i++)
        found = strcmp(g_called[i], q) == 0;
    pthread_mutex_unlock(&g_mu);
    return found;
}

/* "hang*": blocks until the gate opens. "fail*": fails with code 42.
 * "slow*": 20 ms then like "ok". "ok*": answers 192.0.2.1 at once.
 * Anything else: the system resolver. */
static int test_resolve(dns_kind_t kind, const char *q, dns_answer_t *a, void *arg)
{
    REQUIRE(arg == &g_mu);
    atomic_fetch_add(&g_started, 1);
    pthread_mutex_lock(&g_mu);
    if (g_ncalled < 4096)
        snprintf(g_called[g_ncalled++], sizeof g_called[0], "%s", q);
    pthread_mutex_unlock(&g_mu);
    if (strncmp(q, "hang", 4) == 0) {
        pthread_mutex_lock(&g_mu);
        atomic_fetch_add(&g_hanging, 1);
        while (!g_gate_open)
            pthread_cond_wait(&g_cv, &g_mu);
        atomic_fetch_sub(&g_hanging, 1);
        pthread_mutex_unlock(&g_mu);
        strcpy(a->addrs[0], "192.0.2.99");
        a->naddrs = 1;
        return 0;
    }
    if (strncmp(q, "fail", 4) == 0) {
        snprintf(a->message, sizeof a->message, "injected failure");
        return 42;
    }
    if (strncmp(q, "slow", 4) == 0)
        usleep(20 * 1000);
    if (strncmp(q, "slow", 4) == 0 || strncmp(q, "ok", 2) == 0) {
        strcpy(a->addrs[0], "192.0.2.1");
        a->naddrs = 1;
        return 0;
    }
    return dns_resolve_system(kind, q, a, NULL);
}

/* ---------------------------------------------------------------------- */
/* Requests and the loop                                                   */
/* ---------------------------------------------------------------------- */

struct req {
    char query[DNS_MAX_QUERY];
    uint64_t id;
    int told;          /* callbacks received: must end at exactly 1 */
    int order;         /* when it was told (1, 2, ...) */
    dns_state_t state;
    double elapsed_ms;
    int error;
    char message[128];
    int naddrs;
    char addrs[DNS_MAX_ADDRS][DNS_ADDR_LEN];
    char host[DNS_HOST_LEN];
    uint64_t ticks_at_told;
};

#define MAX_REQS 2048
static struct req g_reqs[MAX_REQS];
static int g_nreqs;
static int g_order;
static int g_told_total;
static async_runtime_t *g_rt;
static dns_resolver_t *g_r;
static uint64_t g_ticks; /* heartbeat timer events seen by the loop */
static bool g_in_destroy;

static void on_result(const dns_result_t *res, void *arg)
{
    REQUIRE(arg == &g_reqs);
    struct req *q = res->user;
    REQUIRE(q >= g_reqs && q < g_reqs + g_nreqs);
    REQUIRE(q->id == res->id);
    REQUIRE(strcmp(q->query, res->query) == 0);
    if (++q->told != 1)
        FAIL("request %llu (%s) told %d times", (unsigned long long)res->id, res->query, q->told);
    q->order = ++g_order;
    g_told_total++;
    q->state = res->state;
    q->elapsed_ms = res->elapsed_ms;
    q->error = res->error;
    q->ticks_at_told = g_ticks;
    REQUIRE((res->answer != NULL) == (res->state == DNS_RESOLVED || res->state == DNS_FAILED));
    if (res->answer) {
        snprintf(q->message, sizeof q->message, "%s", res->answer->message);
        q->naddrs = res->answer->naddrs;
        memcpy(q->addrs, res->answer->addrs, sizeof q->addrs);
        memcpy(q->host, res->answer->host, sizeof q->host);
    }
    if (g_in_destroy) { /* a callback run by destroy cannot start new work */
        REQUIRE(res->state == DNS_CANCELLED);
        errno = 0;
        REQUIRE(dns_submit(g_r, DNS_FORWARD, "ok-late", 0, NULL) == 0 && errno == ESHUTDOWN);
    }
}

static void setup(const dns_config_t *cfg)
{
    g_rt = async_runtime_init();
    REQUIRE(g_rt != NULL);
    g_r = dns_resolver_create(g_rt, KEY_DNS, cfg, on_result, &g_reqs);
    REQUIRE(g_r != NULL);
    REQUIRE(async_runtime_add_timer(g_rt, 20, 20, KEY_TICK) != 0);
}

static void teardown(void)
{
    g_in_destroy = true;
    dns_resolver_destroy(g_r);
    g_in_destroy = false;
    g_r = NULL;
    async_runtime_deinit(g_rt);
    g_rt = NULL;
}

static struct req *submit(dns_kind_t kind, const char *query, unsigned timeout_ms)
{
    REQUIRE(g_nreqs < MAX_REQS);
    struct req *q = &g_reqs[g_nreqs++];
    memset(q, 0, sizeof *q);
    snprintf(q->query, sizeof q->query, "%s", query);
    q->id = dns_submit(g_r, kind, query, timeout_ms, q);
    if (q->id == 0)
        FAIL("dns_submit(%s) refused: %s", query, strerror(errno));
    return q;
}

/* submit of the forward lookup of the name fmt makes of i ("ok-%d"). */
static struct req *submit_nth(const char *fmt, int i, unsigned timeout_ms)
{
    char name[32];
    snprintf(name, sizeof name, fmt, i);
    return submit(DNS_FORWARD, name, timeout_ms);
}

static void pump_once(int timeout_ms)
{
    io_event_t evs[64];
    int n = async_runtime_wait(g_rt, evs, 64, timeout_ms);
    REQUIRE(n >= 0);
    for (int i = 0; i < n; i++) {
        if (dns_resolver_handle_event(g_r, &evs[i]))
            continue;
        REQUIRE(evs[i].event_type == ASYNC_EVENT_TIMER && evs[i].completion_key == KEY_TICK);
        g_ticks++;
    }
}

/* Runs the loop until `cond` holds; fails after `ms`. */
#define PUMP_UNTIL(cond, ms)                                                                                   \
    do {                                                                                                       \
        int64_t pump_deadline_ = now_us() + (int64_t)(ms) * 1000;                                              \
        while (!(cond)) {                                                                                      \
            if (now_us() > pump_deadline_)                                                                     \
                FAIL("timed out waiting for %s", #cond);                                                       \
            pump_once(50);                                                                                     \
        }                                                                                                      \
    } while (0)

static void pump_for(int ms)
{
    int64_t end = now_us() + (int64_t)ms * 1000;
    while (now_us() < end)
        pump_once(10);
}

static dns_stats_t stats(void)
{
    dns_stats_t s;
    dns_resolver_get_stats(g_r, &s);
    return s;
}

/* Every request told exactly once, and the stats agree. */
static void check_all_told_once(void)
{
    pump_for(100); /* nothing more may arrive */
    for (int i = 0; i < g_nreqs; i++)
        if (g_reqs[i].told != 1)
            FAIL("request %d (%s) told %d times", i, g_reqs[i].query, g_reqs[i].told);
    dns_stats_t s = stats();
    REQUIRE(s.inflight == 0);
    REQUIRE(s.resolved + s.failed + s.timed_out + s.cancelled == s.submitted);
}

static bool has_addr(const struct req *q, const char *addr)
{
    for (int i = 0; i < q->naddrs; i++)
        if (strcmp(q->addrs[i], addr) == 0)
            return true;
    return false;
}

static void reset(void)
{
    g_nreqs = g_order = g_told_total = 0;
    g_ticks = 0;
    atomic_store(&g_started, 0);
    pthread_mutex_lock(&g_mu);
    g_ncalled = 0;
    pthread_mutex_unlock(&g_mu);
    gate_set(false);
}

/* ---------------------------------------------------------------------- */
/* /etc/hosts                                                              */
/* ---------------------------------------------------------------------- */

struct host_entry {
    char name[64];
    char addrs[4][DNS_ADDR_LEN]; /* canonical text of the addresses listed for it */
    int naddrs;
};

static int read_hosts(struct host_entry *out, int max)
{
    FILE *f = fopen("/etc/hosts", "r");
    if (f == NULL)
        return 0;
    int n = 0;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *save, *addr = strtok_r(line, " \t\r\n", &save);
        if (addr == NULL)
            continue;
        unsigned char bin[16];
        char canon[DNS_ADDR_LEN];
        int fam = strchr(addr, ':') ? AF_INET6 : AF_INET;
        if (inet_pton(fam, addr, bin) != 1 || !inet_ntop(fam, bin, canon, sizeof canon))
            continue;
        for (char *name; (name = strtok_r(NULL, " \t\r\n", &save)) != NULL;) {
            if (strlen(name) >= sizeof out[0].name)
                continue;
            int k = 0;
            while (k < n && strcmp(out[k].name, name) != 0)
                k++;
            if (k == n) {
                if (n == max)
                    continue;
                memset(&out[n], 0, sizeof out[n]);
                strcpy(out[n++].name, name);
            }
            if (out[k].naddrs < 4)
                strcpy(out[k].addrs[out[k].naddrs++], canon);
        }
    }
    fclose(f);
    return n;
}

/* ---------------------------------------------------------------------- */
/* Cases                                                                   */
/* ---------------------------------------------------------------------- */

/* Hundreds of concurrent lookups through the system resolver, all in flight
 * at once, each answered exactly once and correctly. */
static void case_many(void)
{
    dns_config_t cfg = {.workers = 8, .max_inflight = 512, .timeout_ms = 15000};
    setup(&cfg);
    struct host_entry hosts[32];
    int nhosts = read_hosts(hosts, 32);
    printf("names from /etc/hosts: %d\n", nhosts);

    static const char *numeric[] = {"127.0.0.1", "::1", "10.1.2.3", "2001:db8::5", "192.0.2.200"};
    static const char *bad[] = {"foo..bar", "bad name!", "-lead.example"};
    enum { N = 400 };
    int kinds[N]; /* 0 numeric, 1 hosts, 2 bad, 3 reverse of 127.0.0.1, 4 localhost */
    int which[N];
    for (int i = 0; i < N; i++) {
        int k = i % 5;
        if (k == 1 && nhosts == 0)
            k = 4;
        kinds[i] = k;
        switch (k) {
        case 0:
            which[i] = (i / 5) % 5;
            submit(DNS_FORWARD, numeric[which[i]], 0);
            break;
        case 1:
            which[i] = (i / 5) % nhosts;
            submit(DNS_FORWARD, hosts[which[i]].name, 0);
            break;
        case 2:
            which[i] = (i / 5) % 3;
            submit(DNS_FORWARD, bad[which[i]], 0);
            break;
        case 3:
            submit(DNS_REVERSE, "127.0.0.1", 0);
            break;
        case 4:
            submit(DNS_FORWARD, "localhost", 0);
            break;
        }
    }
    REQUIRE(stats().inflight == N); /* all concurrent: none answered before the loop runs */
    PUMP_UNTIL(g_told_total == N, 60000);
    check_all_told_once();

    const struct host_entry *lo = NULL; /* names listed for 127.0.0.1 */
    for (int h = 0; h < nhosts; h++)
        for (int a = 0; a < hosts[h].naddrs; a++)
            if (strcmp(hosts[h].addrs[a], "127.0.0.1") == 0 && lo == NULL)
                lo = &hosts[h];
    int resolved = 0, failed = 0, slowest = 0;
    for (int i = 0; i < N; i++) {
        struct req *q = &g_reqs[i];
        switch (kinds[i]) {
        case 0:
            if (q->state != DNS_RESOLVED || q->naddrs != 1 || !has_addr(q, numeric[which[i]]))
                FAIL("%s: %s, %d addresses (%s)", q->query, dns_state_name(q->state), q->naddrs, q->addrs[0]);
            break;
        case 1: {
            const struct host_entry *h = &hosts[which[i]];
            bool ok = false;
            for (int a = 0; a < h->naddrs; a++)
                ok = ok || has_addr(q, h->addrs[a]);
            if (q->state != DNS_RESOLVED || !ok)
                FAIL("%s (from /etc/hosts, %s): %s, first address %s", q->query, h->addrs[0],
                     dns_state_name(q->state), q->naddrs ? q->addrs[0] : "-");
            break;
        }
        case 2: /* no network: fails at once, or at worst times out */
            if (q->state != DNS_FAILED && q->state != DNS_TIMED_OUT)
                FAIL("%s should not resolve: %s", q->query, dns_state_name(q->state));
            if (q->state == DNS_FAILED)
                REQUIRE(q->error != 0 && q->message[0] != '\0');
            failed++;
            break;
        case 3:
            if (lo) { /* 127.0.0.1 -> one of its names in /etc/hosts */
                if (q->state != DNS_RESOLVED || q->host[0] == '\0')
                    FAIL("reverse 127.0.0.1: %s (%s)", dns_state_name(q->state), q->message);
            }
            break;
        case 4:
            if (q->state != DNS_RESOLVED || (!has_addr(q, "127.0.0.1") && !has_addr(q, "::1")))
                FAIL("localhost: %s", dns_state_name(q->state));
            break;
        }
        resolved += q->state == DNS_RESOLVED;
        if (q->elapsed_ms > g_reqs[slowest].elapsed_ms)
            slowest = i;
    }
    printf("many: %d lookups, %d resolved, %d bad names refused; slowest %s: %.1f ms\n", N, resolved, failed,
           g_reqs[slowest].query, g_reqs[slowest].elapsed_ms);
    teardown();
    REQUIRE(dns_live_workers() == 0);
}

/* An injected resolver that hangs: its lookups time out on time, while the
 * loop keeps running and the other lookups complete; late answers are
 * discarded; jobs that ended while queued are skipped, not run. */
static void case_hang(void)
{
    dns_config_t cfg = {.workers = 4, .max_inflight = 256, .timeout_ms = 15000,
                        .resolve = test_resolve, .resolve_arg = &g_mu};
    setup(&cfg);
    reset();
    enum { HANG_MS = 1500 };
    struct req *h1 = submit(DNS_FORWARD, "hang-1", HANG_MS);
    struct req *h2 = submit(DNS_FORWARD, "hang-2", HANG_MS);
    int64_t t0 = now_us();
    PUMP_UNTIL(atomic_load(&g_hanging) == 2, WAIT_MS);
    uint64_t ticks0 = g_ticks;
    enum { N = 100 };
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, i % 10 == 9 ? "localhost" : "ok-%d", i);
        submit(DNS_FORWARD, name, 0);
    }
    PUMP_UNTIL(g_told_total == N + 2, WAIT_MS + HANG_MS);
    double waited = (double)(now_us() - t0) / 1000.0;

    REQUIRE(h1->state == DNS_TIMED_OUT && h2->state == DNS_TIMED_OUT);
    /* Never early; "on time" within a generous margin for a loaded machine. */
    if (h1->elapsed_ms < HANG_MS || h2->elapsed_ms < HANG_MS)
        FAIL("timed out early: after %.3f and %.3f ms (timeout %d ms)", h1->elapsed_ms, h2->elapsed_ms, HANG_MS);
    REQUIRE(waited < HANG_MS + 15000);
    int first_timeout = h1->order < h2->order ? h1->order : h2->order;
    for (int i = 2; i < N + 2; i++) {
        struct req *q = &g_reqs[i];
        if (q->state != DNS_RESOLVED)
            FAIL("%s: %s", q->query, dns_state_name(q->state));
        if (q->order > first_timeout)
            FAIL("%s finished after the hung lookups timed out: held up by them", q->query);
    }
    /* The loop kept turning while two workers were stuck. */
    if (h1->ticks_at_told < ticks0 + 3)
        FAIL("only %llu heartbeats while lookups hung", (unsigned long long)(h1->ticks_at_told - ticks0));
    REQUIRE(atomic_load(&g_hanging) == 2); /* still stuck when they were told */

    /* Their answers arrive late and are discarded: no second callback. */
    gate_set(true);
    PUMP_UNTIL(stats().late_results == 2, WAIT_MS);
    check_all_told_once();

    /* All workers stuck: queued lookups time out too, and once the workers
     * come back the stale jobs are skipped rather than run. */
    gate_set(false);
    int base = g_nreqs;
    for (int i = 0; i < 4; i++)
        submit_nth("hang-all-%d", i, 300);
    PUMP_UNTIL(atomic_load(&g_hanging) == 4, WAIT_MS);
    for (int i = 0; i < 10; i++)
        submit_nth("ok-queued-%d", i, 300);
    PUMP_UNTIL(g_told_total == g_nreqs, WAIT_MS);
    for (int i = base; i < g_nreqs; i++)
        if (g_reqs[i].state != DNS_TIMED_OUT || g_reqs[i].elapsed_ms < 300.0)
            FAIL("%s: %s after %.1f ms", g_reqs[i].query, dns_state_name(g_reqs[i].state), g_reqs[i].elapsed_ms);
    gate_set(true);
    PUMP_UNTIL(stats().skipped == 10 && stats().late_results == 6, WAIT_MS);
    for (int i = 0; i < 10; i++) {
        char name[32];
        snprintf(name, sizeof name, "ok-queued-%d", i);
        if (was_called(name))
            FAIL("%s ran although it had timed out in the queue", name);
    }
    check_all_told_once();
    teardown();
    REQUIRE(dns_live_workers() == 0);
}

/* Cancellation before and during resolution, twice, and of unknown ids. */
static void case_cancel(void)
{
    dns_config_t cfg = {.workers = 1, .resolve = test_resolve, .resolve_arg = &g_mu};
    setup(&cfg);
    reset();
    struct req *running = submit(DNS_FORWARD, "hang-running", 30000);
    PUMP_UNTIL(atomic_load(&g_hanging) == 1, WAIT_MS);
    struct req *queued = submit(DNS_FORWARD, "ok-queued", 30000); /* behind the stuck one */

    /* Before resolution: told synchronously, exactly once. */
    REQUIRE(dns_cancel(g_r, queued->id) == 0);
    REQUIRE(queued->told == 1 && queued->state == DNS_CANCELLED);
    errno = 0;
    REQUIRE(dns_cancel(g_r, queued->id) == -1 && errno == ENOENT);

    /* During resolution. */
    REQUIRE(dns_cancel(g_r, running->id) == 0);
    REQUIRE(running->told == 1 && running->state == DNS_CANCELLED);
    REQUIRE(dns_cancel(g_r, running->id) == -1);
    REQUIRE(dns_cancel(g_r, 0) == -1 && errno == ENOENT);
    REQUIRE(dns_cancel(g_r, 123456789) == -1 && errno == ENOENT);

    /* The stuck worker comes back: its answer is discarded, the cancelled
     * queued job is skipped, and new lookups work. */
    gate_set(true);
    PUMP_UNTIL(stats().late_results == 1 && stats().skipped == 1, WAIT_MS);
    REQUIRE(!was_called("ok-queued"));
    struct req *after = submit(DNS_FORWARD, "ok-after", 0);
    PUMP_UNTIL(after->told == 1, WAIT_MS);
    REQUIRE(after->state == DNS_RESOLVED && has_addr(after, "192.0.2.1"));

    /* A batch of 50 slow lookups; half cancelled while queued or running. */
    for (int i = 0; i < 50; i++)
        submit(DNS_FORWARD, "slow", 0);
    for (int i = g_nreqs - 50; i < g_nreqs; i += 2)
        REQUIRE(dns_cancel(g_r, g_reqs[i].id) == 0);
    PUMP_UNTIL(g_told_total == g_nreqs, WAIT_MS);
    for (int i = g_nreqs - 50; i < g_nreqs; i++)
        REQUIRE(g_reqs[i].state == ((i - (g_nreqs - 50)) % 2 == 0 ? DNS_CANCELLED : DNS_RESOLVED));
    check_all_told_once();
    dns_stats_t s = stats();
    REQUIRE(s.cancelled == 27);
    teardown();
}

/* The in-flight cap and the job backlog give a clear EBUSY. */
static void case_busy(void)
{
    dns_config_t cfg = {.workers = 2, .max_inflight = 4, .resolve = test_resolve, .resolve_arg = &g_mu};
    setup(&cfg);
    reset();
    struct req *first = submit(DNS_FORWARD, "hang-a", 30000);
    submit(DNS_FORWARD, "hang-b", 30000);
    submit(DNS_FORWARD, "ok-1", 30000);
    submit(DNS_FORWARD, "ok-2", 30000);
    PUMP_UNTIL(atomic_load(&g_hanging) == 2, WAIT_MS);
    errno = 0;
    REQUIRE(dns_submit(g_r, DNS_FORWARD, "ok-3", 0, NULL) == 0 && errno == EBUSY);
    REQUIRE(stats().rejected_busy == 1 && stats().inflight == 4);
    REQUIRE(dns_cancel(g_r, first->id) == 0); /* frees a slot */
    struct req *again = submit(DNS_FORWARD, "ok-4", 30000);
    REQUIRE(again->id != 0);
    gate_set(true);
    PUMP_UNTIL(g_told_total == g_nreqs, WAIT_MS);
    check_all_told_once();
    teardown();

    /* Backlog: one worker stuck, requests time out while queued; their stale
     * jobs fill the job queue (capacity max_inflight + workers = 3), and then
     * submissions are refused with EBUSY although nothing is in flight. */
    dns_config_t cfg2 = {.workers = 1, .max_inflight = 2, .resolve = test_resolve, .resolve_arg = &g_mu};
    setup(&cfg2);
    reset();
    submit(DNS_FORWARD, "hang-x", 200);
    PUMP_UNTIL(atomic_load(&g_hanging) == 1, WAIT_MS);
    for (int i = 0; i < 3; i++) {
        submit_nth("ok-%d", i, 200);
        PUMP_UNTIL(g_told_total == g_nreqs, WAIT_MS);
    }
    REQUIRE(stats().inflight == 0 && stats().timed_out == 4);
    errno = 0;
    REQUIRE(dns_submit(g_r, DNS_FORWARD, "ok-9", 0, NULL) == 0 && errno == EBUSY);
    gate_set(true);
    PUMP_UNTIL(stats().skipped == 3, WAIT_MS);
    struct req *later = submit(DNS_FORWARD, "ok-later", 0);
    PUMP_UNTIL(later->told == 1, WAIT_MS);
    REQUIRE(later->state == DNS_RESOLVED);
    check_all_told_once();
    teardown();
}

/* Shutdown with lookups in flight, some stuck for good: every request is told
 * exactly once (CANCELLED), destroy returns, stuck workers are detached and
 * exit on their own once their lookup returns. */
static void case_shutdown(void)
{
    dns_config_t cfg = {.workers = 4, .max_inflight = 128, .shutdown_grace_ms = 300,
                        .resolve = test_resolve, .resolve_arg = &g_mu};
    setup(&cfg);
    reset();
    for (int i = 0; i < 3; i++)
        submit_nth("hang-%d", i, 60000);
    PUMP_UNTIL(atomic_load(&g_hanging) == 3, WAIT_MS);
    for (int i = 0; i < 60; i++)
        submit(DNS_FORWARD, i % 2 ? "slow" : "ok", 60000);
    pump_once(0); /* maybe a few answers; most still in flight */
    int told_before = g_told_total;
    REQUIRE(told_before < g_nreqs);

    int64_t t0 = now_us();
    teardown(); /* on_result checks that destroy's callbacks are CANCELLED and cannot submit */
    double took = (double)(now_us() - t0) / 1000.0;
    for (int i = 0; i < g_nreqs; i++)
        if (g_reqs[i].told != 1)
            FAIL("%s told %d times", g_reqs[i].query, g_reqs[i].told);
    REQUIRE(g_reqs[0].state == DNS_CANCELLED);
    printf("shutdown: %d of %d told before destroy; destroy took %.0f ms (grace 300 ms)\n", told_before, g_nreqs,
           took);
    REQUIRE(took < 15000); /* returned despite three workers stuck for good */
    REQUIRE(atomic_load(&g_hanging) == 3);
    REQUIRE(dns_live_workers() >= 3); /* the stuck ones, detached */

    /* Let them return: they must exit without calling back or crashing
     * (their queues and runtime are gone). */
    gate_set(true);
    int64_t deadline = now_us() + WAIT_MS * 1000LL;
    while (dns_live_workers() != 0) {
        if (now_us() > deadline)
            FAIL("%u detached workers never exited", dns_live_workers());
        usleep(10 * 1000);
    }
    REQUIRE(g_told_total == g_nreqs);
}

/* Failures: injected, from the system resolver, and bad input. */
static void case_fail(void)
{
    dns_config_t cfg = {.workers = 2, .resolve = test_resolve, .resolve_arg = &g_mu};
    setup(&cfg);
    reset();
    struct req *inj = submit(DNS_FORWARD, "fail-1", 0);
    struct req *sys = submit(DNS_FORWARD, "foo..bar", 10000);
    struct req *rev_bad = submit(DNS_REVERSE, "not-an-address", 0);
    struct req *rev_ok = submit(DNS_REVERSE, "127.0.0.1", 10000);
    PUMP_UNTIL(g_told_total == 4, WAIT_MS);
    REQUIRE(inj->state == DNS_FAILED && inj->error == 42 && strcmp(inj->message, "injected failure") == 0);
    REQUIRE(sys->state == DNS_FAILED || sys->state == DNS_TIMED_OUT);
    REQUIRE(rev_bad->state == DNS_FAILED && rev_bad->error != 0 && rev_bad->message[0] != '\0');
    printf("reverse 127.0.0.1: %s %s\n", dns_state_name(rev_ok->state), rev_ok->host);

    /* Refused at once, no callback. */
    char longname[DNS_MAX_QUERY + 10];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    errno = 0;
    REQUIRE(dns_submit(g_r, DNS_FORWARD, NULL, 0, NULL) == 0 && errno == EINVAL);
    errno = 0;
    REQUIRE(dns_submit(g_r, DNS_FORWARD, "", 0, NULL) == 0 && errno == EINVAL);
    errno = 0;
    REQUIRE(dns_submit(g_r, DNS_FORWARD, longname, 0, NULL) == 0 && errno == EINVAL);
    errno = 0;
    REQUIRE(dns_submit(g_r, (dns_kind_t)7, "ok", 0, NULL) == 0 && errno == EINVAL);
    check_all_told_once();
    REQUIRE(stats().submitted == 4);
    teardown();

    errno = 0;
    REQUIRE(dns_resolver_create(NULL, 1, NULL, on_result, NULL) == NULL && errno == EINVAL);
}

/* The CLI, run as a child process. */
static void run_cli(const char *prog, const char *const args[], int want_status, const char *const want[])
{
    char *argv[16] = {(char *)prog};
    int n = 1;
    for (; args[n - 1]; n++)
        argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    struct child c;
    child_start(&c, argv, CHILD_FILE, "/dev/null");
    int st = child_wait(&c, WAIT_MS);
    for (int i = 0; want && want[i]; i++)
        child_expect(&c, want[i], 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != want_status) {
        fprintf(stderr, "---- output ----\n%s\n", c.out);
        FAIL("%s %s...: status %d, expected %d", prog, args[0], WIFEXITED(st) ? WEXITSTATUS(st) : -1, want_status);
    }
    child_free(&c);
}

static void case_cli(const char *prog)
{
    run_cli(prog, (const char *const[]){"127.0.0.1", "::1", "localhost", NULL}, 0, NULL);
    run_cli(prog, (const char *const[]){"127.0.0.1", "::1", NULL}, 0,
            (const char *const[]){"127.0.0.1: 127.0.0.1 (", NULL});
    run_cli(prog, (const char *const[]){"::1", NULL}, 0, (const char *const[]){"::1: ::1 (", NULL});
    run_cli(prog, (const char *const[]){"-t", "10000", "foo..bar", "127.0.0.1", NULL}, 1,
            (const char *const[]){"foo..bar: ", NULL});
    /* More names than may be in flight: the rest wait their turn. */
    run_cli(prog,
            (const char *const[]){"-j", "2", "-w", "2", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5",
                                  "10.0.0.6", "10.0.0.7", NULL},
            0, (const char *const[]){"10.0.0.7: 10.0.0.7", NULL});
    run_cli(prog, (const char *const[]){"-r", "not-an-address", NULL}, 1,
            (const char *const[]){"not-an-address: failed: ", NULL});
    run_cli(prog, (const char *const[]){"-t", "0", "localhost", NULL}, 2, NULL);
    run_cli(prog, (const char *const[]){"-x", NULL}, 2, NULL);
    char *noargs[] = {(char *)prog, NULL};
    struct child c;
    child_start(&c, noargs, CHILD_FILE, "/dev/null");
    int st = child_wait(&c, WAIT_MS);
    REQUIRE(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    child_free(&c);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CASE [PATH-TO-async_dns]\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    const char *c = argv[1];
    if (strcmp(c, "many") == 0)
        case_many();
    else if (strcmp(c, "hang") == 0)
        case_hang();
    else if (strcmp(c, "cancel") == 0)
        case_cancel();
    else if (strcmp(c, "busy") == 0)
        case_busy();
    else if (strcmp(c, "shutdown") == 0)
        case_shutdown();
    else if (strcmp(c, "fail") == 0)
        case_fail();
    else if (strcmp(c, "cli") == 0 && argc == 3)
        case_cli(argv[2]);
    else {
        fprintf(stderr, "unknown case '%s'\n", c);
        return 2;
    }
    printf("%s: ok\n", c);
    return 0;
}
