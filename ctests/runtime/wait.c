/* async_runtime_wait: how a wait ends and who may wait. Wakeups from other
 * threads (before, during and after a wait, many rings at once, 4 threads
 * flooding), from signal handlers on the waiting thread, on other threads
 * and on threads the host did not make (Go's); a wakeup ends exactly one
 * wait, also one that does not sleep (a wait(0), one that returns a queued
 * completion, one a signal interrupted); EINTR; timeouts and bad
 * arguments; one waiter at a time (a second gets ASYNC_E_BUSY, and with two
 * threads waiting in turn every completion still arrives once); fds and
 * timers added while a wait sleeps. An idle runtime sleeps afterwards
 * (check_quiet). */
#include "check.h"
#include "rt.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>

/* --- wakeup ------------------------------------------------------------- */

static async_runtime_t *g_rt;
static atomic_int g_main_done;

static void *wakeup_later(void *arg)
{
    (void)arg;
    sleep_ms(150);
    CHECK_EQ(async_runtime_wakeup(g_rt), 0);
    return NULL;
}

CASE(wakeup_blocked) // poll
{
    pthread_t th;
    io_event_t ev[4];
    double t0, el;
    int n;
    g_rt = mkrt();
    CHECK(pthread_create(&th, NULL, wakeup_later, NULL) == 0);
    t0 = now_ms();
    n = async_runtime_wait(g_rt, ev, 4, 20000);
    el = now_ms() - t0;
    CHECK_EQ(n, 0); /* no event for a wakeup */
    CHECK(el < 10000);
    pthread_join(th, NULL);
    /* the wakeup was consumed: nothing left, and the next wait sleeps */
    t0 = now_ms();
    CHECK_EQ(wait_ok(g_rt, ev, 4, 100), 0);
    CHECK(now_ms() - t0 >= 100.0);
    async_runtime_deinit(g_rt);
}

CASE(wakeup_before_wait) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    double t0;
    CHECK_EQ(async_runtime_wakeup(rt), 0);
    t0 = now_ms();
    CHECK_EQ(wait_ok(rt, ev, 4, 20000), 0);
    CHECK(now_ms() - t0 < 5000); /* returns at once */
    t0 = now_ms();
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0);
    CHECK(now_ms() - t0 >= 100.0);
    /* a wakeup with a pending completion: just the completion */
    CHECK_EQ(async_runtime_wakeup(rt), 0);
    CHECK_EQ(async_runtime_post_completion(rt, 5, 6), 0);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_COMPLETION);
    async_runtime_deinit(rt);
}

/* A wakeup ends exactly one wait early: the next one, even when that wait
 * would not have slept. A wait(0) takes it (with nothing registered, then
 * with an idle fd registered), and the wait after it sleeps its whole
 * timeout. */
CASE(wakeup_taken_by_wait_zero) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int p[2] = {-1, -1};
    double t0;
    for (int round = 0; round < 2; round++) {
        if (round == 1) {
            CHECK_EQ(pipe(p), 0);
            CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0);
        }
        CHECK_EQ(async_runtime_wakeup(rt), 0);
        CHECK_EQ(wait_ok(rt, ev, 4, 0), 0);
        t0 = now_ms();
        CHECK_EQ(wait_ok(rt, ev, 4, 100), 0);
        CHECK(now_ms() - t0 >= 100.0); /* the wait(0) took the wakeup */
    }
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    close(p[0]);
    close(p[1]);
    async_runtime_deinit(rt);
}

/* A wait that returns a completion queued before it began takes a wakeup
 * made before it too (wakeup then post, and post then wakeup): the wait
 * after it sleeps its whole timeout. */
CASE(wakeup_taken_by_wait_with_completion) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    double t0;
    for (int round = 0; round < 2; round++) {
        if (round == 0)
            CHECK_EQ(async_runtime_wakeup(rt), 0);
        CHECK_EQ(async_runtime_post_completion(rt, 5, (uintptr_t)round), 0);
        if (round == 1)
            CHECK_EQ(async_runtime_wakeup(rt), 0);
        CHECK_EQ(wait_ok(rt, ev, 4, 100), 1);
        CHECK_EQ(ev[0].event_type, ASYNC_EVENT_COMPLETION);
        CHECK_EQ(ev[0].completion_key, 5);
        CHECK_EQ(ev[0].data, (uintptr_t)round);
        t0 = now_ms();
        CHECK_EQ(wait_ok(rt, ev, 4, 100), 0);
        CHECK(now_ms() - t0 >= 100.0); /* the first wait took the wakeup */
    }
    async_runtime_deinit(rt);
}

