/* No thread can be created, or only k more (RLIMIT_NPROC of an unprivileged
 * user, in a child process): the blocking pool with no thread or a busy one,
 * the constructors that start threads (they fail with their documented
 * errors and leave nothing behind; all works once the limit is raised).
 * Each *_child case runs only in the child its parent case starts (net.h,
 * run_child). Every wait is bounded. */
#include <stdatomic.h>
#include <sys/resource.h>

#include "check.h"
#define BOUND_MS 20000 /* every wait of this file, in ms */
#include "net.h"

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
CASE(nothreads_pool_empty_child) // adversarial
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
CASE(nothreads_pool_busy_child) // adversarial
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
CASE(nothreads_calls_child) // adversarial
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

CASE(nothreads_pool_empty) { run_child("nothreads_pool_empty_child"); } // adversarial

CASE(nothreads_pool_busy) { run_child("nothreads_pool_busy_child"); } // adversarial

CASE(nothreads_calls) { run_child("nothreads_calls_child"); } // adversarial

/* ---- only k more threads: partial failures of the constructors ----------------- */

static int threads_now(void)
{
    return (int)proc_status_field("Threads: %ld");
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

CASE(nothreads_partial_child) // adversarial
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
            if (!sched_try_create(workers))
                failed++;
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
    async_sched_t *s2 = sched_new(4);
    async_sched_destroy(s2);
    async_sched_destroy(s);
    exit(0);
}

CASE(nothreads_partial) { run_child("nothreads_partial_child"); } // adversarial

TEST_MAIN()
