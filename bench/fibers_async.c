/*
 * Fibers, libasync: the four fiber micro-benchmarks, one per mode. Every
 * timed loop runs on fibers; the main thread only starts the scheduler and
 * waits in async_sched_run. Peers: fibers_boost.cpp and go/fibers.
 *
 * usage: fibers_async yield    workers fibers yields_per_fiber
 *        fibers_async spawn    workers total batch
 *        fibers_async pingpong workers round_trips [timeout_ms=-1]
 *        fibers_async parked   workers fibers stack_kb
 *        fibers_async cancel   workers fibers scopes
 *        fibers_async fib      workers fibers n yields
 *
 *   yield:    `fibers` fibers each call async_fiber_yield() yields_per_fiber
 *             times; ns_per_yield = time from the first fiber's start to the
 *             last one's end / all yields.
 *   spawn:    a root fiber spawns `batch` joinable empty fibers, joins them,
 *             and repeats until `total`; ns_per_fiber = elapsed / total.
 *   pingpong: two fibers, two rendezvous channels (capacity 0) of uint64;
 *             ping sends i and waits for i+1; ns_per_rt = elapsed / trips.
 *             Every send and recv waits with timeout_ms (-1: no timeout,
 *             like the peers; a finite one arms a timer per wait).
 *   parked:   a root fiber spawns `fibers` fibers that each block in
 *             async_chan_recv on one rendezvous channel; create_ns = time
 *             until the last one has started / fibers; rss_per_fiber_b =
 *             VmRSS once all are parked minus VmRSS before / fibers. Closing
 *             the channel then wakes them all (each recv must fail with
 *             ASYNC_E_CLOSED).
 *   cancel:   `fibers` fibers spread over `scopes` nested scopes (each inside
 *             the one before), half parked in async_chan_recv on one
 *             rendezvous channel, half in an hour's async_fiber_sleep; once
 *             all are parked, one async_scope_cancel of the outermost scope
 *             and async_scope_join of it: cancel_ms = time from the cancel
 *             until the join returned (every fiber returned, each with
 *             ASYNC_E_CANCELLED).
 *   fib:      the main thread spawns `fibers` fibers that each compute fib(n)
 *             (recursively) and then yield `yields` times; secs = from the
 *             first spawn until async_sched_run returned. Every result is
 *             checked. spread = how far the worker with the least even share
 *             of the fibers started is from an even share: the largest of
 *             share/even and even/share over the workers (1.0 = exactly
 *             even; "inf" if a worker started none); run_spread the same for
 *             the fibers resumed (fibers_run) per worker.
 */
#include "bench.h"

#include <math.h>
#include <stdatomic.h>

#include "async.h"

static async_sched_t *sched;
static long n_fibers, n_per, n_batch;
static int op_timeout = -1;
static _Atomic long started, finished, counted;
static _Atomic uint64_t t_first, t_last;
static async_chan_t *ch_a, *ch_b;
static _Atomic int failed;
static char fail_msg[160];

static void fail_later(const char *what) {
    int zero = 0;
    if (atomic_compare_exchange_strong(&failed, &zero, 1))
        snprintf(fail_msg, sizeof fail_msg, "%s: %s", what, async_strerror(async_last_error()));
}

static void mark_start(void) {
    uint64_t zero = 0, t = now_ns();
    atomic_compare_exchange_strong(&t_first, &zero, t);
}

static void mark_end(void) { atomic_store(&t_last, now_ns()); }

static async_sched_t *make_sched(int workers, size_t stack) {
    async_sched_config_t cfg = {.workers = workers, .stack_size = stack};
    async_sched_t *s = async_sched_create(&cfg);
    if (!s) FAIL("async_sched_create: %s", async_strerror(async_last_error()));
    return s;
}

static void spawn_or_fail(void (*fn)(void *), void *arg) {
    if (!async_fiber_spawn(sched, fn, arg, 0)) FAIL("async_fiber_spawn: %s", async_strerror(async_last_error()));
}