/* The epoll doorbell is edge-triggered and the wait does not read it on a
 * ring from a post (cabi/internal/rt/wait.c), only for a wakeup and every
 * 4096 unread rings. After more rings than that: a wakeup still makes the
 * next wait return 0 at once, it is consumed (the wait after sleeps its
 * whole timeout), and posts still wake a sleeping wait. On the poll
 * backend (a pipe) the same must hold. */
static atomic_long g_ring_acked;
static atomic_int g_ring_stop;
static void *ring_poster(void *arg)
{
    async_runtime_t *rt = arg;
    for (long i = 0; !atomic_load(&g_ring_stop); i++) {
        CHECK_EQ(async_runtime_post_completion(rt, 7, (uintptr_t)i), 0);
        while (atomic_load(&g_ring_acked) <= i && !atomic_load(&g_ring_stop))
            usleep(20); /* the loop goes back to sleep: the next post rings */
    }
    return NULL;
}

CASE(wakeup_after_many_rings) // poll
{
    async_runtime_t *rt = mkrt();
    async_runtime_stats_t st;
    io_event_t ev[4];
    pthread_t th;
    double t0;
    long got = 0;
    atomic_store(&g_ring_acked, 0);
    atomic_store(&g_ring_stop, 0);
    CHECK(pthread_create(&th, NULL, ring_poster, rt) == 0);
    t0 = now_ms();
    for (;;) {
        int n = wait_some(rt, ev, 4, 5000), i;
        CHECK(n >= 1); /* a post always wakes the sleeping wait */
        for (i = 0; i < n; i++) {
            CHECK_EQ(ev[i].completion_key, 7);
            CHECK_EQ((long)ev[i].data, got); /* each once, in order */
            got++;
        }
        atomic_store(&g_ring_acked, got);
        CHECK_EQ(async_runtime_get_stats(rt, &st, sizeof st), (int)sizeof st);
        if (st.doorbell_writes >= 3 * 4096 || now_ms() - t0 > 60000)
            break;
    }
    atomic_store(&g_ring_stop, 1);
    pthread_join(th, NULL);
    /* what the poster posted before it saw the stop */
    for (;;) {
        int n = wait_ok(rt, ev, 4, 0), i;
        if (n == 0)
            break;
        for (i = 0; i < n; i++)
            CHECK_EQ((long)ev[i].data, got++);
    }
    printf("%ld posts, %llu doorbell writes\n", got, (unsigned long long)st.doorbell_writes);
    CHECK(st.doorbell_writes > 4096); /* the unread-ring period was passed */
    CHECK_EQ(async_runtime_wakeup(rt), 0);
    t0 = now_ms();
    CHECK_EQ(wait_ok(rt, ev, 4, 20000), 0);
    CHECK(now_ms() - t0 < 5000); /* the wakeup was seen at once */
    t0 = now_ms();
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0);
    CHECK(now_ms() - t0 >= 100.0); /* and consumed */
    CHECK_EQ(async_runtime_post_completion(rt, 8, 9), 0);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].completion_key, 8);
    async_runtime_deinit(rt);
}

static atomic_int g_handler_rc = 99, g_handler_errno_ok, g_handler_runs;

static void wakeup_handler(int sig)
{
    int saved = errno, rc;
    (void)sig;
    errno = 4242;
    rc = async_runtime_wakeup(g_rt);
    atomic_store(&g_handler_rc, rc);
    atomic_store(&g_handler_errno_ok, errno == 4242);
    atomic_fetch_add(&g_handler_runs, 1);
    errno = saved;
}

/* A thread that never called libasync raises SIGUSR1 on itself, every 100 ms
 * until the main thread's wait returned; the handler calls wakeup. */
static void *raise_self(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_main_done)) {
        sleep_ms(100);
        if (!atomic_load(&g_main_done))
            raise(SIGUSR1);
    }
    return NULL;
}

