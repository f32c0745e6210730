/* Wake-ups from plain host threads of a scheduler whose workers all sleep:
 * spawns, channel sends and closes, mutex unlocks, with a fiber parked on a
 * quiet fd, on 1 and 2 workers. Every fiber readied runs; every wait is
 * bounded, so a lost wake-up fails the case instead of hanging it. */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "fibers.h"

/* ---- wake-ups from host threads while every worker sleeps ------------------ */

#define HW_FIBERS 32

typedef struct {
    async_chan_t *ch[HW_FIBERS];
    async_mutex_t *mu;
    atomic_int got;      /* elements the fibers received */
    atomic_int spawned;  /* host-spawned fibers that ran */
    atomic_int locked;   /* mutex lock waits that ended */
    atomic_int closed;   /* recvs that saw their channel closed */
    atomic_int idx;
    async_chan_t *tmp[4 * 400];
} hw_t;

static hw_t hw;

static void hw_recv_fiber(void *arg)
{
    int i = (int)(intptr_t)arg;
    for (;;) {
        int v;
        int r = async_chan_recv(hw.ch[i], &v, -1);
        if (r != 0) {
            CHECK(async_last_error() == ASYNC_E_CLOSED || async_last_error() == ASYNC_E_CANCELLED);
            return;
        }
        atomic_fetch_add(&hw.got, 1);
    }
}

static void hw_spawned(void *arg)
{
    (void)arg;
    atomic_fetch_add(&hw.spawned, 1);
}

static void hw_lock_fiber(void *arg)
{
    (void)arg;
    CHECK_EQ(async_mutex_lock(hw.mu, -1), 0);
    atomic_fetch_add(&hw.locked, 1);
    CHECK_EQ(async_mutex_unlock(hw.mu), 0);
}

static void hw_close_fiber(void *arg)
{
    async_chan_t *c = arg;
    int v;
    CHECK(async_chan_recv(c, &v, -1) != 0);
    CHECK_ERR(ASYNC_E_CLOSED);
    atomic_fetch_add(&hw.closed, 1);
}

/* A fiber parked for ever on an fd that never gets ready: the poller worker
 * sleeps with an fd registered. */
static void hw_fd_fiber(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b;
    ssize_t r = async_fiber_read(fd, &b, 1, -1);
    CHECK(r <= 0);
}

typedef struct {
    async_sched_t *s;
    int id, rounds;
    atomic_int *sent;
} hw_host_t;

/* One host thread: sends, spawns, unlocks, closes, one at a time with the
 * scheduler given time to fall asleep in between (gap) or in bursts. */
static void *hw_host(void *arg)
{
    hw_host_t *h = arg;
    unsigned seed = 1234u + (unsigned)h->id;
    for (int r = 0; r < h->rounds; r++) {
        int kind = rand_r(&seed) % 4;
        if (kind == 0) {
            int i = rand_r(&seed) % HW_FIBERS, v = r;
            CHECK_EQ(async_chan_send(hw.ch[i], &v, BOUND_MS), 0);
            atomic_fetch_add(h->sent, 1);
        } else if (kind == 1) {
            CHECK(async_fiber_spawn(h->s, hw_spawned, NULL, 0) != NULL);
        } else if (kind == 2) {
            int burst = 1 + rand_r(&seed) % 16;
            for (int k = 0; k < burst; k++) {
                int i = rand_r(&seed) % HW_FIBERS, v = k;
                CHECK_EQ(async_chan_send(hw.ch[i], &v, BOUND_MS), 0);
                atomic_fetch_add(h->sent, 1);
            }
        } else {
            async_chan_t *c = async_chan_create(0, sizeof(int));
            CHECK(c != NULL);
            CHECK(async_fiber_spawn(h->s, hw_close_fiber, c, 0) != NULL);
            /* let it park (or not: a close before the recv works too) */
            if (rand_r(&seed) % 2) usleep(300);
            async_chan_close(c);
            hw.tmp[atomic_fetch_add(&hw.idx, 1)] = c; /* destroyed after the scheduler */
        }
        if (rand_r(&seed) % 3 == 0) usleep(100 + rand_r(&seed) % 900); /* the workers fall asleep */
    }
    return NULL;
}

