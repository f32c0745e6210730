/* Bad arguments to the scheduler, fiber, channel, stats, dump, name and key
 * calls: each fails with the documented error (ASYNC_E_INVAL for bad values,
 * ASYNC_E_BADHANDLE for NULL, destroyed or wrong-type handles, ASYNC_E_STATE
 * outside a fiber) and changes nothing.
 * scripts/cross.sh builds this file for Windows and runs its cases under
 * wine, except those inside #if !defined(_WIN32). */
#include <pthread.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdint.h>

#include "fibers.h"

CASE(sched_bad_input) { // valgrind
    CHECK_FAIL(async_fiber_spawn(NULL, nop_fiber, NULL, 0) == NULL, ASYNC_E_BADHANDLE);
    async_sched_config_t bad = {-1, 0, 0};
    CHECK_FAIL(async_sched_create(&bad) == NULL, ASYNC_E_INVAL);
    async_sched_config_t bad2 = {1, 100, 0};
    CHECK_FAIL(async_sched_create(&bad2) == NULL, ASYNC_E_INVAL);
    async_sched_config_t bad3 = {1, 0, 9};
    CHECK_FAIL(async_sched_create(&bad3) == NULL, ASYNC_E_INVAL);
    async_sched_t *s = sched_new(1);
    CHECK_FAIL(async_fiber_spawn(s, NULL, NULL, 0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_spawn(s, nop_fiber, NULL, 0x80) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_join(NULL, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_join((async_fiber_t *)s, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_sched_run((async_sched_t *)(uintptr_t)12345) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_sched_shutdown(s, -2) == -1, ASYNC_E_INVAL);
    async_sched_stats_t st;
    CHECK_FAIL(async_sched_get_stats(s, NULL, NULL, 0) == -1, ASYNC_E_INVAL);
    CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
    CHECK_EQ(st.workers, 1);
    CHECK_EQ(st.stack_size, 64 * 1024);
    CHECK(st.guard_mode >= 1 && st.guard_mode <= 3);
    async_sched_destroy(s);
    CHECK_FAIL(async_sched_run(s) == -1, ASYNC_E_BADHANDLE);
    async_sched_destroy(s); /* ignored */
    CHECK_ERR(ASYNC_E_BADHANDLE);
}

#if !defined(_WIN32)

CASE(fiber_api_bad_input) // adversarial
{
    async_chan_t *c = async_chan_create(1, 4);
    async_chan_op_t ops[65];
    async_sched_t *s = sched_new(1);
    async_sched_stats_t st;
    async_sched_worker_stats_t ws[2];
    int v = 0;
    CHECK(c != NULL);
    memset(ops, 0, sizeof ops);
    CHECK_FAIL(async_chan_select(NULL, 1, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_select(ops, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_select(ops, 65, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_select(ops, SIZE_MAX, 0) == -1, ASYNC_E_INVAL);
    ops[0].chan = c;
    ops[0].dir = ASYNC_CHAN_RECV;
    CHECK_FAIL(async_chan_select(ops, 1, -2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_select(ops, 1, INT_MIN) == -1, ASYNC_E_INVAL);
    ops[0].dir = 0;
    CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_INVAL);
    ops[0].dir = ASYNC_CHAN_SEND;
    CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_INVAL);
    ops[0].chan = NULL;
    ops[0].elem = &v;
    CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_BADHANDLE);
    ops[0].chan = (async_chan_t *)s;
    CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_chan_send(c, NULL, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_send(c, &v, -2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_recv(c, &v, INT_MIN) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(1, 0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(1, (1u << 20) + 1) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create((1u << 24) + 1, 1) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(SIZE_MAX, 1) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(SIZE_MAX, SIZE_MAX) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(1u << 24, 1u << 20) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(s, NULL, NULL, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(s, &st, NULL, 1) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(s, &st, ws, -1) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(NULL, &st, NULL, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_sched_shutdown(s, -2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_dump(s, -1) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_set_name(NULL, "x") == -1, ASYNC_E_STATE);
    CHECK_FAIL(async_fiber_get_name(NULL, NULL, 0) == -1, ASYNC_E_STATE);
    CHECK_FAIL(async_fiber_blocking(NULL, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_join(NULL, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_join((async_fiber_t *)c, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_sched_run((async_sched_t *)c) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_key_create(NULL, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_key_delete(0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_setspecific(12345, &v) == -1, ASYNC_E_BADHANDLE);
    async_sched_destroy(s);
    async_chan_destroy(c);
}

#endif /* !_WIN32 */

TEST_MAIN()
