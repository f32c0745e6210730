/*
 * wake latency, libasync: the loop thread blocks in async_runtime_wait(-1);
 * the sender posts one completion carrying its timestamp.
 *
 * usage: latency_async [samples=3000]
 */
#include "latency.h"

#include "async.h"

static async_runtime_t *rt;

/* Enter Go once so the first-call cost is not in a sample. */
static void sender_thread_start(void) { (void)async_queue_is_empty(NULL); }

static void send_wake(uint64_t t0) {
    if (async_runtime_post_completion(rt, 1, (uintptr_t)t0) != 0)
        FAIL("post_completion: %s", async_strerror(async_last_error()));
}

int main(int argc, char **argv) {
    latency_setup(argc, argv);
    rt = async_runtime_init();
    if (!rt) FAIL("async_runtime_init: %s", async_strerror(async_last_error()));
    pthread_t th = start_sender();
    io_event_t ev[8];
    uint64_t last = now_ns();
    for (int done = 0; !done;) {
        int n = async_runtime_wait(rt, ev, 8, 5000);
        if (n < 0) FAIL("async_runtime_wait: %s", async_strerror(async_last_error()));
        if (n == 0) { /* timeout, or a signal interrupted the wait */
            if (now_ns() - last >= 5000000000u) FAIL("a wake was lost (5 s without an event)");
            continue;
        }
        last = now_ns();
        for (int i = 0; i < n && !done; i++) {
            if (ev[i].event_type != ASYNC_EVENT_COMPLETION || ev[i].completion_key != 1)
                FAIL("unexpected event type=%u", ev[i].event_type);
            done = record_sample((uint64_t)ev[i].data);
        }
    }
    pthread_join(th, NULL);
    async_runtime_deinit(rt);
    print_latency();
    return 0;
}
