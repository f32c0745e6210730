/* test_adv12.c — adversarial pass 12: resource exhaustion in the middle of a
 * load, as include/async.h promises it: RLIMIT_NOFILE lowered while fibers
 * accept, connect, read and write loopback TCP (and raised again), every
 * constructor that needs descriptors tried with 0..n left (the documented
 * error, no descriptor leaked), RLIMIT_AS lowered in a child process while
 * fibers, threads and objects are created. See docs/RELIABILITY.md,
 * "Adversarial pass 12". No assertion is timed: every wait is bounded so that
 * a hang fails the case instead. */
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "check.h"

#define BOUND_MS 20000

#define wait_count(v, target, what) wait_count_within(v, target, BOUND_MS, what)

/* ---- a descriptor famine: fill every free number up to a lowered limit ---- */

typedef struct {
    struct rlimit saved;
    int fill[4200];
    int nfill;
} famine_t;

static void famine_free(famine_t *f, int n);

/* Open descriptors below 4096 without opening one (works at EMFILE). */
static int open_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            n++;
    return n;
}

/* Lowers the soft RLIMIT_NOFILE to just above the highest open fd + slack
 * and fills every free number below it, then frees `left` of them. */
static void famine_begin(famine_t *f, int slack, int left)
{
    struct rlimit lim;
    int maxfd = 0;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &f->saved), 0);
    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            maxfd = fd;
    lim = f->saved;
    lim.rlim_cur = (rlim_t)maxfd + 1 + (rlim_t)slack;
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &lim), 0);
    f->nfill = 0;
    for (;;) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            CHECK(errno == EMFILE);
            break;
        }
        CHECK(f->nfill < 4200);
        f->fill[f->nfill++] = fd;
    }
    famine_free(f, left);
}

static void famine_free(famine_t *f, int n)
{
    CHECK(f->nfill >= n);
    for (int i = 0; i < n; i++)
        close(f->fill[--f->nfill]);
}

static void famine_end(famine_t *f)
{
    while (f->nfill > 0)
        close(f->fill[--f->nfill]);
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &f->saved), 0);
}

/* ---- every constructor that needs descriptors, with 0..n of them left ---- */

static void *nop_proc(void *arg)
{
    return arg;
}

static int err_in(int e, int a, int b)
{
    return e == a || e == b;
}

/* The calls that open descriptors, each tried with `left` free numbers: it
 * succeeds, or fails with its documented error and leaves no descriptor
 * behind; what succeeded gives every descriptor back when destroyed. */
static void sweep_once(int left, async_sched_t *live, int *fails)
{
    famine_t *f = calloc(1, sizeof *f);
    CHECK(f != NULL);
    famine_begin(f, 48, left);
    int n0 = open_fds();
    for (int workers = 1; workers <= 2; workers++) {
        async_sched_config_t cfg = {workers, 0, 0};
        async_clear_error();
        async_sched_t *s = async_sched_create(&cfg);
        if (!s) {
            int e = async_last_error();
            if (!err_in(e, ASYNC_E_NOMEM, ASYNC_E_SYS))
                fprintf(stderr, "left %d: async_sched_create(%d) failed with %d\n", left, workers, e);
            CHECK(err_in(e, ASYNC_E_NOMEM, ASYNC_E_SYS));
            fails[0]++;
        } else {
            async_sched_destroy(s);
        }
        if (open_fds() != n0)
            fprintf(stderr, "left %d: async_sched_create(%d) %s: %d fds, %d before\n", left, workers,
                    s ? "+ destroy" : "failed", open_fds(), n0);
        CHECK_EQ(open_fds(), n0);
    }
    async_clear_error();
    async_runtime_t *rt = async_runtime_init();
    if (!rt) {
        CHECK(err_in(async_last_error(), ASYNC_E_NOMEM, ASYNC_E_SYS));
        fails[1]++;
    } else {
        async_runtime_deinit(rt);
    }
    if (open_fds() != n0)
        fprintf(stderr, "left %d: async_runtime_init: %d fds, %d before\n", left, open_fds(), n0);
    CHECK_EQ(open_fds(), n0);
    async_clear_error();
    async_worker_t *w = async_worker_create(nop_proc, NULL, 0);
    if (!w) {
        int e = async_last_error();
        if (!err_in(e, ASYNC_E_NOMEM, ASYNC_E_SYS))
            fprintf(stderr, "left %d: async_worker_create failed with %d\n", left, e);
        CHECK(err_in(e, ASYNC_E_NOMEM, ASYNC_E_SYS));
        fails[2]++;
    } else {
        CHECK(async_worker_join(w, BOUND_MS));
        async_worker_destroy(w);
    }
    if (open_fds() != n0)
        fprintf(stderr, "left %d: async_worker_create: %d fds, %d before\n", left, open_fds(), n0);
    CHECK_EQ(open_fds(), n0);
    /* the fiber-side signal watch (a pipe once per signal) and a runtime's */
    async_clear_error();
    if (async_fiber_watch_signal(SIGUSR2) != 0) {
        CHECK_ERR(ASYNC_E_SYS);
        CHECK_EQ(open_fds(), n0);
        fails[4]++;
    } else {
        CHECK_EQ(async_fiber_unwatch_signal(SIGUSR2), 0);
        n0 = open_fds(); /* the pipe may stay for the next watch */
    }
    /* the stall monitor: a thread, no descriptor expected */
    async_clear_error();
    if (async_sched_set_stall_ms(live, 1000) != 0) {
        CHECK(err_in(async_last_error(), ASYNC_E_NOMEM, ASYNC_E_SYS));
        fails[3]++;
    } else {
        CHECK_EQ(async_sched_set_stall_ms(live, 0), 0);
    }
    CHECK_EQ(open_fds(), n0);
    famine_end(f);
    free(f);
}

