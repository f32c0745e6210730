//go:build windows

/* Fiber stacks on Windows: one VirtualAlloc reservation per stack, laid out
 * and grown like a Windows thread stack, pooled per scheduler.
 *
 *   reservation (TIB DeallocationStack)
 *   | 1 page never committed, then LA_WIN_GUARANTEE pages the kernel commits
 *   |   to run the stack-overflow handler in (TIB GuaranteedStackBytes)
 *   | stack_size bytes: reserved; the top LA_WIN_COMMIT pages committed
 *   |   read/write, the page below them committed PAGE_GUARD
 *   top (TIB StackBase)
 *
 * The context switch (switch_windows_amd64.S) puts the running fiber's
 * StackBase, StackLimit (the lowest committed read/write address),
 * DeallocationStack and GuaranteedStackBytes in the thread's TIB, so Windows
 * (and wine) treat a fiber stack the way they treat a thread's: a touch of the
 * guard page commits it and moves the guard one page down (StackLimit
 * follows), so a fiber commits only the stack it uses; once the guard would
 * enter the guarantee, the kernel commits the guarantee and raises
 * EXCEPTION_STACK_OVERFLOW on the fiber, with the guarantee left to run
 * handlers in. signals_windows.c's vectored handler turns that (or an access
 * violation in the reservation below the committed stack: a frame that
 * jumped the guard page) into the "fiber stack overflow in fiber <id>" report,
 * then ends the process. A stack keeps what it committed when it goes back to
 * the pool; its StackLimit is read back from the exiting fiber's saved frame
 * (la_stack_win_exit), so the next fiber starts with the right one.
 *
 * la_stack_t.base is the page below the stack_size bytes (the lowest page of
 * the guarantee), so base + page and base + page + size bracket the stack as
 * on the other platforms; .slot holds the committed bytes below the top.
 *
 * Guard modes: 0 and 2 both give this (reported as 2); 1 (madvise) and 3
 * (canaries) are Linux modes and fail with ASYNC_E_NOTSUP. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <winsock2.h> /* before windows.h (async.h includes it) */
#include <windows.h>

#include "fiber_int.h"

#define LA_WIN_GUARANTEE 4 /* pages */
#define LA_WIN_LOW (1 + LA_WIN_GUARANTEE) /* pages below the stack */
#define LA_WIN_COMMIT 2 /* pages committed up front */

struct la_stackpool {
    pthread_mutex_t mu;
    size_t stack_size, page;
    int mode;            /* 2, or 0 when unsupported */
    la_stack_t *free_st; /* free stacks */
    size_t nfree, capfree;
    char **all; /* every reservation of the pool */
    size_t nall, capall;
};

static size_t page_size(void) {
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    return si.dwPageSize;
}

la_stackpool_t *la_stackpool_new(size_t stack_size, int guard_mode) {
    la_stackpool_t *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    p->page = page_size();
    p->stack_size = (stack_size + p->page - 1) / p->page * p->page;
    p->mode = guard_mode == LA_GUARD_AUTO || guard_mode == LA_GUARD_MPROTECT ? LA_GUARD_MPROTECT : 0;
    return p;
}

int la_stackpool_guard_mode(la_stackpool_t *p) { return p->mode; }

size_t la_stackpool_stack_size(la_stackpool_t *p) { return p->stack_size; }

/* One new stack (p->mu held). */
static int new_stack(la_stackpool_t *p, la_stack_t *out) {
    if (p->nall == p->capall) {
        size_t n = p->capall ? p->capall * 2 : 64;
        char **a = realloc(p->all, n * sizeof *a);
        if (!a) return ASYNC_E_NOMEM;
        p->all = a;
        p->capall = n;
    }
    size_t total = LA_WIN_LOW * p->page + p->stack_size;
    char *r = VirtualAlloc(NULL, total, MEM_RESERVE, PAGE_READWRITE);
    if (!r) return ASYNC_E_NOMEM;
    size_t commit = LA_WIN_COMMIT * p->page;
    if (commit + p->page > p->stack_size) commit = p->stack_size - p->page;
    char *top = r + total;
    if (!VirtualAlloc(top - commit - p->page, p->page, MEM_COMMIT, PAGE_READWRITE | PAGE_GUARD) ||
        !VirtualAlloc(top - commit, commit, MEM_COMMIT, PAGE_READWRITE)) {
        VirtualFree(r, 0, MEM_RELEASE);
        return ASYNC_E_NOMEM;
    }
    *(uint64_t *)(top - LA_STACK_TOP_RESERVE) = LA_WIN_STACK_MAGIC; /* no frame goes there */
    p->all[p->nall++] = r;
    out->base = r + (LA_WIN_LOW - 1) * p->page;
    out->size = p->stack_size;
    out->arena = 0;
    out->slot = (uint32_t)commit;
    return 0;
}

