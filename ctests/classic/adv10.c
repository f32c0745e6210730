/* test_adv10.c — adversarial pass 10: async_runtime_* as include/async.h
 * promises it (wakeups from signal handlers and many threads, posts from
 * many threads against every wait shape, deinit races and descriptor reuse,
 * fork, RLIMIT_NOFILE). See docs/RELIABILITY.md, "Adversarial pass 10".
 * Registered for epoll and poll. No timed assertion is an upper bound on
 * wall time: a wait that must sleep is checked by its lower bound (it waits
 * at least n ms) or by the CPU time it burns (getrusage). */
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#if defined(__linux__)
#include <sys/eventfd.h>
#endif
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "check.h"

#define MAXEV 64

static double thread_cpu_ms(void)
{
    struct rusage ru;
#if defined(RUSAGE_THREAD)
    CHECK_EQ(getrusage(RUSAGE_THREAD, &ru), 0);
#else
    CHECK_EQ(getrusage(RUSAGE_SELF, &ru), 0); /* darwin: no per-thread usage */
#endif
    return (double)ru.ru_utime.tv_sec * 1e3 + ru.ru_utime.tv_usec / 1e3 + (double)ru.ru_stime.tv_sec * 1e3 +
           ru.ru_stime.tv_usec / 1e3;
}

/* After the wakeups of a test are over: at most `slack` waits may still
 * return early (a wakeup consumed by an EINTR return, say), then waits of
 * 100 ms with nothing to do must each last at least 100 ms and sleep (CPU
 * time well below the wall time). */
static void check_quiet(async_runtime_t *rt, int slack)
{
    io_event_t ev[MAXEV];
    int early = 0;
    for (int round = 0; round < 3; round++) {
        double t0 = now_ms(), c0 = thread_cpu_ms();
        int n = async_runtime_wait(rt, ev, MAXEV, 100);
        double wall = now_ms() - t0, cpu = thread_cpu_ms() - c0;
        CHECK_EQ(n, 0);
        if (wall < 99.0) {
            early++;
            if (early > slack) {
                fprintf(stderr, "wait(100) returned after %.2f ms with nothing to do (%d early returns)\n", wall,
                        early);
                CHECK(early <= slack);
            }
            round--;
            continue;
        }
        if (cpu > wall / 2) {
            fprintf(stderr, "wait(100) burnt %.1f ms CPU in %.1f ms: it spins\n", cpu, wall);
            CHECK(cpu <= wall / 2);
        }
    }
}

/* ---- wakeups from signal handlers ------------------------------------------- */

static async_runtime_t *sig_rt;
static atomic_int sig_handled;

static void wake_handler(int sig)
{
    (void)sig;
    int e = errno;
    atomic_fetch_add(&sig_handled, 1); /* before the wakeup: the woken wait may look at it */
    if (async_runtime_wakeup(sig_rt) != 0)
        abort();
    CHECK_EQ(errno, e);
}

static void install(int sig, void (*fn)(int), int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = SA_ONSTACK | flags;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(sig, &sa, NULL), 0);
}

typedef struct {
    pthread_t target;
    atomic_int stop;
    atomic_int waiting; /* the waiter's round, raised before each wait */
    int rounds;
    int burst;
} sigsend_t;

static void *sig_sender(void *arg)
{
    sigsend_t *s = arg;
    for (int r = 1; r <= s->rounds; r++) {
        while (atomic_load(&s->waiting) < r && !atomic_load(&s->stop))
            sched_yield();
        if (atomic_load(&s->stop))
            break;
        if ((r & 3) == 0)
            sleep_ms(1); /* sometimes let the waiter reach its sleep */
        for (int i = 0; i < s->burst; i++)
            pthread_kill(s->target, SIGUSR1);
    }
    return NULL;
}

/* Starts the sender, waits s->rounds times on sig_rt (each wait must end by a
 * wakeup from the handler, with no event: bounded, so a lost wakeup fails),
 * then stops and joins the sender. */
static void wait_rounds(sigsend_t *s)
{
    pthread_t th;
    start_thread(&th, sig_sender, s);
    io_event_t ev[MAXEV];
    for (int r = 1; r <= s->rounds; r++) {
        atomic_store(&s->waiting, r);
        int n = async_runtime_wait(sig_rt, ev, MAXEV, 10000);
        CHECK_EQ(n, 0);
    }
    atomic_store(&s->stop, 1);
    join_within(th, 10000, "sender");
}

/* Bursts of signals whose handler calls async_runtime_wakeup land on the
 * thread blocked in async_runtime_wait(-1): every round must end (the wait
 * returns), and once the bursts are over a wait must sleep again. */
static void sig_burst(int flags)
{
    sig_rt = async_runtime_init();
    CHECK(sig_rt);
    install(SIGUSR1, wake_handler, flags);
    sigsend_t s;
    memset(&s, 0, sizeof s);
    s.target = pthread_self();
    s.rounds = 2000;
    s.burst = 5;
    wait_rounds(&s);
    /* Let the last signals land, then the loop must settle. */
    sleep_ms(20);
    check_quiet(sig_rt, 3);
    install(SIGUSR1, SIG_IGN, 0);
    async_runtime_deinit(sig_rt);
}

static void t_sig_burst_restart(void) { sig_burst(SA_RESTART); }
static void t_sig_burst_norestart(void) { sig_burst(0); }

static void *adv10_victim(void *arg);

/* The handler runs on another thread than the waiter (the waiter blocks
 * SIGUSR1): its wakeups must still end every wait. */
static void t_sig_other_thread(void)
{
    sig_rt = async_runtime_init();
    CHECK(sig_rt);
    install(SIGUSR1, wake_handler, 0);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_t victim;
    struct helper {
        atomic_int stop;
    } h;
    atomic_store(&h.stop, 0);
    CHECK_EQ(pthread_sigmask(SIG_BLOCK, &set, NULL), 0);
    sigsend_t s;
    memset(&s, 0, sizeof s);
    s.rounds = 1000;
    s.burst = 3;
    /* The victim thread: unblocks SIGUSR1 and naps. */
    start_thread(&victim, adv10_victim, &h.stop);
    s.target = victim;
    wait_rounds(&s);
    atomic_store(&h.stop, 1);
    join_within(victim, 10000, "victim");
    check_quiet(sig_rt, 2);
    CHECK_EQ(pthread_sigmask(SIG_UNBLOCK, &set, NULL), 0);
    install(SIGUSR1, SIG_IGN, 0);
    async_runtime_deinit(sig_rt);
}

