/* test_adv3.c — promises a third adversarial pass (reading only
 * include/async.h) found broken (docs/RELIABILITY.md, "Adversarial pass 3").
 *
 * Cases:
 *   dump_vs_watch     async_sched_dump_on_signal and async_runtime_add_signal
 *                     on one signal, in every order of install and removal:
 *                     the watch keeps its events while the dump goes, and
 *                     the host's action comes back when the last goes.
 *   fiber_rewatch     async_fiber_unwatch_signal followed at once by
 *                     async_fiber_watch_signal ends the waits of
 *                     async_fiber_wait_signal that began under the earlier
 *                     watch (ASYNC_E_STATE), a plain thread's and a fiber's.
 *   stats_signal      async_runtime_get_stats counts SIGNAL events as SIGNAL
 *                     (events[6]), not COMPLETION (events[4]), on every
 *                     path of the wait (timeout 0, a sleep, with completions).
 *   dump_failed_rereg a failed async_sched_dump_on_signal (refused signal,
 *                     fd < 0) leaves the scheduler with no registration: the
 *                     host's action is back, nothing is dumped, its slot of
 *                     the 64 is free.
 *   log_one_line      a log message is one line whatever it quotes: an
 *                     ASYNC_FIBER_STALL_MS value with newlines forges no
 *                     second "libasync:" line on stderr, and a handler gets
 *                     no control character.
 *   log_records       async_set_log_handler from 4 threads at once over the
 *                     same 2000 new (level, fn, ctx) triples, then each set
 *                     again: the handler set last is the one called, with
 *                     its ctx and level (the lookup is a hash now; one record
 *                     per triple is not observable from outside, and the
 *                     speed is not asserted: see docs/RELIABILITY.md).
 *   cancel_*          pthread_cancel of a thread (a plain thread or an
 *                     async_worker's) asleep inside a libasync wait (channel
 *                     receive, mutex lock, queue dequeue, runtime wait, fiber
 *                     sleep, signal wait) does not act there: the wait completes when its
 *                     event comes (the result reaches the thread), the
 *                     cancel acts at the thread's next cancellation point,
 *                     and the object still works (no waiter record of the
 *                     dead thread left, no lock held, no BUSY runtime).
 */
#include "check.h"

#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>

/* --- dump_vs_watch ------------------------------------------------------------ */

static volatile sig_atomic_t host_hits;
static void host_handler(int s) { (void)s; host_hits++; }

static int host_installed(int sig)
{
    struct sigaction cur;
    CHECK_EQ(sigaction(sig, NULL, &cur), 0);
    return !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == host_handler;
}

/* One SIGNAL event of key for rt, within 2 s. */
static void expect_signal_event(async_runtime_t *rt, uintptr_t key)
{
    io_event_t ev[4];
    int n = async_runtime_wait(rt, ev, 4, 2000);
    CHECK_EQ(n, 1);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_SIGNAL);
    CHECK_EQ(ev[0].completion_key, key);
}

