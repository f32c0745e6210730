/* Queues, workers and runtimes: bugs an adversarial pass (header only,
 * "break this") found (docs/RELIABILITY.md, "Adversarial pass 7"). Each
 * case failed before its fix. */
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

static const test_case_t cases[] = {
    T(stats_forked),
};

TEST_MAIN(cases)
