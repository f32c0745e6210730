/* Signals as events: async_runtime_add_signal /
 * async_runtime_remove_signal (ASYNC_EVENT_SIGNAL through async_runtime_wait)
 * and the fiber-side watch (async_fiber_watch_signal, async_fiber_wait_signal,
 * async_fiber_unwatch_signal), with real signals: raise, kill, pthread_kill,
 * tgkill to every thread of the process (Go's and fiber workers' included),
 * sigqueue floods from other threads, fork.
 *
 * The rt_ cases also run on the poll backend (ctests/CMakeLists.txt).
 * Before each watch the signal's action is set to SIG_IGN, so a signal that
 * lands after the last removal is harmless, and the restore is checkable. */
#include "check.h"

#include <dirent.h>
#include <stdatomic.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define KEY 0x5157u

static void set_ign(int s) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    CHECK_EQ(sigaction(s, &sa, NULL), 0);
}

/* The current action of s is SIG_IGN. */
static int is_ign(int s) {
    struct sigaction cur;
    CHECK_EQ(sigaction(s, NULL, &cur), 0);
    return !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN;
}

/* A fresh runtime that watches sig under key (sig's action set to SIG_IGN
 * first). */
static async_runtime_t *rt_watching(int sig, uintptr_t key) {
    set_ign(sig);
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    CHECK_EQ(async_runtime_add_signal(rt, sig, key), 0);
    return rt;
}

/* Waits (bounded) until rt delivers signal events; returns the sum of their
 * counts, checking each event's shape. Other events fail the test. */
static uint64_t wait_signals(async_runtime_t *rt, int timeout_ms, uintptr_t key, int *nevents) {
    io_event_t ev[16];
    int n = async_runtime_wait(rt, ev, 16, timeout_ms);
    CHECK(n >= 0);
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) {
        CHECK_EQ(ev[i].event_type, ASYNC_EVENT_SIGNAL);
        CHECK_EQ(ev[i].fd, -1);
        CHECK_EQ(ev[i].completion_key, key);
        CHECK(ev[i].data >= 1);
        CHECK(ev[i].context == NULL);
        sum += ev[i].data;
    }
    if (nevents) *nevents = n;
    return sum;
}

/* Collects signal events until their counts reach want (bounded: 20 s). */
static uint64_t collect(async_runtime_t *rt, uint64_t want, uintptr_t key) {
    uint64_t sum = 0;
    double end = now_ms() + 20000;
    while (sum < want && now_ms() < end) sum += wait_signals(rt, 100, key, NULL);
    return sum;
}

/* Raises sig n times before a wait: the wait returns one event that
 * carries all n. */
static void raise_coalesced(async_runtime_t *rt, int sig, int n) {
    for (int i = 0; i < n; i++) CHECK_EQ(raise(sig), 0);
    int nev = 0;
    CHECK_EQ(wait_signals(rt, 5000, KEY, &nev), (uint64_t)n);
    CHECK_EQ(nev, 1);
}

/* ---- runtime ----------------------------------------------------------------- */

/* One raise: one event with count 1; the action comes back on removal. */
CASE(rt_basic) { // poll
    async_runtime_t *rt = rt_watching(SIGUSR1, KEY);
    struct sigaction cur;
    CHECK_EQ(sigaction(SIGUSR1, NULL, &cur), 0);
    CHECK(cur.sa_flags & SA_SIGINFO);
    CHECK(cur.sa_flags & SA_ONSTACK);
    CHECK(!is_ign(SIGUSR1));
    CHECK_EQ(wait_signals(rt, 0, KEY, NULL), 0);
    CHECK_EQ(raise(SIGUSR1), 0); /* handled before raise returns */
    int nev = 0;
    CHECK_EQ(wait_signals(rt, 5000, KEY, &nev), 1);
    CHECK_EQ(nev, 1);
    CHECK_EQ(wait_signals(rt, 0, KEY, &nev), 0);
    CHECK_EQ(async_runtime_remove_signal(rt, SIGUSR1), 0);
    CHECK(is_ign(SIGUSR1));
    CHECK_EQ(raise(SIGUSR1), 0);
    CHECK_EQ(wait_signals(rt, 0, KEY, NULL), 0);
    async_runtime_deinit(rt);
}

/* Loop metrics count signal events under their bit ([6] SIGNAL), one per
 * event however many signals it carries. */
CASE(rt_metrics) { // poll
    async_runtime_t *rt = rt_watching(SIGUSR1, KEY);
    raise_coalesced(rt, SIGUSR1, 3);
    async_runtime_stats_t st;
    CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
    CHECK_EQ(st.events[6], 1);
    CHECK_EQ(st.events[4], 0);
    CHECK_EQ(st.events_total, 1);
    async_runtime_deinit(rt);
}

