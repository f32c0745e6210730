/* The buffered reader (async_reader_*): frames cut at a delimiter out of a
 * stream however the bytes arrive, the max_len bound (ASYNC_E_TOOBIG and
 * the rest of the frame after it; max_len bytes without a delimiter at end
 * of file too), the last frame at end of file, no byte lost to a timeout or
 * a cancel, the frames already there taken past a deadline or a cancel,
 * async_reader_read beside read_until, and the argument errors. The I/O
 * cases run on a fiber and on a plain thread (and, with the `uring` word,
 * on io_uring). */
#include "check.h"
#include "net.h"

#include <limits.h>
#include <pthread.h>

/* ---- helpers ------------------------------------------------------------------ */

/* A writer thread: writes data in pieces of `piece` bytes, sleeping
 * pause_ms between them (while stop is 0), then shuts its side down for
 * writing if eof is set. */
typedef struct {
    int fd;
    const char *data;
    size_t len, piece;
    int pause_ms, eof;
    atomic_int stop;
} trickle_t;

static void *trickle_thread(void *arg)
{
    trickle_t *t = arg;
    for (size_t off = 0; off < t->len && !atomic_load(&t->stop);) {
        size_t n = t->len - off < t->piece ? t->len - off : t->piece;
        CHECK_EQ(write(t->fd, t->data + off, n), (ssize_t)n);
        off += n;
        if (t->pause_ms)
            sleep_ms(t->pause_ms);
    }
    if (t->eof)
        CHECK_EQ(shutdown(t->fd, SHUT_WR), 0);
    return NULL;
}

/* Writes s to fd at once (blocking). */
static void put(int fd, const char *s)
{
    size_t n = strlen(s);
    CHECK_EQ(write(fd, s, n), (ssize_t)n);
}

/* The next frame must be `want` (its length and bytes). */
static void expect_frame(async_reader_t *r, int delim, const char *want, int timeout_ms)
{
    const char *out = NULL;
    ssize_t n = async_reader_read_until(r, delim, &out, timeout_ms);
    if (n != (ssize_t)strlen(want))
        fprintf(stderr, "frame: got %zd (%s), want %zu bytes \"%s\"\n", n, n < 0 ? async_strerror(async_last_error()) : "",
                strlen(want), want);
    CHECK_EQ(n, (ssize_t)strlen(want));
    CHECK(n == 0 || memcmp(out, want, (size_t)n) == 0);
}

/* The next read_until must fail with err. */
static void expect_error(async_reader_t *r, int delim, int err, int timeout_ms)
{
    const char *out = NULL;
    CHECK_EQ(async_reader_read_until(r, delim, &out, timeout_ms), -1);
    CHECK_ERR(err);
}

/* ---- frames, however the bytes arrive --------------------------------------- */

static const char lines[] = "look\nsay hello to the room\n\nnorth\nget lamp from the chest\nquit\n";

static void split_writes_fn(void *arg)
{
    (void)arg;
    int sv[2];
    pthread_t t;
    make_pair(0, sv);
    trickle_t tr = {sv[1], lines, sizeof lines - 1, 3, 1, 1, 0};
    async_reader_t *r = async_reader_create(sv[0], 64);
    CHECK(r != NULL);
    start_thread(&t, trickle_thread, &tr);
    expect_frame(r, '\n', "look\n", 10000);
    expect_frame(r, '\n', "say hello to the room\n", 10000);
    expect_frame(r, '\n', "\n", 10000);
    expect_frame(r, '\n', "north\n", 10000);
    expect_frame(r, '\n', "get lamp from the chest\n", 10000);
    expect_frame(r, '\n', "quit\n", 10000);
    expect_frame(r, '\n', "", 10000); /* end of file */
    join_within(t, 10000, "writer");
    async_reader_destroy(r);
    close_pair(sv);
}

CASE(lines_split_across_many_writes) // uring
{
    on_fiber_then_thread(split_writes_fn);
}

