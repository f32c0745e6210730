/* The fiber layer's fd poller: one per scheduler, with one-shot
 * registrations and a doorbell that wakes the worker blocked in it. The
 * scheduler (sched.c) and the fiber fds (io.c) use only these functions; each
 * backend is one file: poller_epoll.c (Linux), poller_kqueue.c (darwin, the
 * BSDs; on Linux with -tags la_kqueue and libkqueue), so IOCP can be added
 * without touching either. Not installed. */
#ifndef LA_POLLER_H
#define LA_POLLER_H

/* The most fd events one la_poller_wait hands out (what a busy worker's
 * periodic poll must have room for in its run queue, sched.c). */
#define LA_POLL_MAX 128

/* Directions, in what a waiter wants and in what an event reports (an error
 * or a hang-up reports both). */
enum { LA_PF_IN = 1, LA_PF_OUT = 2, LA_PF_PRI = 4 /* epoll: urgent data (EPOLLPRI), with IN */ };

#if !defined(__linux__) && !defined(_WIN32) || defined(LA_FIBER_KQUEUE)
#define LA_POLLER_KQUEUE 1
#endif

#if defined(_WIN32)
#include <stdatomic.h>
#include <stdint.h>
/* Windows (poller_windows.c): an I/O completion port that the idle worker
 * sleeps in, woken by a posted packet; fd waits are one-shot AFD polls
 * (la_afd_op_t below) on one \Device\Afd handle bound to the port. */
typedef struct {
    int fd, bell;           /* unused (api.c sets them to -1) */
    void *port;             /* HANDLE of the completion port */
    void *afd;              /* HANDLE of \Device\Afd */
    _Atomic int kicked;     /* a doorbell packet is queued */
    _Atomic int64_t nops;   /* AFD polls whose packet has not come back */
} la_poller_t;
#else
#include <stdatomic.h>
/* The backend's state, embedded in the scheduler. */
typedef struct {
    int fd;   /* the kernel poller (epoll, kqueue) */
    int bell; /* the doorbell (eventfd; kqueue: -1 with EVFILT_USER, else a pipe's read end) */
#if defined(LA_POLLER_KQUEUE)
    int bell_w; /* kqueue without EVFILT_USER: the pipe's write end */
#else
    /* epoll: edges of the doorbell not read (counted by every thread that
     * polls: the poller and a busy worker's non-blocking poll) */
    _Atomic unsigned bell_unread;
#endif
} la_poller_t;
#endif

/* 0, or -1 with errno (nothing left open). */
int la_poller_open(la_poller_t *p);
/* Closes what open made; a poller that failed to open may be closed. */
void la_poller_close(la_poller_t *p);
/* Makes the thread blocked in la_poller_wait (or the next one) return; any
 * thread, never blocks. */
void la_poller_kick(la_poller_t *p);
/* (Re)arms fd for the directions in want, one shot: its next event disarms
 * it and comes back with rec. Sets *added to 1 when fd was not registered
 * (first arm, or its number was closed and reused). 0 or -errno. */
int la_poller_arm(la_poller_t *p, int fd, unsigned want, void *rec, int *added);
/* Registers fd for good, edge-triggered, for both directions (an owned fd,
 * io.c): every later change of its readiness comes back once with rec, and
 * nothing is re-armed. replace 0: -EEXIST when fd is registered already
 * (nothing changes); replace 1: a registration of fd (a one-shot one of
 * la_poller_arm) is turned into this one. 0 or -errno. */
int la_poller_own(la_poller_t *p, int fd, void *rec, int replace);
/* Removes fd's registration (before it is closed, or when its ownership
 * ends). 0 or -errno (-ENOENT: not registered). */
int la_poller_disown(la_poller_t *p, int fd);
/* Waits up to timeout_ms (-1 forever) and calls fn(ctx, rec, got) for each
 * fd event; a kick is consumed, not reported to fn: *rang (when not NULL) is
 * set to 1 if this call took one, else 0. Returns the number of fd events.
 * Several threads may wait at once (a blocking one, non-blocking ones); a
 * kick goes to whichever takes it first, so a non-blocking caller that took
 * one must pass it on (sched.c, poll_now). */
int la_poller_wait(la_poller_t *p, int timeout_ms, void (*fn)(void *ctx, void *rec, unsigned got), void *ctx,
                   int *rang);

#if defined(_WIN32)
/* Windows replaces la_poller_arm with one-shot AFD polls that io_windows.c
 * allocates (malloc) per parked wait: an op starts with this header (the
 * IO_STATUS_BLOCK and AFD_POLL_INFO the kernel writes). la_poller_wait calls
 * fn(ctx, op, afd_events) when its packet comes back (events 0: cancelled or
 * failed) and then drops the poller's reference; the last of the two
 * references (the waiter's, la_afd_op_unref) frees it. la_poller_close
 * cancels what is outstanding and drains it. */
typedef struct {
    struct {
        uintptr_t status; /* NTSTATUS (union with a pointer) */
        uintptr_t information;
    } iosb;
    struct {
        int64_t timeout;
        uint32_t nhandles, exclusive;
        struct {
            uintptr_t handle;
            uint32_t events;
            int32_t status;
        } h;
    } info;
    _Atomic int refs;
} la_afd_op_t;

enum {
    LA_AFD_RECEIVE = 0x0001,
    LA_AFD_SEND = 0x0004,
    LA_AFD_DISCONNECT = 0x0008,
    LA_AFD_ABORT = 0x0010,
    LA_AFD_LOCAL_CLOSE = 0x0020,
    LA_AFD_ACCEPT = 0x0080,
    LA_AFD_CONNECT_FAIL = 0x0100
};
/* Issues op's poll of base_socket (a base provider SOCKET) for afd_events;
 * sets op->refs to 2. 0, or a Win32/NT error code (no packet will come). */
int la_poller_afd_submit(la_poller_t *p, la_afd_op_t *op, uintptr_t base_socket, uint32_t afd_events);
/* Asks for op's packet now (it comes back cancelled, or with its result). */
void la_poller_afd_cancel(la_poller_t *p, la_afd_op_t *op);
void la_afd_op_unref(la_afd_op_t *op);
#endif

#endif