/* Five signals before a wait: one event, count 5. */
CASE(rt_coalesced) { // poll
    async_runtime_t *rt = rt_watching(SIGUSR2, KEY);
    raise_coalesced(rt, SIGUSR2, 5);
    async_runtime_deinit(rt);
    CHECK(is_ign(SIGUSR2)); /* deinit dropped the watch */
}

/* A wait blocked on another thread wakes for a signal sent with kill and
 * taken by some other thread. */
static async_runtime_t *blocked_rt;
static _Atomic int blocked_got;
static void *blocked_waiter(void *arg) {
    (void)arg;
    /* Blocked here, so the signal lands on another thread and the waiter
     * must be woken through the doorbell, not by EINTR. */
    block_signal(SIGHUP);
    atomic_store(&blocked_got, (int)wait_signals(blocked_rt, -1, KEY, NULL)); /* join_within bounds it */
    return NULL;
}

CASE(rt_wakes_wait) { // poll
    blocked_rt = rt_watching(SIGHUP, KEY);
    pthread_t th;
    start_thread(&th, blocked_waiter, NULL);
    sleep_ms(50); /* likely asleep by now; either way the signal must come out */
    CHECK_EQ(kill(getpid(), SIGHUP), 0);
    join_within(th, 30000, "waiter");
    CHECK_EQ(atomic_load(&blocked_got), 1);
    async_runtime_deinit(blocked_rt);
}

/* The signal lands on the waiting thread itself (pthread_kill): its sleep
 * ends with EINTR, and the wait returns the signal's event, not 0. */
static async_runtime_t *ow_rt;
static _Atomic int ow_n = -1, ow_ready;
static io_event_t ow_ev;
static void *ow_waiter(void *arg) {
    (void)arg;
    atomic_store(&ow_ready, 1);
    atomic_store(&ow_n, async_runtime_wait(ow_rt, &ow_ev, 1, -1)); /* join_within bounds it */
    return NULL;
}

CASE(rt_on_waiter_thread) { // poll
    ow_rt = rt_watching(SIGUSR1, KEY);
    pthread_t th;
    start_thread(&th, ow_waiter, NULL);
    double end = now_ms() + 20000;
    while (!atomic_load(&ow_ready) && now_ms() < end) sleep_ms(1);
    sleep_ms(20); /* likely asleep; if not, the event is there before it sleeps */
    CHECK_EQ(pthread_kill(th, SIGUSR1), 0);
    join_within(th, 30000, "waiter");
    CHECK_EQ(atomic_load(&ow_n), 1);
    CHECK_EQ(ow_ev.event_type, ASYNC_EVENT_SIGNAL);
    CHECK_EQ(ow_ev.data, 1);
    async_runtime_deinit(ow_rt);
}

/* Go's preemption signal (SIGURG), which Go's runtime may send to a host
 * thread that has just run Go code inside the wait, does not end a wait:
 * only the host's own signals do. */
CASE(rt_wait_outlasts_go_preempt_signal) { // poll
    ow_rt = async_runtime_init();
    CHECK(ow_rt);
    atomic_store(&ow_n, -1);
    atomic_store(&ow_ready, 0);
    pthread_t th;
    start_thread(&th, ow_waiter, NULL);
    double end = now_ms() + 20000;
    while (!atomic_load(&ow_ready) && now_ms() < end) sleep_ms(1);
    sleep_ms(20); /* likely asleep; the signals below span the sleep */
    for (int i = 0; i < 20; i++) {
        CHECK_EQ(pthread_kill(th, SIGURG), 0);
        sleep_ms(2);
    }
    CHECK_EQ(atomic_load(&ow_n), -1); /* still waiting */
    CHECK_EQ(async_runtime_post_completion(ow_rt, 7, 77), 0);
    join_within(th, 30000, "waiter");
    CHECK_EQ(atomic_load(&ow_n), 1);
    CHECK_EQ(ow_ev.event_type, ASYNC_EVENT_COMPLETION);
    CHECK_EQ(ow_ev.completion_key, 7);
    CHECK_EQ(ow_ev.data, 77);
    async_runtime_deinit(ow_rt);
}

/* A count that arrived but was not taken yet is dropped by the removal; a
 * new watch starts from 0. */
