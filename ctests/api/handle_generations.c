/* Handle generations: a destroyed handle never names a later object of its
 * slot, across 2^24 create/destroy cycles of queues, and a slot whose last
 * generation was used is retired (queues, channels, fibers spawned from a
 * fiber), never wrapped. */
#include "check.h"

#include <stdatomic.h>

/* ---- handle generations --------------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* Under qemu (ASYNC_TEST_EMULATOR), ASan and TSan, 2^24 cycles take too long
 * (over 10 s): the library's test hook ASYNC_TEST_HANDLE_GEN (read once, by the
 * first handle allocation) starts every fresh slot just below the generation
 * where a 24-bit counter wrapped, and a few thousand cycles cross that
 * point. Only the full count fails on a library without the hook. */
static long wrap_cycles(void) {
    if (SANITIZED || ASYNC_TEST_TSAN || getenv("ASYNC_TEST_EMULATOR")) {
        CHECK_EQ(setenv("ASYNC_TEST_HANDLE_GEN", "16776960", 1), 0); /* 2^24 - 256 */
        return 4096;
    }
    return (1L << 24) + 64;
}

/* A destroyed queue handle never names the slot's next queues: 2^24+ create
 * and destroy cycles (one slot, reused each time) never hand out the
 * destroyed handle's value again, and it stays invalid. */
CASE(handle_wrap_queue) { // timeout=120
    long n = wrap_cycles();
    async_queue_t *h0 = async_queue_create(1, 8, (async_queue_flags_t)0);
    CHECK(h0 != NULL);
    async_queue_destroy(h0);
    for (long i = 0; i < n; i++) {
        async_queue_t *q = async_queue_create(1, 8, (async_queue_flags_t)0);
        if (q == h0) {
            fprintf(stderr, "cycle %ld: a new queue got the destroyed handle %p\n", i, (void *)q);
            CHECK(q != h0);
        }
        async_queue_destroy(q);
    }
    async_queue_t *q = async_queue_create(1, 8, (async_queue_flags_t)0);
    CHECK(q != NULL);
    CHECK_FAIL(!async_queue_enqueue(h0, "x", 1), ASYNC_E_BADHANDLE);
    CHECK(async_queue_is_empty(q));
    async_queue_destroy(q);
}

/* The same with the handle of a slot whose last generation was used: the
 * slot is retired, the stale handles of every type stay invalid. */
#define NEAR_END "4294967000" /* 2^32 - 296 */

CASE(handle_exhausted_queue) {
    CHECK_EQ(setenv("ASYNC_TEST_HANDLE_GEN", NEAR_END, 1), 0);
    async_queue_t *first = async_queue_create(1, 8, (async_queue_flags_t)0);
    CHECK(first != NULL);
    async_queue_destroy(first);
    async_queue_t *prev = first;
    for (int i = 0; i < 1000; i++) {
        async_queue_t *q = async_queue_create(1, 8, (async_queue_flags_t)0);
        CHECK(q != NULL);
        CHECK(q != first && q != prev);
        CHECK_FAIL(!async_queue_enqueue(prev, "x", 1), ASYNC_E_BADHANDLE);
        CHECK(async_queue_enqueue(q, "x", 1));
        async_queue_destroy(q);
        prev = q;
    }
    CHECK_FAIL(!async_queue_enqueue(first, "x", 1), ASYNC_E_BADHANDLE);
}

CASE(handle_exhausted_chan) {
    CHECK_EQ(setenv("ASYNC_TEST_HANDLE_GEN", NEAR_END, 1), 0);
    int v = 1;
    async_chan_t *first = async_chan_create(1, sizeof v);
    CHECK(first != NULL);
    async_chan_destroy(first);
    for (int i = 0; i < 1000; i++) {
        async_chan_t *c = async_chan_create(1, sizeof v);
        CHECK(c != NULL);
        CHECK(c != first);
        CHECK_EQ(async_chan_try_send(c, &v), 0);
        async_chan_destroy(c);
    }
    async_chan_t *c = async_chan_create(1, sizeof v);
    CHECK(c != NULL);
    async_clear_error();
    CHECK(async_chan_try_send(first, &v) != 0);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    CHECK_EQ(async_chan_try_send(c, &v), 0);
    async_chan_destroy(c);
}

/* Fibers spawned from a fiber reuse the worker's cached records and their
 * handle slots (la_handle_reuse): past the slot's last generation a new slot
 * is taken, and a joined fiber's handle never names a later fiber. */
static void nothing(void *arg) { (void)arg; }

typedef struct {
    async_sched_t *s;
    async_fiber_t *first;
    int ok;
} respawn_t;

static void respawner(void *arg) {
    respawn_t *r = arg;
    for (int i = 0; i < 1000; i++) {
        async_fiber_t *f = async_fiber_spawn(r->s, nothing, NULL, ASYNC_FIBER_JOINABLE);
        if (!f) return;
        if (i == 0) r->first = f;
        else if (f == r->first) return;
        if (async_fiber_join(f, 10000) != 0) return;
    }
    r->ok = async_fiber_join(r->first, 0) != 0 && async_last_error() == ASYNC_E_BADHANDLE;
}

CASE(handle_exhausted_fiber) {
    CHECK_EQ(setenv("ASYNC_TEST_HANDLE_GEN", NEAR_END, 1), 0);
    async_sched_t *s = sched_new(1);
    respawn_t r = {s, NULL, 0};
    CHECK(async_fiber_spawn(s, respawner, &r, 0) != NULL);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK(r.ok);
    async_sched_destroy(s);
}

TEST_MAIN()
