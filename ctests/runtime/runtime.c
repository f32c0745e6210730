/* async_runtime tests. Run one case: test_runtime CASE. CMake registers every
 * case twice: with the default backend and with ASYNC_BACKEND=poll. */
#include "check.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/time.h>


static int wait_ok(async_runtime_t *rt, io_event_t *ev, int max, int timeout)
{
    int n = async_runtime_wait(rt, ev, max, timeout);
    CHECK(n >= 0);
    CHECK(n <= max);
    return n;
}

/* Waits until at least one event arrives (or `ms` pass); returns the count. */
static int wait_some(async_runtime_t *rt, io_event_t *ev, int max, int ms)
{
    double t0 = now_ms();
    for (;;) {
        int left = ms - (int)(now_ms() - t0), n;
        if (left <= 0)
            return 0;
        n = wait_ok(rt, ev, max, left);
        if (n > 0)
            return n;
    }
}

static void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    CHECK(fl != -1);
    CHECK(fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0);
}

/* Installs `fn` for `sig` the way a cgo host must: SA_ONSTACK, and no
 * SA_RESTART so interrupted system calls fail with EINTR. */
static void on_signal(int sig, void (*fn)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(sig, &sa, NULL) == 0);
}

/* --- completions -------------------------------------------------------- */

static void t_post_basic(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[8];
    int n;
    CHECK_EQ(async_runtime_post_completion(rt, UINTPTR_MAX, 0), 0);
    CHECK_EQ(async_runtime_post_completion(rt, 0, UINTPTR_MAX), 0);
    CHECK_EQ(async_runtime_post_completion(rt, (uintptr_t)0x8000000000000001ull, (uintptr_t)0x123456789ull), 0);
    n = wait_some(rt, ev, 8, 5000);
    CHECK_EQ(n, 3);
    CHECK_EQ(ev[0].fd, -1);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_COMPLETION);
    CHECK(ev[0].completion_key == UINTPTR_MAX);
    CHECK(ev[0].data == 0);
    CHECK(ev[1].completion_key == 0);
    CHECK(ev[1].data == UINTPTR_MAX);
    CHECK(ev[2].completion_key == (uintptr_t)0x8000000000000001ull);
    CHECK(ev[2].data == (uintptr_t)0x123456789ull);
    CHECK_EQ(ev[1].event_type, ASYNC_EVENT_COMPLETION);
    CHECK_EQ(ev[2].fd, -1);
    CHECK(ev[0].context == NULL && ev[1].context == NULL && ev[2].context == NULL);
    CHECK_EQ(wait_ok(rt, ev, 8, 0), 0); /* delivered exactly once */
    async_runtime_deinit(rt);
}

#define MPSC_PRODUCERS 8
#define MPSC_POSTS 1000000u
#define MPSC_KEY(p) (((uintptr_t)0xABCD << 48) | (uintptr_t)(p))
#define MPSC_DATA(p, s) ((uintptr_t)0xF000000000000000ull | ((uintptr_t)(p) << 36) | (uintptr_t)(s))

static async_runtime_t *g_mrt;
static pthread_barrier_t g_mbar;

static void *mpsc_producer(void *arg)
{
    uintptr_t p = (uintptr_t)arg;
    uint32_t s;
    pthread_barrier_wait(&g_mbar);
    for (s = 0; s < MPSC_POSTS; s++)
        CHECK_EQ(async_runtime_post_completion(g_mrt, MPSC_KEY(p), MPSC_DATA(p, s)), 0);
    return NULL;
}

static void t_mpsc(void)
{
    pthread_t th[MPSC_PRODUCERS];
    static io_event_t ev[512];
    uint64_t next[MPSC_PRODUCERS] = {0};
    uint64_t total = 0, want = (uint64_t)MPSC_PRODUCERS * MPSC_POSTS;
    int i;
    g_mrt = mkrt();
    CHECK(pthread_barrier_init(&g_mbar, NULL, MPSC_PRODUCERS + 1) == 0);
    for (i = 0; i < MPSC_PRODUCERS; i++)
        CHECK(pthread_create(&th[i], NULL, mpsc_producer, (void *)(uintptr_t)i) == 0);
    pthread_barrier_wait(&g_mbar);
    while (total < want) {
        int n = async_runtime_wait(g_mrt, ev, 512, 20000), k;
        CHECK(n > 0); /* producers are still posting: 20 s without an event is a hang */
        for (k = 0; k < n; k++) {
            uintptr_t p = ev[k].completion_key & 0xFFFF;
            CHECK_EQ(ev[k].event_type, ASYNC_EVENT_COMPLETION);
            CHECK_EQ(ev[k].fd, -1);
            CHECK(ev[k].completion_key == MPSC_KEY(p));
            CHECK(p < MPSC_PRODUCERS);
            /* in order per producer, each exactly once */
            if (ev[k].data != MPSC_DATA(p, next[p])) {
                fprintf(stderr, "producer %u: expected seq %llu, got data %#llx\n", (unsigned)p,
                        (unsigned long long)next[p], (unsigned long long)ev[k].data);
                CHECK(ev[k].data == MPSC_DATA(p, next[p]));
            }
            next[p]++;
        }
        total += (uint64_t)n;
    }
    for (i = 0; i < MPSC_PRODUCERS; i++)
        pthread_join(th[i], NULL);
    for (i = 0; i < MPSC_PRODUCERS; i++)
        CHECK_EQ(next[i], MPSC_POSTS);
    CHECK_EQ(wait_ok(g_mrt, ev, 512, 0), 0);
    pthread_barrier_destroy(&g_mbar);
    async_runtime_deinit(g_mrt);
}

