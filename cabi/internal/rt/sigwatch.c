/* Signals as events: async_runtime_add_signal / async_runtime_remove_signal
 * (an ASYNC_EVENT_SIGNAL event through async_runtime_wait) and the
 * fiber-side watch (async_fiber_watch_signal, async_fiber_wait_signal,
 * async_fiber_unwatch_signal).
 *
 * Why a handler of our own and not signalfd: a signalfd only sees a signal
 * that is blocked in every thread of the process, and a library cannot
 * block a signal in threads it did not create (the host's, Go's). So the
 * first watch of a signal takes it from base's one owner of signal
 * dispositions (base/sigown.c: the first libasync user of a signal, this
 * watch or async_sched_dump_on_signal, installs the common handler and saves
 * the host's action; the last one restores it, if ours is still installed),
 * which calls on_signal, and the last watch drops it. Go installs handlers only for the
 * synchronous signals and its own in a c-shared library (SIGSEGV, SIGBUS,
 * SIGFPE, SIGPIPE, SIGURG: docs/EMBEDDING.md); those, and the ones a
 * process cannot or should not catch as events, are refused (sig_allowed).
 *
 * The handler is async-signal-safe: atomics, la_handle_get/put (the pin
 * async_runtime_wakeup uses) and one write(2). For each watch of the signal
 * (a fixed table: no allocation, no lock) it pins the runtime's handle,
 * adds 1 to the runtime's count of that signal, sets the signal's bit in
 * the runtime's mask, and rings the doorbell if the loop may sleep (the same
 * Dekker pair as a completion's post, completions.c). The loop (take,
 * completions.c) exchanges the mask and each count with 0 and hands out one
 * SIGNAL event per signal with the count: coalesced, and exact for the
 * handler entries (a count taken is never counted again, an increment is
 * never lost). A watch that is removed clears the runtime's sigon bit: a
 * count that still lands is dropped at take.
 *
 * No signal is lost to the swap of actions (base/sigown.c): on_signal
 * returns 1 when it counted the signal for a watch, and a watch is in place
 * (sigon bit, table entry, fiber_on) before la_sigown_take installs the
 * handler and stays until la_sigown_drop has put the host's action back;
 * a signal that reaches on_signal after that finds no watch and the common
 * handler raises it again, for the host's action.
 *
 * A pinned handle keeps the runtime's record from being recycled (deinit
 * retires the handle and waits for pins before it closes anything), so a
 * signal racing a deinit either counts into the live record or finds the
 * handle dead. A table entry names the handle, not the record, and is
 * checked against the record's sigon bit, so an entry being reused for
 * another runtime or signal at that moment cannot deliver to the wrong one.
 *
 * The fiber side: one pipe per signal, made at the first watch and never
 * closed (so the handler can never write into a reused descriptor number),
 * and a count. The handler adds to the count, then writes a byte; a waiter
 * drains the pipe, exchanges the count with 0 and, if it was 0, waits for
 * the pipe to be readable with async_fiber_wait_fd (parks a fiber, polls on
 * a thread).
 *
 * A waiter belongs to the watch generation it began under (fiber_gen, +1 at
 * each start of the watch) and returns ASYNC_E_STATE once the generation
 * changed, not only while nothing is watched: an unwatch followed at once by
 * a watch must still end the earlier waits. The unwatch's byte is what wakes
 * them, so the new watch does not drain the pipe, and a waiter of the new
 * generation that drains it while waiters of the previous one are still
 * inside (fiber_waiting, counted by generation parity) writes a byte back:
 * they wake, see the new generation and leave. So does a waiter that finds,
 * after its drain, that the watch ended or changed (it may have eaten the
 * byte meant for the others).
 *
 * After fork(), the child inherits the handler: there the common handler
 * puts back the host's action and raises the signal again, so the child
 * reacts as it would have without libasync (LA_ENTRY refuses the child's
 * calls). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "fiber.h" /* la_current_fiber */
#include "rt.h"

#if !defined(_WIN32)

/* Watches of runtimes, process-wide: the handler scans them all. */
#define LA_SIG_WATCHES 256
static struct {
    _Atomic int signo;  /* 0: free */
    _Atomic uint64_t h; /* the runtime's handle */
} watches[LA_SIG_WATCHES];

