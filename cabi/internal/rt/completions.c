/* The C side of a runtime: its doorbell, its sleep flag, and the lock-free
 * completion path used by async_runtime_post_completion.
 *
 * Posting from C must not cross into Go: a crossing costs 50-100 ns, more
 * than the whole operation. So each posting thread owns one single-producer
 * queue per runtime (a chain of blocks), found through a small thread-local
 * cache. A post writes one entry and publishes it with one store; the only
 * shared write is the rare doorbell ring when the loop may be asleep. The
 * loop thread (Go, in Runtime.Wait) drains every producer's queue with one
 * call (la_rtc_take), round-robin across producers, FIFO within each.
 *
 * Lifetimes: a producer record is referenced by its thread and by its
 * runtime's list; whichever lets go last frees it (a thread that exits
 * orphans its records, and the loop frees them once drained). la_rtc_t
 * records are never freed, only recycled, so a late reader of a stale one
 * reads valid memory; anything that acts on a runtime first pins its handle.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rt.h"
#if defined(_WIN32)
#include "sys_windows.h"
#endif

#define LA_CB 254 /* entries per block: a block is 4 KiB on 64-bit */

typedef struct la_cblock {
    struct la_cblock *_Atomic next;
    _Atomic uint32_t count; /* entries published */
    uint32_t pad;
    la_pair_t e[LA_CB];
} la_cblock_t;

struct la_cprod {
    /* owner thread */
    la_cblock_t *tblk;
    uint32_t tcount;
    uint64_t h;
    la_rtc_t *rt;
    struct la_cprod *tnext; /* the owner thread's list */
    _Atomic int dead;       /* the runtime was closed */
    _Atomic int orphan;     /* the owner thread exited */
    _Atomic int refs;       /* owner thread + runtime list */
    la_cblock_t *_Atomic spare; /* a drained block handed back for reuse */
    /* loop thread (under rt->mu) */
    la_cblock_t *hblk;
    uint32_t hidx;
    struct la_cprod *next;
};

#define LA_PCACHE 4
static __thread la_cprod_t *pcache[LA_PCACHE];
static __thread la_cprod_t *owned; /* every record this thread created */
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static pthread_mutex_t rtc_free_mu = PTHREAD_MUTEX_INITIALIZER;
static la_rtc_t *rtc_free;

static void prod_unref(la_cprod_t *p) {
    if (atomic_fetch_sub(&p->refs, 1) != 1) return;
    free(atomic_load(&p->spare));
    la_cblock_t *b = p->hblk;
    while (b) {
        la_cblock_t *n = atomic_load(&b->next);
        free(b);
        b = n;
    }
    free(p);
}

static void on_thread_exit(void *unused) {
    (void)unused;
    la_cprod_t *p = owned;
    owned = NULL;
    for (int i = 0; i < LA_PCACHE; i++) pcache[i] = NULL;
    while (p) {
        la_cprod_t *n = p->tnext;
        atomic_store(&p->orphan, 1);
        prod_unref(p);
        p = n;
    }
}

static void make_exit_key(void) { pthread_key_create(&exit_key, on_thread_exit); }

la_rtc_t *la_rtc_new(int fd, int kind) {
    pthread_mutex_lock(&rtc_free_mu);
    la_rtc_t *r = rtc_free;
    if (r) rtc_free = r->free_next;
    pthread_mutex_unlock(&rtc_free_mu);
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return NULL;
        pthread_mutex_init(&r->mu, NULL);
    }
    r->bell.fd = fd;
    r->bell.kind = kind;
    memset(&r->sh, 0, sizeof r->sh);
    atomic_store(&r->sh.gowork, 1); /* nothing published yet: Go first */
    atomic_store(&r->waiting, 0);
    atomic_store(&r->closed, 0);
    r->prods = r->cursor = NULL;
    r->free_next = NULL;
    return r;
}

/* Closes the runtime's C side: producers are told, unlinked and released.
 * Call after la_handle_free (no new producer can register then). */
void la_rtc_close(la_rtc_t *r) {
    pthread_mutex_lock(&r->mu);
    atomic_store(&r->closed, 1);
    la_cprod_t *p = r->prods;
    r->prods = r->cursor = NULL;
    pthread_mutex_unlock(&r->mu);
    while (p) {
        la_cprod_t *n = p->next;
        atomic_store(&p->dead, 1);
        prod_unref(p);
        p = n;
    }
}

