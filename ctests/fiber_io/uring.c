/* Fiber I/O through io_uring (issue 13 item 3; docs/FIBERS.md "io_uring"):
 * ASYNC_FIBER_IO=uring. Each case makes its schedulers with the variable
 * set and learns from the INFO log line whether the rings are in use; where
 * io_uring is unavailable (old kernel, seccomp, kernel.io_uring_disabled)
 * the case prints "skipped" and passes. Every wait is bounded. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "check.h"

#define LA_TEST_NOINLINE __attribute__((noinline))

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

static void tcp_listener(int *lfd, struct sockaddr_in *addr) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    CHECK_EQ(listen(l, 1024), 0);
    socklen_t len = sizeof a;
    CHECK_EQ(getsockname(l, (struct sockaddr *)&a, &len), 0);
    *lfd = l;
    *addr = a;
}

static void run_until(async_sched_t *s, atomic_int *done, int want, int ms, const char *what) {
    double t0 = now_ms();
    while (atomic_load(done) < want) {
        if (now_ms() - t0 > ms) {
            fprintf(stderr, "%s: %d of %d done after %d ms\n", what, atomic_load(done), want, ms);
            fflush(stderr);
            _exit(1);
        }
        sleep_ms(2);
    }
    (void)s;
}

/* ---- the rings are used only when asked for --------------------------------- */

static void t_selected(void) {
    setenv("ASYNC_FIBER_IO", "epoll", 1);
    atomic_store(&log_uring, 0);
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_INFO, log_fn, NULL), 0);
    async_sched_config_t cfg = {1, 0, 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s != NULL);
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

static void t_nofile_fallback(void) {
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
    run_until(s, &r.done, 1, 5000, "nofile_fallback read");
    CHECK_EQ(r.got, 1);
    async_sched_destroy(s);
    close(sv[0]);
    close(sv[1]);
}

/* ---- echo: accept, connect, read, write through the rings -------------------- */

#define ECHO_CONNS 200
#define ECHO_MSGS 200

typedef struct {
    async_sched_t *s;
    int lfd;
    struct sockaddr_in addr;
    atomic_int done, served;
    atomic_int bad;
} echo_t;

typedef struct {
    echo_t *e;
    int fd;
} conn_t;

static void echo_serve(void *arg) {
    conn_t *c = arg;
    char buf[4096];
    for (;;) {
        ssize_t r = async_fiber_read(c->fd, buf, sizeof buf, 10000);
        if (r <= 0) break;
        if (async_fiber_write(c->fd, buf, (size_t)r, 10000) != r) {
            atomic_store(&c->e->bad, 1);
            break;
        }
    }
    close(c->fd);
    atomic_fetch_add(&c->e->served, 1);
    free(c);
}

static void echo_accept(void *arg) {
    echo_t *e = arg;
    for (int i = 0; i < ECHO_CONNS; i++) {
        struct sockaddr_in peer;
        socklen_t len = sizeof peer;
        int fd = async_fiber_accept(e->lfd, (struct sockaddr *)&peer, &len, 10000);
        if (fd < 0) {
            atomic_store(&e->bad, 2);
            return;
        }
        int fl = fcntl(fd, F_GETFL), fdfl = fcntl(fd, F_GETFD);
        if (!(fl & O_NONBLOCK) || !(fdfl & FD_CLOEXEC) || len != sizeof peer || peer.sin_family != AF_INET)
            atomic_store(&e->bad, 3);
        conn_t *c = malloc(sizeof *c);
        c->e = e;
        c->fd = fd;
        CHECK(async_fiber_spawn(e->s, echo_serve, c, 0) != NULL);
    }
}

static void echo_client(void *arg) {
    echo_t *e = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || async_fiber_connect(fd, (struct sockaddr *)&e->addr, sizeof e->addr, 10000) != 0) {
        atomic_store(&e->bad, 4);
        if (fd >= 0) close(fd);
        atomic_fetch_add(&e->done, 1);
        return;
    }
    unsigned seed = (unsigned)fd * 2654435761u;
    char out[2000], in[2000];
    for (int m = 0; m < ECHO_MSGS; m++) {
        size_t n = 1 + (seed = seed * 1103515245u + 12345u) % sizeof out;
        for (size_t i = 0; i < n; i++) out[i] = (char)(m + i);
        if (async_fiber_write(fd, out, n, 10000) != (ssize_t)n) {
            atomic_store(&e->bad, 5);
            break;
        }
        size_t got = 0;
        while (got < n) {
            ssize_t r = async_fiber_read(fd, in + got, n - got, 10000);
            if (r <= 0) break;
            got += (size_t)r;
        }
        if (got != n || memcmp(in, out, n) != 0) {
            atomic_store(&e->bad, 6);
            break;
        }
    }
    close(fd);
    atomic_fetch_add(&e->done, 1);
}

