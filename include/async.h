/*
 * libasync: an async runtime for C programs, built in Go.
 *
 * This header is the reference. Every function is documented where it is
 * declared: what it does, whether it is thread-safe, whether it blocks or
 * parks, and its errors. It compiles as C99 and C++11 (declarations in
 * extern "C"). Link with -lasync (libasync.so), or with libasync.a plus
 * -lpthread -ldl; pkg-config and CMake: README.md, "Linking".
 *
 * What it offers
 *  - Errors and logging: a failed call says so in its return value and
 *    async_last_error() tells why; async_set_log_handler receives the
 *    library's messages.
 *  - async_queue: a thread-safe FIFO of copied, bounded-size messages, with
 *    full policies (drop the oldest, or block the writer), timed waits, and
 *    a hook that posts a completion to an event loop when it gets data.
 *  - async_worker: a managed thread running a C procedure, with a graceful
 *    stop, a timed join and the procedure's result.
 *  - async_runtime: one event loop per host thread; a single wait call
 *    reports fd readiness, completions posted by any thread, timers and
 *    POSIX signals.
 *  - Fibers: stackful C coroutines on an M:N work-stealing scheduler
 *    (async_sched_*, async_fiber_*) with channels, mutexes and condition
 *    variables, fiber-local storage, fd and socket calls, signal waits, a
 *    pool for blocking calls, and debugging aids (names, dumps, a stall
 *    detector). The same calls block normally on a plain thread.
 *
 * Where to start
 *  - An event loop: async_runtime_init, then async_runtime_add (fds),
 *    async_runtime_add_timer, async_runtime_post_completion, and
 *    async_runtime_wait in a loop. Run a blocking call off the loop with
 *    async_runtime_submit_work (its result comes back as a completion), or
 *    hand work to async_worker threads through an async_queue attached to
 *    the loop (async_queue_attach). README.md has a 20-line example.
 *  - Many connections in straight-line code: async_sched_create,
 *    async_fiber_spawn, async_fiber_accept / read / write, async_sched_run.
 *  - The conventions below hold for every function; read them first.
 *
 * Guides: docs/EVENT_LOOP.md, docs/QUEUES_AND_WORKERS.md, docs/FIBERS.md,
 * docs/SERVERS.md, docs/EMBEDDING.md (the Go runtime inside a C host),
 * docs/DEBUGGING.md, docs/PLATFORMS.md. The classic lib/async API
 * (include/async/): docs/CLASSIC_API.md.
 */

/*
 * Conventions used by every function below
 * -----------------------------------------
 *  - Handles (async_queue_t *, async_worker_t *, async_runtime_t *,
 *    async_sched_t *, async_fiber_t *, async_scope_t *, async_chan_t *,
 *    async_mutex_t *, async_cond_t *) are opaque values, never pointers to
 *    memory you may read. Each call validates its handle: NULL, a destroyed
 *    handle, or a value that is not a handle of that type fails with
 *    ASYNC_E_BADHANDLE; it never crashes. A handle value is never issued
 *    twice in a process: a destroyed handle stays invalid however many
 *    objects are created after it.
 *  - Results: functions returning int or ssize_t return 0 (or a count) on
 *    success and -1 on failure; async_fiber_accept returns -1 on failure.
 *    Functions returning bool return false on failure. Functions returning a
 *    handle or id return NULL / 0 on failure. After any failure
 *    async_last_error() tells the calling thread (on a fiber: the calling
 *    fiber) why.
 *  - Successful calls do not reset async_last_error(). To tell whether a
 *    call failed whose return value cannot show it (the void functions, and
 *    those whose answer for an invalid handle is also a valid answer:
 *    async_queue_is_empty, async_queue_is_full, async_worker_should_stop,
 *    async_worker_get_state, async_worker_result,
 *    async_worker_get_native_handle, async_fiber_getspecific), call
 *    async_clear_error() before it and check async_last_error() after.
 *  - Errors: each function's comment lists its errors. Two apply to every
 *    function and are not repeated: ASYNC_E_FORKED (below) and
 *    ASYNC_E_INTERNAL (a bug inside libasync was caught and turned into an
 *    error instead of crashing the host).
 *  - "Thread-safe" means any number of threads may call it concurrently on the
 *    same handle. Every function is, except async_runtime_wait (one thread at
 *    a time per runtime). Destroying a handle while other threads still use
 *    it is safe in the sense that those calls fail with ASYNC_E_BADHANDLE or
 *    ASYNC_E_CLOSED instead of crashing; it is still a bug in the caller.
 *  - "Blocks" means the calling thread may sleep. Only these block:
 *    async_queue_enqueue (on a BLOCK_WRITER queue), async_queue_enqueue_wait,
 *    async_queue_dequeue_wait, async_worker_join, async_runtime_wait,
 *    async_sched_run, async_sched_shutdown, async_sched_destroy, and, on a
 *    plain thread, the calls that park (a few others name a short wait in
 *    their comment: a write of async_sched_dump to a full pipe, turning the
 *    stall detector off, the close(2) of async_fiber_close). "Parks" means: called on a fiber,
 *    the call suspends only that fiber (its worker thread runs other fibers
 *    meanwhile); called on a plain thread, it blocks the thread. No call
 *    blocks a fiber's worker thread: on a fiber the queue waits park, and
 *    the calls that would block the thread fail with ASYNC_E_STATE or only
 *    start their work (see each one).
 *  - No libasync function is a cancellation point: a pthread_cancel of a
 *    thread asleep inside a libasync call (a queue, channel, mutex,
 *    condition, join or signal wait, async_runtime_wait, async_worker_join,
 *    async_fiber_sleep, async_sched_shutdown or _destroy, turning the stall
 *    detector off) does not act there: the waits disable cancellation while
 *    they sleep and restore the thread's state on return. The call ends as
 *    it would have (its result, a dequeued message say, is the thread's),
 *    and the cancel takes effect at the thread's next cancellation point
 *    outside libasync. Exceptions: the I/O itself of the fiber fd functions
 *    on a plain thread (read, write, connect, accept: the libc calls,
 *    cancellation points as usual), and the idle sleep of a thread that runs
 *    a scheduler (async_sched_run). The calls that do not sleep use no
 *    cancellation point on Linux; on macOS and the BSDs a cancel already
 *    pending when a thread enters libasync may act at one of their
 *    non-blocking reads or writes of a doorbell (there, cancel threads only
 *    while they wait, or disable cancellation around libasync calls). Not
 *    on Windows (no pthread_cancel).
 *  - After fork() only the child's exec is supported: every call made in the
 *    child fails at once with ASYNC_E_FORKED (it never hangs), except
 *    async_version, async_version_string, async_strerror, async_last_error,
 *    async_last_os_error, async_clear_error, async_set_log_handler and
 *    async_worker_current, which work as usual, async_fiber_current, which
 *    returns NULL (the child has no fibers, even when fork() was called on
 *    one), async_fiber_cancelled, which returns 0, and async_fiber_yield
 *    (sched_yield). The child is known by the
 *    library's pthread_atfork handler: a child made by _Fork() or a raw
 *    clone(2) runs none, is not known, and must not call libasync at all (as
 *    with any function that is not async-signal-safe in the child of a
 *    threaded process).
 *  - Timeouts are in milliseconds: -1 waits forever, 0 does not wait, n > 0
 *    waits at least n ms. Other negative values fail with ASYNC_E_INVAL.
 *    What a call with timeout 0 reports when it cannot complete at once is
 *    given in its comment (ASYNC_E_EMPTY / ASYNC_E_FULL for the queue and
 *    channel calls, ASYNC_E_BUSY for a mutex, ASYNC_E_TIMEDOUT elsewhere).
 *  - Signal handlers the host installs must use SA_ONSTACK (sigaction). The
 *    library runs a Go runtime whose threads (and the host's threads while
 *    they are inside a libasync call) run on small stacks; a handler without
 *    SA_ONSTACK that lands there can crash the process ("traceback did not
 *    unwind completely", SIGSEGV). See docs/EMBEDDING.md.
 *  - Out of memory: memory the library keeps in C (queues, completions,
 *    timers, fibers and their stacks, channels) running out is
 *    ASYNC_E_NOMEM. What lives in the Go runtime's heap (a runtime and its
 *    fd registrations: async_runtime_init, async_runtime_add) cannot fail
 *    that way: when the process has no address space left for it
 *    (RLIMIT_AS, ulimit -v) Go ends the process ("fatal error: out of
 *    memory"), and so it does when it cannot start a thread it needs.
 *    docs/EMBEDDING.md says how much address space to allow.
 *  - The classic lib/async queue and worker API: the async_queue_* and
 *    async_worker_* functions of the classic async_queue.h and
 *    async_worker.h are declared here with the same names, signatures,
 *    types and values, so such code compiles against this header. One
 *    behaviour differs: async_worker_destroy of a worker whose procedure
 *    still runs asks it to stop and detaches it (the classic API required a
 *    join first). async_worker_get_stop_event is not declared here: use
 *    async_worker_stop_fd or async_worker_should_stop. The classic headers
 *    themselves, with the classic event loop: include/async/ and
 *    docs/CLASSIC_API.md.
 */
#ifndef ASYNC_H
#define ASYNC_H

#include <stddef.h>
#include <stdint.h>
#if !defined(_WIN32)
#include <pthread.h>
#include <sys/socket.h>
#include <sys/types.h>
#else
#include <winsock2.h>
#include <ws2tcpip.h> /* socklen_t */
#if defined(_MSC_VER)
#include <basetsd.h>
typedef SSIZE_T ssize_t;
#endif
#endif
#if !defined(__cplusplus)
#include <stdbool.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define ASYNC_VERSION_MAJOR 0
#define ASYNC_VERSION_MINOR 1
#define ASYNC_VERSION_PATCH 0
/* The header's version as one comparable number, MAJOR*10000 + MINOR*100 +
 * PATCH (0.1.0 is 100, 1.2.3 is 10203); usable in #if. */
#define ASYNC_VERSION_NUMBER (ASYNC_VERSION_MAJOR * 10000 + ASYNC_VERSION_MINOR * 100 + ASYNC_VERSION_PATCH)
/* Non-zero when the header is version major.minor.patch or later; usable in
 * #if: #if ASYNC_VERSION_AT_LEAST(0, 2, 0) ... #endif */
#define ASYNC_VERSION_AT_LEAST(major, minor, patch)                                                          \
    (ASYNC_VERSION_NUMBER >= (major) * 10000 + (minor) * 100 + (patch))

/* The version of the library you run against (which may differ from the
 * header's ASYNC_VERSION_NUMBER you compiled with), as MAJOR*10000 +
 * MINOR*100 + PATCH. Thread-safe; never blocks; never fails; works as usual
 * in a forked child. */
int async_version(void);

/* The library's version as "MAJOR.MINOR.PATCH". Never NULL; thread-safe;
 * never blocks; works as usual in a forked child. */
const char *async_version_string(void);

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum {
    ASYNC_OK = 0,
    ASYNC_E_INVAL = 1,      /* invalid argument (NULL pointer, zero size, bad flags or timeout) */
    ASYNC_E_BADHANDLE = 2,  /* NULL, destroyed, or not a handle of this type */
    ASYNC_E_NOMEM = 3,      /* out of memory or out of handles */
    ASYNC_E_TOOBIG = 4,     /* message larger than the queue's max_msg_size; a datagram or reader frame too long */
    ASYNC_E_BUFSIZE = 5,    /* buffer too small; the needed size is in *out_size */
    ASYNC_E_EMPTY = 6,      /* nothing to dequeue or receive */
    ASYNC_E_FULL = 7,       /* queue full (no DROP_OLDEST / BLOCK_WRITER policy) or channel full */
    ASYNC_E_TIMEDOUT = 8,   /* the timeout expired */
    ASYNC_E_CLOSED = 9,     /* destroyed while the call waited on it; a closed channel; a reset or refused connection */
    ASYNC_E_BUSY = 10,      /* another caller already waits there: async_runtime_wait, an fd direction, a join; a fiber mutex is owned (trylock) */
    ASYNC_E_EXISTS = 11,    /* fd already registered with this runtime; an address in use */
    ASYNC_E_NOTFOUND = 12,  /* fd or timer not registered with this runtime */
    ASYNC_E_BADFD = 13,     /* not an open file descriptor (or not pollable) */
    ASYNC_E_SYS = 14,       /* an operating-system call failed unexpectedly */
    ASYNC_E_INTERNAL = 15,  /* a bug inside libasync was caught (never crashes the host) */
    ASYNC_E_CANCELLED = 16, /* the operation was cancelled */
    ASYNC_E_NOTSUP = 17,    /* not supported on this platform or build */
    ASYNC_E_FORKED = 18,    /* called in a child process after fork(); only exec is supported */
    ASYNC_E_STATE = 19      /* the object is not in a state that allows this call */
} async_err_t;

/* A static English description of an error code; unknown codes give
 * "unknown error". Never NULL; thread-safe; async-signal-safe; never blocks. */
const char *async_strerror(int code);

/* The code of the calling thread's last failed libasync call (ASYNC_OK if none
 * failed yet, or since async_clear_error). Thread-local; never blocks. */
int async_last_error(void);

/* The operating-system error number (errno; on Windows the Win32 or
 * Winsock error code) behind the calling thread's last error when that is
 * ASYNC_E_SYS; 0 when the last error is anything else (also ASYNC_OK), or
 * when the failed OS call gave no number. Set and reset together with
 * async_last_error (on a fiber it is the fiber's, like async_last_error).
 * Thread-local; never blocks; never sets an error. */
int async_last_os_error(void);

/* Resets the calling thread's last error to ASYNC_OK (and its OS error to
 * 0). Thread-local; never blocks. */
void async_clear_error(void);

/* ------------------------------------------------------------------------ */
/* Logging                                                                   */
/* ------------------------------------------------------------------------ */

/* Levels of the messages libasync writes for the host; a handler set with
 * level L receives every message whose level is <= L. */
#define ASYNC_LOG_OFF (-1)  /* as a handler's level: no message at all */
#define ASYNC_LOG_FATAL 0   /* the process is about to end (a fiber stack overflow) */
#define ASYNC_LOG_ERROR 1   /* a failure inside libasync (an internal error caught) */
#define ASYNC_LOG_WARN 2    /* misuse or a condition the host should know about */
#define ASYNC_LOG_INFO 3    /* rare, useful events */
#define ASYNC_LOG_DEBUG 4   /* detail for whoever debugs libasync */

/* A log handler: level is one of ASYNC_LOG_FATAL..ASYNC_LOG_DEBUG; msg is
 * one line without the trailing newline, valid only during the call (a
 * control character in what a message quotes, e.g. an environment
 * variable's value, arrives escaped: \n, \r, \t, \xHH); ctx is what was
 * given to async_set_log_handler. */
