/* The fiber layer's fd poller: one per scheduler, with one-shot
 * registrations and a doorbell that wakes the worker blocked in it. The
 * scheduler (sched.c) and the fiber fds (io.c) use only these functions; each
 * backend is one file: poller_epoll.c (Linux), poller_kqueue.c (darwin, the
 * BSDs; on Linux with -tags la_kqueue and libkqueue), so IOCP can be added
 * without touching either. Not installed. */
#ifndef LA_POLLER_H
#define LA_POLLER_H

/* Directions, in what a waiter wants and in what an event reports (an error
 * or a hang-up reports both). */
enum { LA_PF_IN = 1, LA_PF_OUT = 2 };

#if !defined(__linux__) || defined(LA_FIBER_KQUEUE)
#define LA_POLLER_KQUEUE 1
#endif

/* The backend's state, embedded in the scheduler. */
typedef struct {
    int fd;   /* the kernel poller (epoll, kqueue) */
    int bell; /* the doorbell (eventfd; kqueue: -1 with EVFILT_USER, else a pipe's read end) */
#if defined(LA_POLLER_KQUEUE)
    int bell_w; /* kqueue without EVFILT_USER: the pipe's write end */
#endif
} la_poller_t;

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
/* Waits up to timeout_ms (-1 forever) and calls fn(ctx, rec, got) for each
 * fd event; a kick is consumed, not reported. Returns the number of fd
 * events. */
int la_poller_wait(la_poller_t *p, int timeout_ms, void (*fn)(void *ctx, void *rec, unsigned got), void *ctx);

#endif
