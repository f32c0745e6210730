/* async_sockaddr_parse, async_fiber_listen and async_fiber_udp_bind: numeric
 * addresses (IPv4, IPv6 with brackets and scope, the wildcards) and bad
 * ones; a listener on port 0 (getsockname tells the port), non-blocking and
 * close-on-exec, owned on a fiber (its accepted connections too: closed
 * with async_fiber_close) and plain on a thread; an address in use; two
 * REUSEPORT listeners on one port; IPv6 on ::1 and the dual-stack default
 * against V6ONLY (skipped where the machine has no IPv6); bad input. The
 * I/O cases run on a fiber (epoll, and io_uring with the `uring` word) and
 * on a plain thread. Every wait is bounded. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "net.h"

static int port_of(int fd) {
    struct sockaddr_storage ss;
    socklen_t l = sizeof ss;
    CHECK_EQ(getsockname(fd, (struct sockaddr *)&ss, &l), 0);
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

static void addr_of(const char *host, int port, struct sockaddr_storage *ss, socklen_t *l) {
    CHECK_EQ(async_sockaddr_parse(host, port, ss, l), 0);
}

/* 1 if this machine can bind ::1 (else the IPv6 cases skip). */
static int have_ipv6(void) {
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_in6 a = {.sin6_family = AF_INET6};
    a.sin6_addr = in6addr_loopback;
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* 1 if fd is owned by some scheduler (async_fiber_fd_open says EXISTS);
 * a plain fd is owned by s by this look, and given back. */
static int is_owned(async_sched_t *s, int fd) {
    async_clear_error();
    if (async_fiber_fd_open(s, fd) == 0) {
        /* it was plain: owning it made it s's; the caller closes it with
         * async_fiber_close */
        return 0;
    }
    CHECK_ERR(ASYNC_E_EXISTS);
    return 1;
}

/* ---- async_sockaddr_parse ------------------------------------------------------ */

CASE(sockaddr_parse_forms) {
    struct sockaddr_storage ss;
    socklen_t l = 0;
    addr_of("127.0.0.1", 8080, &ss, &l);
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    CHECK_EQ(ss.ss_family, AF_INET);
    CHECK_EQ(l, sizeof(struct sockaddr_in));
    CHECK_EQ(ntohs(a4->sin_port), 8080);
    CHECK_EQ(ntohl(a4->sin_addr.s_addr), INADDR_LOOPBACK);
    /* NULL and "": the IPv4 wildcard */
    addr_of(NULL, 0, &ss, &l);
    CHECK_EQ(ss.ss_family, AF_INET);
    CHECK_EQ(a4->sin_addr.s_addr, htonl(INADDR_ANY));
    addr_of("", 65535, &ss, &l);
    CHECK_EQ(ss.ss_family, AF_INET);
    CHECK_EQ(ntohs(a4->sin_port), 65535);
    /* IPv6, bare and in brackets; the wildcard */
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    addr_of("::1", 443, &ss, &l);
    CHECK_EQ(ss.ss_family, AF_INET6);
    CHECK_EQ(l, sizeof(struct sockaddr_in6));
    CHECK_EQ(ntohs(a6->sin6_port), 443);
    CHECK(memcmp(&a6->sin6_addr, &in6addr_loopback, sizeof in6addr_loopback) == 0);
    addr_of("[::1]", 1, &ss, &l);
    CHECK_EQ(ss.ss_family, AF_INET6);
    CHECK(memcmp(&a6->sin6_addr, &in6addr_loopback, sizeof in6addr_loopback) == 0);
    addr_of("::", 2, &ss, &l);
    CHECK(memcmp(&a6->sin6_addr, &in6addr_any, sizeof in6addr_any) == 0);
    /* a scope: a number, or an interface name */
    addr_of("fe80::1%3", 2, &ss, &l);
    CHECK_EQ(a6->sin6_scope_id, 3);
    unsigned lo = if_nametoindex("lo");
    if (lo) {
        addr_of("[fe80::1%lo]", 2, &ss, &l);
        CHECK_EQ(a6->sin6_scope_id, lo);
    }
}

CASE(sockaddr_parse_bad) {
    struct sockaddr_storage ss;
    socklen_t l;
    const char *bad[] = {"localhost", "1.2.3", "256.1.1.1", "::1::2", "[::1", "::1]", "[]", "fe80::1%",
                         "fe80::1%no-such-if0", "1.2.3.4:80", " 1.2.3.4"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        l = 77;
        CHECK_FAIL(async_sockaddr_parse(bad[i], 80, &ss, &l) == -1, ASYNC_E_INVAL);
    }
    CHECK_FAIL(async_sockaddr_parse("127.0.0.1", 65536, &ss, &l) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sockaddr_parse("127.0.0.1", -1, &ss, &l) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sockaddr_parse("127.0.0.1", 80, NULL, &l) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sockaddr_parse("127.0.0.1", 80, &ss, NULL) == -1, ASYNC_E_INVAL);
}

/* ---- a listener on port 0 ---------------------------------------------------------- */

/* A client thread: connects to port and exchanges 4 bytes. */
static int client_port;
static void *client_main(void *arg) {
    (void)arg;
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(c >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)client_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    CHECK_EQ(write(c, "ping", 4), 4);
    char b[4];
    CHECK_EQ(read(c, b, 4), 4);
    CHECK(memcmp(b, "pong", 4) == 0);
    close(c);
    return NULL;
}

static async_sched_t *plain_probe; /* a scheduler of this process, to tell owned fds */

static void listen_serve(void *arg) {
    int fiber = arg != NULL;
    struct sockaddr_storage ss;
    socklen_t l;
    addr_of("127.0.0.1", 0, &ss, &l);
    int lfd = async_fiber_listen((struct sockaddr *)&ss, l, 0, 0);
    CHECK(lfd >= 0);
    client_port = port_of(lfd);
    CHECK(client_port > 0);
    CHECK(fcntl(lfd, F_GETFD) & FD_CLOEXEC);
    CHECK(fcntl(lfd, F_GETFL) & O_NONBLOCK);
    int one = 0;
    socklen_t ol = sizeof one;
    CHECK_EQ(getsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, &ol), 0);
    CHECK(one != 0);
    pthread_t t;
    start_thread(&t, client_main, NULL);
    int c = async_fiber_accept(lfd, NULL, NULL, 20000);
    CHECK(c >= 0);
    /* owned on a fiber (the listener and what it accepts), plain on a thread */
    CHECK_EQ(is_owned(plain_probe, lfd), fiber);
    CHECK_EQ(is_owned(plain_probe, c), fiber);
    char b[4];
    CHECK_EQ(async_fiber_read(c, b, 4, 20000), 4);
    CHECK(memcmp(b, "ping", 4) == 0);
    CHECK_EQ(async_fiber_write(c, "pong", 4, 20000), 4);
    join_within(t, 20000, "client");
    CHECK_EQ(async_fiber_close(c), 0);
    CHECK_EQ(async_fiber_close(lfd), 0);
}

