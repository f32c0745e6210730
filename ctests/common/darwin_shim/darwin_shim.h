/* Stand-ins for the Linux (glibc) calls the C tests and the examples use,
 * so that scripts/cross.sh can compile and link them for macOS (forced in
 * with -include; never used on Linux). They make the programs build; they
 * are not darwin ports of the tests: nothing built with them has run, and
 * cases that test Linux-only behaviour (seccomp, tgkill, IP_RECVERR, the
 * thread's stack attributes) would fail or skip on a Mac. */
#ifndef LA_DARWIN_SHIM_H
#define LA_DARWIN_SHIM_H
#if defined(__APPLE__)
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* socket(2) flags: set after the call by the callers' fcntl, or not at all */
#ifndef SOCK_CLOEXEC
#define SOCK_CLOEXEC 0
#endif
#ifndef SOCK_NONBLOCK
#define SOCK_NONBLOCK 0
#endif
#ifndef IP_RECVERR
#define IP_RECVERR 0 /* Linux only: setsockopt fails on a Mac */
#endif

static inline int la_shim_fdflags(int fd, int flags) {
    if (flags & O_CLOEXEC) fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (flags & O_NONBLOCK) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}
static inline int pipe2(int p[2], int flags) {
    if (pipe(p) != 0) return -1;
    la_shim_fdflags(p[0], flags);
    la_shim_fdflags(p[1], flags);
    return 0;
}
static inline int accept4(int fd, struct sockaddr *a, socklen_t *l, int flags) {
    (void)flags;
    int r = accept(fd, a, l);
    if (r >= 0) la_shim_fdflags(r, O_CLOEXEC | O_NONBLOCK);
    return r;
}
static inline pid_t gettid(void) {
    uint64_t id = 0;
    pthread_threadid_np(NULL, &id);
    return (pid_t)id;
}
static inline int pthread_condattr_setclock(pthread_condattr_t *a, clockid_t c) {
    (void)a;
    (void)c;
    return 0; /* darwin: the tests' deadlines would need CLOCK_REALTIME */
}
static inline int pthread_getattr_np(pthread_t t, pthread_attr_t *a) {
    (void)t;
    (void)a;
    return ENOSYS;
}
/* Only the zero timeout the tests use: takes a pending signal of set. */
static inline int sigtimedwait(const sigset_t *set, siginfo_t *info, const struct timespec *ts) {
    (void)info;
    (void)ts;
    sigset_t p;
    int sig;
    if (sigpending(&p) != 0) return -1;
    for (int s = 1; s < NSIG; s++)
        if (sigismember(set, s) && sigismember(&p, s)) return sigwait(set, &sig) == 0 ? sig : -1;
    errno = EAGAIN;
    return -1;
}

/* darwin has no real-time signals: SIGRTMIN is a number no signal has
 * (sigaction, and async_runtime_add_signal, refuse it), and sigqueue sends
 * the signal without its value. */
#ifndef SIGRTMIN
#define SIGRTMIN NSIG
#endif
static inline int sigqueue(pid_t pid, int sig, const union sigval v) {
    (void)v;
    return kill(pid, sig);
}

/* darwin names only the calling thread */
static inline int la_shim_setname(pthread_t t, const char *name) {
    return pthread_equal(t, pthread_self()) ? pthread_setname_np(name) : ENOSYS;
}
#define pthread_setname_np(t, name) la_shim_setname(t, name)

/* pthread_timedjoin_np: a helper thread joins and reports. */
typedef struct {
    pthread_t t;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, abandoned;
    void *ret;
} la_shim_join_t;
static void *la_shim_joiner(void *p) {
    la_shim_join_t *j = p;
    void *r = NULL;
    pthread_join(j->t, &r);
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    j->ret = r;
    int gone = j->abandoned;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (gone) free(j);
    return NULL;
}
static inline int pthread_timedjoin_np(pthread_t t, void **ret, const struct timespec *abs) {
    la_shim_join_t *j = calloc(1, sizeof *j);
    if (!j) return ENOMEM;
    j->t = t;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    pthread_t h;
    if (pthread_create(&h, NULL, la_shim_joiner, j) != 0) {
        free(j);
        return EAGAIN;
    }
    pthread_detach(h);
    int rc = 0;
    pthread_mutex_lock(&j->mu);
    while (!j->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&j->cv, &j->mu, abs);
    if (j->done) {
        rc = 0;
        if (ret) *ret = j->ret;
    } else {
        j->abandoned = 1; /* the joiner frees it */
    }
    int done = j->done;
    pthread_mutex_unlock(&j->mu);
    if (done) free(j);
    return rc;
}

/* pthread barriers (not in darwin's libc) */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned n, count, round;
} pthread_barrier_t;
typedef int pthread_barrierattr_t;
#define PTHREAD_BARRIER_SERIAL_THREAD (-1)
static inline int pthread_barrier_init(pthread_barrier_t *b, const pthread_barrierattr_t *a, unsigned n) {
    (void)a;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->n = n;
    b->count = b->round = 0;
    return 0;
}
static inline int pthread_barrier_wait(pthread_barrier_t *b) {
    pthread_mutex_lock(&b->mu);
    unsigned round = b->round;
    int last = ++b->count == b->n;
    if (last) {
        b->count = 0;
        b->round++;
        pthread_cond_broadcast(&b->cv);
    } else {
        while (round == b->round) pthread_cond_wait(&b->cv, &b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    return last ? PTHREAD_BARRIER_SERIAL_THREAD : 0;
}
static inline int pthread_barrier_destroy(pthread_barrier_t *b) {
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    return 0;
}
#endif
#endif
