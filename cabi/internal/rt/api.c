/* The public runtime functions of include/async.h. Each checks the entry
 * (LA_ENTRY), then calls the C completion path (completions.c), the C half
 * of the wait (wait.c) or a Go export (runtime.go), and records the error
 * code in the calling thread's last-error slot. async_runtime_wakeup stays
 * async-signal-safe: it never enters Go.
 *
 * Go code must never run on a fiber stack: the Go exports are called through
 * la_call_off_fiber (fiber.h), which runs them on the worker's own stack when
 * the caller is a fiber. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "_cgo_export.h"
#include "fiber.h"
#include "rt.h"

enum {
    GO_RT_INIT, GO_RT_DEINIT, GO_RT_FD, GO_RT_WAIT, GO_RT_ADD_TIMER, GO_RT_CANCEL_TIMER
};

/* The arguments of one la_go_* call. */
typedef struct {
    int op, rc;
    uint64_t h, u1, u2;
    void *p, *p2;
    int i1, i2;
    unsigned u;
    uintptr_t k;
} la_gocall_t;

static void go_dispatch(void *arg) {
    la_gocall_t *c = arg;
    switch (c->op) {
    case GO_RT_INIT: c->rc = la_go_rt_init((uint64_t *)c->p); break;
    case GO_RT_DEINIT: c->rc = la_go_rt_deinit(c->h); break;
    case GO_RT_FD: c->rc = la_go_rt_fd(c->h, c->i1, c->i2, (uint32_t)c->u, c->k); break;
    case GO_RT_WAIT: c->rc = la_rt_wait(c->h, (io_event_t *)c->p, c->i1, c->i2, (int *)c->p2); break;
    case GO_RT_ADD_TIMER: c->rc = la_go_rt_add_timer(c->h, c->u1, c->u2, c->k, (uint64_t *)c->p); break;
    case GO_RT_CANCEL_TIMER: c->rc = la_go_rt_cancel_timer(c->h, c->u1); break;
    default: c->rc = ASYNC_E_INTERNAL;
    }
}

static int go(la_gocall_t c) {
    la_call_off_fiber(go_dispatch, &c);
    return c.rc;
}

#define GO(...) go((la_gocall_t){__VA_ARGS__})

/* ---- runtime ------------------------------------------------------------- */

async_runtime_t *async_runtime_init(void) {
    LA_ENTRY(NULL);
    uint64_t h = 0;
    if (!la_ok(GO(.op = GO_RT_INIT, .p = &h))) return NULL;
    return (async_runtime_t *)(uintptr_t)h;
}

void async_runtime_deinit(async_runtime_t *rt) {
    LA_ENTRY();
    if (la_ok(GO(.op = GO_RT_DEINIT, .h = LA_H(rt)))) la_sig_forget(LA_H(rt)); /* sigwatch.c */
}

static int rt_fd(async_runtime_t *rt, la_rt_fd_op_t op, async_fd_t fd, uint32_t events, void *context) {
    LA_ENTRY(-1);
#if defined(_WIN32)
    if (fd > (async_fd_t)INT32_MAX) return la_set_error(ASYNC_E_BADFD), -1;
#endif
    return la_ok(GO(.op = GO_RT_FD, .h = LA_H(rt), .i1 = op, .i2 = (int)fd, .u = events, .k = (uintptr_t)context)) ? 0 : -1;
}

int async_runtime_add(async_runtime_t *rt, async_fd_t fd, uint32_t events, void *context) {
    return rt_fd(rt, LA_RT_FD_ADD, fd, events, context);
}

int async_runtime_modify(async_runtime_t *rt, async_fd_t fd, uint32_t events) {
    return rt_fd(rt, LA_RT_FD_MODIFY, fd, events, NULL);
}

int async_runtime_remove(async_runtime_t *rt, async_fd_t fd) { return rt_fd(rt, LA_RT_FD_REMOVE, fd, 0, NULL); }

int async_runtime_wait(async_runtime_t *rt, io_event_t *events, int max_events, int timeout_ms) {
    LA_ENTRY(-1);
    /* On a fiber a wait would block its worker thread (and every fiber
     * queued there) in epoll_wait: refused. A poll (timeout 0) is fine. */
    int on_fiber = la_current_fiber() != NULL;
    if (timeout_ms != 0 && timeout_ms >= -1 && on_fiber) {
        la_set_error(ASYNC_E_STATE);
        return -1;
    }
    int n = 0;
    /* The wait is C (wait.c), which disables cancellation itself where it
     * sleeps or enters Go: on a plain thread it is called directly. */
    int rc = on_fiber ? GO(.op = GO_RT_WAIT, .h = LA_H(rt), .p = events, .i1 = max_events, .i2 = timeout_ms, .p2 = &n)
                      : la_rt_wait(LA_H(rt), events, max_events, timeout_ms, &n);
    if (!la_ok(rc)) return -1;
    return n;
}

int async_runtime_post_completion(async_runtime_t *rt, uintptr_t completion_key, uintptr_t data) {
    LA_ENTRY(-1);
    /* Pure C (completions.c): no Go crossing, safe on a fiber stack as is. */
    return la_ok(la_rt_post(LA_H(rt), completion_key, data)) ? 0 : -1;
}

