/* async_sched_shutdown at a random moment of a load (fibers on rendezvous
 * and buffered channels fed by a thread, sleepers, pipe readers, queue
 * waiters, spawn+join loops, yielders): every fiber returns, normally or
 * with ASYNC_E_CANCELLED; later spawns fail; no channel element is lost. */
#include "check.h"
#include "rt.h"

#include <pthread.h>
#include <stdatomic.h>

static void nop_fiber(void *a) { (void)a; }

/* --- scheduler shutdown in the middle of a load ------------------------------ */
/*
 * Rounds for about 2 s: 200 fibers of eight kinds (ping and pong on two
 * rendezvous channels, consumers of a buffered channel a thread feeds,
 * sleepers, readers of pipes a thread writes, queue waiters, spawn+join
 * loops, yielders) and a thread feeding them; async_sched_shutdown(s, 10000) after a random
 * 5..100 ms. Checked: shutdown returns 0 (every fiber returned); each fiber
 * ended either normally or on CANCELLED (no other error); spawned = finished;
 * later spawns fail with CANCELLED; every element a send reported as sent was
 * received by a fiber or is still in the channel (drained afterwards).
 */

enum { SD_FIBERS = 200 };

static struct {
    async_sched_t *s;
    async_chan_t *pp[2], *feed;
    async_queue_t *q;
    int pipes[SD_FIBERS / 8][2]; /* one per fd-reading fiber: one reader per fd */
    atomic_int stop, cancelled, other_err;
    _Atomic uint64_t fed, eaten, pp_sent, pp_got;
} sd;

static void sd_end(int rc)
{
    if (rc == 0)
        return;
    if (async_last_error() == ASYNC_E_CANCELLED)
        atomic_fetch_add(&sd.cancelled, 1);
    else {
        fprintf(stderr, "fiber ended on error %d (%s)\n", async_last_error(), async_strerror(async_last_error()));
        atomic_fetch_add(&sd.other_err, 1);
    }
}

static void sd_child(void *a)
{
    (void)a;
    async_fiber_yield();
}

static void sd_fiber(void *a)
{
    int kind = (int)(intptr_t)a % 8, v = 0, rc = 0;
    uint64_t u;
    switch (kind) {
    case 0: /* ping */
    case 1: /* pong */
        for (;;) {
            async_chan_t *in = sd.pp[kind == 0], *out = sd.pp[kind];
            if (kind == 0 || v > 0) {
                if ((rc = async_chan_send(out, &v, -1)) != 0)
                    break;
                atomic_fetch_add(&sd.pp_sent, 1);
            }
            if ((rc = async_chan_recv(in, &v, -1)) != 0)
                break;
            atomic_fetch_add(&sd.pp_got, 1);
            v++;
        }
        break;
    case 2:
        while ((rc = async_chan_recv(sd.feed, &v, -1)) == 0)
            atomic_fetch_add(&sd.eaten, 1);
        break;
    case 3:
        while ((rc = async_fiber_sleep(1 + (uint64_t)(v++ % 5))) == 0) {
        }
        break;
    case 4: {
        char buf[16];
        int fd = sd.pipes[(intptr_t)a / 8][0];
        ssize_t r;
        while ((r = async_fiber_read(fd, buf, sizeof buf, 50)) > 0 || (r < 0 && async_last_error() == ASYNC_E_TIMEDOUT)) {
        }
        rc = r < 0 ? -1 : 0;
        break;
    }
    case 5:
        while ((rc = async_queue_dequeue_wait(sd.q, &u, sizeof u, NULL, 20) ? 0 : -1) == 0 ||
               async_last_error() == ASYNC_E_TIMEDOUT) {
        }
        break;
    case 6: {
        async_fiber_t *f;
        while ((f = async_fiber_spawn(sd.s, sd_child, NULL, ASYNC_FIBER_JOINABLE)) != NULL)
            if ((rc = async_fiber_join(f, -1)) != 0)
                break;
        if (f == NULL)
            rc = -1;
        break;
    }
    default:
        for (v = 0; v < 200000; v++) {
            async_fiber_yield();
            if (async_fiber_sleep(0) != 0) {
                rc = -1;
                break;
            }
        }
        break;
    }
    sd_end(rc);
}

