/* Fiber edge cases of issue 10 (items 1, 10, 12, 14): fd readiness that must
 * not outlive its file or be reported for ever, SIGPIPE on pipe writes, fork
 * on a fiber, and thread-blocking calls made on a fiber. One case per ctest
 * test (group fiber_edge, see CMakeLists.txt). Every wait is bounded: a
 * regression fails the case instead of hanging it. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "check.h"


/* Waits until n fibers of s are parked; fails after 30 s. */

/* Waits (on the main thread) until *flag is set; a fiber that spins on its
 * worker never sets it, and the case fails after `ms` instead of hanging. */
static void wait_flag(atomic_int *flag, int ms, const char *what) {
    double t0 = now_ms();
    while (!atomic_load(flag)) {
        if (now_ms() - t0 > ms) {
            fprintf(stderr, "%s: not done after %d ms (a fiber spins or blocks its worker)\n", what, ms);
            fflush(stderr);
            _exit(1);
        }
        sleep_ms(2);
    }
}

/* A fiber that counts while it may, parking 1 ms at a time. */
typedef struct {
    atomic_long count;
    atomic_int stop;
} counter_t;

static void counter_fiber(void *arg) {
    counter_t *c = arg;
    while (!atomic_load(&c->stop)) {
        atomic_fetch_add(&c->count, 1);
        async_fiber_sleep(1);
    }
}

/* ---- item 1: HUP on a file, then its number reused by a new socket ---------- */

typedef struct {
    async_sched_t *s;
    counter_t cnt;
    int num, peer;  /* the reused number, and the new socket's peer */
    int step, err;  /* how far the reader got; the error that stopped it */
    atomic_int done;
} hup_t;

/* Writes to the new socket once the counter fiber has advanced by 5 (so
 * it ran while the reader was parked on the reused number). */
static void hup_writer(void *arg) {
    hup_t *x = arg;
    long c0 = atomic_load(&x->cnt.count);
    for (int i = 0; i < 20000 && atomic_load(&x->cnt.count) < c0 + 5; i++) async_fiber_sleep(1);
    if (write(x->peer, "new", 3) != 3) x->err = -1;
}

static void hup_reader(void *arg) {
    hup_t *x = arg;
    char buf[64];
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) goto out;
    x->num = sp[0];
    x->peer = sp[1];
    /* 1: parked in a read when the peer hangs up (main thread closes it):
     * the read sees EOF */
    ssize_t n = async_fiber_read(sp[0], buf, sizeof buf, 10000);
    if (n != 0) goto fail;
    x->step = 1;
    /* 2: close it; a new socket takes the number */
    close(sp[0]);
    int np[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, np) != 0) goto out;
    if (np[0] != x->num) {
        if (dup2(np[0], x->num) != x->num) goto out;
        close(np[0]);
    }
    x->peer = np[1];
    /* 3: nothing to read there: the read times out */
    async_clear_error();
    if (async_fiber_read(x->num, buf, sizeof buf, 50) != -1 || async_last_error() != ASYNC_E_TIMEDOUT) goto fail;
    x->step = 3;
    /* 4: so does a wait for readability */
    async_clear_error();
    if (async_fiber_wait_fd(x->num, ASYNC_EVENT_READ, 50) != -1 || async_last_error() != ASYNC_E_TIMEDOUT)
        goto fail;
    x->step = 4;
    /* 5: a long read parks and lets the worker run the other fibers; the
     * writer fiber's data ends it */
    if (!async_fiber_spawn(x->s, hup_writer, x, 0)) goto out;
    n = async_fiber_read(x->num, buf, sizeof buf, 20000);
    if (n != 3 || memcmp(buf, "new", 3) != 0) goto fail;
    x->step = 5;
    goto out;
fail:
    x->err = async_last_error();
out:
    atomic_store(&x->cnt.stop, 1);
    atomic_store(&x->done, 1);
}

static void t_hup_reuse(void) {
    async_sched_t *s = sched_new(1); /* one worker: a spinning fiber starves the others */
    static hup_t x;
    x.s = s;
    x.num = x.peer = -1;
    CHECK(async_fiber_spawn(s, counter_fiber, &x.cnt, 0));
    CHECK(async_fiber_spawn(s, hup_reader, &x, 0));
    sched_wait_parked(s, 2); /* the reader is parked in its first read */
    CHECK_EQ(close(x.peer), 0);
    wait_flag(&x.done, 20000, "hup_reuse");
    if (x.step != 5) fprintf(stderr, "stopped after step %d: %s\n", x.step, async_strerror(x.err));
    CHECK_EQ(x.step, 5);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    close(x.num);
    close(x.peer);
}

