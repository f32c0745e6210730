/* A fiber echo server soaked by many connections (stress): every echo
 * intact and every connection served, and after the warm-up the process's
 * open descriptors and resident memory stay flat. Runs for
 * ASYNC_STRESS_SECONDS (default 3) with ASYNC_SOAK_CONNS connections;
 * scripts/soak.sh runs it for minutes with 10000. */
#include "check.h"
#include "proc.h"
#include "rt.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>

/* --- fiber echo soak: connections held open, fd count and RSS flat ------------ */
/*
 * ASYNC_SOAK_CONNS connections (default 500; scripts/soak.sh uses 10000) to
 * an echo server of one fiber per connection in this process, for the
 * case's time. The clients run as fibers in a second process (this binary,
 * case echo_clients, started with posix_spawn), so each side needs only one
 * descriptor per connection. Each client sends a message of random length
 * (1..256 bytes), reads it back, checks it, sleeps 0..49 ms and repeats.
 * This (server) process samples its VmRSS and open fds every 200 ms.
 * Checked: every echo intact and every connection served; once all
 * connections are up and a quarter of the time has passed (warm-up), the fd
 * count never rises above that baseline + 8 and RSS never above
 * baseline + max(baseline / 4, 16 MiB).
 */

static struct {
    async_sched_t *s;
    int lfd, nconn;
    struct sockaddr_in addr;
    double deadline;
    atomic_int accepted, served, failures;
    _Atomic uint64_t echoed, echoes;
} es;

/* The connection count both sides use: ASYNC_SOAK_CONNS, scaled down to what
 * RLIMIT_NOFILE allows. */
static int es_conns(void)
{
    const char *nc = getenv("ASYNC_SOAK_CONNS");
    int n = nc && *nc ? atoi(nc) : 500, fds;
    CHECK(n >= 1);
    fds = raise_nofile(n + 256);
    if (fds < n + 256) {
        n = fds - 256;
        printf("RLIMIT_NOFILE %d: scaled to %d connections\n", fds, n);
        CHECK(n >= 100);
    }
    return n;
}

static void es_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char buf[512];
    for (;;) {
        ssize_t n = async_fiber_read(fd, buf, sizeof buf, -1);
        if (n <= 0)
            break;
        if (async_fiber_write(fd, buf, (size_t)n, -1) != n) {
            atomic_fetch_add(&es.failures, 1);
            break;
        }
        atomic_fetch_add(&es.echoed, (uint64_t)n);
    }
    close(fd);
    atomic_fetch_add(&es.served, 1);
}

static void es_acceptor(void *arg)
{
    int i;
    (void)arg;
    for (i = 0; i < es.nconn; i++) {
        int fd = async_fiber_accept(es.lfd, NULL, NULL, 60000);
        if (fd < 0) {
            fprintf(stderr, "accept: %s\n", async_strerror(async_last_error()));
            atomic_fetch_add(&es.failures, 1);
            return;
        }
        CHECK(async_fiber_spawn(es.s, es_conn, (void *)(intptr_t)fd, 0));
        atomic_fetch_add(&es.accepted, 1);
    }
}

static void es_client(void *arg)
{
    uint32_t id = (uint32_t)(uintptr_t)arg, m = 0;
    char out[256], in[256];
    rng_t r;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    rng_init(&r, 6000 + id);
    if (fd < 0 || async_fiber_connect(fd, (struct sockaddr *)&es.addr, sizeof es.addr, 60000) != 0) {
        fprintf(stderr, "connect: %s\n", async_strerror(async_last_error()));
        atomic_fetch_add(&es.failures, 1);
        if (fd >= 0)
            close(fd);
        return;
    }
    while (now_ms() < es.deadline) {
        size_t len = 1 + rng_below(&r, sizeof out), i, got = 0;
        for (i = 0; i < len; i++)
            out[i] = (char)(id * 31u + m * 7u + (uint32_t)i);
        if (async_fiber_write(fd, out, len, 30000) != (ssize_t)len)
            goto fail;
        while (got < len) {
            ssize_t n = async_fiber_read(fd, in + got, len - got, 30000);
            if (n <= 0)
                goto fail;
            got += (size_t)n;
        }
        if (memcmp(in, out, len) != 0)
            goto fail;
        atomic_fetch_add(&es.echoes, 1);
        m++;
        if (async_fiber_sleep(rng_below(&r, 50)) != 0)
            goto fail;
    }
    close(fd);
    return;
fail:
    fprintf(stderr, "client %u failed at message %u: %s\n", id, m, async_strerror(async_last_error()));
    atomic_fetch_add(&es.failures, 1);
    close(fd);
}

/* Not a ctest case: the client side of echo_soak, in its own process.
 * ASYNC_ECHO_PORT names the server's port; ASYNC_ECHO_END_MS how long to run. */
