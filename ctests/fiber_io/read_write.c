/* async_fiber_read and async_fiber_write: reads of 0 bytes, end of file, a
 * write to a peer that closed (ASYNC_E_CLOSED), refused connects, big
 * transfers written whole (through sockets and pipes, on 1 and 4 workers,
 * with a plain thread on one end), and both directions of one fd used at
 * once by fibers on different workers. Every wait is bounded. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <termios.h>

#include "check.h"
#include "net.h"

/* ---- async_fiber_read/write with n == 0 return 0 at once ------------------ */

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
    make_pair(1, z->fds + 2); /* TCP */
    z->closed = 1000; /* far above the numbers this process opens */
    CHECK(fcntl(z->closed, F_GETFD) == -1 && errno == EBADF);
    atomic_store(&z->done, 0);
}

static void zero_teardown(zero_t *z) {
    for (int i = 0; i < 4; i++) close(z->fds[i]);
}

/* The header: "Reads up to n bytes (at least 1 unless n is 0 or at end of
 * file: returns 0)". A read of 0 bytes on an idle socket returns 0 at once:
 * it does not wait for data (recv of 0 bytes says EAGAIN there), neither
 * with a timeout nor with -1. */
CASE(read_zero_bytes_fiber) { // uring adversarial
    static zero_t z;
    zero_setup(&z);
    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, zero_fiber, &z, 0));
    wait_flag(&z.done, 10000, "zero-length reads and writes on a fiber");
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    zero_teardown(&z);
}

CASE(read_zero_bytes_thread) { // adversarial
    static zero_t z;
    zero_setup(&z);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, zero_thread, &z), 0);
    wait_flag(&z.done, 10000, "zero-length reads and writes on a plain thread");
    pthread_join(th, NULL);
    zero_teardown(&z);
}

/* ---- big transfers across workers; both directions of one fd --------------------- */

#define XFER (24u << 20)

static unsigned char *xsrc;

typedef struct {
    int fd;
    size_t n;
    uint64_t sum;
    atomic_int done;
    int err;
} xfer_t;

static void xwriter(void *arg) {
    xfer_t *x = arg;
    size_t off = 0;
    /* in pieces of odd sizes so it parks many times */
    while (off < x->n) {
        size_t k = x->n - off < 3000001 ? x->n - off : 3000001;
        ssize_t r = async_fiber_write(x->fd, xsrc + off, k, 30000);
        if (r != (ssize_t)k) {
            x->err = async_last_error();
            break;
        }
        off += k;
    }
    atomic_store(&x->done, 1);
}

static void xreader(void *arg) {
    xfer_t *x = arg;
    unsigned char b[7919]; /* on the fiber's stack: it may resume on another worker */
    size_t got = 0;
    uint64_t sum = 0;
    unsigned n = 0;
    while (got < x->n) {
        ssize_t r = async_fiber_read(x->fd, b, sizeof b, 30000);
        if (r <= 0) {
            x->err = r == 0 ? -2 : async_last_error();
            break;
        }
        for (ssize_t i = 0; i < r; i++) sum = sum * 31 + b[i] + (got + i);
        got += r;
        if (++n % 7 == 0) async_fiber_yield();
    }
    x->sum = sum;
    x->n = got;
    atomic_store(&x->done, 1);
}

static uint64_t xsum(size_t n) {
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) sum = sum * 31 + xsrc[i] + i;
    return sum;
}

/* Both directions of each end of one socketpair at once, four fibers on
 * four workers: every byte arrives once, in order. */