static void pipelined_fn(void *arg)
{
    (void)arg;
    int sv[2];
    make_pair(1, sv);
    async_reader_t *r = async_reader_create(sv[0], 32);
    CHECK(r != NULL);
    put(sv[1], "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\n\r\n");
    expect_frame(r, '\n', "GET / HTTP/1.1\r\n", 10000);
    /* the rest came with the same read: no wait for it */
    CHECK_EQ(async_reader_buffered(r), strlen("Host: a\r\n\r\nGET /2 HTTP/1.1\r\n\r\n"));
    expect_frame(r, '\n', "Host: a\r\n", 0);
    expect_frame(r, '\n', "\r\n", 0);
    expect_frame(r, '\n', "GET /2 HTTP/1.1\r\n", 0);
    expect_frame(r, '\n', "\r\n", 0);
    CHECK_EQ(async_reader_buffered(r), 0);
    expect_error(r, '\n', ASYNC_E_TIMEDOUT, 0);
    async_reader_destroy(r);
    close_pair(sv);
}

CASE(several_frames_in_one_read) // uring
{
    on_fiber_then_thread(pipelined_fn);
}

static void other_delim_fn(void *arg)
{
    (void)arg;
    int sv[2];
    make_pair(0, sv);
    async_reader_t *r = async_reader_create(sv[0], 16);
    CHECK(r != NULL);
    CHECK_EQ(write(sv[1], "k=v;x\0y;\xff|z", 11), 11);
    CHECK_EQ(shutdown(sv[1], SHUT_WR), 0);
    expect_frame(r, ';', "k=v;", 10000);
    {
        const char *out;
        CHECK_EQ(async_reader_read_until(r, 0, &out, 10000), 2);
        CHECK(memcmp(out, "x\0", 2) == 0);
    }
    expect_frame(r, ';', "y;", 10000);
    expect_frame(r, 0xff, "\xff", 10000);
    expect_frame(r, '|', "|", 10000);
    expect_frame(r, '\n', "z", 10000); /* the last frame has no delimiter */
    expect_frame(r, '\n', "", 10000);
    async_reader_destroy(r);
    close_pair(sv);
}

CASE(delimiter_other_than_newline) // uring
{
    on_fiber_then_thread(other_delim_fn);
}

static void partial_eof_fn(void *arg)
{
    (void)arg;
    int sv[2];
    make_pair(1, sv);
    async_reader_t *r = async_reader_create(sv[0], 100);
    CHECK(r != NULL);
    put(sv[1], "one\ntwo\nunfinished");
    CHECK_EQ(shutdown(sv[1], SHUT_WR), 0);
    expect_frame(r, '\n', "one\n", 10000);
    expect_frame(r, '\n', "two\n", 10000);
    expect_frame(r, '\n', "unfinished", 10000);
    expect_frame(r, '\n', "", 10000);
    expect_frame(r, '\n', "", 10000); /* and 0 again */
    async_reader_destroy(r);
    close_pair(sv);
}

CASE(eof_returns_partial_frame_then_zero) // uring
{
    on_fiber_then_thread(partial_eof_fn);
}

/* ---- the max_len bound ---------------------------------------------------------- */

static void max_len_fn(void *arg)
{
    (void)arg;
    int sv[2];
    const char *out;
    make_pair(0, sv);
    async_reader_t *r = async_reader_create(sv[0], 8);
    CHECK(r != NULL);
    put(sv[1], "1234567\n12345678\nab\n");
    expect_frame(r, '\n', "1234567\n", 10000); /* exactly max_len */
    CHECK_EQ(async_reader_read_until(r, '\n', &out, 10000), -1);
    CHECK_ERR(ASYNC_E_TOOBIG);
    CHECK(memcmp(out, "12345678", 8) == 0); /* its first max_len bytes, consumed */
    expect_frame(r, '\n', "\n", 10000);      /* then the rest of that frame */
    expect_frame(r, '\n', "ab\n", 10000);
    async_reader_destroy(r);
    close_pair(sv);
}

