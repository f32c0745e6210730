/* Faults a host can cause or suffer, and bad values for every public
 * function. Each case is its own process (ctest), so a case may end with
 * threads still blocked: the process must still exit cleanly.
 *
 * Run one case: test_faults CASE. The runtime cases are registered again
 * with ASYNC_BACKEND=poll (see CMakeLists.txt). */
#include "check.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>


static uint32_t rnd_state = 12345;

/* A number in [0, n) (single-threaded use only; threads keep their own). */
static uint32_t rnd(uint32_t n)
{
    rnd_state = rnd_state * 1103515245u + 12345u;
    return (rnd_state >> 8) % n;
}

static uint32_t rnd_r(uint32_t *s, uint32_t n)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 8) % n;
}

static void seed(const char *name)
{
    const char *s = getenv("ASYNC_STRESS_SEED");
    rnd_state = s && *s ? (uint32_t)strtoul(s, NULL, 0) : (uint32_t)time(NULL) ^ (uint32_t)getpid();
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("%s: ASYNC_STRESS_SEED=%u, backend %s\n", name, rnd_state,
           getenv("ASYNC_BACKEND") ? getenv("ASYNC_BACKEND") : "default");
}

static bool backend_is_poll(void)
{
    const char *b = getenv("ASYNC_BACKEND");
    return b != NULL && strcmp(b, "poll") == 0;
}

/* Collects events for up to ms (stops early once `until` events came). At
 * least one wait runs, however late this thread gets the CPU: what was ready
 * before the call is always collected. */
static int collect(async_runtime_t *rt, io_event_t *out, int max, int ms, int until)
{
    double t0 = now_ms();
    int got = 0;
    while (got < max && got < until) {
        int left = ms - (int)(now_ms() - t0), n;
        if (left < 0)
            left = 0;
        n = async_runtime_wait(rt, out + got, max - got, left);
        CHECK(n >= 0);
        got += n;
        if (left == 0)
            break;
    }
    return got;
}

/* --- a worker that never stops ----------------------------------------- */
/*
 * Procs that ignore the stop request: one blocked in read(2) forever, one
 * blocked in async_queue_dequeue_wait(-1), one in async_runtime_wait(-1),
 * one spinning on add_timer/cancel_timer on another runtime. Checked: join
 * times out (TIMEDOUT, also for a second joiner), state stays STOPPING,
 * destroy returns at once and invalidates the handle; destroying the queue /
 * runtime they block in wakes those two (CLOSED) and after its runtime's
 * deinit the spinner gets BADHANDLE on every call; the library keeps working; and the process exits cleanly with
 * the read(2) proc and the spinner still running.
 */

static int g_never_pipe[2];
static async_queue_t *g_never_q;
static async_runtime_t *g_never_rt, *g_never_rt2;
static atomic_int g_never_qerr, g_never_rterr, g_never_badposts, g_never_started;

static void *never_read(void *ctx)
{
    char c;
    (void)ctx;
    atomic_fetch_add(&g_never_started, 1);
    for (;;)
        if (read(g_never_pipe[0], &c, 1) == 0)
            sleep_ms(1000);
    return NULL;
}

static void *never_queue(void *ctx)
{
    uint64_t v;
    (void)ctx;
    atomic_fetch_add(&g_never_started, 1);
    /* The stop ends this wait (ASYNC_E_CANCELLED: a worker's own queue waits
     * are stoppable, test_worker_stop.c); the proc still ignores it. */
    while (async_queue_dequeue_wait(g_never_q, &v, sizeof v, NULL, -1)) {
    }
    atomic_store(&g_never_qerr, async_last_error());
    for (;;)
        sleep_ms(1000); /* and still never returns */
    return NULL;
}

static void *never_wait(void *ctx)
{
    io_event_t ev[4];
    (void)ctx;
    atomic_fetch_add(&g_never_started, 1);
    for (;;) {
        if (async_runtime_wait(g_never_rt, ev, 4, -1) >= 0)
            continue;
        if (async_last_error() != ASYNC_E_BUSY)
            break;
        sleep_ms(1); /* lost a race with the main thread's probe: again */
    }
    atomic_store(&g_never_rterr, async_last_error());
    for (;;)
        sleep_ms(1000);
    return NULL;
}

static void *never_post(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&g_never_started, 1);
    for (;;) {
        uint64_t id = async_runtime_add_timer(g_never_rt2, 1000000, 0, 1);
        if (id == 0 || async_runtime_cancel_timer(g_never_rt2, id) != 0) {
            CHECK(async_last_error() == ASYNC_E_BADHANDLE || async_last_error() == ASYNC_E_CLOSED);
            atomic_fetch_add(&g_never_badposts, 1);
        }
        sched_yield();
    }
    return NULL;
}

static void *joiner(void *w)
{
    double t0 = now_ms();
    bool ok = async_worker_join((async_worker_t *)w, 300);
    CHECK(!ok);
    /* the worker may be destroyed meanwhile: either error is fine, no crash, no hang */
    CHECK(async_last_error() == ASYNC_E_TIMEDOUT || async_last_error() == ASYNC_E_BADHANDLE);
    CHECK(now_ms() - t0 < 10000);
    return NULL;
}

static void t_worker_never_stops(void)
{
    void *(*procs[4])(void *) = {never_read, never_queue, never_wait, never_post};
    async_worker_t *w[4];
    pthread_t jt;
    double t0;
    int i;
    CHECK(pipe(g_never_pipe) == 0);
    g_never_q = async_queue_create(4, sizeof(uint64_t), (async_queue_flags_t)0);
    g_never_rt = mkrt();
    g_never_rt2 = mkrt();
    CHECK(g_never_q != NULL);
    for (i = 0; i < 4; i++) {
        w[i] = async_worker_create(procs[i], NULL, 0);
        CHECK(w[i] != NULL);
    }
    /* let them block: all four procs began, and the runtime waiter is inside
     * its wait (a wait of ours fails with BUSY); the queue reader has the
     * joins below (> 400 ms) to reach its call before the queue goes away */
    t0 = now_ms();
    while (atomic_load(&g_never_started) < 4) {
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(1);
    }
    for (;;) {
        io_event_t ev[1];
        int n = async_runtime_wait(g_never_rt, ev, 1, 0);
        if (n == -1 && async_last_error() == ASYNC_E_BUSY)
            break;
        CHECK_EQ(n, 0);
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(1);
    }
    for (i = 0; i < 4; i++) {
        struct pollfd pfd;
        async_worker_signal_stop(w[i]);
        CHECK_EQ(async_worker_get_state(w[i]), ASYNC_WORKER_STOPPING);
        CHECK(async_worker_should_stop(w[i]));
        pfd.fd = async_worker_stop_fd(w[i]);
        pfd.events = POLLIN;
        CHECK(pfd.fd >= 0);
        CHECK_EQ(poll(&pfd, 1, 0), 1);
        t0 = now_ms();
        CHECK_FAIL(!async_worker_join(w[i], 0), ASYNC_E_TIMEDOUT);
        CHECK_FAIL(!async_worker_join(w[i], 100), ASYNC_E_TIMEDOUT);
        CHECK(now_ms() - t0 >= 99);
        CHECK_FAIL(async_worker_result(w[i]) == NULL, ASYNC_E_STATE);
        CHECK_EQ(async_worker_get_state(w[i]), ASYNC_WORKER_STOPPING);
    }
    /* destroy while another thread is joining */
    start_thread(&jt, joiner, w[0]);
    sleep_ms(20);
    for (i = 0; i < 4; i++) {
        t0 = now_ms();
        async_clear_error();
        async_worker_destroy(w[i]);
        CHECK_ERR(ASYNC_OK);
        CHECK(now_ms() - t0 < 5000); /* never blocks (a generous bound) */
        CHECK_FAIL(async_worker_get_state(w[i]) == ASYNC_WORKER_STOPPED, ASYNC_E_BADHANDLE);
        CHECK_FAIL(!async_worker_join(w[i], 0), ASYNC_E_BADHANDLE);
        CHECK_FAIL(async_worker_stop_fd(w[i]) == -1, ASYNC_E_BADHANDLE);
    }
    join_within(jt, 10000, "the joiner");
    /* the objects they hang in can still be destroyed: they wake */
    async_queue_destroy(g_never_q);
    async_runtime_deinit(g_never_rt);
    async_runtime_deinit(g_never_rt2);
    t0 = now_ms();
    while ((atomic_load(&g_never_qerr) == 0 || atomic_load(&g_never_rterr) == 0 ||
            atomic_load(&g_never_badposts) < 10) &&
           now_ms() - t0 < 10000)
        sleep_ms(5);
    CHECK_EQ(atomic_load(&g_never_qerr), ASYNC_E_CANCELLED); /* at the stop, before the destroy */
    CHECK_EQ(atomic_load(&g_never_rterr), ASYNC_E_CLOSED);
    CHECK(atomic_load(&g_never_badposts) >= 10);
    /* the library still works around them */
    {
        async_runtime_t *rt = mkrt();
        io_event_t ev[2];
        CHECK_EQ(async_runtime_post_completion(rt, 7, 8), 0);
        CHECK_EQ(collect(rt, ev, 2, 5000, 1), 1);
        CHECK(ev[0].completion_key == 7 && ev[0].data == 8);
        async_runtime_deinit(rt);
    }
    /* return with the read(2) proc and the spinner still running: exit must be clean */
}

