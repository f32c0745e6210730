/* Thread-blocking work from fibers: async_fiber_blocking's offload pool
 * (every job runs once, the pool grows on demand, nested offloads run
 * inline, an offloaded function may shut down or destroy its own fiber's
 * scheduler, a job offloaded after the shutdown began still runs) and the
 * thread-blocking calls a fiber is refused (runtime_wait, worker_join with a
 * timeout). Every wait is bounded. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"
#include "net.h"

/* ---- thread-blocking calls on a fiber ------------------------------ */

static void *wk_proc(void *ctx) {
    (void)ctx;
    while (!async_worker_should_stop(async_worker_current())) sleep_ms(1);
    return NULL;
}

typedef struct {
    async_runtime_t *rt;
    async_worker_t *wk;
    steps_t st;
} blk_t;

static void blk_fiber(void *arg) {
    blk_t *x = arg;
    io_event_t ev[4];
    /* runtime_wait with a timeout: refused, the worker is not blocked */
    async_clear_error();
    if (async_runtime_wait(x->rt, ev, 4, 500) != -1 || async_last_error() != ASYNC_E_STATE) goto end;
    x->st.step = 1;
    async_clear_error();
    if (async_runtime_wait(x->rt, ev, 4, -1) != -1 || async_last_error() != ASYNC_E_STATE) goto end;
    x->st.step = 2;
    /* a poll (timeout 0) is allowed: it never blocks */
    if (async_runtime_wait(x->rt, ev, 4, 0) != 0) goto end;
    x->st.step = 3;
    /* worker_join with a timeout: refused; with 0: just a check */
    async_clear_error();
    if (async_worker_join(x->wk, 500) || async_last_error() != ASYNC_E_STATE) goto end;
    x->st.step = 4;
    async_clear_error();
    if (async_worker_join(x->wk, -1) || async_last_error() != ASYNC_E_STATE) goto end;
    x->st.step = 5;
    async_clear_error();
    if (async_worker_join(x->wk, 0) || async_last_error() != ASYNC_E_TIMEDOUT) goto end;
    x->st.step = 6;
    /* the other fiber of this worker still runs */
    long c0 = atomic_load(&x->st.cnt.count);
    for (int i = 0; i < 20000 && atomic_load(&x->st.cnt.count) < c0 + 3; i++) async_fiber_sleep(1);
    if (atomic_load(&x->st.cnt.count) < c0 + 3) goto end;
    x->st.step = 7;
end:
    steps_end(&x->st);
}

CASE(blocking_calls_refused_on_fiber) { // poll
    static blk_t x;
    x.rt = async_runtime_init();
    CHECK(x.rt != NULL);
    x.wk = async_worker_create(wk_proc, NULL, 0);
    CHECK(x.wk != NULL);
    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, counter_fiber, &x.st.cnt, 0));
    CHECK(async_fiber_spawn(s, blk_fiber, &x, 0));
    steps_wait(&x.st, 7, 20000, "blocking_calls_refused_on_fiber");
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    /* the same calls on a plain thread still block and work */
    async_worker_signal_stop(x.wk);
    CHECK(async_worker_join(x.wk, 10000));
    async_worker_destroy(x.wk);
    io_event_t ev[4];
    CHECK_EQ(async_runtime_wait(x.rt, ev, 4, 1), 0);
    async_runtime_deinit(x.rt);
}

/* ---- async_fiber_blocking: the pool grows while jobs outnumber idle threads */

/* A barrier of `parties` jobs that gives up at a deadline (pthread barriers
 * cannot time out). Jobs that all run at once meet; with fewer pool threads
 * than jobs the ones queued behind never start and the others time out. */
static pthread_mutex_t meet_mu = PTHREAD_MUTEX_INITIALIZER;

static pthread_cond_t meet_cv;

static int meet_parties, meet_arrived, meet_ok;

static struct timespec meet_deadline;

static void meet_job(void *arg) {
    (void)arg;
    pthread_mutex_lock(&meet_mu);
    meet_arrived++;
    pthread_cond_broadcast(&meet_cv);
    while (meet_arrived < meet_parties) {
        if (pthread_cond_timedwait(&meet_cv, &meet_mu, &meet_deadline) == ETIMEDOUT) break;
    }
    if (meet_arrived >= meet_parties) meet_ok++;
    pthread_mutex_unlock(&meet_mu);
}

static void meet_fiber(void *arg) { CHECK_EQ(async_fiber_blocking(meet_job, arg), 0); }

static void warm_job(void *arg) {
    (void)arg;
    sleep_ms(20);
}

static void warm_fiber(void *arg) { CHECK_EQ(async_fiber_blocking(warm_job, arg), 0); }