static void t_nofile_sweep(void)
{
    /* warm up: Go's poller, a first scheduler, the blocking pool */
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    async_runtime_deinit(rt);
    async_sched_t *live = sched_new(2);
    int fails[5] = {0, 0, 0, 0, 0};
    for (int left = 0; left <= 24; left++)
        sweep_once(left, live, fails);
    printf("failures: sched_create %d, runtime_init %d, worker_create %d, stall %d, watch_signal %d\n",
           fails[0], fails[1], fails[2], fails[3], fails[4]);
    CHECK(fails[0] > 0 && fails[1] > 0);
    /* and everything works again */
    for (int i = 0; i < 3; i++) {
        async_sched_t *s = sched_new(2);
        async_sched_destroy(s);
    }
    async_sched_destroy(live);
}

/* ---- an echo load on loopback TCP while the descriptors run out ------------ */

#define LD_CLIENTS 8 /* per phase: early ones connect before the famine, late ones during it */
#define LD_ROUNDS 300
#define LD_CHUNK 1500

typedef struct {
    async_sched_t *s;
    int lfd;
    struct sockaddr_in addr;
    int csock[2 * LD_CLIENTS];
    atomic_int accepted, accept_nomem, accept_other, accept_other_code;
    atomic_int rounds;   /* client rounds completed, all clients */
    atomic_int done;     /* clients finished */
    atomic_int bad;      /* a byte echoed wrong, a call failed */
    atomic_int echo_end; /* echo fibers that saw end of file */
    atomic_int famine_over;
    atomic_int famine_checks;
} ld_t;

static ld_t ld;

static void ld_bad(const char *what, int code)
{
    fprintf(stderr, "load: %s (error %d, os %d)\n", what, code, async_last_os_error());
    atomic_fetch_add(&ld.bad, 1);
}

static void ld_echo(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char buf[4096];
    for (;;) {
        ssize_t r = async_fiber_read(fd, buf, sizeof buf, BOUND_MS);
        if (r == 0)
            break;
        if (r < 0) {
            ld_bad("echo read", async_last_error());
            break;
        }
        if (async_fiber_write(fd, buf, (size_t)r, BOUND_MS) != r) {
            ld_bad("echo write", async_last_error());
            break;
        }
    }
    atomic_fetch_add(&ld.echo_end, 1);
    if (async_fiber_close(fd) != 0)
        ld_bad("echo close", async_last_error());
}

static void ld_acceptor(void *arg)
{
    (void)arg;
    double t0 = now_ms();
    while (atomic_load(&ld.accepted) < 2 * LD_CLIENTS) {
        if (now_ms() - t0 > BOUND_MS) {
            ld_bad("acceptor gave up", 0);
            return;
        }
        async_clear_error();
        int fd = async_fiber_accept(ld.lfd, NULL, NULL, 200);
        if (fd < 0) {
            int e = async_last_error();
            if (e == ASYNC_E_NOMEM) {
                atomic_fetch_add(&ld.accept_nomem, 1);
                async_fiber_sleep(1);
            } else if (e != ASYNC_E_TIMEDOUT) {
                atomic_fetch_add(&ld.accept_other, 1);
                atomic_store(&ld.accept_other_code, e);
                async_fiber_sleep(1);
            }
            continue;
        }
        atomic_fetch_add(&ld.accepted, 1);
        /* a spawn needs no descriptor: it works in the famine too */
        if (!async_fiber_spawn(ld.s, ld_echo, (void *)(intptr_t)fd, 0)) {
            ld_bad("spawn echo", async_last_error());
            close(fd);
        }
    }
}

static void ld_client(void *arg)
{
    int id = (int)(intptr_t)arg;
    int fd = ld.csock[id];
    unsigned char out[LD_CHUNK], in[LD_CHUNK];
    if (async_fiber_connect(fd, (struct sockaddr *)&ld.addr, sizeof ld.addr, BOUND_MS) != 0) {
        ld_bad("connect", async_last_error());
        goto out;
    }
    /* an early client goes on until the famine is over: its end would free
     * descriptors for the acceptor */
    for (int r = 0; r < LD_ROUNDS || !atomic_load(&ld.famine_over); r++) {
        size_t len = 1 + (size_t)((id * 131 + r * 17) % LD_CHUNK);
        for (size_t i = 0; i < len; i++)
            out[i] = (unsigned char)(id * 7 + r * 3 + i);
        if (async_fiber_write(fd, out, len, BOUND_MS) != (ssize_t)len) {
            ld_bad("client write", async_last_error());
            goto out;
        }
        size_t got = 0;
        while (got < len) {
            ssize_t n = async_fiber_read(fd, in + got, len - got, BOUND_MS);
            if (n <= 0) {
                ld_bad(n == 0 ? "client read: early end of file" : "client read", async_last_error());
                goto out;
            }
            got += (size_t)n;
        }
        if (memcmp(in, out, len) != 0) {
            ld_bad("echo differs", 0);
            goto out;
        }
        atomic_fetch_add(&ld.rounds, 1);
    }
out:
    shutdown(fd, SHUT_WR);
    char b;
    (void)async_fiber_read(fd, &b, 1, BOUND_MS); /* the server's end of file */
    if (async_fiber_close(fd) != 0)
        ld_bad("client close", async_last_error());
    atomic_fetch_add(&ld.done, 1);
}

static void *ld_client_thread(void *arg)
{
    ld_client(arg);
    return NULL;
}

/* In the famine, on a fiber: what needs no descriptor works, what needs one
 * fails with its documented error. */
static void ld_famine_probe(void *arg)
{
    (void)arg;
    async_sched_config_t cfg = {1, 0, 0};
    async_clear_error();
    async_sched_t *s2 = async_sched_create(&cfg);
    if (s2) {
        async_sched_destroy(s2); /* a descriptor was freed meanwhile: fine */
    } else if (!err_in(async_last_error(), ASYNC_E_NOMEM, ASYNC_E_SYS)) {
        ld_bad("sched_create in the famine", async_last_error());
    }
    async_chan_t *c = async_chan_create(4, sizeof(int));
    if (!c)
        ld_bad("chan_create in the famine", async_last_error());
    else
        async_chan_destroy(c);
    if (async_fiber_sleep(1) != 0)
        ld_bad("sleep in the famine", async_last_error());
    atomic_fetch_add(&ld.famine_checks, 1);
}