/* --- the host closes a registered fd ------------------------------------ */
/*
 * 8 pipes stay registered and working; 8 others are closed without remove
 * while the loop waits in another thread (epoll forgets them; poll reports
 * each once as ERROR|CLOSE). Their numbers are then reused by new pipes and
 * registered again. Checked: no event ever has a context other than the one
 * given at add for that fd; closed registrations report at most ERROR|CLOSE;
 * remove of a closed fd is BADFD; the reused numbers report exactly what
 * their new pipes do; the untouched pipes keep reporting.
 */

enum { HC_KEEP = 8, HC_CLOSE = 8 };

static struct {
    async_runtime_t *rt;
    int keep[HC_KEEP][2], gone[HC_CLOSE][2];
    int ctx_keep[HC_KEEP], ctx_gone[HC_CLOSE], ctx_new[HC_CLOSE];
} hc;

static void *hc_closer(void *arg)
{
    int i;
    (void)arg;
    sleep_ms(50); /* the loop is in async_runtime_wait(-1) by now */
    for (i = 0; i < HC_CLOSE; i++) {
        close(hc.gone[i][0]);
        close(hc.gone[i][1]);
    }
    sleep_ms(20);
    CHECK(write(hc.keep[3][1], "k", 1) == 1); /* wakes the loop */
    return NULL;
}

/* Index of ctx in arr, or -1. */
static int ctx_index(const int *arr, int n, const void *ctx)
{
    int i;
    for (i = 0; i < n; i++)
        if (ctx == &arr[i])
            return i;
    return -1;
}

static void t_host_close(void)
{
    io_event_t ev[64];
    pthread_t th;
    int i, n, k, newfd[HC_CLOSE][2], keep_seen = 0;
    seed("host_close");
    hc.rt = mkrt();
    for (i = 0; i < HC_KEEP; i++) {
        CHECK(pipe(hc.keep[i]) == 0);
        CHECK_EQ(async_runtime_add(hc.rt, hc.keep[i][0], ASYNC_EVENT_READ, &hc.ctx_keep[i]), 0);
    }
    for (i = 0; i < HC_CLOSE; i++) {
        CHECK(pipe(hc.gone[i]) == 0);
        CHECK_EQ(async_runtime_add(hc.rt, hc.gone[i][0], ASYNC_EVENT_READ, &hc.ctx_gone[i]), 0);
        if (i % 2)
            CHECK(write(hc.gone[i][1], "g", 1) == 1); /* some are readable when closed */
    }
    /* drain the readable ones first so the wait below blocks */
    for (i = 1; i < HC_CLOSE; i += 2) {
        char c;
        CHECK(read(hc.gone[i][0], &c, 1) == 1);
    }
    start_thread(&th, hc_closer, NULL);
    /* ends soon after the closer's write (keep[3] then fills ev: it is
     * reported by every wait); the long bound only covers a slow start */
    n = collect(hc.rt, ev, 64, 30000, 64);
    join_within(th, 10000, "the closing thread");
    for (k = 0; k < n; k++) {
        int g = ctx_index(hc.ctx_gone, HC_CLOSE, ev[k].context), kk = ctx_index(hc.ctx_keep, HC_KEEP, ev[k].context);
        if (g >= 0) {
            /* a closed registration: poll says ERROR|CLOSE once, epoll nothing */
            CHECK(backend_is_poll());
            CHECK_EQ(ev[k].fd, hc.gone[g][0]);
            CHECK((ev[k].event_type & (ASYNC_EVENT_READ | ASYNC_EVENT_WRITE)) == 0);
            continue;
        }
        if (kk < 0)
            fprintf(stderr, "event fd %d type %#x with context %p\n", ev[k].fd, ev[k].event_type, ev[k].context);
        CHECK_EQ(kk, 3);
        CHECK_EQ(ev[k].fd, hc.keep[3][0]);
        CHECK(ev[k].event_type & ASYNC_EVENT_READ);
        keep_seen++;
    }
    CHECK(keep_seen >= 1);
    {
        char c;
        CHECK(read(hc.keep[3][0], &c, 1) == 1);
    }
    /* remove of a closed fd */
    for (i = 0; i < HC_CLOSE; i++)
        CHECK_FAIL(async_runtime_remove(hc.rt, hc.gone[i][0]) == -1, ASYNC_E_BADFD);
    /* reuse the numbers: new pipes get the lowest free descriptors */
    for (i = 0; i < HC_CLOSE; i++) {
        CHECK(pipe(newfd[i]) == 0);
        CHECK_EQ(async_runtime_add(hc.rt, newfd[i][0], ASYNC_EVENT_READ, &hc.ctx_new[i]), 0);
    }
    {
        int reused = 0, j;
        for (i = 0; i < HC_CLOSE; i++)
            for (j = 0; j < HC_CLOSE; j++)
                reused += newfd[i][0] == hc.gone[j][0];
        printf("host_close: %d of %d closed numbers reused by the new pipes\n", reused, HC_CLOSE);
        CHECK(reused > 0);
    }
    /* only the written ones report, with their new context */
    for (i = 0; i < HC_CLOSE; i += 2)
        CHECK(write(newfd[i][1], "n", 1) == 1);
    for (i = 0; i < HC_KEEP; i++)
        CHECK(write(hc.keep[i][1], "k", 1) == 1);
    sleep_ms(20);
    n = collect(hc.rt, ev, 64, 300, 64); /* level-triggered: repeats are fine */
    {
        int seen_new[HC_CLOSE] = {0}, seen_keep[HC_KEEP] = {0};
        for (k = 0; k < n; k++) {
            int a = ctx_index(hc.ctx_new, HC_CLOSE, ev[k].context), b = ctx_index(hc.ctx_keep, HC_KEEP, ev[k].context);
            if (a < 0 && b < 0) {
                fprintf(stderr, "event fd %d type %#x with context %p (none of the live registrations)\n", ev[k].fd,
                        ev[k].event_type, ev[k].context);
                CHECK(!"every event carries its registration's context");
            }
            if (a >= 0) {
                CHECK_EQ(ev[k].fd, newfd[a][0]);
                if (a % 2)
                    CHECK(!"an empty new pipe reported an event");
                seen_new[a] = 1;
            } else {
                CHECK_EQ(ev[k].fd, hc.keep[b][0]);
                seen_keep[b] = 1;
            }
        }
        for (i = 0; i < HC_CLOSE; i += 2)
            CHECK(seen_new[i]);
        for (i = 0; i < HC_KEEP; i++)
            CHECK(seen_keep[i]);
    }
    for (i = 0; i < HC_CLOSE; i++) {
        CHECK_EQ(async_runtime_remove(hc.rt, newfd[i][0]), 0);
        close(newfd[i][0]);
        close(newfd[i][1]);
    }
    for (i = 0; i < HC_KEEP; i++) {
        CHECK_EQ(async_runtime_remove(hc.rt, hc.keep[i][0]), 0);
        close(hc.keep[i][0]);
        close(hc.keep[i][1]);
    }
    CHECK_EQ(collect(hc.rt, ev, 64, 50, 64), 0);
    async_runtime_deinit(hc.rt);
}

/* --- the host closes a registered fd that has a duplicate ---------------- */
/*
 * As above, but the open file lives on in a dup (as after dup2, fork, or
 * passing the fd to another process): the kernel's epoll keeps watching the
 * file under the old number, so until the number is reused, events with the
 * old context are allowed. Then checked: a new, empty pipe that got the old
 * number and was added is not reported readable (the old file's readiness
 * is not its); after its remove nothing is reported for the number; and a
 * wait meanwhile sleeps instead of spinning (the header: never a busy spin).
 * The problems are counted and reported together at the end.
 */


static void t_host_close_dup(void)
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[16];
    int p[2], q[2], dupfd, ctx_old, ctx_new, n, k, misattributed = 0, after_remove = 0;
    double t0, c0, wall, cpu;
    seed("host_close_dup");
    CHECK(pipe(p) == 0);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_old), 0);
    dupfd = dup(p[0]);
    CHECK(dupfd >= 0);
    close(p[0]); /* closed while registered; the file stays open through dupfd */
    CHECK(write(p[1], "x", 1) == 1);
    n = collect(rt, ev, 16, 100, 16);
    for (k = 0; k < n; k++) /* epoll still watches the file; poll reports the number closed */
        CHECK(ev[k].context == &ctx_old && ev[k].fd == p[0]);
    printf("host_close_dup: %d events for the closed, still registered number (%s)\n", n,
           n ? "with the old context: the host broke the remove-before-close rule" : "none");
    CHECK(pipe(q) == 0);
    CHECK_EQ(q[0], p[0]); /* the number is reused */
    CHECK_EQ(async_runtime_add(rt, q[0], ASYNC_EVENT_READ, &ctx_new), 0);
    n = collect(rt, ev, 16, 100, 16);
    for (k = 0; k < n; k++) {
        CHECK(ev[k].context == &ctx_new); /* nothing else is registered */
        misattributed++;
    }
    if (misattributed)
        fprintf(stderr, "the new, empty pipe on fd %d was reported readable %d times (the old file's readiness)\n",
                q[0], misattributed);
    CHECK_EQ(async_runtime_remove(rt, q[0]), 0);
    t0 = now_ms();
    c0 = cpu_ms();
    n = collect(rt, ev, 16, 300, 16);
    cpu = cpu_ms() - c0;
    wall = now_ms() - t0;
    for (k = 0; k < n; k++)
        fprintf(stderr, "after remove, fd %d: event type %#x context %p\n", ev[k].fd, ev[k].event_type,
                ev[k].context);
    after_remove = n;
    printf("host_close_dup: waits with nothing registered: %.0f ms CPU in %.0f ms\n", cpu, wall);
    if (cpu > wall / 2)
        fprintf(stderr, "the waits spun: %.0f ms of CPU in %.0f ms while nothing was registered\n", cpu, wall);
    close(dupfd);
    close(p[1]);
    close(q[0]);
    close(q[1]);
    async_runtime_deinit(rt);
    CHECK_EQ(misattributed, 0);
    CHECK_EQ(after_remove, 0);
    CHECK(cpu <= wall / 2);
}

