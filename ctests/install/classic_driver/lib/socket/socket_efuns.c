#include "socket/socket_efuns.h"
#include "async/async_worker.h"

platform_mutex_t socket_lock;

int socket_notify(async_runtime_t *rt, uintptr_t key, socket_fd_t fd) {
    int rc;
    platform_mutex_lock(&socket_lock);
    rc = async_runtime_post_completion(rt, key, (uintptr_t)fd);
    platform_mutex_unlock(&socket_lock);
    return rc;
}
