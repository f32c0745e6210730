/* The scheduler's idle and wake-up paths (docs/FIBERS.md "Idle workers and
 * hand-offs"): every fiber readied (an fd event, a timeout, a channel send
 * from a fiber or a plain thread, join, mutex, cancellation, shutdown) runs,
 * with 1 to 4 workers, epoll or io_uring, including work handed to a worker
 * that is between its look at the scheduler's state and its poll; idle
 * workers go back to sleep (little CPU with a fiber waiting on a quiet fd);
 * close, destroy and shutdown while workers spin, poll or sleep stay clean.
 * Every wait is bounded: a lost wake-up fails the case instead of hanging it.
 *
 * On Linux this program interposes epoll_wait() (libasync's scheduler calls
 * it through the PLT). When `staged` is on, a poll delays its system call,
 * standing for a worker preempted between its look at the scheduler's state
 * and the call, stretched to milliseconds so that the other threads act
 * inside the window in most rounds. Off, it only forwards. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#if !defined(_WIN32)
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#endif

#include "fibers.h"

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

/* ---- a fiber parked on an fd that stays quiet -------------------------------- */

#if !defined(_WIN32)
typedef struct {
    int p[2]; /* a pipe: the reader waits on p[0] */
    atomic_int rc; /* 1 while it waits */
} quiet_t;

/* Waits (up to 60 s) for a byte that comes at the end: while it waits,
 * fibers wait on fds, so idle and busy workers poll the fds without
 * blocking. */
static void quiet_reader(void *arg) {
    quiet_t *q = arg;
    char c;
    atomic_store(&q->rc, 1);
    ssize_t r = async_fiber_read(q->p[0], &c, 1, 60000);
    atomic_store(&q->rc, r == 1 ? 0 : 2);
}

/* Makes the pipe q->p and starts quiet_reader (q) on its read end; returns
 * once that reader is parked (the only parked fiber of s). */
static void quiet_start(async_sched_t *s, quiet_t *q) {
    CHECK_EQ(pipe(q->p), 0);
    atomic_store(&q->rc, 0);
    spawn_until_parked(s, quiet_reader, q, 1);
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

/* Starts echo_fiber on s for `rounds` rounds, over two new unbuffered
 * channels of longs. */
static void echo_start(async_sched_t *s, echo_t *e, long rounds) {
    e->in = async_chan_create(0, sizeof(long));
    e->out = async_chan_create(0, sizeof(long));
    e->rounds = rounds;
    atomic_store(&e->got, 0);
    CHECK(e->in && e->out);
    CHECK(async_fiber_spawn(s, echo_fiber, e, 0));
}

/* Destroys the channels of an echo fiber that has ended. */
static void echo_free(echo_t *e) {
    async_chan_destroy(e->in);
    async_chan_destroy(e->out);
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
CASE(kick_stolen_inbox) { // uring adversarial
    async_sched_t *s = sched_new(2);
    quiet_t q;
    quiet_start(s, &q);
    echo_t e;
    echo_start(s, &e, 300);
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
    CHECK_EQ(write(q.p[1], "x", 1), 1);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&q.rc), 0);
    CHECK_EQ(atomic_load(&e.got), e.rounds);
    echo_free(&e);
    close_pair(q.p);
    async_sched_destroy(s);
}

typedef struct {
    atomic_long go, done;
    atomic_int bad;
} tk_t;

/* Keeps its worker busy (waits for `go` without parking), then sleeps 1 ms:
 * the timer is the earliest, so adding it kicks the worker in the poller. */
static void timer_kicker(void *arg) {
    tk_t *t = arg;
    for (long i = 1;; i++) {
        double t0 = now_ms();
        while (atomic_load(&t->go) < i) {
            if (atomic_load(&t->go) < 0) return;
            if (now_ms() - t0 > 30000) {
                atomic_store(&t->bad, 1);
                return;
            }
        }
        if (async_fiber_sleep(1) != 0) {
            atomic_store(&t->bad, 2);
            return;
        }
        atomic_store(&t->done, i);
    }
}

