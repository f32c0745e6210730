/* The error half of every public function: the calling thread's (or
 * fiber's) last-error slot, async_strerror's table, the fork flag that the
 * entry macro LA_ENTRY (base.h) checks, and the library's version string. */
#include <pthread.h>

#include "base.h"

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

/* The fiber layer registers how to find the running fiber's slots (below
 * the subsystems, base calls nobody: the hooks keep the C call graph
 * acyclic). */
static int *(*error_slot_hook)(void);
static int *(*os_error_slot_hook)(void);

void la_set_error_slot_hooks(int *(*err)(void), int *(*os)(void)) {
    error_slot_hook = err;
    os_error_slot_hook = os;
}

static inline int *la_error_slot(void) { return error_slot_hook ? error_slot_hook() : NULL; }

/* On a fiber (also while it runs a Go call on its worker's stack) the slot
 * is the fiber's own: a fiber may resume on another thread. Not inlined, so
 * that the TLS address is never cached across a switch. */
__attribute__((noinline)) static int *os_error_slot(void) {
    int *slot = os_error_slot_hook ? os_error_slot_hook() : NULL;
    return slot ? slot : &last_os_error;
}

__attribute__((noinline)) void la_set_error(int code) {
    int *slot = la_error_slot();
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
    int *slot = la_error_slot();
    return slot ? *slot : last_error;
}

int async_last_os_error(void) {
    int *slot = la_error_slot();
    int code = slot ? *slot : last_error;
    return code == ASYNC_E_SYS ? *os_error_slot() : 0;
}

__attribute__((noinline)) void async_clear_error(void) {
    int *slot = la_error_slot();
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
    [ASYNC_E_TOOBIG] = "too large: a message over the queue's max_msg_size, a datagram, or a reader's frame",
    [ASYNC_E_BUFSIZE] = "buffer too small for the message",
    [ASYNC_E_EMPTY] = "queue or channel is empty",
    [ASYNC_E_FULL] = "queue or channel is full",
    [ASYNC_E_TIMEDOUT] = "timed out",
    [ASYNC_E_CLOSED] = "closed: destroyed while the call waited, a closed channel, or a reset connection",
    [ASYNC_E_BUSY] = "busy: another caller already waits there (runtime wait, fd direction, join)",
    [ASYNC_E_EXISTS] = "already registered, or address in use",
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