CASE(rt_remove_drops_pending) { // poll
    async_runtime_t *rt = rt_watching(SIGUSR2, KEY);
    CHECK_EQ(raise(SIGUSR2), 0);
    CHECK_EQ(raise(SIGUSR2), 0);
    CHECK_EQ(async_runtime_remove_signal(rt, SIGUSR2), 0);
    CHECK_EQ(wait_signals(rt, 0, KEY, NULL), 0);
    CHECK_EQ(async_runtime_add_signal(rt, SIGUSR2, KEY + 1), 0);
    CHECK_EQ(raise(SIGUSR2), 0);
    CHECK_EQ(wait_signals(rt, 5000, KEY + 1, NULL), 1); /* with the new key */
    async_runtime_deinit(rt);
}

/* Several signals and completions at once, with max_events 1: each signal
 * comes as its own event, none lost. */
CASE(rt_mixed) { // poll
    set_ign(SIGUSR1);
    set_ign(SIGUSR2);
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    CHECK_EQ(async_runtime_add_signal(rt, SIGUSR1, 1), 0);
    CHECK_EQ(async_runtime_add_signal(rt, SIGUSR2, 2), 0);
    CHECK_EQ(async_runtime_post_completion(rt, 3, 33), 0);
    CHECK_EQ(raise(SIGUSR1), 0);
    CHECK_EQ(raise(SIGUSR2), 0);
    CHECK_EQ(raise(SIGUSR2), 0);
    int seen1 = 0, seen2 = 0, seenc = 0;
    for (int i = 0; i < 3; i++) {
        io_event_t ev;
        CHECK_EQ(async_runtime_wait(rt, &ev, 1, 5000), 1);
        if (ev.event_type == ASYNC_EVENT_COMPLETION) {
            CHECK_EQ(ev.completion_key, 3);
            seenc++;
        } else {
            CHECK_EQ(ev.event_type, ASYNC_EVENT_SIGNAL);
            if (ev.completion_key == 1) {
                CHECK_EQ(ev.data, 1);
                seen1++;
            } else {
                CHECK_EQ(ev.completion_key, 2);
                CHECK_EQ(ev.data, 2);
                seen2++;
            }
        }
    }
    CHECK_EQ(seen1, 1);
    CHECK_EQ(seen2, 1);
    CHECK_EQ(seenc, 1);
    io_event_t ev;
    CHECK_EQ(async_runtime_wait(rt, &ev, 1, 0), 0);
    async_runtime_deinit(rt);
    CHECK(is_ign(SIGUSR1));
    CHECK(is_ign(SIGUSR2));
}

/* Two runtimes on one signal: each counts every signal; after one removes
 * its watch, only the other hears. */
CASE(rt_two_runtimes) { // poll
    set_ign(SIGUSR1);
    async_runtime_t *a = async_runtime_init(), *b = async_runtime_init();
    CHECK(a && b);
    CHECK_EQ(async_runtime_add_signal(a, SIGUSR1, 10), 0);
    CHECK_EQ(async_runtime_add_signal(b, SIGUSR1, 20), 0);
    for (int i = 0; i < 3; i++) CHECK_EQ(raise(SIGUSR1), 0);
    CHECK_EQ(wait_signals(a, 5000, 10, NULL), 3);
    CHECK_EQ(wait_signals(b, 5000, 20, NULL), 3);
    CHECK_EQ(async_runtime_remove_signal(a, SIGUSR1), 0);
    CHECK(!is_ign(SIGUSR1)); /* b still watches */
    for (int i = 0; i < 2; i++) CHECK_EQ(raise(SIGUSR1), 0);
    CHECK_EQ(wait_signals(a, 0, 10, NULL), 0);
    CHECK_EQ(wait_signals(b, 5000, 20, NULL), 2);
    async_runtime_deinit(b);
    CHECK(is_ign(SIGUSR1));
    async_runtime_deinit(a);
}

