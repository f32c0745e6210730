/* Cross-worker hand-offs (docs/FIBERS.md "Idle workers and
 * hand-offs"): idle workers spin for a bounded time before they sleep, a
 * waker wakes a sleeper only when nobody spins (and hands the woken one its
 * spinning unit), fibers readied by threads outside the scheduler go through
 * a lock-free inbox, and a fiber in another worker's LIFO slot is stolen only
 * once it has waited there. What must hold whatever the timing:
 *   - no work: the workers sleep (CPU near zero once the spin bound passed);
 *   - no lost wake-up: work readied at any moment of a worker's
 *     spin -> sleep transition runs, from a worker, a plain thread or
 *     another scheduler's worker;
 *   - a fiber left in a busy worker's LIFO slot is run by another worker;
 *   - destroy and shutdown while workers spin.
 * Every wait is bounded; no case asserts a speed. */
#include <stdatomic.h>
#include <sys/resource.h>
#if !defined(_WIN32)
#include <sys/socket.h>
#include <unistd.h>
#endif

#include "fibers.h"



/* ---- ping-pong across workers ------------------------------------------------ */

typedef struct {
    async_chan_t *a, *b;
    long n;
    atomic_long done; /* round trips checked by ping */
    atomic_int bad;
} pp_t;

static void pp_ping(void *arg) {
    pp_t *p = arg;
    for (long i = 0; i < p->n; i++) {
        uint64_t x = (uint64_t)i;
        if (async_chan_send(p->a, &x, 30000) != 0 || async_chan_recv(p->b, &x, 30000) != 0 || x != (uint64_t)i + 1) {
            atomic_store(&p->bad, 1);
            return;
        }
        atomic_store(&p->done, i + 1);
    }
}

static void pp_pong(void *arg) {
    pp_t *p = arg;
    for (long i = 0; i < p->n; i++) {
        uint64_t x;
        if (async_chan_recv(p->a, &x, 30000) != 0) {
            atomic_store(&p->bad, 1);
            return;
        }
        x++;
        if (async_chan_send(p->b, &x, 30000) != 0) {
            atomic_store(&p->bad, 1);
            return;
        }
    }
}

static void run_pingpong(async_sched_t *s, long n) {
    pp_t p = {async_chan_create(0, sizeof(uint64_t)), async_chan_create(0, sizeof(uint64_t)), n, 0, 0};
    CHECK(p.a && p.b);
    CHECK(async_fiber_spawn(s, pp_pong, &p, 0));
    CHECK(async_fiber_spawn(s, pp_ping, &p, 0));
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&p.bad), 0);
    CHECK_EQ(atomic_load(&p.done), n);
    async_chan_destroy(p.a);
    async_chan_destroy(p.b);
}

/* Many rendezvous round trips between two fibers on 2 and 4 workers: every
 * value arrives (each park is woken, wherever the partner runs). */
CASE(pingpong) {
    for (int workers = 2; workers <= 4; workers += 2) {
        async_sched_t *s = sched_new(workers);
        run_pingpong(s, 200000);
        async_sched_destroy(s);
    }
}

/* ---- idle CPU ---------------------------------------------------------------- */

/* CPU the process uses over `ms` of wall time, in ms. */
static double cpu_over(int ms) {
    double c0 = cpu_ms();
    sleep_ms(ms);
    return cpu_ms() - c0;
}

/* Spinning is bounded: a scheduler without work (fresh, and just after a
 * burst of hand-offs left every worker spinning) uses well under a core.
 * Generous bound (30% of one core over 1 s): the spin lasts microseconds. */
CASE(idle_cpu) {
    for (int workers = 2; workers <= 4; workers += 2) {
        async_sched_t *s = sched_new(workers);
        sleep_ms(50);
        double fresh = cpu_over(1000);
        run_pingpong(s, 20000);
        double after = cpu_over(1000);
        printf("workers %d: idle cpu %.1f ms per s (fresh), %.1f ms per s (after work)\n", workers, fresh, after);
        CHECK(fresh < 300);
        CHECK(after < 300);
        async_sched_destroy(s);
    }
}

