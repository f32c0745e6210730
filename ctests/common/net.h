/* net.h — helpers shared by the fiber I/O tests (ctests/fiber_io): the
 * bound on a case's waits (BOUND_MS, wait_count), socket pairs of each kind,
 * a port nobody listens on, owned-or-plain descriptors (own_if, close_as),
 * one-fiber probes (io_probe_t, probe_spawn, steps_t), fibers that keep
 * workers busy or count while others park, bounded waits on a flag, and the
 * child runner of the cases that must change a process-wide limit. Include
 * it after check.h. Everything here is static inline or marked unused: a
 * file takes what it needs. */
#ifndef NET_H
#define NET_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>

#if defined(__linux__)
#include <sys/eventfd.h>
#else
/* Other systems only build the tests (scripts/cross.sh, darwin): no eventfd,
 * no memfd, no packet-mode pipes there; the cases that use them fail if run. */
#include <errno.h>
#define EFD_CLOEXEC 0
#define EFD_NONBLOCK 0
static inline int eventfd(unsigned v, int flags)
{
    (void)v;
    (void)flags;
    errno = ENOSYS;
    return -1;
}
#ifndef O_DIRECT
#define O_DIRECT 0
#endif
#define MFD_CLOEXEC 0
static inline int memfd_create(const char *name, unsigned flags)
{
    (void)name;
    (void)flags;
    errno = ENOSYS;
    return -1;
}
#endif

#define NET_UNUSED __attribute__((unused))

/* The bound on a case's waits, in ms: a file that wants another defines
 * BOUND_MS before it includes net.h. */
#ifndef BOUND_MS
#define BOUND_MS 8000
#endif

/* Waits (at most BOUND_MS) until *v >= target; fails naming what. */
#define wait_count(v, target, what) wait_count_within(v, target, BOUND_MS, what)

/* e is a or b. */
static inline int err_in(int e, int a, int b)
{
    return e == a || e == b;
}

/* ---- sockets ----------------------------------------------------------------- */

/* A connected pair of kind 0: unix stream, 1: TCP loopback (a short read
 * there is the kernel's, not the peer's), 2: unix seqpacket. */
static inline void make_pair(int kind, int sv[2])
{
    if (kind == 0) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    } else if (kind == 2) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    } else {
        struct sockaddr_in a;
        int l = loopback_listener(4, &a);
        sv[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(sv[0] >= 0);
        CHECK_EQ(connect(sv[0], (struct sockaddr *)&a, sizeof a), 0);
        sv[1] = accept4(l, NULL, NULL, SOCK_CLOEXEC);
        CHECK(sv[1] >= 0);
        close(l);
    }
}

/* A loopback port nobody listens on (bound, not listening, then closed). */
static inline struct sockaddr_in refused_addr(void)
{
    struct sockaddr_in sa;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(l, (struct sockaddr *)&sa, sizeof sa), 0);
    socklen_t sl = sizeof sa;
    CHECK_EQ(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
    close(l);
    return sa;
}

/* 1 if this machine can bind ::1 with a socket of type (SOCK_STREAM,
 * SOCK_DGRAM); the IPv6 cases skip where it cannot. */