int la_stack_get_many(la_stackpool_t *p, la_stack_t *out, int n) {
    if (!p->mode) return -ASYNC_E_NOTSUP;
    pthread_mutex_lock(&p->mu);
    int got = 0, rc = 0;
    while (got < n && p->nfree > 0) out[got++] = p->free_st[--p->nfree];
    if (got == 0) rc = new_stack(p, &out[got]), got = rc ? 0 : 1;
    pthread_mutex_unlock(&p->mu);
    return got ? got : -rc;
}

int la_stack_get(la_stackpool_t *p, la_stack_t *out, uint64_t fiber_id) {
    (void)fiber_id;
    int n = la_stack_get_many(p, out, 1);
    return n < 0 ? -n : 0;
}

void la_stack_put_many(la_stackpool_t *p, const la_stack_t *st, int n) {
    pthread_mutex_lock(&p->mu);
    if (p->nfree + (size_t)n > p->capfree) {
        size_t c = p->capfree ? p->capfree : 64;
        while (c < p->nfree + (size_t)n) c *= 2;
        la_stack_t *a = realloc(p->free_st, c * sizeof *a);
        if (!a) { /* keep them reserved (freed with the pool), unused */
            pthread_mutex_unlock(&p->mu);
            return;
        }
        p->free_st = a;
        p->capfree = c;
    }
    for (int i = 0; i < n; i++) p->free_st[p->nfree++] = st[i];
    pthread_mutex_unlock(&p->mu);
}

void la_stack_put(la_stackpool_t *p, la_stack_t *st) { la_stack_put_many(p, st, 1); }

void la_stackpool_free(la_stackpool_t *p) {
    if (!p) return;
    for (size_t i = 0; i < p->nall; i++) VirtualFree(p->all[i], 0, MEM_RELEASE);
    free(p->all);
    free(p->free_st);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* The overflow handler finds the fiber through the thread's worker. */
void la_stack_own(const la_stack_t *st, uint64_t fiber_id) { (void)st, (void)fiber_id; }
int la_stack_canary_ok(la_stackpool_t *p, const la_stack_t *st) { return (void)p, (void)st, 1; }
void la_stack_check(la_stackpool_t *p, const la_stack_t *st, uint64_t id) { (void)p, (void)st, (void)id; }

/* The lowest address of the reservation of the stack whose base is base. */
uintptr_t la_stack_win_reserve(uintptr_t base) { return base - (LA_WIN_LOW - 1) * page_size(); }

/* Frame slots of switch_windows_amd64.S (in 8-byte words from the saved
 * stack pointer): GuaranteedStackBytes, StackBase, StackLimit,
 * DeallocationStack, r12, return address; 35 words down from the top. */
enum { LA_F_GUAR = 1, LA_F_BASE = 2, LA_F_LIMIT = 3, LA_F_DEALLOC = 4, LA_F_R12 = 28, LA_F_RET = 33, LA_F_WORDS = 35 };

/* A fiber on st exited, its frame saved at sp: keep the StackLimit it left
 * (what the stack has committed now) for the next fiber. */
void la_stack_win_exit(la_stack_t *st, void *sp, size_t page) {
    uintptr_t top = (uintptr_t)(st->base + page + st->size);
    uintptr_t limit = (uintptr_t)((uint64_t *)sp)[LA_F_LIMIT];
    if (limit >= (uintptr_t)(st->base + page) && limit < top) st->slot = (uint32_t)(top - limit);
}

void *la_ctx_make_win64(void *hi, void *arg) {
    la_fiber_t *f = arg;
    size_t page = f->s->page;
    char *top_of_stack = f->stack.base + page + f->stack.size;
    uintptr_t top = (uintptr_t)hi & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - LA_F_WORDS * 8);
    memset(sp, 0, LA_F_WORDS * 8);
    ((uint32_t *)sp)[0] = 0x1F80;                                       /* MXCSR default */
    ((uint16_t *)sp)[2] = 0x027F;                                       /* x87 CW default on Windows x64 */
    sp[LA_F_GUAR] = LA_WIN_GUARANTEE * page;                            /* GuaranteedStackBytes */
    sp[LA_F_BASE] = (uint64_t)(uintptr_t)top_of_stack;                  /* StackBase */
    sp[LA_F_LIMIT] = (uint64_t)(uintptr_t)(top_of_stack - f->stack.slot); /* StackLimit */
    sp[LA_F_DEALLOC] = (uint64_t)la_stack_win_reserve((uintptr_t)f->stack.base); /* DeallocationStack */
    sp[LA_F_R12] = (uint64_t)(uintptr_t)arg;
    sp[LA_F_RET] = (uint64_t)(uintptr_t)la_ctx_trampoline;
    /* sp[34] (top - 8): 0, the trampoline's fake return address */
    return sp;
}

/* Runs on what is left of the overflowed stack (the guarantee): small. */
void la_stack_report_abort(const char *what, uint64_t fiber_id, const char *how) {
    char buf[384];
    la_stack_report_format(buf, sizeof buf, what, fiber_id, how);
    la_log_str(ASYNC_LOG_FATAL, buf);
    /* like abort(): exit code 3, no handler of the host runs on this stack */
    TerminateProcess(GetCurrentProcess(), 3);
    for (;;) {
    }
}