typedef struct {
    int users;            /* runtime watches + 1 while fibers watch (under mu) */
    int fiber_refs;       /* async_fiber_watch_signal calls not undone (under mu) */
    _Atomic int fiber_on;
    _Atomic uint64_t fiber_count;
    _Atomic uint64_t fiber_gen; /* +1 at each start of the fiber-side watch */
    _Atomic int fiber_waiting[2]; /* waiters in async_fiber_wait_signal, by generation parity */
    int made;              /* the pipe exists (it is never closed) */
    int pipe_r;
    _Atomic int pipe_w;
} la_sigstate_t;
static la_sigstate_t sigs[LA_SIG_N];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void ring(la_rtc_t *r) {
    int32_t one = 1;
    if (atomic_load_explicit(&r->sh.sleeping, memory_order_seq_cst) == 0 ||
        !atomic_compare_exchange_strong(&r->sh.sleeping, &one, 0))
        return;
    uint64_t v = 1;
    char ch = 'r';
    ssize_t w;
    do w = r->bell.kind == LA_DOORBELL_EVENTFD ? la_write_nc(r->bell.fd, &v, sizeof v)
                                                : la_write_nc(r->bell.fd, &ch, 1);
    while (w < 0 && errno == EINTR);
}

/* Called by the common handler (base/sigown.c), which saves errno and
 * handles a forked child. Returns 1 if a watch counted the signal. */
static int on_signal(int sig) {
    if (sig <= 0 || sig >= LA_SIG_N) return 0;
    int taken = 0;
    uint64_t bit = (uint64_t)1 << (sig - 1);
    for (int i = 0; i < LA_SIG_WATCHES; i++) {
        if (atomic_load_explicit(&watches[i].signo, memory_order_acquire) != sig) continue;
        uint64_t h = atomic_load_explicit(&watches[i].h, memory_order_acquire);
        la_slot_t *slot;
        la_rtc_t *r = h ? la_handle_get(h, LA_T_RUNTIME, &slot) : NULL;
        if (!r) continue;
        if (atomic_load(&r->sigon) & bit) {
            atomic_fetch_add(&r->sigpend[sig], 1);
            atomic_fetch_or(&r->sigmask, bit); /* seq_cst: Dekker with the loop's sleep flag */
            ring(r);
            taken = 1;
        }
        la_handle_put(slot);
    }
    la_sigstate_t *st = &sigs[sig];
    if (atomic_load(&st->fiber_on)) {
        atomic_fetch_add(&st->fiber_count, 1);
        /* fiber_on is raised only once the pipe exists. */
        char c = 's';
        ssize_t k;
        do k = la_write_nc(atomic_load(&st->pipe_w), &c, 1);
        while (k < 0 && errno == EINTR); /* EAGAIN: full, readable anyway */
        taken = 1;
    }
    return taken;
}

/* 1 if signo may be watched. Refused: out of range; what cannot be caught
 * (SIGKILL, SIGSTOP); the synchronous signals of a fault (SIGSEGV, SIGBUS,
 * SIGFPE, SIGILL, SIGTRAP, SIGSYS) and SIGABRT; what the Go runtime handles
 * or uses (SIGPIPE, SIGURG, SIGPROF); the signals libc keeps for itself
 * (between 31 and SIGRTMIN). */
static int sig_allowed(int s) {
    if (s < 1 || s >= LA_SIG_N || s >= NSIG) return 0;
    switch (s) {
    case SIGKILL: case SIGSTOP: case SIGSEGV: case SIGBUS: case SIGFPE: case SIGILL: case SIGTRAP:
    case SIGABRT: case SIGPIPE: case SIGURG: case SIGPROF:
#if defined(SIGSYS)
    case SIGSYS:
#endif
        return 0;
    }
#if defined(SIGRTMIN)
    if (s > 31 && (s < SIGRTMIN || s > SIGRTMAX)) return 0;
#else
    if (s > 31) return 0;
#endif
    return 1;
}

/* Under mu: the first user takes the signal (base/sigown.c installs the
 * common handler). Returns an async_err_t. */
