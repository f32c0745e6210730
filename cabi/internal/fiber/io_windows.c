//go:build windows

/* Fiber socket I/O on Windows: async_fiber_wait_fd, read, write, accept and
 * connect on SOCKETs (winsock has no readiness for pipes or files), and the
 * server helpers listen, udp_bind, recvfrom and sendto (plain sockets: no
 * owned descriptors here).
 *
 * Like io.c, a call tries first (a non-blocking recv/send/accept/connect, or
 * WSAPoll with timeout 0 for wait_fd) and parks only when that would block.
 * A park issues one AFD poll of the socket's base provider handle for its
 * direction (poller_windows.c) and sleeps until the poll's packet comes back,
 * the deadline passes or the scheduler shuts down; then it retries. The poll
 * is one shot and belongs to this park alone (a heap record shared by the
 * waiter and the poller, freed by whichever lets go last), so nothing is
 * registered across parks: a socket closed and its handle value reused
 * meanwhile cannot be confused with the old one, and several fibers may wait
 * on one socket in the same direction (Windows never reports ASYNC_E_BUSY).
 * A park that ends before its packet (timeout, shutdown) cancels the poll.
 *
 * Sockets are switched to non-blocking mode (FIONBIO): winsock has no
 * per-call MSG_DONTWAIT, and no SIGPIPE either. WSAGetLastError is read only
 * inside the noinline sys_* helpers (a park may move the fiber to another
 * thread). Plain threads wait in WSAPoll. */
#include <winsock2.h>
#include <ws2tcpip.h>
#include <windows.h>
#include <mswsock.h>

#include <stdlib.h>

#include "fiber_int.h"

#ifndef SIO_BASE_HANDLE
#define SIO_BASE_HANDLE _WSAIOR(IOC_WS2, 34)
#endif

typedef struct {
    la_afd_op_t afd; /* first: the poller hands this back */
    la_spin_t lk;
    la_waiter_t *w; /* the parked waiter, NULL once it or the event let go */
} la_wop_t;

int la_io_init(la_sched_t *s) {
    (void)s;
    return 0;
}

void la_io_free(la_sched_t *s) { (void)s; }

/* A poll's packet came back (any worker, in la_poller_wait). */
void la_io_event(void *ctx, void *rec, unsigned got) {
    (void)ctx, (void)got;
    la_wop_t *op = rec;
    la_waiter_t *wake = NULL;
    la_spin_lock(&op->lk);
    if (op->w && la_waiter_claim(op->w, LA_W_READY)) wake = op->w;
    op->w = NULL;
    la_spin_unlock(&op->lk);
    /* a claimed fiber cannot run before this: its waiter is alive */
    if (wake) la_waiter_signal(wake);
}

/* ---- winsock calls: 0/n or -WSA error ------------------------------------- */

LA_NOINLINE static int sys_nonblock(SOCKET s) {
    u_long one = 1;
    return ioctlsocket(s, FIONBIO, &one) == 0 ? 0 : -WSAGetLastError();
}

LA_NOINLINE static int sys_base(SOCKET s, SOCKET *base) {
    DWORD n = 0;
    *base = INVALID_SOCKET;
    if (WSAIoctl(s, SIO_BASE_HANDLE, NULL, 0, base, sizeof *base, &n, NULL, NULL) != 0) return -WSAGetLastError();
    return 0;
}

/* WSAPoll of one socket: revents, 0 on timeout, or -WSA error. */
LA_NOINLINE static int sys_poll1(SOCKET s, short events, int timeout) {
    WSAPOLLFD p = {.fd = s, .events = events, .revents = 0};
    int r = WSAPoll(&p, 1, timeout);
    if (r < 0) return -WSAGetLastError();
    if (r == 0) return 0;
    if (p.revents & POLLNVAL) return -WSAENOTSOCK;
    return p.revents ? p.revents : 0;
}

/* One non-blocking WSARecvFrom (also async_fiber_read's, addr NULL): the count or
 * -WSA error. A datagram longer than n is cut to n (WSAEMSGSIZE with buf
 * filled), as recvfrom(2) does. */
