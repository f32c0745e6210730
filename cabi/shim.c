/* The public C API of include/async.h for the queue and the runtime.
 *
 * Each function is a small C shim: it refuses calls in a forked child before
 * touching Go, calls the C queue (queue.c), the C completion path
 * (completions.c) or a la_go_* export, and records the error code in the
 * calling thread's last-error slot. Keeping the public entry points in C is
 * what lets later layers (the fiber scheduler) route calls made on a fiber
 * stack through a stack switch, and lets async_runtime_wakeup stay
 * async-signal-safe: it never enters Go. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "_cgo_export.h"
#include "fiber.h"
#include "la.h"

#define LA_STR2(x) #x
#define LA_STR(x) LA_STR2(x)

int async_version(void) {
    return ASYNC_VERSION_NUMBER;
}

const char *async_version_string(void) {
    return LA_STR(ASYNC_VERSION_MAJOR) "." LA_STR(ASYNC_VERSION_MINOR) "." LA_STR(ASYNC_VERSION_PATCH);
}

/* ---- errors -------------------------------------------------------------- */

static __thread int last_error;
static __thread int last_os_error; /* the errno of the last ASYNC_E_SYS, else 0 */

/* On a fiber (also while it runs a Go call on its worker's stack) the slot
 * is the fiber's own: a fiber may resume on another thread. Not inlined, so
 * that the TLS address is never cached across a switch. */
__attribute__((noinline)) static int *os_error_slot(void) {
    int *slot = la_fiber_os_error_slot();
    return slot ? slot : &last_os_error;
}

__attribute__((noinline)) void la_set_error(int code) {
    int *slot = la_fiber_error_slot();
    if (slot)
        *slot = code;
    else
        last_error = code;
    if (code != ASYNC_E_SYS) *os_error_slot() = 0;
}

void la_note_os_error(int os) { *os_error_slot() = os; }

void la_set_error_os(int code, int os) {
    la_note_os_error(code == ASYNC_E_SYS ? os : 0);
    la_set_error(code);
}

__attribute__((noinline)) int async_last_error(void) {
    int *slot = la_fiber_error_slot();
    return slot ? *slot : last_error;
}

int async_last_os_error(void) {
    int *slot = la_fiber_error_slot();
    int code = slot ? *slot : last_error;
    return code == ASYNC_E_SYS ? *os_error_slot() : 0;
}

/* ---- Go calls ---------------------------------------------------------------
 * Go code must never run on a fiber stack: on a fiber, la_go_call runs fn on
 * the worker's own stack ("trap": the fiber switches to its worker loop,
 * which calls fn and switches straight back). Go exports called this way
 * never park the fiber. */
void la_go_call(void (*fn)(void *), void *arg) {
    if (la_current_fiber())
        la_fiber_trap(fn, arg);
    else
        fn(arg);
}

enum {
    GO_RT_INIT, GO_RT_DEINIT, GO_RT_FD, GO_RT_WAIT, GO_RT_POST, GO_RT_ADD_TIMER, GO_RT_CANCEL_TIMER
};

/* The arguments of one la_go_* call. */
typedef struct {
    int op, rc;
    uint64_t h, h2, u1, u2;
    void *p, *p2;
    size_t n;
    int i1, i2;
    unsigned u;
    uintptr_t k, d;
} la_gocall_t;

static void go_dispatch(void *arg) {
    la_gocall_t *c = arg;
    switch (c->op) {
    case GO_RT_INIT: c->rc = la_go_rt_init((uint64_t *)c->p); break;
    case GO_RT_DEINIT: c->rc = la_go_rt_deinit(c->h); break;
    case GO_RT_FD: c->rc = la_go_rt_fd(c->h, c->i1, c->i2, (uint32_t)c->u, c->k); break;
    case GO_RT_WAIT: c->rc = la_rt_wait(c->h, (io_event_t *)c->p, c->i1, c->i2, (int *)c->p2); break;
    case GO_RT_POST: c->rc = la_rt_post(c->h, c->k, c->d); break;
    case GO_RT_ADD_TIMER: c->rc = la_go_rt_add_timer(c->h, c->u1, c->u2, c->k, (uint64_t *)c->p); break;
    case GO_RT_CANCEL_TIMER: c->rc = la_go_rt_cancel_timer(c->h, c->u1); break;
    default: c->rc = ASYNC_E_INTERNAL;
    }
}

static int go(la_gocall_t c) {
    la_go_call(go_dispatch, &c);
    return c.rc;
}

#define GO(...) go((la_gocall_t){__VA_ARGS__})

__attribute__((noinline)) void async_clear_error(void) {
    int *slot = la_fiber_error_slot();
    if (slot)
        *slot = ASYNC_OK;
    else
        last_error = ASYNC_OK;
    *os_error_slot() = 0;
}