CASE(wakeup_signal) // poll
{
    pthread_t th;
    io_event_t ev[4];
    double t0;
    int n;
    g_rt = mkrt();
    install_handler(SIGUSR1, wakeup_handler, 0);
    CHECK(pthread_create(&th, NULL, raise_self, NULL) == 0);
    t0 = now_ms();
    n = async_runtime_wait(g_rt, ev, 4, 20000);
    atomic_store(&g_main_done, 1);
    pthread_join(th, NULL);
    CHECK_EQ(n, 0);
    CHECK(now_ms() - t0 < 10000);
    CHECK(atomic_load(&g_handler_runs) >= 1);
    CHECK_EQ(atomic_load(&g_handler_rc), 0);
    CHECK_EQ(atomic_load(&g_handler_errno_ok), 1); /* errno left untouched */
    async_runtime_deinit(g_rt);
}

/* A thread that keeps SIGALRM unblocked; the main (waiting) thread blocks it,
 * so the setitimer signal runs the handler on some other thread. */
static void *alarm_sink(void *arg)
{
    sigset_t set;
    (void)arg;
    sigemptyset(&set);
    sigaddset(&set, SIGALRM);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    while (!atomic_load(&g_main_done))
        sleep_ms(10);
    return NULL;
}

CASE(wakeup_setitimer) // poll
{
    pthread_t th;
    sigset_t set;
    struct itimerval it;
    io_event_t ev[4];
    double t0, el;
    int n, err;
    g_rt = mkrt();
    install_handler(SIGALRM, wakeup_handler, 0);
    CHECK(pthread_create(&th, NULL, alarm_sink, NULL) == 0);
    sigemptyset(&set);
    sigaddset(&set, SIGALRM);
    CHECK(pthread_sigmask(SIG_BLOCK, &set, NULL) == 0);
    memset(&it, 0, sizeof it);
    it.it_value.tv_usec = 100000;
    it.it_interval.tv_usec = 100000; /* repeats in case the first one comes before the wait */
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
    t0 = now_ms();
    n = async_runtime_wait(g_rt, ev, 4, 20000);
    err = n < 0 ? async_last_error() : 0;
    el = now_ms() - t0;
    memset(&it, 0, sizeof it);
    setitimer(ITIMER_REAL, &it, NULL);
    atomic_store(&g_main_done, 1);
    pthread_join(th, NULL);
    /* SIGALRM is process-directed: besides alarm_sink, any thread that has it
     * unblocked (a Go runtime thread) may run the handler, and the wait may
     * return (the handler's wakeup) before that handler has counted itself.
     * Wait for the count (bounded) instead of assuming the joined thread ran
     * it. */
    for (double t1 = now_ms(); atomic_load(&g_handler_runs) < 1 && now_ms() - t1 < 10000;)
        sleep_ms(1);
    if (n != 0 || atomic_load(&g_handler_runs) < 1 || atomic_load(&g_handler_rc) != 0 ||
        atomic_load(&g_handler_errno_ok) != 1)
        fprintf(stderr, "wait returned %d (error %d) after %.1f ms; handler ran %d times, rc %d, errno kept %d\n",
                n, err, el, atomic_load(&g_handler_runs), atomic_load(&g_handler_rc),
                atomic_load(&g_handler_errno_ok));
    CHECK_EQ(n, 0);
    CHECK(now_ms() - t0 < 10000);
    CHECK(atomic_load(&g_handler_runs) >= 1);
    CHECK_EQ(atomic_load(&g_handler_rc), 0);
    CHECK_EQ(atomic_load(&g_handler_errno_ok), 1);
    async_runtime_deinit(g_rt);
}

/* --- EINTR -------------------------------------------------------------- */

static atomic_int g_sig_seen;
static pthread_t g_main_thread;

static void flag_handler(int sig)
{
    (void)sig;
    atomic_fetch_add(&g_sig_seen, 1);
}

static void *kill_main_repeatedly(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_main_done)) {
        sleep_ms(100);
        if (!atomic_load(&g_main_done))
            pthread_kill(g_main_thread, SIGUSR2);
    }
    return NULL;
}

