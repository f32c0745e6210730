/* Fiber debugging tools (issue 14 item 6; docs/DEBUGGING.md): fiber names,
 * async_sched_dump (also from a signal handler, also during churn), the
 * stall detector, and the gdb helper scripts/gdb/libasync-gdb.py run in a
 * real gdb against a child with parked fibers. */
#include <fcntl.h>
#include <dirent.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>

#include "check.h"

/* ---- helpers --------------------------------------------------------------------- */

/* Waits (bounded) until stats say `parked` fibers are parked and `running`
 * run. */
static void wait_counts(async_sched_t *s, uint64_t parked, uint64_t running) {
    async_sched_stats_t st;
    for (int i = 0; i < 20000; i++) {
        CHECK(async_sched_get_stats(s, &st, NULL, 0) >= 0);
        if (st.fibers_parked == parked && st.fibers_running == running) return;
        sleep_ms(1);
    }
    fprintf(stderr, "parked %llu running %llu\n", (unsigned long long)st.fibers_parked,
            (unsigned long long)st.fibers_running);
    CHECK(!"fibers did not reach the expected states");
}

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

/* ---- names ------------------------------------------------------------------------- */

static atomic_int go_on, self_checked;

static void name_self(void *arg) {
    (void)arg;
    char buf[ASYNC_FIBER_NAME_MAX];
    CHECK_EQ(async_fiber_get_name(NULL, buf, sizeof buf), 0); /* no name yet */
    CHECK_EQ(buf[0], 0);
    CHECK_EQ(async_fiber_set_name(NULL, "self"), 0);
    CHECK_EQ(async_fiber_get_name(NULL, buf, sizeof buf), 4);
    CHECK(strcmp(buf, "self") == 0);
    CHECK_EQ(async_fiber_get_name(async_fiber_current(), buf, sizeof buf), 4);
    atomic_store(&self_checked, 1); /* only now may the main thread rename it */
    while (!atomic_load(&go_on)) async_fiber_sleep(1);
}

