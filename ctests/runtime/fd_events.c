/* fd readiness through async_runtime_add_fd / modify_fd / remove_fd: read,
 * write and both, hang-up, error and half-close, modify and remove,
 * duplicates and bad fds, regular files, an event mask of zero, a closed fd
 * whose number is reused; each registration's own context in every event;
 * a wait with timeout 0 reports what is ready; with more ready fds than
 * max_events every one is reported within a bounded number of waits, also
 * while another thread floods completions, and within ceil(R / max_events)
 * + 1 waits while another thread adds, modifies and removes other fds. */
#include "check.h"
#include "rt.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

/* --- fd readiness ------------------------------------------------------- */

static int ctx_a, ctx_b;

CASE(fd_read) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int p[2], i;
    char c = 'x';
    CHECK(pipe(p) == 0);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_a), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0); /* nothing to read yet */
    CHECK(write(p[1], &c, 1) == 1);
    /* level-triggered: reported on every wait until consumed */
    for (i = 0; i < 3; i++) {
        CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
        CHECK_EQ(ev[0].fd, p[0]);
        CHECK(ev[0].event_type & ASYNC_EVENT_READ);
        CHECK(!(ev[0].event_type & (ASYNC_EVENT_COMPLETION | ASYNC_EVENT_TIMER | ASYNC_EVENT_WRITE)));
        CHECK(ev[0].context == (void *)&ctx_a);
        CHECK(ev[0].completion_key == 0 && ev[0].data == 0);
    }
    CHECK(read(p[0], &c, 1) == 1);
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    async_runtime_deinit(rt);
    close_pair(p);
}

CASE(fd_write) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int s[2], n, filled = 0;
    char buf[4096];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0);
    set_nonblock(s[0]);
    set_nonblock(s[1]);
    CHECK_EQ(async_runtime_add(rt, s[0], ASYNC_EVENT_WRITE, &ctx_b), 0);
    n = wait_some(rt, ev, 4, 5000);
    CHECK_EQ(n, 1);
    CHECK_EQ(ev[0].fd, s[0]);
    CHECK(ev[0].event_type & ASYNC_EVENT_WRITE);
    CHECK(!(ev[0].event_type & ASYNC_EVENT_READ));
    CHECK(ev[0].context == (void *)&ctx_b);
    /* fill the socket: no longer writable */
    memset(buf, 'w', sizeof buf);
    for (;;) {
        ssize_t w = send(s[0], buf, sizeof buf, MSG_NOSIGNAL);
        if (w < 0) {
            CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
            break;
        }
        filled += (int)w;
    }
    CHECK(filled > 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0);
    /* drain the peer: writable again */
    while (recv(s[1], buf, sizeof buf, 0) > 0) {
    }
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].fd, s[0]);
    CHECK(ev[0].event_type & ASYNC_EVENT_WRITE);
    CHECK_EQ(async_runtime_remove(rt, s[0]), 0);
    async_runtime_deinit(rt);
    close_pair(s);
}

/* ORs the bits reported for fd over one wait (READ and WRITE may come in one
 * event or in two). */
static uint32_t bits_for(async_runtime_t *rt, int fd, void *ctx)
{
    io_event_t ev[8];
    uint32_t bits = 0;
    int n = wait_some(rt, ev, 8, 5000), i;
    for (i = 0; i < n; i++) {
        CHECK_EQ(ev[i].fd, fd);
        CHECK(ev[i].context == ctx);
        bits |= ev[i].event_type;
    }
    return bits;
}

CASE(fd_readwrite) // poll
{
    async_runtime_t *rt = mkrt();
    int s[2];
    uint32_t bits;
    char c = 'r';
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0);
    CHECK_EQ(async_runtime_add(rt, s[0], ASYNC_EVENT_READ | ASYNC_EVENT_WRITE, &ctx_a), 0);
    bits = bits_for(rt, s[0], &ctx_a);
    CHECK(bits & ASYNC_EVENT_WRITE);
    CHECK(!(bits & ASYNC_EVENT_READ));
    CHECK(send(s[1], &c, 1, MSG_NOSIGNAL) == 1);
    bits = bits_for(rt, s[0], &ctx_a);
    CHECK((bits & (ASYNC_EVENT_READ | ASYNC_EVENT_WRITE)) == (ASYNC_EVENT_READ | ASYNC_EVENT_WRITE));
    CHECK(!(bits & (ASYNC_EVENT_CLOSE | ASYNC_EVENT_ERROR)));
    CHECK_EQ(async_runtime_remove(rt, s[0]), 0);
    async_runtime_deinit(rt);
    close_pair(s);
}