LA_NOINLINE static ssize_t sys_recvfrom(SOCKET s, void *buf, size_t n, struct sockaddr *a, socklen_t *l) {
    int e = sys_nonblock(s);
    if (e) return e;
    WSABUF wb = {.len = n > INT32_MAX ? INT32_MAX : (ULONG)n, .buf = buf};
    DWORD got = 0, fl = 0;
    INT alen = a ? *l : 0;
    int r = WSARecvFrom(s, &wb, 1, &got, &fl, a, a ? &alen : NULL, NULL, NULL);
    int err = r == 0 ? 0 : WSAGetLastError();
    if (err && err != WSAEMSGSIZE) return -err;
    if (a) *l = alen;
    return err ? (ssize_t)wb.len : (ssize_t)got;
}

LA_NOINLINE static ssize_t sys_write(SOCKET s, const void *buf, size_t n) {
    int e = sys_nonblock(s);
    if (e) return e;
    int r = send(s, buf, n > INT32_MAX ? INT32_MAX : (int)n, 0);
    return r >= 0 ? r : -WSAGetLastError();
}

LA_NOINLINE static SOCKET sys_accept(SOCKET s, struct sockaddr *a, socklen_t *l, int *err) {
    int e = sys_nonblock(s);
    if (e) {
        *err = -e;
        return INVALID_SOCKET;
    }
    SOCKET c = accept(s, a, l);
    if (c == INVALID_SOCKET) {
        *err = WSAGetLastError();
        return c;
    }
    u_long one = 1;
    ioctlsocket(c, FIONBIO, &one);
    SetHandleInformation((HANDLE)c, HANDLE_FLAG_INHERIT, 0);
    *err = 0;
    return c;
}

LA_NOINLINE static int sys_connect(SOCKET s, const struct sockaddr *a, socklen_t l) {
    int e = sys_nonblock(s);
    if (e) return e;
    return connect(s, a, l) == 0 ? 0 : -WSAGetLastError();
}

LA_NOINLINE static int sys_sockerr(SOCKET s) {
    int err = 0;
    int len = sizeof err;
    if (getsockopt(s, SOL_SOCKET, SO_ERROR, (char *)&err, &len) != 0) return -WSAGetLastError();
    return -err;
}

/* 0 if s is an open socket, else -WSA error. */
LA_NOINLINE static int sys_is_socket(SOCKET s) {
    int type = 0;
    int len = sizeof type;
    return getsockopt(s, SOL_SOCKET, SO_TYPE, (char *)&type, &len) == 0 ? 0 : -WSAGetLastError();
}

static int map_wsa(int e) {
    switch (e) {
    case WSAENOTSOCK:
    case WSAEBADF:
    case WSANOTINITIALISED:
    case WSA_INVALID_HANDLE: return ASYNC_E_BADFD;
    case WSAENOBUFS:
    case WSA_NOT_ENOUGH_MEMORY:
    case WSAEMFILE: return ASYNC_E_NOMEM;
    case WSAEINVAL:
    case WSAEFAULT: return ASYNC_E_INVAL;
    case WSAETIMEDOUT: return ASYNC_E_TIMEDOUT;
    case WSAECONNRESET:
    case WSAECONNABORTED:
    case WSAECONNREFUSED:
    case WSAESHUTDOWN:
    case WSAENETRESET: return ASYNC_E_CLOSED;
    default: la_note_os_error(e); return ASYNC_E_SYS;
    }
}

/* ---- parking on a socket ----------------------------------------------------- */

static uint32_t afd_mask(int dirs) {
    uint32_t m = LA_AFD_ABORT | LA_AFD_LOCAL_CLOSE | LA_AFD_CONNECT_FAIL;
    if (dirs & 1) m |= LA_AFD_RECEIVE | LA_AFD_ACCEPT | LA_AFD_DISCONNECT;
    if (dirs & 2) m |= LA_AFD_SEND;
    return m;
}

/* Parks the current fiber until s may be ready for dirs (1 read, 2 write,
 * 3 either) or the deadline. 0 (retry the call) or an async_err_t. */