/* --- deinit with pending work ------------------------------------------- */
/*
 * Deinit while the runtime holds 10000 undelivered completions, expired and
 * future timers, a repeating timer, readable registered fds and an attached
 * queue with messages (its completion pending). Checked: the runtime handle
 * is dead for every call; the fds are still open and can be added to a new
 * runtime; the queue keeps its messages, enqueue still works and posts
 * nothing, attach to the dead runtime is BADHANDLE, detach works, and
 * attaching to a new runtime posts one completion at once (non-empty); the
 * new runtime sees nothing of the old one's work.
 */
static void t_faults_deinit_pending(void)
{
    async_runtime_t *rt = mkrt(), *rt2;
    async_queue_t *q = async_queue_create(16, sizeof(int), ASYNC_QUEUE_SIGNAL_ON_DATA);
    io_event_t ev[16];
    uint64_t timer;
    int p[2], i, v, n;
    seed("deinit_pending");
    CHECK(q != NULL);
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], "x", 1) == 1);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0);
    CHECK_EQ(async_runtime_add(rt, p[1], ASYNC_EVENT_WRITE, NULL), 0);
    for (i = 0; i < 10000; i++)
        CHECK_EQ(async_runtime_post_completion(rt, 1, (uintptr_t)i), 0);
    for (i = 0; i < 50; i++)
        CHECK(async_runtime_add_timer(rt, (uint64_t)(i % 3 == 0 ? 0 : 100000), 0, 2) != 0);
    timer = async_runtime_add_timer(rt, 1, 1, 3);
    CHECK(timer != 0);
    CHECK_EQ(async_queue_attach(q, rt, 4), 0);
    for (v = 0; v < 3; v++)
        CHECK(async_queue_enqueue(q, &v, sizeof v));
    sleep_ms(20); /* timers expire undelivered */
    async_runtime_deinit(rt);
    /* the dead handle */
    CHECK_FAIL(async_runtime_post_completion(rt, 1, 1) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_wait(rt, ev, 16, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_cancel_timer(rt, timer) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_remove(rt, p[0]) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_queue_attach(q, rt, 5) == -1, ASYNC_E_BADHANDLE);
    /* the queue lives on */
    v = 3;
    CHECK(async_queue_enqueue(q, &v, sizeof v));
    CHECK_EQ(async_queue_attach(q, NULL, 0), 0);
    rt2 = mkrt();
    CHECK_EQ(collect(rt2, ev, 16, 50, 16), 0); /* nothing of the old runtime */
    CHECK_EQ(async_queue_attach(q, rt2, 6), 0);
    n = collect(rt2, ev, 16, 5000, 1);
    CHECK_EQ(n, 1);
    CHECK(ev[0].completion_key == 6 && ev[0].data == (uintptr_t)q);
    for (i = 0; i < 4; i++) {
        CHECK(async_queue_dequeue(q, &v, sizeof v, NULL));
        CHECK_EQ(v, i);
    }
    CHECK(async_queue_is_empty(q));
    /* the fds were not closed and can be registered again */
    CHECK(fcntl(p[0], F_GETFD) != -1 && fcntl(p[1], F_GETFD) != -1);
    CHECK_EQ(async_runtime_add(rt2, p[0], ASYNC_EVENT_READ, &v), 0);
    n = collect(rt2, ev, 16, 5000, 1);
    CHECK_EQ(n, 1);
    CHECK(ev[0].fd == p[0] && ev[0].context == &v);
    CHECK_EQ(async_runtime_remove(rt2, p[0]), 0);
    CHECK_EQ(collect(rt2, ev, 16, 50, 16), 0);
    async_queue_destroy(q);
    async_runtime_deinit(rt2);
    close(p[0]);
    close(p[1]);
}

/* --- deinit racing calls from threads ------------------------------------ */
/*
 * Rounds for about 2 s: a runtime with an attached DROP_OLDEST queue is hit
 * by 3 posting threads, a timer thread (add/cancel), a wakeup thread, an fd
 * thread (add/modify/remove), a queue writer and a waiting thread; the main
 * thread deinits it after a random 0..15 ms and at once creates a new
 * runtime (which may take the freed handle slot). Checked: every thread's
 * calls succeed until they fail, then fail with CLOSED (while the deinit is
 * under way) or BADHANDLE, never succeed again, and once the deinit has
 * returned fail with BADHANDLE; the queue is unaffected; the
 * new runtime receives none of the old one's completions or timers.
 */

enum { DR_POSTERS = 3 };
#define DR_KEY ((uintptr_t)0xD1ED)

static struct {
    async_runtime_t *rt;
    async_queue_t *q;
    atomic_int stop, failed, deinit_done;
    int fdpipe[2];
} dr;

/* Called after an op failed: CLOSED (deinit under way) or BADHANDLE; it never
 * succeeds again, and once deinit has returned it is BADHANDLE. */
static void dr_after_failure(int (*op)(uint32_t *), uint32_t *rs)
{
    int i, e = async_last_error();
    if (e != ASYNC_E_BADHANDLE && e != ASYNC_E_CLOSED) {
        fprintf(stderr, "a call on the dying runtime failed with %d (%s)\n", e, async_strerror(e));
        CHECK(!"CLOSED or BADHANDLE");
    }
    for (i = 0; i < 50 || !atomic_load(&dr.deinit_done); i++) {
        bool after = atomic_load(&dr.deinit_done);
        async_clear_error();
        CHECK(op(rs) != 0); /* never succeeds again */
        e = async_last_error();
        CHECK(e == ASYNC_E_BADHANDLE || (!after && e == ASYNC_E_CLOSED));
    }
    atomic_fetch_add(&dr.failed, 1);
}

static int dr_post(uint32_t *rs)
{
    return async_runtime_post_completion(dr.rt, DR_KEY, rnd_r(rs, 1000));
}

static int dr_timer(uint32_t *rs)
{
    uint64_t id = async_runtime_add_timer(dr.rt, rnd_r(rs, 3), rnd_r(rs, 2), DR_KEY);
    if (id == 0)
        return -1;
    if (rnd_r(rs, 2) && async_runtime_cancel_timer(dr.rt, id) != 0 && async_last_error() != ASYNC_E_NOTFOUND)
        return -1; /* NOTFOUND: the waiter delivered it */
    return 0;
}

static int dr_wakeup(uint32_t *rs)
{
    (void)rs;
    return async_runtime_wakeup(dr.rt);
}

static int dr_fd(uint32_t *rs)
{
    if (async_runtime_add(dr.rt, dr.fdpipe[0], ASYNC_EVENT_READ, NULL) != 0)
        return -1;
    if (rnd_r(rs, 2) && async_runtime_modify(dr.rt, dr.fdpipe[0], ASYNC_EVENT_READ | ASYNC_EVENT_WRITE) != 0)
        return -1;
    return async_runtime_remove(dr.rt, dr.fdpipe[0]);
}

static void *dr_thread(void *arg)
{
    int (*op)(uint32_t *) = (int (*)(uint32_t *))arg;
    uint32_t rs = (uint32_t)(uintptr_t)&rs;
    while (!atomic_load(&dr.stop)) {
        if (op(&rs) != 0) {
            dr_after_failure(op, &rs);
            return NULL;
        }
    }
    CHECK(!"stopped before the runtime was gone");
    return NULL;
}

static void *dr_waiter(void *arg)
{
    io_event_t ev[8];
    uint32_t rs = (uint32_t)(uintptr_t)&rs;
    (void)arg;
    for (;;) {
        int n = async_runtime_wait(dr.rt, ev, 8, rnd_r(&rs, 3) == 0 ? -1 : 5);
        if (n < 0) {
            CHECK(async_last_error() == ASYNC_E_CLOSED || async_last_error() == ASYNC_E_BADHANDLE);
            atomic_fetch_add(&dr.failed, 1);
            return NULL;
        }
    }
}

static void *dr_writer(void *arg)
{
    int v = 0;
    (void)arg;
    while (!atomic_load(&dr.stop)) {
        CHECK(async_queue_enqueue(dr.q, &v, sizeof v)); /* the queue is not affected */
        v++;
        if (v % 64 == 0)
            sched_yield();
    }
    return NULL;
}

