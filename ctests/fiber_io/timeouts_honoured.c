/* A fiber fd call's timeout bounds the call's whole waiting, on both I/O
 * paths, on owned and plain fds and on plain threads: never early, never
 * ignored, whatever the fd does meanwhile (a reader that takes a few bytes
 * per millisecond, so one call wakes many times; a hang-up or error its read
 * does not clear; its number closed and reused). A fiber's deadline or a
 * scope's cancel that comes earlier wins. Every wait is bounded. */
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "check.h"
#include "net.h"

/* How late a timeout may end on a loaded machine. */
#define LATE_MS 3000

/* Checks that a call begun at t0 with timeout ms ended neither early nor
 * hugely late. */
#define CHECK_ENDED_AFTER(t0, ms)                                                                              \
    do {                                                                                                       \
        double el_ = now_ms() - (t0);                                                                          \
        if (el_ < (ms) - 0.5 || el_ > (ms) + LATE_MS)                                                          \
            fprintf(stderr, "ended after %.2f ms, timeout %d ms\n", el_, (int)(ms));                           \
        CHECK(el_ >= (ms) - 0.5 && el_ <= (ms) + LATE_MS);                                                     \
    } while (0)

/* Makes fd owned by the calling fiber's scheduler when owned. */
static void own(int fd, int owned)
{
    if (owned)
        CHECK_EQ(async_fiber_fd_open(NULL, fd), 0);
}

static void (*variant_fn)(int owned);

static void variant_fiber(void *arg) { variant_fn((int)(intptr_t)arg); }

/* Runs fn on a fiber with plain fds, on a fiber with owned fds, then on this
 * plain thread. */
static void on_fibers_and_thread(void (*fn)(int owned))
{
    variant_fn = fn;
    for (int owned = 0; owned < 2; owned++) {
        async_sched_t *s = sched_new(2);
        on_fiber(s, variant_fiber, (void *)(intptr_t)owned);
        async_sched_destroy(s);
    }
    fn(0);
}

/* Fills socket fd's send buffer with MSG_DONTWAIT: fd stays blocking, so
 * io_uring's send waits in the ring (an O_NONBLOCK socket's fails at once
 * and the poller path waits). On a unix stream socket nobody reads, the
 * buffer then stays full (TCP may free room later as acks come). */
static void fill(int fd)
{
    static char junk[65536];
    while (send(fd, junk, sizeof junk, MSG_DONTWAIT) > 0) {
    }
    while (send(fd, junk, 1, MSG_DONTWAIT) > 0) {
    }
}

/* ---- a slow reader: many wakes inside one write ---------------------------------- */

typedef struct {
    int fd;
    size_t chunk;
    atomic_int stop;
    atomic_long taken;
} slow_reader_t;

/* Takes chunk bytes a millisecond until told to stop. */
static void *slow_reader(void *arg)
{
    slow_reader_t *r = arg;
    char *b = malloc(r->chunk);
    CHECK(b != NULL);
    CHECK_EQ(fcntl(r->fd, F_SETFL, fcntl(r->fd, F_GETFL) | O_NONBLOCK), 0);
    while (!atomic_load(&r->stop)) {
        ssize_t n = read(r->fd, b, r->chunk);
        if (n > 0)
            atomic_fetch_add(&r->taken, n);
        sleep_ms(1);
    }
    free(b);
    return NULL;
}

#define BIG_WRITE ((size_t)64 << 20)

static void big_write_to_slow_reader(int owned)
{
    char *buf = calloc(1, BIG_WRITE);
    CHECK(buf != NULL);
    for (int kind = 0; kind < 3; kind++) {
        int p[2];
        if (kind == 2)
            CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
        else
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p), 0);
        /* kind 0 takes 1 byte a millisecond, 1 and 2 a page (the writer
         * finds room again and again) */
        slow_reader_t r = {.fd = kind == 2 ? p[0] : p[1], .chunk = kind == 0 ? 1 : 4096};
        int w = kind == 2 ? p[1] : p[0];
        own(w, owned);
        pthread_t th;
        start_thread(&th, slow_reader, &r);
        double t0 = now_ms();
        CHECK_EQ(async_fiber_write(w, buf, BIG_WRITE, 50), -1);
        CHECK_ERR(ASYNC_E_TIMEDOUT);
        CHECK_ENDED_AFTER(t0, 50);
        atomic_store(&r.stop, 1);
        join_within(th, LATE_MS, "the slow reader");
        close_as(w, owned);
        close(r.fd);
    }
    free(buf);
}

