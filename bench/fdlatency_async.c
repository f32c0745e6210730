/*
 * fd readiness wake latency, libasync: the loop thread blocks in
 * async_runtime_wait(-1) with the read end of a pipe registered; the sender
 * writes one byte. The sample ends when the wait has returned the READ event
 * (the byte is then read, outside the sample).
 *
 * usage: fdlatency_async [samples=3000]
 */
#define _GNU_SOURCE
#include "fdlatency.h"

#include "async.h"

int main(int argc, char **argv) {
    fdlatency_setup(argc, argv);
    async_runtime_t *rt = async_runtime_init();
    if (!rt) FAIL("async_runtime_init: %s", async_strerror(async_last_error()));
    if (async_runtime_add(rt, pfd[0], ASYNC_EVENT_READ, (void *)1) != 0)
        FAIL("async_runtime_add: %s", async_strerror(async_last_error()));
    pthread_t th = start_sender();
    io_event_t ev[8];
    uint64_t last = now_ns();
    for (int done = 0; !done;) {
        int n = async_runtime_wait(rt, ev, 8, 5000);
        if (n < 0) FAIL("async_runtime_wait: %s", async_strerror(async_last_error()));
        if (n == 0) {
            if (now_ns() - last >= 5000000000u) FAIL("a wake was lost (5 s without an event)");
            continue;
        }
        uint64_t t0 = atomic_load(&shared_t0);
        last = now_ns();
        for (int i = 0; i < n && !done; i++) {
            if (ev[i].fd != pfd[0] || !(ev[i].event_type & ASYNC_EVENT_READ) || ev[i].context != (void *)1)
                FAIL("unexpected event fd=%d type=%u", (int)ev[i].fd, ev[i].event_type);
            done = record_sample(t0);
            char c;
            if (read(pfd[0], &c, 1) != 1) FAIL("pipe read: %s", strerror(errno));
        }
    }
    pthread_join(th, NULL);
    async_runtime_deinit(rt);
    print_latency();
    return 0;
}