/* The timer path of the same theft: three workers, one kept busy by a
 * fiber that then sleeps 1 ms, one in the poller (its timeout set before
 * that sleep began: the quiet reader's 60 s), one in a held non-blocking
 * poll that takes the kick the new earliest timer sent. The poller slept on
 * past the 1 ms, and the other workers, which had found no timer due, slept
 * on the condition variable: the sleeper woke after the quiet reader's
 * timeout, not after 1 ms. Plain-thread hand-offs to an echo fiber keep the
 * workers moving between rounds. */
CASE(kick_stolen_timer) { // uring adversarial
    async_sched_t *s = sched_new(3);
    quiet_t q;
    quiet_start(s, &q);
    echo_t e;
    tk_t t = {0, 0, 0};
    echo_start(s, &e, 1L << 40);
    CHECK(async_fiber_spawn(s, timer_kicker, &t, 0));
    long rounds = 200, staged_rounds = 0;
    atomic_store(&nb_bells, 0);
    atomic_store(&staged, 1);
    for (long i = 1; i <= rounds; i++) {
        long v = i;
        CHECK_EQ(async_chan_send(e.in, &v, 10000), 0);
        CHECK_EQ(async_chan_recv(e.out, &v, 10000), 0);
        atomic_store(&sent, 0);
        atomic_store(&nb_after, 0);
        double t0 = now_ms();
        while (!(atomic_load(&nb_in) && atomic_load(&b_in)) && now_ms() - t0 < 20) pause_us(20);
        staged_rounds += atomic_load(&nb_in) && atomic_load(&b_in);
        atomic_store(&t.go, i);
        pause_us(300); /* the sleep began: its timer is in, the poller kicked */
        atomic_store(&sent, 1);
        t0 = now_ms();
        while (atomic_load(&t.done) < i && !atomic_load(&t.bad) && now_ms() - t0 < 10000) pause_us(100);
        if (atomic_load(&t.done) < i) {
            printf("round %ld: the 1 ms sleep did not end within 10 s\n", i);
            fflush(stdout);
            async_sched_dump(s, 1);
        }
        CHECK_EQ(atomic_load(&t.bad), 0);
        CHECK_EQ(atomic_load(&t.done), i);
    }
    atomic_store(&staged, 0);
    atomic_store(&sent, 0);
    printf("rounds staged: %ld of %ld, doorbells taken by non-blocking polls: %ld\n", staged_rounds, rounds,
           atomic_load(&nb_bells));
    atomic_store(&t.go, -1);
    CHECK_EQ(write(q.p[1], "x", 1), 1);
    double t1 = now_ms();
    while (atomic_load(&q.rc) == 1 && now_ms() - t1 < 20000) sleep_ms(1);
    CHECK_EQ(async_sched_shutdown(s, 20000), 0); /* ends the echo fiber's wait */
    CHECK_EQ(atomic_load(&q.rc), 0);
    echo_free(&e);
    close_pair(q.p);
    async_sched_destroy(s);
}
#else
CASE(kick_stolen_inbox) { printf("skipped: interposes epoll_wait (Linux)\n"); } // uring adversarial
CASE(kick_stolen_timer) { printf("skipped: interposes epoll_wait (Linux)\n"); } // uring adversarial
#endif

/* ---- a storm of fd events from a plain thread ---------------------------------- */

#if !defined(_WIN32)
static uint32_t rng_next(uint32_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return *x;
}

enum { ST_PIPES = 24 };

typedef struct {
    int rd[ST_PIPES], wr[ST_PIPES];
    int owned;              /* the read ends are owned (async_fiber_fd_open) */
    long bytes;             /* the writer's total */
    atomic_long got;        /* bytes the readers took */
    atomic_int ended, bad;  /* readers that saw EOF; unexpected results */
    atomic_long timeouts;   /* short-timeout reads that timed out (retried) */
} storm_t;

typedef struct {
    storm_t *st;
    int k;
} storm_arg_t;

/* Reads its pipe until EOF: even k with a 30 s timeout (a lost fd wake-up
 * fails the case's bounded wait), odd k with 0 to 3 ms timeouts, retried (a
 * timeout racing the event must not lose the byte). */
