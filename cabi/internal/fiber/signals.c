//go:build !windows

/* Stack-overflow reporting: every worker thread gets an alternate signal
 * stack, and one process-wide SIGSEGV/SIGBUS handler (SA_ONSTACK) checks
 * whether the fault address is in a guard page of a fiber stack arena. If so
 * it prints "libasync: fiber stack overflow in fiber <id> ..." with write(2)
 * and aborts; otherwise it hands the signal to the handler installed before
 * it (Go's, usually), or restores SIG_DFL and returns so the fault repeats. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fiber_int.h"

static struct sigaction old_segv, old_bus;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int install_rc = -1;

static void chain(int sig, siginfo_t *si, void *uc) {
    struct sigaction *old = sig == SIGBUS ? &old_bus : &old_segv;
    if (old->sa_flags & SA_SIGINFO) {
        if (old->sa_sigaction) {
            old->sa_sigaction(sig, si, uc);
            return;
        }
    } else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
        old->sa_handler(sig);
        return;
    }
    /* default action: restore it and return; the fault happens again */
    signal(sig, SIG_DFL);
}

uintptr_t la_sig_current_stack(uint64_t *id);

/* A frame larger than the guard page can skip it: a fault up to this far
 * below the running fiber's stack also counts as its overflow (the guard
 * below every arena, LA_BELOW_ARENA in stacks.c, is as large: an overflow
 * of an arena's lowest stack faults inside this window). */
#define LA_BELOW_STACK (256u * 1024u)

static void on_fault(int sig, siginfo_t *si, void *uc) {
    int guard = 0;
    uintptr_t addr = (uintptr_t)si->si_addr;
    uint64_t id = la_stack_guard_hit(addr, &guard);
    if (id && guard) la_stack_overflow_abort(id, "guard page hit");
    uintptr_t lo = la_sig_current_stack(&id);
    if (lo && addr < lo && addr >= lo - LA_BELOW_STACK) la_stack_overflow_abort(id, "fault below its stack");
    /* canary mode (opt-in): a fault anywhere after an overflow that has not
     * reached a switch yet (it may have wrecked another fiber's stack) */
    uint64_t top = 0;
    id = la_stack_canary_scan(&top);
    if (id) la_stack_overflow_abort(id, "canary overwritten, found at a fault");
    if (top)
        la_stack_report_abort(": the top of the stack of fiber ", top,
                              "canary overwritten by an overflow of the stack above it, found at a fault");
    chain(sig, si, uc);
}

static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &old_segv) != 0 || sigaction(SIGBUS, &sa, &old_bus) != 0) {
        install_rc = errno; /* the errno of the failure (la_sig_install) */
        return;
    }
    install_rc = 0;
}

int la_sig_install(void) {
    pthread_once(&once, install);
    return install_rc;
}

#define LA_ALTSTACK (64u * 1024u)

void la_sig_thread_init(void **alt) {
    void *p = mmap(NULL, LA_ALTSTACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    stack_t ss = {.ss_sp = p, .ss_size = LA_ALTSTACK, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) != 0) {
        munmap(p, LA_ALTSTACK);
        return;
    }
    *alt = p;
}

void la_sig_thread_fini(void *alt) {
    if (!alt) return;
    stack_t ss = {.ss_sp = NULL, .ss_size = 0, .ss_flags = SS_DISABLE};
    sigaltstack(&ss, NULL);
    munmap(alt, LA_ALTSTACK);
}