static int sig_use(int s) {
    la_sigstate_t *st = &sigs[s];
    if (st->users == 0) {
        int rc = la_sigown_take(s, LA_SIGOWN_WATCH, on_signal);
        if (rc != 0) return rc;
    }
    st->users++;
    return 0;
}

/* Under mu: the last user drops the signal (the host's action comes back
 * when no other libasync feature uses it, unless the host installed another
 * one since: that one stays). The caller withdraws the watch after it. */
static void sig_unuse(int s) {
    la_sigstate_t *st = &sigs[s];
    if (--st->users > 0) return;
    la_sigown_drop(s, LA_SIGOWN_WATCH);
}

/* Runs op on the runtime behind h, under mu; ASYNC_E_BADHANDLE if h names
 * none. */
static int on_runtime(uint64_t h, int signo, uintptr_t key, int (*op)(la_rtc_t *, uint64_t, int, uintptr_t)) {
    pthread_mutex_lock(&mu);
    la_slot_t *slot;
    la_rtc_t *r = la_handle_get(h, LA_T_RUNTIME, &slot);
    int rc = r ? op(r, h, signo, key) : ASYNC_E_BADHANDLE;
    if (r) la_handle_put(slot);
    pthread_mutex_unlock(&mu);
    return rc;
}

/* Empties watch slot i, which watched signo (under mu): the entry goes
 * after the host's action is back, if this was the last user. */
static void drop_watch(int i, int signo) {
    sig_unuse(signo);
    atomic_store(&watches[i].signo, 0);
    atomic_store(&watches[i].h, 0);
}

static int add_locked(la_rtc_t *r, uint64_t h, int signo, uintptr_t key) {
    uint64_t bit = (uint64_t)1 << (signo - 1);
    if (atomic_load(&r->closed)) return ASYNC_E_CLOSED;
    if (atomic_load(&r->sigon) & bit) return ASYNC_E_EXISTS;
    int i = 0;
    while (i < LA_SIG_WATCHES && atomic_load(&watches[i].signo) != 0) i++;
    if (i == LA_SIG_WATCHES) return ASYNC_E_NOMEM;
    atomic_store(&r->sigkey[signo], key);
    atomic_store(&r->sigpend[signo], 0);
    atomic_fetch_or(&r->sigon, bit);
    atomic_store(&watches[i].h, h);
    atomic_store(&watches[i].signo, signo);
    int rc = sig_use(signo);
    if (rc != 0) {
        atomic_store(&watches[i].signo, 0);
        atomic_store(&watches[i].h, 0);
        atomic_fetch_and(&r->sigon, ~bit);
    }
    return rc;
}

static int remove_locked(la_rtc_t *r, uint64_t h, int signo, uintptr_t key) {
    (void)key;
    uint64_t bit = (uint64_t)1 << (signo - 1);
    if (!(atomic_load(&r->sigon) & bit)) return ASYNC_E_NOTFOUND; /* sigon changes under mu */
    for (int i = 0; i < LA_SIG_WATCHES; i++) {
        if (atomic_load(&watches[i].signo) == signo && atomic_load(&watches[i].h) == h) {
            drop_watch(i, signo);
            break;
        }
    }
    atomic_fetch_and(&r->sigon, ~bit); /* after drop_watch: counts until the host's action is back */
    return 0;
}

static int sig_add(uint64_t h, int signo, uintptr_t key) {
    if (!sig_allowed(signo)) return ASYNC_E_INVAL;
    return on_runtime(h, signo, key, add_locked);
}

static int sig_remove(uint64_t h, int signo) {
    if (signo < 1 || signo >= LA_SIG_N) return ASYNC_E_INVAL;
    return on_runtime(h, signo, 0, remove_locked);
}

void la_sig_forget(uint64_t h) {
    if (!h) return;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < LA_SIG_WATCHES; i++) {
        int s = atomic_load(&watches[i].signo);
        if (s != 0 && atomic_load(&watches[i].h) == h) drop_watch(i, s);
    }
    pthread_mutex_unlock(&mu);
}