/* ---- item 1: a connected UDP socket after one ICMP error ------------------ */

typedef struct {
    int fd;
    int step, err;
    ssize_t first;
    int first_err;
    counter_t cnt;
    atomic_int done;
} udp_t;

static void udp_reader(void *arg) {
    udp_t *x = arg;
    char buf[64];
    /* 1: parked when the ICMP error comes (main thread sends): the read
     * reports the refusal */
    async_clear_error();
    x->first = async_fiber_read(x->fd, buf, sizeof buf, 10000);
    x->first_err = async_last_error();
    if (x->first != -1 || x->first_err != ASYNC_E_CLOSED) goto fail;
    x->step = 1;
    /* 2: the error was reported; nothing else comes: a read times out */
    async_clear_error();
    if (async_fiber_read(x->fd, buf, sizeof buf, 50) != -1 || async_last_error() != ASYNC_E_TIMEDOUT) goto fail;
    x->step = 2;
    /* 3: and the worker still ran the counter while this read waited */
    long c0 = atomic_load(&x->cnt.count);
    for (int i = 0; i < 200 && atomic_load(&x->cnt.count) == c0; i++) {
        async_clear_error();
        if (async_fiber_read(x->fd, buf, sizeof buf, 5) != -1 || async_last_error() != ASYNC_E_TIMEDOUT) goto fail;
    }
    if (atomic_load(&x->cnt.count) == c0) goto fail;
    x->step = 3;
    goto out;
fail:
    x->err = async_last_error();
out:
    atomic_store(&x->cnt.stop, 1);
    atomic_store(&x->done, 1);
}

static void udp_run(int recverr) {
    /* a loopback port nobody listens on: bind one, note it, close it */
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    int tmp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHECK(tmp >= 0);
    CHECK_EQ(bind(tmp, (struct sockaddr *)&a, sizeof a), 0);
    CHECK_EQ(getsockname(tmp, (struct sockaddr *)&a, &al), 0);
    close(tmp);
    static udp_t x;
    x.fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHECK(x.fd >= 0);
    CHECK_EQ(connect(x.fd, (struct sockaddr *)&a, sizeof a), 0);
    /* IP_RECVERR: the ICMP error also goes to the error queue, which keeps
     * the socket reporting EPOLLERR while recv() says EAGAIN */
    if (recverr) CHECK_EQ(setsockopt(x.fd, IPPROTO_IP, IP_RECVERR, &recverr, sizeof recverr), 0);

    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, counter_fiber, &x.cnt, 0));
    CHECK(async_fiber_spawn(s, udp_reader, &x, 0));
    sched_wait_parked(s, 2);
    CHECK_EQ(send(x.fd, "ping", 4, 0), 4); /* -> ICMP port unreachable */
    wait_flag(&x.done, 20000, "udp_icmp");
    if (x.step != 3)
        fprintf(stderr, "stopped after step %d: %s (first read %zd, %s)\n", x.step, async_strerror(x.err), x.first,
                async_strerror(x.first_err));
    CHECK_EQ(x.step, 3);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    if (recverr) {
        /* the condition was there all along: wait_fd reports it */
        int ev = async_fiber_wait_fd(x.fd, ASYNC_EVENT_READ, 1000);
        CHECK(ev > 0 && (ev & ASYNC_EVENT_ERROR));
    }
    close(x.fd);
}

static void t_udp_icmp(void) { udp_run(0); }

/* The socket keeps reporting an error its read does not clear: each read
 * still times out on time, and the worker runs the counter meanwhile. */
static void t_udp_recverr(void) { udp_run(1); }

