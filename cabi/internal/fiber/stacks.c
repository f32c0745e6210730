//go:build !windows

/* Fiber stacks: pooled slots carved out of large mmap(MAP_NORESERVE) arenas.
 *
 * A slot is one guard page followed by the usable stack (the stack grows
 * down, so the guard is at the low end). Guard modes:
 *   1 madvise(MADV_GUARD_INSTALL): no VMA split (Linux >= 6.13);
 *   2 mprotect(PROT_NONE): every guard is a VMA of its own and splits the
 *     arena's mapping (guard, stack, guard, stack...: two VMAs per slot, no
 *     sharing is possible), so only a budget derived from vm.max_map_count
 *     (mprotect_budget) of them process-wide;
 *   3 canary (opt-in only): magic words in the lowest 256 bytes of the stack
 *     and at its top, checked when a fiber switches out, before it is resumed
 *     and at exit. Nothing stops a write; see include/async.h for what it
 *     misses.
 * Below every arena lies a guard of LA_BELOW_ARENA bytes (MADV_GUARD_INSTALL
 * where the kernel has it, else PROT_NONE), so that no overflow of the
 * arena's lowest stack (a frame that jumps its guard page, or in canary mode
 * any overflow past the slot's spare page) writes into whatever is mapped
 * under the arena, such as a thread's stack with its control block (glibc
 * keeps it at the top; once its rseq area is overwritten the kernel kills
 * the process with SIGSEGV when that thread next wakes or takes a signal,
 * before any handler runs). It faults in the guard instead, and the fault
 * handler reports it (a frame larger than the guard can still jump it).
 * Auto (0) tries 1, then 2; when the mprotect budget is spent it fails with
 * ASYNC_E_NOMEM: it never falls back to 3, which cannot promise that an
 * overflow does not silently corrupt another fiber's stack.
 *
 * Under valgrind (RUNNING_ON_VALGRIND) mode 1 is unavailable (valgrind does
 * not know MADV_GUARD_INSTALL and faults on the guard itself), and every
 * slot is registered with VALGRIND_STACK_REGISTER when first handed out.
 *
 * Arenas are listed in a global table that the SIGSEGV handler reads without
 * locks. A freed arena's table entry is reused by a later arena (else a
 * process would run out of entries after LA_MAX_ARENAS arenas in its life);
 * readers stay safe because:
 *   - every entry has a sequence word (seq): odd while the entry is not
 *     published (freed, or being filled), even while it is; a reader
 *     copies the fields between two loads of seq and skips the entry unless
 *     both loads are the same even value (a seqlock), so it never combines
 *     base, nslots and owner of two different arenas;
 *   - owner arrays are never freed while the process lives: a freed entry
 *     keeps its array (owner_cap entries) for the next arena of that entry,
 *     and an array too small for it is kept on a list (retired) and
 *     replaced by one of the next power of two, so a reader that copied an
 *     older owner pointer still reads memory it may read, within the nslots
 *     it copied with it. Capacities only double, so what stays allocated is
 *     bounded by the entries in use at the peak, not by how many arenas
 *     came and went.
 * Entries are claimed and freed under arenas_mu; free entries are kept on a
 * list (free_head, linked through next_free). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fiber_int.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define LA_VALGRIND 1
#endif
#endif
#ifndef LA_VALGRIND
#define RUNNING_ON_VALGRIND 0
#define VALGRIND_STACK_REGISTER(lo, hi) 0u
#define VALGRIND_STACK_DEREGISTER(id) ((void)(id))
#endif

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif

#define LA_ARENA_BYTES (32u << 20)
/* The guard below every arena: as large as the window below a running
 * fiber's stack in which the fault handler counts a fault as that fiber's
 * overflow (LA_BELOW_STACK, signals.c). */
#define LA_BELOW_ARENA (256u * 1024u)
#define LA_MAX_ARENAS 65536u
/* vm.max_map_count VMAs minus this many left to the rest of the process
 * (Go heap, thread stacks, libraries, malloc arenas), halved: the default
 * 65530 gives 30000 guarded stacks. */
