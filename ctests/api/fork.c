/* fork: in the child every libasync call fails at once with ASYNC_E_FORKED
 * (queues, workers, runtimes, fibers; a failed async_queue_get_stats leaves
 * *stats zeroed), never hangs on a lock another thread held at the fork,
 * however busy the parent's threads and fibers were inside libasync; the
 * child may exec a program that uses libasync as usual; the parent's
 * objects keep working. */
#include "check.h"
#include "proc.h"
#include "rt.h"

#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>

/* --- every call of the child fails with ASYNC_E_FORKED -------------------- */

static int wait_one(async_runtime_t *rt, io_event_t *ev)
{
    double t0 = now_ms();
    int n;
    do
        n = async_runtime_wait(rt, ev, 1, 1000);
    while (n == 0 && now_ms() - t0 < 10000);
    return n;
}

static char expect_version[64], forked_text[128];

static void child_body(async_queue_t *q, async_runtime_t *rt, async_worker_t *w)
{
    int v = 1;
    io_event_t ev[2];
    CHILD_CHECK(10, !async_queue_enqueue(q, &v, sizeof v));
    CHILD_CHECK(11, async_last_error() == ASYNC_E_FORKED);
    CHILD_CHECK(12, !async_queue_dequeue(q, &v, sizeof v, NULL));
    CHILD_CHECK(13, async_last_error() == ASYNC_E_FORKED);
    CHILD_CHECK(14, async_queue_create(4, 4, (async_queue_flags_t)0) == NULL);
    CHILD_CHECK(15, async_last_error() == ASYNC_E_FORKED);
    CHILD_CHECK(16, async_runtime_init() == NULL);
    CHILD_CHECK(17, async_last_error() == ASYNC_E_FORKED);
    CHILD_CHECK(18, async_runtime_post_completion(rt, 1, 2) == -1);
    CHILD_CHECK(19, async_last_error() == ASYNC_E_FORKED);
    CHILD_CHECK(20, async_runtime_wait(rt, ev, 2, -1) == -1); /* must not hang */
    CHILD_CHECK(21, async_last_error() == ASYNC_E_FORKED);
    CHILD_CHECK(22, async_runtime_wakeup(rt) == -1);
    CHILD_CHECK(23, async_last_error() == ASYNC_E_FORKED);
    CHILD_CHECK(24, async_runtime_add_timer(rt, 1, 0, 1) == 0);
    CHILD_CHECK(25, async_last_error() == ASYNC_E_FORKED);
    CHILD_CHECK(26, !async_queue_dequeue_wait(q, &v, sizeof v, NULL, -1));
    CHILD_CHECK(27, async_last_error() == ASYNC_E_FORKED);
    CHILD_CHECK(28, async_worker_create(run_until_stopped, NULL, 0) == NULL);
    CHILD_CHECK(29, async_last_error() == ASYNC_E_FORKED);
    CHILD_CHECK(30, !async_worker_join(w, -1));
    CHILD_CHECK(31, async_last_error() == ASYNC_E_FORKED);
    async_clear_error();
    async_worker_signal_stop(w); /* must not touch the parent's stop descriptor */
    CHILD_CHECK(32, async_last_error() == ASYNC_E_FORKED);
    async_clear_error();
    CHILD_CHECK(35, async_worker_stop_fd(w) == -1 && async_last_error() == ASYNC_E_FORKED);
    async_clear_error();
    CHILD_CHECK(36, async_worker_should_stop(w) && async_last_error() == ASYNC_E_FORKED);
    async_clear_error();
    CHILD_CHECK(37, async_worker_get_state(w) == ASYNC_WORKER_STOPPED && async_last_error() == ASYNC_E_FORKED);
    async_clear_error();
    CHILD_CHECK(38, async_worker_result(w) == NULL && async_last_error() == ASYNC_E_FORKED);
    async_clear_error();
    (void)async_worker_get_native_handle(w);
    CHILD_CHECK(39, async_last_error() == ASYNC_E_FORKED);
    CHILD_CHECK(33, async_runtime_cancel_timer(rt, 1) == -1 && async_last_error() == ASYNC_E_FORKED);
    CHILD_CHECK(34, async_queue_attach(q, rt, 1) == -1 && async_last_error() == ASYNC_E_FORKED);
    /* these work as usual in the child */
    CHILD_CHECK(40, async_version_string() != NULL && strcmp(async_version_string(), expect_version) == 0);
    CHILD_CHECK(41, strcmp(async_strerror(ASYNC_E_FORKED), forked_text) == 0);
    CHILD_CHECK(42, async_worker_current() == NULL);
    async_clear_error();
    CHILD_CHECK(43, async_last_error() == ASYNC_OK);
    CHILD_CHECK(44, async_runtime_wakeup(rt) == -1 && async_last_error() == ASYNC_E_FORKED);
    _exit(0);
}

static async_runtime_t *g_frt;

static void *busy_waiter(void *arg)
{
    io_event_t ev[2];
    (void)arg;
    /* parent-side thread sitting inside libasync while the fork happens */
    for (;;) {
        int n = async_runtime_wait(g_frt, ev, 2, 10000);
        if (n > 0 && ev[0].completion_key == 999)
            return NULL;
        CHECK(n >= 0);
    }
}

