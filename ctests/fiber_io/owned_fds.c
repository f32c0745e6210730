/* Owned descriptors: async_fiber_fd_open, async_fiber_close, and
 * async_fiber_accept returning owned fds. An owned fd is registered once
 * (edge-triggered) and parks with no poller call; a close through the
 * library wakes its parked fibers with ASYNC_E_CLOSED (also a read parked
 * before the fd was owned); a number owned by one scheduler is a plain fd to
 * another; a failed fd_open leaves the file as it was. The epoll checks
 * (seccomp, /proc/self/fdinfo) are Linux-only; elsewhere (darwin, built by
 * scripts/cross.sh) the cases run without them. Every wait is bounded. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#if defined(__linux__)
#include <dirent.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif

#include "check.h"

static void pair(int sv[2]) { CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0); }

/* The epoll events mask registered for fd in this process's epoll sets (the
 * fiber poller's; Go's has other fds), from /proc/self/fdinfo; -1 if fd is
 * registered nowhere. */
#if defined(__linux__)
static long long epoll_mask_of(int fd) {
    DIR *d = opendir("/proc/self/fd");
    CHECK(d != NULL);
    struct dirent *e;
    long long mask = -1;
    while ((e = readdir(d)) != NULL) {
        char path[300], link[64];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n <= 0) continue;
        link[n] = 0;
        if (strcmp(link, "anon_inode:[eventpoll]") != 0) continue;
        snprintf(path, sizeof path, "/proc/self/fdinfo/%s", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        char line[512];
        while (fgets(line, sizeof line, f)) {
            int tfd;
            unsigned long long ev;
            if (sscanf(line, "tfd: %d events: %llx", &tfd, &ev) == 2 && tfd == fd) mask = (long long)ev;
        }
        fclose(f);
    }
    closedir(d);
    return mask;
}

static void check_registered_et(int fd) {
    long long m = epoll_mask_of(fd);
    if (m < 0) {
        fprintf(stderr, "fd %d is not registered in any epoll set\n", fd);
        CHECK(m >= 0);
    }
    CHECK((m & EPOLLET) != 0);
    CHECK((m & EPOLLONESHOT) == 0);
    CHECK((m & EPOLLIN) && (m & EPOLLOUT));
}
#else
static void check_registered_et(int fd) { (void)fd; }
#endif

/* ---- ping-pong over socketpairs ------------------------------------------ */

typedef struct {
    int fd;
    int rounds;
    size_t size;
    int echo; /* 1: the echoing side */
    _Atomic int *fails;
} pp_t;

static void fill(unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed * 131u + i * 7u);
}

/* Reads exactly n bytes; 0 or -1. */
static int read_full(int fd, unsigned char *b, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = async_fiber_read(fd, b + got, n - got, 30000);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

static void pp_fiber(void *arg) {
    pp_t *p = arg;
    unsigned char *out = malloc(p->size), *in = malloc(p->size);
    CHECK(out && in);
    for (int i = 0; i < p->rounds; i++) {
        size_t n = 1 + ((size_t)i * 7919u) % p->size;
        if (p->echo) {
            if (read_full(p->fd, in, n) != 0 || async_fiber_write(p->fd, in, n, 30000) != (ssize_t)n) {
                atomic_fetch_add(p->fails, 1);
                break;
            }
        } else {
            fill(out, n, (unsigned)i + (unsigned)p->fd);
            if (async_fiber_write(p->fd, out, n, 30000) != (ssize_t)n || read_full(p->fd, in, n) != 0 ||
                memcmp(in, out, n) != 0) {
                atomic_fetch_add(p->fails, 1);
                break;
            }
        }
    }
    free(out);
    free(in);
}

/* Runs `rounds` round trips on each of the npairs socketpairs in sv. */
static void pingpong(async_sched_t *s, int (*sv)[2], int npairs, int rounds, size_t size) {
    _Atomic int fails = 0;
    pp_t *pp = calloc((size_t)npairs * 2, sizeof *pp);
    CHECK(pp != NULL);
    for (int i = 0; i < npairs; i++) {
        pp[2 * i] = (pp_t){sv[i][0], rounds, size, 0, &fails};
        pp[2 * i + 1] = (pp_t){sv[i][1], rounds, size, 1, &fails};
        CHECK(async_fiber_spawn(s, pp_fiber, &pp[2 * i], 0) != NULL);
        CHECK(async_fiber_spawn(s, pp_fiber, &pp[2 * i + 1], 0) != NULL);
    }
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&fails), 0);
    free(pp);
}

