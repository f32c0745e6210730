/* Fiber fd I/O while every worker is kept busy by yielding fibers, so that
 * only a busy worker's periodic look delivers fd events: ping-pong across
 * 2-4 workers over unix stream, TCP and seqpacket pairs (owned and plain),
 * owned fds closed by another fiber, scheduler shutdown and destroy in the
 * middle of the ping-pong and with readers parked, a signal wait, dumps and
 * stats while fibers park and migrate, and many fibers on many fds woken in
 * a scrambled order. Every wait is bounded. */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "check.h"
#include "net.h"

/* ---- ping-pong across workers: every message parks both ends ---- */

#define PP_PAIRS 24

#define PP_ROUNDS 60

typedef struct {
    int fd;
    int echo; /* 1: read then write back; 0: write then read */
} pp_arg_t;

static pp_arg_t pp_args[PP_PAIRS * 2];

static atomic_int pp_done;

static int pp_sv[PP_PAIRS][2];

static void pp_fn(void *arg)
{
    pp_arg_t *a = arg;
    for (int i = 0; i < PP_ROUNDS; i++) {
        unsigned char b = (unsigned char)i, got = 0;
        if (!a->echo)
            CHECK_EQ(async_fiber_write(a->fd, &b, 1, BOUND_MS), 1);
        CHECK_EQ(async_fiber_read(a->fd, &got, 1, BOUND_MS), 1);
        CHECK_EQ(got, b);
        if (a->echo)
            CHECK_EQ(async_fiber_write(a->fd, &got, 1, BOUND_MS), 1);
        if (i % 7 == 0)
            async_fiber_yield();
    }
    atomic_fetch_add(&pp_done, 1);
}

static void pingpong(int workers, int kind, int owned)
{
    async_sched_t *s = sched_new(workers);
    atomic_store(&pp_done, 0);
    busy_start(s, workers * 2);
    for (int i = 0; i < PP_PAIRS; i++) {
        make_pair(kind, pp_sv[i]);
        for (int j = 0; j < 2; j++) {
            if (owned && (owned == 2 || (i + j) % 2 == 0))
                CHECK_EQ(async_fiber_fd_open(s, pp_sv[i][j]), 0);
            pp_args[2 * i + j].fd = pp_sv[i][j];
            pp_args[2 * i + j].echo = j;
        }
    }
    for (int i = 0; i < PP_PAIRS * 2; i++)
        CHECK(async_fiber_spawn(s, pp_fn, &pp_args[i], 0) != NULL);
    wait_count(&pp_done, PP_PAIRS * 2, "ping-pong fibers");
    atomic_store(&busy_stop, 1);
    sched_finish(s, BOUND_MS);
    for (int i = 0; i < PP_PAIRS; i++) {
        close_pair(pp_sv[i]);
    }
}

CASE(busy_pingpong_unix_2w) { pingpong(2, 0, 0); } // uring adversarial

CASE(busy_pingpong_unix_4w_owned) { pingpong(4, 0, 2); } // uring adversarial

CASE(busy_pingpong_tcp_3w_mixed) { pingpong(3, 1, 1); } // uring adversarial

CASE(busy_pingpong_tcp_2w_owned) { pingpong(2, 1, 2); } // uring adversarial

CASE(busy_pingpong_seqpacket_3w) { pingpong(3, 2, 1); } // uring adversarial

/* ---- close and shutdown racing parked fibers on busy workers ---- */

#define CR_N 32

static int cr_fd[CR_N][2];

static atomic_int cr_ended, cr_bad;

static void cr_parked(void *arg)
{
    int i = (int)(intptr_t)arg;
    char b;
    ssize_t n = async_fiber_read(cr_fd[i][1], &b, 1, -1);
    int e = async_last_error();
    if (n >= 0 || (e != ASYNC_E_CLOSED && e != ASYNC_E_CANCELLED && e != ASYNC_E_BADFD))
        atomic_fetch_add(&cr_bad, 1);
    atomic_fetch_add(&cr_ended, 1);
}

