/*
 * libasync — the classic lib/async API (the one the Neolith MUD driver's
 * lib/async declares), on libasync. See docs/CLASSIC_API.md.
 *
 * Include it through async/async_queue.h, async/async_worker.h and
 * async/async_runtime.h, the classic header names; link with -lasync. A C
 * file written against the classic API compiles unchanged and keeps its
 * meaning. Do not include <async.h> in the same translation unit: its
 * io_event_t and async_runtime_wait/modify are the modern ones (this header
 * refuses to be combined with it).
 *
 * The queue and worker functions are libasync's own (same names, signatures,
 * types and values). The classic runtime functions whose meaning differs
 * from the modern ones are macros naming differently named functions of the
 * library (async_classic_*), so both APIs live in one libasync.so.
 *
 * Errors: every function that fails records why in async_last_error()
 * (declared below, as async_strerror and async_clear_error), as the modern
 * API does.
 */
#ifndef ASYNC_CLASSIC_H
#define ASYNC_CLASSIC_H

#ifdef ASYNC_H
#error "async/async_*.h (the classic lib/async API) and async.h cannot be included in one translation unit"
#endif

#include <stddef.h>
#include <stdint.h>
/* What the classic headers brought in (through the driver's
 * port/socket_comm.h), which code written against them may rely on. */
#if !defined(_WIN32)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h> /* struct timeval */
#else
#include <winsock2.h> /* SOCKET, struct timeval */
#include <ws2tcpip.h>
#include <windows.h>  /* HANDLE */
#endif
#if !defined(__cplusplus)
#include <stdbool.h>
#endif

/* The classic headers included the driver's own port/socket_comm.h (from
 * async_runtime.h) and port/sync.h (from async_worker.h). Define
 * ASYNC_CLASSIC_PORT_HEADERS (in the driver's build, e.g. CMake's
 * target_compile_definitions) to include them the same way, for code that
 * relies on what they declare; socket_fd_t then comes from there. */