/* Steady state makes no epoll_ctl: after a warm-up, a seccomp filter makes
 * every epoll_ctl of the process fail with EPERM, and thousands of parks and
 * wake-ups on owned fds still work (the one-shot path re-arms with
 * EPOLL_CTL_MOD at every park, and fails there). */
CASE(owned_steady_no_epoll_ctl) {
    async_sched_t *s = sched_new(1);
    int sv[2][2];
    for (int i = 0; i < 2; i++) {
        pair(sv[i]);
        CHECK_EQ(async_fiber_fd_open(s, sv[i][0]), 0);
        CHECK_EQ(async_fiber_fd_open(s, sv[i][1]), 0);
    }
    pingpong(s, sv, 2, 50, 64);
    for (int i = 0; i < 2; i++) {
        check_registered_et(sv[i][0]);
        check_registered_et(sv[i][1]);
    }
#if defined(__linux__)
    struct sock_filter filt[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_epoll_ctl, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof filt / sizeof filt[0]), filt};
    CHECK_EQ(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0) {
        /* qemu-user and some sandboxes: the registration check above stands */
        printf("seccomp unavailable (errno %d): epoll_ctl not counted\n", errno);
        async_sched_destroy(s);
        return;
    }
    {
        /* the filter works: a raw epoll_ctl now fails */
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN};
        CHECK(ep >= 0);
        CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, sv[0][0], &ev) != 0 && errno == EPERM);
        close(ep);
    }
#endif
    pingpong(s, sv, 2, 2000, 64);
    /* larger messages: writes that fill the buffer park for room too */
    pingpong(s, sv, 2, 200, 300000);
    async_sched_destroy(s);
}

/* Many fibers, many pairs, 2 workers, sizes up to 256 KiB: data intact
 * (fewer round trips under TSan, which makes each copy slow). */
CASE(owned_pingpong_many) { // uring
    async_sched_t *s = sched_new(2);
    enum { N = 64 };
    int sv[N][2];
    for (int i = 0; i < N; i++) {
        pair(sv[i]);
        CHECK_EQ(async_fiber_fd_open(s, sv[i][0]), 0);
        CHECK_EQ(async_fiber_fd_open(s, sv[i][1]), 0);
    }
    pingpong(s, sv, N, ASYNC_TEST_TSAN ? 60 : 300, 256 * 1024);
    for (int i = 0; i < N; i++) {
        CHECK_EQ(async_fiber_close(sv[i][0]), 0);
        CHECK_EQ(async_fiber_close(sv[i][1]), 0);
    }
    async_sched_destroy(s);
}

/* One fd, a reader fiber and a writer fiber at once (full duplex), against
 * a peer doing the same: 8 MiB each way. */
typedef struct {
    int fd;
    size_t total;
    int writer;
    _Atomic int *fails;
} dup_t;

