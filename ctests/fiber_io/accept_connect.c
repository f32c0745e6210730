/* async_fiber_accept and async_fiber_connect on fibers and plain threads:
 * connects that succeed, are refused, time out or are still in progress (a
 * second connect waits for the first one's result), accept's addr/len and the
 * flags of the fds it returns, sockets in states their call does not fit (an
 * answer, never a hang or SIGPIPE), accept and connect storms on busy
 * workers, and an echo load over loopback TCP on 1 and 4 workers. Every wait
 * is bounded: a regression fails the case instead of hanging it. */
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <termios.h>

#include "check.h"
#include "net.h"

/* ---- connect ------------------------------------------------------------------ */

static void connect_body(void *arg) {
    (void)arg;
    struct sockaddr_in bad = refused_addr();
    int tm[] = {0, 1, 1000, -1};
    for (int i = 0; i < 4; i++) {
        int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(c >= 0);
        async_clear_error();
        int r = async_fiber_connect(c, (struct sockaddr *)&bad, sizeof bad, tm[i]);
        int e = async_last_error();
        if (!(r == -1 && (e == ASYNC_E_CLOSED || (tm[i] >= 0 && tm[i] < 2 && e == ASYNC_E_TIMEDOUT))))
            fprintf(stderr, "connect refused t %d -> %d err %d\n", tm[i], r, e);
        CHECK(r == -1);
        CHECK(e == ASYNC_E_CLOSED || (tm[i] >= 0 && tm[i] < 2 && e == ASYNC_E_TIMEDOUT));
        close(c);
    }
    /* a connect already in progress (started by the host, non-blocking): the
     * call waits for its result */
    struct sockaddr_in sa;
    int l = loopback_listener(16, &sa);
    for (int i = 0; i < 20; i++) {
        int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        CHECK(c >= 0);
        int r0 = connect(c, (struct sockaddr *)&sa, sizeof sa);
        int e0 = errno;
        CHECK(r0 == 0 || e0 == EINPROGRESS);
        async_clear_error();
        int r = async_fiber_connect(c, (struct sockaddr *)&sa, sizeof sa, 2000);
        if (r != 0)
            fprintf(stderr, "connect after host connect (%s) -> %d err %d os %d\n", r0 == 0 ? "done" : "EINPROGRESS",
                    r, async_last_error(), async_last_os_error());
        CHECK_EQ(r, 0);
        CHECK_EQ(async_fiber_write(c, "x", 1, 1000), 1);
        int a = async_fiber_accept(l, NULL, NULL, 1000);
        CHECK(a >= 0);
        char b;
        CHECK_EQ(async_fiber_read(a, &b, 1, 1000), 1);
        close(a);
        close(c);
    }
    close(l);
}

CASE(connect_states) { on_new_sched(2, connect_body); } // uring adversarial

CASE(connect_states_thread) { connect_body(NULL); } // adversarial

/* ---- accept's addr/len ---------------------------------------------------------- */

