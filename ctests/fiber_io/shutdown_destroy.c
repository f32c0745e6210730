/* Scheduler shutdown and destroy while fibers sit in each fiber I/O call
 * (read, write, accept, wait_fd, on sockets and pipes; a connect still in
 * progress): every parked call ends with ASYNC_E_CANCELLED and a cancelled
 * receive takes nothing; calls that begin after the shutdown end at once;
 * destroy racing async_fiber_close and fd_open of owned fds from host
 * threads. (With every worker busy: busy_workers.c.) Every wait is
 * bounded. */
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>

#include "check.h"
#include "net.h"

/* Fills socket and pipe buffers. */
static char bigbuf[8 << 20];

/* ---- shutdown while fibers sit in each call ------------------------------------------ */

static atomic_int sd_errs[8];

static int sd_fds[8];

static struct sockaddr_in sd_sa;

/* The fibers of parked_end: fiber i makes its call on sd_fds[i] and keeps
 * the error it ends with in sd_errs[i]. */
static void sd_set(void *a, ssize_t r) {
    atomic_store(&sd_errs[(intptr_t)a], r == -1 ? async_last_error() : 0);
}

static void sd_read(void *a) {
    char b[4];
    sd_set(a, async_fiber_read(sd_fds[(intptr_t)a], b, 4, -1));
}

static void sd_write(void *a) {
    sd_set(a, async_fiber_write(sd_fds[(intptr_t)a], bigbuf, sizeof bigbuf, -1));
}

static void sd_accept(void *a) {
    sd_set(a, async_fiber_accept(sd_fds[(intptr_t)a], NULL, NULL, -1));
}

static void sd_wait(void *a) {
    sd_set(a, async_fiber_wait_fd(sd_fds[(intptr_t)a], ASYNC_EVENT_READ, -1));
}

static void *destroy_thread(void *arg) {
    async_sched_destroy(arg);
    return NULL;
}

static void parked_end(int destroy) {
    async_sched_t *s = sched_new(2);
    int sp[2], sq[2], pp[2], pq[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sq), 0);
    CHECK_EQ(pipe2(pp, O_CLOEXEC), 0);
    CHECK_EQ(pipe2(pq, O_CLOEXEC), 0);
    int l = loopback_listener(16, &sd_sa);
    sd_fds[0] = sp[0];
    sd_fds[1] = sq[0];
    sd_fds[2] = l;
    sd_fds[3] = sp[1];
    sd_fds[4] = pp[0];
    sd_fds[5] = pq[1];
    /* a socket and a pipe read and written, an accept, a wait_fd */
    void (*fns[6])(void *) = {sd_read, sd_write, sd_accept, sd_wait, sd_read, sd_write};
    for (int i = 0; i < 6; i++) {
        atomic_store(&sd_errs[i], -1);
        CHECK(async_fiber_spawn(s, fns[i], (void *)(intptr_t)i, 0) != NULL);
    }
    sched_wait_parked(s, 6);
    if (destroy) {
        pthread_t th;
        start_thread(&th, destroy_thread, s);
        join_within(th, 10000, "async_sched_destroy with fibers parked in I/O");
    } else {
        CHECK_EQ(async_sched_shutdown(s, 10000), 0);
    }
    for (int i = 0; i < 6; i++) {
        printf("call %d -> %d\n", i, atomic_load(&sd_errs[i]));
        CHECK_EQ(atomic_load(&sd_errs[i]), ASYNC_E_CANCELLED);
    }
    if (!destroy) async_sched_destroy(s);
    close_pair(sp);
    close_pair(sq);
    close_pair(pp);
    close_pair(pq);
    close(l);
}

CASE(shutdown_parked) { parked_end(0); } // uring adversarial

CASE(destroy_parked) { parked_end(1); } // uring adversarial

/* ---- connect in progress when the scheduler shuts down -------------------------------------- */

static atomic_int cp_err = -1;

static int cp_fd;

static struct sockaddr_in cp_sa;

static void cp_connect(void *arg) {
    (void)arg;
    int r = async_fiber_connect(cp_fd, (struct sockaddr *)&cp_sa, sizeof cp_sa, -1);
    atomic_store(&cp_err, r == -1 ? async_last_error() : 0);
}

