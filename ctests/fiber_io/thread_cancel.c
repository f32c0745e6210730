/* pthread_cancel of plain threads inside async_fiber_read, write and
 * accept: only the I/O itself is a cancellation point (include/async.h); a
 * thread cancelled while it waits unwinds without having consumed anything.
 * Every wait is bounded. */
#include <netinet/in.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>

#include "check.h"
#include "net.h"

/* ---- pthread_cancel of plain threads inside async_fiber_read/write ---- */

/* ASan cannot unpoison the frames a cancel unwinds (forced unwinding skips
 * their epilogues), and its own thread-exit code then runs over that stale
 * poison near the top of the thread's stack (a false stack-buffer-underflow
 * in sigaltstack). The cancelled threads therefore start below an
 * uninstrumented pad, so that no instrumented frame sits where the exit code
 * runs; without ASan the pad changes nothing. */
#if defined(__has_attribute)
#if __has_attribute(no_sanitize_address)
#define NO_ASAN __attribute__((no_sanitize_address))
#endif
#endif

#ifndef NO_ASAN
#define NO_ASAN
#endif

typedef struct {
    void *(*fn)(void *);
} padded_t;

static NO_ASAN __attribute__((noinline)) void *padded_start(void *arg)
{
    volatile char pad[4096];
    pad[0] = 0;
    void *r = ((padded_t *)arg)->fn(NULL);
    pad[1] = pad[0];
    return r;
}

static padded_t pad_reader, pad_writer, pad_accept;

/* Starts pad's function on a new thread (padded_start), waits until it sets
 * *in (cleared first), sleeps pause_ms, cancels it; returns the thread for
 * the caller to join. */
static pthread_t start_and_cancel(padded_t *pad, atomic_int *in, int pause_ms, const char *what)
{
    pthread_t t;
    atomic_store(in, 0);
    start_thread(&t, padded_start, pad);
    wait_count(in, 1, what);
    if (pause_ms)
        sleep_ms(pause_ms);
    CHECK_EQ(pthread_cancel(t), 0);
    return t;
}

static int cx_fd[2];

static atomic_int cx_in;

static void *cx_reader(void *arg)
{
    char b;
    (void)arg;
    atomic_store(&cx_in, 1);
    async_fiber_read(cx_fd[1], &b, 1, -1);
    return NULL;
}

static void *cx_writer(void *arg)
{
    static char big[1 << 16];
    (void)arg;
    atomic_store(&cx_in, 1);
    for (;;)
        if (async_fiber_write(cx_fd[0], big, sizeof big, -1) < 0)
            return NULL;
}

static atomic_int cx_ok;

static void cx_fiber_read(void *arg)
{
    (void)arg;
    char b[4] = {0};
    ssize_t n = async_fiber_read(cx_fd[1], b, 1, BOUND_MS);
    CHECK_EQ(n, 1);
    CHECK_EQ(b[0], 'z');
    atomic_fetch_add(&cx_ok, 1);
}

/* Only the I/O itself is a cancellation point (include/async.h): a plain
 * thread cancelled while it waits in async_fiber_read/write unwinds at the
 * recv/send that follows the readiness, before it consumed anything; then
 * the fd works for the next thread and for a fiber, and the scheduler goes. */
static void cancel_case(int owned)
{
    async_sched_t *s = sched_new(2);
    char sink[1 << 16];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, cx_fd), 0);
    own_if(s, cx_fd[1], owned);
    for (int round = 0; round < 12; round++) {
        pthread_t t = start_and_cancel(&pad_reader, &cx_in, round % 2, "reader thread");
        CHECK_EQ(write(cx_fd[0], "z", 1), 1); /* readiness: the recv acts on the cancel */
        join_within(t, BOUND_MS, "cancelled reader");
        /* the byte was not taken by the cancelled thread: a fiber reads it */
        atomic_store(&cx_ok, 0);
        CHECK(async_fiber_spawn(s, cx_fiber_read, NULL, 0) != NULL);
        wait_count(&cx_ok, 1, "fiber read after a cancel");
    }
    /* writers cancelled while they wait for room (cx_fd[0] is plain) */
    for (int round = 0; round < 6; round++) {
        /* 2 ms is not a verdict: the cancel acts wherever the writer is */
        pthread_t t = start_and_cancel(&pad_writer, &cx_in, 2, "writer thread");
        /* make room until the writer is gone (bounded by join_within's loop) */
        double t0 = now_ms();
        for (;;) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 20000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            while (recv(cx_fd[1], sink, sizeof sink, MSG_DONTWAIT) > 0) {
            }
            if (pthread_timedjoin_np(t, NULL, &ts) == 0)
                break;
            CHECK(now_ms() - t0 < BOUND_MS);
        }
    }
    while (recv(cx_fd[1], sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
    CHECK_EQ(write(cx_fd[0], "z", 1), 1);
    atomic_store(&cx_ok, 0);
    CHECK(async_fiber_spawn(s, cx_fiber_read, NULL, 0) != NULL);
    wait_count(&cx_ok, 1, "fiber read after the cancelled writers");
    sched_finish(s, BOUND_MS);
    close_pair(cx_fd);
}

CASE(pthread_cancel_plain) // adversarial
{
    pad_reader.fn = cx_reader;
    pad_writer.fn = cx_writer;
    cancel_case(0);
}

CASE(pthread_cancel_owned) // adversarial
{
    pad_reader.fn = cx_reader;
    pad_writer.fn = cx_writer;
    cancel_case(1);
}

/* ---- pthread_cancel of a plain thread waiting in async_fiber_accept ---- */

static int ac_l;

static atomic_int ac_in, ac_ok;

static void *ac_thread(void *arg)
{
    (void)arg;
    atomic_store(&ac_in, 1);
    async_fiber_accept(ac_l, NULL, NULL, -1);
    atomic_store(&ac_in, 2); /* not reached: the accept4 after the wait acts on the cancel */
    return NULL;
}

static void ac_fiber(void *arg)
{
    (void)arg;
    int c = async_fiber_accept(ac_l, NULL, NULL, BOUND_MS);
    CHECK(c >= 0);
    CHECK_EQ(async_fiber_close(c), 0);
    atomic_fetch_add(&ac_ok, 1);
}

CASE(pthread_cancel_accept) // adversarial
{
    async_sched_t *s = sched_new(2);
    struct sockaddr_in a;
    ac_l = loopback_listener(16, &a);
    pad_accept.fn = ac_thread;
    for (int round = 0; round < 6; round++) {
        pthread_t t = start_and_cancel(&pad_accept, &ac_in, round % 2, "accepting thread");
        int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(c >= 0);
        CHECK_EQ(connect(c, (struct sockaddr *)&a, sizeof a), 0);
        join_within(t, BOUND_MS, "cancelled accept");
        CHECK_EQ(atomic_load(&ac_in), 1);
        /* the connection is still there for a fiber */
        atomic_store(&ac_ok, 0);
        CHECK(async_fiber_spawn(s, ac_fiber, NULL, 0) != NULL);
        wait_count(&ac_ok, 1, "fiber accept after a cancel");
        close(c);
    }
    sched_finish(s, BOUND_MS);
    close(ac_l);
}

TEST_MAIN()
