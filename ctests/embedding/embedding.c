/* What the Go runtime inside libasync means for a C host
 * (docs/EMBEDDING.md): threads after load, the signal handlers Go installs,
 * a host handler installed after load (SA_ONSTACK), SIGSEGV and SIGPIPE in
 * host code, fork + exec, and the address-space limit (ulimit -v) the
 * library needs. Each claim of docs/EMBEDDING.md names its case here.
 *
 * Several cases run this binary again as a child ("child_*" cases, not in
 * ctest's list: their table lines are not `T(name),`) to observe how a
 * process ends or how it starts under a limit. */
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "check.h"
#include "proc.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMB_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMB_ASAN 1
#endif
#endif
#ifndef EMB_ASAN
#define EMB_ASAN 0
#endif

/* The bound docs/EMBEDDING.md gives: threads the library adds to a process
 * once its first call returned (Go runtime: measured 4-7; see the doc). */
#define EMB_MAX_EXTRA_THREADS 12
/* The address-space limit (RLIMIT_AS, KiB, as `ulimit -v`) under which
 * docs/EMBEDDING.md says a small program works, and one under which the Go
 * runtime cannot start. */
#define EMB_ULIMIT_V_WORKS 2097152
#define EMB_ULIMIT_V_FAILS 600000

/* Prints the VmSize and VmRSS lines of /proc/self/status (measurements
 * docs/EMBEDDING.md quotes). */
static void print_vm(const char *when)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    if (!f)
        return;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmSize:", 7) == 0 || strncmp(line, "VmRSS:", 6) == 0)
            printf("%s %s", when, line);
    fclose(f);
}

/* One runtime round trip: the library works. */
static void round_trip(void)
{
    async_runtime_t *rt = async_runtime_init();
    io_event_t ev;
    CHECK(rt != NULL);
    CHECK_EQ(async_runtime_post_completion(rt, 11, 22), 0);
    CHECK_EQ(async_runtime_wait(rt, &ev, 1, 10000), 1);
    CHECK_EQ(ev.event_type, ASYNC_EVENT_COMPLETION);
    CHECK_EQ(ev.completion_key, 11);
    CHECK_EQ(ev.data, 22);
    async_runtime_deinit(rt);
}

static void *worker_ret(void *arg) { return arg; }
static void fiber_inc(void *arg) { __atomic_fetch_add((int *)arg, 1, __ATOMIC_SEQ_CST); }

/* A worker and a scheduler with fibers: the library works (threads, fibers). */
static void use_workers_and_fibers(void)
{
    async_sched_config_t cfg = {2, 0, 0};
    async_sched_t *s;
    async_worker_t *w;
    int n = 0, i;
    w = async_worker_create(worker_ret, (void *)&n, 0);
    CHECK(w != NULL);
    CHECK(async_worker_join(w, 10000));
    CHECK(async_worker_result(w) == (void *)&n);
    async_worker_destroy(w);
    s = async_sched_create(&cfg);
    CHECK(s != NULL);
    for (i = 0; i < 100; i++)
        CHECK(async_fiber_spawn(s, fiber_inc, &n, 0) != NULL);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(n, 100);
    async_sched_destroy(s);
}

/* ---- running this binary as a child ----------------------------------- */

static char self_path[4096];

static void find_self(void)
{
    ssize_t len = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    CHECK(len > 0);
    self_path[len] = 0;
}

static bool emulated(void)
{
    const char *emu = getenv("ASYNC_TEST_EMULATOR");
    return emu && *emu;
}

/* Readies run_child (find_self), unless skip: then it says "skipped: why"
 * and returns false. */
static bool children_ready(bool skip, const char *why)
{
    if (skip) {
        printf("skipped: %s\n", why);
        return false;
    }
    find_self();
    return true;
}

/* In a forked child: exec this binary's case `name` (through the emulator
 * under qemu-user). Never returns. */
static void exec_self(const char *name)
{
    const char *emu = getenv("ASYNC_TEST_EMULATOR");
    if (emu && *emu) {
        char *argv[] = {(char *)emu, self_path, (char *)name, NULL};
        execvp(emu, argv);
    } else {
        char *argv[] = {self_path, (char *)name, NULL};
        execv(self_path, argv);
    }
    _exit(99); /* exec failed */
}

/* Runs case `name` of this binary in a child process, with RLIMIT_AS set to
 * as_kib KiB first when as_kib > 0. Returns the wait status; the child's
 * stdout and stderr (at most outsz - 1 bytes) are in out. The child is
 * killed after 30 s (a hang fails the test). */