static void echo_with(int workers) {
    async_sched_t *s = mk_uring(workers);
    if (!s) return;
    echo_t e;
    memset(&e, 0, sizeof e);
    e.s = s;
    tcp_listener(&e.lfd, &e.addr);
    CHECK(async_fiber_spawn(s, echo_accept, &e, 0) != NULL);
    for (int i = 0; i < ECHO_CONNS; i++) CHECK(async_fiber_spawn(s, echo_client, &e, 0) != NULL);
    run_until(s, &e.done, ECHO_CONNS, 60000, "echo clients");
    run_until(s, &e.served, ECHO_CONNS, 60000, "echo servers");
    CHECK_EQ(atomic_load(&e.bad), 0);
    /* the listening socket was switched to O_NONBLOCK, as promised */
    CHECK(fcntl(e.lfd, F_GETFL) & O_NONBLOCK);
    async_sched_destroy(s);
    close(e.lfd);
}

static void t_echo_1(void) { echo_with(1); }
static void t_echo_4(void) { echo_with(4); }

/* ---- timeouts lose no data ------------------------------------------------------- */

#define TO_BYTES 20000

typedef struct {
    int fd;
    atomic_int done;
    int got, timeouts, bad;
} tord_t;

static void to_reader(void *arg) {
    tord_t *t = arg;
    unsigned char buf[64];
    while (t->got < TO_BYTES) {
        ssize_t r = async_fiber_read(t->fd, buf, sizeof buf, 1);
        if (r < 0) {
            if (async_last_error() != ASYNC_E_TIMEDOUT) {
                t->bad = 1;
                break;
            }
            t->timeouts++;
            continue;
        }
        if (r == 0) {
            t->bad = 2;
            break;
        }
        for (ssize_t i = 0; i < r; i++)
            if (buf[i] != (unsigned char)(t->got + i)) t->bad = 3;
        t->got += (int)r;
    }
    atomic_store(&t->done, 1);
}

/* A reader with a 1 ms timeout against a writer that trickles bytes: every
 * park races its cancellation against the data; each byte arrives once, in
 * order (a cancelled receive that got data returns it). */
static void t_timeout_no_loss(void) {
    async_sched_t *s = mk_uring(1);
    if (!s) return;
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    tord_t t;
    memset(&t, 0, sizeof t);
    t.fd = sv[0];
    CHECK(async_fiber_spawn(s, to_reader, &t, 0) != NULL);
    unsigned char b[7];
    int sent = 0;
    while (sent < TO_BYTES) {
        int n = TO_BYTES - sent < 7 ? TO_BYTES - sent : 1 + sent % 7;
        for (int i = 0; i < n; i++) b[i] = (unsigned char)(sent + i);
        CHECK_EQ(write(sv[1], b, (size_t)n), n);
        sent += n;
        if (sent % 97 < 7) {
            struct timespec ts = {0, 900000};
            nanosleep(&ts, NULL);
        }
    }
    run_until(s, &t.done, 1, 30000, "reader");
    CHECK_EQ(t.bad, 0);
    CHECK_EQ(t.got, TO_BYTES);
    printf("%d timeouts\n", t.timeouts);
    async_sched_destroy(s);
    close(sv[0]);
    close(sv[1]);
}

/* ---- a timed-out receive never writes into a stack that was given back ---------- */

typedef struct {
    async_sched_t *s;
    int fd;
    atomic_int step;
    int err;
    int intact;
    ssize_t later;
} reuse_t;

/* Reads into a buffer deep on its stack and times out. */
static LA_TEST_NOINLINE void reuse_first(void *arg) {
    reuse_t *x = arg;
    volatile char pad[8192];
    pad[0] = 1;
    char buf[4096];
    ssize_t r = async_fiber_read(x->fd, buf, sizeof buf, 20);
    x->err = r < 0 ? async_last_error() : -1;
    (void)pad[0];
    atomic_store(&x->step, 1);
}

/* Runs on the stack the first fiber gave back (one worker: its cache hands
 * it out next) and fills the same region; the peer's data must not land in
 * it. */