static void storm_reader(void *arg) {
    storm_arg_t *a = arg;
    storm_t *st = a->st;
    uint32_t x = 0x9e3779b9u * (uint32_t)(a->k + 1);
    for (;;) {
        char buf[64];
        int to = (a->k & 1) ? (int)(rng_next(&x) % 4) : 30000;
        ssize_t r = async_fiber_read(st->rd[a->k], buf, sizeof buf, to);
        if (r > 0) {
            atomic_fetch_add(&st->got, r);
        } else if (r == 0) {
            atomic_fetch_add(&st->ended, 1);
            return;
        } else if (async_last_error() == ASYNC_E_TIMEDOUT && (a->k & 1)) {
            atomic_fetch_add(&st->timeouts, 1);
        } else {
            fprintf(stderr, "reader %d: %zd (%s)\n", a->k, r, async_strerror(async_last_error()));
            atomic_store(&st->bad, 1);
            return;
        }
    }
}

/* Writes bytes one at a time to random pipes with 0 to 200 us gaps (the
 * workers move between running, spinning, polling and sleeping all along),
 * then closes the write ends. */
static void *storm_writer(void *arg) {
    storm_t *st = arg;
    uint32_t x = 12345;
    for (long i = 0; i < st->bytes; i++) {
        int k = (int)(rng_next(&x) % ST_PIPES);
        CHECK_EQ(write(st->wr[k], "x", 1), 1);
        int gap = (int)(rng_next(&x) % 201);
        if (gap > 150) sleep_ms(0 + (gap > 195)); /* now and then a real sleep: the workers go idle */
        else spin_us(gap);
    }
    for (int k = 0; k < ST_PIPES; k++) close(st->wr[k]);
    return NULL;
}

static void storm_run(int workers, int owned) {
    async_sched_t *s = sched_new(workers);
    storm_t *st = calloc(1, sizeof *st);
    storm_arg_t args[ST_PIPES];
    CHECK(st);
    st->bytes = 3000;
    st->owned = owned;
    for (int k = 0; k < ST_PIPES; k++) {
        int p[2];
        CHECK_EQ(pipe(p), 0);
        st->rd[k] = p[0];
        st->wr[k] = p[1];
        if (owned) CHECK_EQ(async_fiber_fd_open(s, p[0]), 0);
        args[k] = (storm_arg_t){st, k};
        CHECK(async_fiber_spawn(s, storm_reader, &args[k], 0));
    }
    pthread_t th;
    start_thread(&th, storm_writer, st);
    join_within(th, 60000, "storm writer");
    /* every byte arrives and every reader sees EOF, within a bound */
    double t0 = now_ms();
    while ((atomic_load(&st->got) < st->bytes || atomic_load(&st->ended) < ST_PIPES) && now_ms() - t0 < 30000)
        sleep_ms(1);
    if (atomic_load(&st->got) < st->bytes || atomic_load(&st->ended) < ST_PIPES) {
        fprintf(stderr, "workers %d owned %d: %ld of %ld bytes, %d of %d readers ended\n", workers, owned,
                atomic_load(&st->got), st->bytes, atomic_load(&st->ended), ST_PIPES);
        async_sched_dump(s, 2);
    }
    CHECK_EQ(atomic_load(&st->got), st->bytes);
    CHECK_EQ(atomic_load(&st->ended), ST_PIPES);
    CHECK_EQ(atomic_load(&st->bad), 0);
    CHECK_EQ(async_sched_run(s), 0);
    printf("workers %d owned %d: %ld short timeouts\n", workers, owned, atomic_load(&st->timeouts));
    for (int k = 0; k < ST_PIPES; k++) {
        if (owned) CHECK_EQ(async_fiber_close(st->rd[k]), 0);
        else close(st->rd[k]);
    }
    free(st);
    async_sched_destroy(s);
}

/* 24 pipes written byte by byte from a plain thread at random small gaps
 * while fibers read them with and without timeouts, 1 to 4 workers, plain
 * and owned read ends: every byte is read, every reader sees EOF. */
CASE(fd_storm) { // uring adversarial
    for (int workers = 1; workers <= 4; workers++) {
        storm_run(workers, 0);
        storm_run(workers, 1);
    }
}
#else
CASE(fd_storm) { printf("skipped: pipes (not Windows)\n"); } // uring adversarial
#endif

/* ---- fd, channel and timer wakes mixed ------------------------------------------- */

#if !defined(_WIN32)
typedef struct {
    int rd, wr;               /* a socketpair: the fd fibers read rd */
    async_chan_t *c;          /* fed by a plain thread */
    async_mutex_t *mu;
    long rounds;
    atomic_long fd_got, ch_got, slept, locked;
    atomic_int bad;
    long shared;              /* under mu */
    async_sched_t *s;
} mixed_t;

