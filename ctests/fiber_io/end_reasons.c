/* A parked fiber fd call that a timeout, async_fiber_cancel or
 * async_sched_shutdown ends reports that reason (ASYNC_E_TIMEDOUT,
 * ASYNC_E_CANCELLED), never ASYNC_E_BADFD or another error, for every kind
 * of fd (pipe, eventfd, pty, unix and TCP sockets, a listener), owned and
 * plain, on both I/O paths; a stream read ended again and again by 1 ms
 * timeouts and by cancels loses and duplicates no byte. */
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "check.h"
#include "net.h"

enum { END_TIMEOUT, END_CANCEL, END_SHUTDOWN };

enum {
    K_PIPE_READ,
    K_PIPE_WRITE,
    K_EVENTFD_READ,
    K_EVENTFD_WRITE,
    K_PTY_READ,
    K_PTY_WRITE,
    K_UNIX_READ,
    K_UNIX_WRITE,
    K_TCP_READ,
    K_TCP_WRITE,
    K_ACCEPT,
    K_COUNT
};

typedef struct {
    int kind;
    int fd;
    int timeout;
    atomic_int done;
    ssize_t r;
    int err;
} end_probe_t;

/* Fills fd: a socket with MSG_DONTWAIT (it stays blocking, so io_uring's
 * send waits in the ring), another fd switched to O_NONBLOCK. */
static void make_full(int fd, int sock)
{
    static char junk[65536];
    if (!sock)
        CHECK_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
    while ((sock ? send(fd, junk, sizeof junk, MSG_DONTWAIT) : write(fd, junk, sizeof junk)) > 0) {
    }
    while ((sock ? send(fd, junk, 1, MSG_DONTWAIT) : write(fd, junk, 1)) > 0) {
    }
}

/* Opens the fd of kind k that the call will wait on (*fd) and what must
 * stay open meanwhile (keep[0..1], -1 when unused). */
static void open_kind(int k, int *fd, int keep[2])
{
    int p[2];
    keep[0] = keep[1] = -1;
    switch (k) {
    case K_PIPE_READ:
    case K_PIPE_WRITE:
        CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
        *fd = k == K_PIPE_READ ? p[0] : p[1];
        keep[0] = k == K_PIPE_READ ? p[1] : p[0];
        if (k == K_PIPE_WRITE)
            make_full(*fd, 0);
        break;
    case K_EVENTFD_READ:
    case K_EVENTFD_WRITE:
        *fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        CHECK(*fd >= 0);
        if (k == K_EVENTFD_WRITE) {
            uint64_t v = UINT64_MAX - 1; /* the counter is full */
            CHECK_EQ(write(*fd, &v, sizeof v), (ssize_t)sizeof v);
        }
        break;
    case K_PTY_READ:
    case K_PTY_WRITE: {
        int m, sl;
        open_pty(&m, &sl);
        /* read: the master, nothing typed; write: the terminal side, its
         * output unread by the master until it is full */
        *fd = k == K_PTY_READ ? m : sl;
        keep[0] = k == K_PTY_READ ? sl : m;
        if (k == K_PTY_WRITE)
            make_full(*fd, 0);
        break;
    }
    case K_UNIX_READ:
    case K_UNIX_WRITE:
    case K_TCP_READ:
    case K_TCP_WRITE:
        make_pair(k == K_UNIX_READ || k == K_UNIX_WRITE ? 0 : 1, p);
        *fd = p[0];
        keep[0] = p[1];
        if (k == K_UNIX_WRITE || k == K_TCP_WRITE)
            make_full(*fd, 1);
        break;
    default: {
        struct sockaddr_in a;
        *fd = loopback_listener(4, &a);
        break;
    }
    }
}