CASE(fd_close) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int p[2], s[2];
    /* pipe: the writer goes away */
    CHECK(pipe(p) == 0);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_a), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
    close(p[1]);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].fd, p[0]);
    CHECK(ev[0].event_type & ASYNC_EVENT_CLOSE);
    CHECK(ev[0].context == (void *)&ctx_a);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    close(p[0]);
    /* socket: the peer closes (only READ was asked for; CLOSE always comes) */
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0);
    CHECK_EQ(async_runtime_add(rt, s[0], ASYNC_EVENT_READ, &ctx_b), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
    close(s[1]);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].fd, s[0]);
    CHECK(ev[0].event_type & ASYNC_EVENT_CLOSE);
    CHECK(ev[0].context == (void *)&ctx_b);
    /* level-triggered: reported again */
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].event_type & ASYNC_EVENT_CLOSE);
    CHECK_EQ(async_runtime_remove(rt, s[0]), 0);
    close(s[0]);
    async_runtime_deinit(rt);
}

CASE(fd_error) // poll
{
    /* a pipe's write end whose reader is gone has an error condition;
     * ERROR is reported even when only READ is watched */
    async_runtime_t *rt = mkrt();
    uint32_t masks[2] = {ASYNC_EVENT_WRITE, ASYNC_EVENT_READ};
    int i;
    for (i = 0; i < 2; i++) {
        io_event_t ev[4];
        int p[2];
        CHECK(pipe(p) == 0);
        close(p[0]);
        CHECK_EQ(async_runtime_add(rt, p[1], masks[i], &ctx_b), 0);
        CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
        CHECK_EQ(ev[0].fd, p[1]);
        CHECK(ev[0].event_type & ASYNC_EVENT_ERROR);
        CHECK(ev[0].context == (void *)&ctx_b);
        CHECK_EQ(async_runtime_remove(rt, p[1]), 0);
        close(p[1]);
    }
    async_runtime_deinit(rt);
}

CASE(fd_modify) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int s[2], other[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0);
    CHECK(pipe(other) == 0);
    CHECK_EQ(async_runtime_add(rt, s[0], ASYNC_EVENT_READ, &ctx_a), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
    CHECK_EQ(async_runtime_modify(rt, s[0], ASYNC_EVENT_WRITE), 0);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].fd, s[0]);
    CHECK(ev[0].event_type & ASYNC_EVENT_WRITE);
    CHECK(ev[0].context == (void *)&ctx_a); /* the context from add is kept */
    CHECK_EQ(async_runtime_modify(rt, s[0], ASYNC_EVENT_READ), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
    CHECK_FAIL(async_runtime_modify(rt, s[0], 0x40) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_modify(rt, s[0], ASYNC_EVENT_READ | 0x1000) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_modify(rt, other[0], ASYNC_EVENT_READ) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_modify(rt, -1, ASYNC_EVENT_READ) == -1, ASYNC_E_BADFD);
    /* the failed modifies changed nothing: still READ only */
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
    CHECK(send(s[1], "z", 1, MSG_NOSIGNAL) == 1);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].event_type & ASYNC_EVENT_READ);
    CHECK(!(ev[0].event_type & ASYNC_EVENT_WRITE));
    CHECK_EQ(async_runtime_remove(rt, s[0]), 0);
    async_runtime_deinit(rt);
    close_pair(s);
    close_pair(other);
}

CASE(fd_remove) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int p[2];
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], "x", 1) == 1);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].context == NULL);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0); /* still readable, no longer watched */
    CHECK_FAIL(async_runtime_remove(rt, p[0]) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_remove(rt, p[1]) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_remove(rt, -1) == -1, ASYNC_E_BADFD);
    /* can be added again, with a new context */
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_b), 0);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].context == (void *)&ctx_b);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    /* the library did not close the fd */
    CHECK(fcntl(p[0], F_GETFD) != -1);
    async_runtime_deinit(rt);
    CHECK(fcntl(p[0], F_GETFD) != -1);
    close_pair(p);
}

