/* A pending deferred pthread cancel on the calling thread: the scheduler,
 * fiber, channel, dump, close, wait and join calls are no cancellation
 * points (each completes and returns normally), nor is the dump-on-signal
 * handler run on such a thread. */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "fibers.h"

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
    sched_finish(cx_s, BOUND_MS);
}

CASE(cancel_fiber_calls) // uring adversarial
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
    close_pair(cx_pipe);
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

CASE(cancel_dump_signal) // uring adversarial
{
    async_sched_t *s = sched_new(1);
    async_chan_t *c = async_chan_create(0, sizeof(int));
    CHECK(c != NULL);
    spawn_until_parked(s, cds_parked, c, 1);
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
    close_pair(p);
}

TEST_MAIN()