static void duplex_fiber(void *arg) {
    dup_t *d = arg;
    unsigned char b[8192];
    size_t done = 0;
    while (done < d->total) {
        size_t n = d->total - done < sizeof b ? d->total - done : sizeof b;
        if (d->writer) {
            for (size_t i = 0; i < n; i++) b[i] = (unsigned char)((done + i) * 13u);
            if (async_fiber_write(d->fd, b, n, 30000) != (ssize_t)n) goto fail;
            done += n;
        } else {
            ssize_t r = async_fiber_read(d->fd, b, n, 30000);
            if (r <= 0) goto fail;
            for (ssize_t i = 0; i < r; i++)
                if (b[i] != (unsigned char)((done + (size_t)i) * 13u)) goto fail;
            done += (size_t)r;
        }
    }
    return;
fail:
    atomic_fetch_add(d->fails, 1);
}

CASE(owned_duplex) { // uring
    async_sched_t *s = sched_new(2);
    int sv[2];
    pair(sv);
    CHECK_EQ(async_fiber_fd_open(s, sv[0]), 0);
    CHECK_EQ(async_fiber_fd_open(s, sv[1]), 0);
    _Atomic int fails = 0;
    dup_t d[4];
    for (int i = 0; i < 4; i++) {
        d[i] = (dup_t){sv[i / 2], (size_t)8 << 20, i % 2, &fails};
        CHECK(async_fiber_spawn(s, duplex_fiber, &d[i], 0) != NULL);
    }
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&fails), 0);
    CHECK_EQ(async_fiber_close(sv[0]), 0);
    CHECK_EQ(async_fiber_close(sv[1]), 0);
    async_sched_destroy(s);
}

/* ---- close through the library --------------------------------------------- */

typedef struct {
    int fd;
    int op; /* 0 read, 1 write, 2 accept, 3 wait_fd read */
    _Atomic int result; /* -1 until done, then the error (0: success) */
} cw_t;

static void closed_waiter(void *arg) {
    cw_t *c = arg;
    char b[256];
    int rc;
    async_clear_error();
    switch (c->op) {
    case 0: rc = async_fiber_read(c->fd, b, sizeof b, 20000) < 0 ? -1 : 0; break;
    case 1: {
        static char big[1 << 20];
        rc = async_fiber_write(c->fd, big, sizeof big, 20000) < 0 ? -1 : 0;
        break;
    }
    case 2: rc = async_fiber_accept(c->fd, NULL, NULL, 20000) < 0 ? -1 : 0; break;
    default: rc = async_fiber_wait_fd(c->fd, ASYNC_EVENT_READ, 20000) < 0 ? -1 : 0; break;
    }
    atomic_store(&c->result, rc ? async_last_error() : 0);
}

/* A reader and a writer parked on one owned fd, and an acceptor parked on an
 * owned listening socket: async_fiber_close from a plain thread wakes each
 * at once with ASYNC_E_CLOSED (not at its 20 s timeout). */
CASE(owned_close_wakes_all) { // uring
    async_sched_t *s = sched_new(2);
    int sv[2];
    pair(sv);
    int small = 4096;
    CHECK_EQ(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
    struct sockaddr_in a;
    int l = loopback_listener(128, &a);
    CHECK_EQ(async_fiber_fd_open(s, sv[0]), 0);
    CHECK_EQ(async_fiber_fd_open(s, l), 0);
    cw_t c[3] = {{sv[0], 0, -1}, {sv[0], 1, -1}, {l, 2, -1}};
    for (int i = 0; i < 3; i++) CHECK(async_fiber_spawn(s, closed_waiter, &c[i], 0) != NULL);
    sched_wait_parked(s, 3);
    double t0 = now_ms();
    CHECK_EQ(async_fiber_close(sv[0]), 0);
    CHECK_EQ(async_fiber_close(l), 0);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK(now_ms() - t0 < 15000); /* woken by the close, not by the timeout */
    for (int i = 0; i < 3; i++) CHECK_EQ(atomic_load(&c[i].result), ASYNC_E_CLOSED);
    /* the number is closed */
    CHECK_FAIL(async_fiber_close(sv[0]) != 0, ASYNC_E_BADFD);
    close(sv[1]);
    async_sched_destroy(s);
}

/* The same from a fiber of the owning scheduler, with async_fiber_wait_fd. */
static async_sched_t *cl_s;

static int cl_fd;

static void closer(void *arg) {
    (void)arg;
    CHECK_EQ(async_fiber_close(cl_fd), 0);
}

CASE(owned_close_from_fiber) { // uring
    async_sched_t *s = sched_new(1);
    cl_s = s;
    int sv[2];
    pair(sv);
    cl_fd = sv[0];
    CHECK_EQ(async_fiber_fd_open(s, sv[0]), 0);
    cw_t c = {sv[0], 3, -1};
    spawn_until_parked(s, closed_waiter, &c, 1);
    CHECK(async_fiber_spawn(s, closer, NULL, 0) != NULL);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&c.result), ASYNC_E_CLOSED);
    close(sv[1]);
    async_sched_destroy(s);
}