static void mixed_fd(void *arg) {
    mixed_t *m = arg;
    for (long i = 0; i < m->rounds; i++) {
        char c;
        if (async_fiber_read(m->rd, &c, 1, 30000) != 1) {
            atomic_store(&m->bad, 1);
            return;
        }
        atomic_fetch_add(&m->fd_got, 1);
    }
}

static void mixed_chan(void *arg) {
    mixed_t *m = arg;
    for (long i = 0; i < m->rounds; i++) {
        long v;
        if (async_chan_recv(m->c, &v, 30000) != 0 || v != i) {
            atomic_store(&m->bad, 2);
            return;
        }
        atomic_fetch_add(&m->ch_got, 1);
    }
}

/* Sleeps of 0 to 2 ms: timers that come due while the other workers are
 * idle, in the poller or in a non-blocking poll. */
static void mixed_sleep(void *arg) {
    mixed_t *m = arg;
    uint32_t x = 777;
    for (long i = 0; i < m->rounds / 4; i++) {
        if (async_fiber_sleep(rng_next(&x) % 3) != 0) {
            atomic_store(&m->bad, 3);
            return;
        }
        atomic_fetch_add(&m->slept, 1);
    }
}

/* Contended mutex hand-offs between fibers (each unlock wakes the next
 * waiter) and a join of a child per round. */
static void mixed_child(void *arg) { (void)arg; }

static void mixed_lock(void *arg) {
    mixed_t *m = arg;
    for (long i = 0; i < m->rounds / 4; i++) {
        if (async_mutex_lock(m->mu, 30000) != 0) {
            atomic_store(&m->bad, 4);
            return;
        }
        m->shared++;
        if ((i & 7) == 0) async_fiber_yield();
        async_mutex_unlock(m->mu);
        async_fiber_t *ch = async_fiber_spawn(m->s, mixed_child, NULL, ASYNC_FIBER_JOINABLE);
        if (!ch || async_fiber_join(ch, 30000) != 0) {
            atomic_store(&m->bad, 5);
            return;
        }
        atomic_fetch_add(&m->locked, 1);
    }
}

static void *mixed_feeder(void *arg) {
    mixed_t *m = arg;
    uint32_t x = 4242;
    for (long i = 0; i < m->rounds; i++) {
        CHECK_EQ(write(m->wr, "y", 1), 1);
        CHECK_EQ(async_chan_send(m->c, &i, 30000), 0);
        int gap = (int)(rng_next(&x) % 201);
        if (gap > 190) sleep_ms(1);
        else spin_us(gap);
    }
    return NULL;
}

static void mixed_run(int workers) {
    async_sched_t *s = sched_new(workers);
    enum { LOCKERS = 4 };
    mixed_t m = {0};
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    m.rd = sv[0];
    m.wr = sv[1];
    m.c = async_chan_create(0, sizeof(long));
    m.mu = async_mutex_create();
    m.rounds = 2000;
    m.s = s;
    CHECK(m.c && m.mu);
    CHECK(async_fiber_spawn(s, mixed_fd, &m, 0));
    CHECK(async_fiber_spawn(s, mixed_chan, &m, 0));
    CHECK(async_fiber_spawn(s, mixed_sleep, &m, 0));
    for (int k = 0; k < LOCKERS; k++) CHECK(async_fiber_spawn(s, mixed_lock, &m, 0));
    pthread_t th;
    start_thread(&th, mixed_feeder, &m);
    join_within(th, 90000, "mixed feeder");
    double t0 = now_ms();
    while (now_ms() - t0 < 30000 &&
           (atomic_load(&m.fd_got) < m.rounds || atomic_load(&m.ch_got) < m.rounds ||
            atomic_load(&m.slept) < m.rounds / 4 || atomic_load(&m.locked) < LOCKERS * (m.rounds / 4)) &&
           !atomic_load(&m.bad))
        sleep_ms(1);
    printf("workers %d: fd %ld ch %ld slept %ld locked %ld\n", workers, atomic_load(&m.fd_got),
           atomic_load(&m.ch_got), atomic_load(&m.slept), atomic_load(&m.locked));
    CHECK_EQ(atomic_load(&m.bad), 0);
    CHECK_EQ(atomic_load(&m.fd_got), m.rounds);
    CHECK_EQ(atomic_load(&m.ch_got), m.rounds);
    CHECK_EQ(atomic_load(&m.slept), m.rounds / 4);
    CHECK_EQ(atomic_load(&m.locked), LOCKERS * (m.rounds / 4));
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(m.shared, LOCKERS * (m.rounds / 4));
    async_chan_destroy(m.c);
    async_mutex_destroy(m.mu);
    close_pair(sv);
    async_sched_destroy(s);
}

