/* async_worker teardown: a joined and destroyed worker gives its stop
 * descriptor back at once, and async_worker_destroy without a join racing
 * the worker thread's exit frees the worker exactly once. */
#include <stdatomic.h>

#include "check.h"
#define BOUND_MS 20000 /* every wait of this file, in ms */
#include "net.h"

/* ---- a joined and destroyed worker gives its descriptor back ------------------- */

/* async_worker_join returned (proc has returned) and async_worker_destroy
 * released the worker: its stop descriptor is closed by then, so a host at
 * its descriptor limit can open one at once (not the worker's own thread,
 * still on its way out after waking the joiner, a moment later). */
CASE(worker_fd_back) // adversarial
{
    async_runtime_t *rt = async_runtime_init(); /* Go's poller: two fds, for good */
    CHECK(rt != NULL);
    async_runtime_deinit(rt);
    int n0 = open_fds(), late = 0;
    for (int i = 0; i < 2000; i++) {
        async_worker_t *w = async_worker_create(nop_proc, NULL, 0);
        CHECK(w != NULL);
        CHECK(async_worker_join(w, BOUND_MS));
        async_worker_destroy(w);
        if (open_fds() != n0)
            late++;
        double t0 = now_ms();
        while (open_fds() != n0 && now_ms() - t0 < BOUND_MS)
            usleep(100);
        CHECK_EQ(open_fds(), n0); /* never a leak */
    }
    if (late)
        fprintf(stderr, "%d of 2000 workers closed their stop descriptor after destroy returned\n", late);
    CHECK_EQ(late, 0);
}

/* ---- destroy racing the worker thread's exit ------------------------------------ */

/* async_worker_destroy without a join, at random moments around the end of
 * a short proc: the last reference may be the handle's or the thread's,
 * never freed under the other (ASan sees a use after free otherwise). */
CASE(worker_destroy_exit) // adversarial
{
    unsigned seed = 12345;
    for (int i = 0; i < 4000; i++) {
        async_worker_t *w = async_worker_create(nop_proc, NULL, 0);
        CHECK(w != NULL);
        seed = seed * 1103515245u + 12345u;
        for (volatile unsigned k = 0, n = (seed >> 16) % 4000; k < n; k++) {
        }
        async_worker_destroy(w);
    }
}

TEST_MAIN()