static void t_max_events(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[64];
    uintptr_t i;
    int n;
    for (i = 0; i < 10; i++)
        CHECK_EQ(async_runtime_post_completion(rt, 7, i), 0);
    memset(ev, 0xEE, sizeof ev);
    CHECK_EQ(wait_some(rt, ev, 1, 5000), 1);
    CHECK(ev[0].data == 0);
    CHECK(ev[1].data == (uintptr_t)0xEEEEEEEEEEEEEEEEull); /* only max_events entries written */
    n = wait_some(rt, ev, 3, 5000);
    CHECK_EQ(n, 3);
    for (i = 0; i < 3; i++)
        CHECK(ev[i].data == 1 + i);
    n = wait_some(rt, ev, 64, 5000);
    CHECK_EQ(n, 6);
    for (i = 0; i < 6; i++)
        CHECK(ev[i].data == 4 + i);
    CHECK_EQ(wait_ok(rt, ev, 64, 0), 0);
    /* timers beyond max_events stay queued too */
    CHECK(async_runtime_add_timer(rt, 0, 0, 100) != 0);
    CHECK(async_runtime_add_timer(rt, 0, 0, 101) != 0);
    CHECK_EQ(async_runtime_post_completion(rt, 1, 1), 0);
    sleep_ms(50);
    {
        int got = 0, timers = 0, comps = 0;
        double t0 = now_ms();
        while (got < 3 && now_ms() - t0 < 5000) {
            n = wait_ok(rt, ev, 1, 100);
            if (n == 1) {
                got++;
                timers += ev[0].event_type == ASYNC_EVENT_TIMER;
                comps += ev[0].event_type == ASYNC_EVENT_COMPLETION;
            }
        }
        CHECK_EQ(timers, 2);
        CHECK_EQ(comps, 1);
    }
    CHECK_EQ(wait_ok(rt, ev, 64, 50), 0);
    async_runtime_deinit(rt);
}

static void t_two_runtimes(void)
{
    async_runtime_t *a = mkrt(), *b = mkrt();
    io_event_t ev[4];
    CHECK(a != b);
    CHECK_EQ(async_runtime_post_completion(a, 1, 2), 0);
    CHECK(async_runtime_add_timer(a, 0, 0, 3) != 0);
    CHECK_EQ(wait_ok(b, ev, 4, 100), 0);
    CHECK_EQ(async_runtime_wakeup(b), 0);
    CHECK_EQ(wait_some(a, ev, 4, 5000) >= 1, 1);
    async_runtime_deinit(a);
    CHECK_EQ(async_runtime_post_completion(b, 4, 5), 0); /* b is still alive */
    CHECK_EQ(wait_some(b, ev, 4, 5000), 1);
    CHECK(ev[0].completion_key == 4 && ev[0].data == 5);
    async_runtime_deinit(b);
}

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

static void t_wakeup_blocked(void)
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

static void t_wakeup_before_wait(void)
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

static void t_wakeup_after_many_rings(void)
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

static void t_wakeup_signal(void)
{
    pthread_t th;
    io_event_t ev[4];
    double t0;
    int n;
    g_rt = mkrt();
    on_signal(SIGUSR1, wakeup_handler);
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

static void t_wakeup_setitimer(void)
{
    pthread_t th;
    sigset_t set;
    struct itimerval it;
    io_event_t ev[4];
    double t0, el;
    int n, err;
    g_rt = mkrt();
    on_signal(SIGALRM, wakeup_handler);
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

static void t_eintr(void)
{
    pthread_t th;
    io_event_t ev[4];
    double t0;
    int n, round;
    g_rt = mkrt();
    g_main_thread = pthread_self();
    on_signal(SIGUSR2, flag_handler);
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

/* --- wait arguments and timeouts ---------------------------------------- */

static void t_wait_timeouts(void)
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

static void t_wait_inval(void)
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

static void t_busy(void)
{
    waiter_t w;
    pthread_t th;
    memset(&w, 0, sizeof w);
    w.rt = mkrt();
    CHECK(pthread_create(&th, NULL, waiter_thread, &w) == 0);
    probe_busy(w.rt);
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

static void t_deinit_while_waiting(void)
{
    waiter_t w;
    pthread_t th;
    memset(&w, 0, sizeof w);
    w.rt = mkrt();
    CHECK(pthread_create(&th, NULL, waiter_thread, &w) == 0);
    probe_busy(w.rt);
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

static void t_add_while_waiting(void)
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
    close(g_apipe[0]);
    close(g_apipe[1]);
}

/* --- fd readiness ------------------------------------------------------- */

static int ctx_a, ctx_b;

static void t_fd_read(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int p[2], i;
    char c = 'x';
    CHECK(pipe(p) == 0);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_a), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0); /* nothing to read yet */
    CHECK(write(p[1], &c, 1) == 1);
    /* level-triggered: reported on every wait until consumed */
    for (i = 0; i < 3; i++) {
        CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
        CHECK_EQ(ev[0].fd, p[0]);
        CHECK(ev[0].event_type & ASYNC_EVENT_READ);
        CHECK(!(ev[0].event_type & (ASYNC_EVENT_COMPLETION | ASYNC_EVENT_TIMER | ASYNC_EVENT_WRITE)));
        CHECK(ev[0].context == (void *)&ctx_a);
        CHECK(ev[0].completion_key == 0 && ev[0].data == 0);
    }
    CHECK(read(p[0], &c, 1) == 1);
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    async_runtime_deinit(rt);
    close(p[0]);
    close(p[1]);
}

static void t_fd_write(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int s[2], n, filled = 0;
    char buf[4096];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0);
    set_nonblock(s[0]);
    set_nonblock(s[1]);
    CHECK_EQ(async_runtime_add(rt, s[0], ASYNC_EVENT_WRITE, &ctx_b), 0);
    n = wait_some(rt, ev, 4, 5000);
    CHECK_EQ(n, 1);
    CHECK_EQ(ev[0].fd, s[0]);
    CHECK(ev[0].event_type & ASYNC_EVENT_WRITE);
    CHECK(!(ev[0].event_type & ASYNC_EVENT_READ));
    CHECK(ev[0].context == (void *)&ctx_b);
    /* fill the socket: no longer writable */
    memset(buf, 'w', sizeof buf);
    for (;;) {
        ssize_t w = send(s[0], buf, sizeof buf, MSG_NOSIGNAL);
        if (w < 0) {
            CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
            break;
        }
        filled += (int)w;
    }
    CHECK(filled > 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0);
    /* drain the peer: writable again */
    while (recv(s[1], buf, sizeof buf, 0) > 0) {
    }
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].fd, s[0]);
    CHECK(ev[0].event_type & ASYNC_EVENT_WRITE);
    CHECK_EQ(async_runtime_remove(rt, s[0]), 0);
    async_runtime_deinit(rt);
    close(s[0]);
    close(s[1]);
}

