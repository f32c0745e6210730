/* async_worker_signal_stop reaches the worker's own queue waits: a worker
 * blocked in async_queue_dequeue_wait / enqueue_wait / a blocking enqueue
 * wakes with ASYNC_E_CANCELLED when it is asked to stop, a wait that begins
 * after the stop fails at once, queued messages are still handed out first,
 * and nobody else waiting on the queue is disturbed. A stop that did not
 * reach such a wait would leave it hanging; the bounded joins
 * (async_worker_join with a timeout, join_within) turn that into a failure.
 * Also built for Windows by scripts/cross.sh. */
#include <sched.h>
#include <stdatomic.h>

#include "check.h"

/* Generous bounds: they only turn a hang into a failure. */
#define JOIN_MS 20000

/* ---- helpers -------------------------------------------------------------------- */

enum { OP_DEQ = 0, OP_ENQ_WAIT = 1, OP_ENQ = 2 };

typedef struct {
    async_queue_t *q;
    int op;          /* OP_*: the wait the worker makes */
    int timeout_ms;  /* for the _wait calls */
    int loop;        /* 1: repeat until the call fails; 0: one call */
    int wait_stop;   /* 1: make the first call only once should_stop() is true */
    _Atomic int entered; /* the worker is about to make its (first) call */
    _Atomic int done;    /* the worker's calls are over */
    int ok_calls;        /* calls that succeeded */
    int err;             /* async_last_error() of the call that failed (0: none) */
    int msgs[64];        /* the first messages dequeued */
} job_t;

static void *job_proc(void *arg) {
    job_t *j = arg;
    async_worker_t *self = async_worker_current();
    CHECK(self != NULL);
    if (j->wait_stop) {
        double t0 = now_ms();
        while (!async_worker_should_stop(self)) {
            CHECK(now_ms() - t0 < JOIN_MS);
            sched_yield();
        }
    }
    atomic_store(&j->entered, 1);
    for (;;) {
        int v = 0x5a5a;
        bool ok;
        async_clear_error();
        if (j->op == OP_DEQ) {
            size_t n = 0;
            ok = async_queue_dequeue_wait(j->q, &v, sizeof v, &n, j->timeout_ms);
            if (ok) {
                CHECK_EQ(n, sizeof v);
                if (j->ok_calls < 64) j->msgs[j->ok_calls] = v;
            }
        } else if (j->op == OP_ENQ_WAIT) {
            ok = async_queue_enqueue_wait(j->q, &v, sizeof v, j->timeout_ms);
        } else {
            ok = async_queue_enqueue(j->q, &v, sizeof v);
        }
        if (!ok) {
            j->err = async_last_error();
            break;
        }
        j->ok_calls++;
        if (!j->loop) break;
    }
    atomic_store(&j->done, 1);
    return NULL;
}

static async_worker_t *start_job(job_t *j) {
    async_worker_t *w = async_worker_create(job_proc, j, 0);
    CHECK(w != NULL);
    return w;
}

/* Joins w within JOIN_MS (fails the test if its proc is still blocked) and
 * destroys it. */
static void join_job(async_worker_t *w) {
    if (!async_worker_join(w, JOIN_MS)) {
        fprintf(stderr, "worker still running after %d ms: its wait was not interrupted\n", JOIN_MS);
        CHECK(0);
    }
    async_worker_destroy(w);
}

static void wait_entered(job_t *j) {
    double t0 = now_ms();
    while (!atomic_load(&j->entered)) {
        CHECK(now_ms() - t0 < JOIN_MS);
        sched_yield();
    }
}

/* Starts a worker running j and returns once it is about to make its call,
 * plus 20 ms: most likely asleep in the wait by then (either way the wait
 * must end when it is stopped). */
static async_worker_t *start_waiting(job_t *j) {
    async_worker_t *w = start_job(j);
    wait_entered(j);
    sleep_ms(20);
    return w;
}

static void enq_int(async_queue_t *q, int v) { CHECK(async_queue_enqueue(q, &v, sizeof v)); }

static size_t qsize(async_queue_t *q) {
    async_queue_stats_t st;
    async_queue_get_stats(q, &st);
    CHECK(st.capacity != 0);
    return st.current_size;
}

/* ---- cases ---------------------------------------------------------------------- */

/* A worker blocked in dequeue_wait(-1) on an empty queue wakes with
 * ASYNC_E_CANCELLED; so does one blocked with a long timeout. */
