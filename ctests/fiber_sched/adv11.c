/* test_adv11.c — adversarial pass 11: the fiber scheduler as include/async.h
 * promises it, driven from plain host threads: wake-ups of a scheduler whose
 * workers all sleep (spawns, channel sends and closes, mutex unlocks from
 * host threads), bursts of fds becoming ready at once (owned and plain),
 * async_fiber_close and fd-number reuse while fibers are parked, pending
 * pthread cancels in calls that must not be cancellation points, and
 * shutdown/destroy racing all of it. See docs/RELIABILITY.md, "Adversarial
 * pass 11". Every case also runs with ASYNC_FIBER_IO=uring. No assertion is
 * timed: every wait is bounded so that a lost wake-up fails the case instead
 * of hanging it. */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "check.h"

#define BOUND_MS 20000

#if !defined(MSG_NOSIGNAL)
#define MSG_NOSIGNAL 0 /* darwin: the peers stay open while the writers run */
#endif

/* Waits (bounded) until *v >= target; fails with what otherwise. */
static void wait_count(atomic_int *v, int target, const char *what)
{
    double t0 = now_ms();
    while (atomic_load(v) < target) {
        if (now_ms() - t0 > BOUND_MS) {
            fprintf(stderr, "%s: %d of %d after %d ms (a lost wake-up?)\n", what, atomic_load(v), target, BOUND_MS);
            CHECK(atomic_load(v) >= target);
        }
        usleep(200);
    }
}


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

    CHECK_EQ(async_sched_shutdown(s, BOUND_MS), 0);
    async_sched_destroy(s);
    for (int i = 0; i < HW_FIBERS; i++) async_chan_destroy(hw.ch[i]);
    for (int i = 0; i < atomic_load(&hw.idx); i++) async_chan_destroy(hw.tmp[i]);
    async_mutex_destroy(hw.mu);
    close(sv[0]);
    close(sv[1]);
}

static void t_host_wake_1w(void) { host_wake(1); }
static void t_host_wake_2w(void) { host_wake(2); }

/* ---- hundreds of fds ready at once ----------------------------------------- */

#define FB_N 256
#define FB_ROUNDS 20

static int fb_sv[FB_N][2];
static atomic_int fb_done, fb_exited;

static void fb_fiber(void *arg)
{
    int i = (int)(intptr_t)arg;
    int fd = fb_sv[i][1];
    for (int r = 0;; r++) {
        char b = 0;
        ssize_t n = async_fiber_read(fd, &b, 1, BOUND_MS);
        if (n == 0) break; /* the host shut its side down */
        if (n != 1) fprintf(stderr, "fiber %d round %d: read %zd err %d\n", i, r, n, async_last_error());
        CHECK_EQ(n, 1);
        CHECK_EQ(b, (char)r);
        CHECK_EQ(async_fiber_write(fd, &b, 1, BOUND_MS), 1);
        atomic_fetch_add(&fb_done, 1);
    }
    CHECK_EQ(async_fiber_close(fd), 0);
    atomic_fetch_add(&fb_exited, 1);
}

static void fd_burst(int nw)
{
    raise_nofile(4 * FB_N + 64);
    async_sched_t *s = sched_new(nw);
    atomic_store(&fb_done, 0);
    atomic_store(&fb_exited, 0);
    for (int i = 0; i < FB_N; i++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fb_sv[i]), 0);
        if (i % 2) CHECK_EQ(async_fiber_fd_open(s, fb_sv[i][1]), 0); /* half owned */
        CHECK(async_fiber_spawn(s, fb_fiber, (void *)(intptr_t)i, 0) != NULL);
    }
    for (int r = 0; r < FB_ROUNDS; r++) {
        if (r % 2) usleep(2000); /* asleep in the poller, or not yet */
        char b = (char)r;
        for (int i = 0; i < FB_N; i++) CHECK_EQ(write(fb_sv[i][0], &b, 1), 1);
        wait_count(&fb_done, (r + 1) * FB_N, "fd burst");
        for (int i = 0; i < FB_N; i++) {
            struct pollfd p = {fb_sv[i][0], POLLIN, 0};
            CHECK_EQ(poll(&p, 1, BOUND_MS), 1);
            char c;
            CHECK_EQ(read(fb_sv[i][0], &c, 1), 1);
            CHECK_EQ(c, b);
        }
    }
    for (int i = 0; i < FB_N; i++) CHECK_EQ(shutdown(fb_sv[i][0], SHUT_WR), 0);
    wait_count(&fb_exited, FB_N, "fibers that saw end of file");
    CHECK_EQ(async_sched_shutdown(s, BOUND_MS), 0);
    async_sched_destroy(s);
    for (int i = 0; i < FB_N; i++) close(fb_sv[i][0]);
}

static void t_fd_burst_1w(void) { fd_burst(1); }
static void t_fd_burst_2w(void) { fd_burst(2); }

/* ---- async_fiber_close of parked owned fds during a burst; numbers reused ---- */

