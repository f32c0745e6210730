/* 10,000 loopback connections held open at once, each echoing 100 lines:
 * the server is one fiber per connection on owned descriptors, framing its
 * input with the buffered reader; the clients are fibers in a second
 * process (this binary, case echo_10k_clients), so each process needs one
 * descriptor per connection. Every client sends its lines in bursts of 1 to
 * 8 (several frames in one read on the server), reads each echo with a
 * reader of its own and compares it with what it sent. Checked: every
 * connection made and served, every line echoed unchanged and in order,
 * the server echoed exactly 1,000,000 lines and closed every descriptor it
 * accepted. Both processes raise RLIMIT_NOFILE's soft limit to the hard
 * one; the case is skipped when the hard limit is too low for 10,000
 * connections. */
#include "check.h"
#include "net.h"
#include "proc.h"

#include <sys/resource.h>

/* TSan keeps a context of its own for every fiber, and 10k of them in a
 * process pass its limit of 8128 threads: the TSan build runs 500
 * connections. */
#define CONNS (ASYNC_TEST_TSAN ? 500 : 10000)
#define MSGS 100
#define BURST_MAX 8
#define MAX_LINE 512
#define FD_MARGIN 256
#define IO_TIMEOUT_MS 120000

/* Raises the soft descriptor limit to the hard one; returns the new soft
 * limit. */
static long nofile_to_hard(void)
{
    struct rlimit rl;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
    return rl.rlim_cur == RLIM_INFINITY ? (long)1 << 30 : (long)rl.rlim_cur;
}

/* ---- the server: one fiber per connection ------------------------------------ */

static struct {
    async_sched_t *s;
    int lfd;
    atomic_int accepted, served, failures;
    atomic_long lines;
} srv;

static void srv_fail(const char *what)
{
    fprintf(stderr, "server %s: %s\n", what, async_strerror(async_last_error()));
    atomic_fetch_add(&srv.failures, 1);
}

/* Echoes every line of the connection until its end of file, then closes
 * it. */
static void srv_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    long lines = 0;
    async_reader_t *r = async_reader_create(fd, MAX_LINE);
    if (!r) {
        srv_fail("reader");
        async_fiber_close(fd);
        return;
    }
    for (;;) {
        const char *line;
        ssize_t n = async_reader_read_until(r, '\n', &line, -1);
        if (n == 0)
            break;
        if (n < 0) {
            srv_fail("read");
            break;
        }
        if (async_fiber_write(fd, line, (size_t)n, IO_TIMEOUT_MS) != n) {
            srv_fail("write");
            break;
        }
        lines++;
    }
    async_reader_destroy(r);
    if (async_fiber_close(fd) != 0)
        srv_fail("close");
    atomic_fetch_add(&srv.lines, lines);
    atomic_fetch_add(&srv.served, 1);
}

static void srv_acceptor(void *arg)
{
    (void)arg;
    for (int i = 0; i < CONNS; i++) {
        int fd = async_fiber_accept(srv.lfd, NULL, NULL, IO_TIMEOUT_MS);
        if (fd < 0) {
            srv_fail("accept");
            return;
        }
        /* accepted from an owned listener on a fiber: owned already */
        if (async_fiber_fd_open(NULL, fd) != -1 || async_last_error() != ASYNC_E_EXISTS)
            srv_fail("ownership of an accepted descriptor");
        if (!async_fiber_spawn(srv.s, srv_conn, (void *)(intptr_t)fd, 0)) {
            srv_fail("spawn");
            async_fiber_close(fd);
            return;
        }
        atomic_fetch_add(&srv.accepted, 1);
    }
}

/* ---- the clients (second process) ------------------------------------------- */

static struct {
    struct sockaddr_in addr;
    async_chan_t *connecting; /* a token per connect in progress: bounds the SYN burst */
    async_chan_t *go;         /* closed once every client has connected */
    atomic_int connected, done, failures;
    atomic_long lines;
} cli;

