/* Every scheduler feature with many more workers than CPUs: 16 and 64
 * workers (config.workers, so ASYNC_WORKERS does not change them) on however
 * few CPUs the machine has. Only a few workers run at any moment; the OS
 * picks which, so a worker may sit preempted in the middle of a hand-off, a
 * steal or a wake-up while the others go on. What must hold all the same:
 *   - hand-offs: a fiber wakes a fiber parked on another worker, and every
 *     value of a rendezvous arrives;
 *   - stealing: fibers spawned onto a worker that never lets go of its CPU
 *     are all run by the others;
 *   - mutex and condition variable: no increment lost under contention, no
 *     wake-up lost (a cond_wait that times out fails the case);
 *   - channels: values sent through select, send and recv arrive exactly
 *     once;
 *   - fiber I/O on owned fds, and on plain sockets (the uring word runs that
 *     case again on io_uring, one ring per worker): every byte arrives in
 *     order, async_fiber_close wakes the readers parked on it;
 *   - shutdown and destroy while fibers are parked (in sleep, recv, mutex
 *     lock and cond wait) from many workers: each park fails with
 *     ASYNC_E_CANCELLED and every fiber returns.
 * scripts/many_workers.sh runs every other fiber case with ASYNC_WORKERS=16
 * and 64. Every wait is bounded; no case asserts a speed. */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>

#include "fibers.h"

static const int worker_counts[] = {16, 64};
#define NCOUNTS ((int)(sizeof worker_counts / sizeof worker_counts[0]))

/* ---- the set of threads seen ------------------------------------------------ */

/* A lock-free set of thread ids (a worker thread is added from a fiber,
 * which must not block its worker on a pthread mutex). */
#define MAX_THREADS 128
typedef struct {
    _Atomic uintptr_t id[MAX_THREADS];
} thread_set_t;

/* Adds me; 1 if it was not in the set yet. */
static int thread_set_add(thread_set_t *ts, uintptr_t me) {
    for (int i = 0; i < MAX_THREADS; i++) {
        uintptr_t cur = atomic_load(&ts->id[i]);
        if (cur == me) return 0;
        if (cur == 0) {
            if (atomic_compare_exchange_strong(&ts->id[i], &cur, me)) return 1;
            if (cur == me) return 0;
        }
    }
    CHECK(!"more threads than the set holds");
    return 0;
}

static int thread_set_count(thread_set_t *ts) {
    int n = 0;
    while (n < MAX_THREADS && atomic_load(&ts->id[n]) != 0) n++;
    return n;
}

static int thread_set_has(thread_set_t *ts, uintptr_t t) {
    for (int i = 0; i < MAX_THREADS; i++)
        if (atomic_load(&ts->id[i]) == t) return 1;
    return 0;
}

static uintptr_t me_id(void) { return (uintptr_t)cur_thread(); }

/* ---- hand-offs ---------------------------------------------------------------- */

/* Every HO_FORCE-th round, ping first moves off the thread pong called its
 * recv on. */
enum { HO_ROUNDS = 200, HO_FORCE = 20 };

typedef struct {
    async_chan_t *a, *b;       /* rendezvous: ping -> pong, pong -> ping */
    _Atomic uintptr_t pong_at; /* the thread pong called its last recv on */
    atomic_long pong_round;    /* rounds whose recv pong has called */
    atomic_int moved;          /* rounds in which ping moved off pong's thread */
    atomic_int cross;          /* rendezvous on a whose two fibers were on two threads */
    atomic_int done;           /* round trips checked by ping */
    atomic_int bad;
} ho_pair_t;

