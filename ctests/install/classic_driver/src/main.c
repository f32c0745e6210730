/* The miniature driver: a console on stdin (two lines, then its end), a
 * user's socket read on its readiness, and a notification posted by
 * lib/socket. Prints "minidriver: ok" and exits 0 when all came. */
#include <stdio.h>
#include <unistd.h>
#include "backend.h"
#include "comm.h"
#include "misc/misc.h"
#include "socket/socket_efuns.h"

int main(void) {
    socket_fd_t fds[2];
    platform_event_t *stop_event;
    int rc;
    g_runtime = async_runtime_init();
    if (!g_runtime || create_test_socket_pair(fds) != 0 || set_socket_nonblocking(fds[0], 1) != 0) return 1;
    if (!platform_mutex_init(&socket_lock) || misc_console_capacity() != CONSOLE_MAX_LINE) return 1;
    /* no platform event in a libasync worker */
    stop_event = async_worker_get_stop_event(async_worker_current());
    if (stop_event != NULL) return 1;
    g_console_worker = console_worker_init(g_runtime, CONSOLE_COMPLETION_KEY);
    if (!g_console_worker) return 1;
    if (async_runtime_add(g_runtime, fds[0], EVENT_READ, NULL) != 0 || comm_start_read(fds[0]) != 0) return 1;
    if (write(fds[1], "look", 4) != 4 || socket_notify(g_runtime, 0x50C, fds[0]) != 0) return 1;
    rc = backend(fds[0], 0x50C);
    console_worker_shutdown(g_console_worker);
    async_runtime_remove(g_runtime, fds[0]);
    SOCKET_CLOSE(fds[0]);
    SOCKET_CLOSE(fds[1]);
    async_runtime_deinit(g_runtime);
    platform_mutex_destroy(&socket_lock);
    if (rc == 0) printf("minidriver: ok\n");
    return rc;
}