CASE(write_of_64mib_to_a_slow_reader_times_out_after_50ms) // uring adversarial timeout=120
{
    on_fibers_and_thread(big_write_to_slow_reader);
}

/* ---- a trickling writer: many wakes inside one read_full ------------------------ */

typedef struct {
    int fd;
    int total;
    atomic_int stop;
    atomic_int sent;
} trickler_t;

/* Writes bytes 0, 1, 2, ... (mod 251) one a millisecond, total at most. */
static void *trickler(void *arg)
{
    trickler_t *t = arg;
    for (int i = 0; i < t->total && !atomic_load(&t->stop); i++) {
        unsigned char c = (unsigned char)(i % 251);
        CHECK_EQ(write(t->fd, &c, 1), 1);
        atomic_fetch_add(&t->sent, 1);
        sleep_ms(1);
    }
    return NULL;
}

static void check_sequence(const unsigned char *b, size_t n, size_t from)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)((from + i) % 251)) {
            fprintf(stderr, "byte %zu is %u, expected %u\n", from + i, b[i], (unsigned)((from + i) % 251));
            CHECK(!"stream out of order");
        }
}

static void read_full_from_trickler(int owned)
{
    static unsigned char buf[1 << 20];
    int sv[2];
    make_pair(1, sv);
    own(sv[0], owned);
    trickler_t t = {.fd = sv[1], .total = 4000};
    pthread_t th;
    start_thread(&th, trickler, &t);
    size_t got = 0;
    double t0 = now_ms();
    CHECK_EQ(async_fiber_read_full(sv[0], buf, sizeof buf, &got, 60), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_ENDED_AFTER(t0, 60);
    check_sequence(buf, got, 0);
    atomic_store(&t.stop, 1);
    join_within(th, LATE_MS, "the trickler");
    /* the stream goes on right after the bytes read */
    size_t rest = (size_t)atomic_load(&t.sent) - got, got2 = 0;
    CHECK_EQ(async_fiber_read_full(sv[0], buf, rest, &got2, LATE_MS), (ssize_t)rest);
    check_sequence(buf, rest, got);
    close_as(sv[0], owned);
    close(sv[1]);
}

CASE(read_full_from_a_trickling_peer_times_out_losing_nothing) // uring adversarial
{
    on_fibers_and_thread(read_full_from_trickler);
}

static void read_until_from_trickler(int owned)
{
    int sv[2];
    make_pair(1, sv);
    own(sv[0], owned);
    async_reader_t *rd = async_reader_create(sv[0], 1 << 16);
    CHECK(rd != NULL);
    trickler_t t = {.fd = sv[1], .total = 4000};
    pthread_t th;
    start_thread(&th, trickler, &t);
    const char *out = NULL;
    double t0 = now_ms();
    /* the trickler's bytes are 0..250: delimiter 255 never comes from it */
    CHECK_EQ(async_reader_read_until(rd, 255, &out, 60), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_ENDED_AFTER(t0, 60);
    atomic_store(&t.stop, 1);
    join_within(th, LATE_MS, "the trickler");
    unsigned char end = 255;
    CHECK_EQ(write(sv[1], &end, 1), 1);
    ssize_t n = async_reader_read_until(rd, 255, &out, LATE_MS);
    CHECK_EQ(n, (ssize_t)atomic_load(&t.sent) + 1);
    check_sequence((const unsigned char *)out, (size_t)n - 1, 0);
    async_reader_destroy(rd);
    close_as(sv[0], owned);
    close(sv[1]);
}

CASE(read_until_from_a_trickling_peer_times_out_keeping_the_bytes) // uring adversarial
{
    on_fibers_and_thread(read_until_from_trickler);
}

/* ---- timeout 0 ------------------------------------------------------------------- */

static void zero_timeouts(int owned)
{
    int sv[2];
    make_pair(0, sv);
    own(sv[0], owned);
    char b[16];
    size_t got = 99;
    double t0 = now_ms();
    CHECK_EQ(async_fiber_read(sv[0], b, sizeof b, 0), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_EQ(async_fiber_read_full(sv[0], b, sizeof b, &got, 0), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_EQ(got, 0);
    CHECK_EQ(async_fiber_wait_fd(sv[0], ASYNC_EVENT_READ, 0), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_EQ(async_fiber_recvfrom(sv[0], b, sizeof b, NULL, NULL, 0), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    fill(sv[0]);
    CHECK_EQ(async_fiber_write(sv[0], "x", 1, 0), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_EQ(async_fiber_wait_fd(sv[0], ASYNC_EVENT_READ | ASYNC_EVENT_WRITE, 0), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    struct sockaddr_in a;
    int l = loopback_listener(4, &a);
    own(l, owned);
    CHECK_EQ(async_fiber_accept(l, NULL, NULL, 0), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 < LATE_MS);
    /* what is there is taken */
    CHECK_EQ(write(sv[1], "ab", 2), 2);
    CHECK_EQ(async_fiber_read(sv[0], b, sizeof b, 0), 2);
    close_as(l, owned);
    close_as(sv[0], owned);
    close(sv[1]);
}

CASE(timeouts_of_0_never_wait) // uring adversarial
{
    on_fibers_and_thread(zero_timeouts);
}

/* ---- 1 ms and INT_MAX ------------------------------------------------------------ */

static void one_ms_timeouts(int owned)
{
    int sv[2];
    make_pair(0, sv);
    own(sv[0], owned);
    fill(sv[0]);
    char c;
    for (int i = 0; i < 200; i++) {
        double t0 = now_ms();
        switch (i % 3) {
        case 0:
            CHECK_EQ(async_fiber_read(sv[0], &c, 1, 1), -1);
            break;
        case 1:
            CHECK_EQ(async_fiber_write(sv[0], "x", 1, 1), -1);
            break;
        default:
            CHECK_EQ(async_fiber_wait_fd(sv[0], ASYNC_EVENT_READ | ASYNC_EVENT_WRITE, 1), -1);
        }
        CHECK_ERR(ASYNC_E_TIMEDOUT);
        CHECK_ENDED_AFTER(t0, 1);
        if (i % 3 == 1) { /* a timed-out write leaves the stream unusable */
            close_as(sv[0], owned);
            close(sv[1]);
            make_pair(0, sv);
            own(sv[0], owned);
            fill(sv[0]);
        }
    }
    close_as(sv[0], owned);
    close(sv[1]);
}

CASE(timeouts_of_1ms_end_neither_early_nor_lost) // uring adversarial
{
    on_fibers_and_thread(one_ms_timeouts);
}

static void *drain_after_50ms(void *arg)
{
    int fd = (int)(intptr_t)arg;
    static char b[1 << 16];
    sleep_ms(50);
    CHECK_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
    double t0 = now_ms();
    while (now_ms() - t0 < 200)
        if (read(fd, b, sizeof b) <= 0)
            sleep_ms(1);
    return NULL;
}

static void int_max_write_and_wait(int owned)
{
    int sv[2];
    make_pair(1, sv);
    own(sv[0], owned);
    fill(sv[0]);
    pthread_t th;
    start_thread(&th, drain_after_50ms, (void *)(intptr_t)sv[1]);
    CHECK(async_fiber_wait_fd(sv[0], ASYNC_EVENT_READ | ASYNC_EVENT_WRITE, INT_MAX) & ASYNC_EVENT_WRITE);
    static char b[1 << 18];
    CHECK_EQ(async_fiber_write(sv[0], b, sizeof b, INT_MAX), (ssize_t)sizeof b);
    join_within(th, LATE_MS, "the drainer");
    close_as(sv[0], owned);
    close(sv[1]);
}

CASE(timeouts_of_int_max_wait_for_room) // uring adversarial
{
    on_fibers_and_thread(int_max_write_and_wait);
}

/* ---- conditions a read does not clear -------------------------------------------- */

static void pty_with_closed_slave(int owned)
{
    int m, sl;
    open_pty(&m, &sl);
    close(sl);
    own(m, owned);
    char b[64];
    double t0 = now_ms();
    CHECK_EQ(async_fiber_read(m, b, sizeof b, 50), 0);
    CHECK(now_ms() - t0 < LATE_MS);
    t0 = now_ms();
    int ev = async_fiber_wait_fd(m, ASYNC_EVENT_WRITE, 50);
    CHECK(now_ms() - t0 < 50 + LATE_MS);
    CHECK(ev == -1 ? async_last_error() == ASYNC_E_TIMEDOUT : (ev & ASYNC_EVENT_CLOSE) != 0);
    static char big[1 << 20];
    t0 = now_ms();
    ssize_t r = async_fiber_write(m, big, sizeof big, 50);
    CHECK(now_ms() - t0 < 50 + LATE_MS);
    CHECK(r == (ssize_t)sizeof big || r == -1);
    close_as(m, owned);
}

CASE(pty_whose_slave_closed_keeps_the_timeouts) // uring adversarial linux
{
    on_fibers_and_thread(pty_with_closed_slave);
}

static void udp_with_pending_error(int owned)
{
    struct sockaddr_in to;
    memset(&to, 0, sizeof to);
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int gone = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(gone >= 0);
    CHECK_EQ(bind(gone, (struct sockaddr *)&to, sizeof to), 0);
    socklen_t l = sizeof to;
    CHECK_EQ(getsockname(gone, (struct sockaddr *)&to, &l), 0);
    close(gone);
    int u = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHECK(u >= 0);
    CHECK_EQ(connect(u, (struct sockaddr *)&to, sizeof to), 0);
    own(u, owned);
    char b[16];
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(send(u, "x", 1, 0), 1);
        CHECK_EQ(async_fiber_read(u, b, sizeof b, LATE_MS), -1);
        CHECK_ERR(ASYNC_E_CLOSED);
        double t0 = now_ms();
        CHECK_EQ(async_fiber_read(u, b, sizeof b, 50), -1);
        CHECK_ERR(ASYNC_E_TIMEDOUT);
        CHECK_ENDED_AFTER(t0, 50);
    }
    close_as(u, owned);
}

CASE(socket_error_read_once_then_the_timeout_holds) // uring adversarial linux
{
    on_fibers_and_thread(udp_with_pending_error);
}

/* ---- the number closed and reused under the call --------------------------------- */

static int reuse_peer[2];

/* Makes the number arg name another socket, idle: its peer stays open (in
 * reuse_peer) until the case closes it. */
static void *reuse_after_30ms(void *arg)
{
    int fd = (int)(intptr_t)arg;
    sleep_ms(30);
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, reuse_peer), 0);
    CHECK_EQ(dup2(reuse_peer[0], fd), fd);
    return NULL;
}

static void reused_number(int owned)
{
    (void)owned; /* an owned fd closed with close(2) is a bug: plain only */
    for (int kind = 0; kind < 2; kind++) {
        int sv[2];
        make_pair(kind, sv);
        pthread_t th;
        start_thread(&th, reuse_after_30ms, (void *)(intptr_t)sv[0]);
        char c;
        double t0 = now_ms();
        ssize_t r = async_fiber_read(sv[0], &c, 1, 150);
        int e = async_last_error();
        CHECK(now_ms() - t0 < 150 + LATE_MS);
        join_within(th, LATE_MS, "the reuser");
        if (r != -1)
            fprintf(stderr, "kind %d: read returned %zd\n", kind, r);
        CHECK(r == -1 && (e == ASYNC_E_TIMEDOUT || e == ASYNC_E_BADFD || e == ASYNC_E_CLOSED));
        close(sv[0]);
        close(sv[1]);
        close_pair(reuse_peer);
    }
}

CASE(a_read_whose_number_is_reused_keeps_its_timeout) // uring adversarial
{
    variant_fn = reused_number;
    async_sched_t *s = sched_new(2);
    on_fiber(s, variant_fiber, NULL);
    async_sched_destroy(s);
    reused_number(0);
}

/* ---- an fd owned by another scheduler -------------------------------------------- */

static int foreign_fd;

/* Waits on foreign_fd, which another scheduler owns (a plain descriptor
 * here): the timeouts hold. */
static void foreign_waits(void *arg)
{
    (void)arg;
    char c;
    double t0 = now_ms();
    CHECK_EQ(async_fiber_read(foreign_fd, &c, 1, 50), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_ENDED_AFTER(t0, 50);
    t0 = now_ms();
    CHECK_EQ(async_fiber_wait_fd(foreign_fd, ASYNC_EVENT_READ, 50), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_ENDED_AFTER(t0, 50);
}

static void foreign_waits_byte(void *arg)
{
    (void)arg;
    char c = 0;
    CHECK_EQ(async_fiber_read(foreign_fd, &c, 1, LATE_MS), 1);
    CHECK_EQ(c, 'z');
}

CASE(an_fd_owned_by_another_scheduler_keeps_the_timeouts) // uring adversarial
{
    async_sched_t *owner = sched_new(1), *other = sched_new(2);
    int sv[2];
    make_pair(1, sv);
    CHECK_EQ(async_fiber_fd_open(owner, sv[0]), 0);
    foreign_fd = sv[0];
    on_fiber(other, foreign_waits, NULL);
    foreign_waits(NULL);
    /* the owner's own fiber still gets its byte */
    CHECK_EQ(write(sv[1], "z", 1), 1);
    on_fiber(owner, foreign_waits_byte, NULL);
    async_sched_destroy(other);
    async_sched_destroy(owner);
    CHECK_EQ(async_fiber_close(sv[0]), 0);
    close(sv[1]);
}

/* ---- the fiber's deadline and its scope's cancel ---------------------------------- */

static void deadline_wins(int owned)
{
    int sv[2];
    make_pair(0, sv);
    own(sv[0], owned);
    char c;
    double t0 = now_ms();
    CHECK_EQ(async_fiber_set_deadline(40), 0);
    CHECK_EQ(async_fiber_read(sv[0], &c, 1, INT_MAX), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_ENDED_AFTER(t0, 40);
    fill(sv[0]);
    t0 = now_ms();
    CHECK_EQ(async_fiber_set_deadline(40), 0);
    CHECK_EQ(async_fiber_wait_fd(sv[0], ASYNC_EVENT_READ | ASYNC_EVENT_WRITE, 100000), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_ENDED_AFTER(t0, 40);
    t0 = now_ms();
    CHECK_EQ(async_fiber_set_deadline(40), 0);
    CHECK_EQ(async_fiber_write(sv[0], "x", 1, INT_MAX), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_ENDED_AFTER(t0, 40);
    /* the call's own earlier timeout wins over a later deadline */
    CHECK_EQ(async_fiber_set_deadline(100000), 0);
    t0 = now_ms();
    CHECK_EQ(async_fiber_read(sv[0], &c, 1, 30), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_ENDED_AFTER(t0, 30);
    CHECK_EQ(async_fiber_set_deadline(-1), 0);
    close_as(sv[0], owned);
    close(sv[1]);
}

static void deadline_fiber(void *arg) { deadline_wins((int)(intptr_t)arg); }

CASE(a_deadline_earlier_than_the_timeout_ends_the_call) // uring adversarial
{
    for (int owned = 0; owned < 2; owned++) {
        async_sched_t *s = sched_new(2);
        on_fiber(s, deadline_fiber, (void *)(intptr_t)owned);
        async_sched_destroy(s);
    }
}

/* A shield keeps the deadline from ending the park: the call's own timeout
 * still ends it, not earlier. */
static void shielded_deadline(void *arg)
{
    int owned = (int)(intptr_t)arg;
    int sv[2];
    make_pair(0, sv);
    own(sv[0], owned);
    char c;
    CHECK_EQ(async_fiber_shield_begin(), 0);
    CHECK_EQ(async_fiber_set_deadline(10), 0);
    double t0 = now_ms();
    CHECK_EQ(async_fiber_read(sv[0], &c, 1, 80), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_ENDED_AFTER(t0, 80);
    fill(sv[0]);
    t0 = now_ms();
    CHECK_EQ(async_fiber_write(sv[0], "x", 1, 80), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_ENDED_AFTER(t0, 80);
    t0 = now_ms();
    CHECK_EQ(async_fiber_wait_fd(sv[0], ASYNC_EVENT_READ | ASYNC_EVENT_WRITE, 80), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK_ENDED_AFTER(t0, 80);
    CHECK_EQ(async_fiber_shield_end(), 0);
    /* unshielded, the passed deadline fails the next wait */
    CHECK_EQ(async_fiber_read(sv[0], &c, 1, 80), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    close_as(sv[0], owned);
    close(sv[1]);
}

CASE(a_shielded_call_keeps_its_own_timeout_past_the_deadline) // uring adversarial
{
    for (int owned = 0; owned < 2; owned++) {
        async_sched_t *s = sched_new(2);
        on_fiber(s, shielded_deadline, (void *)(intptr_t)owned);
        async_sched_destroy(s);
    }
}

/* A scope's deadline ends a call of INT_MAX. */
static void scope_deadline_reader(void *arg)
{
    int *fd = arg;
    char c;
    double t0 = now_ms();
    CHECK_EQ(async_fiber_read(*fd, &c, 1, INT_MAX), -1);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 < 40 + LATE_MS);
}

CASE(a_scope_deadline_ends_a_read_of_int_max) // uring adversarial
{
    async_sched_t *s = sched_new(2);
    int sv[2];
    make_pair(1, sv);
    async_scope_t *sc = async_scope_create(s, NULL, 40);
    CHECK(sc != NULL);
    double t0 = now_ms();
    CHECK(async_scope_spawn(sc, scope_deadline_reader, &sv[0], 0) != NULL);
    CHECK_EQ(async_scope_join(sc, 40 + LATE_MS), 0);
    CHECK(now_ms() - t0 >= 39.5);
    CHECK_EQ(async_scope_destroy(sc), 0);
    async_sched_destroy(s);
    close_pair(sv);
}

typedef struct {
    int fd;
    int owned;
    atomic_int res;
} scoped_read_t;

static void scoped_reader(void *arg)
{
    scoped_read_t *sr = arg;
    own(sr->fd, sr->owned);
    char c;
    ssize_t r = async_fiber_read(sr->fd, &c, 1, INT_MAX);
    atomic_store(&sr->res, r == -1 ? async_last_error() : 1000);
}

CASE(a_scope_cancel_ends_a_read_of_int_max) // uring adversarial
{
    for (int owned = 0; owned < 2; owned++) {
        async_sched_t *s = sched_new(2);
        async_scope_t *sc = async_scope_create(s, NULL, -1);
        CHECK(sc != NULL);
        int sv[2];
        make_pair(1, sv);
        scoped_read_t sr = {.fd = sv[0], .owned = owned};
        atomic_store(&sr.res, -1);
        CHECK(async_scope_spawn(sc, scoped_reader, &sr, 0) != NULL);
        sched_wait_parked(s, 1);
        CHECK_EQ(async_scope_cancel(sc), 0);
        CHECK_EQ(async_scope_join(sc, LATE_MS), 0);
        CHECK_EQ(atomic_load(&sr.res), ASYNC_E_CANCELLED);
        CHECK_EQ(async_scope_destroy(sc), 0);
        async_sched_destroy(s);
        close_as(sv[0], owned);
        close(sv[1]);
    }
}

TEST_MAIN()
