#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include "backend.h"
#include "comm.h"

#define MAX_EVENTS 512

async_runtime_t *g_runtime;
console_worker_context_t *g_console_worker;

static io_event_t events[MAX_EVENTS];

int backend(socket_fd_t user_fd, uintptr_t notify_key) {
    int lines = 0, eof = 0, got_user = 0, got_notify = 0, rounds;
    char buf[CONSOLE_MAX_LINE];
    for (rounds = 0; rounds < 200 && !(eof && got_user && got_notify); rounds++) {
        struct timeval tv = {10, 0};
        int n = async_runtime_wait(g_runtime, events, MAX_EVENTS, &tv), i;
        if (n < 0) return 1;
        for (i = 0; i < n; i++) {
            io_event_t *e = &events[i];
            if (e->completion_key == CONSOLE_COMPLETION_KEY) {
                size_t got;
                while (async_queue_dequeue(g_console_worker->line_queue, buf, sizeof buf - 1, &got)) {
                    buf[got] = 0;
                    printf("console: %s\n", buf);
                    lines++;
                }
                eof = console_worker_eof(g_console_worker);
            } else if (e->completion_key == notify_key) {
                got_notify = e->fd == INVALID_SOCKET_FD && e->bytes_transferred == (size_t)user_fd;
            } else if (e->fd == user_fd && (e->event_type & EVENT_READ)) {
                int r = comm_read(user_fd, buf, sizeof buf - 1);
                if (r <= 0) return 1;
                buf[r] = 0;
                printf("user: %s\n", buf);
                got_user = 1;
                if (comm_start_read(user_fd) != 0) return 1;
            }
        }
    }
    printf("lines %d eof %d user %d notify %d\n", lines, eof, got_user, got_notify);
    return eof && got_user && got_notify && lines == 2 ? 0 : 1;
}