/* ---- wake-ups around the spin -> sleep transition --------------------------- */

typedef struct {
    async_chan_t *c;
    long rounds;
    atomic_long got;
} rx_t;

static void rx_fiber(void *arg) {
    rx_t *r = arg;
    for (long i = 0; i < r->rounds; i++) {
        long v;
        if (async_chan_recv(r->c, &v, 30000) != 0 || v != i) return;
        atomic_fetch_add(&r->got, 1);
    }
}

/* Starts rx_fiber(r) on s for `rounds` values over a new channel of
 * capacity cap (r->c); returns the channel. */
static async_chan_t *rx_start(async_sched_t *s, rx_t *r, size_t cap, long rounds) {
    *r = (rx_t){async_chan_create(cap, sizeof(long)), rounds, 0};
    CHECK(r->c);
    CHECK(async_fiber_spawn(s, rx_fiber, r, 0));
    return r->c;
}

/* Checks that each of the n rx fibers got all `rounds` values, then
 * destroys their channels. */
static void rx_check_free(rx_t *rx, int n, long rounds) {
    for (int k = 0; k < n; k++) {
        CHECK_EQ(atomic_load(&rx[k].got), rounds);
        async_chan_destroy(rx[k].c);
    }
}

/* A plain thread readies a parked fiber after delays spread over the
 * workers' spin window (0 to ~200 us, then a few ms: asleep): each send
 * (a hand-off to the fiber, through the inbox) must be taken, or the
 * bounded send fails. */
CASE(wake_after_spin) {
    async_sched_t *s = sched_new(2);
    rx_t r;
    rx_start(s, &r, 0, 400);
    for (long i = 0; i < r.rounds; i++) {
        if (i % 50 == 49)
            sleep_ms(3);
        else
            spin_us((double)(i % 50) * 4);
        CHECK_EQ(async_chan_send(r.c, &i, 30000), 0);
    }
    CHECK_EQ(async_sched_run(s), 0);
    rx_check_free(&r, 1, r.rounds);
    async_sched_destroy(s);
}

/* ---- readies from outside the scheduler -------------------------------------- */

enum { RT_THREADS = 4, RT_FIBERS = 16, RT_PER = 2000 };

typedef struct {
    async_chan_t *c[RT_FIBERS];
    rx_t rx[RT_FIBERS];
    atomic_int bad;
} remote_t;

typedef struct {
    remote_t *r;
    int first; /* the fibers t, t + RT_THREADS, ... get this thread's values */
} remote_arg_t;

static void *remote_sender(void *arg) {
    remote_arg_t *a = arg;
    for (long i = 0; i < RT_PER; i++)
        for (int k = a->first; k < RT_FIBERS; k += RT_THREADS)
            if (async_chan_send(a->r->c[k], &i, 30000) != 0) atomic_store(&a->r->bad, 1);
    return NULL;
}

/* Plain threads send to fibers parked on rendezvous channels: every wake-up
 * is a remote ready (the inbox, with its exchange-all consumers racing the
 * pushes); 4 threads x 16 fibers x 2000 values all arrive. */
CASE(remote_ready) {
    async_sched_t *s = sched_new(2);
    remote_t *r = calloc(1, sizeof *r);
    CHECK(r);
    for (int k = 0; k < RT_FIBERS; k++) r->c[k] = rx_start(s, &r->rx[k], 0, RT_PER);
    pthread_t th[RT_THREADS];
    remote_arg_t args[RT_THREADS];
    for (int t = 0; t < RT_THREADS; t++) {
        args[t] = (remote_arg_t){r, t};
        start_thread(&th[t], remote_sender, &args[t]);
    }
    for (int t = 0; t < RT_THREADS; t++) join_within(th[t], 120000, "remote sender");
    CHECK_EQ(atomic_load(&r->bad), 0);
    CHECK_EQ(async_sched_run(s), 0);
    rx_check_free(r->rx, RT_FIBERS, RT_PER);
    free(r);
    async_sched_destroy(s);
}