static void ho_ping(void *arg) {
    ho_pair_t *p = arg;
    for (long i = 0; i < HO_ROUNDS; i++) {
        long x = i;
        int moved = 0;
        if (i % HO_FORCE == 0) {
            while (atomic_load(&p->pong_round) <= i) async_fiber_yield();
            moved = move_off((pthread_t)atomic_load(&p->pong_at));
        }
        uintptr_t me = me_id();
        if (async_chan_send(p->a, &x, BOUND_MS) != 0) {
            atomic_store(&p->bad, 1);
            return;
        }
        /* pong stores pong_at again only after ping's recv below: this is
         * where it called the recv that met this send (the one of the two
         * that came second woke the other) */
        atomic_fetch_add(&p->cross, atomic_load(&p->pong_at) != me);
        atomic_fetch_add(&p->moved, moved);
        if (async_chan_recv(p->b, &x, BOUND_MS) != 0 || x != i + 1) {
            atomic_store(&p->bad, 1);
            return;
        }
        atomic_fetch_add(&p->done, 1);
    }
}

static void ho_pong(void *arg) {
    ho_pair_t *p = arg;
    for (long i = 0; i < HO_ROUNDS; i++) {
        long x;
        atomic_store(&p->pong_at, me_id());
        atomic_store(&p->pong_round, i + 1);
        if (async_chan_recv(p->a, &x, BOUND_MS) != 0 || x != i) {
            atomic_store(&p->bad, 1);
            return;
        }
        x++;
        if (async_chan_send(p->b, &x, BOUND_MS) != 0) {
            atomic_store(&p->bad, 1);
            return;
        }
    }
}

/* Runs as many ping-pong pairs as workers on a new scheduler of w workers;
 * returns the rounds in which ping moved off pong's thread. */
static long handoff_run(int w) {
    async_sched_t *s = sched_new(w);
    ho_pair_t *p = calloc((size_t)w, sizeof *p);
    CHECK(p);
    for (int i = 0; i < w; i++) {
        p[i].a = async_chan_create(0, sizeof(long));
        p[i].b = async_chan_create(0, sizeof(long));
        CHECK(p[i].a && p[i].b);
        CHECK(async_fiber_spawn(s, ho_pong, &p[i], 0));
        CHECK(async_fiber_spawn(s, ho_ping, &p[i], 0));
    }
    CHECK_EQ(async_sched_run(s), 0);
    long cross = 0, moved = 0;
    for (int i = 0; i < w; i++) {
        CHECK_EQ(atomic_load(&p[i].bad), 0);
        CHECK_EQ(atomic_load(&p[i].done), HO_ROUNDS);
        cross += atomic_load(&p[i].cross);
        moved += atomic_load(&p[i].moved);
        async_chan_destroy(p[i].a);
        async_chan_destroy(p[i].b);
    }
    printf("workers %d: %ld of %d rendezvous between two threads (%ld after a move)\n", w, cross, w * HO_ROUNDS,
           moved);
    free(p);
    async_sched_destroy(s);
    return moved;
}

/* Every round trip of every pair completes (a lost wake-up fails a bounded
 * send or receive). A woken fiber mostly runs on its waker's worker, so
 * pairs tend to stay on one worker; every HO_FORCE-th round ping first
 * moves to another worker's thread (move_off), and then the rendezvous is
 * between two threads: the one of the two that came second woke the other,
 * parked on another worker. Moving is up to the scheduler and the OS, not
 * promised for any one try: a run in which no ping moved is repeated (5
 * tries). */
CASE(many_workers_handoff) { // timeout=120
    for (int k = 0; k < NCOUNTS; k++) {
        long moved = 0;
        for (int attempt = 0; attempt < 5 && moved == 0; attempt++) moved = handoff_run(worker_counts[k]);
        CHECK(moved > 0);
    }
}

/* ---- stealing ---------------------------------------------------------------- */

/* Fewer than a worker's local run queue holds: they all stay in it, and
 * only stealing moves them. Each holds the worker that took it until
 * ST_THIEVES threads have taken one. */
enum { ST_FIBERS = 100, ST_THIEVES = 4 };

typedef struct {
    async_sched_t *s;
    _Atomic uintptr_t spawner_at;
    atomic_int started, finished, all_started_while_held;
    thread_set_t ran_on; /* the threads the spawned fibers started on */
} steal_t;

static void st_child(void *arg) {
    steal_t *st = arg;
    thread_set_add(&st->ran_on, me_id());
    atomic_fetch_add(&st->started, 1);
    double t0 = now_ms();
    while (thread_set_count(&st->ran_on) < ST_THIEVES && now_ms() - t0 < BOUND_MS) {
    }
    for (int i = 0; i < 5; i++) async_fiber_yield();
    atomic_fetch_add(&st->finished, 1);
}

