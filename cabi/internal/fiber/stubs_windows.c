/* Fibers on Windows: not implemented yet (see docs/PLATFORMS.md for the
 * plan). The fiber layer (fiber_*.c, switch_*.S) is built on every
 * other platform; on Windows this file stands in for it:
 *   - the hooks the rest of cabi calls (no thread is ever on a fiber);
 *   - every public fiber, scheduler and channel function, so the DLL exports
 *     the whole of async.h. Calls that async.h defines for plain threads
 *     behave as documented there (yield, sleep, blocking, current); the
 *     others fail with ASYNC_E_NOTSUP.
 * scripts/cross.sh checks that the DLL exports every function of async.h. */
#include <winsock2.h>
#include <windows.h>

#include "fiber.h"

/* ---- hooks used by base, rt and queue -------------------------------------------- */

int *la_fiber_error_slot(void) { return NULL; }
int *la_fiber_os_error_slot(void) { return NULL; }

la_fiber_t *la_current_fiber(void) { return NULL; }

void la_fiber_trap(void (*fn)(void *), void *arg) { fn(arg); }

/* Waiters: there are no fibers on Windows, so the only waiters are worker
 * threads' stoppable queue waits (la_waiter_init_park). They sleep on the
 * worker record's word with WaitOnAddress, as the futex does elsewhere
 * (waiters.c has the protocol); la_waiter_init is never reached here. */
int la_waiter_init(la_waiter_t *w, int kind) {
    (void)w, (void)kind;
    return ASYNC_E_NOTSUP;
}

static __thread la_wpark_t *wpark_self;

void la_wpark_set_self(la_wpark_t *p) { wpark_self = p; }

la_wpark_t *la_wpark_self(void) { return wpark_self; }

static void wpark_kick(la_wpark_t *p) {
    atomic_fetch_add(&p->seq, 1);
    WakeByAddressAll((void *)&p->seq);
}

int la_wpark_stop(la_wpark_t *p) {
    if (atomic_exchange(&p->stop, 1) != 0) return 0;
    wpark_kick(p);
    return 1;
}


void la_wpark_kick_unpin(la_wpark_t *p) {
    wpark_kick(p);
    atomic_fetch_sub(&p->pins, 1);
}

void la_wpark_drain(la_wpark_t *p) {
    while (atomic_load(&p->pins) != 0) SwitchToThread();
}

int la_waiter_init_park(la_waiter_t *w, la_wpark_t *p) {
    w->f = NULL;
    w->park = p;
    w->signalled = 0;
    w->claim = &w->tclaim;
    atomic_store(&w->tclaim, LA_W_WAITING);
    if (atomic_load(&p->stop)) return ASYNC_E_CANCELLED;
    return 0;
}

static int waiter_claim(la_waiter_t *w, int reason) {
    int z = LA_W_WAITING;
    return atomic_compare_exchange_strong(w->claim, &z, reason);
}

int la_waiter_wake(la_waiter_t *w, int reason) {
    if (!w->park || !waiter_claim(w, reason)) return 0;
    wpark_kick(w->park);
    return 1;
}

int la_waiter_wake_later(la_waiter_t *w, int reason, la_wpark_t **kick) {
    if (!w->park || *kick) return la_waiter_wake(w, reason);
    if (!waiter_claim(w, reason)) return 0;
    atomic_fetch_add(&w->park->pins, 1);
    *kick = w->park;
    return 1;
}

int la_waiter_wait(la_waiter_t *w, uint64_t deadline_ns) {
    la_wpark_t *p = w->park;
    if (!p) return LA_W_TIMEDOUT;
    for (;;) {
        uint32_t seq = atomic_load(&p->seq);
        int c = atomic_load(w->claim);
        if (c != LA_W_WAITING) return c;
        if (atomic_load(&p->stop)) {
            if (waiter_claim(w, LA_W_STOPPED)) return LA_W_STOPPED;
            continue;
        }
        DWORD ms = INFINITE;
        if (deadline_ns) {
            uint64_t now = la_now_ns();
            if (now >= deadline_ns) {
                if (waiter_claim(w, LA_W_TIMEDOUT)) return LA_W_TIMEDOUT;
                deadline_ns = 0;
                continue;
            }
            uint64_t left = (deadline_ns - now + 999999u) / 1000000u;
            ms = left >= INFINITE ? INFINITE - 1 : (DWORD)left;
        }
        WaitOnAddress((volatile void *)&p->seq, &seq, sizeof seq, ms);
    }
}

void la_waiter_done(la_waiter_t *w) { (void)w; }

int la_reason_err(int reason) {
    switch (reason) {
    case LA_W_READY: return 0;
    case LA_W_TIMEDOUT: return ASYNC_E_TIMEDOUT;
    case LA_W_CANCELLED:
    case LA_W_STOPPED: return ASYNC_E_CANCELLED;
    case LA_W_CLOSED: return ASYNC_E_CLOSED;
    default: return ASYNC_E_INTERNAL;
    }
}

uint64_t la_coarse_ns(void) { return (uint64_t)GetTickCount64() * 1000000u; }

/* ---- the public API ------------------------------------------------------ */

static int notsup(void) {
    la_set_error(ASYNC_E_NOTSUP);
    return -1;
}

async_sched_t *async_sched_create(const async_sched_config_t *cfg) {
    (void)cfg;
    notsup();
    return NULL;
}

int async_sched_run(async_sched_t *s) {
    (void)s;
    return notsup();
}

int async_sched_shutdown(async_sched_t *s, int timeout_ms) {
    (void)s, (void)timeout_ms;
    return notsup();
}

void async_sched_destroy(async_sched_t *s) {
    (void)s;
    notsup();
}

