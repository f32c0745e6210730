/* async_sched_dump (docs/DEBUGGING.md): one line per fiber with its id,
 * name and state (parked in which wait, runnable, running, blocking, done),
 * dumps from threads, fibers and signals while fibers spawn, park, migrate
 * and end (run it under ASan), the dump-on-signal handler, and a dump to a
 * pipe whose reader is gone: ASYNC_E_SYS with EPIPE, no SIGPIPE (nor from
 * the signal handler). */
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>

#include "fibers.h"

/* Dumps s into a string (malloc'd) through a temporary file. */
static char *dump_str(async_sched_t *s, int *nlines) {
    char path[] = "/tmp/la_dump_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    int n = async_sched_dump(s, fd);
    CHECK(n >= 0);
    if (nlines) *nlines = n;
    off_t len = lseek(fd, 0, SEEK_END);
    char *buf = malloc((size_t)len + 1);
    CHECK(buf);
    CHECK_EQ(pread(fd, buf, (size_t)len, 0), len);
    buf[len] = 0;
    close(fd);
    return buf;
}

/* The dump line of the fiber named name ("fiber N \"name\" ..."), copied
 * into out; 0 if there is none. */
static int line_of(const char *dump, const char *name, char *out, size_t cap) {
    char key[64];
    snprintf(key, sizeof key, "\"%s\" ", name);
    const char *p = strstr(dump, key);
    if (!p) return 0;
    while (p > dump && p[-1] != '\n') p--;
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n >= cap) n = cap - 1;
    memcpy(out, p, n);
    out[n] = 0;
    return 1;
}

static void expect_line(const char *dump, const char *name, const char *what) {
    char line[256];
    if (!line_of(dump, name, line, sizeof line) || !strstr(line, what)) {
        fprintf(stderr, "dump:\n%s\nno line for \"%s\" with \"%s\"\n", dump, name, what);
        CHECK(!"dump line");
    }
}

/* ---- dump ------------------------------------------------------------------------ */

static async_chan_t *dch;
static int dpipe[2];
static atomic_int spin_stop;
static async_fiber_t *sleeper_f;

static void d_reader(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "reader");
    int v;
    async_chan_recv(dch, &v, -1);
}

static void d_sender(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "sender");
    async_chan_t *c = async_chan_create(0, sizeof(int));
    int v = 1;
    async_chan_send(c, &v, -1); /* nobody receives: parked until shutdown */
    async_chan_destroy(c);
}

static void d_sleeper(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "sleeper");
    async_fiber_sleep(600000);
}

static void d_piper(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "piper");
    char c;
    async_fiber_read(dpipe[0], &c, 1, -1);
}

static void d_joiner(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "joiner");
    async_fiber_join(sleeper_f, -1);
}

static void d_spinner(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "spinner");
    while (!atomic_load(&spin_stop)) {
    }
}

static void d_done(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "finished");
}

static void d_blocker_fn(void *arg) {
    (void)arg;
    while (!atomic_load(&spin_stop)) sleep_ms(1);
}

static void d_blocker(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "blocker");
    async_fiber_blocking(d_blocker_fn, NULL);
}

static async_queue_t *dq;

static void d_queuer(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "queuer");
    char m[8];
    size_t n = 0;
    async_queue_dequeue_wait(dq, m, sizeof m, &n, -1);
}