/* Line `seq` of client id, with its '\n': a header naming both and a
 * payload of 0..300 bytes that depends on both. */
static size_t make_line(char *out, unsigned id, unsigned seq)
{
    uint32_t h = (id + 1) * 2654435761u ^ (seq + 1) * 40503u;
    int n = snprintf(out, MAX_LINE, "c%u m%u ", id, seq);
    size_t len = (size_t)n, pay = (h >> 7) % 301;
    for (size_t i = 0; i < pay; i++) {
        h = h * 1103515245u + 12345u;
        out[len++] = (char)(' ' + (h >> 16) % 95);
    }
    out[len++] = '\n';
    return len;
}

static void cli_fail(unsigned id, const char *what)
{
    fprintf(stderr, "client %u %s: %s\n", id, what, async_strerror(async_last_error()));
    atomic_fetch_add(&cli.failures, 1);
}

/* Connects (at most 256 connects in flight), then counts itself connected;
 * the last one opens the gate. -1 (counted) if the connect failed. */
static int cli_connect(unsigned id)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), rc = -1;
    char token = 0;
    if (fd < 0) {
        fprintf(stderr, "client %u socket: %s\n", id, strerror(errno));
        atomic_fetch_add(&cli.failures, 1);
    } else if (async_chan_send(cli.connecting, &token, IO_TIMEOUT_MS) != 0) {
        cli_fail(id, "connect token");
    } else {
        rc = async_fiber_connect(fd, (struct sockaddr *)&cli.addr, sizeof cli.addr, IO_TIMEOUT_MS);
        if (rc != 0)
            cli_fail(id, "connect");
        CHECK_EQ(async_chan_recv(cli.connecting, &token, 0), 0);
    }
    if (atomic_fetch_add(&cli.connected, 1) + 1 == CONNS)
        async_chan_close(cli.go);
    if (rc != 0 && fd >= 0)
        close(fd);
    return rc == 0 ? fd : -1;
}

/* Sends lines [seq, seq + k) in one write and checks their echoes. */
static int cli_burst(unsigned id, int fd, async_reader_t *r, unsigned seq, unsigned k)
{
    char out[BURST_MAX * MAX_LINE], want[MAX_LINE];
    size_t len = 0;
    for (unsigned j = 0; j < k; j++)
        len += make_line(out + len, id, seq + j);
    if (async_fiber_write(fd, out, len, IO_TIMEOUT_MS) != (ssize_t)len) {
        cli_fail(id, "write");
        return -1;
    }
    for (unsigned j = 0; j < k; j++) {
        const char *line;
        size_t wl = make_line(want, id, seq + j);
        ssize_t n = async_reader_read_until(r, '\n', &line, IO_TIMEOUT_MS);
        if (n != (ssize_t)wl || memcmp(line, want, wl) != 0) {
            fprintf(stderr, "client %u line %u: got %zd bytes, want %zu (%s)\n", id, seq + j, n, wl,
                    n < 0 ? async_strerror(async_last_error()) : "changed");
            atomic_fetch_add(&cli.failures, 1);
            return -1;
        }
    }
    return 0;
}

static void cli_fiber(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg, seq = 0;
    int fd = cli_connect(id);
    async_reader_t *r = NULL;
    if (fd < 0)
        goto out;
    /* every connection is open before the first line goes out */
    if (async_chan_recv(cli.go, NULL, IO_TIMEOUT_MS) != -1 || async_last_error() != ASYNC_E_CLOSED) {
        cli_fail(id, "gate");
        goto out;
    }
    r = async_reader_create(fd, MAX_LINE);
    if (!r) {
        cli_fail(id, "reader");
        goto out;
    }
    while (seq < MSGS) {
        unsigned k = 1 + (id * 7u + seq * 13u) % BURST_MAX;
        if (k > MSGS - seq)
            k = MSGS - seq;
        if (cli_burst(id, fd, r, seq, k) != 0)
            goto out;
        seq += k;
    }
    atomic_fetch_add(&cli.lines, MSGS);
    /* the server's end of file; nothing more may come */
    const char *line;
    if (shutdown(fd, SHUT_WR) != 0 || async_reader_read_until(r, '\n', &line, IO_TIMEOUT_MS) != 0)
        cli_fail(id, "end of file");
out:
    async_reader_destroy(r);
    if (fd >= 0)
        close(fd);
    atomic_fetch_add(&cli.done, 1);
}

