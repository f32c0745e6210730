/* What only the io_uring path has (ASYNC_FIBER_IO=uring; docs/FIBERS.md
 * "io_uring"): the rings are used only when asked for, a scheduler at
 * RLIMIT_NOFILE falls back to epoll, pipes take the poller path, a ring op is
 * submitted while its worker is busy, more completions at once than the
 * completion ring holds, and a timed-out op's cancel that comes late does not
 * end the next op of the same stack depth. Each case makes its schedulers with the variable
 * set and learns from the INFO log line whether the rings are in use; where
 * io_uring is unavailable (old kernel, seccomp, kernel.io_uring_disabled)
 * the case prints "skipped" and passes. Every wait is bounded. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "check.h"
#include "net.h"

/* ---- schedulers with rings -------------------------------------------------- */

static atomic_int log_uring, log_epoll;

static void log_fn(int level, const char *msg, void *ctx) {
    (void)ctx;
    (void)level;
    if (strstr(msg, "fiber I/O: io_uring (")) atomic_store(&log_uring, 1);
    if (strstr(msg, "fiber I/O:") && strstr(msg, "epoll is used")) atomic_store(&log_epoll, 1);
}

/* A scheduler with `workers` workers and ASYNC_FIBER_IO=uring, or NULL
 * (after printing "skipped") when the kernel refuses io_uring. */
static async_sched_t *mk_uring_cfg(const async_sched_config_t *cfg) {
    setenv("ASYNC_FIBER_IO", "uring", 1);
    atomic_store(&log_uring, 0);
    atomic_store(&log_epoll, 0);
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_INFO, log_fn, NULL), 0);
    async_sched_t *s = async_sched_create(cfg);
    CHECK(s != NULL);
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, NULL, NULL), 0);
    if (atomic_load(&log_uring)) return s;
    CHECK(atomic_load(&log_epoll));
    printf("io_uring unavailable here: skipped\n");
    async_sched_destroy(s);
    return NULL;
}

static async_sched_t *mk_uring(int workers) {
    async_sched_config_t cfg = {workers, 0, 0};
    return mk_uring_cfg(&cfg);
}

/* ---- the rings are used only when asked for --------------------------------- */

CASE(uring_only_when_asked) { // linux
    setenv("ASYNC_FIBER_IO", "epoll", 1);
    atomic_store(&log_uring, 0);
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_INFO, log_fn, NULL), 0);
    async_sched_t *s = sched_new(1);
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, NULL, NULL), 0);
    CHECK(!atomic_load(&log_uring));
    async_sched_destroy(s);
    s = mk_uring(2);
    if (s) async_sched_destroy(s);
}

/* RLIMIT_NOFILE leaves room for the scheduler's poller but not for its
 * rings: the scheduler is made anyway, on epoll, and the INFO message says
 * why (async.h, ASYNC_FIBER_IO). The limit is raised one descriptor at a
 * time from the lowest free number; the first create that succeeds had no
 * room for a second ring. */
typedef struct {
    int fd;
    ssize_t got;
    atomic_int done;
} fb_read_t;

static void fb_read(void *arg) {
    fb_read_t *r = arg;
    char c;
    r->got = async_fiber_read(r->fd, &c, 1, 5000);
    atomic_store(&r->done, 1);
}

static char fallback_msg[256];

static void log_keep(int level, const char *msg, void *ctx) {
    (void)ctx;
    (void)level;
    if (strstr(msg, "fiber I/O:")) snprintf(fallback_msg, sizeof fallback_msg, "%s", msg);
}

CASE(uring_nofile_falls_back) { // linux
    async_sched_t *s = mk_uring(2);
    if (!s) return;
    async_sched_destroy(s);
    s = NULL;
    int lowest = dup(0);
    CHECK(lowest >= 0);
    close(lowest);
    struct rlimit old;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
    async_sched_config_t cfg = {2, 0, 0};
    for (int k = 1; k <= 16 && !s; k++) {
        struct rlimit rl = {(rlim_t)(lowest + k), old.rlim_max};
        CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
        fallback_msg[0] = 0;
        CHECK_EQ(async_set_log_handler(ASYNC_LOG_INFO, log_keep, NULL), 0);
        s = async_sched_create(&cfg);
        CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, NULL, NULL), 0);
    }
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
    CHECK(s != NULL);
    printf("log: %s\n", fallback_msg);
    CHECK(strstr(fallback_msg, "epoll is used") != NULL);
    CHECK(strstr(fallback_msg, "no descriptor left") != NULL);
    /* and it works: a fiber's read of a socket waits and gets the data */
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fb_read_t r = {.fd = sv[0]};
    CHECK(async_fiber_spawn(s, fb_read, &r, 0) != NULL);
    sleep_ms(20);
    CHECK_EQ(write(sv[1], "x", 1), 1);
    wait_count_within(&r.done, 1, 5000, "read after the fallback");
    CHECK_EQ(r.got, 1);
    async_sched_destroy(s);
    close_pair(sv);
}

/* ---- pipes take the poller path ------------------------------------------------- */