#define CP_N 128

static int cp_owned[CP_N][2], cp_plain[CP_N][2];
static atomic_int cp_closed, cp_data, cp_other;

static void cp_owned_fiber(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b;
    ssize_t n = async_fiber_read(fd, &b, 1, -1); /* only the close can end it */
    if (n == -1 && async_last_error() == ASYNC_E_CLOSED)
        atomic_fetch_add(&cp_closed, 1);
    else {
        fprintf(stderr, "owned read after async_fiber_close: %zd err %d\n", n, async_last_error());
        atomic_fetch_add(&cp_other, 1);
    }
}

static void cp_plain_fiber(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b;
    ssize_t n = async_fiber_read(fd, &b, 1, BOUND_MS);
    if (n == 1)
        atomic_fetch_add(&cp_data, 1);
    else {
        fprintf(stderr, "plain read: %zd err %d\n", n, async_last_error());
        atomic_fetch_add(&cp_other, 1);
    }
}

static void *cp_closer(void *arg)
{
    (void)arg;
    for (int i = 0; i < CP_N; i++) CHECK_EQ(async_fiber_close(cp_owned[i][1]), 0);
    return NULL;
}

static void *cp_writer(void *arg)
{
    (void)arg;
    for (int i = 0; i < CP_N; i++) CHECK_EQ(write(cp_plain[i][0], "x", 1), 1);
    return NULL;
}

/* The new owner of a reused number: a fiber reads it, the host writes. */
static atomic_int cp_new_got;
static void cp_new_fiber(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b;
    ssize_t n = async_fiber_read(fd, &b, 1, BOUND_MS);
    if (n != 1) fprintf(stderr, "read on the reused number %d: %zd err %d\n", fd, n, async_last_error());
    CHECK_EQ(n, 1);
    atomic_fetch_add(&cp_new_got, 1);
    CHECK_EQ(async_fiber_close(fd), 0);
}

static void close_parked(int nw)
{
    raise_nofile(8 * CP_N + 64);
    async_sched_t *s = sched_new(nw);
    for (int round = 0; round < 5; round++) {
        atomic_store(&cp_closed, 0);
        atomic_store(&cp_data, 0);
        atomic_store(&cp_other, 0);
        atomic_store(&cp_new_got, 0);
        for (int i = 0; i < CP_N; i++) {
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, cp_owned[i]), 0);
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, cp_plain[i]), 0);
            CHECK_EQ(async_fiber_fd_open(s, cp_owned[i][1]), 0);
            CHECK(async_fiber_spawn(s, cp_owned_fiber, (void *)(intptr_t)cp_owned[i][1], 0) != NULL);
            CHECK(async_fiber_spawn(s, cp_plain_fiber, (void *)(intptr_t)cp_plain[i][1], 0) != NULL);
        }
        sched_wait_parked(s, 2 * CP_N);
        pthread_t a, b;
        start_thread(&a, cp_closer, NULL);
        start_thread(&b, cp_writer, NULL);
        join_within(a, BOUND_MS, "closer");
        join_within(b, BOUND_MS, "writer");
        /* the closed numbers come back at once: owned by s again, read by
         * new fibers */
        int nsv[CP_N][2];
        for (int i = 0; i < CP_N; i++) {
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, nsv[i]), 0);
            if (round % 2 == 0) CHECK_EQ(async_fiber_fd_open(s, nsv[i][1]), 0); /* odd rounds: plain */
            CHECK(async_fiber_spawn(s, cp_new_fiber, (void *)(intptr_t)nsv[i][1], 0) != NULL);
        }
        for (int i = 0; i < CP_N; i++) CHECK_EQ(write(nsv[i][0], "y", 1), 1);
        wait_count(&cp_closed, CP_N, "owned reads ended by async_fiber_close");
        wait_count(&cp_data, CP_N, "plain reads");
        wait_count(&cp_new_got, CP_N, "reads on reused numbers");
        CHECK_EQ(atomic_load(&cp_other), 0);
        for (int i = 0; i < CP_N; i++) {
            close(cp_owned[i][0]);
            close(cp_plain[i][0]);
            close(cp_plain[i][1]);
            close(nsv[i][0]);
        }
    }
    CHECK_EQ(async_sched_shutdown(s, BOUND_MS), 0);
    async_sched_destroy(s);
}

static void t_close_parked_1w(void) { close_parked(1); }
static void t_close_parked_2w(void) { close_parked(2); }

/* ---- a plain fd closed with close(2) and its number reused while parked ---- */

static atomic_int rp_ended;

static void rp_fiber(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b[8];
    /* timeout_ms is always honoured, also when the number was closed and
     * reused: whatever the result, the call ends */
    (void)async_fiber_read(fd, b, sizeof b, 50);
    atomic_fetch_add(&rp_ended, 1);
}

