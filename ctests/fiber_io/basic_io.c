/* Fiber fd I/O basics: pipes streamed in order to EOF, async_fiber_wait_fd
 * (timeout, wake on data, a second waiter is ASYNC_E_BUSY, level semantics,
 * hang-up, plain-thread polls, bad input), fd numbers reused behind the
 * scheduler's back, a TCP echo server with thousands of client fibers
 * (ASYNC_TEST_FULL=1: 10k connections), and network errors (accept timeout,
 * refused connect, writes to a closed peer or pipe: ASYNC_E_CLOSED, no
 * SIGPIPE). */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "fibers.h"

/* ---- pipes: numbered messages from writer fibers reach reader fibers in
 * order, then EOF ---------------------------------------------------------- */

typedef struct {
    int fd;
    int msgs;
    int bad;
    int eof;
} pipe_end_t;

enum { MSG = 16 };

static void pipe_writer(void *arg) {
    pipe_end_t *e = arg;
    char m[MSG];
    for (int i = 0; i < 1000; i++) {
        memset(m, 'a' + i % 26, MSG);
        memcpy(m, &i, sizeof i);
        CHECK_EQ(async_fiber_write(e->fd, m, MSG, -1), MSG);
        if (i % 100 == 0) async_fiber_yield();
    }
    close(e->fd);
}

static void pipe_reader(void *arg) {
    pipe_end_t *e = arg;
    char buf[MSG * 8];
    size_t have = 0;
    for (;;) {
        ssize_t n = async_fiber_read(e->fd, buf + have, sizeof buf - have, -1);
        CHECK(n >= 0);
        if (n == 0) break;
        have += (size_t)n;
        size_t off = 0;
        for (; have - off >= MSG; off += MSG) {
            int seq;
            memcpy(&seq, buf + off, sizeof seq);
            if (seq != e->msgs || buf[off + MSG - 1] != 'a' + seq % 26) e->bad++;
            e->msgs++;
        }
        memmove(buf, buf + off, have - off);
        have -= off;
    }
    e->eof = have == 0;
    close(e->fd);
}

CASE(pipes) { // uring valgrind
    async_sched_t *s = sched_new(2);
    pipe_end_t r[2], w[2];
    for (int i = 0; i < 2; i++) {
        int p[2];
        CHECK_EQ(pipe(p), 0);
        r[i] = (pipe_end_t){p[0], 0, 0, 0};
        w[i] = (pipe_end_t){p[1], 0, 0, 0};
        CHECK(async_fiber_spawn(s, pipe_reader, &r[i], 0));
        CHECK(async_fiber_spawn(s, pipe_writer, &w[i], 0));
    }
    CHECK_EQ(async_sched_run(s), 0);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(r[i].msgs, 1000);
        CHECK_EQ(r[i].bad, 0);
        CHECK_EQ(r[i].eof, 1);
    }
    async_sched_destroy(s);
}

typedef struct {
    int fd;
    int result;
    int err;
} wait_ctx_t;

static void wait_reader(void *arg) {
    wait_ctx_t *x = arg;
    x->result = async_fiber_wait_fd(x->fd, ASYNC_EVENT_READ, -1);
    x->err = async_last_error();
}

static void wait_short(void *arg) {
    wait_ctx_t *x = arg;
    x->result = async_fiber_wait_fd(x->fd, ASYNC_EVENT_READ, 30);
    x->err = async_last_error();
}