/* ---- reuse of the number ------------------------------------------------------ */

CASE(owned_reuse_after_close) {
    async_sched_t *s = sched_new(1);
    int sv[2][2];
    pair(sv[0]);
    CHECK_EQ(async_fiber_fd_open(s, sv[0][0]), 0);
    CHECK_EQ(async_fiber_fd_open(s, sv[0][1]), 0);
    pingpong(s, sv, 1, 20, 64);
    int n0 = sv[0][0], n1 = sv[0][1];
    CHECK_EQ(async_fiber_close(n0), 0);
    CHECK_EQ(async_fiber_close(n1), 0);
    /* the lowest free numbers come back */
    pair(sv[0]);
    CHECK((sv[0][0] == n0 && sv[0][1] == n1) || (sv[0][0] == n1 && sv[0][1] == n0));
    CHECK_EQ(async_fiber_fd_open(s, sv[0][0]), 0); /* not EXISTS */
    CHECK_EQ(async_fiber_fd_open(s, sv[0][1]), 0);
    pingpong(s, sv, 1, 200, 64);
    /* closed with close(2) behind the library's back, the number reused:
     * async_fiber_fd_open sees the old registration is gone and takes the
     * number over */
    n0 = sv[0][0];
    n1 = sv[0][1];
    close(n0);
    close(n1);
    pair(sv[0]);
    CHECK((sv[0][0] == n0 && sv[0][1] == n1) || (sv[0][0] == n1 && sv[0][1] == n0));
    CHECK_EQ(async_fiber_fd_open(s, sv[0][0]), 0);
    CHECK_EQ(async_fiber_fd_open(s, sv[0][1]), 0);
    check_registered_et(sv[0][0]);
    pingpong(s, sv, 1, 200, 64);
    CHECK_EQ(async_fiber_close(sv[0][0]), 0);
    CHECK_EQ(async_fiber_close(sv[0][1]), 0);
    async_sched_destroy(s);
}

/* ---- EOF, hang-up -------------------------------------------------------------- */

typedef struct {
    int fd;
    _Atomic ssize_t r1, r2;
    _Atomic int err;
} eof_t;

static void eof_reader(void *arg) {
    eof_t *e = arg;
    char b[64];
    atomic_store(&e->r1, async_fiber_read(e->fd, b, sizeof b, 20000));
    atomic_store(&e->r2, async_fiber_read(e->fd, b, sizeof b, 20000));
}

static void eof_writer(void *arg) {
    eof_t *e = arg;
    char b[64] = {0};
    async_clear_error();
    ssize_t r = async_fiber_write(e->fd, b, sizeof b, 20000);
    atomic_store(&e->err, r < 0 ? async_last_error() : 0);
}