static void t_dump_vs_watch(void)
{
    const int sig = SIGUSR1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = host_handler;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(sig, &sa, NULL), 0);
    async_sched_t *s = async_sched_create(NULL);
    async_runtime_t *rt = async_runtime_init();
    CHECK(s && rt);
    int devnull = open("/dev/null", O_WRONLY);
    CHECK(devnull >= 0);

    /* A: dump, watch, dump goes: the watch still gets its signal (and the
     * host's action is not back under it); the watch goes: the host's. */
    CHECK_EQ(async_sched_dump_on_signal(s, sig, devnull), 0);
    CHECK_EQ(async_runtime_add_signal(rt, sig, 5), 0);
    CHECK_EQ(async_sched_dump_on_signal(s, 0, devnull), 0);
    CHECK(!host_installed(sig));
    host_hits = 0;
    raise(sig);
    expect_signal_event(rt, 5);
    CHECK_EQ(host_hits, 0);
    CHECK_EQ(async_runtime_remove_signal(rt, sig), 0);
    CHECK(host_installed(sig));

    /* B: watch, dump, watch goes, dump goes: the host's action. */
    CHECK_EQ(async_runtime_add_signal(rt, sig, 6), 0);
    CHECK_EQ(async_sched_dump_on_signal(s, sig, devnull), 0);
    CHECK_EQ(async_runtime_remove_signal(rt, sig), 0);
    CHECK(!host_installed(sig));
    CHECK_EQ(async_sched_dump_on_signal(s, 0, devnull), 0);
    CHECK(host_installed(sig));

    /* C: dump, watch, watch goes, dump goes. */
    CHECK_EQ(async_sched_dump_on_signal(s, sig, devnull), 0);
    CHECK_EQ(async_runtime_add_signal(rt, sig, 7), 0);
    CHECK_EQ(async_runtime_remove_signal(rt, sig), 0);
    CHECK_EQ(async_sched_dump_on_signal(s, 0, devnull), 0);
    CHECK(host_installed(sig));

    /* D: the fiber-side watch with the dump, and both at once: the watch
     * counts the signal the dump also handles. */
    CHECK_EQ(async_fiber_watch_signal(sig), 0);
    CHECK_EQ(async_sched_dump_on_signal(s, sig, devnull), 0);
    CHECK_EQ(async_runtime_add_signal(rt, sig, 8), 0);
    host_hits = 0;
    raise(sig);
    expect_signal_event(rt, 8);
    CHECK_EQ(async_fiber_wait_signal(sig, 2000), 1);
    CHECK_EQ(async_fiber_unwatch_signal(sig), 0);
    CHECK_EQ(async_sched_dump_on_signal(s, 0, devnull), 0);
    raise(sig);
    expect_signal_event(rt, 8);
    CHECK_EQ(host_hits, 0);
    async_runtime_deinit(rt); /* drops the last watch */
    CHECK(host_installed(sig));
    raise(sig);
    CHECK_EQ(host_hits, 1);

    async_sched_destroy(s);
    close(devnull);
}

/* --- fiber_rewatch ------------------------------------------------------------- */

/* true if the thread is asleep (S or D in /proc/self/task/<tid>/stat). */
static bool thread_asleep(int tid)
{
    char path[64], buf[512], *p;
    FILE *f;
    size_t n;
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    f = fopen(path, "r");
    if (!f)
        return false;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    p = strrchr(buf, ')'); /* the state follows the command name */
    return p && (p[2] == 'S' || p[2] == 'D');
}

static int rw_sig;
static atomic_int rw_tid, rw_thread_err, rw_fiber_err;

static void *rw_thread(void *arg)
{
    (void)arg;
    atomic_store(&rw_tid, (int)gettid());
    int c = async_fiber_wait_signal(rw_sig, 20000);
    atomic_store(&rw_thread_err, c < 0 ? async_last_error() : 1000 + c);
    return NULL;
}

static void rw_fiber(void *arg)
{
    (void)arg;
    int c = async_fiber_wait_signal(rw_sig, 20000);
    atomic_store(&rw_fiber_err, c < 0 ? async_last_error() : 1000 + c);
}

/* true once s's dump shows a fiber parked on an fd. */
static bool fiber_parked_on_fd(async_sched_t *s)
{
    int p[2];
    char buf[4096];
    CHECK_EQ(pipe(p), 0);
    CHECK(async_sched_dump(s, p[1]) >= 1);
    close(p[1]);
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    close(p[0]);
    buf[n > 0 ? n : 0] = 0;
    return strstr(buf, "parked: fd ") != NULL;
}