static int fd_park(la_fiber_t *f, SOCKET s, int dirs, uint64_t deadline) {
    la_sched_t *sc = f->s;
    if (deadline && la_now_ns() >= deadline) return ASYNC_E_TIMEDOUT;
    SOCKET base;
    int e = sys_base(s, &base);
    if (e) return map_wsa(-e);
    la_wop_t *op = calloc(1, sizeof *op);
    if (!op) return ASYNC_E_NOMEM;
    /* Under op's lock until the waiter is in: a packet that comes back at
     * once waits for it (as io.c arms under its record's lock). */
    la_spin_lock(&op->lk);
    int st = la_poller_afd_submit(&sc->poller, &op->afd, (uintptr_t)base, afd_mask(dirs));
    if (st) {
        la_spin_unlock(&op->lk);
        free(op);
        if (st == ERROR_NOT_SUPPORTED) return ASYNC_E_NOTSUP;
        la_note_os_error(st);
        return ASYNC_E_BADFD;
    }
    la_waiter_t w;
    int rc = la_waiter_init(&w, LA_PK_NORMAL);
    if (rc) { /* shutting down */
        la_spin_unlock(&op->lk);
        la_poller_afd_cancel(&sc->poller, &op->afd);
        la_afd_op_unref(&op->afd);
        return rc;
    }
    op->w = &w;
    la_spin_unlock(&op->lk);
    la_fdwait_add(f, 1);
    int why = la_waiter_wait(&w, deadline);
    la_fdwait_add(f, -1);
    la_spin_lock(&op->lk);
    int pending = op->w != NULL;
    op->w = NULL;
    la_spin_unlock(&op->lk);
    if (pending) la_poller_afd_cancel(&sc->poller, &op->afd);
    la_afd_op_unref(&op->afd);
    la_waiter_done(&w);
    return la_reason_err(why);
}

static int bad_sock(async_fd_t fd) { return fd == (async_fd_t)INVALID_SOCKET; }

/* Waits (thread or fiber) until s may be ready for dir; 0 or an async_err_t. */
static int wait_dir(SOCKET s, int dir, uint64_t deadline, int timeout_ms) {
    if (timeout_ms == 0) return ASYNC_E_TIMEDOUT;
    la_fiber_t *f = la_current_fiber();
    if (f) return fd_park(f, s, dir ? 2 : 1, deadline);
    int r = sys_poll1(s, dir ? POLLWRNORM : POLLRDNORM, la_ms_left(deadline));
    if (r < 0) return map_wsa(-r);
    if (r == 0) return ASYNC_E_TIMEDOUT;
    return 0;
}

/* WSAPoll's revents as async events. A hang-up is also READ when READ was
 * asked (a read returns 0 then, as poll(2) reports POLLIN at end of file;
 * WSAPoll may report POLLHUP alone). */
static uint32_t from_poll(int re, uint32_t asked) {
    uint32_t ev = 0;
    if (re & (POLLRDNORM | POLLRDBAND)) ev |= ASYNC_EVENT_READ;
    if (re & POLLWRNORM) ev |= ASYNC_EVENT_WRITE;
    if (re & POLLERR) ev |= ASYNC_EVENT_ERROR;
    if (re & POLLHUP) ev |= ASYNC_EVENT_CLOSE | (asked & ASYNC_EVENT_READ);
    return ev;
}

/* ---- public API ------------------------------------------------------------- */