static void listen_port0(int fiber) {
    plain_probe = sched_new(1);
    if (fiber) {
        async_sched_t *s = sched_new(2);
        on_fiber(s, listen_serve, (void *)1);
        async_sched_destroy(s);
    } else {
        listen_serve(NULL);
    }
    async_sched_destroy(plain_probe);
}

CASE(listen_port0_fiber) { listen_port0(1); } // uring
CASE(listen_port0_thread) { listen_port0(0); }

/* ---- address in use, REUSEPORT -------------------------------------------------------- */

static void in_use(void *arg) {
    (void)arg;
    struct sockaddr_storage ss;
    socklen_t l;
    addr_of("127.0.0.1", 0, &ss, &l);
    int a = async_fiber_listen((struct sockaddr *)&ss, l, 16, 0);
    CHECK(a >= 0);
    ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port_of(a));
    CHECK_FAIL(async_fiber_listen((struct sockaddr *)&ss, l, 16, 0) == -1, ASYNC_E_EXISTS);
    /* REUSEPORT on one of them only: still in use */
    CHECK_FAIL(async_fiber_listen((struct sockaddr *)&ss, l, 16, ASYNC_LISTEN_REUSEPORT) == -1, ASYNC_E_EXISTS);
    CHECK_EQ(async_fiber_close(a), 0);
    /* UDP: a port bound twice is in use too */
    addr_of("127.0.0.1", 0, &ss, &l);
    int u = async_fiber_udp_bind((struct sockaddr *)&ss, l, 0);
    CHECK(u >= 0);
    ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port_of(u));
    CHECK_FAIL(async_fiber_udp_bind((struct sockaddr *)&ss, l, 0) == -1, ASYNC_E_EXISTS);
    CHECK_EQ(async_fiber_close(u), 0);
}