CASE(eintr) // poll
{
    pthread_t th;
    io_event_t ev[4];
    double t0;
    int n, round;
    g_rt = mkrt();
    g_main_thread = pthread_self();
    install_handler(SIGUSR2, flag_handler, 0);
    for (round = 0; round < 2; round++) {
        atomic_store(&g_main_done, 0);
        atomic_store(&g_sig_seen, 0);
        CHECK(pthread_create(&th, NULL, kill_main_repeatedly, NULL) == 0);
        t0 = now_ms();
        n = async_runtime_wait(g_rt, ev, 4, round == 0 ? 20000 : -1);
        atomic_store(&g_main_done, 1);
        pthread_join(th, NULL);
        CHECK_EQ(n, 0); /* interrupted: 0 events, so the caller can check its flags */
        CHECK(atomic_load(&g_sig_seen) >= 1);
        CHECK(now_ms() - t0 < 10000);
    }
    /* still fully usable afterwards */
    CHECK_EQ(async_runtime_post_completion(g_rt, 1, 2), 0);
    CHECK_EQ(wait_some(g_rt, ev, 4, 5000), 1);
    async_runtime_deinit(g_rt);
}

/* A signal whose handler calls async_runtime_wakeup interrupts the wait of
 * the thread it lands on: that wait returns 0 and takes the wakeup, so the
 * wait after it sleeps its whole timeout. */
CASE(wakeup_taken_by_interrupted_wait) // poll
{
    pthread_t th;
    io_event_t ev[4];
    double t0;
    g_rt = mkrt();
    g_main_thread = pthread_self();
    install_handler(SIGUSR2, wakeup_handler, 0);
    CHECK(pthread_create(&th, NULL, kill_main_repeatedly, NULL) == 0);
    t0 = now_ms();
    CHECK_EQ(wait_ok(g_rt, ev, 4, 20000), 0);
    CHECK(now_ms() - t0 < 10000);
    atomic_store(&g_main_done, 1);
    pthread_join(th, NULL);
    CHECK(atomic_load(&g_handler_runs) >= 1);
    CHECK_EQ(atomic_load(&g_handler_rc), 0);
    /* A thread this slow may have let the sender signal again after the
     * wait returned: that later wakeup is pending, and a wait(0) takes it. */
    if (atomic_load(&g_handler_runs) > 1)
        CHECK_EQ(wait_ok(g_rt, ev, 4, 0), 0);
    t0 = now_ms();
    CHECK_EQ(wait_ok(g_rt, ev, 4, 100), 0);
    CHECK(now_ms() - t0 >= 100.0);
    install_handler(SIGUSR2, SIG_IGN, 0);
    async_runtime_deinit(g_rt);
}

/* --- wait arguments and timeouts ---------------------------------------- */

CASE(wait_timeouts) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    double t0, el;
    int ms[3] = {1, 100, 250}, i;
    t0 = now_ms();
    CHECK_EQ(wait_ok(rt, ev, 4, 0), 0);
    CHECK(now_ms() - t0 < 1000);
    for (i = 0; i < 3; i++) {
        t0 = now_ms();
        CHECK_EQ(wait_ok(rt, ev, 4, ms[i]), 0);
        el = now_ms() - t0;
        if (el < ms[i])
            fprintf(stderr, "wait(%d) returned after %.3f ms\n", ms[i], el);
        CHECK(el >= (double)ms[i]);
        CHECK(el < ms[i] + 2000.0);
    }
    /* a long wait sleeps: it does not spin on the CPU */
    {
        struct timespec c0, c1;
        double cpu;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        CHECK_EQ(wait_ok(rt, ev, 4, 400), 0);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        cpu = (double)(c1.tv_sec - c0.tv_sec) * 1e3 + (double)(c1.tv_nsec - c0.tv_nsec) / 1e6;
        if (cpu >= 200.0)
            fprintf(stderr, "wait(400) used %.1f ms of CPU\n", cpu);
        CHECK(cpu < 200.0);
    }
    async_runtime_deinit(rt);
}