#define LA_MAP_RESERVE 5530
#define LA_VALGRIND_MAX_GUARDS 12000
#define LA_CANARY 0x6c6962617379636bULL
#define LA_CANARY_WORDS 32 /* the lowest 256 bytes of the stack */
#define LA_TOP_CANARY_WORDS 8 /* the highest 64 bytes of the slot (LA_STACK_TOP_RESERVE) */

typedef struct {
    _Atomic uint32_t seq;   /* odd: not published (see the top of the file) */
    _Atomic uintptr_t base; /* 0: unused or unmapped */
    _Atomic size_t slot_size; /* guard page + stack */
    _Atomic uint32_t nslots;
    _Atomic int mode;
    _Atomic(_Atomic uint64_t *) owner; /* fiber id per slot (0: free); never freed */
    uint32_t owner_cap;      /* entries of owner (arenas_mu) */
    uint32_t next_free;      /* free list link: index + 1, 0 ends (arenas_mu) */
    unsigned *vg_id;         /* valgrind stack id + 1 per slot (under valgrind) */
} la_arena_t;

/* an owner array replaced by a bigger one: kept, a reader may hold it */
typedef struct la_retired {
    struct la_retired *next;
    void *mem;
} la_retired_t;

static la_arena_t arenas[LA_MAX_ARENAS];
static _Atomic uint32_t narenas; /* entries ever used (the high-water mark) */
static pthread_mutex_t arenas_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t free_head; /* index + 1 of a free entry, 0: none (arenas_mu) */
static la_retired_t *retired; /* (arenas_mu) */

/* A consistent copy of a published entry, or 0 (async-signal-safe). The
 * entry is a seqlock without fences: the reader loads seq, the fields and
 * seq again, each load an acquire (the second look at seq stays after the
 * fields); a writer makes seq odd, stores the fields with release (a reader
 * that sees a new value sees the odd seq) and makes seq even with release. */
typedef struct {
    uintptr_t base;
    size_t slot_size;
    uint32_t nslots;
    int mode;
    _Atomic uint64_t *owner;
} la_arena_view_t;

static int arena_view(la_arena_t *a, la_arena_view_t *v) {
    uint32_t s1 = atomic_load_explicit(&a->seq, memory_order_acquire);
    if (s1 & 1u) return 0;
    v->base = atomic_load_explicit(&a->base, memory_order_acquire);
    v->slot_size = atomic_load_explicit(&a->slot_size, memory_order_acquire);
    v->nslots = atomic_load_explicit(&a->nslots, memory_order_acquire);
    v->mode = atomic_load_explicit(&a->mode, memory_order_acquire);
    v->owner = atomic_load_explicit(&a->owner, memory_order_acquire);
    if (atomic_load_explicit(&a->seq, memory_order_relaxed) != s1) return 0;
    return v->base != 0 && v->owner != NULL && v->slot_size != 0;
}

/* Starts rewriting an entry (arenas_mu held): readers skip it from here
 * (the fields are stored with release after it). */
static void arena_unpublish(la_arena_t *a) {
    uint32_t s = atomic_load_explicit(&a->seq, memory_order_relaxed);
    if (!(s & 1u)) atomic_store_explicit(&a->seq, s + 1u, memory_order_relaxed);
}

/* Publishes the entry's fields written since arena_unpublish (arenas_mu held). */
static void arena_publish(la_arena_t *a) {
    uint32_t s = atomic_load_explicit(&a->seq, memory_order_relaxed);
    atomic_store_explicit(&a->seq, s + 1u, memory_order_release);
}
static _Atomic int mprotect_guards;
#if defined(__linux__)
static _Atomic int madvise_guard_broken;
#else
static _Atomic int madvise_guard_broken = 1; /* MADV_GUARD_INSTALL is Linux's: mprotect guards */
#endif
static _Atomic int mprotect_budget_v = -1;