int async_fiber_wait_fd(async_fd_t fd, uint32_t events, int timeout_ms) {
    LA_ENTRY(-1);
    if (la_wait_fd_bad_args(events, timeout_ms)) return -1;
    if (bad_sock(fd)) {
        la_set_error(ASYNC_E_BADFD);
        return -1;
    }
    SOCKET s = (SOCKET)fd;
    short pev = (short)(((events & ASYNC_EVENT_READ) ? POLLRDNORM : 0) | ((events & ASYNC_EVENT_WRITE) ? POLLWRNORM : 0));
    la_fiber_t *f = la_current_fiber();
    uint64_t deadline = la_deadline(timeout_ms);
    for (;;) {
        int r = sys_poll1(s, pev, f ? 0 : la_ms_left(deadline));
        if (r < 0) {
            la_set_error(map_wsa(-r));
            return -1;
        }
        if (r > 0) return (int)from_poll(r, events);
        if (timeout_ms == 0 || !f) {
            la_set_error(ASYNC_E_TIMEDOUT);
            return -1;
        }
        int rc = fd_park(f, s, (int)(events & (ASYNC_EVENT_READ | ASYNC_EVENT_WRITE)), deadline);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
}

static int io_args(async_fd_t fd, const void *buf, size_t n, int timeout_ms, ssize_t *early) {
    *early = -1;
    if (la_buf_bad_args(buf, n, timeout_ms)) return 1;
    if (bad_sock(fd)) {
        la_set_error(ASYNC_E_BADFD);
        return 1;
    }
    if (n == 0) {
        int e = sys_is_socket((SOCKET)fd);
        if (e) la_set_error(map_wsa(-e));
        *early = e ? -1 : 0;
        return 1;
    }
    return 0;
}

/* The receive of async_fiber_read and async_fiber_recvfrom (addr NULL: the
 * source is not told): tried, and retried after a wait for readiness. */
static ssize_t recv_loop(SOCKET s, void *buf, size_t n, struct sockaddr *addr, socklen_t *len, int timeout_ms) {
    uint64_t deadline = la_deadline(timeout_ms);
    for (;;) {
        ssize_t r = sys_recvfrom(s, buf, n, addr, len);
        if (r >= 0) return r;
        if (r == -WSAEINTR) continue;
        if (r != -WSAEWOULDBLOCK) {
            la_set_error(map_wsa((int)-r));
            return -1;
        }
        int rc = wait_dir(s, 0, deadline, timeout_ms);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
}

ssize_t async_fiber_read(async_fd_t fd, void *buf, size_t n, int timeout_ms) {
    LA_ENTRY(-1);
    ssize_t early;
    if (io_args(fd, buf, n, timeout_ms, &early)) return early;
    return recv_loop((SOCKET)fd, buf, n, NULL, NULL, timeout_ms);
}

ssize_t async_fiber_write(async_fd_t fd, const void *buf, size_t n, int timeout_ms) {
    LA_ENTRY(-1);
    ssize_t early;
    if (io_args(fd, buf, n, timeout_ms, &early)) return early;
    uint64_t deadline = la_deadline(timeout_ms);
    size_t done = 0;
    while (done < n) {
        ssize_t r = sys_write((SOCKET)fd, (const char *)buf + done, n - done);
        if (r >= 0) {
            done += (size_t)r;
            continue;
        }
        if (r == -WSAEINTR) continue;
        if (r != -WSAEWOULDBLOCK) {
            la_set_error(map_wsa((int)-r));
            return -1;
        }
        int rc = wait_dir((SOCKET)fd, 1, deadline, timeout_ms);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
    return (ssize_t)n;
}

async_fd_t async_fiber_accept(async_fd_t lfd, struct sockaddr *addr, socklen_t *len, int timeout_ms) {
    LA_ENTRY((async_fd_t)INVALID_SOCKET);
    if (la_check_timeout(timeout_ms)) return (async_fd_t)INVALID_SOCKET;
    if ((addr && !len) || bad_sock(lfd)) {
        la_set_error(bad_sock(lfd) ? ASYNC_E_BADFD : ASYNC_E_INVAL);
        return (async_fd_t)INVALID_SOCKET;
    }
    uint64_t deadline = la_deadline(timeout_ms);
    for (;;) {
        int err = 0;
        SOCKET c = sys_accept((SOCKET)lfd, addr, len, &err);
        if (c != INVALID_SOCKET) return (async_fd_t)c;
        if (err == WSAEINTR || err == WSAECONNRESET) continue;
        if (err != WSAEWOULDBLOCK) {
            la_set_error(map_wsa(err));
            return (async_fd_t)INVALID_SOCKET;
        }
        int rc = wait_dir((SOCKET)lfd, 0, deadline, timeout_ms);
        if (rc) {
            la_set_error(rc);
            return (async_fd_t)INVALID_SOCKET;
        }
    }
}

/* Owned fds (include/async.h) are not implemented here: every wait keeps
 * its own AFD poll, so there is no registration to keep. */
int async_fiber_fd_open(async_sched_t *sh, async_fd_t fd) {
    LA_ENTRY(-1);
    (void)sh;
    (void)fd;
    la_set_error(ASYNC_E_NOTSUP);
    return -1;
}

LA_NOINLINE static int sys_closesocket(SOCKET s) { return closesocket(s) == 0 ? 0 : -WSAGetLastError(); }

int async_fiber_close(async_fd_t fd) {
    LA_ENTRY(-1);
    if (bad_sock(fd)) {
        la_set_error(ASYNC_E_BADFD);
        return -1;
    }
    int e = sys_closesocket((SOCKET)fd);
    if (e) {
        la_set_error(map_wsa(-e));
        return -1;
    }
    return 0;
}

int async_fiber_connect(async_fd_t fd, const struct sockaddr *addr, socklen_t len, int timeout_ms) {
    LA_ENTRY(-1);
    if (la_check_timeout(timeout_ms)) return -1;
    if (!addr) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    if (bad_sock(fd)) {
        la_set_error(ASYNC_E_BADFD);
        return -1;
    }
    SOCKET s = (SOCKET)fd;
    int r = sys_connect(s, addr, len);
    if (r == 0) return 0;
    /* WSAEALREADY: in progress already, wait for its result (io.c) */
    if (r != -WSAEWOULDBLOCK && r != -WSAEINPROGRESS && r != -WSAEINTR && r != -WSAEALREADY) {
        la_set_error(map_wsa(-r));
        return -1;
    }
    uint64_t deadline = la_deadline(timeout_ms);
    for (;;) {
        /* a failed connect shows as POLLERR|POLLHUP, not POLLWRNORM */
        int pr = sys_poll1(s, POLLWRNORM, 0);
        if (pr < 0) {
            la_set_error(map_wsa(-pr));
            return -1;
        }
        if (pr > 0) {
            int e = sys_sockerr(s);
            if (e == 0 && (pr & POLLWRNORM)) return 0;
            la_set_error(e ? map_wsa(-e) : ASYNC_E_CLOSED);
            return -1;
        }
        int rc = wait_dir(s, 1, deadline, timeout_ms);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
}

/* ---- server helpers (include/async.h "Server helpers") ---------------------------- */

/* The options, bind and listen of a new socket s: 0 or a WSA error. */
LA_NOINLINE static int sys_bind_setup(SOCKET s, int fam, int type, const struct sockaddr *a, int len,
                                      unsigned flags, int backlog) {
    SetHandleInformation((HANDLE)s, HANDLE_FLAG_INHERIT, 0); /* close-on-exec: not inherited */
    BOOL one = TRUE;
    /* a listener's port is its own (no other socket may take it over) */
    if (type == SOCK_STREAM && setsockopt(s, SOL_SOCKET, SO_EXCLUSIVEADDRUSE, (const char *)&one, sizeof one) != 0)
        return WSAGetLastError();
    if (fam == AF_INET6) {
        DWORD v6only = (flags & ASYNC_LISTEN_V6ONLY) ? 1 : 0; /* set either way: Windows' default is 1 */
        if (setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, (const char *)&v6only, sizeof v6only) != 0)
            return WSAGetLastError();
    }
    u_long nb = 1;
    if (ioctlsocket(s, FIONBIO, &nb) != 0) return WSAGetLastError();
    if (bind(s, a, len) != 0) return WSAGetLastError();
    if (type == SOCK_STREAM && listen(s, backlog) != 0) return WSAGetLastError();
    return 0;
}

LA_NOINLINE static SOCKET sys_bound(int fam, int type, const struct sockaddr *a, int len, unsigned flags,
                                    int backlog, int *err) {
    SOCKET s = socket(fam, type, type == SOCK_STREAM ? IPPROTO_TCP : IPPROTO_UDP);
    if (s == INVALID_SOCKET) {
        *err = WSAGetLastError();
        return s;
    }
    *err = sys_bind_setup(s, fam, type, a, len, flags, backlog);
    if (*err) {
        closesocket(s);
        return INVALID_SOCKET;
    }
    return s;
}

static int bound_err(int e) {
    switch (e) {
    case WSAEADDRINUSE: return ASYNC_E_EXISTS;
    case WSAEAFNOSUPPORT:
    case WSAEPROTONOSUPPORT:
    case WSAENOPROTOOPT: return ASYNC_E_NOTSUP;
    case WSAEACCES:
    case WSAEADDRNOTAVAIL: la_note_os_error(e); return ASYNC_E_SYS;
    default: return map_wsa(e);
    }
}

/* async_fiber_listen (SOCK_STREAM) and async_fiber_udp_bind (SOCK_DGRAM):
 * plain sockets (no owned descriptors here). */
static async_fd_t bound_socket(const struct sockaddr *addr, socklen_t len, int type, int backlog, unsigned flags) {
    int need = (int)la_bind_addr_len(addr, len, flags); /* net.c */
    if (!need) return (async_fd_t)INVALID_SOCKET;
    if (flags & ASYNC_LISTEN_REUSEPORT) {
        la_set_error(ASYNC_E_NOTSUP);
        return (async_fd_t)INVALID_SOCKET;
    }
    int err = 0;
    SOCKET s = sys_bound(addr->sa_family, type, addr, need, flags, backlog <= 0 ? SOMAXCONN : backlog, &err);
    if (s == INVALID_SOCKET) {
        la_set_error(bound_err(err));
        return (async_fd_t)INVALID_SOCKET;
    }
    return (async_fd_t)s;
}

async_fd_t async_fiber_listen(const struct sockaddr *addr, socklen_t len, int backlog, unsigned flags) {
    LA_ENTRY((async_fd_t)INVALID_SOCKET);
    return bound_socket(addr, len, SOCK_STREAM, backlog, flags);
}

async_fd_t async_fiber_udp_bind(const struct sockaddr *addr, socklen_t len, unsigned flags) {
    LA_ENTRY((async_fd_t)INVALID_SOCKET);
    return bound_socket(addr, len, SOCK_DGRAM, 0, flags);
}

LA_NOINLINE static ssize_t sys_sendto(SOCKET s, const void *buf, size_t n, const struct sockaddr *a, socklen_t l) {
    int e = sys_nonblock(s);
    if (e) return e;
    int r = sendto(s, buf, n > INT32_MAX ? INT32_MAX : (int)n, 0, a, a ? l : 0);
    return r >= 0 ? r : -WSAGetLastError();
}

/* The checks of recvfrom and sendto: 0, or 1 with the error recorded. */
static int dgram_args(async_fd_t fd, const void *buf, size_t n, int timeout_ms) {
    if (la_buf_bad_args(buf, n, timeout_ms)) return 1;
    if (bad_sock(fd)) {
        la_set_error(ASYNC_E_BADFD);
        return 1;
    }
    return 0;
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
    int type = 0, tl = (int)sizeof type;
    if (n == 0 && getsockopt((SOCKET)fd, SOL_SOCKET, SO_TYPE, (char *)&type, &tl) == 0 && type == SOCK_STREAM) {
        if (addr) *len = 0;
        return 0;
    }
    return recv_loop((SOCKET)fd, buf, n, addr, len, timeout_ms);
}

static int send_err(int e) {
    switch (e) {
    case WSAEMSGSIZE: return ASYNC_E_TOOBIG;
    case WSAEDESTADDRREQ:
    case WSAENOTCONN: /* addr NULL on a socket that is not connected */
    case WSAEAFNOSUPPORT:
    case WSAEISCONN: return ASYNC_E_INVAL;
    default: return map_wsa(e);
    }
}

ssize_t async_fiber_sendto(async_fd_t fd, const void *buf, size_t n, const struct sockaddr *addr, socklen_t len,
                           int timeout_ms) {
    LA_ENTRY(-1);
    if (dgram_args(fd, buf, n, timeout_ms)) return -1;
    uint64_t deadline = la_deadline(timeout_ms);
    size_t done = 0;
    for (;;) {
        ssize_t r = sys_sendto((SOCKET)fd, (const char *)buf + done, n - done, addr, len);
        if (r >= 0) {
            done += (size_t)r;
            if (done >= n) return (ssize_t)n; /* also an empty datagram, sent once */
            continue;
        }
        if (r == -WSAEINTR) continue;
        if (r != -WSAEWOULDBLOCK) {
            la_set_error(send_err((int)-r));
            return -1;
        }
        int rc = wait_dir((SOCKET)fd, 1, deadline, timeout_ms);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
}