CASE(duplex_big) { // uring timeout=180 adversarial
    xsrc = malloc(XFER);
    CHECK(xsrc != NULL);
    for (size_t i = 0; i < XFER; i++) xsrc[i] = (unsigned char)(i * 2654435761u >> 13);
    uint64_t want = xsum(XFER);
    async_sched_t *s = sched_new(4);
    for (int round = 0; round < 2; round++) {
        int sp[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
        int z = 8192;
        setsockopt(sp[0], SOL_SOCKET, SO_SNDBUF, &z, sizeof z);
        setsockopt(sp[1], SOL_SOCKET, SO_SNDBUF, &z, sizeof z);
        xfer_t w0 = {sp[0], XFER, 0, 0, 0}, r1 = {sp[1], XFER, 0, 0, 0};
        xfer_t w1 = {sp[1], XFER, 0, 0, 0}, r0 = {sp[0], XFER, 0, 0, 0};
        async_fiber_t *f[4];
        f[0] = async_fiber_spawn(s, xwriter, &w0, ASYNC_FIBER_JOINABLE);
        f[1] = async_fiber_spawn(s, xreader, &r1, ASYNC_FIBER_JOINABLE);
        f[2] = async_fiber_spawn(s, xwriter, &w1, ASYNC_FIBER_JOINABLE);
        f[3] = async_fiber_spawn(s, xreader, &r0, ASYNC_FIBER_JOINABLE);
        for (int i = 0; i < 4; i++) CHECK(f[i] != NULL);
        for (int i = 0; i < 4; i++) CHECK_EQ(async_fiber_join(f[i], 120000), 0);
        CHECK_EQ(w0.err, 0);
        CHECK_EQ(w1.err, 0);
        CHECK_EQ(r0.err, 0);
        CHECK_EQ(r1.err, 0);
        CHECK_EQ(r1.n, XFER);
        CHECK_EQ(r0.n, XFER);
        CHECK(r1.sum == want);
        CHECK(r0.sum == want);
        close_pair(sp);
    }
    async_sched_destroy(s);
    free(xsrc);
}

/* ---- both directions of one plain fd, waited on two workers ----------------------------- */

typedef struct {
    int fd;
    int iters;
    int err;
} pp_t;

/* each side: read one byte, write one byte back, many times; both ends of
 * the pair are written and read by different fibers at once */
static void pp_reader(void *arg) {
    pp_t *x = arg;
    char c;
    for (int i = 0; i < x->iters; i++) {
        ssize_t r = async_fiber_read(x->fd, &c, 1, 20000);
        if (r != 1 || c != (char)i) {
            x->err = r != 1 ? async_last_error() : -100 - i;
            return;
        }
    }
}

static void pp_writer(void *arg) {
    pp_t *x = arg;
    for (int i = 0; i < x->iters; i++) {
        char c = (char)i;
        if (async_fiber_write(x->fd, &c, 1, 20000) != 1) {
            x->err = async_last_error();
            return;
        }
        if (i % 3 == 0) async_fiber_yield();
    }
}

static void pp_waiter(void *arg) {
    pp_t *x = arg; /* wait_fd for both directions, the reader reads after */
    for (int i = 0; i < x->iters; i++) {
        int ev = async_fiber_wait_fd(x->fd, ASYNC_EVENT_READ, 20000);
        if (ev < 0) {
            x->err = async_last_error();
            return;
        }
        char c;
        ssize_t r = read(x->fd, &c, 1);
        if (r == 1 && c != (char)i) {
            x->err = -100 - i;
            return;
        }
        if (r != 1) i--; /* spurious: wait again */
    }
}

CASE(duplex_ping) { // uring adversarial
    async_sched_t *s = sched_new(4);
    for (int mode = 0; mode < 2; mode++) {
        int sp[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sp), 0);
        int n = 20000;
        pp_t r0 = {sp[0], n, 0}, w0 = {sp[0], n, 0}, r1 = {sp[1], n, 0}, w1 = {sp[1], n, 0};
        async_fiber_t *f[4];
        f[0] = async_fiber_spawn(s, mode ? pp_waiter : pp_reader, &r0, ASYNC_FIBER_JOINABLE);
        f[1] = async_fiber_spawn(s, pp_writer, &w0, ASYNC_FIBER_JOINABLE);
        f[2] = async_fiber_spawn(s, mode ? pp_waiter : pp_reader, &r1, ASYNC_FIBER_JOINABLE);
        f[3] = async_fiber_spawn(s, pp_writer, &w1, ASYNC_FIBER_JOINABLE);
        for (int i = 0; i < 4; i++) CHECK(f[i] != NULL);
        for (int i = 0; i < 4; i++) CHECK_EQ(async_fiber_join(f[i], 60000), 0);
        CHECK_EQ(r0.err, 0);
        CHECK_EQ(r1.err, 0);
        CHECK_EQ(w0.err, 0);
        CHECK_EQ(w1.err, 0);
        close_pair(sp);
    }
    async_sched_destroy(s);
}