int la_sig_take(la_rtc_t *r, la_pair_t *out, io_event_t *ev, int max) {
    int n = 0;
    uint64_t m = atomic_exchange(&r->sigmask, 0);
    while (m) {
        if (n == max) {
            atomic_fetch_or(&r->sigmask, m); /* the rest next time */
            break;
        }
        int s = __builtin_ctzll(m) + 1;
        m &= m - 1;
        uintptr_t c = atomic_exchange(&r->sigpend[s], 0);
        if (c == 0 || !(atomic_load(&r->sigon) & ((uint64_t)1 << (s - 1)))) continue;
        uintptr_t key = atomic_load(&r->sigkey[s]);
        if (ev) {
            io_event_t *o = &ev[n++];
            o->fd = -1;
            o->event_type = ASYNC_EVENT_SIGNAL;
            o->completion_key = key;
            o->data = c;
            o->context = NULL;
        } else {
            out[n].key = key;
            out[n].data = c;
            out[n].type = ASYNC_EVENT_SIGNAL;
            n++;
        }
    }
    return n;
}

/* ---- the fiber side -------------------------------------------------------- */

static int make_pipe(la_sigstate_t *st) {
    if (st->made) return 0;
    int p[2];
#if defined(__linux__)
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0) {
        la_note_os_error(errno);
        return ASYNC_E_SYS;
    }
#else
    if (pipe(p) != 0) {
        la_note_os_error(errno);
        return ASYNC_E_SYS;
    }
    for (int i = 0; i < 2; i++) {
        fcntl(p[i], F_SETFD, FD_CLOEXEC);
        fcntl(p[i], F_SETFL, fcntl(p[i], F_GETFL) | O_NONBLOCK);
    }
#endif
    st->pipe_r = p[0];
    atomic_store(&st->pipe_w, p[1]);
    st->made = 1;
    return 0;
}

static void drain(int fd) {
    char buf[256];
    while (la_read_nc(fd, buf, sizeof buf) > 0) {
    }
}

static int fiber_watch(int signo) {
    if (!sig_allowed(signo)) return ASYNC_E_INVAL;
    la_sigstate_t *st = &sigs[signo];
    pthread_mutex_lock(&mu);
    int rc = 0;
    if (st->fiber_refs == 0) {
        if ((rc = make_pipe(st)) == 0) {
            /* No drain: a byte of the last unwatch may still have to wake
             * waiters of the earlier watch (a stale byte only costs a waiter
             * one more look at the count). */
            atomic_store(&st->fiber_count, 0);
            atomic_fetch_add(&st->fiber_gen, 1);
            atomic_store(&st->fiber_on, 1);
            rc = sig_use(signo);
            if (rc != 0) atomic_store(&st->fiber_on, 0);
        }
    }
    if (rc == 0) st->fiber_refs++;
    pthread_mutex_unlock(&mu);
    return rc;
}

