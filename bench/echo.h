/*
 * Shared by the TCP echo servers in bench/ (echo_async.c, echo_epoll.c, echo_uring.c,
 * echo_uv.c; go/echo does the same in Go): a server listens on 127.0.0.1 on a
 * port the kernel picks, prints "port=N" on stdout and echoes every byte it
 * reads until it is killed (tcp_client sends SIGTERM when it is done).
 */
#ifndef ECHO_H
#define ECHO_H

#include "bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* A listening socket on 127.0.0.1:0 (backlog 4096); prints its port. */
static inline int echo_listen(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 4096) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("echo server: listen");
        exit(1);
    }
    printf("port=%d\n", ntohs(a.sin_port));
    fflush(stdout);
    return fd;
}

/* How many descriptors a server's per-fd table covers: the (raised)
 * RLIMIT_NOFILE, at most a million. */
static inline int echo_max_fds(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
    return rl.rlim_cur > 1000000 ? 1000000 : (int)rl.rlim_cur;
}

static inline void echo_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

#endif
