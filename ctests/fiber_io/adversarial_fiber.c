/* Fiber violations found by an adversarial tester who read only
 * include/async.h (docs/RELIABILITY.md, "Found by adversarial tests:
 * fibers"). One case per ctest test (group adv_fiber, see CMakeLists.txt).
 * Every wait is bounded: a regression fails the case instead of hanging it. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "check.h"


/* Waits (on the calling thread) until *flag is set; fails after `ms`. */
static void wait_flag(atomic_int *flag, int ms, const char *what) {
    double t0 = now_ms();
    while (!atomic_load(flag)) {
        if (now_ms() - t0 > ms) {
            fprintf(stderr, "%s: not done after %d ms\n", what, ms);
            fflush(stderr);
            _exit(1);
        }
        sleep_ms(1);
    }
}

/* ---- async_fiber_blocking: the pool grows while jobs outnumber idle threads */

/* A barrier of `parties` jobs that gives up at a deadline (pthread barriers
 * cannot time out). Jobs that all run at once meet; with fewer pool threads
 * than jobs the ones queued behind never start and the others time out. */
static pthread_mutex_t meet_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t meet_cv;
static int meet_parties, meet_arrived, meet_ok;
static struct timespec meet_deadline;

static void meet_job(void *arg) {
    (void)arg;
    pthread_mutex_lock(&meet_mu);
    meet_arrived++;
    pthread_cond_broadcast(&meet_cv);
    while (meet_arrived < meet_parties) {
        if (pthread_cond_timedwait(&meet_cv, &meet_mu, &meet_deadline) == ETIMEDOUT) break;
    }
    if (meet_arrived >= meet_parties) meet_ok++;
    pthread_mutex_unlock(&meet_mu);
}

static void meet_fiber(void *arg) { CHECK_EQ(async_fiber_blocking(meet_job, arg), 0); }

static void warm_job(void *arg) {
    (void)arg;
    sleep_ms(20);
}

static void warm_fiber(void *arg) { CHECK_EQ(async_fiber_blocking(warm_job, arg), 0); }

/* The header: the pool "grows on demand up to 64 threads"; only jobs beyond
 * 64 wait. Before the fix a submission spawned a thread only when no thread
 * was idle, so one idle thread, already claimed by the job queued just
 * before, made each following submission wait for it: N jobs that must run
 * together (here a barrier of N; the tester's case was a 2-party barrier)
 * deadlocked. The pool starts with one idle thread (a warm-up job), and each
 * round submits twice as many jobs as the rounds before left idle threads. */
static void t_blocking_grow(void) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&meet_cv, &ca);
    async_sched_t *s = sched_new(2);
    CHECK(async_fiber_spawn(s, warm_fiber, NULL, 0));
    CHECK_EQ(async_sched_run(s), 0);
    sleep_ms(50); /* the warm-up thread is idle now */
    for (int n = 2; n <= 32; n *= 2) {
        pthread_mutex_lock(&meet_mu);
        meet_parties = n;
        meet_arrived = 0;
        meet_ok = 0;
        clock_gettime(CLOCK_MONOTONIC, &meet_deadline);
        meet_deadline.tv_sec += 5;
        pthread_mutex_unlock(&meet_mu);
        for (int i = 0; i < n; i++) CHECK(async_fiber_spawn(s, meet_fiber, NULL, 0));
        CHECK_EQ(async_sched_run(s), 0);
        pthread_mutex_lock(&meet_mu);
        int ok = meet_ok, arrived = meet_arrived;
        pthread_mutex_unlock(&meet_mu);
        if (ok != n) fprintf(stderr, "%d jobs: %d met within 5 s (%d ran at all)\n", n, ok, arrived);
        CHECK_EQ(ok, n);
    }
    async_sched_destroy(s);
}

/* ---- async_fiber_read/write with n == 0 return 0 at once ------------------ */

static void tcp_pair(int sv[2]) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    CHECK_EQ(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    CHECK_EQ(listen(l, 1), 0);
    CHECK_EQ(getsockname(l, (struct sockaddr *)&a, &len), 0);
    sv[0] = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(sv[0] >= 0);
    CHECK_EQ(connect(sv[0], (struct sockaddr *)&a, sizeof a), 0);
    sv[1] = accept(l, NULL, NULL);
    CHECK(sv[1] >= 0);
    close(l);
}

typedef struct {
    int fds[4]; /* two idle socket pairs: AF_UNIX stream, TCP */
    int closed; /* a closed fd number */
    atomic_int done;
} zero_t;

