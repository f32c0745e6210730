/* The handle table: see base.h. Allocation and release take a mutex (cold
 * paths); validation is lock-free. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "base.h"

#define LA_CHUNK_BITS 12
#define LA_CHUNK_SIZE (1u << LA_CHUNK_BITS)
#define LA_MAX_CHUNKS 4096u /* 16M live handles: LA_CHUNK_BITS + 12 = LA_IDX_BITS */
#define LA_GEN_LAST 0xFFFFFFFFu /* a slot that carried this generation is retired */
_Static_assert(LA_MAX_CHUNKS * LA_CHUNK_SIZE == 1u << LA_IDX_BITS, "slot index width");

static la_slot_t *_Atomic chunks[LA_MAX_CHUNKS];
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t *free_idx;
static size_t nfree, free_cap;
static uint32_t next_idx = 1;

/* Test hook: ASYNC_TEST_HANDLE_GEN=<n> makes every fresh slot start after
 * generation n (its first handle has generation n+1), so that tests reach
 * the end of a slot's generations without 2^32 cycles. Read once, under the
 * table lock, by the first allocation. */
static int gen_base_read;
static uint32_t gen_base;

static uint32_t fresh_gen(void) {
    if (!gen_base_read) {
        gen_base_read = 1;
        const char *e = getenv("ASYNC_TEST_HANDLE_GEN");
        if (e && *e) {
            unsigned long long v = strtoull(e, NULL, 0);
            gen_base = v >= LA_GEN_LAST ? LA_GEN_LAST - 1 : (uint32_t)v;
        }
    }
    return gen_base;
}

static la_slot_t *slot_of(uint32_t idx) {
    if (idx == 0 || idx >= LA_MAX_CHUNKS * LA_CHUNK_SIZE) return NULL;
    la_slot_t *c = atomic_load_explicit(&chunks[idx >> LA_CHUNK_BITS], memory_order_acquire);
    if (!c) return NULL;
    return &c[idx & (LA_CHUNK_SIZE - 1)];
}

/* The next handle of slot idx, published with obj. The slot has a
 * generation left (free-listed slots and reserved slots are checked). */
static uint64_t publish(uint32_t idx, int type, void *obj) {
    la_slot_t *s = slot_of(idx);
    s->gen++;
    __atomic_store_n(&s->obj, obj, __ATOMIC_RELEASE); /* see la_handle_peek */
    uint64_t h = ((uint64_t)s->gen << 32) | ((uint64_t)(type & 0xFF) << LA_IDX_BITS) | idx;
    atomic_store_explicit(&s->tag, h, memory_order_release);
    return h;
}

uint64_t la_handle_alloc(int type, void *obj) {
    pthread_mutex_lock(&table_mu);
    uint32_t idx;
    if (nfree > 0) {
        idx = free_idx[--nfree];
    } else {
        if (next_idx >= LA_MAX_CHUNKS * LA_CHUNK_SIZE) {
            pthread_mutex_unlock(&table_mu);
            return 0;
        }
        idx = next_idx;
        uint32_t ci = idx >> LA_CHUNK_BITS;
        if (!atomic_load_explicit(&chunks[ci], memory_order_relaxed)) {
            la_slot_t *c = calloc(LA_CHUNK_SIZE, sizeof(la_slot_t));
            if (!c) {
                pthread_mutex_unlock(&table_mu);
                return 0;
            }
            atomic_store_explicit(&chunks[ci], c, memory_order_release);
        }
        next_idx++;
        slot_of(idx)->gen = fresh_gen();
    }
    uint64_t h = publish(idx, type, obj);
    pthread_mutex_unlock(&table_mu);
    return h;
}

static int type_of(uint64_t h) { return (int)((h >> LA_IDX_BITS) & 0xFF); }