/* A listener whose backlog is full drops SYNs: a connect stays in progress. */
CASE(connect_shutdown) { // uring adversarial
    int l = loopback_listener(0, &cp_sa);
    int fill[8], nf = 0;
    for (; nf < 8; nf++) {
        fill[nf] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        connect(fill[nf], (struct sockaddr *)&cp_sa, sizeof cp_sa);
    }
    sleep_ms(50);
    /* is the next connect left in progress? */
    cp_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    async_sched_t *s = sched_new(2);
    CHECK(async_fiber_spawn(s, cp_connect, NULL, 0) != NULL);
    double t0 = now_ms();
    async_sched_stats_t st;
    for (;;) {
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        if (st.fibers_parked == 1 || atomic_load(&cp_err) != -1 || now_ms() - t0 > 5000) break;
        sleep_ms(1);
    }
    if (atomic_load(&cp_err) != -1) {
        printf("skipped: the connect did not stay in progress (%d)\n", atomic_load(&cp_err));
    } else {
        CHECK_EQ(st.fibers_parked, 1);
        CHECK_EQ(async_sched_shutdown(s, 10000), 0);
        CHECK_EQ(atomic_load(&cp_err), ASYNC_E_CANCELLED);
    }
    async_sched_destroy(s);
    close(cp_fd);
    for (int i = 0; i < nf; i++) close(fill[i]);
    close(l);
}

/* ---- calls that begin after the shutdown: every one that would park ends
 * with ASYNC_E_CANCELLED at once (a timeout of -1 included) ------------------------------------------- */

static int late_sp[2], late_full[2], late_l;

static struct sockaddr_in late_sa;

static atomic_int late_res[6];

static void late_calls(void *arg) {
    (void)arg;
    while (async_fiber_sleep(5) == 0) {
    }
    char b[4];
    atomic_store(&late_res[0], async_fiber_read(late_sp[0], b, 4, -1) == -1 ? async_last_error() : 0);
    atomic_store(&late_res[1], async_fiber_write(late_full[0], bigbuf, 1 << 20, -1) == -1 ? async_last_error() : 0);
    atomic_store(&late_res[2], async_fiber_accept(late_l, NULL, NULL, -1) == -1 ? async_last_error() : 0);
    atomic_store(&late_res[3], async_fiber_wait_fd(late_sp[0], ASYNC_EVENT_READ, -1) == -1 ? async_last_error() : 0);
    atomic_store(&late_res[4], async_fiber_read(late_sp[0], b, 4, 100000) == -1 ? async_last_error() : 0);
    /* data there: a call that need not park returns it */
    CHECK_EQ(write(late_sp[1], "d", 1), 1);
    atomic_store(&late_res[5], (int)async_fiber_read(late_sp[0], b, 4, -1));
}

CASE(calls_after_shutdown) { // uring adversarial
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, late_sp), 0);
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, late_full), 0);
    while (write(late_full[0], bigbuf, 65536) > 0) {
    }
    late_l = loopback_listener(16, &late_sa);
    async_sched_t *s = sched_new(2);
    for (int i = 0; i < 6; i++) atomic_store(&late_res[i], -1);
    CHECK(async_fiber_spawn(s, late_calls, NULL, 0) != NULL);
    sleep_ms(20);
    CHECK_EQ(async_sched_shutdown(s, 10000), 0);
    for (int i = 0; i < 5; i++) {
        printf("late call %d -> %d\n", i, atomic_load(&late_res[i]));
        CHECK_EQ(atomic_load(&late_res[i]), ASYNC_E_CANCELLED);
    }
    CHECK_EQ(atomic_load(&late_res[5]), 1);
    async_sched_destroy(s);
    close_pair(late_sp);
    close_pair(late_full);
    close(late_l);
}

/* ---- destroy racing async_fiber_close / fd_open of owned fds from host
 * threads while fibers are parked on them; afterwards no number is left
 * owned by the dead scheduler ---- */

#define DR_N 24

static int dr_sv[DR_N][2];

static atomic_int dr_closed[DR_N];

static atomic_int dr_go;

static async_sched_t *dr_s;

static void dr_reader(void *arg)
{
    int i = (int)(intptr_t)arg;
    char b;
    ssize_t n = async_fiber_read(dr_sv[i][1], &b, 1, -1);
    int e = async_last_error();
    CHECK(n < 0);
    CHECK(e == ASYNC_E_CLOSED || e == ASYNC_E_CANCELLED);
}

static void *dr_closer(void *arg)
{
    int half = (int)(intptr_t)arg;
    while (!atomic_load(&dr_go))
        ;
    for (int i = half; i < DR_N; i += 2) {
        if (i % 4 < 2) {
            CHECK_EQ(async_fiber_close(dr_sv[i][1]), 0);
            atomic_store(&dr_closed[i], 1);
        } else {
            /* already owned (by s, or by nobody once destroy released it) */
            int r = async_fiber_fd_open(dr_s, dr_sv[i][1]);
            int e = async_last_error();
            CHECK(r == 0 || e == ASYNC_E_EXISTS || e == ASYNC_E_BADHANDLE || e == ASYNC_E_STATE);
        }
    }
    return NULL;
}