static void cr_closer(void *arg)
{
    int i = (int)(intptr_t)arg;
    async_fiber_yield();
    CHECK_EQ(async_fiber_close(cr_fd[i][1]), 0);
}

/* A scheduler of `workers` workers, every one kept busy (busy_start), and
 * the cr_ counts cleared. */
static async_sched_t *cr_sched(int workers)
{
    async_sched_t *s = sched_new(workers);
    atomic_store(&cr_ended, 0);
    atomic_store(&cr_bad, 0);
    busy_start(s, workers);
    return s;
}

/* Owned read ends closed by another fiber while every worker is busy. */
CASE(owned_close_busy) // uring adversarial
{
    async_sched_t *s = cr_sched(3);
    for (int i = 0; i < CR_N; i++) {
        int p[2];
        CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
        cr_fd[i][0] = p[1];
        cr_fd[i][1] = p[0];
        CHECK_EQ(async_fiber_fd_open(s, cr_fd[i][1]), 0);
        CHECK(async_fiber_spawn(s, cr_parked, (void *)(intptr_t)i, 0) != NULL);
    }
    sched_wait_parked(s, CR_N); /* each close finds its reader parked */
    for (int i = 0; i < CR_N; i++)
        CHECK(async_fiber_spawn(s, cr_closer, (void *)(intptr_t)i, 0) != NULL);
    wait_count(&cr_ended, CR_N, "parked readers woken by async_fiber_close");
    CHECK_EQ(atomic_load(&cr_bad), 0);
    atomic_store(&busy_stop, 1);
    sched_finish(s, BOUND_MS);
    for (int i = 0; i < CR_N; i++)
        close(cr_fd[i][0]);
}

/* Parked readers (owned and plain) on busy workers; shutdown ends them all. */
CASE(shutdown_parked_busy) // uring adversarial
{
    async_sched_t *s = cr_sched(4);
    for (int i = 0; i < CR_N; i++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, cr_fd[i]), 0);
        own_if(s, cr_fd[i][1], i % 2);
        CHECK(async_fiber_spawn(s, cr_parked, (void *)(intptr_t)i, 0) != NULL);
    }
    sched_wait_parked(s, CR_N);
    (void)async_sched_shutdown(s, 0); /* the busy fibers do not stop by themselves */
    atomic_store(&busy_stop, 1);
    wait_count(&cr_ended, CR_N, "parked readers ended by shutdown");
    CHECK_EQ(atomic_load(&cr_bad), 0);
    sched_finish(s, BOUND_MS);
    for (int i = 0; i < CR_N; i++) {
        close_pair(cr_fd[i]);
    }
}

/* ---- a signal wait while every worker is busy yielding ---- */

static atomic_int sg_state;

static void sg_waiter(void *arg)
{
    (void)arg;
    atomic_store(&sg_state, 1);
    int n = async_fiber_wait_signal(SIGUSR2, BOUND_MS);
    atomic_store(&sg_state, n >= 1 ? 2 : 3);
}

CASE(signal_wait_busy) // adversarial
{
    async_sched_t *s = sched_new(2);
    CHECK_EQ(async_fiber_watch_signal(SIGUSR2), 0);
    atomic_store(&sg_state, 0);
    busy_start(s, 4);
    spawn_until_parked(s, sg_waiter, NULL, 1);
    CHECK_EQ(kill(getpid(), SIGUSR2), 0);
    double t0 = now_ms();
    while (atomic_load(&sg_state) < 2 && now_ms() - t0 < 2 * BOUND_MS)
        usleep(200);
    CHECK_EQ(atomic_load(&sg_state), 2);
    atomic_store(&busy_stop, 1);
    sched_finish(s, BOUND_MS);
    CHECK_EQ(async_fiber_unwatch_signal(SIGUSR2), 0);
}

/* ---- shutdown and destroy in the middle of the ping-pong ---- */

static atomic_int mf_msgs, mf_ended, mf_bad;