CASE(stop_dequeue_wakes) {
    async_queue_t *q = async_queue_create(4, sizeof(int), 0);
    CHECK(q);
    for (int k = 0; k < 2; k++) {
        job_t j = {.q = q, .op = OP_DEQ, .timeout_ms = k == 0 ? -1 : 600000};
        async_worker_t *w = start_waiting(&j);
        async_worker_signal_stop(w);
        join_job(w);
        CHECK_EQ(j.ok_calls, 0);
        CHECK_EQ(j.err, ASYNC_E_CANCELLED);
    }
    CHECK_EQ(qsize(q), 0);
    async_queue_destroy(q);
}

/* In a worker proc: waits (JOIN_MS at most) until the worker is asked to
 * stop; returns the worker. */
static async_worker_t *wait_stop_asked(void) {
    async_worker_t *self = async_worker_current();
    double t0 = now_ms();
    while (!async_worker_should_stop(self)) {
        CHECK(now_ms() - t0 < JOIN_MS);
        sched_yield();
    }
    return self;
}

/* The stop is sticky: a wait that begins after it fails at once (-1 and a
 * long timeout alike); timeout 0 still only checks (ASYNC_E_EMPTY / FULL). */
static void *sticky_proc(void *arg) {
    async_queue_t **qs = arg; /* [0] empty, [1] full BLOCK_WRITER */
    wait_stop_asked();
    int v = 1;
    size_t n;
    for (int i = 0; i < 3; i++) {
        CHECK_FAIL(!async_queue_dequeue_wait(qs[0], &v, sizeof v, &n, -1), ASYNC_E_CANCELLED);
        CHECK_FAIL(!async_queue_dequeue_wait(qs[0], &v, sizeof v, &n, 600000), ASYNC_E_CANCELLED);
        CHECK_FAIL(!async_queue_dequeue_wait(qs[0], &v, sizeof v, &n, 0), ASYNC_E_EMPTY);
        CHECK_FAIL(!async_queue_dequeue(qs[0], &v, sizeof v, &n), ASYNC_E_EMPTY);
        CHECK_FAIL(!async_queue_enqueue_wait(qs[1], &v, sizeof v, -1), ASYNC_E_CANCELLED);
        CHECK_FAIL(!async_queue_enqueue_wait(qs[1], &v, sizeof v, 600000), ASYNC_E_CANCELLED);
        CHECK_FAIL(!async_queue_enqueue(qs[1], &v, sizeof v), ASYNC_E_CANCELLED);
        CHECK_FAIL(!async_queue_enqueue_wait(qs[1], &v, sizeof v, 0), ASYNC_E_FULL);
    }
    /* Not the queue's state: room makes enqueue_wait succeed after the stop. */
    CHECK(async_queue_enqueue_wait(qs[0], &v, sizeof v, -1));
    CHECK(async_queue_dequeue_wait(qs[0], &v, sizeof v, &n, -1));
    return (void *)1;
}

CASE(stop_sticky) {
    async_queue_t *qs[2];
    qs[0] = async_queue_create(4, sizeof(int), 0);
    qs[1] = async_queue_create(1, sizeof(int), ASYNC_QUEUE_BLOCK_WRITER);
    CHECK(qs[0] && qs[1]);
    enq_int(qs[1], 7);
    async_worker_t *w = async_worker_create(sticky_proc, qs, 0);
    CHECK(w);
    async_worker_signal_stop(w);
    CHECK(async_worker_join(w, JOIN_MS));
    CHECK(async_worker_result(w) == (void *)1);
    async_worker_destroy(w);
    CHECK_EQ(qsize(qs[1]), 1);
    async_queue_destroy(qs[0]);
    async_queue_destroy(qs[1]);
}

/* Data before stop: messages queued when the stop comes are still handed out
 * by dequeue_wait (without waiting); only when it would have to wait does it
 * fail with ASYNC_E_CANCELLED. */
CASE(stop_data_first) {
    async_queue_t *q = async_queue_create(8, sizeof(int), 0);
    CHECK(q);
    for (int i = 0; i < 5; i++) enq_int(q, 100 + i);
    job_t j = {.q = q, .op = OP_DEQ, .timeout_ms = -1, .loop = 1, .wait_stop = 1};
    async_worker_t *w = start_job(&j);
    async_worker_signal_stop(w);
    join_job(w);
    CHECK_EQ(j.ok_calls, 5);
    for (int i = 0; i < 5; i++) CHECK_EQ(j.msgs[i], 100 + i);
    CHECK_EQ(j.err, ASYNC_E_CANCELLED);
    CHECK_EQ(qsize(q), 0);
    async_queue_destroy(q);
}

