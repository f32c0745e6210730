//go:build !windows

/* The socket server helpers (include/async.h "Server helpers") on POSIX:
 * async_fiber_listen and async_fiber_udp_bind (a bound socket, owned by the
 * calling fiber's scheduler), async_fiber_recvfrom and async_fiber_sendto
 * (the retry-and-park loop of io_api.c's calls; on a scheduler with rings a
 * plain socket's datagram goes through io_uring.c's la_uring_msg, with its
 * msghdr on the fiber's stack). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fiber_int.h"

/* ---- bound sockets ---------------------------------------------------------- */

#define LA_LISTEN_FLAGS (ASYNC_LISTEN_REUSEPORT | ASYNC_LISTEN_V6ONLY)

/* The options of a new socket of family fam before its bind: 0 or -errno. */
LA_NOINLINE static int sys_sockopts(int fd, int fam, int type, unsigned flags) {
    int one = 1;
    /* SO_REUSEADDR: a listener restarts while its old connections sit in
     * TIME_WAIT. Not for UDP, where it would let two sockets share the
     * port silently (REUSEPORT says so when it is wanted). */
    if (type == SOCK_STREAM && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) return -errno;
    if (flags & ASYNC_LISTEN_REUSEPORT) {
#if defined(SO_REUSEPORT)
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) return -errno;
#else
        return -ENOPROTOOPT;
#endif
    }
    if (fam == AF_INET6) {
        int v6only = (flags & ASYNC_LISTEN_V6ONLY) ? 1 : 0; /* set either way: the default differs by system */
        if (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only) != 0) return -errno;
    }
    return 0;
}

/* A non-blocking, close-on-exec socket of type bound to a (and listening,
 * for SOCK_STREAM): the fd or -errno (nothing is left open then). */
