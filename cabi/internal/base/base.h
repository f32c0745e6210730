/* What every subsystem of cabi's C half shares (package base). Not installed.
 * Handles (handles.c), the last-error slot, the fork flag and the entry check
 * LA_ENTRY (errors.c), the monotonic clock and deadlines (clock.c), the log
 * hook (log.c), intrusive lists and a spinlock. Nothing here calls into another subsystem. */
#ifndef LA_BASE_H
#define LA_BASE_H

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "async.h"

/* Handles
 * -------
 * Every handle is an integer disguised as a pointer:
 *   bits  0..23  slot index (from 1; the table holds at most 2^24 slots)
 *   bits 24..31  type (LA_T_*)
 *   bits 32..63  generation of the slot (1..2^32-1)
 * A slot's generation grows by one per handle it carries; a slot whose
 * generation is exhausted is never used again, so a handle value is issued
 * at most once per process and a stale handle never validates again.
 * The slot table lives in C memory that is never freed, so validating any
 * value (NULL, stale, forged, of another type) is a few loads and never
 * dereferences memory the caller handed us. */
#define LA_IDX_BITS 24
#define LA_IDX_MASK ((1u << LA_IDX_BITS) - 1)
/* The slot index of handle h. */
static inline uint32_t la_handle_idx(uint64_t h) { return (uint32_t)h & LA_IDX_MASK; }
enum { LA_T_QUEUE = 1, LA_T_WORKER = 2, LA_T_RUNTIME = 3, LA_T_SCHED = 4, LA_T_FIBER = 5, LA_T_CHAN = 6 };
enum { LA_T_MUTEX = 7, LA_T_COND = 8 }; /* fiber mutexes and condition variables (fiber/sync.c) */
enum { LA_T_SCOPE = 9 };                 /* fiber scopes (fiber/scope.c) */

typedef struct {
    _Atomic uint64_t tag;  /* the live handle value, 0 when free */
    _Atomic uint32_t refs; /* short-lived readers of obj (see la_handle_get) */
    uint32_t gen;          /* last generation used (under the table lock or by
                            * the slot's reserver); UINT32_MAX: exhausted */
    void *obj;             /* C-side object, may be NULL */
} la_slot_t;

uint64_t la_handle_alloc(int type, void *obj);
/* Invalidates h, waits for readers of its slot to leave, frees the slot.
 * Returns the object, or NULL if h was not live. */
void *la_handle_free(uint64_t h, int type);
/* la_handle_free in two steps, for objects recycled with their slot:
 * la_handle_retire invalidates h (and waits for its readers) but keeps the
 * slot reserved; la_handle_reuse publishes a new handle (new generation) in
 * a reserved slot (when the slot's generations are exhausted it releases the
 * slot and allocates another: the caller takes the slot index from the
 * returned handle); la_handle_release returns a reserved slot to the table. */
void *la_handle_retire(uint64_t h, int type);
uint64_t la_handle_reuse(uint32_t idx, int type, void *obj);
void la_handle_release(uint32_t idx);
/* Validates h and pins its slot: the object stays valid until
 * la_handle_put(). NULL if h is not a live handle of that type. */
void *la_handle_get(uint64_t h, int type, la_slot_t **slot);
void la_handle_put(la_slot_t *slot);
/* h's object without pinning: NULL unless h was live during the call. For
 * objects that are never freed (only recycled as the same type), which the
 * caller checks again under its own lock (the queues, queue.c). */
void *la_handle_peek(uint64_t h, int type);
/* 1 if h is a live handle of that type (no pinning). */
int la_handle_live(uint64_t h, int type);

#define LA_H(p) ((uint64_t)(uintptr_t)(p))

/* The two descriptors reserved at load for Go's own poller (fdreserve.c):
 * closes them (StartGoPoller, just before Go starts its poller); returns how
 * many there were (0 on Windows, or when loading found no free ones). */