typedef void (*async_log_fn)(int level, const char *msg, void *ctx);

/* Sends every message of level <= `level` to fn(level, msg, ctx) from now
 * on, and drops the others. fn NULL restores the default handler, which
 * writes "libasync: <msg>" and a newline to stderr (fd 2) with one write;
 * the default level is ASYNC_LOG_WARN. level ASYNC_LOG_OFF silences
 * everything.
 *
 * The handler may be called from any thread, several at once: the host's
 * threads, libasync's worker and fiber threads (on a fiber's stack, where it
 * must not block the thread for long), and for ASYNC_LOG_FATAL from a signal
 * handler (a fiber stack overflow) just before the process aborts, so what
 * it does for ASYNC_LOG_FATAL must be async-signal-safe. It must not call
 * async_set_log_handler. errno is preserved around it.
 *
 * Thread-safe; never blocks. After it returns no new message goes to the
 * old handler, but a message another thread was delivering at that moment
 * may still reach it (so keep the old ctx valid); each distinct (level,
 * fn, ctx) ever set keeps a 32-byte record for the life of the process
 * (setting it again reuses it, also when threads set it at once; finding
 * it costs O(1) on average). Errors: ASYNC_E_INVAL
 * (level outside ASYNC_LOG_OFF..ASYNC_LOG_DEBUG), ASYNC_E_NOMEM. Works as
 * usual in a forked child. */
int async_set_log_handler(int level, async_log_fn fn, void *ctx);

/* ------------------------------------------------------------------------ */
/* async_queue: a thread-safe FIFO of copied, bounded-size messages           */
/* ------------------------------------------------------------------------ */

typedef struct async_queue_s async_queue_t;
typedef struct async_runtime_s async_runtime_t;

typedef enum {
    ASYNC_QUEUE_DROP_OLDEST = 0x01,    /* full: drop the head, count it, succeed */
    ASYNC_QUEUE_BLOCK_WRITER = 0x02,   /* full: enqueue waits for room */
    ASYNC_QUEUE_SIGNAL_ON_DATA = 0x04  /* post a completion when empty -> non-empty (see attach) */
} async_queue_flags_t;
/* Flags combine with |; SIGNAL_ON_DATA goes with either policy. In C++ a
 * combination, and no flags, need a cast:
 * (async_queue_flags_t)(ASYNC_QUEUE_DROP_OLDEST | ASYNC_QUEUE_SIGNAL_ON_DATA),
 * (async_queue_flags_t)0. */

/* A queue's counters (async_queue_get_stats). */
typedef struct {
    size_t capacity;        /* in messages, as given to async_queue_create */
    size_t current_size;    /* messages queued now */
    size_t max_msg_size;    /* as given to async_queue_create */
    uint64_t enqueue_count; /* messages enqueued */
    uint64_t dequeue_count; /* messages dequeued */
    uint64_t dropped_count; /* dropped by DROP_OLDEST, or discarded by async_queue_clear */
} async_queue_stats_t;

/* Creates a queue of up to `capacity` messages of at most `max_msg_size`
 * bytes each. DROP_OLDEST and BLOCK_WRITER are mutually exclusive.
 * Returns NULL with ASYNC_E_INVAL for a zero capacity or size, a capacity
 * above 2^30 or a max_msg_size above 2^40 (a negative number cast to
 * size_t, say), unknown flags, or both policies; ASYNC_E_NOMEM if memory or
 * handles run out. A queue of up to 1 MiB of slots (capacity times
 * max_msg_size, rounded) gets its memory here; a larger one allocates each
 * slot when a message first needs it (see async_queue_enqueue).
 * Thread-safe; never blocks. */
async_queue_t *async_queue_create(size_t capacity, size_t max_msg_size, async_queue_flags_t flags);

/* Destroys the queue and discards its messages. Every thread blocked in
 * enqueue/enqueue_wait/dequeue_wait on it wakes and fails with ASYNC_E_CLOSED.
 * NULL or an invalid handle is ignored (ASYNC_E_BADHANDLE). Thread-safe;
 * never blocks. */
void async_queue_destroy(async_queue_t *queue);

/* Copies `size` bytes from `data` to the tail. When the queue is full:
 * DROP_OLDEST drops the head (counted in dropped_count) and succeeds;
 * BLOCK_WRITER blocks until there is room (like enqueue_wait with -1);
 * otherwise fails at once with ASYNC_E_FULL.
 * Errors: ASYNC_E_BADHANDLE, ASYNC_E_INVAL (data NULL or size 0),
 * ASYNC_E_TOOBIG (size > max_msg_size), ASYNC_E_FULL, ASYNC_E_CLOSED
 * (destroyed while blocked), ASYNC_E_NOMEM (a queue above 1 MiB whose slot
 * for this message could not be allocated or grown; nothing was enqueued or
 * dropped), ASYNC_E_CANCELLED (BLOCK_WRITER: on a fiber once its scheduler
 * shuts down; on a worker's own thread once async_worker_signal_stop was
 * called for that worker: see there). Thread-safe; blocks only with
 * BLOCK_WRITER (on a fiber it parks instead). */
bool async_queue_enqueue(async_queue_t *queue, const void *data, size_t size);

/* Like async_queue_enqueue, but when the queue is full and the policy is not
 * DROP_OLDEST, waits up to timeout_ms for room (fails with ASYNC_E_TIMEDOUT;
 * with timeout_ms 0 it fails at once with ASYNC_E_FULL). With DROP_OLDEST it
 * never waits. On a worker's own thread the wait ends with
 * ASYNC_E_CANCELLED once the worker is asked to stop, and a wait that would
 * begin after that fails at once (see async_worker_signal_stop); on a fiber
 * it fails with ASYNC_E_CANCELLED once its scheduler shuts down. Errors:
 * those of async_queue_enqueue, ASYNC_E_INVAL also for timeout_ms < -1,
 * ASYNC_E_TIMEDOUT. Thread-safe; blocks (on a fiber it parks instead). */
bool async_queue_enqueue_wait(async_queue_t *queue, const void *data, size_t size, int timeout_ms);

/* Copies the head message into `buffer` and removes it; its length is written
 * to *out_size (out_size may be NULL). Never blocks.
 * Errors: ASYNC_E_BADHANDLE; ASYNC_E_INVAL (buffer NULL with buffer_size > 0);
 * ASYNC_E_EMPTY; ASYNC_E_BUFSIZE (buffer_size too small: the needed size is
 * written to *out_size and the message stays at the head). Every message
 * is at least 1 byte long, so async_queue_dequeue(q, NULL, 0, &n) on a
 * non-empty queue fails with ASYNC_E_BUFSIZE and tells the head's size in
 * n. Thread-safe. */
bool async_queue_dequeue(async_queue_t *queue, void *buffer, size_t buffer_size, size_t *out_size);

/* Like async_queue_dequeue, but waits up to timeout_ms for a message
 * (ASYNC_E_TIMEDOUT; with timeout_ms 0 it fails at once with ASYNC_E_EMPTY).
 * On a worker's own thread the wait ends with ASYNC_E_CANCELLED once the
 * worker is asked to stop, and a wait that would begin after that fails at
 * once; a message already queued is still returned first (see
 * async_worker_signal_stop). On a fiber it fails with ASYNC_E_CANCELLED once
 * its scheduler shuts down. Errors: those of async_queue_dequeue
 * (ASYNC_E_EMPTY only with timeout 0), ASYNC_E_INVAL also for timeout_ms <
 * -1, ASYNC_E_TIMEDOUT, ASYNC_E_CLOSED (destroyed during the wait),
 * ASYNC_E_CANCELLED. Thread-safe; blocks (on a fiber it parks instead). */
bool async_queue_dequeue_wait(async_queue_t *queue, void *buffer, size_t buffer_size, size_t *out_size,
                              int timeout_ms);

/* true if the queue holds no message. An invalid handle gives true with
 * ASYNC_E_BADHANDLE. Thread-safe; never blocks. */
bool async_queue_is_empty(const async_queue_t *queue);

/* true if the queue holds `capacity` messages. An invalid handle gives false
 * with ASYNC_E_BADHANDLE. Thread-safe; never blocks. */
bool async_queue_is_full(const async_queue_t *queue);

/* Discards every message (each counted in dropped_count) and wakes writers
 * blocked on a full queue. Invalid handles are ignored (ASYNC_E_BADHANDLE).
 * Thread-safe; never blocks. */
void async_queue_clear(async_queue_t *queue);

/* Fills *stats with a consistent snapshot. An invalid handle or NULL stats
 * leaves *stats zeroed (if non-NULL) with ASYNC_E_BADHANDLE / ASYNC_E_INVAL;
 * a valid queue never has capacity 0, so stats.capacity == 0 means the call
 * failed. Thread-safe; never blocks. */
void async_queue_get_stats(const async_queue_t *queue, async_queue_stats_t *stats);

/* Attaches a queue created with ASYNC_QUEUE_SIGNAL_ON_DATA to a runtime:
 * whenever the queue goes from empty to non-empty it posts one completion
 * (completion_key, data = (uintptr_t)queue) to `rt`. The consumer should
 * dequeue until ASYNC_E_EMPTY on each such completion. rt == NULL detaches.
 * If the queue already holds messages when attached, one completion is posted
 * at once. Attaching again replaces the previous runtime and key. Destroying
 * the queue ends the attachment (completions already posted still carry the
 * old handle, on which calls then fail with ASYNC_E_BADHANDLE); after the
 * runtime's deinit the queue simply posts nothing. Errors: ASYNC_E_BADHANDLE
 * (queue or non-NULL rt), ASYNC_E_INVAL (queue lacks SIGNAL_ON_DATA).
 * Thread-safe; never blocks. */
int async_queue_attach(async_queue_t *queue, async_runtime_t *rt, uintptr_t completion_key);

/* ------------------------------------------------------------------------ */
/* async_worker: a managed thread running a C procedure                       */
/* ------------------------------------------------------------------------ */

typedef struct async_worker_s async_worker_t;
typedef void *(*async_worker_proc_t)(void *context);
/* "proc returns" below also covers a proc whose thread ends without
 * returning: by pthread_exit() or by cancellation (pthread_cancel on
 * async_worker_get_native_handle). Such a worker becomes STOPPED, joins,
 * frees its stop descriptor when destroyed, and its result is NULL (the
 * value passed to pthread_exit is not kept). A cancel acts at the proc's
 * own cancellation points, never inside a libasync call (see the
 * conventions at the top): a worker asleep in a libasync wait ends that
 * wait first. */

typedef enum {
    ASYNC_WORKER_STOPPED = 0,  /* proc has returned */
    ASYNC_WORKER_RUNNING = 1,  /* from create until proc returns, unless asked to stop */
    ASYNC_WORKER_STOPPING = 2  /* signal_stop was called and proc has not returned yet */
} async_worker_state_t;

/* Starts a thread running proc(context). stack_size 0 uses the platform
 * default; other values are honoured (rounded up to the page size, and to
 * 64 KiB: what a call into libasync needs on the thread; and to the platform
 * minimum). When this returns the state is RUNNING (proc may not
 * have begun yet), or already STOPPED if proc returned meanwhile (a short proc
 * may; STOPPING if proc asked itself to stop). Wait with async_worker_join,
 * not by polling for a state change from RUNNING.
 * Errors: ASYNC_E_INVAL (proc NULL, or a stack_size so large that rounding
 * it up to the page size overflows, e.g. SIZE_MAX), ASYNC_E_NOMEM (also for
 * any other stack the system cannot provide, e.g. SIZE_MAX - 4096),
 * ASYNC_E_SYS (the thread could not be created for another reason).
 * Thread-safe; never blocks. */
async_worker_t *async_worker_create(async_worker_proc_t proc, void *context, size_t stack_size);

/* Releases the worker. If proc is still running, the worker is first asked to
 * stop (as by async_worker_signal_stop) and then detached: the thread keeps
 * running until proc returns, its stop descriptor stays valid until then, and
 * its record is freed when proc returns. The handle is invalid at once
 * (async_worker_current() in the detached proc returns NULL). Call
 * async_worker_join first to wait for proc. Invalid handles are ignored
 * (ASYNC_E_BADHANDLE). Thread-safe; never blocks. */
void async_worker_destroy(async_worker_t *worker);

/* Asks the worker to stop: its state becomes STOPPING (if still RUNNING),
 * async_worker_should_stop() returns true, its stop descriptor becomes
 * readable, and the worker's own queue waits end. Those are the calls made
 * on the worker's thread (by proc or anything it calls, also after
 * async_worker_destroy detached it) to async_queue_dequeue_wait,
 * async_queue_enqueue_wait and the blocking async_queue_enqueue of a
 * BLOCK_WRITER queue: one in progress wakes and fails with
 * ASYNC_E_CANCELLED, and so does every later one that would have to wait
 * (the stop is sticky: one signalled just before the wait begins is not
 * lost). They still do what they can do without waiting: a queued message
 * is dequeued, room is used, timeout 0 fails with ASYNC_E_EMPTY / FULL as
 * usual; argument and handle checks come first; so `while (async_queue_dequeue_wait(q, ..., -1)) ...` drains the
 * queue and then ends with ASYNC_E_CANCELLED, no sentinel message needed
 * (a proc whose queue never empties should check async_worker_should_stop).
 * Waits of other threads and fibers on the same queues are not disturbed
 * (stopping one of several workers that wait on one queue ends only that
 * worker's wait, and it takes no message with it).
 * Not interrupted: async_runtime_wait (register async_worker_stop_fd with
 * the runtime to wake it), async_worker_join of another worker (join with a
 * timeout and check async_worker_should_stop), and the fiber/channel calls
 * made from a worker thread. Idempotent. Invalid handles are ignored
 * (ASYNC_E_BADHANDLE). Thread-safe; async-signal-safe (errno is kept);
 * never blocks. */
void async_worker_signal_stop(async_worker_t *worker);

/* Waits until proc has returned: -1 forever, 0 just checks, n > 0 at most
 * about n ms (it wakes when proc returns, not by polling). true once proc has returned
 * (also on later calls); false on timeout (ASYNC_E_TIMEDOUT) or error
 * (ASYNC_E_BADHANDLE, ASYNC_E_INVAL, ASYNC_E_STATE when a worker joins
 * itself, or on a fiber when timeout_ms is not 0: the wait would block the
 * fiber's worker thread; run it with async_fiber_blocking). Thread-safe;
 * blocks (never on a fiber). */
bool async_worker_join(async_worker_t *worker, int timeout_ms);