static void run_or_fail(void) {
    if (async_sched_run(sched) != 0) FAIL("async_sched_run: %s", async_strerror(async_last_error()));
    if (atomic_load(&failed)) FAIL("%s", fail_msg);
}

static uint64_t sum_runs(int workers) {
    async_sched_stats_t st;
    async_sched_worker_stats_t w[64];
    int n = async_sched_get_stats(sched, &st, w, workers < 64 ? workers : 64);
    uint64_t runs = 0;
    for (int i = 0; i < n; i++) runs += w[i].fibers_run;
    return runs;
}

/* ---------------------------------------------------------------- yield */
static void yielder(void *arg) {
    (void)arg;
    mark_start();
    for (long i = 0; i < n_per; i++) async_fiber_yield();
    atomic_fetch_add(&counted, n_per);
    if (atomic_fetch_add(&finished, 1) + 1 == n_fibers) mark_end();
}

static void bench_yield(int workers) {
    for (long i = 0; i < n_fibers; i++) spawn_or_fail(yielder, NULL);
    run_or_fail();
    long yields = atomic_load(&counted);
    if (yields != n_fibers * n_per) FAIL("%ld yields done, expected %ld", yields, n_fibers * n_per);
    /* every yield goes back through the scheduler: a resume per yield */
    uint64_t runs = sum_runs(workers);
    if (runs < (uint64_t)yields) FAIL("the workers resumed fibers %llu times for %ld yields",
                                      (unsigned long long)runs, yields);
    double ns = (double)(t_last - t_first);
    printf("ok=1 workers=%d fibers=%ld yields=%ld secs=%.4f ns_per_yield=%.2f\n", workers, n_fibers, yields,
           ns / 1e9, ns / (double)yields);
}

/* ---------------------------------------------------------------- spawn */
static void empty_fiber(void *arg) {
    (void)arg;
    atomic_fetch_add_explicit(&counted, 1, memory_order_relaxed);
}

static void spawner(void *arg) {
    (void)arg;
    async_fiber_t **kids = malloc((size_t)n_batch * sizeof *kids);
    if (!kids) return fail_later("malloc");
    uint64_t t0 = now_ns();
    for (long done = 0; done < n_fibers; done += n_batch) {
        long b = n_fibers - done < n_batch ? n_fibers - done : n_batch;
        for (long i = 0; i < b; i++) {
            kids[i] = async_fiber_spawn(sched, empty_fiber, NULL, ASYNC_FIBER_JOINABLE);
            if (!kids[i]) return fail_later("async_fiber_spawn");
        }
        for (long i = 0; i < b; i++)
            if (async_fiber_join(kids[i], -1) != 0) return fail_later("async_fiber_join");
    }
    atomic_store(&t_first, t0);
    mark_end();
    free(kids);
}

static void bench_spawn(int workers) {
    spawn_or_fail(spawner, NULL);
    run_or_fail();
    if (atomic_load(&counted) != n_fibers) FAIL("%ld fibers ran, expected %ld", atomic_load(&counted), n_fibers);
    async_sched_stats_t st;
    async_sched_get_stats(sched, &st, NULL, 0);
    if (st.fibers_finished != (uint64_t)n_fibers + 1 || st.fibers_done_unjoined != 0)
        FAIL("stats: %llu finished, %zu unjoined", (unsigned long long)st.fibers_finished, st.fibers_done_unjoined);
    double ns = (double)(t_last - t_first);
    printf("ok=1 workers=%d fibers=%ld batch=%ld secs=%.4f ns_per_fiber=%.1f\n", workers, n_fibers, n_batch,
           ns / 1e9, ns / (double)n_fibers);
}