/* Spawns ST_FIBERS fibers onto its own worker, then keeps that worker
 * (never yields) until they have all started or BOUND_MS passed. */
static void st_spawner(void *arg) {
    steal_t *st = arg;
    atomic_store(&st->spawner_at, me_id());
    for (int i = 0; i < ST_FIBERS; i++) CHECK(async_fiber_spawn(st->s, st_child, st, 0));
    double t0 = now_ms();
    while (atomic_load(&st->started) < ST_FIBERS && now_ms() - t0 < BOUND_MS) {
    }
    atomic_store(&st->all_started_while_held, atomic_load(&st->started) == ST_FIBERS);
}

/* Fibers spawned onto one worker that holds on to its thread are all run
 * by other workers, which took them by stealing (per-worker stats); as each
 * thief is held by the first fiber it took, the rest must be stolen by
 * others still, woken for the work left: at least ST_THIEVES of them. */
CASE(many_workers_stealing) { // timeout=120
    for (int k = 0; k < NCOUNTS; k++) {
        int w = worker_counts[k];
        async_sched_t *s = sched_new(w);
        steal_t *st = calloc(1, sizeof *st);
        CHECK(st);
        st->s = s;
        CHECK(async_fiber_spawn(s, st_spawner, st, 0));
        CHECK_EQ(async_sched_run(s), 0);
        CHECK_EQ(atomic_load(&st->all_started_while_held), 1);
        CHECK_EQ(atomic_load(&st->finished), ST_FIBERS);
        CHECK(!thread_set_has(&st->ran_on, atomic_load(&st->spawner_at)));
        async_sched_stats_t stats;
        async_sched_worker_stats_t ws[64];
        CHECK_EQ(async_sched_get_stats(s, &stats, ws, 64), w);
        uint64_t steals = 0, started = 0;
        int workers_started = 0;
        for (int i = 0; i < w; i++) {
            steals += ws[i].steals;
            started += ws[i].fibers_started;
            workers_started += ws[i].fibers_started > 0;
        }
        printf("workers %d: %d threads started the spawned fibers, %d workers started fibers, %llu steals\n", w,
               thread_set_count(&st->ran_on), workers_started, (unsigned long long)steals);
        CHECK_EQ(started, ST_FIBERS + 1);
        CHECK(thread_set_count(&st->ran_on) >= ST_THIEVES);
        CHECK(steals >= ST_THIEVES);
        CHECK(workers_started >= ST_THIEVES + 1);
        free(st);
        async_sched_destroy(s);
    }
}

/* ---- mutex and condition variable --------------------------------------------- */

enum { MX_PER = 300, PC_ITEMS = 200, PC_CAP = 4 };

typedef struct {
    async_mutex_t *m;
    async_cond_t *not_full, *not_empty, *gate_cv;
    long counter;              /* under m */
    long buf[PC_CAP], head, n; /* under m */
    long consumed, sum;        /* under m */
    long total;                /* items to consume */
    int gate_open;             /* under m */
    atomic_int through_gate, bad;
} mc_t;

/* Increments the counter under the mutex, yielding inside the critical
 * section now and then so that lockers from other workers park on it. */
static void mc_counter(void *arg) {
    mc_t *c = arg;
    for (int i = 0; i < MX_PER; i++) {
        if (async_mutex_lock(c->m, BOUND_MS) != 0) {
            atomic_store(&c->bad, 1);
            return;
        }
        long v = c->counter;
        if (i % 8 == 0) async_fiber_yield();
        c->counter = v + 1;
        CHECK_EQ(async_mutex_unlock(c->m), 0);
    }
}

/* Waits on cv under c->m (held): 0 when woken, -1 (marking the case bad)
 * when the wait timed out: a lost wake-up. */
static int mc_wait(mc_t *c, async_cond_t *cv) {
    if (async_cond_wait(cv, c->m, BOUND_MS) == 0) return 0;
    atomic_store(&c->bad, 1);
    return -1;
}