static void t_reuse_parked(void)
{
    async_sched_t *s = sched_new(2);
    atomic_store(&rp_ended, 0);
    for (int r = 0; r < 200; r++) {
        int sv[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        CHECK(async_fiber_spawn(s, rp_fiber, (void *)(intptr_t)sv[1], 0) != NULL);
        if (r % 2) usleep(200);
        close(sv[1]);
        int nv[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, nv), 0); /* likely takes sv[1]'s number */
        if (r % 3 == 0) CHECK_EQ(write(nv[0], "z", 1), 1);
        wait_count(&rp_ended, r + 1, "read parked on a reused number");
        close(sv[0]);
        close(nv[0]);
        close(nv[1]);
    }
    CHECK_EQ(async_sched_shutdown(s, BOUND_MS), 0);
    async_sched_destroy(s);
}

/* ---- pending cancels in calls that are no cancellation points ---------------- */

static atomic_int cx_ran;
static async_sched_t *cx_s;

static void cx_fiber(void *arg)
{
    (void)arg;
    atomic_fetch_add(&cx_ran, 1);
}

typedef struct {
    const char *what;
    void (*call)(void);
    atomic_int done; /* the call returned */
} cx_t;

/* Runs one call on a fresh thread whose deferred cancel is pending: the
 * call must return (the cancel acts at pthread_testcancel after it). */
static void *cx_thread(void *arg)
{
    cx_t *c = arg;
    int old;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &old);
    c->call();
    atomic_store(&c->done, 1);
    pthread_testcancel();
    atomic_store(&c->done, -1); /* not reached */
    return NULL;
}

static void cx_create(void)
{
    async_sched_config_t cfg = {0, 0, 0}; /* the default worker count: reads the cgroup quota */
    cx_s = async_sched_create(&cfg);
    CHECK(cx_s != NULL);
}

static async_fiber_t *cx_f;
static void cx_spawn(void)
{
    cx_f = async_fiber_spawn(cx_s, cx_fiber, NULL, ASYNC_FIBER_JOINABLE); /* the first stacks */
    CHECK(cx_f != NULL);
}

static async_sched_t *cx_s2; /* guard mode 2: mprotect guards, budget read at the first spawn */
static async_fiber_t *cx_f2;
static void cx_spawn_mprotect(void)
{
    async_sched_config_t cfg2 = {1, 0, 2};
    cx_s2 = async_sched_create(&cfg2); /* its first stack arena */
    CHECK(cx_s2 != NULL);
    cx_f2 = async_fiber_spawn(cx_s2, cx_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(cx_f2 != NULL);
}

static void cx_chan(void)
{
    async_chan_t *c = async_chan_create(2, sizeof(int));
    CHECK(c != NULL);
    int v = 7;
    CHECK_EQ(async_chan_try_send(c, &v), 0);
    CHECK_EQ(async_chan_try_recv(c, &v), 0);
    CHECK(async_chan_try_recv(c, &v) != 0);
    async_chan_close(c);
    async_chan_destroy(c);
    async_mutex_t *m = async_mutex_create();
    CHECK(m != NULL);
    CHECK_EQ(async_mutex_trylock(m), 0);
    CHECK_EQ(async_mutex_unlock(m), 0);
    async_mutex_destroy(m);
    async_sched_stats_t st;
    CHECK_EQ(async_sched_get_stats(cx_s, &st, NULL, 0), 0);
}

static int cx_pipe[2];
static void cx_dump(void) { CHECK(async_sched_dump(cx_s, cx_pipe[1]) >= 0); }

static int cx_sv[2];
static void cx_close(void)
{
    CHECK_EQ(async_fiber_fd_open(cx_s, cx_sv[0]), 0);
    CHECK_EQ(async_fiber_close(cx_sv[0]), 0); /* owned */
    CHECK_EQ(async_fiber_close(cx_sv[1]), 0); /* plain: just close(2) */
}

static int cx_rp[2], cx_ep[2]; /* a readable pipe, an empty one (made by the main thread) */
static void cx_wait0(void)
{
    CHECK_FAIL(async_fiber_wait_fd(cx_ep[0], ASYNC_EVENT_READ, 0) < 0, ASYNC_E_TIMEDOUT); /* not ready */
    CHECK(async_fiber_wait_fd(cx_rp[0], ASYNC_EVENT_READ, 0) & ASYNC_EVENT_READ);       /* ready */
}

static void cx_join(void) { CHECK_EQ(async_fiber_join(cx_f, BOUND_MS), 0); }
static void cx_destroy(void)
{
    CHECK_EQ(async_sched_shutdown(cx_s, BOUND_MS), 0);
    async_sched_destroy(cx_s);
}

static void t_cancel_fiber_calls(void)
{
    static cx_t calls[] = {
        {"async_sched_create", cx_create, 0},
        {"async_fiber_spawn", cx_spawn, 0},
        {"async_sched_create and async_fiber_spawn (guard mode 2)", cx_spawn_mprotect, 0},
        {"channel, mutex and stats calls", cx_chan, 0},
        {"async_sched_dump", cx_dump, 0},
        {"async_fiber_close", cx_close, 0},
        {"async_fiber_wait_fd with timeout 0 on a plain thread", cx_wait0, 0},
        {"async_fiber_join", cx_join, 0},
        {"async_sched_shutdown and _destroy", cx_destroy, 0},
    };
    CHECK_EQ(pipe(cx_pipe), 0);
    CHECK_EQ(pipe(cx_rp), 0);
    CHECK_EQ(pipe(cx_ep), 0);
    CHECK_EQ(write(cx_rp[1], "r", 1), 1);
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, cx_sv), 0);
    int bad = 0;
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        pthread_t th;
        start_thread(&th, cx_thread, &calls[i]);
        join_within(th, 60000, calls[i].what);
        if (atomic_load(&calls[i].done) != 1) {
            fprintf(stderr, "the pending cancel acted inside %s\n", calls[i].what);
            bad++;
            if (i == 0) cx_create(); /* a scheduler for the other calls (made here, no cancel pending) */
        }
    }
    if (cx_f2) CHECK_EQ(async_fiber_join(cx_f2, BOUND_MS), 0);
    if (cx_s2) async_sched_destroy(cx_s2);
    CHECK_EQ(bad, 0);
    CHECK_EQ(atomic_load(&cx_ran), 2);
    /* the fds are closed: no cancel acted before close(2) did its work */
    errno = 0;
    CHECK(fcntl(cx_sv[0], F_GETFD) == -1 && errno == EBADF);
    errno = 0;
    CHECK(fcntl(cx_sv[1], F_GETFD) == -1 && errno == EBADF);
    close(cx_pipe[0]);
    close(cx_pipe[1]);
    for (int i = 0; i < 2; i++) {
        close(cx_rp[i]);
        close(cx_ep[i]);
    }
}

