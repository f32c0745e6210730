/* The log hook, async_set_log_handler: every message libasync writes for the
 * host goes through it; without a handler messages go to stderr. Levels
 * filter, the default comes back, handlers set from many threads at once
 * and in a forked child work, the handler set last is the one called (with
 * its ctx and level), and a message is one line whatever it quotes. Each
 * case that needs a message runs in a child process (an unknown
 * ASYNC_BACKEND is reported once per process; a stack overflow aborts it)
 * and the parent checks the child's stderr. */
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>

#include "check.h"

/* A handler that writes "HOOK<level>[<ctx>]:<msg>|" to stderr with one
 * write (async-signal-safe: it is also used for the FATAL report). */
static void hook(int level, const char *msg, void *ctx) {
    char buf[1200];
    size_t n = 0;
    const char *a = "HOOK";
    while (*a) buf[n++] = *a++;
    buf[n++] = (char)('0' + level);
    buf[n++] = '[';
    for (a = ctx ? (const char *)ctx : "-"; *a && n < 40; a++) buf[n++] = *a;
    buf[n++] = ']';
    buf[n++] = ':';
    for (a = msg; *a && n < sizeof buf - 2; a++) buf[n++] = *a;
    buf[n++] = '|';
    ssize_t w = write(2, buf, n);
    (void)w;
}

static void expect_init_notsup(void) {
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt == NULL);
    CHECK_ERR(ASYNC_E_NOTSUP);
}

/* ---- children ------------------------------------------------------------ */

CHILD(child_default) {
    expect_init_notsup();
    exit(0);
}

CHILD(child_hook) {
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, hook, "ctx1"), 0);
    expect_init_notsup();
    exit(0);
}

CHILD(child_filtered) {
    /* ERROR lets ERROR and FATAL through, not the WARN of the backend */
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_ERROR, hook, "ctx2"), 0);
    expect_init_notsup();
    exit(0);
}

CHILD(child_off) {
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_OFF, NULL, NULL), 0);
    expect_init_notsup();
    exit(0);
}

CHILD(child_restored) {
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_DEBUG, hook, "old"), 0);
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, NULL, NULL), 0); /* back to the default */
    expect_init_notsup();
    exit(0);
}

/* Frames well below the guard page's size: a frame larger than the guard
 * can jump over it, which no guard mode catches (async.h), and the child
 * would die of a plain SIGSEGV instead of the overflow report. */
static int rec(int depth) {
    volatile char buf[512];
    memset((char *)buf, depth, sizeof buf);
    return depth > 1000000 ? buf[1] : rec(depth + 1) + buf[depth % 512];
}

static void overflow(void *arg) {
    (void)arg;
    printf("%d\n", rec(0));
}

CHILD(child_overflow) {
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_FATAL, hook, "fatal"), 0);
    async_sched_config_t cfg = {1, 32 * 1024, 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    CHECK(async_fiber_spawn(s, overflow, NULL, 0));
    async_sched_run(s);
    fprintf(stderr, "survived\n");
    exit(0);
}

/* ---- cases ---------------------------------------------------------------- */

#define BACKEND_MSG "the environment variable ASYNC_BACKEND=\"bogus\" names no poller backend"

/* Runs child case `name` with ASYNC_BACKEND=bogus (its init logs
 * BACKEND_MSG), its stderr into out[4096]; the child must exit with 0. */
