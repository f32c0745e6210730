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
    socklen_t need = la_bind_addr_len(addr, len, flags); /* net.c */
    if (!need) return -1;
    int fd = sys_bound(addr->sa_family, type, addr, need, flags, backlog <= 0 ? SOMAXCONN : backlog);
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

/* 1 if fd is a stream socket. */
LA_NOINLINE static int sys_is_stream(int fd) {
    int type = 0;
    socklen_t l = sizeof type;
    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) == 0 && type == SOCK_STREAM;
}

/* The arguments both calls check: 0, or 1 with the error recorded. */
static int dgram_args(async_fd_t fd, const void *buf, size_t n, int timeout_ms) {
    if (la_buf_bad_args(buf, n, timeout_ms)) return 1;
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

/* One datagram call: fd, the bytes, and the address (recvfrom: addr/len
 * filled in; sendto: addr/slen sent to). A send goes on from done (a stream
 * socket may take part of it). */
typedef struct {
    int fd;
    char *buf;
    size_t n, done;
    struct sockaddr *addr;
    socklen_t *len;
    socklen_t slen;
} dgram_t;

#if defined(LA_URING)
/* The call through io_uring (la_uring_msg), its msghdr here on the fiber's
 * stack: 1 if it was handled (*ret), 0 for the poller path (from d->done). */
static int dgram_uring(dgram_t *d, int send, int timeout_ms, ssize_t *ret) {
    struct iovec iov = {.iov_base = d->buf, .iov_len = d->n};
    struct msghdr m = {.msg_name = d->addr, .msg_iov = &iov, .msg_iovlen = 1};
    m.msg_namelen = !d->addr ? 0 : send ? d->slen : *d->len;
    if (!la_uring_msg(d->fd, &m, send, timeout_ms, ret)) return 0; /* io_uring.c */
    if (*ret < 0) return 1;
    if (!send) {
        if (d->addr) *d->len = m.msg_namelen;
        return 1;
    }
    d->done = (size_t)*ret;
    *ret = (ssize_t)d->n;
    return d->done >= d->n; /* else the rest of a stream below */
}
#endif

/* The poller path of a receive (send 0) or send: tried, and retried after
 * EINTR or a wait for readiness. The result, or -1 with the error set. */
static ssize_t dgram_loop(dgram_t *d, int send, int timeout_ms) {
    uint64_t deadline = LA_DL_UNSET; /* la_io_next_deadline */
    la_fiber_t *f = la_current_fiber();
    la_fdrec_t *rec = f ? la_fdrec(f->s, d->fd) : NULL;
    la_fdsnap_t sn = LA_FDSNAP_START;
    for (;;) {
        if (la_fd_snap_closed(rec, &sn)) return -1;
        ssize_t r = send ? sys_sendto(d->fd, d->buf + d->done, d->n - d->done, d->addr, d->slen)
                         : sys_recvfrom(d->fd, d->buf, d->n, d->addr, d->len);
        if (r >= 0 && !send) return r;
        if (r >= 0) {
            d->done += (size_t)r;
            if (d->done >= d->n) return (ssize_t)d->n; /* also an empty datagram, sent once */
            continue;
        }
        if (r == -EINTR) continue;
        if (r != -EAGAIN && r != -EWOULDBLOCK) {
            la_set_error(send ? send_err((int)-r) : la_io_map_errno((int)-r));
            return -1;
        }
        int rc = la_io_wait_dir(d->fd, send, &deadline, timeout_ms, &sn);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
}

/* recvfrom (send 0) and sendto after their argument checks. */
static ssize_t dgram_call(dgram_t *d, int send, int timeout_ms) {
#if defined(LA_URING)
    ssize_t ret;
    if (la_uring_here(d->fd) && dgram_uring(d, send, timeout_ms, &ret)) return ret;
#endif
    return dgram_loop(d, send, timeout_ms);
}

ssize_t async_fiber_recvfrom(async_fd_t fd, void *buf, size_t n, struct sockaddr *addr, socklen_t *len,
                             int timeout_ms) {
    LA_ENTRY(-1);
    if (dgram_args(fd, buf, n, timeout_ms)) return -1;
    if (addr && !len) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    /* n 0 on a stream socket reads as async_fiber_read: 0 at once (a
     * stream's receive of 0 bytes waits for data it does not take) */
    if (n == 0 && sys_is_stream(fd)) {
        if (addr) *len = 0;
        return 0;
    }
    dgram_t d = {.fd = fd, .buf = buf, .n = n, .addr = addr, .len = len};
    return dgram_call(&d, 0, timeout_ms);
}

ssize_t async_fiber_sendto(async_fd_t fd, const void *buf, size_t n, const struct sockaddr *addr, socklen_t len,
                           int timeout_ms) {
    LA_ENTRY(-1);
    if (dgram_args(fd, buf, n, timeout_ms)) return -1;
    dgram_t d = {.fd = fd, .buf = (char *)buf, .n = n, .addr = (struct sockaddr *)addr, .slen = len};
    return dgram_call(&d, 1, timeout_ms);
}