static void pipe_fiber(void *arg) {
    io_probe_t *m = arg;
    char b[8];
    m->r1 = async_fiber_read(m->fd, b, sizeof b, 10000);
    close(m->fd);
    /* the read end is closed now: EPIPE, no SIGPIPE */
    m->r2 = async_fiber_write(m->fd2, "abc", 3, 10000);
    m->e2 = async_last_error();
    atomic_store(&m->step, 1);
}

CASE(uring_pipe_uses_poller) { // linux
    async_sched_t *s = mk_uring(1);
    if (!s) return;
    int p1[2], p2[2];
    CHECK_EQ(pipe(p1), 0);
    CHECK_EQ(pipe(p2), 0);
    io_probe_t m;
    memset(&m, 0, sizeof m);
    m.fd = p1[0];
    m.fd2 = p2[1];
    close(p2[0]);
    CHECK(async_fiber_spawn(s, pipe_fiber, &m, 0) != NULL);
    sleep_ms(20);
    CHECK_EQ(write(p1[1], "hello", 5), 5);
    wait_count_within(&m.step, 1, 30000, "pipe fiber");
    CHECK_EQ(m.r1, 5);
    CHECK_EQ(m.r2, -1);
    CHECK_EQ(m.e2, ASYNC_E_CLOSED);
    async_sched_destroy(s);
    close(p1[1]);
    close(p2[1]);
}

/* ---- a ring op is submitted while its worker computes --------------------------- */

/* A worker that goes on to another fiber while another worker idles submits
 * its ring ops first (not only when it runs out of work): a fiber computing
 * on that worker does not hold back a read whose data is there. The
 * computing fiber waits (up to 5 s) to see the read complete. */
static int op_fd;
static _Atomic int busy_read_done, busy_saw_done;

static void computer(void *arg) {
    (void)arg;
    double t0 = now_ms();
    while (!atomic_load(&busy_read_done) && now_ms() - t0 < 5000) {
    }
    atomic_store(&busy_saw_done, atomic_load(&busy_read_done));
}

static async_sched_t *busy_s;

static void reader_with_computer(void *arg) {
    (void)arg;
    /* spawned from this fiber: it runs next, on this worker, once the read parks */
    CHECK(async_fiber_spawn(busy_s, computer, NULL, 0) != NULL);
    char b[4];
    ssize_t r = async_fiber_read(op_fd, b, sizeof b, 10000);
    CHECK_EQ(r, 1);
    atomic_store(&busy_read_done, 1);
}

