/*
 * TCP echo client for the echo rows: starts a server program (echo_async,
 * echo_epoll, echo_uring, echo_uv or go_echo, from this program's directory), opens
 * `conns` loopback connections to it and makes every connection do
 * `round_trips` round trips of one `msg_size`-byte message at a time (send,
 * wait for the whole echo, check it, send the next), all connections at once
 * from one epoll loop.
 *
 * Connections are opened in batches of 500; each batch does one untimed
 * warm-up round trip before the next is opened (so the server's accept queue
 * never overflows and every connection is set up on both sides before the
 * clock starts). The timed phase then measures:
 *   cpu_us_per_rt: CPU time the server process used during the timed phase
 *                  (sum of /proc/<pid>/task/<tid>/schedstat run time over its
 *                  threads, ns resolution) / round trips; cpu_stat_us_per_rt
 *                  is the same from utime+stime of /proc/<pid>/stat (10 ms
 *                  ticks) as a cross-check, server_user_us_per_rt its utime
 *                  alone (the server's own code, not the kernel's);
 *   server_sleeps, client_sleeps: voluntary context switches of the server's
 *                  threads and of this client (on loopback a send runs the
 *                  receiver's input path and its wake-up: see
 *                  docs/PERFORMANCE.md, "What the numbers say about TCP echo");
 *   server_preempted: involuntary context switches of the server's threads
 *                  (the CPU taken from them, by the client among others);
 *   p50_us, p99_us: round-trip latency seen by the client (send to last byte
 *                  of the echo), over every round trip;
 *   rt_per_s:      round trips per second;
 *   server_io:     which kernel interface the server waited with, seen from
 *                  outside at the end of the timed phase: "uring" if it holds
 *                  an io_uring instance (an anon_inode:[io_uring] descriptor in
 *                  /proc/<pid>/fd), else "epoll" if it holds an epoll
 *                  descriptor, else "other" (uring_fds=, epoll_fds= count
 *                  them). This tells which I/O path a server that can use
 *                  either really took, without asking the server.
 * Every echo is compared byte for byte with what was sent (content depends on
 * connection and sequence number); any mismatch, stall (10 s without
 * progress) or early server exit prints ok=0. Connections are closed with
 * SO_LINGER 0 (no TIME_WAIT left behind), then the server gets SIGTERM.
 * The server dies with the client (PR_SET_PDEATHSIG) if the client is killed.
 * RLIMIT_NOFILE is raised to its hard limit (the server inherits it); if that
 * is too low for `conns`, conns is reduced and the line says so (conns=).
 *
 * usage: tcp_client conns round_trips msg_size server [server args...]
 */
#include "bench.h"

#include <sched.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define BATCH 500

typedef struct {
    int fd;
    uint32_t done, got;
    uint64_t sent_at;
} conn_t;

static conn_t *cs;
static uint8_t *rbuf; /* msg bytes per connection */
static size_t msg;
static int ep;
static pid_t server;
static uint64_t *samples;
static size_t nsamples;

/* SIGTERM, and SIGKILL if the server is still there 2 s later. */
static void kill_server(void) {
    if (server <= 0) return;
    kill(server, SIGTERM);
    for (int i = 0; i < 200 && waitpid(server, NULL, WNOHANG) == 0; i++) sleep_us(10000);
    if (waitpid(server, NULL, WNOHANG) == 0) {
        kill(server, SIGKILL);
        waitpid(server, NULL, 0);
    }
    server = 0;
}

#define DIE(...)                \
    do {                        \
        kill_server();          \
        FAIL(__VA_ARGS__);      \
    } while (0)

static void fill(uint8_t *p, uint32_t conn, uint32_t seq) {
    memcpy(p, &conn, msg < 4 ? msg : 4);
    if (msg >= 8) memcpy(p + 4, &seq, 4);
    for (size_t j = msg < 8 ? msg : 8; j < msg; j++) p[j] = (uint8_t)(conn * 31u + seq * 7u + j);
}

static void send_msg(uint32_t i) {
    uint8_t m[4096];
    fill(m, i, cs[i].done);
    cs[i].sent_at = now_ns();
    ssize_t w = send(cs[i].fd, m, msg, MSG_NOSIGNAL);
    if (w != (ssize_t)msg) DIE("send on connection %u: %s", i, w < 0 ? strerror(errno) : "short write");
}