/* ---- another scheduler's worker readies ------------------------------------ */

static void xs_sender(void *arg) {
    rx_t *r = arg;
    for (long i = 0; i < r->rounds; i++)
        if (async_chan_send(r->c, &i, 30000) != 0) return;
}

/* Fibers of scheduler A wake fibers of scheduler B (and back, through the
 * rendezvous): readies from a foreign worker go through B's inbox. */
CASE(cross_sched) {
    async_sched_t *a = sched_new(2), *b = sched_new(2);
    enum { PAIRS = 8 };
    rx_t rx[PAIRS];
    for (int k = 0; k < PAIRS; k++) {
        rx_start(b, &rx[k], 0, 20000);
        CHECK(async_fiber_spawn(a, xs_sender, &rx[k], 0));
    }
    CHECK_EQ(async_sched_run(a), 0);
    CHECK_EQ(async_sched_run(b), 0);
    rx_check_free(rx, PAIRS, 20000);
    async_sched_destroy(a);
    async_sched_destroy(b);
}

/* ---- a fiber left in a busy worker's LIFO slot -------------------------------- */

typedef struct {
    async_chan_t *c;
    atomic_int arrived;
    atomic_int timed_out;
} meet_t;

/* After the hand-off both fibers wait for each other WITHOUT parking: the
 * one that goes on running keeps its worker busy, so the other (in that
 * worker's LIFO slot, or its queue) must be taken by the other worker. */
static void meet_wait(meet_t *m) {
    atomic_fetch_add(&m->arrived, 1);
    double t0 = now_ms();
    while (atomic_load(&m->arrived) < 2)
        if (now_ms() - t0 > 20000) {
            atomic_store(&m->timed_out, 1);
            return;
        }
}

static void meet_send(void *arg) {
    meet_t *m = arg;
    long v = 1;
    if (async_chan_send(m->c, &v, 30000) == 0) meet_wait(m);
}

static void meet_recv(void *arg) {
    meet_t *m = arg;
    long v;
    if (async_chan_recv(m->c, &v, 30000) == 0) meet_wait(m);
}

CASE(busy_lifo_slot) {
    async_sched_t *s = sched_new(2);
    for (int round = 0; round < 200; round++) {
        meet_t m = {async_chan_create(0, sizeof(long)), 0, 0};
        CHECK(m.c);
        CHECK(async_fiber_spawn(s, round & 1 ? meet_send : meet_recv, &m, 0));
        CHECK(async_fiber_spawn(s, round & 1 ? meet_recv : meet_send, &m, 0));
        CHECK_EQ(async_sched_run(s), 0);
        CHECK_EQ(atomic_load(&m.timed_out), 0);
        CHECK_EQ(atomic_load(&m.arrived), 2);
        async_chan_destroy(m.c);
    }
    async_sched_destroy(s);
}

/* ---- fan-out: one fiber wakes many --------------------------------------------- */

enum { FAN = 64, FAN_ROUNDS = 500 };

typedef struct {
    async_chan_t *c[FAN];
    rx_t rx[FAN];
} fan_t;

static void fan_producer(void *arg) {
    fan_t *f = arg;
    for (long i = 0; i < FAN_ROUNDS; i++)
        for (int k = 0; k < FAN; k++)
            if (async_chan_send(f->c[k], &i, 30000) != 0) return;
}

/* One fiber readies 64 others over and over (each wake lands on its worker,
 * the other workers spin and steal): every value arrives. */
CASE(fan_out) {
    async_sched_t *s = sched_new(4);
    fan_t *f = calloc(1, sizeof *f);
    CHECK(f);
    for (int k = 0; k < FAN; k++) f->c[k] = rx_start(s, &f->rx[k], 1, FAN_ROUNDS);
    CHECK(async_fiber_spawn(s, fan_producer, f, 0));
    CHECK_EQ(async_sched_run(s), 0);
    rx_check_free(f->rx, FAN, FAN_ROUNDS);
    free(f);
    async_sched_destroy(s);
}