static inline int have_ipv6_loopback(int type)
{
    int fd = socket(AF_INET6, type | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in6 a;
    memset(&a, 0, sizeof a);
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* What a fiber's calls returned, for the main thread to check once `step`
 * says they are done. */
typedef struct {
    int fd, fd2;
    atomic_int step;
    ssize_t r1, r2;
    int e1, e2;
} io_probe_t;

/* Zeroes m, makes a unix stream pair and starts fn(m) on s: the fiber's end
 * of the pair is m->fd, the caller's m->fd2. */
static inline void probe_spawn(async_sched_t *s, void (*fn)(void *), io_probe_t *m)
{
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    memset(m, 0, sizeof *m);
    m->fd = sv[0];
    m->fd2 = sv[1];
    CHECK(async_fiber_spawn(s, fn, m, 0) != NULL);
}

/* Hands fd to s (async_fiber_fd_open, which must succeed) when owned; a
 * plain fd stays as it is. */
static inline void own_if(async_sched_t *s, int fd, int owned)
{
    if (owned)
        CHECK_EQ(async_fiber_fd_open(s, fd), 0);
}

/* Closes fd through the library (which must succeed) when owned, with
 * close(2) otherwise. */
static inline void close_as(int fd, int owned)
{
    if (owned)
        CHECK_EQ(async_fiber_close(fd), 0);
    else
        close(fd);
}

/* ---- fibers ------------------------------------------------------------------- */

/* Runs fn(arg) on a fiber of s and waits (bounded) for it to return. */
static inline void on_fiber(async_sched_t *s, void (*fn)(void *), void *arg)
{
    async_fiber_t *f = async_fiber_spawn(s, fn, arg, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    CHECK_EQ(async_fiber_join(f, 30000), 0);
}

/* Runs fn(NULL) on a fiber of a fresh scheduler of `workers` workers, then
 * destroys the scheduler. */
static inline void on_new_sched(int workers, void (*fn)(void *))
{
    async_sched_t *s = sched_new(workers);
    on_fiber(s, fn, NULL);
    async_sched_destroy(s);
}

/* Runs fn(NULL) on a fiber of a fresh 2-worker scheduler, then on this
 * (plain) thread: a case that holds on both. */
static inline void on_fiber_then_thread(void (*fn)(void *))
{
    on_new_sched(2, fn);
    fn(NULL);
}

/* Creates a scheduler of `workers` workers and destroys it again; where
 * there is no room for it the create must fail with ASYNC_E_NOMEM or
 * ASYNC_E_SYS. Returns 1 if it was created. */
static inline int sched_try_create(int workers)
{
    async_sched_config_t cfg = {workers, 0, 0};
    async_clear_error();
    async_sched_t *s = async_sched_create(&cfg);
    if (!s) {
        CHECK(err_in(async_last_error(), ASYNC_E_NOMEM, ASYNC_E_SYS));
        return 0;
    }
    async_sched_destroy(s);
    return 1;
}

/* Busy workers: fibers that yield until busy_stop is set, so that only a
 * busy worker's periodic look delivers fd events. */
static atomic_int busy_stop NET_UNUSED;

static inline void busy_fn(void *arg)
{
    (void)arg;
    while (!atomic_load(&busy_stop))
        async_fiber_yield();
}

static inline void busy_start(async_sched_t *s, int n)
{
    atomic_store(&busy_stop, 0);
    for (int i = 0; i < n; i++)
        CHECK(async_fiber_spawn(s, busy_fn, NULL, 0) != NULL);
}

/* A fiber that counts while it may, parking 1 ms at a time: it shows that
 * its worker is not blocked. */
typedef struct {
    atomic_long count;
    atomic_int stop;
} counter_t;

static inline void counter_fiber(void *arg)
{
    counter_t *c = arg;
    while (!atomic_load(&c->stop)) {
        atomic_fetch_add(&c->count, 1);
        async_fiber_sleep(1);
    }
}

/* Waits (on the calling thread) until *flag is set; a fiber that spins on
 * its worker never sets it, and the case fails after `ms` instead of
 * hanging. */
static inline void wait_flag(atomic_int *flag, int ms, const char *what)
{
    double t0 = now_ms();
    while (!atomic_load(flag)) {
        if (now_ms() - t0 > ms) {
            fprintf(stderr, "%s: not done after %d ms (a fiber spins or blocks its worker)\n", what, ms);
            fflush(stderr);
            _exit(1);
        }
        sleep_ms(1);
    }
}

/* A fiber that runs numbered steps beside a counter_fiber on its worker:
 * how far it got (step), the error that stopped it (err), and done. */
typedef struct {
    counter_t cnt;
    int step, err;
    atomic_int done;
} steps_t;

/* Ends a steps fiber: keeps its last error, stops the counter fiber, sets
 * done. */
static inline void steps_end(steps_t *st)
{
    st->err = async_last_error();
    atomic_store(&st->cnt.stop, 1);
    atomic_store(&st->done, 1);
}

/* Waits (at most ms) until the steps fiber is done and checks that it
 * reached step `last` (saying on stderr where it stopped otherwise). */
static inline void steps_wait(steps_t *st, int last, int ms, const char *what)
{
    wait_flag(&st->done, ms, what);
    if (st->step != last)
        fprintf(stderr, "%s: stopped after step %d: %s\n", what, st->step, async_strerror(st->err));
    CHECK_EQ(st->step, last);
}

/* ---- child processes and descriptor counts ---------------------------------- */

/* Open descriptors below 4096, counted without opening one (works at
 * EMFILE). */
static inline int open_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            n++;
    return n;
}

static inline void *nop_proc(void *arg)
{
    return arg;
}

/* A number from /proc/self/status: fmt is its line's sscanf format (e.g.
 * "Threads: %ld"); -1 where the line is missing. */
static inline long proc_status_field(const char *fmt)
{
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    CHECK(fp != NULL);
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, fmt, &v) == 1)
            break;
    fclose(fp);
    return v;
}

/* A *_child case runs only in the child its parent case starts (run_child):
 * it changes a process-wide limit the other cases must not see. */
static inline int child_only(void)
{
    if (getenv("ASYNC_TEST_CHILD"))
        return 1;
    printf("skipped: run by its parent case in a child process\n");
    return 0;
}

/* Runs case `name` of this binary in a child (see child_only) and fails
 * unless it exits with 0; skipped under an emulator. */
static inline void run_child(const char *name)
{
    if (getenv("ASYNC_TEST_EMULATOR")) {
        printf("skipped under an emulator\n");
        return;
    }
    int st = run_self_case(name, "ASYNC_TEST_CHILD=1");
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
}

/* A pseudo-terminal: *m its master, *sl its terminal side (both
 * close-on-exec, neither the controlling terminal). */
static inline void open_pty(int *m, int *sl)
{
    *m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    CHECK(*m >= 0);
    CHECK_EQ(grantpt(*m), 0);
    CHECK_EQ(unlockpt(*m), 0);
    *sl = open(ptsname(*m), O_RDWR | O_NOCTTY | O_CLOEXEC);
    CHECK(*sl >= 0);
}

#endif /* NET_H */