static void *sd_feeder(void *a)
{
    int v = 0;
    uint64_t u = 0;
    (void)a;
    while (!atomic_load(&sd.stop)) {
        int i;
        if (async_chan_send(sd.feed, &v, 2) == 0)
            atomic_fetch_add(&sd.fed, 1);
        CHECK(async_queue_enqueue(sd.q, &u, sizeof u)); /* DROP_OLDEST: never blocks */
        for (i = 0; i < SD_FIBERS / 8; i++)
            if (write(sd.pipes[i][1], "p", 1) < 0)
                CHECK(errno == EAGAIN);
        sleep_ms(1);
    }
    return NULL;
}

CASE(fiber_shutdown_mid_load)
{
    double deadline;
    int rounds = 0;
    seed("fiber_shutdown_mid_load");
    deadline = now_ms() + 2000;
    for (int i = 0; i < SD_FIBERS / 8; i++)
        CHECK(pipe2(sd.pipes[i], O_NONBLOCK | O_CLOEXEC) == 0);
    do {
        async_sched_config_t cfg = {2, 32 * 1024, 0};
        async_sched_stats_t st;
        pthread_t feeder;
        int i, v;
        sd.s = async_sched_create(&cfg);
        sd.pp[0] = async_chan_create(0, sizeof(int));
        sd.pp[1] = async_chan_create(0, sizeof(int));
        sd.feed = async_chan_create(8, sizeof(int));
        sd.q = async_queue_create(8, sizeof(uint64_t), ASYNC_QUEUE_DROP_OLDEST);
        CHECK(sd.s && sd.pp[0] && sd.pp[1] && sd.feed && sd.q);
        atomic_store(&sd.stop, 0);
        atomic_store(&sd.fed, 0);
        atomic_store(&sd.eaten, 0);
        atomic_store(&sd.pp_sent, 0);
        atomic_store(&sd.pp_got, 0);
        start_thread(&feeder, sd_feeder, NULL);
        for (i = 0; i < SD_FIBERS; i++)
            CHECK(async_fiber_spawn(sd.s, sd_fiber, (void *)(intptr_t)i, 0));
        sleep_ms(5 + (int)rnd(95));
        CHECK_EQ(async_sched_shutdown(sd.s, 10000), 0);
        CHECK_FAIL(async_fiber_spawn(sd.s, nop_fiber, NULL, 0) == NULL, ASYNC_E_CANCELLED);
        CHECK_EQ(async_sched_run(sd.s), 0);
        CHECK_EQ(async_sched_get_stats(sd.s, &st, NULL, 0), 0);
        CHECK_EQ(st.fibers_spawned, st.fibers_finished);
        CHECK_EQ(st.fibers_runnable + st.fibers_running + st.fibers_parked, 0);
        atomic_store(&sd.stop, 1);
        join_within(feeder, 10000, "the feeder");
        /* what was sent was received, or is still there */
        while (async_chan_try_recv(sd.feed, &v) == 0)
            atomic_fetch_add(&sd.eaten, 1);
        CHECK_EQ(atomic_load(&sd.eaten), atomic_load(&sd.fed));
        CHECK_EQ(atomic_load(&sd.pp_got), atomic_load(&sd.pp_sent)); /* rendezvous: a completed send was taken */
        async_sched_destroy(sd.s);
        async_chan_destroy(sd.pp[0]);
        async_chan_destroy(sd.pp[1]);
        async_chan_destroy(sd.feed);
        async_queue_destroy(sd.q);
        rounds++;
    } while (now_ms() < deadline);
    printf("fiber_shutdown_mid_load: %d rounds, %d parked calls cancelled\n", rounds, atomic_load(&sd.cancelled));
    CHECK_EQ(atomic_load(&sd.other_err), 0);
    CHECK(atomic_load(&sd.cancelled) > 0);
    for (int i = 0; i < SD_FIBERS / 8; i++) {
        close_pair(sd.pipes[i]);
    }
}

TEST_MAIN()
