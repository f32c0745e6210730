/*
 * wakecount: an LD_PRELOAD shim that counts the libc calls libasync's fiber
 * scheduler makes to wake or put to sleep a worker, without tracing (strace
 * stops the process at every traced call, which changes how often workers
 * sleep: see docs/PERFORMANCE.md, "Cross-worker hand-offs"). Prints the counts
 * to stderr at exit.
 *
 *   gcc -O2 -shared -fPIC -o bench/out/wakecount.so bench/wakecount.c -ldl
 *   LD_PRELOAD=bench/out/wakecount.so bench/out/fibers_async pingpong 2 200000
 *
 * write: poller doorbell kicks (eventfd); epoll_wait: blocking waits (timeout
 * != 0) = sleeps as the poller; cond_signal / cond_wait: the other sleepers.
 * Go's runtime makes its system calls directly, so only C callers count.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <unistd.h>

static _Atomic long n_write, n_read, n_epoll, n_csig, n_cwait, n_cbc;

#define NEXT(fn)                                                                                                       \
    static __typeof__(&fn) real;                                                                                       \
    if (!real) real = (__typeof__(&fn))dlsym(RTLD_NEXT, #fn)

ssize_t write(int fd, const void *b, size_t n) {
    NEXT(write);
    n_write++;
    return real(fd, b, n);
}

ssize_t read(int fd, void *b, size_t n) {
    NEXT(read);
    n_read++;
    return real(fd, b, n);
}

int epoll_wait(int e, struct epoll_event *ev, int m, int t) {
    NEXT(epoll_wait);
    if (t) n_epoll++;
    return real(e, ev, m, t);
}

int pthread_cond_signal(pthread_cond_t *c) {
    NEXT(pthread_cond_signal);
    n_csig++;
    return real(c);
}

int pthread_cond_broadcast(pthread_cond_t *c) {
    NEXT(pthread_cond_broadcast);
    n_cbc++;
    return real(c);
}

int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m) {
    NEXT(pthread_cond_wait);
    n_cwait++;
    return real(c, m);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "wakecount: write=%ld read=%ld epoll_wait_blocking=%ld cond_signal=%ld cond_wait=%ld cond_broadcast=%ld\n",
            n_write, n_read, n_epoll, n_csig, n_cwait, n_cbc);
}
