/* A stand-in for a driver's port/socket_comm.h, for the header check with
 * ASYNC_CLASSIC_PORT_HEADERS (ctests/CMakeLists.txt): declares socket_fd_t. */
#ifndef TEST_PORT_SOCKET_COMM_H
#define TEST_PORT_SOCKET_COMM_H
#ifdef _WIN32
#include <winsock2.h>
typedef SOCKET socket_fd_t;
#else
#include <sys/socket.h>
typedef int socket_fd_t;
#endif
#endif