static void mc_producer(void *arg) {
    mc_t *c = arg;
    for (long i = 1; i <= PC_ITEMS; i++) {
        CHECK_EQ(async_mutex_lock(c->m, BOUND_MS), 0);
        while (c->n == PC_CAP)
            if (mc_wait(c, c->not_full) != 0) {
                CHECK_EQ(async_mutex_unlock(c->m), 0);
                return;
            }
        c->buf[(c->head + c->n) % PC_CAP] = i;
        c->n++;
        CHECK_EQ(async_cond_signal(c->not_empty), 0);
        CHECK_EQ(async_mutex_unlock(c->m), 0);
    }
}

/* Consumes until all items are consumed (the last one wakes the others). */
static void mc_consumer(void *arg) {
    mc_t *c = arg;
    CHECK_EQ(async_mutex_lock(c->m, BOUND_MS), 0);
    for (;;) {
        while (c->n == 0 && c->consumed < c->total)
            if (mc_wait(c, c->not_empty) != 0) goto out;
        if (c->consumed == c->total) break;
        c->sum += c->buf[c->head];
        c->head = (c->head + 1) % PC_CAP;
        c->n--;
        if (++c->consumed == c->total) CHECK_EQ(async_cond_broadcast(c->not_empty), 0);
        CHECK_EQ(async_cond_signal(c->not_full), 0);
    }
out:
    CHECK_EQ(async_mutex_unlock(c->m), 0);
}

static void mc_gate(void *arg) {
    mc_t *c = arg;
    CHECK_EQ(async_mutex_lock(c->m, BOUND_MS), 0);
    int ok = 1;
    while (ok && !c->gate_open) ok = mc_wait(c, c->gate_cv) == 0;
    if (ok) atomic_fetch_add(&c->through_gate, 1);
    CHECK_EQ(async_mutex_unlock(c->m), 0);
}

/* Per worker count: 2 counters per worker under one mutex; a bounded buffer
 * with as many producers and consumers as workers, woken by
 * async_cond_signal; 2 fibers per worker behind a gate that one broadcast
 * from a plain thread opens. No increment, item or wake-up is lost. */
CASE(many_workers_mutex_cond) { // timeout=120
    for (int k = 0; k < NCOUNTS; k++) {
        int w = worker_counts[k];
        async_sched_t *s = sched_new(w);
        mc_t *c = calloc(1, sizeof *c);
        CHECK(c);
        c->m = async_mutex_create();
        c->not_full = async_cond_create();
        c->not_empty = async_cond_create();
        c->gate_cv = async_cond_create();
        CHECK(c->m && c->not_full && c->not_empty && c->gate_cv);
        c->total = (long)w * PC_ITEMS;
        for (int i = 0; i < 2 * w; i++) CHECK(async_fiber_spawn(s, mc_gate, c, 0));
        for (int i = 0; i < 2 * w; i++) CHECK(async_fiber_spawn(s, mc_counter, c, 0));
        for (int i = 0; i < w; i++) {
            CHECK(async_fiber_spawn(s, mc_producer, c, 0));
            CHECK(async_fiber_spawn(s, mc_consumer, c, 0));
        }
        /* the gate opens once its fibers are parked on it (or some may not
         * have reached it: they find it open) */
        sleep_ms(10);
        CHECK_EQ(async_mutex_lock(c->m, BOUND_MS), 0);
        c->gate_open = 1;
        CHECK_EQ(async_cond_broadcast(c->gate_cv), 0);
        CHECK_EQ(async_mutex_unlock(c->m), 0);
        CHECK_EQ(async_sched_run(s), 0);
        CHECK_EQ(atomic_load(&c->bad), 0);
        CHECK_EQ(c->counter, 2L * w * MX_PER);
        CHECK_EQ(c->consumed, c->total);
        CHECK_EQ(c->sum, (long)w * PC_ITEMS * (PC_ITEMS + 1) / 2);
        CHECK_EQ(atomic_load(&c->through_gate), 2 * w);
        async_cond_destroy(c->gate_cv);
        async_cond_destroy(c->not_empty);
        async_cond_destroy(c->not_full);
        async_mutex_destroy(c->m);
        free(c);
        async_sched_destroy(s);
    }
}