/* Every connection in [lo, hi) does `rts` more round trips. */
static void run_phase(uint32_t lo, uint32_t hi, uint32_t rts, int record) {
    static struct epoll_event evs[1024];
    uint8_t want[4096];
    uint32_t remaining = hi - lo;
    for (uint32_t i = lo; i < hi; i++) {
        cs[i].done = 0;
        cs[i].got = 0;
        send_msg(i);
    }
    while (remaining > 0) {
        int n = epoll_wait(ep, evs, 1024, 10000);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) DIE("no progress for 10 s (%u connections still busy)", remaining);
        for (int k = 0; k < n; k++) {
            uint32_t i = evs[k].data.u32;
            conn_t *c = &cs[i];
            ssize_t r = recv(c->fd, rbuf + (size_t)i * msg + c->got, msg - c->got, MSG_DONTWAIT);
            if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (r <= 0) DIE("connection %u: %s", i, r == 0 ? "closed by the server" : strerror(errno));
            c->got += (uint32_t)r;
            if (c->got < msg) continue;
            uint64_t t = now_ns();
            fill(want, i, c->done);
            if (memcmp(want, rbuf + (size_t)i * msg, msg) != 0)
                DIE("connection %u round trip %u: the echo differs from what was sent", i, c->done);
            if (record) samples[nsamples++] = t - c->sent_at;
            c->got = 0;
            if (++c->done == rts)
                remaining--;
            else
                send_msg(i);
        }
    }
}

/* Sum over the server's threads of what parse reads from each thread's
 * /proc/<pid>/task/<tid>/<file> (a thread gone meanwhile counts 0). */
static uint64_t sum_tasks(const char *file, uint64_t (*parse)(FILE *)) {
    char path[64];
    uint64_t total = 0;
    snprintf(path, sizeof path, "/proc/%d/task", (int)server);
    DIR *d = opendir(path);
    if (!d) DIE("cannot read %s", path);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s/%s", path, e->d_name, file);
        FILE *f = fopen(p, "r");
        if (!f) continue;
        total += parse(f);
        fclose(f);
    }
    closedir(d);
    return total;
}

static uint64_t parse_run_ns(FILE *f) { /* schedstat: run time first */
    unsigned long long run = 0;
    return fscanf(f, "%llu", &run) == 1 ? run : 0;
}

/* The number after "key:" at the start of a line of a status file. */
static uint64_t status_field(FILE *f, const char *key) {
    char line[256];
    size_t k = strlen(key);
    unsigned long long v;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, k) == 0 && line[k] == ':' && sscanf(line + k + 1, "%llu", &v) == 1) return v;
    return 0;
}

static uint64_t parse_sleeps(FILE *f) { return status_field(f, "voluntary_ctxt_switches"); }
static uint64_t parse_preempted(FILE *f) { return status_field(f, "nonvoluntary_ctxt_switches"); }

static uint64_t server_user_ns; /* utime alone, from the last server_cpu_ns */

/* CPU time of every thread of the server, in ns (schedstat), and in ns from
 * the utime+stime ticks of /proc/<pid>/stat. */
static uint64_t server_cpu_ns(uint64_t *stat_ns) {
    uint64_t total = sum_tasks("schedstat", parse_run_ns);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)server);
    FILE *f = fopen(path, "r");
    char line[1024] = "";
    if (!f || !fgets(line, sizeof line, f)) DIE("cannot read %s", path);
    fclose(f);
    char *p = strrchr(line, ')');
    unsigned long long ut = 0, st = 0;
    /* after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        DIE("cannot parse %s", path);
    *stat_ns = (ut + st) * (1000000000ull / (uint64_t)sysconf(_SC_CLK_TCK));
    server_user_ns = ut * (1000000000ull / (uint64_t)sysconf(_SC_CLK_TCK));
    return total;
}

/* Voluntary context switches (sleeps) of every thread of the server. */
static uint64_t server_sleeps(void) { return sum_tasks("status", parse_sleeps); }

/* Involuntary context switches (preemptions) of every thread of the server. */
static uint64_t server_preempted(void) { return sum_tasks("status", parse_preempted); }

static uint64_t my_sleeps(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)ru.ru_nvcsw;
}

/* How many io_uring and epoll descriptors the server holds. */
static void server_pollers(int *uring, int *epoll) {
    char path[64];
    *uring = *epoll = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)server);
    DIR *d = opendir(path);
    if (!d) DIE("cannot read %s", path);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[PATH_MAX], target[128];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        ssize_t n = readlink(p, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = '\0';
        if (strcmp(target, "anon_inode:[io_uring]") == 0) ++*uring;
        if (strcmp(target, "anon_inode:[eventpoll]") == 0) ++*epoll;
    }
    closedir(d);
}

/* ECHO_PIN="C,S": the client runs on CPU C, the server on CPU S (which = 0
 * and 1). Unset: the OS places both. */
static void pin_from_env(int which) {
    const char *e = getenv("ECHO_PIN");
    int cpu[2];
    if (!e || sscanf(e, "%d,%d", &cpu[0], &cpu[1]) != 2) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu[which], &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) FAIL("sched_setaffinity: %s", strerror(errno));
}