static void t_names(void) {
    char buf[64];
    /* no fiber: NULL means the caller, and a plain thread is none */
    CHECK_FAIL(async_fiber_set_name(NULL, "x") == -1, ASYNC_E_STATE);
    CHECK_FAIL(async_fiber_get_name(NULL, buf, sizeof buf) == -1, ASYNC_E_STATE);
    CHECK_FAIL(async_fiber_set_name((async_fiber_t *)(uintptr_t)12345, "x") == -1, ASYNC_E_BADHANDLE);
    async_sched_config_t cfg = {.workers = 2};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    async_fiber_t *f = async_fiber_spawn(s, name_self, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f);
    CHECK_FAIL(async_fiber_get_name(f, NULL, 4) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_set_name((async_fiber_t *)s, "x") == -1, ASYNC_E_BADHANDLE); /* a sched handle */
    /* wait until the fiber has named itself and checked it (renaming it
     * before that made its own checks fail now and then: a race of this
     * test, seen under qemu) */
    for (int i = 0; i < 10000 && !atomic_load(&self_checked); i++) sleep_ms(1);
    CHECK(atomic_load(&self_checked));
    CHECK_EQ(async_fiber_get_name(f, buf, sizeof buf), 4);
    CHECK(strcmp(buf, "self") == 0);
    /* size 0 with NULL: the length only */
    CHECK_EQ(async_fiber_get_name(f, NULL, 0), 4);
    /* a small buffer: cut, NUL-terminated, full length returned */
    CHECK_EQ(async_fiber_get_name(f, buf, 3), 4);
    CHECK(strcmp(buf, "se") == 0);
    /* truncation at 31 bytes, never inside a UTF-8 sequence: 30 'a' + "é"
     * (2 bytes) is 32 bytes: the é goes whole */
    char longn[64];
    memset(longn, 'a', 30);
    strcpy(longn + 30, "\xc3\xa9zz");
    CHECK_EQ(async_fiber_set_name(f, longn), 0);
    CHECK_EQ(async_fiber_get_name(f, buf, sizeof buf), 30);
    CHECK(memcmp(buf, longn, 30) == 0 && buf[30] == 0);
    /* 29 'a' + é = 31 bytes fits exactly */
    memset(longn, 'a', 29);
    strcpy(longn + 29, "\xc3\xa9zz");
    CHECK_EQ(async_fiber_set_name(f, longn), 0);
    CHECK_EQ(async_fiber_get_name(f, buf, sizeof buf), 31);
    CHECK(memcmp(buf, longn, 31) == 0);
    /* bytes that are not UTF-8 (continuation bytes only) are cut at 31 */
    memset(longn, 0x80, 40);
    longn[40] = 0;
    CHECK_EQ(async_fiber_set_name(f, longn), 0);
    CHECK_EQ(async_fiber_get_name(f, buf, sizeof buf), 28);
    /* a 4-byte character across the cut goes whole */
    memset(longn, 'b', 28);
    strcpy(longn + 28, "\xf0\x9f\x98\x80");
    CHECK_EQ(async_fiber_set_name(f, longn), 0);
    CHECK_EQ(async_fiber_get_name(f, buf, sizeof buf), 28);
    memset(longn, 'b', 27);
    strcpy(longn + 27, "\xf0\x9f\x98\x80");
    CHECK_EQ(async_fiber_set_name(f, longn), 0);
    CHECK_EQ(async_fiber_get_name(f, buf, sizeof buf), 31);
    /* control bytes become '?': a dump line stays one line */
    CHECK_EQ(async_fiber_set_name(f, "a\nb\tc\x7f"), 0);
    CHECK_EQ(async_fiber_get_name(f, buf, sizeof buf), 6);
    CHECK(strcmp(buf, "a?b?c?") == 0);
    /* NULL and "" remove it */
    CHECK_EQ(async_fiber_set_name(f, NULL), 0);
    CHECK_EQ(async_fiber_get_name(f, buf, sizeof buf), 0);
    CHECK_EQ(async_fiber_set_name(f, "kept"), 0);
    CHECK_EQ(async_fiber_set_name(f, ""), 0);
    CHECK_EQ(async_fiber_get_name(f, buf, sizeof buf), 0);
    CHECK_EQ(async_fiber_set_name(f, "kept"), 0);
    atomic_store(&go_on, 1);
    /* a returned joinable fiber keeps its name until joined */
    async_sched_stats_t st;
    for (int i = 0; i < 10000; i++) {
        CHECK(async_sched_get_stats(s, &st, NULL, 0) >= 0);
        if (st.fibers_done_unjoined == 1) break;
        sleep_ms(1);
    }
    CHECK_EQ(st.fibers_done_unjoined, 1);
    CHECK_EQ(async_fiber_get_name(f, buf, sizeof buf), 4);
    CHECK_EQ(async_fiber_join(f, 10000), 0);
    CHECK_FAIL(async_fiber_get_name(f, buf, sizeof buf) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_set_name(f, "late") == -1, ASYNC_E_BADHANDLE);
    /* a reused record starts without a name */
    atomic_store(&go_on, 0);
    f = async_fiber_spawn(s, name_self, NULL, ASYNC_FIBER_JOINABLE); /* checks "no name yet" itself */
    CHECK(f);
    atomic_store(&go_on, 1);
    CHECK_EQ(async_fiber_join(f, 10000), 0);
    async_sched_destroy(s);
}

/* Names set from other threads while the fibers end: never a crash, only
 * 0 or ASYNC_E_BADHANDLE. */
static void short_fiber(void *arg) {
    (void)arg;
    async_fiber_yield();
}