static void t_fiber_rewatch(void)
{
    rw_sig = SIGRTMIN + 3;
    CHECK_EQ(async_fiber_watch_signal(rw_sig), 0);
    async_sched_config_t cfg = {1, 0, 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s != NULL);
    pthread_t t;
    start_thread(&t, rw_thread, NULL);
    async_fiber_t *f = async_fiber_spawn(s, rw_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    /* Both in their wait: the fiber parked on the pipe, the thread asleep
     * for 3 samples in a row (it sleeps nowhere else). */
    double t0 = now_ms();
    int streak = 0;
    while (streak < 3) {
        int tid = atomic_load(&rw_tid);
        streak = tid && thread_asleep(tid) && fiber_parked_on_fd(s) ? streak + 1 : 0;
        CHECK(now_ms() - t0 < 10000);
        sleep_ms(5);
    }
    CHECK_EQ(async_fiber_unwatch_signal(rw_sig), 0);
    CHECK_EQ(async_fiber_watch_signal(rw_sig), 0);
    join_within(t, 10000, "thread waiter");
    CHECK_EQ(async_fiber_join(f, 10000), 0);
    CHECK_EQ(atomic_load(&rw_thread_err), ASYNC_E_STATE);
    CHECK_EQ(atomic_load(&rw_fiber_err), ASYNC_E_STATE);
    /* the new watch works */
    union sigval v = {0};
    CHECK_EQ(sigqueue(getpid(), rw_sig, v), 0);
    CHECK_EQ(async_fiber_wait_signal(rw_sig, 5000), 1);
    CHECK_EQ(async_fiber_unwatch_signal(rw_sig), 0);
    CHECK_EQ(async_sched_shutdown(s, 5000), 0);
    async_sched_destroy(s);
}

/* --- stats_signal ---------------------------------------------------------------- */

static void t_stats_signal(void)
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    CHECK_EQ(async_runtime_add_signal(rt, SIGUSR2, 42), 0);
    io_event_t ev[8];
    uint64_t sigs = 0, comps = 0;
    for (int i = 0; i < 30; i++) {
        raise(SIGUSR2);
        if (i % 5 == 3) /* a signal and completions in one wait */
            for (int k = 0; k < 3; k++)
                CHECK_EQ(async_runtime_post_completion(rt, 7, (uintptr_t)k), 0);
        int n = async_runtime_wait(rt, ev, 8, i % 3 == 0 ? 0 : 1000);
        CHECK(n >= 0);
        for (int k = 0; k < n; k++) {
            if (ev[k].event_type == ASYNC_EVENT_SIGNAL)
                sigs++;
            else if (ev[k].event_type == ASYNC_EVENT_COMPLETION)
                comps++;
            else
                CHECK(!"unexpected event type");
        }
    }
    /* what is left */
    int n;
    while ((n = async_runtime_wait(rt, ev, 8, 0)) > 0)
        for (int k = 0; k < n; k++)
            ev[k].event_type == ASYNC_EVENT_SIGNAL ? sigs++ : comps++;
    CHECK(sigs >= 10);
    CHECK_EQ(comps, 18);
    async_runtime_stats_t st;
    CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
    CHECK_EQ(st.events[6], sigs);
    CHECK_EQ(st.events[4], comps);
    CHECK_EQ(st.events_total, sigs + comps);
    async_runtime_deinit(rt);
}

/* --- dump_failed_rereg ----------------------------------------------------------- */

