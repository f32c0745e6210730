/* Fiber violations found by an adversarial tester who read only
 * include/async.h (docs/RELIABILITY.md, "Found by adversarial tests:
 * fibers"). One case per ctest test (group adv_fiber, see CMakeLists.txt).
 * Every wait is bounded: a regression fails the case instead of hanging it. */
#include <stdatomic.h>

#include "check.h"

static async_sched_t *mk(int workers) {
    async_sched_config_t cfg = {workers, 0, 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s != NULL);
    return s;
}

/* Waits (on the calling thread) until *flag is set; fails after `ms`. */
static void wait_flag(atomic_int *flag, int ms, const char *what) {
    double t0 = now_ms();
    while (!atomic_load(flag)) {
        if (now_ms() - t0 > ms) {
            fprintf(stderr, "%s: not done after %d ms\n", what, ms);
            fflush(stderr);
            _exit(1);
        }
        sleep_ms(1);
    }
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
 * 64 wait. Before the fix a submission spawned a thread only when no thread
 * was idle, so one idle thread, already claimed by the job queued just
 * before, made each following submission wait for it: N jobs that must run
 * together (here a barrier of N; the tester's case was a 2-party barrier)
 * deadlocked. The pool starts with one idle thread (a warm-up job), and each
 * round submits twice as many jobs as the rounds before left idle threads. */
static void t_blocking_grow(void) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&meet_cv, &ca);
    async_sched_t *s = mk(2);
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

static const test_case_t cases[] = {
    T(blocking_grow),
};

TEST_MAIN(cases)