static void host_wake(int nw)
{
    async_sched_t *s = sched_new(nw);
    memset(&hw, 0, sizeof hw);
    for (int i = 0; i < HW_FIBERS; i++) {
        hw.ch[i] = async_chan_create(i % 2 ? 0 : 4, sizeof(int)); /* rendezvous and buffered */
        CHECK(hw.ch[i] != NULL);
        CHECK(async_fiber_spawn(s, hw_recv_fiber, (void *)(intptr_t)i, 0) != NULL);
    }
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    CHECK(async_fiber_spawn(s, hw_fd_fiber, (void *)(intptr_t)sv[0], 0) != NULL);
    hw.mu = async_mutex_create();
    CHECK(hw.mu != NULL);

    /* one at a time from one thread: every step must be seen while the
     * workers sleep */
    atomic_int sent = 0;
    for (int r = 0; r < 300; r++) {
        usleep(r % 3 ? 200 : 2000);
        int k = r % 4;
        if (k == 0) {
            int v = r;
            CHECK_EQ(async_chan_try_send(hw.ch[(r / 4) % HW_FIBERS & ~1], &v) == 0 ||
                         async_chan_send(hw.ch[(r / 4) % HW_FIBERS & ~1], &v, BOUND_MS) == 0,
                     1);
            atomic_fetch_add(&sent, 1);
            wait_count(&hw.got, atomic_load(&sent), "one-at-a-time buffered send");
        } else if (k == 1) {
            int before = atomic_load(&hw.spawned);
            CHECK(async_fiber_spawn(s, hw_spawned, NULL, 0) != NULL);
            wait_count(&hw.spawned, before + 1, "one-at-a-time spawn");
        } else if (k == 2) {
            /* the host owns the mutex; a fiber parks on it; the host's
             * unlock must run it */
            CHECK_EQ(async_mutex_lock(hw.mu, BOUND_MS), 0);
            int before = atomic_load(&hw.locked);
            CHECK(async_fiber_spawn(s, hw_lock_fiber, NULL, 0) != NULL);
            usleep(500);
            CHECK_EQ(async_mutex_unlock(hw.mu), 0);
            wait_count(&hw.locked, before + 1, "one-at-a-time mutex unlock");
        } else {
            async_chan_t *c = async_chan_create(0, sizeof(int));
            CHECK(c != NULL);
            int before = atomic_load(&hw.closed);
            CHECK(async_fiber_spawn(s, hw_close_fiber, c, 0) != NULL);
            usleep(500);
            async_chan_close(c);
            wait_count(&hw.closed, before + 1, "one-at-a-time chan close");
            async_chan_destroy(c);
        }
    }

    /* bursts from four threads at once */
    pthread_t th[4];
    hw_host_t hh[4];
    int rounds = 400;
    for (int i = 0; i < 4; i++) {
        hh[i] = (hw_host_t){s, i, rounds, &sent};
        start_thread(&th[i], hw_host, &hh[i]);
    }
    for (int i = 0; i < 4; i++) join_within(th[i], 120000, "host thread");
    wait_count(&hw.got, atomic_load(&sent), "burst sends");

    sched_finish(s, BOUND_MS);
    for (int i = 0; i < HW_FIBERS; i++) async_chan_destroy(hw.ch[i]);
    for (int i = 0; i < atomic_load(&hw.idx); i++) async_chan_destroy(hw.tmp[i]);
    async_mutex_destroy(hw.mu);
    close_pair(sv);
}

CASE(host_wake_1w) { host_wake(1); } // uring adversarial
CASE(host_wake_2w) { host_wake(2); } // uring adversarial

TEST_MAIN()
