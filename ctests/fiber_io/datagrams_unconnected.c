/* async_fiber_recvfrom and async_fiber_sendto on unconnected UDP sockets:
 * the source address of each datagram (IPv4, and IPv6 on ::1 where the
 * machine has it), a datagram cut to the buffer and an address cut to *len,
 * the empty datagram, a receive that parks until a datagram comes, a send
 * to a peer nobody listens on, the ICMP error a connected socket gets, a
 * datagram too large, bad input. Sockets from async_fiber_udp_bind (owned
 * on a fiber) and from socket(2) (plain: io_uring serves those with the
 * `uring` word); on a fiber and on a plain thread. Every wait is bounded. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "net.h"

static int use_plain; /* the case's sockets: 0 async_fiber_udp_bind, 1 socket(2) + bind(2) */

/* A UDP socket bound to host:0 (its address in *a). */
static int udp_sock(const char *host, struct sockaddr_storage *a, socklen_t *l) {
    CHECK_EQ(async_sockaddr_parse(host, 0, a, l), 0);
    int fd;
    if (use_plain) {
        fd = socket(a->ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        CHECK(fd >= 0);
        CHECK_EQ(bind(fd, (struct sockaddr *)a, *l), 0);
    } else {
        fd = async_fiber_udp_bind((struct sockaddr *)a, *l, 0);
        CHECK(fd >= 0);
    }
    *l = sizeof *a;
    CHECK_EQ(getsockname(fd, (struct sockaddr *)a, l), 0);
    return fd;
}

static int same_addr(const struct sockaddr_storage *x, socklen_t xl, const struct sockaddr_storage *y, socklen_t yl) {
    if (xl != yl || x->ss_family != y->ss_family) return 0;
    if (x->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)x, *b = (const void *)y;
        return a->sin_port == b->sin_port && a->sin_addr.s_addr == b->sin_addr.s_addr;
    }
    const struct sockaddr_in6 *a = (const void *)x, *b = (const void *)y;
    return a->sin6_port == b->sin6_port && memcmp(&a->sin6_addr, &b->sin6_addr, sizeof a->sin6_addr) == 0;
}

/* Runs fn on a fiber and on this thread, with sockets of each kind. */
static void both_kinds(void (*fn)(void *)) {
    for (use_plain = 0; use_plain < 2; use_plain++) on_fiber_then_thread(fn);
}

/* ---- source address, both ways ----------------------------------------------------- */

static void exchange(const char *host) {
    struct sockaddr_storage sa, ca, from;
    socklen_t sl, cl, fl;
    int srv = udp_sock(host, &sa, &sl);
    int cli = udp_sock(host, &ca, &cl);
    CHECK_EQ(async_fiber_sendto(cli, "hello", 5, (struct sockaddr *)&sa, sl, 20000), 5);
    char buf[64];
    fl = sizeof from;
    CHECK_EQ(async_fiber_recvfrom(srv, buf, sizeof buf, (struct sockaddr *)&from, &fl, 20000), 5);
    CHECK(memcmp(buf, "hello", 5) == 0);
    CHECK(same_addr(&from, fl, &ca, cl));
    /* the reply goes to the source just learned */
    CHECK_EQ(async_fiber_sendto(srv, "world!", 6, (struct sockaddr *)&from, fl, 20000), 6);
    fl = sizeof from;
    CHECK_EQ(async_fiber_recvfrom(cli, buf, sizeof buf, (struct sockaddr *)&from, &fl, 20000), 6);
    CHECK(memcmp(buf, "world!", 6) == 0);
    CHECK(same_addr(&from, fl, &sa, sl));
    /* addr NULL: the source is not told (len is not looked at) */
    CHECK_EQ(async_fiber_sendto(cli, "x", 1, (struct sockaddr *)&sa, sl, 20000), 1);
    CHECK_EQ(async_fiber_recvfrom(srv, buf, sizeof buf, NULL, NULL, 20000), 1);
    CHECK_EQ(async_fiber_close(srv), 0);
    CHECK_EQ(async_fiber_close(cli), 0);
}

static void exchange_v4(void *arg) {
    (void)arg;
    exchange("127.0.0.1");
}