CASE(owned_eof_hangup) {
    async_sched_t *s = sched_new(1);
    /* a socket: the parked read ends with 0 when the peer closes, and so
     * does the next one; a write then fails with CLOSED */
    int sv[2];
    pair(sv);
    CHECK_EQ(async_fiber_fd_open(s, sv[0]), 0);
    eof_t e = {sv[0], -2, -2, -1};
    spawn_until_parked(s, eof_reader, &e, 1);
    close(sv[1]);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&e.r1), 0);
    CHECK_EQ(atomic_load(&e.r2), 0);
    CHECK(async_fiber_spawn(s, eof_writer, &e, 0) != NULL);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&e.err), ASYNC_E_CLOSED);
    CHECK_EQ(async_fiber_close(sv[0]), 0);
    /* a pipe: the writer's close is an EOF for the owned read end */
    int p[2];
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(async_fiber_fd_open(s, p[0]), 0);
    eof_t e2 = {p[0], -2, -2, -1};
    spawn_until_parked(s, eof_reader, &e2, 1);
    CHECK_EQ(write(p[1], "x", 1), 1);
    sched_wait_parked(s, 1); /* the second read parks */
    close(p[1]);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&e2.r1), 1);
    CHECK_EQ(atomic_load(&e2.r2), 0);
    CHECK_EQ(async_fiber_close(p[0]), 0);
    async_sched_destroy(s);
}

/* ---- TCP: accept returns owned fds ---------------------------------------------- */

static struct sockaddr_in tcp_addr;

static _Atomic int tcp_fails;

static void tcp_conn(void *arg) {
    int fd = (int)(intptr_t)arg;
    char b[4096];
    ssize_t n;
    while ((n = async_fiber_read(fd, b, sizeof b, 30000)) > 0)
        if (async_fiber_write(fd, b, (size_t)n, 30000) != n) break;
    if (n < 0) atomic_fetch_add(&tcp_fails, 1);
    CHECK_EQ(async_fiber_close(fd), 0);
}

static void tcp_server(void *arg) {
    int l = (int)(intptr_t)arg;
    async_sched_t *s = cl_s;
    for (int i = 0; i < 8; i++) {
        int fd = async_fiber_accept(l, NULL, NULL, 30000);
        CHECK(fd >= 0);
        /* owned by this scheduler already */
        CHECK_FAIL(async_fiber_fd_open(NULL, fd) != 0, ASYNC_E_EXISTS);
        CHECK_FAIL(async_fiber_fd_open(s, fd) != 0, ASYNC_E_EXISTS);
        check_registered_et(fd);
        CHECK(async_fiber_spawn(s, tcp_conn, (void *)(intptr_t)fd, 0) != NULL);
    }
}

static void tcp_client(void *arg) {
    (void)arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    CHECK_EQ(async_fiber_fd_open(NULL, fd), 0);
    CHECK_EQ(async_fiber_connect(fd, (struct sockaddr *)&tcp_addr, sizeof tcp_addr, 30000), 0);
    /* connect kept it owned */
    CHECK_FAIL(async_fiber_fd_open(NULL, fd) != 0, ASYNC_E_EXISTS);
    unsigned char out[3000], in[3000];
    for (int i = 0; i < 300; i++) {
        size_t n = 1 + (size_t)(i * 37) % sizeof out;
        fill(out, n, (unsigned)i);
        if (async_fiber_write(fd, out, n, 30000) != (ssize_t)n || read_full(fd, in, n) != 0 ||
            memcmp(in, out, n) != 0) {
            atomic_fetch_add(&tcp_fails, 1);
            break;
        }
    }
    CHECK_EQ(async_fiber_close(fd), 0);
}

/* A plain listening socket gives plain fds, as before owned fds existed
 * (a program that closes them with close(2) stays correct). */
static int plain_l, plain_fd = -1;

static void plain_accept(void *arg) {
    (void)arg;
    plain_fd = async_fiber_accept(plain_l, NULL, NULL, 20000);
}