/* Bad input: documented errors, nothing installed. */
CASE(rt_errors) { // poll
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    int refused[] = {0, -1, 65, 1000, SIGKILL, SIGSTOP, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT,
                     SIGPIPE, SIGURG, SIGPROF, 32, 33};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int s = refused[i];
        if (s == 32 || s == 33) {
            if (s >= SIGRTMIN) continue; /* a libc without reserved numbers */
        }
        struct sigaction before, after;
        int known = s >= 1 && s < NSIG && sigaction(s, NULL, &before) == 0;
        CHECK_FAIL(async_runtime_add_signal(rt, s, KEY) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_watch_signal(s) == -1, ASYNC_E_INVAL);
        if (known) {
            CHECK_EQ(sigaction(s, NULL, &after), 0);
            CHECK(memcmp(&before.sa_handler, &after.sa_handler, sizeof before.sa_handler) == 0);
        }
    }
    set_ign(SIGUSR1);
    CHECK_FAIL(async_runtime_add_signal(NULL, SIGUSR1, KEY) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_remove_signal(rt, SIGUSR1) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_remove_signal(rt, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_remove_signal(rt, 99) == -1, ASYNC_E_INVAL);
    CHECK_EQ(async_runtime_add_signal(rt, SIGUSR1, KEY), 0);
    CHECK_FAIL(async_runtime_add_signal(rt, SIGUSR1, KEY) == -1, ASYNC_E_EXISTS);
    CHECK_EQ(async_runtime_add_signal(rt, SIGRTMIN, KEY), 0); /* real-time signals are fine */
    CHECK_EQ(async_runtime_remove_signal(rt, SIGRTMIN), 0);
    CHECK_EQ(async_runtime_remove_signal(rt, SIGUSR1), 0);
    CHECK(is_ign(SIGUSR1));
    CHECK_FAIL(async_runtime_remove_signal(rt, SIGUSR1) == -1, ASYNC_E_NOTFOUND);
    async_runtime_deinit(rt);
    CHECK_FAIL(async_runtime_add_signal(rt, SIGUSR1, KEY) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_remove_signal(rt, SIGUSR1) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_unwatch_signal(SIGUSR1) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_fiber_wait_signal(SIGUSR1, 0) == -1, ASYNC_E_STATE);
    CHECK_FAIL(async_fiber_wait_signal(0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_wait_signal(SIGUSR1, -2) == -1, ASYNC_E_INVAL);
}

/* A handler the host installed before is replaced while watched, and comes
 * back on removal; one the host installs during the watch stays. */
static _Atomic int host_hits;
static void host_handler(int s) {
    (void)s;
    atomic_fetch_add(&host_hits, 1);
}
static void host_handler2(int s) { (void)s; }

CASE(rt_host_handler) { // poll
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = host_handler;
    sa.sa_flags = SA_ONSTACK;
    CHECK_EQ(sigaction(SIGUSR1, &sa, NULL), 0);
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    CHECK_EQ(async_runtime_add_signal(rt, SIGUSR1, KEY), 0);
    CHECK_EQ(raise(SIGUSR1), 0);
    CHECK_EQ(wait_signals(rt, 5000, KEY, NULL), 1);
    CHECK_EQ(atomic_load(&host_hits), 0);
    CHECK_EQ(async_runtime_remove_signal(rt, SIGUSR1), 0);
    CHECK_EQ(raise(SIGUSR1), 0);
    CHECK_EQ(atomic_load(&host_hits), 1);
    CHECK_EQ(wait_signals(rt, 0, KEY, NULL), 0);
    /* The host takes the signal over during a watch: its action stays. */
    CHECK_EQ(async_runtime_add_signal(rt, SIGUSR1, KEY), 0);
    sa.sa_handler = host_handler2;
    CHECK_EQ(sigaction(SIGUSR1, &sa, NULL), 0);
    CHECK_EQ(async_runtime_remove_signal(rt, SIGUSR1), 0);
    struct sigaction cur;
    CHECK_EQ(sigaction(SIGUSR1, NULL, &cur), 0);
    CHECK(cur.sa_handler == host_handler2);
    async_runtime_deinit(rt);
    set_ign(SIGUSR1);
}

/* Deinit with a count pending: no crash, the watch is gone, and the next
 * runtime (which may get the recycled record) sees nothing of it. */
CASE(rt_deinit_pending) { // poll
    set_ign(SIGUSR1);
    for (int round = 0; round < 50; round++) {
        async_runtime_t *rt = async_runtime_init();
        CHECK(rt);
        CHECK_EQ(async_runtime_add_signal(rt, SIGUSR1, KEY), 0);
        CHECK_EQ(raise(SIGUSR1), 0);
        async_runtime_deinit(rt);
        CHECK(is_ign(SIGUSR1));
        async_runtime_t *rt2 = async_runtime_init();
        CHECK(rt2);
        CHECK_EQ(wait_signals(rt2, 0, KEY, NULL), 0);
        CHECK_EQ(async_runtime_add_signal(rt2, SIGUSR1, KEY), 0);
        CHECK_EQ(wait_signals(rt2, 0, KEY, NULL), 0); /* no stale count */
        CHECK_EQ(raise(SIGUSR1), 0);
        CHECK_EQ(wait_signals(rt2, 5000, KEY, NULL), 1);
        async_runtime_deinit(rt2);
    }
}

/* A removal while another thread is blocked in the wait: no event for the
 * removed signal afterwards; the wait still ends by a wakeup. */
static async_runtime_t *rw_rt;
static _Atomic int rw_events = -1;
static void *rw_waiter(void *arg) {
    (void)arg;
    io_event_t ev[4];
    atomic_store(&rw_events, async_runtime_wait(rw_rt, ev, 4, 20000));
    return NULL;
}

CASE(rt_remove_during_wait) { // poll
    rw_rt = rt_watching(SIGUSR1, KEY);
    pthread_t th;
    start_thread(&th, rw_waiter, NULL);
    sleep_ms(50);
    CHECK_EQ(async_runtime_remove_signal(rw_rt, SIGUSR1), 0);
    CHECK_EQ(raise(SIGUSR1), 0); /* ignored now */
    CHECK_EQ(async_runtime_wakeup(rw_rt), 0);
    join_within(th, 30000, "waiter");
    CHECK_EQ(atomic_load(&rw_events), 0);
    async_runtime_deinit(rw_rt);
}

/* A flood of real-time signals queued with sigqueue by other threads, each
 * handled by the process: the counts add up to exactly what was sent. */
#define FLOOD_THREADS 3
#define FLOOD_EACH 3000
static _Atomic long flood_sent;
static int flood_sig;
static void *flooder(void *arg) {
    (void)arg;
    union sigval v = {.sival_int = 0};
    for (int i = 0; i < FLOOD_EACH; i++) {
        while (sigqueue(getpid(), flood_sig, v) != 0) {
            CHECK_EQ(errno, EAGAIN); /* the queue is full: let it drain */
            sched_yield();
        }
        atomic_fetch_add(&flood_sent, 1);
    }
    return NULL;
}

CASE(rt_flood) { // poll notsan
    flood_sig = SIGRTMIN + 2;
    async_runtime_t *rt = rt_watching(flood_sig, KEY);
    pthread_t th[FLOOD_THREADS];
    for (int i = 0; i < FLOOD_THREADS; i++) start_thread(&th[i], flooder, NULL);
    uint64_t sum = 0;
    int events = 0;
    double end = now_ms() + 30000;
    while (sum < (uint64_t)FLOOD_THREADS * FLOOD_EACH && now_ms() < end) {
        int n = 0;
        sum += wait_signals(rt, 100, KEY, &n);
        events += n;
    }
    for (int i = 0; i < FLOOD_THREADS; i++) join_within(th[i], 30000, "flooder");
    CHECK_EQ(atomic_load(&flood_sent), FLOOD_THREADS * FLOOD_EACH);
    sum += wait_signals(rt, 50, KEY, NULL); /* nothing more may come */
    CHECK_EQ(sum, (uint64_t)FLOOD_THREADS * FLOOD_EACH);
    printf("%d events for %d signals\n", events, FLOOD_THREADS * FLOOD_EACH);
    async_runtime_deinit(rt);
    CHECK(is_ign(flood_sig));
}

/* Ping-pong: one signal at a time from the main thread, the next sent as soon
 * as the waiter (which blocks the signal itself, so it is woken by the
 * doorbell only) has counted the previous one, which races each signal with
 * the waiter going back to sleep (the Dekker pair of the sleep flag and
 * la_rtc_pending). A lost wake-up hangs a round: bounded, it fails. */
#define PP_ROUNDS 20000
static async_runtime_t *pp_rt;
static _Atomic uint64_t pp_total;
static _Atomic int pp_stop;
static int pp_sig;
static void *pp_waiter(void *arg) {
    (void)arg;
    block_signal(pp_sig);
    while (!atomic_load(&pp_stop)) atomic_fetch_add(&pp_total, wait_signals(pp_rt, -1, KEY, NULL));
    return NULL;
}

CASE(rt_pingpong) { // poll
    pp_sig = SIGRTMIN + 5;
    pp_rt = rt_watching(pp_sig, KEY);
    pthread_t th;
    start_thread(&th, pp_waiter, NULL);
    for (uint64_t i = 1; i <= PP_ROUNDS; i++) {
        /* a varying head start for the waiter: the signal lands anywhere on
         * its way back to sleep */
        for (volatile unsigned d = (unsigned)(i * 7919u) % 4096u; d > 0; d--) {
        }
        CHECK_EQ(raise(pp_sig), 0); /* handled on this thread before raise returns */
        double end = now_ms() + 10000;
        for (int spins = 0; atomic_load(&pp_total) < i && now_ms() < end; spins++)
            if (spins > 1000) sched_yield(); /* a loaded machine: let the waiter run */
        if (atomic_load(&pp_total) != i) fprintf(stderr, "round %llu: the waiter was not woken\n", (unsigned long long)i);
        CHECK_EQ(atomic_load(&pp_total), i);
    }
    atomic_store(&pp_stop, 1);
    CHECK_EQ(async_runtime_wakeup(pp_rt), 0);
    join_within(th, 30000, "waiter");
    async_runtime_deinit(pp_rt);
}

/* The signal sent to every thread of the process in turn (tgkill): Go's
 * threads, fiber workers, a worker, the host's. Each one is counted. */
static void noop_fiber(void *arg) {
    (void)arg;
    async_fiber_sleep(1);
}

CASE(rt_every_thread) { // poll notsan
    if (getenv("ASYNC_TEST_EMULATOR")) {
        /* qemu-user lists its own threads in /proc/self/task and lets
         * process-directed signals land on them: there they are lost
         * (rt_every_thread) or end the process with "uncaught target signal
         * 11" (rt_race_add_remove), every run; natively both pass. */
        printf("skipped under an emulator (qemu-user signal delivery)\n");
        return;
    }
    int sig = SIGRTMIN + 3;
    set_ign(sig);
    async_sched_t *s = sched_new(2);
    for (int i = 0; i < 10; i++) CHECK(async_fiber_spawn(s, noop_fiber, NULL, 0));
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    CHECK_EQ(async_runtime_add_signal(rt, sig, KEY), 0);
    int sent = 0;
    for (int round = 0; round < 3; round++) {
        DIR *d = opendir("/proc/self/task");
        CHECK(d);
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            pid_t tid = (pid_t)atoi(e->d_name);
            if (syscall(SYS_tgkill, getpid(), tid, sig) != 0) {
                CHECK_EQ(errno, ESRCH); /* a thread that just ended */
                continue;
            }
            sent++;
            /* one at a time: each signal is its own, never merged */
            CHECK_EQ(collect(rt, 1, KEY), 1);
        }
        closedir(d);
    }
    CHECK(sent >= 6);
    CHECK_EQ(wait_signals(rt, 0, KEY, NULL), 0);
    async_runtime_deinit(rt);
    async_sched_destroy(s);
}