CASE(wait_fd) { // uring valgrind
    async_sched_t *s = sched_new(2);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    /* timeout */
    wait_ctx_t a = {p[0], 0, 0};
    async_fiber_t *f = async_fiber_spawn(s, wait_short, &a, ASYNC_FIBER_JOINABLE);
    CHECK_EQ(async_fiber_join(f, -1), 0);
    CHECK_EQ(a.result, -1);
    CHECK_EQ(a.err, ASYNC_E_TIMEDOUT);
    /* a parked reader wakes on data; a second reader of the same fd is BUSY */
    a.result = 0;
    f = async_fiber_spawn(s, wait_reader, &a, ASYNC_FIBER_JOINABLE);
    sched_wait_parked(s, 1); /* the first reader holds the fd before the second one asks */
    wait_ctx_t b = {p[0], 0, 0};
    async_fiber_t *g = async_fiber_spawn(s, wait_short, &b, ASYNC_FIBER_JOINABLE);
    CHECK_EQ(async_fiber_join(g, -1), 0);
    CHECK_EQ(b.result, -1);
    CHECK_EQ(b.err, ASYNC_E_BUSY);
    CHECK_EQ(write(p[1], "x", 1), 1);
    CHECK_EQ(async_fiber_join(f, -1), 0);
    CHECK(a.result > 0 && (a.result & ASYNC_EVENT_READ));
    /* level semantics: the byte is still there, so a new wait returns at once */
    a.result = 0;
    f = async_fiber_spawn(s, wait_short, &a, ASYNC_FIBER_JOINABLE);
    CHECK_EQ(async_fiber_join(f, -1), 0);
    CHECK(a.result & ASYNC_EVENT_READ);
    /* plain thread: poll */
    CHECK(async_fiber_wait_fd(p[0], ASYNC_EVENT_READ, 0) & ASYNC_EVENT_READ);
    CHECK(async_fiber_wait_fd(p[1], ASYNC_EVENT_WRITE, -1) & ASYNC_EVENT_WRITE);
    char c;
    CHECK_EQ(read(p[0], &c, 1), 1);
    CHECK_FAIL(async_fiber_wait_fd(p[0], ASYNC_EVENT_READ, 10) == -1, ASYNC_E_TIMEDOUT);
    /* hang-up is reported */
    close(p[1]);
    /* an empty pipe whose writer is gone: poll says POLLHUP alone, and a
     * read returns 0 at once: READ|CLOSE, as on every platform */
    CHECK_EQ(async_fiber_wait_fd(p[0], ASYNC_EVENT_READ, -1), (int)(ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE));
    a.result = 0;
    f = async_fiber_spawn(s, wait_reader, &a, ASYNC_FIBER_JOINABLE);
    CHECK_EQ(async_fiber_join(f, -1), 0);
    CHECK_EQ(a.result, (int)(ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE));
    close(p[0]);
    /* bad input */
    CHECK_FAIL(async_fiber_wait_fd(-1, ASYNC_EVENT_READ, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_wait_fd(0, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_wait_fd(0, 0x40, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_wait_fd(0, ASYNC_EVENT_READ, -3) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_read(-1, &c, 1, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_read(0, NULL, 1, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_write(-1, &c, 1, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_accept(-1, NULL, NULL, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_connect(3, NULL, 0, 0) == -1, ASYNC_E_INVAL);
    async_sched_destroy(s);
}

/* fd numbers reused behind the scheduler's back: a read of a drained stream
 * parks before trying (its fd stays registered), so after close() the same
 * number naming another file must still be watched: data already there, data
 * that comes later, and a regular file that cannot be watched at all. */
typedef struct {
    int fd, peer; /* fd: the number the reader fiber uses */
    int step;     /* how far the fiber got */
    int err;
} reuse_t;

static void *late_writer(void *arg) {
    reuse_t *x = arg;
    sleep_ms(30);
    ssize_t r = write(x->peer, "late", 4);
    (void)r;
    return NULL;
}

static void reuse_fiber(void *arg) {
    reuse_t *x = arg;
    char buf[64];
    int sp[2];
    pthread_t th;
    /* 1: a stream socket the fiber parked on (so it is registered) and then
     * drained */
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0) return;
    x->peer = sp[1];
    if (pthread_create(&th, NULL, late_writer, x) != 0) return;
    ssize_t n = async_fiber_read(sp[0], buf, sizeof buf, 5000);
    pthread_join(th, NULL);
    if (n != 4) goto fail;
    x->step = 1;
    /* 2: close it; a pipe takes the number, with data already in */
    int num = sp[0];
    close_pair(sp);
    int p[2];
    if (pipe(p) != 0) return;
    if (p[0] != num) {
        if (dup2(p[0], num) != num) return;
        close(p[0]);
    }
    if (write(p[1], "xyz", 3) != 3) return;
    if (async_fiber_read(num, buf, sizeof buf, 5000) != 3 || memcmp(buf, "xyz", 3) != 0) goto fail;
    x->step = 2;
    /* 3: the same number, data arriving while the reader is parked */
    x->fd = num;
    x->peer = p[1];
    if (pthread_create(&th, NULL, late_writer, x) != 0) return;
    n = async_fiber_read(num, buf, sizeof buf, 5000);
    pthread_join(th, NULL);
    if (n != 4 || memcmp(buf, "late", 4) != 0) goto fail;
    x->step = 3;
    /* 4: a regular file on that number (not pollable) reads normally */
    close(num);
    close(p[1]);
    FILE *tf = tmpfile();
    if (!tf || fwrite("file", 1, 4, tf) != 4 || fflush(tf) != 0) return;
    if (fileno(tf) != num && dup2(fileno(tf), num) != num) return;
    if (lseek(num, 0, SEEK_SET) != 0) return;
    if (async_fiber_read(num, buf, sizeof buf, 5000) != 4 || memcmp(buf, "file", 4) != 0) goto fail;
    if (fileno(tf) != num) close(num);
    fclose(tf);
    x->step = 4;
    return;
fail:
    x->err = async_last_error();
}

CASE(fd_reuse) { // uring valgrind
    async_sched_t *s = sched_new(1);
    reuse_t x = {-1, -1, 0, 0};
    CHECK(async_fiber_spawn(s, reuse_fiber, &x, 0));
    CHECK_EQ(async_sched_run(s), 0);
    if (x.step != 4) fprintf(stderr, "stopped after step %d: %s\n", x.step, async_strerror(x.err));
    CHECK_EQ(x.step, 4);
    async_sched_destroy(s);
}

/* echo: N client fibers x M messages against one acceptor + a fiber per
 * connection */
typedef struct {
    int lfd;
    int nconn;
    int msgs;
    struct sockaddr_in addr;
    atomic_int ok_clients;
    atomic_int served;
    atomic_int failures;
    async_sched_t *s;
} echo_t;

static echo_t *echo_g;

static void echo_conn(void *arg) {
    int fd = (int)(intptr_t)arg;
    char buf[512];
    for (;;) {
        ssize_t n = async_fiber_read(fd, buf, sizeof buf, -1);
        if (n <= 0) break;
        if (async_fiber_write(fd, buf, (size_t)n, -1) != n) {
            atomic_fetch_add(&echo_g->failures, 1);
            break;
        }
    }
    close(fd);
    atomic_fetch_add(&echo_g->served, 1);
}

static void echo_acceptor(void *arg) {
    echo_t *e = arg;
    for (int i = 0; i < e->nconn; i++) {
        int fd = async_fiber_accept(e->lfd, NULL, NULL, -1);
        if (fd < 0) {
            fprintf(stderr, "accept: %s\n", async_strerror(async_last_error()));
            atomic_fetch_add(&e->failures, 1);
            return;
        }
        CHECK(async_fiber_spawn(e->s, echo_conn, (void *)(intptr_t)fd, 0));
    }
}

static void echo_client(void *arg) {
    echo_t *e = arg;
    uint32_t id = (uint32_t)(uintptr_t)async_fiber_current();
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || async_fiber_connect(fd, (struct sockaddr *)&e->addr, sizeof e->addr, -1) != 0) {
        fprintf(stderr, "connect: %s\n", async_strerror(async_last_error()));
        atomic_fetch_add(&e->failures, 1);
        if (fd >= 0) close(fd);
        return;
    }
    char out[100], in[100];
    for (int m = 0; m < e->msgs; m++) {
        size_t len = 1 + (size_t)((id + (uint32_t)m) % sizeof out);
        for (size_t i = 0; i < len; i++) out[i] = (char)(id * 31u + (uint32_t)m * 7u + (uint32_t)i);
        if (async_fiber_write(fd, out, len, -1) != (ssize_t)len) goto fail;
        size_t got = 0;
        while (got < len) {
            ssize_t n = async_fiber_read(fd, in + got, len - got, -1);
            if (n <= 0) goto fail;
            got += (size_t)n;
        }
        if (memcmp(in, out, len) != 0) goto fail;
    }
    close(fd);
    atomic_fetch_add(&e->ok_clients, 1);
    return;
fail:
    fprintf(stderr, "client failed: %s\n", async_strerror(async_last_error()));
    atomic_fetch_add(&e->failures, 1);
    close(fd);
}

CASE(echo_many_conns) { // uring timeout=180 valgrind tsan_soak
    const char *full = getenv("ASYNC_TEST_FULL");
    int nconn = full && *full == '1' ? 10000 : 2000;
    int fds = raise_nofile(2 * nconn + 256);
    if (fds < 2 * nconn + 256) {
        nconn = (fds - 256) / 2;
        printf("RLIMIT_NOFILE %d: scaled to %d connections\n", fds, nconn);
        CHECK(nconn >= 100);
    }
    echo_t e = {0};
    e.nconn = nconn;
    e.msgs = 100;
    e.lfd = loopback_listener(4096, &e.addr);
    e.s = sched_new(0);
    echo_g = &e;
    double t0 = now_ms();
    CHECK(async_fiber_spawn(e.s, echo_acceptor, &e, 0));
    for (int i = 0; i < nconn; i++) CHECK(async_fiber_spawn(e.s, echo_client, &e, 0));
    CHECK_EQ(async_sched_run(e.s), 0);
    printf("echo: %d connections x %d messages in %.0f ms\n", nconn, e.msgs, now_ms() - t0);
    CHECK_EQ(atomic_load(&e.failures), 0);
    CHECK_EQ(atomic_load(&e.ok_clients), nconn);
    CHECK_EQ(atomic_load(&e.served), nconn);
    close(e.lfd);
    async_sched_destroy(e.s);
}

/* connect errors, accept timeout, write to a closed peer (no SIGPIPE) */
static void net_errors_fiber(void *arg) {
    (void)arg;
    struct sockaddr_in addr;
    int lfd = loopback_listener(16, &addr);
    CHECK_FAIL(async_fiber_accept(lfd, NULL, NULL, 20) == -1, ASYNC_E_TIMEDOUT);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK_EQ(async_fiber_connect(c, (struct sockaddr *)&addr, sizeof addr, 5000), 0);
    struct sockaddr_in peer;
    socklen_t pl = sizeof peer;
    int a = async_fiber_accept(lfd, (struct sockaddr *)&peer, &pl, 5000);
    CHECK(a >= 0);
    CHECK_EQ(pl, sizeof peer);
    CHECK(fcntl(a, F_GETFL) & O_NONBLOCK);
    close(a);
    char buf[4096];
    memset(buf, 1, sizeof buf);
    int failed = 0;
    for (int i = 0; i < 1000 && !failed; i++) failed = async_fiber_write(c, buf, sizeof buf, 5000) < 0;
    CHECK(failed);
    CHECK_ERR(ASYNC_E_CLOSED);
    close(c);
    close(lfd);
    /* refused */
    c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK_FAIL(async_fiber_connect(c, (struct sockaddr *)&addr, sizeof addr, 5000) == -1, ASYNC_E_CLOSED);
    close(c);
    /* a pipe whose reader is gone: EPIPE, not SIGPIPE */
    int p[2];
    CHECK_EQ(pipe(p), 0);
    close(p[0]);
    CHECK_FAIL(async_fiber_write(p[1], "x", 1, -1) == -1, ASYNC_E_CLOSED);
    close(p[1]);
}

CASE(net_errors) { // uring valgrind
    async_sched_t *s = sched_new(2);
    async_fiber_t *f = async_fiber_spawn(s, net_errors_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK_EQ(async_fiber_join(f, -1), 0);
    async_sched_destroy(s);
}

TEST_MAIN()
