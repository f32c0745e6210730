/* Queues, workers and runtimes: bugs an adversarial pass (header only,
 * "break this") found (docs/RELIABILITY.md, "Adversarial pass 7"). Each
 * case failed before its fix. */
#include <stdatomic.h>
#include <sys/wait.h>

#include "check.h"

/* async_queue_get_stats promises that a failed call leaves *stats zeroed
 * (when stats is not NULL). In a forked child every call fails with
 * ASYNC_E_FORKED, and this one returned before it zeroed: *stats kept the
 * caller's garbage. */
static void t_stats_forked(void)
{
    async_queue_t *q = async_queue_create(4, 8, 0);
    CHECK(q != NULL);
    CHECK(async_queue_enqueue(q, "a", 1));
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        async_queue_stats_t st;
        memset(&st, 0xa5, sizeof st);
        CHECK_FAIL((async_queue_get_stats(q, &st), 1), ASYNC_E_FORKED);
        CHECK_EQ(st.capacity, 0);
        CHECK_EQ(st.current_size, 0);
        CHECK_EQ(st.max_msg_size, 0);
        CHECK_EQ(st.enqueue_count, 0);
        CHECK_EQ(st.dequeue_count, 0);
        CHECK_EQ(st.dropped_count, 0);
        CHECK_FAIL((async_queue_get_stats(q, NULL), 1), ASYNC_E_FORKED);
        _exit(0);
    }
    int status;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
    async_queue_destroy(q);
}

/* async_worker_get_native_handle of a worker whose proc had returned gave
 * the pthread_t of a thread that no longer exists; glibc hands the same id
 * (the thread's descriptor) to the next thread it creates, so a
 * pthread_kill or pthread_cancel on it, which the header suggests, hit
 * another worker (here B) or was undefined behaviour. Once proc has returned
 * the call now gives a zero-filled pthread_t with ASYNC_E_STATE. */
static atomic_int native_gate;
static void *native_quick(void *c) { return c; }
static void *native_slow(void *c)
{
    while (!atomic_load(&native_gate))
        sleep_ms(1);
    return c;
}

static void t_native_stopped(void)
{
    pthread_t zero, t;
    memset(&zero, 0, sizeof zero);
    async_worker_t *a = async_worker_create(native_quick, NULL, 0);
    CHECK(a != NULL);
    CHECK(async_worker_join(a, 30000));
    CHECK_EQ(async_worker_get_state(a), ASYNC_WORKER_STOPPED);
    async_worker_t *b = async_worker_create(native_slow, NULL, 0);
    CHECK(b != NULL);
    async_clear_error();
    t = async_worker_get_native_handle(b);
    CHECK_ERR(ASYNC_OK);
    CHECK(memcmp(&t, &zero, sizeof t) != 0);
    async_clear_error();
    t = async_worker_get_native_handle(a);
    if (pthread_equal(t, async_worker_get_native_handle(b)))
        printf("A's stale id is B's thread\n");
    CHECK_ERR(ASYNC_E_STATE);
    CHECK(memcmp(&t, &zero, sizeof t) == 0);
    atomic_store(&native_gate, 1);
    CHECK(async_worker_join(b, 30000));
    CHECK_FAIL((t = async_worker_get_native_handle(b), 1), ASYNC_E_STATE);
    CHECK(memcmp(&t, &zero, sizeof t) == 0);
    async_worker_destroy(a);
    async_worker_destroy(b);
}

static const test_case_t cases[] = {
    T(stats_forked), // adversarial
    T(native_stopped), // adversarial
};

TEST_MAIN(cases)