CHILD(echo_clients)
{
    const char *port = getenv("ASYNC_ECHO_PORT"), *ms = getenv("ASYNC_ECHO_END_MS");
    int i;
    CHECK(port && ms);
    g_seed = (uint64_t)getpid();
    es.nconn = es_conns();
    es.deadline = now_ms() + atof(ms);
    es.addr.sin_family = AF_INET;
    es.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    es.addr.sin_port = htons((uint16_t)atoi(port));
    es.s = async_sched_create(NULL);
    CHECK(es.s != NULL);
    for (i = 0; i < es.nconn; i++)
        CHECK(async_fiber_spawn(es.s, es_client, (void *)(uintptr_t)i, 0));
    CHECK_EQ(async_sched_run(es.s), 0);
    printf("echo_clients: %d connections, %llu echoes checked, %d failures\n", es.nconn,
           (unsigned long long)atomic_load(&es.echoes), atomic_load(&es.failures));
    CHECK_EQ(atomic_load(&es.failures), 0);
    CHECK(atomic_load(&es.echoes) >= (uint64_t)es.nconn);
    async_sched_destroy(es.s);
}

extern char **environ;

CASE(echo_soak) // stress
{
    double start = now_ms(), deadline = stress_begin("echo_soak"), warm, next_sample;
    long rss0 = 0, rss_max = 0, rss_first;
    int fd0 = 0, fd_max = 0, one = 1, status = 0;
    socklen_t al = sizeof es.addr;
    char self[4096], port[16], end_ms[32], *argv[3];
    ssize_t len;
    pid_t child, r;
    es.nconn = es_conns();
    es.deadline = deadline;
    warm = start + (deadline - start) / 4;
    es.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(es.lfd >= 0);
    setsockopt(es.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    es.addr.sin_family = AF_INET;
    es.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(es.lfd, (struct sockaddr *)&es.addr, sizeof es.addr), 0);
    CHECK_EQ(getsockname(es.lfd, (struct sockaddr *)&es.addr, &al), 0);
    CHECK_EQ(listen(es.lfd, 4096), 0);
    /* the clients: this binary again, in a new process */
    len = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(len > 0);
    self[len] = 0;
    snprintf(port, sizeof port, "%u", (unsigned)ntohs(es.addr.sin_port));
    snprintf(end_ms, sizeof end_ms, "%.0f", deadline - now_ms());
    CHECK_EQ(setenv("ASYNC_ECHO_PORT", port, 1), 0);
    CHECK_EQ(setenv("ASYNC_ECHO_END_MS", end_ms, 1), 0);
    fflush(stdout);
    {
        /* Under qemu-user (no binfmt) this binary can only be started
         * through the emulator: ASYNC_TEST_EMULATOR names it. */
        const char *emu = getenv("ASYNC_TEST_EMULATOR");
        char *eargv[4] = {(char *)emu, self, (char *)"echo_clients", NULL};
        argv[0] = self;
        argv[1] = (char *)"echo_clients";
        argv[2] = NULL;
        if (emu && *emu)
            CHECK_EQ(posix_spawnp(&child, emu, NULL, NULL, eargv, environ), 0);
        else
            CHECK_EQ(posix_spawn(&child, self, NULL, NULL, argv, environ), 0);
    }
    es.s = async_sched_create(NULL);
    CHECK(es.s != NULL);
    rss_first = rss_kb();
    CHECK(async_fiber_spawn(es.s, es_acceptor, NULL, 0));
    /* sample while the clients run (this thread does not run fibers) */
    next_sample = now_ms();
    while ((r = waitpid(child, &status, WNOHANG)) == 0) {
        double now = now_ms();
        if (now > deadline + 120000) {
            kill(child, SIGKILL);
            CHECK(!"the client process hung");
        }
        if (now >= next_sample) {
            long rss = rss_kb();
            int n = fd_count();
            next_sample = now + 200;
            if (rss0 == 0 && now >= warm && now < deadline && atomic_load(&es.accepted) == es.nconn) {
                rss0 = rss;
                fd0 = n;
                printf("echo_soak: baseline after warm-up: %d fds, RSS %ld KiB (%ld KiB before start)\n", fd0, rss0,
                       rss_first);
            } else if (rss0 != 0 && now < deadline) {
                if (rss > rss_max)
                    rss_max = rss;
                if (n > fd_max)
                    fd_max = n;
            }
        }
        sleep_ms(20);
    }
    CHECK_EQ(r, child);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0); /* the clients checked every echo */
    CHECK_EQ(async_sched_run(es.s), 0);
    printf("echo_soak: %d connections, %d served, %llu bytes echoed; after warm-up max %d fds (baseline %d), max "
           "RSS %ld KiB (baseline %ld)\n",
           es.nconn, atomic_load(&es.served), (unsigned long long)atomic_load(&es.echoed), fd_max, fd0, rss_max,
           rss0);
    CHECK_EQ(atomic_load(&es.failures), 0);
    CHECK_EQ(atomic_load(&es.served), es.nconn);
    CHECK(rss0 > 0); /* a baseline was taken */
    CHECK(fd_max <= fd0 + 8);
    CHECK(rss_max <= rss0 + (rss0 / 4 > 16384 ? rss0 / 4 : 16384));
    close(es.lfd);
    async_sched_destroy(es.s);
}

TEST_MAIN()