CASE(dump_states) {
    CHECK_FAIL(async_sched_dump(NULL, 1) == -1, ASYNC_E_BADHANDLE);
    async_sched_config_t cfg = {.workers = 2};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    CHECK_FAIL(async_sched_dump(s, -1) == -1, ASYNC_E_INVAL);
    /* a write that fails: ASYNC_E_SYS with the errno */
    int bad = open("/dev/null", O_RDONLY);
    CHECK(bad >= 0);
    CHECK_FAIL(async_sched_dump(s, bad) == -1, ASYNC_E_SYS);
    CHECK_EQ(async_last_os_error(), EBADF);
    close(bad);
    int n = -1;
    char *d = dump_str(s, &n); /* empty */
    CHECK_EQ(n, 0);
    CHECK(strstr(d, "2 workers, 0 fibers"));
    free(d);

    dch = async_chan_create(0, sizeof(int));
    CHECK(dch);
    CHECK_EQ(pipe(dpipe), 0);
    dq = async_queue_create(4, 8, 0);
    CHECK(dq);
    async_fiber_t *fin = async_fiber_spawn(s, d_done, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(fin);
    sleeper_f = async_fiber_spawn(s, d_sleeper, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(sleeper_f);
    CHECK(async_fiber_spawn(s, d_reader, NULL, 0));
    CHECK(async_fiber_spawn(s, d_sender, NULL, 0));
    CHECK(async_fiber_spawn(s, d_piper, NULL, 0));
    CHECK(async_fiber_spawn(s, d_joiner, NULL, 0));
    CHECK(async_fiber_spawn(s, d_blocker, NULL, 0));
    CHECK(async_fiber_spawn(s, d_queuer, NULL, 0));
    CHECK(async_fiber_spawn(s, d_spinner, NULL, 0));
    wait_counts(s, 7, 1);
    sleep_ms(30); /* so that "for N ms" is > 0 somewhere (not asserted exactly) */
    d = dump_str(s, &n);
    printf("%s", d);
    CHECK_EQ(n, 9);
    CHECK(strstr(d, "9 fibers"));
    CHECK(strstr(d, "end of dump: 9 fibers listed"));
    char want[128];
    snprintf(want, sizeof want, "parked: chan recv 0x%llx, for ", (unsigned long long)(uintptr_t)dch);
    expect_line(d, "reader", want);
    expect_line(d, "sender", "parked: chan send 0x");
    expect_line(d, "sleeper", "parked: sleep, wakes in ");
    snprintf(want, sizeof want, "parked: fd %d read, for ", dpipe[0]);
    expect_line(d, "piper", want);
    expect_line(d, "joiner", "parked: join of fiber ");
    expect_line(d, "blocker", "parked: blocking call 0x");
    snprintf(want, sizeof want, "parked: queue read 0x%llx", (unsigned long long)(uintptr_t)dq);
    expect_line(d, "queuer", want);
    expect_line(d, "spinner", "running on worker ");
    expect_line(d, "finished", "done-unjoined");
    /* the joiner names the sleeper's id */
    char sl[256], jl[256];
    CHECK(line_of(d, "sleeper", sl, sizeof sl) && line_of(d, "joiner", jl, sizeof jl));
    unsigned long long sid = strtoull(sl + 6, NULL, 10);
    snprintf(want, sizeof want, "join of fiber %llu,", sid);
    CHECK(strstr(jl, want));
    free(d);
    /* from a fiber too (another scheduler's and its own) */
    atomic_store(&spin_stop, 1);
    CHECK_EQ(write(dpipe[1], "x", 1), 1);
    CHECK_EQ(async_sched_shutdown(s, 10000), 0);
    CHECK_EQ(async_fiber_join(fin, 1000), 0);
    async_sched_destroy(s);
    async_chan_destroy(dch);
    async_queue_destroy(dq);
    close_pair(dpipe);
}

/* ---- dump during churn (run it under ASan): threads and fibers dump while
 * fibers spawn, park, migrate, end, and signals dump too ------------------------- */

static async_sched_t *churn_s;
static atomic_int churn_stop;
static atomic_long churn_dumps, churn_rounds;
static int null_fd;

static void churn_leaf(void *arg) {
    async_chan_t *c = arg;
    async_fiber_set_name(NULL, "leaf");
    int v = 0;
    CHECK_EQ(async_chan_send(c, &v, -1), 0);
    async_fiber_yield();
    async_fiber_sleep(0);
}

static void churn_parent(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "parent");
    async_chan_t *c = async_chan_create(1, sizeof(int));
    CHECK(c);
    while (!atomic_load(&churn_stop)) {
        async_fiber_t *kids[8];
        for (int i = 0; i < 8; i++) kids[i] = async_fiber_spawn(churn_s, churn_leaf, c, ASYNC_FIBER_JOINABLE);
        for (int i = 0; i < 8; i++) {
            int v;
            if (kids[i]) CHECK_EQ(async_chan_recv(c, &v, -1), 0);
        }
        for (int i = 0; i < 8; i++)
            if (kids[i]) CHECK_EQ(async_fiber_join(kids[i], -1), 0);
        atomic_fetch_add(&churn_rounds, 1);
    }
    async_chan_destroy(c);
}

static void churn_dumper(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "dumper");
    while (!atomic_load(&churn_stop)) {
        CHECK(async_sched_dump(churn_s, null_fd) >= 0);
        atomic_fetch_add(&churn_dumps, 1);
        async_fiber_yield();
    }
}