static int run_child(const char *name, long as_kib, char *out, size_t outsz)
{
    int p[2], status = 0;
    size_t got = 0;
    double t0 = now_ms();
    pid_t pid = fork_piped(p);
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        close_pair(p);
        if (as_kib > 0) {
            /* Thread stacks are reserved at RLIMIT_STACK (glibc's default
             * pthread stack size): the usual 8 MiB, whatever ctest got. */
            struct rlimit st = {8u << 20, 8u << 20}, as = {(rlim_t)as_kib * 1024, (rlim_t)as_kib * 1024};
            struct rlimit cur;
            if (getrlimit(RLIMIT_STACK, &cur) == 0 && cur.rlim_max != RLIM_INFINITY && cur.rlim_max < st.rlim_max)
                st.rlim_cur = st.rlim_max = cur.rlim_max;
            if (setrlimit(RLIMIT_STACK, &st) != 0 || setrlimit(RLIMIT_AS, &as) != 0)
                _exit(98);
        }
        exec_self(name);
    }
    close(p[1]);
    for (;;) {
        struct pollfd pf = {p[0], POLLIN, 0};
        int r = poll(&pf, 1, 100);
        if (r > 0) {
            char buf[512];
            ssize_t n = read(p[0], buf, sizeof buf);
            if (n <= 0)
                break;
            if (got + 1 < outsz) {
                size_t k = (size_t)n < outsz - 1 - got ? (size_t)n : outsz - 1 - got;
                memcpy(out + got, buf, k);
                got += k;
            }
        }
        if (now_ms() - t0 > 30000) {
            kill(pid, SIGKILL);
            break;
        }
    }
    out[got] = 0;
    close(p[0]);
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        CHECK(r != -1);
        if (r == pid)
            break;
        if (now_ms() - t0 > 30000) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fprintf(stderr, "child %s hung; its output:\n%s\n", name, out);
            CHECK(!"the child hung");
        }
        sleep_ms(2);
    }
    return status;
}

static void show_status(const char *name, int status, const char *out)
{
    fprintf(stderr, "child %s: %s %d; its output:\n%s\n", name, WIFEXITED(status) ? "exit code" : "signal",
            WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? WTERMSIG(status) : -1, out);
}

/* ---- threads ------------------------------------------------------------ */

/* EMBEDDING.md "Threads": the Go runtime starts its threads when the library
 * is loaded; once the first call returned, the process has at most
 * EMB_MAX_EXTRA_THREADS more than the host's own. */
CASE(threads_after_load)
{
    async_runtime_t *rt;
    int at_main = count_threads(), after;
    rt = async_runtime_init(); /* waits for the Go runtime's start */
    CHECK(rt != NULL);
    after = count_threads();
    printf("threads: %d at main, %d after the first call (bound: 1 + %d)\n", at_main, after,
           EMB_MAX_EXTRA_THREADS);
    /* qemu-user has a thread of its own in /proc/self/task. */
    CHECK(after <= 1 + EMB_MAX_EXTRA_THREADS + (emulated() ? 2 : 0));
    CHECK(after >= 2); /* the Go runtime does run threads of its own */
    round_trip();
    async_runtime_deinit(rt);
    after = count_threads();
    printf("threads after a round trip: %d\n", after);
    print_vm("after the first calls:");
    CHECK(after <= 1 + EMB_MAX_EXTRA_THREADS + (emulated() ? 2 : 0));
}

/* ---- signals ------------------------------------------------------------ */

static bool has_handler(int sig, bool *onstack)
{
    struct sigaction sa;
    CHECK_EQ(sigaction(sig, NULL, &sa), 0);
    *onstack = (sa.sa_flags & SA_ONSTACK) != 0;
    return (sa.sa_flags & SA_SIGINFO) ? sa.sa_sigaction != NULL
                                      : (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN);
}

/* EMBEDDING.md "Signals": by main, Go has installed handlers (SA_ONSTACK)
 * for SIGSEGV, SIGBUS, SIGFPE, SIGPIPE and SIGURG, and none for the other
 * signals (SIGQUIT, SIGINT, SIGTERM, SIGUSR1, SIGCHLD, SIGPROF keep their
 * default action). Checked before any libasync call. */
