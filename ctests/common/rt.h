/* Runtime helpers for the C tests: waits that check their result, event
 * collection, signal handlers installed the way a cgo host must, the check
 * that an idle runtime sleeps, and the seeded random choices and bookkeeping
 * of the bounded-time stress cases. Includes check.h.
 *
 * A test of the classic API (include/async/) defines ASYNC_TEST_CLASSIC
 * before it includes this header: it then gets the classic headers, check.h's
 * helpers without check.h's include of async.h (the two cannot share a
 * translation unit), and the classic wait with a timeval (waittv). */
#ifndef RT_H
#define RT_H

#ifdef ASYNC_TEST_CLASSIC
#include "async/async_queue.h"
#include "async/async_runtime.h"
#include "async/async_worker.h"
#define ASYNC_H
#endif
#include "check.h"

#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/time.h>

/* Room for the events of one wait. */
#define MAXEV 64

#ifdef ASYNC_TEST_CLASSIC

static io_event_t ev[MAXEV];

/* A classic wait with a timeval of sec s + usec us, into ev. */
static inline int waittv(async_runtime_t *rt, long sec, long usec)
{
    struct timeval tv;
    tv.tv_sec = (time_t)sec;
    tv.tv_usec = (suseconds_t)usec;
    return async_runtime_wait(rt, ev, MAXEV, &tv);
}

#else /* the modern API (async.h) */

/* One async_runtime_wait; its result must be a count in [0, max]. */
static inline int wait_ok(async_runtime_t *rt, io_event_t *ev, int max, int timeout)
{
    int n = async_runtime_wait(rt, ev, max, timeout);
    CHECK(n >= 0);
    CHECK(n <= max);
    return n;
}

/* Waits until at least one event arrives (or `ms` pass); returns the count. */
static inline int wait_some(async_runtime_t *rt, io_event_t *ev, int max, int ms)
{
    double t0 = now_ms();
    for (;;) {
        int left = ms - (int)(now_ms() - t0), n;
        if (left <= 0)
            return 0;
        n = wait_ok(rt, ev, max, left);
        if (n > 0)
            return n;
    }
}

/* Collects events for up to ms (stops early once `until` events came). At
 * least one wait runs, however late this thread gets the CPU: what was ready
 * before the call is always collected. */
static inline int collect_events(async_runtime_t *rt, io_event_t *out, int max, int ms, int until)
{
    double t0 = now_ms();
    int got = 0;
    while (got < max && got < until) {
        int left = ms - (int)(now_ms() - t0), n;
        if (left < 0)
            left = 0;
        n = async_runtime_wait(rt, out + got, max - got, left);
        CHECK(n >= 0);
        got += n;
        if (left == 0)
            break;
    }
    return got;
}

static inline void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    CHECK(fl != -1);
    CHECK(fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0);
}

/* true when the runtimes of this process use the poll backend. */
static inline bool backend_is_poll(void)
{
    const char *b = getenv("ASYNC_BACKEND");
    return b != NULL && strcmp(b, "poll") == 0;
}

/* Installs `fn` for `sig` the way a cgo host must: SA_ONSTACK, plus flags
 * (without SA_RESTART interrupted system calls fail with EINTR). */
static inline void install_handler(int sig, void (*fn)(int), int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = SA_ONSTACK | flags;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(sig, &sa, NULL), 0);
}

/* CPU time of the calling thread so far, in ms (of the process on systems
 * without per-thread usage). */
static inline double thread_cpu_ms(void)
{
    struct rusage ru;
#if defined(RUSAGE_THREAD)
    CHECK_EQ(getrusage(RUSAGE_THREAD, &ru), 0);
#else
    CHECK_EQ(getrusage(RUSAGE_SELF, &ru), 0);
#endif
    return (double)ru.ru_utime.tv_sec * 1e3 + ru.ru_utime.tv_usec / 1e3 + (double)ru.ru_stime.tv_sec * 1e3 +
           ru.ru_stime.tv_usec / 1e3;
}

/* After the wakeups of a test are over: at most `slack` waits may still
 * return early (a wakeup consumed by an EINTR return, say), then waits of
 * 100 ms with nothing to do must each last at least 100 ms and sleep (CPU
 * time well below the wall time). */
static inline void check_quiet(async_runtime_t *rt, int slack)
{
    io_event_t ev[MAXEV];
    int early = 0;
    for (int round = 0; round < 3; round++) {
        double t0 = now_ms(), c0 = thread_cpu_ms();
        int n = async_runtime_wait(rt, ev, MAXEV, 100);
        double wall = now_ms() - t0, cpu = thread_cpu_ms() - c0;
        CHECK_EQ(n, 0);
        if (wall < 99.0) {
            early++;
            if (early > slack) {
                fprintf(stderr, "wait(100) returned after %.2f ms with nothing to do (%d early returns)\n", wall,
                        early);
                CHECK(early <= slack);
            }
            round--;
            continue;
        }
        if (cpu > wall / 2) {
            fprintf(stderr, "wait(100) burnt %.1f ms CPU in %.1f ms: it spins\n", cpu, wall);
            CHECK(cpu <= wall / 2);
        }
    }
}

/* A worker proc that runs until it is asked to stop; its result is ctx. */
static inline void *run_until_stopped(void *ctx)
{
    async_worker_t *self = async_worker_current();
    while (self && !async_worker_should_stop(self))
        sleep_ms(2);
    return ctx;
}

