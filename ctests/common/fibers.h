/* fibers.h — helpers shared by the fiber tests (ctests/fiber_sched,
 * fiber_sync, fiber_stack, fiber_io/basic_io.c), on top of check.h. Every
 * wait here is bounded, so that a lost wake-up fails a case instead of
 * hanging it. */
#ifndef FIBERS_H
#define FIBERS_H

#include "check.h"

#if !defined(_WIN32) && !defined(MSG_NOSIGNAL)
#define MSG_NOSIGNAL 0 /* darwin: the peers stay open while the writers run */
#endif

/* The bound on every wait of the cases that must not hang on a lost
 * wake-up. */
#define BOUND_MS 20000

/* Waits (at most BOUND_MS) until *v >= target; fails naming what. */
static inline void wait_count(atomic_int *v, int target, const char *what)
{
    wait_count_within(v, target, BOUND_MS, what);
}

/* Busy-waits us microseconds (a sleep would last far longer than asked on
 * a loaded machine). */
static inline void spin_us(double us)
{
    double t0 = now_ms();
    while ((now_ms() - t0) * 1e3 < us) {
    }
}

/* Defines name_fiber (a fiber entry) and name_thread (a pthread entry), each
 * of which runs body(): the same work on a fiber and on a plain thread. */
#define FIBER_AND_THREAD(name, body)                                                                           \
    static void name##_fiber(void *arg)                                                                        \
    {                                                                                                          \
        (void)arg;                                                                                             \
        body();                                                                                                \
    }                                                                                                          \
    static void *name##_thread(void *arg)                                                                      \
    {                                                                                                          \
        (void)arg;                                                                                             \
        body();                                                                                                \
        return NULL;                                                                                           \
    }

/* A fiber that returns at once. */
static inline void nop_fiber(void *arg)
{
    (void)arg;
}

/* A stream of longs 0, 1, ... n-1 over a channel; bad counts the values
 * received out of order. */
typedef struct {
    async_chan_t *c;
    long n;
    long bad;
} int_stream_t;

/* Receives until the channel is closed: n values, in order. */
static inline void int_consumer(void *arg)
{
    int_stream_t *p = (int_stream_t *)arg;
    long v, expect = 0;
    while (async_chan_recv(p->c, &v, -1) == 0) {
        if (v != expect)
            p->bad++;
        expect++;
    }
    CHECK_ERR(ASYNC_E_CLOSED);
    CHECK_EQ(expect, p->n);
}

/* A fiber that yields 1000 times, counting each yield. */
static atomic_long yields_counted;
static atomic_int yielders_done;

static inline void yielder(void *arg)
{
    (void)arg;
    for (int i = 0; i < 1000; i++) {
        atomic_fetch_add(&yields_counted, 1);
        async_fiber_yield();
    }
    atomic_fetch_add(&yielders_done, 1);
}

/* The thread the caller runs on now, read in a function of its own:
 * pthread_self() is a "const" function, and the compiler may reuse its value
 * across a park, which is exactly what must not happen on a fiber (it may
 * resume on another thread). */
__attribute__((noinline, unused)) static pthread_t cur_thread(void)
{
    __asm__ volatile("" ::: "memory");
    return pthread_self();
}

/* Yields (sleeping now and then) until the calling fiber runs on a thread
 * other than `from`; 1 if it moved. */
static inline int move_off(pthread_t from)
{
    for (int i = 0; i < 20000; i++) {
        if (!pthread_equal(cur_thread(), from))
            return 1;
        if (i % 16 == 15)
            async_fiber_sleep(1);
        else
            async_fiber_yield();
    }
    return 0;
}

/* Locks m once *nwait (a count kept under m) has reached n: the waiters
 * counted it and then wait on a condition variable, which releases m only
 * inside the wait. Fails after 30 s. */
static inline void lock_when_waiting(async_mutex_t *m, const int *nwait, int n)
{
    double t0 = now_ms();
    for (;;) {
        CHECK_EQ(async_mutex_lock(m, BOUND_MS), 0);
        if (*nwait >= n)
            return;
        CHECK_EQ(async_mutex_unlock(m), 0);
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(1);
    }
}

/* Waits (up to 20 s) until the stats of s count `parked` fibers parked and
 * `running` running. */
static inline void wait_counts(async_sched_t *s, uint64_t parked, uint64_t running)
{
    async_sched_stats_t st;
    for (int i = 0; i < 20000; i++) {
        CHECK(async_sched_get_stats(s, &st, NULL, 0) >= 0);
        if (st.fibers_parked == parked && st.fibers_running == running)
            return;
        sleep_ms(1);
    }
    fprintf(stderr, "parked %llu running %llu\n", (unsigned long long)st.fibers_parked,
            (unsigned long long)st.fibers_running);
    CHECK(!"fibers did not reach the expected states");
}

/* Recurses in ~1 KiB frames until a frame lies below limit, yielding at the
 * bottom. */
__attribute__((noinline, unused)) static int recurse_to(char *limit, int depth)
{
    volatile char buf[1024];
    memset((char *)buf, depth, sizeof buf);
    if ((char *)buf > limit)
        return recurse_to(limit, depth + 1) + buf[depth % 1024];
    async_fiber_yield();
    return buf[0];
}

/* A fiber that overflows a 32 KiB stack: it recurses to about 1 KiB below
 * its bottom. */
static inline void overflow_32k(void *arg)
{
    char top;
    (void)arg;
    printf("%d\n", recurse_to((char *)((uintptr_t)&top - 33 * 1024), 0));
}

/* true (saying that `what` is skipped) under qemu-user, which accepts
 * MADV_GUARD_INSTALL but ignores it: a guard installed that way is never
 * hit there. */
static inline int madv_guard_ignored(const char *what)
{
    if (!getenv("ASYNC_TEST_EMULATOR"))
        return 0;
    printf("%s skipped: qemu-user accepts MADV_GUARD_INSTALL but ignores it\n", what);
    return 1;
}

#if !defined(_WIN32)
/* Runs child case `name` with env (run_self_case_out; its stderr into out,
 * cap bytes) and checks that it reported a fiber stack overflow and was
 * aborted (SIGABRT). */
static inline void check_overflow_child(const char *name, const char *env, char *out, size_t cap)
{
    int st = run_self_case_out(name, env, out, cap);
    CHECK(strstr(out, "libasync: fiber stack overflow") != NULL);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
}
#endif

#endif /* FIBERS_H */
