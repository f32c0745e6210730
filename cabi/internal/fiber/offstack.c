/* Go calls from fibers, and the fiber's own last-error slot.
 *
 * Go code must never run on a fiber stack: on a fiber, la_call_off_fiber
 * runs fn on the worker's own stack ("trap": the fiber switches to its
 * worker loop, which calls fn and switches straight back). Go exports called
 * this way never park the fiber. */
#include "fiber.h"

#if !defined(_WIN32)
#include <signal.h>

/* 1 once this thread has called into Go. */
static __thread int go_bound;

/* Go's first call on a host thread binds one of Go's thread records to it
 * for the thread's life and sets the thread's signal mask to let through
 * what Go's runtime wants (the fault signals, SIGCHLD, SIGPROF, SIGURG and
 * more); later calls leave the mask alone. That first call is an empty one,
 * with the host's mask put back after it (include/async.h: libasync changes
 * no signal mask): every real Go call, and every wait that sleeps, runs with
 * the host's mask. */
static void bind_to_go(void) {
    sigset_t host;
    int kept = pthread_sigmask(SIG_BLOCK, NULL, &host) == 0;
    la_go_bind();
    if (kept) pthread_sigmask(SIG_SETMASK, &host, NULL);
    go_bound = 1;
}
#endif

void la_call_off_fiber(void (*fn)(void *), void *arg) {
    if (la_current_fiber()) {
        la_fiber_trap(fn, arg);
        return;
    }
    /* Go code and the C it calls through cgo may reach libc functions that
     * are cancellation points: cgo's wait for the Go runtime's
     * initialization (pthread_cond_wait, in the process's first calls),
     * the close and open of the descriptors reserved for Go's poller, the
     * default log writer. A cancel pending in the host's thread must not
     * act there (include/async.h: no libasync function is a cancellation
     * point), the less so as it would unwind Go's frames. */
    int cs = LA_CANCEL_KEPT;
    la_nocancel_enter(&cs);
#if !defined(_WIN32)
    if (!go_bound) bind_to_go();
#endif
    fn(arg);
    la_nocancel_leave(&cs);
}

static void start_go_poller(void *arg) {
    (void)arg;
    (void)la_go_start_poller();
}

void la_ensure_go_poller(void) {
    if (atomic_load_explicit(&la_go_poller_up, memory_order_acquire)) return;
    la_call_off_fiber(start_go_poller, NULL);
}

/* On a fiber (also while it runs a Go call on its worker's stack) the
 * last-error slots are the fiber's own: a fiber may resume on another thread.
 * Registered at load, before any public call can run. */
__attribute__((constructor)) static void la_fiber_error_init(void) {
    la_set_error_slot_hooks(la_fiber_error_slot, la_fiber_os_error_slot);
}