static void accept_body(void *arg) {
    (void)arg;
    struct sockaddr_in sa;
    int l = loopback_listener(16, &sa);
    struct sockaddr_in peer;
    socklen_t len = sizeof peer;
    CHECK_FAIL(async_fiber_accept(l, (struct sockaddr *)&peer, NULL, 0) == -1, ASYNC_E_INVAL);
    /* addr NULL ignores len (accept(2)): nothing pending, so a timeout */
    CHECK_FAIL(async_fiber_accept(l, NULL, &len, 0) == -1, ASYNC_E_TIMEDOUT);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK_EQ(async_fiber_connect(c, (struct sockaddr *)&sa, sizeof sa, 2000), 0);
    /* too small: truncated, *len tells the full size (accept(2)) */
    struct {
        unsigned char b[4];
        unsigned char canary[32];
    } small;
    memset(&small, 0xAB, sizeof small);
    len = 4;
    int a = async_fiber_accept(l, (struct sockaddr *)small.b, &len, 2000);
    CHECK(a >= 0);
    CHECK_EQ(len, sizeof(struct sockaddr_in));
    for (size_t i = 0; i < sizeof small.canary; i++) CHECK_EQ(small.canary[i], 0xAB);
    int fl = fcntl(a, F_GETFL), fdfl = fcntl(a, F_GETFD);
    CHECK(fl & O_NONBLOCK);
    CHECK(fdfl & FD_CLOEXEC);
    close(a);
    close(c);
    /* len 0 */
    c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK_EQ(async_fiber_connect(c, (struct sockaddr *)&sa, sizeof sa, 2000), 0);
    len = 0;
    a = async_fiber_accept(l, (struct sockaddr *)&peer, &len, 2000);
    CHECK(a >= 0);
    close(a);
    close(c);
    /* not listening, and not a socket */
    int nl = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    async_clear_error();
    a = async_fiber_accept(nl, NULL, NULL, 200);
    printf("accept(not listening) -> %d err %d\n", a, async_last_error());
    CHECK(a == -1 && async_last_error() != ASYNC_E_TIMEDOUT);
    close(nl);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    async_clear_error();
    a = async_fiber_accept(p[0], NULL, NULL, 200);
    printf("accept(pipe) -> %d err %d\n", a, async_last_error());
    CHECK(a == -1 && async_last_error() != ASYNC_E_TIMEDOUT);
    close_pair(p);
    close(l);
}

CASE(accept_args) { on_new_sched(2, accept_body); } // uring adversarial

/* Fills socket and pipe buffers. */
static char bigbuf[8 << 20];

/* ---- sockets in states their call does not fit: an answer, never a hang or SIGPIPE ------------ */

static void states_body(void *arg) {
    (void)arg;
    char b[8];
    struct sockaddr_in sa;
    int l = loopback_listener(16, &sa);
    int e;
    /* read and write on a listening socket */
    async_clear_error();
    CHECK(async_fiber_read(l, b, sizeof b, 200) == -1);
    e = async_last_error();
    printf("read(listener) -> err %d\n", e);
    CHECK(e != ASYNC_E_TIMEDOUT);
    async_clear_error();
    CHECK(async_fiber_write(l, "x", 1, 200) == -1);
    e = async_last_error();
    printf("write(listener) -> err %d\n", e);
    CHECK(e == ASYNC_E_CLOSED || e == ASYNC_E_SYS);
    /* a fresh, unconnected TCP socket */
    int u = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    async_clear_error();
    ssize_t r = async_fiber_read(u, b, sizeof b, 200);
    e = async_last_error();
    printf("read(unconnected) -> %zd err %d\n", r, e);
    CHECK(r == 0 || (r == -1 && e != ASYNC_E_TIMEDOUT));
    async_clear_error();
    CHECK(async_fiber_write(u, "x", 1, 200) == -1);
    e = async_last_error();
    printf("write(unconnected) -> err %d\n", e);
    CHECK(e == ASYNC_E_CLOSED || e == ASYNC_E_SYS);
    /* connect: a pipe, a short address, a second connect on a connected socket */
    int p[2];
    CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    async_clear_error();
    CHECK(async_fiber_connect(p[0], (struct sockaddr *)&sa, sizeof sa, 200) == -1);
    printf("connect(pipe) -> err %d\n", async_last_error());
    CHECK(async_last_error() == ASYNC_E_BADFD || async_last_error() == ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_connect(u, (struct sockaddr *)&sa, 2, 200) == -1, ASYNC_E_INVAL);
    CHECK_EQ(async_fiber_connect(u, (struct sockaddr *)&sa, sizeof sa, 2000), 0);
    async_clear_error();
    int rc = async_fiber_connect(u, (struct sockaddr *)&sa, sizeof sa, 2000);
    printf("connect(connected) -> %d err %d\n", rc, async_last_error());
    /* our own side shut for writing: CLOSED, no SIGPIPE */
    CHECK_EQ(shutdown(u, SHUT_WR), 0);
    CHECK_FAIL(async_fiber_write(u, "x", 1, 200) == -1, ASYNC_E_CLOSED);
    CHECK_FAIL(async_fiber_write(u, bigbuf, 1 << 20, 200) == -1, ASYNC_E_CLOSED);
    int a = async_fiber_accept(l, NULL, NULL, 2000);
    CHECK(a >= 0);
    CHECK_EQ(async_fiber_read(a, b, sizeof b, 2000), 0); /* the half-close is end of file */
    CHECK_EQ(async_fiber_write(a, "back", 4, 2000), 4);  /* the other way still works */
    CHECK_EQ(async_fiber_read(u, b, sizeof b, 2000), 4);
    close(a);
    close(u);
    close_pair(p);
    close(l);
}