static void *adv10_victim(void *arg)
{
    atomic_int *stop = arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    while (!atomic_load(stop))
        sleep_ms(1);
    return NULL;
}


/* The signals land on threads the host did not make (Go's): every C thread
 * of the test blocks SIGUSR1, the process is sent it, and the handler's
 * wakeup must still end each wait. */
static void t_sig_foreign_thread(void)
{
    sig_rt = async_runtime_init();
    CHECK(sig_rt);
    install(SIGUSR1, wake_handler, SA_RESTART);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    CHECK_EQ(pthread_sigmask(SIG_BLOCK, &set, NULL), 0);
    io_event_t ev[MAXEV];
    for (int r = 0; r < 200; r++) {
        int before = atomic_load(&sig_handled);
        CHECK_EQ(kill(getpid(), SIGUSR1), 0);
        int n = async_runtime_wait(sig_rt, ev, MAXEV, 10000);
        CHECK_EQ(n, 0);
        /* The handler ran (on a thread of Go's): the wait ended because of
         * its wakeup, not its timeout. */
        CHECK(atomic_load(&sig_handled) > before);
    }
    check_quiet(sig_rt, 2);
    install(SIGUSR1, SIG_IGN, 0);
    CHECK_EQ(pthread_sigmask(SIG_UNBLOCK, &set, NULL), 0);
    async_runtime_deinit(sig_rt);
}


/* 256 watches of runtimes at most: the next is NOMEM; deinit gives the
 * watches back and, with the last one, the host's action. */
static void host_noop(int sig) { (void)sig; }

static void t_sig_watch_limit(void)
{
    enum { NR = 260 };
    static async_runtime_t *rts[NR];
    int sig = SIGRTMIN + 6;
    install(sig, host_noop, 0);
    int ok = 0;
    for (int i = 0; i < NR; i++) {
        rts[i] = async_runtime_init();
        CHECK(rts[i]);
        async_clear_error();
        if (async_runtime_add_signal(rts[i], sig, (uintptr_t)i) == 0) {
            ok++;
        } else {
            CHECK_ERR(ASYNC_E_NOMEM);
        }
    }
    CHECK_EQ(ok, 256);
    struct sigaction cur;
    CHECK_EQ(sigaction(sig, NULL, &cur), 0);
    CHECK(cur.sa_handler != host_noop);
    /* Every watch gets the signal. */
    CHECK_EQ(kill(getpid(), sig), 0);
    io_event_t ev[4];
    for (int i = 0; i < 256; i++) {
        int n = async_runtime_wait(rts[i], ev, 4, 5000);
        CHECK_EQ(n, 1);
        CHECK_EQ(ev[0].event_type, ASYNC_EVENT_SIGNAL);
        CHECK_EQ(ev[0].completion_key, i);
    }
    for (int i = 0; i < NR; i++)
        async_runtime_deinit(rts[i]);
    CHECK_EQ(sigaction(sig, NULL, &cur), 0);
    CHECK(cur.sa_handler == host_noop);
    /* The slots are free again. */
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    CHECK_EQ(async_runtime_add_signal(rt, sig, 1), 0);
    async_runtime_deinit(rt);
    install(sig, SIG_DFL, 0);
}

/* ---- wakeups from many threads ---------------------------------------------- */

typedef struct {
    async_runtime_t *rt;
    int calls;
    atomic_int *done;
} waker_t;

static void *waker(void *arg)
{
    waker_t *w = arg;
    for (int i = 0; i < w->calls; i++)
        CHECK_EQ(async_runtime_wakeup(w->rt), 0);
    atomic_fetch_add(w->done, 1);
    return NULL;
}

typedef struct {
    async_runtime_t *rt;
    atomic_int *stop;
    long waits;
} wloop_t;

static void *wait_loop(void *arg)
{
    wloop_t *l = arg;
    io_event_t ev[MAXEV];
    while (!atomic_load(l->stop)) {
        int n = async_runtime_wait(l->rt, ev, MAXEV, 10000);
        CHECK(n >= 0);
        l->waits++;
    }
    return NULL;
}

/* 4 threads x 250k wakeups, with a waiter looping on wait(-1 like), then
 * one final wakeup must end its loop; afterwards waits sleep. Then a million
 * wakeups with nobody waiting: the next wait returns at once, and only a
 * bounded number of waits after it return early. */
static void t_wakeup_flood(void)
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    atomic_int done = 0, stop = 0;
    waker_t w = {rt, 250000, &done};
    wloop_t l = {rt, &stop, 0};
    pthread_t wt[4], lt;
    start_thread(&lt, wait_loop, &l);
    for (int i = 0; i < 4; i++)
        start_thread(&wt[i], waker, &w);
    for (int i = 0; i < 4; i++)
        join_within(wt[i], 120000, "waker");
    atomic_store(&stop, 1);
    CHECK_EQ(async_runtime_wakeup(rt), 0);
    join_within(lt, 15000, "wait loop after the final wakeup");
    async_runtime_stats_t st;
    CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
    CHECK_EQ(st.wakeups, 1000001);
    check_quiet(rt, 2);

    /* No waiter: a million in a row. */
    for (int i = 0; i < 1000000; i++)
        CHECK_EQ(async_runtime_wakeup(rt), 0);
    io_event_t ev[MAXEV];
    CHECK_EQ(async_runtime_wait(rt, ev, MAXEV, 10000), 0);
    check_quiet(rt, 2);
    async_runtime_deinit(rt);
}

/* ---- posts from many threads against every wait shape ----------------------- */

#define NPOST 4
#define PER_POST 100000

typedef struct {
    async_runtime_t *rt;
    int id;
    atomic_long *posted; /* posts returned, all threads */
} poster_t;

static void *poster(void *arg)
{
    poster_t *p = arg;
    for (long i = 0; i < PER_POST; i++) {
        CHECK_EQ(async_runtime_post_completion(p->rt, (uintptr_t)p->id, (uintptr_t)i), 0);
        atomic_fetch_add(p->posted, 1);
        if ((i & 1023) == 0)
            sleep_ms(1); /* let the loop fall asleep now and then */
    }
    return NULL;
}