static atomic_int sig_stop, sig_count;

static void on_sig(int sig)
{
    (void)sig;
    atomic_fetch_add(&sig_count, 1);
}

/* Sends SIGUSR1 to the process (whichever thread takes it: workers, the
 * host, the blocking pool) until told to stop, with a pause now and then. */
static void *sig_flood(void *arg)
{
    (void)arg;
    for (int i = 0; !atomic_load(&sig_stop); i++) {
        kill(getpid(), SIGUSR1);
        if (i % 16 == 0)
            usleep(50);
    }
    return NULL;
}

static void nofile_load(int workers, int own_listener, int signals)
{
    pthread_t flood;
    memset(&ld, 0, sizeof ld);
    if (signals) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sig;
        sa.sa_flags = SA_ONSTACK; /* no SA_RESTART: every slow call sees EINTR */
        sigemptyset(&sa.sa_mask);
        CHECK_EQ(sigaction(SIGUSR1, &sa, NULL), 0);
        atomic_store(&sig_stop, 0);
        start_thread(&flood, sig_flood, NULL);
    }
    ld.s = sched_new(workers);
    ld.lfd = loopback_listener(128, &ld.addr);
    if (own_listener)
        CHECK_EQ(async_fiber_fd_open(ld.s, ld.lfd), 0);
    for (int i = 0; i < 2 * LD_CLIENTS; i++) {
        ld.csock[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(ld.csock[i] >= 0);
        if (own_listener && i % 2)
            CHECK_EQ(async_fiber_fd_open(ld.s, ld.csock[i]), 0);
    }
    CHECK(async_fiber_spawn(ld.s, ld_acceptor, NULL, 0) != NULL);
    /* with signals, client 0 runs on a plain thread: its waits are poll(2),
     * which the signals interrupt */
    pthread_t plain;
    if (signals)
        start_thread(&plain, ld_client_thread, (void *)(intptr_t)0);
    for (int i = signals ? 1 : 0; i < LD_CLIENTS; i++)
        CHECK(async_fiber_spawn(ld.s, ld_client, (void *)(intptr_t)i, 0) != NULL);
    wait_count(&ld.accepted, LD_CLIENTS, "early connections accepted");
    wait_count(&ld.rounds, LD_CLIENTS * 10, "early rounds");

    famine_t *f = calloc(1, sizeof *f);
    CHECK(f != NULL);
    famine_begin(f, 16, 0);
    for (int i = LD_CLIENTS; i < 2 * LD_CLIENTS; i++)
        CHECK(async_fiber_spawn(ld.s, ld_client, (void *)(intptr_t)i, 0) != NULL);
    CHECK(async_fiber_spawn(ld.s, ld_famine_probe, NULL, 0) != NULL);
    /* the acceptor meets EMFILE, the early clients go on */
    wait_count(&ld.accept_nomem, 3, "accepts failed with ASYNC_E_NOMEM");
    int r0 = atomic_load(&ld.rounds);
    wait_count(&ld.rounds, r0 + LD_CLIENTS * 5, "rounds in the famine");
    wait_count(&ld.famine_checks, 1, "famine probe");
    /* a plain thread's accept at EMFILE: NOMEM at once, the connection stays
     * pending (it is accepted by the acceptor fiber once the limit is up) */
    async_clear_error();
    CHECK(async_fiber_accept(ld.lfd, NULL, NULL, 0) < 0);
    CHECK_ERR(ASYNC_E_NOMEM);
    async_clear_error();
    CHECK(async_fiber_accept(ld.lfd, NULL, NULL, 50) < 0);
    CHECK_ERR(ASYNC_E_NOMEM);
    CHECK(atomic_load(&ld.accepted) < 2 * LD_CLIENTS);
    famine_end(f);
    free(f);
    atomic_store(&ld.famine_over, 1);

    wait_count(&ld.done, 2 * LD_CLIENTS, "clients done");
    if (signals)
        join_within(plain, BOUND_MS, "plain-thread client");
    wait_count(&ld.echo_end, 2 * LD_CLIENTS, "echo fibers ended");
    CHECK_EQ(async_sched_run(ld.s), 0);
    printf("accepted %d, accept NOMEM %d, other %d (last %d), rounds %d, bad %d\n", atomic_load(&ld.accepted),
           atomic_load(&ld.accept_nomem), atomic_load(&ld.accept_other), atomic_load(&ld.accept_other_code),
           atomic_load(&ld.rounds), atomic_load(&ld.bad));
    CHECK_EQ(atomic_load(&ld.bad), 0);
    CHECK_EQ(atomic_load(&ld.accept_other), 0);
    CHECK_EQ(atomic_load(&ld.accepted), 2 * LD_CLIENTS);
    CHECK(atomic_load(&ld.rounds) >= 2 * LD_CLIENTS * LD_ROUNDS);
    CHECK_EQ(async_fiber_close(ld.lfd), 0);
    async_sched_destroy(ld.s);
    if (signals) {
        atomic_store(&sig_stop, 1);
        join_within(flood, BOUND_MS, "signal flood");
        printf("%d signals handled\n", atomic_load(&sig_count));
        CHECK(atomic_load(&sig_count) > 0);
    }
}

static void t_load_plain_1w(void)
{
    nofile_load(1, 0, 0);
}

static void t_load_plain_2w(void)
{
    nofile_load(2, 0, 0);
}

static void t_load_owned_1w(void)
{
    nofile_load(1, 1, 0);
}

static void t_load_owned_2w(void)
{
    nofile_load(2, 1, 0);
}

/* The same with SIGUSR1 arriving all along (a handler without SA_RESTART). */
static void t_load_signals_1w(void)
{
    nofile_load(1, 0, 1);
}

static void t_load_signals_2w(void)
{
    nofile_load(2, 1, 1);
}

/* A *_child case runs only in the child its parent case starts. */
static int child_only(void)
{
    if (getenv("ADV12_CHILD"))
        return 1;
    printf("skipped: run by its parent case in a child process\n");
    return 0;
}

/* ---- no thread can be created (RLIMIT_NPROC of an unprivileged user) ---------- */

