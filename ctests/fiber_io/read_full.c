/* async_fiber_read_full: exactly n bytes across many small writes under one
 * timeout; the end of the stream mid-way (a short count); a timeout or a
 * cancel mid-way (*got tells the bytes stored, and none is lost: the rest
 * comes with the next call); one deadline for the whole call, also when
 * every read gets a little data; bad input. On a fiber (epoll, and io_uring
 * with the `uring` word: the TCP pair is a plain socket there) and on a
 * plain thread. Every wait is bounded. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "net.h"

/* The writer thread: `chunks` writes of `chunk` bytes (byte i of the stream
 * is i % 251), delay_ms apart; then shuts the writing side if eof, and
 * waits for stop otherwise (the stream stays open). */
typedef struct {
    int fd, chunks, chunk, delay_ms, eof;
    atomic_int stop;
} writer_t;

static void *writer_main(void *arg) {
    writer_t *w = arg;
    char buf[256];
    size_t pos = 0;
    for (int c = 0; c < w->chunks && !atomic_load(&w->stop); c++) {
        for (int i = 0; i < w->chunk; i++) buf[i] = (char)((pos + (size_t)i) % 251);
        CHECK_EQ(write(w->fd, buf, (size_t)w->chunk), w->chunk);
        pos += (size_t)w->chunk;
        if (w->delay_ms) sleep_ms(w->delay_ms);
    }
    if (w->eof) CHECK_EQ(shutdown(w->fd, SHUT_WR), 0);
    return NULL;
}

static void check_stream(const char *buf, size_t from, size_t n) {
    for (size_t i = 0; i < n; i++) CHECK_EQ((unsigned char)buf[i], (from + i) % 251);
}

/* The reader's side of a case: which one, on a fiber or a thread. */
typedef struct {
    int fd;
    void (*body)(int fd);
} reader_t;

static void reader_fiber(void *arg) {
    reader_t *r = arg;
    r->body(r->fd);
}

/* Runs body(fd of a TCP pair) against the writer w (its fd: the other end),
 * on a fiber (fiber 1) or this thread. */
static void run_case(int fiber, writer_t *w, void (*body)(int fd)) {
    int sv[2];
    make_pair(1, sv);
    w->fd = sv[1];
    atomic_store(&w->stop, 0);
    pthread_t t;
    start_thread(&t, writer_main, w);
    reader_t r = {sv[0], body};
    if (fiber) {
        async_sched_t *s = sched_new(2);
        on_fiber(s, reader_fiber, &r);
        async_sched_destroy(s);
    } else {
        body(sv[0]);
    }
    atomic_store(&w->stop, 1);
    join_within(t, 20000, "writer");
    close(sv[0]);
    close(sv[1]);
}

/* ---- many small writes, one timeout --------------------------------------------- */

static void body_many(int fd) {
    static char buf[2000];
    size_t got = 12345;
    CHECK_EQ(async_fiber_read_full(fd, buf, sizeof buf, &got, 20000), (ssize_t)sizeof buf);
    CHECK_EQ(got, sizeof buf);
    check_stream(buf, 0, sizeof buf);
}

static void many(int fiber) {
    writer_t w = {.chunks = 200, .chunk = 10, .delay_ms = 1};
    run_case(fiber, &w, body_many);
}

CASE(many_small_writes_fiber) { many(1); } // uring
CASE(many_small_writes_thread) { many(0); }

/* ---- end of file mid-way --------------------------------------------------------- */

static void body_eof(int fd) {
    static char buf[1000];
    size_t got = 0;
    CHECK_EQ(async_fiber_read_full(fd, buf, sizeof buf, &got, 20000), 300);
    CHECK_EQ(got, 300);
    check_stream(buf, 0, 300);
    /* at the end already: 0 */
    got = 7;
    CHECK_EQ(async_fiber_read_full(fd, buf, sizeof buf, &got, 20000), 0);
    CHECK_EQ(got, 0);
}

static void eof_midway(int fiber) {
    writer_t w = {.chunks = 3, .chunk = 100, .delay_ms = 5, .eof = 1};
    run_case(fiber, &w, body_eof);
}

CASE(eof_midway_fiber) { eof_midway(1); } // uring
CASE(eof_midway_thread) { eof_midway(0); }

/* ---- timeout mid-way: *got right, the bytes kept ------------------------------- */