CASE(uring_submit_while_busy) { // linux
    async_sched_t *s = mk_uring(2);
    if (!s) return;
    busy_s = s;
    for (int round = 0; round < 3; round++) {
        int sv[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        op_fd = sv[0];
        CHECK_EQ(write(sv[1], "x", 1), 1); /* the data is there before the read */
        atomic_store(&busy_read_done, 0);
        atomic_store(&busy_saw_done, 0);
        async_fiber_t *f = async_fiber_spawn(s, reader_with_computer, NULL, ASYNC_FIBER_JOINABLE);
        CHECK(f != NULL);
        CHECK_EQ(async_fiber_join(f, 20000), 0);
        sched_wait_parked(s, 0);
        /* the computer ends within 5 s either way; wait for it */
        async_sched_stats_t st;
        double t0 = now_ms();
        do {
            CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
            CHECK(now_ms() - t0 < 20000);
            if (st.fibers_runnable + st.fibers_running) sleep_ms(5);
        } while (st.fibers_runnable + st.fibers_running);
        printf("round %d: the computing fiber saw the read done: %d\n", round, atomic_load(&busy_saw_done));
        CHECK_EQ(atomic_load(&busy_saw_done), 1);
        close_pair(sv);
    }
    async_sched_destroy(s);
}

/* ---- more completions at once than the completion ring holds ---------------- */

/* One worker's CQ has 16384 entries (io_uring.c, LA_UR_CQ). More receives
 * than that complete while the worker computes (one worker: completions are
 * task work that runs at its next kernel entry, so they all land at once):
 * the kernel keeps the ones that do not fit aside (IORING_FEAT_NODROP) and
 * the worker must fetch them (reap, IORING_SQ_CQ_OVERFLOW). Every receive
 * must end with its own datagram. */
enum { OVF_N = 16384 + 616 };

static int ovf_fd[OVF_N];

static atomic_int ovf_done, ovf_bad, ovf_go;

static void ovf_reader(void *arg) {
    int i = (int)(intptr_t)arg;
    int v = -1;
    ssize_t r = async_fiber_read(ovf_fd[i], &v, sizeof v, 60000);
    if (r != (ssize_t)sizeof v || v != i) atomic_fetch_add(&ovf_bad, 1);
    atomic_fetch_add(&ovf_done, 1);
}

static void ovf_hog(void *arg) {
    (void)arg;
    /* no system call until every datagram is sent */
    while (!atomic_load(&ovf_go)) __asm__ volatile("" ::: "memory");
}

CASE(uring_cq_overflow) { // linux notsan
    int want = OVF_N + 256;
    if (raise_nofile(want) < want) {
        printf("RLIMIT_NOFILE cannot reach %d here: skipped\n", want);
        return;
    }
    async_sched_config_t cfg = {1, 16384, 0};
    async_sched_t *s = mk_uring_cfg(&cfg);
    if (!s) return;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    static struct sockaddr_in addr[OVF_N];
    for (int i = 0; i < OVF_N; i++) {
        ovf_fd[i] = socket(AF_INET, SOCK_DGRAM, 0);
        CHECK(ovf_fd[i] >= 0);
        CHECK_EQ(bind(ovf_fd[i], (struct sockaddr *)&a, sizeof a), 0);
        socklen_t len = sizeof addr[i];
        CHECK_EQ(getsockname(ovf_fd[i], (struct sockaddr *)&addr[i], &len), 0);
        CHECK(async_fiber_spawn(s, ovf_reader, (void *)(intptr_t)i, 0) != NULL);
    }
    sched_wait_parked(s, OVF_N); /* every receive is in the ring */
    CHECK(async_fiber_spawn(s, ovf_hog, NULL, 0) != NULL);
    async_sched_stats_t st;
    double t0 = now_ms();
    do { /* the hog runs: the worker makes no system call from here */
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        CHECK(now_ms() - t0 < 60000);
        sleep_ms(1);
    } while (st.fibers_parked != OVF_N || st.fibers_runnable != 0);
    int tx = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(tx >= 0);
    for (int i = 0; i < OVF_N; i++)
        CHECK_EQ(sendto(tx, &i, sizeof i, 0, (struct sockaddr *)&addr[i], sizeof addr[i]), (ssize_t)sizeof i);
    atomic_store(&ovf_go, 1);
    wait_count_within(&ovf_done, OVF_N, 60000, "receives past the completion ring");
    CHECK_EQ(atomic_load(&ovf_bad), 0);
    close(tx);
    for (int i = 0; i < OVF_N; i++) close(ovf_fd[i]);
    async_sched_destroy(s);
}

/* ---- a late cancel spares the next op at the same address ------------------- */

/* A ring op's record is on its fiber's stack, so the next read from the same
 * depth has the same address; a cancel names one op, not the address
 * (io_uring.c, ur_key). ASYNC_TEST_URING_CANCEL_DELAY_US (io_uring.c,
 * test-only, read when the rings are made) makes each cancel reach the
 * kernel that late. The first read's deadline passes and its cancel is held
 * back; its data comes first, and the read returns it (an op that completed
 * anyway keeps its result). The second read, from the same call site, is in
 * the ring when that cancel arrives: it must go on waiting and get its data. */
enum { LC_TIMEOUT_MS = 50, LC_DELAY_MS = 500 };

typedef struct {
    int fd[2];
    ssize_t got[2];
    int err[2];
    atomic_int step;
} late_cancel_t;

static void late_cancel_reader(void *arg) {
    late_cancel_t *m = arg;
    for (int i = 0; i < 2; i++) {
        char c = 0;
        m->got[i] = async_fiber_read(m->fd[i], &c, 1, i == 0 ? LC_TIMEOUT_MS : 10000);
        m->err[i] = m->got[i] < 0 ? async_last_error() : 0;
        atomic_store(&m->step, i + 1);
    }
}

CASE(uring_late_cancel_spares_next_read) { // linux
    char delay[32];
    snprintf(delay, sizeof delay, "%d", LC_DELAY_MS * 1000);
    setenv("ASYNC_TEST_URING_CANCEL_DELAY_US", delay, 1);
    async_sched_t *s = mk_uring(1); /* one ring: both reads go into it */
    unsetenv("ASYNC_TEST_URING_CANCEL_DELAY_US");
    if (!s) return;
    int a[2], b[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
    late_cancel_t m = {.fd = {a[0], b[0]}};
    CHECK(async_fiber_spawn(s, late_cancel_reader, &m, 0) != NULL);
    sched_wait_parked(s, 1); /* the first read is in the ring */
    double t0 = now_ms();
    /* after its deadline, before its late cancel */
    sleep_ms(LC_TIMEOUT_MS + 200);
    CHECK_EQ(write(a[1], "a", 1), 1);
    wait_count_within(&m.step, 1, 10000, "the first read");
    sched_wait_parked(s, 1); /* the second read is in the ring */
    double t1 = now_ms() - t0;
    if (m.got[0] != 1 || t1 > LC_TIMEOUT_MS + LC_DELAY_MS)
        printf("the first read's cancel came first (got %zd, second read started at %.0f ms): no race\n", m.got[0],
               t1);
    /* the first read's cancel has come by now */
    double wait = LC_TIMEOUT_MS + LC_DELAY_MS + 350 - (now_ms() - t0);
    if (wait > 0) sleep_ms((int)wait);
    CHECK_EQ(write(b[1], "b", 1), 1);
    wait_count_within(&m.step, 2, 10000, "the second read");
    printf("first read: %zd, second read: %zd (error %d)\n", m.got[0], m.got[1], m.err[1]);
    CHECK_EQ(m.got[1], 1);
    async_sched_destroy(s);
    close_pair(a);
    close_pair(b);
}

TEST_MAIN()