/* The worker running the calling thread, or NULL on any other thread (and
 * in a proc whose worker was destroyed). Thread-safe; never blocks; never
 * sets an error; works as usual in a forked child. */
async_worker_t *async_worker_current(void);

/* true once async_worker_signal_stop() was called for this worker. An invalid
 * handle gives true (a worker loop then ends) with ASYNC_E_BADHANDLE.
 * Thread-safe; never blocks. */
bool async_worker_should_stop(async_worker_t *worker);

/* RUNNING, STOPPING or STOPPED as described above. An invalid handle gives
 * ASYNC_WORKER_STOPPED with ASYNC_E_BADHANDLE. Thread-safe; never blocks. */
async_worker_state_t async_worker_get_state(const async_worker_t *worker);

/* What proc returned (NULL if its thread ended by pthread_exit or
 * cancellation); NULL while it runs (ASYNC_E_STATE) or for an invalid
 * handle (ASYNC_E_BADHANDLE). After async_worker_join returned true, a
 * NULL from a valid handle is what proc returned. Thread-safe; never
 * blocks. */
void *async_worker_result(async_worker_t *worker);

#if !defined(_WIN32)
/* The worker's thread, for pthread_setname_np, pthread_kill and the like (the
 * thread is detached: do not join or detach it). Classic lib/async API.
 * A zero-filled value with ASYNC_E_BADHANDLE for an invalid handle, and with
 * ASYNC_E_STATE once proc has returned (STOPPED): the thread is gone and the
 * system may give its id to another thread (glibc does), so a pthread_kill
 * or pthread_cancel on the old id could reach that thread. The id is the worker's only
 * while proc runs: use it from proc itself, or make sure proc has not
 * returned (it waits for you) before you signal the thread.
 * Thread-safe; never blocks. */
pthread_t async_worker_get_native_handle(async_worker_t *worker);
#endif

/* A descriptor owned by the worker that becomes readable (and stays readable)
 * once async_worker_signal_stop() is called, so a proc blocked in
 * poll()/select() on its own descriptors can include it and wake. Do not
 * read, write or close it. It is close-on-exec and stays valid until the
 * worker's record is freed. On Windows it is a SOCKET (select() takes only
 * sockets) returned as an int. -1 with ASYNC_E_BADHANDLE for an invalid
 * handle. Thread-safe; never blocks. */
int async_worker_stop_fd(async_worker_t *worker);

/* ------------------------------------------------------------------------ */
/* async_runtime: one event loop per host thread                              */
/* ------------------------------------------------------------------------ */

#if defined(_WIN32)
typedef uintptr_t async_fd_t; /* SOCKET */
#else
typedef int async_fd_t;
#endif

#define ASYNC_EVENT_READ 0x01u       /* readable (or a listening socket has a connection) */
#define ASYNC_EVENT_WRITE 0x02u      /* writable */
#define ASYNC_EVENT_ERROR 0x04u      /* error condition on the fd */
#define ASYNC_EVENT_CLOSE 0x08u      /* hung up (or the fd was closed); see async_runtime_add */
#define ASYNC_EVENT_COMPLETION 0x10u /* a posted completion */
#define ASYNC_EVENT_TIMER 0x20u      /* a timer fired */
#define ASYNC_EVENT_SIGNAL 0x40u     /* a watched signal arrived (async_runtime_add_signal) */

typedef struct {
    async_fd_t fd;             /* fd events: the descriptor; otherwise -1 */
    uint32_t event_type;       /* ASYNC_EVENT_* bits (fd events may combine READ|WRITE|ERROR|CLOSE) */
    uintptr_t completion_key;  /* completions: the key posted; timers, signals: their key; fd events: 0 */
    uintptr_t data;            /* completions: the data posted; timers: the timer id; signals: the count
                                  (>= 1) since the last delivery; fd events: 0 */
    void *context;             /* fd events: the context given to async_runtime_add; otherwise NULL */
} io_event_t;

/* Creates an event loop on the platform's default backend: epoll + eventfd on
 * Linux, kqueue + pipe on macOS and the BSDs, IOCP on Windows; the
 * environment variable ASYNC_BACKEND selects another one available on the
 * platform: "epoll", "kqueue", "iocp", or "poll" (poll + pipe, any unix).
 * See docs/PLATFORMS.md for what is tested where. Every descriptor it opens
 * is close-on-exec.
 * Errors: ASYNC_E_NOMEM, ASYNC_E_SYS (async_last_os_error() tells which
 * errno), ASYNC_E_NOTSUP (ASYNC_BACKEND names no backend of this build; the
 * first such failure of the process also writes one line to stderr naming
 * the variable, its value and the backends available).
 * The process's first successful call also starts the Go runtime's own
 * poller (two descriptors on Linux), with two descriptors the library
 * reserved while it was loaded; if none were free then, this call needs two
 * more and fails with ASYNC_E_SYS (EMFILE) when they are missing, never
 * aborting the process. Descriptors 0, 1 and 2 that are closed when the
 * library is loaded are opened on /dev/null then (before Go's runtime
 * starts), so that no descriptor of the library or of Go takes them. So a
 * host may take every free descriptor at the top of main: this call then
 * fails with ASYNC_E_SYS (EMFILE) instead of the process aborting.
 * Thread-safe; never blocks. */
async_runtime_t *async_runtime_init(void);

/* Destroys the loop, its pending completions and timers. Registered fds are
 * not closed (they are the caller's). A thread blocked in async_runtime_wait
 * on it returns -1 with ASYNC_E_CLOSED. Invalid handles are ignored
 * (ASYNC_E_BADHANDLE). Thread-safe; never blocks. */
void async_runtime_deinit(async_runtime_t *rt);

/* Watches fd for `events` (ASYNC_EVENT_READ, ASYNC_EVENT_WRITE and
 * ASYNC_EVENT_CLOSE, or 0; ERROR may be passed and changes nothing).
 * Level-triggered. `context` comes back in each io_event_t.
 * Errors and a hang-up of both sides (POLLHUP/EPOLLHUP: a pipe whose writer
 * is gone, a socket shut both ways or reset) are always reported, as ERROR
 * and CLOSE. A read-side hang-up alone (the peer's shutdown(SHUT_WR), or its
 * close seen over TCP) is reported as CLOSE only when `events` has
 * ASYNC_EVENT_CLOSE; data sent before it may still be unread, so with READ
 * asked it comes as READ (read until it returns 0), and a READ|CLOSE event
 * means: read what is left first. On kqueue and IOCP a peer's close and its
 * shutdown(SHUT_WR) look alike: ask for CLOSE to hear of either without READ.
 * Errors: ASYNC_E_BADHANDLE, ASYNC_E_INVAL (other event bits), ASYNC_E_BADFD
 * (fd < 0, not open, or not pollable, e.g. a regular file with epoll),
 * ASYNC_E_EXISTS (already added), ASYNC_E_NOMEM, ASYNC_E_SYS, ASYNC_E_CLOSED
 * (async_runtime_deinit is under way on another thread).
 * Call async_runtime_remove before closing a registered fd. If it is closed
 * without: the poll backend reports it once as ERROR|CLOSE, if the number is
 * still free at its next wait (poll watches numbers: once another file has
 * the number, that file's readiness comes with the old context, until
 * async_runtime_remove of the number or until the number is added); epoll
 * forgets it (but if a dup keeps the file open, its events keep coming with
 * the old context until async_runtime_remove of the number, or until the
 * number is reused and added). Either way a new descriptor with the same
 * number can be added again and never receives the old file's events.
 * Thread-safe (may be called while another thread waits); never blocks. */
int async_runtime_add(async_runtime_t *rt, async_fd_t fd, uint32_t events, void *context);

/* Changes the events watched for a registered fd (same bits as add).
 * Errors: ASYNC_E_BADHANDLE, ASYNC_E_INVAL, ASYNC_E_BADFD, ASYNC_E_NOTFOUND
 * (fd not registered), ASYNC_E_SYS, ASYNC_E_CLOSED (deinit under way).
 * Thread-safe; never blocks. */
int async_runtime_modify(async_runtime_t *rt, async_fd_t fd, uint32_t events);

/* Stops watching fd. Call it before closing the fd. A registered number
 * that was closed and reused meanwhile is removed too (its registration is
 * the old file's; the new file was never added). A wait that begins after
 * this returned reports no event of that registration; a wait already
 * handing out events on another thread may still return one, with its
 * context (free the context once that wait has returned). Errors:
 * ASYNC_E_BADHANDLE, ASYNC_E_BADFD (also for an fd already closed),
 * ASYNC_E_NOTFOUND, ASYNC_E_SYS, ASYNC_E_CLOSED (deinit under way).
 * Thread-safe; never blocks. */
int async_runtime_remove(async_runtime_t *rt, async_fd_t fd);

/* Waits for events and fills up to max_events entries of `events`; returns
 * how many (0 on timeout, on async_runtime_wakeup() (it ends one wait: see
 * there), or when a signal interrupted the wait, so the caller can check its
 * signal flags; on Linux the Go runtime's own SIGURG never does), or -1.
 * Completions and timers beyond max_events stay queued for the next call;
 * fd readiness is level-triggered and is reported again; when more fds
 * are ready than fit, they take turns: on the epoll and poll backends an fd
 * that stays ready is reported at least once in every ceil(R / M) + 1
 * consecutive calls that look at the fds, M being max_events (256 if it is
 * larger) and R the number of registered fds that are ready, whatever fds
 * other threads add, modify or remove in between (kqueue and IOCP: the
 * kernel's order; see docs/LIMITS.md). A call skips that look while
 * completions or timers are ready, at most 8 times in a row and for at
 * most 1 ms.
 * timeout_ms: -1 forever, 0 poll, n > 0 at least n ms (rounded up to whole
 * ms; never a busy spin) unless an event, a wakeup or a signal ends it
 * early. Errors: ASYNC_E_BADHANDLE, ASYNC_E_INVAL (events
 * NULL, max_events < 1, timeout < -1), ASYNC_E_BUSY (another thread is
 * already waiting on this runtime: the loser fails at once, and every event
 * is delivered to exactly one of the callers), ASYNC_E_CLOSED (deinit during
 * the wait), ASYNC_E_STATE (called on a fiber with timeout_ms not 0: the wait
 * would block the fiber's worker thread; checked before the handle; run it
 * with async_fiber_blocking, or poll with 0). Out of memory it still
 * delivers (its buffers are reserved at init; a large max_events may get
 * fewer events per call) and never fails for memory. Call it from one thread
 * at a time; blocks (never on a fiber). */
int async_runtime_wait(async_runtime_t *rt, io_event_t *events, int max_events, int timeout_ms);

/* Queues a completion (key and data delivered intact, exactly once) and wakes
 * the waiting thread if it sleeps. Never blocks and never fails because many
 * completions are pending. Errors: ASYNC_E_BADHANDLE, ASYNC_E_NOMEM.
 * Thread-safe.
 * Order: the completions posted to one runtime form a single sequence, and
 * async_runtime_wait returns them in that sequence (across calls and
 * max_events limits). The sequence is consistent with happens-before (C11
 * 5.1.2.4): if one successful post happens before another, it is delivered
 * first. So completions of one thread arrive in program order, those of one
 * fiber too even when it moves between worker threads, and two posts from
 * different threads arrive in the order that synchronisation between them
 * fixes (a mutex held around both, a semaphore or a release/acquire atomic
 * passed from one to the other, a thread create or join). Posts that are not
 * ordered by happens-before (concurrent ones) arrive in some order. A post
 * is ordered when it takes effect, inside the call: one that returned before
 * another began is delivered first. No order holds between completions and
 * other events (fd readiness, timers). */
int async_runtime_post_completion(async_runtime_t *rt, uintptr_t completion_key, uintptr_t data);

/* Makes one async_runtime_wait return early, without producing an event: a
 * wait blocked now returns (with whatever events are ready, possibly 0); if
 * none is blocked, the next wait returns without sleeping, whatever its
 * timeout (with what is ready, possibly 0). That wait takes the wakeup: the
 * wait after it sleeps as usual. So a wakeup ends at most one wait early,
 * and several wakeups before a wait takes them count as one. A wakeup made
 * while a wait returns without sleeping ends that wait or the next one.
 * Errors: ASYNC_E_BADHANDLE, ASYNC_E_SYS.
 * Thread-safe; async-signal-safe (it does not touch errno's final value,
 * allocate or lock); never blocks. */
int async_runtime_wakeup(async_runtime_t *rt);

/* Starts a timer that fires a TIMER event carrying `key` (and the timer id in
 * `data`) after delay_ms, then every repeat_ms if repeat_ms > 0 (without
 * drift: missed periods are skipped, not bunched). Returns the timer id
 * (never 0), or 0 on error: ASYNC_E_BADHANDLE, ASYNC_E_NOMEM (timers are
 * kept in C memory: out of memory is this error, never an abort), ASYNC_E_CLOSED
 * (deinit under way on another thread). A one-shot
 * timer's id is invalid once its event was returned by async_runtime_wait.
 * (On 32-bit platforms the id in io_event_t.data is truncated to uintptr_t.)
 * Thread-safe; never blocks. */
uint64_t async_runtime_add_timer(async_runtime_t *rt, uint64_t delay_ms, uint64_t repeat_ms, uintptr_t key);

/* Cancels a pending timer; its event will not be delivered afterwards, even if
 * it had expired but not been returned yet. Errors: ASYNC_E_BADHANDLE,
 * ASYNC_E_NOTFOUND (unknown, delivered one-shot, or already cancelled).
 * Thread-safe; never blocks. */
int async_runtime_cancel_timer(async_runtime_t *rt, uint64_t timer_id);

/* Loop metrics (async_runtime_get_stats), in the spirit of libuv's
 * uv_metrics_info and uv_metrics_idle_time. Every counter is kept whether or
 * not anyone reads it (a few plain stores per wait; see docs/PERFORMANCE.md),
 * counts from async_runtime_init and never resets.
 *
 * Extensibility: fields are only ever appended, never moved, resized or
 * given another meaning, and ASYNC_RUNTIME_STATS_EVENT_KINDS stays 16. The
 * caller passes sizeof its struct; the library fills the fields that both
 * its own and the caller's struct have, and zeroes the rest of the caller's
 * struct (so a program built against a newer header reads 0 for counters an
 * older library does not know; the return value says how many bytes were
 * filled). */