CASE(fd_exists) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int p[2];
    CHECK(pipe(p) == 0);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_a), 0);
    CHECK_FAIL(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_a) == -1, ASYNC_E_EXISTS);
    CHECK_FAIL(async_runtime_add(rt, p[0], ASYNC_EVENT_WRITE, &ctx_b) == -1, ASYNC_E_EXISTS);
    /* the original registration is intact */
    CHECK(write(p[1], "x", 1) == 1);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].context == (void *)&ctx_a);
    CHECK(ev[0].event_type & ASYNC_EVENT_READ);
    /* the same fd in another runtime is independent */
    {
        async_runtime_t *rt2 = mkrt();
        CHECK_EQ(async_runtime_add(rt2, p[0], ASYNC_EVENT_READ, &ctx_b), 0);
        CHECK_EQ(wait_some(rt2, ev, 4, 5000), 1);
        CHECK(ev[0].context == (void *)&ctx_b);
        CHECK_EQ(async_runtime_remove(rt2, p[0]), 0);
        async_runtime_deinit(rt2);
    }
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    async_runtime_deinit(rt);
    close_pair(p);
}

CASE(fd_bad) // poll
{
    async_runtime_t *rt = mkrt();
    int p[2], closed;
    CHECK(pipe(p) == 0);
    closed = p[1];
    close(closed);
    CHECK_FAIL(async_runtime_add(rt, -1, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, -12345, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, closed, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, 1 << 20, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, p[0], 0x40, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(rt, p[0], ASYNC_EVENT_READ | 0x80000000u, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(rt, p[0], ASYNC_EVENT_COMPLETION, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(rt, p[0], ASYNC_EVENT_TIMER, NULL) == -1, ASYNC_E_INVAL);
    /* none of these registered anything */
    CHECK_FAIL(async_runtime_remove(rt, p[0]) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_remove(rt, closed) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_modify(rt, closed, ASYNC_EVENT_READ) == -1, ASYNC_E_BADFD);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0);
    /* registered, then closed without remove: remove says BADFD */
    close(p[0]);
    CHECK_FAIL(async_runtime_remove(rt, p[0]) == -1, ASYNC_E_BADFD);
    async_runtime_deinit(rt);
}

CASE(fd_regular_file) // poll
{
    /* a regular file is not pollable with epoll */
    async_runtime_t *rt = mkrt();
    char path[] = "/tmp/libasync-ctest-XXXXXX";
    int fd = mkstemp(path), rc;
    CHECK(fd >= 0);
    unlink(path);
    async_clear_error();
    rc = async_runtime_add(rt, fd, ASYNC_EVENT_READ, NULL);
    if (!backend_is_poll()) {
        CHECK_EQ(rc, -1);
        CHECK_ERR(ASYNC_E_BADFD);
    } else if (rc == 0) { /* poll() accepts regular files: always ready */
        io_event_t ev[2];
        CHECK_EQ(wait_some(rt, ev, 2, 5000), 1);
        CHECK_EQ(ev[0].fd, fd);
        CHECK_EQ(async_runtime_remove(rt, fd), 0);
    } else {
        CHECK_ERR(ASYNC_E_BADFD);
    }
    close(fd);
    async_runtime_deinit(rt);
}

CASE(fd_events_zero) // poll
{
    /* events 0 watches nothing but ERROR/CLOSE; ERROR and CLOSE may be passed */
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int p[2], s[2];
    CHECK(pipe(p) == 0);
    CHECK_EQ(async_runtime_add(rt, p[0], 0, &ctx_a), 0);
    CHECK(write(p[1], "x", 1) == 1);
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0); /* readable, but READ not asked for */
    close(p[1]);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].fd, p[0]);
    CHECK(ev[0].event_type & ASYNC_EVENT_CLOSE);
    CHECK(!(ev[0].event_type & ASYNC_EVENT_READ));
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    close(p[0]);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0);
    CHECK_EQ(async_runtime_add(rt, s[0], ASYNC_EVENT_READ | ASYNC_EVENT_ERROR | ASYNC_EVENT_CLOSE, &ctx_b), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0); /* same as READ alone: nothing yet */
    CHECK_EQ(async_runtime_modify(rt, s[0], ASYNC_EVENT_ERROR | ASYNC_EVENT_CLOSE), 0);
    CHECK(send(s[1], "y", 1, MSG_NOSIGNAL) == 1);
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0);
    CHECK_EQ(async_runtime_modify(rt, s[0], ASYNC_EVENT_READ), 0);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].event_type & ASYNC_EVENT_READ);
    CHECK(ev[0].context == (void *)&ctx_b);
    CHECK_EQ(async_runtime_remove(rt, s[0]), 0);
    close_pair(s);
    async_runtime_deinit(rt);
}

