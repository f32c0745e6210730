#pragma once
#include "async/async_runtime.h"
#include "async/async_queue.h"
#include "async/console_worker.h"

extern async_runtime_t *g_runtime;
extern console_worker_context_t *g_console_worker;
/* Runs the main loop until the console's end, the socket's line and the
 * notification have all come; 0 then, 1 on a failure. */
int backend(socket_fd_t user_fd, uintptr_t notify_key);
