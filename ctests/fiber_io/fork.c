/* fork while fibers run: on a fiber (the child is not on a fiber), with
 * fibers parked on fds, and while fibers do I/O on every worker. In the child
 * every fiber call fails at once with ASYNC_E_FORKED. Every wait is
 * bounded. */
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "check.h"
#define BOUND_MS 20000 /* every wait of this file, in ms */
#include "net.h"

/* ---- fork on a fiber ----------------------------------------------- */

/* Not inlined: the child's view of the TLS comes from a fresh call. */
__attribute__((noinline)) static int child_current_is_null(void) { return async_fiber_current() == NULL; }

typedef struct {
    pid_t pid;
    int parent_ok;
} fork_t;

static void fork_fiber(void *arg) {
    fork_t *x = arg;
    async_fiber_t *me = async_fiber_current();
    pid_t pid = fork();
    if (pid == 0) {
        /* child: 0 = NULL as documented; 3 = the parent's fiber; the
         * other calls fail with ASYNC_E_FORKED */
        int code = child_current_is_null() ? 0 : 3;
        if (code == 0 && (async_fiber_sleep(1) != -1 || async_last_error() != ASYNC_E_FORKED)) code = 4;
        _exit(code);
    }
    x->pid = pid;
    /* the parent still runs on its fiber */
    x->parent_ok = me != NULL && async_fiber_current() == me;
}

CASE(fork_on_fiber) { // uring
    static fork_t x;
    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, fork_fiber, &x, 0));
    CHECK_EQ(async_sched_run(s), 0);
    CHECK(x.pid > 0);
    CHECK(x.parent_ok);
    int st = 0;
    CHECK_EQ(waitpid(x.pid, &st, 0), x.pid);
    if (!WIFEXITED(st)) fprintf(stderr, "child status 0x%x\n", st);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
    async_sched_destroy(s);
}

/* ---- fork while fibers are parked on fds ------------------------------------------------ */

static void fk_noop(void *arg)
{
    (void)arg;
}

static int fk_fd;

static atomic_int fk_err = -1;

static void fk_reader(void *arg) {
    (void)arg;
    char b[4];
    ssize_t r = async_fiber_read(fk_fd, b, sizeof b, 20000);
    atomic_store(&fk_err, r == 3 ? 0 : (int)async_last_error());
}