static void t_names_race(void) {
    async_sched_config_t cfg = {.workers = 2};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    char buf[ASYNC_FIBER_NAME_MAX];
    int ok = 0, gone = 0;
    for (int i = 0; i < 20000; i++) {
        async_fiber_t *f = async_fiber_spawn(s, short_fiber, NULL, 0);
        CHECK(f);
        async_clear_error();
        if (async_fiber_set_name(f, "racer") == 0)
            ok++;
        else {
            CHECK_ERR(ASYNC_E_BADHANDLE);
            gone++;
        }
        int n = async_fiber_get_name(f, buf, sizeof buf);
        CHECK(n == -1 || n == 5 || n == 0);
    }
    printf("named %d, gone %d\n", ok, gone);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
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

static void t_dump_states(void) {
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
    close(dpipe[0]);
    close(dpipe[1]);
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

static void t_dump_churn(void) {
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

static void t_dump_signal(void) {
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
    close(p[0]);
    close(p[1]);
}

/* ---- stall detector ---------------------------------------------------------------- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[8192];
static atomic_int warns, infos, hog_warns;

static void log_fn(int level, const char *msg, void *ctx) {
    (void)ctx;
    if (strncmp(msg, "stall:", 6) != 0) return;
    pthread_mutex_lock(&log_mu);
    size_t l = strlen(log_buf);
    snprintf(log_buf + l, sizeof log_buf - l, "%d %s\n", level, msg);
    pthread_mutex_unlock(&log_mu);
    atomic_fetch_add(level == ASYNC_LOG_WARN ? &warns : &infos, 1);
    if (level == ASYNC_LOG_WARN && strstr(msg, "\"hog\"")) atomic_fetch_add(&hog_warns, 1);
}

static atomic_int hog_go;
static atomic_int yielder_go;

static void hog(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "hog");
    while (!atomic_load(&hog_go)) {
    }
}

static void yielder(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "polite");
    while (!atomic_load(&yielder_go)) async_fiber_yield();
}

/* Threads of this process named "la-stall" (the monitor threads). */
static int count_threads(void) {
    DIR *d = opendir("/proc/self/task");
    CHECK(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[300], comm[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(comm, sizeof comm, f) && strncmp(comm, "la-stall", 8) == 0) n++;
        fclose(f);
    }
    closedir(d);
    return n;
}

/* count_threads() once it equals want (bounded). A joined thread can stay
 * in /proc/self/task for a moment after pthread_join returned (the kernel
 * clears the joined tid before the task is gone; seen under qemu-user). */
static int threads_settle(int want) {
    int n = count_threads();
    for (int i = 0; i < 5000 && n != want; i++) {
        sleep_ms(1);
        n = count_threads();
    }
    return n;
}

static void wait_atomic(atomic_int *v, int want, const char *what) {
    for (int i = 0; i < 20000 && atomic_load(v) < want; i++) sleep_ms(1);
    if (atomic_load(v) < want) {
        fprintf(stderr, "log:\n%s", log_buf);
        fprintf(stderr, "%s did not happen\n", what);
        CHECK(0);
    }
}

static void t_stall(void) {
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_INFO, log_fn, NULL), 0);
    async_sched_config_t cfg = {.workers = 2};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    CHECK_FAIL(async_sched_set_stall_ms(s, -1) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_set_stall_ms(s, 3600001) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_set_stall_ms(NULL, 10) == -1, ASYNC_E_BADHANDLE);
    int base = count_threads();
    CHECK_EQ(base, 0);
    CHECK_EQ(async_sched_set_stall_ms(s, 0), 0); /* off when off: nothing */
    CHECK_EQ(threads_settle(base), base);
    CHECK_EQ(async_sched_set_stall_ms(s, 40), 0);
    CHECK_EQ(threads_settle(base + 1), base + 1); /* the monitor thread */
    CHECK_EQ(async_sched_set_stall_ms(s, 40), 0); /* again: still one */
    CHECK_EQ(threads_settle(base + 1), base + 1);
    /* a fiber that yields all the time runs beside it (it is reported only
     * if the OS keeps its worker thread off the CPU for 40 ms: a stall of
     * that worker all the same, so not asserted on this shared machine) */
    async_fiber_t *y = async_fiber_spawn(s, yielder, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(y);
    async_fiber_t *h = async_fiber_spawn(s, hog, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(h);
    wait_atomic(&warns, 1, "the stall report");
    /* reported once per stall: wait for several more thresholds to pass
     * (the monitor samples every 10 ms: count its rounds by time only as a
     * lower bound; a second report would be a bug whenever it came) */
    sleep_ms(400);
    atomic_store(&hog_go, 1);
    wait_atomic(&infos, 1, "the end-of-stall message");
    atomic_store(&yielder_go, 1);
    CHECK_EQ(async_fiber_join(h, 10000), 0);
    CHECK_EQ(async_fiber_join(y, 10000), 0);
    pthread_mutex_lock(&log_mu);
    printf("%s", log_buf);
    CHECK_EQ(atomic_load(&hog_warns), 1);
    CHECK(strstr(log_buf, "\"hog\" has run for "));
    CHECK(strstr(log_buf, "without parking or yielding (threshold 40 ms, on a CPU for "));
    pthread_mutex_unlock(&log_mu);
    /* off: the monitor thread is gone */
    CHECK_EQ(async_sched_set_stall_ms(s, 0), 0);
    CHECK_EQ(threads_settle(base), base);
    /* destroy with the monitor on stops it */
    CHECK_EQ(async_sched_set_stall_ms(s, 1000), 0);
    CHECK_EQ(threads_settle(base + 1), base + 1);
    async_sched_destroy(s);
    CHECK_EQ(threads_settle(base), base);
}

/* A log handler on the monitor thread cannot stop the monitor or destroy the
 * scheduler (the monitor would join itself, or free what it scans):
 * ASYNC_E_STATE, and both still work from elsewhere afterwards. */
static async_sched_t *hs;
static atomic_int h_set_err = -1, h_destroy_err = -1;

static void selfish_log(int level, const char *msg, void *ctx) {
    (void)ctx;
    if (level != ASYNC_LOG_WARN || strncmp(msg, "stall:", 6) != 0 || atomic_load(&h_destroy_err) != -1) return;
    async_clear_error();
    int rc = async_sched_set_stall_ms(hs, 0);
    atomic_store(&h_set_err, rc == -1 ? async_last_error() : 0);
    async_clear_error();
    async_sched_destroy(hs);
    atomic_store(&h_destroy_err, async_last_error());
}

static void t_stall_handler_calls(void) {
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, selfish_log, NULL), 0);
    async_sched_config_t cfg = {.workers = 1};
    hs = async_sched_create(&cfg);
    CHECK(hs);
    CHECK_EQ(async_sched_set_stall_ms(hs, 20), 0);
    async_fiber_t *h = async_fiber_spawn(hs, hog, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(h);
    for (int i = 0; i < 20000 && atomic_load(&h_destroy_err) == -1; i++) sleep_ms(1);
    CHECK_EQ(atomic_load(&h_set_err), ASYNC_E_STATE);
    CHECK_EQ(atomic_load(&h_destroy_err), ASYNC_E_STATE);
    atomic_store(&hog_go, 1);
    CHECK_EQ(async_fiber_join(h, 10000), 0);
    CHECK_EQ(async_sched_set_stall_ms(hs, 0), 0);
    CHECK_EQ(threads_settle(0), 0);
    async_sched_destroy(hs);
}

/* ASYNC_FIBER_STALL_MS turns it on for new schedulers (run in a child) */
static void t_stall_env_child(void) {
    if (!getenv("ASYNC_FIBER_STALL_MS")) return;
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_INFO, log_fn, NULL), 0);
    async_sched_config_t cfg = {.workers = 1};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    async_fiber_t *h = async_fiber_spawn(s, hog, NULL, ASYNC_FIBER_JOINABLE);
    wait_atomic(&warns, 1, "the stall report");
    atomic_store(&hog_go, 1);
    CHECK_EQ(async_fiber_join(h, 10000), 0);
    async_sched_destroy(s);
}