static const char *const messages[] = {
    [ASYNC_OK] = "success",
    [ASYNC_E_INVAL] = "invalid argument",
    [ASYNC_E_BADHANDLE] = "invalid handle (NULL, destroyed, or of another type)",
    [ASYNC_E_NOMEM] = "out of memory or handles",
    [ASYNC_E_TOOBIG] = "message larger than the queue's max_msg_size",
    [ASYNC_E_BUFSIZE] = "buffer too small for the message",
    [ASYNC_E_EMPTY] = "queue or channel is empty",
    [ASYNC_E_FULL] = "queue or channel is full",
    [ASYNC_E_TIMEDOUT] = "timed out",
    [ASYNC_E_CLOSED] = "closed: destroyed while the call waited, a closed channel, or a reset connection",
    [ASYNC_E_BUSY] = "busy: another caller already waits there (runtime wait, fd direction, join)",
    [ASYNC_E_EXISTS] = "file descriptor already registered",
    [ASYNC_E_NOTFOUND] = "file descriptor or timer not registered",
    [ASYNC_E_BADFD] = "bad file descriptor",
    [ASYNC_E_SYS] = "operating-system call failed",
    [ASYNC_E_INTERNAL] = "internal error in libasync",
    [ASYNC_E_CANCELLED] = "operation cancelled",
    [ASYNC_E_NOTSUP] = "not supported",
    [ASYNC_E_FORKED] = "called in a child process after fork(); only exec is supported",
    [ASYNC_E_STATE] = "object not in a state that allows this call",
};

const char *async_strerror(int code) {
    if (code < 0 || (size_t)code >= sizeof messages / sizeof messages[0] || !messages[code]) return "unknown error";
    return messages[code];
}

/* ---- fork ---------------------------------------------------------------- */

_Atomic int la_forked;

#if !defined(_WIN32)
static void on_fork_child(void) { atomic_store(&la_forked, 1); }

__attribute__((constructor)) static void la_init(void) { pthread_atfork(NULL, NULL, on_fork_child); }
#endif

#define LA_FORK_GUARD(fail)                                                                                  \
    do {                                                                                                     \
        if (__builtin_expect(atomic_load_explicit(&la_forked, memory_order_relaxed), 0)) {                   \
            la_set_error(ASYNC_E_FORKED);                                                                    \
            return fail;                                                                                     \
        }                                                                                                    \
    } while (0)

/* rc is an async_err_t from Go: record it and report success or failure. */
static inline int la_ok(int rc) {
    if (__builtin_expect(rc != 0, 0)) {
        la_set_error(rc);
        return 0;
    }
    return 1;
}

/* ---- queue ----------------------------------------------------------------
 * Pure C (queue.c): no Go crossing. Waits park a calling fiber. */

async_queue_t *async_queue_create(size_t capacity, size_t max_msg_size, async_queue_flags_t flags) {
    LA_FORK_GUARD(NULL);
    uint64_t h = 0;
    if (!la_ok(la_q_create(capacity, max_msg_size, (unsigned)flags, &h))) return NULL;
    return (async_queue_t *)(uintptr_t)h;
}

void async_queue_destroy(async_queue_t *queue) {
    LA_FORK_GUARD();
    la_ok(la_q_destroy(LA_H(queue)));
}

bool async_queue_enqueue(async_queue_t *queue, const void *data, size_t size) {
    LA_FORK_GUARD(false);
    /* wait is only consulted when the queue is full, and only BLOCK_WRITER
     * waits then: queue.c reads the flag under its lock. */
    return la_ok(la_q_enqueue(LA_H(queue), data, size, -1, -1));
}

bool async_queue_enqueue_wait(async_queue_t *queue, const void *data, size_t size, int timeout_ms) {
    LA_FORK_GUARD(false);
    return la_ok(la_q_enqueue(LA_H(queue), data, size, 1, timeout_ms));
}

bool async_queue_dequeue(async_queue_t *queue, void *buffer, size_t buffer_size, size_t *out_size) {
    LA_FORK_GUARD(false);
    return la_ok(la_q_dequeue(LA_H(queue), buffer, buffer_size, out_size, 0));
}

bool async_queue_dequeue_wait(async_queue_t *queue, void *buffer, size_t buffer_size, size_t *out_size,
                              int timeout_ms) {
    LA_FORK_GUARD(false);
    return la_ok(la_q_dequeue(LA_H(queue), buffer, buffer_size, out_size, timeout_ms));
}

bool async_queue_is_empty(const async_queue_t *queue) {
    LA_FORK_GUARD(true);
    int r = 1;
    if (!la_ok(la_q_query(LA_H(queue), 0, &r))) return true;
    return r != 0;
}

bool async_queue_is_full(const async_queue_t *queue) {
    LA_FORK_GUARD(false);
    int r = 0;
    if (!la_ok(la_q_query(LA_H(queue), 1, &r))) return false;
    return r != 0;
}

void async_queue_clear(async_queue_t *queue) {
    LA_FORK_GUARD();
    la_ok(la_q_clear(LA_H(queue)));
}