/* The race: the stop is signalled from another thread at every moment of the
 * worker's life (before its first wait, while it drains messages, as it
 * enters a wait, while it sleeps); each time the worker must end with
 * ASYNC_E_CANCELLED, and every message is either dequeued or still queued. */
typedef struct {
    async_worker_t *_Atomic w;
    _Atomic int go;
    int spins;
} stopper_t;

static void *stopper(void *arg) {
    stopper_t *s = arg;
    double t0 = now_ms();
    while (!atomic_load(&s->go)) {
        CHECK(now_ms() - t0 < JOIN_MS);
    }
    for (int i = 0; i < s->spins; i++) atomic_signal_fence(memory_order_seq_cst);
    async_worker_signal_stop(atomic_load(&s->w));
    return NULL;
}

CASE(stop_race) {
    const int rounds = 600;
    async_queue_t *q = async_queue_create(16, sizeof(int), 0);
    CHECK(q);
    for (int r = 0; r < rounds; r++) {
        int nmsg = r % 4;
        for (int i = 0; i < nmsg; i++) enq_int(q, i);
        job_t j = {.q = q, .op = OP_DEQ, .timeout_ms = (r & 1) ? -1 : 600000, .loop = 1};
        stopper_t s = {.spins = (r * 37) % 2000};
        pthread_t t;
        start_thread(&t, stopper, &s);
        async_worker_t *w = start_job(&j);
        atomic_store(&s.w, w);
        if (r % 3 == 0) wait_entered(&j);
        atomic_store(&s.go, 1);
        join_within(t, JOIN_MS, "stopper");
        join_job(w);
        CHECK_EQ(j.err, ASYNC_E_CANCELLED);
        CHECK(j.ok_calls <= nmsg);
        CHECK_EQ((size_t)j.ok_calls + qsize(q), (size_t)nmsg);
        async_queue_clear(q);
    }
    async_queue_destroy(q);
}

/* Several workers and a plain thread wait on one queue: stopping one worker
 * ends only its wait. The others keep waiting and each later gets one of the
 * messages; the stopped worker took none. */
static void *plain_reader(void *arg) {
    job_t *j = arg;
    atomic_store(&j->entered, 1);
    int v;
    size_t n;
    async_clear_error();
    if (async_queue_dequeue_wait(j->q, &v, sizeof v, &n, -1)) {
        j->ok_calls = 1;
        j->msgs[0] = v;
    } else {
        j->err = async_last_error();
    }
    atomic_store(&j->done, 1);
    return NULL;
}

CASE(stop_others_undisturbed) {
    async_queue_t *q = async_queue_create(8, sizeof(int), 0);
    CHECK(q);
    enum { NW = 3 };
    job_t jobs[NW], pj = {.q = q, .op = OP_DEQ, .timeout_ms = -1};
    async_worker_t *w[NW];
    for (int i = 0; i < NW; i++) {
        jobs[i] = (job_t){.q = q, .op = OP_DEQ, .timeout_ms = -1};
        w[i] = start_job(&jobs[i]);
    }
    pthread_t pt;
    start_thread(&pt, plain_reader, &pj);
    for (int i = 0; i < NW; i++) wait_entered(&jobs[i]);
    wait_entered(&pj);
    sleep_ms(20); /* let them fall asleep (not required for correctness) */

    async_worker_signal_stop(w[0]);
    CHECK(async_worker_join(w[0], JOIN_MS));
    CHECK_EQ(jobs[0].err, ASYNC_E_CANCELLED);
    CHECK_EQ(jobs[0].ok_calls, 0);
    /* The others still wait. */
    sleep_ms(20);
    for (int i = 1; i < NW; i++) {
        CHECK_FAIL(!async_worker_join(w[i], 0), ASYNC_E_TIMEDOUT);
        CHECK_EQ(atomic_load(&jobs[i].done), 0);
    }
    CHECK_EQ(atomic_load(&pj.done), 0);
    /* One message each for the three that wait. */
    for (int i = 0; i < NW; i++) enq_int(q, 10 + i);
    int seen = 0;
    for (int i = 1; i < NW; i++) {
        CHECK(async_worker_join(w[i], JOIN_MS));
        CHECK_EQ(jobs[i].ok_calls, 1);
        seen |= 1 << (jobs[i].msgs[0] - 10);
    }
    join_within(pt, JOIN_MS, "plain reader");
    CHECK_EQ(pj.ok_calls, 1);
    seen |= 1 << (pj.msgs[0] - 10);
    CHECK_EQ(seen, 7);
    async_queue_stats_t st;
    async_queue_get_stats(q, &st);
    CHECK_EQ(st.dequeue_count, 3);
    CHECK_EQ(st.current_size, 0);
    for (int i = 0; i < NW; i++) async_worker_destroy(w[i]);
    async_queue_destroy(q);
}