static void t_post_shapes(void)
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    atomic_long posted = 0;
    poster_t ps[NPOST];
    pthread_t th[NPOST];
    long next[NPOST] = {0};
    for (int i = 0; i < NPOST; i++) {
        ps[i] = (poster_t){rt, i, &posted};
        start_thread(&th[i], poster, &ps[i]);
    }
    long got = 0;
    io_event_t ev[MAXEV];
    unsigned it = 0;
    while (got < (long)NPOST * PER_POST) {
        it++;
        int max = 1 + (int)(it % 7);
        int shape = it % 3;
        int timeout = shape == 0 ? 5000 : shape == 1 ? 0 : 3000;
        long before = atomic_load(&posted);
        double t0 = now_ms();
        int n = async_runtime_wait(rt, ev, max, timeout);
        CHECK(n >= 0 && n <= max);
        if (n == 0 && timeout > 0 && got < before && now_ms() - t0 >= timeout) {
            fprintf(stderr, "lost wake-up: %ld posted before a wait(%d) that timed out with %ld delivered\n",
                    before, timeout, got);
            CHECK(0);
        }
        for (int i = 0; i < n; i++) {
            CHECK_EQ(ev[i].event_type, ASYNC_EVENT_COMPLETION);
            CHECK_EQ(ev[i].fd, -1);
            int id = (int)ev[i].completion_key;
            CHECK(id >= 0 && id < NPOST);
            if ((long)ev[i].data != next[id]) {
                fprintf(stderr, "thread %d: got %ld, expected %ld\n", id, (long)ev[i].data, next[id]);
                CHECK_EQ(ev[i].data, next[id]);
            }
            next[id]++;
            got++;
        }
    }
    for (int i = 0; i < NPOST; i++)
        join_within(th[i], 60000, "poster");
    CHECK_EQ(async_runtime_wait(rt, ev, MAXEV, 0), 0);
    async_runtime_stats_t st;
    CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
    CHECK_EQ(st.completions_pending, 0);
    CHECK_EQ(st.events[4], (long)NPOST * PER_POST);
    check_quiet(rt, 0);
    async_runtime_deinit(rt);
}


/* completions_pending is exact when no post runs: checked at quiet points
 * between rounds of short-lived posting threads (their records are
 * orphaned at exit and freed by the loop once delivered) and partial
 * takes of 1..5 events. */
typedef struct {
    async_runtime_t *rt;
    int n;
} shortpost_t;

static void *short_poster(void *arg)
{
    shortpost_t *p = arg;
    for (int i = 0; i < p->n; i++)
        CHECK_EQ(async_runtime_post_completion(p->rt, 1, (uintptr_t)i), 0);
    return NULL;
}

static void t_pending_exact(void)
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    long posted = 0, got = 0;
    unsigned seed = 7;
    io_event_t ev[8];
    async_runtime_stats_t st;
    for (int round = 0; round < 400; round++) {
        int nt = 1 + round % 4;
        pthread_t th[4];
        shortpost_t sp[4];
        for (int i = 0; i < nt; i++) {
            seed = seed * 1103515245u + 12345u;
            sp[i].rt = rt;
            sp[i].n = (int)((seed >> 16) % 600); /* some cross a 4 KiB block */
            posted += sp[i].n;
            start_thread(&th[i], short_poster, &sp[i]);
        }
        for (int i = 0; i < nt; i++)
            join_within(th[i], 10000, "poster");
        /* The main thread posts too (its record lives on). */
        CHECK_EQ(async_runtime_post_completion(rt, 2, 0), 0);
        posted++;
        CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
        CHECK_EQ(st.completions_pending, posted - got);
        int takes = (int)(seed >> 8) % 40;
        for (int k = 0; k < takes; k++) {
            int n = async_runtime_wait(rt, ev, 1 + k % 5, 0);
            CHECK(n >= 0);
            got += n;
            CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
            CHECK_EQ(st.completions_pending, posted - got);
        }
    }
    while (got < posted) {
        int n = async_runtime_wait(rt, ev, 8, 1000);
        CHECK(n > 0);
        got += n;
    }
    CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
    CHECK_EQ(st.completions_pending, 0);
    CHECK_EQ(st.events[4], posted);
    async_runtime_deinit(rt);
}

/* ---- deinit racing everything; descriptor numbers reused -------------------- */

typedef struct {
    async_runtime_t *_Atomic rt;
    atomic_int stop;
    int kind;
} hammer_t;

static void *hammer(void *arg)
{
    hammer_t *h = arg;
    async_runtime_stats_t st;
    io_event_t ev[4];
    unsigned i = 0;
    while (!atomic_load(&h->stop)) {
        async_runtime_t *rt = atomic_load(&h->rt);
        if (h->kind == 3) {
            /* a blocking waiter: deinit must end its wait (CLOSED), and a
             * wait on the dead handle fails at once (BADHANDLE) */
            int n = async_runtime_wait(rt, ev, 4, 5000);
            if (n < 0) {
                int e = async_last_error();
                CHECK(e == ASYNC_E_CLOSED || e == ASYNC_E_BADHANDLE || e == ASYNC_E_BUSY);
            }
            continue;
        }
        switch ((h->kind + i++) % 4) {
        case 0: async_runtime_wakeup(rt); break;
        case 1: async_runtime_post_completion(rt, 1, 2); break;
        case 2: async_runtime_get_stats(rt, &st, sizeof st); break;
        case 3: async_runtime_wait(rt, ev, 4, 0); break;
        }
    }
    return NULL;
}