/* A wait of 1.5 s on another thread: its result and how long it took. */
typedef struct {
    async_runtime_t *rt;
    int n;
    double ms;
} waitres_t;

static inline void *timed_wait(void *arg)
{
    waitres_t *w = arg;
    io_event_t ev[MAXEV];
    double t0 = now_ms();
    w->n = async_runtime_wait(w->rt, ev, MAXEV, 1500);
    w->ms = now_ms() - t0;
    return NULL;
}

/* Starts timed_wait(w) on *th and gives it 50 ms to fall asleep. */
static inline void start_timed_wait(waitres_t *w, pthread_t *th)
{
    start_thread(th, timed_wait, w);
    sleep_ms(50);
}

#endif /* ASYNC_TEST_CLASSIC */

/* --- seeded random choices ---------------------------------------------- */

/* One sequence for the main thread (seed, rnd); threads keep their own state
 * (rnd_r). ASYNC_STRESS_SEED repeats a run's choices. */
static uint32_t rnd_state = 12345;

/* A number in [0, n) (single-threaded use only). */
static inline uint32_t rnd(uint32_t n)
{
    rnd_state = rnd_state * 1103515245u + 12345u;
    return (rnd_state >> 8) % n;
}

static inline uint32_t rnd_r(uint32_t *s, uint32_t n)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 8) % n;
}

/* Seeds rnd from ASYNC_STRESS_SEED or the clock and prints the seed. */
static inline void seed(const char *name)
{
    const char *s = getenv("ASYNC_STRESS_SEED");
    rnd_state = s && *s ? (uint32_t)strtoul(s, NULL, 0) : (uint32_t)time(NULL) ^ (uint32_t)getpid();
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("%s: ASYNC_STRESS_SEED=%u, backend %s\n", name, rnd_state,
           getenv("ASYNC_BACKEND") ? getenv("ASYNC_BACKEND") : "default");
}

/* --- bounded-time stress ------------------------------------------------- */

/* Each stress case runs for ASYNC_STRESS_SECONDS (default 3); its random
 * choices come from a seed printed at the start (ASYNC_STRESS_SEED repeats
 * them), one independent stream per thread (rng_init). */
static uint64_t g_seed;

/* Prints the seed and returns the case's deadline (now_ms() based). */
static inline double stress_begin(const char *name)
{
    const char *s = getenv("ASYNC_STRESS_SECONDS");
    const char *sd = getenv("ASYNC_STRESS_SEED");
    double sec = s && *s ? atof(s) : 3.0;
    setvbuf(stdout, NULL, _IOLBF, 0); /* a failed CHECK ends with _exit: keep what was printed */
    if (sec < 0.2)
        sec = 0.2;
    g_seed = sd && *sd ? strtoull(sd, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    printf("%s: %.1f s, ASYNC_STRESS_SEED=%llu, backend %s\n", name, sec, (unsigned long long)g_seed,
           getenv("ASYNC_BACKEND") ? getenv("ASYNC_BACKEND") : "default");
    fflush(stdout);
    return now_ms() + sec * 1000.0;
}

typedef struct {
    uint64_t s;
} rng_t;

static inline void rng_init(rng_t *r, uint64_t stream)
{
    r->s = g_seed ^ (stream * 0x9E3779B97F4A7C15ull) ^ 0xD1B54A32D192ED03ull;
    if (r->s == 0)
        r->s = 1;
}

/* stress_begin(name), and r seeded as the case's stream `stream`; returns
 * the deadline. */
static inline double stress_begin_rng(const char *name, rng_t *r, uint64_t stream)
{
    double deadline = stress_begin(name);
    rng_init(r, stream);
    return deadline;
}

/* A number in [0, n); n > 0. */
static inline uint32_t rng_below(rng_t *r, uint32_t n)
{
    uint64_t x = r->s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    r->s = x;
    return (uint32_t)((x >> 11) % n);
}

static inline void sleep_us(unsigned us)
{
    struct timespec ts;
    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (long)(us % 1000000) * 1000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A fixed-size bit set with atomic test-and-set. */
typedef struct {
    _Atomic uint64_t *w;
    size_t bits;
} bitmap_t;

static inline void bm_init(bitmap_t *b, size_t bits)
{
    b->bits = bits;
    b->w = calloc((bits + 63) / 64, sizeof(uint64_t));
    CHECK(b->w != NULL);
}

static inline void bm_clear(bitmap_t *b) { memset((void *)b->w, 0, (b->bits + 63) / 64 * sizeof(uint64_t)); }

/* Sets bit i; false if it was already set (a duplicate). */
static inline bool bm_set(bitmap_t *b, uint64_t i)
{
    uint64_t m = (uint64_t)1 << (i % 64);
    CHECK(i < b->bits);
    return (atomic_fetch_or(&b->w[i / 64], m) & m) == 0;
}

/* Number of set bits among the first n. */
static inline uint64_t bm_count(bitmap_t *b, uint64_t n)
{
    uint64_t c = 0, i;
    for (i = 0; i < n; i++)
        c += (atomic_load(&b->w[i / 64]) >> (i % 64)) & 1;
    return c;
}

static inline void bm_free(bitmap_t *b)
{
    free((void *)b->w);
    b->w = NULL;
}

#endif
