/* Version, errors, thread-local error state and fork. Run: test_misc CASE. */
#include "check.h"

#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

static void t_version(void)
{
    char want[64];
    const char *v = async_version_string();
    CHECK(v != NULL);
    snprintf(want, sizeof want, "%d.%d.%d", ASYNC_VERSION_MAJOR, ASYNC_VERSION_MINOR, ASYNC_VERSION_PATCH);
    if (strcmp(v, want) != 0)
        fprintf(stderr, "library version \"%s\", header \"%s\"\n", v, want);
    CHECK(strcmp(v, want) == 0);
    CHECK(strcmp(async_version_string(), want) == 0);
}

static void t_strerror(void)
{
    const char *s[ASYNC_E_STATE + 1];
    const int unknown[] = {ASYNC_E_STATE + 1, 20, 99, 1000, -1, -2, INT_MAX, INT_MIN};
    int i, j;
    for (i = ASYNC_OK; i <= ASYNC_E_STATE; i++) {
        s[i] = async_strerror(i);
        CHECK(s[i] != NULL);
        CHECK(s[i][0] != '\0');
        CHECK(strcmp(s[i], "unknown error") != 0);
        for (j = 0; j < i; j++) {
            if (strcmp(s[i], s[j]) == 0)
                fprintf(stderr, "codes %d and %d share \"%s\"\n", i, j, s[i]);
            CHECK(strcmp(s[i], s[j]) != 0);
        }
    }
    for (i = 0; i < (int)(sizeof unknown / sizeof unknown[0]); i++) {
        const char *u = async_strerror(unknown[i]);
        CHECK(u != NULL);
        CHECK(strcmp(u, "unknown error") == 0);
    }
}

static void *fresh_thread_error(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)async_last_error();
}

static void *thread_sets_inval(void *arg)
{
    (void)arg;
    CHECK(async_queue_create(0, 1, (async_queue_flags_t)0) == NULL);
    return (void *)(intptr_t)async_last_error();
}

static void t_last_error(void)
{
    pthread_t th;
    void *r;
    async_queue_t *q;
    /* nothing failed yet on this thread */
    CHECK_EQ(async_last_error(), ASYNC_OK);
    /* a new thread starts with ASYNC_OK even after failures elsewhere */
    async_queue_destroy(NULL);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    CHECK(pthread_create(&th, NULL, fresh_thread_error, NULL) == 0);
    pthread_join(th, &r);
    CHECK_EQ((intptr_t)r, ASYNC_OK);
    /* thread-local: another thread's failure does not change ours */
    CHECK(pthread_create(&th, NULL, thread_sets_inval, NULL) == 0);
    pthread_join(th, &r);
    CHECK_EQ((intptr_t)r, ASYNC_E_INVAL);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    /* successful calls do not reset it */
    q = async_queue_create(4, 4, (async_queue_flags_t)0);
    CHECK(q != NULL);
    CHECK(async_queue_enqueue(q, "abc", 3));
    CHECK_ERR(ASYNC_E_BADHANDLE);
    async_queue_destroy(q);
    CHECK_ERR(ASYNC_E_BADHANDLE);
}

static void *thread_clears(void *arg)
{
    (void)arg;
    async_queue_destroy(NULL);
    if (async_last_error() != ASYNC_E_BADHANDLE)
        return (void *)1;
    async_clear_error();
    return (void *)(intptr_t)async_last_error();
}

static void t_clear_error(void)
{
    pthread_t th;
    void *r;
    CHECK(async_queue_create(0, 0, (async_queue_flags_t)0) == NULL);
    CHECK_ERR(ASYNC_E_INVAL);
    async_clear_error();
    CHECK_ERR(ASYNC_OK);
    async_clear_error(); /* idempotent */
    CHECK_ERR(ASYNC_OK);
    /* thread-local: another thread clearing its error leaves ours */
    async_queue_destroy(NULL);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    CHECK(pthread_create(&th, NULL, thread_clears, NULL) == 0);
    pthread_join(th, &r);
    CHECK_EQ((intptr_t)r, ASYNC_OK);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    /* the void-function pattern: clear, call, check */
    async_clear_error();
    async_queue_clear(NULL);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    {
        async_queue_t *q = async_queue_create(2, 2, (async_queue_flags_t)0);
        CHECK(q != NULL);
        async_clear_error();
        async_queue_clear(q);
        CHECK_ERR(ASYNC_OK); /* it succeeded */
        async_queue_destroy(q);
    }
}

/* --- fork --------------------------------------------------------------- */

/* Child-side check: no stdio, exit code tells which check failed. */
#define CHILD_CHECK(n, expr)                                                                                   \
    do {                                                                                                       \
        if (!(expr))                                                                                           \
            _exit(n);                                                                                          \
    } while (0)

static void *gated_worker(void *ctx)
{
    async_worker_t *self = async_worker_current();
    (void)ctx;
    while (self && !async_worker_should_stop(self))
        sleep_ms(2);
    return (void *)(uintptr_t)5;
}

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
    CHILD_CHECK(28, async_worker_create(gated_worker, NULL, 0) == NULL);
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
    pid_t pid;
    int status = 0;
    double t0;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        child_body(q, rt, w);
    t0 = now_ms();
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        CHECK(r != -1);
        if (r == pid)
            break;
        if (now_ms() - t0 > 15000) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fprintf(stderr, "child hung in a libasync call after fork\n");
            CHECK(!"child hung");
        }
        sleep_ms(5);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "child: %s %d (exit code N = failed CHILD_CHECK N in child_body)\n",
                WIFEXITED(status) ? "exit code" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
    /* the child's signal_stop did not reach the parent's worker */
    {
        struct pollfd pfd = {async_worker_stop_fd(w), POLLIN, 0};
        CHECK_EQ(poll(&pfd, 1, 0), 0);
        CHECK(!async_worker_should_stop(w));
    }
}

static void t_fork(void)
{
    async_queue_t *q = async_queue_create(4, sizeof(int), (async_queue_flags_t)0);
    async_runtime_t *rt = async_runtime_init();
    async_worker_t *w = async_worker_create(gated_worker, NULL, 0);
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

static const test_case_t cases[] = {
    T(version),
    T(strerror),
    T(last_error),
    T(clear_error),
    T(fork),
};

TEST_MAIN(cases)