CASE(sock_wrong_state) { // uring adversarial
    signal(SIGPIPE, SIG_DFL);
    on_fiber_then_thread(states_body);
}

/* ---- a connect that timed out is still in progress: a second
 * async_fiber_connect waits for its result (EALREADY is not an error) ------------------------------ */

static int ca_listener, ca_fd;

static struct sockaddr_in ca_sa;

static atomic_int ca_first = -1, ca_second = -1;

static void ca_body(void *arg) {
    (void)arg;
    int r = async_fiber_connect(ca_fd, (struct sockaddr *)&ca_sa, sizeof ca_sa, 100);
    atomic_store(&ca_first, r == -1 ? async_last_error() : 0);
    if (r == 0) return;
    r = async_fiber_connect(ca_fd, (struct sockaddr *)&ca_sa, sizeof ca_sa, 15000);
    atomic_store(&ca_second, r == -1 ? async_last_error() : 0);
    if (r == -1) fprintf(stderr, "second connect -> err %d os %d\n", async_last_error(), async_last_os_error());
}

static void *ca_drain(void *arg) {
    (void)arg;
    /* once the first connect timed out: make room in the backlog */
    double t0 = now_ms();
    while (atomic_load(&ca_first) == -1 && now_ms() - t0 < 10000) sleep_ms(2);
    int fl = fcntl(ca_listener, F_GETFL);
    fcntl(ca_listener, F_SETFL, fl | O_NONBLOCK);
    /* accept whatever completes until the second connect is done */
    while (atomic_load(&ca_first) != 0 && atomic_load(&ca_second) == -1 && now_ms() - t0 < 14000) {
        int a = accept4(ca_listener, NULL, NULL, SOCK_NONBLOCK);
        if (a >= 0)
            close(a);
        else
            sleep_ms(2);
    }
    return NULL;
}

static void connect_again(int on_fiber_) {
    ca_listener = loopback_listener(0, &ca_sa);
    int fill[8];
    for (int i = 0; i < 8; i++) {
        fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        connect(fill[i], (struct sockaddr *)&ca_sa, sizeof ca_sa);
    }
    sleep_ms(50);
    ca_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    atomic_store(&ca_first, -1);
    atomic_store(&ca_second, -1);
    pthread_t th;
    start_thread(&th, ca_drain, NULL);
    if (on_fiber_) {
        on_new_sched(2, ca_body);
    } else {
        ca_body(NULL);
    }
    join_within(th, 20000, "drain");
    printf("first %d second %d\n", atomic_load(&ca_first), atomic_load(&ca_second));
    if (atomic_load(&ca_first) == 0) {
        printf("skipped: the connect did not stay in progress\n");
    } else {
        CHECK_EQ(atomic_load(&ca_first), ASYNC_E_TIMEDOUT);
        CHECK_EQ(atomic_load(&ca_second), 0);
    }
    close(ca_fd);
    for (int i = 0; i < 8; i++) close(fill[i]);
    close(ca_listener);
}

CASE(connect_again) { connect_again(1); } // uring adversarial

CASE(connect_again_thread) { connect_again(0); } // adversarial

/* ---- an accept that parked first (the ring's accept with io_uring): the
 * new fd is O_NONBLOCK and close-on-exec, addr/len filled as accept(2) ------------------------------ */

static int pa_l;

static struct sockaddr_in pa_sa;

static void *pa_client(void *arg) {
    int *out = arg;
    sleep_ms(100);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK_EQ(connect(c, (struct sockaddr *)&pa_sa, sizeof pa_sa), 0);
    *out = c;
    return NULL;
}