CASE(signal_handlers_at_main)
{
    static const int go_sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGPIPE, SIGURG};
    static const int host_sigs[] = {SIGQUIT, SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGCHLD, SIGPROF, SIGALRM};
    size_t i;
    bool onstack;
    for (i = 0; i < sizeof go_sigs / sizeof go_sigs[0]; i++) {
        if (EMB_ASAN && go_sigs[i] != SIGPIPE && go_sigs[i] != SIGURG)
            continue; /* ASan owns the fault signals in that build */
        if (!has_handler(go_sigs[i], &onstack) || !onstack)
            fprintf(stderr, "signal %d (%s): no handler with SA_ONSTACK at main\n", go_sigs[i],
                    strsignal(go_sigs[i]));
        CHECK(has_handler(go_sigs[i], &onstack));
        CHECK(onstack);
    }
    for (i = 0; i < sizeof host_sigs / sizeof host_sigs[0]; i++) {
        if (emulated())
            break; /* qemu-user reports its own view */
        if (has_handler(host_sigs[i], &onstack))
            fprintf(stderr, "signal %d (%s) has a handler at main\n", host_sigs[i], strsignal(host_sigs[i]));
        CHECK(!has_handler(host_sigs[i], &onstack));
    }
    round_trip();
}

/* The signals 1..64 blocked in the calling thread, one bit each. */
static uint64_t blocked_mask(void)
{
    sigset_t m;
    uint64_t bits = 0;
    CHECK_EQ(pthread_sigmask(SIG_BLOCK, NULL, &m), 0);
    for (int s = 1; s <= 64 && s < NSIG; s++)
        if (sigismember(&m, s) == 1)
            bits |= (uint64_t)1 << (s - 1);
    return bits;
}

static void mask_keeper_timer(void)
{
    async_runtime_t *rt = async_runtime_init(); /* a thread's first call into Go */
    io_event_t ev;
    CHECK(rt != NULL);
    CHECK(async_runtime_add_timer(rt, 1, 0, 7) != 0);      /* Go: the timer wheel */
    CHECK_EQ(async_runtime_wait(rt, &ev, 1, 10000), 1);    /* Go: the timer fires */
    CHECK_EQ(ev.event_type, ASYNC_EVENT_TIMER);
    async_runtime_deinit(rt);
}

/* Which host signals a thread blocks, and those it does not, stay so across
 * its calls into the library, the first one (which binds the thread to Go's
 * runtime) included: the fault signals, SIGCHLD, SIGPROF and SIGURG, which
 * Go's runtime wants let through on its threads, among them. */
static void *mask_keeper(void *arg)
{
    static const int sigs[] = {SIGCHLD, SIGURG, SIGPROF, SIGUSR1, SIGTRAP, SIGSEGV, SIGBUS, SIGFPE};
    sigset_t want;
    sigemptyset(&want);
    if (arg) /* else: nothing blocked */
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            sigaddset(&want, sigs[i]);
    CHECK_EQ(pthread_sigmask(SIG_SETMASK, &want, NULL), 0);
    uint64_t before = blocked_mask();
    CHECK_EQ(before != 0, arg != NULL);
    mask_keeper_timer();
    CHECK_EQ(blocked_mask(), before);
    mask_keeper_timer(); /* calls after the first */
    CHECK_EQ(blocked_mask(), before);
    return NULL;
}

CASE(calls_keep_thread_mask) // poll
{
    pthread_t th;
    start_thread(&th, mask_keeper, (void *)1);
    join_within(th, 30000, "blocking thread");
    start_thread(&th, mask_keeper, NULL);
    join_within(th, 30000, "unblocking thread");
}

static volatile sig_atomic_t usr1_count, usr1_altstack;

static void on_usr1(int sig, siginfo_t *si, void *uc)
{
    stack_t ss;
    (void)sig;
    (void)si;
    (void)uc;
    if (sigaltstack(NULL, &ss) == 0 && (ss.ss_flags & SS_ONSTACK))
        usr1_altstack++;
    usr1_count++;
}

/* EMBEDDING.md "Signals": a handler the host installs after load, with
 * SA_ONSTACK, runs on every thread of the process, the Go runtime's own
 * included (SIGUSR1 sent to each thread in turn while fibers, a worker and a
 * runtime are busy), and the library keeps working. Also: SIGPIPE set to
 * SIG_IGN by the host after load makes a host write to a closed pipe return
 * EPIPE. */
static volatile int busy_stop;
static void fiber_spin(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&busy_stop, __ATOMIC_SEQ_CST))
        async_fiber_yield();
}