/* ---- channels ----------------------------------------------------------------- */

enum { CH_PER = 200 };

typedef struct {
    async_chan_t *c[2]; /* c[0] buffered, c[1] rendezvous */
    atomic_int next_producer;
    atomic_int producers_done;
    long nvalues;       /* CH_PER per producer */
    atomic_uchar *seen; /* per value: times received */
    atomic_int received, bad;
} ch_t;

/* Sends its CH_PER values: even ones by select over both channels, odd ones
 * by a plain send on the one the value picks. */
static void ch_producer(void *arg) {
    ch_t *c = arg;
    long id = atomic_fetch_add(&c->next_producer, 1);
    for (long i = 0; i < CH_PER; i++) {
        long v = id * CH_PER + i;
        if (i % 2 == 0) {
            async_chan_op_t ops[2] = {{c->c[0], ASYNC_CHAN_SEND, &v, 0}, {c->c[1], ASYNC_CHAN_SEND, &v, 0}};
            int r = async_chan_select(ops, 2, BOUND_MS);
            if (r < 0 || ops[r].status != 0) atomic_store(&c->bad, 1);
        } else if (async_chan_send(c->c[(v / 2) % 2], &v, BOUND_MS) != 0) {
            atomic_store(&c->bad, 1);
        }
    }
    atomic_fetch_add(&c->producers_done, 1);
}

static void ch_take(ch_t *c, long v) {
    if (v < 0 || v >= c->nvalues || atomic_fetch_add(&c->seen[v], 1) != 0)
        atomic_store(&c->bad, 1);
    atomic_fetch_add(&c->received, 1);
}

/* Receives by select over the channels still open, and by a plain recv
 * every third time, until both are closed and drained. */
static void ch_consumer(void *arg) {
    ch_t *c = arg;
    int open[2] = {1, 1};
    for (long round = 0; open[0] || open[1]; round++) {
        long v;
        if (round % 3 == 2) {
            int i = open[0] ? 0 : 1;
            if (async_chan_recv(c->c[i], &v, -1) == 0)
                ch_take(c, v);
            else if (async_last_error() == ASYNC_E_CLOSED)
                open[i] = 0;
            else
                atomic_store(&c->bad, 1);
            continue;
        }
        async_chan_op_t ops[2];
        int map[2], n = 0;
        for (int i = 0; i < 2; i++)
            if (open[i]) {
                ops[n] = (async_chan_op_t){c->c[i], ASYNC_CHAN_RECV, &v, 0};
                map[n++] = i;
            }
        int r = async_chan_select(ops, (size_t)n, -1);
        if (r < 0) {
            atomic_store(&c->bad, 1);
            return;
        }
        if (ops[r].status == ASYNC_E_CLOSED)
            open[map[r]] = 0;
        else
            ch_take(c, v);
    }
}

/* As many producers and consumers as workers over a buffered and a
 * rendezvous channel, through select, send and recv: every value arrives
 * exactly once; closing both channels ends every consumer. */
CASE(many_workers_channels) { // timeout=120
    for (int k = 0; k < NCOUNTS; k++) {
        int w = worker_counts[k];
        async_sched_t *s = sched_new(w);
        ch_t *c = calloc(1, sizeof *c);
        CHECK(c);
        long nvalues = c->nvalues = (long)w * CH_PER;
        c->seen = calloc((size_t)nvalues, sizeof *c->seen);
        c->c[0] = async_chan_create(8, sizeof(long));
        c->c[1] = async_chan_create(0, sizeof(long));
        CHECK(c->seen && c->c[0] && c->c[1]);
        for (int i = 0; i < w; i++) CHECK(async_fiber_spawn(s, ch_consumer, c, 0));
        for (int i = 0; i < w; i++) CHECK(async_fiber_spawn(s, ch_producer, c, 0));
        wait_count(&c->producers_done, w, "producers");
        async_chan_close(c->c[0]);
        async_chan_close(c->c[1]);
        CHECK_EQ(async_sched_run(s), 0);
        CHECK_EQ(atomic_load(&c->bad), 0);
        CHECK_EQ(atomic_load(&c->received), nvalues);
        for (long v = 0; v < nvalues; v++) CHECK_EQ(atomic_load(&c->seen[v]), 1);
        async_chan_destroy(c->c[0]);
        async_chan_destroy(c->c[1]);
        free(c->seen);
        free(c);
        async_sched_destroy(s);
    }
}

