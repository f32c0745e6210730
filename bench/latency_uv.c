/*
 * wake latency, libuv peer: the loop thread runs uv_run; the sender calls
 * uv_async_send.
 *
 * usage: latency_uv [samples=3000]
 */
#include "latency.h"

#include <uv.h>

static uv_async_t async_handle;

static void sender_thread_start(void) {}

static void send_wake(uint64_t t0) {
    (void)t0;
    if (uv_async_send(&async_handle) != 0) FAIL("uv_async_send failed");
}

static void on_async(uv_async_t *h) {
    if (record_sample(atomic_load(&shared_t0))) uv_close((uv_handle_t *)h, NULL);
}

int main(int argc, char **argv) {
    latency_setup(argc, argv);
    uv_loop_t *loop = uv_default_loop();
    uv_async_init(loop, &async_handle, on_async);
    pthread_t th = start_sender();
    uv_run(loop, UV_RUN_DEFAULT);
    pthread_join(th, NULL);
    print_latency();
    return 0;
}