/* ORs the bits reported for fd over one wait (READ and WRITE may come in one
 * event or in two). */
static uint32_t bits_for(async_runtime_t *rt, int fd, void *ctx)
{
    io_event_t ev[8];
    uint32_t bits = 0;
    int n = wait_some(rt, ev, 8, 5000), i;
    for (i = 0; i < n; i++) {
        CHECK_EQ(ev[i].fd, fd);
        CHECK(ev[i].context == ctx);
        bits |= ev[i].event_type;
    }
    return bits;
}

static void t_fd_readwrite(void)
{
    async_runtime_t *rt = mkrt();
    int s[2];
    uint32_t bits;
    char c = 'r';
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0);
    CHECK_EQ(async_runtime_add(rt, s[0], ASYNC_EVENT_READ | ASYNC_EVENT_WRITE, &ctx_a), 0);
    bits = bits_for(rt, s[0], &ctx_a);
    CHECK(bits & ASYNC_EVENT_WRITE);
    CHECK(!(bits & ASYNC_EVENT_READ));
    CHECK(send(s[1], &c, 1, MSG_NOSIGNAL) == 1);
    bits = bits_for(rt, s[0], &ctx_a);
    CHECK((bits & (ASYNC_EVENT_READ | ASYNC_EVENT_WRITE)) == (ASYNC_EVENT_READ | ASYNC_EVENT_WRITE));
    CHECK(!(bits & (ASYNC_EVENT_CLOSE | ASYNC_EVENT_ERROR)));
    CHECK_EQ(async_runtime_remove(rt, s[0]), 0);
    async_runtime_deinit(rt);
    close(s[0]);
    close(s[1]);
}

static void t_fd_close(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int p[2], s[2];
    /* pipe: the writer goes away */
    CHECK(pipe(p) == 0);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_a), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
    close(p[1]);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].fd, p[0]);
    CHECK(ev[0].event_type & ASYNC_EVENT_CLOSE);
    CHECK(ev[0].context == (void *)&ctx_a);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    close(p[0]);
    /* socket: the peer closes (only READ was asked for; CLOSE always comes) */
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0);
    CHECK_EQ(async_runtime_add(rt, s[0], ASYNC_EVENT_READ, &ctx_b), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
    close(s[1]);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].fd, s[0]);
    CHECK(ev[0].event_type & ASYNC_EVENT_CLOSE);
    CHECK(ev[0].context == (void *)&ctx_b);
    /* level-triggered: reported again */
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].event_type & ASYNC_EVENT_CLOSE);
    CHECK_EQ(async_runtime_remove(rt, s[0]), 0);
    close(s[0]);
    async_runtime_deinit(rt);
}

static void t_fd_error(void)
{
    /* a pipe's write end whose reader is gone has an error condition;
     * ERROR is reported even when only READ is watched */
    async_runtime_t *rt = mkrt();
    uint32_t masks[2] = {ASYNC_EVENT_WRITE, ASYNC_EVENT_READ};
    int i;
    for (i = 0; i < 2; i++) {
        io_event_t ev[4];
        int p[2];
        CHECK(pipe(p) == 0);
        close(p[0]);
        CHECK_EQ(async_runtime_add(rt, p[1], masks[i], &ctx_b), 0);
        CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
        CHECK_EQ(ev[0].fd, p[1]);
        CHECK(ev[0].event_type & ASYNC_EVENT_ERROR);
        CHECK(ev[0].context == (void *)&ctx_b);
        CHECK_EQ(async_runtime_remove(rt, p[1]), 0);
        close(p[1]);
    }
    async_runtime_deinit(rt);
}

static void t_fd_modify(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int s[2], other[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0);
    CHECK(pipe(other) == 0);
    CHECK_EQ(async_runtime_add(rt, s[0], ASYNC_EVENT_READ, &ctx_a), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
    CHECK_EQ(async_runtime_modify(rt, s[0], ASYNC_EVENT_WRITE), 0);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].fd, s[0]);
    CHECK(ev[0].event_type & ASYNC_EVENT_WRITE);
    CHECK(ev[0].context == (void *)&ctx_a); /* the context from add is kept */
    CHECK_EQ(async_runtime_modify(rt, s[0], ASYNC_EVENT_READ), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
    CHECK_FAIL(async_runtime_modify(rt, s[0], 0x40) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_modify(rt, s[0], ASYNC_EVENT_READ | 0x1000) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_modify(rt, other[0], ASYNC_EVENT_READ) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_modify(rt, -1, ASYNC_EVENT_READ) == -1, ASYNC_E_BADFD);
    /* the failed modifies changed nothing: still READ only */
    CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
    CHECK(send(s[1], "z", 1, MSG_NOSIGNAL) == 1);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].event_type & ASYNC_EVENT_READ);
    CHECK(!(ev[0].event_type & ASYNC_EVENT_WRITE));
    CHECK_EQ(async_runtime_remove(rt, s[0]), 0);
    async_runtime_deinit(rt);
    close(s[0]);
    close(s[1]);
    close(other[0]);
    close(other[1]);
}

static void t_fd_remove(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int p[2];
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], "x", 1) == 1);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].context == NULL);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0); /* still readable, no longer watched */
    CHECK_FAIL(async_runtime_remove(rt, p[0]) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_remove(rt, p[1]) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_remove(rt, -1) == -1, ASYNC_E_BADFD);
    /* can be added again, with a new context */
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_b), 0);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].context == (void *)&ctx_b);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    /* the library did not close the fd */
    CHECK(fcntl(p[0], F_GETFD) != -1);
    async_runtime_deinit(rt);
    CHECK(fcntl(p[0], F_GETFD) != -1);
    close(p[0]);
    close(p[1]);
}