#if defined(ASYNC_CLASSIC_PORT_HEADERS)
#include "port/socket_comm.h"
#include "port/sync.h"
#if !defined(ASYNC_CLASSIC_HAVE_SOCKET_FD_T)
#define ASYNC_CLASSIC_HAVE_SOCKET_FD_T
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors (libasync's; the classic API had none) ------------------------ */

/* The codes of async.h (same names and values). */
typedef enum {
    ASYNC_OK = 0,
    ASYNC_E_INVAL = 1,
    ASYNC_E_BADHANDLE = 2,
    ASYNC_E_NOMEM = 3,
    ASYNC_E_TOOBIG = 4,
    ASYNC_E_BUFSIZE = 5,
    ASYNC_E_EMPTY = 6,
    ASYNC_E_FULL = 7,
    ASYNC_E_TIMEDOUT = 8,
    ASYNC_E_CLOSED = 9,
    ASYNC_E_BUSY = 10,
    ASYNC_E_EXISTS = 11,
    ASYNC_E_NOTFOUND = 12,
    ASYNC_E_BADFD = 13,
    ASYNC_E_SYS = 14,
    ASYNC_E_INTERNAL = 15,
    ASYNC_E_CANCELLED = 16,
    ASYNC_E_NOTSUP = 17,
    ASYNC_E_FORKED = 18,
    ASYNC_E_STATE = 19
} async_err_t;

/* As in async.h: the description of an error code, the calling thread's
 * last error, and its reset. */
const char *async_strerror(int code);
int async_last_error(void);
void async_clear_error(void);

/* ---- async_queue ----------------------------------------------------------- */

typedef struct async_queue_s async_queue_t;

typedef enum {
    ASYNC_QUEUE_DROP_OLDEST = 0x01,
    ASYNC_QUEUE_BLOCK_WRITER = 0x02,
    ASYNC_QUEUE_SIGNAL_ON_DATA = 0x04
} async_queue_flags_t;

typedef struct {
    size_t capacity;
    size_t current_size;
    size_t max_msg_size;
    uint64_t enqueue_count;
    uint64_t dequeue_count;
    uint64_t dropped_count;
} async_queue_stats_t;

/* The queue functions of async.h, declared as the classic async_queue.h
 * declares them (same names, signatures and meaning: async.h documents
 * each one). */
async_queue_t *async_queue_create(size_t capacity, size_t max_msg_size, async_queue_flags_t flags);
void async_queue_destroy(async_queue_t *queue);
bool async_queue_enqueue(async_queue_t *queue, const void *data, size_t size);
bool async_queue_dequeue(async_queue_t *queue, void *buffer, size_t buffer_size, size_t *out_size);
bool async_queue_is_empty(const async_queue_t *queue);
bool async_queue_is_full(const async_queue_t *queue);
void async_queue_clear(async_queue_t *queue);
void async_queue_get_stats(const async_queue_t *queue, async_queue_stats_t *stats);

/* ---- async_worker ---------------------------------------------------------- */

typedef struct async_worker_s async_worker_t;
typedef void *(*async_worker_proc_t)(void *context);

typedef enum {
    ASYNC_WORKER_STOPPED = 0,
    ASYNC_WORKER_RUNNING = 1,
    ASYNC_WORKER_STOPPING = 2
} async_worker_state_t;

/* The worker functions of async.h, declared as the classic async_worker.h
 * declares them (same names, signatures and meaning: async.h documents
 * each one; async_worker_destroy of a running worker asks it to stop and
 * detaches it). */
async_worker_t *async_worker_create(async_worker_proc_t proc, void *context, size_t stack_size);
void async_worker_destroy(async_worker_t *worker);
void async_worker_signal_stop(async_worker_t *worker);
bool async_worker_join(async_worker_t *worker, int timeout_ms);
async_worker_t *async_worker_current(void);
bool async_worker_should_stop(async_worker_t *worker);
async_worker_state_t async_worker_get_state(const async_worker_t *worker);
#if !defined(_WIN32)
/* As in async.h: the worker's thread while its proc runs. */
pthread_t async_worker_get_native_handle(async_worker_t *worker);
#endif
/* Every platform, as in the classic API. The classic return type is the
 * driver's platform_event_t (port/sync.h: typedef struct platform_event_s
 * platform_event_t). libasync's worker has no such event: returns NULL with
 * ASYNC_E_NOTSUP, on every platform (docs/CLASSIC_API.md; a modern file uses
 * async_worker_stop_fd). */
struct platform_event_s *async_classic_worker_get_stop_event(async_worker_t *worker);
#define async_worker_get_stop_event async_classic_worker_get_stop_event

/* ---- async_runtime --------------------------------------------------------- */

/* socket_fd_t is the driver's type (its port/socket_comm.h declares the same
 * typedef; C11 and C++ accept the repetition). Define
 * ASYNC_CLASSIC_HAVE_SOCKET_FD_T to leave it out. */
#if !defined(ASYNC_CLASSIC_HAVE_SOCKET_FD_T)
#if defined(_WIN32)
typedef SOCKET socket_fd_t;
#else
typedef int socket_fd_t;
#endif
#endif

#define EVENT_READ 0x01  /* readable (a listening socket: a connection waits); completions */
#define EVENT_WRITE 0x02 /* writable */
#define EVENT_ERROR 0x04 /* error condition on the descriptor */
#define EVENT_CLOSE 0x08 /* hang-up */

/* One event of async_runtime_wait:
 *  - descriptor readiness: fd (the real descriptor), context (as registered),
 *    event_type EVENT_* bits; completion_key 0, bytes_transferred 0, buffer
 *    NULL;
 *  - a completion (async_runtime_post_completion): fd -1 (INVALID_SOCKET on
 *    Windows), completion_key as posted, event_type EVENT_READ,
 *    bytes_transferred = the data posted, context and buffer NULL;
 *  - Windows: the end of a post_read / post_write (see there). */
typedef struct {
#if defined(_WIN32)
    SOCKET fd;
    HANDLE handle; /* always NULL */
#else
    int fd;
#endif
    uintptr_t completion_key;
    uint32_t event_type;
    void *context;
    size_t bytes_transferred;
    void *buffer;
} io_event_t;

typedef enum {
    CONSOLE_TYPE_NONE = 0,
    CONSOLE_TYPE_REAL, /* a terminal (a console on Windows) */
    CONSOLE_TYPE_PIPE, /* a pipe (FIFO) */
    CONSOLE_TYPE_FILE  /* a regular file */
} console_type_t;

typedef struct async_runtime_s async_runtime_t;

/* The modern functions, with the classic meaning. */
async_runtime_t *async_runtime_init(void);
int async_runtime_wakeup(async_runtime_t *runtime);
int async_runtime_post_completion(async_runtime_t *runtime, uintptr_t completion_key, uintptr_t data);

/* The classic runtime functions (docs/CLASSIC_API.md: what each does).
 * async_runtime_wait's timeout: NULL blocks; otherwise its value
 * tv_sec + tv_usec / 1000000, whatever the fields hold (without overflow):
 * <= 0 polls, a partial millisecond rounds up, INT_MAX ms (24.8 days) or
 * more waits INT_MAX ms. In a forked child every classic function fails with
 * ASYNC_E_FORKED (NONE / NULL for the console getters). */
void async_classic_runtime_deinit(async_runtime_t *runtime);
int async_classic_runtime_add(async_runtime_t *runtime, socket_fd_t fd, uint32_t events, void *context);
int async_classic_runtime_modify(async_runtime_t *runtime, socket_fd_t fd, uint32_t events, void *context);
int async_classic_runtime_remove(async_runtime_t *runtime, socket_fd_t fd);
int async_classic_runtime_wait(async_runtime_t *runtime, io_event_t *events, int max_events,
                               struct timeval *timeout);
int async_classic_runtime_add_console(async_runtime_t *runtime, void *context);
console_type_t async_classic_runtime_get_console_type(async_runtime_t *runtime);
void *async_classic_runtime_get_console_ctx(async_runtime_t *runtime);

#define async_runtime_deinit async_classic_runtime_deinit
#define async_runtime_add async_classic_runtime_add
#define async_runtime_modify async_classic_runtime_modify
#define async_runtime_remove async_classic_runtime_remove
#define async_runtime_wait async_classic_runtime_wait
#define async_runtime_add_console async_classic_runtime_add_console
#define async_runtime_get_console_type async_classic_runtime_get_console_type
#define async_runtime_get_console_ctx async_classic_runtime_get_console_ctx

#if !defined(_WIN32)
/* POSIX only, as in the classic API: the runtime's wake-up descriptor (the
 * eventfd, or the pipe's read end). Do not read, write or close it. */
int async_classic_runtime_get_event_loop_handle(async_runtime_t *runtime);
#define async_runtime_get_event_loop_handle async_classic_runtime_get_event_loop_handle
#endif

/* Every platform, as in the classic API: start a read / write of len bytes
 * on the socket fd into / from buffer.
 * POSIX (readiness-based, as the classic epoll and poll backends): nothing
 * to start; both succeed and do nothing (the driver reads and writes when
 * the socket's readiness event comes). 0, or -1 with ASYNC_E_BADHANDLE
 * (runtime not live) or ASYNC_E_FORKED; the other arguments are not looked
 * at.
 * Windows (completion-based): start an overlapped WSARecv / WSASend into /
 * from buffer, which must stay valid until the operation's event: one
 * io_event_t with fd, the context of fd's registration (NULL if none),
 * event_type EVENT_READ or EVENT_WRITE (plus EVENT_ERROR if it failed),
 * bytes_transferred (0 for a read: end of stream) and buffer. The
 * operation's end is posted to the runtime as a completion, so its event
 * comes from async_runtime_wait like any other. 0, or -1 with ASYNC_E_INVAL
 * (buffer NULL with len > 0, len above 2^31-1), ASYNC_E_BADHANDLE,
 * ASYNC_E_BADFD, ASYNC_E_NOMEM, ASYNC_E_SYS. */
int async_classic_runtime_post_read(async_runtime_t *runtime, socket_fd_t fd, void *buffer, size_t len);
int async_classic_runtime_post_write(async_runtime_t *runtime, socket_fd_t fd, void *buffer, size_t len);
#define async_runtime_post_read async_classic_runtime_post_read
#define async_runtime_post_write async_classic_runtime_post_write

#if defined(_WIN32)
/* Windows only, as in the classic API. NOT IMPLEMENTED: NULL with
 * ASYNC_E_NOTSUP (docs/CLASSIC_API.md). */
HANDLE async_classic_runtime_get_console_event(async_runtime_t *runtime);
#define async_runtime_get_console_event async_classic_runtime_get_console_event
#endif

#ifdef __cplusplus
}
#endif

#endif /* ASYNC_CLASSIC_H */