static LA_TEST_NOINLINE void reuse_second(void *arg) {
    reuse_t *x = arg;
    volatile char area[24576]; /* covers the first fiber's frames */
    for (size_t i = 0; i < sizeof area; i++) area[i] = 0x5a;
    atomic_store(&x->step, 2);
    while (atomic_load(&x->step) != 3) async_fiber_sleep(1);
    async_fiber_sleep(30); /* time for a stray receive to land */
    x->intact = 1;
    for (size_t i = 0; i < sizeof area; i++)
        if (area[i] != 0x5a) x->intact = 0;
    char buf[64];
    x->later = async_fiber_read(x->fd, buf, sizeof buf, 5000);
    atomic_store(&x->step, 4);
}

/* Spawned on the worker, one after the other: the second gets the stack
 * the first gave back (the worker's stack cache is LIFO). */
static void reuse_driver(void *arg) {
    reuse_t *x = arg;
    async_fiber_t *a = async_fiber_spawn(x->s, reuse_first, x, ASYNC_FIBER_JOINABLE);
    CHECK(a != NULL);
    CHECK_EQ(async_fiber_join(a, 30000), 0);
    CHECK(async_fiber_spawn(x->s, reuse_second, x, 0) != NULL);
}

static void t_timeout_stack_reuse(void) {
    async_sched_t *s = mk_uring(1);
    if (!s) return;
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    reuse_t x;
    memset(&x, 0, sizeof x);
    x.fd = sv[0];
    x.s = s;
    CHECK(async_fiber_spawn(s, reuse_driver, &x, 0) != NULL);
    run_until(s, &x.step, 2, 30000, "second fiber");
    CHECK_EQ(x.err, ASYNC_E_TIMEDOUT);
    char data[64];
    memset(data, 0xee, sizeof data);
    CHECK_EQ(write(sv[1], data, sizeof data), (ssize_t)sizeof data);
    atomic_store(&x.step, 3);
    run_until(s, &x.step, 4, 30000, "second fiber's read");
    CHECK_EQ(x.intact, 1);
    CHECK_EQ(x.later, (ssize_t)sizeof data); /* the cancelled receive took nothing */
    async_sched_destroy(s);
    close(sv[0]);
    close(sv[1]);
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
    async_sched_t *s = mk_uring(2);
    if (!s) return;
    int sv[PARK_N][2];
    park_t p[PARK_N + 1];
    atomic_int parked = 0, done = 0;
    for (int i = 0; i < PARK_N; i++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]), 0);
        p[i] = (park_t){sv[i][0], 0, &parked, &done};
        CHECK(async_fiber_spawn(s, park_reader, &p[i], 0) != NULL);
    }
    int lfd;
    struct sockaddr_in a;
    tcp_listener(&lfd, &a);
    p[PARK_N] = (park_t){lfd, 0, &parked, &done};
    CHECK(async_fiber_spawn(s, park_acceptor, &p[PARK_N], 0) != NULL);
    run_until(s, &parked, PARK_N + 1, 30000, "parking");
    /* each is parked (or about to): stats say when all are */
    for (double t0 = now_ms();;) {
        async_sched_stats_t st;
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        if (st.fibers_parked == PARK_N + 1) break;
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(2);
    }
    if (!destroy_only) CHECK_EQ(async_sched_shutdown(s, 30000), 0);
    async_sched_destroy(s);
    CHECK_EQ(atomic_load(&done), PARK_N + 1);
    for (int i = 0; i <= PARK_N; i++) CHECK_EQ(p[i].err, ASYNC_E_CANCELLED);
    for (int i = 0; i < PARK_N; i++) {
        /* the cancelled receives took nothing */
        CHECK_EQ(write(sv[i][1], "x", 1), 1);
        char c;
        CHECK_EQ(read(sv[i][0], &c, 1), 1);
        close(sv[i][0]);
        close(sv[i][1]);
    }
    close(lfd);
}

static void t_shutdown_inflight(void) { inflight(0); }
static void t_destroy_inflight(void) { inflight(1); }

/* ---- one reader per fd, EOF, reset, refused ------------------------------------- */

typedef struct {
    int fd, fd2;
    atomic_int step;
    ssize_t r1, r2;
    int e1, e2;
} misc_t;

static void busy_first(void *arg) {
    misc_t *m = arg;
    char b[8];
    atomic_store(&m->step, 1);
    m->r1 = async_fiber_read(m->fd, b, sizeof b, 10000);
    m->e1 = async_last_error();
    atomic_fetch_add(&m->step, 10);
}

