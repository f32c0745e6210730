//go:build !windows

/* The fiber fd calls (io.c tells the design): async_fiber_wait_fd,
 * async_fiber_read, async_fiber_write, async_fiber_accept and
 * async_fiber_connect, on a fiber (parks) or a plain thread (poll(2)); on a
 * scheduler with rings the plain fds go through io_uring.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sys/socket.h>

#include "fiber_int.h"


/* A read or write of 0 bytes: 0 at once on an open fd (a socket's recv or
 * send of 0 bytes may say EAGAIN, which must not make the call wait for data
 * or room it does not need), else an error. Takes nothing: a datagram stays
 * queued. 0 or -1 with the error set. */
static int zero_len(int fd) {
    int e = la_io_fd_open(fd);
    if (e) {
        la_set_error(la_io_map_errno(-e));
        return -1;
    }
    return 0;
}

/* The argument checks async_fiber_read and async_fiber_write share: 1 with
 * *early set (-1 with the error recorded, or 0 for a 0-byte call on an open
 * fd) when the call ends here. */

static int io_args(async_fd_t fd, const void *buf, size_t n, int timeout_ms, ssize_t *early) {
    *early = -1;
    if (la_buf_bad_args(buf, n, timeout_ms)) return 1;
    if (fd < 0) {
        la_set_error(ASYNC_E_BADFD);
        return 1;
    }
    if (n == 0) {
        *early = zero_len(fd);
        return 1;
    }
    return 0;
}

/* The events for async_fiber_wait_fd from poll's revents re; asked: the
 * caller's events. The hang-up is the runtime's (async_runtime_add without
 * ASYNC_EVENT_CLOSE): a read-side hang-up alone (the peer's
 * shutdown(SHUT_WR), or its close seen over TCP) is not asked for
 * (POLLRDHUP) and shows as POLLIN, READ (the read returns 0 after the data
 * left); CLOSE comes with POLLHUP only, the hang-up of both sides, whatever
 * was asked. A POLLHUP is READ|CLOSE when READ was asked: a read does not
 * wait then (it returns 0, or the error), whether or not the kernel also
 * says POLLIN (a socket does, an empty pipe or a hung-up terminal does
 * not). */
static uint32_t from_poll(int re, uint32_t asked) {
    uint32_t ev = 0;
    if (re & POLLIN) ev |= ASYNC_EVENT_READ;
    if (re & POLLOUT) ev |= ASYNC_EVENT_WRITE;
    if (re & POLLERR) ev |= ASYNC_EVENT_ERROR;
    if (re & POLLHUP) ev |= ASYNC_EVENT_CLOSE | (asked & ASYNC_EVENT_READ);
    return ev;
}

/* ---- public API ------------------------------------------------------------- */