static void t_deinit_reuse(void)
{
    hammer_t h;
    atomic_store(&h.stop, 0);
    pthread_t th[4];
    hammer_t hs[4];
    for (int round = 0; round < 300; round++) {
        async_runtime_t *rt = async_runtime_init();
        CHECK(rt);
        for (int i = 0; i < 4; i++) {
            atomic_store(&hs[i].rt, rt);
            atomic_store(&hs[i].stop, 0);
            hs[i].kind = i;
            start_thread(&th[i], hammer, &hs[i]);
        }
        if (round & 1)
            sched_yield();
        else
            sleep_ms(1);
        async_runtime_deinit(rt);
        /* Take the freed numbers: pipes and eventfds. */
        int fds[16], nf = 0;
        for (int i = 0; i < 4; i++) {
            int p[2];
            CHECK_EQ(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
            fds[nf++] = p[0];
            fds[nf++] = p[1];
#if defined(__linux__)
            int e = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
#else
            int e = dup(p[0]); /* no eventfd: another number taken */
#endif
            CHECK(e >= 0);
            fds[nf++] = e;
        }
        sleep_ms(2); /* the hammers go on with the stale handle */
        for (int i = 0; i < 4; i++) {
            atomic_store(&hs[i].stop, 1);
            join_within(th[i], 10000, "hammer");
        }
        for (int i = 0; i < nf; i++) {
            char buf[64];
            ssize_t k = read(fds[i], buf, sizeof buf);
            if (k > 0 || (k < 0 && errno != EAGAIN && errno != EBADF && errno != EINVAL)) {
                /* the write ends of pipes fail with EBADF on read: fine */
                fprintf(stderr, "round %d: fd %d got %zd stray bytes (errno %d)\n", round, fds[i], k, errno);
                CHECK(k <= 0);
            }
        }
        for (int i = 0; i < nf; i++)
            close(fds[i]);
    }
}

/* ---- fork ----------------------------------------------------------------------- */

typedef struct {
    async_runtime_t *rt;
    int n;
    double ms;
} waitres_t;

static void *timed_wait(void *arg)
{
    waitres_t *w = arg;
    io_event_t ev[MAXEV];
    double t0 = now_ms();
    w->n = async_runtime_wait(w->rt, ev, MAXEV, 1500);
    w->ms = now_ms() - t0;
    return NULL;
}

static void t_fork_child_calls(void)
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    /* Let the parent's loop sleep on another thread. */
    waitres_t w = {rt, -2, 0};
    pthread_t th;
    start_thread(&th, timed_wait, &w);
    sleep_ms(50);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        io_event_t ev[4];
        async_runtime_stats_t st;
        int bad = 0;
        for (int i = 0; i < 100; i++) {
            async_clear_error();
            if (async_runtime_wakeup(rt) != -1 || async_last_error() != ASYNC_E_FORKED)
                bad |= 1;
            if (async_runtime_post_completion(rt, 1, 1) != -1 || async_last_error() != ASYNC_E_FORKED)
                bad |= 2;
        }
        if (async_runtime_wait(rt, ev, 4, 100) != -1 || async_last_error() != ASYNC_E_FORKED)
            bad |= 4;
        if (async_runtime_add_timer(rt, 0, 0, 1) != 0 || async_last_error() != ASYNC_E_FORKED)
            bad |= 8;
        if (async_runtime_get_stats(rt, &st, sizeof st) != -1 || async_last_error() != ASYNC_E_FORKED)
            bad |= 16;
        async_runtime_deinit(rt);
        if (async_last_error() != ASYNC_E_FORKED)
            bad |= 32;
        _exit(bad);
    }
    int status;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
    join_within(th, 15000, "parent's wait");
    /* The child's calls must not have touched the parent's loop. */
    CHECK_EQ(w.n, 0);
    CHECK(w.ms >= 1499.0);
    CHECK_EQ(async_runtime_post_completion(rt, 5, 6), 0);
    io_event_t ev[4];
    CHECK_EQ(async_runtime_wait(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].completion_key, 5);
    async_runtime_deinit(rt);
}


/* ---- signal counts ---------------------------------------------------------- */

typedef struct {
    int sig, n;
    atomic_int sent;
    atomic_int done;
} sigq_t;

static void *sigq_sender(void *arg)
{
    sigq_t *q = arg;
    union sigval v;
    v.sival_int = 0;
    for (int i = 0; i < q->n; i++) {
        if (sigqueue(getpid(), q->sig, v) == 0)
            atomic_fetch_add(&q->sent, 1);
        else
            sched_yield(); /* EAGAIN: the queue is full */
        if ((i & 63) == 0)
            sleep_ms(1);
    }
    atomic_store(&q->done, 1);
    return NULL;
}

typedef struct {
    async_runtime_t *rt;
    atomic_int stop;
    long posted;
} cflood_t;

static void *cflood(void *arg)
{
    cflood_t *c = arg;
    while (!atomic_load(&c->stop)) {
        CHECK_EQ(async_runtime_post_completion(c->rt, 7, (uintptr_t)c->posted), 0);
        c->posted++;
        if ((c->posted & 255) == 0)
            sleep_ms(1);
    }
    return NULL;
}

/* Real-time signals sent with sigqueue are each counted: the SIGNAL events'
 * counts add up to the signals sent, while completions flood the loop and
 * the waits take one or two events at a time. */
static void t_sig_count_exact(void)
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    int sig = SIGRTMIN + 2;
    CHECK_EQ(async_runtime_add_signal(rt, sig, 42), 0);
    sigq_t q = {sig, 3000, 0, 0};
    cflood_t c;
    c.rt = rt;
    atomic_store(&c.stop, 0);
    c.posted = 0;
    pthread_t qt, ct;
    start_thread(&ct, cflood, &c);
    start_thread(&qt, sigq_sender, &q);
    long sum = 0, comps = 0, next = 0;
    io_event_t ev[MAXEV];
    double t0 = now_ms();
    unsigned it = 0;
    for (;;) {
        it++;
        int n = async_runtime_wait(rt, ev, 1 + (int)(it & 1), (it % 3) == 0 ? 0 : 200);
        CHECK(n >= 0);
        for (int i = 0; i < n; i++) {
            if (ev[i].event_type == ASYNC_EVENT_SIGNAL) {
                CHECK_EQ(ev[i].completion_key, 42);
                CHECK(ev[i].data >= 1);
                sum += (long)ev[i].data;
            } else {
                CHECK_EQ(ev[i].event_type, ASYNC_EVENT_COMPLETION);
                CHECK_EQ(ev[i].data, next);
                next++;
                comps++;
            }
        }
        if (atomic_load(&q.done) && sum >= atomic_load(&q.sent))
            break;
        if (now_ms() - t0 > 60000)
            break;
    }
    join_within(qt, 10000, "sender");
    atomic_store(&c.stop, 1);
    join_within(ct, 10000, "poster");
    /* Anything left is delivered now. */
    for (int k = 0; k < 5; k++) {
        int n = async_runtime_wait(rt, ev, MAXEV, 20);
        for (int i = 0; i < n; i++)
            if (ev[i].event_type == ASYNC_EVENT_SIGNAL)
                sum += (long)ev[i].data;
    }
    if (sum != atomic_load(&q.sent))
        fprintf(stderr, "signals sent %d, counted %ld\n", atomic_load(&q.sent), sum);
    CHECK_EQ(sum, atomic_load(&q.sent));
    CHECK(atomic_load(&q.sent) > 0);
    CHECK_EQ(async_runtime_remove_signal(rt, sig), 0);
    async_runtime_deinit(rt);
}

