//go:build !windows

/* Fiber stacks: pooled slots carved out of large mmap(MAP_NORESERVE) arenas.
 *
 * A slot is one guard page followed by the usable stack (the stack grows
 * down, so the guard is at the low end). Guard modes:
 *   1 madvise(MADV_GUARD_INSTALL): no VMA split (Linux >= 6.13);
 *   2 mprotect(PROT_NONE): one VMA split per slot, so only up to
 *     LA_MAX_MPROTECT_GUARDS of them process-wide (vm.max_map_count);
 *   3 canary: magic words in the lowest 256 bytes of the stack, checked at
 *     every switch-out and at exit.
 * Auto (0) tries 1, then 2, then 3 when the mprotect budget is spent.
 *
 * Arenas are listed in a global table that the SIGSEGV handler reads without
 * locks (entries are published once and never reused). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fiber_int.h"

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif

#define LA_ARENA_BYTES (32u << 20)
#define LA_MAX_ARENAS 65536u
#define LA_MAX_MPROTECT_GUARDS 30000
#define LA_CANARY 0x6c6962617379636bULL
#define LA_CANARY_WORDS 32 /* the lowest 256 bytes of the stack */

typedef struct {
    _Atomic uintptr_t base; /* 0: unused or unmapped */
    size_t slot_size;       /* guard page + stack */
    uint32_t nslots;
    int mode;
    _Atomic uint64_t *owner; /* fiber id per slot (0: free) */
} la_arena_t;

static la_arena_t arenas[LA_MAX_ARENAS];
static _Atomic uint32_t narenas;
static pthread_mutex_t arenas_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int mprotect_guards;
static _Atomic int madvise_guard_broken;

struct la_stackpool {
    pthread_mutex_t mu;
    size_t stack_size, slot_size, page;
    int want_mode;  /* as configured */
    int last_mode;  /* mode of the newest arena */
    uint32_t *free_a, *free_s; /* free slots: arena index, slot index */
    size_t nfree, cap, total;
    uint32_t *mine; /* arena indexes owned by this pool */
    size_t nmine, capmine;
};

la_stackpool_t *la_stackpool_new(size_t stack_size, int guard_mode) {
    la_stackpool_t *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    p->page = (size_t)sysconf(_SC_PAGESIZE);
    p->stack_size = (stack_size + p->page - 1) / p->page * p->page;
    p->slot_size = p->stack_size + p->page;
    p->want_mode = guard_mode;
    return p;
}

int la_stackpool_guard_mode(la_stackpool_t *p) {
    pthread_mutex_lock(&p->mu);
    int m = p->last_mode ? p->last_mode : p->want_mode;
    pthread_mutex_unlock(&p->mu);
    return m;
}

static int grow_list(uint32_t **a, uint32_t **b, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap * 2 : 1024;
    while (n < need) n *= 2;
    uint32_t *na = realloc(*a, n * sizeof *na);
    if (!na) return -1;
    *a = na;
    if (b) {
        uint32_t *nb = realloc(*b, n * sizeof *nb);
        if (!nb) return -1;
        *b = nb;
    }
    *cap = n;
    return 0;
}