static void t_fd_exists(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int p[2];
    CHECK(pipe(p) == 0);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_a), 0);
    CHECK_FAIL(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_a) == -1, ASYNC_E_EXISTS);
    CHECK_FAIL(async_runtime_add(rt, p[0], ASYNC_EVENT_WRITE, &ctx_b) == -1, ASYNC_E_EXISTS);
    /* the original registration is intact */
    CHECK(write(p[1], "x", 1) == 1);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].context == (void *)&ctx_a);
    CHECK(ev[0].event_type & ASYNC_EVENT_READ);
    /* the same fd in another runtime is independent */
    {
        async_runtime_t *rt2 = mkrt();
        CHECK_EQ(async_runtime_add(rt2, p[0], ASYNC_EVENT_READ, &ctx_b), 0);
        CHECK_EQ(wait_some(rt2, ev, 4, 5000), 1);
        CHECK(ev[0].context == (void *)&ctx_b);
        CHECK_EQ(async_runtime_remove(rt2, p[0]), 0);
        async_runtime_deinit(rt2);
    }
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    async_runtime_deinit(rt);
    close(p[0]);
    close(p[1]);
}

static void t_fd_bad(void)
{
    async_runtime_t *rt = mkrt();
    int p[2], closed;
    CHECK(pipe(p) == 0);
    closed = p[1];
    close(closed);
    CHECK_FAIL(async_runtime_add(rt, -1, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, -12345, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, closed, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, 1 << 20, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, p[0], 0x40, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(rt, p[0], ASYNC_EVENT_READ | 0x80000000u, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(rt, p[0], ASYNC_EVENT_COMPLETION, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(rt, p[0], ASYNC_EVENT_TIMER, NULL) == -1, ASYNC_E_INVAL);
    /* none of these registered anything */
    CHECK_FAIL(async_runtime_remove(rt, p[0]) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_remove(rt, closed) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_modify(rt, closed, ASYNC_EVENT_READ) == -1, ASYNC_E_BADFD);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0);
    /* registered, then closed without remove: remove says BADFD */
    close(p[0]);
    CHECK_FAIL(async_runtime_remove(rt, p[0]) == -1, ASYNC_E_BADFD);
    async_runtime_deinit(rt);
}

static int backend_is_poll(void)
{
    const char *b = getenv("ASYNC_BACKEND");
    return b != NULL && strcmp(b, "poll") == 0;
}

static void t_fd_regular_file(void)
{
    /* a regular file is not pollable with epoll */
    async_runtime_t *rt = mkrt();
    char path[] = "/tmp/libasync-ctest-XXXXXX";
    int fd = mkstemp(path), rc;
    CHECK(fd >= 0);
    unlink(path);
    async_clear_error();
    rc = async_runtime_add(rt, fd, ASYNC_EVENT_READ, NULL);
    if (!backend_is_poll()) {
        CHECK_EQ(rc, -1);
        CHECK_ERR(ASYNC_E_BADFD);
    } else if (rc == 0) { /* poll() accepts regular files: always ready */
        io_event_t ev[2];
        CHECK_EQ(wait_some(rt, ev, 2, 5000), 1);
        CHECK_EQ(ev[0].fd, fd);
        CHECK_EQ(async_runtime_remove(rt, fd), 0);
    } else {
        CHECK_ERR(ASYNC_E_BADFD);
    }
    close(fd);
    async_runtime_deinit(rt);
}

static void t_fd_events_zero(void)
{
    /* events 0 watches nothing but ERROR/CLOSE; ERROR and CLOSE may be passed */
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    int p[2], s[2];
    CHECK(pipe(p) == 0);
    CHECK_EQ(async_runtime_add(rt, p[0], 0, &ctx_a), 0);
    CHECK(write(p[1], "x", 1) == 1);
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0); /* readable, but READ not asked for */
    close(p[1]);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK_EQ(ev[0].fd, p[0]);
    CHECK(ev[0].event_type & ASYNC_EVENT_CLOSE);
    CHECK(!(ev[0].event_type & ASYNC_EVENT_READ));
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    close(p[0]);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0);
    CHECK_EQ(async_runtime_add(rt, s[0], ASYNC_EVENT_READ | ASYNC_EVENT_ERROR | ASYNC_EVENT_CLOSE, &ctx_b), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0); /* same as READ alone: nothing yet */
    CHECK_EQ(async_runtime_modify(rt, s[0], ASYNC_EVENT_ERROR | ASYNC_EVENT_CLOSE), 0);
    CHECK(send(s[1], "y", 1, MSG_NOSIGNAL) == 1);
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0);
    CHECK_EQ(async_runtime_modify(rt, s[0], ASYNC_EVENT_READ), 0);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].event_type & ASYNC_EVENT_READ);
    CHECK(ev[0].context == (void *)&ctx_b);
    CHECK_EQ(async_runtime_remove(rt, s[0]), 0);
    close(s[0]);
    close(s[1]);
    async_runtime_deinit(rt);
}

/* Collects events for `ms`; checks they all belong to fd. Returns the OR of
 * the bits seen with context `ctx` and stores the OR for other contexts.
 * At least one wait runs, however late this thread gets the CPU: what was
 * ready before the call is always seen. */
static uint32_t collect(async_runtime_t *rt, int fd, void *ctx, uint32_t *other_bits, int ms)
{
    io_event_t ev[8];
    uint32_t bits = 0;
    double t0 = now_ms();
    *other_bits = 0;
    do {
        int n = wait_ok(rt, ev, 8, 20), i;
        for (i = 0; i < n; i++) {
            CHECK_EQ(ev[i].fd, fd);
            if (ev[i].context == ctx)
                bits |= ev[i].event_type;
            else
                *other_bits |= ev[i].event_type;
        }
    } while (now_ms() - t0 < ms);
    return bits;
}

/* Puts the read end of a new pipe at descriptor number `num`. */
static void pipe_at(int num, int *wr)
{
    int p[2];
    CHECK(pipe(p) == 0);
    if (p[0] != num) {
        CHECK(dup2(p[0], num) == num);
        close(p[0]);
    }
    *wr = p[1];
}