/* ---- 8 MiB through a pipe in pieces that park many times, fibers moving ----------------------------- */

CASE(pipe_big) { // adversarial
    size_t n = 8u << 20;
    xsrc = malloc(n);
    CHECK(xsrc != NULL);
    for (size_t i = 0; i < n; i++) xsrc[i] = (unsigned char)(i * 2654435761u >> 11);
    uint64_t want = xsum(n);
    async_sched_t *s = sched_new(4);
    int p[2];
    CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    xfer_t w = {p[1], n, 0, 0, 0}, r = {p[0], n, 0, 0, 0};
    async_fiber_t *fw = async_fiber_spawn(s, xwriter, &w, ASYNC_FIBER_JOINABLE);
    async_fiber_t *fr = async_fiber_spawn(s, xreader, &r, ASYNC_FIBER_JOINABLE);
    CHECK(fw && fr);
    CHECK_EQ(async_fiber_join(fw, 60000), 0);
    CHECK_EQ(async_fiber_join(fr, 60000), 0);
    CHECK_EQ(w.err, 0);
    CHECK_EQ(r.err, 0);
    CHECK_EQ(r.n, n);
    CHECK(r.sum == want);
    close_pair(p);
    async_sched_destroy(s);
    free(xsrc);
}

/* ---- writes that must park on non-sockets: a full pipe, an eventfd at its
 * maximum; busy workers; a plain thread on one end ---- */

#define BW_BYTES (1 << 20)

static int bw_p[2];

static atomic_int bw_done;

static unsigned char bw_out[BW_BYTES];

static void bw_writer(void *arg)
{
    (void)arg;
    for (int i = 0; i < BW_BYTES; i++)
        bw_out[i] = (unsigned char)(i * 7 + (i >> 12));
    for (int off = 0; off < BW_BYTES;) {
        int n = 65536 + 4096 + 3;
        if (n > BW_BYTES - off)
            n = BW_BYTES - off;
        CHECK_EQ(async_fiber_write(bw_p[1], bw_out + off, (size_t)n, BOUND_MS), n);
        off += n;
    }
    atomic_fetch_add(&bw_done, 1);
}

static void bw_reader(void *arg)
{
    (void)arg;
    static unsigned char in[8191];
    int got = 0;
    while (got < BW_BYTES) {
        ssize_t n = async_fiber_read(bw_p[0], in, sizeof in, BOUND_MS);
        CHECK(n > 0);
        for (ssize_t k = 0; k < n; k++)
            if (in[k] != (unsigned char)((got + k) * 7 + ((got + k) >> 12)))
                CHECK_EQ(in[k], (unsigned char)((got + k) * 7 + ((got + k) >> 12)));
        got += (int)n;
    }
    CHECK_EQ(async_fiber_read(bw_p[0], in, sizeof in, BOUND_MS), 0); /* the writer closed */
    atomic_fetch_add(&bw_done, 1);
}

static void *bw_plain_writer(void *arg)
{
    bw_writer(arg);
    close(bw_p[1]);
    return NULL;
}

static void bw_fiber_writer_close(void *arg)
{
    bw_writer(arg);
    CHECK_EQ(async_fiber_close(bw_p[1]), 0);
}

static void pipe_big(int plain_writer)
{
    async_sched_t *s = sched_new(3);
    atomic_store(&bw_done, 0);
    busy_start(s, 3);
    CHECK_EQ(pipe2(bw_p, O_CLOEXEC), 0);
    CHECK_EQ(async_fiber_fd_open(s, bw_p[0]), 0);
    if (!plain_writer)
        CHECK_EQ(async_fiber_fd_open(s, bw_p[1]), 0);
    CHECK(async_fiber_spawn(s, bw_reader, NULL, 0) != NULL);
    pthread_t t;
    if (plain_writer)
        start_thread(&t, bw_plain_writer, NULL);
    else
        CHECK(async_fiber_spawn(s, bw_fiber_writer_close, NULL, 0) != NULL);
    wait_count(&bw_done, 2, "pipe writer and reader");
    if (plain_writer)
        join_within(t, BOUND_MS, "plain writer");
    atomic_store(&busy_stop, 1);
    sched_finish(s, BOUND_MS);
    CHECK_EQ(async_fiber_close(bw_p[0]), 0);
}