static void *nt_thread(void *arg)
{
    return arg;
}

/* Can this process start a thread now? */
static int can_start_thread(void)
{
    pthread_t t;
    int rc = pthread_create(&t, NULL, nt_thread, NULL);
    if (rc == 0)
        pthread_join(t, NULL);
    return rc == 0;
}

static void nproc_set(rlim_t soft)
{
    struct rlimit rl;
    CHECK_EQ(getrlimit(RLIMIT_NPROC, &rl), 0);
    rl.rlim_cur = soft == RLIM_INFINITY ? rl.rlim_max : soft;
    CHECK_EQ(setrlimit(RLIMIT_NPROC, &rl), 0);
}

/* Root ignores RLIMIT_NPROC: become nobody first (in the child only). */
static int become_unprivileged(void)
{
    if (geteuid() != 0)
        return 1;
#if defined(__linux__)
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)
        return 0;
#else /* no setresuid on darwin: setgid/setuid as root set all three ids */
    if (setgid(65534) != 0 || setuid(65534) != 0)
        return 0;
#endif
    return 1;
}

typedef struct {
    atomic_int ran, done, bad, refused, on_fiber;
    atomic_int arrived; /* jobs that have begun */
    int need;           /* jobs that wait for each other */
} nt_t;

static nt_t nt;

/* A blocking job of the kind the header allows: it waits for the other jobs
 * of its batch ("they may wait for each other"), bounded: a job that could
 * not get a thread must have been refused, never left queued behind them. */
static void nt_job(void *arg)
{
    (void)arg;
    if (async_fiber_current() != NULL)
        atomic_fetch_add(&nt.on_fiber, 1);
    atomic_fetch_add(&nt.arrived, 1);
    double t0 = now_ms();
    while (atomic_load(&nt.arrived) + atomic_load(&nt.refused) < nt.need && now_ms() - t0 < 5000)
        usleep(100);
    if (atomic_load(&nt.arrived) + atomic_load(&nt.refused) < nt.need) {
        fprintf(stderr, "a blocking job waited 5 s for another one that neither ran nor was refused\n");
        atomic_fetch_add(&nt.bad, 1);
    }
    atomic_fetch_add(&nt.ran, 1);
}

/* A job that needs a thread's stack: 256 KiB of locals (a fiber has 64). */
static void nt_deep_job(void *arg)
{
    (void)arg;
    volatile char big[256 * 1024];
    if (async_fiber_current() != NULL)
        atomic_fetch_add(&nt.on_fiber, 1);
    for (size_t i = 0; i < sizeof big; i += 512)
        big[i] = (char)i;
    atomic_fetch_add(&nt.ran, 1);
}

static void nt_blocking_fiber(void *arg)
{
    async_clear_error();
    int r = async_fiber_blocking(arg ? nt_deep_job : nt_job, NULL);
    if (r != 0) {
        int e = async_last_error();
        if (!err_in(e, ASYNC_E_NOMEM, ASYNC_E_SYS)) {
            fprintf(stderr, "async_fiber_blocking: error %d\n", e);
            atomic_fetch_add(&nt.bad, 1);
        }
        atomic_fetch_add(&nt.refused, 1);
    }
    atomic_fetch_add(&nt.done, 1);
}

static void nt_batch(async_sched_t *s, int n, int deep)
{
    memset(&nt, 0, sizeof nt);
    nt.need = n;
    for (int i = 0; i < n; i++)
        CHECK(async_fiber_spawn(s, nt_blocking_fiber, deep ? (void *)1 : NULL, 0) != NULL);
    wait_count(&nt.done, n, "blocking calls returned");
    CHECK_EQ(atomic_load(&nt.bad), 0);
    CHECK_EQ(atomic_load(&nt.on_fiber), 0); /* fn runs on a plain thread */
    CHECK_EQ(atomic_load(&nt.ran) + atomic_load(&nt.refused), n);
}

/* The thread limit on; returns 0 (the child exits: skipped) where it
 * cannot be had. */
static int nt_limit(void)
{
    if (!become_unprivileged()) {
        printf("skipped: cannot become an unprivileged user\n");
        return 0;
    }
    nproc_set(1);
    if (can_start_thread()) {
        printf("skipped: RLIMIT_NPROC does not stop thread creation here\n");
        return 0;
    }
    return 1;
}

/* No thread can be started and the blocking pool has none: a job that needs
 * a thread's stack, and two jobs on one worker that wait for each other. */
static void t_nothreads_pool_empty_child(void)
{
    if (!child_only())
        return;
    async_sched_t *s = sched_new(1);
    if (!nt_limit())
        exit(0);
    nt_batch(s, 1, 1);
    nt_batch(s, 2, 0);
    printf("refused %d\n", atomic_load(&nt.refused));
    nproc_set(RLIM_INFINITY);
    nt_batch(s, 1, 1);
    CHECK_EQ(atomic_load(&nt.ran), 1);
    nt_batch(s, 4, 0);
    CHECK_EQ(atomic_load(&nt.ran), 4);
    async_sched_destroy(s);
    exit(0);
}

/* No thread can be started, the pool has one thread and it is busy with a
 * job that waits for the next one. */
static void t_nothreads_pool_busy_child(void)
{
    if (!child_only())
        return;
    async_sched_t *s = sched_new(2);
    nt_batch(s, 1, 0); /* the pool now has one (idle) thread */
    CHECK_EQ(atomic_load(&nt.ran), 1);
    if (!nt_limit())
        exit(0);
    memset(&nt, 0, sizeof nt);
    nt.need = 2;
    CHECK(async_fiber_spawn(s, nt_blocking_fiber, NULL, 0) != NULL);
    wait_count(&nt.arrived, 1, "the first job on the pool thread");
    CHECK(async_fiber_spawn(s, nt_blocking_fiber, NULL, 0) != NULL);
    wait_count(&nt.done, 2, "blocking calls returned");
    CHECK_EQ(atomic_load(&nt.bad), 0);
    CHECK_EQ(atomic_load(&nt.on_fiber), 0);
    CHECK_EQ(atomic_load(&nt.ran) + atomic_load(&nt.refused), 2);
    nproc_set(RLIM_INFINITY);
    nt_batch(s, 8, 0);
    CHECK_EQ(atomic_load(&nt.ran), 8);
    async_sched_destroy(s);
    exit(0);
}