/* Collects events for `ms`; checks they all belong to fd. Returns the OR of
 * the bits seen with context `ctx` and stores the OR for other contexts.
 * At least one wait runs, however late this thread gets the CPU: what was
 * ready before the call is always seen. */
static uint32_t collect(async_runtime_t *rt, int fd, void *ctx, uint32_t *other_bits, int ms)
{
    io_event_t ev[8];
    uint32_t bits = 0;
    double t0 = now_ms();
    *other_bits = 0;
    do {
        int n = wait_ok(rt, ev, 8, 20), i;
        for (i = 0; i < n; i++) {
            CHECK_EQ(ev[i].fd, fd);
            if (ev[i].context == ctx)
                bits |= ev[i].event_type;
            else
                *other_bits |= ev[i].event_type;
        }
    } while (now_ms() - t0 < ms);
    return bits;
}

/* Puts the read end of a new pipe at descriptor number `num`. */
static void pipe_at(int num, int *wr)
{
    int p[2];
    CHECK(pipe(p) == 0);
    if (p[0] != num) {
        CHECK(dup2(p[0], num) == num);
        close(p[0]);
    }
    *wr = p[1];
}

CASE(fd_closed_reuse) // poll
{
    /* a registered fd closed without remove: its number can be added again */
    async_runtime_t *rt = mkrt();
    uint32_t bits, old;
    int p[2], num, wr, round;
    for (round = 0; round < 2; round++) {
        CHECK(pipe(p) == 0);
        num = p[0];
        CHECK_EQ(async_runtime_add(rt, num, ASYNC_EVENT_READ, &ctx_a), 0);
        close_pair(p);
        if (round == 1) {
            /* let a wait notice the close first: epoll says nothing, poll
             * reports ERROR|CLOSE once */
            bits = collect(rt, num, &ctx_a, &old, 100);
            CHECK_EQ(old, 0);
            CHECK(bits == 0 || (bits & (ASYNC_EVENT_ERROR | ASYNC_EVENT_CLOSE)));
            if (!backend_is_poll())
                CHECK_EQ(bits, 0);
            CHECK_EQ(collect(rt, num, &ctx_a, &old, 100), 0); /* once */
        }
        pipe_at(num, &wr);
        CHECK_EQ(async_runtime_add(rt, num, ASYNC_EVENT_READ, &ctx_b), 0);
        CHECK_EQ(collect(rt, num, &ctx_b, &old, 100), 0); /* the new pipe is empty */
        CHECK(write(wr, "n", 1) == 1);
        bits = collect(rt, num, &ctx_b, &old, 200);
        CHECK(bits & ASYNC_EVENT_READ);
        /* a stale report for the old registration may only say ERROR|CLOSE */
        CHECK(!(old & (ASYNC_EVENT_READ | ASYNC_EVENT_WRITE)));
        CHECK_EQ(async_runtime_remove(rt, num), 0);
        close(num);
        close(wr);
    }
    async_runtime_deinit(rt);
}

/* --- half_close ------------------------------------------------------------ */

static uint32_t one_event(async_runtime_t *rt, int fd, void *ctx)
{
    io_event_t ev[4];
    double t0 = now_ms();
    for (;;) {
        int n = async_runtime_wait(rt, ev, 4, 100);
        CHECK(n >= 0);
        if (n > 0) {
            CHECK_EQ(n, 1);
            CHECK_EQ(ev[0].fd, fd);
            CHECK(ev[0].context == ctx);
            return ev[0].event_type;
        }
        CHECK(now_ms() - t0 < 5000);
    }
}