static void run_bogus_backend(const char *name, char out[4096]) {
    int st = run_self_case_out(name, "ASYNC_BACKEND=bogus", out, 4096);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Runs child case `name` (see run_bogus_backend): the default handler wrote
 * the message to stderr, and no hook got it. */
static void check_default_log(const char *name) {
    char out[4096];
    run_bogus_backend(name, out);
    CHECK(strstr(out, "libasync: " BACKEND_MSG) != NULL);
    CHECK(strstr(out, "HOOK") == NULL);
}

/* Without a handler the message is on stderr as before the hook existed. */
CASE(log_default_stderr) {
    check_default_log("child_default");
}

/* A handler gets the message (level, ctx, text without "libasync: " and
 * without a newline) and nothing is written to stderr by libasync. */
CASE(log_handler_gets_message) {
    char out[4096];
    run_bogus_backend("child_hook", out);
    CHECK(strstr(out, "HOOK2[ctx1]:" BACKEND_MSG) != NULL);
    CHECK(strstr(out, "ASYNC_E_NOTSUP|") != NULL); /* one line, no newline in it */
    CHECK(strstr(out, "libasync:") == NULL);
}

/* A message above the handler's level is dropped; OFF silences the default. */
CASE(log_level_filters) {
    char out[4096];
    run_bogus_backend("child_filtered", out);
    CHECK(strstr(out, "HOOK") == NULL);
    CHECK(strstr(out, "libasync:") == NULL);
    run_bogus_backend("child_off", out);
    CHECK(strstr(out, "libasync:") == NULL);
}

/* fn NULL restores the default handler; the replaced handler gets nothing. */
CASE(log_restore_default) {
    check_default_log("child_restored");
}

/* The fiber stack overflow report (from the SIGSEGV handler) goes through
 * the handler at ASYNC_LOG_FATAL, then the process aborts. */
CASE(log_overflow_through_handler) {
    if (getenv("ASYNC_TEST_EMULATOR")) {
        printf("skipped under an emulator (guard pages are not enforced there)\n");
        return;
    }
    char out[4096];
    int st = run_self_case_out("child_overflow", NULL, out, sizeof out);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    CHECK(strstr(out, "HOOK0[fatal]:fiber stack overflow in fiber ") != NULL);
    CHECK(strstr(out, "libasync: fiber stack overflow") == NULL);
    CHECK(strstr(out, "survived") == NULL);
}

/* Bad levels are refused with ASYNC_E_INVAL and change nothing. */
CASE(log_bad_level) {
    CHECK_FAIL(async_set_log_handler(ASYNC_LOG_DEBUG + 1, hook, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_set_log_handler(ASYNC_LOG_OFF - 1, hook, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_set_log_handler(1 << 30, NULL, NULL) == -1, ASYNC_E_INVAL);
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, NULL, NULL), 0);
}

/* Handlers swapped by several threads at once while others read: no crash,
 * and the last set wins (checked through a child would need a message; here
 * the calls themselves must all succeed). */
static _Atomic int swap_stop;
static void *swapper(void *arg) {
    (void)arg;
    for (int i = 0; i < 2000 && !atomic_load(&swap_stop); i++)
        CHECK_EQ(async_set_log_handler(i % 5, (i & 1) ? hook : NULL, NULL), 0);
    return NULL;
}

CASE(log_concurrent_set) {
    pthread_t th[4];
    for (int i = 0; i < 4; i++) start_thread(&th[i], swapper, NULL);
    for (int i = 0; i < 4; i++) join_within(th[i], 30000, "swapper");
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, NULL, NULL), 0);
}

/* async_set_log_handler in a child forked while other threads of the parent
 * were setting handlers: it must work at once, never wait for a lock that a
 * parent thread held at the fork. Each child must exit within 3 s. */
static _Atomic int fork_stop;
static void *fork_setter(void *arg) {
    uintptr_t me = (uintptr_t)arg;
    /* bounded: a leak per call must not eat the machine */
    for (uintptr_t i = 0; i < 1000000 && !atomic_load(&fork_stop); i++)
        CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, (i & 1) ? hook : NULL, (void *)(me * 8 + (i & 7))), 0);
    return NULL;
}

CASE(log_fork_set) {
    pthread_t th[3];
    for (uintptr_t i = 0; i < 3; i++) start_thread(&th[i], fork_setter, (void *)i);
    int hung = 0;
    for (int k = 0; k < 40; k++) {
        pid_t pid = fork_flushed();
        if (pid == 0) {
            int rc = async_set_log_handler(ASYNC_LOG_WARN, NULL, NULL);
            _exit(rc == 0 ? 0 : 3);
        }
        int st = 0, done = 0;
        for (int w = 0; w < 300 && !done; w++) {
            pid_t r = waitpid(pid, &st, WNOHANG);
            CHECK(r >= 0);
            if (r == pid) done = 1;
            else sleep_ms(10);
        }
        if (!done) {
            hung++;
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        } else {
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        }
    }
    atomic_store(&fork_stop, 1);
    for (int i = 0; i < 3; i++) join_within(th[i], 30000, "setter");
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, NULL, NULL), 0);
    CHECK_EQ(hung, 0);
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
CHILD(log_one_line_child)
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

CASE(log_one_line) // adversarial
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

CASE(log_records) // adversarial
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

TEST_MAIN()