static void mf_fn(void *arg)
{
    pp_arg_t *a = arg;
    for (int i = 0;; i++) {
        unsigned char b = (unsigned char)i, got = 0;
        if (!a->echo && async_fiber_write(a->fd, &b, 1, BOUND_MS) != 1)
            break;
        if (async_fiber_read(a->fd, &got, 1, BOUND_MS) != 1)
            break;
        if (got != b)
            atomic_fetch_add(&mf_bad, 1);
        if (a->echo && async_fiber_write(a->fd, &got, 1, BOUND_MS) != 1)
            break;
        atomic_fetch_add(&mf_msgs, 1);
    }
    int e = async_last_error();
    /* the shutdown, or the peer's end: its fiber was cancelled (a hang-up
     * reads as 0 bytes, a closed peer writes ASYNC_E_CLOSED) */
    if (e != ASYNC_E_CANCELLED && e != ASYNC_E_CLOSED && e != 0)
        atomic_fetch_add(&mf_bad, 1);
    atomic_fetch_add(&mf_ended, 1);
}

typedef struct {
    async_sched_t *s;
} mf_destroy_t;

static void *mf_destroyer(void *arg)
{
    async_sched_destroy(((mf_destroy_t *)arg)->s);
    return NULL;
}

static void midflight(int workers, int owned, int by_destroy)
{
    async_sched_t *s = sched_new(workers);
    atomic_store(&mf_msgs, 0);
    atomic_store(&mf_ended, 0);
    atomic_store(&mf_bad, 0);
    busy_start(s, workers);
    for (int i = 0; i < PP_PAIRS; i++) {
        make_pair(i % 2, pp_sv[i]);
        for (int j = 0; j < 2; j++) {
            if (owned && (i + j) % 2 == 0)
                CHECK_EQ(async_fiber_fd_open(s, pp_sv[i][j]), 0);
            pp_args[2 * i + j].fd = pp_sv[i][j];
            pp_args[2 * i + j].echo = j;
            CHECK(async_fiber_spawn(s, mf_fn, &pp_args[2 * i + j], 0) != NULL);
        }
    }
    wait_count(&mf_msgs, 2000, "messages before the shutdown");
    if (!by_destroy) {
        (void)async_sched_shutdown(s, 0); /* the busy fibers do not stop by themselves */
        wait_count(&mf_ended, PP_PAIRS * 2, "ping-pong fibers ended by the shutdown");
        atomic_store(&busy_stop, 1);
        sched_finish(s, BOUND_MS);
    } else {
        pthread_t t;
        mf_destroy_t d = {s};
        start_thread(&t, mf_destroyer, &d);
        wait_count(&mf_ended, PP_PAIRS * 2, "ping-pong fibers ended by the destroy");
        atomic_store(&busy_stop, 1);
        join_within(t, BOUND_MS, "async_sched_destroy");
    }
    CHECK_EQ(atomic_load(&mf_bad), 0);
    for (int i = 0; i < PP_PAIRS; i++) {
        close_pair(pp_sv[i]);
    }
}

CASE(shutdown_mid_pingpong) { midflight(3, 1, 0); } // uring adversarial

CASE(destroy_mid_pingpong) { midflight(4, 1, 1); } // uring adversarial

/* ---- dumps and stats while fibers park and migrate ---- */