int la_fd_reserve_release(void);
/* Opens and closes n (<= 8) descriptors: 0 if they were free, else the errno. */
int la_fd_probe(int n);
/* 1 once Go's own poller was started (gopoller.go). */
extern _Atomic int la_go_poller_up;
/* Starts Go's own poller if it is not yet (base.StartGoPoller, a Go export:
 * never call it on a fiber stack; la_ensure_go_poller in fiber.h does the
 * trap). Returns 0 or the errno that kept it unstarted (EMFILE). */
int la_go_start_poller(void);
/* Does nothing, in Go (base.go): binds the calling thread to Go's runtime
 * (la_call_off_fiber, fiber/offstack.c). Never call it on a fiber stack. */
void la_go_bind(void);

/* Errors and fork detection (errors.c). */
/* Records the calling thread's (or fiber's) last error. la_set_error keeps
 * the OS error noted by la_note_os_error for ASYNC_E_SYS and clears it for
 * any other code; la_set_error_os sets both (os ignored unless code is
 * ASYNC_E_SYS). Every ASYNC_E_SYS is recorded with its errno this way. */
void la_set_error(int code);
void la_set_error_os(int code, int os);
void la_note_os_error(int os);
/* How the error functions find the running fiber's own slots (NULL off a
 * fiber): its last error and its OS error. The fiber layer sets them once,
 * at load. */
void la_set_error_slot_hooks(int *(*err)(void), int *(*os)(void));
extern _Atomic int la_forked;

/* The entry check of every public function: a forked child is refused
 * (ASYNC_E_FORKED) before anything else runs, Go in particular. */
#define LA_ENTRY(fail)                                                                                       \
    do {                                                                                                     \
        if (__builtin_expect(atomic_load_explicit(&la_forked, memory_order_relaxed), 0)) {                   \
            la_set_error(ASYNC_E_FORKED);                                                                    \
            return fail;                                                                                     \
        }                                                                                                    \
    } while (0)

/* rc is an async_err_t: record it and report success or failure. */
static inline int la_ok(int rc) {
    if (__builtin_expect(rc != 0, 0)) {
        la_set_error(rc);
        return 0;
    }
    return 1;
}

#define LA_H(p) ((uint64_t)(uintptr_t)(p))


/* ---- monotonic clock and deadlines (clock.c) ------------------------------ */
/* Nanoseconds of CLOCK_MONOTONIC (QueryPerformanceCounter on Windows). */
uint64_t la_now_ns(void);
/* The deadline timeout_ms from now, 0 for "forever" (timeout_ms < 0). */
uint64_t la_deadline(int timeout_ms);
/* Whole milliseconds from now until deadline, rounded up (a sleep never
 * ends early) and capped at INT32_MAX (a longer wait wakes once early and
 * looks again): -1 for "forever" (deadline 0), 0 once it has passed. The
 * timeout to hand to poll, epoll_wait and the like. */
int la_ms_left(uint64_t deadline);
/* A caller's timeout_ms is -1 (forever), 0 (do not wait) or a count of ms:
 * 0 if so, else ASYNC_E_INVAL recorded as the thread's error and -1. */
static inline int la_check_timeout(int timeout_ms) {
    if (timeout_ms < -1) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    return 0;
}
/* Initializes cv to time its waits on CLOCK_MONOTONIC (where the platform
 * allows: not macOS, not Windows), as la_now_ns and la_deadline count. */
void la_cond_init_mono(pthread_cond_t *cv);
/* pthread_cond_timedwait on a cv made by la_cond_init_mono, until abs on
 * CLOCK_MONOTONIC (on Windows: CLOCK_REALTIME, winpthreads' clock). macOS
 * has no pthread_condattr_setclock: there the time left until abs is
 * measured on CLOCK_MONOTONIC and handed to
 * pthread_cond_timedwait_relative_np, so a step of the wall clock neither
 * ends a wait early nor stretches it. 0, ETIMEDOUT or another errno, like
 * pthread_cond_timedwait (ETIMEDOUT without unlocking when abs is past). */