/* Several runtimes watch one signal: each counts every one. */
static void t_sig_many_runtimes(void)
{
    enum { NR = 24 };
    async_runtime_t *rts[NR];
    int sig = SIGRTMIN + 3;
    for (int i = 0; i < NR; i++) {
        rts[i] = async_runtime_init();
        CHECK(rts[i]);
        CHECK_EQ(async_runtime_add_signal(rts[i], sig, (uintptr_t)i), 0);
    }
    sigq_t q = {sig, 500, 0, 0};
    pthread_t qt;
    start_thread(&qt, sigq_sender, &q);
    join_within(qt, 60000, "sender");
    sleep_ms(50);
    io_event_t ev[MAXEV];
    for (int r = 0; r < NR; r++) {
        long sum = 0;
        double t0 = now_ms();
        while (sum < atomic_load(&q.sent) && now_ms() - t0 < 10000) {
            int n = async_runtime_wait(rts[r], ev, MAXEV, 100);
            CHECK(n >= 0);
            for (int i = 0; i < n; i++) {
                CHECK_EQ(ev[i].event_type, ASYNC_EVENT_SIGNAL);
                CHECK_EQ(ev[i].completion_key, r);
                sum += (long)ev[i].data;
            }
        }
        CHECK_EQ(async_runtime_wait(rts[r], ev, MAXEV, 0), 0);
        if (sum != atomic_load(&q.sent))
            fprintf(stderr, "runtime %d: sent %d, counted %ld\n", r, atomic_load(&q.sent), sum);
        CHECK_EQ(sum, atomic_load(&q.sent));
    }
    for (int i = 0; i < NR; i++)
        async_runtime_deinit(rts[i]);
}

/* ---- timers and waits: never early ------------------------------------------ */

static void t_timers_never_early(void)
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    enum { NT = 300 };
    static double added[NT];
    static uint64_t ids[NT];
    static int delay[NT];
    unsigned seed = 12345;
    for (int i = 0; i < NT; i++) {
        seed = seed * 1103515245u + 12345u;
        delay[i] = (int)((seed >> 16) % 40);
        added[i] = now_ms();
        ids[i] = async_runtime_add_timer(rt, (uint64_t)delay[i], 0, (uintptr_t)i);
        CHECK(ids[i] != 0);
        if ((i & 15) == 0)
            CHECK_EQ(async_runtime_wakeup(rt), 0);
        if ((i & 7) == 0) {
            io_event_t ev1[2];
            int n = async_runtime_wait(rt, ev1, 2, 1);
            CHECK(n >= 0);
            for (int k = 0; k < n; k++) {
                int j = (int)ev1[k].completion_key;
                double at = now_ms();
                CHECK(at - added[j] >= delay[j]);
                ids[j] = 0;
            }
        }
    }
    io_event_t ev[MAXEV];
    double t0 = now_ms();
    for (;;) {
        int left = 0;
        for (int i = 0; i < NT; i++)
            left += ids[i] != 0;
        if (!left)
            break;
        CHECK(now_ms() - t0 < 30000);
        int n = async_runtime_wait(rt, ev, 3, 50);
        double at = now_ms();
        CHECK(n >= 0);
        for (int k = 0; k < n; k++) {
            CHECK_EQ(ev[k].event_type, ASYNC_EVENT_TIMER);
            int j = (int)ev[k].completion_key;
            CHECK(ids[j] != 0);
            CHECK_EQ(ev[k].data, (uintptr_t)ids[j]);
            if (at - added[j] < delay[j]) {
                fprintf(stderr, "timer %d of %d ms fired after %.3f ms\n", j, delay[j], at - added[j]);
                CHECK(at - added[j] >= delay[j]);
            }
            ids[j] = 0;
        }
    }
    /* Waits of 1..5 ms after wakeups consumed: each lasts at least n ms. */
    for (int i = 0; i < 200; i++) {
        int ms = 1 + i % 5;
        if (i % 10 == 0) {
            CHECK_EQ(async_runtime_wakeup(rt), 0);
            CHECK_EQ(async_runtime_wait(rt, ev, MAXEV, 1000), 0);
        }
        double s = now_ms();
        int n = async_runtime_wait(rt, ev, MAXEV, ms);
        double d = now_ms() - s;
        CHECK_EQ(n, 0);
        if (d < ms) {
            fprintf(stderr, "wait(%d) returned after %.3f ms\n", ms, d);
            CHECK(d >= ms);
        }
    }
    /* A repeating timer left alone for 20 periods fires once, not 20 times. */
    uint64_t rep = async_runtime_add_timer(rt, 10, 10, 99);
    CHECK(rep != 0);
    sleep_ms(200);
    int fired = 0;
    for (int k = 0; k < 3; k++) {
        int n = async_runtime_wait(rt, ev, MAXEV, 0);
        for (int i = 0; i < n; i++) {
            CHECK_EQ(ev[i].completion_key, 99);
            fired++;
        }
    }
    CHECK(fired >= 1 && fired <= 3); /* 3: a loaded machine may let a period pass between the waits */
    CHECK_EQ(async_runtime_cancel_timer(rt, rep), 0);
    check_quiet(rt, 1);
    async_runtime_deinit(rt);
}

/* ---- fork with a watched signal ------------------------------------------- */

static int host_pipe_w = -1;
static void host_usr2(int sig)
{
    (void)sig;
    char c = 'h';
    ssize_t k = write(host_pipe_w, &c, 1);
    (void)k;
}