/* ---------------------------------------------------------------- pingpong */
static void ping(void *arg) {
    (void)arg;
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < (uint64_t)n_per; i++) {
        uint64_t x = i;
        if (async_chan_send(ch_a, &x, op_timeout) != 0) return fail_later("ping send");
        if (async_chan_recv(ch_b, &x, op_timeout) != 0) return fail_later("ping recv");
        if (x != i + 1) {
            snprintf(fail_msg, sizeof fail_msg, "round trip %llu came back as %llu", (unsigned long long)i,
                     (unsigned long long)x);
            atomic_store(&failed, 1);
            return;
        }
    }
    atomic_store(&t_first, t0);
    mark_end();
    atomic_store(&counted, n_per);
}

static void pong(void *arg) {
    (void)arg;
    for (long i = 0; i < n_per; i++) {
        uint64_t x;
        if (async_chan_recv(ch_a, &x, op_timeout) != 0) return fail_later("pong recv");
        x++;
        if (async_chan_send(ch_b, &x, op_timeout) != 0) return fail_later("pong send");
    }
}

static void bench_pingpong(int workers) {
    ch_a = async_chan_create(0, sizeof(uint64_t));
    ch_b = async_chan_create(0, sizeof(uint64_t));
    if (!ch_a || !ch_b) FAIL("async_chan_create: %s", async_strerror(async_last_error()));
    spawn_or_fail(pong, NULL);
    spawn_or_fail(ping, NULL);
    run_or_fail();
    if (atomic_load(&counted) != n_per) FAIL("ping did not finish");
    double ns = (double)(t_last - t_first);
    printf("ok=1 workers=%d round_trips=%ld timeout_ms=%d secs=%.4f ns_per_rt=%.1f\n", workers, n_per, op_timeout,
           ns / 1e9, ns / (double)n_per);
    async_chan_destroy(ch_a);
    async_chan_destroy(ch_b);
}

/* ---------------------------------------------------------------- parked */
static long vm_rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[128];
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &v) == 1) break;
    fclose(f);
    return v;
}

static void parker(void *arg) {
    (void)arg;
    if (atomic_fetch_add(&started, 1) + 1 == n_fibers) mark_end();
    uint64_t x;
    if (async_chan_recv(ch_a, &x, -1) == 0) return fail_later("recv on a closed channel succeeded");
    if (async_last_error() != ASYNC_E_CLOSED) return fail_later("recv on the closed channel");
    atomic_fetch_add_explicit(&counted, 1, memory_order_relaxed);
}

static void parked_root(void *arg) {
    (void)arg;
    for (long i = 0; i < n_fibers; i++)
        if (!async_fiber_spawn(sched, parker, NULL, 0)) return fail_later("async_fiber_spawn");
}

static void bench_parked(int workers, long stack_kb) {
    ch_a = async_chan_create(0, sizeof(uint64_t));
    if (!ch_a) FAIL("async_chan_create: %s", async_strerror(async_last_error()));
    long rss0 = vm_rss_kib();
    uint64_t t0 = now_ns();
    spawn_or_fail(parked_root, NULL);
    async_sched_stats_t st;
    /* wait (politely) until every fiber has started, then until all park */
    for (int i = 0; atomic_load(&started) < n_fibers; i++) {
        if (atomic_load(&failed)) FAIL("%s", fail_msg);
        if (i > 120000) FAIL("only %ld of %ld fibers started in 120 s", atomic_load(&started), n_fibers);
        sleep_us(1000);
    }
    for (int i = 0;; i++) {
        async_sched_get_stats(sched, &st, NULL, 0);
        if (st.fibers_parked == (size_t)n_fibers) break;
        if (i > 1000) FAIL("only %zu of %ld fibers parked after 10 s", st.fibers_parked, n_fibers);
        sleep_us(10000);
    }
    long rss1 = vm_rss_kib();
    double create_ns = (double)(t_last - t0) / (double)n_fibers;
    uint64_t t1 = now_ns();
    async_chan_close(ch_a);
    run_or_fail();
    double wake_ns = (double)(now_ns() - t1) / (double)n_fibers;
    if (atomic_load(&counted) != n_fibers) FAIL("%ld of %ld fibers woke with ASYNC_E_CLOSED", atomic_load(&counted),
                                                n_fibers);
    if (rss0 < 0 || rss1 < 0) FAIL("no VmRSS in /proc/self/status");
    printf("ok=1 workers=%d fibers=%ld stack_kb=%ld guard_mode=%d rss_mib=%.1f rss_per_fiber_b=%.0f "
           "create_ns=%.1f close_wake_ns=%.1f\n",
           workers, n_fibers, stack_kb, st.guard_mode, (double)(rss1 - rss0) / 1024,
           (double)(rss1 - rss0) * 1024 / (double)n_fibers, create_ns, wake_ns);
    async_chan_destroy(ch_a);
}