CASE(half_close) // poll
{
    async_runtime_t *rt = mkrt();
    int s[2], t[2];
    char buf[16];
    uint32_t bits;
    /* READ only: the last command before the peer's SHUT_WR is READ, and
     * after it is read the EOF is READ too (read returns 0) */
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0);
    CHECK_EQ(async_runtime_add(rt, s[0], ASYNC_EVENT_READ, &ctx_a), 0);
    CHECK(send(s[1], "quit\n", 5, MSG_NOSIGNAL) == 5);
    CHECK_EQ(shutdown(s[1], SHUT_WR), 0);
    bits = one_event(rt, s[0], &ctx_a);
    CHECK_EQ(bits, ASYNC_EVENT_READ);
    CHECK_EQ(read(s[0], buf, sizeof buf), 5);
    bits = one_event(rt, s[0], &ctx_a);
    CHECK_EQ(bits, ASYNC_EVENT_READ);
    CHECK_EQ(read(s[0], buf, sizeof buf), 0);
    /* the same registration asking for CLOSE gets READ|CLOSE */
    CHECK_EQ(async_runtime_modify(rt, s[0], ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE), 0);
    bits = one_event(rt, s[0], &ctx_a);
    CHECK_EQ(bits, ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE);
    /* CLOSE alone: the read-side hang-up, no READ */
    CHECK_EQ(async_runtime_modify(rt, s[0], ASYNC_EVENT_CLOSE), 0);
    bits = one_event(rt, s[0], &ctx_a);
    CHECK_EQ(bits, ASYNC_EVENT_CLOSE);
    /* the hang-up of both sides is CLOSE whatever was asked */
    CHECK_EQ(async_runtime_modify(rt, s[0], ASYNC_EVENT_READ), 0);
    close(s[1]);
    bits = one_event(rt, s[0], &ctx_a);
    CHECK(bits & ASYNC_EVENT_CLOSE);
    CHECK_EQ(async_runtime_remove(rt, s[0]), 0);
    close(s[0]);
    /* WRITE only: the peer's SHUT_WR is not an event at all (no spurious
     * wakeups with nothing to report) */
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, t) == 0);
    CHECK_EQ(async_runtime_add(rt, t[0], 0, &ctx_b), 0);
    CHECK_EQ(shutdown(t[1], SHUT_WR), 0);
    {
        io_event_t ev[4];
        CHECK_EQ(async_runtime_wait(rt, ev, 4, 100), 0);
    }
    CHECK_EQ(async_runtime_modify(rt, t[0], ASYNC_EVENT_WRITE), 0);
    bits = one_event(rt, t[0], &ctx_b);
    CHECK_EQ(bits, ASYNC_EVENT_WRITE);
    CHECK_EQ(async_runtime_remove(rt, t[0]), 0);
    close_pair(t);
    async_runtime_deinit(rt);
}

/* --- fdmap_context ---------------------------------------------------------- */

/* The C wait translates the records of live registrations itself (the fd map
 * of cabi/internal/rt/fdmap.c, kept by Go): once add, modify or remove has
 * returned, a wait must report the new context and events, never the old
 * registration's, and nothing for a removed fd. */
CASE(fdmap_context) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    int p[2];
    io_event_t ev[8];
    CHECK(rt != NULL);
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(write(p[1], "x", 1), 1); /* p[0] stays readable, p[1] writable */
    for (uintptr_t i = 1; i <= 2000; i++) {
        CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, (void *)i), 0);
        int n = async_runtime_wait(rt, ev, 8, 1000);
        CHECK_EQ(n, 1);
        CHECK_EQ(ev[0].fd, p[0]);
        CHECK(ev[0].context == (void *)i);
        CHECK(ev[0].event_type == ASYNC_EVENT_READ);
        if (i % 2) {
            /* asked for WRITE only on a read end: no event at all */
            CHECK_EQ(async_runtime_modify(rt, p[0], ASYNC_EVENT_WRITE), 0);
            CHECK_EQ(async_runtime_wait(rt, ev, 8, 0), 0);
        }
        CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
        CHECK_EQ(async_runtime_wait(rt, ev, 8, 0), 0);
        /* the write end under the next context */
        CHECK_EQ(async_runtime_add(rt, p[1], ASYNC_EVENT_WRITE, (void *)(i + 100000)), 0);
        n = async_runtime_wait(rt, ev, 8, 1000);
        CHECK_EQ(n, 1);
        CHECK(ev[0].fd == p[1] && ev[0].context == (void *)(i + 100000));
        CHECK(ev[0].event_type == ASYNC_EVENT_WRITE);
        CHECK_EQ(async_runtime_remove(rt, p[1]), 0);
    }
    close_pair(p);
    async_runtime_deinit(rt);
}

/* --- wait_zero_ready -------------------------------------------------------- */