/* Not a ctest case: the client side of echo_10k_connections, run in its
 * own process. ASYNC_ECHO_PORT names the server's port. */
CHILD(echo_10k_clients)
{
    const char *port = getenv("ASYNC_ECHO_PORT");
    CHECK(port != NULL);
    CHECK(nofile_to_hard() >= CONNS + FD_MARGIN);
    cli.addr.sin_family = AF_INET;
    cli.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cli.addr.sin_port = htons((uint16_t)atoi(port));
    cli.connecting = async_chan_create(256, 1);
    cli.go = async_chan_create(1, 1);
    CHECK(cli.connecting && cli.go);
    async_sched_t *s = async_sched_create(NULL);
    CHECK(s != NULL);
    for (unsigned i = 0; i < CONNS; i++)
        CHECK(async_fiber_spawn(s, cli_fiber, (void *)(uintptr_t)i, 0) != NULL);
    wait_count_within(&cli.done, CONNS, 600000, "clients done");
    printf("clients: %d connected, %ld lines echoed intact, %d failures\n", atomic_load(&cli.connected),
           atomic_load(&cli.lines), atomic_load(&cli.failures));
    CHECK_EQ(atomic_load(&cli.failures), 0);
    CHECK_EQ(atomic_load(&cli.lines), (long)CONNS * MSGS);
    sched_finish(s, 10000);
    async_chan_destroy(cli.connecting);
    async_chan_destroy(cli.go);
}

CASE(echo_10k_connections) // stress uring timeout=900
{
    long lim = nofile_to_hard();
    if (lim < CONNS + FD_MARGIN) {
        printf("skipped: RLIMIT_NOFILE hard limit %ld, %d connections need %d descriptors per process\n", lim, CONNS,
               CONNS + FD_MARGIN);
        return;
    }
    struct sockaddr_in a;
    char env[64];
    double t0 = now_ms();
    int fds0 = fd_count();
    srv.lfd = loopback_listener(4096, &a);
    srv.s = sched_new(0);
    CHECK_EQ(async_fiber_fd_open(srv.s, srv.lfd), 0);
    CHECK(async_fiber_spawn(srv.s, srv_acceptor, NULL, 0) != NULL);
    snprintf(env, sizeof env, "ASYNC_ECHO_PORT=%u", (unsigned)ntohs(a.sin_port));
    int st = run_self_case("echo_10k_clients", env);
    /* the clients closed their ends: every connection fiber sees its end
     * of file and closes its descriptor */
    wait_count_within(&srv.served, atomic_load(&srv.accepted), 60000, "connections served");
    printf("server: %d accepted, %d served, %ld lines echoed, %d failures, %.1f s\n", atomic_load(&srv.accepted),
           atomic_load(&srv.served), atomic_load(&srv.lines), atomic_load(&srv.failures), (now_ms() - t0) / 1000);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
    CHECK_EQ(atomic_load(&srv.failures), 0);
    CHECK_EQ(atomic_load(&srv.accepted), CONNS);
    CHECK_EQ(atomic_load(&srv.served), CONNS);
    CHECK_EQ(atomic_load(&srv.lines), (long)CONNS * MSGS);
    sched_finish(srv.s, 10000);
    CHECK_EQ(async_fiber_close(srv.lfd), 0);
    CHECK(fd_count() < fds0 + 16); /* every accepted descriptor was closed */
}

TEST_MAIN()
