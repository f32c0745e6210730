/* Compile-only check: async.h is self-contained, valid C99 and warning-free
 * under -std=c99 -Wall -Wextra -pedantic -Werror. Every declaration is used
 * so that a type error anywhere in the header breaks this file. */
#include "async.h"
#include "async.h" /* include guard */

#define USE(f) (void)(f)

int header_c99_probe(void);

int header_c99_probe(void)
{
    async_queue_stats_t st;
    io_event_t ev;
    async_fd_t fd = 0;
    async_err_t e = ASYNC_E_STATE;
    async_queue_flags_t qf = ASYNC_QUEUE_SIGNAL_ON_DATA;
    async_worker_state_t ws = ASYNC_WORKER_STOPPING;
    async_worker_proc_t proc = 0;
    bool b = true;
    st.capacity = 0;
    st.enqueue_count = 0;
    ev.fd = fd;
    ev.event_type = ASYNC_EVENT_READ | ASYNC_EVENT_WRITE | ASYNC_EVENT_ERROR | ASYNC_EVENT_CLOSE |
                    ASYNC_EVENT_COMPLETION | ASYNC_EVENT_TIMER | ASYNC_EVENT_SIGNAL;
    ev.completion_key = (uintptr_t)0;
    ev.data = (uintptr_t)0;
    ev.context = NULL;
    USE(async_version);
    USE(async_version_string);
    USE(async_strerror);
    USE(async_last_error);
    USE(async_last_os_error);
    USE(async_clear_error);
    USE(async_queue_create);
    USE(async_queue_destroy);
    USE(async_queue_enqueue);
    USE(async_queue_enqueue_wait);
    USE(async_queue_dequeue);
    USE(async_queue_dequeue_wait);
    USE(async_queue_is_empty);
    USE(async_queue_is_full);
    USE(async_queue_clear);
    USE(async_queue_get_stats);
    USE(async_queue_attach);
    USE(async_worker_create);
    USE(async_worker_destroy);
    USE(async_worker_signal_stop);
    USE(async_worker_join);
    USE(async_worker_current);
    USE(async_worker_should_stop);
    USE(async_worker_get_state);
    USE(async_worker_result);
    USE(async_worker_stop_fd);
    USE(async_worker_get_native_handle);
    USE(async_runtime_init);
    USE(async_runtime_deinit);
    USE(async_runtime_add);
    USE(async_runtime_modify);
    USE(async_runtime_remove);
    USE(async_runtime_wait);
    USE(async_runtime_post_completion);
    USE(async_runtime_wakeup);
    USE(async_runtime_add_timer);
    USE(async_runtime_cancel_timer);
    USE(async_runtime_add_signal);
    USE(async_runtime_remove_signal);
    USE(proc);
    USE(st);
    USE(ev);
    return (int)e + (int)qf + (int)ws + (int)b + ASYNC_OK + ASYNC_VERSION_MAJOR + ASYNC_VERSION_MINOR +
           ASYNC_VERSION_PATCH + ASYNC_VERSION_NUMBER + ASYNC_VERSION_AT_LEAST(0, 1, 0) + ASYNC_WORKER_RUNNING +
           ASYNC_QUEUE_DROP_OLDEST + ASYNC_QUEUE_BLOCK_WRITER;
}