CASE(pipe_big_owned) { pipe_big(0); } // uring adversarial

CASE(pipe_big_plain_writer) { pipe_big(1); } // uring adversarial

/* ---- end of file, a write to a closed peer, a refused connect ---------------- */

static void ends_fiber(void *arg) {
    io_probe_t *m = arg;
    char b[8];
    /* the peer closed: end of file, and a write fails with CLOSED (no SIGPIPE) */
    m->r1 = async_fiber_read(m->fd, b, sizeof b, 10000);
    m->r2 = async_fiber_write(m->fd, "xyz", 3, 10000);
    if (m->r2 < 0) m->e2 = async_last_error();
    /* refused */
    struct sockaddr_in a = refused_addr();
    int c = socket(AF_INET, SOCK_STREAM, 0);
    int rc = async_fiber_connect(c, (struct sockaddr *)&a, sizeof a, 10000);
    m->e1 = rc < 0 ? async_last_error() : 0;
    close(c);
    atomic_store(&m->step, 1);
}

CASE(eof_closed_refused) { // linux uring
    async_sched_t *s = sched_new(1);
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    close(sv[1]);
    io_probe_t m = {.fd = sv[0]};
    CHECK(async_fiber_spawn(s, ends_fiber, &m, 0) != NULL);
    wait_count_within(&m.step, 1, 30000, "fiber");
    CHECK_EQ(m.r1, 0);
    CHECK_EQ(m.r2, -1);
    CHECK_EQ(m.e2, ASYNC_E_CLOSED);
    CHECK_EQ(m.e1, ASYNC_E_CLOSED);
    async_sched_destroy(s);
    close(sv[0]);
}

/* ---- a large write is written whole --------------------------------------------- */

#define BIG (8u << 20)

static void big_writer(void *arg) {
    io_probe_t *m = arg;
    unsigned char *b = malloc(BIG);
    for (size_t i = 0; i < BIG; i++) b[i] = (unsigned char)(i * 7);
    m->r1 = async_fiber_write(m->fd, b, BIG, 30000);
    free(b);
    atomic_store(&m->step, 1);
}

CASE(big_write) { // linux uring
    async_sched_t *s = sched_new(1);
    io_probe_t m;
    probe_spawn(s, big_writer, &m);
    unsigned char buf[65536];
    size_t got = 0;
    int bad = 0;
    double t0 = now_ms();
    while (got < BIG) {
        ssize_t r = read(m.fd2, buf, sizeof buf);
        CHECK(r > 0);
        for (ssize_t i = 0; i < r; i++)
            if (buf[i] != (unsigned char)((got + (size_t)i) * 7)) bad = 1;
        got += (size_t)r;
        CHECK(now_ms() - t0 < 60000);
    }
    wait_count_within(&m.step, 1, 30000, "writer");
    CHECK_EQ(m.r1, (ssize_t)BIG);
    CHECK_EQ(bad, 0);
    async_sched_destroy(s);
    close(m.fd);
    close(m.fd2);
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

CASE(big_write_workers) { // linux uring
    async_sched_t *s = sched_new(4);
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
    wait_count_within(&done, MW_N, 60000, "writers");
    for (int i = 0; i < MW_N; i++) {
        join_within(th[i], 30000, "reader");
        if (m[i].r < 0) fprintf(stderr, "writer %d: %s\n", i, async_strerror(m[i].err));
        CHECK_EQ(m[i].r, (ssize_t)MW_BYTES);
        CHECK_EQ(rd[i].got, (size_t)MW_BYTES);
        CHECK_EQ(rd[i].bad, 0);
        close_pair(sv[i]);
    }
    async_sched_destroy(s);
}

TEST_MAIN()