/* ---- the dump-on-signal handler on a thread whose cancel is pending --------- */

static atomic_int cds_done;
static void *cds_thread(void *arg)
{
    (void)arg;
    int old;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &old);
    /* the handler runs here, on this thread, and writes the dump */
    CHECK_EQ(pthread_kill(pthread_self(), SIGUSR1), 0);
    atomic_store(&cds_done, 1);
    pthread_testcancel();
    atomic_store(&cds_done, -1);
    return NULL;
}

static void cds_parked(void *arg)
{
    int v;
    (void)async_chan_recv(arg, &v, -1);
}

static void *cds_destroy(void *arg)
{
    async_sched_destroy(arg);
    return NULL;
}

static size_t cds_drain(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 200) != 1) break;
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
        if (n >= cap - 1) break;
    }
    buf[n] = 0;
    return n;
}

static void t_cancel_dump_signal(void)
{
    async_sched_t *s = sched_new(1);
    async_chan_t *c = async_chan_create(0, sizeof(int));
    CHECK(c != NULL);
    CHECK(async_fiber_spawn(s, cds_parked, c, 0) != NULL);
    sched_wait_parked(s, 1);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(async_sched_dump_on_signal(s, SIGUSR1, p[1]), 0);
    pthread_t th;
    start_thread(&th, cds_thread, NULL);
    join_within(th, BOUND_MS, "thread that raised the dump signal");
    if (atomic_load(&cds_done) != 1) fprintf(stderr, "the pending cancel acted inside the dump's signal handler\n");
    CHECK_EQ(atomic_load(&cds_done), 1);
    static char buf[65536];
    CHECK(cds_drain(p[0], buf, sizeof buf) > 0);
    /* a second dump works (the first one did not stay "running") */
    CHECK_EQ(pthread_kill(pthread_self(), SIGUSR1), 0);
    cds_drain(p[0], buf, sizeof buf);
    if (strstr(buf, "already running")) fprintf(stderr, "second dump: %s\n", buf);
    CHECK(strstr(buf, "already running") == NULL);
    CHECK(strstr(buf, "fiber") != NULL);
    async_chan_close(c);
    start_thread(&th, cds_destroy, s); /* unregisters the dump: waits for the handlers */
    join_within(th, BOUND_MS, "async_sched_destroy");
    async_chan_destroy(c);
    close(p[0]);
    close(p[1]);
}

/* ---- destroy racing host-thread wake-ups, spawns and closes ------------------- */

typedef struct {
    async_sched_t *s;
    async_chan_t *c;
    int devnull;
    atomic_int stop;
} dr_t;

static void dr_fiber(void *arg)
{
    dr_t *d = arg;
    int v;
    while (async_chan_recv(d->c, &v, 1000) == 0 || async_last_error() == ASYNC_E_TIMEDOUT) {
    }
}

static void dr_fd_fiber(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b;
    (void)async_fiber_read(fd, &b, 1, 1000);
}

