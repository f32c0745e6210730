/* The stack guard modes of async_sched_config_t (1: guard pages by
 * madvise, 2: by mprotect, 3: canaries): a scheduler in each mode runs its
 * fibers and reports the mode and stack size it was given (mode 1 may be
 * ASYNC_E_NOTSUP where the kernel lacks MADV_GUARD_INSTALL).
 * scripts/cross.sh builds this file for Windows (where guard_modes is
 * skipped: Linux modes 1 and 3 are ASYNC_E_NOTSUP there). */
#include <pthread.h>
#include <stdatomic.h>

#include "fibers.h"

CASE(guard_modes) { // valgrind
    for (int m = 1; m <= 3; m++) {
        async_sched_config_t cfg = {1, 32 * 1024, m};
        async_sched_t *s = async_sched_create(&cfg);
        if (!s && m == 1 && async_last_error() == ASYNC_E_NOTSUP) {
            printf("madvise guards unsupported here\n");
            continue;
        }
        CHECK(s);
        atomic_store(&yields_counted, 0);
        atomic_store(&yielders_done, 0);
        for (int i = 0; i < 10; i++) CHECK(async_fiber_spawn(s, yielder, NULL, 0));
        CHECK_EQ(async_sched_run(s), 0);
        CHECK_EQ(atomic_load(&yielders_done), 10);
        async_sched_stats_t st;
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        CHECK_EQ(st.guard_mode, m);
        CHECK_EQ(st.stack_size, 32 * 1024);
        async_sched_destroy(s);
    }
}

TEST_MAIN()
