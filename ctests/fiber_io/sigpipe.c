/* SIGPIPE: fiber writes to a peer that reset or vanished, and pipe writes
 * whose reader closed, end with ASYNC_E_CLOSED and never raise SIGPIPE, on a
 * fiber (whose worker must not be left with one pending) and on a plain
 * thread; a SIGPIPE pending before the call stays pending and none is added.
 * Every wait is bounded. */
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>

#include "check.h"
#include "net.h"

/* ---- a pipe whose reader closed -------------------------------------- */

static int sigpipe_pending(void) {
    sigset_t p;
    CHECK_EQ(sigpending(&p), 0);
    return sigismember(&p, SIGPIPE);
}

static int sigpipe_blocked(void) {
    sigset_t m;
    CHECK_EQ(pthread_sigmask(SIG_BLOCK, NULL, &m), 0);
    return sigismember(&m, SIGPIPE);
}

static void *close_later(void *arg) {
    sleep_ms(20);
    close((int)(intptr_t)arg);
    return NULL;
}

/* Fills the pipe p[1] (non-blocking) to the brim. */
static void fill_pipe(int wfd) {
    int fl = fcntl(wfd, F_GETFL);
    CHECK(fcntl(wfd, F_SETFL, fl | O_NONBLOCK) == 0);
    char junk[4096] = {0};
    while (write(wfd, junk, sizeof junk) > 0) {
    }
    CHECK(errno == EAGAIN);
}

/* On a plain thread: SIGPIPE would kill the process (the host's default
 * action, or the Go runtime's handler on a non-Go thread). */
CASE(pipe_epipe_thread) {
    int p[2];
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(close(p[0]), 0);
    CHECK(!sigpipe_blocked());
    CHECK_FAIL(async_fiber_write(p[1], "x", 1, 1000) == -1, ASYNC_E_CLOSED);
    CHECK(!sigpipe_blocked()); /* the mask is restored */
    CHECK(!sigpipe_pending()); /* and no SIGPIPE is left behind */
    close(p[1]);

    /* the reader closes while the write waits for room */
    CHECK_EQ(pipe(p), 0);
    fill_pipe(p[1]);
    pthread_t th;
    start_thread(&th, close_later, (void *)(intptr_t)p[0]);
    CHECK_FAIL(async_fiber_write(p[1], "x", 1, 10000) == -1, ASYNC_E_CLOSED);
    join_within(th, 10000, "close_later");
    CHECK(!sigpipe_blocked());
    CHECK(!sigpipe_pending());
    close(p[1]);

    /* a thread that blocks SIGPIPE itself and has one pending keeps it */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    CHECK_EQ(pthread_sigmask(SIG_BLOCK, &set, NULL), 0);
    CHECK_EQ(pthread_kill(pthread_self(), SIGPIPE), 0);
    CHECK(sigpipe_pending());
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(close(p[0]), 0);
    CHECK_FAIL(async_fiber_write(p[1], "x", 1, 1000) == -1, ASYNC_E_CLOSED);
    CHECK(sigpipe_blocked());
    CHECK(sigpipe_pending());
    struct timespec zero = {0, 0};
    CHECK_EQ(sigtimedwait(&set, NULL, &zero), SIGPIPE);
    CHECK(!sigpipe_pending());
    /* and with none pending, the write leaves none */
    CHECK_FAIL(async_fiber_write(p[1], "x", 1, 1000) == -1, ASYNC_E_CLOSED);
    CHECK(!sigpipe_pending());
    CHECK(sigpipe_blocked());
    close(p[1]);
    CHECK_EQ(pthread_sigmask(SIG_UNBLOCK, &set, NULL), 0);
}

typedef struct {
    int wfd;
    int r1, e1, r2, e2;
    int pending1, pending2;
    atomic_int done;
} fpipe_t;

static void pipe_fiber(void *arg) {
    fpipe_t *x = arg;
    async_clear_error();
    x->r1 = (int)async_fiber_write(x->wfd, "x", 1, 1000);
    x->e1 = async_last_error();
    x->pending1 = sigpipe_pending(); /* no park since the write: same thread */
    atomic_store(&x->done, 1);
}

static void pipe_fiber_parked(void *arg) {
    fpipe_t *x = arg;
    async_clear_error();
    x->r2 = (int)async_fiber_write(x->wfd, "x", 1, 10000);
    x->e2 = async_last_error();
    x->pending2 = sigpipe_pending();
    atomic_store(&x->done, 1);
}