CASE(wait_inval) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    CHECK_FAIL(async_runtime_wait(rt, NULL, 4, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, -1, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, 4, -2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, 4, -1000) == -1, ASYNC_E_INVAL);
    /* an invalid call consumed nothing */
    CHECK_EQ(async_runtime_post_completion(rt, 1, 1), 0);
    CHECK_FAIL(async_runtime_wait(rt, ev, 0, -1) == -1, ASYNC_E_INVAL);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    async_runtime_deinit(rt);
}

/* --- concurrency on one runtime ----------------------------------------- */

typedef struct {
    async_runtime_t *rt;
    int n, err;
    double elapsed;
} waiter_t;

static void *waiter_thread(void *arg)
{
    waiter_t *w = (waiter_t *)arg;
    io_event_t ev[4];
    double t0 = now_ms();
    for (;;) {
        w->n = async_runtime_wait(w->rt, ev, 4, 20000);
        w->err = w->n < 0 ? async_last_error() : 0;
        if (!(w->n < 0 && w->err == ASYNC_E_BUSY)) /* lost a race with the probe: retry */
            break;
        sleep_ms(1);
    }
    w->elapsed = now_ms() - t0;
    return NULL;
}

/* Returns once the waiter thread is inside async_runtime_wait: the main
 * thread's own wait fails with ASYNC_E_BUSY. */
static void probe_busy(async_runtime_t *rt)
{
    io_event_t ev[4];
    double t0 = now_ms();
    for (;;) {
        int n = async_runtime_wait(rt, ev, 4, 0);
        if (n == -1) {
            CHECK_ERR(ASYNC_E_BUSY);
            return;
        }
        CHECK_EQ(n, 0);
        CHECK(now_ms() - t0 < 10000);
        sleep_ms(5);
    }
}

/* Starts waiter_thread on a new runtime (w->rt) and returns once its wait
 * is in progress (another thread's wait is refused as busy). */
static void start_waiter(waiter_t *w, pthread_t *th)
{
    memset(w, 0, sizeof *w);
    w->rt = mkrt();
    start_thread(th, waiter_thread, w);
    probe_busy(w->rt);
}

CASE(busy) // poll
{
    waiter_t w;
    pthread_t th;
    start_waiter(&w, &th);
    CHECK_FAIL(async_runtime_wait(w.rt, (io_event_t[1]){{0}}, 1, 100) == -1, ASYNC_E_BUSY);
    CHECK_EQ(async_runtime_wakeup(w.rt), 0);
    pthread_join(th, NULL);
    CHECK_EQ(w.n, 0);
    CHECK(w.elapsed < 15000);
    /* once the other thread left, this thread may wait */
    CHECK_EQ(async_runtime_post_completion(w.rt, 1, 1), 0);
    {
        io_event_t ev[2];
        CHECK_EQ(wait_some(w.rt, ev, 2, 5000), 1);
    }
    async_runtime_deinit(w.rt);
}

CASE(deinit_while_waiting) // poll
{
    waiter_t w;
    pthread_t th;
    start_waiter(&w, &th);
    async_runtime_deinit(w.rt);
    pthread_join(th, NULL);
    CHECK_EQ(w.n, -1);
    CHECK_EQ(w.err, ASYNC_E_CLOSED);
    CHECK(w.elapsed < 15000);
    CHECK_FAIL(async_runtime_post_completion(w.rt, 1, 1) == -1, ASYNC_E_BADHANDLE);
}

static async_runtime_t *g_art;
static int g_apipe[2];

static void *add_later(void *arg)
{
    char c = 'a';
    (void)arg;
    sleep_ms(150);
    CHECK(write(g_apipe[1], &c, 1) == 1);
    CHECK_EQ(async_runtime_add(g_art, g_apipe[0], ASYNC_EVENT_READ, &g_apipe), 0);
    return NULL;
}

CASE(add_while_waiting) // poll
{
    /* an fd added by another thread during a wait is watched by that wait */
    pthread_t th;
    io_event_t ev[4];
    double t0;
    int n;
    g_art = mkrt();
    CHECK(pipe(g_apipe) == 0);
    CHECK(pthread_create(&th, NULL, add_later, NULL) == 0);
    t0 = now_ms();
    n = wait_some(g_art, ev, 4, 10000);
    pthread_join(th, NULL);
    CHECK_EQ(n, 1);
    CHECK(now_ms() - t0 < 9000);
    CHECK_EQ(ev[0].fd, g_apipe[0]);
    CHECK(ev[0].event_type & ASYNC_EVENT_READ);
    CHECK(ev[0].context == (void *)&g_apipe);
    CHECK_EQ(async_runtime_remove(g_art, g_apipe[0]), 0);
    async_runtime_deinit(g_art);
    close_pair(g_apipe);
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
 * wakeup from the handler, with no event, long before its 10 s timeout: a
 * lost wakeup fails), then stops and joins the sender. */