/* No thread can be started: the constructors that start threads fail with
 * their documented errors and leave nothing behind; all works once the limit
 * is raised. */
static void t_nothreads_calls_child(void)
{
    if (!child_only())
        return;
    async_sched_t *s = sched_new(1);
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    if (!nt_limit())
        exit(0);
    int n0 = open_fds();
    async_clear_error();
    CHECK(async_worker_create(nop_proc, NULL, 0) == NULL);
    CHECK(err_in(async_last_error(), ASYNC_E_NOMEM, ASYNC_E_SYS));
    CHECK_EQ(open_fds(), n0);
    async_sched_config_t cfg = {2, 0, 0};
    async_clear_error();
    CHECK(async_sched_create(&cfg) == NULL);
    CHECK(err_in(async_last_error(), ASYNC_E_NOMEM, ASYNC_E_SYS));
    CHECK_EQ(open_fds(), n0);
    async_clear_error();
    CHECK(async_sched_set_stall_ms(s, 100) != 0);
    CHECK(err_in(async_last_error(), ASYNC_E_NOMEM, ASYNC_E_SYS));
    async_runtime_t *rt2 = async_runtime_init();
    if (rt2)
        async_runtime_deinit(rt2);
    else
        CHECK(err_in(async_last_error(), ASYNC_E_NOMEM, ASYNC_E_SYS));
    nproc_set(RLIM_INFINITY);
    CHECK(can_start_thread());
    async_worker_t *w = async_worker_create(nop_proc, NULL, 0);
    CHECK(w != NULL);
    CHECK(async_worker_join(w, BOUND_MS));
    async_worker_destroy(w);
    async_sched_t *s2 = async_sched_create(&cfg);
    CHECK(s2 != NULL);
    async_sched_destroy(s2);
    CHECK_EQ(async_sched_set_stall_ms(s, 100), 0);
    CHECK_EQ(async_sched_set_stall_ms(s, 0), 0);
    async_sched_destroy(s);
    async_runtime_deinit(rt);
    exit(0);
}

static void run_child(const char *name)
{
    if (getenv("ASYNC_TEST_EMULATOR")) {
        printf("skipped under an emulator\n");
        return;
    }
    int st = run_self_case(name, "ADV12_CHILD=1");
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
}

static void t_nothreads_pool_empty(void)
{
    run_child("nothreads_pool_empty_child");
}

static void t_nothreads_pool_busy(void)
{
    run_child("nothreads_pool_busy_child");
}

static void t_nothreads_calls(void)
{
    run_child("nothreads_calls_child");
}

/* ---- only k more threads: partial failures of the constructors ----------------- */

static int threads_now(void)
{
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;
    CHECK(fp != NULL);
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    fclose(fp);
    return n;
}

/* Waits (bounded) for the thread count to come down to n: exiting threads
 * leave the count a moment after their joiners return. */
static int threads_back_to(int n)
{
    double t0 = now_ms();
    while (threads_now() > n && now_ms() - t0 < BOUND_MS)
        usleep(200);
    return threads_now();
}

static void t_nothreads_partial_child(void)
{
    if (!child_only())
        return;
    async_sched_t *s = sched_new(1);
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    async_runtime_deinit(rt);
    if (!become_unprivileged()) {
        printf("skipped: cannot become an unprivileged user\n");
        exit(0);
    }
    int failed = 0;
    for (int k = 0; k <= 6; k++) {
        int t0 = threads_now();
        nproc_set((rlim_t)t0 + (rlim_t)k);
        int f0 = open_fds();
        for (int workers = 1; workers <= 4; workers++) {
            async_sched_config_t cfg = {workers, 0, 0};
            async_clear_error();
            async_sched_t *s2 = async_sched_create(&cfg);
            if (s2) {
                async_sched_destroy(s2);
            } else {
                CHECK(err_in(async_last_error(), ASYNC_E_NOMEM, ASYNC_E_SYS));
                failed++;
            }
            CHECK_EQ(open_fds(), f0);
            int t1 = threads_back_to(t0);
            if (t1 != t0)
                fprintf(stderr, "k %d, %d workers: %d threads, %d before\n", k, workers, t1, t0);
            CHECK_EQ(t1, t0);
        }
        async_clear_error();
        if (async_sched_set_stall_ms(s, 50) == 0)
            CHECK_EQ(async_sched_set_stall_ms(s, 0), 0);
        else
            CHECK(err_in(async_last_error(), ASYNC_E_NOMEM, ASYNC_E_SYS));
        CHECK_EQ(threads_back_to(t0), t0);
        nproc_set(RLIM_INFINITY);
    }
    printf("%d scheduler creations refused\n", failed);
    CHECK(failed > 0);
    async_sched_config_t cfg = {4, 0, 0};
    async_sched_t *s2 = async_sched_create(&cfg);
    CHECK(s2 != NULL);
    async_sched_destroy(s2);
    async_sched_destroy(s);
    exit(0);
}

static void t_nothreads_partial(void)
{
    run_child("nothreads_partial_child");
}

/* ---- a joined and destroyed worker gives its descriptor back ------------------- */

/* async_worker_join returned (proc has returned) and async_worker_destroy
 * released the worker: its stop descriptor is closed by then, so a host at
 * its descriptor limit can open one at once. Before the fix the worker's
 * own thread, still on its way out after waking the joiner, closed it a
 * moment later. */
static void t_worker_fd_back(void)
{
    async_runtime_t *rt = async_runtime_init(); /* Go's poller: two fds, for good */
    CHECK(rt != NULL);
    async_runtime_deinit(rt);
    int n0 = open_fds(), late = 0;
    for (int i = 0; i < 2000; i++) {
        async_worker_t *w = async_worker_create(nop_proc, NULL, 0);
        CHECK(w != NULL);
        CHECK(async_worker_join(w, BOUND_MS));
        async_worker_destroy(w);
        if (open_fds() != n0)
            late++;
        double t0 = now_ms();
        while (open_fds() != n0 && now_ms() - t0 < BOUND_MS)
            usleep(100);
        CHECK_EQ(open_fds(), n0); /* never a leak */
    }
    if (late)
        fprintf(stderr, "%d of 2000 workers closed their stop descriptor after destroy returned\n", late);
    CHECK_EQ(late, 0);
}