/* ---- destroy and shutdown while workers spin ------------------------------------ */

static void short_fiber(void *arg) {
    atomic_long *n = arg;
    async_fiber_yield();
    atomic_fetch_add(n, 1);
}

/* Right after async_sched_run returns the workers are still spinning
 * (looking for work for up to the spin bound): destroy must stop them. */
CASE(destroy_spinning) {
    for (int round = 0; round < 200; round++) {
        async_sched_t *s = sched_new(round % 2 ? 2 : 4);
        atomic_long n = 0;
        for (int i = 0; i < 8; i++) CHECK(async_fiber_spawn(s, short_fiber, &n, 0));
        CHECK_EQ(async_sched_run(s), 0);
        CHECK_EQ(atomic_load(&n), 8);
        async_sched_destroy(s);
    }
}

static void sleep_fiber(void *arg) {
    atomic_long *n = arg;
    if (async_fiber_sleep(60000) == -1 && async_last_error() == ASYNC_E_CANCELLED) atomic_fetch_add(n, 1);
}

/* Shutdown while one fiber is parked and the other workers spin. */
CASE(shutdown_spinning) {
    for (int round = 0; round < 100; round++) {
        async_sched_t *s = sched_new(2);
        atomic_long n = 0, cancelled = 0;
        CHECK(async_fiber_spawn(s, sleep_fiber, &cancelled, 0));
        for (int i = 0; i < 4; i++) CHECK(async_fiber_spawn(s, short_fiber, &n, 0));
        CHECK_EQ(async_sched_shutdown(s, 30000), 0);
        CHECK_EQ(atomic_load(&cancelled), 1);
        CHECK_EQ(atomic_load(&n), 4);
        async_sched_destroy(s);
    }
}

#if !defined(_WIN32)
/* ---- fd waits while every worker stays busy ---------------------------------- */

/* Workers that never run out of fibers poll the fds every few dozen
 * dispatches, but only while some fiber waits for one: the count of fd
 * waiters is kept per worker (a park counts on the worker it began on, its
 * end on the worker it resumed on). Here two yielding fibers keep both
 * workers busy the whole time, so the reader's wake-ups can only come from
 * that busy poll: a count that read zero with the reader parked would leave
 * it parked until the yielders give up (20 s), and the case fails. */
typedef struct {
    int fd;
    long rounds_want;
    atomic_int stop, bad, gave_up;
    atomic_long rounds;
} fb_t;

static void fb_yielder(void *arg) {
    fb_t *b = arg;
    double t0 = now_ms();
    while (!atomic_load(&b->stop)) {
        if (now_ms() - t0 > 20000) {
            atomic_store(&b->gave_up, 1);
            return;
        }
        async_fiber_yield();
    }
}

static void fb_reader(void *arg) {
    fb_t *b = arg;
    for (long i = 0; i < b->rounds_want; i++) {
        char c;
        if (async_fiber_read(b->fd, &c, 1, 30000) != 1 || c != (char)i) {
            atomic_store(&b->bad, 1);
            break;
        }
        atomic_store(&b->rounds, i + 1);
    }
    atomic_store(&b->stop, 1);
}

/* `yielders` fibers that yield until the reader is done keep the workers
 * busy; the reader reads `rounds` bytes written one at a time by this
 * thread, on a plain and on an owned descriptor. */