/* ---- fiber I/O: owned fds, plain sockets (epoll or io_uring) ------------------ */

enum { IO_RECORDS = 100 };

typedef struct {
    long pair, seq;
} rec_t;

typedef struct {
    int fd[2]; /* socketpair: fd[0] the writer's (client's) end, fd[1] the reader's */
    long id;
    atomic_int *readers_parking, *closed_woken, *bad;
} io_pair_t;

/* Reads exactly n bytes; 0, or -1 (error or end of file first). */
static int read_full(int fd, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = async_fiber_read(fd, (char *)buf + got, n - got, BOUND_MS);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
    return async_fiber_write(fd, buf, n, BOUND_MS) == (ssize_t)n ? 0 : -1;
}

static void owned_writer(void *arg) {
    io_pair_t *p = arg;
    for (long i = 0; i < IO_RECORDS; i++) {
        rec_t r = {p->id, i};
        if (write_full(p->fd[0], &r, sizeof r) != 0) atomic_store(p->bad, 1);
    }
}

/* Reads the writer's records in order, then parks in a read that only
 * async_fiber_close ends. */
static void owned_reader(void *arg) {
    io_pair_t *p = arg;
    for (long i = 0; i < IO_RECORDS; i++) {
        rec_t r;
        if (read_full(p->fd[1], &r, sizeof r) != 0 || r.pair != p->id || r.seq != i) {
            atomic_store(p->bad, 1);
            return;
        }
    }
    char c;
    atomic_fetch_add(p->readers_parking, 1);
    if (async_fiber_read(p->fd[1], &c, 1, -1) == -1 && async_last_error() == ASYNC_E_CLOSED)
        atomic_fetch_add(p->closed_woken, 1);
}

static void owned_closer(void *arg) {
    io_pair_t *p = arg;
    CHECK_EQ(async_fiber_close(p->fd[1]), 0);
}

/* w socketpairs (both ends owned by s if owned), and on each pair the fibers
 * a(pair) and b(pair); n1, n2 and bad are the pairs' shared counters. */
static io_pair_t *io_pairs_start(async_sched_t *s, int w, int owned, void (*a)(void *), void (*b)(void *),
                                 atomic_int *n1, atomic_int *n2, atomic_int *bad) {
    io_pair_t *p = calloc((size_t)w, sizeof *p);
    CHECK(p);
    for (int i = 0; i < w; i++) {
        p[i] = (io_pair_t){{-1, -1}, i, n1, n2, bad};
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p[i].fd), 0);
        if (owned) {
            CHECK_EQ(async_fiber_fd_open(s, p[i].fd[0]), 0);
            CHECK_EQ(async_fiber_fd_open(s, p[i].fd[1]), 0);
        }
        CHECK(async_fiber_spawn(s, a, &p[i], 0));
        CHECK(async_fiber_spawn(s, b, &p[i], 0));
    }
    return p;
}

/* As many socketpairs as workers, both ends owned by the scheduler: a
 * writer and a reader fiber per pair move records (every one arrives, in
 * order); then each reader parks on its fd and a fiber closing it with
 * async_fiber_close wakes it with ASYNC_E_CLOSED. */