static void busy_second(void *arg) {
    misc_t *m = arg;
    char b[8];
    m->r2 = async_fiber_read(m->fd, b, sizeof b, 10000);
    m->e2 = async_last_error();
    atomic_fetch_add(&m->step, 100);
}

static void t_busy(void) {
    async_sched_t *s = mk_uring(1);
    if (!s) return;
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    misc_t m;
    memset(&m, 0, sizeof m);
    m.fd = sv[0];
    CHECK(async_fiber_spawn(s, busy_first, &m, 0) != NULL);
    run_until(s, &m.step, 1, 30000, "first reader");
    for (double t0 = now_ms();;) {
        async_sched_stats_t st;
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        if (st.fibers_parked == 1) break;
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(2);
    }
    CHECK(async_fiber_spawn(s, busy_second, &m, 0) != NULL);
    run_until(s, &m.step, 101, 30000, "second reader");
    CHECK_EQ(m.r2, -1);
    CHECK_EQ(m.e2, ASYNC_E_BUSY);
    CHECK_EQ(write(sv[1], "abc", 3), 3);
    run_until(s, &m.step, 111, 30000, "first reader's data");
    CHECK_EQ(m.r1, 3);
    async_sched_destroy(s);
    close(sv[0]);
    close(sv[1]);
}

static void ends_fiber(void *arg) {
    misc_t *m = arg;
    char b[8];
    /* the peer closed: end of file, and a write fails with CLOSED (no SIGPIPE) */
    m->r1 = async_fiber_read(m->fd, b, sizeof b, 10000);
    m->r2 = async_fiber_write(m->fd, "xyz", 3, 10000);
    if (m->r2 < 0) m->e2 = async_last_error();
    /* refused */
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    socklen_t len = sizeof a;
    bind(l, (struct sockaddr *)&a, sizeof a);
    getsockname(l, (struct sockaddr *)&a, &len);
    close(l); /* a port nobody listens on */
    int c = socket(AF_INET, SOCK_STREAM, 0);
    int rc = async_fiber_connect(c, (struct sockaddr *)&a, sizeof a, 10000);
    m->e1 = rc < 0 ? async_last_error() : 0;
    close(c);
    atomic_store(&m->step, 1);
}

static void t_eof_closed_refused(void) {
    async_sched_t *s = mk_uring(1);
    if (!s) return;
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    close(sv[1]);
    misc_t m;
    memset(&m, 0, sizeof m);
    m.fd = sv[0];
    CHECK(async_fiber_spawn(s, ends_fiber, &m, 0) != NULL);
    run_until(s, &m.step, 1, 30000, "fiber");
    CHECK_EQ(m.r1, 0);
    CHECK_EQ(m.r2, -1);
    CHECK_EQ(m.e2, ASYNC_E_CLOSED);
    CHECK_EQ(m.e1, ASYNC_E_CLOSED);
    async_sched_destroy(s);
    close(sv[0]);
}

/* ---- accept: a timed-out accept takes no connection ----------------------------- */

static void acc_fiber(void *arg) {
    misc_t *m = arg;
    m->r1 = async_fiber_accept(m->fd, NULL, NULL, 20);
    m->e1 = async_last_error();
    atomic_store(&m->step, 1);
    while (atomic_load(&m->step) != 2) async_fiber_sleep(1);
    m->r2 = async_fiber_accept(m->fd, NULL, NULL, 10000);
    atomic_store(&m->step, 3);
}