static void t_dump_failed_rereg(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = host_handler;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(SIGUSR1, &sa, NULL), 0);
    async_sched_config_t cfg = {1, 0, 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s != NULL);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(fcntl(p[0], F_SETFL, O_NONBLOCK), 0);
    const int bad[][2] = {{SIGALRM, 1}, {SIGUSR1, -1}, {SIGKILL, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ(async_sched_dump_on_signal(s, SIGUSR1, p[1]), 0);
        CHECK(!host_installed(SIGUSR1));
        CHECK_FAIL(async_sched_dump_on_signal(s, bad[i][0], bad[i][1] < 0 ? -1 : p[1]) == -1, ASYNC_E_INVAL);
        CHECK(host_installed(SIGUSR1)); /* s's was the last registration */
        host_hits = 0;
        raise(SIGUSR1);
        CHECK_EQ(host_hits, 1);
        char buf[64];
        CHECK(read(p[0], buf, sizeof buf) < 0 && errno == EAGAIN); /* nothing dumped */
    }
    /* The slot went too: 64 registrations, one fails, a 65th scheduler fits. */
    enum { N = 65 };
    async_sched_t *m[N];
    int devnull = open("/dev/null", O_WRONLY);
    CHECK(devnull >= 0);
    for (int i = 0; i < N; i++)
        CHECK((m[i] = async_sched_create(&cfg)) != NULL);
    for (int i = 0; i < 64; i++)
        CHECK_EQ(async_sched_dump_on_signal(m[i], SIGUSR2, devnull), 0);
    CHECK_FAIL(async_sched_dump_on_signal(m[64], SIGUSR2, devnull) == -1, ASYNC_E_NOMEM);
    CHECK_FAIL(async_sched_dump_on_signal(m[3], SIGALRM, devnull) == -1, ASYNC_E_INVAL);
    CHECK_EQ(async_sched_dump_on_signal(m[64], SIGUSR2, devnull), 0);
    for (int i = 0; i < N; i++)
        async_sched_destroy(m[i]);
    async_sched_destroy(s);
    close(devnull);
    close(p[0]);
    close(p[1]);
}

/* --- log_one_line ---------------------------------------------------------------- */

static atomic_int lo_msgs, lo_ctl;
static void lo_handler(int level, const char *msg, void *ctx)
{
    (void)level, (void)ctx;
    atomic_fetch_add(&lo_msgs, 1);
    for (const char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            atomic_fetch_add(&lo_ctl, 1);
}

/* In a child with the crafted ASYNC_FIBER_STALL_MS: one message to stderr
 * (the default handler), one to a handler. */
static void t_log_one_line_child(void)
{
    async_sched_t *s = async_sched_create(NULL);
    CHECK(s != NULL);
    async_sched_destroy(s);
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_DEBUG, lo_handler, NULL), 0);
    s = async_sched_create(NULL);
    CHECK(s != NULL);
    async_sched_destroy(s);
    CHECK(atomic_load(&lo_msgs) >= 1);
    CHECK_EQ(atomic_load(&lo_ctl), 0);
}