CASE(many_workers_owned_fds) { // timeout=120
    for (int k = 0; k < NCOUNTS; k++) {
        int w = worker_counts[k];
        async_sched_t *s = sched_new(w);
        atomic_int parking = 0, woken = 0, bad = 0;
        io_pair_t *p = io_pairs_start(s, w, 1, owned_reader, owned_writer, &parking, &woken, &bad);
        wait_count(&parking, w, "readers done with their records");
        sched_wait_parked(s, (size_t)w);
        CHECK_EQ(atomic_load(&bad), 0);
        for (int i = 0; i < w; i++) CHECK(async_fiber_spawn(s, owned_closer, &p[i], 0));
        CHECK_EQ(async_sched_run(s), 0);
        CHECK_EQ(atomic_load(&woken), w);
        for (int i = 0; i < w; i++) CHECK_EQ(async_fiber_close(p[i].fd[0]), 0);
        free(p);
        async_sched_destroy(s);
    }
}

static void echo_server(void *arg) {
    io_pair_t *p = arg;
    rec_t r;
    while (read_full(p->fd[1], &r, sizeof r) == 0)
        if (write_full(p->fd[1], &r, sizeof r) != 0) break;
}

/* Sends its records one at a time and reads each back, then shuts its
 * side down, which ends the echo fiber's read loop. */
static void echo_client(void *arg) {
    io_pair_t *p = arg;
    for (long i = 0; i < IO_RECORDS; i++) {
        rec_t r = {p->id, i}, back;
        if (write_full(p->fd[0], &r, sizeof r) != 0 || read_full(p->fd[0], &back, sizeof back) != 0 ||
            back.pair != p->id || back.seq != i) {
            atomic_store(p->bad, 1);
            break;
        }
    }
    CHECK_EQ(shutdown(p->fd[0], SHUT_WR), 0);
    atomic_fetch_add(p->closed_woken, 1);
}

static atomic_int log_uring, log_epoll;

static void io_log(int level, const char *msg, void *ctx) {
    (void)ctx;
    (void)level;
    if (strstr(msg, "fiber I/O: io_uring (")) atomic_store(&log_uring, 1);
    if (strstr(msg, "fiber I/O:") && strstr(msg, "epoll is used")) atomic_store(&log_epoll, 1);
}

/* A scheduler of w workers; under ASYNC_FIBER_IO=uring it checks that the
 * rings are in use, unless io_uring is refused here altogether (a
 * one-worker scheduler does not get a ring either). */
static async_sched_t *io_sched_new(int w) {
    const char *io = getenv("ASYNC_FIBER_IO");
    atomic_store(&log_uring, 0);
    atomic_store(&log_epoll, 0);
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_INFO, io_log, NULL), 0);
    async_sched_t *s = sched_new(w);
    if (io && strcmp(io, "uring") == 0 && !atomic_load(&log_uring)) {
        atomic_store(&log_uring, 0);
        async_sched_destroy(sched_new(1));
        CHECK(!atomic_load(&log_uring));
        printf("io_uring unavailable here: epoll is used\n");
    }
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, NULL, NULL), 0);
    return s;
}

/* As many plain (not owned) socketpairs as workers, a client and an echo
 * fiber on each: every record comes back, in order. The uring word runs it
 * again with one io_uring per worker. */
CASE(many_workers_socket_echo) { // uring timeout=120
    for (int k = 0; k < NCOUNTS; k++) {
        int w = worker_counts[k];
        async_sched_t *s = io_sched_new(w);
        atomic_int unused = 0, clients_done = 0, bad = 0;
        io_pair_t *p = io_pairs_start(s, w, 0, echo_server, echo_client, &unused, &clients_done, &bad);
        CHECK_EQ(async_sched_run(s), 0);
        CHECK_EQ(atomic_load(&bad), 0);
        CHECK_EQ(atomic_load(&clients_done), w);
        for (int i = 0; i < w; i++) close_pair(p[i].fd);
        free(p);
        async_sched_destroy(s);
    }
}

/* ---- shutdown and destroy while parked ---------------------------------------- */

enum { SD_PER_WORKER = 4, SD_SPREAD_MS = 10000 };

typedef struct {
    async_chan_t *c;     /* nobody sends */
    async_mutex_t *held; /* held by the main thread */
    async_mutex_t *m;
    async_cond_t *cv;    /* nobody signals */
    int workers;
    double spread_until;
    thread_set_t parked_on; /* the threads the fibers made their last park from */
    atomic_int next, parking, cancelled, other;
} sd_t;