static void pa_body(void *arg) {
    (void)arg;
    for (int k = 0; k < 3; k++) {
        int c = -1;
        pthread_t th;
        start_thread(&th, pa_client, &c);
        struct {
            struct sockaddr_in a;
            unsigned char canary[16];
        } big;
        memset(&big, 0xAB, sizeof big);
        socklen_t len = k == 1 ? 4 : sizeof big.a;
        int a = k == 2 ? async_fiber_accept(pa_l, NULL, NULL, 5000)
                       : async_fiber_accept(pa_l, (struct sockaddr *)&big.a, &len, 5000);
        CHECK(a >= 0);
        join_within(th, 5000, "client");
        CHECK(fcntl(a, F_GETFL) & O_NONBLOCK);
        CHECK(fcntl(a, F_GETFD) & FD_CLOEXEC);
        if (k < 2) CHECK_EQ(len, sizeof(struct sockaddr_in));
        if (k == 0) CHECK_EQ(big.a.sin_family, AF_INET);
        if (k == 1) CHECK_EQ(((unsigned char *)&big.a)[4], 0xAB); /* nothing past *len written */
        for (int i = 0; i < 16; i++) CHECK_EQ(big.canary[i], 0xAB);
        close(a);
        close(c);
    }
}

CASE(accept_parked) { // uring adversarial
    pa_l = loopback_listener(16, &pa_sa);
    on_fiber_then_thread(pa_body);
    close(pa_l);
}

/* ---- accept and connect storms on busy workers (owned and plain listener) ---- */

#define AC_CONNS 48

static int as_l;

static struct sockaddr_in as_addr;

static atomic_int as_done;

static void as_server(void *arg)
{
    (void)arg;
    int c = async_fiber_accept(as_l, NULL, NULL, BOUND_MS);
    CHECK(c >= 0);
    char b = 0;
    CHECK_EQ(async_fiber_read(c, &b, 1, BOUND_MS), 1);
    CHECK_EQ(async_fiber_write(c, &b, 1, BOUND_MS), 1);
    CHECK_EQ(async_fiber_close(c), 0);
    atomic_fetch_add(&as_done, 1);
}

static void as_client(void *arg)
{
    int i = (int)(intptr_t)arg;
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(c >= 0);
    if (i % 2)
        CHECK_EQ(async_fiber_fd_open(NULL, c), 0);
    CHECK_EQ(async_fiber_connect(c, (struct sockaddr *)&as_addr, sizeof as_addr, BOUND_MS), 0);
    char b = (char)i, got = 0;
    CHECK_EQ(async_fiber_write(c, &b, 1, BOUND_MS), 1);
    CHECK_EQ(async_fiber_read(c, &got, 1, BOUND_MS), 1);
    CHECK_EQ(got, b);
    CHECK_EQ(async_fiber_read(c, &got, 1, BOUND_MS), 0); /* the server closed */
    CHECK_EQ(async_fiber_close(c), 0);
    atomic_fetch_add(&as_done, 1);
}

static void accept_storm(int owned)
{
    async_sched_t *s = sched_new(3);
    atomic_store(&as_done, 0);
    as_l = loopback_listener(AC_CONNS, &as_addr);
    own_if(s, as_l, owned);
    busy_start(s, 3);
    /* one acceptor at a time may wait (one-reader rule): they take turns */
    for (int i = 0; i < AC_CONNS; i++)
        CHECK(async_fiber_spawn(s, as_client, (void *)(intptr_t)i, 0) != NULL);
    for (int i = 0; i < AC_CONNS; i++) {
        int before = atomic_load(&as_done);
        CHECK(async_fiber_spawn(s, as_server, NULL, 0) != NULL);
        wait_count(&as_done, before + 1, "one accepted connection served");
    }
    wait_count(&as_done, 2 * AC_CONNS, "clients and servers");
    atomic_store(&busy_stop, 1);
    sched_finish(s, BOUND_MS);
    close_as(as_l, owned);
}

CASE(accept_storm_owned) { accept_storm(1); } // uring adversarial

CASE(accept_storm_plain) { accept_storm(0); } // uring adversarial