CASE(host_handler_onstack) // poll notsan
{
    async_sched_config_t cfg = {2, 0, 0};
    struct sigaction sa;
    async_sched_t *s;
    DIR *d;
    struct dirent *e;
    int tids[256], ntids = 0, i, p[2];
    pid_t me = getpid();
    if (emulated()) {
        /* qemu-user's own threads are in /proc/self/task too, and it handles
         * the signals sent to them itself. */
        printf("skipped under an emulator\n");
        return;
    }
    round_trip(); /* the Go runtime is up */
    s = async_sched_create(&cfg);
    CHECK(s != NULL);
    for (i = 0; i < 4; i++)
        CHECK(async_fiber_spawn(s, fiber_spin, NULL, 0) != NULL);
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_usr1;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(SIGUSR1, &sa, NULL), 0);

    d = opendir("/proc/self/task");
    CHECK(d != NULL);
    while ((e = readdir(d)) != NULL && ntids < 256)
        if (e->d_name[0] != '.')
            tids[ntids++] = atoi(e->d_name);
    closedir(d);
    CHECK(ntids >= 3);
    for (int round = 0; round < 20; round++) {
        for (i = 0; i < ntids; i++) {
            int before = usr1_count;
            double t0 = now_ms();
            if (syscall(SYS_tgkill, me, tids[i], SIGUSR1) != 0) {
                CHECK_EQ(errno, ESRCH); /* a thread that ended meanwhile */
                continue;
            }
            while (usr1_count == before) {
                CHECK(now_ms() - t0 < 10000);
                sched_yield();
            }
        }
        CHECK_EQ(kill(me, SIGUSR1), 0); /* any thread */
    }
    printf("SIGUSR1 handled %d times on %d threads, %d times on an alternate signal stack\n", (int)usr1_count, ntids,
           (int)usr1_altstack);
    CHECK(usr1_count >= 20 * ntids);
    __atomic_store_n(&busy_stop, 1, __ATOMIC_SEQ_CST);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    round_trip();
    use_workers_and_fibers();

    /* SIGPIPE ignored by the host after load: EPIPE, and the library works. */
    signal(SIGPIPE, SIG_IGN);
    CHECK_EQ(pipe(p), 0);
    close(p[0]);
    errno = 0;
    CHECK(write(p[1], "x", 1) == -1 && errno == EPIPE);
    close(p[1]);
    round_trip();
}

/* EMBEDDING.md "Signals": a NULL dereference in host C code on a host thread
 * ends the process with SIGSEGV (Go's handler passes a fault outside Go code
 * to the action before it: the default), not with a Go traceback. */
CHILD(child_segv)
{
    volatile int *volatile p = NULL;
    round_trip();
    fprintf(stderr, "about to fault\n");
    *p = 1;
    fprintf(stderr, "still alive\n");
}

CASE(segv_in_host_code) // notsan
{
    char out[8192];
    int st;
    if (!children_ready(emulated(), "under an emulator"))
        return;
    st = run_child("child_segv", 0, out, sizeof out);
    if (EMB_ASAN) { /* UBSan (null store) or ASan's handler, chained by Go, reports and exits */
        CHECK(strstr(out, "AddressSanitizer") != NULL || strstr(out, "runtime error") != NULL);
        CHECK(!WIFEXITED(st) || WEXITSTATUS(st) != 0);
        return;
    }
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGSEGV)
        show_status("child_segv", st, out);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
    CHECK(strstr(out, "about to fault") != NULL);
    CHECK(strstr(out, "goroutine") == NULL); /* no Go traceback */
}

/* EMBEDDING.md "Signals": with SIGPIPE at its default action, a host thread's
 * write to a pipe without reader kills the process with SIGPIPE, as it would
 * without the library (Go's handler forwards it). */
CHILD(child_sigpipe)
{
    int p[2];
    round_trip();
    CHECK_EQ(pipe(p), 0);
    close(p[0]);
    fprintf(stderr, "about to write\n");
    (void)!write(p[1], "x", 1);
    fprintf(stderr, "still alive, errno %d\n", errno);
}

CASE(sigpipe_host_thread) // notsan
{
    char out[8192];
    int st;
    if (!children_ready(emulated(), "under an emulator"))
        return;
    st = run_child("child_sigpipe", 0, out, sizeof out);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGPIPE)
        show_status("child_sigpipe", st, out);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGPIPE);
    CHECK(strstr(out, "still alive") == NULL);
}

/* ---- fork and exec -------------------------------------------------------- */

CHILD(child_use)
{
    CHECK_EQ(async_version(), ASYNC_VERSION_NUMBER);
    round_trip();
    use_workers_and_fibers();
    printf("child used libasync\n");
}

/* EMBEDDING.md "fork and exec": a host that forks while the library runs:
 * in the child every call fails with ASYNC_E_FORKED except the version,
 * error and current-thread calls; exec of a program that uses libasync then
 * works (this binary, case child_use). */
