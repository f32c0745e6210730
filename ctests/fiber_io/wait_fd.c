/* Readiness and parking rules of the fiber I/O calls: one waiter per fd and
 * direction (a second gets ASYNC_E_BUSY; wait_fd for READ|WRITE that can
 * write at once does not wait), hang-up on a file whose number is then
 * reused, shutdown(2) ending a parked read, two schedulers parked on one fd,
 * urgent data only (readiness the read cannot clear), and hang-ups reported
 * as the runtime reports them (a half-close is READ, not CLOSE). Every wait
 * is bounded. */
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "check.h"
#include "net.h"

/* ---- HUP on a file, then its number reused by a new socket ---------- */

typedef struct {
    async_sched_t *s;
    steps_t st;     /* how far the reader got; the error that stopped it */
    atomic_int num, peer; /* the reused number, and the new socket's peer */
} hup_t;

/* Writes to the new socket once the counter fiber has advanced by 5 (so
 * it ran while the reader was parked on the reused number). */
static void hup_writer(void *arg) {
    hup_t *x = arg;
    long c0 = atomic_load(&x->st.cnt.count);
    for (int i = 0; i < 20000 && atomic_load(&x->st.cnt.count) < c0 + 5; i++) async_fiber_sleep(1);
    if (write(x->peer, "new", 3) != 3) x->st.err = -1;
}

static void hup_reader(void *arg) {
    hup_t *x = arg;
    char buf[64];
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) goto end;
    x->num = sp[0];
    x->peer = sp[1];
    /* 1: parked in a read when the peer hangs up (main thread closes it):
     * the read sees EOF */
    ssize_t n = async_fiber_read(sp[0], buf, sizeof buf, 10000);
    if (n != 0) goto end;
    x->st.step = 1;
    /* 2: close it; a new socket takes the number */
    close(sp[0]);
    int np[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, np) != 0) goto end;
    if (np[0] != x->num) {
        if (dup2(np[0], x->num) != x->num) goto end;
        close(np[0]);
    }
    x->peer = np[1];
    /* 3: nothing to read there: the read times out */
    async_clear_error();
    if (async_fiber_read(x->num, buf, sizeof buf, 50) != -1 || async_last_error() != ASYNC_E_TIMEDOUT) goto end;
    x->st.step = 3;
    /* 4: so does a wait for readability */
    async_clear_error();
    if (async_fiber_wait_fd(x->num, ASYNC_EVENT_READ, 50) != -1 || async_last_error() != ASYNC_E_TIMEDOUT)
        goto end;
    x->st.step = 4;
    /* 5: a long read parks and lets the worker run the other fibers; the
     * writer fiber's data ends it */
    if (!async_fiber_spawn(x->s, hup_writer, x, 0)) goto end;
    n = async_fiber_read(x->num, buf, sizeof buf, 20000);
    if (n != 3 || memcmp(buf, "new", 3) != 0) goto end;
    x->st.step = 5;
end:
    steps_end(&x->st);
}

