/* The public C API of include/async.h for the queue and the runtime.
 *
 * Each function is a small C shim: it refuses calls in a forked child before
 * touching Go, calls the la_go_* export, and records the error code in the
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
#include "la.h"

#define LA_STR2(x) #x
#define LA_STR(x) LA_STR2(x)

const char *async_version_string(void) {
    return LA_STR(ASYNC_VERSION_MAJOR) "." LA_STR(ASYNC_VERSION_MINOR) "." LA_STR(ASYNC_VERSION_PATCH);
}

/* ---- errors -------------------------------------------------------------- */

static __thread int last_error;

/* Not inlined on purpose: later, on a fiber, the slot is per fiber. */
__attribute__((noinline)) void la_set_error(int code) { last_error = code; }

int async_last_error(void) { return last_error; }

void async_clear_error(void) { last_error = ASYNC_OK; }

static const char *const messages[] = {
    [ASYNC_OK] = "success",
    [ASYNC_E_INVAL] = "invalid argument",
    [ASYNC_E_BADHANDLE] = "invalid handle (NULL, destroyed, or of another type)",
    [ASYNC_E_NOMEM] = "out of memory or handles",
    [ASYNC_E_TOOBIG] = "message larger than the queue's max_msg_size",
    [ASYNC_E_BUFSIZE] = "buffer too small for the message",
    [ASYNC_E_EMPTY] = "queue is empty",
    [ASYNC_E_FULL] = "queue is full",
    [ASYNC_E_TIMEDOUT] = "timed out",
    [ASYNC_E_CLOSED] = "object destroyed while the call waited on it",
    [ASYNC_E_BUSY] = "another thread is already waiting on this runtime",
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

static void on_fork_child(void) { atomic_store(&la_forked, 1); }

__attribute__((constructor)) static void la_init(void) { pthread_atfork(NULL, NULL, on_fork_child); }

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

/* ---- queue --------------------------------------------------------------- */

async_queue_t *async_queue_create(size_t capacity, size_t max_msg_size, async_queue_flags_t flags) {
    LA_FORK_GUARD(NULL);
    uint64_t h = 0;
    if (!la_ok(la_go_queue_create(capacity, max_msg_size, (unsigned)flags, &h))) return NULL;
    return (async_queue_t *)(uintptr_t)h;
}

void async_queue_destroy(async_queue_t *queue) {
    LA_FORK_GUARD();
    la_ok(la_go_queue_destroy(LA_H(queue)));
}

bool async_queue_enqueue(async_queue_t *queue, const void *data, size_t size) {
    LA_FORK_GUARD(false);
    return la_ok(la_go_queue_enqueue(LA_H(queue), (void *)data, size, -1, 0));
}

bool async_queue_enqueue_wait(async_queue_t *queue, const void *data, size_t size, int timeout_ms) {
    LA_FORK_GUARD(false);
    return la_ok(la_go_queue_enqueue(LA_H(queue), (void *)data, size, timeout_ms, 1));
}

bool async_queue_dequeue(async_queue_t *queue, void *buffer, size_t buffer_size, size_t *out_size) {
    LA_FORK_GUARD(false);
    return la_ok(la_go_queue_dequeue(LA_H(queue), buffer, buffer_size, out_size, 0));
}

bool async_queue_dequeue_wait(async_queue_t *queue, void *buffer, size_t buffer_size, size_t *out_size,
                              int timeout_ms) {
    LA_FORK_GUARD(false);
    return la_ok(la_go_queue_dequeue(LA_H(queue), buffer, buffer_size, out_size, timeout_ms));
}

bool async_queue_is_empty(const async_queue_t *queue) {
    LA_FORK_GUARD(true);
    int r = 1;
    if (!la_ok(la_go_queue_query(LA_H(queue), 0, &r))) return true;
    return r != 0;
}

bool async_queue_is_full(const async_queue_t *queue) {
    LA_FORK_GUARD(false);
    int r = 0;
    if (!la_ok(la_go_queue_query(LA_H(queue), 1, &r))) return false;
    return r != 0;
}

void async_queue_clear(async_queue_t *queue) {
    LA_FORK_GUARD();
    la_ok(la_go_queue_clear(LA_H(queue)));
}

void async_queue_get_stats(const async_queue_t *queue, async_queue_stats_t *stats) {
    LA_FORK_GUARD();
    if (!stats) {
        la_set_error(ASYNC_E_INVAL);
        return;
    }
    memset(stats, 0, sizeof *stats);
    la_ok(la_go_queue_stats(LA_H(queue), stats));
}

int async_queue_attach(async_queue_t *queue, async_runtime_t *rt, uintptr_t completion_key) {
    LA_FORK_GUARD(-1);
    return la_ok(la_go_queue_attach(LA_H(queue), LA_H(rt), completion_key)) ? 0 : -1;
}

/* ---- runtime ------------------------------------------------------------- */

async_runtime_t *async_runtime_init(void) {
    LA_FORK_GUARD(NULL);
    uint64_t h = 0;
    if (!la_ok(la_go_rt_init(&h))) return NULL;
    return (async_runtime_t *)(uintptr_t)h;
}

void async_runtime_deinit(async_runtime_t *rt) {
    LA_FORK_GUARD();
    la_ok(la_go_rt_deinit(LA_H(rt)));
}

static int rt_fd(async_runtime_t *rt, int op, async_fd_t fd, uint32_t events, void *context) {
    LA_FORK_GUARD(-1);
#if defined(_WIN32)
    if (fd > (async_fd_t)INT32_MAX) return la_set_error(ASYNC_E_BADFD), -1;
#endif
    return la_ok(la_go_rt_fd(LA_H(rt), op, (int)fd, events, (uintptr_t)context)) ? 0 : -1;
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
    int n = 0;
    if (!la_ok(la_go_rt_wait(LA_H(rt), events, max_events, timeout_ms, &n))) return -1;
    return n;
}

int async_runtime_post_completion(async_runtime_t *rt, uintptr_t completion_key, uintptr_t data) {
    LA_FORK_GUARD(-1);
    /* Pure C (completions.c): no Go crossing. */
    return la_ok(la_rt_post(LA_H(rt), completion_key, data)) ? 0 : -1;
}

int async_runtime_wakeup(async_runtime_t *rt) {
    LA_FORK_GUARD(-1);
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
    int ok = r >= 0 || errno == EAGAIN;
    errno = saved;
    if (!ok) {
        la_set_error(ASYNC_E_SYS);
        return -1;
    }
    return 0;
}

uint64_t async_runtime_add_timer(async_runtime_t *rt, uint64_t delay_ms, uint64_t repeat_ms, uintptr_t key) {
    LA_FORK_GUARD(0);
    uint64_t id = 0;
    if (!la_ok(la_go_rt_add_timer(LA_H(rt), delay_ms, repeat_ms, key, &id))) return 0;
    return id;
}

int async_runtime_cancel_timer(async_runtime_t *rt, uint64_t timer_id) {
    LA_FORK_GUARD(-1);
    return la_ok(la_go_rt_cancel_timer(LA_H(rt), timer_id)) ? 0 : -1;
}