/* The header: the pool "grows on demand up to 64 threads"; only jobs beyond
 * 64 wait. An idle thread already claimed by a queued job does not count as
 * idle: each submission beyond the idle threads starts one, so N jobs that
 * must run together (a barrier of N) all run. The pool starts with one idle
 * thread (a warm-up job), and each round submits twice as many jobs as the
 * rounds before left idle threads. */
CASE(blocking_grow) { // adversarial
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&meet_cv, &ca);
    async_sched_t *s = sched_new(2);
    CHECK(async_fiber_spawn(s, warm_fiber, NULL, 0));
    CHECK_EQ(async_sched_run(s), 0);
    sleep_ms(50); /* the warm-up thread is idle now */
    for (int n = 2; n <= 32; n *= 2) {
        pthread_mutex_lock(&meet_mu);
        meet_parties = n;
        meet_arrived = 0;
        meet_ok = 0;
        clock_gettime(CLOCK_MONOTONIC, &meet_deadline);
        meet_deadline.tv_sec += 5;
        pthread_mutex_unlock(&meet_mu);
        for (int i = 0; i < n; i++) CHECK(async_fiber_spawn(s, meet_fiber, NULL, 0));
        CHECK_EQ(async_sched_run(s), 0);
        pthread_mutex_lock(&meet_mu);
        int ok = meet_ok, arrived = meet_arrived;
        pthread_mutex_unlock(&meet_mu);
        if (ok != n) fprintf(stderr, "%d jobs: %d met within 5 s (%d ran at all)\n", n, ok, arrived);
        CHECK_EQ(ok, n);
    }
    async_sched_destroy(s);
}

/* ---- the offload pool ---------------------------------------------------------------- */

static atomic_int off_count;

static void off_sleep(void *arg) {
    (void)arg;
    usleep(1000);
    atomic_fetch_add(&off_count, 1);
}

static void off_fiber(void *arg) {
    (void)arg;
    CHECK_EQ(async_fiber_blocking(off_sleep, NULL), 0);
}

/* 3000 fibers offload at once: every job runs once, every fiber returns. */
CASE(blocking_many) { // adversarial
    async_sched_t *s = sched_new(2);
    atomic_store(&off_count, 0);
    for (int i = 0; i < 3000; i++) CHECK(async_fiber_spawn(s, off_fiber, NULL, 0) != NULL);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&off_count), 3000);
    async_sched_destroy(s);
}

/* What an offloaded function sees: a plain thread (no fiber), a nested
 * async_fiber_blocking runs inline, fiber calls there block the pool
 * thread as on a plain thread. */
static atomic_int nested_ran;

static pthread_t nested_tid;

static void nested_inner(void *arg) {
    (void)arg;
    CHECK(pthread_equal(pthread_self(), nested_tid));
    atomic_store(&nested_ran, 1);
}

static void nested_outer(void *arg) {
    int *p = arg;
    CHECK(async_fiber_current() == NULL);
    nested_tid = pthread_self();
    CHECK_EQ(async_fiber_blocking(nested_inner, NULL), 0);
    char b;
    CHECK_EQ(async_fiber_read(p[0], &b, 1, 5000), 1);
    CHECK_EQ(async_fiber_sleep(1), 0);
}

static void nested_fiber(void *arg) { CHECK_EQ(async_fiber_blocking(nested_outer, arg), 0); }

CASE(blocking_nested) { // adversarial
    async_sched_t *s = sched_new(2);
    int p[2];
    CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    CHECK_EQ(write(p[1], "z", 1), 1);
    on_fiber(s, nested_fiber, p);
    CHECK_EQ(atomic_load(&nested_ran), 1);
    /* from a plain thread: inline */
    atomic_store(&nested_ran, 0);
    nested_tid = pthread_self();
    CHECK_EQ(async_fiber_blocking(nested_inner, NULL), 0);
    CHECK_EQ(atomic_load(&nested_ran), 1);
    CHECK_FAIL(async_fiber_blocking(NULL, NULL) == -1, ASYNC_E_INVAL);
    close_pair(p);
    async_sched_destroy(s);
}

/* An offloaded function that shuts down (or destroys) its own fiber's
 * scheduler: the fiber waits for the function, the function for the fiber. */
static async_sched_t *self_s;

static _Atomic(async_fiber_t *) self_f;

static atomic_int self_rc = 99, self_err, self_after = -1;

static void self_shutdown_job(void *arg) {
    (void)arg;
    /* waits that could only end after this job: refused */
    double t0 = now_ms();
    while (!atomic_load(&self_f) && now_ms() - t0 < 10000) sleep_ms(1);
    CHECK_FAIL(async_fiber_join(atomic_load(&self_f), -1) == -1, ASYNC_E_STATE);
    CHECK_FAIL(async_sched_run(self_s) == -1, ASYNC_E_STATE);
    /* shutdown starts and returns without waiting, as on a worker */
    async_clear_error();
    atomic_store(&self_rc, async_sched_shutdown(self_s, -1));
    atomic_store(&self_err, async_last_error());
}