static void t_faults_deinit_race(void)
{
    int (*ops[])(uint32_t *) = {dr_post, dr_post, dr_post, dr_timer, dr_wakeup, dr_fd};
    enum { NOPS = sizeof ops / sizeof ops[0] };
    double deadline;
    int rounds = 0, i;
    seed("deinit_race");
    deadline = now_ms() + 2000;
    CHECK(pipe(dr.fdpipe) == 0);
    dr.q = async_queue_create(8, sizeof(int), (async_queue_flags_t)(ASYNC_QUEUE_DROP_OLDEST | ASYNC_QUEUE_SIGNAL_ON_DATA));
    CHECK(dr.q != NULL);
    do {
        pthread_t th[NOPS], waiter, writer;
        async_runtime_t *rt2;
        io_event_t ev[64];
        int n, k;
        dr.rt = mkrt();
        CHECK_EQ(async_queue_attach(dr.q, dr.rt, DR_KEY), 0);
        atomic_store(&dr.stop, 0);
        atomic_store(&dr.failed, 0);
        atomic_store(&dr.deinit_done, 0);
        for (i = 0; i < NOPS; i++)
            start_thread(&th[i], dr_thread, (void *)ops[i]);
        start_thread(&waiter, dr_waiter, NULL);
        start_thread(&writer, dr_writer, NULL);
        sleep_ms((int)rnd(16));
        async_runtime_deinit(dr.rt);
        atomic_store(&dr.deinit_done, 1);
        rt2 = mkrt(); /* may reuse the slot: the old handle must not reach it */
        for (i = 0; i < NOPS; i++)
            join_within(th[i], 10000, "a thread calling the dying runtime");
        join_within(waiter, 10000, "the waiter");
        atomic_store(&dr.stop, 1);
        join_within(writer, 10000, "the queue writer");
        CHECK_EQ(atomic_load(&dr.failed), NOPS + 1);
        n = collect(rt2, ev, 64, 20, 64);
        for (k = 0; k < n; k++)
            fprintf(stderr, "the new runtime got key %#llx type %#x\n", (unsigned long long)ev[k].completion_key,
                    ev[k].event_type);
        CHECK_EQ(n, 0);
        CHECK(async_queue_enqueue(dr.q, &n, sizeof n)); /* detached by the deinit: posts nothing */
        CHECK_EQ(collect(rt2, ev, 64, 5, 64), 0);
        async_runtime_deinit(rt2);
        async_queue_clear(dr.q);
        rounds++;
    } while (now_ms() < deadline);
    printf("deinit_race: %d rounds\n", rounds);
    async_queue_destroy(dr.q);
    close(dr.fdpipe[0]);
    close(dr.fdpipe[1]);
}

/* --- queue destroy racing blocked readers and writers ---------------------- */
/*
 * Rounds for about 2 s of three kinds: readers blocked on an empty queue,
 * writers blocked on a full BLOCK_WRITER queue, or both sides busy; 4
 * readers and 4 writers are threads, 2 more are fibers (their queue waits
 * park). The queue is destroyed after a random delay. Checked: every blocked
 * call returns false with CLOSED (or BADHANDLE if it started after the
 * destroy) within 10 s; in the first two kinds, where everyone is surely
 * blocked (these use no timeouts), CLOSED exactly.
 */

enum { QD_READERS = 4, QD_WRITERS = 4 };

static struct {
    async_queue_t *q;
    int kind; /* 0: readers only, 1: writers only, 2: both */
    atomic_int closed, badhandle, blocked_ok;
    atomic_int tids[QD_READERS + QD_WRITERS], ntids;
} qd;

/* true if the thread is asleep (S or D in /proc/self/task/<tid>/stat). */
static bool thread_asleep(int tid)
{
    char path[64], buf[512], *p;
    FILE *f;
    size_t n;
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    f = fopen(path, "r");
    if (!f)
        return false;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    p = strrchr(buf, ')'); /* the state follows the command name */
    return p && (p[2] == 'S' || p[2] == 'D');
}

/* Waits until every reader/writer thread has been asleep for 3 samples in a
 * row: then each is blocked in its queue call (nothing else sleeps). */
static void qd_wait_all_asleep(int nthreads)
{
    double t0 = now_ms();
    int streak = 0;
    while (streak < 3) {
        int i, asleep = atomic_load(&qd.ntids) == nthreads;
        for (i = 0; asleep && i < nthreads; i++)
            asleep = thread_asleep(atomic_load(&qd.tids[i]));
        streak = asleep ? streak + 1 : 0;
        CHECK(now_ms() - t0 < 10000);
        sleep_ms(5);
    }
}

static void qd_register_thread(void)
{
    int i = atomic_fetch_add(&qd.ntids, 1);
    atomic_store(&qd.tids[i], (int)gettid());
}

static void qd_note(const char *who)
{
    int e = async_last_error();
    if (qd.kind != 2 && e != ASYNC_E_CLOSED)
        fprintf(stderr, "round kind %d: a blocked %s got %d (%s)\n", qd.kind, who, e, async_strerror(e));
    if (e == ASYNC_E_CLOSED)
        atomic_fetch_add(&qd.closed, 1);
    else if (e == ASYNC_E_BADHANDLE)
        atomic_fetch_add(&qd.badhandle, 1);
    else {
        fprintf(stderr, "queue call failed with %d (%s)\n", e, async_strerror(e));
        CHECK(!"CLOSED or BADHANDLE");
    }
}

static void qd_read_loop(void)
{
    uint64_t v;
    uint32_t rs = (uint32_t)(uintptr_t)&v;
    for (;;) {
        int to = qd.kind != 2 || rnd_r(&rs, 2) ? -1 : 1 + (int)rnd_r(&rs, 5);
        if (async_queue_dequeue_wait(qd.q, &v, sizeof v, NULL, to)) {
            atomic_fetch_add(&qd.blocked_ok, 1);
            continue;
        }
        if (async_last_error() == ASYNC_E_TIMEDOUT)
            continue;
        qd_note(async_fiber_current() ? "reader fiber" : "reader thread");
        return;
    }
}

static void qd_write_loop(void)
{
    uint64_t v = 1;
    uint32_t rs = (uint32_t)(uintptr_t)&v;
    for (;;) {
        bool ok = rnd_r(&rs, 2) ? async_queue_enqueue(qd.q, &v, sizeof v)
                                : async_queue_enqueue_wait(qd.q, &v, sizeof v, qd.kind != 2 || rnd_r(&rs, 2) ? -1 : 3);
        if (ok)
            continue;
        if (async_last_error() == ASYNC_E_TIMEDOUT)
            continue;
        qd_note(async_fiber_current() ? "writer fiber" : "writer thread");
        return;
    }
}

static void *qd_reader(void *a)
{
    (void)a;
    qd_register_thread();
    qd_read_loop();
    return NULL;
}

static void *qd_writer(void *a)
{
    (void)a;
    qd_register_thread();
    qd_write_loop();
    return NULL;
}

static void qd_fiber(void *a)
{
    if ((intptr_t)a == 0)
        qd_read_loop();
    else
        qd_write_loop();
}

static void t_queue_destroy_race(void)
{
    async_sched_config_t cfg = {2, 0, 0};
    async_sched_t *s = async_sched_create(&cfg);
    double deadline;
    int rounds = 0, i;
    seed("queue_destroy_race");
    CHECK(s != NULL);
    deadline = now_ms() + 2000;
    do {
        pthread_t rd[QD_READERS], wr[QD_WRITERS];
        async_fiber_t *f[2];
        int nr, nw, nf = 0, expect;
        qd.kind = rounds % 3;
        qd.q = async_queue_create(1 + rnd(4), sizeof(uint64_t), ASYNC_QUEUE_BLOCK_WRITER);
        CHECK(qd.q != NULL);
        atomic_store(&qd.closed, 0);
        atomic_store(&qd.badhandle, 0);
        atomic_store(&qd.ntids, 0);
        nr = qd.kind == 1 ? 0 : QD_READERS;
        nw = qd.kind == 0 ? 0 : QD_WRITERS;
        for (i = 0; i < nr; i++)
            start_thread(&rd[i], qd_reader, NULL);
        for (i = 0; i < nw; i++)
            start_thread(&wr[i], qd_writer, NULL);
        if (qd.kind != 1)
            CHECK((f[nf++] = async_fiber_spawn(s, qd_fiber, (void *)0, ASYNC_FIBER_JOINABLE)) != NULL);
        if (qd.kind != 0)
            CHECK((f[nf++] = async_fiber_spawn(s, qd_fiber, (void *)1, ASYNC_FIBER_JOINABLE)) != NULL);
        if (qd.kind != 2) {
            /* make sure every caller is blocked: the fibers parked, the threads asleep */
            async_sched_stats_t st;
            double t0 = now_ms();
            do {
                CHECK(now_ms() - t0 < 10000);
                sleep_ms(5);
                CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
            } while (st.fibers_parked < (size_t)nf);
            qd_wait_all_asleep(nr + nw);
        } else {
            sleep_ms((int)rnd(20));
        }
        async_queue_destroy(qd.q);
        for (i = 0; i < nr; i++)
            join_within(rd[i], 10000, "a reader blocked on the destroyed queue");
        for (i = 0; i < nw; i++)
            join_within(wr[i], 10000, "a writer blocked on the destroyed queue");
        for (i = 0; i < nf; i++)
            CHECK_EQ(async_fiber_join(f[i], 10000), 0);
        expect = nr + nw + nf;
        CHECK_EQ(atomic_load(&qd.closed) + atomic_load(&qd.badhandle), expect);
        if (qd.kind != 2) /* everyone was surely blocked (no timeouts in these kinds) */
            CHECK_EQ(atomic_load(&qd.closed), expect);
        rounds++;
    } while (now_ms() < deadline);
    printf("queue_destroy_race: %d rounds, %d messages passed\n", rounds, atomic_load(&qd.blocked_ok));
    async_sched_destroy(s);
}