static void *churn_thread(void *arg) {
    (void)arg;
    while (!atomic_load(&churn_stop)) {
        CHECK(async_sched_dump(churn_s, null_fd) >= 0);
        atomic_fetch_add(&churn_dumps, 1);
    }
    return NULL;
}

static void *signal_thread(void *arg) {
    (void)arg;
    long n = 0;
    while (!atomic_load(&churn_stop)) {
        kill(getpid(), SIGUSR1);
        if (++n % 16 == 0) sleep_ms(1);
    }
    return NULL;
}

static async_scope_t *djoin_scope;
static void d_scoper(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "scoper");
    CHECK_EQ(async_scope_join(djoin_scope, -1), 0);
}

/* A fiber in async_scope_join shows the scope's handle. */
CASE(dump_scope_join) {
    async_sched_t *s = sched_new(2);
    djoin_scope = async_scope_create(s, NULL, -1);
    CHECK(djoin_scope);
    CHECK(async_scope_spawn(djoin_scope, d_sleeper, NULL, 0));
    CHECK(async_fiber_spawn(s, d_scoper, NULL, 0));
    wait_counts(s, 2, 0);
    int n = -1;
    char *d = dump_str(s, &n);
    char want[128];
    snprintf(want, sizeof want, "parked: scope join 0x%llx, for ", (unsigned long long)(uintptr_t)djoin_scope);
    expect_line(d, "scoper", want);
    free(d);
    CHECK_EQ(async_sched_shutdown(s, 10000), 0); /* the sleeper is cancelled, the join returns */
    async_sched_destroy(s);
}

CASE(dump_churn) { // timeout=120
    null_fd = open("/dev/null", O_WRONLY);
    CHECK(null_fd >= 0);
    async_sched_config_t cfg = {.workers = 2};
    churn_s = async_sched_create(&cfg);
    CHECK(churn_s);
    CHECK_EQ(async_sched_dump_on_signal(churn_s, SIGUSR1, null_fd), 0);
    CHECK_EQ(async_sched_set_stall_ms(churn_s, 1), 0); /* the monitor reads names too */
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_OFF, NULL, NULL), 0);
    for (int i = 0; i < 4; i++) CHECK(async_fiber_spawn(churn_s, churn_parent, NULL, 0));
    CHECK(async_fiber_spawn(churn_s, churn_dumper, NULL, 0));
    pthread_t th[2], sig;
    for (int i = 0; i < 2; i++) start_thread(&th[i], churn_thread, NULL);
    start_thread(&sig, signal_thread, NULL);
    sleep_ms(1500);
    double t0 = now_ms();
    atomic_store(&churn_stop, 1);
    for (int i = 0; i < 2; i++) join_within(th[i], 30000, "dump thread");
    join_within(sig, 30000, "signal thread");
    sleep_ms(20); /* a SIGUSR1 still pending is delivered while the handler is ours */
    double t1 = now_ms();
    CHECK_EQ(async_sched_run(churn_s), 0);
    printf("%ld dumps, %ld rounds of 8 fibers; stop %.0f ms, run %.0f ms\n", atomic_load(&churn_dumps),
           atomic_load(&churn_rounds), t1 - t0, now_ms() - t1);
    CHECK(atomic_load(&churn_dumps) > 0);
    CHECK(atomic_load(&churn_rounds) > 0);
    async_sched_destroy(churn_s); /* also drops the signal registration: SIGUSR1's default again */
    struct sigaction sa;
    CHECK_EQ(sigaction(SIGUSR1, NULL, &sa), 0);
    CHECK(sa.sa_handler == SIG_DFL);
    close(null_fd);
}

/* ---- dump on a signal -------------------------------------------------------------- */

static atomic_int host_hits;
static void host_handler(int sig) {
    (void)sig;
    atomic_fetch_add(&host_hits, 1);
}