int async_sched_get_stats(async_sched_t *s, async_sched_stats_t *stats, async_sched_worker_stats_t *per_worker,
                          int max_workers) {
    (void)s, (void)stats, (void)per_worker, (void)max_workers;
    return notsup();
}

async_fiber_t *async_fiber_spawn(async_sched_t *s, void (*fn)(void *), void *arg, unsigned flags) {
    (void)s, (void)fn, (void)arg, (void)flags;
    notsup();
    return NULL;
}

int async_fiber_join(async_fiber_t *f, int timeout_ms) {
    (void)f, (void)timeout_ms;
    return notsup();
}

/* Plain-thread behaviour of async.h: every thread is a plain thread here. */
void async_fiber_yield(void) { SwitchToThread(); }

int async_fiber_sleep(uint64_t ms) {
    while (ms > 0) {
        DWORD d = ms > 0x7FFFFFFFu ? 0x7FFFFFFFu : (DWORD)ms;
        Sleep(d);
        ms -= d;
    }
    return 0;
}

async_fiber_t *async_fiber_current(void) { return NULL; }

int async_fiber_blocking(void (*fn)(void *), void *arg) {
    if (!fn) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    fn(arg);
    return 0;
}

int async_fiber_wait_fd(async_fd_t fd, uint32_t events, int timeout_ms) {
    (void)fd, (void)events, (void)timeout_ms;
    return notsup();
}

ssize_t async_fiber_read(async_fd_t fd, void *buf, size_t n, int timeout_ms) {
    (void)fd, (void)buf, (void)n, (void)timeout_ms;
    return notsup();
}

ssize_t async_fiber_write(async_fd_t fd, const void *buf, size_t n, int timeout_ms) {
    (void)fd, (void)buf, (void)n, (void)timeout_ms;
    return notsup();
}

async_fd_t async_fiber_accept(async_fd_t listen_fd, struct sockaddr *addr, socklen_t *len, int timeout_ms) {
    (void)listen_fd, (void)addr, (void)len, (void)timeout_ms;
    notsup();
    return (async_fd_t)-1;
}

int async_fiber_connect(async_fd_t fd, const struct sockaddr *addr, socklen_t len, int timeout_ms) {
    (void)fd, (void)addr, (void)len, (void)timeout_ms;
    return notsup();
}

async_chan_t *async_chan_create(size_t capacity, size_t elem_size) {
    (void)capacity, (void)elem_size;
    notsup();
    return NULL;
}

int async_chan_send(async_chan_t *c, const void *elem, int timeout_ms) {
    (void)c, (void)elem, (void)timeout_ms;
    return notsup();
}

int async_chan_recv(async_chan_t *c, void *elem, int timeout_ms) {
    (void)c, (void)elem, (void)timeout_ms;
    return notsup();
}

int async_chan_try_send(async_chan_t *c, const void *elem) {
    (void)c, (void)elem;
    return notsup();
}

int async_chan_try_recv(async_chan_t *c, void *elem) {
    (void)c, (void)elem;
    return notsup();
}

void async_chan_close(async_chan_t *c) {
    (void)c;
    notsup();
}

void async_chan_destroy(async_chan_t *c) {
    (void)c;
    notsup();
}

int async_chan_select(async_chan_op_t *ops, size_t n, int timeout_ms) {
    (void)ops, (void)n, (void)timeout_ms;
    return notsup();
}

/* Fiber mutexes, condition variables and fiber-local storage (sync.c,
 * fls.c): not on Windows yet. */
async_mutex_t *async_mutex_create(void) {
    notsup();
    return NULL;
}

void async_mutex_destroy(async_mutex_t *m) {
    (void)m;
    notsup();
}

int async_mutex_lock(async_mutex_t *m, int timeout_ms) {
    (void)m, (void)timeout_ms;
    return notsup();
}

int async_mutex_trylock(async_mutex_t *m) {
    (void)m;
    return notsup();
}

int async_mutex_unlock(async_mutex_t *m) {
    (void)m;
    return notsup();
}

async_cond_t *async_cond_create(void) {
    notsup();
    return NULL;
}

void async_cond_destroy(async_cond_t *c) {
    (void)c;
    notsup();
}

int async_cond_wait(async_cond_t *c, async_mutex_t *m, int timeout_ms) {
    (void)c, (void)m, (void)timeout_ms;
    return notsup();
}

int async_cond_signal(async_cond_t *c) {
    (void)c;
    return notsup();
}

int async_cond_broadcast(async_cond_t *c) {
    (void)c;
    return notsup();
}

int async_fiber_key_create(async_fiber_key_t *key, void (*destructor)(void *)) {
    (void)key, (void)destructor;
    return notsup();
}

int async_fiber_key_delete(async_fiber_key_t key) {
    (void)key;
    return notsup();
}

int async_fiber_setspecific(async_fiber_key_t key, void *value) {
    (void)key, (void)value;
    return notsup();
}

void *async_fiber_getspecific(async_fiber_key_t key) {
    (void)key;
    notsup();
    return NULL;
}

int async_fiber_set_name(async_fiber_t *f, const char *name) {
    (void)f, (void)name;
    return notsup();
}

int async_fiber_get_name(async_fiber_t *f, char *buf, size_t size) {
    (void)f, (void)buf, (void)size;
    return notsup();
}

int async_sched_dump(async_sched_t *s, int fd) {
    (void)s, (void)fd;
    return notsup();
}

int async_sched_dump_on_signal(async_sched_t *s, int signo, int fd) {
    (void)s, (void)signo, (void)fd;
    return notsup();
}

int async_sched_set_stall_ms(async_sched_t *s, int ms) {
    (void)s, (void)ms;
    return notsup();
}