/* ---------------------------------------------------------------- cancel */
static void cancelled_parker(void *arg) {
    (void)arg;
    uint64_t x;
    int rc = (uintptr_t)arg % 2 ? async_fiber_sleep(3600u * 1000u) : async_chan_recv(ch_a, &x, -1);
    if (rc == 0) return fail_later("a park outlived the cancel");
    if (async_last_error() != ASYNC_E_CANCELLED) return fail_later("a park ended otherwise than cancelled");
    atomic_fetch_add_explicit(&counted, 1, memory_order_relaxed);
}

static void bench_cancel(int workers, int nscopes) {
    ch_a = async_chan_create(0, sizeof(uint64_t));
    async_scope_t *sc[64];
    if (!ch_a || nscopes < 1 || nscopes > 64) FAIL("bad arguments or async_chan_create");
    for (int i = 0; i < nscopes; i++)
        if (!(sc[i] = async_scope_create(sched, i ? sc[i - 1] : NULL, -1))) FAIL("async_scope_create");
    for (long i = 0; i < n_fibers; i++)
        if (!async_scope_spawn(sc[i % nscopes], cancelled_parker, (void *)(uintptr_t)i, 0)) FAIL("async_scope_spawn");
    async_sched_stats_t st;
    for (int i = 0;; i++) {
        async_sched_get_stats(sched, &st, NULL, 0);
        if (st.fibers_parked == (size_t)n_fibers) break;
        if (i > 6000) FAIL("only %zu of %ld fibers parked after 60 s", st.fibers_parked, n_fibers);
        sleep_us(10000);
    }
    uint64_t t0 = now_ns();
    if (async_scope_cancel(sc[0]) != 0) FAIL("async_scope_cancel");
    if (async_scope_join(sc[0], 60000) != 0) FAIL("async_scope_join: %s", async_strerror(async_last_error()));
    double ns = (double)(now_ns() - t0);
    if (atomic_load(&failed)) FAIL("%s", fail_msg);
    if (atomic_load(&counted) != n_fibers) FAIL("%ld of %ld fibers were cancelled", atomic_load(&counted), n_fibers);
    printf("ok=1 workers=%d fibers=%ld scopes=%d cancel_ms=%.3f ns_per_fiber=%.1f\n", workers, n_fibers, nscopes,
           ns / 1e6, ns / (double)n_fibers);
    for (int i = nscopes - 1; i >= 0; i--) async_scope_destroy(sc[i]);
    async_chan_destroy(ch_a);
}

/* ---------------------------------------------------------------- fib */
static int fib_n, *fib_out;

static int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

static void fib_fiber(void *arg) {
    int r = fib(fib_n);
    for (long i = 0; i < n_per; i++) async_fiber_yield();
    fib_out[(uintptr_t)arg] = r;
    atomic_fetch_add_explicit(&finished, 1, memory_order_relaxed);
}

/* The largest of share/even and even/share over v[0..n). */
static double spread_of(const uint64_t *v, int n) {
    double total = 0;
    for (int i = 0; i < n; i++) total += (double)v[i];
    double even = total / n, worst = 1.0;
    for (int i = 0; i < n; i++) {
        if (v[i] == 0) return INFINITY;
        double a = (double)v[i] / even, b = even / (double)v[i];
        worst = a > worst ? a : worst;
        worst = b > worst ? b : worst;
    }
    return worst;
}