/* --- fork while other threads are inside libasync -------------------------- */
/*
 * Load in the parent: a thread in async_runtime_wait, two posting threads, a
 * queue reader in dequeue_wait(-1) and a writer, a worker adding and
 * cancelling timers, and a scheduler whose fibers ping-pong on channels,
 * sleep and park in chan_recv. The main thread forks 6 times at random
 * moments. In the child every libasync call (including ones that would block
 * forever) fails at once with ASYNC_E_FORKED, then the child execs: /bin/true,
 * or this test binary (case exec_child), which uses libasync normally. The
 * parent checks each child's exit status (a hang is killed after 15 s) and
 * that its own load ran on undisturbed.
 */

static struct {
    async_runtime_t *rt, *rt_timers;
    async_queue_t *q;
    async_sched_t *s;
    async_chan_t *ping, *pong, *idle;
    async_worker_t *w;
    atomic_int stop;
    _Atomic uint64_t posted, got, qsent, qgot, pings;
    char self[4096];
} fb;

#define FB_END ((uintptr_t)0xE0D)

/* Until FB_END, then until the posters' completions are all in (FIFO holds
 * per posting thread only: FB_END may overtake them). */
static void *fb_waiter(void *a)
{
    io_event_t ev[64];
    bool end = false;
    double t_end = 0;
    (void)a;
    while (!end || atomic_load(&fb.got) < atomic_load(&fb.posted)) {
        int n = async_runtime_wait(fb.rt, ev, 64, end ? 100 : -1), k;
        CHECK(n >= 0);
        CHECK(!end || now_ms() - t_end < 10000);
        for (k = 0; k < n; k++) {
            if (ev[k].completion_key == FB_END) {
                end = true;
                t_end = now_ms();
                continue;
            }
            atomic_fetch_add(&fb.got, 1);
        }
    }
    return NULL;
}

static void *fb_poster(void *a)
{
    (void)a;
    while (!atomic_load(&fb.stop)) {
        CHECK_EQ(async_runtime_post_completion(fb.rt, 1, 2), 0);
        if (atomic_fetch_add(&fb.posted, 1) % 256 == 0)
            sleep_ms(1);
    }
    return NULL;
}

static void *fb_qreader(void *a)
{
    uint64_t v;
    (void)a;
    for (;;) {
        CHECK(async_queue_dequeue_wait(fb.q, &v, sizeof v, NULL, -1));
        if (v == UINT64_MAX)
            return NULL;
        atomic_fetch_add(&fb.qgot, 1);
    }
}

static void *fb_qwriter(void *a)
{
    uint64_t v = 0;
    (void)a;
    while (!atomic_load(&fb.stop)) {
        CHECK(async_queue_enqueue(fb.q, &v, sizeof v));
        atomic_fetch_add(&fb.qsent, 1);
        v++;
        if (v % 64 == 0)
            sleep_ms(1);
    }
    v = UINT64_MAX;
    CHECK(async_queue_enqueue(fb.q, &v, sizeof v));
    return NULL;
}

static void *fb_worker(void *a)
{
    async_worker_t *self = async_worker_current();
    (void)a;
    while (!async_worker_should_stop(self)) {
        uint64_t id = async_runtime_add_timer(fb.rt_timers, 1000000, 0, 1);
        CHECK(id != 0);
        CHECK_EQ(async_runtime_cancel_timer(fb.rt_timers, id), 0);
    }
    return (void *)(uintptr_t)0x600D;
}

static void fb_pinger(void *a)
{
    int v = 0;
    (void)a;
    while (!atomic_load(&fb.stop)) {
        if (async_chan_send(fb.ping, &v, -1) != 0 || async_chan_recv(fb.pong, &v, -1) != 0)
            break;
        atomic_fetch_add(&fb.pings, 1);
        if (v % 100 == 0)
            async_fiber_sleep(1);
    }
    async_chan_close(fb.ping);
}

static void fb_ponger(void *a)
{
    int v;
    (void)a;
    while (async_chan_recv(fb.ping, &v, -1) == 0) {
        v++;
        if (async_chan_send(fb.pong, &v, -1) != 0)
            break;
    }
}

static void fb_idler(void *a)
{
    int v;
    (void)a;
    CHECK_FAIL(async_chan_recv(fb.idle, &v, -1) == -1, ASYNC_E_CLOSED);
}

static void nop_fiber(void *a)
{
    (void)a;
}

static void *nop_proc(void *a)
{
    return a;
}

/* Child side: no stdio, no locks; the exit code names the failed check. */
#define CHILD_CHECK(n, expr)                                                                                   \
    do {                                                                                                       \
        if (!(expr))                                                                                           \
            _exit(n);                                                                                          \
    } while (0)
#define CHILD_FORKED(n, expr) CHILD_CHECK(n, (expr) && async_last_error() == ASYNC_E_FORKED)

static void fb_child(int round)
{
    io_event_t ev[4];
    uint64_t v = 0;
    int x = 0, p[2];
    async_chan_op_t op = {fb.ping, ASYNC_CHAN_RECV, &x, 0};
    double t0 = now_ms();
    async_clear_error();
    CHILD_FORKED(10, async_runtime_wait(fb.rt, ev, 4, -1) == -1);
    CHILD_FORKED(11, async_runtime_post_completion(fb.rt, 1, 1) == -1);
    CHILD_FORKED(12, async_runtime_add_timer(fb.rt, 1, 0, 1) == 0);
    CHILD_FORKED(13, async_runtime_wakeup(fb.rt) == -1);
    CHILD_FORKED(14, !async_queue_dequeue_wait(fb.q, &v, sizeof v, NULL, -1));
    CHILD_FORKED(15, !async_queue_enqueue_wait(fb.q, &v, sizeof v, -1));
    CHILD_FORKED(16, !async_worker_join(fb.w, -1));
    CHILD_FORKED(17, async_worker_create(nop_proc, NULL, 0) == NULL);
    CHILD_FORKED(18, async_runtime_init() == NULL);
    CHILD_FORKED(19, async_queue_create(1, 1, (async_queue_flags_t)0) == NULL);
    CHILD_FORKED(20, async_sched_create(NULL) == NULL);
    CHILD_FORKED(21, async_fiber_spawn(fb.s, nop_fiber, NULL, 0) == NULL);
    CHILD_FORKED(22, async_chan_recv(fb.idle, &x, -1) == -1);
    CHILD_FORKED(23, async_chan_send(fb.ping, &x, -1) == -1);
    CHILD_FORKED(24, async_chan_select(&op, 1, -1) == -1);
    CHILD_FORKED(25, async_sched_run(fb.s) == -1);
    CHILD_FORKED(26, async_sched_shutdown(fb.s, -1) == -1);
    CHILD_FORKED(27, async_fiber_sleep(1000000) == -1);
    CHILD_CHECK(28, pipe(p) == 0);
    CHILD_FORKED(29, async_fiber_wait_fd(p[0], ASYNC_EVENT_READ, -1) == -1);
    CHILD_FORKED(30, async_fiber_read(p[0], &x, 1, -1) == -1);
    CHILD_FORKED(31, async_fiber_blocking(nop_fiber, NULL) == -1);
    CHILD_FORKED(32, async_chan_create(1, 1) == NULL);
    async_clear_error();
    async_sched_destroy(fb.s); /* void: must return at once, touching nothing */
    CHILD_CHECK(33, async_last_error() == ASYNC_E_FORKED);
    async_clear_error();
    async_runtime_deinit(fb.rt);
    CHILD_CHECK(34, async_last_error() == ASYNC_E_FORKED);
    CHILD_CHECK(35, async_worker_current() == NULL && async_fiber_current() == NULL);
    CHILD_CHECK(36, now_ms() - t0 < 10000); /* at once, not after some timeout */
    if (round % 2 == 0) {
        char *argv[] = {(char *)"true", NULL};
        execv("/bin/true", argv);
    } else {
        /* Under qemu-user (no binfmt) this binary can only be started
         * through the emulator: ASYNC_TEST_EMULATOR names it. */
        char *emu = getenv("ASYNC_TEST_EMULATOR");
        if (emu && *emu) {
            char *eargv[] = {emu, fb.self, (char *)"exec_child", NULL};
            execvp(emu, eargv);
        } else {
            char *argv[] = {fb.self, (char *)"exec_child", NULL};
            execv(fb.self, argv);
        }
    }
    _exit(99); /* exec failed */
}

static void fb_fork(int round)
{
    pid_t pid;
    int status = 0;
    double t0;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        fb_child(round);
    t0 = now_ms();
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        CHECK(r != -1);
        if (r == pid)
            break;
        if (now_ms() - t0 > 15000) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            CHECK(!"the child hung");
        }
        sleep_ms(2);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "child %d: %s %d (exit code N: CHILD_CHECK N in fb_child failed)\n", round,
                WIFEXITED(status) ? "exit code" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
}