static void *dr_destroyer(void *arg)
{
    (void)arg;
    while (!atomic_load(&dr_go))
        ;
    async_sched_destroy(dr_s);
    return NULL;
}

CASE(destroy_races_owned_close) // uring adversarial
{
    for (int round = 0; round < 8; round++) {
        dr_s = sched_new(2 + round % 3);
        atomic_store(&dr_go, 0);
        for (int i = 0; i < DR_N; i++) {
            atomic_store(&dr_closed[i], 0);
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, dr_sv[i]), 0);
            CHECK_EQ(async_fiber_fd_open(dr_s, dr_sv[i][1]), 0);
            CHECK(async_fiber_spawn(dr_s, dr_reader, (void *)(intptr_t)i, 0) != NULL);
        }
        sched_wait_parked(dr_s, DR_N);
        pthread_t c0, c1, d;
        start_thread(&c0, dr_closer, (void *)0);
        start_thread(&c1, dr_closer, (void *)1);
        start_thread(&d, dr_destroyer, NULL);
        atomic_store(&dr_go, 1);
        join_within(c0, BOUND_MS, "closer 0");
        join_within(c1, BOUND_MS, "closer 1");
        join_within(d, BOUND_MS, "async_sched_destroy");
        /* every number still open is owned by nobody: a new scheduler takes it */
        async_sched_t *s2 = sched_new(1);
        for (int i = 0; i < DR_N; i++) {
            if (!atomic_load(&dr_closed[i])) {
                CHECK_EQ(async_fiber_fd_open(s2, dr_sv[i][1]), 0);
                CHECK_EQ(async_fiber_close(dr_sv[i][1]), 0);
            }
            close(dr_sv[i][0]);
        }
        sched_finish(s2, BOUND_MS);
    }
}

/* ---- shutdown and destroy with receives in flight ------------------------------- */

typedef struct {
    int fd;
    int err;
    atomic_int *parked, *done;
} park_t;

static void park_reader(void *arg) {
    park_t *p = arg;
    char buf[16];
    atomic_fetch_add(p->parked, 1);
    ssize_t r = async_fiber_read(p->fd, buf, sizeof buf, -1);
    p->err = r < 0 ? async_last_error() : -1;
    atomic_fetch_add(p->done, 1);
}

static void park_acceptor(void *arg) {
    park_t *p = arg;
    atomic_fetch_add(p->parked, 1);
    int r = async_fiber_accept(p->fd, NULL, NULL, -1);
    p->err = r < 0 ? async_last_error() : -1;
    atomic_fetch_add(p->done, 1);
}

#define PARK_N 64

static void inflight(int destroy_only) {
    async_sched_t *s = sched_new(2);
    int sv[PARK_N][2];
    park_t p[PARK_N + 1];
    atomic_int parked = 0, done = 0;
    for (int i = 0; i < PARK_N; i++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]), 0);
        p[i] = (park_t){sv[i][0], 0, &parked, &done};
        CHECK(async_fiber_spawn(s, park_reader, &p[i], 0) != NULL);
    }
    struct sockaddr_in a;
    int lfd = loopback_listener(1024, &a);
    p[PARK_N] = (park_t){lfd, 0, &parked, &done};
    CHECK(async_fiber_spawn(s, park_acceptor, &p[PARK_N], 0) != NULL);
    wait_count_within(&parked, PARK_N + 1, 30000, "parking");
    /* each is parked (or about to): stats say when all are */
    sched_wait_parked(s, PARK_N + 1);
    if (!destroy_only) CHECK_EQ(async_sched_shutdown(s, 30000), 0);
    async_sched_destroy(s);
    CHECK_EQ(atomic_load(&done), PARK_N + 1);
    for (int i = 0; i <= PARK_N; i++) CHECK_EQ(p[i].err, ASYNC_E_CANCELLED);
    for (int i = 0; i < PARK_N; i++) {
        /* the cancelled receives took nothing */
        CHECK_EQ(write(sv[i][1], "x", 1), 1);
        char c;
        CHECK_EQ(read(sv[i][0], &c, 1), 1);
        close_pair(sv[i]);
    }
    close(lfd);
}

CASE(shutdown_inflight) { inflight(0); } // linux uring

CASE(destroy_inflight) { inflight(1); } // linux uring

TEST_MAIN()