/* Add, remove, deinit and init racing a stream of signals from another
 * thread, and two runtimes' waits: no crash, no event after the last removal,
 * the action restored. */
static _Atomic int race_stop;
static void *race_sender(void *arg) {
    (void)arg;
    while (!atomic_load(&race_stop)) {
        kill(getpid(), SIGUSR2);
        sched_yield();
    }
    return NULL;
}

CASE(rt_race_add_remove) { // poll
    if (getenv("ASYNC_TEST_EMULATOR")) {
        /* qemu-user lists its own threads in /proc/self/task and lets
         * process-directed signals land on them: there they are lost
         * (rt_every_thread) or end the process with "uncaught target signal
         * 11" (rt_race_add_remove), every run; natively both pass. */
        printf("skipped under an emulator (qemu-user signal delivery)\n");
        return;
    }
    set_ign(SIGUSR2);
    pthread_t th;
    start_thread(&th, race_sender, NULL);
    async_runtime_t *keep = async_runtime_init();
    CHECK(keep);
    for (int i = 0; i < 1000; i++) {
        async_runtime_t *rt = async_runtime_init();
        CHECK(rt);
        CHECK_EQ(async_runtime_add_signal(rt, SIGUSR2, KEY), 0);
        if (i % 3 == 0) CHECK_EQ(async_runtime_add_signal(keep, SIGUSR2, 7), 0);
        (void)wait_signals(rt, 0, KEY, NULL);
        if (i % 2) CHECK_EQ(async_runtime_remove_signal(rt, SIGUSR2), 0);
        if (i % 3 == 0) {
            CHECK_EQ(async_runtime_remove_signal(keep, SIGUSR2), 0);
            (void)wait_signals(keep, 0, 7, NULL); /* what came before the removal */
        }
        async_runtime_deinit(rt);
    }
    atomic_store(&race_stop, 1);
    join_within(th, 30000, "sender");
    CHECK(is_ign(SIGUSR2));
    /* Nothing for keep once its watch is gone. */
    CHECK_EQ(kill(getpid(), SIGUSR2), 0);
    CHECK_EQ(wait_signals(keep, 20, 7, NULL), 0);
    async_runtime_deinit(keep);
}