static void t_log_one_line(void)
{
    char out[4096];
    int st = run_self_case_out("log_one_line_child",
                               "ASYNC_FIBER_STALL_MS=5\nlibasync: forged\r\x1b[2Jline", out, sizeof out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    int lines = 0; /* lines that start with "libasync:" */
    for (char *p = out; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        lines += strncmp(p, "libasync:", 9) == 0;
    CHECK_EQ(lines, 1);
    CHECK(strstr(out, "ASYNC_FIBER_STALL_MS=5\\nlibasync: forged\\r\\x1b[2Jline ignored") != NULL);
    /* one line: the only newline is the last byte */
    char *nl = strchr(out, '\n');
    CHECK(nl != NULL && nl[1] == 0);
}

/* --- log_records ----------------------------------------------------------------- */

enum { LR_THREADS = 4, LR_TRIPLES = 2000 };
static atomic_int lr_go, lr_calls;
static _Atomic(uintptr_t) lr_ctx_seen;
static void lr_handler(int level, const char *msg, void *ctx)
{
    (void)level, (void)msg;
    atomic_fetch_add(&lr_calls, 1);
    atomic_store(&lr_ctx_seen, (uintptr_t)ctx);
}
static void lr_other(int level, const char *msg, void *ctx) { (void)level, (void)msg, (void)ctx; }

static void *lr_thread(void *arg)
{
    uintptr_t me = (uintptr_t)arg;
    while (!atomic_load(&lr_go))
        sched_yield();
    for (int round = 0; round < 2; round++)
        for (uintptr_t i = 0; i < LR_TRIPLES; i++) {
            /* the same triples in every thread, different orders */
            uintptr_t k = (i * (2 * me + 1)) % LR_TRIPLES;
            CHECK_EQ(async_set_log_handler((int)(k % 5), (k & 1) ? lr_handler : lr_other,
                                           (void *)(0x10000 + k)), 0);
        }
    return NULL;
}

static void t_log_records(void)
{
    pthread_t t[LR_THREADS];
    for (uintptr_t i = 0; i < LR_THREADS; i++)
        start_thread(&t[i], lr_thread, (void *)i);
    atomic_store(&lr_go, 1);
    for (int i = 0; i < LR_THREADS; i++)
        join_within(t[i], 60000, "log setter");
    /* Each triple set again from here finds its record: the handler, level
     * and ctx are the ones given. A bad ASYNC_FIBER_STALL_MS makes one WARN
     * at each async_sched_create. */
    CHECK_EQ(setenv("ASYNC_FIBER_STALL_MS", "bad", 1), 0);
    for (uintptr_t k = 1; k < LR_TRIPLES; k += 2) {
        int level = (int)(k % 5);
        CHECK_EQ(async_set_log_handler(level, lr_handler, (void *)(0x10000 + k)), 0);
        if (k % 100 != 1)
            continue;
        atomic_store(&lr_calls, 0);
        async_sched_t *s = async_sched_create(NULL);
        CHECK(s != NULL);
        async_sched_destroy(s);
        if (level >= ASYNC_LOG_WARN) {
            CHECK(atomic_load(&lr_calls) >= 1);
            CHECK_EQ(atomic_load(&lr_ctx_seen), 0x10000 + k);
        } else {
            CHECK_EQ(atomic_load(&lr_calls), 0);
        }
    }
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, NULL, NULL), 0);
    CHECK_FAIL(async_set_log_handler(ASYNC_LOG_DEBUG + 1, lr_handler, NULL) == -1, ASYNC_E_INVAL);
}

/* --- cancel_* ---------------------------------------------------------------------- */

enum { CW_CHAN, CW_MUTEX, CW_QUEUE, CW_RUNTIME, CW_SLEEP, CW_SIGNAL };
static struct {
    int what;
    async_chan_t *c;
    async_mutex_t *m;
    async_queue_t *q;
    async_runtime_t *rt;
    atomic_int tid, rc, value, after, held, release;
    pthread_t holder;
} cw;

/* Holds cw.m until cw.release (a mutex is unlocked by its owner). */
static void *cw_holder(void *arg)
{
    (void)arg;
    CHECK_EQ(async_mutex_lock(cw.m, -1), 0);
    atomic_store(&cw.held, 1);
    while (!atomic_load(&cw.release))
        sleep_ms(1);
    CHECK_EQ(async_mutex_unlock(cw.m), 0);
    return NULL;
}

/* The waiting thread: one blocking call, its result, then a cancellation
 * point (where the cancel must act). Not instrumented by ASan: the
 * cancellation's unwinding skips ASan's unpoisoning of this frame's
 * redzones, and ASan's own thread teardown then writes over them (a false
 * stack-buffer-overflow in sigaltstack). */
__attribute__((no_sanitize_address)) static void *cw_proc(void *arg)
{
    (void)arg;
    atomic_store(&cw.tid, (int)gettid());
    int rc = -1, v = 0;
    switch (cw.what) {
    case CW_CHAN:
        rc = async_chan_recv(cw.c, &v, -1);
        break;
    case CW_MUTEX:
        rc = async_mutex_lock(cw.m, -1);
        v = 1;
        break;
    case CW_QUEUE: {
        size_t n = 0;
        rc = async_queue_dequeue_wait(cw.q, &v, sizeof v, &n, -1) ? 0 : -1;
        break;
    }
    case CW_RUNTIME: {
        io_event_t ev[2];
        rc = async_runtime_wait(cw.rt, ev, 2, -1);
        v = rc == 1 ? (int)ev[0].data : -1;
        break;
    }
    case CW_SLEEP:
        rc = async_fiber_sleep(1000);
        v = 1;
        break;
    case CW_SIGNAL:
        rc = async_fiber_wait_signal(SIGRTMIN + 4, -1);
        v = rc == 1 ? 4242 : -1;
        rc = rc == 1 ? 0 : rc;
        break;
    }
    atomic_store(&cw.rc, rc);
    atomic_store(&cw.value, v);
    pthread_testcancel(); /* the cancel acts here */
    atomic_store(&cw.after, 1);
    return NULL;
}