static void t_fd_closed_reuse(void)
{
    /* a registered fd closed without remove: its number can be added again */
    async_runtime_t *rt = mkrt();
    uint32_t bits, old;
    int p[2], num, wr, round;
    for (round = 0; round < 2; round++) {
        CHECK(pipe(p) == 0);
        num = p[0];
        CHECK_EQ(async_runtime_add(rt, num, ASYNC_EVENT_READ, &ctx_a), 0);
        close(p[0]);
        close(p[1]);
        if (round == 1) {
            /* let a wait notice the close first: epoll says nothing, poll
             * reports ERROR|CLOSE once */
            bits = collect(rt, num, &ctx_a, &old, 100);
            CHECK_EQ(old, 0);
            CHECK(bits == 0 || (bits & (ASYNC_EVENT_ERROR | ASYNC_EVENT_CLOSE)));
            if (!backend_is_poll())
                CHECK_EQ(bits, 0);
            CHECK_EQ(collect(rt, num, &ctx_a, &old, 100), 0); /* once */
        }
        pipe_at(num, &wr);
        CHECK_EQ(async_runtime_add(rt, num, ASYNC_EVENT_READ, &ctx_b), 0);
        CHECK_EQ(collect(rt, num, &ctx_b, &old, 100), 0); /* the new pipe is empty */
        CHECK(write(wr, "n", 1) == 1);
        bits = collect(rt, num, &ctx_b, &old, 200);
        CHECK(bits & ASYNC_EVENT_READ);
        /* a stale report for the old registration may only say ERROR|CLOSE */
        CHECK(!(old & (ASYNC_EVENT_READ | ASYNC_EVENT_WRITE)));
        CHECK_EQ(async_runtime_remove(rt, num), 0);
        close(num);
        close(wr);
    }
    async_runtime_deinit(rt);
}

/* --- timers ------------------------------------------------------------- */

static void t_timer_oneshot(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    const uintptr_t key = (uintptr_t)0xFEDCBA9876543210ull;
    double t0 = now_ms(), el;
    uint64_t id = async_runtime_add_timer(rt, 60, 0, key);
    CHECK(id != 0);
    CHECK_EQ(wait_some(rt, ev, 4, 10000), 1);
    el = now_ms() - t0;
    CHECK(el >= 60.0);
    CHECK(el < 5000.0);
    CHECK_EQ(ev[0].fd, -1);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_TIMER);
    CHECK(ev[0].completion_key == key);
    CHECK(ev[0].data == (uintptr_t)id);
    CHECK(ev[0].context == NULL);
    CHECK_EQ(wait_ok(rt, ev, 4, 200), 0); /* one-shot: fires once */
    CHECK_FAIL(async_runtime_cancel_timer(rt, id) == -1, ASYNC_E_NOTFOUND);
    /* delay 0 fires promptly */
    t0 = now_ms();
    id = async_runtime_add_timer(rt, 0, 0, 1);
    CHECK(id != 0);
    CHECK_EQ(wait_some(rt, ev, 4, 10000), 1);
    CHECK(now_ms() - t0 < 5000);
    CHECK(ev[0].data == (uintptr_t)id);
    CHECK(ev[0].completion_key == 1);
    async_runtime_deinit(rt);
}

static void t_timer_order(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    uintptr_t keys[3];
    int got = 0;
    double t0 = now_ms();
    CHECK(async_runtime_add_timer(rt, 150, 0, 150) != 0);
    CHECK(async_runtime_add_timer(rt, 50, 0, 50) != 0);
    CHECK(async_runtime_add_timer(rt, 100, 0, 100) != 0);
    while (got < 3 && now_ms() - t0 < 10000) {
        int n = wait_ok(rt, ev, 4, 1000), i;
        for (i = 0; i < n && got < 3; i++) {
            CHECK_EQ(ev[i].event_type, ASYNC_EVENT_TIMER);
            keys[got++] = ev[i].completion_key;
        }
    }
    CHECK_EQ(got, 3);
    CHECK_EQ(keys[0], 50);
    CHECK_EQ(keys[1], 100);
    CHECK_EQ(keys[2], 150);
    CHECK(now_ms() - t0 >= 150.0);
    async_runtime_deinit(rt);
}

static void t_timer_repeat(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[16];
    const int period = 50;
    int count = 0;
    double t0 = now_ms(), el;
    uint64_t id = async_runtime_add_timer(rt, (uint64_t)period, (uint64_t)period, 77);
    CHECK(id != 0);
    while (now_ms() - t0 < 1000) {
        int n = wait_ok(rt, ev, 16, 100), i;
        for (i = 0; i < n; i++) {
            CHECK_EQ(ev[i].event_type, ASYNC_EVENT_TIMER);
            CHECK_EQ(ev[i].fd, -1);
            CHECK_EQ(ev[i].completion_key, 77);
            CHECK(ev[i].data == (uintptr_t)id);
        }
        count += n;
    }
    el = now_ms() - t0;
    fprintf(stderr, "repeating timer: %d firings in %.0f ms (period %d)\n", count, el, period);
    CHECK(count >= 5);                               /* about 20 expected */
    CHECK(count <= (int)(el / period) + 1);          /* never early */
    CHECK_EQ(async_runtime_cancel_timer(rt, id), 0); /* a repeating timer stays valid */
    CHECK_EQ(wait_ok(rt, ev, 16, 200), 0);
    CHECK_FAIL(async_runtime_cancel_timer(rt, id) == -1, ASYNC_E_NOTFOUND);
    async_runtime_deinit(rt);
}

static void t_timer_no_bunching(void)
{
    /* missed periods are skipped, not delivered in a burst */
    async_runtime_t *rt = mkrt();
    io_event_t ev[64];
    uint64_t id = async_runtime_add_timer(rt, 10, 10, 5);
    int n;
    CHECK(id != 0);
    sleep_ms(300); /* ~30 periods pass without a wait */
    n = wait_some(rt, ev, 64, 5000);
    CHECK(n >= 1);
    CHECK(n <= 2);
    CHECK_EQ(async_runtime_cancel_timer(rt, id), 0);
    async_runtime_deinit(rt);
}