/* How many mprotect guards the process may have (slots, process-wide). */
static int mprotect_budget(void) {
    int b = atomic_load(&mprotect_budget_v);
    if (b >= 0) return b;
    long max = 65530;
    /* fopen, fscanf, fclose: cancellation points (a first spawn from a host
     * thread whose cancel is pending; see la_default_workers) */
    int cs = LA_CANCEL_KEPT;
    la_nocancel_enter(&cs);
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    if (f) {
        if (fscanf(f, "%ld", &max) != 1) max = 65530;
        fclose(f);
    }
    la_nocancel_leave(&cs);
    b = max > LA_MAP_RESERVE ? (int)((max - LA_MAP_RESERVE) / 2) : 0;
    if (b > (1 << 30)) b = 1 << 30;
    /* valgrind's own table of mappings (VG_N_SEGMENTS) ends far sooner:
     * valgrind 3.19 exits ("VG_N_SEGMENTS is too low") long before 100000
     * guards; 13104 were measured to work */
    if (RUNNING_ON_VALGRIND && b > LA_VALGRIND_MAX_GUARDS) b = LA_VALGRIND_MAX_GUARDS;
    const char *e = getenv("ASYNC_FIBER_MPROTECT_MAX"); /* tests: a smaller budget */
    if (e && *e) {
        long v = strtol(e, NULL, 10);
        if (v >= 0 && v < b) b = (int)v;
    }
    atomic_store(&mprotect_budget_v, b);
    return b;
}

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

/* An arena's memory: LA_BELOW_ARENA bytes (the guard below it, installed by
 * guard_arena), then `bytes` of slots; returns the first slot, or NULL. */
