#pragma once
#include "async/async_runtime.h"
/* Starts reading from a user's socket (a no-op where readiness is not
 * completion-based); 0 or -1. */
int comm_start_read(socket_fd_t fd);
/* Reads what the user sent; the byte count, 0 at its end, -1. */
int comm_read(socket_fd_t fd, char *buf, size_t len);
