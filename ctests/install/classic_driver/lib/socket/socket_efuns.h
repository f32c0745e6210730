#pragma once
#include "async/async_runtime.h"
/* Posts (key, fd) to the runtime; socket_fd_t and platform_mutex_t come
 * through the classic headers, as they did from the driver's port headers. */
int socket_notify(async_runtime_t *rt, uintptr_t key, socket_fd_t fd);
extern platform_mutex_t socket_lock;