CASE(accept_plain) { // uring
    async_sched_t *s = sched_new(1);
    struct sockaddr_in a;
    plain_l = loopback_listener(128, &a);
    CHECK(async_fiber_spawn(s, plain_accept, NULL, 0) != NULL);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(c >= 0);
    CHECK_EQ(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK(plain_fd >= 0);
#if defined(__linux__)
    CHECK_EQ(epoll_mask_of(plain_fd), -1); /* not registered */
#endif
    CHECK_EQ(async_fiber_fd_open(s, plain_fd), 0); /* not owned yet */
    CHECK_EQ(async_fiber_close(plain_fd), 0);
    close(c);
    close(plain_l);
    async_sched_destroy(s);
}

CASE(owned_tcp_echo) { // uring
    async_sched_t *s = sched_new(2);
    cl_s = s;
    int l = loopback_listener(128, &tcp_addr);
    CHECK_EQ(async_fiber_fd_open(s, l), 0);
    CHECK(async_fiber_spawn(s, tcp_server, (void *)(intptr_t)l, 0) != NULL);
    for (int i = 0; i < 8; i++) CHECK(async_fiber_spawn(s, tcp_client, NULL, 0) != NULL);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&tcp_fails), 0);
    CHECK_EQ(async_fiber_close(l), 0);
    async_sched_destroy(s);
}

/* TCP urgent data: a read stops at the urgent mark, a short read that
 * leaves data behind with no new edge to come. The owned read hint ("the
 * last read was short and no event came since: park at once") must be off
 * for such an fd (EPOLLPRI turns it off), or the second read parks until its
 * timeout. */
static int urg_fd = -1;

static _Atomic int urg_go;

static _Atomic ssize_t urg_r1 = -2, urg_r2 = -2;

static char urg_b2[8];

static void urg_reader(void *arg) {
    int l = (int)(intptr_t)arg;
    urg_fd = async_fiber_accept(l, NULL, NULL, 20000);
    CHECK(urg_fd >= 0);
    while (!atomic_load(&urg_go)) async_fiber_sleep(1);
    char b[64];
    atomic_store(&urg_r1, async_fiber_read(urg_fd, b, sizeof b, 20000));
    atomic_store(&urg_r2, async_fiber_read(urg_fd, urg_b2, sizeof urg_b2, 10000));
    CHECK_EQ(async_fiber_close(urg_fd), 0);
}

CASE(owned_tcp_urgent) {
    async_sched_t *s = sched_new(1);
    struct sockaddr_in a;
    int l = loopback_listener(128, &a);
    CHECK_EQ(async_fiber_fd_open(s, l), 0);
    CHECK(async_fiber_spawn(s, urg_reader, (void *)(intptr_t)l, 0) != NULL);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(c >= 0);
    CHECK_EQ(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    CHECK_EQ(send(c, "abc", 3, 0), 3);
    CHECK_EQ(send(c, "X", 1, MSG_OOB), 1);
    CHECK_EQ(send(c, "def", 3, 0), 3);
    /* let the idle worker take the events (with none, the case proves less,
     * it cannot fail for that) */
    sleep_ms(50);
    atomic_store(&urg_go, 1);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&urg_r1), 3);
    CHECK_EQ(atomic_load(&urg_r2), 3);
    CHECK(memcmp(urg_b2, "def", 3) == 0);
    close(c);
    CHECK_EQ(async_fiber_close(l), 0);
    async_sched_destroy(s);
}

/* ---- other schedulers, plain threads ----------------------------------------------- */

static int other_fd;

static _Atomic ssize_t other_got = -2;

static void other_reader(void *arg) {
    (void)arg;
    char b[16];
    atomic_store(&other_got, async_fiber_read(other_fd, b, sizeof b, 20000));
}