/* Runs on a fiber or a plain thread. */
static void zero_calls(zero_t *z) {
    static const int tmo[] = {-1, 100, 0};
    char buf[4];
    for (int i = 0; i < 4; i++) {
        for (int t = 0; t < 3; t++) {
            CHECK_EQ(async_fiber_read(z->fds[i], buf, 0, tmo[t]), 0);
            CHECK_EQ(async_fiber_read(z->fds[i], NULL, 0, tmo[t]), 0);
            CHECK_EQ(async_fiber_write(z->fds[i], buf, 0, tmo[t]), 0);
            CHECK_EQ(async_fiber_write(z->fds[i], NULL, 0, tmo[t]), 0);
        }
    }
    /* a zero-length read takes nothing: the byte is still there after it */
    CHECK_EQ(async_fiber_write(z->fds[0], "x", 1, 1000), 1);
    CHECK_EQ(async_fiber_read(z->fds[1], buf, 0, -1), 0);
    CHECK_EQ(async_fiber_read(z->fds[1], buf, sizeof buf, 1000), 1);
    CHECK_EQ(buf[0], 'x');
    /* the arguments are still checked as documented */
    CHECK_FAIL(async_fiber_read(z->closed, buf, 0, -1) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_write(z->closed, buf, 0, -1) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_read(-1, buf, 0, -1) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_read(z->fds[0], buf, 0, -2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_write(z->fds[0], buf, 0, -2) == -1, ASYNC_E_INVAL);
    atomic_store(&z->done, 1);
}

static void zero_fiber(void *arg) { zero_calls(arg); }

static void *zero_thread(void *arg) {
    zero_calls(arg);
    return NULL;
}

static void zero_setup(zero_t *z) {
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, z->fds), 0);
    tcp_pair(z->fds + 2);
    z->closed = 1000; /* far above the numbers this process opens */
    CHECK(fcntl(z->closed, F_GETFD) == -1 && errno == EBADF);
    atomic_store(&z->done, 0);
}

static void zero_teardown(zero_t *z) {
    for (int i = 0; i < 4; i++) close(z->fds[i]);
}

/* The header: "Reads up to n bytes (at least 1 unless n is 0 or at end of
 * file: returns 0)". Before the fix a read of 0 bytes on an idle socket
 * waited for data (recv of 0 bytes says EAGAIN there) and returned
 * ASYNC_E_TIMEDOUT, or never with timeout -1. */
static void t_read_zero_fiber(void) {
    static zero_t z;
    zero_setup(&z);
    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, zero_fiber, &z, 0));
    wait_flag(&z.done, 10000, "zero-length reads and writes on a fiber");
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    zero_teardown(&z);
}

static void t_read_zero_thread(void) {
    static zero_t z;
    zero_setup(&z);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, zero_thread, &z), 0);
    wait_flag(&z.done, 10000, "zero-length reads and writes on a plain thread");
    pthread_join(th, NULL);
    zero_teardown(&z);
}

/* ---- async_fiber_wait_fd: ASYNC_E_BUSY only for a call that must wait ---- */

typedef struct {
    int fd;
    atomic_int a_done, b_done;
    int a_ret, b_both, b_read, b_read_err;
} busy_t;

static void busy_a(void *arg) {
    busy_t *b = arg;
    b->a_ret = async_fiber_wait_fd(b->fd, ASYNC_EVENT_READ, 10000);
    atomic_store(&b->a_done, 1);
}

static void busy_b(void *arg) {
    busy_t *b = arg;
    /* the fd is writable: nothing to wait for, so no ASYNC_E_BUSY */
    b->b_both = async_fiber_wait_fd(b->fd, ASYNC_EVENT_READ | ASYNC_EVENT_WRITE, 1000);
    /* reading would have to wait, and another fiber waits to read */
    async_clear_error();
    b->b_read = async_fiber_wait_fd(b->fd, ASYNC_EVENT_READ, 1000);
    b->b_read_err = async_last_error();
    atomic_store(&b->b_done, 1);
}

/* The tester's borderline note: while fiber A waits to read an idle but
 * writable socket, fiber B's wait_fd(READ|WRITE) returns WRITE at once
 * rather than ASYNC_E_BUSY. Within the header's promise (B does not wait);
 * the header now says so. B's wait for READ alone gets ASYNC_E_BUSY. */
static void t_wait_fd_busy(void) {
    static busy_t b;
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    b.fd = sv[0];
    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, busy_a, &b, 0));
    async_sched_stats_t st;
    double t0 = now_ms();
    do {
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        CHECK(now_ms() - t0 < 10000);
        sleep_ms(1);
    } while (st.fibers_parked != 1);
    CHECK(async_fiber_spawn(s, busy_b, &b, 0));
    wait_flag(&b.b_done, 10000, "second waiter");
    CHECK_EQ(b.b_both, ASYNC_EVENT_WRITE);
    CHECK_EQ(b.b_read, -1);
    CHECK_EQ(b.b_read_err, ASYNC_E_BUSY);
    CHECK_EQ(write(sv[1], "x", 1), 1);
    wait_flag(&b.a_done, 10000, "first waiter");
    CHECK(b.a_ret > 0 && (b.a_ret & ASYNC_EVENT_READ));
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    close(sv[0]);
    close(sv[1]);
}

static const test_case_t cases[] = {
    T(blocking_grow), // adversarial
    T(read_zero_fiber), // uring adversarial
    T(read_zero_thread), // adversarial
    T(wait_fd_busy), // uring adversarial
};

TEST_MAIN(cases)