/* A wait with timeout 0 reports a ready fd every time, also the first wait
 * of a new runtime: the fd poll may be skipped while other events are ready,
 * never when the wait would then return nothing (the poll backend returned 0
 * in ~9 of 10 back-to-back waits, and both backends on the first one). */
CASE(wait_zero_ready) // poll adversarial
{
    for (int round = 0; round < 20; round++) {
        async_runtime_t *rt = async_runtime_init();
        int p[2];
        io_event_t ev[4];
        CHECK(rt != NULL);
        CHECK_EQ(pipe(p), 0);
        CHECK_EQ(write(p[1], "x", 1), 1);
        CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, (void *)7), 0);
        for (int i = 0; i < 100; i++) {
            int n = async_runtime_wait(rt, ev, 1 + i % 4, 0);
            if (n != 1)
                fprintf(stderr, "round %d, wait %d: %d events\n", round, i, n);
            CHECK_EQ(n, 1);
            CHECK(ev[0].context == (void *)7 && (ev[0].event_type & ASYNC_EVENT_READ));
        }
        close_pair(p);
        async_runtime_deinit(rt);
    }
}

/* --- fd_rotation ------------------------------------------------------------ */

#define ROT_FDS 5
static async_runtime_t *rot_rt;
static atomic_int rot_stop;

static void *rot_flooder(void *arg)
{
    (void)arg;
    while (!atomic_load(&rot_stop)) {
        for (int i = 0; i < 256; i++)
            if (async_runtime_post_completion(rot_rt, 1, (uintptr_t)i) != 0)
                break;
        sleep_ms(1);
    }
    return NULL;
}

/* k always-ready fds (unread data in pipes), waits with max_events = max:
 * within every run of 2k fd events (2k waits without a flood) each of the k
 * fds has been reported. */
static void rotation(int k, int max, int flood)
{
    int p[ROT_FDS][2];
    long last[ROT_FDS];
    io_event_t ev[ROT_FDS];
    long fdev = 0;
    pthread_t t;
    CHECK(k <= ROT_FDS && max <= ROT_FDS);
    rot_rt = async_runtime_init();
    CHECK(rot_rt != NULL);
    for (int i = 0; i < k; i++) {
        CHECK(pipe(p[i]) == 0);
        CHECK(write(p[i][1], "x", 1) == 1);
        CHECK_EQ(async_runtime_add(rot_rt, p[i][0], ASYNC_EVENT_READ, (void *)(intptr_t)(i + 1)), 0);
        last[i] = 0;
    }
    atomic_store(&rot_stop, 0);
    if (flood)
        start_thread(&t, rot_flooder, NULL);
    /* bounded: without a flood every wait reports fds; with one, a poll
     * happens at least every 9th wait */
    for (long w = 0; w < 200000 && fdev < 40L * k; w++) {
        int n = async_runtime_wait(rot_rt, ev, max, 1000);
        CHECK(n >= 0);
        CHECK(flood || n > 0);
        for (int j = 0; j < n; j++) {
            if (ev[j].event_type == ASYNC_EVENT_COMPLETION)
                continue;
            int i = (int)(intptr_t)ev[j].context - 1;
            CHECK(i >= 0 && i < k);
            fdev++;
            last[i] = fdev;
        }
        for (int i = 0; i < k; i++) {
            if (fdev - last[i] > 2L * k) {
                fprintf(stderr, "k=%d max=%d flood=%d: fd %d not reported in the last %ld fd events\n", k, max,
                        flood, i, fdev - last[i]);
                CHECK(!"a ready fd starves");
            }
        }
    }
    CHECK(fdev >= 40L * k);
    atomic_store(&rot_stop, 1);
    if (flood)
        join_within(t, 10000, "flooder");
    for (int i = 0; i < k; i++) {
        CHECK_EQ(async_runtime_remove(rot_rt, p[i][0]), 0);
        close_pair(p[i]);
    }
    async_runtime_deinit(rot_rt);
}

CASE(fd_rotation) // poll adversarial
{
    rotation(3, 1, 0);
    rotation(5, 2, 0);
    rotation(5, 1, 0);
    rotation(2, 1, 0);
}

CASE(fd_rotation_flood) // poll timeout=120 adversarial
{
    rotation(3, 1, 1);
    rotation(5, 2, 1);
}

/* --- turns while other fds come and go ----------------------------------- */

#define CHURN_LIVE 8 /* other fds the churner keeps registered at most */
#define TURN_FDS 300

