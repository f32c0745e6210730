/* Signal watches at their limits: every real-time signal sent with
 * sigqueue is counted, also with completions flooding the loop; several
 * runtimes watching one signal each count every one; 256 watches at most
 * (the next is ASYNC_E_NOMEM, deinit gives the slots back); in a child
 * forked with a signal watched the host's action is back and runtime calls
 * fail with ASYNC_E_FORKED, while the parent's watch goes on untouched;
 * async_fiber_unwatch_signal followed at once by async_fiber_watch_signal
 * ends the waits that began under the earlier watch (ASYNC_E_STATE), a
 * plain thread's and a fiber's. */
#include "check.h"
#include "proc.h"
#include "rt.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/wait.h>

/* 256 watches of runtimes at most: the next is NOMEM; deinit gives the
 * watches back and, with the last one, the host's action. */
static void host_noop(int sig) { (void)sig; }

CASE(sig_watch_limit) // poll adversarial
{
    enum { NR = 260 };
    static async_runtime_t *rts[NR];
    int sig = SIGRTMIN + 6;
    install_handler(sig, host_noop, 0);
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
    install_handler(sig, SIG_DFL, 0);
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
CASE(sig_count_exact) // poll adversarial notsan
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
CASE(sig_many_runtimes) // poll adversarial notsan
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

/* ---- fork with a watched signal ------------------------------------------- */

static int host_pipe_w = -1;
static void host_usr2(int sig)
{
    (void)sig;
    char c = 'h';
    ssize_t k = write(host_pipe_w, &c, 1);
    (void)k;
}

CASE(fork_watched_signal) // poll adversarial notsan
{
    int hp[2];
    CHECK_EQ(pipe2(hp, O_CLOEXEC), 0);
    host_pipe_w = hp[1];
    install_handler(SIGUSR2, host_usr2, 0);
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    CHECK_EQ(async_runtime_add_signal(rt, SIGUSR2, 3), 0);
    waitres_t w = {rt, -2, 0};
    pthread_t th;
    start_timed_wait(&w, &th);
    pid_t pid = fork_flushed();
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
    install_handler(SIGUSR2, SIG_DFL, 0);
}

/* --- fiber_rewatch ------------------------------------------------------------- */

static int rw_sig;
static atomic_int rw_tid, rw_thread_err, rw_fiber_err;

static void *rw_thread(void *arg)
{
    (void)arg;
    atomic_store(&rw_tid, (int)gettid());
    int c = async_fiber_wait_signal(rw_sig, 20000);
    atomic_store(&rw_thread_err, c < 0 ? async_last_error() : 1000 + c);
    return NULL;
}

static void rw_fiber(void *arg)
{
    (void)arg;
    int c = async_fiber_wait_signal(rw_sig, 20000);
    atomic_store(&rw_fiber_err, c < 0 ? async_last_error() : 1000 + c);
}

/* true once s's dump shows a fiber parked on an fd. */
static bool fiber_parked_on_fd(async_sched_t *s)
{
    int p[2];
    char buf[4096];
    CHECK_EQ(pipe(p), 0);
    CHECK(async_sched_dump(s, p[1]) >= 1);
    close(p[1]);
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    close(p[0]);
    buf[n > 0 ? n : 0] = 0;
    return strstr(buf, "parked: fd ") != NULL;
}

CASE(fiber_rewatch) // adversarial
{
    rw_sig = SIGRTMIN + 3;
    CHECK_EQ(async_fiber_watch_signal(rw_sig), 0);
    async_sched_t *s = sched_new(1);
    pthread_t t;
    start_thread(&t, rw_thread, NULL);
    async_fiber_t *f = async_fiber_spawn(s, rw_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    /* Both in their wait: the fiber parked on the pipe, the thread asleep
     * for 3 samples in a row (it sleeps nowhere else). */
    double t0 = now_ms();
    int streak = 0;
    while (streak < 3) {
        int tid = atomic_load(&rw_tid);
        streak = tid && thread_asleep(tid) && fiber_parked_on_fd(s) ? streak + 1 : 0;
        CHECK(now_ms() - t0 < 10000);
        sleep_ms(5);
    }
    CHECK_EQ(async_fiber_unwatch_signal(rw_sig), 0);
    CHECK_EQ(async_fiber_watch_signal(rw_sig), 0);
    join_within(t, 10000, "thread waiter");
    CHECK_EQ(async_fiber_join(f, 10000), 0);
    CHECK_EQ(atomic_load(&rw_thread_err), ASYNC_E_STATE);
    CHECK_EQ(atomic_load(&rw_fiber_err), ASYNC_E_STATE);
    /* the new watch works */
    union sigval v = {0};
    CHECK_EQ(sigqueue(getpid(), rw_sig, v), 0);
    CHECK_EQ(async_fiber_wait_signal(rw_sig, 5000), 1);
    CHECK_EQ(async_fiber_unwatch_signal(rw_sig), 0);
    sched_finish(s, 5000);
}

TEST_MAIN()