#define ASYNC_RUNTIME_STATS_EVENT_KINDS 16 /* events[b] counts ASYNC_EVENT_* bit (1u << b) */
typedef struct {
    uint64_t iterations;   /* async_runtime_wait calls that returned >= 0 (with events, on timeout,
                              wakeup or signal), one per pass of the caller's loop */
    uint64_t idle_time_ns; /* ns the waiting thread spent blocked in the poller (epoll_wait, poll,
                              kevent, GetQueuedCompletionStatusEx) in waits allowed to sleep
                              (timeout_ms != 0); a wait that returns without sleeping adds nothing */
    uint64_t events_total; /* io_event_t entries returned by async_runtime_wait */
    uint64_t events[ASYNC_RUNTIME_STATS_EVENT_KINDS]; /* entries returned whose event_type had the
                              bit (1u << index): [0] READ, [1] WRITE, [2] ERROR, [3] CLOSE,
                              [4] COMPLETION, [5] TIMER, [6] SIGNAL; an fd event with READ|WRITE counts in both
                              [0] and [1]; later ASYNC_EVENT_* bits take the next indexes */
    uint64_t completions_pending; /* snapshot: completions posted and not yet returned */
    uint64_t timers_armed;        /* snapshot: timers added and not yet cancelled, nor (one-shot)
                                     returned by a wait; repeating timers stay armed */
    uint64_t doorbell_writes;     /* times a post (async_runtime_post_completion, a queue's
                                     SIGNAL_ON_DATA) or async_runtime_add_timer found the waiter
                                     asleep and wrote the doorbell to wake it (posts to a busy
                                     loop write nothing); async_runtime_wakeup is not counted here */
    uint64_t wakeups;             /* successful async_runtime_wakeup calls */
} async_runtime_stats_t;
/* The size of the first version of async_runtime_stats_t: the smallest
 * stats_size accepted. */
#define ASYNC_RUNTIME_STATS_MIN_SIZE ((size_t)184)

/* Fills *stats with rt's counters (see async_runtime_stats_t). Pass
 * stats_size = sizeof(async_runtime_stats_t); returns the number of bytes
 * filled (the smaller of stats_size and the library's own struct size; the
 * rest of *stats is zeroed), or -1.
 * Each counter is read atomically (never torn) and monotonic ones never go
 * back; the set is not an atomic snapshot: a wait running on another thread
 * may have counted some of its events and not yet others.
 * completions_pending is exact when no post runs concurrently; a post in
 * progress may or may not be in it.
 * Errors: ASYNC_E_BADHANDLE (rt invalid, or deinit done or under way),
 * ASYNC_E_INVAL (stats NULL, stats_size below ASYNC_RUNTIME_STATS_MIN_SIZE
 * or not a multiple of 8; *stats is left untouched).
 * Thread-safe (any thread or fiber, also while another thread waits on rt);
 * never blocks or parks: it never waits for events, only for a lock that the
 * loop holds while it hands out one batch of completions. */
int async_runtime_get_stats(async_runtime_t *rt, async_runtime_stats_t *stats, size_t stats_size);

/* Watches the POSIX signal signo: each time the process receives it, the
 * next async_runtime_wait of rt returns one event {fd -1, event_type
 * ASYNC_EVENT_SIGNAL, completion_key `key`, data: how many times the signal
 * arrived since the last such event (>= 1), context NULL}, and wakes if it
 * sleeps. Signals are coalesced: one event per signal and wait however many
 * arrived, and the counts add up exactly to the times libasync's handler
 * ran (the kernel itself merges a standard signal that arrives while the
 * same one is pending; real-time signals sent with sigqueue are each
 * counted). Several runtimes may watch one signal: each gets every signal
 * and its own count. No order holds between signal events and other events.
 *
 * How: the first watch of a signal in the process (by any runtime or
 * async_fiber_watch_signal) installs libasync's handler with sigaction
 * (SA_SIGINFO | SA_ONSTACK | SA_RESTART), replacing the action that was
 * there, which is saved: it is not called while libasync watches the
 * signal (not chained). The last async_runtime_remove_signal,
 * async_runtime_deinit or async_fiber_unwatch_signal of that signal puts the
 * saved action back (SIG_DFL, SIG_IGN or the host's handler), unless the
 * host has installed another action since, which then stays; while
 * async_sched_dump_on_signal also uses signo, the action comes back when the
 * last of both goes (one libasync handler per signal serves both, and the
 * host's action is saved once, by the first). No signal is lost to these
 * swaps (nor to those of async_sched_dump_on_signal): each arrival is
 * counted for a watch that exists at that moment or acted on by the saved
 * action. The action is replaced only once the watch is in place, a watch
 * counts until the saved action is back, and a signal that reaches
 * libasync's handler after the last watch went is raised again on the
 * thread it hit, where the action that is back takes it (with its siginfo
 * on Linux; as from raise() elsewhere). While watched
 * the host must not install its own action for signo (events stop) nor
 * block signo in every thread (nothing arrives); it may block it in some
 * threads, and the signal may land on any thread, Go's and fiber workers'
 * included. While watched, the special meanings of the replaced action do
 * not hold (SIGCHLD at SIG_IGN reaping children, SA_NOCLDSTOP), and a
 * program exec'd meanwhile starts with the signal at SIG_DFL. A process
 * forked while a signal is watched gets the saved action back at the first
 * such signal in the child (which then acts on it as without libasync).
 * libasync changes no signal mask.
 *
 * Refused with ASYNC_E_INVAL: signo out of range (< 1, > 64 or >= NSIG),
 * SIGKILL, SIGSTOP, the fault signals SIGSEGV, SIGBUS, SIGFPE, SIGILL,
 * SIGTRAP, SIGSYS, and SIGABRT, the signals the Go runtime inside the
 * library handles or uses (SIGPIPE, SIGURG, SIGPROF), and the numbers between
 * 31 and SIGRTMIN that the C library keeps. Other errors: ASYNC_E_BADHANDLE,
 * ASYNC_E_EXISTS (rt already watches signo), ASYNC_E_NOMEM (256 watches of
 * runtimes in the process at most), ASYNC_E_SYS (sigaction failed),
 * ASYNC_E_CLOSED (deinit under way). async_runtime_deinit drops rt's
 * watches, and counts not delivered yet with them (a signal arriving during
 * the deinit is one of those).
 * Windows: fails with ASYNC_E_NOTSUP (no POSIX signals).
 * Thread-safe (may be called while another thread waits on rt); never
 * blocks (a short process-wide lock). */
int async_runtime_add_signal(async_runtime_t *rt, int signo, uintptr_t key);

/* Stops watching signo on rt. A wait that takes its events after this
 * returned gets no SIGNAL event for signo (a count not delivered yet is
 * dropped, also one that lands during the call); a wait already handing
 * out events on another thread may still return one. The last watch of
 * signo in the process puts back the action that was there, and from then
 * on every arrival goes to it, also one caught by libasync's handler
 * during the swap (see async_runtime_add_signal). Errors: ASYNC_E_BADHANDLE,
 * ASYNC_E_INVAL (signo out of range), ASYNC_E_NOTFOUND (rt does not watch
 * signo), ASYNC_E_NOTSUP (Windows). Thread-safe; never blocks. */
int async_runtime_remove_signal(async_runtime_t *rt, int signo);

/* ---- Offload: a function on libasync's pool, its result as a completion ---- */

/* Work for async_runtime_submit_work: runs on a pool thread; what it returns
 * is the completion's data. */
typedef uintptr_t (*async_work_fn)(void *arg);
/* Called, on a pool thread, instead of the delivery when the runtime was
 * deinitialised before the result could be posted: ran is 0 if fn never ran
 * (result 0), 1 if it ran (result: what it returned). Lets the submitter free
 * what arg or the result own. */
typedef void (*async_work_drop_fn)(void *arg, uintptr_t result, int ran);

/* Work items submitted and not started yet, in the whole process: a submit
 * beyond fails with ASYNC_E_FULL. */
#define ASYNC_WORK_MAX_QUEUED 65536

/* Runs fn(arg) on libasync's pool of blocking threads (the pool of
 * async_fiber_blocking: it grows on demand up to 64 threads, shared by both
 * calls; a thread idle for 10 s exits; work beyond 64 at once waits in FIFO
 * order) and posts its result to rt as a completion: async_runtime_wait
 * returns one event {fd -1, event_type ASYNC_EVENT_COMPLETION,
 * completion_key `key`, data: fn's return value, context NULL}, exactly once
 * (ordered after everything fn posted itself). Nothing else is delivered
 * for the item: no event on failure, none for a cancelled item.
 * If rt is deinitialised before the result is posted, nothing is delivered
 * and nothing of libasync's leaks: an item not started yet is not run, and
 * drop (if not NULL) is called on a pool thread (ran 0); an item running
 * finishes, and drop gets its result (ran 1). Out of memory when the result
 * is posted, the pool thread retries (every millisecond) until it is posted
 * or rt is gone. fn runs on a plain thread: it may block (file I/O,
 * getaddrinfo, sleeping locks; fiber calls block as on any thread), must not
 * wait for work submitted after it (it may be queued behind it), and must
 * not call async_runtime_wait on rt.
 * Returns the item's id (never 0, never reused in the process), for
 * async_runtime_cancel_work; or 0: ASYNC_E_INVAL (fn NULL),
 * ASYNC_E_BADHANDLE, ASYNC_E_FULL (ASYNC_WORK_MAX_QUEUED items are waiting
 * for a thread), ASYNC_E_NOMEM (no memory for the item's record, 64 bytes;
 * or no pool thread is idle and the system refuses a new one: the item would
 * wait for a busy one for ever if all of them wait for it), ASYNC_E_SYS
 * (starting a pool thread failed otherwise); fn is then never run.
 * Thread-safe (any thread or fiber, also fn itself); never blocks or parks
 * (a short process-wide lock; it may start a thread). */
uint64_t async_runtime_submit_work(async_runtime_t *rt, async_work_fn fn, void *arg, uintptr_t key,
                                   async_work_drop_fn drop);

/* Cancels a work item of rt that has not started: fn will never run, no
 * completion comes and drop is not called (arg is the caller's again).
 * Returns 0, or -1: ASYNC_E_BADHANDLE; ASYNC_E_NOTFOUND (work_id unknown or
 * of another runtime, cancelled, or started: then its completion comes, or
 * came, as if no cancel had been tried). A cancel racing the start of the
 * item has exactly one of the two outcomes. Thread-safe; never blocks (a
 * short process-wide lock held while it looks through the waiting items:
 * O(waiting items)). */
int async_runtime_cancel_work(async_runtime_t *rt, uint64_t work_id);


/* ------------------------------------------------------------------------ */
/* Fibers: stackful coroutines on an M:N work-stealing scheduler             */
/* ------------------------------------------------------------------------ */
/*
 * A scheduler owns N worker threads that run fibers: C functions with their
 * own (pooled, guard-protected) stacks. A fiber runs until it parks (a
 * blocking call below), yields or returns; it may resume on another worker
 * (so never keep a pointer to thread-local data, errno included, across a
 * parking call). Fibers are not preempted: a fiber that computes for long
 * should call async_fiber_yield() now and then.
 *
 * Every call below that "parks" suspends only the calling fiber when called
 * on a fiber; called on a plain thread it blocks that thread instead. The
 * queue waits (async_queue_enqueue_wait, async_queue_dequeue_wait and
 * enqueue on a BLOCK_WRITER queue) park too. The other queue, runtime and
 * timer calls are safe on a fiber and do not block. async_runtime_wait and
 * async_worker_join would block the whole worker thread: on a fiber they
 * fail with ASYNC_E_STATE unless timeout_ms is 0. Run them, and anything
 * else that blocks a thread (sleep(), a blocking read(), a contended
 * pthread_mutex_lock, ...), with async_fiber_blocking().
 * async_last_error(), async_last_os_error() and async_clear_error() are per
 * fiber on a fiber.
 * See docs/FIBERS.md.
 *
 * Once async_sched_shutdown() was called, every parked call of that
 * scheduler's fibers (sleep, join, chan send/recv/select, wait_fd, read,
 * write, accept, connect, queue waits, mutex lock, cond wait: it still
 * takes its mutex back) returns at once with
 * ASYNC_E_CANCELLED, and so does every later one that has to wait; the
 * fibers unwind normally. A call that completes without waiting still
 * completes (a send with room or a waiting receiver, a receive of a
 * buffered element, a lock of a free mutex, a select with a ready
 * operation, a join of a returned fiber), so cleanup code can still use
 * them; async_fiber_sleep and async_cond_wait always wait, so they always
 * fail. A fiber that loops without ever waiting (async_fiber_yield never
 * fails) is not stopped: give it a call that waits, or a flag.
 */

typedef struct async_sched_s async_sched_t;
typedef struct async_fiber_s async_fiber_t;
typedef struct async_chan_s async_chan_t;

/* Scheduler configuration; zero fields take the defaults.
 *  workers:    worker threads (default: the CPUs this process may use, i.e.
 *              the affinity mask reduced by a cgroup v2 cpu.max quota; the
 *              environment variable ASYNC_WORKERS overrides). 1..1024.
 *  stack_size: usable stack bytes per fiber, rounded up to the page size
 *              (default 64 KiB; ASYNC_FIBER_STACK_KB overrides). 16 KiB..1 GiB.
 *  guard_mode: how stack overflow is caught:
 *              0 auto: mode 1 where the kernel has it (not under valgrind),
 *                else mode 2; never mode 3. Every stack is guarded: past
 *                mode 2's budget a spawn fails with ASYNC_E_NOMEM.
 *              1 guard page below every stack, madvise(MADV_GUARD_INSTALL)
 *                (Linux >= 6.13; no limit but memory).
 *              2 guard page with mprotect: one kernel mapping each, so at
 *                most (vm.max_map_count - 5530) / 2 guarded stacks in the
 *                process (30000 by default; 12000 under valgrind); past
 *                that, ASYNC_E_NOMEM (ASYNC_FIBER_MPROTECT_MAX lowers it).
 *              3 canaries (opt-in, no limit): 256 bytes at the bottom and
 *                64 at the top of every stack, checked when a fiber switches
 *                out, before it resumes and at exit, and at any fault.
 *                Nothing stops a write into the stack below: an overflow is
 *                found later, and one whose writes skip every canary (a
 *                large frame that writes only part of itself) or that hits a
 *                fiber running on another worker at that moment can corrupt
 *                another fiber's stack silently. For many fibers where a
 *                guard per stack cannot be had and that risk is accepted.
 *              Outside Windows, stacks lie side by side in arenas of
 *              32 MiB, each with a 256 KiB guard below it (in every mode),
 *              so an overflow (but a frame larger than that guard) never
 *              runs out of the fiber stacks into other memory of the process.
 *              A guard-page hit (modes 1 and 2) or a fault just below the
 *              running fiber's stack (a frame that jumped the guard page, or
 *              in mode 3 an overflow into the guard below its arena) prints
 *              "libasync: fiber stack overflow in fiber <id> (...)" to
 *              stderr and aborts (SIGABRT); a broken canary does the same
 *              when it is found. A frame larger than the guard that lands in
 *              another stack without faulting is not caught in any mode:
 *              build with -fstack-clash-protection.
 *              Windows: every stack is reserved and committed on demand like
 *              a thread's stack, behind a guard page the kernel moves down;
 *              modes 0 and 2 give that (reported as 2), 1 and 3 fail with
 *              ASYNC_E_NOTSUP. An overflow (the kernel's stack overflow
 *              exception, or a fault below the fiber's committed stack)
 *              prints the same message through the log hook and ends the
 *              process with exit code 3. */
