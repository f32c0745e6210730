#include <stdio.h>
#include <unistd.h>
#include "backend.h"
#include "comm.h"

int comm_start_read(socket_fd_t fd) {
    if (async_runtime_post_read(g_runtime, fd, NULL, 0) != 0) {
        fprintf(stderr, "comm: post_read failed: %s\n", async_strerror(async_last_error()));
        return -1;
    }
    return 0;
}

int comm_read(socket_fd_t fd, char *buf, size_t len) {
    return (int)read(fd, buf, len);
}
