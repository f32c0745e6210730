/* The DROP_OLDEST policy at its edges: a full DROP_OLDEST + SIGNAL_ON_DATA
 * queue (capacity 1 and 2) posts one completion per empty -> non-empty
 * transition, not one per enqueue that drops the head; an enqueue that fails
 * with ASYNC_E_NOMEM drops nothing. */
#include "check.h"

#include <stdatomic.h>
#include <sys/wait.h>

/* --- drop_signal -------------------------------------------------------------- */

/* Completions with key 7 that a few non-blocking waits hand out. */
static int drain_signals(async_runtime_t *rt)
{
    io_event_t ev[16];
    int got = 0;
    for (int i = 0; i < 20; i++) {
        int n = async_runtime_wait(rt, ev, 16, 0);
        CHECK(n >= 0);
        for (int j = 0; j < n; j++) {
            CHECK_EQ(ev[j].event_type, ASYNC_EVENT_COMPLETION);
            CHECK_EQ(ev[j].completion_key, 7);
            got++;
        }
    }
    return got;
}

static void drop_signal(size_t cap)
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    async_queue_t *q = async_queue_create(cap, 4, ASYNC_QUEUE_SIGNAL_ON_DATA | ASYNC_QUEUE_DROP_OLDEST);
    CHECK(q != NULL);
    CHECK_EQ(async_queue_attach(q, rt, 7), 0);
    char buf[4];
    size_t len;
    /* fill, then 5 more into the full queue: one transition, one post */
    for (size_t i = 0; i < cap + 5; i++)
        CHECK(async_queue_enqueue(q, "m", 1));
    CHECK_EQ(drain_signals(rt), 1);
    /* the queue stays full (never empty): no more posts */
    for (int i = 0; i < 5; i++)
        CHECK(async_queue_enqueue(q, "m", 1));
    CHECK_EQ(drain_signals(rt), 0);
    async_queue_stats_t st;
    async_queue_get_stats(q, &st);
    CHECK_EQ(st.current_size, cap);
    CHECK_EQ(st.dropped_count, 10);
    /* emptied, then filled again: one more post */
    for (size_t i = 0; i < cap; i++)
        CHECK(async_queue_dequeue(q, buf, sizeof buf, &len));
    for (int i = 0; i < 5; i++)
        CHECK(async_queue_enqueue(q, "m", 1));
    CHECK_EQ(drain_signals(rt), 1);
    async_queue_destroy(q);
    async_runtime_deinit(rt);
}

CASE(drop_signal) // poll adversarial
{
    drop_signal(1);
    drop_signal(2);
    drop_signal(3);
}

/* --- drop_nomem ------------------------------------------------------------- */

/* A full DROP_OLDEST queue whose enqueue fails with ASYNC_E_NOMEM (the new
 * message's slot cannot grow) must lose nothing: the head it would have
 * dropped stays, and dropped_count does not move (the head is dropped only
 * once the new message has its slot). A child process under RLIMIT_AS, so the allocation surely fails. */
CHILD(drop_nomem_child)
{
    struct rlimit rl;
    char buf[8];
    size_t len;
    async_queue_stats_t st;
    /* slots are allocated per message up to max_msg (lazy slots) */
    async_queue_t *q = async_queue_create(2, (size_t)1 << 40, ASYNC_QUEUE_DROP_OLDEST);
    CHECK(q != NULL);
    CHECK(async_queue_enqueue(q, "A", 1));
    CHECK(async_queue_enqueue(q, "B", 1));
#if !defined(__SANITIZE_ADDRESS__)
    CHECK_EQ(getrlimit(RLIMIT_AS, &rl), 0);
    rl.rlim_cur = (rlim_t)1 << 40; /* far below what a 1 TiB slot needs, above what runs */
    CHECK_EQ(setrlimit(RLIMIT_AS, &rl), 0);
#else
    (void)rl; /* ASan's shadow needs more address space: its allocation cap does it (t_drop_nomem) */
#endif
    /* the huge message is never read: its slot cannot be allocated */
    static char small[1];
    CHECK_FAIL(!async_queue_enqueue(q, small, ((size_t)1 << 40) - 64), ASYNC_E_NOMEM);
    async_queue_get_stats(q, &st);
    CHECK_EQ(st.dropped_count, 0);
    CHECK_EQ(st.current_size, 2);
    CHECK(async_queue_dequeue(q, buf, sizeof buf, &len));
    CHECK(len == 1 && buf[0] == 'A');
    CHECK(async_queue_dequeue(q, buf, sizeof buf, &len));
    CHECK(len == 1 && buf[0] == 'B');
    /* and a DROP_OLDEST enqueue that fits still drops the head */
    CHECK(async_queue_enqueue(q, "C", 1));
    CHECK(async_queue_enqueue(q, "D", 1));
    CHECK(async_queue_enqueue(q, "E", 1));
    async_queue_get_stats(q, &st);
    CHECK_EQ(st.dropped_count, 1);
    CHECK(async_queue_dequeue(q, buf, sizeof buf, &len));
    CHECK(len == 1 && buf[0] == 'D');
    async_queue_destroy(q);
    exit(0);
}

CASE(drop_nomem) // poll adversarial notsan
{
    static char env[1024];
    if (getenv("ASYNC_TEST_EMULATOR")) {
        printf("skipped under an emulator: qemu-user does not apply RLIMIT_AS to the guest\n");
        return;
    }
    const char *old = getenv("ASAN_OPTIONS");
    snprintf(env, sizeof env, "ASAN_OPTIONS=%s%sallocator_may_return_null=1:max_allocation_size_mb=1024",
             old ? old : "", old && *old ? ":" : "");
    int st = run_self_case("drop_nomem_child", env);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
}

TEST_MAIN()