static inline int la_cond_timedwait_mono(pthread_cond_t *cv, pthread_mutex_t *mu, const struct timespec *abs) {
#if defined(__APPLE__)
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t ns = ((int64_t)abs->tv_sec - (int64_t)now.tv_sec) * 1000000000 + (abs->tv_nsec - now.tv_nsec);
    if (ns <= 0) return ETIMEDOUT;
    struct timespec rel = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    return pthread_cond_timedwait_relative_np(cv, mu, &rel);
#else
    return pthread_cond_timedwait(cv, mu, abs);
#endif
}
/* The absolute time for pthread_cond_timedwait on a la_cond_init_mono cv
 * that a la_now_ns deadline (ns) stands for: the deadline itself where the cv
 * counts CLOCK_MONOTONIC; on macOS and Windows (system clock) now + what is
 * left of it, and then a wait that times out must check la_now_ns: the two
 * clocks drift (a wait may end a little before the deadline). */
struct timespec la_cond_abstime(uint64_t deadline_ns);

/* ---- cancellation ------------------------------------------------------------ */
/* No libasync function is a cancellation point (include/async.h,
 * conventions): a host's pthread_cancel of a thread asleep inside libasync
 * would unwind it with waiter records on its stack still linked, locks held
 * or a runtime's waiting flag up. So a host's thread about to sleep inside
 * libasync (a cond wait, epoll_wait, poll, nanosleep, pthread_join) disables
 * cancellation first, on the slow path only, and the call puts the old
 * state back just before it returns (not right after the sleep: a read or
 * write of a doorbell later in the same call is a cancellation point too).
 * A pending cancel then acts at the host's next cancellation point; nothing
 * here calls pthread_testcancel (acting on it after the call completed
 * would lose its result, a dequeued message, say). *cs starts as
 * LA_CANCEL_KEPT; enter and leave may be called any number of times. */
#define LA_CANCEL_KEPT (-1)
static inline void la_nocancel_enter(int *cs) {
#if !defined(_WIN32)
    if (*cs == LA_CANCEL_KEPT) pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, cs);
#else
    (void)cs;
#endif
}
static inline void la_nocancel_leave(int *cs) {
#if !defined(_WIN32)
    if (*cs != LA_CANCEL_KEPT) {
        int old;
        pthread_setcancelstate(*cs, &old);
        *cs = LA_CANCEL_KEPT;
    }
#else
    (void)cs;
#endif
}

/* write(2) and read(2) for the calls that do not sleep but touch a
 * descriptor: a doorbell's ring (async_runtime_wakeup, a post or a signal
 * that finds the loop asleep) and its drain. libc's write and read are
 * cancellation points even when they do not block: a deferred cancel that
 * is pending when the host calls async_runtime_wakeup, say, would act in
 * there, with the runtime's handle pinned (its deinit then spins forever)
 * or its waiting flag up. On Linux these are the raw system calls, which
 * are not cancellation points (syscall(2) in glibc and musl); elsewhere
 * libc's (cancellation points there). Both are
 * async-signal-safe and set errno as write and read do. */
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
static inline ssize_t la_write_nc(int fd, const void *buf, size_t n) { return (ssize_t)syscall(SYS_write, fd, buf, n); }
static inline ssize_t la_read_nc(int fd, void *buf, size_t n) { return (ssize_t)syscall(SYS_read, fd, buf, n); }
#elif !defined(_WIN32)
#include <unistd.h>
static inline ssize_t la_write_nc(int fd, const void *buf, size_t n) { return write(fd, buf, n); }
static inline ssize_t la_read_nc(int fd, void *buf, size_t n) { return read(fd, buf, n); }
#endif

