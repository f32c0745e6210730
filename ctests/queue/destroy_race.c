/* async_queue_destroy racing readers and writers blocked in the queue's
 * waits (threads, and fibers whose waits park): every blocked call returns
 * false with ASYNC_E_CLOSED (ASYNC_E_BADHANDLE if it began after the
 * destroy) within 10 s, none hangs. */
#include "check.h"
#include "proc.h"
#include "rt.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/syscall.h>

/* --- queue destroy racing blocked readers and writers ---------------------- */
/*
 * Rounds for about 2 s of three kinds: readers blocked on an empty queue,
 * writers blocked on a full BLOCK_WRITER queue, or both sides busy; 4
 * readers and 4 writers are threads, 2 more are fibers (their queue waits
 * park). The queue is destroyed after a random delay. Checked: every blocked
 * call returns false with CLOSED (or BADHANDLE if it started after the
 * destroy) within 10 s; in the first two kinds, where everyone is surely
 * blocked (these use no timeouts), CLOSED exactly.
 */

enum { QD_READERS = 4, QD_WRITERS = 4 };

static struct {
    async_queue_t *q;
    int kind; /* 0: readers only, 1: writers only, 2: both */
    atomic_int closed, badhandle, blocked_ok;
    atomic_int tids[QD_READERS + QD_WRITERS], ntids;
} qd;

/* Waits until every reader/writer thread has been asleep for 3 samples in a
 * row: then each is blocked in its queue call (nothing else sleeps). */
static void qd_wait_all_asleep(int nthreads)
{
    double t0 = now_ms();
    int streak = 0;
    while (streak < 3) {
        int i, asleep = atomic_load(&qd.ntids) == nthreads;
        for (i = 0; asleep && i < nthreads; i++)
            asleep = thread_asleep(atomic_load(&qd.tids[i]));
        streak = asleep ? streak + 1 : 0;
        CHECK(now_ms() - t0 < 10000);
        sleep_ms(5);
    }
}

static void qd_register_thread(void)
{
    int i = atomic_fetch_add(&qd.ntids, 1);
    atomic_store(&qd.tids[i], (int)gettid());
}

static void qd_note(const char *who)
{
    int e = async_last_error();
    if (qd.kind != 2 && e != ASYNC_E_CLOSED)
        fprintf(stderr, "round kind %d: a blocked %s got %d (%s)\n", qd.kind, who, e, async_strerror(e));
    if (e == ASYNC_E_CLOSED)
        atomic_fetch_add(&qd.closed, 1);
    else if (e == ASYNC_E_BADHANDLE)
        atomic_fetch_add(&qd.badhandle, 1);
    else {
        fprintf(stderr, "queue call failed with %d (%s)\n", e, async_strerror(e));
        CHECK(!"CLOSED or BADHANDLE");
    }
}

static void qd_read_loop(void)
{
    uint64_t v;
    uint32_t rs = (uint32_t)(uintptr_t)&v;
    for (;;) {
        int to = qd.kind != 2 || rnd_r(&rs, 2) ? -1 : 1 + (int)rnd_r(&rs, 5);
        if (async_queue_dequeue_wait(qd.q, &v, sizeof v, NULL, to)) {
            atomic_fetch_add(&qd.blocked_ok, 1);
            continue;
        }
        if (async_last_error() == ASYNC_E_TIMEDOUT)
            continue;
        qd_note(async_fiber_current() ? "reader fiber" : "reader thread");
        return;
    }
}

static void qd_write_loop(void)
{
    uint64_t v = 1;
    uint32_t rs = (uint32_t)(uintptr_t)&v;
    for (;;) {
        bool ok = rnd_r(&rs, 2) ? async_queue_enqueue(qd.q, &v, sizeof v)
                                : async_queue_enqueue_wait(qd.q, &v, sizeof v, qd.kind != 2 || rnd_r(&rs, 2) ? -1 : 3);
        if (ok)
            continue;
        if (async_last_error() == ASYNC_E_TIMEDOUT)
            continue;
        qd_note(async_fiber_current() ? "writer fiber" : "writer thread");
        return;
    }
}

static void *qd_reader(void *a)
{
    (void)a;
    qd_register_thread();
    qd_read_loop();
    return NULL;
}

static void *qd_writer(void *a)
{
    (void)a;
    qd_register_thread();
    qd_write_loop();
    return NULL;
}

static void qd_fiber(void *a)
{
    if ((intptr_t)a == 0)
        qd_read_loop();
    else
        qd_write_loop();
}

CASE(destroy_race)
{
    async_sched_config_t cfg = {2, 0, 0};
    async_sched_t *s = async_sched_create(&cfg);
    double deadline;
    int rounds = 0, i;
    seed("queue_destroy_race");
    CHECK(s != NULL);
    deadline = now_ms() + 2000;
    do {
        pthread_t rd[QD_READERS], wr[QD_WRITERS];
        async_fiber_t *f[2];
        int nr, nw, nf = 0, expect;
        qd.kind = rounds % 3;
        qd.q = async_queue_create(1 + rnd(4), sizeof(uint64_t), ASYNC_QUEUE_BLOCK_WRITER);
        CHECK(qd.q != NULL);
        atomic_store(&qd.closed, 0);
        atomic_store(&qd.badhandle, 0);
        atomic_store(&qd.ntids, 0);
        nr = qd.kind == 1 ? 0 : QD_READERS;
        nw = qd.kind == 0 ? 0 : QD_WRITERS;
        for (i = 0; i < nr; i++)
            start_thread(&rd[i], qd_reader, NULL);
        for (i = 0; i < nw; i++)
            start_thread(&wr[i], qd_writer, NULL);
        if (qd.kind != 1)
            CHECK((f[nf++] = async_fiber_spawn(s, qd_fiber, (void *)0, ASYNC_FIBER_JOINABLE)) != NULL);
        if (qd.kind != 0)
            CHECK((f[nf++] = async_fiber_spawn(s, qd_fiber, (void *)1, ASYNC_FIBER_JOINABLE)) != NULL);
        if (qd.kind != 2) {
            /* make sure every caller is blocked: the fibers parked, the threads asleep */
            async_sched_stats_t st;
            double t0 = now_ms();
            do {
                CHECK(now_ms() - t0 < 10000);
                sleep_ms(5);
                CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
            } while (st.fibers_parked < (size_t)nf);
            qd_wait_all_asleep(nr + nw);
        } else {
            sleep_ms((int)rnd(20));
        }
        async_queue_destroy(qd.q);
        for (i = 0; i < nr; i++)
            join_within(rd[i], 10000, "a reader blocked on the destroyed queue");
        for (i = 0; i < nw; i++)
            join_within(wr[i], 10000, "a writer blocked on the destroyed queue");
        for (i = 0; i < nf; i++)
            CHECK_EQ(async_fiber_join(f[i], 10000), 0);
        expect = nr + nw + nf;
        CHECK_EQ(atomic_load(&qd.closed) + atomic_load(&qd.badhandle), expect);
        if (qd.kind != 2) /* everyone was surely blocked (no timeouts in these kinds) */
            CHECK_EQ(atomic_load(&qd.closed), expect);
        rounds++;
    } while (now_ms() < deadline);
    printf("queue_destroy_race: %d rounds, %d messages passed\n", rounds, atomic_load(&qd.blocked_ok));
    async_sched_destroy(s);
}

TEST_MAIN()
