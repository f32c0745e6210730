//go:build !windows

/* The system calls of fiber fd I/O (io.c tells the design): each reports
 * -errno (errno is read only in here, in noinline functions: after a park a
 * fiber may run on another thread), and la_io_map_errno maps errno to an
 * async_err_t for io*.c and io_uring.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#include "fiber_int.h"

/* ---- syscalls that report -errno ----------------------------------------- */

/* 1 if reads of fd drain it when they return less than asked. */
LA_NOINLINE static int sys_is_stream(int fd) {
    int type = 0;
    socklen_t len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0) return type == SOCK_STREAM;
    struct stat st;
    return errno == ENOTSOCK && fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

/* (Re)arms r->fd for want (one shot); the poller adds it when it is not
 * registered, and then the read hint is learned. */
LA_NOINLINE int la_io_arm(la_sched_t *s, la_fdrec_t *r, unsigned want) {
    int added = 0;
    int e = la_poller_arm(&s->poller, r->fd, want, r, &added);
    if (e == 0 && added) atomic_store_explicit(&r->stream, (char)sys_is_stream(r->fd), memory_order_relaxed);
    return e;
}

LA_NOINLINE int la_io_poll1(int fd, short events, int timeout) {
    struct pollfd p = {.fd = fd, .events = events, .revents = 0};
    int r, cs = LA_CANCEL_KEPT;
    /* not a cancellation point (base.h): poll(2) is one also with timeout
     * 0, where a host thread's pending cancel acted in
     * async_fiber_wait_fd(fd, ev, 0) (a worker thread is never cancelled) */
    if (timeout != 0 || !la_current_worker()) la_nocancel_enter(&cs);
    do r = poll(&p, 1, timeout);
    while (r < 0 && errno == EINTR && timeout == 0);
    if (r < 0) r = -errno;
    la_nocancel_leave(&cs);
    if (r < 0) return r;
    if (r == 0) return 0;
    if (p.revents & POLLNVAL) return -EBADF;
    return p.revents ? p.revents : 0;
}

/* 0 if fd is an open descriptor, else -errno (EBADF). */
LA_NOINLINE int la_io_fd_open(int fd) { return fcntl(fd, F_GETFD) < 0 ? -errno : 0; }

LA_NOINLINE static int sys_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) return -errno;
    if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -errno;
    return 0;
}

/* sys_nonblock that says whether it set the flag (*was: the flags before,
 * -1 if it did not change them), for a caller that may have to undo it. */
LA_NOINLINE int la_io_nonblock_undoable(int fd, int *was) {
    *was = -1;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) return -errno;
    if (fl & O_NONBLOCK) return 0;
    if (fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -errno;
    *was = fl;
    return 0;
}

LA_NOINLINE void la_io_setfl(int fd, int fl) {
    int e = errno;
    (void)fcntl(fd, F_SETFL, fl);
    errno = e;
}

/* A socket's non-blocking receive and send. On a worker thread (a fiber's
 * call) through syscall(2): libc's recv and send are cancellation points,
 * and each brackets the call with two atomic updates of the thread's
 * cancellation state (four locked instructions per echo round trip, about
 * 0.05 µs); a worker is never cancelled. On a plain thread the libc calls,
 * cancellation points as async.h says. */
#if defined(__linux__) && defined(SYS_recvfrom) && defined(SYS_sendto)
static inline ssize_t sock_recv(int fd, void *buf, size_t n) {
    if (la_current_worker()) return (ssize_t)syscall(SYS_recvfrom, fd, buf, n, MSG_DONTWAIT, NULL, NULL);
    return recv(fd, buf, n, MSG_DONTWAIT);
}
static inline ssize_t sock_send(int fd, const void *buf, size_t n) {
    if (la_current_worker())
        return (ssize_t)syscall(SYS_sendto, fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL, NULL, (socklen_t)0);
    return send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
}
#else
static inline ssize_t sock_recv(int fd, void *buf, size_t n) { return recv(fd, buf, n, MSG_DONTWAIT); }
static inline ssize_t sock_send(int fd, const void *buf, size_t n) {
    return send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
}
#endif