CASE(exactly_max_len_and_one_more) // uring
{
    on_fiber_then_thread(max_len_fn);
}

/* A reader (max_len) of a unix stream that holds data, then end of file. */
static async_reader_t *reader_at_eof(int sv[2], size_t max_len, const char *data)
{
    make_pair(0, sv);
    async_reader_t *r = async_reader_create(sv[0], max_len);
    CHECK(r != NULL);
    put(sv[1], data);
    CHECK_EQ(shutdown(sv[1], SHUT_WR), 0);
    return r;
}

/* max_len bytes without a delimiter are a frame too long as soon as they
 * are buffered, at end of file too: a last frame has at most max_len - 1
 * bytes (max_len 8, and max_len 1 where every byte but the delimiter is
 * too long). */
static void eof_max_len_fn(void *arg)
{
    (void)arg;
    int sv[2];
    const char *out;
    async_reader_t *r = reader_at_eof(sv, 8, "1234567\n12345678");
    expect_frame(r, '\n', "1234567\n", 10000);
    expect_error(r, '\n', ASYNC_E_TOOBIG, 10000);
    expect_frame(r, '\n', "", 10000);
    async_reader_destroy(r);
    close_pair(sv);
    r = reader_at_eof(sv, 1, "\nab");
    expect_frame(r, '\n', "\n", 10000);
    CHECK_EQ(async_reader_read_until(r, '\n', &out, 10000), -1);
    CHECK_ERR(ASYNC_E_TOOBIG);
    CHECK_EQ(out[0], 'a');
    expect_error(r, '\n', ASYNC_E_TOOBIG, 10000);
    expect_frame(r, '\n', "", 10000);
    async_reader_destroy(r);
    close_pair(sv);
}

CASE(max_len_without_delimiter_is_too_long_at_eof_too) // uring adversarial
{
    on_fiber_then_thread(eof_max_len_fn);
}

/* Frames of max_len and max_len + 1 bytes behind a shorter one, with
 * max_len above the smallest buffer: the unread bytes must move to the
 * buffer's front to make room for them. */
#define BIG 10000
static char big_in[3000 + BIG + (BIG + 1) + 3];

static void big_frames_fn(void *arg)
{
    (void)arg;
    int sv[2];
    pthread_t t;
    const char *out;
    size_t off = 0;
    memset(big_in, 'x', sizeof big_in);
    big_in[off += 3000 - 1] = '\n';
    big_in[off += BIG] = '\n';
    big_in[off += BIG + 1] = '\n';
    memcpy(big_in + sizeof big_in - 3, "ok\n", 3);
    make_pair(0, sv);
    trickle_t tr = {sv[1], big_in, sizeof big_in, 1000, 0, 1, 0};
    async_reader_t *r = async_reader_create(sv[0], BIG);
    CHECK(r != NULL);
    start_thread(&t, trickle_thread, &tr);
    CHECK_EQ(async_reader_read_until(r, '\n', &out, 10000), 3000);
    CHECK_EQ(async_reader_read_until(r, '\n', &out, 10000), BIG);
    CHECK(out[0] == 'x' && out[BIG - 2] == 'x' && out[BIG - 1] == '\n');
    CHECK_EQ(async_reader_read_until(r, '\n', &out, 10000), -1);
    CHECK_ERR(ASYNC_E_TOOBIG);
    CHECK(out[0] == 'x' && out[BIG - 1] == 'x');
    expect_frame(r, '\n', "\n", 10000); /* the rest of the frame */
    expect_frame(r, '\n', "ok\n", 10000);
    expect_frame(r, '\n', "", 10000);
    join_within(t, 10000, "writer");
    async_reader_destroy(r);
    close_pair(sv);
}

CASE(frames_of_max_len_above_the_buffer_minimum) // uring
{
    on_fiber_then_thread(big_frames_fn);
}

/* ---- timeouts and cancels lose nothing ------------------------------------------- */