/* ---- item 10: a pipe whose reader closed -------------------------------------- */

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
static void t_pipe_epipe_thread(void) {
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
static void t_pipe_epipe_fiber(void) {
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
    CHECK(async_fiber_spawn(s, pipe_fiber_parked, &x, 0));
    sched_wait_parked(s, 1);
    close(p[0]);
    wait_flag(&x.done, 20000, "pipe_fiber_parked");
    CHECK_EQ(x.r2, -1);
    CHECK_EQ(x.e2, ASYNC_E_CLOSED);
    CHECK_EQ(x.pending2, 0);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    close(p[1]);
}

/* ---- item 12: fork on a fiber ----------------------------------------------- */

/* Not inlined: the child's view of the TLS comes from a fresh call. */
__attribute__((noinline)) static int child_current_is_null(void) { return async_fiber_current() == NULL; }

typedef struct {
    pid_t pid;
    int parent_ok;
} fork_t;

static void fork_fiber(void *arg) {
    fork_t *x = arg;
    async_fiber_t *me = async_fiber_current();
    pid_t pid = fork();
    if (pid == 0) {
        /* child: 0 = NULL as documented; 3 = the parent's fiber; the
         * other calls fail with ASYNC_E_FORKED */
        int code = child_current_is_null() ? 0 : 3;
        if (code == 0 && (async_fiber_sleep(1) != -1 || async_last_error() != ASYNC_E_FORKED)) code = 4;
        _exit(code);
    }
    x->pid = pid;
    /* the parent still runs on its fiber */
    x->parent_ok = me != NULL && async_fiber_current() == me;
}

static void t_fork_current(void) {
    static fork_t x;
    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, fork_fiber, &x, 0));
    CHECK_EQ(async_sched_run(s), 0);
    CHECK(x.pid > 0);
    CHECK(x.parent_ok);
    int st = 0;
    CHECK_EQ(waitpid(x.pid, &st, 0), x.pid);
    if (!WIFEXITED(st)) fprintf(stderr, "child status 0x%x\n", st);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
    async_sched_destroy(s);
}

/* ---- item 14: thread-blocking calls on a fiber ------------------------------ */

static void *wk_proc(void *ctx) {
    (void)ctx;
    while (!async_worker_should_stop(async_worker_current())) sleep_ms(1);
    return NULL;
}

typedef struct {
    async_runtime_t *rt;
    async_worker_t *wk;
    counter_t cnt;
    int step, err;
    atomic_int done;
} blk_t;

static void blk_fiber(void *arg) {
    blk_t *x = arg;
    io_event_t ev[4];
    /* runtime_wait with a timeout: refused, the worker is not blocked */
    async_clear_error();
    if (async_runtime_wait(x->rt, ev, 4, 500) != -1 || async_last_error() != ASYNC_E_STATE) goto fail;
    x->step = 1;
    async_clear_error();
    if (async_runtime_wait(x->rt, ev, 4, -1) != -1 || async_last_error() != ASYNC_E_STATE) goto fail;
    x->step = 2;
    /* a poll (timeout 0) is allowed: it never blocks */
    if (async_runtime_wait(x->rt, ev, 4, 0) != 0) goto fail;
    x->step = 3;
    /* worker_join with a timeout: refused; with 0: just a check */
    async_clear_error();
    if (async_worker_join(x->wk, 500) || async_last_error() != ASYNC_E_STATE) goto fail;
    x->step = 4;
    async_clear_error();
    if (async_worker_join(x->wk, -1) || async_last_error() != ASYNC_E_STATE) goto fail;
    x->step = 5;
    async_clear_error();
    if (async_worker_join(x->wk, 0) || async_last_error() != ASYNC_E_TIMEDOUT) goto fail;
    x->step = 6;
    /* the other fiber of this worker still runs */
    long c0 = atomic_load(&x->cnt.count);
    for (int i = 0; i < 20000 && atomic_load(&x->cnt.count) < c0 + 3; i++) async_fiber_sleep(1);
    if (atomic_load(&x->cnt.count) < c0 + 3) goto fail;
    x->step = 7;
    goto out;
fail:
    x->err = async_last_error();
out:
    atomic_store(&x->cnt.stop, 1);
    atomic_store(&x->done, 1);
}

static void t_block_on_fiber(void) {
    static blk_t x;
    x.rt = async_runtime_init();
    CHECK(x.rt != NULL);
    x.wk = async_worker_create(wk_proc, NULL, 0);
    CHECK(x.wk != NULL);
    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, counter_fiber, &x.cnt, 0));
    CHECK(async_fiber_spawn(s, blk_fiber, &x, 0));
    wait_flag(&x.done, 20000, "block_on_fiber");
    if (x.step != 7) fprintf(stderr, "stopped after step %d: %s\n", x.step, async_strerror(x.err));
    CHECK_EQ(x.step, 7);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    /* the same calls on a plain thread still block and work */
    async_worker_signal_stop(x.wk);
    CHECK(async_worker_join(x.wk, 10000));
    async_worker_destroy(x.wk);
    io_event_t ev[4];
    CHECK_EQ(async_runtime_wait(x.rt, ev, 4, 1), 0);
    async_runtime_deinit(x.rt);
}

static const test_case_t cases[] = {
    T(hup_reuse), // uring
    T(udp_icmp), // uring
    T(udp_recverr), // uring
    T(pipe_epipe_thread),
    T(pipe_epipe_fiber), // uring
    T(fork_current), // uring
    T(block_on_fiber), // poll
};

TEST_MAIN(cases)