CASE(hangup_number_reused) { // uring
    async_sched_t *s = sched_new(1); /* one worker: a spinning fiber starves the others */
    static hup_t x;
    x.s = s;
    x.num = x.peer = -1;
    CHECK(async_fiber_spawn(s, counter_fiber, &x.st.cnt, 0));
    CHECK(async_fiber_spawn(s, hup_reader, &x, 0));
    sched_wait_parked(s, 2); /* the reader is parked in its first read */
    CHECK_EQ(close(x.peer), 0);
    steps_wait(&x.st, 5, 20000, "hangup_number_reused");
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    close(x.num);
    close(x.peer);
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

/* While fiber A waits to read an idle but writable socket, fiber B's
 * wait_fd(READ|WRITE) returns WRITE at once rather than ASYNC_E_BUSY (B does
 * not wait; the header says so). B's wait for READ alone gets
 * ASYNC_E_BUSY. */
CASE(wait_fd_busy) { // uring adversarial
    static busy_t b;
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    b.fd = sv[0];
    async_sched_t *s = sched_new(1);
    spawn_until_parked(s, busy_a, &b, 1);
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
    close_pair(sv);
}

/* ---- shutdown(2) from another thread ends a parked read (both paths) --------------------------- */

static atomic_int shr_r = -2;

static int shr_fd;

static void shr_reader(void *arg) {
    (void)arg;
    char b[8];
    ssize_t r = async_fiber_read(shr_fd, b, sizeof b, 20000);
    atomic_store(&shr_r, r < 0 ? -1000 - async_last_error() : (int)r);
}

CASE(shutdown_rd_ends_parked_read) { // uring adversarial
    async_sched_t *s = sched_new(2);
    for (int how = 0; how < 2; how++) {
        int sp[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
        shr_fd = sp[0];
        atomic_store(&shr_r, -2);
        async_fiber_t *f = async_fiber_spawn(s, shr_reader, NULL, ASYNC_FIBER_JOINABLE);
        CHECK(f != NULL);
        sched_wait_parked(s, 1);
        if (how == 0)
            CHECK_EQ(shutdown(sp[0], SHUT_RD), 0);
        else
            CHECK_EQ(shutdown(sp[1], SHUT_WR), 0); /* the peer half-closes */
        CHECK_EQ(async_fiber_join(f, 10000), 0);
        CHECK_EQ(atomic_load(&shr_r), 0);
        close_pair(sp);
    }
    async_sched_destroy(s);
}

/* ---- two schedulers parked on one plain fd in the same direction ------------------------------- */

static atomic_int two_woke;

static int two_fd;

static void two_waiter(void *arg) {
    (void)arg;
    if (async_fiber_wait_fd(two_fd, ASYNC_EVENT_READ, 10000) > 0) atomic_fetch_add(&two_woke, 1);
}

CASE(two_scheds_one_fd) { // uring adversarial
    async_sched_t *a = sched_new(1), *b = sched_new(1);
    int sp[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    two_fd = sp[0];
    CHECK(async_fiber_spawn(a, two_waiter, NULL, 0) != NULL);
    CHECK(async_fiber_spawn(b, two_waiter, NULL, 0) != NULL);
    sched_wait_parked(a, 1);
    sched_wait_parked(b, 1);
    CHECK_EQ(write(sp[1], "z", 1), 1);
    CHECK_EQ(async_sched_run(a), 0);
    CHECK_EQ(async_sched_run(b), 0);
    CHECK_EQ(atomic_load(&two_woke), 2);
    async_sched_destroy(a);
    async_sched_destroy(b);
    close_pair(sp);
}

/* ---- urgent (out-of-band) data only: readiness the read cannot clear ---------------------------------- */

static void oob_body(void *arg) {
    (void)arg;
    struct sockaddr_in sa;
    int l = loopback_listener(16, &sa);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK_EQ(async_fiber_connect(c, (struct sockaddr *)&sa, sizeof sa, 2000), 0);
    int a = async_fiber_accept(l, NULL, NULL, 2000);
    CHECK(a >= 0);
    CHECK_EQ(send(c, "!", 1, MSG_OOB), 1);
    sleep_ms(20);
    char b[8];
    double t0 = now_ms();
    async_clear_error();
    ssize_t r = async_fiber_read(a, b, sizeof b, 200);
    int e = async_last_error();
    printf("read with only OOB data -> %zd err %d after %.0f ms\n", r, e, now_ms() - t0);
    CHECK(r >= 0 || e == ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 < 5000);
    CHECK_EQ(send(c, "n", 1, 0), 1);
    r = async_fiber_read(a, b, sizeof b, 2000);
    CHECK(r >= 1);
    close(a);
    close(c);
    close(l);
}

CASE(urgent_data_only) { // uring adversarial
    on_fiber_then_thread(oob_body);
}

/* ---- hang-ups, as the event loop reports them ------------------------------- */

/* The runtime the hang-up cases compare with (made on the main thread). */
static async_runtime_t *hup_rt;

/* What a registration of fd for events on hup_rt reports now (fd readiness
 * is level-triggered: the condition is there already); 0: nothing within
 * BOUND_MS. */
static uint32_t rt_reports(int fd, uint32_t events) {
    CHECK_EQ(async_runtime_add(hup_rt, fd, events, NULL), 0);
    uint32_t got = 0;
    io_event_t evs[4];
    for (double t0 = now_ms(); !got && now_ms() - t0 < BOUND_MS;) {
        int n = async_runtime_wait(hup_rt, evs, 4, 0);
        CHECK(n >= 0);
        for (int i = 0; i < n; i++)
            if (evs[i].fd == fd) got |= evs[i].event_type;
        if (!got) sleep_ms(1);
    }
    CHECK_EQ(async_runtime_remove(hup_rt, fd), 0);
    return got;
}

/* async_fiber_wait_fd(fd, events), which must report something, and must
 * report what the runtime does for the same events. */
static int wait_as_rt(int fd, uint32_t events) {
    int ev = async_fiber_wait_fd(fd, events, BOUND_MS);
    CHECK(ev > 0);
    CHECK_EQ((uint32_t)ev, rt_reports(fd, events));
    return ev;
}

/* On a unix stream pair and over TCP: the peer's shutdown(SHUT_WR) is READ
 * for a READ wait (no CLOSE: the byte before it is still there, then the
 * read returns 0) and WRITE for a WRITE wait, as for a runtime registration
 * without ASYNC_EVENT_CLOSE (one with it hears CLOSE; a fiber wait cannot ask
 * for it). The hang-up of both sides (the unix peer's close; over TCP the
 * peer's close is a half-close until this side shuts its writing too) is
 * CLOSE for either wait, as the runtime reports it. */
static void half_close_body(void *arg) {
    (void)arg;
    for (int kind = 0; kind < 2; kind++) {
        int sv[2];
        char c;
        make_pair(kind, sv);
        int a = sv[0], b = sv[1];
        CHECK_EQ(write(b, "x", 1), 1);
        CHECK_EQ(shutdown(b, SHUT_WR), 0);
        CHECK_EQ(async_fiber_wait_fd(a, ASYNC_EVENT_READ, BOUND_MS), (int)ASYNC_EVENT_READ);
        CHECK_EQ(async_fiber_read(a, &c, 1, BOUND_MS), 1);
        /* only the half-close makes it readable now */
        CHECK_EQ(wait_as_rt(a, ASYNC_EVENT_READ), (int)ASYNC_EVENT_READ);
        CHECK_EQ(wait_as_rt(a, ASYNC_EVENT_WRITE), (int)ASYNC_EVENT_WRITE);
        CHECK_EQ(wait_as_rt(a, ASYNC_EVENT_READ | ASYNC_EVENT_WRITE), (int)(ASYNC_EVENT_READ | ASYNC_EVENT_WRITE));
        CHECK_EQ(rt_reports(a, ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE), ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE);
        CHECK_EQ(rt_reports(a, ASYNC_EVENT_CLOSE), ASYNC_EVENT_CLOSE);
        CHECK_FAIL(async_fiber_wait_fd(a, ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE, 0) == -1, ASYNC_E_INVAL);
        CHECK_EQ(async_fiber_read(a, &c, 1, BOUND_MS), 0);
        CHECK_EQ(wait_as_rt(a, ASYNC_EVENT_READ), (int)ASYNC_EVENT_READ); /* end of file stays readable */
        close(b);
        if (kind == 1) {
            CHECK_EQ(wait_as_rt(a, ASYNC_EVENT_READ), (int)ASYNC_EVENT_READ); /* FIN again: still half */
            CHECK_EQ(shutdown(a, SHUT_WR), 0);
        }
        CHECK_EQ(wait_as_rt(a, ASYNC_EVENT_READ) & (int)(ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE),
                 (int)(ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE));
        CHECK(wait_as_rt(a, ASYNC_EVENT_WRITE) & ASYNC_EVENT_CLOSE);
        CHECK_EQ(async_fiber_read(a, &c, 1, BOUND_MS), 0);
        close(a);
    }
}

CASE(half_close_is_read) { // uring poll
    hup_rt = mkrt();
    on_fiber_then_thread(half_close_body);
    async_runtime_deinit(hup_rt);
}

typedef struct {
    int rfd, wfd;       /* waits for READ on rfd, for WRITE on wfd (send buffer full) */
    atomic_int parked;  /* set just before the waits */
    int rev, wev, werr; /* what they returned */
} hup_wait_t;

static void hup_waits(hup_wait_t *x) {
    atomic_store(&x->parked, 1);
    x->rev = async_fiber_wait_fd(x->rfd, ASYNC_EVENT_READ, BOUND_MS);
    async_clear_error();
    x->wev = async_fiber_wait_fd(x->wfd, ASYNC_EVENT_WRITE, 300);
    x->werr = async_last_error();
}

static void hup_waits_fiber(void *arg) { hup_waits(arg); }
static void *hup_waits_thread(void *arg) {
    hup_waits(arg);
    return NULL;
}

/* A wait parked (a fiber) or blocked (a plain thread) on a unix stream socket
 * when its peer shuts its writing side: a READ wait wakes with READ alone,
 * and a WRITE wait on the socket whose send buffer is full is not woken (the
 * peer can still read; it times out). */
CASE(half_close_wakes_read_wait) { // uring
    for (int on_thread = 0; on_thread < 2; on_thread++) {
        int sv[2], wv[2];
        make_pair(0, sv);
        make_pair(0, wv);
        CHECK_EQ(fcntl(wv[0], F_SETFL, O_NONBLOCK), 0);
        char fill[4096] = {0};
        while (write(wv[0], fill, sizeof fill) > 0) {
        }
        CHECK_EQ(shutdown(wv[1], SHUT_WR), 0);
        static hup_wait_t x;
        memset(&x, 0, sizeof x);
        x.rfd = sv[0];
        x.wfd = wv[0];
        async_sched_t *s = NULL;
        pthread_t t;
        if (on_thread) {
            start_thread(&t, hup_waits_thread, &x);
            wait_count(&x.parked, 1, "the waiting thread");
            sleep_ms(50); /* in its poll(2) */
        } else {
            s = sched_new(1);
            spawn_until_parked(s, hup_waits_fiber, &x, 1);
        }
        CHECK_EQ(shutdown(sv[1], SHUT_WR), 0);
        if (on_thread) {
            join_within(t, BOUND_MS, "the waiting thread");
        } else {
            CHECK_EQ(async_sched_run(s), 0);
            async_sched_destroy(s);
        }
        CHECK_EQ(x.rev, (int)ASYNC_EVENT_READ);
        CHECK_EQ(x.wev, -1);
        CHECK_EQ(x.werr, ASYNC_E_TIMEDOUT);
        close(sv[0]);
        close(sv[1]);
        close(wv[0]);
        close(wv[1]);
    }
}

/* ---- one reader per fd: a second read of it gets ASYNC_E_BUSY ---------------- */

static void busy_first(void *arg) {
    io_probe_t *m = arg;
    char b[8];
    atomic_store(&m->step, 1);
    m->r1 = async_fiber_read(m->fd, b, sizeof b, 10000);
    m->e1 = async_last_error();
    atomic_fetch_add(&m->step, 10);
}

static void busy_second(void *arg) {
    io_probe_t *m = arg;
    char b[8];
    m->r2 = async_fiber_read(m->fd, b, sizeof b, 10000);
    m->e2 = async_last_error();
    atomic_fetch_add(&m->step, 100);
}

CASE(second_reader_busy) { // linux uring
    async_sched_t *s = sched_new(1);
    io_probe_t m;
    probe_spawn(s, busy_first, &m);
    wait_count_within(&m.step, 1, 30000, "first reader");
    sched_wait_parked(s, 1);
    CHECK(async_fiber_spawn(s, busy_second, &m, 0) != NULL);
    wait_count_within(&m.step, 101, 30000, "second reader");
    CHECK_EQ(m.r2, -1);
    CHECK_EQ(m.e2, ASYNC_E_BUSY);
    CHECK_EQ(write(m.fd2, "abc", 3), 3);
    wait_count_within(&m.step, 111, 30000, "first reader's data");
    CHECK_EQ(m.r1, 3);
    async_sched_destroy(s);
    close(m.fd);
    close(m.fd2);
}

TEST_MAIN()
