#include <fcntl.h>
#include <unistd.h>
#include "port/socket_comm.h"

int create_test_socket_pair(socket_fd_t fds[2]) {
    return socketpair(AF_UNIX, SOCK_STREAM, 0, fds);
}

int set_socket_nonblocking(socket_fd_t fd, int which) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) return -1;
    return fcntl(fd, F_SETFL, which ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}