static int fiber_unwatch(int signo) {
    if (signo < 1 || signo >= LA_SIG_N) return ASYNC_E_INVAL;
    la_sigstate_t *st = &sigs[signo];
    pthread_mutex_lock(&mu);
    int rc = 0;
    if (st->fiber_refs == 0) {
        rc = ASYNC_E_NOTFOUND;
    } else if (--st->fiber_refs == 0) {
        sig_unuse(signo); /* first: the watch counts until the host's action is back */
        atomic_store(&st->fiber_on, 0);
        /* Wake the waiters: they find no count and no watch (STATE). */
        char c = 'u';
        ssize_t k;
        /* Under mu, which deinit takes too: not a cancellation point. */
        do k = la_write_nc(atomic_load(&st->pipe_w), &c, 1);
        while (k < 0 && errno == EINTR);
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* Returns the count (> 0), or -1 with the error recorded. */
static int fiber_wait(int signo, int timeout_ms) {
    if (signo < 1 || signo >= LA_SIG_N || timeout_ms < -1) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    la_sigstate_t *st = &sigs[signo];
    uint64_t deadline = la_deadline(timeout_ms);
    /* The generation first: the watch raises it before fiber_on. */
    uint64_t gen = atomic_load(&st->fiber_gen);
    if (!atomic_load(&st->fiber_on)) {
        la_set_error(ASYNC_E_STATE);
        return -1;
    }
    _Atomic int *mine = &st->fiber_waiting[gen & 1], *prev = &st->fiber_waiting[(gen + 1) & 1];
    /* A plain thread: no cancellation point in the whole loop (base.h): a
     * cancel acting at the drain's read would leave fiber_waiting counted. */
    int cs = LA_CANCEL_KEPT;
    if (!la_current_fiber()) la_nocancel_enter(&cs);
    atomic_fetch_add(mine, 1);
    int rc;
    for (;;) {
        if (!atomic_load(&st->fiber_on) || atomic_load(&st->fiber_gen) != gen) {
            la_set_error(ASYNC_E_STATE);
            rc = -1;
            break;
        }
        drain(st->pipe_r); /* before the count: a byte after it is a new signal */
        if (atomic_load(prev) > 0 || !atomic_load(&st->fiber_on) || atomic_load(&st->fiber_gen) != gen) {
            /* The drain may have eaten the byte of an unwatch that other
             * waiters (of this watch or of the previous one) have not seen
             * yet: give it back (they leave at once when they see it). */
            char b = 'u';
            ssize_t k;
            do k = la_write_nc(atomic_load(&st->pipe_w), &b, 1);
            while (k < 0 && errno == EINTR);
        }
        uint64_t c = atomic_exchange(&st->fiber_count, 0);
        if (c > 0) {
            if (c > INT_MAX) {
                atomic_fetch_add(&st->fiber_count, c - INT_MAX);
                c = INT_MAX;
            }
            rc = (int)c;
            break;
        }
        int ms = -1;
        if (deadline) {
            ms = la_ms_left(deadline);
            if (ms == 0) {
                la_set_error(ASYNC_E_TIMEDOUT);
                rc = -1;
                break;
            }
        }
        if (async_fiber_wait_fd(st->pipe_r, ASYNC_EVENT_READ, ms) < 0) {
            rc = -1;
            break;
        }
    }
    atomic_fetch_sub(mine, 1);
    la_nocancel_leave(&cs);
    return rc;
}

#else /* _WIN32: no signals as events (ASYNC_E_NOTSUP) */

int la_sig_take(la_rtc_t *r, la_pair_t *out, io_event_t *ev, int max) {
    (void)r, (void)out, (void)ev, (void)max;
    return 0;
}

void la_sig_forget(uint64_t h) { (void)h; }

#endif /* !_WIN32 */

/* ---- the public functions -------------------------------------------------- */

int async_runtime_add_signal(async_runtime_t *rt, int signo, uintptr_t key) {
    LA_ENTRY(-1);
#if defined(_WIN32)
    (void)rt, (void)signo, (void)key;
    return la_ok(ASYNC_E_NOTSUP) ? 0 : -1;
#else
    return la_ok(sig_add(LA_H(rt), signo, key)) ? 0 : -1;
#endif
}

int async_runtime_remove_signal(async_runtime_t *rt, int signo) {
    LA_ENTRY(-1);
#if defined(_WIN32)
    (void)rt, (void)signo;
    return la_ok(ASYNC_E_NOTSUP) ? 0 : -1;
#else
    return la_ok(sig_remove(LA_H(rt), signo)) ? 0 : -1;
#endif
}

int async_fiber_watch_signal(int signo) {
    LA_ENTRY(-1);
#if defined(_WIN32)
    (void)signo;
    return la_ok(ASYNC_E_NOTSUP) ? 0 : -1;
#else
    return la_ok(fiber_watch(signo)) ? 0 : -1;
#endif
}

int async_fiber_unwatch_signal(int signo) {
    LA_ENTRY(-1);
#if defined(_WIN32)
    (void)signo;
    return la_ok(ASYNC_E_NOTSUP) ? 0 : -1;
#else
    return la_ok(fiber_unwatch(signo)) ? 0 : -1;
#endif
}

int async_fiber_wait_signal(int signo, int timeout_ms) {
    LA_ENTRY(-1);
#if defined(_WIN32)
    (void)signo, (void)timeout_ms;
    la_set_error(ASYNC_E_NOTSUP);
    return -1;
#else
    return fiber_wait(signo, timeout_ms);
#endif
}