static void *dr_host(void *arg)
{
    dr_t *d = arg;
    unsigned seed = (unsigned)(uintptr_t)pthread_self();
    while (!atomic_load(&d->stop)) {
        int v = 1;
        switch (rand_r(&seed) % 4) {
        case 3: {
            /* a dump racing the parks, wake-ups and the destroy */
            int r = async_sched_dump(d->s, d->devnull);
            if (r < 0) CHECK_ERR(ASYNC_E_BADHANDLE);
            async_sched_stats_t st;
            if (async_sched_get_stats(d->s, &st, NULL, 0) != 0) CHECK_ERR(ASYNC_E_BADHANDLE);
            break;
        }
        case 0:
            (void)async_chan_try_send(d->c, &v);
            break;
        case 1: {
            async_fiber_t *f = async_fiber_spawn(d->s, dr_fiber, d, 0);
            if (!f) {
                int e = async_last_error();
                CHECK(e == ASYNC_E_CANCELLED || e == ASYNC_E_BADHANDLE);
            }
            break;
        }
        default: {
            int sv[2];
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
            int owned = async_fiber_fd_open(d->s, sv[1]) == 0;
            async_fiber_t *f = async_fiber_spawn(d->s, dr_fd_fiber, (void *)(intptr_t)sv[1], 0);
            (void)f;
            (void)write(sv[0], "q", 1);
            (void)owned;
            /* the fiber may still be parked on it: async_fiber_close wakes it */
            CHECK_EQ(async_fiber_close(sv[1]), 0);
            close(sv[0]);
        }
        }
    }
    return NULL;
}

static void t_destroy_race(void)
{
    for (int round = 0; round < 30; round++) {
        dr_t d;
        d.s = sched_new(1 + round % 2);
        d.c = async_chan_create(8, sizeof(int));
        CHECK(d.c != NULL);
        atomic_store(&d.stop, 0);
        d.devnull = open("/dev/null", O_WRONLY);
        CHECK(d.devnull >= 0);
        for (int i = 0; i < 8; i++) CHECK(async_fiber_spawn(d.s, dr_fiber, &d, 0) != NULL);
        pthread_t th[3];
        for (int i = 0; i < 3; i++) start_thread(&th[i], dr_host, &d);
        usleep(5000 + 1000 * (round % 7));
        async_chan_close(d.c); /* dr_fiber loops end */
        async_sched_destroy(d.s);
        atomic_store(&d.stop, 1);
        for (int i = 0; i < 3; i++) join_within(th[i], BOUND_MS, "host thread");
        async_chan_destroy(d.c);
        close(d.devnull);
    }
}

/* ---- reads racing their timeouts: no byte lost, none duplicated ------------- */

#define TR_N 24
#define TR_BYTES 3000

static int tr_sv[TR_N][2];
static atomic_int tr_finished, tr_bad;

static void tr_fiber(void *arg)
{
    int i = (int)(intptr_t)arg;
    int fd = tr_sv[i][1];
    unsigned seed = (unsigned)i * 7919u + 1;
    unsigned char want = 0;
    int got = 0;
    while (got < TR_BYTES) {
        unsigned char b[64];
        size_t n = 1 + rand_r(&seed) % sizeof b;
        ssize_t r = async_fiber_read(fd, b, n, 1 + rand_r(&seed) % 3);
        if (r < 0) {
            if (async_last_error() == ASYNC_E_TIMEDOUT) continue;
            fprintf(stderr, "fiber %d: read failed with %d after %d bytes\n", i, async_last_error(), got);
            atomic_fetch_add(&tr_bad, 1);
            break;
        }
        if (r == 0) {
            fprintf(stderr, "fiber %d: end of file after %d bytes\n", i, got);
            atomic_fetch_add(&tr_bad, 1);
            break;
        }
        for (ssize_t k = 0; k < r; k++) {
            if (b[k] != want) {
                fprintf(stderr, "fiber %d: byte %d is %u, expected %u (lost or duplicated)\n", i, got, b[k], want);
                atomic_fetch_add(&tr_bad, 1);
                atomic_fetch_add(&tr_finished, 1);
                return;
            }
            want++;
            got++;
        }
    }
    atomic_fetch_add(&tr_finished, 1);
}

static void *tr_writer(void *arg)
{
    int half = (int)(intptr_t)arg;
    unsigned seed = 99u + (unsigned)half;
    int off[TR_N] = {0};
    for (int done = 0; done < TR_N / 2;) {
        done = 0;
        for (int j = 0; j < TR_N / 2; j++) {
            int i = half * (TR_N / 2) + j;
            if (off[i - half * (TR_N / 2)] >= TR_BYTES) {
                done++;
                continue;
            }
            int o = off[i - half * (TR_N / 2)];
            int n = 1 + rand_r(&seed) % 40;
            if (n > TR_BYTES - o) n = TR_BYTES - o;
            unsigned char b[64];
            for (int k = 0; k < n; k++) b[k] = (unsigned char)(o + k);
            CHECK_EQ(write(tr_sv[i][0], b, (size_t)n), n);
            off[i - half * (TR_N / 2)] += n;
        }
        if (rand_r(&seed) % 4 == 0) usleep(rand_r(&seed) % 3000);
    }
    return NULL;
}