LA_NOINLINE ssize_t la_io_read_now(int fd, void *buf, size_t n) {
    ssize_t r = sock_recv(fd, buf, n);
    if (r >= 0) return r;
    if (errno != ENOTSOCK) return -errno;
    int e = sys_nonblock(fd);
    if (e) return e;
    r = read(fd, buf, n);
    if (r >= 0) return r;
    e = errno;
    /* A terminal's hang-up reads as EIO on Linux (a pty master whose slave
     * side is closed), where a pipe or socket reads 0: it is the end of
     * file async.h promises for a peer's hang-up. Only with the hang-up
     * (POLLHUP) there: an EIO without it (a background read on an orphaned
     * process group's terminal) stays an error. */
    if (e == EIO && isatty(fd)) {
        int re = la_io_poll1(fd, POLLIN, 0);
        if (re > 0 && (re & POLLHUP)) return 0;
    }
    return -e;
}

/* write(2) to a non-socket (a pipe, say) without SIGPIPE: a write to a pipe
 * whose reader closed raises SIGPIPE at the writing thread (on a host thread
 * the default action, or the Go runtime's handler, kills the process). The
 * signal is blocked around the write, and the one the write raised is taken
 * back with sigtimedwait, unless one was already pending before (that one
 * is the host's: it stays). The thread's own pending signals are taken
 * before the process's, so a SIGPIPE sent to the process meanwhile stays
 * too. Fiber workers block SIGPIPE for good (worker_main): there only the
 * take-back runs, and only after EPIPE. Also async_sched_dump's writes
 * (tools.c), from any thread and from its signal handler: the calls it makes
 * (pthread_sigmask, sigpending, sigtimedwait) are system calls, safe there. */
LA_NOINLINE ssize_t la_write_nosigpipe(int fd, const void *buf, size_t n) {
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    int restore = 0, pending_before = 0;
    if (!la_current_worker()) {
        if (pthread_sigmask(SIG_BLOCK, &pipe_set, &old) != 0) return -EINVAL;
        if (!sigismember(&old, SIGPIPE)) {
            /* it was deliverable here: none can be pending for this thread */
            restore = 1;
        } else {
            sigset_t p;
            pending_before = sigpending(&p) == 0 && sigismember(&p, SIGPIPE);
        }
    }
    ssize_t r = write(fd, buf, n);
    int err = r < 0 ? errno : 0;
    if (err == EPIPE && !pending_before) {
#if defined(__APPLE__)
        /* no sigtimedwait: sigwait returns at once for a pending signal */
        sigset_t p;
        int sig;
        if (sigpending(&p) == 0 && sigismember(&p, SIGPIPE)) sigwait(&pipe_set, &sig);
#else
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR) {
        }
#endif
    }
    if (restore) pthread_sigmask(SIG_SETMASK, &old, NULL);
    return r >= 0 ? r : -err;
}

LA_NOINLINE ssize_t la_io_write_now(int fd, const void *buf, size_t n) {
    ssize_t r = sock_send(fd, buf, n);
    if (r >= 0) return r;
    if (errno != ENOTSOCK) return -errno;
    int e = sys_nonblock(fd);
    if (e) return e;
    return la_write_nosigpipe(fd, buf, n);
}

LA_NOINLINE int la_io_accept_now(int fd, struct sockaddr *a, socklen_t *l) {
    int e = sys_nonblock(fd);
    if (e) return e;
#if defined(__APPLE__)
    /* no accept4: the flags are set after (a fork + exec on another thread
     * in between may inherit the descriptor, as with any darwin accept) */
    int r = accept(fd, a, l);
    if (r < 0) return -errno;
    fcntl(r, F_SETFD, FD_CLOEXEC);
    fcntl(r, F_SETFL, fcntl(r, F_GETFL) | O_NONBLOCK);
    return r;
#else
    int r = accept4(fd, a, l, SOCK_NONBLOCK | SOCK_CLOEXEC);
    return r >= 0 ? r : -errno;
#endif
}

LA_NOINLINE int la_io_connect_now(int fd, const struct sockaddr *a, socklen_t l) {
    int e = sys_nonblock(fd);
    if (e) return e;
    int r = connect(fd, a, l);
    return r == 0 ? 0 : -errno;
}

LA_NOINLINE int la_io_sockerr(int fd) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return -errno;
    return -err;
}

int la_io_map_errno(int e) {
    switch (e) {
    case EBADF:
    case ENOTSOCK:
    case EPERM: return ASYNC_E_BADFD;
    case ENOMEM:
    case ENOBUFS: return ASYNC_E_NOMEM;
    case EINVAL: return ASYNC_E_INVAL;
    case ETIMEDOUT: return ASYNC_E_TIMEDOUT;
    case EPIPE:
    case ECONNRESET:
    case ECONNREFUSED: return ASYNC_E_CLOSED;
    default: la_note_os_error(e); return ASYNC_E_SYS;
    }
}