void la_rtc_recycle(la_rtc_t *r) {
    pthread_mutex_lock(&rtc_free_mu);
    r->free_next = rtc_free;
    rtc_free = r;
    pthread_mutex_unlock(&rtc_free_mu);
}

static la_cblock_t *new_block(void) {
    la_cblock_t *b = malloc(sizeof *b);
    if (!b) return NULL;
    atomic_store_explicit(&b->next, NULL, memory_order_relaxed);
    atomic_store_explicit(&b->count, 0, memory_order_relaxed);
    return b;
}

/* Drops this thread's records of closed runtimes. */
static void prune_owned(void) {
    la_cprod_t **pp = &owned;
    while (*pp) {
        la_cprod_t *p = *pp;
        if (atomic_load(&p->dead)) {
            *pp = p->tnext;
            for (int i = 0; i < LA_PCACHE; i++)
                if (pcache[i] == p) pcache[i] = NULL;
            prod_unref(p);
        } else {
            pp = &p->tnext;
        }
    }
}

static __attribute__((noinline)) la_cprod_t *producer_slow(uint64_t h) {
    pthread_once(&exit_once, make_exit_key);
    prune_owned();
    for (la_cprod_t *p = owned; p; p = p->tnext) {
        if (p->h == h) {
            pcache[(h ^ (h >> 40)) & (LA_PCACHE - 1)] = p;
            return p;
        }
    }
    la_slot_t *slot;
    la_rtc_t *r = la_handle_get(h, LA_T_RUNTIME, &slot);
    if (!r) return NULL;
    la_cprod_t *p = calloc(1, sizeof *p);
    la_cblock_t *b = p ? new_block() : NULL;
    if (!b) {
        free(p);
        la_handle_put(slot);
        errno = ENOMEM;
        return NULL;
    }
    p->tblk = p->hblk = b;
    p->h = h;
    p->rt = r;
    atomic_store(&p->refs, 2);
    pthread_mutex_lock(&r->mu);
    p->next = r->prods;
    r->prods = p;
    pthread_mutex_unlock(&r->mu);
    la_handle_put(slot);
    p->tnext = owned;
    owned = p;
    pthread_setspecific(exit_key, (void *)1);
    pcache[(h ^ (h >> 40)) & (LA_PCACHE - 1)] = p;
    return p;
}

int la_rt_post(uint64_t h, uintptr_t key, uintptr_t data) {
    la_cprod_t *p = pcache[(h ^ (h >> 40)) & (LA_PCACHE - 1)];
    if (__builtin_expect(!p || p->h != h || atomic_load_explicit(&p->dead, memory_order_acquire), 0)) {
        errno = 0;
        p = producer_slow(h);
        if (!p) return errno == ENOMEM ? ASYNC_E_NOMEM : ASYNC_E_BADHANDLE;
    }
    la_cblock_t *b = p->tblk;
    uint32_t c = p->tcount;
    if (__builtin_expect(c == LA_CB, 0)) {
        /* Reuse the block the loop handed back, if any: no malloc in a
         * steady stream. */
        la_cblock_t *nb = atomic_exchange_explicit(&p->spare, NULL, memory_order_acquire);
        if (nb) {
            atomic_store_explicit(&nb->next, NULL, memory_order_relaxed);
            atomic_store_explicit(&nb->count, 0, memory_order_relaxed);
        } else if (!(nb = new_block())) {
            return ASYNC_E_NOMEM;
        }
        atomic_store_explicit(&b->next, nb, memory_order_release);
        p->tblk = b = nb;
        c = 0;
    }
    b->e[c].key = key;
    b->e[c].data = data;
    p->tcount = c + 1;
    /* Publish, then look at the sleep flag: with the loop's "raise the flag,
     * then look for work" this is a Dekker pair (both sequentially
     * consistent), so either the loop sees the entry or we see the flag. */
    atomic_store_explicit(&b->count, c + 1, memory_order_seq_cst);
    la_rtc_t *r = p->rt;
    if (__builtin_expect(atomic_load_explicit(&r->sh.sleeping, memory_order_seq_cst) != 0, 0)) {
        /* Pin the handle first: r may be recycled once its runtime is gone,
         * and its flag then belongs to another runtime. */
        la_slot_t *slot;
        la_rtc_t *pr = la_handle_get(h, LA_T_RUNTIME, &slot);
        if (pr) {
            int32_t one = 1;
            if (atomic_compare_exchange_strong(&pr->sh.sleeping, &one, 0)) {
                int saved = errno;
#if defined(_WIN32)
                /* The doorbell is an I/O completion port, not a descriptor. */
                if (pr->bell.kind == LA_DOORBELL_IOCP) la_win_ring(pr->bell.fd);
#else
                uint64_t v = 1;
                char ch = 'r';
                ssize_t w;
                do w = pr->bell.kind == LA_DOORBELL_EVENTFD ? write(pr->bell.fd, &v, sizeof v)
                                                            : write(pr->bell.fd, &ch, 1);
                while (w < 0 && errno == EINTR);
#endif
                errno = saved;
            }
            la_handle_put(slot);
        }
    }
    return 0;
}