/* An fd owned by A: a fiber of B and a plain thread read it as a plain fd. */
CASE(owned_other_sched) { // uring
    async_sched_t *a = sched_new(1), *b = sched_new(1);
    int sv[2];
    pair(sv);
    other_fd = sv[0];
    CHECK_EQ(async_fiber_fd_open(a, sv[0]), 0);
    CHECK_FAIL(async_fiber_fd_open(b, sv[0]) != 0, ASYNC_E_EXISTS);
    spawn_until_parked(b, other_reader, NULL, 1);
    CHECK_EQ(write(sv[1], "hello", 5), 5);
    CHECK_EQ(async_sched_run(b), 0);
    CHECK_EQ(atomic_load(&other_got), 5);
    char buf[16];
    CHECK_EQ(write(sv[1], "abc", 3), 3);
    CHECK_EQ(async_fiber_read(sv[0], buf, sizeof buf, 20000), 3); /* plain thread */
    /* the owner still works */
    atomic_store(&other_got, -2);
    spawn_until_parked(a, other_reader, NULL, 1);
    CHECK_EQ(write(sv[1], "xy", 2), 2);
    CHECK_EQ(async_sched_run(a), 0);
    CHECK_EQ(atomic_load(&other_got), 2);
    /* A's end leaves the fd open and owned by nobody: B may own it */
    async_sched_destroy(a);
    CHECK(fcntl(sv[0], F_GETFD) >= 0);
    CHECK_EQ(async_fiber_fd_open(b, sv[0]), 0);
    atomic_store(&other_got, -2);
    spawn_until_parked(b, other_reader, NULL, 1);
    CHECK_EQ(write(sv[1], "z", 1), 1);
    CHECK_EQ(async_sched_run(b), 0);
    CHECK_EQ(atomic_load(&other_got), 1);
    CHECK_EQ(async_fiber_close(sv[0]), 0);
    close(sv[1]);
    async_sched_destroy(b);
}

/* ---- errors ---------------------------------------------------------------------- */

CASE(owned_errors) {
    async_sched_t *s = sched_new(1);
    int sv[2];
    pair(sv);
    CHECK_FAIL(async_fiber_fd_open(NULL, sv[0]) != 0, ASYNC_E_STATE); /* plain thread */
    CHECK_FAIL(async_fiber_fd_open((async_sched_t *)(uintptr_t)12345, sv[0]) != 0, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_fd_open(s, -1) != 0, ASYNC_E_BADFD);
    int dead = dup(sv[0]);
    close(dead);
    CHECK_FAIL(async_fiber_fd_open(s, dead) != 0, ASYNC_E_BADFD);
    char tmpl[] = "/tmp/ownfd_XXXXXX";
    int file = mkstemp(tmpl);
    CHECK(file >= 0);
    unlink(tmpl);
    CHECK_FAIL(async_fiber_fd_open(s, file) != 0, ASYNC_E_BADFD); /* regular file: not pollable */
    CHECK_EQ(async_fiber_close(file), 0);                        /* a plain fd: just closed */
    CHECK_EQ(async_fiber_fd_open(s, sv[0]), 0);
    CHECK_FAIL(async_fiber_fd_open(s, sv[0]) != 0, ASYNC_E_EXISTS);
    CHECK_FAIL(async_fiber_close(-1) != 0, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_close(dead) != 0, ASYNC_E_BADFD);
    CHECK_EQ(async_fiber_close(sv[0]), 0);
    CHECK_FAIL(async_fiber_close(sv[0]) != 0, ASYNC_E_BADFD);
    CHECK_EQ(async_fiber_close(sv[1]), 0);
    async_sched_destroy(s);
}

static int rd_fd;
static _Atomic int rd_err = -1;

static void err_reader(void *arg) {
    (void)arg;
    char b[16];
    ssize_t r = async_fiber_read(rd_fd, b, sizeof b, 30000);
    atomic_store(&rd_err, r < 0 ? async_last_error() : 0);
}

/* Starts a joinable fiber on s that reads fd (30 s timeout) and keeps the
 * error its read ends with in rd_err (0: it read); returns once the fiber
 * is parked in the read. */