CASE(listen_address_in_use) { on_fiber_then_thread(in_use); } // uring

/* Two REUSEPORT listeners on one port: both accept connections to it (the
 * kernel spreads them; each connection is accepted by exactly one). */
static void reuseport(void *arg) {
    (void)arg;
    struct sockaddr_storage ss;
    socklen_t l;
    addr_of("127.0.0.1", 0, &ss, &l);
    int a = async_fiber_listen((struct sockaddr *)&ss, l, 64, ASYNC_LISTEN_REUSEPORT);
    CHECK(a >= 0);
    int port = port_of(a);
    ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
    int b = async_fiber_listen((struct sockaddr *)&ss, l, 64, ASYNC_LISTEN_REUSEPORT);
    CHECK(b >= 0);
    CHECK_EQ(port_of(b), port);
    /* connections until each listener accepted one (bounded) */
    int got_a = 0, got_b = 0, cs[64], nc = 0;
    while ((!got_a || !got_b) && nc < 64) {
        int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(c >= 0);
        CHECK_EQ(async_fiber_connect(c, (struct sockaddr *)&ss, l, 20000), 0);
        cs[nc++] = c;
        int x = async_fiber_accept(a, NULL, NULL, 0);
        int y = x >= 0 ? -1 : async_fiber_accept(b, NULL, NULL, 2000);
        if (x < 0 && y < 0) y = async_fiber_accept(a, NULL, NULL, 2000);
        CHECK(x >= 0 || y >= 0);
        if (x >= 0) got_a = 1, async_fiber_close(x);
        else got_b = 1, async_fiber_close(y);
    }
    CHECK(got_a && got_b);
    for (int i = 0; i < nc; i++) close(cs[i]);
    CHECK_EQ(async_fiber_close(a), 0);
    CHECK_EQ(async_fiber_close(b), 0);
}

CASE(listen_reuseport_two_listeners) { on_fiber_then_thread(reuseport); } // uring linux

/* ---- IPv6 ------------------------------------------------------------------------- */

static void v6_loopback(void *arg) {
    (void)arg;
    struct sockaddr_storage ss;
    socklen_t l;
    addr_of("::1", 0, &ss, &l);
    int lfd = async_fiber_listen((struct sockaddr *)&ss, l, 0, 0);
    CHECK(lfd >= 0);
    ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port_of(lfd));
    int c = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(c >= 0);
    CHECK_EQ(async_fiber_connect(c, (struct sockaddr *)&ss, l, 20000), 0);
    struct sockaddr_storage peer;
    socklen_t pl = sizeof peer;
    int a = async_fiber_accept(lfd, (struct sockaddr *)&peer, &pl, 20000);
    CHECK(a >= 0);
    CHECK_EQ(peer.ss_family, AF_INET6);
    CHECK_EQ(async_fiber_write(c, "six", 3, 20000), 3);
    char b[3];
    CHECK_EQ(async_fiber_read(a, b, 3, 20000), 3);
    CHECK(memcmp(b, "six", 3) == 0);
    close(c);
    CHECK_EQ(async_fiber_close(a), 0);
    CHECK_EQ(async_fiber_close(lfd), 0);
}