/* fork while SIGTERM is watched: the child gets the action that was there
 * before (the default: it dies of SIGTERM), instead of a handler whose
 * events nobody can receive; the parent keeps its watch. */
CASE(rt_fork_child) { // poll notsan
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    CHECK_EQ(sigaction(SIGTERM, &dfl, NULL), 0);
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    CHECK_EQ(async_runtime_add_signal(rt, SIGTERM, KEY), 0);
    pid_t pid = fork_flushed();
    if (pid == 0) {
        if (async_runtime_add_signal(rt, SIGUSR1, KEY) != -1 || async_last_error() != ASYNC_E_FORKED) _exit(4);
        raise(SIGTERM);
        _exit(3); /* survived: the signal was swallowed */
    }
    int st = 0;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    if (!WIFSIGNALED(st)) fprintf(stderr, "child exited with %d\n", WEXITSTATUS(st));
    CHECK(WIFSIGNALED(st));
    CHECK_EQ(WTERMSIG(st), SIGTERM);
    CHECK_EQ(raise(SIGTERM), 0); /* the parent still watches */
    CHECK_EQ(wait_signals(rt, 5000, KEY, NULL), 1);
    async_runtime_deinit(rt);
    struct sigaction cur;
    CHECK_EQ(sigaction(SIGTERM, NULL, &cur), 0);
    CHECK(!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_DFL);
}