typedef struct {
    int workers;
    size_t stack_size;
    int guard_mode;
} async_sched_config_t;

#define ASYNC_FIBER_JOINABLE 0x1u /* the fiber's handle lives until async_fiber_join */

/* Per-worker counters (monotonic). */
typedef struct {
    uint64_t fibers_run;     /* times a fiber was resumed on this worker */
    uint64_t fibers_started; /* fibers that began running on this worker */
    uint64_t steals;         /* successful steals from other workers */
    uint64_t parks;          /* times a fiber parked on this worker */
} async_sched_worker_stats_t;

typedef struct {
    int workers;
    int guard_mode;             /* the mode in use (1, 2 or 3) */
    size_t stack_size;          /* usable bytes per fiber stack */
    uint64_t fibers_spawned;    /* total ever spawned */
    uint64_t fibers_finished;   /* total whose function returned */
    size_t fibers_runnable;     /* the live fibers by state: each counted once, in one of the four */
    size_t fibers_running;      /* also one on its way into a park, until its worker switched away */
    size_t fibers_parked;       /* switched away, its wait registered: a wake, close or cancel now reaches it */
    size_t fibers_done_unjoined; /* joinable, returned, not joined yet */
} async_sched_stats_t;

/* Creates a scheduler and starts its worker threads (they sleep while there
 * is no work). cfg NULL uses the defaults. Errors: ASYNC_E_INVAL (a field out
 * of range), ASYNC_E_NOTSUP (guard_mode 1 on a kernel without
 * MADV_GUARD_INSTALL, or under valgrind), ASYNC_E_NOMEM (also: guard_mode 0
 * or 2 and the process's mprotect guard budget is spent), ASYNC_E_SYS.
 * Several schedulers may
 * exist at once. Thread-safe; never blocks. */
async_sched_t *async_sched_create(const async_sched_config_t *cfg);

/* Blocks the calling thread until no fiber of s is live (every fiber has
 * returned; joinable ones need not be joined yet). The calling thread does
 * not run fibers itself: the workers do. Returns 0 at once if there is no
 * fiber. New fibers may be spawned meanwhile (also from fibers). Errors:
 * ASYNC_E_BADHANDLE, ASYNC_E_STATE (called on a worker thread or fiber, or
 * in a function async_fiber_blocking runs for one of s's fibers: that fiber
 * is live until the function returns).
 * Thread-safe; blocks. */
int async_sched_run(async_sched_t *s);

/* Cancels: sets s into shutdown (later spawns fail with ASYNC_E_CANCELLED,
 * parked and later parking calls of its fibers fail with ASYNC_E_CANCELLED;
 * async_fiber_blocking is not interrupted), then waits up to timeout_ms for
 * every fiber to return. 0 when none is live; -1 with ASYNC_E_TIMEDOUT if
 * some still run (a fiber that never has to wait in a parking call cannot be
 * stopped: async_fiber_yield does not fail, nor does a call that completes
 * at once; see "Once async_sched_shutdown() was called" above).
 * Called on a worker thread (e.g. from a fiber), or in a function
 * async_fiber_blocking runs for one of s's fibers, it only starts the
 * shutdown and returns 0 without waiting. Idempotent. Errors: ASYNC_E_BADHANDLE,
 * ASYNC_E_INVAL, ASYNC_E_TIMEDOUT. Thread-safe; blocks. */
int async_sched_shutdown(async_sched_t *s, int timeout_ms);

/* Shuts s down (as async_sched_shutdown(s, -1): waits for every fiber to
 * return), stops the workers, frees the handles of unjoined joinable fibers,
 * the scopes not destroyed yet (their handles become invalid) and every
 * resource. In this order, also against calls racing it from
 * other threads or fibers: (1) s enters shutdown: from here spawns on s fail
 * with ASYNC_E_CANCELLED and parks of its fibers are cancelled; (2) every
 * fiber whose spawn returned a handle (before or during this call, from any
 * thread or fiber) runs and returns; (3) the handle s becomes invalid: later
 * calls on s fail with ASYNC_E_BADHANDLE; (4) the calls on s in progress in
 * other threads end (a join that was waiting returns 0 once its fiber
 * returned; a join of one of s's fibers that begins after (1) on a plain
 * thread or another scheduler's fiber fails with ASYNC_E_BADHANDLE); (5) the workers stop and the memory is freed. Must not
 * be called on a worker thread, nor in a function async_fiber_blocking runs
 * for one of s's fibers, nor from a log handler on the stall
 * monitor's thread (async_sched_set_stall_ms) (ASYNC_E_STATE). Invalid handles, and a
 * second destroy racing the first, are ignored (ASYNC_E_BADHANDLE).
 * Thread-safe; blocks. */
void async_sched_destroy(async_sched_t *s);

/* Fills *stats (and up to max_workers entries of per_worker, which may be
 * NULL when max_workers is 0) and returns the number of entries written.
 * The counters are read without stopping the workers: each is exact, the set
 * is not an atomic snapshot. Errors: ASYNC_E_BADHANDLE, ASYNC_E_INVAL.
 * Thread-safe; never blocks (it walks the live fibers under a lock). */
int async_sched_get_stats(async_sched_t *s, async_sched_stats_t *stats, async_sched_worker_stats_t *per_worker,
                          int max_workers);

/* Starts fn(arg) on a new fiber of s. flags: 0 or ASYNC_FIBER_JOINABLE. A
 * non-joinable fiber's handle becomes invalid when fn returns; a joinable
 * one's stays valid until async_fiber_join succeeds (or s is destroyed).
 * A returned handle is a promise: fn runs (its parks are cancelled if s
 * shuts down) and async_sched_destroy(s) waits for it. Once
 * async_sched_shutdown(s) or async_sched_destroy(s) has put s into shutdown
 * (their first step; every spawn that starts after either call returned, or
 * after a park of s's fibers returned ASYNC_E_CANCELLED), spawns fail with
 * ASYNC_E_CANCELLED; ASYNC_E_BADHANDLE once destroy has freed the handle.
 * A spawn racing that step either fails or is accepted as above.
 * Errors: ASYNC_E_BADHANDLE, ASYNC_E_INVAL (fn NULL, unknown flags),
 * ASYNC_E_CANCELLED (s is shutting down), ASYNC_E_NOMEM (also when no
 * guarded stack can be had: guard_mode 0 or 2 past the mprotect budget, see
 * async_sched_config_t). Thread-safe (also from fibers of any scheduler);
 * never blocks. */
async_fiber_t *async_fiber_spawn(async_sched_t *s, void (*fn)(void *), void *arg, unsigned flags);

/* Waits up to timeout_ms for a joinable fiber to return, then frees its
 * handle. Errors: ASYNC_E_BADHANDLE (also, on a plain thread or another
 * scheduler's fiber, once async_sched_destroy of f's scheduler has begun,
 * unless this join was already waiting: that one returns 0 when f returns), ASYNC_E_INVAL (not joinable, bad timeout),
 * ASYNC_E_STATE (a fiber joining itself, also in a function
 * async_fiber_blocking runs for it), ASYNC_E_BUSY (another join is in
 * progress), ASYNC_E_TIMEDOUT (the handle stays valid), ASYNC_E_CANCELLED.
 * Thread-safe; parks. */
int async_fiber_join(async_fiber_t *f, int timeout_ms);

/* Lets the other runnable fibers run; the caller stays runnable. On a plain
 * thread (and in a forked child) it calls sched_yield(). Never fails. */
void async_fiber_yield(void);

/* Sleeps at least ms milliseconds. 0 or -1 with ASYNC_E_CANCELLED, or
 * ASYNC_E_TIMEDOUT when the fiber's deadline (async_fiber_set_deadline, its
 * scope's) comes first. Thread-safe; parks. */
int async_fiber_sleep(uint64_t ms);

/* The calling fiber, or NULL on a plain thread (and in a child process
 * forked on a fiber: the child has no fibers). Never fails; sets no error. */
async_fiber_t *async_fiber_current(void);

/* ---- Cancellation, scopes and deadlines (docs/FIBERS.md "Cancellation and scopes") ----
 *
 * A cancelled fiber's parked call and every later call of it that has to
 * park fail with ASYNC_E_CANCELLED (each call once; the request stays),
 * exactly as after async_sched_shutdown (see "Once async_sched_shutdown()
 * was called" above: a call that completes without waiting still completes,
 * async_fiber_sleep always fails). A call that completed before the cancel
 * reached it keeps its result: a channel or queue element is either
 * delivered (the call succeeded) or stays with the sender (the call failed);
 * a fiber read or write cut short reports what it transferred as a timeout
 * does (async_fiber_write: the stream is then unusable, see there).
 * async_fiber_blocking is never interrupted: its function runs to the end
 * and the call returns 0; the cancel takes effect at the next park. Plain
 * threads' waits are never cancelled by these calls.
 * A deadline makes every parking call that begins after it and has to
 * wait fail with ASYNC_E_TIMEDOUT (one that completes without waiting still
 * completes, as above; async_fiber_sleep always fails), and bounds every
 * parking call in progress (a call with its own earlier timeout keeps
 * that). A fiber's deadline is the earliest of its own
 * (async_fiber_set_deadline) and its scope's. A call with timeout_ms 0
 * never waits, so it reports its own result under a cancel or a passed
 * deadline too (async_chan_recv ASYNC_E_EMPTY, async_mutex_lock
 * ASYNC_E_BUSY, ...).
 * A scope groups fibers (async_scope_spawn); scopes nest. Cancelling a
 * scope cancels every fiber in it and in every scope below it, and every
 * fiber spawned into any of them later. Fibers spawned with
 * async_fiber_spawn (also from a fiber of a scope) belong to no scope. */
typedef struct async_scope_s async_scope_t;

/* Cancels fiber f (see above). Idempotent; a fiber that finished is not
 * affected (0 while its handle is valid: joinable, not joined yet). A fiber
 * whose function returned has not finished while its fiber-local
 * destructors run (async_fiber_key_create): their parks are cancelled like
 * the function's. Safe against f returning, being joined, being woken or
 * moving to another worker concurrently. Errors: ASYNC_E_BADHANDLE.
 * Thread-safe (any thread or fiber, f itself included); never blocks or
 * parks. */
int async_fiber_cancel(async_fiber_t *f);

/* 1 if the calling fiber was cancelled (async_fiber_cancel, a scope's
 * cancel) or its scheduler is shutting down, else 0 (also on a plain
 * thread and in a forked child, and in a function that async_fiber_blocking
 * runs for a cancelled fiber: that runs on a plain thread of the pool). A
 * shield does not change the answer. Never fails; sets no error; never
 * blocks or parks. */
int async_fiber_cancelled(void);

/* Shields the calling fiber from cancellation until the matching
 * async_fiber_shield_end (they nest): meanwhile its parks are not ended by
 * async_fiber_cancel, a scope's cancel or a deadline (the call's own
 * timeout still applies; async_sched_shutdown still cancels them), so a
 * short cleanup can still wait. A cancel that arrives meanwhile takes
 * effect at the first park after the last shield_end. Errors:
 * ASYNC_E_STATE (not on a fiber; _end without a _begin), ASYNC_E_INVAL
 * (nesting deeper than INT32_MAX). Never blocks or parks. */
int async_fiber_shield_begin(void);
int async_fiber_shield_end(void);

/* Sets the calling fiber's own deadline to timeout_ms from now (-1: none,
 * which leaves only its scope's). Replaces an earlier one. Errors:
 * ASYNC_E_STATE (not on a fiber), ASYNC_E_INVAL (timeout_ms < -1). Never
 * blocks or parks. */
int async_fiber_set_deadline(int timeout_ms);

/* Creates a scope of scheduler s, inside parent (NULL: at the top). Its
 * deadline is timeout_ms from now (-1: none), or the parent's when that is
 * earlier; it is fixed for the scope's life. A scope created inside a
 * cancelled one starts cancelled. On a scheduler that is shutting down it
 * is created (not cancelled), and every spawn into it fails with
 * ASYNC_E_CANCELLED, as every spawn does then. Errors: ASYNC_E_BADHANDLE (s or parent),
 * ASYNC_E_INVAL (parent of another scheduler, timeout_ms < -1),
 * ASYNC_E_NOMEM. Thread-safe; never blocks or parks. */
async_scope_t *async_scope_create(async_sched_t *s, async_scope_t *parent, int timeout_ms);

/* async_fiber_spawn on the scope's scheduler, the fiber in scope sc: it
 * takes sc's deadline, and starts cancelled if sc was cancelled (it runs,
 * its first park fails). Errors: those of async_fiber_spawn, and
 * ASYNC_E_BADHANDLE (sc). Thread-safe; never blocks or parks. */
async_fiber_t *async_scope_spawn(async_scope_t *sc, void (*fn)(void *), void *arg, unsigned flags);

/* Cancels every fiber of sc and of every scope below it, and those spawned
 * into them later (see above). Returns at once: join to wait. Idempotent.
 * Errors: ASYNC_E_BADHANDLE. Thread-safe; never parks (it takes a lock
 * the scheduler's scopes share while it walks them). */
int async_scope_cancel(async_scope_t *sc);

/* Waits up to timeout_ms (-1: for ever, 0: a look) until every fiber of sc
 * and of every scope below it has returned (joinable ones still need
 * async_fiber_join to free their handles); then none of them runs any more.
 * The wait is not ended by a cancel of the calling fiber, its deadline or
 * its scheduler's shutdown, only by its own timeout, so a parent can always
 * wait for its children before it frees what they use. Several joins may
 * wait at once. A join that began before sc's destroy (or its scheduler's)
 * returns its own result; one that begins after it fails with
 * ASYNC_E_BADHANDLE. Errors: ASYNC_E_BADHANDLE, ASYNC_E_INVAL (timeout_ms < -1),
 * ASYNC_E_TIMEDOUT (fibers still run), ASYNC_E_STATE (the calling fiber is
 * in sc or below, also in a function async_fiber_blocking runs for such a
 * fiber: it would wait for itself). Thread-safe; parks. */