static void *cw_worker_proc(void *arg) { return cw_proc(arg); }

/* The event the waiter waits for (from a helper thread: a regression may hang). */
static void *cw_complete(void *arg)
{
    (void)arg;
    int v = 4242;
    switch (cw.what) {
    case CW_CHAN:
        CHECK_EQ(async_chan_send(cw.c, &v, 5000), 0);
        break;
    case CW_MUTEX:
        atomic_store(&cw.release, 1);
        join_within(cw.holder, 10000, "mutex holder");
        break;
    case CW_QUEUE:
        CHECK(async_queue_enqueue(cw.q, &v, sizeof v));
        break;
    case CW_RUNTIME:
        CHECK_EQ(async_runtime_post_completion(cw.rt, 1, (uintptr_t)v), 0);
        break;
    case CW_SLEEP:
        break;
    case CW_SIGNAL: {
        union sigval sv = {0};
        CHECK_EQ(sigqueue(getpid(), SIGRTMIN + 4, sv), 0);
        break;
    }
    }
    return NULL;
}

/* 0 if inconclusive: the call had returned before the cancel was sent
 * (only a sleep can: it ends by itself). */
static int cancel_case(int what, int on_worker)
{
    memset(&cw, 0, sizeof cw);
    cw.what = what;
    atomic_store(&cw.rc, -99); /* set by the waiter when its call returns */
    CHECK((cw.c = async_chan_create(0, sizeof(int))) != NULL);
    CHECK((cw.m = async_mutex_create()) != NULL);
    if (what == CW_MUTEX) {
        start_thread(&cw.holder, cw_holder, NULL);
        while (!atomic_load(&cw.held))
            sleep_ms(1);
    }
    CHECK((cw.q = async_queue_create(4, sizeof(int), 0)) != NULL);
    CHECK((cw.rt = async_runtime_init()) != NULL);
    if (what == CW_SIGNAL)
        CHECK_EQ(async_fiber_watch_signal(SIGRTMIN + 4), 0);
    pthread_t th;
    async_worker_t *w = NULL;
    if (on_worker) {
        CHECK((w = async_worker_create(cw_worker_proc, NULL, 0)) != NULL);
        th = async_worker_get_native_handle(w);
    } else {
        start_thread(&th, cw_proc, NULL);
    }
    /* asleep in the call for 3 samples in a row (it sleeps nowhere else) */
    double t0 = now_ms();
    for (int streak = 0; streak < 3;) {
        int tid = atomic_load(&cw.tid);
        streak = tid && thread_asleep(tid) ? streak + 1 : 0;
        CHECK(now_ms() - t0 < 10000);
        sleep_ms(5);
    }
    CHECK_EQ(pthread_cancel(th), 0);
    int early = atomic_load(&cw.rc) != -99;
    CHECK(!early || what == CW_SLEEP);
    sleep_ms(20); /* let a cancel that wrongly acts inside the call do so */
    pthread_t helper;
    start_thread(&helper, cw_complete, NULL);
    join_within(helper, 10000, "the waiter's event");
    if (on_worker) {
        CHECK(async_worker_join(w, 10000));
        async_worker_destroy(w);
    } else {
        join_within(th, 10000, "cancelled waiter");
    }
    if (early) { /* a loaded machine: the sleep ended before the cancel */
        async_runtime_deinit(cw.rt);
        async_queue_destroy(cw.q);
        async_chan_destroy(cw.c);
        async_mutex_destroy(cw.m);
        return 0;
    }
    /* the call completed with its result; the cancel acted after it */
    CHECK_EQ(atomic_load(&cw.after), 0);
    switch (what) {
    case CW_CHAN:
    case CW_QUEUE:
    case CW_RUNTIME:
    case CW_SIGNAL:
        CHECK_EQ(atomic_load(&cw.rc), what == CW_RUNTIME ? 1 : 0);
        CHECK_EQ(atomic_load(&cw.value), 4242);
        break;
    case CW_MUTEX:
    case CW_SLEEP:
        CHECK_EQ(atomic_load(&cw.rc), 0);
        CHECK_EQ(atomic_load(&cw.value), 1);
        break;
    }
    /* the objects still work */
    int v = 1;
    CHECK_FAIL(async_chan_send(cw.c, &v, 50) == -1, ASYNC_E_TIMEDOUT); /* no receiver left behind */
    if (what != CW_MUTEX) { /* (there the dead thread owns it) */
        CHECK_EQ(async_mutex_lock(cw.m, 1000), 0);
        CHECK_EQ(async_mutex_unlock(cw.m), 0);
    }
    CHECK(async_queue_enqueue(cw.q, &v, sizeof v));
    CHECK(async_queue_dequeue_wait(cw.q, &v, sizeof v, NULL, 1000));
    io_event_t ev[2];
    CHECK(async_runtime_wait(cw.rt, ev, 2, 0) >= 0); /* not BUSY */
    if (what == CW_SIGNAL) {
        union sigval sv = {0};
        CHECK_EQ(sigqueue(getpid(), SIGRTMIN + 4, sv), 0);
        CHECK_EQ(async_fiber_wait_signal(SIGRTMIN + 4, 5000), 1);
        CHECK_EQ(async_fiber_unwatch_signal(SIGRTMIN + 4), 0);
    }
    async_runtime_deinit(cw.rt);
    async_queue_destroy(cw.q);
    async_chan_destroy(cw.c);
    if (what != CW_MUTEX)
        async_mutex_destroy(cw.m);
    return 1;
}