static void t_fork_watched_signal(void)
{
    int hp[2];
    CHECK_EQ(pipe2(hp, O_CLOEXEC), 0);
    host_pipe_w = hp[1];
    install(SIGUSR2, host_usr2, 0);
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    CHECK_EQ(async_runtime_add_signal(rt, SIGUSR2, 3), 0);
    waitres_t w = {rt, -2, 0};
    pthread_t th;
    start_thread(&th, timed_wait, &w);
    sleep_ms(50);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* Here the host's action is back at the first SIGUSR2. */
        for (int i = 0; i < 3; i++) {
            raise(SIGUSR2);
            sleep_ms(5);
        }
        async_clear_error();
        int bad = async_runtime_wakeup(rt) != -1 || async_last_error() != ASYNC_E_FORKED;
        _exit(bad);
    }
    int status;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
    close(hp[1]);
    char buf[16];
    ssize_t k = read(hp[0], buf, sizeof buf);
    /* The child's host handler ran for every raise after the first (which
     * the common handler re-raised): 3 bytes. */
    CHECK_EQ(k, 3);
    join_within(th, 15000, "parent's wait");
    CHECK_EQ(w.n, 0);
    CHECK(w.ms >= 1499.0);
    /* The parent still watches, and got nothing from the child. */
    io_event_t ev[4];
    CHECK_EQ(async_runtime_wait(rt, ev, 4, 0), 0);
    CHECK_EQ(kill(getpid(), SIGUSR2), 0);
    CHECK_EQ(async_runtime_wait(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_SIGNAL);
    CHECK_EQ(ev[0].data, 1);
    async_runtime_deinit(rt);
    close(hp[0]);
    install(SIGUSR2, SIG_DFL, 0);
}


/* ---- pthread_cancel: no libasync function is a cancellation point ------------ */

enum { CX_WAKEUP, CX_POST_RING, CX_WAIT0, CX_WAIT0_WOKEN, CX_SIGNAL_RING, CX_QUEUE_RING };

typedef struct {
    async_runtime_t *rt;
    async_queue_t *q;
    int what;
    atomic_int returned; /* the call came back (the cancel did not act inside) */
    int rc;
} cx_t;

static void *cx_thread(void *arg)
{
    cx_t *c = arg;
    CHECK_EQ(pthread_setcanceltype(PTHREAD_CANCEL_DEFERRED, NULL), 0);
    io_event_t ev[4];
    /* The cancel is pending before the call: it must act at the thread's
     * next cancellation point outside libasync, not inside. */
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    switch (c->what) {
    case CX_WAKEUP: c->rc = async_runtime_wakeup(c->rt); break;
    case CX_POST_RING: c->rc = async_runtime_post_completion(c->rt, 11, 12); break;
    case CX_WAIT0:
    case CX_WAIT0_WOKEN: c->rc = async_runtime_wait(c->rt, ev, 4, 0); break;
    case CX_SIGNAL_RING: c->rc = raise(SIGRTMIN + 4); break;
    case CX_QUEUE_RING: c->rc = async_queue_enqueue(c->q, "m", 1) ? 0 : -1; break;
    }
    atomic_store(&c->returned, 1);
    pthread_testcancel();
    return NULL;
}

static void *deinit_thread(void *arg)
{
    async_runtime_deinit(arg);
    return NULL;
}

static void cancel_case(int what)
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    int p[2];
    CHECK_EQ(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
    /* a registered fd: a wait(0) polls the fds */
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0);
    waitres_t w = {rt, -2, 0};
    pthread_t wt = 0;
    int sleeper = what == CX_POST_RING || what == CX_SIGNAL_RING || what == CX_QUEUE_RING;
    async_queue_t *q = NULL;
    if (what == CX_QUEUE_RING) {
        /* the SIGNAL_ON_DATA post of an enqueue runs under the queue's lock */
        q = async_queue_create(4, 8, ASYNC_QUEUE_SIGNAL_ON_DATA);
        CHECK(q);
        CHECK_EQ(async_queue_attach(q, rt, 77), 0);
    }
    if (what == CX_SIGNAL_RING)
        CHECK_EQ(async_runtime_add_signal(rt, SIGRTMIN + 4, 5), 0);
    if (sleeper) {
        /* the loop asleep: a post or a signal rings the doorbell */
        start_thread(&wt, timed_wait, &w);
        async_runtime_stats_t st;
        double t0 = now_ms();
        do {
            sleep_ms(2);
            CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
            CHECK(now_ms() - t0 < 10000);
        } while (st.iterations == 0 && now_ms() - t0 < 100); /* give it time to sleep */
    }
    if (what == CX_WAIT0_WOKEN)
        CHECK_EQ(async_runtime_wakeup(rt), 0);
    cx_t c;
    c.rt = rt;
    c.q = q;
    c.what = what;
    atomic_store(&c.returned, 0);
    c.rc = -2;
    pthread_t th;
    start_thread(&th, cx_thread, &c);
    join_within(th, 10000, "cancelled thread");
    if (!atomic_load(&c.returned))
        fprintf(stderr, "the pending cancel acted inside the libasync call\n");
    CHECK(atomic_load(&c.returned));
    CHECK(c.rc >= 0);
    if (sleeper)
        join_within(wt, 15000, "waiter");
    if (q) {
        /* The queue is not wedged either: its lock is free. */
        char buf[8];
        size_t len = 0;
        CHECK(async_queue_dequeue(q, buf, sizeof buf, &len));
        CHECK(async_queue_enqueue(q, "n", 1));
        async_queue_destroy(q);
    }
    /* The runtime is not wedged: a wait is not BUSY, deinit returns. */
    io_event_t ev[8];
    CHECK(async_runtime_wait(rt, ev, 8, 0) >= 0);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    pthread_t dt;
    start_thread(&dt, deinit_thread, rt);
    join_within(dt, 10000, "deinit");
    close(p[0]);
    close(p[1]);
}

static void t_cancel_wakeup(void) { cancel_case(CX_WAKEUP); }
static void t_cancel_post_ring(void) { cancel_case(CX_POST_RING); }
static void t_cancel_wait0(void) { cancel_case(CX_WAIT0); }
static void t_cancel_wait0_woken(void) { cancel_case(CX_WAIT0_WOKEN); }
static void t_cancel_signal_ring(void) { cancel_case(CX_SIGNAL_RING); }
static void t_cancel_queue_ring(void) { cancel_case(CX_QUEUE_RING); }


/* Every runtime call, made by a thread whose cancel is pending, comes back
 * (the thread makes no libc cancellation point of its own meanwhile). */
typedef struct {
    int rfd;
    atomic_int step;
} cxall_t;

