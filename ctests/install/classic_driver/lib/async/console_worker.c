#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "console_worker.h"
#include "console_mode.h"
#include "logger/logger.h"

static void *console_worker_proc(void *arg) {
    console_worker_context_t *ctx = arg;
    char line[CONSOLE_MAX_LINE];
    size_t len = 0;
    while (!async_worker_should_stop(async_worker_current())) {
        struct pollfd p = {STDIN_FILENO, POLLIN, 0};
        char c;
        ssize_t n;
        if (poll(&p, 1, 50) <= 0) continue;
        n = read(STDIN_FILENO, &c, 1);
        if (n <= 0 || c == '\n') {
            if (len > 0 && async_queue_enqueue(ctx->line_queue, line, len))
                async_runtime_post_completion(ctx->runtime, ctx->completion_key, len);
            len = 0;
        } else if (len < sizeof line) {
            line[len++] = c;
        }
        if (n <= 0) {
            platform_mutex_lock(&ctx->state_mutex);
            ctx->eof_detected = true;
            platform_mutex_unlock(&ctx->state_mutex);
            async_runtime_post_completion(ctx->runtime, ctx->completion_key, 0);
            break;
        }
    }
    return NULL;
}

console_worker_context_t *console_worker_init(async_runtime_t *runtime, uintptr_t completion_key) {
    console_worker_context_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx || !platform_mutex_init(&ctx->state_mutex)) return NULL;
    ctx->runtime = runtime;
    ctx->completion_key = completion_key;
    ctx->console_type = console_is_terminal() ? CONSOLE_TYPE_REAL : CONSOLE_TYPE_PIPE;
    ctx->line_queue = async_queue_create(64, CONSOLE_MAX_LINE, ASYNC_QUEUE_BLOCK_WRITER);
    if (!ctx->line_queue) return NULL;
    ctx->worker = async_worker_create(console_worker_proc, ctx, 0);
    if (!ctx->worker) debug_message("console worker: not started\n");
    return ctx->worker ? ctx : NULL;
}

bool console_worker_eof(console_worker_context_t *ctx) {
    bool eof;
    platform_mutex_lock(&ctx->state_mutex);
    eof = ctx->eof_detected;
    platform_mutex_unlock(&ctx->state_mutex);
    return eof;
}

void console_worker_shutdown(console_worker_context_t *ctx) {
    async_worker_signal_stop(ctx->worker);
    async_worker_join(ctx->worker, 5000);
    async_worker_destroy(ctx->worker);
    async_queue_destroy(ctx->line_queue);
    platform_mutex_destroy(&ctx->state_mutex);
    free(ctx);
}
