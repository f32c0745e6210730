/* One owner of the process-wide disposition of each signal libasync catches
 * (base.h, "signal ownership").
 *
 * Two features install a handler for a host's signal: the signal watches
 * (rt/sigwatch.c: async_runtime_add_signal, async_fiber_watch_signal) and
 * the dump on a signal (fiber/tools.c: async_sched_dump_on_signal). The
 * disposition has one owner: the first libasync user of a signal installs
 * on_signal and saves the host's action, once; the last one puts it back
 * (unless the host installed another action since, which then stays); in
 * between, on_signal calls the handler of each feature that uses the signal.
 *
 * No signal is lost to the swap: each one is taken by a feature (its
 * handler returns nonzero: counted for a watch, dumped) or acted on by the
 * host's action. The features keep their side of it: a feature's handler
 * takes every signal while the feature holds the signal here (it publishes
 * its watches before la_sigown_take and withdraws them only after
 * la_sigown_drop). Here: the last drop puts the host's action back before
 * it clears the feature's handler, and gen (odd while on_signal is ours to
 * own) moves at every install and restore. A handler that runs late (the
 * signal was delivered to on_signal before the restore, the features' state
 * is read after it) finds nothing that takes the signal and a gen that
 * moved: it raises the signal again on its own thread, with its siginfo
 * where the system allows; the signal is blocked while on_signal runs, so
 * it comes back at its return, under the action then installed (the
 * host's, or a new install whose watches are already published). A signal
 * that nothing takes while gen has not moved is one for a runtime whose
 * deinit is under way (its watches and their counts go with it).
 *
 * The handler is async-signal-safe: atomic loads, the features' own
 * (async-signal-safe) handlers, and the re-raise (rt_tgsigqueueinfo on
 * Linux, raise elsewhere). In a forked child (la_forked) it puts back the
 * host's action and raises the signal again, so the child reacts as it
 * would have without libasync (LA_ENTRY refuses the child's calls). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#include "base.h"

#if !defined(_WIN32)

typedef struct {
    unsigned users;         /* a bit per feature (under mu) */
    struct sigaction host;  /* the action on_signal replaced (set before it is installed) */
    _Atomic(la_sigown_fn) fn[LA_SIGOWN_USERS];
    _Atomic unsigned gen;   /* odd from an install to the restore; +1 at each */
} la_sigown_t;

static la_sigown_t own[LA_SIGOWN_N];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* Sends sig again to the calling thread (async-signal-safe). */
static void reraise(int sig, siginfo_t *si) {
#if defined(__linux__) && defined(SYS_rt_tgsigqueueinfo)
    /* To itself a thread may queue any siginfo: the host's handler sees the
     * sender (and a sigqueue's value) the kernel gave on_signal. */
    if (si && syscall(SYS_rt_tgsigqueueinfo, getpid(), (pid_t)syscall(SYS_gettid), sig, si) == 0) return;
#else
    (void)si;
#endif
    raise(sig);
}

static void on_signal(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    if (sig <= 0 || sig >= LA_SIGOWN_N) return;
    int saved = errno;
    la_sigown_t *o = &own[sig];
    if (atomic_load_explicit(&la_forked, memory_order_relaxed)) {
        /* A forked child: the host's action comes back, and the signal
         * (blocked while we run) is taken again under it. */
        sigaction(sig, &o->host, NULL);
        raise(sig);
        errno = saved;
        return;
    }
    unsigned gen = atomic_load(&o->gen);
    int taken = 0;
    for (int u = 0; u < LA_SIGOWN_USERS; u++) {
        la_sigown_fn fn = atomic_load(&o->fn[u]);
        if (fn && fn(sig)) taken = 1;
    }
    /* seq_cst: a feature withdraws its watches after the restore's gen
     * step, so a handler that found none sees the step. */
    if (!taken && (!(gen & 1) || atomic_load(&o->gen) != gen)) reraise(sig, si);
    errno = saved;
}

int la_sigown_take(int sig, int user, la_sigown_fn fn) {
    if (sig <= 0 || sig >= LA_SIGOWN_N || user < 0 || user >= LA_SIGOWN_USERS || !fn) return ASYNC_E_INVAL;
    la_sigown_t *o = &own[sig];
    int rc = 0;
    pthread_mutex_lock(&mu);
    atomic_store(&o->fn[user], fn);
    if (o->users == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_signal;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        atomic_fetch_add(&o->gen, 1); /* odd: ours from here */
        /* One call swaps the actions: a host's sigaction racing it is
         * either saved or comes after ours, never lost; a signal before it
         * goes to the host's action, one after to fn (already published). */
        if (sigaction(sig, &sa, &o->host) != 0) {
            la_note_os_error(errno);
            atomic_fetch_add(&o->gen, 1);
            atomic_store(&o->fn[user], NULL);
            rc = ASYNC_E_SYS;
        }
    }
    if (rc == 0) o->users |= 1u << user;
    pthread_mutex_unlock(&mu);
    return rc;
}

void la_sigown_drop(int sig, int user) {
    if (sig <= 0 || sig >= LA_SIGOWN_N || user < 0 || user >= LA_SIGOWN_USERS) return;
    la_sigown_t *o = &own[sig];
    pthread_mutex_lock(&mu);
    if (o->users & (1u << user)) {
        o->users &= ~(1u << user);
        if (o->users == 0) {
            /* The host's action first, while fn still takes what reaches
             * on_signal: no instant has neither. */
            struct sigaction cur;
            if (sigaction(sig, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_signal)
                sigaction(sig, &o->host, NULL);
            atomic_fetch_add(&o->gen, 1); /* even: a late handler raises again */
        }
        atomic_store(&o->fn[user], NULL);
    }
    pthread_mutex_unlock(&mu);
}

#endif /* !_WIN32 */