static void t_accept_timeout(void) {
    async_sched_t *s = mk_uring(1);
    if (!s) return;
    int lfd;
    struct sockaddr_in a;
    tcp_listener(&lfd, &a);
    misc_t m;
    memset(&m, 0, sizeof m);
    m.fd = lfd;
    CHECK(async_fiber_spawn(s, acc_fiber, &m, 0) != NULL);
    run_until(s, &m.step, 1, 30000, "accept timeout");
    CHECK_EQ(m.r1, -1);
    CHECK_EQ(m.e1, ASYNC_E_TIMEDOUT);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK_EQ(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    atomic_store(&m.step, 2);
    run_until(s, &m.step, 3, 30000, "accept");
    CHECK(m.r2 >= 0);
    close((int)m.r2);
    close(c);
    async_sched_destroy(s);
    close(lfd);
}

/* ---- pipes take the poller path ------------------------------------------------- */

static void pipe_fiber(void *arg) {
    misc_t *m = arg;
    char b[8];
    m->r1 = async_fiber_read(m->fd, b, sizeof b, 10000);
    close(m->fd);
    /* the read end is closed now: EPIPE, no SIGPIPE */
    m->r2 = async_fiber_write(m->fd2, "abc", 3, 10000);
    m->e2 = async_last_error();
    atomic_store(&m->step, 1);
}

static void t_pipe_fallback(void) {
    async_sched_t *s = mk_uring(1);
    if (!s) return;
    int p1[2], p2[2];
    CHECK_EQ(pipe(p1), 0);
    CHECK_EQ(pipe(p2), 0);
    misc_t m;
    memset(&m, 0, sizeof m);
    m.fd = p1[0];
    m.fd2 = p2[1];
    close(p2[0]);
    CHECK(async_fiber_spawn(s, pipe_fiber, &m, 0) != NULL);
    sleep_ms(20);
    CHECK_EQ(write(p1[1], "hello", 5), 5);
    run_until(s, &m.step, 1, 30000, "pipe fiber");
    CHECK_EQ(m.r1, 5);
    CHECK_EQ(m.r2, -1);
    CHECK_EQ(m.e2, ASYNC_E_CLOSED);
    async_sched_destroy(s);
    close(p1[1]);
    close(p2[1]);
}

/* ---- a large write is written whole --------------------------------------------- */

#define BIG (8u << 20)

static void big_writer(void *arg) {
    misc_t *m = arg;
    unsigned char *b = malloc(BIG);
    for (size_t i = 0; i < BIG; i++) b[i] = (unsigned char)(i * 7);
    m->r1 = async_fiber_write(m->fd, b, BIG, 30000);
    free(b);
    atomic_store(&m->step, 1);
}

static void t_big_write(void) {
    async_sched_t *s = mk_uring(1);
    if (!s) return;
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    misc_t m;
    memset(&m, 0, sizeof m);
    m.fd = sv[0];
    CHECK(async_fiber_spawn(s, big_writer, &m, 0) != NULL);
    unsigned char buf[65536];
    size_t got = 0;
    int bad = 0;
    double t0 = now_ms();
    while (got < BIG) {
        ssize_t r = read(sv[1], buf, sizeof buf);
        CHECK(r > 0);
        for (ssize_t i = 0; i < r; i++)
            if (buf[i] != (unsigned char)((got + (size_t)i) * 7)) bad = 1;
        got += (size_t)r;
        CHECK(now_ms() - t0 < 60000);
    }
    run_until(s, &m.step, 1, 30000, "writer");
    CHECK_EQ(m.r1, (ssize_t)BIG);
    CHECK_EQ(bad, 0);
    async_sched_destroy(s);
    close(sv[0]);
    close(sv[1]);
}

/* ---- large writes on 4 workers: a write's next send is submitted where the fiber
 * runs now (it may have moved; the worker it left may sleep) -------------------- */

#define MW_N 4
#define MW_BYTES (4u << 20)

typedef struct {
    int fd;
    ssize_t r;
    int err;
    atomic_int *done;
} mw_t;

static void mw_writer(void *arg) {
    mw_t *m = arg;
    unsigned char *b = malloc(MW_BYTES);
    for (size_t i = 0; i < MW_BYTES; i++) b[i] = (unsigned char)(i * 13);
    m->r = async_fiber_write(m->fd, b, MW_BYTES, 20000);
    m->err = m->r < 0 ? async_last_error() : 0;
    free(b);
    atomic_fetch_add(m->done, 1);
}

typedef struct {
    int fd;
    size_t got;
    int bad;
} mw_reader_t;

static void *mw_read_thread(void *arg) {
    mw_reader_t *x = arg;
    unsigned char buf[4096];
    while (x->got < MW_BYTES) {
        ssize_t r = read(x->fd, buf, sizeof buf);
        if (r <= 0) break;
        for (ssize_t i = 0; i < r; i++)
            if (buf[i] != (unsigned char)((x->got + (size_t)i) * 13)) x->bad = 1;
        x->got += (size_t)r;
    }
    return NULL;
}

static void t_big_write_workers(void) {
    async_sched_t *s = mk_uring(4);
    if (!s) return;
    int sv[MW_N][2];
    mw_t m[MW_N];
    mw_reader_t rd[MW_N];
    pthread_t th[MW_N];
    atomic_int done = 0;
    for (int i = 0; i < MW_N; i++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]), 0);
        m[i] = (mw_t){sv[i][0], 0, 0, &done};
        rd[i] = (mw_reader_t){sv[i][1], 0, 0};
        start_thread(&th[i], mw_read_thread, &rd[i]);
        CHECK(async_fiber_spawn(s, mw_writer, &m[i], 0) != NULL);
    }
    run_until(s, &done, MW_N, 60000, "writers");
    for (int i = 0; i < MW_N; i++) {
        join_within(th[i], 30000, "reader");
        if (m[i].r < 0) fprintf(stderr, "writer %d: %s\n", i, async_strerror(m[i].err));
        CHECK_EQ(m[i].r, (ssize_t)MW_BYTES);
        CHECK_EQ(rd[i].got, (size_t)MW_BYTES);
        CHECK_EQ(rd[i].bad, 0);
        close(sv[i][0]);
        close(sv[i][1]);
    }
    async_sched_destroy(s);
}