/* fd events, channel sends from a plain thread, short timers, mutex
 * hand-offs and joins at once, on 1 to 4 workers: every wake-up runs. */
CASE(mixed_wakes) { // uring adversarial
    for (int workers = 1; workers <= 4; workers++) mixed_run(workers);
}
#else
CASE(mixed_wakes) { printf("skipped: socketpair (not Windows)\n"); } // uring adversarial
#endif

/* ---- idle CPU with a fiber waiting on a quiet fd --------------------------------- */

#if !defined(_WIN32)

/* With fibers waiting on fds the idle workers may poll them while they
 * spin; once the work is done they must sleep all the same (one in the
 * poller): well under a core over a second (generous bound: 30%). */
CASE(idle_cpu_fd_waiter) { // adversarial
    for (int workers = 2; workers <= 4; workers += 2) {
        async_sched_t *s = sched_new(workers);
        quiet_t q;
        quiet_start(s, &q);
        echo_t e;
        echo_start(s, &e, 2000);
        for (long i = 0; i < e.rounds; i++) {
            long v = i;
            CHECK_EQ(async_chan_send(e.in, &v, 10000), 0);
            CHECK_EQ(async_chan_recv(e.out, &v, 10000), 0);
        }
        sleep_ms(50);
        double c0 = cpu_ms();
        sleep_ms(1000);
        double used = cpu_ms() - c0;
        printf("workers %d: idle cpu %.1f ms over 1 s\n", workers, used);
        CHECK(used < 300);
        CHECK_EQ(write(q.p[1], "x", 1), 1);
        CHECK_EQ(async_sched_run(s), 0);
        CHECK_EQ(atomic_load(&q.rc), 0);
        echo_free(&e);
        close_pair(q.p);
        async_sched_destroy(s);
    }
}
#else
CASE(idle_cpu_fd_waiter) { printf("skipped: pipes (not Windows)\n"); } // adversarial
#endif

/* ---- close and shutdown while workers spin, poll and sleep ------------------------ */

#if !defined(_WIN32)
enum { CL_FDS = 16 };

typedef struct {
    int fd;
    atomic_int rc; /* 0 running, else 1 + async_last_error() */
} closer_t;

static void closed_reader(void *arg) {
    closer_t *c = arg;
    char b;
    ssize_t r = async_fiber_read(c->fd, &b, 1, 30000);
    atomic_store(&c->rc, r < 0 ? 1 + async_last_error() : 1000);
}

/* Plain-thread hand-offs keep the workers moving between running, spinning
 * (with non-blocking polls: fibers wait on fds) and sleeping, while the
 * test thread closes owned fds that fibers are parked on, at random gaps:
 * each of those fibers wakes with ASYNC_E_CLOSED, whoever polls. */
CASE(close_while_polled) { // uring adversarial
    for (int workers = 2; workers <= 4; workers++) {
        async_sched_t *s = sched_new(workers);
        closer_t cl[CL_FDS];
        int peer[CL_FDS];
        for (int k = 0; k < CL_FDS; k++) {
            int sv[2];
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
            CHECK_EQ(async_fiber_fd_open(s, sv[0]), 0);
            cl[k].fd = sv[0];
            atomic_store(&cl[k].rc, 0);
            peer[k] = sv[1];
            CHECK(async_fiber_spawn(s, closed_reader, &cl[k], 0));
        }
        sched_wait_parked(s, CL_FDS);
        echo_t e;
        echo_start(s, &e, 1L << 40);
        uint32_t x = 99;
        for (int k = 0; k < CL_FDS; k++) {
            for (int j = 0; j < 20; j++) {
                long v = j;
                CHECK_EQ(async_chan_send(e.in, &v, 10000), 0);
                CHECK_EQ(async_chan_recv(e.out, &v, 10000), 0);
            }
            spin_us((int)(rng_next(&x) % 201));
            CHECK_EQ(async_fiber_close(cl[k].fd), 0);
        }
        for (int k = 0; k < CL_FDS; k++) {
            double t0 = now_ms();
            while (atomic_load(&cl[k].rc) == 0 && now_ms() - t0 < 20000) sleep_ms(1);
            CHECK_EQ(atomic_load(&cl[k].rc), 1 + ASYNC_E_CLOSED);
            close(peer[k]);
        }
        CHECK_EQ(async_sched_shutdown(s, 20000), 0); /* ends the echo fiber's wait */
        echo_free(&e);
        async_sched_destroy(s);
    }
}