CASE(recvfrom_source_address) { // uring
    both_kinds(exchange_v4);
}


static void exchange_v6(void *arg) {
    (void)arg;
    exchange("::1");
}

CASE(recvfrom_source_address_ipv6) { // uring
    if (!have_ipv6_loopback(SOCK_DGRAM)) {
        printf("no IPv6 on this machine: skipped\n");
        return;
    }
    both_kinds(exchange_v6);
}

/* ---- cut datagram, cut address, empty datagram --------------------------------------- */

static void truncation(void *arg) {
    (void)arg;
    struct sockaddr_storage sa, ca, from;
    socklen_t sl, cl, fl;
    int srv = udp_sock("127.0.0.1", &sa, &sl);
    int cli = udp_sock("127.0.0.1", &ca, &cl);
    char big[100], buf[100];
    memset(big, 'A', sizeof big);
    CHECK_EQ(async_fiber_sendto(cli, big, sizeof big, (struct sockaddr *)&sa, sl, 20000), 100);
    CHECK_EQ(async_fiber_sendto(cli, "B", 1, (struct sockaddr *)&sa, sl, 20000), 1);
    /* cut to 10; the rest of that datagram is gone, the next one is whole */
    memset(buf, 0, sizeof buf);
    CHECK_EQ(async_fiber_recvfrom(srv, buf, 10, NULL, NULL, 20000), 10);
    CHECK(memcmp(buf, big, 10) == 0);
    CHECK_EQ(buf[10], 0);
    CHECK_EQ(async_fiber_recvfrom(srv, buf, sizeof buf, NULL, NULL, 20000), 1);
    CHECK_EQ(buf[0], 'B');
    /* an address cut to *len: *len tells its full size */
    CHECK_EQ(async_fiber_sendto(cli, "C", 1, (struct sockaddr *)&sa, sl, 20000), 1);
    struct sockaddr_storage small;
    memset(&small, 0xee, sizeof small);
    fl = 4;
    CHECK_EQ(async_fiber_recvfrom(srv, buf, sizeof buf, (struct sockaddr *)&small, &fl, 20000), 1);
    CHECK_EQ(fl, sizeof(struct sockaddr_in));
    CHECK_EQ(((unsigned char *)&small)[4], 0xee); /* nothing written past 4 bytes */
    /* the empty datagram: sent (buf may be NULL) and received as 0, with its source */
    CHECK_EQ(async_fiber_sendto(cli, NULL, 0, (struct sockaddr *)&sa, sl, 20000), 0);
    fl = sizeof from;
    CHECK_EQ(async_fiber_recvfrom(srv, buf, sizeof buf, (struct sockaddr *)&from, &fl, 20000), 0);
    CHECK(same_addr(&from, fl, &ca, cl));
    /* n 0 takes one datagram (cut to nothing) */
    CHECK_EQ(async_fiber_sendto(cli, "DD", 2, (struct sockaddr *)&sa, sl, 20000), 2);
    CHECK_EQ(async_fiber_sendto(cli, "E", 1, (struct sockaddr *)&sa, sl, 20000), 1);
    CHECK_EQ(async_fiber_recvfrom(srv, NULL, 0, NULL, NULL, 20000), 0);
    CHECK_EQ(async_fiber_recvfrom(srv, buf, sizeof buf, NULL, NULL, 20000), 1);
    CHECK_EQ(buf[0], 'E');
    /* nothing left: a receive times out */
    CHECK_FAIL(async_fiber_recvfrom(srv, buf, sizeof buf, NULL, NULL, 50) == -1, ASYNC_E_TIMEDOUT);
    CHECK_FAIL(async_fiber_recvfrom(srv, buf, sizeof buf, NULL, NULL, 0) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(async_fiber_close(srv), 0);
    CHECK_EQ(async_fiber_close(cli), 0);
}

CASE(recvfrom_truncation_and_empty) { // uring
    both_kinds(truncation);
}

/* ---- a receive parked until a datagram comes -------------------------------------------- */

typedef struct {
    int fd;
    ssize_t r;
    struct sockaddr_storage from;
    socklen_t fl;
    char buf[16];
} parked_t;

static void parked_recv(void *arg) {
    parked_t *x = arg;
    x->fl = sizeof x->from;
    x->r = async_fiber_recvfrom(x->fd, x->buf, sizeof x->buf, (struct sockaddr *)&x->from, &x->fl, 20000);
}

static void parked(int plain) {
    use_plain = plain;
    async_sched_t *s = sched_new(1);
    static parked_t x;
    memset(&x, 0, sizeof x);
    struct sockaddr_storage sa, ca;
    socklen_t sl, cl;
    x.fd = udp_sock("127.0.0.1", &sa, &sl); /* plain here, on this thread */
    if (!plain) CHECK_EQ(async_fiber_fd_open(s, x.fd), 0);
    use_plain = 1;
    int cli = udp_sock("127.0.0.1", &ca, &cl);
    async_fiber_t *f = async_fiber_spawn(s, parked_recv, &x, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    sched_wait_parked(s, 1);
    CHECK_EQ(sendto(cli, "late", 4, 0, (struct sockaddr *)&sa, sl), 4);
    CHECK_EQ(async_fiber_join(f, 20000), 0);
    CHECK_EQ(x.r, 4);
    CHECK(memcmp(x.buf, "late", 4) == 0);
    CHECK(same_addr(&x.from, x.fl, &ca, cl));
    async_sched_destroy(s);
    async_fiber_close(x.fd);
    close(cli);
}

CASE(recvfrom_parks_until_datagram_owned) { parked(0); } // uring
CASE(recvfrom_parks_until_datagram_plain) { parked(1); } // uring

/* A parked receive cancelled: ASYNC_E_CANCELLED, and a datagram sent after
 * it is whole for the next receive (the cancelled one took nothing). */
typedef struct {
    int fd;
    ssize_t r;
    int err;
} cancel_t;

static void cancelled_recv(void *arg) {
    cancel_t *x = arg;
    char buf[16];
    async_clear_error();
    x->r = async_fiber_recvfrom(x->fd, buf, sizeof buf, NULL, NULL, 20000);
    x->err = async_last_error();
}

static void cancel_parked(int plain) {
    use_plain = 1;
    async_sched_t *s = sched_new(1);
    struct sockaddr_storage sa, ca;
    socklen_t sl, cl;
    static cancel_t x;
    x.fd = udp_sock("127.0.0.1", &sa, &sl);
    if (!plain) CHECK_EQ(async_fiber_fd_open(s, x.fd), 0);
    int cli = udp_sock("127.0.0.1", &ca, &cl);
    async_fiber_t *f = async_fiber_spawn(s, cancelled_recv, &x, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    sched_wait_parked(s, 1);
    CHECK_EQ(async_fiber_cancel(f), 0);
    CHECK_EQ(async_fiber_join(f, 20000), 0);
    CHECK_EQ(x.r, -1);
    CHECK_EQ(x.err, ASYNC_E_CANCELLED);
    CHECK_EQ(sendto(cli, "after", 5, 0, (struct sockaddr *)&sa, sl), 5);
    char buf[16];
    CHECK_EQ(async_fiber_recvfrom(x.fd, buf, sizeof buf, NULL, NULL, 20000), 5);
    CHECK(memcmp(buf, "after", 5) == 0);
    async_sched_destroy(s);
    async_fiber_close(x.fd);
    close(cli);
}

CASE(recvfrom_cancelled_owned) { cancel_parked(0); } // uring
CASE(recvfrom_cancelled_plain) { cancel_parked(1); } // uring

/* ---- peers that are not there --------------------------------------------------------------- */

/* A loopback UDP port nobody uses (bound, noted, closed). */
static struct sockaddr_in dead_port(void) {
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    int t = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHECK(t >= 0);
    CHECK_EQ(bind(t, (struct sockaddr *)&a, sizeof a), 0);
    CHECK_EQ(getsockname(t, (struct sockaddr *)&a, &l), 0);
    close(t);
    return a;
}

static void nobody(void *arg) {
    (void)arg;
    struct sockaddr_storage ca;
    socklen_t cl;
    int cli = udp_sock("127.0.0.1", &ca, &cl);
    struct sockaddr_in dead = dead_port();
    /* unconnected: the send succeeds (nobody reports the peer's absence) */
    CHECK_EQ(async_fiber_sendto(cli, "anyone", 6, (struct sockaddr *)&dead, sizeof dead, 20000), 6);
    char buf[16];
    CHECK_FAIL(async_fiber_recvfrom(cli, buf, sizeof buf, NULL, NULL, 100) == -1, ASYNC_E_TIMEDOUT);
    /* connected: the ICMP error comes back as ASYNC_E_CLOSED, once */
    CHECK_EQ(connect(cli, (struct sockaddr *)&dead, sizeof dead), 0);
    CHECK_EQ(async_fiber_sendto(cli, "ping", 4, NULL, 0, 20000), 4);
    CHECK_FAIL(async_fiber_recvfrom(cli, buf, sizeof buf, NULL, NULL, 20000) == -1, ASYNC_E_CLOSED);
    CHECK_FAIL(async_fiber_recvfrom(cli, buf, sizeof buf, NULL, NULL, 100) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(async_fiber_close(cli), 0);
}

CASE(sendto_unconnected_peer_and_icmp_error) { // uring
    both_kinds(nobody);
}

/* ---- a datagram too large; bad input ---------------------------------------------------- */

static void too_big(void *arg) {
    (void)arg;
    struct sockaddr_storage sa, ca;
    socklen_t sl, cl;
    int srv = udp_sock("127.0.0.1", &sa, &sl);
    int cli = udp_sock("127.0.0.1", &ca, &cl);
    static char big[70000];
    CHECK_FAIL(async_fiber_sendto(cli, big, sizeof big, (struct sockaddr *)&sa, sl, 20000) == -1, ASYNC_E_TOOBIG);
    /* the socket is still usable */
    CHECK_EQ(async_fiber_sendto(cli, big, 1000, (struct sockaddr *)&sa, sl, 20000), 1000);
    CHECK_EQ(async_fiber_recvfrom(srv, big, sizeof big, NULL, NULL, 20000), 1000);
    CHECK_EQ(async_fiber_close(srv), 0);
    CHECK_EQ(async_fiber_close(cli), 0);
}

CASE(sendto_too_big) { // uring
    both_kinds(too_big);
}

static void bad_input(void *arg) {
    (void)arg;
    struct sockaddr_storage sa;
    socklen_t sl;
    int fd = udp_sock("127.0.0.1", &sa, &sl);
    char buf[8];
    socklen_t l = sizeof sa;
    CHECK_FAIL(async_fiber_recvfrom(fd, NULL, 4, NULL, NULL, 10) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_recvfrom(fd, buf, sizeof buf, (struct sockaddr *)&sa, NULL, 10) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_recvfrom(fd, buf, sizeof buf, NULL, NULL, -2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_recvfrom(fd, buf, (size_t)-1, NULL, NULL, 10) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_recvfrom(-1, buf, sizeof buf, (struct sockaddr *)&sa, &l, 10) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_sendto(fd, NULL, 4, (struct sockaddr *)&sa, sl, 10) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_sendto(fd, buf, 4, (struct sockaddr *)&sa, sl, -5) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_sendto(-1, buf, 4, (struct sockaddr *)&sa, sl, 10) == -1, ASYNC_E_BADFD);
    /* addr NULL on a socket that is not connected */
    CHECK_FAIL(async_fiber_sendto(fd, buf, 4, NULL, 0, 10) == -1, ASYNC_E_INVAL);
    /* not a socket */
    int p[2];
    CHECK_EQ(pipe(p), 0);
    CHECK_FAIL(async_fiber_recvfrom(p[0], buf, sizeof buf, NULL, NULL, 10) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_sendto(p[1], buf, 4, (struct sockaddr *)&sa, sl, 10) == -1, ASYNC_E_BADFD);
    close(p[0]);
    close(p[1]);
    CHECK_EQ(async_fiber_close(fd), 0);
    /* a closed number */
    CHECK_FAIL(async_fiber_recvfrom(fd, buf, sizeof buf, NULL, NULL, 10) == -1, ASYNC_E_BADFD);
}

CASE(datagram_bad_input) { // uring
    both_kinds(bad_input);
}

TEST_MAIN()