/* A full BLOCK_WRITER queue: a worker in enqueue_wait(-1) and one in the
 * blocking async_queue_enqueue both wake with ASYNC_E_CANCELLED and add
 * nothing; a writer that is not stopped still gets the room later. */
CASE(stop_enqueue_wait_full) {
    async_queue_t *q = async_queue_create(1, sizeof(int), ASYNC_QUEUE_BLOCK_WRITER);
    CHECK(q);
    enq_int(q, 1);
    job_t a = {.q = q, .op = OP_ENQ_WAIT, .timeout_ms = -1};
    job_t b = {.q = q, .op = OP_ENQ};
    job_t c = {.q = q, .op = OP_ENQ_WAIT, .timeout_ms = -1};
    async_worker_t *wa = start_job(&a), *wb = start_job(&b), *wc = start_job(&c);
    wait_entered(&a);
    wait_entered(&b);
    wait_entered(&c);
    sleep_ms(20);
    async_worker_signal_stop(wa);
    async_worker_signal_stop(wb);
    join_job(wa);
    join_job(wb);
    CHECK_EQ(a.err, ASYNC_E_CANCELLED);
    CHECK_EQ(b.err, ASYNC_E_CANCELLED);
    CHECK_EQ(a.ok_calls + b.ok_calls, 0);
    CHECK_EQ(atomic_load(&c.done), 0);
    async_queue_stats_t st;
    async_queue_get_stats(q, &st);
    CHECK_EQ(st.enqueue_count, 1);
    /* Room for c. */
    int v;
    CHECK(async_queue_dequeue(q, &v, sizeof v, NULL));
    CHECK(async_worker_join(wc, JOIN_MS));
    CHECK_EQ(c.ok_calls, 1);
    async_worker_destroy(wc);
    async_queue_get_stats(q, &st);
    CHECK_EQ(st.enqueue_count, 2);
    CHECK_EQ(st.current_size, 1);
    async_queue_destroy(q);
}

/* The queue destroyed while a worker waits, with the stop racing it: the
 * wait ends with ASYNC_E_CLOSED or ASYNC_E_CANCELLED, never hangs, never
 * touches freed memory (ASan build). A destroy alone gives ASYNC_E_CLOSED. */
typedef struct {
    async_queue_t *q;
    _Atomic int go;
    int spins;
} destroyer_t;

static void *destroyer(void *arg) {
    destroyer_t *d = arg;
    double t0 = now_ms();
    while (!atomic_load(&d->go)) CHECK(now_ms() - t0 < JOIN_MS);
    for (int i = 0; i < d->spins; i++) atomic_signal_fence(memory_order_seq_cst);
    async_queue_destroy(d->q);
    return NULL;
}

CASE(stop_queue_destroyed) {
    /* destroy alone */
    async_queue_t *q = async_queue_create(2, sizeof(int), 0);
    CHECK(q);
    job_t j = {.q = q, .op = OP_DEQ, .timeout_ms = -1};
    async_worker_t *w = start_waiting(&j);
    async_queue_destroy(q);
    join_job(w);
    CHECK_EQ(j.err, ASYNC_E_CLOSED);

    /* destroy racing the stop */
    for (int r = 0; r < 300; r++) {
        q = async_queue_create(1, sizeof(int), (r & 1) ? ASYNC_QUEUE_BLOCK_WRITER : 0);
        CHECK(q);
        if (r & 1) enq_int(q, 1);
        job_t k = {.q = q, .op = (r & 1) ? OP_ENQ_WAIT : OP_DEQ, .timeout_ms = -1};
        destroyer_t d = {.q = q, .spins = (r * 53) % 1500};
        pthread_t t;
        start_thread(&t, destroyer, &d);
        async_worker_t *wk = start_job(&k);
        if (r % 2 == 0) wait_entered(&k);
        atomic_store(&d.go, 1);
        async_worker_signal_stop(wk);
        join_within(t, JOIN_MS, "destroyer");
        join_job(wk);
        CHECK_EQ(k.ok_calls, 0);
        /* BADHANDLE: the destroy came before the worker's first call */
        CHECK(k.err == ASYNC_E_CLOSED || k.err == ASYNC_E_CANCELLED || k.err == ASYNC_E_BADHANDLE);
    }
}