static void wait_rounds(sigsend_t *s)
{
    pthread_t th;
    start_thread(&th, sig_sender, s);
    io_event_t ev[MAXEV];
    for (int r = 1; r <= s->rounds; r++) {
        atomic_store(&s->waiting, r);
        double t0 = now_ms();
        int n = async_runtime_wait(sig_rt, ev, MAXEV, 10000);
        double took = now_ms() - t0;
        CHECK_EQ(n, 0);
        if (took >= 9000)
            fprintf(stderr, "round %d: the wait ran to its timeout (the handler's wakeup was lost)\n", r);
        CHECK(took < 9000);
    }
    atomic_store(&s->stop, 1);
    join_within(th, 10000, "sender");
}

/* Bursts of signals whose handler calls async_runtime_wakeup land on the
 * thread blocked in async_runtime_wait(-1): every round must end (the wait
 * returns), and once the bursts are over a wait must sleep again. */
static void sig_burst(int flags)
{
    if (ASYNC_TEST_TSAN && backend_is_poll()) {
        /* TSan runs an asynchronous signal's handler only once the thread
         * enters a function it intercepts; the poll backend's sleep (a raw
         * ppoll in Go) is none, so the handler's wakeup comes as late as the
         * wait's timeout. */
        printf("not run: TSan with the poll backend\n");
        return;
    }
    sig_rt = async_runtime_init();
    CHECK(sig_rt);
    install_handler(SIGUSR1, wake_handler, flags);
    sigsend_t s;
    memset(&s, 0, sizeof s);
    s.target = pthread_self();
    s.rounds = 2000;
    s.burst = 5;
    wait_rounds(&s);
    /* Let the last signals land, then the loop must settle. */
    sleep_ms(20);
    check_quiet(sig_rt, 3);
    install_handler(SIGUSR1, SIG_IGN, 0);
    async_runtime_deinit(sig_rt);
}

CASE(sig_burst_restart) { sig_burst(SA_RESTART); } // poll adversarial
CASE(sig_burst_norestart) { sig_burst(0); } // poll adversarial

static void *sig_victim(void *arg);

/* The handler runs on another thread than the waiter (the waiter blocks
 * SIGUSR1): its wakeups must still end every wait. */
CASE(sig_other_thread) // poll adversarial
{
    sig_rt = async_runtime_init();
    CHECK(sig_rt);
    install_handler(SIGUSR1, wake_handler, 0);
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
    start_thread(&victim, sig_victim, &h.stop);
    s.target = victim;
    wait_rounds(&s);
    atomic_store(&h.stop, 1);
    join_within(victim, 10000, "victim");
    check_quiet(sig_rt, 2);
    CHECK_EQ(pthread_sigmask(SIG_UNBLOCK, &set, NULL), 0);
    install_handler(SIGUSR1, SIG_IGN, 0);
    async_runtime_deinit(sig_rt);
}

static void *sig_victim(void *arg)
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
 * wakeup must still end each wait. Not under TSan: it runs a signal's handler
 * only once the thread enters a function it intercepts, which Go's threads
 * may not do before the wait's timeout. */