/* ---- echo: accept, connect, read and write over loopback TCP ------------------ */

#define ECHO_CONNS 200

#define ECHO_MSGS 200

typedef struct {
    async_sched_t *s;
    int lfd;
    struct sockaddr_in addr;
    atomic_int done, served;
    atomic_int bad;
} echo_t;

typedef struct {
    echo_t *e;
    int fd;
} conn_t;

static void echo_serve(void *arg) {
    conn_t *c = arg;
    char buf[4096];
    for (;;) {
        ssize_t r = async_fiber_read(c->fd, buf, sizeof buf, 10000);
        if (r <= 0) break;
        if (async_fiber_write(c->fd, buf, (size_t)r, 10000) != r) {
            atomic_store(&c->e->bad, 1);
            break;
        }
    }
    close(c->fd);
    atomic_fetch_add(&c->e->served, 1);
    free(c);
}

static void echo_accept(void *arg) {
    echo_t *e = arg;
    for (int i = 0; i < ECHO_CONNS; i++) {
        struct sockaddr_in peer;
        socklen_t len = sizeof peer;
        int fd = async_fiber_accept(e->lfd, (struct sockaddr *)&peer, &len, 10000);
        if (fd < 0) {
            atomic_store(&e->bad, 2);
            return;
        }
        int fl = fcntl(fd, F_GETFL), fdfl = fcntl(fd, F_GETFD);
        if (!(fl & O_NONBLOCK) || !(fdfl & FD_CLOEXEC) || len != sizeof peer || peer.sin_family != AF_INET)
            atomic_store(&e->bad, 3);
        conn_t *c = malloc(sizeof *c);
        c->e = e;
        c->fd = fd;
        CHECK(async_fiber_spawn(e->s, echo_serve, c, 0) != NULL);
    }
}

static void echo_client(void *arg) {
    echo_t *e = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || async_fiber_connect(fd, (struct sockaddr *)&e->addr, sizeof e->addr, 10000) != 0) {
        atomic_store(&e->bad, 4);
        if (fd >= 0) close(fd);
        atomic_fetch_add(&e->done, 1);
        return;
    }
    unsigned seed = (unsigned)fd * 2654435761u;
    char out[2000], in[2000];
    for (int m = 0; m < ECHO_MSGS; m++) {
        size_t n = 1 + (seed = seed * 1103515245u + 12345u) % sizeof out;
        for (size_t i = 0; i < n; i++) out[i] = (char)(m + i);
        if (async_fiber_write(fd, out, n, 10000) != (ssize_t)n) {
            atomic_store(&e->bad, 5);
            break;
        }
        size_t got = 0;
        while (got < n) {
            ssize_t r = async_fiber_read(fd, in + got, n - got, 10000);
            if (r <= 0) break;
            got += (size_t)r;
        }
        if (got != n || memcmp(in, out, n) != 0) {
            atomic_store(&e->bad, 6);
            break;
        }
    }
    close(fd);
    atomic_fetch_add(&e->done, 1);
}

static void echo_with(int workers) {
    async_sched_t *s = sched_new(workers);
    echo_t e;
    memset(&e, 0, sizeof e);
    e.s = s;
    e.lfd = loopback_listener(1024, &e.addr);
    CHECK(async_fiber_spawn(s, echo_accept, &e, 0) != NULL);
    for (int i = 0; i < ECHO_CONNS; i++) CHECK(async_fiber_spawn(s, echo_client, &e, 0) != NULL);
    wait_count_within(&e.done, ECHO_CONNS, 60000, "echo clients");
    wait_count_within(&e.served, ECHO_CONNS, 60000, "echo servers");
    CHECK_EQ(atomic_load(&e.bad), 0);
    /* the listening socket was switched to O_NONBLOCK, as promised */
    CHECK(fcntl(e.lfd, F_GETFL) & O_NONBLOCK);
    async_sched_destroy(s);
    close(e.lfd);
}

CASE(tcp_echo_1w) { echo_with(1); } // linux uring

CASE(tcp_echo_4w) { echo_with(4); } // linux uring

TEST_MAIN()
