/* async_sched_dump_on_signal beside the signal watches: a dump and an
 * async_runtime_add_signal on one signal, in every order of install and
 * removal (the watch keeps its events while the dump goes, the host's
 * action comes back when the last goes); a failed dump registration
 * (refused signal, fd < 0) leaves nothing behind (the host's action is
 * back, nothing is dumped, its slot of the 64 is free). */
#include "check.h"

#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>

/* --- dump_vs_watch ------------------------------------------------------------ */

static volatile sig_atomic_t host_hits;
static void host_handler(int s) { (void)s; host_hits++; }

static int host_installed(int sig)
{
    struct sigaction cur;
    CHECK_EQ(sigaction(sig, NULL, &cur), 0);
    return !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == host_handler;
}

/* One SIGNAL event of key for rt, within 2 s. */
static void expect_signal_event(async_runtime_t *rt, uintptr_t key)
{
    io_event_t ev[4];
    int n = async_runtime_wait(rt, ev, 4, 2000);
    CHECK_EQ(n, 1);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_SIGNAL);
    CHECK_EQ(ev[0].completion_key, key);
}

CASE(dump_vs_watch) // poll adversarial
{
    const int sig = SIGUSR1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = host_handler;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(sig, &sa, NULL), 0);
    async_sched_t *s = async_sched_create(NULL);
    async_runtime_t *rt = async_runtime_init();
    CHECK(s && rt);
    int devnull = open("/dev/null", O_WRONLY);
    CHECK(devnull >= 0);

    /* A: dump, watch, dump goes: the watch still gets its signal (and the
     * host's action is not back under it); the watch goes: the host's. */
    CHECK_EQ(async_sched_dump_on_signal(s, sig, devnull), 0);
    CHECK_EQ(async_runtime_add_signal(rt, sig, 5), 0);
    CHECK_EQ(async_sched_dump_on_signal(s, 0, devnull), 0);
    CHECK(!host_installed(sig));
    host_hits = 0;
    raise(sig);
    expect_signal_event(rt, 5);
    CHECK_EQ(host_hits, 0);
    CHECK_EQ(async_runtime_remove_signal(rt, sig), 0);
    CHECK(host_installed(sig));

    /* B: watch, dump, watch goes, dump goes: the host's action. */
    CHECK_EQ(async_runtime_add_signal(rt, sig, 6), 0);
    CHECK_EQ(async_sched_dump_on_signal(s, sig, devnull), 0);
    CHECK_EQ(async_runtime_remove_signal(rt, sig), 0);
    CHECK(!host_installed(sig));
    CHECK_EQ(async_sched_dump_on_signal(s, 0, devnull), 0);
    CHECK(host_installed(sig));

    /* C: dump, watch, watch goes, dump goes. */
    CHECK_EQ(async_sched_dump_on_signal(s, sig, devnull), 0);
    CHECK_EQ(async_runtime_add_signal(rt, sig, 7), 0);
    CHECK_EQ(async_runtime_remove_signal(rt, sig), 0);
    CHECK_EQ(async_sched_dump_on_signal(s, 0, devnull), 0);
    CHECK(host_installed(sig));

    /* D: the fiber-side watch with the dump, and both at once: the watch
     * counts the signal the dump also handles. */
    CHECK_EQ(async_fiber_watch_signal(sig), 0);
    CHECK_EQ(async_sched_dump_on_signal(s, sig, devnull), 0);
    CHECK_EQ(async_runtime_add_signal(rt, sig, 8), 0);
    host_hits = 0;
    raise(sig);
    expect_signal_event(rt, 8);
    CHECK_EQ(async_fiber_wait_signal(sig, 2000), 1);
    CHECK_EQ(async_fiber_unwatch_signal(sig), 0);
    CHECK_EQ(async_sched_dump_on_signal(s, 0, devnull), 0);
    raise(sig);
    expect_signal_event(rt, 8);
    CHECK_EQ(host_hits, 0);
    async_runtime_deinit(rt); /* drops the last watch */
    CHECK(host_installed(sig));
    raise(sig);
    CHECK_EQ(host_hits, 1);

    async_sched_destroy(s);
    close(devnull);
}

/* --- dump_failed_rereg ----------------------------------------------------------- */

CASE(dump_failed_rereg) // adversarial
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = host_handler;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(SIGUSR1, &sa, NULL), 0);
    async_sched_t *s = sched_new(1);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(fcntl(p[0], F_SETFL, O_NONBLOCK), 0);
    const int bad[][2] = {{SIGALRM, 1}, {SIGUSR1, -1}, {SIGKILL, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ(async_sched_dump_on_signal(s, SIGUSR1, p[1]), 0);
        CHECK(!host_installed(SIGUSR1));
        CHECK_FAIL(async_sched_dump_on_signal(s, bad[i][0], bad[i][1] < 0 ? -1 : p[1]) == -1, ASYNC_E_INVAL);
        CHECK(host_installed(SIGUSR1)); /* s's was the last registration */
        host_hits = 0;
        raise(SIGUSR1);
        CHECK_EQ(host_hits, 1);
        char buf[64];
        CHECK(read(p[0], buf, sizeof buf) < 0 && errno == EAGAIN); /* nothing dumped */
    }
    /* The slot went too: 64 registrations, one fails, a 65th scheduler fits. */
    enum { N = 65 };
    async_sched_t *m[N];
    int devnull = open("/dev/null", O_WRONLY);
    CHECK(devnull >= 0);
    for (int i = 0; i < N; i++)
        m[i] = sched_new(1);
    for (int i = 0; i < 64; i++)
        CHECK_EQ(async_sched_dump_on_signal(m[i], SIGUSR2, devnull), 0);
    CHECK_FAIL(async_sched_dump_on_signal(m[64], SIGUSR2, devnull) == -1, ASYNC_E_NOMEM);
    CHECK_FAIL(async_sched_dump_on_signal(m[3], SIGALRM, devnull) == -1, ASYNC_E_INVAL);
    CHECK_EQ(async_sched_dump_on_signal(m[64], SIGUSR2, devnull), 0);
    for (int i = 0; i < N; i++)
        async_sched_destroy(m[i]);
    async_sched_destroy(s);
    close(devnull);
    close_pair(p);
}

TEST_MAIN()
