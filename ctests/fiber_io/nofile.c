/* RLIMIT_NOFILE: every constructor that needs descriptors tried with 0..n of
 * them left (it works, or fails with its documented error and leaks nothing),
 * an echo load over loopback TCP while the descriptors run out (with signals
 * arriving all along), accept out of descriptors, an open fd above a lowered
 * limit, and descriptors and memory that stay flat over many timed-out,
 * cancelled and failed calls. Every wait is bounded. */
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "check.h"
#define BOUND_MS 20000 /* every wait of this file, in ms */
#include "net.h"

/* ---- an open fd above RLIMIT_NOFILE (the limit lowered after it was opened) ---------------- */

static int hi_fd, hi_peer;

static void hi_body(void *arg) {
    (void)arg;
    char b[8];
    CHECK_EQ(async_fiber_write(hi_fd, "hi", 2, 1000), 2);
    CHECK_EQ(async_fiber_read(hi_peer, b, sizeof b, 1000), 2);
    CHECK_FAIL(async_fiber_read(hi_fd, b, sizeof b, 20) == -1, ASYNC_E_TIMEDOUT);
    CHECK(async_fiber_wait_fd(hi_fd, ASYNC_EVENT_WRITE, 1000) & ASYNC_EVENT_WRITE);
    CHECK_FAIL(async_fiber_wait_fd(hi_fd, ASYNC_EVENT_READ, 20) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(write(hi_peer, "yo", 2), 2);
    CHECK(async_fiber_wait_fd(hi_fd, ASYNC_EVENT_READ, 1000) & ASYNC_EVENT_READ);
    CHECK_EQ(async_fiber_read(hi_fd, b, sizeof b, 1000), 2);
}

CASE(fd_above_limit) { // uring adversarial
    struct rlimit rl, save;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &save), 0);
    int want = 70000;
    if (save.rlim_max < (rlim_t)want + 1) want = (int)save.rlim_max - 1;
    if (want < 2000) {
        printf("skipped: hard limit %lu\n", (unsigned long)save.rlim_max);
        return;
    }
    rl = save;
    rl.rlim_cur = (rlim_t)want + 1;
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    int sp[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    CHECK_EQ(dup2(sp[0], want), want);
    CHECK_EQ(dup2(sp[1], want - 1), want - 1);
    close_pair(sp);
    hi_fd = want;
    hi_peer = want - 1;
    rl.rlim_cur = 256;
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    on_fiber_then_thread(hi_body);
    close(hi_fd);
    close(hi_peer);
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &save), 0);
}

/* ---- accept out of descriptors ----------------------------------------------------------------- */

static void emfile_body(void *arg) {
    int l = (int)(intptr_t)arg;
    /* take every free descriptor */
    int taken[4096], nt = 0;
    for (;;) {
        int d = dup(l);
        if (d < 0) break;
        CHECK(nt < 4096);
        taken[nt++] = d;
    }
    async_clear_error();
    double t0 = now_ms();
    int a = async_fiber_accept(l, NULL, NULL, 2000);
    printf("accept at EMFILE -> %d err %d after %.0f ms\n", a, async_last_error(), now_ms() - t0);
    CHECK(a == -1);
    CHECK_ERR(ASYNC_E_NOMEM);
    for (int i = 0; i < nt; i++) close(taken[i]);
    /* the pending connection was not lost */
    a = async_fiber_accept(l, NULL, NULL, 2000);
    CHECK(a >= 0);
    close(a);
}

CASE(accept_emfile) { // uring adversarial
    struct rlimit save, rl;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &save), 0);
    async_sched_t *s = sched_new(2);
    struct sockaddr_in sa;
    int l = loopback_listener(16, &sa);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK_EQ(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
    rl = save;
    rl.rlim_cur = 200;
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    on_fiber(s, emfile_body, (void *)(intptr_t)l);
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &save), 0);
    close(c);
    close(l);
    async_sched_destroy(s);
}

/* ---- nothing accumulates: descriptors and memory stay flat over many
 * timed-out, cancelled and failed calls on short-lived fds ------------------------------------------ */

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    long a = 0, b = 0;
    if (fscanf(f, "%ld %ld", &a, &b) != 2) b = -1;
    fclose(f);
    return b * (sysconf(_SC_PAGESIZE) / 1024);
}

static void churn_body(void *arg) {
    int rounds = (int)(intptr_t)arg;
    char b[16];
    struct sockaddr_in bad = refused_addr();
    for (int i = 0; i < rounds; i++) {
        int sp[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
        CHECK_FAIL(async_fiber_read(sp[0], b, sizeof b, 1) == -1, ASYNC_E_TIMEDOUT);
        CHECK_FAIL(async_fiber_wait_fd(sp[0], ASYNC_EVENT_READ, 1) == -1, ASYNC_E_TIMEDOUT);
        CHECK_EQ(async_fiber_write(sp[1], "abc", 3, 100), 3);
        CHECK_EQ(async_fiber_read(sp[0], b, sizeof b, 100), 3);
        close_pair(sp);
        int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(async_fiber_connect(c, (struct sockaddr *)&bad, sizeof bad, 100) == -1);
        close(c);
    }
}

CASE(no_fd_or_memory_growth) { // uring adversarial
    async_sched_t *s = sched_new(2);
    on_fiber(s, churn_body, (void *)(intptr_t)300); /* warm up */
    int fd0 = count_fds();
    long rss0 = rss_kb();
    on_fiber(s, churn_body, (void *)(intptr_t)3000);
    int fd1 = count_fds();
    long rss1 = rss_kb();
    printf("fds %d -> %d, rss %ld -> %ld KiB\n", fd0, fd1, rss0, rss1);
    CHECK_EQ(fd1, fd0);
    CHECK(rss1 - rss0 < 8192);
    async_sched_destroy(s);
}

/* ---- a descriptor famine: fill every free number up to a lowered limit ---- */

typedef struct {
    struct rlimit saved;
    int fill[4200];
    int nfill;
} famine_t;

static void famine_free(famine_t *f, int n);

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

CASE(nofile_sweep) // uring adversarial
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

CASE(nofile_load_plain_1w) { nofile_load(1, 0, 0); } // uring adversarial

CASE(nofile_load_plain_2w) { nofile_load(2, 0, 0); } // uring adversarial

CASE(nofile_load_owned_1w) { nofile_load(1, 1, 0); } // uring adversarial

CASE(nofile_load_owned_2w) { nofile_load(2, 1, 0); } // uring adversarial

/* The same with SIGUSR1 arriving all along (a handler without SA_RESTART). */
CASE(nofile_load_signals_1w) { nofile_load(1, 0, 1); } // uring adversarial

CASE(nofile_load_signals_2w) { nofile_load(2, 1, 1); } // uring adversarial

TEST_MAIN()