static char *map_arena(size_t bytes) {
    char *m = mmap(NULL, LA_BELOW_ARENA + bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return m == MAP_FAILED ? NULL : m + LA_BELOW_ARENA;
}

static void unmap_arena(char *mem, size_t bytes) { munmap(mem - LA_BELOW_ARENA, LA_BELOW_ARENA + bytes); }

/* The mprotect guards of an arena given back (mode: the arena's). */
static void unguard_arena(int mode, uint32_t nslots) {
    if (mode == LA_GUARD_MPROTECT) atomic_fetch_sub(&mprotect_guards, (int)nslots);
}

/* Makes the LA_BELOW_ARENA bytes below mem a guard: MADV_GUARD_INSTALL where
 * the kernel has it (no mapping of its own), else PROT_NONE (in mode 2 one
 * mapping with the lowest slot's guard page). 0, or -1. */
static int guard_below(char *mem, int mode) {
    char *g = mem - LA_BELOW_ARENA;
    if (mode != LA_GUARD_MPROTECT && !RUNNING_ON_VALGRIND && !atomic_load(&madvise_guard_broken)) {
        if (madvise(g, LA_BELOW_ARENA, MADV_GUARD_INSTALL) == 0) return 0;
        atomic_store(&madvise_guard_broken, 1);
    }
    return mprotect(g, LA_BELOW_ARENA, PROT_NONE);
}

/* Guards the nslots slots at mem and the memory below them as p's mode
 * asks; *mode: the mode they got. 0 or an ASYNC_E_ code (the mprotect
 * budget taken back then; the caller unmaps). */
static int guard_arena(la_stackpool_t *p, char *mem, uint32_t nslots, int *mode_out) {
    int mode = p->want_mode;
    if (mode == LA_GUARD_MADVISE && RUNNING_ON_VALGRIND) return ASYNC_E_NOTSUP;
    if (mode == LA_GUARD_AUTO)
        mode = atomic_load(&madvise_guard_broken) || RUNNING_ON_VALGRIND ? LA_GUARD_MPROTECT : LA_GUARD_MADVISE;
    if (mode == LA_GUARD_MADVISE) {
        for (uint32_t i = 0; i < nslots; i++) {
            if (madvise(mem + (size_t)i * p->slot_size, p->page, MADV_GUARD_INSTALL) != 0) {
                if (p->want_mode == LA_GUARD_MADVISE) return ASYNC_E_NOTSUP;
                atomic_store(&madvise_guard_broken, 1);
                mode = LA_GUARD_MPROTECT;
                break;
            }
        }
    }
    if (mode == LA_GUARD_MPROTECT) {
        /* Past the budget: no more guarded stacks. Auto mode does not fall
         * back to canaries (opt-in only, guard_mode 3). */
        if (atomic_fetch_add(&mprotect_guards, (int)nslots) + (int)nslots > mprotect_budget()) {
            unguard_arena(mode, nslots);
            return ASYNC_E_NOMEM;
        }
        for (uint32_t i = 0; i < nslots; i++) {
            if (mprotect(mem + (size_t)i * p->slot_size, p->page, PROT_NONE) != 0) {
                unguard_arena(mode, nslots);
                return ASYNC_E_NOMEM;
            }
        }
    }
    if (guard_below(mem, mode) != 0) {
        unguard_arena(mode, nslots);
        return ASYNC_E_NOMEM;
    }
    *mode_out = mode;
    return 0;
}

/* Lists the arena at mem in the global table (a freed entry first, its
 * owner array with it, else a new one); its index, or -1 (ASYNC_E_NOMEM). */
static int64_t publish_arena(la_stackpool_t *p, char *mem, uint32_t nslots, int mode, unsigned *vg_id) {
    pthread_mutex_lock(&arenas_mu);
    uint32_t ai;
    int reused = free_head != 0;
    if (reused) {
        ai = free_head - 1u;
    } else {
        ai = atomic_load_explicit(&narenas, memory_order_relaxed);
        if (ai >= LA_MAX_ARENAS) {
            pthread_mutex_unlock(&arenas_mu);
            return -1;
        }
    }
    la_arena_t *a = &arenas[ai];
    _Atomic uint64_t *owner = atomic_load_explicit(&a->owner, memory_order_relaxed);
    if (!owner || a->owner_cap < nslots) {
        uint32_t cap = 8;
        while (cap < nslots) cap *= 2;
        owner = calloc(cap, sizeof *owner);
        la_retired_t *old = a->owner_cap ? malloc(sizeof *old) : NULL;
        if (!owner || (a->owner_cap && !old)) {
            pthread_mutex_unlock(&arenas_mu);
            free(owner);
            free(old);
            return -1;
        }
        if (old) {
            old->mem = (void *)atomic_load_explicit(&a->owner, memory_order_relaxed);
            old->next = retired;
            retired = old;
        }
        a->owner_cap = cap;
    } else {
        for (uint32_t i = 0; i < nslots; i++) atomic_store_explicit(&owner[i], 0, memory_order_relaxed);
    }
    if (reused) free_head = a->next_free;
    a->next_free = 0;
    arena_unpublish(a);
    atomic_store_explicit(&a->slot_size, p->slot_size, memory_order_release);
    atomic_store_explicit(&a->nslots, nslots, memory_order_release);
    atomic_store_explicit(&a->mode, mode, memory_order_release);
    atomic_store_explicit(&a->owner, owner, memory_order_release);
    a->vg_id = vg_id;
    atomic_store_explicit(&a->base, (uintptr_t)mem, memory_order_release);
    arena_publish(a);
    if (!reused) atomic_store_explicit(&narenas, ai + 1, memory_order_release);
    pthread_mutex_unlock(&arenas_mu);
    return ai;
}

/* Adds an arena to p (p->mu held). */
static int add_arena(la_stackpool_t *p) {
    uint32_t nslots = (uint32_t)(LA_ARENA_BYTES / p->slot_size);
    if (nslots < 8) nslots = 8;
    size_t bytes = (size_t)nslots * p->slot_size;
    char *mem = map_arena(bytes);
    if (!mem) return ASYNC_E_NOMEM;
    int mode = 0;
    int rc = guard_arena(p, mem, nslots, &mode);
    if (rc) {
        unmap_arena(mem, bytes);
        return rc;
    }
    unsigned *vg_id = RUNNING_ON_VALGRIND ? calloc(nslots, sizeof *vg_id) : NULL;
    int64_t ai = -1;
    if ((RUNNING_ON_VALGRIND && !vg_id) || grow_list(&p->free_a, &p->free_s, &p->cap, p->total + nslots) != 0 ||
        grow_list(&p->mine, NULL, &p->capmine, p->nmine + 1) != 0 ||
        (ai = publish_arena(p, mem, nslots, mode, vg_id)) < 0) {
        free(vg_id);
        unmap_arena(mem, bytes);
        unguard_arena(mode, nslots);
        return ASYNC_E_NOMEM;
    }
    p->mine[p->nmine++] = (uint32_t)ai;
    p->total += nslots;
    /* Hand out low slots first. */
    for (uint32_t i = nslots; i-- > 0;) {
        p->free_a[p->nfree] = (uint32_t)ai;
        p->free_s[p->nfree] = i;
        p->nfree++;
    }
    p->last_mode = mode;
    return 0;
}

/* The canaries lie in stack memory that an overflowing frame may have
 * covered with its ASan redzones: they are read and written raw. */
#if defined(__clang__) || defined(__GNUC__)
#define LA_RAW_STACK_ACCESS __attribute__((no_sanitize_address, no_sanitize_thread))
#else
#define LA_RAW_STACK_ACCESS
#endif

LA_RAW_STACK_ACCESS static void write_canaries(char *base, uintptr_t page, size_t slot_size) {
    for (int i = 0; i < LA_CANARY_WORDS; i++) ((uint64_t *)(base + page))[i] = LA_CANARY;
    for (int i = 1; i <= LA_TOP_CANARY_WORDS; i++) ((uint64_t *)(base + slot_size))[-i] = LA_CANARY;
}

/* Fills out (p->mu held, p->nfree > 0). */
static void pop_slot(la_stackpool_t *p, la_stack_t *out) {
    p->nfree--;
    uint32_t ai = p->free_a[p->nfree], si = p->free_s[p->nfree];
    la_arena_t *a = &arenas[ai];
    out->arena = ai;
    out->slot = si;
    out->base = (char *)atomic_load_explicit(&a->base, memory_order_relaxed) + (size_t)si * p->slot_size;
    out->size = p->stack_size;
    if (a->vg_id && !a->vg_id[si])
        a->vg_id[si] = 1u + VALGRIND_STACK_REGISTER(out->base + p->page, out->base + p->slot_size);
    if (atomic_load_explicit(&a->mode, memory_order_relaxed) == LA_GUARD_CANARY)
        write_canaries(out->base, p->page, p->slot_size);
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
    _Atomic uint64_t *owner = atomic_load_explicit(&arenas[st->arena].owner, memory_order_relaxed);
    atomic_store_explicit(&owner[st->slot], fiber_id, memory_order_relaxed);
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

LA_RAW_STACK_ACCESS static int canary_bottom_ok(const char *base, uintptr_t page) {
    const uint64_t *w = (const uint64_t *)(base + page);
    uint64_t bad = 0;
    for (int i = 0; i < LA_CANARY_WORDS; i++) bad |= w[i] ^ LA_CANARY;
    return bad == 0;
}

LA_RAW_STACK_ACCESS static int canary_top_ok(const char *base, size_t slot_size) {
    const uint64_t *w = (const uint64_t *)(base + slot_size);
    uint64_t bad = 0;
    for (int i = 1; i <= LA_TOP_CANARY_WORDS; i++) bad |= w[-i] ^ LA_CANARY;
    return bad == 0;
}

int la_stack_canary_ok(la_stackpool_t *p, const la_stack_t *st) {
    if (atomic_load_explicit(&arenas[st->arena].mode, memory_order_relaxed) != LA_GUARD_CANARY) return 1;
    return canary_bottom_ok(st->base, p->page);
}

void la_stack_check(la_stackpool_t *p, const la_stack_t *st, uint64_t id) {
    if (atomic_load_explicit(&arenas[st->arena].mode, memory_order_relaxed) != LA_GUARD_CANARY) return;
    if (!canary_bottom_ok(st->base, p->page)) la_stack_overflow_abort(id, "canary overwritten");
    if (!canary_top_ok(st->base, p->slot_size)) {
        /* the fiber in the slot above overflowed down into this stack: name
         * it if its own canary shows it, else this victim */
        uint64_t top;
        uint64_t culprit = la_stack_canary_scan(&top);
        if (culprit) la_stack_overflow_abort(culprit, "canary overwritten; it also overwrote another fiber's stack");
        la_stack_report_abort(": the top of the stack of fiber ", id,
                              "canary overwritten by an overflow of the stack above it, whose frame skipped "
                              "that fiber's own canary");
    }
}

/* Async-signal-safe: a live fiber of a canary-mode arena whose lowest
 * canary is broken (its stack overflowed), or 0; *top_broken: a live fiber
 * whose top canary is broken (the stack above it overflowed into it). */
uint64_t la_stack_canary_scan(uint64_t *top_broken) {
    uint32_t n = atomic_load_explicit(&narenas, memory_order_acquire);
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    *top_broken = 0;
    for (uint32_t i = 0; i < n; i++) {
        la_arena_view_t v;
        if (!arena_view(&arenas[i], &v) || v.mode != LA_GUARD_CANARY) continue;
        for (uint32_t si = 0; si < v.nslots; si++) {
            uint64_t id = atomic_load_explicit(&v.owner[si], memory_order_relaxed);
            if (!id) continue;
            const char *sb = (const char *)v.base + (size_t)si * v.slot_size;
            if (!canary_bottom_ok(sb, page)) return id;
            if (!*top_broken && !canary_top_ok(sb, v.slot_size)) *top_broken = id;
        }
    }
    return 0;
}

void la_stackpool_free(la_stackpool_t *p) {
    if (!p) return;
    pthread_mutex_lock(&arenas_mu);
    for (size_t i = 0; i < p->nmine; i++) {
        la_arena_t *a = &arenas[p->mine[i]];
        uint32_t nslots = atomic_load_explicit(&a->nslots, memory_order_relaxed);
        size_t slot_size = atomic_load_explicit(&a->slot_size, memory_order_relaxed);
        /* readers skip the entry before its memory goes */
        arena_unpublish(a);
        uintptr_t base = atomic_exchange(&a->base, 0);
        /* a reader that copied the entry just before skips free slots: no
         * canary scan of a stack being unmapped, unless it read the owner
         * already (see the top of the file) */
        _Atomic uint64_t *owner = atomic_load_explicit(&a->owner, memory_order_relaxed);
        for (uint32_t si = 0; si < nslots; si++) atomic_store_explicit(&owner[si], 0, memory_order_relaxed);
        if (a->vg_id)
            for (uint32_t si = 0; si < nslots; si++)
                if (a->vg_id[si]) VALGRIND_STACK_DEREGISTER(a->vg_id[si] - 1u);
        free(a->vg_id);
        a->vg_id = NULL;
        unmap_arena((char *)base, (size_t)nslots * slot_size);
        unguard_arena(atomic_load_explicit(&a->mode, memory_order_relaxed), nslots);
        /* a->owner stays allocated (a signal handler may be reading it) and
         * goes with the entry to the next arena that takes it */
        a->next_free = free_head;
        free_head = p->mine[i] + 1u;
    }
    pthread_mutex_unlock(&arenas_mu);
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
        la_arena_view_t v;
        if (!arena_view(&arenas[i], &v)) continue;
        if (addr < v.base || addr >= v.base + (uintptr_t)v.nslots * v.slot_size) continue;
        uintptr_t si = (addr - v.base) / v.slot_size;
        uintptr_t off = (addr - v.base) % v.slot_size;
        *is_guard = off < page;
        return atomic_load_explicit(&v.owner[si], memory_order_relaxed);
    }
    *is_guard = 0;
    return 0;
}

void la_stack_report_abort(const char *what, uint64_t fiber_id, const char *how) {
    char buf[512];
    la_stack_report_format(buf, sizeof buf, what, fiber_id, how);
    /* through the log hook: the default writes "libasync: " and this */
    la_log_str(ASYNC_LOG_FATAL, buf);
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