int async_scope_join(async_scope_t *sc, int timeout_ms);

/* Frees scope sc; its handle becomes invalid. Only an empty scope goes:
 * cancel and join first. async_sched_destroy frees the scopes left. Errors:
 * ASYNC_E_BADHANDLE, ASYNC_E_BUSY (a fiber of sc or below has not returned,
 * or a scope inside sc is not destroyed). Thread-safe; never blocks or
 * parks. */
int async_scope_destroy(async_scope_t *sc);

/* ---- Fiber debugging: names, dumps, the stall detector (docs/DEBUGGING.md) ---- */

/* Bytes of a fiber name, its terminating NUL included: a name is cut to
 * ASYNC_FIBER_NAME_MAX - 1 bytes (never in the middle of a UTF-8 sequence:
 * a character that does not fit goes whole). */
#define ASYNC_FIBER_NAME_MAX 32

/* Names fiber f (NULL: the calling fiber) for async_sched_dump, the stall
 * report and the gdb helper. name is copied: cut to ASYNC_FIBER_NAME_MAX - 1
 * bytes at a UTF-8 character boundary, and every control byte (< 0x20,
 * 0x7f) replaced by '?', so a dump line stays one line. name NULL or ""
 * removes the name. A fiber has no name until one is set; a name stays
 * until the fiber's handle becomes invalid (a joinable fiber keeps it after
 * it returned, until joined). Safe against f ending concurrently: a handle
 * that is no longer valid gives ASYNC_E_BADHANDLE. Errors: ASYNC_E_BADHANDLE,
 * ASYNC_E_STATE (f NULL on a plain thread). Thread-safe (also from fibers);
 * never blocks or parks. */
int async_fiber_set_name(async_fiber_t *f, const char *name);

/* Copies the name of fiber f (NULL: the calling fiber) into buf (size bytes,
 * always NUL-terminated when size > 0; cut when too small) and returns the
 * name's length in bytes (0: no name), as snprintf does: a return >= size
 * means buf holds a cut copy. buf may be NULL when size is 0. Errors:
 * ASYNC_E_INVAL (buf NULL with size > 0), ASYNC_E_BADHANDLE, ASYNC_E_STATE
 * (f NULL on a plain thread). Thread-safe; never blocks or parks. */
int async_fiber_get_name(async_fiber_t *f, char *buf, size_t size);

/* Writes one line per fiber of s that is live or returned but not joined
 * (with a header line and a last line), to fd with write(2):
 *   fiber <id> "<name>" <state> [<what it waits on>] [for <ms> ms]
 * state: runnable, running on worker <n>, parked, done-unjoined. A parked
 * fiber shows what it waits on (sleep, join of a fiber id, chan send/recv
 * with the channel handle, select, fd <n> read/write, blocking call, queue
 * read/write with the queue handle) and for how long (ms, measured with a
 * coarse clock: a few ms of resolution). The dump is a snapshot taken
 * without stopping the workers (each fiber's line is consistent, the set may
 * be slightly stale); it is built in memory first, so no lock of s is held
 * while writing. Returns the number of fiber lines written. Errors:
 * ASYNC_E_BADHANDLE, ASYNC_E_INVAL (fd < 0), ASYNC_E_NOMEM, ASYNC_E_SYS
 * (a write failed; async_last_os_error() tells why: EPIPE for a pipe or
 * socket whose reader is gone, never a SIGPIPE, also in the handler of
 * async_sched_dump_on_signal). Thread-safe (also from
 * fibers of any scheduler: it does not park, but a write to a full pipe
 * blocks the caller's thread); not async-signal-safe (see
 * async_sched_dump_on_signal). */
int async_sched_dump(async_sched_t *s, int fd);

/* Makes signal signo dump s to fd (as async_sched_dump) from its handler;
 * signo 0 removes s's registration. Several schedulers may share a signal
 * (each is dumped); a scheduler has at most one registration (a new call
 * replaces it; when that call fails, for any reason, s has none). The handler is async-signal-safe: it formats by hand, writes
 * with write(2), takes no lock the interrupted thread may hold (a fiber list
 * whose lock is held at that moment is skipped and reported as skipped), and
 * lists at most 4096 fibers of each scheduler (the rest are counted). The
 * handler replaces signo's previous disposition (it does not chain to a
 * previous handler); the previous one is restored when the last
 * registration for signo goes (signo 0, or async_sched_destroy), or, while
 * libasync also watches signo (async_runtime_add_signal,
 * async_fiber_watch_signal), when the last of those goes too: libasync
 * installs one handler per signal for both, saves the host's action once
 * and restores it once, and no signal is lost to the swap (each one is
 * dumped or acted on by the host's action; see async_runtime_add_signal).
 * A process forked while signo is registered gets
 * the host's action back at the first such signal in the child. Allowed:
 * SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGTERM, SIGWINCH and the
 * real-time signals. Errors: ASYNC_E_BADHANDLE, ASYNC_E_INVAL (another
 * signal, fd < 0), ASYNC_E_NOMEM (also: 64 schedulers registered), ASYNC_E_SYS
 * (sigaction), ASYNC_E_NOTSUP (Windows: no POSIX signals). Thread-safe;
 * never blocks (removal waits for a handler that is dumping s on another
 * thread). */
int async_sched_dump_on_signal(async_sched_t *s, int signo, int fd);

/* The stall detector: once ms > 0, a monitor thread of s reports through the
 * log hook (ASYNC_LOG_WARN, async_set_log_handler) every fiber that runs
 * longer than ms milliseconds without parking, yielding or returning, once
 * per stall: its id, name, worker, how long it has run so far (at least
 * ms; the monitor samples every ms/4, 1 to 250 ms) and how long of that its
 * worker thread was on a CPU (much less: the OS kept the worker off the CPU,
 * which is reported the same way). When such a fiber
 * finally switches out, an ASYNC_LOG_INFO message gives the stall's length
 * (at least). It costs the workers two stores per dispatch; the monitor
 * thread (named la-stall) exists only while ms > 0. ms 0 turns it off (the
 * monitor thread is joined). The environment variable ASYNC_FIBER_STALL_MS
 * (0 to 3600000) sets it for every new scheduler (a bad value is ignored
 * with an ASYNC_LOG_WARN message). Errors: ASYNC_E_BADHANDLE,
 * ASYNC_E_INVAL (ms < 0 or > 3600000), ASYNC_E_NOMEM, ASYNC_E_SYS (no thread could be started),
 * ASYNC_E_STATE (called from a log handler on the monitor thread; such a
 * handler must not destroy the scheduler either: async_sched_destroy fails
 * there with ASYNC_E_STATE). Thread-safe (also on a fiber); never parks
 * (turning it off waits for the monitor thread to end). */
int async_sched_set_stall_ms(async_sched_t *s, int ms);


/* Windows: the fd of the five calls below is a SOCKET (anything else is
 * ASYNC_E_BADFD: pipes and files have no readiness there); read, write,
 * accept and connect switch it to non-blocking mode (FIONBIO) and there is no
 * SIGPIPE to avoid; a plain thread waits with WSAPoll; ASYNC_E_BUSY is never
 * returned (every waiting fiber has its own poll, so several may wait on one
 * socket in one direction); WSAPoll's POLLHUP (a peer's close, and its
 * shutdown(SD_SEND), which WSAPoll does not tell apart) is CLOSE, and
 * READ|CLOSE when READ was asked. */

/* Waits until fd is ready for `events` (ASYNC_EVENT_READ and/or
 * ASYNC_EVENT_WRITE) and returns the ready events (READ, WRITE, ERROR, CLOSE
 * bits; level semantics: data left unread is reported again, and so is a
 * hang-up or error condition while it lasts). CLOSE comes as
 * async_runtime_add reports it for a registration without
 * ASYNC_EVENT_CLOSE (CLOSE cannot be asked here): a read-side hang-up alone
 * (the peer's shutdown(SHUT_WR), or its close seen over TCP) is never
 * CLOSE, it is READ when READ was asked (read until the read returns 0)
 * and nothing when only WRITE was; a hang-up of both sides (POLLHUP: a pipe
 * whose writer is gone, a socket shut both ways or reset, a pty whose other
 * side closed) is CLOSE whatever was asked, and READ|CLOSE when READ was
 * asked, since a read then returns at once (0, or the error), also where
 * the kernel reports the hang-up alone, as for an empty pipe (the runtime
 * says CLOSE alone there). Where poll(2) reports a peer's shutdown(SHUT_WR)
 * as POLLHUP (macOS), and on Windows, a half-close cannot be told from a
 * full hang-up and is reported as one. At most one
 * fiber may wait for reading and one for writing on an fd of a scheduler at
 * a time: a call that has to wait in a direction another fiber already
 * waits in gets ASYNC_E_BUSY; a call that finds fd ready for one of its
 * events returns them at once, without waiting, so never BUSY (READ|WRITE
 * on a writable fd while another fiber waits to read it returns WRITE).
 * Errors: ASYNC_E_INVAL (events 0 or with bits other than READ and WRITE;
 * a bad timeout), ASYNC_E_BADFD,
 * ASYNC_E_TIMEDOUT, ASYNC_E_BUSY, ASYNC_E_CANCELLED. Thread-safe; parks
 * (a plain thread uses poll(2)). */
int async_fiber_wait_fd(async_fd_t fd, uint32_t events, int timeout_ms);

/* Starts the process-wide fiber-side watch of signo: from now on every
 * arrival of signo is counted for async_fiber_wait_signal (and no longer
 * acted on by the previous action). Calls nest: the watch lasts until as
 * many async_fiber_unwatch_signal calls. The handler, the signals refused
 * and the fate of the action that was there are those of
 * async_runtime_add_signal (both kinds of watch may be active at once; each
 * sees every signal). Errors: ASYNC_E_INVAL (a refused signo, see
 * async_runtime_add_signal), ASYNC_E_SYS (sigaction or the pipe it makes,
 * once per signal, failed), ASYNC_E_NOTSUP (Windows). Thread-safe; never
 * blocks. */
int async_fiber_watch_signal(int signo);

/* Undoes one async_fiber_watch_signal(signo); the last one ends the watch
 * (a count not taken yet is dropped, and waiting callers return
 * ASYNC_E_STATE, also when a new async_fiber_watch_signal follows at once:
 * a wait belongs to the watch it began under). Errors: ASYNC_E_INVAL (out of range), ASYNC_E_NOTFOUND
 * (not watched), ASYNC_E_NOTSUP (Windows). Thread-safe; never blocks. */
int async_fiber_unwatch_signal(int signo);

/* Waits until signo has arrived (under async_fiber_watch_signal) and returns
 * how many times it arrived since the last call that returned a count (at
 * most INT_MAX; the rest stays for the next call). Signals that arrived
 * while nobody waited are counted, not lost. When several callers wait for
 * one signal, one of them gets the count and the others go on waiting; at
 * most one fiber per scheduler may wait for a given signal at a time (the
 * others get ASYNC_E_BUSY). Errors: ASYNC_E_INVAL (signo out of range,
 * timeout_ms < -1), ASYNC_E_STATE (signo is not watched, or the watch ended
 * during the wait, even if another one started since), ASYNC_E_TIMEDOUT, ASYNC_E_BUSY, ASYNC_E_CANCELLED (the
 * fiber's scheduler shuts down), ASYNC_E_NOTSUP (Windows). Thread-safe;
 * parks (a plain thread blocks in poll(2)). */
int async_fiber_wait_signal(int signo, int timeout_ms);

/* Fiber I/O backend: the environment variable ASYNC_FIBER_IO, read by
 * async_sched_create, chooses how a scheduler's fibers wait in the four
 * calls below (and in async_fiber_recvfrom, async_fiber_sendto and
 * async_fiber_read_full, "Server helpers"): "epoll" or unset (the
 * default) through the scheduler's fd poller, "uring" through io_uring on Linux 5.19 or later (one ring per
 * worker; where io_uring cannot be used, epoll is used and an
 * ASYNC_LOG_INFO message says why: a kernel older than 5.19 or one that
 * refuses io_uring, valgrind, or no descriptor or memory left for the
 * rings when the scheduler is created; other platforms ignore it). The promises
 * below hold for both. With io_uring: a socket call of a fiber with
 * timeout_ms other than 0 is submitted to the ring; a timeout, a cancel or
 * deadline of the fiber, or shutdown cancels it and waits for the kernel to confirm before returning (the
 * kernel never writes into buf after the call returned), and an operation
 * that completed meanwhile keeps its result; the ASYNC_E_BUSY rule is kept
 * apart from async_fiber_wait_fd's; closing the fd with close(2) from
 * another thread does not end an operation in flight, a receive, send or
 * accept (shutdown(2) does, and so does async_fiber_close once the
 * scheduler owns the fd: ASYNC_E_CLOSED): it holds the file it began on (a
 * closed listener keeps its port until its accept ends), may return that
 * file's bytes (or its end of file) even after the number was reused, and
 * until it ends (timeout, shutdown) it holds the number's direction: a
 * fiber's read of the new file under that number returns the data already
 * there and gets ASYNC_E_BUSY only where it would have to wait (as the
 * epoll path does when another fiber waits), a write or accept gets
 * ASYNC_E_BUSY (the epoll path lets them run). Plain threads, timeout_ms
 * 0, fds that are not sockets and fds the scheduler owns
 * (async_fiber_fd_open, whose async_fiber_close must wake their waiters)
 * take the poller path, and so does the wait of a socket with O_NONBLOCK
 * set (the ring's operation on it fails at once instead of waiting). */

/* Reads up to n bytes (at least 1 unless n is 0 or at end of file: returns
 * 0; with n 0 at once, reading nothing (a socket's pending data or datagram
 * stays; buf may be NULL), if fd is open, whatever timeout_ms; on a datagram socket
 * an empty datagram is read as 0 too, and a datagram longer than n is cut
 * to n). buf NULL with n > 0, or n > SSIZE_MAX: ASYNC_E_INVAL. The fd is switched to O_NONBLOCK if it is not a socket; sockets are
 * read with MSG_DONTWAIT. A peer's hang-up ends the read with 0 (end of
 * file; also a terminal's hang-up, e.g. a pty master whose slave side is
 * closed, which read(2) reports as EIO on Linux; an EIO without a hang-up,
 * such as a background read on an orphaned process group's terminal, is
 * ASYNC_E_SYS) and a socket error with its error (once: the next read
 * waits again).
 * timeout_ms is always honoured, also when the fd number was closed and
 * reused meanwhile, or the fd reports a condition its read does not clear.
 * Errors: ASYNC_E_INVAL, ASYNC_E_BADFD, ASYNC_E_TIMEDOUT (nothing read),
 * ASYNC_E_CLOSED (connection reset or refused, e.g. the ICMP error a
 * connected UDP socket received), ASYNC_E_BUSY (another fiber reads this
 * fd), ASYNC_E_CANCELLED, ASYNC_E_SYS. Thread-safe; parks. */
