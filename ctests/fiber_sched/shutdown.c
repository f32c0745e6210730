/* async_sched_shutdown: every wait a fiber is parked in (sleep, channel
 * send/recv/select, fd wait/read/write/accept, join, queue waits) returns
 * ASYNC_E_CANCELLED, a blocking call already running finishes, later parks
 * fail at once, a spawn fails; calls that complete at once still do. A fiber
 * that never parks makes shutdown time out. A read cancelled by shutdown
 * writes nothing into its buffer afterwards; shutdown racing hand-offs from
 * host threads loses no element and keeps no lock.
 * scripts/cross.sh builds this file for Windows and runs its cases under
 * wine, except those inside #if !defined(_WIN32). */
#include <pthread.h>
#include <stdatomic.h>
#if !defined(_WIN32)
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#endif

#include "fibers.h"

#if !defined(_WIN32) /* pipes, socketpair */
/* shutdown: one fiber parked in each kind of wait */
enum { W_SLEEP, W_RECV, W_SEND, W_SELECT, W_WAITFD, W_READ, W_WRITE, W_ACCEPT, W_JOIN, W_QDEQ, W_QENQ, W_NKINDS };
static const char *wait_names[W_NKINDS] = {"sleep", "recv", "send", "select", "wait_fd", "read",
                                           "write", "accept", "join", "queue_dequeue", "queue_enqueue"};

typedef struct {
    int kind;
    atomic_int returned;
    int err;
    int rc;
    double t;
} sd_t;

static struct {
    async_chan_t *empty, *full;
    int pipe_r, pipe2_r, sock_w, lfd;
    async_fiber_t *sleeper;
    async_queue_t *qempty, *qfull;
} sdw;

static void long_sleeper(void *arg) {
    (void)arg;
    async_fiber_sleep(3600 * 1000);
}

static void sd_waiter(void *arg) {
    sd_t *x = arg;
    int v = 0;
    char buf[64];
    int rc = 0;
    switch (x->kind) {
    case W_SLEEP: rc = async_fiber_sleep(3600 * 1000); break;
    case W_RECV: rc = async_chan_recv(sdw.empty, &v, -1); break;
    case W_SEND: rc = async_chan_send(sdw.full, &v, -1); break;
    case W_SELECT: {
        async_chan_op_t ops[2] = {{sdw.empty, ASYNC_CHAN_RECV, &v, 0}, {sdw.full, ASYNC_CHAN_SEND, &v, 0}};
        rc = async_chan_select(ops, 2, -1);
        break;
    }
    case W_WAITFD: rc = async_fiber_wait_fd(sdw.pipe2_r, ASYNC_EVENT_READ, -1); break;
    case W_READ: rc = (int)async_fiber_read(sdw.pipe_r, buf, sizeof buf, -1); break;
    case W_WRITE: {
        static char big[1 << 20];
        rc = (int)async_fiber_write(sdw.sock_w, big, sizeof big, -1);
        break;
    }
    case W_ACCEPT: rc = async_fiber_accept(sdw.lfd, NULL, NULL, -1); break;
    case W_JOIN: rc = async_fiber_join(sdw.sleeper, -1); break;
    case W_QDEQ: rc = async_queue_dequeue_wait(sdw.qempty, &v, sizeof v, NULL, -1) ? 0 : -1; break;
    case W_QENQ: rc = async_queue_enqueue_wait(sdw.qfull, &v, sizeof v, -1) ? 0 : -1; break;
    }
    x->rc = rc;
    x->err = async_last_error();
    x->t = now_ms();
    atomic_fetch_add(&x->returned, 1);
    /* a new park after shutdown fails at once */
    CHECK_FAIL(async_fiber_sleep(1000) == -1, ASYNC_E_CANCELLED);
}

static void blocking_nap(void *arg) {
    sleep_ms(200);
    *(int *)arg = 1;
}

static void sd_blocking(void *arg) {
    int *done = arg;
    CHECK_EQ(async_fiber_blocking(blocking_nap, done), 0); /* not cancelled */
    CHECK_EQ(*done, 1);
}