int async_fiber_wait_fd(async_fd_t fd, uint32_t events, int timeout_ms) {
    LA_ENTRY(-1);
    if (la_wait_fd_bad_args(events, timeout_ms)) return -1;
    if (fd < 0) {
        la_set_error(ASYNC_E_BADFD);
        return -1;
    }
    short pev = (short)(((events & ASYNC_EVENT_READ) ? POLLIN : 0) |
                        ((events & ASYNC_EVENT_WRITE) ? POLLOUT : 0));
    la_fiber_t *f = la_current_fiber();
    if (!f) {
        uint64_t deadline = la_deadline(timeout_ms);
        int r;
        do r = la_io_poll1(fd, pev, la_ms_left(deadline));
        while (r == -EINTR);
        if (r < 0) {
            la_set_error(la_io_map_errno(-r));
            return -1;
        }
        if (r == 0) {
            la_set_error(ASYNC_E_TIMEDOUT);
            return -1;
        }
        return (int)from_poll(r, events);
    }
    la_fdrec_t *rec = la_fdrec(f->s, fd);
    la_fdsnap_t sn = LA_FDSNAP_START;
    uint64_t deadline = LA_DL_UNSET; /* la_io_next_deadline */
    for (;;) {
        if (la_fd_snap_closed(rec, &sn)) return -1;
        int r = la_io_poll1(fd, pev, 0);
        if (r < 0) {
            la_set_error(la_io_map_errno(-r));
            return -1;
        }
        if (r > 0) return (int)from_poll(r, events);
        if (timeout_ms == 0) {
            la_set_error(ASYNC_E_TIMEDOUT);
            return -1;
        }
        int dirs = (int)(events & (ASYNC_EVENT_READ | ASYNC_EVENT_WRITE));
        int rc = la_io_next_deadline(&deadline, timeout_ms);
        if (rc == 0) rc = sn.owned ? la_io_owned_park(f, fd, dirs, &sn, deadline) : la_io_fd_park(f, fd, dirs, deadline);
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
#if defined(LA_URING)
    if (la_uring_here(fd) && la_uring_read(fd, buf, n, timeout_ms, &early)) return early; /* io_uring.c */
#endif
    uint64_t deadline = LA_DL_UNSET; /* la_io_next_deadline */
    la_fiber_t *f = la_current_fiber();
    la_fdrec_t *rec = f ? la_fdrec(f->s, fd) : NULL;
    la_fdsnap_t sn = LA_FDSNAP_START;
    la_fd_snap(rec, &sn);
    /* The last read drained this stream: wait first (see the top). */
    if (rec && timeout_ms != 0 && atomic_load_explicit(&rec->drained, memory_order_relaxed) &&
        (sn.owned ? atomic_load_explicit(&rec->tcp, memory_order_relaxed) &&
                        atomic_load_explicit(&rec->dseq, memory_order_relaxed) == sn.sin
                  : atomic_load_explicit(&rec->stream, memory_order_relaxed))) {
        int rc = la_io_wait_dir(fd, 0, &deadline, timeout_ms, &sn);
        /* Only ASYNC_E_CLOSED ends the call here. A passed timeout or
         * deadline, a cancel or another fiber's wait (ASYNC_E_BUSY) fail
         * only a read that has to wait, and the hint may be stale: the read
         * below takes what is there, and its own wait reports them. Other
         * errors (the number now names another kind of file, say): the read
         * below reports what applies. */
        if (rc == ASYNC_E_CLOSED) {
            la_set_error(rc);
            return -1;
        }
        if (la_fd_snap_closed(rec, &sn)) return -1;
    }
    for (;;) {
        ssize_t r = la_io_read_now(fd, buf, n);
        if (r >= 0) {
            if (rec) {
                int drained = r > 0 && (size_t)r < n;
                if (drained && sn.owned) atomic_store_explicit(&rec->dseq, sn.sin, memory_order_relaxed);
                atomic_store_explicit(&rec->drained, (char)drained, memory_order_relaxed);
            }
            return r;
        }
        if (r == -EINTR) continue;
        if (r != -EAGAIN && r != -EWOULDBLOCK) {
            la_set_error(la_io_map_errno((int)-r));
            return -1;
        }
        int rc = la_io_wait_dir(fd, 0, &deadline, timeout_ms, &sn);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
        if (la_fd_snap_closed(rec, &sn)) return -1;
    }
}

ssize_t async_fiber_write(async_fd_t fd, const void *buf, size_t n, int timeout_ms) {
    LA_ENTRY(-1);
    ssize_t early;
    if (io_args(fd, buf, n, timeout_ms, &early)) return early;
    size_t done = 0;
#if defined(LA_URING)
    if (la_uring_here(fd) && la_uring_write(fd, buf, n, timeout_ms, &early, &done)) return early; /* io_uring.c */
#endif
    uint64_t deadline = LA_DL_UNSET; /* la_io_next_deadline */
    la_fiber_t *f = la_current_fiber();
    la_fdrec_t *rec = f ? la_fdrec(f->s, fd) : NULL;
    la_fdsnap_t sn = LA_FDSNAP_START;
    while (done < n) {
        if (la_fd_snap_closed(rec, &sn)) return -1;
        ssize_t r = la_io_write_now(fd, (const char *)buf + done, n - done);
        if (r >= 0) {
            done += (size_t)r;
            continue;
        }
        if (r == -EINTR) continue;
        if (r != -EAGAIN && r != -EWOULDBLOCK) {
            la_set_error(la_io_map_errno((int)-r));
            return -1;
        }
        int rc = la_io_wait_dir(fd, 1, &deadline, timeout_ms, &sn);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
    return (ssize_t)n;
}

async_fd_t async_fiber_accept(async_fd_t lfd, struct sockaddr *addr, socklen_t *len, int timeout_ms) {
    LA_ENTRY(-1);
    if (la_check_timeout(timeout_ms)) return -1;
    if ((addr && !len) || lfd < 0) {
        la_set_error(lfd < 0 ? ASYNC_E_BADFD : ASYNC_E_INVAL);
        return -1;
    }
#if defined(LA_URING)
    int ur;
    if (la_uring_here(lfd) && la_uring_accept(lfd, addr, len, timeout_ms, &ur)) return ur; /* io_uring.c */
#endif
    uint64_t deadline = LA_DL_UNSET; /* la_io_next_deadline */
    la_fiber_t *f = la_current_fiber();
    la_fdrec_t *rec = f ? la_fdrec(f->s, lfd) : NULL;
    la_fdsnap_t sn = LA_FDSNAP_START;
    for (;;) {
        if (la_fd_snap_closed(rec, &sn)) return -1;
        int r = la_io_accept_now(lfd, addr, len);
        if (r >= 0) {
            /* accepted on a socket this scheduler owns: owned too (the
             * kernel just handed the number out, so a stale owner goes);
             * if it cannot be registered it stays a plain descriptor */
            if (sn.owned) la_io_own_fd(f->s, r, 1);
            return r;
        }
        if (r == -EINTR || r == -ECONNABORTED) continue;
        if (r != -EAGAIN && r != -EWOULDBLOCK) {
            la_set_error(r == -EMFILE || r == -ENFILE ? ASYNC_E_NOMEM : la_io_map_errno(-r));
            return -1;
        }
        int rc = la_io_wait_dir(lfd, 0, &deadline, timeout_ms, &sn);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
    }
}

int async_fiber_connect(async_fd_t fd, const struct sockaddr *addr, socklen_t len, int timeout_ms) {
    LA_ENTRY(-1);
    if (la_check_timeout(timeout_ms)) return -1;
    if (!addr) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    if (fd < 0) {
        la_set_error(ASYNC_E_BADFD);
        return -1;
    }
#if defined(LA_URING)
    int ur;
    if (la_uring_here(fd) && la_uring_connect(fd, addr, len, timeout_ms, &ur)) return ur; /* io_uring.c */
#endif
    la_fiber_t *f = la_current_fiber();
    la_fdrec_t *rec = f ? la_fdrec(f->s, fd) : NULL;
    la_fdsnap_t sn = LA_FDSNAP_START;
    la_fd_snap(rec, &sn);
    int r = la_io_connect_now(fd, addr, len);
    if (r == 0) return 0;
    /* EALREADY: a connect of this socket is in progress (one that timed out,
     * or the host's own non-blocking one): wait for its result as for ours */
    if (r != -EINPROGRESS && r != -EINTR && r != -EALREADY) {
        la_set_error(la_io_map_errno(-r));
        return -1;
    }
    uint64_t deadline = LA_DL_UNSET; /* la_io_next_deadline */
    for (;;) {
        int rc = la_io_wait_dir(fd, 1, &deadline, timeout_ms, &sn);
        if (rc) {
            la_set_error(rc);
            return -1;
        }
        if (la_fd_snap_closed(rec, &sn)) return -1;
        int pr = la_io_poll1(fd, POLLOUT, 0);
        if (pr < 0) {
            la_set_error(la_io_map_errno(-pr));
            return -1;
        }
        if (pr == 0) continue;
        int e = la_io_sockerr(fd);
        if (e == 0) return 0;
        la_set_error(la_io_map_errno(-e));
        return -1;
    }
}
