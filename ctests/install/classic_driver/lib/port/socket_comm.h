/* The driver's port/socket_comm.h (POSIX part). Relies on its includer for
 * nothing; the classic async_runtime.h included it. */
#pragma once
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
typedef int socket_fd_t;
#define INVALID_SOCKET_FD -1
#define SOCKET_CLOSE(s) close(s)
int create_test_socket_pair(socket_fd_t fds[2]);
int set_socket_nonblocking(socket_fd_t fd, int which);