static void timeout_fn(void *arg)
{
    (void)arg;
    int sv[2];
    make_pair(1, sv);
    async_reader_t *r = async_reader_create(sv[0], 64);
    CHECK(r != NULL);
    expect_error(r, '\n', ASYNC_E_TIMEDOUT, 0);
    put(sv[1], "abc");
    expect_error(r, '\n', ASYNC_E_TIMEDOUT, 50);
    CHECK_EQ(async_reader_buffered(r), 3);
    expect_error(r, '\n', ASYNC_E_TIMEDOUT, 0);
    put(sv[1], "def\nghi");
    expect_frame(r, '\n', "abcdef\n", 10000);
    CHECK_EQ(async_reader_buffered(r), 3);
    async_reader_destroy(r);
    close_pair(sv);
}

CASE(timeout_mid_frame_keeps_the_bytes) // uring
{
    on_fiber_then_thread(timeout_fn);
}

/* A byte every 10 ms and never a delimiter: each read succeeds, yet the
 * call ends at its timeout, long before the writer stops. */
static char trickle_data[400];

static void whole_call_fn(void *arg)
{
    (void)arg;
    int sv[2];
    pthread_t t;
    make_pair(0, sv);
    memset(trickle_data, 'z', sizeof trickle_data);
    trickle_t tr = {sv[1], trickle_data, sizeof trickle_data, 1, 10, 0, 0};
    async_reader_t *r = async_reader_create(sv[0], 1000);
    CHECK(r != NULL);
    start_thread(&t, trickle_thread, &tr);
    double t0 = now_ms();
    expect_error(r, '\n', ASYNC_E_TIMEDOUT, 200);
    double took = now_ms() - t0;
    atomic_store(&tr.stop, 1);
    join_within(t, 10000, "writer");
    CHECK(took >= 190);
    CHECK(took < 3000); /* the writer goes on for 4 s */
    CHECK(async_reader_buffered(r) > 0);
    async_reader_destroy(r);
    close_pair(sv);
}

CASE(timeout_bounds_the_whole_call) // uring
{
    on_fiber_then_thread(whole_call_fn);
}

typedef struct {
    async_reader_t *r;
    ssize_t rc;
    int err;
} cancel_t;

static void cancel_reader_fiber(void *arg)
{
    cancel_t *c = arg;
    const char *out;
    c->rc = async_reader_read_until(c->r, '\n', &out, -1);
    c->err = async_last_error();
}