static void end_call(void *arg)
{
    end_probe_t *m = arg;
    static _Thread_local char buf[1 << 16];
    uint64_t one = 1;
    switch (m->kind) {
    case K_PIPE_WRITE:
    case K_PTY_WRITE:
    case K_UNIX_WRITE:
    case K_TCP_WRITE:
        m->r = async_fiber_write(m->fd, buf, sizeof buf, m->timeout);
        break;
    case K_EVENTFD_WRITE:
        m->r = async_fiber_write(m->fd, &one, sizeof one, m->timeout);
        break;
    case K_EVENTFD_READ:
        m->r = async_fiber_read(m->fd, buf, 8, m->timeout);
        break;
    case K_ACCEPT:
        m->r = async_fiber_accept(m->fd, NULL, NULL, m->timeout);
        break;
    default:
        m->r = async_fiber_read(m->fd, buf, sizeof buf, m->timeout);
    }
    m->err = m->r == -1 ? async_last_error() : 0;
    atomic_store(&m->done, 1);
}

static void end_one(int k, int how, int owned)
{
    async_sched_t *s = sched_new(2);
    end_probe_t m = {.kind = k, .timeout = how == END_TIMEOUT ? 30 : INT_MAX};
    int keep[2];
    open_kind(k, &m.fd, keep);
    own_if(s, m.fd, owned);
    async_fiber_t *f = async_fiber_spawn(s, end_call, &m, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    if (how != END_TIMEOUT) {
        sched_wait_parked(s, 1);
        if (how == END_CANCEL)
            CHECK_EQ(async_fiber_cancel(f), 0);
        else
            CHECK_EQ(async_sched_shutdown(s, 5000), 0);
    }
    CHECK_EQ(async_fiber_join(f, 5000), 0);
    if (m.r != -1 || m.err != (how == END_TIMEOUT ? ASYNC_E_TIMEDOUT : ASYNC_E_CANCELLED))
        fprintf(stderr, "kind %d end %d owned %d: returned %zd error %d\n", k, how, owned, m.r, m.err);
    CHECK_EQ(m.r, -1);
    CHECK_EQ(m.err, how == END_TIMEOUT ? ASYNC_E_TIMEDOUT : ASYNC_E_CANCELLED);
    async_sched_destroy(s);
    close_as(m.fd, owned);
    for (int j = 0; j < 2; j++)
        if (keep[j] >= 0)
            close(keep[j]);
}

static void end_all_kinds(int how)
{
    for (int k = 0; k < K_COUNT; k++)
        for (int owned = 0; owned < 2; owned++)
            end_one(k, how, owned);
}

CASE(a_timeout_ends_a_parked_call_with_timedout_on_every_fd_kind) // uring adversarial
{
    end_all_kinds(END_TIMEOUT);
}

CASE(a_cancel_ends_a_parked_call_with_cancelled_on_every_fd_kind) // uring adversarial
{
    end_all_kinds(END_CANCEL);
}

CASE(a_shutdown_ends_a_parked_call_with_cancelled_on_every_fd_kind) // uring adversarial
{
    end_all_kinds(END_SHUTDOWN);
}

/* A pipe with room and a regular file never make a call wait: it completes
 * on a cancelled fiber (arg 0) and past the fiber's deadline (arg 1). */
static void io_that_need_not_wait(void *arg)
{
    if (arg)
        CHECK_EQ(async_fiber_set_deadline(0), 0);
    else
        CHECK_EQ(async_fiber_cancel(async_fiber_current()), 0);
    int p[2];
    CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    CHECK_EQ(async_fiber_write(p[1], "xy", 2, INT_MAX), 2);
    char b[8];
    CHECK_EQ(async_fiber_read(p[0], b, sizeof b, INT_MAX), 2);
    close_pair(p);
    char path[] = "/tmp/async_end_reasons_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    CHECK_EQ(async_fiber_write(fd, "abc", 3, INT_MAX), 3);
    CHECK_EQ(lseek(fd, 0, SEEK_SET), 0);
    CHECK_EQ(async_fiber_read(fd, b, sizeof b, INT_MAX), 3);
    CHECK_EQ(memcmp(b, "abc", 3), 0);
    CHECK_EQ(async_fiber_read(fd, b, sizeof b, INT_MAX), 0);
    close(fd);
}

CASE(pipe_and_file_io_that_need_not_wait_completes_when_cancelled_or_late) // uring adversarial
{
    async_sched_t *s = sched_new(2);
    on_fiber(s, io_that_need_not_wait, NULL);
    on_fiber(s, io_that_need_not_wait, (void *)1);
    async_sched_destroy(s);
}

/* ---- a stream read ended again and again ----------------------------------------- */

#define STREAM_BYTES 400000

typedef struct {
    int fd;  /* the reader's end */
    int wfd; /* the writer's end */
    atomic_long pos; /* bytes taken so far, all in order */
    atomic_int bad;
    atomic_int done;
} stream_t;

static void *stream_writer(void *arg)
{
    stream_t *st = arg;
    static unsigned char b[1024];
    unsigned seed = 7;
    for (long sent = 0; sent < STREAM_BYTES;) {
        long n = 1 + rand_r(&seed) % (long)sizeof b;
        if (n > STREAM_BYTES - sent)
            n = STREAM_BYTES - sent;
        for (long i = 0; i < n; i++)
            b[i] = (unsigned char)((sent + i) % 251);
        for (long off = 0; off < n;) {
            ssize_t w = write(st->wfd, b + off, (size_t)(n - off));
            CHECK(w > 0);
            off += w;
        }
        sent += n;
        if (rand_r(&seed) % 2 == 0)
            sleep_ms(1);
    }
    return NULL;
}

/* Reads until the stream is complete or its call fails other than by a
 * timeout; checks every byte against its position. */
static void stream_reader(void *arg)
{
    stream_t *st = arg;
    unsigned char b[3000];
    unsigned seed = (unsigned)atomic_load(&st->pos);
    while (atomic_load(&st->pos) < STREAM_BYTES) {
        size_t want = 1 + rand_r(&seed) % sizeof b;
        ssize_t r = async_fiber_read(st->fd, b, want, 1 + rand_r(&seed) % 2);
        if (r < 0) {
            if (async_last_error() == ASYNC_E_TIMEDOUT)
                continue;
            if (async_last_error() != ASYNC_E_CANCELLED)
                atomic_fetch_add(&st->bad, 1);
            break;
        }
        CHECK(r > 0);
        long p = atomic_load(&st->pos);
        for (ssize_t i = 0; i < r; i++)
            if (b[i] != (unsigned char)((p + i) % 251))
                atomic_fetch_add(&st->bad, 1);
        atomic_store(&st->pos, p + r);
    }
    atomic_fetch_add(&st->done, 1);
}

static void stream_ended_again_and_again(int kind, int owned)
{
    async_sched_t *s = sched_new(2);
    int sv[2];
    make_pair(kind, sv);
    own_if(s, sv[0], owned);
    stream_t st = {.fd = sv[0], .wfd = sv[1]};
    pthread_t th;
    start_thread(&th, stream_writer, &st);
    int rounds = 0;
    double t0 = now_ms();
    while (atomic_load(&st.pos) < STREAM_BYTES) {
        if (now_ms() - t0 > 60000)
            fprintf(stderr, "%ld of %d bytes after %d rounds\n", atomic_load(&st.pos), STREAM_BYTES, rounds);
        CHECK(now_ms() - t0 < 60000);
        atomic_store(&st.done, 0);
        async_fiber_t *f = async_fiber_spawn(s, stream_reader, &st, ASYNC_FIBER_JOINABLE);
        CHECK(f != NULL);
        sleep_ms(rounds++ % 3);
        CHECK_EQ(async_fiber_cancel(f), 0);
        CHECK_EQ(async_fiber_join(f, 5000), 0);
        CHECK_EQ(atomic_load(&st.bad), 0);
    }
    CHECK_EQ(atomic_load(&st.pos), STREAM_BYTES);
    join_within(th, 5000, "the stream writer");
    async_sched_destroy(s);
    close_as(sv[0], owned);
    close(sv[1]);
}

CASE(a_stream_read_ended_by_timeouts_and_cancels_loses_no_byte) // uring adversarial timeout=180
{
    for (int kind = 0; kind < 2; kind++)
        for (int owned = 0; owned < 2; owned++)
            stream_ended_again_and_again(kind, owned);
}

TEST_MAIN()
