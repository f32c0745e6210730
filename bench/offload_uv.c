/*
 * offload, libuv peer: uv_queue_work runs the function on libuv's thread
 * pool (UV_THREADPOOL_SIZE, default 4 threads); its after_work callback runs
 * on the loop (offload.h has the protocol).
 *
 * usage: offload_uv [latency_samples=20000] [throughput_items=500000]
 */
#include "offload.h"

#include <uv.h>

typedef struct {
    uv_work_t req;
    long i;
    uintptr_t result;
    uint64_t t0;
} item_t;

static uv_loop_t *loop;
static item_t *lat_item, *items;
static long lat_i, next, done;

static void echo(uv_work_t *req) {
    item_t *it = req->data;
    it->result = (uintptr_t)it->i;
}

static void after_latency(uv_work_t *req, int status);
static void after_throughput(uv_work_t *req, int status);

static void submit(item_t *it, long i, uv_after_work_cb after) {
    it->i = i;
    it->req.data = it;
    it->t0 = now_ns();
    if (uv_queue_work(loop, &it->req, echo, after) != 0) FAIL("uv_queue_work failed");
}

static void after_latency(uv_work_t *req, int status) {
    item_t *it = req->data;
    if (status != 0 || it->result != (uintptr_t)it->i) FAIL("latency: item %ld lost", it->i);
    if (it->i >= WARMUP) samples[it->i - WARMUP] = now_ns() - it->t0;
    if (++lat_i < WARMUP + n_samples) submit(lat_item, lat_i, after_latency);
}

static void after_throughput(uv_work_t *req, int status) {
    item_t *it = req->data;
    if (status != 0) FAIL("throughput: status %d", status);
    offload_seen(it->i, it->result);
    done++;
    if (next < n_items) {
        submit(it, next, after_throughput);
        next++;
    }
}

int main(int argc, char **argv) {
    offload_setup(argc, argv);
    loop = uv_default_loop();
    lat_item = calloc(1, sizeof *lat_item);
    items = calloc(IN_FLIGHT, sizeof *items);
    if (!lat_item || !items) FAIL("out of memory");

    submit(lat_item, 0, after_latency);
    uv_run(loop, UV_RUN_DEFAULT);

    uint64_t t0 = now_ns();
    for (; next < IN_FLIGHT && next < n_items; next++) submit(&items[next], next, after_throughput);
    uv_run(loop, UV_RUN_DEFAULT);
    uint64_t took = now_ns() - t0;
    if (done != n_items) FAIL("throughput: %ld of %ld items", done, n_items);
    offload_report(took);
    return 0;
}