/* async_worker_destroy of a running worker asks it to stop: its wait ends
 * too, and the detached proc returns. */
CASE(stop_destroy_running) {
    async_queue_t *q = async_queue_create(2, sizeof(int), 0);
    CHECK(q);
    job_t j = {.q = q, .op = OP_DEQ, .timeout_ms = -1};
    async_worker_t *w = start_waiting(&j);
    async_worker_destroy(w);
    double t0 = now_ms();
    while (!atomic_load(&j.done)) {
        if (now_ms() - t0 > JOIN_MS) {
            fprintf(stderr, "detached worker still blocked\n");
            CHECK(0);
        }
        sleep_ms(2);
    }
    CHECK_EQ(j.err, ASYNC_E_CANCELLED);
    async_queue_destroy(q);
}

/* A worker that is not stopped waits as before on the new path: timeouts,
 * and a long hand-off in both directions on capacity-1 queues. */
static void *echo_proc(void *arg) {
    async_queue_t **qs = arg;
    int v;
    size_t n;
    async_queue_t *own = async_queue_create(1, sizeof v, 0);
    CHECK(own);
    CHECK_FAIL(!async_queue_dequeue_wait(own, &v, sizeof v, &n, 10), ASYNC_E_TIMEDOUT);
    enq_int(own, 3);
    CHECK_FAIL(!async_queue_enqueue_wait(own, &v, sizeof v, 10), ASYNC_E_TIMEDOUT);
    async_queue_destroy(own);
    for (;;) {
        if (!async_queue_dequeue_wait(qs[0], &v, sizeof v, &n, -1)) {
            CHECK_ERR(ASYNC_E_CANCELLED);
            return (void *)1;
        }
        CHECK(async_queue_enqueue_wait(qs[1], &v, sizeof v, -1));
    }
}

CASE(stop_handoff) {
    async_queue_t *qs[2];
    qs[0] = async_queue_create(1, sizeof(int), ASYNC_QUEUE_BLOCK_WRITER);
    qs[1] = async_queue_create(1, sizeof(int), ASYNC_QUEUE_BLOCK_WRITER);
    CHECK(qs[0] && qs[1]);
    async_worker_t *w = async_worker_create(echo_proc, qs, 0);
    CHECK(w);
    for (int i = 0; i < 20000; i++) {
        int v;
        size_t n;
        enq_int(qs[0], i);
        CHECK(async_queue_dequeue_wait(qs[1], &v, sizeof v, &n, JOIN_MS));
        CHECK_EQ(v, i);
    }
    async_worker_signal_stop(w);
    CHECK(async_worker_join(w, JOIN_MS));
    CHECK(async_worker_result(w) == (void *)1);
    async_worker_destroy(w);
    async_queue_destroy(qs[0]);
    async_queue_destroy(qs[1]);
}

/* Fibers are not workers: a fiber waiting on the queue is not disturbed by
 * a stop of a worker waiting on the same queue, and gets the next message. */
static _Atomic int fiber_got;

static void fiber_reader(void *arg) {
    async_queue_t *q = arg;
    int v;
    size_t n;
    if (async_queue_dequeue_wait(q, &v, sizeof v, &n, -1)) atomic_store(&fiber_got, v);
    else atomic_store(&fiber_got, -async_last_error());
}

CASE(stop_fiber_unaffected) {
    async_sched_config_t cfg = {1, 0, 0};
    async_sched_t *s = async_sched_create(&cfg);
    if (!s && async_last_error() == ASYNC_E_NOTSUP) {
        printf("no fibers on this platform\n");
        return;
    }
    CHECK(s);
    async_queue_t *q = async_queue_create(4, sizeof(int), 0);
    CHECK(q);
    spawn_until_parked(s, fiber_reader, q, 1);
    async_sched_stats_t st;
    job_t j = {.q = q, .op = OP_DEQ, .timeout_ms = -1};
    async_worker_t *w = start_waiting(&j);
    async_worker_signal_stop(w);
    join_job(w);
    CHECK_EQ(j.err, ASYNC_E_CANCELLED);
    CHECK_EQ(atomic_load(&fiber_got), 0);
    CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
    CHECK_EQ(st.fibers_parked, 1);
    enq_int(q, 42);
    CHECK_EQ(async_sched_shutdown(s, JOIN_MS), 0);
    CHECK_EQ(atomic_load(&fiber_got), 42);
    async_sched_destroy(s);
    async_queue_destroy(q);
}

