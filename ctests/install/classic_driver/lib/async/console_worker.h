/* The driver's console worker: a worker reads stdin lines into a queue and
 * posts a completion per line to the runtime. It uses the port headers'
 * types (platform_mutex_t), which came through the classic headers. */
#ifndef CONSOLE_WORKER_H
#define CONSOLE_WORKER_H
#include "async/async_queue.h"
#include "async/async_runtime.h"
#include "async/async_worker.h"

typedef struct console_worker_context_s {
    async_queue_t *line_queue;
    async_runtime_t *runtime;
    async_worker_t *worker;
    console_type_t console_type;
    uintptr_t completion_key;
    platform_mutex_t state_mutex;
    bool eof_detected;
} console_worker_context_t;

#define CONSOLE_COMPLETION_KEY 0xC0701E
#define CONSOLE_MAX_LINE 4096

console_worker_context_t *console_worker_init(async_runtime_t *runtime, uintptr_t completion_key);
bool console_worker_eof(console_worker_context_t *ctx);
void console_worker_shutdown(console_worker_context_t *ctx);
#endif
