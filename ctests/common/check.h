/* check.h — tiny helpers shared by the libasync C tests.
 *
 * Every test executable holds many cases (CASE); argv[1] names the case to
 * run (see TEST_MAIN). A failed CHECK prints file:line and the failing expression
 * (plus libasync's last error) and ends the process with status 1, from any
 * thread.
 */
#ifndef CHECK_H
#define CHECK_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "async.h"

/* 1 in a ThreadSanitizer build (make test-tsan), else 0. */
#if defined(__SANITIZE_THREAD__)
#define ASYNC_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ASYNC_TEST_TSAN 1
#endif
#endif
#ifndef ASYNC_TEST_TSAN
#define ASYNC_TEST_TSAN 0
#endif

static inline void check_fail_(const char *file, int line, const char *expr, const char *extra)
{
    int e = async_last_error();
    fprintf(stderr, "%s:%d: CHECK failed: %s%s%s (async_last_error=%d \"%s\", errno=%d)\n", file, line, expr,
            extra ? " " : "", extra ? extra : "", e, async_strerror(e), errno);
    fflush(stderr);
    _exit(1);
}

#define CHECK(expr)                                                                                            \
    do {                                                                                                       \
        if (!(expr))                                                                                           \
            check_fail_(__FILE__, __LINE__, #expr, NULL);                                                      \
    } while (0)

/* Integer comparison that prints both values. */
#define CHECK_EQ(a, b)                                                                                         \
    do {                                                                                                       \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);                                        \
        if (check_a_ != check_b_) {                                                                            \
            char check_m_[96];                                                                                 \
            snprintf(check_m_, sizeof check_m_, "[%lld != %lld]", check_a_, check_b_);                        \
            check_fail_(__FILE__, __LINE__, #a " == " #b, check_m_);                                           \
        }                                                                                                      \
    } while (0)

/* The calling thread's last libasync error must be `code`. */
#define CHECK_ERR(code)                                                                                        \
    do {                                                                                                       \
        int check_e_ = async_last_error();                                                                     \
        if (check_e_ != (int)(code)) {                                                                         \
            char check_m_[160];                                                                                \
            snprintf(check_m_, sizeof check_m_, "[got %d \"%s\"]", check_e_, async_strerror(check_e_));       \
            check_fail_(__FILE__, __LINE__, "async_last_error() == " #code, check_m_);                         \
        }                                                                                                      \
    } while (0)

/* `expr` (a call that must fail) is true, and it set the last error to
 * `code` (the error is cleared first, so a stale value cannot pass). */
#define CHECK_FAIL(expr, code)                                                                                 \
    do {                                                                                                       \
        async_clear_error();                                                                                   \
        CHECK(expr);                                                                                           \
        CHECK_ERR(code);                                                                                       \
    } while (0)

/* Monotonic milliseconds (fractional). */
static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline void sleep_ms(int ms)
{
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Waits until *v >= target; fails (naming what) after bound_ms instead of
 * hanging. Polls every 0.2 ms. */
static inline void wait_count_within(atomic_int *v, int target, int bound_ms, const char *what)
{
    double t0 = now_ms();
    while (atomic_load(v) < target) {
        if (now_ms() - t0 > bound_ms) {
            fprintf(stderr, "%s: %d of %d after %d ms\n", what, atomic_load(v), target, bound_ms);
            CHECK(atomic_load(v) >= target);
        }
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
}

typedef struct {
    const char *name;
    void (*fn)(void);
} test_case_t;

#ifdef ASYNC_VERSION_MAJOR /* the modern header (not the classic API tests) */
/* A fiber scheduler with `workers` workers and defaults otherwise. */
static inline async_sched_t *sched_new(int workers)
{
    async_sched_config_t cfg = {workers, 0, 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s != NULL);
    return s;
}

/* A runtime with the default backend (ASYNC_BACKEND picks another). */
static inline async_runtime_t *mkrt(void)
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    return rt;
}

/* Polls the stats of s until exactly n fibers are parked, sleeping 1 ms
 * between looks unless spin; fails after 60 s instead of hanging. */
static inline void sched_poll_parked_(async_sched_t *s, size_t n, int spin)
{
    async_sched_stats_t st;
    double t0 = now_ms();
    for (;;) {
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        if (st.fibers_parked == n)
            return;
        if (now_ms() - t0 > 60000) {
            fprintf(stderr, "%zu fibers parked after 60 s, expected %zu\n", st.fibers_parked, n);
            CHECK(st.fibers_parked == n);
        }
        if (!spin)
            sleep_ms(1);
    }
}

/* Waits until exactly n fibers of s are parked. */
static inline void sched_wait_parked(async_sched_t *s, size_t n)
{
    sched_poll_parked_(s, n, 0);
}

/* The same without sleeping: returns the moment the count shows n (the
 * window between a park beginning and its switch away is short). */
static inline void sched_spin_parked(async_sched_t *s, size_t n)
{
    sched_poll_parked_(s, n, 1);
}

/* Starts fn(arg) on s (not joinable) and waits until n fibers of s are
 * parked: the new one and the n - 1 parked before it. */
static inline void spawn_until_parked(async_sched_t *s, void (*fn)(void *), void *arg, size_t n)
{
    CHECK(async_fiber_spawn(s, fn, arg, 0) != NULL);
    sched_wait_parked(s, n);
}

/* Checks every count of the queue stats st: capacity, max_msg_size,
 * current_size, enqueue_count, dequeue_count, dropped_count. */
#define CHECK_QUEUE_STATS(st, cap, max_msg, size, enq, deq, dropped)                                          \
    do {                                                                                                       \
        CHECK_EQ((st).capacity, cap);                                                                          \
        CHECK_EQ((st).max_msg_size, max_msg);                                                                  \
        CHECK_EQ((st).current_size, size);                                                                     \
        CHECK_EQ((st).enqueue_count, enq);                                                                     \
        CHECK_EQ((st).dequeue_count, deq);                                                                     \
        CHECK_EQ((st).dropped_count, dropped);                                                                 \
    } while (0)

/* Shuts s down (its fibers must all end within ms) and destroys it. */
static inline void sched_finish(async_sched_t *s, int ms)
{
    CHECK_EQ(async_sched_shutdown(s, ms), 0);
    async_sched_destroy(s);
}
#endif

/* The cases of this executable, registered before main by CASE and CHILD. */
#define TEST_MAX_CASES 256
static test_case_t test_cases_[TEST_MAX_CASES] __attribute__((unused));
static size_t test_ncases_ __attribute__((unused));

static inline void test_register_(const char *name, void (*fn)(void))
{
    if (test_ncases_ == TEST_MAX_CASES) {
        fprintf(stderr, "more than %d cases in one test file\n", TEST_MAX_CASES);
        abort();
    }
    test_cases_[test_ncases_].name = name;
    test_cases_[test_ncases_].fn = fn;
    test_ncases_++;
}

/* CASE(name) { ... } defines a test case, run as `<exe> name`. CMake reads
 * the `CASE(name)` lines (at the start of a line) to register one ctest test
 * per case, `<folder>.<name>`; a `//` comment at the end of that line adds
 * words (poll, uring, timeout=N, linux, env=NAME=VALUE, labels: see
 * ctests/CMakeLists.txt). */
#define CASE(name)                                                                                             \
    static void t_##name(void);                                                                                \
    __attribute__((constructor)) static void test_register_##name(void) { test_register_(#name, t_##name); }   \
    static void t_##name(void)

/* CHILD(name) { ... }: like CASE, runnable by name (run_self_case starts it
 * in a child process), but no ctest test of its own. */
#define CHILD(name) CASE(name)

static inline int test_main_(const test_case_t *cases, size_t n, int argc, char **argv)
{
    size_t i;
    if (argc != 2) {
        fprintf(stderr, "usage: %s CASE\ncases:", argv[0]);
        for (i = 0; i < n; i++)
            fprintf(stderr, " %s", cases[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    for (i = 0; i < n; i++) {
        if (strcmp(cases[i].name, argv[1]) == 0) {
            cases[i].fn();
            printf("ok %s\n", argv[1]);
            fflush(stdout);
            return 0;
        }
    }
    fprintf(stderr, "unknown case %s\n", argv[1]);
    return 2;
}

#define TEST_MAIN()                                                                                            \
    int main(int argc, char **argv) { return test_main_(test_cases_, test_ncases_, argc, argv); }

/* Closes both ends of a pipe or socket pair (close(2), results ignored). */
static inline void close_pair(const int p[2])
{
    close(p[0]);
    close(p[1]);
}

#if !defined(_WIN32)
/* Blocks sig on the calling thread (the process's other threads take it). */
static inline void block_signal(int sig)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    CHECK_EQ(pthread_sigmask(SIG_BLOCK, &set, NULL), 0);
}
#endif

/* Threads for the stress and fault cases. */
static inline void start_thread(pthread_t *t, void *(*fn)(void *), void *arg)
{
    CHECK(pthread_create(t, NULL, fn, arg) == 0);
}

/* Joins t, failing the test if it has not ended within ms (a hang). */
static inline void join_within(pthread_t t, int ms, const char *what)
{
#ifdef _WIN32
    /* winpthreads has no pthread_timedjoin_np; the wine runner's timeout
     * catches a hang there. */
    (void)ms;
    (void)what;
    CHECK_EQ(pthread_join(t, NULL), 0);
#else
    struct timespec ts;
    int rc;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    rc = pthread_timedjoin_np(t, NULL, &ts);
    if (rc != 0)
        fprintf(stderr, "%s did not finish within %d ms\n", what, ms);
    CHECK_EQ(rc, 0);
#endif
}

#if !defined(_WIN32)
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <sys/resource.h>

/* Raises RLIMIT_NOFILE's soft limit to want (the hard one too, as root);
 * returns the limit now in force, which is below want only where the hard
 * limit could not be raised. */
static inline int raise_nofile(int want)
{
    struct rlimit rl;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur >= (rlim_t)want)
        return want;
    rl.rlim_cur = (rlim_t)want;
    if (rl.rlim_max < (rlim_t)want)
        rl.rlim_max = (rlim_t)want;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
        return (int)rl.rlim_cur;
    }
    return want;
}

/* CPU time (user + system) of the whole process so far, in ms: a spin on
 * any thread counts. */
static inline double cpu_ms(void)
{
    struct rusage ru;
    CHECK_EQ(getrusage(RUSAGE_SELF, &ru), 0);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

/* A TCP socket listening on 127.0.0.1 on a port the kernel picks
 * (close-on-exec, blocking); *addr gets its address, for connect. */
static inline int loopback_listener(int backlog, struct sockaddr_in *addr)
{
    socklen_t len = sizeof *addr;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(l >= 0);
    memset(addr, 0, sizeof *addr);
    addr->sin_family = AF_INET;
    addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(l, (struct sockaddr *)addr, sizeof *addr), 0);
    CHECK_EQ(listen(l, backlog), 0);
    CHECK_EQ(getsockname(l, (struct sockaddr *)addr, &len), 0);
    return l;
}

/* fork(2) after flushing stdio (so that the child cannot write the parent's
 * buffered output again); fails the test if fork fails. */
static inline pid_t fork_flushed(void)
{
    pid_t pid;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    CHECK(pid >= 0);
    return pid;
}

/* Makes the pipe p, then fork_flushed(). */
static inline pid_t fork_piped(int p[2])
{
    CHECK_EQ(pipe(p), 0);
    return fork_flushed();
}

/* Runs this test binary's case child_case in a child process (through
 * ASYNC_TEST_EMULATOR under qemu-user), with env ("NAME=value", or NULL)
 * added; returns its wait status and says on stderr how a failing child
 * ended. */
static inline int run_self_case(const char *child_case, const char *env)
{
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    pid_t pid;
    int st = 0;
    CHECK(len > 0);
    self[len] = 0;
    pid = fork_flushed();
    if (pid == 0) {
        char *argv[] = {self, (char *)child_case, NULL};
        char *emu = getenv("ASYNC_TEST_EMULATOR");
        if (env)
            putenv((char *)env);
        if (emu && *emu) {
            char *eargv[] = {emu, self, (char *)child_case, NULL};
            execvp(emu, eargv);
        }
        execv(self, argv);
        _exit(99);
    }
    CHECK(waitpid(pid, &st, 0) == pid);
    if (WIFSIGNALED(st))
        fprintf(stderr, "child %s died of signal %d\n", child_case, WTERMSIG(st));
    else if (WEXITSTATUS(st) != 0)
        fprintf(stderr, "child %s exited with %d\n", child_case, WEXITSTATUS(st));
    return st;
}

/* Like run_self_case, with the child's stderr captured into out (cap bytes,
 * NUL-terminated); prints the child's status and stderr on stdout. */
static inline int run_self_case_out(const char *child_case, const char *env, char *out, size_t cap)
{
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    int p[2];
    pid_t pid;
    size_t have = 0;
    ssize_t r;
    int status;
    CHECK(len > 0);
    self[len] = 0;
    pid = fork_piped(p);
    if (pid == 0) {
        const char *emu;
        dup2(p[1], 2);
        close(p[0]);
        if (env)
            putenv((char *)env);
        emu = getenv("ASYNC_TEST_EMULATOR");
        if (emu && *emu)
            execlp(emu, emu, self, child_case, (char *)NULL);
        else
            execl(self, self, child_case, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    while ((r = read(p[0], out + have, cap - 1 - have)) > 0)
        have += (size_t)r;
    out[have] = 0;
    close(p[0]);
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    printf("%s%s%s: status %#x, stderr:\n%s\n", child_case, env ? " " : "", env ? env : "", status, out);
    fflush(stdout);
    return status;
}
#endif

#endif /* CHECK_H */
