/* Fiber I/O on datagram and packet descriptors: UDP (an empty datagram, one
 * larger than the buffer, a connected socket after an ICMP error, an error
 * the read does not clear), unix datagram and seqpacket sockets and
 * packet-mode pipes, owned and plain: a short read never makes the next
 * read park on data that is there. Every wait is bounded. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>

#include "check.h"
#include "net.h"

/* ---- a connected UDP socket after one ICMP error ------------------ */

typedef struct {
    int fd;
    ssize_t first;
    int first_err;
    steps_t st;
} udp_t;

static void udp_reader(void *arg) {
    udp_t *x = arg;
    char buf[64];
    /* 1: parked when the ICMP error comes (main thread sends): the read
     * reports the refusal */
    async_clear_error();
    x->first = async_fiber_read(x->fd, buf, sizeof buf, 10000);
    x->first_err = async_last_error();
    if (x->first != -1 || x->first_err != ASYNC_E_CLOSED) goto end;
    x->st.step = 1;
    /* 2: the error was reported; nothing else comes: a read times out */
    async_clear_error();
    if (async_fiber_read(x->fd, buf, sizeof buf, 50) != -1 || async_last_error() != ASYNC_E_TIMEDOUT) goto end;
    x->st.step = 2;
    /* 3: and the worker still ran the counter while this read waited */
    long c0 = atomic_load(&x->st.cnt.count);
    for (int i = 0; i < 200 && atomic_load(&x->st.cnt.count) == c0; i++) {
        async_clear_error();
        if (async_fiber_read(x->fd, buf, sizeof buf, 5) != -1 || async_last_error() != ASYNC_E_TIMEDOUT) goto end;
    }
    if (atomic_load(&x->st.cnt.count) == c0) goto end;
    x->st.step = 3;
end:
    steps_end(&x->st);
}

static void udp_run(int recverr) {
    /* a loopback port nobody listens on: bind one, note it, close it */
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    int tmp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHECK(tmp >= 0);
    CHECK_EQ(bind(tmp, (struct sockaddr *)&a, sizeof a), 0);
    CHECK_EQ(getsockname(tmp, (struct sockaddr *)&a, &al), 0);
    close(tmp);
    static udp_t x;
    x.fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHECK(x.fd >= 0);
    CHECK_EQ(connect(x.fd, (struct sockaddr *)&a, sizeof a), 0);
    /* IP_RECVERR: the ICMP error also goes to the error queue, which keeps
     * the socket reporting EPOLLERR while recv() says EAGAIN */
    if (recverr) CHECK_EQ(setsockopt(x.fd, IPPROTO_IP, IP_RECVERR, &recverr, sizeof recverr), 0);

    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, counter_fiber, &x.st.cnt, 0));
    spawn_until_parked(s, udp_reader, &x, 2);
    CHECK_EQ(send(x.fd, "ping", 4, 0), 4); /* -> ICMP port unreachable */
    wait_flag(&x.st.done, 20000, "udp_icmp");
    if (x.st.step != 3)
        fprintf(stderr, "first read %zd, %s\n", x.first, async_strerror(x.first_err));
    steps_wait(&x.st, 3, 20000, "udp_icmp");
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    if (recverr) {
        /* the condition was there all along: wait_fd reports it */
        int ev = async_fiber_wait_fd(x.fd, ASYNC_EVENT_READ, 1000);
        CHECK(ev > 0 && (ev & ASYNC_EVENT_ERROR));
    }
    close(x.fd);
}

CASE(udp_icmp) { udp_run(0); } // uring

/* The socket keeps reporting an error its read does not clear: each read
 * still times out on time, and the worker runs the counter meanwhile. */
CASE(udp_recverr) { udp_run(1); } // uring

/* ---- datagrams ------------------------------------------------------------------------- */

/* An empty datagram is read as 0 bytes and the socket goes on: the next
 * datagram is read whole; a datagram larger than buf is truncated to n. */
static void udp_body(void *arg) {
    (void)arg;
    int u[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, u), 0);
    char b[16];
    CHECK_EQ(send(u[1], "", 0, 0), 0);
    CHECK_EQ(send(u[1], "abcdef", 6, 0), 6);
    CHECK_EQ(async_fiber_read(u[0], b, sizeof b, 1000), 0);
    CHECK_EQ(async_fiber_read(u[0], b, 3, 1000), 3);
    CHECK(memcmp(b, "abc", 3) == 0);
    CHECK_FAIL(async_fiber_read(u[0], b, sizeof b, 30) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(async_fiber_write(u[0], "xyz", 3, 1000), 3);
    CHECK_EQ(recv(u[1], b, sizeof b, 0), 3);
    close_pair(u);
    /* an unconnected UDP socket: write has no destination */
    int d = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    async_clear_error();
    CHECK(async_fiber_write(d, "x", 1, 100) == -1);
    printf("unconnected udp write -> err %d os %d\n", async_last_error(), async_last_os_error());
    CHECK(async_last_error() != ASYNC_E_TIMEDOUT);
    close(d);
}

CASE(udp_empty_and_truncated) { // uring adversarial
    on_fiber_then_thread(udp_body);
}

/* ---- non-socket fds and datagram sockets ---- */

static int nk_fd[2];

static atomic_int nk_done;

static void dgram_reader(void *arg)
{
    (void)arg;
    char buf[100];
    for (int i = 0; i < 3; i++) {
        ssize_t n = async_fiber_read(nk_fd[1], buf, sizeof buf, BOUND_MS);
        CHECK_EQ(n, 10 + i);
        for (int k = 0; k < n; k++)
            CHECK_EQ(buf[k], 'a' + i);
    }
    atomic_fetch_add(&nk_done, 1);
}

/* Three datagrams queued before the reader runs: each short read must not
 * make the next read park on data that is there (owned: edge-triggered). */
static void dgram_case(int kind, int owned, int plain_thread)
{
    async_sched_t *s = sched_new(2);
    atomic_store(&nk_done, 0);
    if (kind == 0)
        CHECK_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, nk_fd), 0);
    else if (kind == 1)
        CHECK_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, nk_fd), 0);
    else {
        int p[2];
        CHECK_EQ(pipe2(p, O_CLOEXEC | O_DIRECT), 0);
        nk_fd[0] = p[1];
        nk_fd[1] = p[0];
    }
    own_if(s, nk_fd[1], owned);
    for (int i = 0; i < 3; i++) {
        char m[16];
        memset(m, 'a' + i, sizeof m);
        CHECK_EQ(write(nk_fd[0], m, (size_t)(10 + i)), 10 + i);
    }
    if (plain_thread)
        dgram_reader(NULL);
    else
        CHECK(async_fiber_spawn(s, dgram_reader, NULL, 0) != NULL);
    wait_count(&nk_done, 1, "datagram reader");
    sched_finish(s, BOUND_MS);
    close_pair(nk_fd);
}

CASE(dgram_unix_owned) { dgram_case(0, 1, 0); } // uring adversarial

CASE(dgram_seqpacket_owned) { dgram_case(1, 1, 0); } // uring adversarial

CASE(dgram_packet_pipe_owned) { dgram_case(2, 1, 0); } // uring adversarial

CASE(dgram_packet_pipe_plain) { dgram_case(2, 0, 1); } // uring adversarial

CASE(dgram_seqpacket_fiber) { dgram_case(1, 0, 0); } // uring adversarial

TEST_MAIN()