CASE(shutdown_waits) { // uring valgrind
    async_sched_t *s = sched_new(2);
    sdw.empty = async_chan_create(1, sizeof(int));
    sdw.full = async_chan_create(1, sizeof(int));
    int one = 1;
    CHECK_EQ(async_chan_send(sdw.full, &one, 0), 0);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    sdw.pipe_r = p[0];
    int p2[2];
    CHECK_EQ(pipe(p2), 0);
    sdw.pipe2_r = p2[0];
    int sp[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
    sdw.sock_w = sp[0];
    struct sockaddr_in addr;
    sdw.lfd = loopback_listener(4, &addr);
    sdw.sleeper = async_fiber_spawn(s, long_sleeper, NULL, ASYNC_FIBER_JOINABLE);
    sdw.qempty = async_queue_create(1, sizeof(int), 0);
    sdw.qfull = async_queue_create(1, sizeof(int), 0);
    CHECK(async_queue_enqueue(sdw.qfull, &one, sizeof one));
    sd_t x[W_NKINDS];
    memset(x, 0, sizeof x);
    for (int k = 0; k < W_NKINDS; k++) {
        x[k].kind = k;
        CHECK(async_fiber_spawn(s, sd_waiter, &x[k], 0));
    }
    int bdone = 0;
    spawn_until_parked(s, sd_blocking, &bdone, W_NKINDS + 2);
    for (int k = 0; k < W_NKINDS; k++) {
        if (atomic_load(&x[k].returned)) fprintf(stderr, "wait %s returned early: rc %d err %d\n", wait_names[k], x[k].rc, x[k].err);
        CHECK_EQ(atomic_load(&x[k].returned), 0);
    }
    double t0 = now_ms();
    CHECK_EQ(async_sched_shutdown(s, 10000), 0);
    for (int k = 0; k < W_NKINDS; k++) {
        if (x[k].rc != -1 || x[k].err != ASYNC_E_CANCELLED || atomic_load(&x[k].returned) != 1)
            fprintf(stderr, "wait %s: rc %d err %d\n", wait_names[k], x[k].rc, x[k].err);
        CHECK_EQ(x[k].rc, -1);
        CHECK_EQ(x[k].err, ASYNC_E_CANCELLED);
        CHECK_EQ(atomic_load(&x[k].returned), 1);
        CHECK(x[k].t >= t0);
    }
    CHECK_EQ(bdone, 1);
    CHECK_FAIL(async_fiber_spawn(s, nop_fiber, NULL, 0) == NULL, ASYNC_E_CANCELLED);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(async_sched_shutdown(s, 0), 0); /* idempotent */
    async_sched_destroy(s); /* frees the unjoined (cancelled-join) sleeper */
    close_pair(p);
    close_pair(p2);
    close_pair(sp);
    close(sdw.lfd);
    async_chan_destroy(sdw.empty);
    async_chan_destroy(sdw.full);
    async_queue_destroy(sdw.qempty);
    async_queue_destroy(sdw.qfull);
}

#endif /* !_WIN32 */

/* a fiber that never parks: shutdown times out, then it finishes */
static atomic_int spin_stop;
static void spinner(void *arg) {
    (void)arg;
    while (!atomic_load(&spin_stop)) sleep_ms(1); /* blocks its worker: allowed, just bad */
}

CASE(shutdown_timeout) { // uring valgrind
    async_sched_t *s = sched_new(2);
    CHECK(async_fiber_spawn(s, spinner, NULL, 0));
    sleep_ms(20);
    CHECK_FAIL(async_sched_shutdown(s, 50) == -1, ASYNC_E_TIMEDOUT);
    atomic_store(&spin_stop, 1);
    CHECK_EQ(async_sched_shutdown(s, -1), 0);
    async_sched_destroy(s);
}

#if !defined(_WIN32)

/* ---- after shutdown only waits are cancelled ----------------------------------
 * A call that completes at once (send to room, recv of a buffered element,
 * an uncontended lock, a join of a finished fiber) still succeeds after
 * async_sched_shutdown; one that has to wait fails with ASYNC_E_CANCELLED;
 * a fiber that only yields is not stopped. */

static atomic_int sn_go, sn_bad, sn_ready;
static void sn_nop(void *arg) { (void)arg; }

#define SN_EXPECT(expr, want_rc, want_err)                                                                     \
    do {                                                                                                       \
        int sn_rc_;                                                                                            \
        async_clear_error();                                                                                   \
        sn_rc_ = (expr);                                                                                       \
        if (sn_rc_ != (want_rc) || async_last_error() != (want_err)) {                                         \
            fprintf(stderr, "%s: %d (error %d), expected %d (error %d)\n", #expr, sn_rc_, async_last_error(),  \
                    (int)(want_rc), (int)(want_err));                                                          \
            atomic_fetch_add(&sn_bad, 1);                                                                      \
        }                                                                                                      \
    } while (0)

static void sn_fiber(void *arg)
{
    async_sched_t *s = arg;
    async_chan_t *c = async_chan_create(2, sizeof(int));
    async_mutex_t *m = async_mutex_create();
    async_mutex_t *held = async_mutex_create();
    async_cond_t *cv = async_cond_create();
    async_fiber_t *done;
    int v = 5;
    async_chan_op_t op;
    CHECK(c && m && held && cv);
    done = async_fiber_spawn(s, sn_nop, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(done != NULL);
    CHECK_EQ(async_mutex_trylock(held), 0);
    CHECK_EQ(async_fiber_join(done, -1), 0);
    done = async_fiber_spawn(s, sn_nop, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(done != NULL);
    atomic_store(&sn_ready, 1);
    while (!atomic_load(&sn_go))
        async_fiber_yield();
    /* completes at once */
    SN_EXPECT(async_chan_send(c, &v, -1), 0, ASYNC_OK);
    SN_EXPECT(async_chan_recv(c, &v, -1), 0, ASYNC_OK);
    SN_EXPECT(async_chan_send(c, &v, -1), 0, ASYNC_OK);
    memset(&op, 0, sizeof op);
    op.chan = c;
    op.dir = ASYNC_CHAN_RECV;
    op.elem = &v;
    SN_EXPECT(async_chan_select(&op, 1, -1), 0, ASYNC_OK);
    SN_EXPECT(async_mutex_lock(m, -1), 0, ASYNC_OK);
    SN_EXPECT(async_fiber_join(done, -1), 0, ASYNC_OK);
    /* has to wait */
    SN_EXPECT(async_cond_wait(cv, m, -1), -1, ASYNC_E_CANCELLED);
    SN_EXPECT(async_mutex_unlock(m), 0, ASYNC_OK);
    SN_EXPECT(async_chan_recv(c, &v, -1), -1, ASYNC_E_CANCELLED);
    SN_EXPECT(async_chan_select(&op, 1, -1), -1, ASYNC_E_CANCELLED);
    SN_EXPECT(async_fiber_sleep(0), -1, ASYNC_E_CANCELLED);
    async_chan_destroy(c);
    async_mutex_destroy(m);
    async_mutex_destroy(held);
    async_cond_destroy(cv);
}

CASE(shutdown_nowait) // adversarial
{
    async_sched_t *s = sched_new(2);
    double t0 = now_ms();
    CHECK(async_fiber_spawn(s, sn_fiber, s, 0) != NULL);
    while (!atomic_load(&sn_ready)) {
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(1);
    }
    for (;;) { /* the joinable nop_fiber has returned: its join completes at once */
        async_sched_stats_t st;
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        if (st.fibers_done_unjoined == 1)
            break;
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(1);
    }
    CHECK_FAIL(async_sched_shutdown(s, 0) == -1, ASYNC_E_TIMEDOUT);
    atomic_store(&sn_go, 1);
    CHECK_EQ(async_sched_shutdown(s, 30000), 0);
    CHECK_EQ(atomic_load(&sn_bad), 0);
    async_sched_destroy(s);
}

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

CASE(shutdown_buf) // uring adversarial
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

CASE(shutdown_handoff) // uring adversarial
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

#endif /* !_WIN32 */

TEST_MAIN()