static void timeout_race(int nw)
{
    async_sched_t *s = sched_new(nw);
    atomic_store(&tr_finished, 0);
    atomic_store(&tr_bad, 0);
    for (int i = 0; i < TR_N; i++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, tr_sv[i]), 0);
        if (i % 3 == 0) CHECK_EQ(async_fiber_fd_open(s, tr_sv[i][1]), 0);
        CHECK(async_fiber_spawn(s, tr_fiber, (void *)(intptr_t)i, 0) != NULL);
    }
    pthread_t a, b;
    start_thread(&a, tr_writer, (void *)(intptr_t)0);
    start_thread(&b, tr_writer, (void *)(intptr_t)1);
    join_within(a, 120000, "writer");
    join_within(b, 120000, "writer");
    wait_count(&tr_finished, TR_N, "readers racing their timeouts");
    CHECK_EQ(atomic_load(&tr_bad), 0);
    CHECK_EQ(async_sched_shutdown(s, BOUND_MS), 0);
    async_sched_destroy(s);
    for (int i = 0; i < TR_N; i++) {
        async_fiber_close(tr_sv[i][1]);
        close(tr_sv[i][0]);
    }
}

static void t_timeout_race_1w(void) { timeout_race(1); }
static void t_timeout_race_2w(void) { timeout_race(2); }

/* ---- a read cancelled by shutdown: nothing is written into buf after ------ */

#define SB_N 32
static int sb_sv[SB_N][2];
static atomic_int sb_parked, sb_bad, sb_ended;

static void sb_fiber(void *arg)
{
    int i = (int)(intptr_t)arg;
    unsigned char *buf = malloc(4096);
    CHECK(buf != NULL);
    atomic_fetch_add(&sb_parked, 1);
    for (;;) {
        ssize_t r = async_fiber_read(sb_sv[i][1], buf, 4096, i % 2 ? -1 : 5);
        if (r < 0 && async_last_error() == ASYNC_E_CANCELLED) break;
        if (r < 0 && async_last_error() == ASYNC_E_TIMEDOUT) continue;
        if (r <= 0) {
            fprintf(stderr, "fiber %d: read %zd err %d\n", i, r, async_last_error());
            atomic_fetch_add(&sb_bad, 1);
            break;
        }
    }
    /* the call returned: the kernel must not write into buf any more */
    memset(buf, 0xA5, 4096);
    for (int k = 0; k < 2000; k++) async_fiber_yield();
    for (int k = 0; k < 4096; k++)
        if (buf[k] != 0xA5) {
            fprintf(stderr, "fiber %d: buf[%d] written after the read returned\n", i, k);
            atomic_fetch_add(&sb_bad, 1);
            break;
        }
    free(buf);
    atomic_fetch_add(&sb_ended, 1);
}

static atomic_int sb_stop;
static void *sb_writer(void *arg)
{
    (void)arg;
    unsigned char b[256];
    memset(b, 0x11, sizeof b);
    while (!atomic_load(&sb_stop))
        for (int i = 0; i < SB_N; i++) (void)send(sb_sv[i][0], b, sizeof b, MSG_DONTWAIT | MSG_NOSIGNAL);
    return NULL;
}

static void t_shutdown_buf(void)
{
    for (int round = 0; round < 10; round++) {
        async_sched_t *s = sched_new(1 + round % 2);
        atomic_store(&sb_parked, 0);
        atomic_store(&sb_bad, 0);
        atomic_store(&sb_ended, 0);
        atomic_store(&sb_stop, 0);
        for (int i = 0; i < SB_N; i++) {
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sb_sv[i]), 0);
            if (i % 4 == 0) CHECK_EQ(async_fiber_fd_open(s, sb_sv[i][1]), 0);
            CHECK(async_fiber_spawn(s, sb_fiber, (void *)(intptr_t)i, 0) != NULL);
        }
        wait_count(&sb_parked, SB_N, "readers started");
        pthread_t w;
        start_thread(&w, sb_writer, NULL);
        usleep(2000 + 1000 * round);
        CHECK_EQ(async_sched_shutdown(s, BOUND_MS), 0);
        atomic_store(&sb_stop, 1);
        join_within(w, BOUND_MS, "writer");
        CHECK_EQ(atomic_load(&sb_ended), SB_N);
        CHECK_EQ(atomic_load(&sb_bad), 0);
        async_sched_destroy(s);
        for (int i = 0; i < SB_N; i++) {
            async_fiber_close(sb_sv[i][1]);
            close(sb_sv[i][0]);
        }
    }
}

/* ---- shutdown racing hand-offs from host threads: nothing lost, no lock kept -- */

typedef struct {
    async_chan_t *c[2]; /* rendezvous, buffered */
    async_mutex_t *m;
    atomic_int sent, got, locked, stop;
} sh_t;

static sh_t sh;