CASE(dump_stats_busy) // uring adversarial
{
    async_sched_t *s = sched_new(3);
    int dn = memfd_create("fiber-dump", MFD_CLOEXEC);
    static char dbuf[1 << 16];
    int fd_lines = 0;
    async_sched_worker_stats_t ws[3];
    async_sched_stats_t st;
    CHECK(dn >= 0);
    atomic_store(&pp_done, 0);
    busy_start(s, 3);
    for (int i = 0; i < PP_PAIRS; i++) {
        make_pair(i % 3, pp_sv[i]);
        for (int j = 0; j < 2; j++) {
            if (j)
                CHECK_EQ(async_fiber_fd_open(s, pp_sv[i][j]), 0);
            pp_args[2 * i + j].fd = pp_sv[i][j];
            pp_args[2 * i + j].echo = j;
        }
    }
    for (int i = 0; i < PP_PAIRS * 2; i++)
        CHECK(async_fiber_spawn(s, pp_fn, &pp_args[i], 0) != NULL);
    double t0 = now_ms();
    while (atomic_load(&pp_done) < PP_PAIRS * 2) {
        CHECK_EQ(ftruncate(dn, 0), 0);
        CHECK_EQ(lseek(dn, 0, SEEK_SET), 0);
        int lines = async_sched_dump(s, dn);
        CHECK(lines >= 0);
        ssize_t len = pread(dn, dbuf, sizeof dbuf - 1, 0);
        CHECK(len >= 0);
        dbuf[len] = 0;
        /* every "fd <n>" a parked fiber waits on is one of ours */
        for (char *q = strstr(dbuf, " fd "); q; q = strstr(q + 1, " fd ")) {
            int n = atoi(q + 4), ours = 0;
            for (int i = 0; i < PP_PAIRS; i++)
                ours |= n == pp_sv[i][0] || n == pp_sv[i][1];
            if (!ours)
                fprintf(stderr, "dump names fd %d: %.80s\n", n, q);
            CHECK(ours);
            fd_lines++;
        }
        CHECK_EQ(async_sched_get_stats(s, &st, ws, 3), 3); /* the workers filled in */
        CHECK_EQ(st.workers, 3);
        CHECK(now_ms() - t0 < BOUND_MS);
    }
    atomic_store(&busy_stop, 1);
    sched_finish(s, BOUND_MS);
    close(dn);
    (void)fd_lines;
    for (int i = 0; i < PP_PAIRS; i++) {
        close_pair(pp_sv[i]);
    }
}

/* ---- many fibers parked on many fds; a host thread wakes them in a
 * scrambled order while every worker is busy ---- */

#define MF_N 400

static int mfd[MF_N][2];

static atomic_int mfd_done;

static void mfd_reader(void *arg)
{
    int i = (int)(intptr_t)arg;
    char b = 0;
    CHECK_EQ(async_fiber_read(mfd[i][1], &b, 1, BOUND_MS), 1);
    CHECK_EQ(b, (char)(i & 0x7f));
    CHECK_EQ(async_fiber_write(mfd[i][1], &b, 1, BOUND_MS), 1);
    atomic_fetch_add(&mfd_done, 1);
}

CASE(many_fds_busy) // uring adversarial
{
    struct rlimit rl;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < 2 * MF_N + 64) {
        rl.rlim_cur = rl.rlim_max < 2 * MF_N + 64 ? rl.rlim_max : 2 * MF_N + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    int n = (int)((rl.rlim_cur - 64) / 2 < MF_N ? (rl.rlim_cur - 64) / 2 : MF_N);
    async_sched_t *s = sched_new(4);
    atomic_store(&mfd_done, 0);
    busy_start(s, 4);
    for (int i = 0; i < n; i++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, mfd[i]), 0);
        if (i % 3)
            CHECK_EQ(async_fiber_fd_open(s, mfd[i][1]), 0);
        CHECK(async_fiber_spawn(s, mfd_reader, (void *)(intptr_t)i, 0) != NULL);
    }
    sched_wait_parked(s, (size_t)n);
    for (int k = 0; k < n; k++) {
        int i = (int)(((unsigned)k * 7919u) % (unsigned)n);
        char b = (char)(i & 0x7f);
        CHECK_EQ(write(mfd[i][0], &b, 1), 1);
    }
    wait_count(&mfd_done, n, "readers of many fds");
    for (int i = 0; i < n; i++) {
        char b = 0;
        struct pollfd p = {mfd[i][0], POLLIN, 0};
        CHECK_EQ(poll(&p, 1, BOUND_MS), 1);
        CHECK_EQ(read(mfd[i][0], &b, 1), 1);
        CHECK_EQ(b, (char)(i & 0x7f));
    }
    atomic_store(&busy_stop, 1);
    sched_finish(s, BOUND_MS);
    for (int i = 0; i < n; i++) {
        close_pair(mfd[i]);
    }
}

TEST_MAIN()