/* Adds an arena to p (p->mu held). */
static int add_arena(la_stackpool_t *p) {
    uint32_t nslots = (uint32_t)(LA_ARENA_BYTES / p->slot_size);
    if (nslots < 8) nslots = 8;
    size_t bytes = (size_t)nslots * p->slot_size;
    char *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) return ASYNC_E_NOMEM;
    int mode = p->want_mode;
    if (mode == 0) mode = atomic_load(&madvise_guard_broken) ? 2 : 1;
    if (mode == 1) {
        for (uint32_t i = 0; i < nslots; i++) {
            if (madvise(mem + (size_t)i * p->slot_size, p->page, MADV_GUARD_INSTALL) != 0) {
                if (p->want_mode == 1) {
                    munmap(mem, bytes);
                    return ASYNC_E_NOTSUP;
                }
                atomic_store(&madvise_guard_broken, 1);
                mode = 2;
                break;
            }
        }
    }
    if (mode == 2) {
        if (atomic_fetch_add(&mprotect_guards, (int)nslots) + (int)nslots > LA_MAX_MPROTECT_GUARDS &&
            p->want_mode == 0) {
            atomic_fetch_sub(&mprotect_guards, (int)nslots);
            mode = 3;
        } else {
            for (uint32_t i = 0; i < nslots; i++) {
                if (mprotect(mem + (size_t)i * p->slot_size, p->page, PROT_NONE) != 0) {
                    munmap(mem, bytes);
                    atomic_fetch_sub(&mprotect_guards, (int)nslots);
                    return ASYNC_E_NOMEM;
                }
            }
        }
    }
    _Atomic uint64_t *owner = calloc(nslots, sizeof *owner);
    if (!owner || grow_list(&p->free_a, &p->free_s, &p->cap, p->total + nslots) != 0 ||
        grow_list(&p->mine, NULL, &p->capmine, p->nmine + 1) != 0) {
        free(owner);
        munmap(mem, bytes);
        if (mode == 2) atomic_fetch_sub(&mprotect_guards, (int)nslots);
        return ASYNC_E_NOMEM;
    }
    pthread_mutex_lock(&arenas_mu);
    uint32_t ai = atomic_load(&narenas);
    if (ai >= LA_MAX_ARENAS) {
        pthread_mutex_unlock(&arenas_mu);
        free(owner);
        munmap(mem, bytes);
        if (mode == 2) atomic_fetch_sub(&mprotect_guards, (int)nslots);
        return ASYNC_E_NOMEM;
    }
    la_arena_t *a = &arenas[ai];
    a->slot_size = p->slot_size;
    a->nslots = nslots;
    a->mode = mode;
    a->owner = owner;
    atomic_store(&a->base, (uintptr_t)mem);
    atomic_store_explicit(&narenas, ai + 1, memory_order_release);
    pthread_mutex_unlock(&arenas_mu);
    p->mine[p->nmine++] = ai;
    p->total += nslots;
    /* Hand out low slots first. */
    for (uint32_t i = nslots; i-- > 0;) {
        p->free_a[p->nfree] = ai;
        p->free_s[p->nfree] = i;
        p->nfree++;
    }
    p->last_mode = mode;
    return 0;
}

/* Fills out (p->mu held, p->nfree > 0). */
static void pop_slot(la_stackpool_t *p, la_stack_t *out) {
    p->nfree--;
    uint32_t ai = p->free_a[p->nfree], si = p->free_s[p->nfree];
    la_arena_t *a = &arenas[ai];
    out->arena = ai;
    out->slot = si;
    out->base = (char *)atomic_load(&a->base) + (size_t)si * a->slot_size;
    out->size = p->stack_size;
    if (a->mode == 3)
        for (int i = 0; i < LA_CANARY_WORDS; i++) ((uint64_t *)(out->base + p->page))[i] = LA_CANARY;
}

int la_stack_get_many(la_stackpool_t *p, la_stack_t *out, int n) {
    pthread_mutex_lock(&p->mu);
    if (p->nfree == 0) {
        int rc = add_arena(p);
        if (rc) {
            pthread_mutex_unlock(&p->mu);
            return -rc;
        }
    }
    int got = 0;
    /* only what is free now: a batch never maps an arena early */
    while (got < n && p->nfree > 0) pop_slot(p, &out[got++]);
    pthread_mutex_unlock(&p->mu);
    return got;
}

int la_stack_get(la_stackpool_t *p, la_stack_t *out, uint64_t fiber_id) {
    int got = la_stack_get_many(p, out, 1);
    if (got < 0) return -got;
    la_stack_own(out, fiber_id);
    return 0;
}

