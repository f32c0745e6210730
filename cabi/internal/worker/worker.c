/* async_worker: plain C on POSIX threads. Workers run C procedures on host
 * threads, so nothing here needs Go: creation honours the stack size exactly,
 * and should_stop/current are a load each. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/eventfd.h>
#endif

#include "base.h"
#include "fiber.h"
#if defined(_WIN32)
#include "sys_windows.h"
#endif

/* A worker may call into libasync (Go); the Go runtime needs some C stack on
 * the calling thread, so smaller requests are rounded up to this. */
#define LA_MIN_WORKER_STACK (64u * 1024u)

typedef struct la_worker {
    async_worker_proc_t proc;
    void *context;
    void *result;
    uint64_t handle;
    _Atomic int state; /* async_worker_state_t */
    la_wpark_t park;   /* the stop flag, and what wakes the worker's own queue waits */
    _Atomic int refs; /* the handle + the running thread + joiners */
    int done;         /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop_rfd, stop_wfd;
    pthread_t thread;
} la_worker_t;

static __thread la_worker_t *current_worker;

/* After fork() the child refuses every worker call (LA_ENTRY) but
 * async_worker_current (a signal_stop there would make the parent's stop
 * descriptor readable). */

static void worker_free(la_worker_t *w) {
    /* The exiting thread drops its reference while it still holds mu
     * (worker_end): wait for its unlock before mu goes. */
    pthread_mutex_lock(&w->mu);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
#if defined(_WIN32)
    la_win_stop_close(w->stop_rfd, w->stop_wfd);
#else
    close(w->stop_rfd);
    if (w->stop_wfd != w->stop_rfd) close(w->stop_wfd);
#endif
    free(w);
}

static void worker_unref(la_worker_t *w) {
    if (atomic_fetch_sub(&w->refs, 1) == 1) worker_free(w);
}

/* Pins the worker behind h (a reference the caller drops with worker_unref);
 * NULL with ASYNC_E_BADHANDLE recorded if h is not a live worker. */
static la_worker_t *worker_get(const async_worker_t *h) {
    la_slot_t *slot;
    la_worker_t *w = la_handle_get(LA_H(h), LA_T_WORKER, &slot);
    if (!w) {
        la_set_error(ASYNC_E_BADHANDLE);
        return NULL;
    }
    atomic_fetch_add(&w->refs, 1);
    la_handle_put(slot);
    return w;
}

/* The end of a worker's thread, however it ends: proc returned (result r),
 * or the thread left through pthread_exit or cancellation (the cleanup
 * handler below; result NULL). Joiners wake, the state becomes STOPPED, and
 * the thread's reference (with the stop descriptor when it is the last one)
 * goes. The reference is dropped before the mutex is released: a join can
 * only return after that, so a join followed by async_worker_destroy frees
 * the record (and closes the stop descriptor) in destroy, not a moment
 * later on this thread (a host at its descriptor limit would find the
 * descriptor still taken). The last reference frees after the unlock (a
 * joiner that wakes then only unlocks, and holds a reference of its own);
 * whoever else drops the last one (async_worker_destroy right after the
 * decrement below) takes mu first in worker_free, so mu and the record
 * outlive this thread's unlock. */
static void worker_end(la_worker_t *w, void *r) {
    current_worker = NULL;
    la_wpark_set_self(NULL);
    la_wpark_drain(&w->park); /* a queue waker may still be about to kick it */
    pthread_mutex_lock(&w->mu);
    w->result = r;
    w->done = 1;
    atomic_store(&w->state, ASYNC_WORKER_STOPPED);
    pthread_cond_broadcast(&w->cv);
    int last = atomic_fetch_sub(&w->refs, 1) == 1;
    pthread_mutex_unlock(&w->mu);
    if (last) worker_free(w);
}

#if defined(__linux__)
void __asan_unpoison_memory_region(void const volatile *addr, size_t size) __attribute__((weak));

/* A cancelled or exiting thread reaches its cleanup handler by a long jump
 * past the frames of proc, whose ASan redzones would stay in the shadow of
 * the stack below this frame, where the handler's callees now run: the
 * stack below here is cleared of them (in ASan processes only). */
static void forget_unwound_frames(void) {
    pthread_attr_t a;
    void *lo;
    size_t size;
    if (!__asan_unpoison_memory_region || pthread_getattr_np(pthread_self(), &a) != 0) return;
    if (pthread_attr_getstack(&a, &lo, &size) == 0) {
        char *here = __builtin_frame_address(0);
        if (here > (char *)lo && here <= (char *)lo + size) __asan_unpoison_memory_region(lo, (size_t)(here - (char *)lo));
    }
    pthread_attr_destroy(&a);
}
#else
static void forget_unwound_frames(void) {}
#endif

static void worker_unwound(void *arg) {
    forget_unwound_frames();
    worker_end(arg, NULL);
}