/* ---- the address space runs out (RLIMIT_AS) while fibers ping-pong ----------- */

typedef struct {
    async_chan_t *park;    /* never sent to: the spawned fibers wait on it */
    async_chan_t *ping, *pong;
    atomic_int pongs, parked_ended, bad, stop;
} as_t;

static as_t as;

static void as_parker(void *arg)
{
    (void)arg;
    int v;
    if (async_chan_recv(as.park, &v, -1) == 0 || async_last_error() != ASYNC_E_CLOSED)
        atomic_fetch_add(&as.bad, 1);
    atomic_fetch_add(&as.parked_ended, 1);
}

static void as_ponger(void *arg)
{
    (void)arg;
    int v;
    while (async_chan_recv(as.ping, &v, -1) == 0) {
        if (async_chan_send(as.pong, &v, -1) != 0) {
            atomic_fetch_add(&as.bad, 1);
            return;
        }
    }
}

static void as_pinger(void *arg)
{
    (void)arg;
    for (int i = 0; !atomic_load(&as.stop); i++) {
        int v = i, w = -1;
        if (async_chan_send(as.ping, &v, -1) != 0 || async_chan_recv(as.pong, &w, -1) != 0 || w != i) {
            atomic_fetch_add(&as.bad, 1);
            return;
        }
        atomic_fetch_add(&as.pongs, 1);
    }
    async_chan_close(as.ping);
}

static long vm_size_kb(void)
{
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    CHECK(fp != NULL);
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, "VmSize: %ld kB", &kb) == 1)
            break;
    fclose(fp);
    return kb;
}

static void as_set(rlim_t v)
{
    struct rlimit rl;
    CHECK_EQ(getrlimit(RLIMIT_AS, &rl), 0);
    rl.rlim_cur = v;
    CHECK_EQ(setrlimit(RLIMIT_AS, &rl), 0);
}

#define AS_MAX 200000

/* Every constructor at the limit: it works or fails with NOMEM (SYS for a
 * thread some report so), and the process goes on. */
static void as_constructors(async_sched_t *s, int *nomem)
{
    async_clear_error();
    async_queue_t *q = async_queue_create(64, 64, 0);
    if (q) async_queue_destroy(q); else { CHECK_ERR(ASYNC_E_NOMEM); nomem[0]++; }
    async_chan_t *c = async_chan_create(64, 64);
    if (c) async_chan_destroy(c); else { CHECK_ERR(ASYNC_E_NOMEM); nomem[1]++; }
    async_mutex_t *m = async_mutex_create();
    if (m) async_mutex_destroy(m); else { CHECK_ERR(ASYNC_E_NOMEM); nomem[2]++; }
    /* async_runtime_init is not tried here: its Go half can abort the process
     * at this limit (docs/RELIABILITY.md, pass 12, "Not done") */
    async_clear_error();
    async_worker_t *w = async_worker_create(nop_proc, NULL, 0);
    if (w) {
        CHECK(async_worker_join(w, BOUND_MS));
        async_worker_destroy(w);
    } else {
        CHECK(err_in(async_last_error(), ASYNC_E_NOMEM, ASYNC_E_SYS));
        nomem[4]++;
    }
    async_sched_config_t cfg = {2, 0, 0};
    async_clear_error();
    async_sched_t *s2 = async_sched_create(&cfg);
    if (s2) {
        async_sched_destroy(s2);
    } else {
        CHECK(err_in(async_last_error(), ASYNC_E_NOMEM, ASYNC_E_SYS));
        nomem[5]++;
    }
    /* a dump of every live fiber (built in memory first) */
    int dn = open("/dev/null", O_WRONLY | O_CLOEXEC);
    CHECK(dn >= 0);
    async_clear_error();
    if (async_sched_dump(s, dn) < 0) {
        CHECK_ERR(ASYNC_E_NOMEM);
        nomem[7]++;
    }
    close(dn);
    /* fiber-local storage off a fiber (a plain thread's values) */
    async_fiber_key_t key;
    async_clear_error();
    if (async_fiber_key_create(&key, NULL) == 0) {
        async_clear_error();
        if (async_fiber_setspecific(key, &key) == 0)
            CHECK(async_fiber_getspecific(key) == &key);
        else
            CHECK_ERR(ASYNC_E_NOMEM);
        CHECK_EQ(async_fiber_key_delete(key), 0);
    } else {
        CHECK_ERR(ASYNC_E_NOMEM);
    }
    /* an owned fd: its record may not fit; a plain thread's I/O on it works */
    int sp[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    async_clear_error();
    if (async_fiber_fd_open(s, sp[0]) != 0) {
        CHECK_ERR(ASYNC_E_NOMEM);
        nomem[6]++;
    }
    char b = 0;
    CHECK_EQ(async_fiber_write(sp[1], "z", 1, BOUND_MS), 1);
    CHECK_EQ(async_fiber_read(sp[0], &b, 1, BOUND_MS), 1);
    CHECK_EQ(b, 'z');
    CHECK_EQ(async_fiber_close(sp[0]), 0);
    CHECK_EQ(async_fiber_close(sp[1]), 0);
}

static void t_as_load_child(void)
{
    if (!child_only())
        return;
    async_sched_t *s = sched_new(2);
    static async_fiber_t *fib[AS_MAX];
    as.park = async_chan_create(1, sizeof(int));
    as.ping = async_chan_create(0, sizeof(int));
    as.pong = async_chan_create(0, sizeof(int));
    CHECK(as.park && as.ping && as.pong);
    CHECK(async_fiber_spawn(s, as_ponger, NULL, 0) != NULL);
    CHECK(async_fiber_spawn(s, as_pinger, NULL, 0) != NULL);
    wait_count(&as.pongs, 100, "pongs before");
    /* warm the allocators, then leave 96 MiB of address space */
    long kb = vm_size_kb();
    CHECK(kb > 0);
    as_set((rlim_t)kb * 1024 + ((rlim_t)96 << 20));
    int n = 0, round_n[3] = {0, 0, 0};
    for (int round = 0; round < 3; round++) {
        n = 0;
        for (; n < AS_MAX; n++) {
            async_clear_error();
            fib[n] = async_fiber_spawn(s, as_parker, NULL, 0);
            if (!fib[n]) {
                if (async_last_error() != ASYNC_E_NOMEM)
                    fprintf(stderr, "spawn %d: error %d\n", n, async_last_error());
                CHECK_ERR(ASYNC_E_NOMEM);
                break;
            }
        }
        CHECK(n > 0 && n < AS_MAX);
        round_n[round] = n;
        /* at the limit: the ping-pong goes on, the constructors fail cleanly */
        int p0 = atomic_load(&as.pongs);
        wait_count(&as.pongs, p0 + 100, "pongs at the limit");
        int nomem[8] = {0};
        as_constructors(s, nomem);
        printf("round %d: %d fibers; NOMEM: queue %d chan %d mutex %d runtime %d worker %d sched %d fd_open %d "
               "dump %d\n",
               round, n, nomem[0], nomem[1], nomem[2], nomem[3], nomem[4], nomem[5], nomem[6], nomem[7]);
        /* and with malloc exhausted too (the ping-pong allocates nothing) */
        static void *hog[1 << 18];
        int nh = 0;
        while (nh < (1 << 18) && (hog[nh] = malloc(1024)) != NULL)
            nh++;
        memset(nomem, 0, sizeof nomem);
        as_constructors(s, nomem);
        p0 = atomic_load(&as.pongs);
        wait_count(&as.pongs, p0 + 100, "pongs with malloc exhausted");
        while (nh > 0)
            free(hog[--nh]);
        printf("  malloc exhausted: NOMEM: queue %d chan %d mutex %d runtime %d worker %d sched %d fd_open %d "
               "dump %d\n",
               nomem[0], nomem[1], nomem[2], nomem[3], nomem[4], nomem[5], nomem[6], nomem[7]);
        /* end them all: the memory comes back */
        async_chan_close(as.park);
        wait_count(&as.parked_ended, n, "parked fibers ended");
        for (double t0 = now_ms();;) { /* the parkers' stacks go back when they have finished */
            async_sched_stats_t st;
            CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
            if (st.fibers_spawned - st.fibers_finished == 2)
                break;
            CHECK(now_ms() - t0 < BOUND_MS);
            usleep(200);
        }
        async_chan_destroy(as.park);
        as.park = async_chan_create(1, sizeof(int));
        CHECK(as.park != NULL);
        atomic_store(&as.parked_ended, 0);
    }
    /* the same number again each round (give or take what the load holds) */
    CHECK(round_n[2] > round_n[0] / 2);
    as_set(RLIM_INFINITY);
    atomic_store(&as.stop, 1);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&as.bad), 0);
    async_sched_destroy(s);
    exit(0);
}