static void body_timeout(int fd) {
    static char buf[1000];
    size_t got = 0;
    CHECK_FAIL(async_fiber_read_full(fd, buf, sizeof buf, &got, 300) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(got, 300);
    check_stream(buf, 0, 300);
    /* nothing more is there: a call that may not wait stores nothing */
    got = 9;
    CHECK_FAIL(async_fiber_read_full(fd, buf, 10, &got, 0) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(got, 0);
}

static void timeout_midway(int fiber) {
    writer_t w = {.chunks = 3, .chunk = 100, .delay_ms = 0};
    run_case(fiber, &w, body_timeout);
}

CASE(timeout_midway_fiber) { timeout_midway(1); } // uring
CASE(timeout_midway_thread) { timeout_midway(0); }

/* The same with the rest written after the timeout: the next call returns
 * exactly the bytes that follow (none was lost in the timed-out call). */
typedef struct {
    int fd;
    atomic_int phase;
} rest_t;

static void rest_body(rest_t *x) {
    static char buf[1000];
    size_t got = 0;
    CHECK_FAIL(async_fiber_read_full(x->fd, buf, sizeof buf, &got, 200) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(got, 120);
    check_stream(buf, 0, 120);
    atomic_store(&x->phase, 1); /* the main thread writes the rest */
    got = 0;
    CHECK_EQ(async_fiber_read_full(x->fd, buf, 880, &got, 20000), 880);
    CHECK_EQ(got, 880);
    check_stream(buf, 120, 880);
}

static void rest_fiber(void *arg) { rest_body(arg); }
static void *rest_thread(void *arg) {
    rest_body(arg);
    return NULL;
}

static void write_stream(int fd, size_t from, size_t n) {
    char buf[1000];
    for (size_t i = 0; i < n; i++) buf[i] = (char)((from + i) % 251);
    CHECK_EQ(write(fd, buf, n), (ssize_t)n);
}

static void rest_kept(int fiber) {
    int sv[2];
    make_pair(1, sv);
    static rest_t x;
    x.fd = sv[0];
    atomic_store(&x.phase, 0);
    write_stream(sv[1], 0, 120);
    async_sched_t *s = NULL;
    pthread_t t;
    async_fiber_t *f = NULL;
    if (fiber) {
        s = sched_new(1);
        f = async_fiber_spawn(s, rest_fiber, &x, ASYNC_FIBER_JOINABLE);
        CHECK(f != NULL);
    } else {
        start_thread(&t, rest_thread, &x);
    }
    double t0 = now_ms();
    while (!atomic_load(&x.phase)) {
        CHECK(now_ms() - t0 < 20000);
        sleep_ms(1);
    }
    write_stream(sv[1], 120, 880);
    if (fiber) {
        CHECK_EQ(async_fiber_join(f, 20000), 0);
        async_sched_destroy(s);
    } else {
        join_within(t, 20000, "reader");
    }
    close(sv[0]);
    close(sv[1]);
}

CASE(timeout_keeps_bytes_fiber) { rest_kept(1); } // uring
CASE(timeout_keeps_bytes_thread) { rest_kept(0); }

/* ---- one deadline for the whole call --------------------------------------------- */

/* A byte every 10 ms for up to 20 s: each read gets data before its own
 * wait could time out, so only a deadline for the whole call ends it. */
static void body_trickle(int fd) {
    static char buf[100000];
    size_t got = 0;
    double t0 = now_ms();
    CHECK_FAIL(async_fiber_read_full(fd, buf, sizeof buf, &got, 300) == -1, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 < 15000); /* the bound of the case: ended by the deadline, not by the stream */
    CHECK(got > 0 && got < sizeof buf);
    check_stream(buf, 0, got);
}

static void one_deadline(int fiber) {
    writer_t w = {.chunks = 2000, .chunk = 1, .delay_ms = 10};
    run_case(fiber, &w, body_trickle);
}

CASE(one_deadline_fiber) { one_deadline(1); } // uring
CASE(one_deadline_thread) { one_deadline(0); }

/* ---- cancel mid-way ------------------------------------------------------------------- */

typedef struct {
    int fd;
    ssize_t r;
    int err;
    size_t got;
    char buf[1000];
} cancel_t;

static void cancel_fiber(void *arg) {
    cancel_t *x = arg;
    async_clear_error();
    x->r = async_fiber_read_full(x->fd, x->buf, sizeof x->buf, &x->got, 20000);
    x->err = async_last_error();
}

CASE(cancel_midway) { // uring
    int sv[2];
    make_pair(1, sv);
    static cancel_t x;
    memset(&x, 0, sizeof x);
    x.fd = sv[0];
    write_stream(sv[1], 0, 64);
    async_sched_t *s = sched_new(1);
    async_fiber_t *f = async_fiber_spawn(s, cancel_fiber, &x, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    sched_wait_parked(s, 1); /* it has the 64 bytes and waits for more */
    CHECK_EQ(async_fiber_cancel(f), 0);
    CHECK_EQ(async_fiber_join(f, 20000), 0);
    CHECK_EQ(x.r, -1);
    CHECK_EQ(x.err, ASYNC_E_CANCELLED);
    CHECK_EQ(x.got, 64);
    check_stream(x.buf, 0, 64);
    async_sched_destroy(s);
    close(sv[0]);
    close(sv[1]);
}

/* ---- bad input --------------------------------------------------------------------------- */

static void bad_args(void *arg) {
    (void)arg;
    int sv[2];
    make_pair(0, sv);
    char buf[8];
    size_t got = 5;
    CHECK_FAIL(async_fiber_read_full(sv[0], NULL, 4, &got, 100) == -1, ASYNC_E_INVAL);
    CHECK_EQ(got, 0);
    got = 5;
    CHECK_FAIL(async_fiber_read_full(-1, buf, 4, &got, 100) == -1, ASYNC_E_BADFD);
    CHECK_EQ(got, 0);
    got = 5;
    CHECK_FAIL(async_fiber_read_full(sv[0], buf, 4, &got, -2) == -1, ASYNC_E_INVAL);
    CHECK_EQ(got, 0);
    CHECK_FAIL(async_fiber_read_full(sv[0], buf, (size_t)-1, NULL, 100) == -1, ASYNC_E_INVAL);
    /* n 0: 0 at once, buf may be NULL */
    got = 5;
    CHECK_EQ(async_fiber_read_full(sv[0], NULL, 0, &got, -1), 0);
    CHECK_EQ(got, 0);
    /* got NULL is allowed */
    CHECK_EQ(write(sv[1], "abcd", 4), 4);
    CHECK_EQ(async_fiber_read_full(sv[0], buf, 4, NULL, 1000), 4);
    CHECK(memcmp(buf, "abcd", 4) == 0);
    close(sv[0]);
    close(sv[1]);
    /* a closed number */
    CHECK_FAIL(async_fiber_read_full(sv[0], buf, 4, &got, 100) == -1, ASYNC_E_BADFD);
}

CASE(read_full_bad_args) { on_fiber_then_thread(bad_args); } // uring

TEST_MAIN()