void *la_handle_get(uint64_t h, int type, la_slot_t **out) {
    if (type_of(h) != type) return NULL;
    la_slot_t *s = slot_of(la_handle_idx(h));
    if (!s) return NULL;
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&s->tag, memory_order_seq_cst) != h) {
        atomic_fetch_sub_explicit(&s->refs, 1, memory_order_release);
        return NULL;
    }
    *out = s;
    return s->obj;
}

void la_handle_put(la_slot_t *s) { atomic_fetch_sub_explicit(&s->refs, 1, memory_order_release); }

/* An object read with acquire was stored by the allocation of h itself (the
 * acquire of the tag orders it after that store) or by a later free or
 * allocation of the slot, which come after the tag left h: the second look
 * at the tag then fails. */
void *la_handle_peek(uint64_t h, int type) {
    if (type_of(h) != type) return NULL;
    la_slot_t *s = slot_of(la_handle_idx(h));
    if (!s || atomic_load_explicit(&s->tag, memory_order_acquire) != h) return NULL;
    void *obj = __atomic_load_n(&s->obj, __ATOMIC_ACQUIRE);
    if (atomic_load_explicit(&s->tag, memory_order_relaxed) != h) return NULL;
    return obj;
}

int la_handle_live(uint64_t h, int type) {
    if (type_of(h) != type) return 0;
    la_slot_t *s = slot_of(la_handle_idx(h));
    return s && atomic_load_explicit(&s->tag, memory_order_acquire) == h;
}

/* Invalidates h and waits for the readers of its slot to leave; 1 if h was
 * live. The slot stays reserved for the caller. */
static int retire(uint64_t h, int type, void **obj) {
    if (type_of(h) != type) return 0;
    la_slot_t *s = slot_of(la_handle_idx(h));
    if (!s) return 0;
    uint64_t expect = h;
    if (!atomic_compare_exchange_strong(&s->tag, &expect, 0)) return 0;
    /* Readers pin a slot only for a few instructions (they never block while
     * pinned), so this wait is short. */
    while (atomic_load_explicit(&s->refs, memory_order_acquire) != 0) sched_yield();
    *obj = s->obj;
    return 1;
}

void *la_handle_retire(uint64_t h, int type) {
    void *obj = NULL;
    retire(h, type, &obj);
    return obj;
}

/* A new handle in a slot the caller reserved with la_handle_retire (the
 * caller owns the slot, so gen needs no lock). A slot whose generations are
 * exhausted is retired for good and another one allocated. */
uint64_t la_handle_reuse(uint32_t idx, int type, void *obj) {
    if (slot_of(idx)->gen == LA_GEN_LAST) {
        /* On failure idx stays reserved: the caller's la_handle_release
         * drops it then. */
        uint64_t h = la_handle_alloc(type, obj);
        if (h) la_handle_release(idx);
        return h;
    }
    return publish(idx, type, obj);
}

void la_handle_release(uint32_t idx) {
    la_slot_t *s = slot_of(idx);
    if (!s) return;
    pthread_mutex_lock(&table_mu);
    __atomic_store_n(&s->obj, NULL, __ATOMIC_RELEASE);
    if (s->gen == LA_GEN_LAST) {
        /* Every generation was used: the slot is never handed out again, so
         * no stale handle of it can ever validate (one slot lost per 2^32
         * handles it carried). */
        pthread_mutex_unlock(&table_mu);
        return;
    }
    if (nfree == free_cap) {
        size_t ncap = free_cap ? free_cap * 2 : 1024;
        uint32_t *n = realloc(free_idx, ncap * sizeof *n);
        if (!n) {
            /* Leak the slot rather than fail the destroy. */
            pthread_mutex_unlock(&table_mu);
            return;
        }
        free_idx = n;
        free_cap = ncap;
    }
    free_idx[nfree++] = idx;
    pthread_mutex_unlock(&table_mu);
}

void *la_handle_free(uint64_t h, int type) {
    void *obj = NULL;
    if (retire(h, type, &obj)) la_handle_release(la_handle_idx(h));
    return obj;
}