static void t_fork_busy(void)
{
    async_sched_config_t cfg = {2, 0, 0};
    pthread_t waiter, posters[2], qr, qw;
    ssize_t len;
    int i;
    seed("fork_busy");
    len = readlink("/proc/self/exe", fb.self, sizeof fb.self - 1);
    CHECK(len > 0);
    fb.self[len] = 0;
    fb.rt = mkrt();
    fb.rt_timers = mkrt();
    fb.q = async_queue_create(8, sizeof(uint64_t), ASYNC_QUEUE_BLOCK_WRITER);
    fb.s = async_sched_create(&cfg);
    fb.ping = async_chan_create(0, sizeof(int));
    fb.pong = async_chan_create(0, sizeof(int));
    fb.idle = async_chan_create(1, sizeof(int));
    CHECK(fb.q && fb.s && fb.ping && fb.pong && fb.idle);
    start_thread(&waiter, fb_waiter, NULL);
    for (i = 0; i < 2; i++)
        start_thread(&posters[i], fb_poster, NULL);
    start_thread(&qr, fb_qreader, NULL);
    start_thread(&qw, fb_qwriter, NULL);
    fb.w = async_worker_create(fb_worker, NULL, 0);
    CHECK(fb.w != NULL);
    CHECK(async_fiber_spawn(fb.s, fb_pinger, NULL, 0));
    CHECK(async_fiber_spawn(fb.s, fb_ponger, NULL, 0));
    for (i = 0; i < 4; i++)
        CHECK(async_fiber_spawn(fb.s, fb_idler, NULL, 0));
    for (i = 0; i < 6; i++) {
        sleep_ms(5 + (int)rnd(40));
        fb_fork(i);
    }
    /* the parent's load went on */
    atomic_store(&fb.stop, 1);
    for (i = 0; i < 2; i++)
        join_within(posters[i], 10000, "a poster");
    CHECK_EQ(async_runtime_post_completion(fb.rt, FB_END, 0), 0);
    join_within(waiter, 10000, "the waiter");
    CHECK_EQ(atomic_load(&fb.got), atomic_load(&fb.posted));
    join_within(qw, 10000, "the queue writer");
    join_within(qr, 10000, "the queue reader");
    CHECK_EQ(atomic_load(&fb.qgot), atomic_load(&fb.qsent));
    async_worker_signal_stop(fb.w);
    CHECK(async_worker_join(fb.w, 10000));
    CHECK(async_worker_result(fb.w) == (void *)(uintptr_t)0x600D);
    async_worker_destroy(fb.w);
    async_chan_close(fb.idle);
    CHECK_EQ(async_sched_run(fb.s), 0);
    printf("fork_busy: 6 children; parent meanwhile: %llu completions, %llu queue messages, %llu ping-pongs\n",
           (unsigned long long)atomic_load(&fb.got), (unsigned long long)atomic_load(&fb.qgot),
           (unsigned long long)atomic_load(&fb.pings));
    CHECK(atomic_load(&fb.pings) > 0 && atomic_load(&fb.got) > 0 && atomic_load(&fb.qgot) > 0);
    async_sched_destroy(fb.s);
    async_chan_destroy(fb.ping);
    async_chan_destroy(fb.pong);
    async_chan_destroy(fb.idle);
    async_queue_destroy(fb.q);
    async_runtime_deinit(fb.rt);
    async_runtime_deinit(fb.rt_timers);
}

/* Not a ctest case: what fork_busy's children exec. libasync works as usual
 * in the new image. */
static void child_fiber(void *a)
{
    CHECK_EQ(async_fiber_sleep(1), 0);
    CHECK_EQ(async_runtime_post_completion((async_runtime_t *)a, 5, 6), 0);
}

static void t_exec_child(void)
{
    async_runtime_t *rt = mkrt();
    async_sched_t *s = async_sched_create(NULL);
    io_event_t ev[2];
    CHECK(s != NULL);
    CHECK(async_fiber_spawn(s, child_fiber, rt, 0));
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(collect(rt, ev, 2, 5000, 1), 1);
    CHECK(ev[0].completion_key == 5 && ev[0].data == 6);
    async_sched_destroy(s);
    async_runtime_deinit(rt);
}

/* --- a blocking call on a fiber that hangs --------------------------------- */
/*
 * One fiber sits in async_fiber_blocking() on a function that blocks until
 * the test releases it; 20 others are parked (channel, sleep, fd wait, join).
 * Checked: async_sched_shutdown with a timeout returns TIMEDOUT (the blocking
 * job is not interruptible, as documented) but every parked fiber has
 * returned with CANCELLED; new spawns fail with CANCELLED; once the job is
 * released the fiber unwinds (its next park is CANCELLED) and shutdown
 * returns 0; destroy completes.
 */

static struct {
    int gate[2], fdwait[2];
    async_chan_t *ch;
    atomic_int cancelled, blocking_done, after_blocking_err;
    async_fiber_t *sleeper;
} bh;

static void bh_hang(void *a)
{
    char c;
    (void)a;
    CHECK(read(bh.gate[0], &c, 1) == 1); /* blocks until released */
}

static void bh_blocker(void *a)
{
    (void)a;
    CHECK_EQ(async_fiber_blocking(bh_hang, NULL), 0);
    atomic_store(&bh.blocking_done, 1);
    async_clear_error();
    CHECK_EQ(async_fiber_sleep(1), -1);
    atomic_store(&bh.after_blocking_err, async_last_error());
}

static void bh_parker(void *a)
{
    int i = (int)(intptr_t)a, v, rc;
    if (i == 2) /* one waiter per fd and one joiner per fiber at a time */
        rc = async_fiber_wait_fd(bh.fdwait[0], ASYNC_EVENT_READ, -1);
    else if (i == 3)
        rc = async_fiber_join(bh.sleeper, -1);
    else if (i % 2)
        rc = async_fiber_sleep(3600 * 1000);
    else
        rc = async_chan_recv(bh.ch, &v, -1);
    CHECK_EQ(rc, -1);
    CHECK_ERR(ASYNC_E_CANCELLED);
    atomic_fetch_add(&bh.cancelled, 1);
}

static void bh_long_sleep(void *a)
{
    (void)a;
    CHECK_FAIL(async_fiber_sleep(3600 * 1000) == -1, ASYNC_E_CANCELLED);
}