static void self_shutdown_fiber(void *arg) {
    (void)arg;
    async_fiber_blocking(self_shutdown_job, NULL);
    atomic_store(&self_after, async_fiber_sleep(1) == -1 ? async_last_error() : 0);
}

/* Waits (10 s at most, then the process ends saying that `call` hangs) until
 * the offloaded job has made its call on its own scheduler. */
static void wait_self_job(const char *call) {
    double t0 = now_ms();
    while (atomic_load(&self_rc) == 99) {
        if (now_ms() - t0 > 10000) {
            fprintf(stderr, "%s in an offloaded job: hangs\n", call);
            _exit(1);
        }
        sleep_ms(5);
    }
}

CASE(blocking_self_shutdown) { // adversarial
    self_s = sched_new(2);
    async_fiber_t *f = async_fiber_spawn(self_s, self_shutdown_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    atomic_store(&self_f, f);
    wait_self_job("async_sched_shutdown(own scheduler, -1)");
    printf("shutdown in job -> %d err %d\n", atomic_load(&self_rc), atomic_load(&self_err));
    CHECK_EQ(atomic_load(&self_rc), 0);
    CHECK_EQ(async_fiber_join(f, 10000), 0);
    CHECK_EQ(atomic_load(&self_after), ASYNC_E_CANCELLED); /* the shutdown did start */
    async_sched_destroy(self_s);
}

static void self_destroy_job(void *arg) {
    (void)arg;
    async_clear_error();
    async_sched_destroy(self_s);
    atomic_store(&self_err, async_last_error());
    atomic_store(&self_rc, 0);
}

static void self_destroy_fiber(void *arg) {
    (void)arg;
    async_fiber_blocking(self_destroy_job, NULL);
}

CASE(blocking_self_destroy) { // adversarial
    self_s = sched_new(2);
    CHECK(async_fiber_spawn(self_s, self_destroy_fiber, NULL, 0) != NULL);
    wait_self_job("async_sched_destroy(own scheduler)");
    printf("destroy in job -> err %d\n", atomic_load(&self_err));
    CHECK_EQ(atomic_load(&self_err), ASYNC_E_STATE);
    async_sched_destroy(self_s);
}

/* A long offload while the scheduler shuts down: shutdown times out (the
 * job is not interrupted), destroy waits for it; nothing is lost. */
static atomic_int long_go, long_done;

static void long_job(void *arg) {
    (void)arg;
    while (!atomic_load(&long_go)) usleep(1000);
    atomic_store(&long_done, 1);
}

static atomic_int long_after = -1;

static void long_fiber(void *arg) {
    (void)arg;
    CHECK_EQ(async_fiber_blocking(long_job, NULL), 0);
    /* after shutdown began, a park is cancelled */
    atomic_store(&long_after, async_fiber_sleep(1) == -1 ? async_last_error() : 0);
}

static void *long_releaser(void *arg) {
    (void)arg;
    sleep_ms(300);
    atomic_store(&long_go, 1);
    return NULL;
}

CASE(blocking_long_shutdown) { // adversarial
    async_sched_t *s = sched_new(2);
    for (int i = 0; i < 3; i++) CHECK(async_fiber_spawn(s, long_fiber, NULL, 0) != NULL);
    sched_wait_parked(s, 3);
    CHECK_FAIL(async_sched_shutdown(s, 20) == -1, ASYNC_E_TIMEDOUT);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, long_releaser, NULL), 0);
    async_sched_destroy(s);
    pthread_join(th, NULL);
    CHECK_EQ(atomic_load(&long_done), 1);
    CHECK_EQ(atomic_load(&long_after), ASYNC_E_CANCELLED);
}

/* ---- async_fiber_blocking after the shutdown began: fn still runs ---------------------------------- */

static atomic_int late_ran, late_rc = 99;

static void late_job(void *arg) {
    (void)arg;
    atomic_store(&late_ran, 1);
}

static void late_fiber(void *arg) {
    (void)arg;
    while (async_fiber_sleep(5) == 0) {
    }
    /* cancelled: the shutdown began */
    atomic_store(&late_rc, async_fiber_blocking(late_job, NULL));
}

CASE(blocking_after_shutdown) { // adversarial
    async_sched_t *s = sched_new(2);
    CHECK(async_fiber_spawn(s, late_fiber, NULL, 0) != NULL);
    sleep_ms(20);
    CHECK_EQ(async_sched_shutdown(s, 10000), 0);
    CHECK_EQ(atomic_load(&late_rc), 0);
    CHECK_EQ(atomic_load(&late_ran), 1);
    async_sched_destroy(s);
}

TEST_MAIN()
