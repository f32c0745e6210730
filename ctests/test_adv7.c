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

/* A registered fd closed without async_runtime_remove (a misuse the header
 * describes: "the poll backend reports it once as ERROR|CLOSE; epoll forgets
 * it") whose number a new file took before the next wait: the poll backend
 * polled the number, so the new file, never added, had its readiness
 * reported as READ with the old registration's context, at every wait, for
 * ever; a caller would read another owner's data thinking it was its own.
 * Now the poll backend checks the identity of the file behind every fd it
 * reports (as add does) and treats a changed one as closed: ERROR|CLOSE once
 * with the old context, then nothing until the number is added again. epoll
 * reports nothing (it forgot the closed file). */
static void t_rt_closed_reused(void)
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    io_event_t ev[4];
    for (int round = 0; round < 3; round++) {
        int a[2], b[2];
        CHECK_EQ(pipe(a), 0);
        CHECK_EQ(async_runtime_add(rt, a[0], ASYNC_EVENT_READ, (void *)1), 0);
        int num = a[0];
        close(a[0]); /* without async_runtime_remove */
        close(a[1]);
        CHECK_EQ(pipe(b), 0); /* the lowest free numbers: b[0] takes num */
        if (b[0] != num) {
            printf("round %d: the number was not reused (%d, %d), skipped\n", round, b[0], num);
            close(b[0]);
            close(b[1]);
            continue;
        }
        CHECK_EQ(write(b[1], "x", 1), 1);
        int closes = 0;
        for (int i = 0; i < 3; i++) {
            int k = async_runtime_wait(rt, ev, 4, 20);
            CHECK(k >= 0);
            for (int j = 0; j < k; j++) {
                printf("wait %d: fd %d type %#x ctx %p\n", i, ev[j].fd, ev[j].event_type, ev[j].context);
                CHECK_EQ(ev[j].fd, num);
                /* never the new file's readiness under the old context */
                CHECK_EQ(ev[j].event_type, ASYNC_EVENT_ERROR | ASYNC_EVENT_CLOSE);
                closes++;
            }
        }
        CHECK(closes <= 1);
        /* the new file, added, is watched with its own context */
        CHECK_EQ(async_runtime_add(rt, b[0], ASYNC_EVENT_READ, (void *)2), 0);
        int k = async_runtime_wait(rt, ev, 4, 5000);
        CHECK_EQ(k, 1);
        CHECK_EQ(ev[0].fd, b[0]);
        CHECK_EQ(ev[0].event_type, ASYNC_EVENT_READ);
        CHECK(ev[0].context == (void *)2);
        CHECK_EQ(async_runtime_remove(rt, b[0]), 0);
        close(b[0]);
        close(b[1]);
    }
    async_runtime_deinit(rt);
}

static const test_case_t cases[] = {
    T(stats_forked),
    T(native_stopped),
    T(rt_closed_reused),
};

TEST_MAIN(cases)
