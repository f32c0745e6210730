/* Compile-only check: the classic headers (include/async/) are
 * self-contained, valid C99 and C++11 and warning-free under -Wall -Wextra
 * -pedantic -Werror (built as C by header_classic_c99 and as C++ by
 * header_classic_cxx11.cpp). Every declaration is used. */
#include "async/async_queue.h"
#include "async/async_runtime.h"
#include "async/async_worker.h"
#include "async/async_queue.h" /* include guards */
#include "async/async_runtime.h"

#define USE(f) (void)(f)

#ifdef __cplusplus
extern "C" int header_classic_probe(void);
#else
int header_classic_probe(void);
#endif

/* The classic event is 48 bytes on LP64 POSIX (a compile-time check). */
#if !defined(_WIN32) && UINTPTR_MAX == 0xffffffffffffffffu
typedef char header_classic_event_is_48[sizeof(io_event_t) == 48 ? 1 : -1];
#endif

int header_classic_probe(void)
{
    async_queue_stats_t st;
    io_event_t ev;
    socket_fd_t fd = 0;
    struct timeval tv;
    async_err_t e = ASYNC_E_STATE;
    async_queue_flags_t qf = ASYNC_QUEUE_SIGNAL_ON_DATA;
    async_worker_state_t ws = ASYNC_WORKER_STOPPING;
    console_type_t ct = CONSOLE_TYPE_FILE;
    async_worker_proc_t proc = 0;
    bool b = true;
    int (*waitf)(async_runtime_t *, io_event_t *, int, struct timeval *) = async_runtime_wait;
    int (*modf)(async_runtime_t *, socket_fd_t, uint32_t, void *) = async_runtime_modify;
    st.capacity = 0;
    tv.tv_sec = 10;
    tv.tv_usec = 0;
    ev.fd = fd;
    ev.completion_key = (uintptr_t)0;
    ev.event_type = EVENT_READ | EVENT_WRITE | EVENT_ERROR | EVENT_CLOSE;
    ev.context = NULL;
    ev.bytes_transferred = 0;
    ev.buffer = NULL;
    USE(async_strerror);
    USE(async_last_error);
    USE(async_clear_error);
    USE(async_queue_create);
    USE(async_queue_destroy);
    USE(async_queue_enqueue);
    USE(async_queue_dequeue);
    USE(async_queue_is_empty);
    USE(async_queue_is_full);
    USE(async_queue_clear);
    USE(async_queue_get_stats);
    USE(async_worker_create);
    USE(async_worker_destroy);
    USE(async_worker_signal_stop);
    USE(async_worker_join);
    USE(async_worker_current);
    USE(async_worker_should_stop);
    USE(async_worker_get_state);
#if !defined(_WIN32)
    USE(async_worker_get_native_handle);
    USE(async_runtime_get_event_loop_handle);
#else
    USE(async_runtime_get_console_event);
#endif
    USE(async_worker_get_stop_event);
    USE(async_runtime_post_read);
    USE(async_runtime_post_write);
    USE(async_runtime_init);
    USE(async_runtime_deinit);
    USE(async_runtime_add);
    USE(async_runtime_remove);
    USE(async_runtime_wakeup);
    USE(async_runtime_post_completion);
    USE(async_runtime_add_console);
    USE(async_runtime_get_console_type);
    USE(async_runtime_get_console_ctx);
    USE(waitf);
    USE(modf);
    USE(st);
    USE(ev);
    USE(tv);
    USE(proc);
    USE(b);
#if defined(ASYNC_CLASSIC_PORT_HEADERS)
    USE(platform_event_wait); /* from the driver's port/sync.h, through async_worker.h */
#endif
    return (int)e + (int)qf + (int)ws + (int)ct;
}