/* Adversarial pass 5: a read that went to the ring while fd was plain, then
 * fd owned (async_fiber_fd_open) and closed through the library
 * (async_fiber_close): the close wakes every fiber of the owner parked on fd
 * with ASYNC_E_CLOSED, io_uring's too. Before, the ring op was not a waiter
 * the close could reach: the read ran to its timeout, and the op kept the
 * socket open (the peer saw no hang-up). */
static int op_fd;
static _Atomic int op_err = -1;

static void ring_reader(void *arg) {
    (void)arg;
    char b[16];
    ssize_t r = async_fiber_read(op_fd, b, sizeof b, 30000);
    atomic_store(&op_err, r < 0 ? async_last_error() : 0);
}

static void t_own_after_park(void) {
    async_sched_t *s = mk_uring(2);
    if (!s) return;
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    op_fd = sv[0];
    atomic_store(&op_err, -1);
    async_fiber_t *f = async_fiber_spawn(s, ring_reader, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    sched_wait_parked(s, 1);
    CHECK_EQ(async_fiber_fd_open(s, op_fd), 0);
    CHECK_EQ(async_fiber_close(op_fd), 0);
    CHECK_EQ(async_fiber_join(f, 10000), 0); /* before: only at the 30 s timeout */
    CHECK_EQ(atomic_load(&op_err), ASYNC_E_CLOSED);
    /* the file is really closed: the peer sees the hang-up */
    struct pollfd p = {.fd = sv[1], .events = POLLIN};
    CHECK_EQ(poll(&p, 1, 10000), 1);
    CHECK(p.revents & (POLLIN | POLLHUP));
    char c;
    CHECK_EQ(read(sv[1], &c, 1), 0);
    close(sv[1]);
    async_sched_destroy(s);
}

/* Adversarial pass 5: a ring op was submitted only when its worker ran out
 * of work (or at its 61st dispatch): a fiber computing on that worker held a
 * read back although the data was there and the other worker idled (1.5 s
 * in the report). Now a worker that goes on to another fiber while another
 * worker idles submits first. Here the computing fiber waits (up to 5 s) to
 * see the read complete; before, it never did while it ran. */
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

static void t_submit_while_busy(void) {
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
        close(sv[0]);
        close(sv[1]);
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

static void t_cq_overflow(void) {
    struct rlimit rl;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    rlim_t want = OVF_N + 256;
    if (rl.rlim_cur < want) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
        if (rl.rlim_cur < want) rl.rlim_max = rl.rlim_cur = want; /* root may raise the hard limit */
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            printf("RLIMIT_NOFILE cannot reach %lu here: skipped\n", (unsigned long)want);
            return;
        }
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
    run_until(s, &ovf_done, OVF_N, 60000, "cq_overflow receives");
    CHECK_EQ(atomic_load(&ovf_bad), 0);
    close(tx);
    for (int i = 0; i < OVF_N; i++) close(ovf_fd[i]);
    async_sched_destroy(s);
}

static const test_case_t cases[] = {
    T(selected), // linux
    T(nofile_fallback), // linux
    T(echo_1), // linux
    T(echo_4), // linux
    T(timeout_no_loss), // linux
    T(timeout_stack_reuse), // linux
    T(shutdown_inflight), // linux
    T(destroy_inflight), // linux
    T(busy), // linux
    T(eof_closed_refused), // linux
    T(accept_timeout), // linux
    T(pipe_fallback), // linux
    T(big_write), // linux
    T(big_write_workers), // linux
    T(own_after_park), // linux
    T(submit_while_busy), // linux
    T(cq_overflow), // linux
};

TEST_MAIN(cases)