static void t_timer_cancel(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    uint64_t a, b, c;
    /* pending */
    a = async_runtime_add_timer(rt, 100, 0, 1);
    CHECK(a != 0);
    CHECK_EQ(async_runtime_cancel_timer(rt, a), 0);
    CHECK_FAIL(async_runtime_cancel_timer(rt, a) == -1, ASYNC_E_NOTFOUND);
    /* expired but not yet delivered: one-shot and repeating */
    b = async_runtime_add_timer(rt, 10, 0, 2);
    c = async_runtime_add_timer(rt, 10, 10, 3);
    CHECK(b != 0 && c != 0);
    sleep_ms(100);
    CHECK_EQ(async_runtime_cancel_timer(rt, b), 0);
    CHECK_EQ(async_runtime_cancel_timer(rt, c), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 300), 0); /* none of the three is delivered */
    /* unknown ids */
    CHECK_FAIL(async_runtime_cancel_timer(rt, 0) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_cancel_timer(rt, 0x123456789ull) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_cancel_timer(rt, UINT64_MAX) == -1, ASYNC_E_NOTFOUND);
    /* cancelling one timer leaves the others */
    a = async_runtime_add_timer(rt, 30, 0, 10);
    b = async_runtime_add_timer(rt, 30, 0, 11);
    CHECK_EQ(async_runtime_cancel_timer(rt, a), 0);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].data == (uintptr_t)b);
    CHECK_EQ(ev[0].completion_key, 11);
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0);
    async_runtime_deinit(rt);
}

static void t_timer_ids(void)
{
    async_runtime_t *rt = mkrt(), *other = mkrt();
    static uint64_t ids[200];
    int i, j;
    for (i = 0; i < 200; i++) {
        ids[i] = async_runtime_add_timer(rt, 60000, 0, (uintptr_t)i);
        CHECK(ids[i] != 0);
        for (j = 0; j < i; j++)
            CHECK(ids[j] != ids[i]);
    }
    for (i = 0; i < 200; i++) {
        /* an id belongs to its runtime */
        CHECK_FAIL(async_runtime_cancel_timer(other, ids[i]) == -1, ASYNC_E_NOTFOUND);
        CHECK_EQ(async_runtime_cancel_timer(rt, ids[i]), 0);
    }
    async_runtime_deinit(rt);
    async_runtime_deinit(other);
}

/* Counts the events of waits for `ms` (at least one wait). */
static int count_events(async_runtime_t *rt, int ms)
{
    io_event_t ev[16];
    int total = 0;
    double t0 = now_ms();
    do
        total += wait_ok(rt, ev, 16, 20);
    while (now_ms() - t0 < ms);
    return total;
}

/* A timer with delay 10 ms and the given period fires once: the first firing
 * is awaited (a loaded host may deliver it late), then 300 ms bring no more. */
static void fires_once(async_runtime_t *rt, uint64_t period)
{
    io_event_t ev[16];
    uint64_t c = async_runtime_add_timer(rt, 10, period, 3);
    int n;
    CHECK(c != 0);
    n = wait_some(rt, ev, 16, 10000);
    if (n != 1)
        fprintf(stderr, "timer (delay 10, repeat %llu): %d events in the first wait\n", (unsigned long long)period, n);
    CHECK_EQ(n, 1);
    CHECK(ev[0].data == (uintptr_t)c);
    n = count_events(rt, 300);
    if (n != 0)
        fprintf(stderr, "timer (delay 10, repeat %llu) fired %d more times in 300 ms\n", (unsigned long long)period, n);
    CHECK_EQ(n, 0);
    CHECK_EQ(async_runtime_cancel_timer(rt, c), 0);
}

static void t_timer_huge(void)
{
    /* huge delays and periods never overflow into "fire now" */
    async_runtime_t *rt = mkrt();
    uint64_t a, b;
    int n;
    a = async_runtime_add_timer(rt, UINT64_MAX, 0, 1);
    b = async_runtime_add_timer(rt, UINT64_MAX / 2 + 12345, UINT64_MAX, 2);
    CHECK(a != 0 && b != 0);
    n = count_events(rt, 200);
    if (n != 0)
        fprintf(stderr, "timers with delay UINT64_MAX and UINT64_MAX/2 fired %d times\n", n);
    CHECK_EQ(n, 0);
    CHECK_EQ(async_runtime_cancel_timer(rt, a), 0);
    CHECK_EQ(async_runtime_cancel_timer(rt, b), 0);
    /* delay 10 ms, period UINT64_MAX (or just below) ms: fires once */
    fires_once(rt, UINT64_MAX);
    fires_once(rt, UINT64_MAX - 1);
    async_runtime_deinit(rt);
}

static async_runtime_t *g_trt;
static _Atomic double g_tadd;

static void *add_timer_later(void *arg)
{
    (void)arg;
    sleep_ms(150);
    atomic_store(&g_tadd, now_ms());
    CHECK(async_runtime_add_timer(g_trt, 50, 0, 4242) != 0);
    return NULL;
}

static void t_timer_while_waiting(void)
{
    /* a timer added by another thread during a wait fires in that wait */
    pthread_t th;
    io_event_t ev[4];
    double t0;
    g_trt = mkrt();
    CHECK(pthread_create(&th, NULL, add_timer_later, NULL) == 0);
    t0 = now_ms();
    CHECK_EQ(wait_some(g_trt, ev, 4, 10000), 1);
    CHECK(now_ms() - t0 < 9000);
    CHECK(now_ms() - atomic_load(&g_tadd) >= 50.0);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_TIMER);
    CHECK_EQ(ev[0].completion_key, 4242);
    pthread_join(th, NULL);
    async_runtime_deinit(g_trt);
}

/* --- mixed sources and lifetime ----------------------------------------- */