CASE(fork_exec) // poll
{
    async_runtime_t *rt;
    pid_t pid;
    find_self();
    rt = async_runtime_init();
    CHECK(rt != NULL);
    use_workers_and_fibers();
    pid = fork_flushed();
    if (pid == 0) {
        io_event_t ev;
        if (async_version() != ASYNC_VERSION_NUMBER || strcmp(async_version_string(), "") == 0)
            _exit(10);
        async_clear_error();
        if (async_runtime_init() != NULL || async_last_error() != ASYNC_E_FORKED)
            _exit(11);
        async_clear_error();
        if (async_runtime_wait(rt, &ev, 1, -1) != -1 || async_last_error() != ASYNC_E_FORKED)
            _exit(12);
        async_clear_error();
        if (async_worker_create(worker_ret, NULL, 0) != NULL || async_last_error() != ASYNC_E_FORKED)
            _exit(13);
        if (strcmp(async_strerror(ASYNC_E_FORKED), "unknown error") == 0)
            _exit(14);
        exec_self("child_use");
    }
    wait_child_ok(pid, 30000, "exit codes 10-14: a check before exec failed; 1: child_use failed");
    round_trip(); /* the parent carries on */
    async_runtime_deinit(rt);
}

/* ---- address space (ulimit -v) ------------------------------------------- */

CHILD(child_limited)
{
    (void)!write(2, "main\n", 5);
    round_trip();
    (void)!write(2, "called\n", 7);
    use_workers_and_fibers();
    printf("child worked\n");
}

/* Why the RLIMIT_AS cases do not run under ASan or an emulator. */
#define LIMITED_SKIP "ASan's shadow memory or the emulator needs more address space than the library"

/* EMBEDDING.md "Memory": a program using the runtime, a worker and a
 * 2-worker scheduler works with RLIMIT_AS (ulimit -v) at EMB_ULIMIT_V_WORKS
 * KiB (thread stacks at 8 MiB). */
CASE(ulimit_v_works) // notsan
{
    char out[16384];
    int st;
    if (!children_ready(EMB_ASAN || emulated(), LIMITED_SKIP))
        return;
    st = run_child("child_limited", EMB_ULIMIT_V_WORKS, out, sizeof out);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        show_status("child_limited", st, out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(out, "child worked") != NULL);
}

/* EMBEDDING.md "Memory": under ulimit -v EMB_ULIMIT_V_FAILS the Go runtime
 * cannot reserve its address space: the process exits with status 2 and
 * Go's "fatal error" before any libasync call that enters Go returns. */
CASE(ulimit_v_too_low) // notsan
{
    char out[16384];
    int st;
    if (!children_ready(EMB_ASAN || emulated(), LIMITED_SKIP))
        return;
    st = run_child("child_limited", EMB_ULIMIT_V_FAILS, out, sizeof out);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 2 || strstr(out, "called"))
        show_status("child_limited", st, out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    CHECK(strstr(out, "fatal error") != NULL);
    CHECK(strstr(out, "called") == NULL);
}

/* ---- version --------------------------------------------------------------- */

/* async_version() and the version macros agree with the string. */
CASE(version)
{
    char want[32];
    CHECK_EQ(ASYNC_VERSION_NUMBER, ASYNC_VERSION_MAJOR * 10000 + ASYNC_VERSION_MINOR * 100 + ASYNC_VERSION_PATCH);
    CHECK_EQ(async_version(), ASYNC_VERSION_NUMBER);
    snprintf(want, sizeof want, "%d.%d.%d", async_version() / 10000, async_version() / 100 % 100,
             async_version() % 100);
    CHECK(strcmp(async_version_string(), want) == 0);
    CHECK(ASYNC_VERSION_AT_LEAST(ASYNC_VERSION_MAJOR, ASYNC_VERSION_MINOR, ASYNC_VERSION_PATCH));
    CHECK(!ASYNC_VERSION_AT_LEAST(ASYNC_VERSION_MAJOR, ASYNC_VERSION_MINOR, ASYNC_VERSION_PATCH + 1));
    CHECK(!ASYNC_VERSION_AT_LEAST(ASYNC_VERSION_MAJOR, ASYNC_VERSION_MINOR + 1, 0));
    CHECK(!ASYNC_VERSION_AT_LEAST(ASYNC_VERSION_MAJOR + 1, 0, 0));
    CHECK(ASYNC_VERSION_AT_LEAST(0, 0, 0));
#if !ASYNC_VERSION_AT_LEAST(0, 1, 0)
#error ASYNC_VERSION_AT_LEAST must work in #if
#endif
}

TEST_MAIN()