ssize_t async_fiber_read(async_fd_t fd, void *buf, size_t n, int timeout_ms);

/* Writes all n bytes (returns n) or fails; on failure some bytes may have
 * been written (how many is not told: a stream is not usable after a
 * failed or timed-out write). n 0 returns 0 at once if fd is open; buf NULL
 * with n > 0, or n > SSIZE_MAX: ASYNC_E_INVAL. A closed peer or reader gives ASYNC_E_CLOSED, never SIGPIPE,
 * on a fiber or a plain thread: sockets are written with MSG_NOSIGNAL; for
 * other fds (pipes) SIGPIPE is blocked around the write and the one it
 * raised is consumed (one already pending before the call stays pending;
 * the thread's signal mask is restored). Fiber worker threads block
 * SIGPIPE for good. n 0 on a closed fd: ASYNC_E_BADFD.
 * timeout_ms counts from the first time the fd has no room (the writes
 * before that do not block): the call fails with ASYNC_E_TIMEDOUT if it has
 * not written all n bytes timeout_ms after that.
 * Errors: as async_fiber_read.
 * Thread-safe; parks. */
ssize_t async_fiber_write(async_fd_t fd, const void *buf, size_t n, int timeout_ms);

/* Accepts a connection on a listening socket (switched to O_NONBLOCK). The
 * new fd is O_NONBLOCK and close-on-exec; owned by the calling fiber's
 * scheduler when listen_fd is (see "Owned descriptors" below: close it with
 * async_fiber_close). addr/len as for accept(2): addr NULL ignores len;
 * addr set needs len (else ASYNC_E_INVAL), and a *len too small truncates
 * the address and *len tells its full size. Errors: ASYNC_E_INVAL, ASYNC_E_BADFD, ASYNC_E_NOMEM
 * (also: out of fds), ASYNC_E_TIMEDOUT, ASYNC_E_BUSY, ASYNC_E_CANCELLED,
 * ASYNC_E_SYS. Thread-safe; parks. */
async_fd_t async_fiber_accept(async_fd_t listen_fd, struct sockaddr *addr, socklen_t *len, int timeout_ms);

/* Connects a socket (switched to O_NONBLOCK) and waits for the result. A
 * connect of fd already in progress (one that timed out here, or the host's
 * own non-blocking connect) is waited for the same way: its result is the
 * call's; on a socket already connected it returns 0. Errors: ASYNC_E_INVAL, ASYNC_E_BADFD, ASYNC_E_CLOSED (refused),
 * ASYNC_E_TIMEDOUT (the attempt may still complete later: close the fd, or
 * call again to wait on it),
 * ASYNC_E_CANCELLED, ASYNC_E_SYS. Thread-safe; parks. */
int async_fiber_connect(async_fd_t fd, const struct sockaddr *addr, socklen_t len, int timeout_ms);

/* Owned descriptors (docs/FIBERS.md "Owned descriptors"). A descriptor
 * the calls above get without ownership is registered with the scheduler's
 * poller anew for every wait (one system call per park). An owned one is
 * registered once, edge-triggered, for both directions, and its waits
 * park and wake without touching the poller again; it must then be closed
 * with async_fiber_close, which wakes the fibers parked on it.
 * async_fiber_accept called on a fiber, on a listening socket owned by that
 * fiber's scheduler, returns a descriptor owned by that scheduler (if its
 * registration fails, e.g. out of memory, it is returned unowned: it works
 * the same, one system call per park); on a plain listening socket, or on
 * a plain thread, it returns a plain descriptor. async_fiber_listen and
 * async_fiber_udp_bind called on a fiber return descriptors owned by its
 * scheduler. async_fiber_connect leaves ownership as it is (an owned fd stays owned, a
 * plain one stays plain).
 *
 * Rules: an fd is owned by at most one scheduler. Its fibers use the
 * registration; fibers of other schedulers and plain threads may use the fd
 * too, as a plain descriptor (they are not woken by async_fiber_close).
 * The one-reader one-writer rule of async_fiber_wait_fd holds (a concurrent
 * read and write from two fibers is fine). Closing an owned fd with close(2)
 * (or replacing it with dup2) is a bug: the fibers parked on it are not
 * woken, and until its number is owned again (async_fiber_fd_open, or
 * async_fiber_accept, async_fiber_listen or async_fiber_udp_bind on a fiber
 * returning it, which detect that the old file is gone and wake the old
 * waiters with ASYNC_E_CLOSED), a
 * fiber of the owning scheduler that waits on a new file with that number
 * may wait until its timeout. That detection also reports the bug: one
 * ASYNC_LOG_WARN message through the log hook (async_set_log_handler),
 * "fd N: owned descriptor was closed with close(2), not async_fiber_close"
 * (the hook is called with no lock of the library held). An fd closed with
 * async_fiber_close, or left owned by nobody by async_sched_destroy, is
 * never reported. async_sched_destroy leaves the fds its scheduler owned
 * open and owned by nobody (close them with close(2) or async_fiber_close).
 * Not in a forked child (ASYNC_E_FORKED, also for async_fiber_close: use
 * close(2) there). Windows: async_fiber_fd_open fails with ASYNC_E_NOTSUP, accept
 * returns plain sockets, async_fiber_close is closesocket. */

/* Makes fd owned by scheduler s (NULL: the calling fiber's scheduler):
 * switches it to O_NONBLOCK and registers it with s's poller for good.
 * Any descriptor the poller takes (sockets, pipes, terminals, eventfds; not
 * regular files). Errors: ASYNC_E_BADHANDLE (s invalid), ASYNC_E_STATE (s
 * NULL on a plain thread), ASYNC_E_BADFD (fd not open, or not pollable),
 * ASYNC_E_EXISTS (fd is owned already, by s or another scheduler),
 * ASYNC_E_NOMEM, ASYNC_E_SYS, ASYNC_E_NOTSUP (Windows). Thread-safe (also
 * from fibers of any scheduler); never parks (a few system calls). */
int async_fiber_fd_open(async_sched_t *s, async_fd_t fd);

/* Closes fd. If a scheduler owns it: its registration goes, every fiber of
 * that scheduler parked on fd (async_fiber_read, write, accept, connect,
 * wait_fd) wakes and fails with ASYNC_E_CLOSED, and so does such a call
 * that began before and parks after; then close(2). Any other fd is just
 * closed (close(2); closesocket on Windows), so this call may close every
 * descriptor the fiber calls use. The number may be handed out again as
 * soon as this call returns; a call on fd that starts after it is a call on
 * whatever the number names then (as with close(2)). An EINTR from close(2)
 * counts as closed (Linux). Errors: ASYNC_E_BADFD (not an open descriptor),
 * ASYNC_E_SYS (close(2) failed otherwise, e.g. EIO: the fd is closed all
 * the same). Thread-safe; never parks (close(2) itself may block, e.g. a
 * socket with SO_LINGER). */
int async_fiber_close(async_fd_t fd);

/* Server helpers (docs/SERVERS.md). They build on the calls above and keep
 * their promises on both fiber I/O paths (epoll, io_uring) and on plain
 * threads. */

/* Fills *out (and *len) with the numeric address host:port, IPv4
 * ("127.0.0.1") or IPv6 ("::1", also in brackets "[::1]", with a scope
 * "fe80::1%eth0" or "fe80::1%2"; Windows takes numeric scopes only); host
 * NULL or "" is the IPv4 wildcard 0.0.0.0, "::" the IPv6 one. *len is the
 * family's size (sizeof(struct sockaddr_in) or sockaddr_in6). No name
 * lookup (names: getaddrinfo under async_fiber_blocking or
 * async_runtime_submit_work). Errors: ASYNC_E_INVAL (NULL out or len, port
 * < 0 or > 65535, host not a numeric address, an unknown scope name).
 * Thread-safe; never blocks. */
int async_sockaddr_parse(const char *host, int port, struct sockaddr_storage *out, socklen_t *len);

/* async_fiber_listen and async_fiber_udp_bind flags. */
#define ASYNC_LISTEN_REUSEPORT 0x1u /* SO_REUSEPORT: several sockets share the port (Linux, BSD, macOS; ASYNC_E_NOTSUP elsewhere) */
#define ASYNC_LISTEN_V6ONLY 0x2u    /* an IPv6 address takes IPv6 only (default: dual-stack, IPv4 mapped); ignored for IPv4 */

/* Creates a TCP socket bound to addr (IPv4 or IPv6; port 0 picks a free
 * port: getsockname(2) tells it) with SO_REUSEADDR (Windows:
 * SO_EXCLUSIVEADDRUSE), listening with backlog (<= 0: SOMAXCONN), non-blocking
 * and close-on-exec. An IPv6 socket is dual-stack (IPV6_V6ONLY off, set
 * explicitly: systems differ in their default) unless ASYNC_LISTEN_V6ONLY.
 * Called on a fiber, the socket is owned by the fiber's
 * scheduler (its async_fiber_accept hands out owned descriptors: close both
 * with async_fiber_close); on a plain thread, or where the scheduler cannot
 * own it (Windows, out of memory), it is a plain descriptor. Errors:
 * ASYNC_E_INVAL (addr NULL, len too small for its family, a family other
 * than AF_INET/AF_INET6, unknown flags), ASYNC_E_EXISTS (address in use),
 * ASYNC_E_NOMEM (also: out of descriptors), ASYNC_E_NOTSUP (REUSEPORT on
 * Windows; an IPv6 address where the system has no IPv6), ASYNC_E_FORKED,
 * ASYNC_E_SYS (e.g. EACCES on a privileged port, EADDRNOTAVAIL for an
 * address of no local interface: async_last_os_error tells). Thread-safe;
 * never parks. */
async_fd_t async_fiber_listen(const struct sockaddr *addr, socklen_t len, int backlog, unsigned flags);

/* As async_fiber_listen, for a UDP socket bound to addr (no listen), without
 * SO_REUSEADDR (on Linux it would let a second socket share the port
 * silently: two sockets share a port only with ASYNC_LISTEN_REUSEPORT on
 * both). Same ownership rule, flags and errors. Thread-safe; never parks. */
async_fd_t async_fiber_udp_bind(const struct sockaddr *addr, socklen_t len, unsigned flags);

/* Reads exactly n bytes unless the stream ends first or the call fails:
 * returns n, or the count read before end of file (less than n, maybe 0),
 * or -1. timeout_ms bounds the whole call, not each read (0: only what is
 * there already). *got (if not NULL) is always set to the bytes stored in
 * buf, also on -1 and for bad arguments (0) (a timeout or cancel after some
 * bytes arrived loses none of them: they are in buf, and the stream goes on
 * after them). n 0 returns 0 at once if fd is open. Errors, buf and n: as
 * async_fiber_read. Thread-safe; parks. */
ssize_t async_fiber_read_full(async_fd_t fd, void *buf, size_t n, size_t *got, int timeout_ms);

/* Receives one datagram into buf (cut to n bytes as recvfrom(2) does, the
 * rest of it dropped; an empty datagram returns 0; n 0 takes one datagram
 * and returns 0, buf may be NULL then) and its source address into
 * addr/len as accept(2) does (addr NULL: not told, len ignored; addr set
 * needs len, else ASYNC_E_INVAL; a *len too small cuts the address and
 * *len tells its full size). Works on bound and connected datagram
 * sockets (on a stream socket it reads as async_fiber_read). Errors: as
 * async_fiber_read (ASYNC_E_BADFD also for an fd that is not a socket;
 * ASYNC_E_CLOSED: an ICMP error queued for the socket, reported once: on
 * Linux only a connected socket gets them, Windows reports them to
 * unconnected ones too). Thread-safe; parks. */
ssize_t async_fiber_recvfrom(async_fd_t fd, void *buf, size_t n, struct sockaddr *addr, socklen_t *len,
                             int timeout_ms);

/* Sends buf as one datagram to addr (addr NULL: the connected peer, len
 * ignored); returns n. n 0 sends an empty datagram (buf may be NULL). A
 * datagram too large for the socket: ASYNC_E_TOOBIG. On an unconnected
 * socket a peer nobody listens on is not an error. Errors: as
 * async_fiber_write (ASYNC_E_BADFD also for an fd that is not a socket;
 * ASYNC_E_CLOSED: a connected socket's ICMP error), ASYNC_E_TOOBIG,
 * ASYNC_E_INVAL also for addr NULL on a socket that is not connected, or
 * an address the socket's family cannot send to (a dual-stack IPv6 socket
 * sends to IPv4 addresses too). Thread-safe; parks (while the socket's
 * send buffer is full). */
ssize_t async_fiber_sendto(async_fd_t fd, const void *buf, size_t n, const struct sockaddr *addr, socklen_t len,
                           int timeout_ms);

/* A buffered reader over one descriptor, for protocols framed by lines or
 * delimiters (telnet lines, HTTP headers) with a bounded length. It reads
 * with async_fiber_read, so it parks on a fiber and blocks a plain thread.
 * A reader is used by one fiber or thread at a time (not thread-safe); it
 * never closes its fd. It is meant for streams: on a datagram socket each
 * read takes one datagram, cut to the buffer's free space, and an empty
 * datagram reads as end of file. */
typedef struct async_reader async_reader_t;

/* Creates a reader of fd whose frames are at most max_len bytes (1 to
 * 64 MiB; the delimiter counts), with a buffer of max(max_len, 4 KiB)
 * allocated here, once. Errors: ASYNC_E_INVAL (max_len out of
 * range), ASYNC_E_BADFD (fd < 0), ASYNC_E_NOMEM. Thread-safe. */
async_reader_t *async_reader_create(async_fd_t fd, size_t max_len);

/* Frees r (NULL: nothing); bytes still buffered are dropped. The fd stays
 * open. Not while another call on r runs. */
void async_reader_destroy(async_reader_t *r);

/* Returns the next frame: the bytes up to and including the first delim
 * byte (delim converted to unsigned char, as memchr does). *out points at
 * them inside r's buffer (not NUL-terminated; valid until the next call on
 * r) and the result is their length. At end of file, bytes left without a
 * delimiter are returned as a last frame (without delim), then 0. A frame
 * longer than max_len: -1 with ASYNC_E_TOOBIG, *out pointing at its first
 * max_len bytes, which are consumed (the next call goes on with the rest
 * of that frame); max_len bytes without delim are such a frame as soon as
 * they are buffered, so a last frame has at most max_len - 1 bytes. timeout_ms bounds the whole call; on -1 the bytes read
 * stay buffered for the next call. Errors: ASYNC_E_INVAL (r or out NULL,
 * bad timeout), ASYNC_E_TOOBIG, and those of async_fiber_read. Parks. */