static void sh_recv_fiber(void *arg)
{
    async_chan_t *c = arg;
    for (;;) {
        int v;
        if (async_chan_recv(c, &v, -1) != 0) {
            int e = async_last_error();
            CHECK(e == ASYNC_E_CANCELLED || e == ASYNC_E_CLOSED);
            return;
        }
        atomic_fetch_add(&sh.got, 1);
    }
}

static void sh_lock_fiber(void *arg)
{
    (void)arg;
    for (;;) {
        if (async_mutex_lock(sh.m, -1) != 0) {
            CHECK_ERR(ASYNC_E_CANCELLED);
            return;
        }
        atomic_fetch_add(&sh.locked, 1);
        CHECK_EQ(async_mutex_unlock(sh.m), 0);
        async_fiber_yield();
    }
}

static void *sh_sender(void *arg)
{
    async_chan_t *c = arg;
    int v = 1;
    while (!atomic_load(&sh.stop)) {
        if (async_chan_send(c, &v, 20) == 0)
            atomic_fetch_add(&sh.sent, 1);
        else
            CHECK(async_last_error() == ASYNC_E_TIMEDOUT || async_last_error() == ASYNC_E_FULL);
    }
    return NULL;
}

static void *sh_locker(void *arg)
{
    (void)arg;
    while (!atomic_load(&sh.stop)) {
        if (async_mutex_lock(sh.m, 20) == 0) {
            CHECK_EQ(async_mutex_unlock(sh.m), 0);
        } else {
            CHECK_ERR(ASYNC_E_TIMEDOUT);
        }
    }
    return NULL;
}

static void t_shutdown_handoff(void)
{
    for (int round = 0; round < 20; round++) {
        async_sched_t *s = sched_new(1 + round % 2);
        sh.c[0] = async_chan_create(0, sizeof(int));
        sh.c[1] = async_chan_create(4, sizeof(int));
        sh.m = async_mutex_create();
        CHECK(sh.c[0] && sh.c[1] && sh.m);
        atomic_store(&sh.sent, 0);
        atomic_store(&sh.got, 0);
        atomic_store(&sh.locked, 0);
        atomic_store(&sh.stop, 0);
        for (int i = 0; i < 8; i++) {
            CHECK(async_fiber_spawn(s, sh_recv_fiber, sh.c[i % 2], 0) != NULL);
            CHECK(async_fiber_spawn(s, sh_lock_fiber, NULL, 0) != NULL);
        }
        pthread_t th[4];
        start_thread(&th[0], sh_sender, sh.c[0]);
        start_thread(&th[1], sh_sender, sh.c[1]);
        start_thread(&th[2], sh_sender, sh.c[0]);
        start_thread(&th[3], sh_locker, NULL);
        usleep(1000 + 700 * (unsigned)round);
        CHECK_EQ(async_sched_shutdown(s, BOUND_MS), 0);
        atomic_store(&sh.stop, 1);
        for (int i = 0; i < 4; i++) join_within(th[i], BOUND_MS, "host thread");
        int left = 0, v;
        while (async_chan_try_recv(sh.c[1], &v) == 0) left++;
        if (atomic_load(&sh.sent) != atomic_load(&sh.got) + left)
            fprintf(stderr, "round %d: %d sent, %d received, %d left in the buffer\n", round, atomic_load(&sh.sent),
                    atomic_load(&sh.got), left);
        CHECK_EQ(atomic_load(&sh.sent), atomic_load(&sh.got) + left);
        /* no cancelled lock wait kept the mutex */
        CHECK_EQ(async_mutex_trylock(sh.m), 0);
        CHECK_EQ(async_mutex_unlock(sh.m), 0);
        async_sched_destroy(s);
        async_chan_destroy(sh.c[0]);
        async_chan_destroy(sh.c[1]);
        async_mutex_destroy(sh.m);
    }
}

/* ---- owned fds of one scheduler closed by another's fibers, during a destroy -- */

#define XC_N 64
static int xc_sv[XC_N][2];
static atomic_int xc_ended, xc_closed_ok;

static void xc_reader(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b;
    ssize_t r = async_fiber_read(fd, &b, 1, -1);
    int e = async_last_error();
    if (!(r == -1 && (e == ASYNC_E_CLOSED || e == ASYNC_E_CANCELLED)))
        fprintf(stderr, "owned read: %zd err %d\n", r, e);
    CHECK(r == -1 && (e == ASYNC_E_CLOSED || e == ASYNC_E_CANCELLED));
    atomic_fetch_add(&xc_ended, 1);
}

static void xc_closer(void *arg)
{
    int i = (int)(intptr_t)arg;
    if (i % 3 == 0) async_fiber_yield();
    CHECK_EQ(async_fiber_close(xc_sv[i][1]), 0);
    atomic_fetch_add(&xc_closed_ok, 1);
}

static void *xc_destroy(void *arg)
{
    async_sched_destroy(arg);
    return NULL;
}