static void *worker_main(void *arg) {
    la_worker_t *w = arg;
    current_worker = w;
    la_wpark_set_self(&w->park);
    void *r;
    pthread_cleanup_push(worker_unwound, w);
    r = w->proc(w->context);
    pthread_cleanup_pop(0);
    worker_end(w, r);
    return NULL;
}

static int make_stop_fd(la_worker_t *w) {
#if defined(_WIN32)
    return la_win_stop_pair(&w->stop_rfd, &w->stop_wfd);
#elif defined(__linux__)
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) return -1;
    w->stop_rfd = w->stop_wfd = fd;
    return 0;
#else
    int p[2];
    if (pipe(p) != 0) return -1;
    for (int i = 0; i < 2; i++) {
        fcntl(p[i], F_SETFD, FD_CLOEXEC);
        fcntl(p[i], F_SETFL, fcntl(p[i], F_GETFL) | O_NONBLOCK);
    }
    w->stop_rfd = p[0];
    w->stop_wfd = p[1];
    return 0;
#endif
}

static void signal_stop(la_worker_t *w);

/* Undoes an async_worker_create that got as far as the record: frees its
 * handle (if it has one) and the record, and records the error. */
static async_worker_t *create_failed(la_worker_t *w, int code, int os) {
    if (w->handle) la_handle_free(w->handle, LA_T_WORKER);
    atomic_store(&w->refs, 1);
    worker_unref(w);
    la_set_error_os(code, os);
    return NULL;
}