static async_fiber_t *start_parked_reader(async_sched_t *s, int fd) {
    rd_fd = fd;
    atomic_store(&rd_err, -1);
    async_fiber_t *f = async_fiber_spawn(s, err_reader, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    sched_wait_parked(s, 1);
    return f;
}

/* s1 owns a number whose file was closed with close(2) (a bug the header
 * names) and reused by a new file. The header promises fd_open detects that
 * the old file is gone, from any scheduler: async_fiber_fd_open(s2, number)
 * succeeds (not ASYNC_E_EXISTS), s2 owns the new file, and s1's reader
 * parked on the old file is woken with ASYNC_E_CLOSED. */
CASE(owned_stale_number_other_sched) { // adversarial
    async_sched_t *s1 = sched_new(2), *s2 = sched_new(1);
    int sv[2], nv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    CHECK_EQ(async_fiber_fd_open(s1, sv[0]), 0);
    async_fiber_t *f = start_parked_reader(s1, sv[0]);
    CHECK_EQ(close(sv[0]), 0); /* behind the library's back */
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, nv), 0);
    CHECK_EQ(nv[0], sv[0]); /* the lowest free number: the same */
    CHECK_EQ(async_fiber_fd_open(s2, nv[0]), 0);
    CHECK_EQ(async_fiber_join(f, 10000), 0);
    CHECK_EQ(atomic_load(&rd_err), ASYNC_E_CLOSED);
    /* s2 really owns it now; a third scheduler cannot take it */
    async_sched_t *s3 = sched_new(1);
    CHECK_FAIL(async_fiber_fd_open(s3, nv[0]) == -1, ASYNC_E_EXISTS);
    /* and s1 does not still own it either: s2's close works, s1 is untouched */
    CHECK_EQ(async_fiber_close(nv[0]), 0);
    close(nv[1]);
    close(sv[1]);
    async_sched_destroy(s3);
    async_sched_destroy(s1);
    async_sched_destroy(s2);
}

/* async_fiber_fd_open of a file it cannot own (a regular file: BADFD)
 * leaves the file as it was: no O_NONBLOCK set on it. */
CASE(failed_open_keeps_flags) { // adversarial
    async_sched_t *s = sched_new(1);
    char path[] = "/tmp/libasync-test-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    int before = fcntl(fd, F_GETFL);
    CHECK(!(before & O_NONBLOCK));
    CHECK_FAIL(async_fiber_fd_open(s, fd) == -1, ASYNC_E_BADFD);
    CHECK_EQ(fcntl(fd, F_GETFL), before);
    close(fd);
    async_sched_destroy(s);
}

/* A read that parked while fd was plain, then fd owned
 * (async_fiber_fd_open) and closed through the library (async_fiber_close):
 * the close wakes every fiber of the owner parked on fd with
 * ASYNC_E_CLOSED, a read in flight in io_uring too (the ring op is a waiter
 * the close reaches), and the file is really closed (the peer sees the
 * hang-up). */
CASE(owned_close_wakes_read_parked_before_open) { // linux uring
    async_sched_t *s = sched_new(2);
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    async_fiber_t *f = start_parked_reader(s, sv[0]);
    CHECK_EQ(async_fiber_fd_open(s, sv[0]), 0);
    CHECK_EQ(async_fiber_close(sv[0]), 0);
    CHECK_EQ(async_fiber_join(f, 10000), 0); /* not at the 30 s timeout */
    CHECK_EQ(atomic_load(&rd_err), ASYNC_E_CLOSED);
    /* the file is really closed: the peer sees the hang-up */
    struct pollfd p = {.fd = sv[1], .events = POLLIN};
    CHECK_EQ(poll(&p, 1, 10000), 1);
    CHECK(p.revents & (POLLIN | POLLHUP));
    char c;
    CHECK_EQ(read(sv[1], &c, 1), 0);
    close(sv[1]);
    async_sched_destroy(s);
}

TEST_MAIN()
