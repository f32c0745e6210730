/* Long timeouts: a deadline further away than INT32_MAX ms (24.8 days) is
 * waited for in capped steps, never turned into "sleep for ever" or into a
 * wrong short sleep by an int overflow.
 *
 * This program interposes epoll_wait() (libasync's scheduler poller calls it
 * through the PLT) to see the timeout each poll is given. */
#include <stdatomic.h>
#include <sys/syscall.h>

#include "check.h"

#if defined(__linux__) /* registered on Linux only (ctests/CMakeLists.txt) */
#include <sys/epoll.h>

static _Atomic int watching;
static _Atomic long polls, bad_polls;
static _Atomic int last_timeout;

int epoll_wait(int ep, struct epoll_event *evs, int n, int timeout) {
    if (atomic_load(&watching)) {
        atomic_fetch_add(&polls, 1);
        atomic_store(&last_timeout, timeout);
        if (timeout < 0) atomic_fetch_add(&bad_polls, 1);
    }
    return (int)syscall(SYS_epoll_pwait, ep, evs, n, timeout, NULL, 8);
}

static _Atomic int slept_rc = 1;

static void long_sleeper(void *arg) {
    (void)arg;
    /* 30 days: more ms than an int holds */
    atomic_store(&slept_rc, async_fiber_sleep(30ull * 24 * 3600 * 1000) == 0 ? 0 : async_last_error());
}

static void nop(void *arg) { (void)arg; }

/* The scheduler's idle poll with only a 30-day sleeper due (2.59e9 ms, more
 * than an int holds): its epoll_wait timeout is capped at INT32_MAX ms, never
 * negative (for ever) nor a wrong short one. */
CASE(sched_poll_long_deadline) { // linux
    async_sched_t *s = sched_new(1);
    spawn_until_parked(s, long_sleeper, NULL, 1);
    atomic_store(&watching, 1);
    /* wake the idle worker so that it computes its poll timeout again */
    double t0 = now_ms();
    while (atomic_load(&polls) < 3 && now_ms() - t0 < 20000) {
        CHECK(async_fiber_spawn(s, nop, NULL, 0) != NULL);
        sleep_ms(20);
    }
    atomic_store(&watching, 0);
    CHECK(atomic_load(&polls) >= 3);
    CHECK_EQ(atomic_load(&bad_polls), 0);
    CHECK_EQ(async_sched_shutdown(s, 10000), 0);
    CHECK_EQ(atomic_load(&slept_rc), ASYNC_E_CANCELLED);
    async_sched_destroy(s);
}

TEST_MAIN()
#else
int main(void) { return 0; } /* built by the darwin cross build, never registered */
#endif