/* ---- the fiber side -------------------------------------------------------- */

static _Atomic int fw_stage;
static _Atomic int fw_first, fw_second, fw_third_err;
static void fw_fiber(void *arg) {
    (void)arg;
    atomic_store(&fw_first, async_fiber_wait_signal(SIGUSR1, 20000)); /* two arrived before */
    atomic_store(&fw_stage, 1);
    atomic_store(&fw_second, async_fiber_wait_signal(SIGUSR1, 20000)); /* parks until one comes */
    atomic_store(&fw_stage, 2);
    int r = async_fiber_wait_signal(SIGUSR1, 30);
    atomic_store(&fw_third_err, r == -1 ? async_last_error() : 1000 + r);
    atomic_store(&fw_stage, 3);
}

CASE(fiber_wait) {
    set_ign(SIGUSR1);
    CHECK_EQ(async_fiber_watch_signal(SIGUSR1), 0);
    CHECK(!is_ign(SIGUSR1));
    CHECK_EQ(raise(SIGUSR1), 0);
    CHECK_EQ(raise(SIGUSR1), 0);
    async_sched_t *s = sched_new(2);
    CHECK(async_fiber_spawn(s, fw_fiber, NULL, 0));
    double end = now_ms() + 20000;
    while (atomic_load(&fw_stage) < 1 && now_ms() < end) sleep_ms(1);
    CHECK_EQ(atomic_load(&fw_stage), 1);
    CHECK_EQ(atomic_load(&fw_first), 2);
    sleep_ms(20); /* likely parked by now; either way the signal is counted */
    CHECK_EQ(kill(getpid(), SIGUSR1), 0);
    while (atomic_load(&fw_stage) < 3 && now_ms() < end) sleep_ms(1);
    CHECK_EQ(atomic_load(&fw_stage), 3);
    CHECK_EQ(atomic_load(&fw_second), 1);
    CHECK_EQ(atomic_load(&fw_third_err), ASYNC_E_TIMEDOUT);
    async_sched_destroy(s);
    /* On a plain thread: blocks, and counts what came meanwhile. */
    CHECK_FAIL(async_fiber_wait_signal(SIGUSR1, 0) == -1, ASYNC_E_TIMEDOUT);
    for (int i = 0; i < 4; i++) CHECK_EQ(raise(SIGUSR1), 0);
    CHECK_EQ(async_fiber_wait_signal(SIGUSR1, 5000), 4);
    /* Nested watches: the second unwatch ends it. */
    CHECK_EQ(async_fiber_watch_signal(SIGUSR1), 0);
    CHECK_EQ(async_fiber_unwatch_signal(SIGUSR1), 0);
    CHECK(!is_ign(SIGUSR1));
    CHECK_EQ(async_fiber_unwatch_signal(SIGUSR1), 0);
    CHECK(is_ign(SIGUSR1));
    CHECK_FAIL(async_fiber_wait_signal(SIGUSR1, 0) == -1, ASYNC_E_STATE);
}

/* A thread blocked in async_fiber_wait_signal returns ASYNC_E_STATE when the
 * watch ends; a runtime watch and a fiber watch of one signal both count. */
static _Atomic int uw_err;
static void *uw_waiter(void *arg) {
    (void)arg;
    int r = async_fiber_wait_signal(SIGUSR2, 20000);
    atomic_store(&uw_err, r == -1 ? async_last_error() : 1000 + r);
    return NULL;
}

