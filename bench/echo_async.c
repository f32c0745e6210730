/*
 * TCP echo server, libasync: one fiber per connection doing blocking-style
 * async_fiber_read / async_fiber_write with a 4 KiB buffer on its stack, one
 * acceptor fiber (the server of docs/FIBERS.md). The descriptors are owned
 * by the scheduler (async_fiber_accept on a fiber returns owned ones; the
 * listening socket is made owned): registered once, no poller call per
 * park, closed with async_fiber_close.
 *
 * The I/O path is the library's choice: ASYNC_FIBER_IO=uring in the
 * environment asks for the io_uring one (the echo_*_uring rows). io_uring
 * serves plain descriptors only (owned ones keep the registered epoll path),
 * so under ASYNC_FIBER_IO=uring the listener is left plain and so are the
 * accepted fds. The library
 * does not say which path it took, so tcp_client reports it from outside
 * (server_io=, from the server's descriptors).
 *
 * usage: echo_async [workers=1]   (see echo.h)
 */
#include "echo.h"

#include "async.h"

static async_sched_t *sched;

static void conn(void *arg) {
    int fd = (int)(intptr_t)arg;
    char b[4096];
    ssize_t n;
    echo_nodelay(fd);
    while ((n = async_fiber_read(fd, b, sizeof b, -1)) > 0)
        if (async_fiber_write(fd, b, (size_t)n, -1) < 0) break;
    async_fiber_close(fd);
}

static void acceptor(void *arg) {
    int lfd = (int)(intptr_t)arg, fd;
    const char *io = getenv("ASYNC_FIBER_IO");
    if (!io || strcmp(io, "uring") != 0) async_fiber_fd_open(NULL, lfd);
    while ((fd = async_fiber_accept(lfd, NULL, NULL, -1)) >= 0)
        if (!async_fiber_spawn(sched, conn, (void *)(intptr_t)fd, 0)) async_fiber_close(fd);
    fprintf(stderr, "echo_async: accept: %s\n", async_strerror(async_last_error()));
}

int main(int argc, char **argv) {
    int lfd = echo_listen();
    async_sched_config_t cfg = {.workers = (int)arg_long(argc, argv, 1, 1)};
    sched = async_sched_create(&cfg);
    if (!sched || !async_fiber_spawn(sched, acceptor, (void *)(intptr_t)lfd, 0)) {
        fprintf(stderr, "echo_async: %s\n", async_strerror(async_last_error()));
        return 1;
    }
    return async_sched_run(sched);
}
