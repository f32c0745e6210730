/* One owner of the process-wide disposition of each signal libasync catches
 * (base.h, "signal ownership").
 *
 * Two features install a handler for a host's signal: the signal watches
 * (rt/sigwatch.c: async_runtime_add_signal, async_fiber_watch_signal) and
 * the dump on a signal (fiber/tools.c: async_sched_dump_on_signal). Each used
 * to save "the action that was there" and put it back when its own last user
 * went, so mixing them on one signal saved the other feature's handler as
 * the host's (and restored it with nobody behind it), or put the host's
 * action back while the other feature still used the signal. Here the
 * disposition has one owner: the first libasync user of a signal installs
 * on_signal and saves the host's action, once; the last one puts it back
 * (unless the host installed another action since, which then stays); in
 * between, on_signal calls the handler of each feature that uses the signal.
 *
 * The handler is async-signal-safe: atomic loads and the features' own
 * (async-signal-safe) handlers. In a forked child (la_forked) it puts back
 * the host's action and raises the signal again, so the child reacts as it
 * would have without libasync (LA_ENTRY refuses the child's calls). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include "base.h"

#if !defined(_WIN32)

typedef struct {
    unsigned users;         /* a bit per feature (under mu) */
    struct sigaction host;  /* the action on_signal replaced (set before it is installed) */
    _Atomic(la_sigown_fn) fn[LA_SIGOWN_USERS];
} la_sigown_t;

static la_sigown_t own[LA_SIGOWN_N];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void on_signal(int sig, siginfo_t *si, void *uc) {
    (void)si;
    (void)uc;
    if (sig <= 0 || sig >= LA_SIGOWN_N) return;
    int saved = errno;
    if (atomic_load_explicit(&la_forked, memory_order_relaxed)) {
        /* A forked child: the host's action comes back, and the signal
         * (blocked while we run) is taken again under it. */
        sigaction(sig, &own[sig].host, NULL);
        raise(sig);
        errno = saved;
        return;
    }
    for (int u = 0; u < LA_SIGOWN_USERS; u++) {
        la_sigown_fn fn = atomic_load_explicit(&own[sig].fn[u], memory_order_acquire);
        if (fn) fn(sig);
    }
    errno = saved;
}

int la_sigown_take(int sig, int user, la_sigown_fn fn) {
    if (sig <= 0 || sig >= LA_SIGOWN_N || user < 0 || user >= LA_SIGOWN_USERS || !fn) return ASYNC_E_INVAL;
    la_sigown_t *o = &own[sig];
    int rc = 0;
    pthread_mutex_lock(&mu);
    atomic_store_explicit(&o->fn[user], fn, memory_order_release);
    if (o->users == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_signal;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        /* One call swaps the actions: a host's sigaction racing it is
         * either saved or comes after ours, never lost. */
        if (sigaction(sig, &sa, &o->host) != 0) {
            la_note_os_error(errno);
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
        atomic_store_explicit(&o->fn[user], NULL, memory_order_release);
        o->users &= ~(1u << user);
        struct sigaction cur;
        if (o->users == 0 && sigaction(sig, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
            cur.sa_sigaction == on_signal)
            sigaction(sig, &o->host, NULL);
    }
    pthread_mutex_unlock(&mu);
}

#endif /* !_WIN32 */
