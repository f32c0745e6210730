/* Readiness and parking rules of the fiber I/O calls: one waiter per fd and
 * direction (a second gets ASYNC_E_BUSY; wait_fd for READ|WRITE that can
 * write at once does not wait), hang-up on a file whose number is then
 * reused, shutdown(2) ending a parked read, two schedulers parked on one fd,
 * and urgent data only (readiness the read cannot clear). Every wait is
 * bounded. */
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "check.h"
#include "net.h"

/* ---- HUP on a file, then its number reused by a new socket ---------- */

typedef struct {
    async_sched_t *s;
    steps_t st;     /* how far the reader got; the error that stopped it */
    int num, peer;  /* the reused number, and the new socket's peer */
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