static void t_fiber_blocking_hangs(void)
{
    async_sched_config_t cfg = {2, 0, 0};
    async_sched_t *s = async_sched_create(&cfg);
    async_sched_stats_t st;
    double t0;
    int i;
    CHECK(s != NULL);
    CHECK(pipe(bh.gate) == 0 && pipe(bh.fdwait) == 0);
    bh.ch = async_chan_create(0, sizeof(int));
    CHECK(bh.ch != NULL);
    bh.sleeper = async_fiber_spawn(s, bh_long_sleep, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(bh.sleeper != NULL);
    CHECK(async_fiber_spawn(s, bh_blocker, NULL, 0));
    for (i = 0; i < 20; i++)
        CHECK(async_fiber_spawn(s, bh_parker, (void *)(intptr_t)i, 0));
    t0 = now_ms();
    for (;;) { /* all parked */
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        if (st.fibers_parked == 22 || now_ms() - t0 > 30000)
            break;
        sleep_ms(5);
    }
    CHECK_EQ(st.fibers_parked, 22);
    t0 = now_ms();
    CHECK_FAIL(async_sched_shutdown(s, 300) == -1, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 299);
    /* the 20 parked fibers were woken with CANCELLED; on a loaded host they
     * may still be unwinding when the 300 ms are over */
    t0 = now_ms();
    while (atomic_load(&bh.cancelled) < 20 && now_ms() - t0 < 30000)
        sleep_ms(2);
    CHECK_EQ(atomic_load(&bh.cancelled), 20);
    CHECK_EQ(atomic_load(&bh.blocking_done), 0);
    CHECK_FAIL(async_fiber_spawn(s, nop_fiber, NULL, 0) == NULL, ASYNC_E_CANCELLED);
    CHECK(write(bh.gate[1], "g", 1) == 1); /* release the hung call */
    CHECK_EQ(async_sched_shutdown(s, 10000), 0);
    CHECK_EQ(atomic_load(&bh.blocking_done), 1);
    CHECK_EQ(atomic_load(&bh.after_blocking_err), ASYNC_E_CANCELLED);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    async_chan_destroy(bh.ch);
    close(bh.gate[0]);
    close(bh.gate[1]);
    close(bh.fdwait[0]);
    close(bh.fdwait[1]);
}

/* --- scheduler shutdown in the middle of a load ------------------------------ */
/*
 * Rounds for about 2 s: 200 fibers of eight kinds (ping and pong on two
 * rendezvous channels, consumers of a buffered channel a thread feeds,
 * sleepers, readers of pipes a thread writes, queue waiters, spawn+join
 * loops, yielders) and a thread feeding them; async_sched_shutdown(s, 10000) after a random
 * 5..100 ms. Checked: shutdown returns 0 (every fiber returned); each fiber
 * ended either normally or on CANCELLED (no other error); spawned = finished;
 * later spawns fail with CANCELLED; every element a send reported as sent was
 * received by a fiber or is still in the channel (drained afterwards).
 */

enum { SD_FIBERS = 200 };

static struct {
    async_sched_t *s;
    async_chan_t *pp[2], *feed;
    async_queue_t *q;
    int pipes[SD_FIBERS / 8][2]; /* one per fd-reading fiber: one reader per fd */
    atomic_int stop, cancelled, other_err;
    _Atomic uint64_t fed, eaten, pp_sent, pp_got;
} sd;

static void sd_end(int rc)
{
    if (rc == 0)
        return;
    if (async_last_error() == ASYNC_E_CANCELLED)
        atomic_fetch_add(&sd.cancelled, 1);
    else {
        fprintf(stderr, "fiber ended on error %d (%s)\n", async_last_error(), async_strerror(async_last_error()));
        atomic_fetch_add(&sd.other_err, 1);
    }
}

static void sd_child(void *a)
{
    (void)a;
    async_fiber_yield();
}

static void sd_fiber(void *a)
{
    int kind = (int)(intptr_t)a % 8, v = 0, rc = 0;
    uint64_t u;
    switch (kind) {
    case 0: /* ping */
    case 1: /* pong */
        for (;;) {
            async_chan_t *in = sd.pp[kind == 0], *out = sd.pp[kind];
            if (kind == 0 || v > 0) {
                if ((rc = async_chan_send(out, &v, -1)) != 0)
                    break;
                atomic_fetch_add(&sd.pp_sent, 1);
            }
            if ((rc = async_chan_recv(in, &v, -1)) != 0)
                break;
            atomic_fetch_add(&sd.pp_got, 1);
            v++;
        }
        break;
    case 2:
        while ((rc = async_chan_recv(sd.feed, &v, -1)) == 0)
            atomic_fetch_add(&sd.eaten, 1);
        break;
    case 3:
        while ((rc = async_fiber_sleep(1 + (uint64_t)(v++ % 5))) == 0) {
        }
        break;
    case 4: {
        char buf[16];
        int fd = sd.pipes[(intptr_t)a / 8][0];
        ssize_t r;
        while ((r = async_fiber_read(fd, buf, sizeof buf, 50)) > 0 || (r < 0 && async_last_error() == ASYNC_E_TIMEDOUT)) {
        }
        rc = r < 0 ? -1 : 0;
        break;
    }
    case 5:
        while ((rc = async_queue_dequeue_wait(sd.q, &u, sizeof u, NULL, 20) ? 0 : -1) == 0 ||
               async_last_error() == ASYNC_E_TIMEDOUT) {
        }
        break;
    case 6: {
        async_fiber_t *f;
        while ((f = async_fiber_spawn(sd.s, sd_child, NULL, ASYNC_FIBER_JOINABLE)) != NULL)
            if ((rc = async_fiber_join(f, -1)) != 0)
                break;
        if (f == NULL)
            rc = -1;
        break;
    }
    default:
        for (v = 0; v < 200000; v++) {
            async_fiber_yield();
            if (async_fiber_sleep(0) != 0) {
                rc = -1;
                break;
            }
        }
        break;
    }
    sd_end(rc);
}

static void *sd_feeder(void *a)
{
    int v = 0;
    uint64_t u = 0;
    (void)a;
    while (!atomic_load(&sd.stop)) {
        int i;
        if (async_chan_send(sd.feed, &v, 2) == 0)
            atomic_fetch_add(&sd.fed, 1);
        CHECK(async_queue_enqueue(sd.q, &u, sizeof u)); /* DROP_OLDEST: never blocks */
        for (i = 0; i < SD_FIBERS / 8; i++)
            if (write(sd.pipes[i][1], "p", 1) < 0)
                CHECK(errno == EAGAIN);
        sleep_ms(1);
    }
    return NULL;
}

static void t_fiber_shutdown_mid_load(void)
{
    double deadline;
    int rounds = 0;
    seed("fiber_shutdown_mid_load");
    deadline = now_ms() + 2000;
    for (int i = 0; i < SD_FIBERS / 8; i++)
        CHECK(pipe2(sd.pipes[i], O_NONBLOCK | O_CLOEXEC) == 0);
    do {
        async_sched_config_t cfg = {2, 32 * 1024, 0};
        async_sched_stats_t st;
        pthread_t feeder;
        int i, v;
        sd.s = async_sched_create(&cfg);
        sd.pp[0] = async_chan_create(0, sizeof(int));
        sd.pp[1] = async_chan_create(0, sizeof(int));
        sd.feed = async_chan_create(8, sizeof(int));
        sd.q = async_queue_create(8, sizeof(uint64_t), ASYNC_QUEUE_DROP_OLDEST);
        CHECK(sd.s && sd.pp[0] && sd.pp[1] && sd.feed && sd.q);
        atomic_store(&sd.stop, 0);
        atomic_store(&sd.fed, 0);
        atomic_store(&sd.eaten, 0);
        atomic_store(&sd.pp_sent, 0);
        atomic_store(&sd.pp_got, 0);
        start_thread(&feeder, sd_feeder, NULL);
        for (i = 0; i < SD_FIBERS; i++)
            CHECK(async_fiber_spawn(sd.s, sd_fiber, (void *)(intptr_t)i, 0));
        sleep_ms(5 + (int)rnd(95));
        CHECK_EQ(async_sched_shutdown(sd.s, 10000), 0);
        CHECK_FAIL(async_fiber_spawn(sd.s, nop_fiber, NULL, 0) == NULL, ASYNC_E_CANCELLED);
        CHECK_EQ(async_sched_run(sd.s), 0);
        CHECK_EQ(async_sched_get_stats(sd.s, &st, NULL, 0), 0);
        CHECK_EQ(st.fibers_spawned, st.fibers_finished);
        CHECK_EQ(st.fibers_runnable + st.fibers_running + st.fibers_parked, 0);
        atomic_store(&sd.stop, 1);
        join_within(feeder, 10000, "the feeder");
        /* what was sent was received, or is still there */
        while (async_chan_try_recv(sd.feed, &v) == 0)
            atomic_fetch_add(&sd.eaten, 1);
        CHECK_EQ(atomic_load(&sd.eaten), atomic_load(&sd.fed));
        CHECK_EQ(atomic_load(&sd.pp_got), atomic_load(&sd.pp_sent)); /* rendezvous: a completed send was taken */
        async_sched_destroy(sd.s);
        async_chan_destroy(sd.pp[0]);
        async_chan_destroy(sd.pp[1]);
        async_chan_destroy(sd.feed);
        async_queue_destroy(sd.q);
        rounds++;
    } while (now_ms() < deadline);
    printf("fiber_shutdown_mid_load: %d rounds, %d parked calls cancelled\n", rounds, atomic_load(&sd.cancelled));
    CHECK_EQ(atomic_load(&sd.other_err), 0);
    CHECK(atomic_load(&sd.cancelled) > 0);
    for (int i = 0; i < SD_FIBERS / 8; i++) {
        close(sd.pipes[i][0]);
        close(sd.pipes[i][1]);
    }
}

/* --- bad values for every public function ---------------------------------- */
/*
 * Handles are covered by test_badinput (NULL, destroyed, bogus, wrong type)
 * and test_fiber's badinput; this is the value side: timeouts below -1
 * (-2 and INT_MIN), zero and huge sizes, NULL buffers, unknown flags and
 * event bits, bad fds (-1, INT_MIN, INT_MAX, closed, a directory, a pipe
 * where a socket is needed), bad configs. Each fails with its documented
 * code and changes nothing.
 */

static void *quick(void *a)
{
    return a;
}

static void t_bad_values(void)
{
    const int bad_to[] = {-2, -1000, INT_MIN};
    char buf[64] = {0};
    size_t n = 0;
    int p[2], closed, dirfd, lsock, plain, i;
    async_queue_t *q = async_queue_create(2, 8, (async_queue_flags_t)0);
    async_runtime_t *rt = mkrt();
    async_worker_t *w = async_worker_create(quick, NULL, 0);
    async_sched_config_t one = {1, 0, 0};
    async_sched_t *s = async_sched_create(&one);
    async_chan_t *ch = async_chan_create(1, sizeof(int));
    async_fiber_t *jf;
    io_event_t ev[4];
    struct sockaddr_in sa;
    async_queue_stats_t qs;
    async_sched_stats_t ss;
    CHECK(q && w && s && ch);
    CHECK(pipe(p) == 0);
    closed = fcntl(p[0], F_DUPFD_CLOEXEC, 900); /* a number far above the ones opened below */
    CHECK(closed >= 900);
    close(closed);
    dirfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(dirfd >= 0);
    lsock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(lsock >= 0);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(lsock, (struct sockaddr *)&sa, sizeof sa), 0);
    CHECK_EQ(listen(lsock, 4), 0);
    plain = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); /* neither listening nor connected */
    CHECK(plain >= 0);
    CHECK_FAIL(async_fiber_accept(plain, NULL, NULL, 0) == -1, ASYNC_E_INVAL); /* not listening */

    /* queue */
    CHECK_FAIL(async_queue_create(0, 8, (async_queue_flags_t)0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(8, 0, (async_queue_flags_t)0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(8, 8, (async_queue_flags_t)0x100) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(8, 8, (async_queue_flags_t)(ASYNC_QUEUE_DROP_OLDEST | ASYNC_QUEUE_BLOCK_WRITER)) == NULL,
               ASYNC_E_INVAL);
    /* absurd sizes: refused (INVAL or NOMEM), never attempted */
    async_clear_error();
    CHECK(async_queue_create(SIZE_MAX, 8, (async_queue_flags_t)0) == NULL);
    CHECK(async_last_error() == ASYNC_E_INVAL || async_last_error() == ASYNC_E_NOMEM);
    async_clear_error();
    CHECK(async_queue_create(8, SIZE_MAX, (async_queue_flags_t)0) == NULL);
    CHECK(async_last_error() == ASYNC_E_INVAL || async_last_error() == ASYNC_E_NOMEM);
    CHECK_FAIL(!async_queue_enqueue(q, NULL, 4), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_enqueue(q, buf, 0), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_enqueue(q, buf, 9), ASYNC_E_TOOBIG);
    CHECK_FAIL(!async_queue_enqueue(q, buf, SIZE_MAX), ASYNC_E_TOOBIG); /* a "negative" size: never read */
    for (i = 0; i < 3; i++) {
        CHECK_FAIL(!async_queue_enqueue_wait(q, buf, 4, bad_to[i]), ASYNC_E_INVAL);
        CHECK_FAIL(!async_queue_dequeue_wait(q, buf, sizeof buf, &n, bad_to[i]), ASYNC_E_INVAL);
    }
    CHECK(async_queue_enqueue(q, buf, 4));
    CHECK_FAIL(!async_queue_dequeue(q, NULL, 8, &n), ASYNC_E_INVAL);
    n = 0;
    CHECK_FAIL(!async_queue_dequeue(q, NULL, 0, &n), ASYNC_E_BUFSIZE);
    CHECK_EQ(n, 4);
    CHECK_FAIL(!async_queue_dequeue(q, buf, 3, &n), ASYNC_E_BUFSIZE);
    async_clear_error();
    async_queue_get_stats(q, NULL);
    CHECK_ERR(ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_attach(q, rt, 1) == -1, ASYNC_E_INVAL); /* no SIGNAL_ON_DATA */
    async_queue_get_stats(q, &qs);
    CHECK_EQ(qs.current_size, 1); /* nothing above changed the queue */
    CHECK_EQ(qs.enqueue_count, 1);

    /* worker */
    CHECK_FAIL(async_worker_create(NULL, NULL, 0) == NULL, ASYNC_E_INVAL);
    async_clear_error();
    CHECK(async_worker_create(quick, NULL, SIZE_MAX) == NULL);
    CHECK(async_last_error() == ASYNC_E_INVAL || async_last_error() == ASYNC_E_NOMEM ||
          async_last_error() == ASYNC_E_SYS);
    for (i = 0; i < 3; i++)
        CHECK_FAIL(!async_worker_join(w, bad_to[i]), ASYNC_E_INVAL);
    CHECK(async_worker_join(w, 10000));

    /* runtime */
    CHECK_FAIL(async_runtime_add(rt, -1, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, INT_MIN, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, INT_MAX, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, closed, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, p[0], 0x40, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(rt, p[0], 0xFFFFFFFFu, NULL) == -1, ASYNC_E_INVAL);
    if (!backend_is_poll())
        CHECK_FAIL(async_runtime_add(rt, dirfd, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_modify(rt, -1, ASYNC_EVENT_READ) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_modify(rt, p[0], ASYNC_EVENT_READ) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_remove(rt, -1) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_remove(rt, INT_MAX) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_remove(rt, p[0]) == -1, ASYNC_E_NOTFOUND);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0);
    CHECK_FAIL(async_runtime_modify(rt, p[0], 0x40) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_EXISTS);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    CHECK_FAIL(async_runtime_wait(rt, NULL, 4, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, -1, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, INT_MIN, 0) == -1, ASYNC_E_INVAL);
    for (i = 0; i < 3; i++)
        CHECK_FAIL(async_runtime_wait(rt, ev, 4, bad_to[i]) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_cancel_timer(rt, 0) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_cancel_timer(rt, UINT64_MAX) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_cancel_timer(rt, 0x123456789ull) == -1, ASYNC_E_NOTFOUND);
    {
        /* extreme (valid) timer values are accepted and cancellable */
        uint64_t a = async_runtime_add_timer(rt, UINT64_MAX, UINT64_MAX, 1);
        uint64_t b = async_runtime_add_timer(rt, UINT64_MAX - 1, 0, 2);
        CHECK(a != 0 && b != 0 && a != b);
        CHECK_EQ(async_runtime_cancel_timer(rt, a), 0);
        CHECK_EQ(async_runtime_cancel_timer(rt, b), 0);
    }
    CHECK_EQ(async_runtime_wait(rt, ev, 4, 0), 0);

    /* scheduler and fibers (called on this plain thread: they block it, as documented) */
    {
        async_sched_config_t bad[] = {{-1, 0, 0}, {1025, 0, 0}, {INT_MIN, 0, 0}, {1, 1, 0},
                                      {1, SIZE_MAX, 0}, {1, 0, 4}, {1, 0, -1}};
        for (i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++)
            CHECK_FAIL(async_sched_create(&bad[i]) == NULL, ASYNC_E_INVAL);
    }
    CHECK_FAIL(async_sched_shutdown(s, -2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_shutdown(s, INT_MIN) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(s, NULL, NULL, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(s, &ss, NULL, -1) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(s, &ss, NULL, 2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_spawn(s, NULL, NULL, 0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_spawn(s, nop_fiber, NULL, 0x100) == NULL, ASYNC_E_INVAL);
    jf = async_fiber_spawn(s, nop_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(jf != NULL);
    for (i = 0; i < 3; i++)
        CHECK_FAIL(async_fiber_join(jf, bad_to[i]) == -1, ASYNC_E_INVAL);
    CHECK_EQ(async_fiber_join(jf, 10000), 0);
    CHECK_FAIL(async_fiber_join(jf, 0) == -1, ASYNC_E_BADHANDLE); /* joined: gone */
    CHECK_FAIL(async_fiber_blocking(NULL, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_wait_fd(-1, ASYNC_EVENT_READ, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_wait_fd(INT_MAX, ASYNC_EVENT_READ, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_wait_fd(closed, ASYNC_EVENT_READ, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_wait_fd(p[0], 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_wait_fd(p[0], 0x40, 0) == -1, ASYNC_E_INVAL);
    for (i = 0; i < 3; i++) {
        CHECK_FAIL(async_fiber_wait_fd(p[0], ASYNC_EVENT_READ, bad_to[i]) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_read(p[0], buf, 4, bad_to[i]) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_write(p[1], buf, 4, bad_to[i]) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_accept(lsock, NULL, NULL, bad_to[i]) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_connect(plain, (struct sockaddr *)&sa, sizeof sa, bad_to[i]) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_chan_send(ch, buf, bad_to[i]) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_chan_recv(ch, buf, bad_to[i]) == -1, ASYNC_E_INVAL);
    }
    CHECK_FAIL(async_fiber_read(p[0], NULL, 4, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_read(-1, buf, 4, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_read(closed, buf, 4, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_write(p[1], NULL, 4, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_write(-1, buf, 4, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_write(dirfd, buf, 4, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_accept(-1, NULL, NULL, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_accept(p[0], NULL, NULL, 0) == -1, ASYNC_E_BADFD); /* not a socket */
    CHECK_FAIL(async_fiber_accept(lsock, (struct sockaddr *)&sa, NULL, 0) == -1, ASYNC_E_INVAL); /* addr, no len */
    CHECK_FAIL(async_fiber_accept(lsock, NULL, NULL, 0) == -1, ASYNC_E_TIMEDOUT); /* the good call, for contrast */
    CHECK_FAIL(async_fiber_connect(plain, NULL, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_connect(plain, (struct sockaddr *)&sa, 3, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_connect(p[0], (struct sockaddr *)&sa, sizeof sa, 0) == -1, ASYNC_E_BADFD);

    /* channels */
    CHECK_FAIL(async_chan_create(1, 0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(1, (1u << 20) + 1) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create((1u << 24) + 1, 1) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(1u << 24, 1u << 10) == NULL, ASYNC_E_INVAL); /* > 1 GiB */
    CHECK_FAIL(async_chan_create(SIZE_MAX, SIZE_MAX) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_send(ch, NULL, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_try_send(ch, NULL) == -1, ASYNC_E_INVAL);
    {
        async_chan_op_t ops[65];
        memset(ops, 0, sizeof ops);
        CHECK_FAIL(async_chan_select(NULL, 1, 0) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_chan_select(ops, 0, 0) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_chan_select(ops, 65, 0) == -1, ASYNC_E_INVAL);
        ops[0].chan = ch;
        ops[0].dir = 3;
        CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_INVAL);
        ops[0].dir = ASYNC_CHAN_SEND;
        ops[0].elem = NULL;
        CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_INVAL);
        ops[0].dir = ASYNC_CHAN_RECV;
        for (i = 0; i < 3; i++)
            CHECK_FAIL(async_chan_select(ops, 1, bad_to[i]) == -1, ASYNC_E_INVAL);
        ops[0].chan = NULL;
        CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_BADHANDLE);
    }
    CHECK_FAIL(async_chan_try_recv(ch, NULL) == -1, ASYNC_E_EMPTY); /* nothing was sent by the calls above */

    /* strerror of anything */
    CHECK(strcmp(async_strerror(INT_MIN), "unknown error") == 0);
    CHECK(strcmp(async_strerror(-1), "unknown error") == 0);

    async_chan_destroy(ch);
    async_sched_destroy(s);
    async_worker_destroy(w);
    async_queue_destroy(q);
    async_runtime_deinit(rt);
    close(p[0]);
    close(p[1]);
    close(dirfd);
    close(lsock);
    close(plain);
}

static const test_case_t cases[] = {
    T(worker_never_stops),
    T(host_close), // poll
    T(host_close_dup), // poll
    T(faults_deinit_pending), // poll
    T(faults_deinit_race), // poll
    T(queue_destroy_race),
    T(fork_busy), // poll
    T(fiber_blocking_hangs),
    T(fiber_shutdown_mid_load),
    T(bad_values), // poll
    {"exec_child", t_exec_child}, /* run by fork_busy's children; not a ctest case */
};

TEST_MAIN(cases)