static void *cx_all(void *arg)
{
    cxall_t *c = arg;
    io_event_t ev[4];
    async_runtime_stats_t st;
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    async_runtime_t *rt = async_runtime_init();
    atomic_store(&c->step, 1);
    if (!rt)
        return NULL;
    async_runtime_add(rt, c->rfd, ASYNC_EVENT_READ, NULL);
    async_runtime_modify(rt, c->rfd, ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE);
    uint64_t id = async_runtime_add_timer(rt, 0, 0, 1);
    async_runtime_add_timer(rt, 100000, 0, 2);
    async_runtime_add_signal(rt, SIGRTMIN + 5, 3);
    atomic_store(&c->step, 2);
    async_runtime_post_completion(rt, 4, 5);
    async_runtime_wakeup(rt);
    async_runtime_wait(rt, ev, 4, 0);
    async_runtime_wait(rt, ev, 4, 1);
    async_runtime_wait(rt, ev, 4, 0);
    async_runtime_get_stats(rt, &st, sizeof st);
    atomic_store(&c->step, 3);
    async_runtime_cancel_timer(rt, id);
    async_runtime_remove_signal(rt, SIGRTMIN + 5);
    async_runtime_remove(rt, c->rfd);
    async_runtime_deinit(rt);
    atomic_store(&c->step, 4);
    pthread_testcancel();
    return NULL;
}

/* A fiber spawned from a host thread whose cancel is pending, onto a
 * scheduler whose only worker sleeps in the fd poller: the spawn kicks the
 * poller (a write to its doorbell), which must not be a cancellation point
 * (fiber/poller_epoll.c used libc's write). */
static atomic_int cxk_ran, cxk_step;
static void cxk_fiber(void *arg)
{
    (void)arg;
    atomic_store(&cxk_ran, 1);
}
static void *cxk_thread(void *arg)
{
    async_sched_t *s = arg;
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    atomic_store(&cxk_step, 1);
    async_fiber_spawn(s, cxk_fiber, NULL, 0);
    atomic_store(&cxk_step, 2);
    pthread_testcancel();
    return NULL;
}

static void t_cancel_fiber_kick(void)
{
    async_sched_config_t cfg = {.workers = 1};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s != NULL);
    for (int round = 0; round < 20; round++) {
        atomic_store(&cxk_ran, 0);
        atomic_store(&cxk_step, 0);
        usleep(20000); /* the worker goes back to sleep in the poller */
        pthread_t th;
        start_thread(&th, cxk_thread, s);
        join_within(th, 20000, "cancelled thread");
        if (atomic_load(&cxk_step) != 2)
            fprintf(stderr, "round %d: the pending cancel acted inside async_fiber_spawn\n", round);
        CHECK_EQ(atomic_load(&cxk_step), 2);
        for (int i = 0; i < 20000 && !atomic_load(&cxk_ran); i++)
            usleep(1000);
        CHECK_EQ(atomic_load(&cxk_ran), 1);
    }
    async_sched_destroy(s);
}