static void t_mixed(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[8];
    int p[2], got = 0, fdev = 0, comp = 0, tim = 0;
    double t0 = now_ms();
    uint64_t id;
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], "x", 1) == 1);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_a), 0);
    CHECK_EQ(async_runtime_post_completion(rt, 11, 12), 0);
    id = async_runtime_add_timer(rt, 0, 0, 13);
    CHECK(id != 0);
    while ((comp == 0 || tim == 0 || fdev == 0) && now_ms() - t0 < 5000) {
        int n = wait_ok(rt, ev, 8, 100), i;
        for (i = 0; i < n; i++) {
            switch (ev[i].event_type) {
            case ASYNC_EVENT_COMPLETION:
                CHECK(ev[i].completion_key == 11 && ev[i].data == 12 && ev[i].fd == -1);
                comp++;
                break;
            case ASYNC_EVENT_TIMER:
                CHECK(ev[i].completion_key == 13 && ev[i].data == (uintptr_t)id && ev[i].fd == -1);
                tim++;
                break;
            default:
                CHECK_EQ(ev[i].fd, p[0]);
                CHECK(ev[i].event_type & ASYNC_EVENT_READ);
                CHECK(ev[i].context == (void *)&ctx_a);
                fdev++;
            }
        }
        got += n;
    }
    CHECK_EQ(comp, 1);
    CHECK_EQ(tim, 1);
    CHECK(fdev >= 1);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    async_runtime_deinit(rt);
    close(p[0]);
    close(p[1]);
}

/* A backlog of completions must not starve fds or timers: the wait hands
 * completions out without entering Go only while nothing else can be ready,
 * so with the backlog far from drained, a readable fd and an expired timer
 * still come out within a few calls (the fd after at most 8 skipped polls),
 * and every completion still arrives exactly once, in order per producer. */
#define FLOOD_N 100000
static async_runtime_t *flood_rt;

static void *flood_producer(void *arg)
{
    for (uintptr_t i = 1; i <= FLOOD_N; i++) CHECK_EQ(async_runtime_post_completion(flood_rt, (uintptr_t)arg, i), 0);
    return NULL;
}

static void flood_check(io_event_t *e, uintptr_t *next, int *fdev, int *tim, uint64_t id, int fd)
{
    switch (e->event_type) {
    case ASYNC_EVENT_COMPLETION:
        CHECK(e->completion_key >= 1 && e->completion_key <= 2 && e->fd == -1 && e->context == NULL);
        CHECK_EQ(e->data, next[e->completion_key]);
        next[e->completion_key]++;
        break;
    case ASYNC_EVENT_TIMER:
        CHECK(e->completion_key == 77 && e->data == (uintptr_t)id && e->fd == -1);
        (*tim)++;
        break;
    default:
        CHECK_EQ(e->fd, fd);
        CHECK(e->context == (void *)&ctx_a);
        (*fdev)++;
    }
}

static void flood_case(int max)
{
    async_runtime_t *rt = flood_rt = mkrt();
    io_event_t ev[16];
    uintptr_t next[3] = {1, 1, 1};
    int p[2], fdev = 0, tim = 0, waits = 0;
    pthread_t th;
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], "x", 1) == 1);
    start_thread(&th, flood_producer, (void *)(uintptr_t)2);
    flood_producer((void *)(uintptr_t)1);
    join_within(th, 30000, "flood producer");
    /* The first wait goes through Go; later ones may not. */
    CHECK_EQ(wait_ok(rt, ev, max, 0), max);
    for (int i = 0; i < max; i++) flood_check(&ev[i], next, &fdev, &tim, 0, -1);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_a), 0);
    uint64_t id = async_runtime_add_timer(rt, 1, 0, 77);
    CHECK(id != 0);
    usleep(5000); /* the timer is due */
    while ((fdev == 0 || tim == 0) && waits < 1000) {
        int n = wait_ok(rt, ev, max, 1000);
        CHECK(n >= 1 && n <= max);
        waits++;
        for (int i = 0; i < n; i++) flood_check(&ev[i], next, &fdev, &tim, id, p[0]);
    }
    CHECK(tim == 1 && fdev >= 1);
    CHECK(waits <= 40); /* not after the backlog (2 * FLOOD_N / max waits) */
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    for (;;) {
        int n = wait_ok(rt, ev, max, 0);
        if (n == 0) break;
        for (int i = 0; i < n; i++) flood_check(&ev[i], next, &fdev, &tim, id, p[0]);
    }
    CHECK_EQ(next[1], FLOOD_N + 1);
    CHECK_EQ(next[2], FLOOD_N + 1);
    CHECK_EQ(tim, 1);
    async_runtime_deinit(rt);
    close(p[0]);
    close(p[1]);
}

static void t_flood_fair_max1(void) { flood_case(1); }
static void t_flood_fair_max16(void) { flood_case(16); }

/* Completions that arrive while the loop is busy come out of the next wait
 * (taken without entering Go), max_events at a time, FIFO, and a timer added
 * in between (which the C side learns of only through Go) is not lost. */
static void t_completions_then_timer(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    for (uintptr_t i = 1; i <= 10; i++) CHECK_EQ(async_runtime_post_completion(rt, 5, i), 0);
    CHECK_EQ(wait_ok(rt, ev, 1, 0), 1);
    CHECK(ev[0].event_type == ASYNC_EVENT_COMPLETION && ev[0].data == 1);
    uint64_t id = async_runtime_add_timer(rt, 0, 0, 9);
    CHECK(id != 0);
    uintptr_t next = 2;
    int tim = 0;
    double t0 = now_ms();
    while ((next <= 10 || !tim) && now_ms() - t0 < 5000) {
        int n = wait_ok(rt, ev, 4, 100);
        CHECK(n <= 4);
        for (int i = 0; i < n; i++) {
            if (ev[i].event_type == ASYNC_EVENT_TIMER) {
                CHECK(ev[i].completion_key == 9);
                tim++;
            } else {
                CHECK(ev[i].event_type == ASYNC_EVENT_COMPLETION && ev[i].completion_key == 5);
                CHECK_EQ(ev[i].data, next);
                next++;
            }
        }
        if (next > 10 && !tim) usleep(1000);
    }
    CHECK_EQ(tim, 1);
    CHECK_EQ(next, 11);
    CHECK_EQ(wait_ok(rt, ev, 4, 0), 0);
    async_runtime_deinit(rt);
}