static void t_cancel_chan_recv(void) { cancel_case(CW_CHAN, 0); }
static void t_cancel_chan_recv_worker(void) { cancel_case(CW_CHAN, 1); }
static void t_cancel_mutex_lock(void) { cancel_case(CW_MUTEX, 0); }
static void t_cancel_queue_dequeue(void) { cancel_case(CW_QUEUE, 0); }
static void t_cancel_queue_dequeue_worker(void) { cancel_case(CW_QUEUE, 1); }
static void t_cancel_runtime_wait(void) { cancel_case(CW_RUNTIME, 0); }
static void t_cancel_runtime_wait_worker(void) { cancel_case(CW_RUNTIME, 1); }
static void t_cancel_signal_wait(void) { cancel_case(CW_SIGNAL, 0); }
static void t_cancel_sleep(void)
{
    int tries = 0;
    while (!cancel_case(CW_SLEEP, 0))
        CHECK(++tries < 5);
}

static const test_case_t cases[] = {
    T(dump_vs_watch), // poll adversarial
    T(fiber_rewatch), // adversarial
    T(stats_signal), // poll adversarial
    T(dump_failed_rereg), // adversarial
    T(log_one_line), // adversarial
    T(log_records), // adversarial
    T(cancel_chan_recv), // poll adversarial
    T(cancel_chan_recv_worker), // poll adversarial
    T(cancel_mutex_lock), // poll adversarial
    T(cancel_queue_dequeue), // poll adversarial
    T(cancel_queue_dequeue_worker), // poll adversarial
    T(cancel_runtime_wait), // poll adversarial
    T(cancel_runtime_wait_worker), // poll adversarial
    T(cancel_sleep), // poll adversarial
    T(cancel_signal_wait), // poll adversarial
    {"log_one_line_child", t_log_one_line_child}, /* run by log_one_line */
};

TEST_MAIN(cases)