static void t_stall_env(void) {
    int st = run_self_case("stall_env_child", "ASYNC_FIBER_STALL_MS=30");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char out[4096];
    st = run_self_case_out("names", "ASYNC_FIBER_STALL_MS=bogus", out, sizeof out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(out, "ASYNC_FIBER_STALL_MS=bogus ignored"));
}

/* ---- gdb ----------------------------------------------------------------------------- */

static async_chan_t *gch;

__attribute__((noinline)) void gdb_parked_in_recv(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "gdb-reader");
    int v;
    async_chan_recv(gch, &v, -1);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void gdb_deep(int n) {
    if (n == 0) {
        async_fiber_sleep(600000);
        return;
    }
    gdb_deep(n - 1);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void gdb_sleeper_fn(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "gdb-sleeper");
    gdb_deep(2);
    __asm__ volatile("" ::: "memory");
}

/* gdb stops here */
__attribute__((noinline)) void gdb_ready(void) { __asm__ volatile("" ::: "memory"); }

static void t_gdb_target(void) {
    async_sched_config_t cfg = {.workers = 2};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    gch = async_chan_create(0, sizeof(int));
    CHECK(async_fiber_spawn(s, gdb_parked_in_recv, NULL, 0));
    CHECK(async_fiber_spawn(s, gdb_sleeper_fn, NULL, 0));
    wait_counts(s, 2, 0);
    gdb_ready();
    async_sched_shutdown(s, 10000);
    async_sched_destroy(s);
    async_chan_destroy(gch);
}