LA_NOINLINE static int sys_bound(int fam, int type, const struct sockaddr *a, socklen_t len, unsigned flags,
                                 int backlog) {
#if defined(SOCK_NONBLOCK) && defined(SOCK_CLOEXEC)
    int fd = socket(fam, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
#else
    int fd = socket(fam, type, 0);
    if (fd < 0) return -errno;
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
#endif
    int e = sys_sockopts(fd, fam, type, flags);
    if (!e && bind(fd, a, len) != 0) e = -errno;
    if (!e && type == SOCK_STREAM && listen(fd, backlog) != 0) e = -errno;
    if (e) {
        int cs = LA_CANCEL_KEPT;
        la_nocancel_enter(&cs);
        close(fd);
        la_nocancel_leave(&cs);
        return e;
    }
    return fd;
}

static int bound_err(int e) {
    switch (e) {
    case EADDRINUSE: return ASYNC_E_EXISTS;
    case EMFILE:
    case ENFILE: return ASYNC_E_NOMEM;
    case EAFNOSUPPORT:
    case EPROTONOSUPPORT:
    case ENOPROTOOPT: return ASYNC_E_NOTSUP;
    case EACCES:
    case EPERM:
    case EADDRNOTAVAIL: la_note_os_error(e); return ASYNC_E_SYS;
    default: return la_io_map_errno(e);
    }
}

/* async_fiber_listen (SOCK_STREAM) and async_fiber_udp_bind (SOCK_DGRAM). */
static async_fd_t bound_socket(const struct sockaddr *addr, socklen_t len, int type, int backlog, unsigned flags) {
    if (!addr || (flags & ~LA_LISTEN_FLAGS)) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    int fam = addr->sa_family;
    socklen_t need = fam == AF_INET ? (socklen_t)sizeof(struct sockaddr_in)
                     : fam == AF_INET6 ? (socklen_t)sizeof(struct sockaddr_in6)
                                       : 0;
    if (!need || len < need) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    int fd = sys_bound(fam, type, addr, need, flags, backlog <= 0 ? SOMAXCONN : backlog);
    if (fd < 0) {
        la_set_error(bound_err(-fd));
        return -1;
    }
    /* owned by the calling fiber's scheduler; if that fails (memory) it
     * stays a plain descriptor */
    la_fiber_t *f = la_current_fiber();
    if (f) (void)la_io_own_fd(f->s, fd, 1);
    return fd;
}

async_fd_t async_fiber_listen(const struct sockaddr *addr, socklen_t len, int backlog, unsigned flags) {
    LA_ENTRY(-1);
    return bound_socket(addr, len, SOCK_STREAM, backlog, flags);
}

async_fd_t async_fiber_udp_bind(const struct sockaddr *addr, socklen_t len, unsigned flags) {
    LA_ENTRY(-1);
    return bound_socket(addr, len, SOCK_DGRAM, 0, flags);
}

/* ---- datagrams ---------------------------------------------------------------- */

LA_NOINLINE static ssize_t sys_recvfrom(int fd, void *buf, size_t n, struct sockaddr *a, socklen_t *l) {
    ssize_t r = recvfrom(fd, buf, n, MSG_DONTWAIT, a, a ? l : NULL);
    return r >= 0 ? r : -errno;
}

LA_NOINLINE static ssize_t sys_sendto(int fd, const void *buf, size_t n, const struct sockaddr *a, socklen_t l) {
    ssize_t r = sendto(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL, a, a ? l : 0);
    return r >= 0 ? r : -errno;
}

/* The arguments both calls check: 0, or 1 with the error recorded. */
static int dgram_args(async_fd_t fd, const void *buf, size_t n, int timeout_ms) {
    if (la_check_timeout(timeout_ms)) return 1;
    if ((!buf && n > 0) || n > (size_t)SSIZE_MAX) {
        la_set_error(ASYNC_E_INVAL);
        return 1;
    }
    if (fd < 0) {
        la_set_error(ASYNC_E_BADFD);
        return 1;
    }
    return 0;
}

static int send_err(int e) {
    switch (e) {
    case EMSGSIZE: return ASYNC_E_TOOBIG;
    case EDESTADDRREQ: /* addr NULL on a socket that is not connected */
    case EAFNOSUPPORT:
    case EISCONN: return ASYNC_E_INVAL;
    default: return la_io_map_errno(e);
    }
}

ssize_t async_fiber_recvfrom(async_fd_t fd, void *buf, size_t n, struct sockaddr *addr, socklen_t *len,
                             int timeout_ms) {
    LA_ENTRY(-1);
    if (dgram_args(fd, buf, n, timeout_ms)) return -1;
    if (addr && !len) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
#if defined(LA_URING)
    if (la_uring_here(fd)) {
        struct iovec iov = {.iov_base = buf, .iov_len = n};
        struct msghdr m = {.msg_name = addr, .msg_namelen = addr ? *len : 0, .msg_iov = &iov, .msg_iovlen = 1};
        ssize_t ret;
        if (la_uring_msg(fd, &m, 0, timeout_ms, &ret)) { /* io_uring.c */
            if (ret >= 0 && addr) *len = m.msg_namelen;
            return ret;
        }
    }
#endif
    uint64_t deadline = la_deadline(timeout_ms);
    la_fiber_t *f = la_current_fiber();
    la_fdrec_t *rec = f ? la_fdrec(f->s, fd) : NULL;
    la_fdsnap_t sn = LA_FDSNAP_START;
    for (;;) {
        if (la_fd_snap_closed(rec, &sn)) return -1;
        ssize_t r = sys_recvfrom(fd, buf, n, addr, len);
        if (r >= 0) return r;
        if (r == -EINTR) continue;
        if (r != -EAGAIN && r != -EWOULDBLOCK) {
            la_set_error(la_io_map_errno((int)-r));
            return -1;
        }
        int rc = la_io_wait_dir(fd, 0, deadline, timeout_ms, &sn);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
}

ssize_t async_fiber_sendto(async_fd_t fd, const void *buf, size_t n, const struct sockaddr *addr, socklen_t len,
                           int timeout_ms) {
    LA_ENTRY(-1);
    if (dgram_args(fd, buf, n, timeout_ms)) return -1;
    size_t done = 0;
#if defined(LA_URING)
    if (la_uring_here(fd)) {
        struct iovec iov = {.iov_base = (void *)buf, .iov_len = n};
        struct msghdr m = {
            .msg_name = (void *)addr, .msg_namelen = addr ? len : 0, .msg_iov = &iov, .msg_iovlen = 1};
        ssize_t ret;
        if (la_uring_msg(fd, &m, 1, timeout_ms, &ret)) { /* io_uring.c */
            if (ret < 0 || (size_t)ret >= n) return ret < 0 ? -1 : (ssize_t)n;
            done = (size_t)ret; /* part of a stream: the rest below */
        }
    }
#endif
    uint64_t deadline = la_deadline(timeout_ms);
    la_fiber_t *f = la_current_fiber();
    la_fdrec_t *rec = f ? la_fdrec(f->s, fd) : NULL;
    la_fdsnap_t sn = LA_FDSNAP_START;
    for (;;) {
        if (la_fd_snap_closed(rec, &sn)) return -1;
        ssize_t r = sys_sendto(fd, (const char *)buf + done, n - done, addr, len);
        if (r >= 0) {
            done += (size_t)r;
            if (done >= n) return (ssize_t)n; /* also an empty datagram, sent once */
            continue;
        }
        if (r == -EINTR) continue;
        if (r != -EAGAIN && r != -EWOULDBLOCK) {
            la_set_error(send_err((int)-r));
            return -1;
        }
        int rc = la_io_wait_dir(fd, 1, deadline, timeout_ms, &sn);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
}