CASE(listen_ipv6_loopback) { // uring
    if (!have_ipv6()) {
        printf("no IPv6 on this machine: skipped\n");
        return;
    }
    on_fiber_then_thread(v6_loopback);
}

/* "::" without V6ONLY takes IPv4 too (dual-stack); with V6ONLY, IPv4 is refused. */
static void v6_dual(void *arg) {
    (void)arg;
    for (int v6only = 0; v6only < 2; v6only++) {
        struct sockaddr_storage ss;
        socklen_t l;
        addr_of("::", 0, &ss, &l);
        int lfd = async_fiber_listen((struct sockaddr *)&ss, l, 0, v6only ? ASYNC_LISTEN_V6ONLY : 0);
        CHECK(lfd >= 0);
        int on = -1;
        socklen_t ol = sizeof on;
        CHECK_EQ(getsockopt(lfd, IPPROTO_IPV6, IPV6_V6ONLY, &on, &ol), 0);
        CHECK_EQ(on != 0, v6only);
        struct sockaddr_storage v4;
        socklen_t l4;
        addr_of("127.0.0.1", port_of(lfd), &v4, &l4);
        int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(c >= 0);
        async_clear_error();
        int r = async_fiber_connect(c, (struct sockaddr *)&v4, l4, 20000);
        if (v6only) {
            CHECK_EQ(r, -1);
            CHECK_ERR(ASYNC_E_CLOSED);
        } else {
            CHECK_EQ(r, 0);
            int a = async_fiber_accept(lfd, NULL, NULL, 20000);
            CHECK(a >= 0);
            CHECK_EQ(async_fiber_close(a), 0);
        }
        close(c);
        CHECK_EQ(async_fiber_close(lfd), 0);
    }
}

CASE(listen_dual_stack_and_v6only) { // uring
    if (!have_ipv6()) {
        printf("no IPv6 on this machine: skipped\n");
        return;
    }
    on_fiber_then_thread(v6_dual);
}

/* ---- bad input --------------------------------------------------------------------------- */

static void bad_input(void *arg) {
    (void)arg;
    struct sockaddr_storage ss;
    socklen_t l;
    addr_of("127.0.0.1", 0, &ss, &l);
    CHECK_FAIL(async_fiber_listen(NULL, l, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_listen((struct sockaddr *)&ss, l - 1, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_listen((struct sockaddr *)&ss, 0, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_listen((struct sockaddr *)&ss, l, 0, 0x100) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_udp_bind(NULL, l, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_udp_bind((struct sockaddr *)&ss, 2, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_udp_bind((struct sockaddr *)&ss, l, 0x4) == -1, ASYNC_E_INVAL);
    struct sockaddr_storage v6;
    socklen_t l6;
    addr_of("::1", 0, &v6, &l6);
    CHECK_FAIL(async_fiber_listen((struct sockaddr *)&v6, (socklen_t)sizeof(struct sockaddr_in), 0, 0) == -1,
               ASYNC_E_INVAL);
    /* a family other than AF_INET / AF_INET6 */
    struct sockaddr_storage un;
    memset(&un, 0, sizeof un);
    un.ss_family = AF_UNIX;
    CHECK_FAIL(async_fiber_listen((struct sockaddr *)&un, sizeof un, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_udp_bind((struct sockaddr *)&un, sizeof un, 0) == -1, ASYNC_E_INVAL);
}

CASE(listen_bad_input) { on_fiber_then_thread(bad_input); }

TEST_MAIN()