async_worker_t *async_worker_create(async_worker_proc_t proc, void *context, size_t stack_size) {
    LA_ENTRY(NULL);
    la_ensure_go_poller(); /* the first one starts Go's poller (base/gopoller.go) */
    if (!proc) {
        la_set_error(ASYNC_E_INVAL);
        return NULL;
    }
    la_worker_t *w = calloc(1, sizeof *w);
    if (!w) {
        la_set_error(ASYNC_E_NOMEM);
        return NULL;
    }
    w->proc = proc;
    w->context = context;
    if (make_stop_fd(w) != 0) {
        int e = errno;
        free(w);
        la_set_error_os(e == ENOMEM ? ASYNC_E_NOMEM : ASYNC_E_SYS, e);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    la_cond_init_mono(&w->cv);
    atomic_store(&w->state, ASYNC_WORKER_RUNNING);
    atomic_store(&w->refs, 2); /* the handle and the thread */
    w->handle = la_handle_alloc(LA_T_WORKER, w);
    if (!w->handle) return create_failed(w, ASYNC_E_NOMEM, 0);

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (stack_size > 0) {
#if defined(_WIN32)
        size_t page = la_win_page_size();
#else
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
#endif
        size_t sz = stack_size < LA_MIN_WORKER_STACK ? LA_MIN_WORKER_STACK : stack_size;
        if (sz < (size_t)PTHREAD_STACK_MIN) sz = PTHREAD_STACK_MIN;
        int overflows = sz > SIZE_MAX - (page - 1); /* when rounded up to whole pages */
        if (overflows || pthread_attr_setstacksize(&attr, (sz + page - 1) / page * page) != 0) {
            pthread_attr_destroy(&attr);
            return create_failed(w, ASYNC_E_INVAL, 0);
        }
    }
    /* w->thread is written before the thread can be observed by anyone but
     * itself (the handle is returned only after pthread_create). */
    int err = pthread_create(&w->thread, &attr, worker_main, w);
    pthread_attr_destroy(&attr);
    if (err != 0) {
        /* EINVAL for a stack size asked for: one the system cannot provide
         * (glibc refuses a size whose guard and TLS do not fit), as EAGAIN
         * is for memory or threads: NOMEM (async.h). */
        int code = err == EAGAIN || (err == EINVAL && stack_size > 0) ? ASYNC_E_NOMEM : ASYNC_E_SYS;
        return create_failed(w, code, err);
    }
    return (async_worker_t *)(uintptr_t)w->handle;
}

void async_worker_destroy(async_worker_t *worker) {
    LA_ENTRY();
    la_worker_t *w = la_handle_free(LA_H(worker), LA_T_WORKER);
    if (!w) {
        la_set_error(ASYNC_E_BADHANDLE);
        return;
    }
    /* Ask a running proc to stop, then drop the handle's reference; the
     * thread's reference keeps the record until proc returns (detached). */
    signal_stop(w);
    worker_unref(w);
}

/* The flag and the wake-up of the worker's own stoppable waits (queue waits,
 * la_wpark_t) come first, then the stop descriptor. All lock-free. */
static void signal_stop(la_worker_t *w) {
    int expect = ASYNC_WORKER_RUNNING;
    atomic_compare_exchange_strong(&w->state, &expect, ASYNC_WORKER_STOPPING);
    if (la_wpark_stop(&w->park)) {
#if defined(_WIN32)
        int r = la_win_stop_signal(w->stop_wfd);
#elif defined(__linux__)
        uint64_t one = 1;
        ssize_t r;
        /* Not a cancellation point (base.h): a cancel pending in the
         * caller would otherwise act before the write, and the stop
         * descriptor would never become readable. */
        do r = la_write_nc(w->stop_wfd, &one, sizeof one);
        while (r < 0 && errno == EINTR);
#else
        char c = 's';
        ssize_t r;
        do r = la_write_nc(w->stop_wfd, &c, 1);
        while (r < 0 && errno == EINTR);
#endif
        (void)r;
    }
}

void async_worker_signal_stop(async_worker_t *worker) {
    LA_ENTRY();
    int saved = errno;
    la_worker_t *w = worker_get(worker);
    if (!w) {
        errno = saved;
        return;
    }
    signal_stop(w);
    worker_unref(w);
    errno = saved;
}

bool async_worker_join(async_worker_t *worker, int timeout_ms) {
    LA_ENTRY(false);
    if (timeout_ms < -1) {
        la_set_error(ASYNC_E_INVAL);
        return false;
    }
    la_worker_t *w = worker_get(worker);
    if (!w) return false;
    /* Joining itself; or, on a fiber, a wait that would block the worker
     * thread (and every fiber queued there): refused. 0 only checks. */
    if (w == current_worker || (timeout_ms != 0 && la_current_fiber())) {
        worker_unref(w);
        la_set_error(ASYNC_E_STATE);
        return false;
    }
    struct timespec deadline;
    if (timeout_ms > 0) {
#if defined(_WIN32)
        clock_gettime(CLOCK_REALTIME, &deadline);
#else
        clock_gettime(CLOCK_MONOTONIC, &deadline);
#endif
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    int cs = LA_CANCEL_KEPT; /* not a cancellation point (base.h) */
    if (timeout_ms != 0) la_nocancel_enter(&cs);
    pthread_mutex_lock(&w->mu);
    int timed_out = 0;
    while (!w->done) {
        if (timeout_ms == 0) {
            timed_out = 1;
            break;
        }
        if (timeout_ms < 0) {
            pthread_cond_wait(&w->cv, &w->mu);
        } else if (la_cond_timedwait_mono(&w->cv, &w->mu, &deadline) == ETIMEDOUT && !w->done) {
            timed_out = 1;
            break;
        }
    }
    pthread_mutex_unlock(&w->mu);
    la_nocancel_leave(&cs);
    worker_unref(w);
    if (timed_out) {
        la_set_error(ASYNC_E_TIMEDOUT);
        return false;
    }
    return true;
}

async_worker_t *async_worker_current(void) {
    la_worker_t *w = current_worker;
    if (!w || !la_handle_live(w->handle, LA_T_WORKER)) return NULL;
    return (async_worker_t *)(uintptr_t)w->handle;
}

bool async_worker_should_stop(async_worker_t *worker) {
    LA_ENTRY(true);
    la_worker_t *w = current_worker;
    if (w && LA_H(worker) == w->handle) {
        /* The worker asking about itself: its record is alive (it holds a
         * reference), so no table lookup is needed. */
        return atomic_load_explicit(&w->park.stop, memory_order_acquire) != 0;
    }
    w = worker_get(worker);
    if (!w) return true;
    bool r = atomic_load(&w->park.stop) != 0;
    worker_unref(w);
    return r;
}

async_worker_state_t async_worker_get_state(const async_worker_t *worker) {
    LA_ENTRY(ASYNC_WORKER_STOPPED);
    la_worker_t *w = worker_get(worker);
    if (!w) return ASYNC_WORKER_STOPPED;
    async_worker_state_t s = (async_worker_state_t)atomic_load(&w->state);
    worker_unref(w);
    return s;
}

void *async_worker_result(async_worker_t *worker) {
    LA_ENTRY(NULL);
    la_worker_t *w = worker_get(worker);
    if (!w) return NULL;
    pthread_mutex_lock(&w->mu);
    int done = w->done;
    void *r = w->result;
    pthread_mutex_unlock(&w->mu);
    worker_unref(w);
    if (!done) {
        la_set_error(ASYNC_E_STATE);
        return NULL;
    }
    return r;
}

int async_worker_stop_fd(async_worker_t *worker) {
    LA_ENTRY(-1);
    la_worker_t *w = worker_get(worker);
    if (!w) return -1;
    int fd = w->stop_rfd;
    worker_unref(w);
    return fd;
}

pthread_t async_worker_get_native_handle(async_worker_t *worker) {
    pthread_t t;
    memset(&t, 0, sizeof t);
    LA_ENTRY(t);
    la_worker_t *w = worker_get(worker);
    if (!w) return t;
    /* Once proc has returned the thread is gone (or about to be), and the
     * system reuses its id for the next thread it creates: handing it out
     * would aim pthread_kill/pthread_cancel at another thread. */
    pthread_mutex_lock(&w->mu);
    int done = w->done;
    pthread_mutex_unlock(&w->mu);
    if (!done) t = w->thread;
    worker_unref(w);
    if (done) la_set_error(ASYNC_E_STATE);
    return t;
}