CASE(fork_parked) { // uring adversarial
    async_sched_t *s = sched_new(2);
    int sp[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    fk_fd = sp[0];
    spawn_until_parked(s, fk_reader, NULL, 1);
    pid_t pid = fork_flushed();
    if (pid == 0) {
        char b[4];
        int ok = 1;
        async_clear_error();
        ok &= async_fiber_read(sp[0], b, 4, 100) == -1 && async_last_error() == ASYNC_E_FORKED;
        ok &= async_fiber_write(sp[1], "x", 1, 100) == -1 && async_last_error() == ASYNC_E_FORKED;
        ok &= async_fiber_wait_fd(sp[0], ASYNC_EVENT_READ, 100) == -1 && async_last_error() == ASYNC_E_FORKED;
        ok &= async_fiber_blocking(fk_noop, NULL) == -1 && async_last_error() == ASYNC_E_FORKED;
        ok &= async_fiber_accept(sp[0], NULL, NULL, 100) == -1 && async_last_error() == ASYNC_E_FORKED;
        ok &= async_fiber_spawn(s, fk_noop, NULL, 0) == NULL && async_last_error() == ASYNC_E_FORKED;
        ok &= async_sched_shutdown(s, 100) == -1 && async_last_error() == ASYNC_E_FORKED;
        ok &= async_fiber_close(sp[0]) == -1 && async_last_error() == ASYNC_E_FORKED;
        struct sockaddr_storage fa;
        socklen_t fl = sizeof(struct sockaddr_in);
        memset(&fa, 0, sizeof fa);
        fa.ss_family = AF_INET;
        size_t got = 7;
        ok &= async_sockaddr_parse("127.0.0.1", 0, &fa, &fl) == -1 && async_last_error() == ASYNC_E_FORKED;
        ok &= async_fiber_listen((struct sockaddr *)&fa, fl, 0, 0) == -1 && async_last_error() == ASYNC_E_FORKED;
        ok &= async_fiber_udp_bind((struct sockaddr *)&fa, fl, 0) == -1 && async_last_error() == ASYNC_E_FORKED;
        ok &= async_fiber_read_full(sp[0], b, 4, &got, 100) == -1 && async_last_error() == ASYNC_E_FORKED && !got;
        ok &= async_fiber_recvfrom(sp[0], b, 4, NULL, NULL, 100) == -1 && async_last_error() == ASYNC_E_FORKED;
        ok &= async_fiber_sendto(sp[1], "x", 1, NULL, 0, 100) == -1 && async_last_error() == ASYNC_E_FORKED;
        ok &= async_fiber_current() == NULL;
        async_fiber_yield();
        ok &= async_sched_create(NULL) == NULL && async_last_error() == ASYNC_E_FORKED;
        /* the child closes its copies: the parent must not notice */
        close_pair(sp);
        _exit(ok ? 0 : 3);
    }
    int st;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
    CHECK_EQ(write(sp[1], "abc", 3), 3);
    async_sched_run(s);
    CHECK_EQ(atomic_load(&fk_err), 0);
    async_sched_destroy(s);
    close_pair(sp);
}

/* ---- fork while fibers do I/O on every worker --------------------------------- */

#define FK_PAIRS 8

typedef struct {
    async_sched_t *s;
    int sp[FK_PAIRS][2];
    async_chan_t *ch;
    async_mutex_t *mu;
    async_queue_t *q;
    atomic_int stop, bytes, bad, forks_from_fiber;
} fk_t;

static fk_t fk;

static void fk_pinger(void *arg)
{
    int i = (int)(intptr_t)arg;
    unsigned char b = 0, r;
    while (!atomic_load(&fk.stop)) {
        if (async_fiber_write(fk.sp[i][0], &b, 1, BOUND_MS) != 1 || async_fiber_read(fk.sp[i][0], &r, 1, BOUND_MS) != 1 ||
            r != (unsigned char)(b + 1)) {
            atomic_fetch_add(&fk.bad, 1);
            return;
        }
        b = (unsigned char)(r + 1);
        atomic_fetch_add(&fk.bytes, 1);
    }
    shutdown(fk.sp[i][0], SHUT_WR);
}

static void fk_ponger(void *arg)
{
    int i = (int)(intptr_t)arg;
    unsigned char b;
    for (;;) {
        ssize_t n = async_fiber_read(fk.sp[i][1], &b, 1, BOUND_MS);
        if (n == 0)
            return;
        b++;
        if (n != 1 || async_fiber_write(fk.sp[i][1], &b, 1, BOUND_MS) != 1) {
            atomic_fetch_add(&fk.bad, 1);
            return;
        }
    }
}

/* A fiber that keeps the fiber mutex locked across parks (the child sees it
 * locked) and a channel receiver. */
static void fk_locker(void *arg)
{
    (void)arg;
    while (!atomic_load(&fk.stop)) {
        if (async_mutex_lock(fk.mu, BOUND_MS) != 0) {
            atomic_fetch_add(&fk.bad, 1);
            return;
        }
        async_fiber_sleep(1);
        async_mutex_unlock(fk.mu);
        async_fiber_yield();
    }
}

#define FK_EXPECT(call, what)                                                                                  \
    do {                                                                                                       \
        async_clear_error();                                                                                   \
        (void)(call);                                                                                          \
        if (async_last_error() != ASYNC_E_FORKED) {                                                            \
            fprintf(stderr, "child: %s gave error %d, not ASYNC_E_FORKED\n", what, async_last_error());         \
            _exit(3);                                                                                          \
        }                                                                                                      \
    } while (0)

/* In the child: every call fails at once with ASYNC_E_FORKED (an alarm ends
 * a child that hangs). */
static void fk_child(void)
{
    char b[8];
    int v = 1;
    alarm(10);
    if (async_fiber_current() != NULL)
        _exit(4);
    FK_EXPECT(async_fiber_spawn(fk.s, fk_noop, NULL, 0), "spawn");
    FK_EXPECT(async_chan_send(fk.ch, &v, -1), "chan_send");
    FK_EXPECT(async_chan_recv(fk.ch, &v, -1), "chan_recv");
    FK_EXPECT(async_mutex_lock(fk.mu, -1), "mutex_lock");
    FK_EXPECT(async_fiber_read(fk.sp[0][1], b, 1, -1), "fiber_read");
    FK_EXPECT(async_fiber_write(fk.sp[0][1], b, 1, -1), "fiber_write");
    FK_EXPECT(async_fiber_wait_fd(fk.sp[1][1], ASYNC_EVENT_READ, -1), "wait_fd");
    FK_EXPECT(async_fiber_sleep(10), "sleep");
    FK_EXPECT(async_fiber_blocking(fk_noop, NULL), "blocking");
    FK_EXPECT(async_queue_dequeue_wait(fk.q, b, sizeof b, NULL, -1), "queue wait");
    FK_EXPECT(async_sched_shutdown(fk.s, -1), "sched_shutdown");
    FK_EXPECT(async_sched_run(fk.s), "sched_run");
    FK_EXPECT(async_sched_dump(fk.s, 2), "sched_dump");
    FK_EXPECT(async_sched_create(NULL), "sched_create");
    FK_EXPECT(async_runtime_init(), "runtime_init");
    FK_EXPECT(async_worker_create(nop_proc, NULL, 0), "worker_create");
    FK_EXPECT(async_chan_create(1, 1), "chan_create");
    FK_EXPECT(async_fiber_close(fk.sp[2][1]), "fiber_close");
    FK_EXPECT(async_sched_destroy(fk.s), "sched_destroy");
    async_fiber_yield();
    _exit(0);
}

static void fk_wait_child(pid_t pid)
{
    int st;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fprintf(stderr, "forked child: status %#x%s\n", st,
                WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM ? " (it hung)" : "");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void fk_forker_fiber(void *arg)
{
    (void)arg;
    pid_t pid = fork();
    if (pid == 0)
        fk_child();
    if (pid < 0) {
        atomic_fetch_add(&fk.bad, 1);
        return;
    }
    /* the child exits at once (or its alarm fires): a short block of the
     * worker; a failed CHECK on a fiber aborts, which the case sees */
    fk_wait_child(pid);
    atomic_fetch_add(&fk.forks_from_fiber, 1);
}

static void fork_load(int workers)
{
    memset(&fk, 0, sizeof fk);
    fk.s = sched_new(workers);
    fk.ch = async_chan_create(0, sizeof(int));
    fk.mu = async_mutex_create();
    fk.q = async_queue_create(4, 8, 0);
    CHECK(fk.ch && fk.mu && fk.q);
    for (int i = 0; i < FK_PAIRS; i++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fk.sp[i]), 0);
        if (i % 2)
            CHECK_EQ(async_fiber_fd_open(fk.s, fk.sp[i][0]), 0);
        CHECK(async_fiber_spawn(fk.s, fk_pinger, (void *)(intptr_t)i, 0) != NULL);
        CHECK(async_fiber_spawn(fk.s, fk_ponger, (void *)(intptr_t)i, 0) != NULL);
    }
    CHECK(async_fiber_spawn(fk.s, fk_locker, NULL, 0) != NULL);
    for (int round = 0; round < 20; round++) {
        int b0 = atomic_load(&fk.bytes);
        wait_count(&fk.bytes, b0 + 50, "ping-pong bytes");
        if (round % 4 == 3) {
            int f0 = atomic_load(&fk.forks_from_fiber);
            CHECK(async_fiber_spawn(fk.s, fk_forker_fiber, NULL, 0) != NULL);
            wait_count(&fk.forks_from_fiber, f0 + 1, "fork from a fiber");
            continue;
        }
        pid_t pid = fork_flushed();
        if (pid == 0)
            fk_child();
        fk_wait_child(pid);
    }
    atomic_store(&fk.stop, 1);
    CHECK_EQ(async_sched_run(fk.s), 0);
    CHECK_EQ(atomic_load(&fk.bad), 0);
    async_sched_destroy(fk.s);
    for (int i = 0; i < FK_PAIRS; i++) {
        close_pair(fk.sp[i]);
    }
    async_chan_destroy(fk.ch);
    async_mutex_destroy(fk.mu);
    async_queue_destroy(fk.q);
}

CASE(fork_load_1w) { fork_load(1); } // uring adversarial

CASE(fork_load_2w) { fork_load(2); } // uring adversarial

TEST_MAIN()