/* Parks one of four ways (recv, sleep, mutex lock, cond wait) with no
 * timeout, which only the shutdown ends; returns the error the park failed
 * with, 0 if it did not fail. */
static int sd_park(sd_t *d, int kind) {
    long v;
    int rc;
    switch (kind) {
    case 0:
        rc = async_chan_recv(d->c, &v, -1);
        break;
    case 1:
        rc = async_fiber_sleep(UINT64_MAX);
        break;
    case 2:
        rc = async_mutex_lock(d->held, -1);
        if (rc == 0) CHECK_EQ(async_mutex_unlock(d->held), 0);
        break;
    default:
        CHECK_EQ(async_mutex_lock(d->m, -1), 0);
        rc = async_cond_wait(d->cv, d->m, -1);
        if (rc != 0) {
            int e = async_last_error();
            CHECK_EQ(async_mutex_unlock(d->m), 0);
            return e;
        }
        CHECK_EQ(async_mutex_unlock(d->m), 0);
    }
    return rc == 0 ? 0 : async_last_error();
}

/* Parks for good at once on a thread no fiber has parked from yet;
 * elsewhere sleeps in 1 ms steps (each wake-up may resume it on another
 * worker) until every worker has had a fiber park from it (or SD_SPREAD_MS
 * passed), then parks there. */
static void sd_fiber(void *arg) {
    sd_t *d = arg;
    int kind = atomic_fetch_add(&d->next, 1) % 4;
    while (!thread_set_add(&d->parked_on, me_id()) && thread_set_count(&d->parked_on) < d->workers &&
           now_ms() < d->spread_until)
        if (async_fiber_sleep(1) != 0) {
            atomic_fetch_add(&d->other, 1);
            return;
        }
    atomic_fetch_add(&d->parking, 1);
    if (sd_park(d, kind) == ASYNC_E_CANCELLED)
        atomic_fetch_add(&d->cancelled, 1);
    else
        atomic_fetch_add(&d->other, 1);
}

/* SD_PER_WORKER fibers per worker parked, from every worker's thread; then
 * async_sched_shutdown (then destroy), or async_sched_destroy alone: every
 * park fails with ASYNC_E_CANCELLED and every fiber returns. */
CASE(many_workers_shutdown_parked) { // timeout=180
    for (int k = 0; k < NCOUNTS; k++) {
        for (int by_destroy = 0; by_destroy < 2; by_destroy++) {
            int w = worker_counts[k], n = SD_PER_WORKER * w;
            async_sched_t *s = sched_new(w);
            sd_t *d = calloc(1, sizeof *d);
            CHECK(d);
            d->c = async_chan_create(0, sizeof(long));
            d->held = async_mutex_create();
            d->m = async_mutex_create();
            d->cv = async_cond_create();
            CHECK(d->c && d->held && d->m && d->cv);
            CHECK_EQ(async_mutex_lock(d->held, -1), 0);
            d->workers = w;
            d->spread_until = now_ms() + SD_SPREAD_MS;
            for (int i = 0; i < n; i++) CHECK(async_fiber_spawn(s, sd_fiber, d, 0));
            wait_count(&d->parking, n, "fibers parking");
            sched_wait_parked(s, (size_t)n);
            printf("workers %d: %d fibers parked from %d threads\n", w, n, thread_set_count(&d->parked_on));
            CHECK_EQ(thread_set_count(&d->parked_on), w);
            if (by_destroy) {
                async_sched_destroy(s);
            } else {
                CHECK_EQ(async_sched_shutdown(s, BOUND_MS), 0);
                async_sched_destroy(s);
            }
            CHECK_EQ(atomic_load(&d->other), 0);
            CHECK_EQ(atomic_load(&d->cancelled), n);
            CHECK_EQ(async_mutex_unlock(d->held), 0);
            async_cond_destroy(d->cv);
            async_mutex_destroy(d->m);
            async_mutex_destroy(d->held);
            async_chan_destroy(d->c);
            free(d);
        }
    }
}

TEST_MAIN()