static void bench_fib(int workers) {
    fib_out = calloc((size_t)n_fibers, sizeof *fib_out);
    if (!fib_out) FAIL("out of memory");
    uint64_t t0 = now_ns();
    for (long i = 0; i < n_fibers; i++) spawn_or_fail(fib_fiber, (void *)(uintptr_t)i);
    run_or_fail();
    double secs = (double)(now_ns() - t0) / 1e9;
    int want = fib(fib_n);
    if (atomic_load(&finished) != n_fibers) FAIL("%ld of %ld fibers finished", atomic_load(&finished), n_fibers);
    for (long i = 0; i < n_fibers; i++)
        if (fib_out[i] != want) FAIL("fiber %ld computed fib(%d) = %d, not %d", i, fib_n, fib_out[i], want);
    async_sched_stats_t st;
    async_sched_worker_stats_t w[64];
    int n = async_sched_get_stats(sched, &st, w, 64);
    if (n != workers) FAIL("async_sched_get_stats reported %d workers, not %d", n, workers);
    uint64_t started_v[64], run_v[64], started_total = 0, steals = 0;
    for (int i = 0; i < n; i++) {
        started_v[i] = w[i].fibers_started;
        run_v[i] = w[i].fibers_run;
        started_total += started_v[i];
        steals += w[i].steals;
    }
    if (started_total != (uint64_t)n_fibers)
        FAIL("the workers started %llu fibers, not %ld", (unsigned long long)started_total, n_fibers);
    printf("ok=1 workers=%d fibers=%ld fib=%d yields=%ld secs=%.4f spread=%.3f run_spread=%.3f steals=%llu "
           "started=",
           workers, n_fibers, fib_n, n_per, secs, spread_of(started_v, n), spread_of(run_v, n),
           (unsigned long long)steals);
    for (int i = 0; i < n; i++) printf("%s%llu", i ? "/" : "", (unsigned long long)started_v[i]);
    printf("\n");
    free(fib_out);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: fibers_async yield|spawn|pingpong|parked|cancel|fib workers ...\n");
        return 2;
    }
    const char *mode = argv[1];
    int workers = (int)arg_long(argc, argv, 2, 1);
    if (!strcmp(mode, "yield")) {
        n_fibers = arg_long(argc, argv, 3, 2);
        n_per = arg_long(argc, argv, 4, 1000000);
        sched = make_sched(workers, 0);
        bench_yield(workers);
    } else if (!strcmp(mode, "spawn")) {
        n_fibers = arg_long(argc, argv, 3, 200000);
        n_batch = arg_long(argc, argv, 4, 100);
        sched = make_sched(workers, 0);
        bench_spawn(workers);
    } else if (!strcmp(mode, "pingpong")) {
        n_per = arg_long(argc, argv, 3, 1000000);
        if (argc > 4) op_timeout = (int)arg_long(argc, argv, 4, 10000);
        sched = make_sched(workers, 0);
        bench_pingpong(workers);
    } else if (!strcmp(mode, "parked")) {
        n_fibers = arg_long(argc, argv, 3, 1000000);
        long kb = arg_long(argc, argv, 4, 16);
        sched = make_sched(workers, (size_t)kb * 1024);
        bench_parked(workers, kb);
    } else if (!strcmp(mode, "cancel")) {
        n_fibers = arg_long(argc, argv, 3, 10000);
        int nscopes = (int)arg_long(argc, argv, 4, 10);
        sched = make_sched(workers, 16 * 1024);
        bench_cancel(workers, nscopes);
    } else if (!strcmp(mode, "fib")) {
        n_fibers = arg_long(argc, argv, 3, 100000);
        fib_n = (int)arg_long(argc, argv, 4, 20);
        n_per = arg_long(argc, argv, 5, 10);
        if (workers > 64) FAIL("at most 64 workers");
        sched = make_sched(workers, 0);
        bench_fib(workers);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    async_sched_destroy(sched);
    return 0;
}
