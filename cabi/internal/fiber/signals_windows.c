//go:build windows

/* Stack-overflow reporting on Windows: one vectored exception handler, added
 * (first in the chain) by the first async_sched_create. A fiber stack is laid
 * out like a thread stack (stacks_windows.c) and the TIB describes it while
 * the fiber runs, so an overflow raises EXCEPTION_STACK_OVERFLOW on the
 * fiber with the stack's guarantee left to run this handler in. For the
 * running fiber of a worker, that, or an access violation in the reservation
 * below the fiber's stack (a frame that jumped the guard), prints "libasync:
 * fiber stack overflow in fiber <id> ..." through the log hook and ends the
 * process. Anything else goes on down the chain (Go's handlers, the host's).
 * Windows has no alternate signal stack: la_sig_thread_init/fini do nothing. */
#include <winsock2.h> /* before windows.h (async.h includes it) */
#include <windows.h>

#include "fiber_int.h"

uintptr_t la_sig_current_stack(uint64_t *id);
uintptr_t la_stack_win_reserve(uintptr_t base);

static LONG CALLBACK on_exception(EXCEPTION_POINTERS *ep) {
    DWORD code = ep->ExceptionRecord->ExceptionCode;
    if (code != EXCEPTION_STACK_OVERFLOW && code != EXCEPTION_ACCESS_VIOLATION &&
        code != EXCEPTION_GUARD_PAGE)
        return EXCEPTION_CONTINUE_SEARCH;
    /* Not a fiber stack (a thread's, Go's): no thread-local lookup, which may
     * allocate on a thread that never made one. The top of the stack the TIB
     * names is committed (a thread's starts there; a fiber's has the mark). */
    uintptr_t stack_base;
    __asm__("movq %%gs:0x08, %0" : "=r"(stack_base)); /* TIB StackBase */
    if (*(volatile uint64_t *)(stack_base - LA_STACK_TOP_RESERVE) != LA_WIN_STACK_MAGIC)
        return EXCEPTION_CONTINUE_SEARCH;
    uint64_t id = 0;
    uintptr_t guard = la_sig_current_stack(&id); /* the stack's base */
    if (!guard) return EXCEPTION_CONTINUE_SEARCH; /* not on a fiber */
    if (code == EXCEPTION_STACK_OVERFLOW) la_stack_overflow_abort(id, "guard page hit");
    if (ep->ExceptionRecord->NumberParameters >= 2) {
        /* below the committed stack (TIB StackLimit, this fiber's: the
         * handler runs on it) but inside its reservation: a frame that jumped
         * the guard page, or the guard page itself */
        uintptr_t addr = (uintptr_t)ep->ExceptionRecord->ExceptionInformation[1];
        uintptr_t limit;
        __asm__("movq %%gs:0x10, %0" : "=r"(limit)); /* TIB StackLimit */
        if (addr >= la_stack_win_reserve(guard) && addr < limit)
            la_stack_overflow_abort(id, code == EXCEPTION_GUARD_PAGE ? "guard page hit" : "fault below its stack");
    }
    return EXCEPTION_CONTINUE_SEARCH;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int install_rc = -1;

static void install(void) {
    install_rc = AddVectoredExceptionHandler(1, on_exception) ? 0 : (int)GetLastError();
}

int la_sig_install(void) {
    pthread_once(&once, install);
    return install_rc;
}

void la_sig_thread_init(void **alt) { *alt = NULL; }
void la_sig_thread_fini(void *alt) { (void)alt; }