static void t_cancel_all_calls(void)
{
    int p[2];
    CHECK_EQ(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
    CHECK_EQ(write(p[1], "x", 1), 1); /* readable: the waits find it */
    cxall_t c;
    c.rfd = p[0];
    atomic_store(&c.step, 0);
    pthread_t th;
    start_thread(&th, cx_all, &c);
    join_within(th, 20000, "cancelled thread");
    if (atomic_load(&c.step) != 4)
        fprintf(stderr, "the pending cancel acted after step %d\n", atomic_load(&c.step));
    CHECK_EQ(atomic_load(&c.step), 4);
    close(p[0]);
    close(p[1]);
}


/* The one line logged for an unknown ASYNC_BACKEND (stderr, the default
 * log writer) is written by a thread whose cancel is pending: the write
 * must not act on it (it runs inside a Go call). */
static void *cx_init(void *arg)
{
    atomic_int *step = arg;
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    async_runtime_t *rt = async_runtime_init();
    atomic_store(step, rt ? 2 : 1);
    pthread_testcancel();
    return NULL;
}

static void t_cancel_log_child(void)
{
    /* A Go call first, so that the one below is not the process's first. */
    CHECK_FAIL(async_runtime_add_timer(NULL, 1, 0, 0) == 0, ASYNC_E_BADHANDLE);
    atomic_int step = 0;
    pthread_t th;
    start_thread(&th, cx_init, &step);
    join_within(th, 20000, "cancelled thread");
    if (atomic_load(&step) != 1)
        fprintf(stderr, "the pending cancel acted inside async_runtime_init (step %d)\n", atomic_load(&step));
    CHECK_EQ(atomic_load(&step), 1);
}

static void t_cancel_log(void)
{
    char out[4096];
    int st = run_self_case_out("cancel_log_child", "ASYNC_BACKEND=nope", out, sizeof out);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
    CHECK(strstr(out, "ASYNC_BACKEND") != NULL);
}


/* The last async_fiber_unwatch_signal of a signal, from a thread whose
 * cancel is pending: it writes a byte under the process-wide signal lock,
 * which async_runtime_deinit and async_runtime_add_signal take too. */
static void *cx_unwatch(void *arg)
{
    atomic_int *step = arg;
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    int rc = async_fiber_unwatch_signal(SIGRTMIN + 7);
    atomic_store(step, rc == 0 ? 1 : 2);
    pthread_testcancel();
    return NULL;
}

static void *rt_signal_cycle(void *arg)
{
    (void)arg;
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    CHECK_EQ(async_runtime_add_signal(rt, SIGRTMIN + 7, 1), 0);
    async_runtime_deinit(rt);
    return NULL;
}

static void t_cancel_unwatch(void)
{
    CHECK_EQ(async_fiber_watch_signal(SIGRTMIN + 7), 0);
    atomic_int step = 0;
    pthread_t th;
    start_thread(&th, cx_unwatch, &step);
    join_within(th, 10000, "cancelled thread");
    if (atomic_load(&step) != 1)
        fprintf(stderr, "the pending cancel acted inside async_fiber_unwatch_signal\n");
    CHECK_EQ(atomic_load(&step), 1);
    /* The signal lock is free: a runtime's watch and deinit go through. */
    start_thread(&th, rt_signal_cycle, NULL);
    join_within(th, 10000, "add_signal and deinit");
}


/* async_worker_signal_stop from a thread whose cancel is pending: the stop
 * descriptor must still become readable (the worker's proc waits for it in
 * async_runtime_wait, as the header suggests). */
static atomic_int stopfd_seen;

static void *stopfd_proc(void *ctx)
{
    async_worker_t **self = ctx;
    while (!atomic_load((atomic_intptr_t *)self))
        sched_yield();
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    int fd = async_worker_stop_fd(*self);
    CHECK(fd >= 0);
    CHECK_EQ(async_runtime_add(rt, fd, ASYNC_EVENT_READ, NULL), 0);
    io_event_t ev[4];
    double t0 = now_ms();
    while (now_ms() - t0 < 5000) {
        int n = async_runtime_wait(rt, ev, 4, 500);
        CHECK(n >= 0);
        if (n > 0 && ev[0].fd == fd) {
            atomic_fetch_or(&stopfd_seen, 1);
            break;
        }
    }
    async_runtime_remove(rt, fd);
    async_runtime_deinit(rt);
    return NULL;
}

static void *cx_stop(void *arg)
{
    async_worker_t *w = arg;
    CHECK_EQ(pthread_cancel(pthread_self()), 0);
    async_worker_signal_stop(w);
    atomic_fetch_or(&stopfd_seen, 2);
    pthread_testcancel();
    return NULL;
}

static void t_cancel_worker_stop(void)
{
    static async_worker_t *_Atomic self;
    atomic_store(&self, NULL);
    async_worker_t *w = async_worker_create(stopfd_proc, (void *)&self, 0);
    CHECK(w);
    atomic_store(&self, w);
    sleep_ms(50); /* the proc reaches its wait */
    pthread_t th;
    start_thread(&th, cx_stop, w);
    join_within(th, 10000, "cancelled thread");
    if (!(atomic_load(&stopfd_seen) & 2))
        fprintf(stderr, "the pending cancel acted inside async_worker_signal_stop\n");
    CHECK(atomic_load(&stopfd_seen) & 2);
    CHECK(async_worker_join(w, 15000));
    if (!(atomic_load(&stopfd_seen) & 1))
        fprintf(stderr, "the worker's stop descriptor never became readable\n");
    CHECK(atomic_load(&stopfd_seen) & 1);
    async_worker_destroy(w);
}

/* ---- RLIMIT_NOFILE, many runtimes ---------------------------------------------- */

static void t_nofile_many(void)
{
    /* Warm up the library (Go's poller) before lowering the limit. */
    async_runtime_t *first = async_runtime_init();
    CHECK(first);
    struct rlimit old, lim;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
    int maxfd = 0;
    for (int fd = 0; fd < 1024; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            maxfd = fd;
    lim = old;
    lim.rlim_cur = (rlim_t)maxfd + 40;
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &lim), 0);
    /* Fill every free number (holes below maxfd too), then free 30. */
    static int fill[1100];
    int nfill = 0;
    for (;;) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            break;
        CHECK(nfill < 1100);
        fill[nfill++] = fd;
    }
    CHECK(nfill >= 30);
    for (int i = 0; i < 30; i++)
        close(fill[--nfill]);
    async_runtime_t *rts[200];
    int n = 0;
    for (; n < 200; n++) {
        async_clear_error();
        rts[n] = async_runtime_init();
        if (!rts[n]) {
            CHECK_ERR(ASYNC_E_SYS);
            break;
        }
    }
    CHECK(n > 0 && n < 200);
    /* Every runtime still works at the limit. */
    io_event_t ev[4];
    for (int i = 0; i < n; i++) {
        CHECK_EQ(async_runtime_post_completion(rts[i], (uintptr_t)i, 1), 0);
        CHECK_EQ(async_runtime_wakeup(rts[i]), 0);
        CHECK_EQ(async_runtime_add_timer(rts[i], 0, 0, 9) != 0, 1);
    }
    for (int i = 0; i < n; i++) {
        int got = 0, timer = 0;
        for (int k = 0; k < 10 && !(got && timer); k++) {
            int m = async_runtime_wait(rts[i], ev, 4, 1000);
            CHECK(m >= 0);
            for (int j = 0; j < m; j++) {
                if (ev[j].event_type == ASYNC_EVENT_COMPLETION) {
                    CHECK_EQ(ev[j].completion_key, i);
                    got++;
                } else {
                    CHECK_EQ(ev[j].event_type, ASYNC_EVENT_TIMER);
                    timer++;
                }
            }
        }
        CHECK_EQ(got, 1);
        CHECK_EQ(timer, 1);
    }
    for (int i = 0; i < n; i++)
        async_runtime_deinit(rts[i]);
    /* The descriptors came back: as many again. */
    int m = 0;
    for (; m < n; m++) {
        rts[m] = async_runtime_init();
        CHECK(rts[m]);
    }
    for (int i = 0; i < m; i++)
        async_runtime_deinit(rts[i]);
    for (int i = 0; i < nfill; i++)
        close(fill[i]);
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
    async_runtime_deinit(first);
}

static const test_case_t cases[] = {
    T(sig_burst_restart), // poll adversarial
    T(sig_burst_norestart), // poll adversarial
    T(sig_other_thread), // poll adversarial
    T(sig_foreign_thread), // poll adversarial
    T(sig_watch_limit), // poll adversarial
    T(wakeup_flood), // poll adversarial
    T(post_shapes), // poll adversarial
    T(pending_exact), // poll adversarial
    T(deinit_reuse), // poll adversarial
    T(fork_child_calls), // poll adversarial
    T(nofile_many), // poll adversarial
    T(sig_count_exact), // poll adversarial
    T(sig_many_runtimes), // poll adversarial
    T(timers_never_early), // poll adversarial
    T(fork_watched_signal), // poll adversarial
    T(cancel_wakeup), // poll adversarial
    T(cancel_post_ring), // poll adversarial
    T(cancel_wait0), // poll adversarial
    T(cancel_wait0_woken), // poll adversarial
    T(cancel_signal_ring), // poll adversarial
    T(cancel_queue_ring), // poll adversarial
    T(cancel_all_calls), // poll adversarial
    T(cancel_fiber_kick), // poll adversarial
    T(cancel_log), // poll adversarial
    T(cancel_unwatch), // poll adversarial
    T(cancel_worker_stop), // poll adversarial
    {"cancel_log_child", t_cancel_log_child}, /* run by cancel_log */
};

TEST_MAIN(cases)