CASE(dump_signal) {
    async_sched_config_t cfg = {.workers = 1};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    CHECK_FAIL(async_sched_dump_on_signal(s, SIGSEGV, 2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_dump_on_signal(s, SIGKILL, 2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_dump_on_signal(s, SIGPIPE, 2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_dump_on_signal(s, 9999, 2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_dump_on_signal(s, -1, 2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_dump_on_signal(s, SIGUSR2, -1) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_dump_on_signal(NULL, SIGUSR2, 2) == -1, ASYNC_E_BADHANDLE);
    /* the host's handler before */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = host_handler;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(SIGUSR2, &sa, NULL), 0);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(fcntl(p[0], F_SETFL, O_NONBLOCK), 0);
    dch = async_chan_create(0, sizeof(int));
    CHECK(async_fiber_spawn(s, d_reader, NULL, 0));
    wait_counts(s, 1, 0);
    CHECK_EQ(async_sched_dump_on_signal(s, SIGUSR2, p[1]), 0);
    CHECK_EQ(raise(SIGUSR2), 0);
    char out[4096];
    ssize_t n = read(p[0], out, sizeof out - 1);
    CHECK(n > 0);
    out[n] = 0;
    printf("%s", out);
    CHECK(strstr(out, "(signal "));
    expect_line(out, "reader", "parked: chan recv 0x");
    CHECK(strstr(out, "end of dump: 1 fibers listed\n"));
    CHECK_EQ(atomic_load(&host_hits), 0); /* replaced, not chained */
    /* removed: the host's handler is back */
    CHECK_EQ(async_sched_dump_on_signal(s, 0, 0), 0);
    CHECK_EQ(raise(SIGUSR2), 0);
    CHECK_EQ(atomic_load(&host_hits), 1);
    CHECK(read(p[0], out, sizeof out) < 0 && errno == EAGAIN);
    /* two schedulers on one signal: both dumped; destroying one keeps the
     * other's registration */
    async_sched_t *s2 = async_sched_create(&cfg);
    CHECK(s2);
    CHECK_EQ(async_sched_dump_on_signal(s, SIGUSR2, p[1]), 0);
    CHECK_EQ(async_sched_dump_on_signal(s2, SIGUSR2, p[1]), 0);
    CHECK_EQ(raise(SIGUSR2), 0);
    n = read(p[0], out, sizeof out - 1);
    CHECK(n > 0);
    out[n] = 0;
    CHECK(strstr(out, "1 workers, 1 fibers") && strstr(out, "1 workers, 0 fibers"));
    async_sched_destroy(s2);
    CHECK_EQ(raise(SIGUSR2), 0);
    n = read(p[0], out, sizeof out - 1);
    CHECK(n > 0);
    out[n] = 0;
    CHECK(strstr(out, "1 workers, 1 fibers") && !strstr(out, "0 fibers"));
    CHECK_EQ(atomic_load(&host_hits), 1);
    async_chan_close(dch);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s); /* the last registration: the host's handler is back */
    CHECK_EQ(raise(SIGUSR2), 0);
    CHECK_EQ(atomic_load(&host_hits), 2);
    async_chan_destroy(dch);
    close_pair(p);
}

/* ---- a dump to a pipe whose reader is gone ------------------------------------------
 * async_sched_dump from a plain thread fails with ASYNC_E_SYS (EPIPE) and
 * leaves no SIGPIPE pending; the dump-on-signal handler writing there does
 * not kill the process either. */

static void de_sleeper(void *arg)
{
    (void)arg;
    async_fiber_sleep(60000);
}

/* Starts a de_sleeper on s (something to dump) and returns the write end of
 * a pipe whose read end is closed. */
static int de_setup(async_sched_t *s)
{
    int p[2];
    CHECK(async_fiber_spawn(s, de_sleeper, NULL, 0) != NULL);
    CHECK_EQ(pipe(p), 0);
    close(p[0]);
    return p[1];
}

CASE(dump_epipe) // adversarial
{
    async_sched_t *s = sched_new(1);
    int w = de_setup(s);
    CHECK_FAIL(async_sched_dump(s, w) == -1, ASYNC_E_SYS);
    CHECK_EQ(async_last_os_error(), EPIPE);
    /* no SIGPIPE left pending for the host either */
    {
        sigset_t pend;
        CHECK_EQ(sigpending(&pend), 0);
        CHECK(!sigismember(&pend, SIGPIPE));
    }
    close(w);
    async_sched_destroy(s);
}

CASE(dump_signal_epipe) // adversarial
{
    async_sched_t *s = sched_new(1);
    int w = de_setup(s);
    CHECK_EQ(async_sched_dump_on_signal(s, SIGUSR2, w), 0);
    CHECK_EQ(raise(SIGUSR2), 0);
    CHECK_EQ(raise(SIGUSR2), 0);
    CHECK_EQ(async_sched_dump_on_signal(s, 0, 0), 0);
    close(w);
    async_sched_destroy(s);
}

TEST_MAIN()