static atomic_int churn_stop;
static int churn_tag; /* the churner's context */

/* Keeps adding, modifying and removing other fds (pipes, every other one
 * readable): a ring of CHURN_LIVE registrations, the oldest replaced. */
static void *turns_churner(void *arg)
{
    async_runtime_t *rt = arg;
    int ring[CHURN_LIVE][2];
    int live = 0, next = 0;
    for (unsigned long it = 0; !atomic_load(&churn_stop); it++) {
        if (live == CHURN_LIVE) {
            CHECK_EQ(async_runtime_remove(rt, ring[next][0]), 0);
            close_pair(ring[next]);
            live--;
        }
        CHECK(pipe(ring[next]) == 0);
        if (it & 1)
            CHECK(write(ring[next][1], "x", 1) == 1);
        CHECK_EQ(async_runtime_add(rt, ring[next][0], ASYNC_EVENT_READ, &churn_tag), 0);
        CHECK_EQ(async_runtime_modify(rt, ring[next][0], ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE), 0);
        live++;
        next = (next + 1) % CHURN_LIVE;
    }
    for (int i = 0; i < live; i++) {
        int j = (next - live + i + CHURN_LIVE) % CHURN_LIVE;
        CHECK_EQ(async_runtime_remove(rt, ring[j][0]), 0);
        close_pair(ring[j]);
    }
    return NULL;
}

/* k always-ready fds, waits with max_events = max while the churner runs:
 * each of the k is reported in every run of ceil(R / M) + 1 consecutive
 * waits (R = k + CHURN_LIVE ready at most, M = max capped at 256). */
static void turns_under_churn(int k, int max, int waits)
{
    static int p[TURN_FDS][2];
    static long last[TURN_FDS];
    io_event_t *ev = calloc((size_t)max, sizeof *ev);
    CHECK(ev != NULL && k <= TURN_FDS);
    async_runtime_t *rt = mkrt();
    for (int i = 0; i < k; i++) {
        CHECK(pipe(p[i]) == 0);
        CHECK(write(p[i][1], "x", 1) == 1);
        CHECK_EQ(async_runtime_add(rt, p[i][0], ASYNC_EVENT_READ, (void *)(intptr_t)(i + 1)), 0);
        last[i] = -1;
    }
    int m = max < 256 ? max : 256;
    long bound = (k + CHURN_LIVE + m - 1) / m + 1;
    pthread_t t;
    atomic_store(&churn_stop, 0);
    start_thread(&t, turns_churner, rt);
    for (long w = 0; w < waits; w++) {
        int n = async_runtime_wait(rt, ev, max, 1000);
        CHECK(n > 0);
        for (int j = 0; j < n; j++) {
            if (ev[j].context == &churn_tag)
                continue;
            int i = (int)(intptr_t)ev[j].context - 1;
            CHECK(ev[j].event_type == ASYNC_EVENT_READ && i >= 0 && i < k && ev[j].fd == p[i][0]);
            last[i] = w;
        }
        for (int i = 0; i < k; i++) {
            if (w - last[i] >= bound) {
                fprintf(stderr, "k=%d max=%d: fd %d not reported in waits %ld..%ld (bound %ld)\n", k, max, i,
                        last[i] + 1, w, bound);
                CHECK(!"a ready fd missed its turn");
            }
        }
    }
    atomic_store(&churn_stop, 1);
    join_within(t, 10000, "churner");
    for (int i = 0; i < k; i++) {
        CHECK_EQ(async_runtime_remove(rt, p[i][0]), 0);
        close_pair(p[i]);
    }
    async_runtime_deinit(rt);
    free(ev);
}

CASE(fd_turns_under_churn) // poll timeout=120 stress
{
#if !defined(__linux__)
    if (!backend_is_poll())
        return; /* kqueue, IOCP: the kernel's order */
#endif
    int nofile = raise_nofile(2 * TURN_FDS + 4 * CHURN_LIVE + 128);
    int k = (nofile - 4 * CHURN_LIVE - 128) / 2;
    k = k < TURN_FDS ? k : TURN_FDS;
    CHECK(k >= 40);
    turns_under_churn(k, 16, 4000);
    turns_under_churn(k, 1000, 200);
    turns_under_churn(40, 3, 2000);
    turns_under_churn(k, 1, 2 * k + 100);
}

TEST_MAIN()
