/* The two patterns of docs/FIBERS.md "Cancellation and scopes", compiled
 * as written there (plus a line that counts the cancelled connections): an
 * echo connection with a paired idle timer that
 * cancels it after IDLE_MS without input (and ends with it), and a server's
 * graceful stop (stop accepting, give in-flight requests a grace period,
 * then cancel the rest). Clients on plain threads over loopback TCP. */
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

/* ---- the guide's code -------------------------------------------------------- */

#define IDLE_MS 300

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static async_sched_t *sched; /* the server's scheduler */

struct conn {
    int fd;
    async_fiber_t *reader;
    _Atomic int64_t last_ms; /* the last input */
};

static void idle_timer(void *arg) {
    struct conn *c = arg;
    for (;;) {
        int64_t idle = mono_ms() - atomic_load(&c->last_ms);
        if (idle >= IDLE_MS) {
            async_fiber_cancel(c->reader); /* its read fails with ASYNC_E_CANCELLED */
            return;
        }
        if (async_fiber_sleep((uint64_t)(IDLE_MS - idle)) < 0) return; /* the connection ended */
    }
}

static atomic_int conns_cancelled; /* (the test's count) */

static void connection(void *arg) {
    struct conn c = {.fd = (int)(intptr_t)arg, .reader = async_fiber_current()};
    atomic_store(&c.last_ms, mono_ms());
    async_scope_t *timer = async_scope_create(sched, NULL, -1);
    if (timer && async_scope_spawn(timer, idle_timer, &c, 0)) {
        char buf[4096];
        ssize_t n;
        while ((n = async_fiber_read(c.fd, buf, sizeof buf, -1)) > 0) {
            atomic_store(&c.last_ms, mono_ms());
            if (async_fiber_write(c.fd, buf, (size_t)n, -1) < 0) break;
        }
        if (n < 0 && async_last_error() == ASYNC_E_CANCELLED) atomic_fetch_add(&conns_cancelled, 1);
        async_scope_cancel(timer);
        async_scope_join(timer, -1); /* the timer uses c, on this stack */
    }
    if (timer) async_scope_destroy(timer);
    async_fiber_close(c.fd);
}

struct server {
    int lfd;
    async_scope_t *accepting, *conns;
};

static void acceptor(void *arg) {
    struct server *sv = arg;
    for (;;) {
        int fd = async_fiber_accept(sv->lfd, NULL, NULL, -1);
        if (fd < 0) return; /* ASYNC_E_CANCELLED: the server stops */
        if (!async_scope_spawn(sv->conns, connection, (void *)(intptr_t)fd, 0)) async_fiber_close(fd);
    }
}

static int server_start(struct server *sv) {
    sv->accepting = async_scope_create(sched, NULL, -1);
    sv->conns = async_scope_create(sched, NULL, -1);
    if (!sv->accepting || !sv->conns) return -1;
    return async_scope_spawn(sv->accepting, acceptor, sv, 0) ? 0 : -1;
}

/* Any thread or fiber (not one of the server's own). */
static void server_stop(struct server *sv, int grace_ms) {
    async_scope_cancel(sv->accepting); /* 1. stop accepting */
    async_scope_join(sv->accepting, -1);
    if (async_scope_join(sv->conns, grace_ms) < 0) { /* 2. in-flight work gets grace_ms */
        async_scope_cancel(sv->conns);                /* 3. then the rest is cancelled */
        async_scope_join(sv->conns, -1);
    }
    async_scope_destroy(sv->accepting);
    async_scope_destroy(sv->conns);
}

/* ---- the cases ------------------------------------------------------------------ */

static int dial(const struct sockaddr_in *a) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    CHECK_EQ(connect(fd, (const struct sockaddr *)a, sizeof *a), 0);
    struct timeval tv = {20, 0}; /* a lost reply fails the case instead of hanging it */
    CHECK_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    return fd;
}

/* An echo round trip; 1 if the reply came back. */
static int echo_once(int fd, char ch) {
    if (send(fd, &ch, 1, MSG_NOSIGNAL) != 1) return 0;
    char got = 0;
    return recv(fd, &got, 1, 0) == 1 && got == ch;
}

/* A client that talks every IDLE_MS / 10 keeps its connection; one that goes
 * quiet is closed by its timer (the client reads EOF); a connection whose
 * client closes first takes its timer down with it. */
CASE(idle_timeout_pattern) { // uring
    sched = sched_new(2);
    struct sockaddr_in a;
    struct server sv = {.lfd = loopback_listener(16, &a)};
    CHECK_EQ(server_start(&sv), 0);
    int busy = dial(&a), quiet = dial(&a), leaver = dial(&a);
    CHECK(echo_once(leaver, 'l'));
    close(leaver); /* its connection ends by EOF and cancels its timer */
    CHECK(echo_once(quiet, 'q'));
    for (int i = 0; i < 15; i++) {
        CHECK(echo_once(busy, (char)('a' + i)));
        sleep_ms(IDLE_MS / 10);
    }
    char b;
    CHECK_EQ(recv(quiet, &b, 1, 0), 0); /* closed by the server after IDLE_MS */
    CHECK(echo_once(busy, 'z'));
    CHECK_EQ(atomic_load(&conns_cancelled), 1);
    server_stop(&sv, 0);
    CHECK_EQ(recv(busy, &b, 1, 0), 0);
    CHECK_EQ(atomic_load(&conns_cancelled), 2);
    CHECK_EQ(async_sched_run(sched), 0); /* every fiber returned */
    close(busy);
    close(quiet);
    close(sv.lfd);
    async_sched_destroy(sched);
}

/* A request in flight when the stop begins is answered within the grace
 * period; the idle connections are cancelled after it; new connections are
 * no longer served. */
CASE(graceful_stop_pattern) { // uring
    sched = sched_new(2);
    atomic_store(&conns_cancelled, 0);
    struct sockaddr_in a;
    struct server sv = {.lfd = loopback_listener(16, &a)};
    CHECK_EQ(server_start(&sv), 0);
    int c[4];
    for (int i = 0; i < 4; i++) {
        c[i] = dial(&a);
        CHECK(echo_once(c[i], 'x'));
    }
    /* the request goes out; the echo would answer at once, so the stop's
     * grace covers it either way */
    CHECK_EQ(send(c[0], "r", 1, MSG_NOSIGNAL), 1);
    server_stop(&sv, IDLE_MS / 2);
    char b = 0;
    CHECK_EQ(recv(c[0], &b, 1, 0), 1);
    CHECK_EQ(b, 'r');
    for (int i = 0; i < 4; i++) CHECK_EQ(recv(c[i], &b, 1, 0), 0); /* closed */
    CHECK_EQ(async_sched_run(sched), 0);
    /* no acceptor any more: a new connection waits in the backlog unserved */
    int late = dial(&a);
    CHECK_EQ(send(late, "n", 1, MSG_NOSIGNAL), 1);
    struct timeval tv = {0, 100000};
    CHECK_EQ(setsockopt(late, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    CHECK_EQ(recv(late, &b, 1, 0), -1);
    close(late);
    for (int i = 0; i < 4; i++) close(c[i]);
    close(sv.lfd);
    async_sched_destroy(sched);
}

TEST_MAIN()