static void t_as_load(void)
{
#if defined(__SANITIZE_ADDRESS__)
    printf("skipped under ASan (its shadow needs the address space)\n");
    return;
#endif
    run_child("as_load_child");
}

/* ---- a runtime's completions, timers and registrations at RLIMIT_AS ----------- */

#define RA_POSTS 4000000

static void t_as_runtime_child(void)
{
    if (!child_only())
        return;
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    long kb = vm_size_kb();
    as_set((rlim_t)kb * 1024 + ((rlim_t)64 << 20));
    /* completions until NOMEM */
    long posted = 0;
    for (; posted < RA_POSTS; posted++) {
        async_clear_error();
        if (async_runtime_post_completion(rt, 7, (uintptr_t)posted) != 0) {
            CHECK_ERR(ASYNC_E_NOMEM);
            break;
        }
    }
    /* timers until NOMEM */
    long timers = 0;
    for (; timers < RA_POSTS; timers++) {
        async_clear_error();
        if (async_runtime_add_timer(rt, 100000, 0, 9) == 0) {
            CHECK_ERR(ASYNC_E_NOMEM);
            break;
        }
    }
    /* (no async_runtime_add here: its registration map is in the Go heap,
     * whose growth can abort the process at this limit) */
    printf("posted %ld, timers %ld\n", posted, timers);
    /* everything posted is delivered, in order, also at the limit */
    static io_event_t ev[256];
    long got = 0;
    double t0 = now_ms();
    while (got < posted) {
        int m = async_runtime_wait(rt, ev, 256, 1000);
        CHECK(m >= 0);
        for (int i = 0; i < m; i++) {
            if (ev[i].event_type == ASYNC_EVENT_COMPLETION) {
                CHECK_EQ(ev[i].data, (uintptr_t)got);
                got++;
            } else {
                CHECK_EQ(ev[i].event_type, ASYNC_EVENT_TIMER); /* none is due: never */
            }
        }
        CHECK(now_ms() - t0 < 2 * BOUND_MS);
    }
    as_set(RLIM_INFINITY);
    /* and posting works again */
    CHECK_EQ(async_runtime_post_completion(rt, 8, 1), 0);
    async_runtime_deinit(rt);
    exit(0);
}

static void t_as_runtime(void)
{
#if defined(__SANITIZE_ADDRESS__)
    printf("skipped under ASan (its shadow needs the address space)\n");
    return;
#endif
    run_child("as_runtime_child");
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

static void fk_noop(void *arg)
{
    (void)arg;
}

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
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0)
            fk_child();
        fk_wait_child(pid);
    }
    atomic_store(&fk.stop, 1);
    CHECK_EQ(async_sched_run(fk.s), 0);
    CHECK_EQ(atomic_load(&fk.bad), 0);
    async_sched_destroy(fk.s);
    for (int i = 0; i < FK_PAIRS; i++) {
        close(fk.sp[i][0]);
        close(fk.sp[i][1]);
    }
    async_chan_destroy(fk.ch);
    async_mutex_destroy(fk.mu);
    async_queue_destroy(fk.q);
}