/* The shared state and the wait flag for Go, which accesses them atomically. */
la_shared_t *la_rtc_shared(la_rtc_t *r) { return &r->sh; }
int32_t *la_rtc_wait_flag(la_rtc_t *r) { return (int32_t *)&r->waiting; }

/* 1 if some producer has entries not taken yet. Loop thread only. */
int la_rtc_pending(la_rtc_t *r) {
    int any = 0;
    pthread_mutex_lock(&r->mu);
    for (la_cprod_t *p = r->prods; p && !any; p = p->next) {
        la_cblock_t *b = p->hblk;
        if (p->hidx < atomic_load_explicit(&b->count, memory_order_seq_cst) ||
            (p->hidx == LA_CB && atomic_load_explicit(&b->next, memory_order_acquire)))
            any = 1;
    }
    pthread_mutex_unlock(&r->mu);
    return any;
}

/* Moves up to max entries into out (pairs) or ev (completion events),
 * round-robin over producers starting after the one served first last time;
 * frees drained blocks and drained orphans. Loop thread only. */
static inline int take(la_rtc_t *r, la_pair_t *out, io_event_t *ev, int max) {
    int n = 0;
    pthread_mutex_lock(&r->mu);
    la_cprod_t *start = r->cursor ? r->cursor : r->prods;
    la_cprod_t *p = start;
    if (p) {
        do {
            for (;;) {
                la_cblock_t *b = p->hblk;
                uint32_t cnt = atomic_load_explicit(&b->count, memory_order_acquire);
                if (ev) {
                    while (p->hidx < cnt && n < max) {
                        const la_pair_t *e = &b->e[p->hidx++];
                        io_event_t *o = &ev[n++];
                        o->fd = -1;
                        o->event_type = ASYNC_EVENT_COMPLETION;
                        o->completion_key = e->key;
                        o->data = e->data;
                        o->context = NULL;
                    }
                } else {
                    while (p->hidx < cnt && n < max) out[n++] = b->e[p->hidx++];
                }
                if (n == max || p->hidx < LA_CB) break;
                la_cblock_t *nb = atomic_load_explicit(&b->next, memory_order_acquire);
                if (!nb) break;
                p->hblk = nb;
                p->hidx = 0;
                la_cblock_t *old = atomic_exchange_explicit(&p->spare, b, memory_order_release);
                free(old);
            }
            p = p->next ? p->next : r->prods;
        } while (n < max && p != start);
        r->cursor = p;
    }
    /* Free orphans that are drained (their threads are gone). */
    la_cprod_t **pp = &r->prods;
    while (*pp) {
        la_cprod_t *q = *pp;
        if (atomic_load(&q->orphan) && q->hidx == atomic_load(&q->hblk->count) && !atomic_load(&q->hblk->next)) {
            *pp = q->next;
            if (r->cursor == q) r->cursor = NULL;
            prod_unref(q);
        } else {
            pp = &q->next;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

int la_rtc_take(la_rtc_t *r, la_pair_t *out, int max) { return take(r, out, NULL, max); }

int la_rtc_take_events(la_rtc_t *r, io_event_t *out, int max) { return take(r, NULL, out, max); }