int async_runtime_wakeup(async_runtime_t *rt) {
    LA_ENTRY(-1);
#if defined(_WIN32)
    /* The doorbell is an IOCP and no signal handler interrupts threads here:
     * ring it through Go (cabi/internal/rt/wakeup_windows.go). */
    return la_ok(la_go_rt_wakeup(LA_H(rt))) ? 0 : -1;
#else
    int saved = errno;
    la_slot_t *slot;
    la_doorbell_t *bell = la_handle_get(LA_H(rt), LA_T_RUNTIME, &slot);
    if (!bell) {
        la_set_error(ASYNC_E_BADHANDLE);
        return -1;
    }
    ssize_t r;
    /* The flag is the wakeup (wait.c, libasync's Wait): the wait that takes
     * it down returns. Raised before the ring, so a wait the ring wakes
     * finds it up; the ring only ends a sleep. */
    atomic_store(&((la_rtc_t *)bell)->sh.wakereq, 1);
    if (bell->kind == LA_DOORBELL_EVENTFD) {
        uint64_t v = (uint64_t)1 << 32; /* port.WakeupIncrement */
        do r = la_write_nc(bell->fd, &v, sizeof v);
        while (r < 0 && errno == EINTR);
    } else {
        char c = 'w'; /* port.WakeupByte */
        do r = la_write_nc(bell->fd, &c, 1);
        while (r < 0 && errno == EINTR);
    }
    /* EAGAIN: the doorbell is already full, the waiter wakes anyway. */
    int ok = r >= 0 || errno == EAGAIN, werr = errno;
    /* Stats; the record is the runtime's while the handle is pinned. A
     * lock-free atomic: async-signal-safe. */
    if (ok) atomic_fetch_add_explicit(&((la_rtc_t *)bell)->sh.wakeups, 1, memory_order_relaxed);
    la_handle_put(slot);
    errno = saved;
    if (!ok) {
        la_set_error_os(ASYNC_E_SYS, werr);
        return -1;
    }
    return 0;
#endif
}

uint64_t async_runtime_add_timer(async_runtime_t *rt, uint64_t delay_ms, uint64_t repeat_ms, uintptr_t key) {
    LA_ENTRY(0);
    uint64_t id = 0;
    if (!la_ok(GO(.op = GO_RT_ADD_TIMER, .h = LA_H(rt), .u1 = delay_ms, .u2 = repeat_ms, .k = key, .p = &id))) return 0;
    return id;
}

int async_runtime_cancel_timer(async_runtime_t *rt, uint64_t timer_id) {
    LA_ENTRY(-1);
    return la_ok(GO(.op = GO_RT_CANCEL_TIMER, .h = LA_H(rt), .u1 = timer_id)) ? 0 : -1;
}

/* ---- stats --------------------------------------------------------------- */

_Static_assert(sizeof(async_runtime_stats_t) == ASYNC_RUNTIME_STATS_MIN_SIZE,
               "a new field of async_runtime_stats_t goes at the end; ASYNC_RUNTIME_STATS_MIN_SIZE stays the first "
               "version's size");
_Static_assert(sizeof(async_runtime_stats_t) % 8 == 0, "stats size");

int async_runtime_get_stats(async_runtime_t *rt, async_runtime_stats_t *stats, size_t stats_size) {
    LA_ENTRY(-1);
    /* Pure C, no Go crossing: safe on a fiber stack and never parks. */
    if (!stats || stats_size < ASYNC_RUNTIME_STATS_MIN_SIZE || stats_size % 8 != 0) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    la_slot_t *slot;
    la_rtc_t *r = la_handle_get(LA_H(rt), LA_T_RUNTIME, &slot);
    if (!r) {
        la_set_error(ASYNC_E_BADHANDLE);
        return -1;
    }
    /* Pinned: deinit waits for us before it recycles r. */
    async_runtime_stats_t st;
    memset(&st, 0, sizeof st);
    st.iterations = atomic_load_explicit(&r->st.iterations, memory_order_relaxed);
    st.idle_time_ns = (uint64_t)atomic_load_explicit(&r->sh.idle_ns, memory_order_relaxed);
    st.events_total = atomic_load_explicit(&r->st.events_total, memory_order_relaxed);
    for (int b = 0; b < ASYNC_RUNTIME_STATS_EVENT_KINDS; b++)
        st.events[b] = atomic_load_explicit(&r->st.events[b], memory_order_relaxed);
    st.completions_pending = la_rtc_pending_count(r);
    int64_t timers = atomic_load_explicit(&r->sh.timers, memory_order_relaxed);
    st.timers_armed = timers > 0 ? (uint64_t)timers : 0;
    st.doorbell_writes = atomic_load_explicit(&r->sh.rings, memory_order_relaxed);
    st.wakeups = atomic_load_explicit(&r->sh.wakeups, memory_order_relaxed);
    la_handle_put(slot);
    size_t n = stats_size < sizeof st ? stats_size : sizeof st;
    memcpy(stats, &st, n);
    if (stats_size > n) memset((char *)stats + n, 0, stats_size - n);
    return (int)n;
}