void async_queue_get_stats(const async_queue_t *queue, async_queue_stats_t *stats) {
    LA_FORK_GUARD();
    if (!stats) {
        la_set_error(ASYNC_E_INVAL);
        return;
    }
    memset(stats, 0, sizeof *stats);
    if (!la_ok(la_q_stats(LA_H(queue), stats))) memset(stats, 0, sizeof *stats);
}

int async_queue_attach(async_queue_t *queue, async_runtime_t *rt, uintptr_t completion_key) {
    LA_FORK_GUARD(-1);
    return la_ok(la_q_attach(LA_H(queue), LA_H(rt), completion_key)) ? 0 : -1;
}

/* ---- runtime ------------------------------------------------------------- */

async_runtime_t *async_runtime_init(void) {
    LA_FORK_GUARD(NULL);
    uint64_t h = 0;
    if (!la_ok(GO(.op = GO_RT_INIT, .p = &h))) return NULL;
    return (async_runtime_t *)(uintptr_t)h;
}

void async_runtime_deinit(async_runtime_t *rt) {
    LA_FORK_GUARD();
    la_ok(GO(.op = GO_RT_DEINIT, .h = LA_H(rt)));
}

static int rt_fd(async_runtime_t *rt, int op, async_fd_t fd, uint32_t events, void *context) {
    LA_FORK_GUARD(-1);
#if defined(_WIN32)
    if (fd > (async_fd_t)INT32_MAX) return la_set_error(ASYNC_E_BADFD), -1;
#endif
    return la_ok(GO(.op = GO_RT_FD, .h = LA_H(rt), .i1 = op, .i2 = (int)fd, .u = events, .k = (uintptr_t)context)) ? 0 : -1;
}

int async_runtime_add(async_runtime_t *rt, async_fd_t fd, uint32_t events, void *context) {
    return rt_fd(rt, 0, fd, events, context);
}

int async_runtime_modify(async_runtime_t *rt, async_fd_t fd, uint32_t events) {
    return rt_fd(rt, 1, fd, events, NULL);
}

int async_runtime_remove(async_runtime_t *rt, async_fd_t fd) { return rt_fd(rt, 2, fd, 0, NULL); }

int async_runtime_wait(async_runtime_t *rt, io_event_t *events, int max_events, int timeout_ms) {
    LA_FORK_GUARD(-1);
    /* On a fiber a wait would block its worker thread (and every fiber
     * queued there) in epoll_wait: refused. A poll (timeout 0) is fine. */
    if (timeout_ms != 0 && timeout_ms >= -1 && la_current_fiber()) {
        la_set_error(ASYNC_E_STATE);
        return -1;
    }
    int n = 0;
    if (!la_ok(GO(.op = GO_RT_WAIT, .h = LA_H(rt), .p = events, .i1 = max_events, .i2 = timeout_ms, .p2 = &n))) return -1;
    return n;
}

int async_runtime_post_completion(async_runtime_t *rt, uintptr_t completion_key, uintptr_t data) {
    LA_FORK_GUARD(-1);
    /* Pure C (completions.c): no Go crossing, safe on a fiber stack as is. */
    return la_ok(la_rt_post(LA_H(rt), completion_key, data)) ? 0 : -1;
}

int async_runtime_wakeup(async_runtime_t *rt) {
    LA_FORK_GUARD(-1);
#if defined(_WIN32)
    /* The doorbell is an IOCP and no signal handler interrupts threads here:
     * ring it through Go (cabi/wakeup_windows.go). */
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
    if (bell->kind == LA_DOORBELL_EVENTFD) {
        uint64_t v = (uint64_t)1 << 32; /* port.WakeupIncrement */
        do r = write(bell->fd, &v, sizeof v);
        while (r < 0 && errno == EINTR);
    } else {
        char c = 'w'; /* port.WakeupByte */
        do r = write(bell->fd, &c, 1);
        while (r < 0 && errno == EINTR);
    }
    la_handle_put(slot);
    /* EAGAIN: the doorbell is already full, the waiter wakes anyway. */
    int ok = r >= 0 || errno == EAGAIN, werr = errno;
    errno = saved;
    if (!ok) {
        la_set_error_os(ASYNC_E_SYS, werr);
        return -1;
    }
    return 0;
#endif
}

uint64_t async_runtime_add_timer(async_runtime_t *rt, uint64_t delay_ms, uint64_t repeat_ms, uintptr_t key) {
    LA_FORK_GUARD(0);
    uint64_t id = 0;
    if (!la_ok(GO(.op = GO_RT_ADD_TIMER, .h = LA_H(rt), .u1 = delay_ms, .u2 = repeat_ms, .k = key, .p = &id))) return 0;
    return id;
}

int async_runtime_cancel_timer(async_runtime_t *rt, uint64_t timer_id) {
    LA_FORK_GUARD(-1);
    return la_ok(GO(.op = GO_RT_CANCEL_TIMER, .h = LA_H(rt), .u1 = timer_id)) ? 0 : -1;
}