/* Bad input still gets its own error on a stopped worker (argument checks
 * come first); a plain thread's waits ignore every worker's stop; bad
 * handles to signal_stop are reported, not crashed on. */
static void *bad_proc(void *arg) {
    async_queue_t *q = arg;
    async_worker_t *self = wait_stop_asked();
    int v = 0;
    size_t n;
    CHECK_FAIL(!async_queue_dequeue_wait(q, NULL, 4, &n, -1), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_dequeue_wait(q, &v, sizeof v, &n, -2), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_enqueue_wait(q, NULL, 4, -1), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_enqueue_wait(q, &v, 0, -1), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_enqueue_wait(q, &v, sizeof v, -7), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_dequeue_wait(NULL, &v, sizeof v, &n, -1), ASYNC_E_BADHANDLE);
    CHECK_FAIL(!async_queue_dequeue_wait((async_queue_t *)(uintptr_t)0x1234, &v, sizeof v, &n, -1),
               ASYNC_E_BADHANDLE);
    CHECK_FAIL(!async_queue_enqueue_wait((async_queue_t *)self, &v, sizeof v, -1), ASYNC_E_BADHANDLE);
    CHECK_FAIL(!async_queue_dequeue_wait(q, &v, sizeof v, &n, -1), ASYNC_E_CANCELLED);
    return (void *)1;
}

CASE(stop_bad_input) {
    CHECK_FAIL((async_worker_signal_stop(NULL), 1), ASYNC_E_BADHANDLE);
    CHECK_FAIL((async_worker_signal_stop((async_worker_t *)(uintptr_t)0x4321), 1), ASYNC_E_BADHANDLE);
    async_queue_t *q = async_queue_create(2, sizeof(int), ASYNC_QUEUE_BLOCK_WRITER);
    CHECK(q);
    CHECK_FAIL((async_worker_signal_stop((async_worker_t *)q), 1), ASYNC_E_BADHANDLE);
    async_worker_t *w = async_worker_create(bad_proc, q, 0);
    CHECK(w);
    async_worker_signal_stop(w);
    async_worker_signal_stop(w); /* idempotent */
    CHECK(async_worker_join(w, JOIN_MS));
    CHECK(async_worker_result(w) == (void *)1);
    async_worker_destroy(w);
    /* stopping a destroyed worker */
    CHECK_FAIL((async_worker_signal_stop(w), 1), ASYNC_E_BADHANDLE);
    /* this thread is no worker: a stop anywhere does not end its waits */
    int v;
    size_t n;
    CHECK_FAIL(!async_queue_dequeue_wait(q, &v, sizeof v, &n, 20), ASYNC_E_TIMEDOUT);
    async_queue_destroy(q);
}

/* Not interrupted, by design: async_runtime_wait on the worker's thread. The
 * documented way (async_worker_stop_fd registered with the runtime) wakes it. */
static void *rt_proc(void *arg) {
    (void)arg;
    async_worker_t *self = async_worker_current();
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    int sfd = async_worker_stop_fd(self);
    CHECK(sfd >= 0);
    CHECK_EQ(async_runtime_add(rt, sfd, ASYNC_EVENT_READ, (void *)self), 0);
    io_event_t ev[2];
    int n;
    do n = async_runtime_wait(rt, ev, 2, -1);
    while (n == 0); /* a signal (EINTR) */
    CHECK_EQ(n, 1);
    CHECK(ev[0].fd == (async_fd_t)sfd && (ev[0].event_type & ASYNC_EVENT_READ) && ev[0].context == (void *)self);
    CHECK(async_worker_should_stop(self));
    CHECK_EQ(async_runtime_remove(rt, sfd), 0);
    async_runtime_deinit(rt);
    return (void *)1;
}

CASE(stop_runtime_fd) { // poll
    async_worker_t *w = async_worker_create(rt_proc, NULL, 0);
    CHECK(w);
    sleep_ms(20);
    async_worker_signal_stop(w);
    CHECK(async_worker_join(w, JOIN_MS));
    CHECK(async_worker_result(w) == (void *)1);
    async_worker_destroy(w);
}

TEST_MAIN()