CASE(cancel_mid_frame_keeps_the_bytes) // uring
{
    int sv[2];
    cancel_t c = {0};
    async_sched_t *s = sched_new(1);
    make_pair(0, sv);
    c.r = async_reader_create(sv[0], 64);
    CHECK(c.r != NULL);
    put(sv[1], "abc");
    async_fiber_t *f = async_fiber_spawn(s, cancel_reader_fiber, &c, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    sched_wait_parked(s, 1);
    sleep_ms(20);
    CHECK_EQ(async_fiber_cancel(f), 0);
    CHECK_EQ(async_fiber_join(f, 10000), 0);
    CHECK_EQ(c.rc, -1);
    CHECK_EQ(c.err, ASYNC_E_CANCELLED);
    /* the reader goes on on this thread: "abc" was kept (in the reader or
     * still in the socket) */
    put(sv[1], "def\n");
    expect_frame(c.r, '\n', "abcdef\n", 10000);
    async_reader_destroy(c.r);
    async_sched_destroy(s);
    close_pair(sv);
}

/* A fiber past its deadline, or cancelled, still gets the frames whose
 * bytes are there (buffered, or in the socket after a short read); only a
 * call that has to wait fails, and keeps the bytes. */
static void past_deadline_fiber(void *arg)
{
    int *sv = arg;
    char c;
    async_reader_t *r = async_reader_create(sv[0], 64);
    CHECK(r != NULL);
    put(sv[1], "ab");
    CHECK_EQ(async_fiber_set_deadline(50), 0);
    expect_error(r, '\n', ASYNC_E_TIMEDOUT, 10000);
    CHECK_EQ(async_reader_buffered(r), 2);
    put(sv[1], "\nx\n");
    expect_frame(r, '\n', "ab\n", 10000);
    expect_frame(r, '\n', "x\n", 10000);
    put(sv[1], "y\n");
    expect_frame(r, '\n', "y\n", 10000);
    expect_error(r, '\n', ASYNC_E_TIMEDOUT, 10000);
    CHECK_EQ(async_fiber_set_deadline(-1), 0);
    CHECK_EQ(async_fiber_cancel(async_fiber_current()), 0);
    put(sv[1], "q\nw");
    expect_frame(r, '\n', "q\n", 10000);
    expect_error(r, '\n', ASYNC_E_CANCELLED, 10000);
    CHECK_EQ(async_reader_read(r, &c, 1, 10000), 1);
    CHECK_EQ(c, 'w');
    put(sv[1], "e");
    CHECK_EQ(async_reader_read(r, &c, 1, 10000), 1);
    CHECK_EQ(c, 'e');
    async_reader_destroy(r);
}

CASE(past_deadline_or_cancelled_takes_the_frames_there) // uring adversarial
{
    int sv[2];
    async_sched_t *s = sched_new(2);
    make_pair(0, sv);
    on_fiber(s, past_deadline_fiber, sv);
    async_sched_destroy(s);
    close_pair(sv);
}

/* ---- async_reader_read beside read_until -------------------------------------------- */

static void mixed_fn(void *arg)
{
    (void)arg;
    int sv[2];
    char buf[64];
    make_pair(0, sv);
    async_reader_t *r = async_reader_create(sv[0], 64);
    CHECK(r != NULL);
    put(sv[1], "Content-Length: 10\n0123456789");
    expect_frame(r, '\n', "Content-Length: 10\n", 10000);
    CHECK_EQ(async_reader_read(r, buf, 0, 10000), 0);
    CHECK_EQ(async_reader_read(r, buf, 4, 10000), 4); /* from the buffer */
    CHECK(memcmp(buf, "0123", 4) == 0);
    CHECK_EQ(async_reader_buffered(r), 6);
    put(sv[1], "next\n");
    CHECK_EQ(async_reader_read(r, buf, sizeof buf, 10000), 6); /* the buffer only */
    CHECK(memcmp(buf, "456789", 6) == 0);
    CHECK_EQ(async_reader_buffered(r), 0);
    expect_frame(r, '\n', "next\n", 10000);
    put(sv[1], "raw");
    CHECK_EQ(async_reader_read(r, buf, sizeof buf, 10000), 3); /* straight from fd */
    CHECK(memcmp(buf, "raw", 3) == 0);
    CHECK_EQ(async_reader_read(r, buf, sizeof buf, 0), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    /* a partial frame, then read takes part of it: the search restarts
     * where the bytes now begin */
    put(sv[1], "abcdef");
    expect_error(r, '\n', ASYNC_E_TIMEDOUT, 30);
    CHECK_EQ(async_reader_read(r, buf, 2, 10000), 2);
    CHECK(memcmp(buf, "ab", 2) == 0);
    put(sv[1], "\n");
    expect_frame(r, '\n', "cdef\n", 10000);
    CHECK_EQ(shutdown(sv[1], SHUT_WR), 0);
    CHECK_EQ(async_reader_read(r, buf, sizeof buf, 10000), 0);
    async_reader_destroy(r);
    close_pair(sv);
}

CASE(read_mixes_with_read_until) // uring
{
    on_fiber_then_thread(mixed_fn);
}

/* ---- random frames and splits against a model ------------------------------------- */

/* 256 KiB of bytes with delimiters at random gaps (some longer than
 * max_len), written in random pieces at random pauses; the reader's
 * results (frames, TOOBIG, raw reads mixed in, the last frame, 0) must be
 * what cutting the same bytes by the rule gives. */
#define MODEL_LEN (256 * 1024)
#define MODEL_MAX 300
static char model_in[MODEL_LEN];

static uint32_t model_rng(uint32_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return *x;
}

static void *model_writer(void *arg)
{
    int fd = (int)(intptr_t)arg;
    uint32_t x = 0x9e3779b9u;
    for (size_t off = 0; off < MODEL_LEN;) {
        size_t n = 1 + model_rng(&x) % 2000;
        if (n > MODEL_LEN - off)
            n = MODEL_LEN - off;
        CHECK_EQ(write(fd, model_in + off, n), (ssize_t)n);
        off += n;
        if (model_rng(&x) % 16 == 0)
            sleep_ms(1);
    }
    CHECK_EQ(shutdown(fd, SHUT_WR), 0);
    return NULL;
}

/* What read_until must return at pos: the frame's length (*toobig 0), or
 * MODEL_MAX with *toobig 1; 0 at the end. */
static size_t model_next(size_t pos, int *toobig)
{
    size_t left = MODEL_LEN - pos, lim = left < MODEL_MAX ? left : MODEL_MAX;
    const char *p = memchr(model_in + pos, '\n', lim);
    *toobig = 0;
    if (p)
        return (size_t)(p - (model_in + pos)) + 1;
    if (left >= MODEL_MAX) {
        *toobig = 1;
        return MODEL_MAX;
    }
    return left;
}

static void model_fn(void *arg)
{
    (void)arg;
    int sv[2];
    pthread_t t;
    uint32_t x = 12345;
    size_t pos = 0, frames = 0, toobigs = 0, raws = 0;
    char raw[64];
    for (size_t i = 0; i < MODEL_LEN; i++) {
        uint32_t v = model_rng(&x);
        model_in[i] = v % 97 == 0 || (v >> 20) % 613 == 0 ? '\n' : (char)('a' + v % 26);
    }
    make_pair(0, sv);
    async_reader_t *r = async_reader_create(sv[0], MODEL_MAX);
    CHECK(r != NULL);
    start_thread(&t, model_writer, (void *)(intptr_t)sv[1]);
    for (;;) {
        if (model_rng(&x) % 8 == 0) { /* a raw read: what comes must be the next bytes */
            ssize_t n = async_reader_read(r, raw, 1 + model_rng(&x) % sizeof raw, 10000);
            CHECK(n >= 0);
            if (n == 0) {
                CHECK_EQ(pos, MODEL_LEN);
                break;
            }
            CHECK(memcmp(raw, model_in + pos, (size_t)n) == 0);
            pos += (size_t)n;
            raws++;
            continue;
        }
        const char *out;
        int toobig;
        size_t want = pos < MODEL_LEN ? model_next(pos, &toobig) : (toobig = 0, 0);
        ssize_t n = async_reader_read_until(r, '\n', &out, 10000);
        if (toobig) {
            CHECK_EQ(n, -1);
            CHECK_ERR(ASYNC_E_TOOBIG);
            toobigs++;
        } else {
            CHECK_EQ(n, (ssize_t)want);
        }
        if (want == 0)
            break;
        CHECK(memcmp(out, model_in + pos, want) == 0);
        pos += want;
        frames++;
    }
    join_within(t, 10000, "writer");
    printf("%zu frames (%zu too long), %zu raw reads\n", frames, toobigs, raws);
    CHECK(frames > 1000 && toobigs > 10 && raws > 100); /* the data had every kind */
    async_reader_destroy(r);
    close_pair(sv);
}

CASE(random_frames_and_splits_match_a_model) // uring
{
    on_fiber_then_thread(model_fn);
}

/* ---- bad arguments ------------------------------------------------------------------ */

CASE(bad_arguments)
{
    int sv[2];
    const char *out;
    char buf[8];
    make_pair(0, sv);
    async_clear_error();
    CHECK(async_reader_create(sv[0], 0) == NULL);
    CHECK_ERR(ASYNC_E_INVAL);
    CHECK(async_reader_create(sv[0], ((size_t)64 << 20) + 1) == NULL);
    CHECK_ERR(ASYNC_E_INVAL);
    CHECK(async_reader_create(-1, 16) == NULL);
    CHECK_ERR(ASYNC_E_BADFD);
    async_reader_t *huge = async_reader_create(sv[0], (size_t)64 << 20);
    CHECK(huge != NULL);
    async_reader_destroy(huge);
    async_reader_destroy(NULL);
    CHECK_EQ(async_reader_buffered(NULL), 0);

    async_reader_t *r = async_reader_create(sv[0], 16);
    CHECK(r != NULL);
    CHECK_EQ(async_reader_read_until(NULL, '\n', &out, 0), -1);
    CHECK_ERR(ASYNC_E_INVAL);
    CHECK_EQ(async_reader_read_until(r, '\n', NULL, 0), -1);
    CHECK_ERR(ASYNC_E_INVAL);
    CHECK_EQ(async_reader_read_until(r, '\n', &out, -2), -1);
    CHECK_ERR(ASYNC_E_INVAL);
    CHECK_EQ(async_reader_read(NULL, buf, sizeof buf, 0), -1);
    CHECK_ERR(ASYNC_E_INVAL);
    CHECK_EQ(async_reader_read(r, NULL, 1, 0), -1);
    CHECK_ERR(ASYNC_E_INVAL);
    CHECK_EQ(async_reader_read(r, buf, sizeof buf, -2), -1);
    CHECK_ERR(ASYNC_E_INVAL);
    put(sv[1], "partial");
    expect_error(r, '\n', ASYNC_E_TIMEDOUT, 20);
    /* the same errors with bytes buffered, and the bytes stay */
    CHECK_EQ(async_reader_read(r, NULL, 1, 0), -1);
    CHECK_ERR(ASYNC_E_INVAL);
    CHECK_EQ(async_reader_read(r, buf, sizeof buf, -2), -1);
    CHECK_ERR(ASYNC_E_INVAL);
    CHECK_EQ(async_reader_read_until(r, '\n', &out, -2), -1);
    CHECK_ERR(ASYNC_E_INVAL);
    CHECK_EQ(async_reader_buffered(r), 7);
    async_reader_destroy(r);

    /* an fd that is not open: the read's error */
    int dead = dup(sv[0]);
    CHECK(dead >= 0);
    close(dead);
    r = async_reader_create(dead, 16);
    CHECK(r != NULL);
    CHECK_EQ(async_reader_read_until(r, '\n', &out, 0), -1);
    CHECK_ERR(ASYNC_E_BADFD);
    CHECK_EQ(async_reader_read(r, buf, sizeof buf, 0), -1);
    CHECK_ERR(ASYNC_E_BADFD);
    async_reader_destroy(r);
    close_pair(sv);
}

/* n above SSIZE_MAX is ASYNC_E_INVAL as for async_fiber_read, also when
 * bytes are buffered (which stay). */
CASE(read_of_more_than_ssize_max_is_invalid) // adversarial
{
    int sv[2];
    char buf[8];
    make_pair(0, sv);
    async_reader_t *r = async_reader_create(sv[0], 16);
    CHECK(r != NULL);
    CHECK_FAIL(async_reader_read(r, buf, (size_t)SSIZE_MAX + 1, 0) == -1, ASYNC_E_INVAL);
    put(sv[1], "partial");
    expect_error(r, '\n', ASYNC_E_TIMEDOUT, 20);
    CHECK_FAIL(async_reader_read(r, buf, (size_t)SSIZE_MAX + 1, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_reader_read(r, buf, SIZE_MAX, 0) == -1, ASYNC_E_INVAL);
    CHECK_EQ(async_reader_buffered(r), 7);
    async_reader_destroy(r);
    close_pair(sv);
}

TEST_MAIN()