CASE(sig_foreign_thread) // poll adversarial notsan
{
    sig_rt = async_runtime_init();
    CHECK(sig_rt);
    install_handler(SIGUSR1, wake_handler, SA_RESTART);
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
    install_handler(SIGUSR1, SIG_IGN, 0);
    CHECK_EQ(pthread_sigmask(SIG_UNBLOCK, &set, NULL), 0);
    async_runtime_deinit(sig_rt);
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
CASE(wakeup_flood) // poll adversarial
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

/* --- two_waiters ----------------------------------------------------------- */

#define TW_N 4000000
#define TW_WAITERS 4
static async_runtime_t *tw_rt;
static _Atomic unsigned char tw_seen[TW_N];
static atomic_long tw_got, tw_dup, tw_busy, tw_bad;
static atomic_int tw_stop, tw_post_stop;
static atomic_long tw_posted;

static void *tw_waiter(void *arg)
{
    io_event_t ev[512];
    int max = (int)(intptr_t)arg;
    while (!atomic_load(&tw_stop)) {
        int n = async_runtime_wait(tw_rt, ev, max, 1);
        if (n < 0) {
            if (async_last_error() == ASYNC_E_BUSY) {
                /* spin: the race needs a waiter ready the moment the
                 * flag clears */
                atomic_fetch_add(&tw_busy, 1);
            }
            else if (atomic_fetch_add(&tw_bad, 1) == 0)
                fprintf(stderr, "wait failed: %d\n", async_last_error());
            continue;
        }
        for (int i = 0; i < n; i++) {
            uintptr_t d = ev[i].data;
            if (ev[i].event_type == ASYNC_EVENT_TIMER && ev[i].completion_key == 8)
                continue;
            if (ev[i].event_type != ASYNC_EVENT_COMPLETION || ev[i].completion_key != 7 || d >= TW_N) {
                if (atomic_fetch_add(&tw_bad, 1) == 0)
                    fprintf(stderr, "bad event: type %u key %lu data %lu\n", ev[i].event_type,
                            (unsigned long)ev[i].completion_key, (unsigned long)d);
                continue;
            }
            if (atomic_fetch_add(&tw_seen[d], 1) != 0)
                atomic_fetch_add(&tw_dup, 1);
            atomic_fetch_add(&tw_got, 1);
        }
    }
    return NULL;
}

static void *tw_poster(void *arg)
{
    (void)arg;
    for (uintptr_t i = 0; i < TW_N && !atomic_load(&tw_post_stop); i++) {
        CHECK_EQ(async_runtime_post_completion(tw_rt, 7, i), 0);
        atomic_store(&tw_posted, (long)i + 1);
        if (i % 1024 == 0)
            sched_yield(); /* completions arrive in bursts and gaps */
    }
    return NULL;
}

CASE(two_waiters) // poll timeout=120
{
    pthread_t w[TW_WAITERS], p;
    long missing = 0;
    double t0;
    tw_rt = mkrt();
    /* Repeating timers keep Go busy, so that both waiters take the Go path
     * (the fast path in C only hands out C-posted completions). */
    for (int i = 0; i < 1000; i++)
        CHECK(async_runtime_add_timer(tw_rt, 1, 1, 8) != 0);
    for (int i = 0; i < TW_WAITERS; i++)
        start_thread(&w[i], tw_waiter, (void *)(intptr_t)512);
    start_thread(&p, tw_poster, NULL);
    /* 5 s of posting (a time, not a count: how many posts fit varies a
     * lot with the load), then every post must come out exactly once. */
    sleep_ms(5000);
    atomic_store(&tw_post_stop, 1);
    join_within(p, 60000, "poster");
    t0 = now_ms();
    while (atomic_load(&tw_got) < atomic_load(&tw_posted) && now_ms() - t0 < 20000)
        sleep_ms(5);
    sleep_ms(20); /* a late duplicate would show now */
    atomic_store(&tw_stop, 1);
    for (int i = 0; i < TW_WAITERS; i++)
        join_within(w[i], 10000, "waiter");
    long posted = atomic_load(&tw_posted);
    for (long i = 0; i < posted; i++)
        missing += atomic_load(&tw_seen[i]) == 0;
    fprintf(stderr, "two_waiters: %ld posted, %ld delivered, %ld duplicates, %ld missing, %ld busy, %ld bad\n",
           posted, (long)atomic_load(&tw_got), (long)atomic_load(&tw_dup), missing, (long)atomic_load(&tw_busy),
           (long)atomic_load(&tw_bad));
    CHECK_EQ(atomic_load(&tw_bad), 0);
    CHECK_EQ(atomic_load(&tw_dup), 0);
    CHECK_EQ(missing, 0);
    CHECK_EQ(atomic_load(&tw_got), posted);
    async_runtime_deinit(tw_rt);
}

TEST_MAIN()
