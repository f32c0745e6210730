/* async_runtime_wait's loop: Go does the work, C does the sleeping.
 * See la_go_rt_wait_begin in main.go for why. */
#include <errno.h>
#include <time.h>
#if defined(__linux__)
#include <sys/epoll.h>
#endif

#include "_cgo_export.h"
#include "la.h"

static int raw_wait(const la_sleep_t *sl) {
#if defined(__linux__)
    return epoll_wait(sl->fd, (struct epoll_event *)sl->raw, sl->rawcap, sl->ms);
#else
    (void)sl;
    errno = ENOSYS; /* no raw poller here: Go never asks */
    return -1;
#endif
}

/* The fast path: while Go has nothing ready (no completion from Go's Post,
 * no expired timer: gowork is 0 and no timer is due before next_due) and
 * the fds need not be polled yet (none registered, or the poll budget of
 * Runtime.Prepare is not spent: 8 skipped polls or 1 ms), the completions
 * posted from C are the only possible events, so they are handed out here,
 * without the 80-100 ns Go crossing and Go's per-event copies. The order
 * of the completions and max_events hold as in Go (same la_rtc_take). Returns
 * -1 to go to Go (also for every error Go reports, such as a bad handle),
 * else an async_err_t. */
static int fast_wait(uint64_t h, io_event_t *events, int max, int timeout, int *out) {
#if defined(_WIN32)
    (void)h, (void)events, (void)max, (void)timeout, (void)out;
    return -1;
#else
    if (!events || max < 1 || timeout < -1) return -1;
    la_slot_t *slot;
    la_rtc_t *r = la_handle_get(h, LA_T_RUNTIME, &slot); /* deinit waits for us */
    if (!r) return -1;
    int rc = -1;
    int32_t idle = 0;
    if (!atomic_compare_exchange_strong(&r->waiting, &idle, 1)) {
        la_handle_put(slot);
        return ASYNC_E_BUSY;
    }
    if (atomic_load(&r->sh.gowork) == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec - r->start_ns;
        int32_t skipped = atomic_load_explicit(&r->sh.skipped, memory_order_relaxed);
        if (now < atomic_load(&r->sh.next_due) &&
            (atomic_load(&r->sh.nfds) == 0 ||
             (skipped < 8 && now - atomic_load_explicit(&r->sh.last_poll, memory_order_relaxed) < 1000000))) {
            int n = la_rtc_take_events(r, events, max);
            if (n > 0) {
                /* Counts as a skipped fd poll, exactly as in Prepare. */
                if (skipped < 8) atomic_store_explicit(&r->sh.skipped, skipped + 1, memory_order_relaxed);
                *out = n;
                rc = 0;
            }
        }
    }
    atomic_store(&r->waiting, 0);
    la_handle_put(slot);
    return rc;
#endif
}

int la_go_rt_wait(uint64_t h, io_event_t *events, int max, int timeout, int *out) {
    int frc = fast_wait(h, events, max, timeout, out);
    if (frc >= 0) return frc;
    la_sleep_t sl = {0};
    int rc = la_go_rt_wait_begin(h, events, max, timeout, out, &sl);
    while (rc == 0 && !sl.done) {
        int n = raw_wait(&sl);
        int err = n < 0 ? errno : 0;
        rc = la_go_rt_wait_finish(sl.token, events, out, n < 0 ? 0 : n, err, &sl);
    }
    return rc;
}