/* ---- signal ownership (sigown.c) ------------------------------------------ */
#if !defined(_WIN32)
/* One owner of the process-wide disposition of each signal libasync
 * catches, shared by its features (LA_SIGOWN_WATCH: rt/sigwatch.c's signal
 * watches; LA_SIGOWN_DUMP: fiber/tools.c's dump on a signal). The first
 * feature to take a signal installs the common handler (SA_SIGINFO |
 * SA_ONSTACK | SA_RESTART) and saves the host's action, once; the last one
 * to drop it puts that action back, unless the host installed another one
 * since. The handler calls fn(sig) of each feature holding the signal (fn
 * must be async-signal-safe; it may still run once just after its drop
 * returned) and fn returns nonzero if it took the signal (counted it for a
 * watch, dumped). A signal that no fn took after the last drop began is
 * raised again, to go to the host's action: so a feature publishes its
 * watches before la_sigown_take and withdraws them only after
 * la_sigown_drop, and then no signal is lost to the swap. In a forked child
 * the handler puts back the host's action and raises the signal again. A
 * feature takes a signal once (its own count of users decides when) and
 * drops it once. la_sigown_take returns 0 or an async_err_t (ASYNC_E_SYS
 * with the errno noted). Thread-safe (a process-wide lock; callers may hold
 * their own lock, taken before it). */
#define LA_SIGOWN_N 65
enum { LA_SIGOWN_WATCH, LA_SIGOWN_DUMP, LA_SIGOWN_USERS };
typedef int (*la_sigown_fn)(int sig);
int la_sigown_take(int sig, int user, la_sigown_fn fn);
void la_sigown_drop(int sig, int user);
#endif

/* ---- the log hook (log.c) ------------------------------------------------- */
/* Every message for the host goes through these (async_set_log_handler).
 * la_log formats (printf) and drops the message at once when its level is
 * filtered out; la_log_str is async-signal-safe when the host's handler is
 * (and always with the default handler). */
void la_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void la_log_str(int level, const char *msg);
int la_log_enabled(int level);

/* ---- intrusive lists ---------------------------------------------------------- */
/* Doubly-linked FIFO lists of waiter nodes that live on the waiters' stacks
 * (channels, fiber mutexes and condition variables, queue waits): a list
 * type with `head` and `tail`, a node type with `prev`, `next` and `listed`.
 * LA_LIST_DEFINE(name, list_t, node_t) defines name_push (append; the node
 * is then listed) and name_remove (unlink, if listed). No locking: the
 * owner's lock is held. */
#define LA_LIST_DEFINE(name, list_t, node_t)                                                                 \
    static inline void name##_push(list_t *l, node_t *n) {                                                   \
        n->next = NULL;                                                                                      \
        n->prev = l->tail;                                                                                   \
        if (l->tail)                                                                                         \
            l->tail->next = n;                                                                               \
        else                                                                                                 \
            l->head = n;                                                                                     \
        l->tail = n;                                                                                         \
        n->listed = 1;                                                                                       \
    }                                                                                                        \
    static inline void name##_remove(list_t *l, node_t *n) {                                                 \
        if (!n->listed) return;                                                                              \
        if (n->prev)                                                                                         \
            n->prev->next = n->next;                                                                         \
        else                                                                                                 \
            l->head = n->next;                                                                               \
        if (n->next)                                                                                         \
            n->next->prev = n->prev;                                                                         \
        else                                                                                                 \
            l->tail = n->prev;                                                                               \
        n->listed = 0;                                                                                       \
    }

/* ---- spinlock (held for a few instructions only; never across a switch) --- */
typedef struct {
    _Atomic int v;
} la_spin_t;

static inline void la_spin_lock(la_spin_t *l) {
    for (int n = 0;; n++) {
        if (!atomic_exchange_explicit(&l->v, 1, memory_order_acquire)) return;
        while (atomic_load_explicit(&l->v, memory_order_relaxed)) {
            if (++n > 100) sched_yield();
#if defined(__x86_64__)
            else __builtin_ia32_pause();
#elif defined(__aarch64__)
            else __asm__ volatile("yield");
#endif
        }
    }
}
static inline void la_spin_unlock(la_spin_t *l) { atomic_store_explicit(&l->v, 0, memory_order_release); }

#endif