static void t_runtime_deinit_pending(void)
{
    async_runtime_t *rt = mkrt();
    int p[2], i;
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], "x", 1) == 1);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ | ASYNC_EVENT_WRITE, &ctx_a), 0);
    CHECK_EQ(async_runtime_add(rt, p[1], ASYNC_EVENT_WRITE, &ctx_b), 0);
    for (i = 0; i < 10000; i++)
        CHECK_EQ(async_runtime_post_completion(rt, (uintptr_t)i, (uintptr_t)i), 0);
    for (i = 0; i < 20; i++)
        CHECK(async_runtime_add_timer(rt, (uint64_t)(i % 2 ? 0 : 100000), (uint64_t)(i % 3 ? 0 : 5), 1) != 0);
    sleep_ms(30); /* some timers expired, undelivered */
    async_runtime_deinit(rt);
    /* registered fds are the caller's: still open */
    CHECK(fcntl(p[0], F_GETFD) != -1);
    CHECK(fcntl(p[1], F_GETFD) != -1);
    CHECK_FAIL(async_runtime_post_completion(rt, 1, 1) == -1, ASYNC_E_BADHANDLE);
    /* a fresh runtime works and sees none of it */
    rt = mkrt();
    {
        io_event_t ev[4];
        CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
        CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0); /* fd free for reuse */
        CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
        CHECK_EQ(ev[0].fd, p[0]);
        CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    }
    async_runtime_deinit(rt);
    close(p[0]);
    close(p[1]);
}

/* --- descriptors -------------------------------------------------------- */

#define MAX_FDS 4096

/* Marks open fds in set[]; returns how many. */
static int list_fds(unsigned char *set)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    CHECK(d != NULL);
    memset(set, 0, MAX_FDS);
    while ((e = readdir(d)) != NULL) {
        int fd;
        if (e->d_name[0] == '.')
            continue;
        fd = atoi(e->d_name);
        if (fd == dirfd(d))
            continue;
        CHECK(fd >= 0 && fd < MAX_FDS);
        set[fd] = 1;
        n++;
    }
    closedir(d);
    return n;
}

static void t_cloexec(void)
{
    static unsigned char before[MAX_FDS], after[MAX_FDS];
    async_runtime_t *rt, *rt2;
    io_event_t ev[4];
    int p[2], fd, fresh = 0;
    CHECK(pipe(p) == 0);
    list_fds(before);
    rt = mkrt();
    rt2 = mkrt();
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0);
    CHECK(async_runtime_add_timer(rt, 0, 0, 1) != 0);
    CHECK(async_runtime_add_timer(rt2, 10, 10, 1) != 0);
    CHECK_EQ(async_runtime_post_completion(rt, 1, 2), 0);
    CHECK_EQ(async_runtime_wakeup(rt2), 0);
    CHECK(wait_some(rt, ev, 4, 5000) >= 1);
    (void)wait_ok(rt2, ev, 4, 50);
    list_fds(after);
    for (fd = 0; fd < MAX_FDS; fd++) {
        int fl;
        if (!after[fd] || before[fd])
            continue;
        fresh++;
        fl = fcntl(fd, F_GETFD);
        if (fl == -1) /* closed meanwhile by the library: fine */
            continue;
        if (!(fl & FD_CLOEXEC))
            fprintf(stderr, "fd %d opened by the library lacks FD_CLOEXEC\n", fd);
        CHECK(fl & FD_CLOEXEC);
    }
    CHECK(fresh >= 1); /* a runtime does open descriptors */
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    async_runtime_deinit(rt);
    async_runtime_deinit(rt2);
    close(p[0]);
    close(p[1]);
}

static void t_fd_leak(void)
{
    /* init/deinit cycles do not leak descriptors */
    static unsigned char s1[MAX_FDS], s2[MAX_FDS];
    io_event_t ev[2];
    int i, n1, n2;
    for (i = 0; i < 3; i++) {
        async_runtime_t *rt = mkrt();
        CHECK(async_runtime_add_timer(rt, 0, 0, 1) != 0);
        (void)wait_some(rt, ev, 2, 1000);
        async_runtime_deinit(rt);
    }
    sleep_ms(50);
    n1 = list_fds(s1);
    for (i = 0; i < 50; i++) {
        async_runtime_t *rt = mkrt();
        CHECK(async_runtime_add_timer(rt, 0, 0, 1) != 0);
        CHECK_EQ(async_runtime_post_completion(rt, 1, 1), 0);
        (void)wait_some(rt, ev, 2, 1000);
        async_runtime_deinit(rt);
    }
    sleep_ms(50);
    n2 = list_fds(s2);
    if (n2 != n1)
        fprintf(stderr, "open fds: %d before, %d after 50 init/deinit cycles\n", n1, n2);
    CHECK(n2 <= n1);
}

static const test_case_t cases[] = {
    T(post_basic), // poll
    T(mpsc), // poll timeout=180
    T(max_events), // poll
    T(two_runtimes), // poll
    T(wakeup_blocked), // poll
    T(wakeup_before_wait), // poll
    T(wakeup_after_many_rings), // poll
    T(wakeup_signal), // poll
    T(wakeup_setitimer), // poll
    T(eintr), // poll
    T(wait_timeouts), // poll
    T(wait_inval), // poll
    T(busy), // poll
    T(deinit_while_waiting), // poll
    T(add_while_waiting), // poll
    T(fd_read), // poll
    T(fd_write), // poll
    T(fd_readwrite), // poll
    T(fd_close), // poll
    T(fd_error), // poll
    T(fd_modify), // poll
    T(fd_remove), // poll
    T(fd_exists), // poll
    T(fd_bad), // poll
    T(fd_regular_file), // poll
    T(fd_events_zero), // poll
    T(fd_closed_reuse), // poll
    T(timer_oneshot), // poll
    T(timer_order), // poll
    T(timer_repeat), // poll
    T(timer_no_bunching), // poll
    T(timer_cancel), // poll
    T(timer_ids), // poll
    T(timer_huge), // poll
    T(timer_while_waiting), // poll
    T(mixed), // poll
    T(flood_fair_max1), // poll
    T(flood_fair_max16), // poll
    T(completions_then_timer), // poll
    T(runtime_deinit_pending), // poll
    T(cloexec), // poll
    T(fd_leak), // poll
};

TEST_MAIN(cases)