static void t_fork_load_1w(void)
{
    fork_load(1);
}

static void t_fork_load_2w(void)
{
    fork_load(2);
}

/* ---- spawns racing at the RLIMIT_AS edge: host threads and fibers ------------- */

typedef struct {
    async_sched_t *s;
    async_chan_t *gate;          /* closed at the end: every holder returns */
    atomic_int ok, ran, nomem, other, stop;
} ch_t;

static ch_t chs;

static void ch_holder(void *arg)
{
    /* odd ones hold their stack until the end, even ones return at once */
    atomic_fetch_add(&chs.ran, 1);
    if ((intptr_t)arg & 1) {
        int v;
        (void)async_chan_recv(chs.gate, &v, -1);
    }
}

static void ch_spawn_one(intptr_t i)
{
    async_clear_error();
    if (async_fiber_spawn(chs.s, ch_holder, (void *)i, 0))
        atomic_fetch_add(&chs.ok, 1);
    else if (async_last_error() == ASYNC_E_NOMEM)
        atomic_fetch_add(&chs.nomem, 1);
    else
        atomic_fetch_add(&chs.other, 1);
}

static void ch_spawner_fiber(void *arg)
{
    (void)arg;
    for (intptr_t i = 0; !atomic_load(&chs.stop); i++) {
        ch_spawn_one(i);
        if (i % 8 == 0)
            async_fiber_yield();
    }
}

static void *ch_spawner_thread(void *arg)
{
    (void)arg;
    for (intptr_t i = 0; !atomic_load(&chs.stop); i++)
        ch_spawn_one(i);
    return NULL;
}

static void t_as_spawn_race_child(void)
{
    if (!child_only())
        return;
    memset(&chs, 0, sizeof chs);
    chs.s = sched_new(2);
    chs.gate = async_chan_create(0, sizeof(int));
    CHECK(chs.gate != NULL);
    as_set((rlim_t)vm_size_kb() * 1024 + ((rlim_t)64 << 20));
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        start_thread(&th[i], ch_spawner_thread, NULL);
    CHECK(async_fiber_spawn(chs.s, ch_spawner_fiber, NULL, 0) != NULL);
    wait_count(&chs.nomem, 5000, "spawns refused at the limit");
    atomic_store(&chs.stop, 1);
    for (int i = 0; i < 2; i++)
        join_within(th[i], BOUND_MS, "spawner thread");
    async_chan_close(chs.gate);
    CHECK_EQ(async_sched_run(chs.s), 0);
    printf("spawned %d, ran %d, NOMEM %d, other %d\n", atomic_load(&chs.ok), atomic_load(&chs.ran),
           atomic_load(&chs.nomem), atomic_load(&chs.other));
    CHECK_EQ(atomic_load(&chs.other), 0);
    CHECK_EQ(atomic_load(&chs.ran), atomic_load(&chs.ok)); /* every accepted spawn ran */
    async_sched_stats_t st;
    CHECK_EQ(async_sched_get_stats(chs.s, &st, NULL, 0), 0);
    CHECK_EQ(st.fibers_spawned, st.fibers_finished);
    /* the stacks came back: as many holders as fit at first fit again */
    async_chan_destroy(chs.gate);
    chs.gate = async_chan_create(0, sizeof(int));
    int n = 0;
    for (; n < AS_MAX; n++)
        if (!async_fiber_spawn(chs.s, ch_holder, (void *)1, 0))
            break;
    CHECK_ERR(ASYNC_E_NOMEM);
    printf("holders after: %d\n", n);
    CHECK(n > 500);
    async_chan_close(chs.gate);
    CHECK_EQ(async_sched_run(chs.s), 0);
    as_set(RLIM_INFINITY);
    async_sched_destroy(chs.s);
    async_chan_destroy(chs.gate);
    exit(0);
}

static void t_as_spawn_race(void)
{
#if defined(__SANITIZE_ADDRESS__)
    printf("skipped under ASan (its shadow needs the address space)\n");
    return;
#endif
    run_child("as_spawn_race_child");
}

/* ---- destroy racing the worker thread's exit ------------------------------------ */

/* async_worker_destroy without a join, at random moments around the end of
 * a short proc: the last reference may be the handle's or the thread's,
 * never freed under the other (ASan sees a use after free otherwise). */
static void t_worker_destroy_exit(void)
{
    unsigned seed = 12345;
    for (int i = 0; i < 4000; i++) {
        async_worker_t *w = async_worker_create(nop_proc, NULL, 0);
        CHECK(w != NULL);
        seed = seed * 1103515245u + 12345u;
        for (volatile unsigned k = 0, n = (seed >> 16) % 4000; k < n; k++) {
        }
        async_worker_destroy(w);
    }
}

static const test_case_t cases[] = {
    T(nofile_sweep), // uring adversarial
    T(load_plain_1w), // uring adversarial
    T(load_plain_2w), // uring adversarial
    T(load_owned_1w), // uring adversarial
    T(load_owned_2w), // uring adversarial
    T(load_signals_1w), // uring adversarial
    T(load_signals_2w), // uring adversarial
    T(nothreads_pool_empty_child), // adversarial
    T(nothreads_pool_empty), // adversarial
    T(nothreads_pool_busy_child), // adversarial
    T(nothreads_pool_busy), // adversarial
    T(nothreads_calls_child), // adversarial
    T(nothreads_calls), // adversarial
    T(nothreads_partial_child), // adversarial
    T(nothreads_partial), // adversarial
    T(worker_fd_back), // adversarial
    T(worker_destroy_exit), // adversarial
    T(as_load_child), // adversarial
    T(as_load), // uring adversarial
    T(as_runtime_child), // adversarial
    T(as_runtime), // adversarial
    T(as_spawn_race_child), // adversarial
    T(as_spawn_race), // adversarial
    T(fork_load_1w), // uring adversarial
    T(fork_load_2w), // uring adversarial
};

TEST_MAIN(cases)