static void start_server(char **argv, int *port) {
    char self[PATH_MAX], prog[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) FAIL("readlink /proc/self/exe: %s", strerror(errno));
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    if (strchr(argv[0], '/'))
        snprintf(prog, sizeof prog, "%s", argv[0]);
    else
        snprintf(prog, sizeof prog, "%s/%s", self, argv[0]);
    int pfd[2];
    if (pipe(pfd) != 0) FAIL("pipe: %s", strerror(errno));
    server = fork();
    if (server < 0) FAIL("fork: %s", strerror(errno));
    if (server == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* no orphan server if the client is killed */
        pin_from_env(1);
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        execv(prog, argv);
        fprintf(stderr, "exec %s: %s\n", prog, strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    char line[128];
    size_t len = 0;
    *port = 0;
    while (len < sizeof line - 1) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        if (poll(&p, 1, 10000) <= 0) break;
        ssize_t r = read(pfd[0], line + len, sizeof line - 1 - len);
        if (r <= 0) break;
        len += (size_t)r;
        line[len] = '\0';
        if (strchr(line, '\n')) {
            sscanf(line, "port=%d", port);
            break;
        }
    }
    close(pfd[0]);
    if (*port <= 0) DIE("%s did not print its port", prog);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: tcp_client conns round_trips msg_size server [args...]\n");
        return 2;
    }
    long conns = arg_long(argc, argv, 1, 1000);
    uint32_t rts = (uint32_t)arg_long(argc, argv, 2, 10);
    msg = (size_t)arg_long(argc, argv, 3, 64);
    if (msg > 4096) FAIL("msg_size is at most 4096");
    signal(SIGPIPE, SIG_IGN);
    pin_from_env(0);

    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur != RLIM_INFINITY && (long)rl.rlim_cur < conns + 64) {
        fprintf(stderr, "tcp_client: RLIMIT_NOFILE is %llu: %ld connections instead of %ld\n",
                (unsigned long long)rl.rlim_cur, (long)rl.rlim_cur - 64, conns);
        conns = (long)rl.rlim_cur - 64;
    }

    int port;
    start_server(argv + 4, &port);
    cs = calloc((size_t)conns, sizeof *cs);
    rbuf = malloc((size_t)conns * msg);
    samples = malloc((size_t)conns * rts * sizeof *samples);
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (!cs || !rbuf || !samples || ep < 0) DIE("out of memory");

    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (long lo = 0; lo < conns; lo += BATCH) {
        long hi = lo + BATCH < conns ? lo + BATCH : conns;
        for (long i = lo; i < hi; i++) {
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd < 0) DIE("socket: %s", strerror(errno));
            if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) DIE("connect #%ld: %s", i, strerror(errno));
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            fcntl(fd, F_SETFL, O_NONBLOCK);
            struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
            if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) DIE("epoll_ctl: %s", strerror(errno));
            cs[i].fd = fd;
        }
        run_phase((uint32_t)lo, (uint32_t)hi, 1, 0);
    }

    uint64_t stat0, stat1;
    uint64_t sl0 = server_sleeps(), csl0 = my_sleeps(), pre0 = server_preempted();
    uint64_t cpu0 = server_cpu_ns(&stat0), user0 = server_user_ns;
    uint64_t t0 = now_ns();
    run_phase(0, (uint32_t)conns, rts, 1);
    uint64_t t1 = now_ns();
    uint64_t cpu1 = server_cpu_ns(&stat1);
    uint64_t sl1 = server_sleeps(), csl1 = my_sleeps(), pre1 = server_preempted();
    int uring_fds, epoll_fds;
    server_pollers(&uring_fds, &epoll_fds);

    if (waitpid(server, NULL, WNOHANG) != 0) {
        server = 0;
        FAIL("the server exited during the run");
    }
    struct linger lg = {1, 0};
    for (long i = 0; i < conns; i++) {
        setsockopt(cs[i].fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        close(cs[i].fd);
    }
    kill_server();

    double n = (double)nsamples, secs = (double)(t1 - t0) / 1e9;
    uint64_t p50 = percentile(samples, nsamples, 50), p99 = percentile(samples, nsamples, 99);
    printf("ok=1 conns=%ld round_trips=%.0f msg=%zu secs=%.4f rt_per_s=%.0f cpu_us_per_rt=%.3f "
           "cpu_stat_us_per_rt=%.3f server_cpu_s=%.3f p50_us=%.1f p99_us=%.1f server_io=%s uring_fds=%d "
           "epoll_fds=%d server_sleeps=%llu client_sleeps=%llu server_user_us_per_rt=%.3f server_preempted=%llu\n",
           conns, n, msg, secs, n / secs, (double)(cpu1 - cpu0) / 1e3 / n, (double)(stat1 - stat0) / 1e3 / n,
           (double)(cpu1 - cpu0) / 1e9, (double)p50 / 1e3, (double)p99 / 1e3,
           uring_fds ? "uring" : epoll_fds ? "epoll" : "other", uring_fds, epoll_fds,
           (unsigned long long)(sl1 - sl0), (unsigned long long)(csl1 - csl0),
           (double)(server_user_ns - user0) / 1e3 / n, (unsigned long long)(pre1 - pre0));
    return 0;
}