ssize_t async_reader_read_until(async_reader_t *r, int delim, const char **out, int timeout_ms);

/* Copies up to n bytes into buf: buffered bytes first, else one
 * async_fiber_read. Returns the count, 0 at end of file, or -1 (errors as
 * async_fiber_read; ASYNC_E_INVAL also for r NULL). Parks. */
ssize_t async_reader_read(async_reader_t *r, void *buf, size_t n, int timeout_ms);

/* Bytes buffered in r and not yet returned (0 for NULL). Never parks. */
size_t async_reader_buffered(const async_reader_t *r);


/* Runs fn(arg) on a thread of a process-wide pool of blocking threads (it
 * grows on demand up to 64 threads: a thread starts whenever the queued jobs
 * outnumber the idle threads; threads idle for 10 s exit) and parks
 * the calling fiber until fn returns; up to 64 jobs run at once (they may
 * wait for each other), jobs beyond 64 wait in FIFO order. Use
 * it for calls that would block a worker (file I/O, getaddrinfo, sleeping
 * locks). fn may use memory on the fiber's stack. This park is NOT cancelled
 * by async_sched_shutdown, async_fiber_cancel, a scope's cancel or a
 * deadline: the fiber always waits for fn, and the call returns 0 (a cancel
 * takes effect at the fiber's next park). On a plain thread
 * (a pool thread included: nested calls) fn runs inline. fn runs on a plain
 * thread (async_fiber_current() is NULL there; the fiber calls block it as
 * on any plain thread), except for the waits that could only end after fn
 * returns: there the pool thread counts as a worker of the calling fiber's
 * scheduler s: async_sched_shutdown(s) only starts the shutdown and returns
 * 0 without waiting, async_sched_destroy(s) and async_sched_run(s) fail with
 * ASYNC_E_STATE, and async_fiber_join of the calling fiber too.
 * Returns 0, or -1: ASYNC_E_INVAL if fn is NULL; ASYNC_E_NOMEM when no
 * pool thread is idle and the system refuses a new one (RLIMIT_NPROC,
 * threads-max, memory for its stack): fn was not run (it is never left
 * waiting for a busy thread, nor run on the fiber); ASYNC_E_SYS when
 * starting the thread failed otherwise (fn was not run).
 * Thread-safe; parks. */
int async_fiber_blocking(void (*fn)(void *), void *arg);

/* Channels: typed-by-size FIFOs between fibers and/or threads. Elements are
 * copied (elem_size bytes). capacity 0 makes a rendezvous channel: a send
 * completes only when a receiver takes the element. Blocked senders and
 * receivers are served in FIFO order. Channels do not belong to a scheduler:
 * fibers of any scheduler and plain threads may share one. */

/* Creates a channel. Errors: ASYNC_E_INVAL (elem_size 0 or > 1 MiB,
 * capacity > 2^24, capacity * elem_size > 1 GiB), ASYNC_E_NOMEM.
 * Thread-safe; never blocks. */
async_chan_t *async_chan_create(size_t capacity, size_t elem_size);

/* Copies *elem into the channel, waiting up to timeout_ms while it is full
 * (or, for capacity 0, until a receiver takes it). timeout_ms 0 never waits
 * and fails with ASYNC_E_FULL. Errors: ASYNC_E_BADHANDLE, ASYNC_E_INVAL,
 * ASYNC_E_FULL, ASYNC_E_TIMEDOUT, ASYNC_E_CLOSED (closed before or while
 * waiting: the element was not sent), ASYNC_E_CANCELLED. Thread-safe;
 * parks. */
int async_chan_send(async_chan_t *c, const void *elem, int timeout_ms);

/* Takes the oldest element into *elem (elem may be NULL to discard it),
 * waiting up to timeout_ms. A closed channel still delivers what it holds,
 * then fails with ASYNC_E_CLOSED. timeout_ms 0 never waits and fails with
 * ASYNC_E_EMPTY. Errors: ASYNC_E_BADHANDLE, ASYNC_E_INVAL, ASYNC_E_EMPTY,
 * ASYNC_E_TIMEDOUT, ASYNC_E_CLOSED, ASYNC_E_CANCELLED. Thread-safe; parks. */
int async_chan_recv(async_chan_t *c, void *elem, int timeout_ms);

/* async_chan_send(c, elem, 0) and async_chan_recv(c, elem, 0): they fail
 * with ASYNC_E_FULL / ASYNC_E_EMPTY when they cannot complete at once, and
 * have the other errors of those functions. Never block. */
int async_chan_try_send(async_chan_t *c, const void *elem);
int async_chan_try_recv(async_chan_t *c, void *elem);

/* Closes the channel: later sends fail with ASYNC_E_CLOSED, receivers drain
 * the buffered elements then get ASYNC_E_CLOSED; every parked sender and
 * receiver wakes with ASYNC_E_CLOSED. Idempotent. Invalid handles are
 * ignored (ASYNC_E_BADHANDLE). Thread-safe; never blocks. */
void async_chan_close(async_chan_t *c);

/* Closes (as above) and releases the handle; the memory goes when the last
 * call using it returns. Invalid handles are ignored (ASYNC_E_BADHANDLE).
 * Thread-safe; never blocks. */
void async_chan_destroy(async_chan_t *c);

#define ASYNC_CHAN_SEND 1
#define ASYNC_CHAN_RECV 2

/* One operation of async_chan_select. */
typedef struct {
    async_chan_t *chan;
    int dir;    /* ASYNC_CHAN_SEND or ASYNC_CHAN_RECV */
    void *elem; /* send: the element to copy; recv: where to copy (may be NULL) */
    int status; /* out, for the chosen op: 0, or ASYNC_E_CLOSED (channel closed) */
} async_chan_op_t;

/* Waits up to timeout_ms until at least one of the n operations can
 * complete, completes exactly one of them and returns its index (when
 * several are ready at once one is chosen at random). An operation on a
 * closed channel completes with ops[i].status = ASYNC_E_CLOSED (a send then
 * sent nothing; a recv on a closed, drained channel received nothing).
 * A channel may appear in several operations. Errors: ASYNC_E_INVAL (ops
 * NULL, n 0 or > 64, bad dir, send with elem NULL), ASYNC_E_BADHANDLE,
 * ASYNC_E_TIMEDOUT (also for timeout 0 when nothing is ready),
 * ASYNC_E_CANCELLED. Thread-safe; parks. */
int async_chan_select(async_chan_op_t *ops, size_t n, int timeout_ms);

/* Mutexes and condition variables for fibers: a wait parks the calling
 * fiber (its worker runs other fibers meanwhile) and blocks a plain thread,
 * as channels do. Like channels they belong to no scheduler: fibers of any
 * scheduler and plain threads may share one. A pthread mutex held across a
 * parking call, or a contended one, blocks a whole worker instead; use these.
 *
 * Ownership: the owner of a mutex locked on a fiber is that fiber, wherever
 * it runs later (fibers move between worker threads); one locked off a
 * fiber belongs to the calling thread. Only the owner may unlock it (a
 * function run by async_fiber_blocking runs on a pool thread: it is not the
 * fiber and cannot unlock the fiber's mutex). A mutex
 * is not recursive: locking a mutex one already owns fails with
 * ASYNC_E_STATE (it never deadlocks on itself). Waiting lockers get the
 * mutex in FIFO order: unlock hands it to the oldest waiter directly, so a
 * waiter cannot be overtaken by later lockers (no starvation; the price is
 * that a busy mutex switches owner on every unlock). A fiber or thread that
 * ends while owning a mutex leaves it locked for good. */
typedef struct async_mutex_s async_mutex_t;
typedef struct async_cond_s async_cond_t;

/* Creates an unlocked mutex. Errors: ASYNC_E_NOMEM. Thread-safe; never
 * blocks. */
async_mutex_t *async_mutex_create(void);

/* Destroys m, locked or not: the handle becomes invalid at once, every call
 * waiting to lock it (async_mutex_lock, or async_cond_wait taking it back)
 * wakes and fails (lock: ASYNC_E_CLOSED; cond_wait: ASYNC_E_BADHANDLE), and
 * the owner's later unlock fails with ASYNC_E_BADHANDLE. The memory goes
 * when the last call using it returns. Invalid handles are ignored
 * (ASYNC_E_BADHANDLE). Thread-safe; never blocks. */
void async_mutex_destroy(async_mutex_t *m);

/* Locks m, waiting up to timeout_ms while another fiber or thread owns it
 * (timeout_ms 0 never waits and fails with ASYNC_E_BUSY, as
 * async_mutex_trylock). Errors: ASYNC_E_BADHANDLE, ASYNC_E_INVAL (bad
 * timeout), ASYNC_E_STATE (the caller already owns m), ASYNC_E_BUSY
 * (timeout 0), ASYNC_E_TIMEDOUT, ASYNC_E_CLOSED (m was destroyed while the
 * call waited), ASYNC_E_CANCELLED (on a fiber of a scheduler that shuts
 * down). After any failure the caller does not own m (unless it already
 * did: ASYNC_E_STATE). Thread-safe; parks. */
int async_mutex_lock(async_mutex_t *m, int timeout_ms);

/* async_mutex_lock(m, 0): locks m if nobody owns it. Errors:
 * ASYNC_E_BADHANDLE, ASYNC_E_BUSY (another owns it), ASYNC_E_STATE (the
 * caller owns it). Thread-safe; never blocks. */
int async_mutex_trylock(async_mutex_t *m);

/* Unlocks m; the oldest waiter, if any, owns it on return. Errors:
 * ASYNC_E_BADHANDLE, ASYNC_E_STATE (the caller, fiber or thread, does not
 * own m: unlocked, or owned by another). Thread-safe; never blocks. */
int async_mutex_unlock(async_mutex_t *m);

/* Creates a condition variable. Errors: ASYNC_E_NOMEM. Thread-safe; never
 * blocks. */
async_cond_t *async_cond_create(void);

/* Destroys c: the handle becomes invalid at once, every waiter wakes and
 * (once it owns its mutex again) fails with ASYNC_E_CLOSED. The memory goes
 * when the last call using it returns. Invalid handles are ignored
 * (ASYNC_E_BADHANDLE). Thread-safe; never blocks. */
void async_cond_destroy(async_cond_t *c);

/* Atomically unlocks m (which the caller must own) and waits on c up to
 * timeout_ms, then locks m again before returning, also after a timeout, a
 * cancellation or a destroy of c. "Atomically": a signal or broadcast made
 * by whoever locks m after this call released it wakes this call. There are
 * no spurious wake-ups, but another fiber or thread may have changed the
 * state it waited for before m is back: wait in a loop on your predicate.
 * Taking m back is not cancelled by async_sched_shutdown (it waits for m's
 * owner). Whatever the result, the caller owns m on return unless m was
 * destroyed (a later async_mutex_unlock then fails with ASYNC_E_BADHANDLE,
 * so "always unlock afterwards" is safe). Errors: ASYNC_E_BADHANDLE (c or m invalid at the call: nothing
 * done; or m destroyed during the call), ASYNC_E_INVAL (bad timeout),
 * ASYNC_E_STATE (the caller does not own m: nothing done),
 * ASYNC_E_TIMEDOUT, ASYNC_E_CLOSED (c was destroyed while the call waited),
 * ASYNC_E_CANCELLED (on a fiber of a scheduler that shuts down; m is still
 * owned). Thread-safe; parks. */
int async_cond_wait(async_cond_t *c, async_mutex_t *m, int timeout_ms);

/* Wakes the oldest waiter of c (signal) or every waiter (broadcast), if any.
 * A signal is never lost to a waiter whose wait ends at the same time for
 * another reason (its timeout, a cancel or deadline of its fiber): it wakes
 * another waiter then. The caller need not own the mutex.
 * Errors: ASYNC_E_BADHANDLE. Thread-safe; never blocks. */
int async_cond_signal(async_cond_t *c);
int async_cond_broadcast(async_cond_t *c);

/* Fiber-local storage: one value (a void *) per key and per fiber, which
 * follows the fiber across worker threads. Off a fiber, each plain thread
 * has its own values for the same keys (like pthread_getspecific), so code
 * that runs on fibers and threads alike sees its own; note that a function
 * run by async_fiber_blocking runs on a pool thread and sees that thread's
 * values, not the fiber's. A key may be used by any fiber of any scheduler.
 * At most 1024 keys exist at once. */
typedef uint64_t async_fiber_key_t;

/* Creates a key and stores it in *key. Every fiber and thread reads NULL
 * for it until it sets a value. destructor (may be NULL) is called with a
 * fiber's non-NULL value when the fiber's function returns: on that fiber's
 * stack, as that fiber (it may park and use this API), before the fiber
 * counts as finished (so before async_fiber_join returns, or
 * async_sched_run, for it). On a plain thread it is called at the thread's
 * exit (a pthread key destructor: not for the main thread's exit()). As
 * with pthread keys: the value reads NULL when the destructor gets it;
 * values set again by destructors get further rounds, 4 in all, and later
 * ones are dropped. Errors: ASYNC_E_INVAL (key NULL), ASYNC_E_NOMEM (1024
 * keys exist). Thread-safe; never blocks. */
int async_fiber_key_create(async_fiber_key_t *key, void (*destructor)(void *));

/* Deletes key: later calls with it fail with ASYNC_E_BADHANDLE (a key value
 * is never issued again), and no destructor is called for the values it
 * still has (free them first if they need it). A destructor call that was
 * already starting at a fiber's or thread's exit may still happen. Errors:
 * ASYNC_E_BADHANDLE. Thread-safe; never blocks. */
int async_fiber_key_delete(async_fiber_key_t key);

/* Sets the calling fiber's (or, off a fiber, thread's) value for key.
 * Errors: ASYNC_E_BADHANDLE (key not live), ASYNC_E_NOMEM (the value is
 * not set). Never blocks; affects only the caller. */
int async_fiber_setspecific(async_fiber_key_t key, void *value);

/* The calling fiber's (or, off a fiber, thread's) value for key; NULL if
 * none was set. Returns NULL with ASYNC_E_BADHANDLE for a key that is not
 * live (a NULL value sets no error: clear the error first to tell them
 * apart). Never blocks. */
void *async_fiber_getspecific(async_fiber_key_t key);

#ifdef __cplusplus
}
#endif

#endif /* ASYNC_H */