static void run_child(async_queue_t *q, async_runtime_t *rt, async_worker_t *w)
{
    pid_t pid = fork_flushed();
    if (pid == 0)
        child_body(q, rt, w);
    wait_child_ok(pid, 15000, "child_body after fork (exit code N = failed CHILD_CHECK N in child_body)");
    /* the child's signal_stop did not reach the parent's worker */
    {
        struct pollfd pfd = {async_worker_stop_fd(w), POLLIN, 0};
        CHECK_EQ(poll(&pfd, 1, 0), 0);
        CHECK(!async_worker_should_stop(w));
    }
}

CASE(fork)
{
    async_queue_t *q = async_queue_create(4, sizeof(int), (async_queue_flags_t)0);
    async_runtime_t *rt = async_runtime_init();
    async_worker_t *w = async_worker_create(run_until_stopped, (void *)(uintptr_t)5, 0);
    pthread_t th;
    io_event_t ev[2];
    int v = 3, round;
    CHECK(q != NULL && rt != NULL && w != NULL);
    snprintf(expect_version, sizeof expect_version, "%s", async_version_string());
    snprintf(forked_text, sizeof forked_text, "%s", async_strerror(ASYNC_E_FORKED));
    g_frt = async_runtime_init();
    CHECK(g_frt != NULL);
    CHECK(pthread_create(&th, NULL, busy_waiter, NULL) == 0);
    sleep_ms(50);
    CHECK(async_queue_enqueue(q, &v, sizeof v));
    CHECK_EQ(async_runtime_post_completion(rt, 1, 1), 0);
    for (round = 0; round < 3; round++)
        run_child(q, rt, w);
    /* the parent carries on */
    v = 0;
    CHECK(async_queue_dequeue(q, &v, sizeof v, NULL));
    CHECK_EQ(v, 3);
    CHECK_EQ(wait_one(rt, ev), 1);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_COMPLETION);
    CHECK(ev[0].completion_key == 1);
    CHECK(async_runtime_add_timer(rt, 1, 0, 2) != 0);
    CHECK_EQ(wait_one(rt, ev), 1);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_TIMER);
    async_worker_signal_stop(w);
    CHECK(async_worker_join(w, 10000));
    CHECK(async_worker_result(w) == (void *)(uintptr_t)5);
    async_worker_destroy(w);
    CHECK_EQ(async_runtime_post_completion(g_frt, 999, 0), 0);
    pthread_join(th, NULL);
    {
        async_queue_t *q2 = async_queue_create(1, 1, (async_queue_flags_t)0);
        CHECK(q2 != NULL);
        async_queue_destroy(q2);
    }
    async_queue_destroy(q);
    async_runtime_deinit(rt);
    async_runtime_deinit(g_frt);
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
    CHILD_FORKED(37, async_scope_create(fb.s, NULL, -1) == NULL);
    CHILD_FORKED(38, async_fiber_cancel(NULL) == -1);
    CHILD_FORKED(39, async_fiber_shield_begin() == -1);
    CHILD_FORKED(40, async_fiber_set_deadline(10) == -1);
    CHILD_CHECK(41, async_fiber_cancelled() == 0);
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
    char what[96];
    snprintf(what, sizeof what, "fb_child round %d (exit code N: CHILD_CHECK N in fb_child failed)", round);
    pid_t pid = fork_flushed();
    if (pid == 0)
        fb_child(round);
    wait_child_ok(pid, 15000, what);
}

CASE(fork_busy) // poll
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

CHILD(exec_child)
{
    async_runtime_t *rt = mkrt();
    async_sched_t *s = async_sched_create(NULL);
    io_event_t ev[2];
    CHECK(s != NULL);
    CHECK(async_fiber_spawn(s, child_fiber, rt, 0));
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(collect_events(rt, ev, 2, 5000, 1), 1);
    CHECK(ev[0].completion_key == 5 && ev[0].data == 6);
    async_sched_destroy(s);
    async_runtime_deinit(rt);
}

/* async_queue_get_stats promises that a failed call leaves *stats zeroed
 * (when stats is not NULL). In a forked child every call fails with
 * ASYNC_E_FORKED, and this one returned before it zeroed: *stats kept the
 * caller's garbage. */
CASE(fork_queue_stats_zeroed) // adversarial
{
    async_queue_t *q = async_queue_create(4, 8, 0);
    CHECK(q != NULL);
    CHECK(async_queue_enqueue(q, "a", 1));
    pid_t pid = fork_flushed();
    if (pid == 0) {
        async_queue_stats_t st;
        memset(&st, 0xa5, sizeof st);
        CHECK_FAIL((async_queue_get_stats(q, &st), 1), ASYNC_E_FORKED);
        CHECK_QUEUE_STATS(st, 0, 0, 0, 0, 0, 0);
        CHECK_FAIL((async_queue_get_stats(q, NULL), 1), ASYNC_E_FORKED);
        _exit(0);
    }
    int status;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
    async_queue_destroy(q);
}

/* --- runtime calls in the child while the parent's loop sleeps ------------ */

CASE(fork_child_calls) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    /* Let the parent's loop sleep on another thread. */
    waitres_t w = {rt, -2, 0};
    pthread_t th;
    start_timed_wait(&w, &th);
    pid_t pid = fork_flushed();
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

TEST_MAIN()