/* On a fiber: the worker threads block SIGPIPE; the write must not leave
 * one pending on the worker either. */
CASE(pipe_epipe_fiber) { // uring
    static fpipe_t x;
    int p[2];
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(close(p[0]), 0);
    x.wfd = p[1];
    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, pipe_fiber, &x, 0));
    wait_flag(&x.done, 20000, "pipe_fiber");
    CHECK_EQ(x.r1, -1);
    CHECK_EQ(x.e1, ASYNC_E_CLOSED);
    CHECK_EQ(x.pending1, 0);
    close(p[1]);

    /* parked for room when the reader closes */
    CHECK_EQ(pipe(p), 0);
    fill_pipe(p[1]);
    x.wfd = p[1];
    atomic_store(&x.done, 0);
    spawn_until_parked(s, pipe_fiber_parked, &x, 1);
    close(p[0]);
    wait_flag(&x.done, 20000, "pipe_fiber_parked");
    CHECK_EQ(x.r2, -1);
    CHECK_EQ(x.e2, ASYNC_E_CLOSED);
    CHECK_EQ(x.pending2, 0);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    close(p[1]);
}

/* ---- SIGPIPE: peers that reset or vanish mid-write ------------------------------- */

static char bigbuf[8 << 20];

static void reset_body(void *arg) {
    (void)arg;
    struct sockaddr_in sa;
    int l = loopback_listener(16, &sa);
    for (int i = 0; i < 4; i++) {
        int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK_EQ(async_fiber_connect(c, (struct sockaddr *)&sa, sizeof sa, 2000), 0);
        int a = async_fiber_accept(l, NULL, NULL, 2000);
        CHECK(a >= 0);
        if (i % 2) {
            struct linger lg = {1, 0}; /* close sends RST */
            CHECK_EQ(setsockopt(a, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
        }
        /* the peer goes away while the write is parked (its buffers full) */
        int peer = a;
        async_fiber_t *killer = NULL;
        (void)killer;
        /* a writer fiber parks; we close the peer from this fiber after a while */
        ssize_t r;
        {
            /* fill then close */
            char junk[4096];
            ssize_t n = read(peer, junk, 1); /* nothing yet: just nonblocking check */
            (void)n;
        }
        close(peer);
        async_fiber_sleep(20);
        async_clear_error();
        r = async_fiber_write(c, bigbuf, sizeof bigbuf, 5000);
        int e = async_last_error();
        if (r == -1 && e != ASYNC_E_CLOSED) fprintf(stderr, "write after peer gone -> err %d\n", e);
        CHECK(r == -1);
        CHECK_EQ(e, ASYNC_E_CLOSED);
        r = async_fiber_write(c, "x", 1, 100);
        CHECK(r == -1);
        close(c);
    }
    close(l);
}

CASE(peer_reset_mid_write) { // uring adversarial
    on_fiber_then_thread(reset_body);
}

/* A writer parked on a full socket whose peer resets it from another
 * thread: CLOSED, never SIGPIPE. */
static int rw_fd;

static atomic_int rw_err = -1;

static void parked_writer(void *arg) {
    (void)arg;
    ssize_t r = async_fiber_write(rw_fd, bigbuf, sizeof bigbuf, 20000);
    atomic_store(&rw_err, r == -1 ? async_last_error() : 0);
}

CASE(peer_reset_parked_writer) { // uring adversarial
    async_sched_t *s = sched_new(2);
    struct sockaddr_in sa;
    int l = loopback_listener(16, &sa);
    for (int i = 0; i < 4; i++) {
        int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK_EQ(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
        int a = accept(l, NULL, NULL);
        CHECK(a >= 0);
        rw_fd = c;
        atomic_store(&rw_err, -1);
        async_fiber_t *f = async_fiber_spawn(s, parked_writer, NULL, ASYNC_FIBER_JOINABLE);
        CHECK(f != NULL);
        sched_wait_parked(s, 1);
        if (i % 2) {
            struct linger lg = {1, 0};
            CHECK_EQ(setsockopt(a, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
            close(a);
        } else {
            /* read a bit so the writer moves, then vanish */
            char junk[65536];
            CHECK(read(a, junk, sizeof junk) > 0);
            close(a);
        }
        CHECK_EQ(async_fiber_join(f, 20000), 0);
        printf("round %d: write -> err %d\n", i, atomic_load(&rw_err));
        CHECK_EQ(atomic_load(&rw_err), ASYNC_E_CLOSED);
        close(c);
    }
    close(l);
    /* a pipe whose reader vanishes while the write is parked (SIGPIPE at its
     * default action: it would kill the process) */
    signal(SIGPIPE, SIG_DFL);
    for (int i = 0; i < 4; i++) {
        int p[2];
        CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
        rw_fd = p[1];
        atomic_store(&rw_err, -1);
        async_fiber_t *f = async_fiber_spawn(s, parked_writer, NULL, ASYNC_FIBER_JOINABLE);
        CHECK(f != NULL);
        sched_wait_parked(s, 1);
        if (i % 2) {
            char junk[4096];
            CHECK(read(p[0], junk, sizeof junk) > 0);
        }
        close(p[0]);
        CHECK_EQ(async_fiber_join(f, 20000), 0);
        CHECK_EQ(atomic_load(&rw_err), ASYNC_E_CLOSED);
        close(p[1]);
    }
    async_sched_destroy(s);
}

/* ---- SIGPIPE bookkeeping on a plain thread ------------------------------------------------- */

/* A SIGPIPE pending before the call stays pending; none is added or
 * consumed; the thread's mask is as it was. */
CASE(sigpipe_pending) { // adversarial
    sigset_t set, old, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    for (int mode = 0; mode < 3; mode++) {
        /* mode 0: SIGPIPE unblocked; 1: blocked with one pending; 2: blocked */
        CHECK_EQ(pthread_sigmask(SIG_BLOCK, &set, &old), 0);
        if (mode == 1) pthread_kill(pthread_self(), SIGPIPE);
        if (mode == 0) CHECK_EQ(pthread_sigmask(SIG_SETMASK, &old, NULL), 0);
        sigset_t before;
        CHECK_EQ(pthread_sigmask(SIG_SETMASK, NULL, &before), 0);
        int p[2];
        CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
        close(p[0]);
        CHECK_FAIL(async_fiber_write(p[1], "x", 1, 100) == -1, ASYNC_E_CLOSED);
        sigset_t after;
        CHECK_EQ(pthread_sigmask(SIG_SETMASK, NULL, &after), 0);
        CHECK_EQ(sigismember(&before, SIGPIPE), sigismember(&after, SIGPIPE));
        CHECK_EQ(sigpending(&pend), 0);
        printf("mode %d: pending after %d\n", mode, sigismember(&pend, SIGPIPE));
        CHECK_EQ(sigismember(&pend, SIGPIPE), mode == 1);
        close(p[1]);
        if (mode >= 1) {
            /* drop the pending one, restore */
            struct timespec z = {0, 0};
            if (mode == 1) CHECK_EQ(sigtimedwait(&set, NULL, &z), SIGPIPE);
            CHECK_EQ(pthread_sigmask(SIG_SETMASK, &old, NULL), 0);
        }
    }
}

/* ---- a SIGPIPE pending before a plain thread's pipe write stays; none is added ---- */

CASE(sigpipe_pending_plain) // adversarial
{
    sigset_t set, old, pend;
    int p[2], sig = 0;
    struct timespec zero = {0, 0};
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    CHECK_EQ(pthread_sigmask(SIG_BLOCK, &set, &old), 0);
    CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    close(p[0]);
    CHECK_EQ(pthread_kill(pthread_self(), SIGPIPE), 0);
    CHECK(async_fiber_write(p[1], "x", 1, BOUND_MS) < 0);
    CHECK_ERR(ASYNC_E_CLOSED);
    sigpending(&pend);
    CHECK(sigismember(&pend, SIGPIPE)); /* the host's own stays */
    sig = sigtimedwait(&set, NULL, &zero);
    CHECK_EQ(sig, SIGPIPE);
    CHECK(async_fiber_write(p[1], "x", 1, BOUND_MS) < 0);
    CHECK_ERR(ASYNC_E_CLOSED);
    sigpending(&pend);
    CHECK(!sigismember(&pend, SIGPIPE)); /* the write's own was consumed */
    /* a mask with SIGPIPE blocked by the host stays blocked */
    sigset_t now;
    CHECK_EQ(pthread_sigmask(SIG_SETMASK, NULL, &now), 0);
    CHECK(sigismember(&now, SIGPIPE));
    CHECK_EQ(pthread_sigmask(SIG_SETMASK, &old, NULL), 0);
    close(p[1]);
}

TEST_MAIN()