static void t_gdb(void) {
    const char *emu = getenv("ASYNC_TEST_EMULATOR");
    if (emu && *emu) { /* this binary is another architecture's (qemu-user) */
        printf("under an emulator: skipped\n");
        return;
    }
    if (system("gdb --version >/dev/null 2>&1") != 0) {
        printf("gdb not found: skipped\n");
        return;
    }
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(len > 0);
    self[len] = 0;
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "gdb -nx -batch -q -ex 'set pagination off' -ex 'set auto-load safe-path /' "
             "-ex 'source %s/scripts/gdb/libasync-gdb.py' -ex 'break gdb_ready' -ex 'run' "
             "-ex 'info fibers' -ex 'fiber bt gdb-reader' -ex 'fiber bt gdb-sleeper' -ex 'bt 1' "
             "-ex 'fiber bt nosuchfiber' -ex 'kill' --args %s gdb_target 2>&1",
             ASYNC_SOURCE_DIR, self);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    static char out[1 << 16];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    pclose(p);
    printf("%s\n", out);
    if (strstr(out, "ptrace: Operation not permitted") || strstr(out, "Couldn't get registers")) {
        printf("ptrace not permitted here: skipped\n");
        return;
    }
    CHECK(strstr(out, "\"gdb-reader\""));
    CHECK(strstr(out, "\"gdb-sleeper\""));
    CHECK(strstr(out, "chan recv 0x"));
    /* the parked fibers' own functions, found by unwinding their stacks */
    const char *r = strstr(out, "\"gdb-reader\" (parked):");
    CHECK(r);
    const char *sl = strstr(r, "\"gdb-sleeper\" (parked):");
    CHECK(sl);
    const char *fn = strstr(r, "gdb_parked_in_recv");
    CHECK(fn && fn < sl);
    CHECK(strstr(r, "async_chan_recv") && strstr(r, "async_chan_recv") < sl);
    CHECK(strstr(sl, "gdb_deep") && strstr(sl, "gdb_sleeper_fn") && strstr(sl, "async_fiber_sleep"));
    /* registers restored: the thread is still in gdb_ready */
    CHECK(strstr(sl, "#0  gdb_ready"));
    CHECK(strstr(out, "libasync: no fiber nosuchfiber"));
}

static const test_case_t cases[] = {
    T(names),
    T(names_race),
    T(dump_states),
    T(dump_churn), // timeout=120
    T(dump_signal),
    T(stall),
    T(stall_handler_calls),
    T(stall_env_child),
    T(stall_env),
    T(gdb_target),
    T(gdb), // timeout=180
};

TEST_MAIN(cases)
