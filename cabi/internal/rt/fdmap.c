/* The fd map of a runtime: see rt.h. One writer at a time (Go holds the
 * runtime's registration lock), one reader (the thread in async_runtime_wait);
 * a per-entry sequence lock lets the reader see each entry whole. */
#include <stdlib.h>

#include "rt.h"

static la_fdent_t *entry(la_rtc_t *r, int fd, int create) {
    if (fd < 0 || fd >= LA_FDMAP_CHUNK * LA_FDMAP_CHUNKS) return NULL;
    la_fdent_t *_Atomic *cp = &r->fdmap.chunk[fd / LA_FDMAP_CHUNK];
    la_fdent_t *c = atomic_load_explicit(cp, memory_order_acquire);
    if (!c && create) {
        c = calloc(LA_FDMAP_CHUNK, sizeof *c);
        if (!c) {
            atomic_store(&r->fdmap.broken, 1); /* Go translates everything from now on */
            return NULL;
        }
        atomic_store_explicit(cp, c, memory_order_release);
    }
    return c ? &c[fd % LA_FDMAP_CHUNK] : NULL;
}

static void write_entry(la_fdent_t *e, uint32_t live, int32_t id, uintptr_t ctx, uint64_t seq) {
    atomic_fetch_add_explicit(&e->ver, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&e->live, live, memory_order_relaxed);
    atomic_store_explicit(&e->id, id, memory_order_relaxed);
    atomic_store_explicit(&e->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&e->seq, seq, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->ver, 1, memory_order_release);
}

void la_fdmap_set(la_rtc_t *r, int fd, int32_t id, uintptr_t ctx, uint64_t seq) {
    la_fdent_t *e = entry(r, fd, 1);
    if (e) write_entry(e, 1, id, ctx, seq);
}

void la_fdmap_del(la_rtc_t *r, int fd, uint64_t seq) {
    la_fdent_t *e = entry(r, fd, 0);
    if (e) write_entry(e, 0, 0, 0, seq);
}

int la_fdmap_get(la_rtc_t *r, int fd, int32_t *id, uintptr_t *ctx, uint64_t *seq) {
    if (atomic_load(&r->fdmap.broken)) return 0;
    la_fdent_t *e = entry(r, fd, 0);
    if (!e) return 0;
    for (int tries = 0; tries < 4; tries++) {
        uint32_t v1 = atomic_load_explicit(&e->ver, memory_order_acquire);
        if (v1 & 1) continue;
        uint32_t live = atomic_load_explicit(&e->live, memory_order_relaxed);
        int32_t i = atomic_load_explicit(&e->id, memory_order_relaxed);
        uintptr_t c = atomic_load_explicit(&e->ctx, memory_order_relaxed);
        uint64_t s = atomic_load_explicit(&e->seq, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&e->ver, memory_order_relaxed) != v1) continue;
        if (!live) return 0;
        *id = i, *ctx = c, *seq = s;
        return 1;
    }
    return 0; /* being written: let Go decide */
}

void la_fdmap_reset(la_rtc_t *r) {
    for (int i = 0; i < LA_FDMAP_CHUNKS; i++) free(atomic_exchange(&r->fdmap.chunk[i], NULL));
    atomic_store(&r->fdmap.broken, 0);
}