static void fd_wake_run(int workers, int yielders, long rounds) {
    for (int owned = 0; owned < 2; owned++) {
        async_sched_t *s = sched_new(workers);
        int sv[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        fb_t b = {.fd = sv[0], .rounds_want = rounds};
        if (owned) CHECK_EQ(async_fiber_fd_open(s, sv[0]), 0);
        for (int k = 0; k < yielders; k++) CHECK(async_fiber_spawn(s, fb_yielder, &b, 0));
        CHECK(async_fiber_spawn(s, fb_reader, &b, 0));
        for (long i = 0; i < rounds && !atomic_load(&b.bad) && !atomic_load(&b.gave_up); i++) {
            double t0 = now_ms();
            while (atomic_load(&b.rounds) < i && !atomic_load(&b.bad) && !atomic_load(&b.gave_up) &&
                   now_ms() - t0 < 30000)
                sleep_ms(1);
            sleep_ms(1); /* most rounds: the reader is parked when the byte comes */
            char c = (char)i;
            CHECK_EQ(write(sv[1], &c, 1), 1);
        }
        double t0 = now_ms();
        while (atomic_load(&b.rounds) < rounds && !atomic_load(&b.bad) && !atomic_load(&b.gave_up) &&
               now_ms() - t0 < 30000)
            sleep_ms(1);
        if (atomic_load(&b.gave_up) || atomic_load(&b.rounds) < rounds)
            fprintf(stderr, "%d workers, %d yielders, owned %d: %ld of %ld bytes read\n", workers, yielders, owned,
                    atomic_load(&b.rounds), rounds);
        CHECK_EQ(atomic_load(&b.gave_up), 0);
        CHECK_EQ(atomic_load(&b.bad), 0);
        CHECK_EQ(atomic_load(&b.rounds), rounds);
        atomic_store(&b.stop, 1);
        CHECK_EQ(async_sched_shutdown(s, 30000), 0);
        if (owned) CHECK_EQ(async_fiber_close(sv[0]), 0);
        else close(sv[0]);
        close(sv[1]);
        async_sched_destroy(s);
    }
}

CASE(fd_wake_busy) { fd_wake_run(2, 2, 200); }

/* The same with so many yielders that each worker's run queue stays more
 * than half full: the periodic poll, which waits for room in the queue (so
 * that the fibers it readies do not overflow it), must still come (at
 * least every fourth time), and with the ring overflowing into the global
 * queue, the periodic look must get to the inbox (the reader is spawned
 * last) and to the poll: before, the reader never ran, then was never
 * woken. */
CASE(fd_wake_crowded) {
    fd_wake_run(1, 200, 50); /* the ring stays at ~200: never room for a poll's worth */
    fd_wake_run(1, 300, 50); /* the ring overflows into the global queue */
    fd_wake_run(2, 600, 50);
}

/* A sleeper spawned (from this plain thread) after 300 yielding fibers on
 * one worker: their ring overflows into the global queue for good. Before,
 * the worker's periodic look took a fiber from the global queue and went
 * no further: the inbox (where the sleeper was spawned) and the due timers
 * were never looked at while the yielders ran, so the sleeper neither
 * started nor woke until they gave up (20 s). */
typedef struct {
    fb_t *b;
    atomic_int naps;
} sleeper_t;

static void crowd_sleeper(void *arg) {
    sleeper_t *z = arg;
    for (int i = 0; i < 20; i++) {
        async_fiber_sleep(2);
        atomic_store(&z->naps, i + 1);
    }
    atomic_store(&z->b->stop, 1);
}

CASE(sleep_crowded) {
    for (int workers = 1; workers <= 2; workers++) {
        async_sched_t *s = sched_new(workers);
        fb_t b = {.fd = -1};
        sleeper_t z = {.b = &b};
        for (int k = 0; k < 300 * workers; k++) CHECK(async_fiber_spawn(s, fb_yielder, &b, 0));
        CHECK(async_fiber_spawn(s, crowd_sleeper, &z, 0));
        double t0 = now_ms();
        while (atomic_load(&z.naps) < 20 && !atomic_load(&b.gave_up) && now_ms() - t0 < 30000) sleep_ms(1);
        if (atomic_load(&z.naps) < 20)
            fprintf(stderr, "%d workers: %d of 20 naps (yielders gave up: %d)\n", workers, atomic_load(&z.naps),
                    atomic_load(&b.gave_up));
        CHECK_EQ(atomic_load(&b.gave_up), 0);
        CHECK_EQ(atomic_load(&z.naps), 20);
        atomic_store(&b.stop, 1);
        sched_finish(s, 30000);
    }
}
#endif

TEST_MAIN()