void la_stack_own(const la_stack_t *st, uint64_t fiber_id) {
    atomic_store_explicit(&arenas[st->arena].owner[st->slot], fiber_id, memory_order_relaxed);
}

void la_stack_put_many(la_stackpool_t *p, const la_stack_t *st, int n) {
    for (int i = 0; i < n; i++) la_stack_own(&st[i], 0);
    pthread_mutex_lock(&p->mu);
    /* the lists were sized for every slot of every arena: never full */
    for (int i = 0; i < n; i++) {
        p->free_a[p->nfree] = st[i].arena;
        p->free_s[p->nfree] = st[i].slot;
        p->nfree++;
    }
    pthread_mutex_unlock(&p->mu);
}

void la_stack_put(la_stackpool_t *p, la_stack_t *st) { la_stack_put_many(p, st, 1); }

int la_stack_canary_ok(la_stackpool_t *p, const la_stack_t *st) {
    if (arenas[st->arena].mode != 3) return 1;
    const uint64_t *w = (const uint64_t *)(st->base + p->page);
    uint64_t bad = 0;
    for (int i = 0; i < LA_CANARY_WORDS; i++) bad |= w[i] ^ LA_CANARY;
    return bad == 0;
}

void la_stackpool_free(la_stackpool_t *p) {
    if (!p) return;
    for (size_t i = 0; i < p->nmine; i++) {
        la_arena_t *a = &arenas[p->mine[i]];
        uintptr_t base = atomic_exchange(&a->base, 0);
        munmap((void *)base, (size_t)a->nslots * a->slot_size);
        if (a->mode == 2) atomic_fetch_sub(&mprotect_guards, (int)a->nslots);
        /* a->owner stays allocated: a signal handler may be reading it. */
    }
    free(p->free_a);
    free(p->free_s);
    free(p->mine);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* Async-signal-safe: which fiber's guard page (or, in canary mode, its
 * lowest stack page) holds addr. */
uint64_t la_stack_guard_hit(uintptr_t addr, int *is_guard) {
    uint32_t n = atomic_load_explicit(&narenas, memory_order_acquire);
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (uint32_t i = 0; i < n; i++) {
        la_arena_t *a = &arenas[i];
        uintptr_t base = atomic_load_explicit(&a->base, memory_order_relaxed);
        if (!base || addr < base || addr >= base + (uintptr_t)a->nslots * a->slot_size) continue;
        uintptr_t si = (addr - base) / a->slot_size;
        uintptr_t off = (addr - base) % a->slot_size;
        *is_guard = off < page;
        return atomic_load_explicit(&a->owner[si], memory_order_relaxed);
    }
    *is_guard = 0;
    return 0;
}

static size_t fmt_u64(char *p, uint64_t v, int base) {
    char t[24];
    size_t n = 0;
    do {
        t[n++] = "0123456789abcdef"[v % (uint64_t)base];
        v /= (uint64_t)base;
    } while (v);
    for (size_t i = 0; i < n; i++) p[i] = t[n - 1 - i];
    return n;
}

/* Async-signal-safe: prints the overflow message and aborts. */
void la_stack_overflow_abort(uint64_t fiber_id, const char *how) {
    char buf[256];
    size_t n = 0;
    const char *a = "libasync: fiber stack overflow in fiber ";
    while (*a) buf[n++] = *a++;
    n += fmt_u64(buf + n, fiber_id, 10);
    buf[n++] = ' ';
    buf[n++] = '(';
    while (*how && n < sizeof buf - 64) buf[n++] = *how++;
    a = "; raise async_sched_config_t.stack_size or ASYNC_FIBER_STACK_KB)\n";
    while (*a) buf[n++] = *a++;
    ssize_t r = write(2, buf, n);
    (void)r;
    /* die of SIGABRT even if someone (Go) handles or blocks it */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(SIGABRT, &sa, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGABRT);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    abort();
}

size_t la_stackpool_stack_size(la_stackpool_t *p) { return p->stack_size; }