CASE(fiber_unwatch_wakes) {
    async_runtime_t *rt = rt_watching(SIGUSR2, KEY);
    CHECK_EQ(async_fiber_watch_signal(SIGUSR2), 0);
    CHECK_EQ(raise(SIGUSR2), 0);
    CHECK_EQ(wait_signals(rt, 5000, KEY, NULL), 1);
    CHECK_EQ(async_fiber_wait_signal(SIGUSR2, 5000), 1);
    pthread_t th;
    start_thread(&th, uw_waiter, NULL);
    sleep_ms(50);
    CHECK_EQ(async_fiber_unwatch_signal(SIGUSR2), 0);
    join_within(th, 30000, "waiter");
    CHECK_EQ(atomic_load(&uw_err), ASYNC_E_STATE);
    CHECK(!is_ign(SIGUSR2)); /* the runtime still watches */
    CHECK_EQ(raise(SIGUSR2), 0);
    CHECK_EQ(wait_signals(rt, 5000, KEY, NULL), 1);
    async_runtime_deinit(rt);
    CHECK(is_ign(SIGUSR2));
}

/* A flood of queued real-time signals counted by a fiber: exact sum. */
static _Atomic uint64_t ff_sum;
static _Atomic int ff_done;
static void ff_fiber(void *arg) {
    (void)arg;
    uint64_t want = (uint64_t)FLOOD_THREADS * FLOOD_EACH;
    while (atomic_load(&ff_sum) < want) {
        int r = async_fiber_wait_signal(flood_sig, 20000);
        if (r < 0) break;
        atomic_fetch_add(&ff_sum, (uint64_t)r);
    }
    atomic_store(&ff_done, 1);
}

CASE(fiber_flood) { // notsan
    flood_sig = SIGRTMIN + 4;
    set_ign(flood_sig);
    CHECK_EQ(async_fiber_watch_signal(flood_sig), 0);
    async_sched_t *s = sched_new(2);
    CHECK(async_fiber_spawn(s, ff_fiber, NULL, 0));
    pthread_t th[FLOOD_THREADS];
    for (int i = 0; i < FLOOD_THREADS; i++) start_thread(&th[i], flooder, NULL);
    for (int i = 0; i < FLOOD_THREADS; i++) join_within(th[i], 30000, "flooder");
    double end = now_ms() + 30000;
    while (!atomic_load(&ff_done) && now_ms() < end) sleep_ms(1);
    CHECK(atomic_load(&ff_done));
    CHECK_EQ(atomic_load(&ff_sum), (uint64_t)FLOOD_THREADS * FLOOD_EACH);
    CHECK_FAIL(async_fiber_wait_signal(flood_sig, 20) == -1, ASYNC_E_TIMEDOUT); /* nothing more */
    async_sched_destroy(s);
    CHECK_EQ(async_fiber_unwatch_signal(flood_sig), 0);
    CHECK(is_ign(flood_sig));
}

/* Two fibers of one scheduler wait for one signal: the second gets
 * ASYNC_E_BUSY; a shutdown cancels the first. */
static _Atomic int bc_parked, bc_first_err, bc_second_err;
static void bc_first(void *arg) {
    (void)arg;
    atomic_store(&bc_parked, 1);
    int r = async_fiber_wait_signal(SIGUSR1, -1);
    atomic_store(&bc_first_err, r == -1 ? async_last_error() : 1000 + r);
}
static void bc_second(void *arg) {
    (void)arg;
    int r = async_fiber_wait_signal(SIGUSR1, 20000);
    atomic_store(&bc_second_err, r == -1 ? async_last_error() : 1000 + r);
}

CASE(fiber_busy_cancel) {
    set_ign(SIGUSR1);
    CHECK_EQ(async_fiber_watch_signal(SIGUSR1), 0);
    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, bc_first, NULL, 0));
    double end = now_ms() + 20000;
    while (!atomic_load(&bc_parked) && now_ms() < end) sleep_ms(1);
    /* One worker, no preemption: the first fiber parks before the second runs. */
    CHECK(async_fiber_spawn(s, bc_second, NULL, 0));
    while (!atomic_load(&bc_second_err) && now_ms() < end) sleep_ms(1);
    CHECK_EQ(atomic_load(&bc_second_err), ASYNC_E_BUSY);
    CHECK_EQ(atomic_load(&bc_first_err), 0); /* still parked */
    CHECK_EQ(async_sched_shutdown(s, 20000), 0);
    while (!atomic_load(&bc_first_err) && now_ms() < end) sleep_ms(1);
    CHECK_EQ(atomic_load(&bc_first_err), ASYNC_E_CANCELLED);
    async_sched_destroy(s);
    CHECK_EQ(async_fiber_unwatch_signal(SIGUSR1), 0);
    CHECK(is_ign(SIGUSR1));
}

TEST_MAIN()
