/* Adversarial pass 14: the fiber scheduler's idle and wake-up paths
 * (docs/FIBERS.md "Idle workers and hand-offs", docs/RELIABILITY.md
 * "Adversarial pass 14: scheduler idle and wake-up paths").
 *
 * What must hold, whatever the timing: every fiber readied (an fd event, a
 * timeout, a channel send from a fiber or a plain thread, join, mutex,
 * cancellation, shutdown) runs, with 1 to 4 workers, epoll or io_uring;
 * idle workers go back to sleep; destroy and shutdown while workers spin,
 * poll or sleep stay clean. Every wait is bounded: a lost wake-up fails the
 * case instead of hanging it.
 *
 * On Linux this program interposes epoll_wait() (libasync's scheduler calls
 * it through the PLT, as ctests/test_deadlines.c relies on). When `delays`
 * is on, a poll delays its system call: a worker preempted between its look
 * at the scheduler's state and the call, stretched to milliseconds so that
 * the other threads act inside the window in most rounds. Off, it only
 * forwards. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#if !defined(_WIN32)
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#endif

#include "check.h"

#if defined(__linux__)
#include <sys/epoll.h>
#include <sys/syscall.h>

/* The interleaving, when `staged` is on: a non-blocking poll (a worker that
 * saw no poller and was preempted before its system call) waits in here
 * until the test thread has readied a fiber (`sent`); a blocking poll (the
 * worker that became the poller, preempted before it blocks) waits until
 * such a non-blocking poll made its call. Each wait is bounded (10 ms): when
 * the scheduler is elsewhere the polls just run late. */
static _Atomic int staged;
static _Atomic int nb_in, b_in, sent, nb_after; /* stage flags */
static _Atomic long nb_bells;                   /* doorbell edges a non-blocking poll took */

static void pause_us(int us) {
    struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Waits up to ms for *flag to be set. */
static void stage_wait(_Atomic int *flag, int ms) {
    for (int i = 0; i < ms * 20 && !atomic_load(flag); i++) pause_us(50);
}

int epoll_wait(int ep, struct epoll_event *evs, int n, int timeout) {
    int st = atomic_load(&staged);
    int mine = 0; /* the one non-blocking poll held back */
    if (st && timeout == 0) {
        int z = 0;
        mine = atomic_compare_exchange_strong(&nb_in, &z, 1);
        if (mine) stage_wait(&sent, 10);
    } else if (st) {
        atomic_fetch_add(&b_in, 1);
        stage_wait(&nb_after, 10);
        atomic_fetch_sub(&b_in, 1);
    }
    int r = (int)syscall(SYS_epoll_pwait, ep, evs, n, timeout, NULL, 8);
    if (st && timeout == 0)
        for (int i = 0; i < r; i++)
            if (!evs[i].data.ptr) atomic_fetch_add(&nb_bells, 1);
    if (mine) {
        if (atomic_load(&sent)) atomic_store(&nb_after, 1);
        atomic_store(&nb_in, 0);
    }
    return r;
}
#define HAVE_DELAYS 1
#endif

static async_sched_t *mk(int workers) {
    async_sched_config_t cfg = {workers, 0, 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s != NULL);
    return s;
}

/* ---- a fiber parked on an fd that stays quiet -------------------------------- */

#if !defined(_WIN32)
typedef struct {
    int fd;
    atomic_int rc; /* 1 while it waits */
} quiet_t;

/* Waits (up to 60 s) for a byte that comes at the end: while it waits,
 * fibers wait on fds, so idle and busy workers poll the fds without
 * blocking. */
static void quiet_reader(void *arg) {
    quiet_t *q = arg;
    char c;
    atomic_store(&q->rc, 1);
    ssize_t r = async_fiber_read(q->fd, &c, 1, 60000);
    atomic_store(&q->rc, r == 1 ? 0 : 2);
}
#endif

/* ---- a plain thread hands work over while a worker polls without blocking ---- */

typedef struct {
    async_chan_t *in, *out;
    long rounds;
    atomic_long got;
} echo_t;

/* Receives a value, answers it; rounds times. */
static void echo_fiber(void *arg) {
    echo_t *e = arg;
    for (long i = 0; i < e->rounds; i++) {
        long v;
        if (async_chan_recv(e->in, &v, 30000) != 0) return;
        if (async_chan_send(e->out, &v, 30000) != 0) return;
        atomic_fetch_add(&e->got, 1);
    }
}

#if defined(HAVE_DELAYS)
/* Two workers, a fiber parked on a pipe nobody writes (so the workers poll
 * the fds without blocking when they run dry), and a plain thread that hands
 * a value to a fiber and waits for the answer, many times. The worker in the
 * poller is woken by the doorbell (wake_one kicks it when nobody spins); a
 * non-blocking poll by the other worker that had seen no poller before it
 * was preempted took that kick out of the shared epoll set: the poller slept
 * on (no timer, no fd event), still holding the spinning unit its waker had
 * given it, so no later ready woke anybody and the next hand-off to the
 * sleeping scheduler was lost. */
static void t_kick_stolen_inbox(void) {
    async_sched_t *s = mk(2);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    quiet_t q = {p[0], 0};
    CHECK(async_fiber_spawn(s, quiet_reader, &q, 0));
    while (atomic_load(&q.rc) != 1) sleep_ms(1);
    sched_wait_parked(s, 1);
    echo_t e = {async_chan_create(0, sizeof(long)), async_chan_create(0, sizeof(long)), 300, 0};
    CHECK(e.in && e.out);
    CHECK(async_fiber_spawn(s, echo_fiber, &e, 0));
    atomic_store(&staged, 1);
    long staged_rounds = 0;
    for (long i = 0; i < e.rounds; i++) {
        long v = i;
        /* a worker in a non-blocking poll, another entering the poller */
        double t0 = now_ms();
        while (!(atomic_load(&nb_in) && atomic_load(&b_in)) && now_ms() - t0 < 20) pause_us(20);
        staged_rounds += atomic_load(&nb_in) && atomic_load(&b_in);
        int rc = async_chan_send(e.in, &v, 10000);
        atomic_store(&sent, 1);
        if (rc == 0) rc = async_chan_recv(e.out, &v, 10000);
        if (rc != 0) {
            printf("round %ld: no answer\n", i);
            fflush(stdout);
            async_sched_dump(s, 1);
        }
        CHECK_EQ(rc, 0);
        CHECK_EQ(v, i);
        atomic_store(&sent, 0);
        atomic_store(&nb_after, 0);
    }
    atomic_store(&staged, 0);
    printf("rounds staged: %ld of %ld, doorbells taken by non-blocking polls: %ld\n", staged_rounds, e.rounds,
           atomic_load(&nb_bells));
    CHECK_EQ(write(p[1], "x", 1), 1);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&q.rc), 0);
    CHECK_EQ(atomic_load(&e.got), e.rounds);
    async_chan_destroy(e.in);
    async_chan_destroy(e.out);
    close(p[0]);
    close(p[1]);
    async_sched_destroy(s);
}
#else
static void t_kick_stolen_inbox(void) { printf("skipped: interposes epoll_wait (Linux)\n"); }
#endif

static const test_case_t cases[] = {
    T(kick_stolen_inbox),
};

TEST_MAIN(cases)