static void t_cross_close(void)
{
    raise_nofile(4 * XC_N + 64);
    async_sched_t *s2 = sched_new(2);
    for (int round = 0; round < 20; round++) {
        async_sched_t *s1 = sched_new(1 + round % 2);
        atomic_store(&xc_ended, 0);
        atomic_store(&xc_closed_ok, 0);
        for (int i = 0; i < XC_N; i++) {
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, xc_sv[i]), 0);
            CHECK_EQ(async_fiber_fd_open(s1, xc_sv[i][1]), 0);
            CHECK(async_fiber_spawn(s1, xc_reader, (void *)(intptr_t)xc_sv[i][1], 0) != NULL);
        }
        sched_wait_parked(s1, XC_N);
        pthread_t th;
        if (round % 2) start_thread(&th, xc_destroy, s1); /* the owner goes while its fds are closed */
        for (int i = 0; i < XC_N; i++) CHECK(async_fiber_spawn(s2, xc_closer, (void *)(intptr_t)i, 0) != NULL);
        wait_count(&xc_closed_ok, XC_N, "closes from the other scheduler");
        wait_count(&xc_ended, XC_N, "owned reads ended");
        if (round % 2)
            join_within(th, BOUND_MS, "destroy");
        else
            async_sched_destroy(s1);
        for (int i = 0; i < XC_N; i++) close(xc_sv[i][0]);
    }
    async_sched_destroy(s2);
}

/* ---- a plain fd made owned while a fiber waits on it, then async_fiber_close -- */

#define OW_N 32
static atomic_int ow_ended;

static void ow_reader(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b;
    ssize_t r = async_fiber_read(fd, &b, 1, -1);
    int e = async_last_error();
    if (!(r == -1 && e == ASYNC_E_CLOSED)) fprintf(stderr, "read on fd %d: %zd err %d\n", fd, r, e);
    CHECK(r == -1);
    CHECK_EQ(e, ASYNC_E_CLOSED);
    atomic_fetch_add(&ow_ended, 1);
}

static void t_own_while_parked(void)
{
    async_sched_t *s = sched_new(2);
    int sv[OW_N][2];
    atomic_store(&ow_ended, 0);
    for (int i = 0; i < OW_N; i++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]), 0);
        CHECK(async_fiber_spawn(s, ow_reader, (void *)(intptr_t)sv[i][1], 0) != NULL);
    }
    sched_wait_parked(s, OW_N);
    for (int i = 0; i < OW_N; i++) {
        CHECK_EQ(async_fiber_fd_open(s, sv[i][1]), 0);
        CHECK_EQ(async_fiber_close(sv[i][1]), 0); /* wakes every fiber of s parked on it */
    }
    wait_count(&ow_ended, OW_N, "reads begun on a plain fd, ended by async_fiber_close once owned");
    CHECK_EQ(async_sched_shutdown(s, BOUND_MS), 0);
    async_sched_destroy(s);
    for (int i = 0; i < OW_N; i++) close(sv[i][0]);
}

/* A plain fd closed with close(2) under a parked reader (timeout -1), its
 * number taken by a new socket that s then owns: async_fiber_close of the
 * number wakes every fiber of s parked on it, the old reader included. */
static void t_reuse_own_close(void)
{
    async_sched_t *s = sched_new(2);
    atomic_store(&ow_ended, 0);
    int done = 0;
    for (int round = 0; round < 50; round++) {
        int sv[2], nv[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        CHECK(async_fiber_spawn(s, ow_reader, (void *)(intptr_t)sv[1], 0) != NULL);
        sched_wait_parked(s, 1);
        CHECK_EQ(close(sv[1]), 0);
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, nv), 0);
        int x = nv[0] == sv[1] ? nv[0] : nv[1] == sv[1] ? nv[1] : -1;
        CHECK(x >= 0); /* the lowest free number comes back */
        CHECK_EQ(async_fiber_fd_open(s, x), 0);
        CHECK_EQ(async_fiber_close(x), 0);
        done++;
        wait_count(&ow_ended, done, "a read on a closed plain fd whose number s owned and closed");
        close(sv[0]);
        close(nv[0] == x ? nv[1] : nv[0]);
    }
    CHECK_EQ(async_sched_shutdown(s, BOUND_MS), 0);
    async_sched_destroy(s);
}

static const test_case_t cases[] = {
    T(host_wake_1w), // uring adversarial
    T(host_wake_2w), // uring adversarial
    T(fd_burst_1w), // uring adversarial
    T(fd_burst_2w), // uring adversarial
    T(close_parked_1w), // uring adversarial
    T(close_parked_2w), // uring adversarial
    T(reuse_parked), // uring adversarial
    T(cancel_fiber_calls), // uring adversarial
    T(destroy_race), // uring adversarial
    T(cancel_dump_signal), // uring adversarial
    T(timeout_race_1w), // uring adversarial
    T(timeout_race_2w), // uring adversarial
    T(shutdown_buf), // uring adversarial
    T(shutdown_handoff), // uring adversarial
    T(cross_close), // uring adversarial
    T(own_while_parked), // uring adversarial
    T(reuse_own_close), // uring adversarial
};

TEST_MAIN(cases)