/* The storm's readers, sleepers and channel receivers are parked or
 * running, a plain thread keeps writing and sending, and the scheduler is
 * shut down (then destroyed) in the middle: shutdown returns 0 within its
 * bound (every fiber ended), wherever the workers were. */
typedef struct {
    int wr[ST_PIPES];
    async_chan_t *c;
    atomic_int stop;
} sd_feed_t;

static void sd_sleeper(void *arg) {
    (void)arg;
    uint32_t x = 5;
    while (async_fiber_sleep(rng_next(&x) % 3) == 0) {
    }
}

static void sd_receiver(void *arg) {
    async_chan_t *c = arg;
    long v;
    while (async_chan_recv(c, &v, 30000) == 0) {
    }
}

static void *sd_feeder(void *arg) {
    sd_feed_t *f = arg;
    uint32_t x = 321;
    while (!atomic_load(&f->stop)) {
        int k = (int)(rng_next(&x) % ST_PIPES);
        if (write(f->wr[k], "z", 1) != 1) break;
        long v = 1;
        if (async_chan_send(f->c, &v, 20) != 0 && async_last_error() != ASYNC_E_TIMEDOUT) break;
        spin_us((int)(rng_next(&x) % 201));
    }
    return NULL;
}

static void sd_reader(void *arg) {
    storm_arg_t *a = arg;
    char buf[16];
    while (async_fiber_read(a->st->rd[a->k], buf, sizeof buf, 30000) > 0) {
    }
}

CASE(shutdown_storm) { // uring adversarial
    for (int round = 0; round < 8; round++) {
        int workers = 1 + round % 4;
        async_sched_t *s = sched_new(workers);
        storm_t *st = calloc(1, sizeof *st);
        sd_feed_t f = {{0}, async_chan_create(0, sizeof(long)), 0};
        storm_arg_t args[ST_PIPES];
        CHECK(st && f.c);
        for (int k = 0; k < ST_PIPES; k++) {
            int p[2];
            CHECK_EQ(pipe(p), 0);
            CHECK_EQ(fcntl(p[1], F_SETFL, O_NONBLOCK), 0);
            st->rd[k] = p[0];
            st->wr[k] = f.wr[k] = p[1];
            if (round & 4) CHECK_EQ(async_fiber_fd_open(s, p[0]), 0);
            args[k] = (storm_arg_t){st, k};
            CHECK(async_fiber_spawn(s, sd_reader, &args[k], 0));
        }
        for (int k = 0; k < 4; k++) {
            CHECK(async_fiber_spawn(s, sd_sleeper, NULL, 0));
            CHECK(async_fiber_spawn(s, sd_receiver, f.c, 0));
        }
        pthread_t th;
        start_thread(&th, sd_feeder, &f);
        sleep_ms(20 + 10 * round);
        CHECK_EQ(async_sched_shutdown(s, 20000), 0);
        atomic_store(&f.stop, 1);
        join_within(th, 20000, "shutdown feeder");
        async_sched_destroy(s);
        for (int k = 0; k < ST_PIPES; k++) {
            close(st->rd[k]);
            close(st->wr[k]);
        }
        async_chan_destroy(f.c);
        free(st);
    }
}
#else
CASE(close_while_polled) { printf("skipped: socketpair (not Windows)\n"); } // uring adversarial
CASE(shutdown_storm) { printf("skipped: pipes (not Windows)\n"); } // uring adversarial
#endif

TEST_MAIN()
