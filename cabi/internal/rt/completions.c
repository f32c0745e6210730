/* The C side of a runtime: its doorbell, its sleep flag, and the lock-free
 * completion path used by async_runtime_post_completion.
 *
 * Posting from C must not cross into Go: a crossing costs 50-100 ns, more
 * than the whole operation. So a post writes one entry into a block owned by
 * its thread (found through a small thread-local cache) and links it onto the
 * runtime's queue with one compare-and-swap; the only other shared write is
 * the rare doorbell ring when the loop may be asleep.
 *
 * Order. The queue is one lock-free stack of runs per runtime (struct la_postq, top).
 * A run is a head slot followed by 1..LA_RUNMAX entries of one producer,
 * contiguous in its block; a tagged pointer (head address | entries - 1)
 * names it. A post either pushes a new run holding its entry, or, when its
 * own run is still on top, grows that run by one with a compare-and-swap of
 * top from (run | n-1) to (run | n). Either way one successful CAS on top
 * claims the entry's place and publishes it. The successful CASes on top
 * form one total order (its modification order) that contains
 * happens-before: if post A happens before post B (program order of a
 * thread, of a fiber that moved to another worker in between, or any
 * synchronisation such as a mutex or a semaphore between them), A's CAS
 * comes first. A run is sealed once anything else is pushed above it (the
 * pusher keeps its tagged pointer, count included, as the link) or the loop
 * takes it. The loop takes the whole stack with one exchange, reverses the
 * runs and delivers oldest first; what does not fit in max_events waits in
 * its private list, which is older than anything still on the stack. There
 * is no gap: an entry is either on the stack, complete, or not ordered yet,
 * so a poster preempted anywhere never holds back other posts and never
 * makes the loop spin or sleep on it.
 *
 * Memory. Entries (16 bytes) live in 4 KiB blocks of their producer record
 * (one per thread and runtime); a run adds one head slot. A producer's runs
 * are delivered in its program order, so when the loop meets a producer's
 * run in a new block, the block before is entirely delivered: it is handed
 * back as the producer's spare (a steady stream allocates nothing). A post
 * writes only its own slots and `top`, never another thread's memory, so a
 * late post into a closed runtime touches memory that its record keeps
 * alive.
 *
 * Lifetimes: a struct la_postq is referenced by its runtime (until la_rtc_recycle)
 * and by every producer record whose thread still holds it; the last one
 * frees it with every record and block left. A thread that exits orphans its
 * records; the loop frees an orphan once all its entries are delivered.
 * la_rtc_t records are never freed, only recycled, so a late reader of a
 * stale one reads valid memory; anything that acts on a runtime first pins
 * its handle. A record points at its struct la_postq, never at a recycled la_rtc_t's
 * queue, so a late post can never land in another runtime.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rt.h"
#if defined(_WIN32)
#include "sys_windows.h"
#endif

/* A slot is an entry {key, data}, or a run's head {link, block}: link is
 * the tagged pointer of the next run (older on the stack, newer in the
 * loop's list; 0 at the end). */
typedef struct {
    uintptr_t a, b;
} la_cslot_t;
#define LA_TAG ((uintptr_t)sizeof(la_cslot_t) - 1) /* a run pointer's low bits: entries - 1 */
#define LA_RUNMAX ((uint32_t)LA_TAG + 1)
#define LA_RUN(t) ((la_cslot_t *)((t) & ~LA_TAG))
#define LA_RUNLEN(t) ((uint32_t)((t)&LA_TAG) + 1)
#define LA_CB ((4096 - 4 * sizeof(void *)) / sizeof(la_cslot_t)) /* slots per 4 KiB block */
/* malloc's alignment leaves the tag bits of a slot's address free. darwin's
 * malloc returns 16-byte aligned blocks on every architecture, while its
 * arm64 max_align_t is 8 (long double is double there). */
#if defined(__APPLE__)
_Static_assert(sizeof(la_cslot_t) <= 16, "slot alignment");
#else
_Static_assert(sizeof(la_cslot_t) <= _Alignof(max_align_t), "slot alignment");
#endif

typedef struct la_cblock {
    la_cprod_t *owner;
    struct la_cblock *fnext; /* postq_free's list of blocks to free */
    uintptr_t mark;          /* postq_free: already on that list */
    uintptr_t pad;
    la_cslot_t s[LA_CB];
} la_cblock_t;
_Static_assert(offsetof(la_cblock_t, s) % sizeof(la_cslot_t) == 0, "slots aligned");

struct la_postq {
    _Atomic uintptr_t top; /* the newest run not taken yet (tagged), or 0 */
    char pad[64 - sizeof(uintptr_t)];
    _Atomic int refs;    /* the runtime + each record whose thread holds it */
    _Atomic int orphans; /* records whose thread let go, not freed yet */
    pthread_mutex_t mu;  /* the loop's side: list, records, take */
    uintptr_t list;      /* taken, not delivered: the oldest run (tagged) */
    uint32_t lpos;       /* entries of it delivered already */
    la_cprod_t *prods;
    uint64_t taken;      /* entries taken by the loop, ever (stats) */
    uint64_t retired;    /* posts of records freed already (stats) */
};

struct la_cprod {
    /* owner thread */
    la_cblock_t *tblk;
    uint32_t tcount;  /* slots used in tblk */
    uint32_t rcount;  /* entries in the run at run */
    la_cslot_t *run;  /* this thread's last run (maybe still on top) */
    uint64_t h;
    la_rtc_t *rt;
    struct la_postq *q;
    struct la_cprod *tnext; /* the owner thread's list */
    _Atomic uint64_t posted; /* posts so far (stats): written by the owner only, before it publishes */
    _Atomic int dead;       /* the runtime was closed */
    _Atomic int orphan;     /* the owner thread let go of this record */
    la_cblock_t *_Atomic spare; /* a drained block handed back for reuse */
    char pad[64]; /* the loop's fields below are on another line than the poster's */
    /* loop thread (under q->mu) */
    la_cblock_t *cblk; /* the block of the last run delivered */
    uint32_t cend;     /* delivered up to here in cblk (the slot after the last run done) */
    struct la_cprod *next;
};

#define LA_PCACHE 4
static __thread la_cprod_t *pcache[LA_PCACHE];
static __thread la_cprod_t *owned; /* every record this thread holds */
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static pthread_mutex_t rtc_free_mu = PTHREAD_MUTEX_INITIALIZER;
static la_rtc_t *rtc_free;

/* Frees a record and the blocks it still owns (none of its entries may be
 * queued). */
static void prod_free(la_cprod_t *p) {
    la_cblock_t *s = atomic_load(&p->spare);
    if (s != p->tblk) free(s);
    if (p->cblk != p->tblk && p->cblk != s) free(p->cblk);
    free(p->tblk);
    free(p);
}

/* Frees a queue nobody can post to or take from any more: every record,
 * every block still holding queued entries, the rest. */
static void postq_free(struct la_postq *q) {
    la_cblock_t *blocks = NULL;
    uintptr_t lists[2] = {q->list, atomic_load(&q->top)};
    for (int i = 0; i < 2; i++) {
        for (uintptr_t t = lists[i]; t; t = LA_RUN(t)->a) {
            la_cblock_t *b = (la_cblock_t *)LA_RUN(t)->b;
            if (!b->mark) {
                b->mark = 1;
                b->fnext = blocks;
                blocks = b;
            }
        }
    }
    la_cprod_t *p = q->prods;
    while (p) {
        la_cprod_t *n = p->next;
        la_cblock_t *bs[3] = {p->tblk, atomic_load(&p->spare), p->cblk};
        for (int i = 0; i < 3; i++) {
            if (bs[i] && !bs[i]->mark) {
                bs[i]->mark = 1;
                bs[i]->fnext = blocks;
                blocks = bs[i];
            }
        }
        free(p);
        p = n;
    }
    while (blocks) {
        la_cblock_t *n = blocks->fnext;
        free(blocks);
        blocks = n;
    }
    pthread_mutex_destroy(&q->mu);
    free(q);
}

static void postq_unref(struct la_postq *q) {
    if (atomic_fetch_sub(&q->refs, 1) == 1) postq_free(q);
}

/* The owner thread lets go of p (it exits, or p's runtime is closed); p may
 * be freed by the loop at once. */
static void prod_release(la_cprod_t *p) {
    struct la_postq *q = p->q;
    atomic_fetch_add(&q->orphans, 1);
    atomic_store(&p->orphan, 1);
    postq_unref(q);
}

static void on_thread_exit(void *unused) {
    (void)unused;
    la_cprod_t *p = owned;
    owned = NULL;
    for (int i = 0; i < LA_PCACHE; i++) pcache[i] = NULL;
    while (p) {
        la_cprod_t *n = p->tnext;
        prod_release(p);
        p = n;
    }
}

static void make_exit_key(void) { pthread_key_create(&exit_key, on_thread_exit); }

la_rtc_t *la_rtc_new(int fd, int kind) {
    struct la_postq *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    pthread_mutex_init(&q->mu, NULL);
    atomic_store(&q->refs, 1);
    pthread_mutex_lock(&rtc_free_mu);
    la_rtc_t *r = rtc_free;
    if (r) rtc_free = r->free_next;
    pthread_mutex_unlock(&rtc_free_mu);
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) {
            postq_free(q);
            return NULL;
        }
    }
    r->bell.fd = fd;
    r->bell.kind = kind;
    memset(&r->sh, 0, sizeof r->sh);
    atomic_store(&r->sh.gowork, 1); /* nothing published yet: Go first */
    atomic_store(&r->waiting, 0);
    atomic_store(&r->closed, 0);
    r->bell_unread = 0;
    atomic_store(&r->sigon, 0);
    atomic_store(&r->sigmask, 0);
    for (int i = 0; i < LA_SIG_N; i++) {
        atomic_store(&r->sigkey[i], 0);
        atomic_store(&r->sigpend[i], 0);
    }
    r->q = q;
    r->free_next = NULL;
    memset(&r->st, 0, sizeof r->st);
    return r;
}

/* Closes the runtime's C side: producers are told (their threads let go of
 * them at their next post or exit). Call after la_handle_free (no new
 * producer can register then). A waiter may still take until
 * la_rtc_recycle. */
void la_rtc_close(la_rtc_t *r) {
    struct la_postq *q = r->q;
    pthread_mutex_lock(&q->mu);
    atomic_store(&r->closed, 1);
    for (la_cprod_t *p = q->prods; p; p = p->next) atomic_store(&p->dead, 1);
    pthread_mutex_unlock(&q->mu);
}

/* After la_rtc_close, once no thread waits on r any more. */
void la_rtc_recycle(la_rtc_t *r) {
    /* Go saw the wait flag down (with Go's atomics, outside C's memory
     * model): this acquire orders the last wait's accesses to r before the
     * writes below. */
    (void)atomic_load_explicit(&r->waiting, memory_order_acquire);
    la_fdmap_reset(r);
    struct la_postq *q = r->q;
    r->q = NULL;
    if (q) postq_unref(q);
    pthread_mutex_lock(&rtc_free_mu);
    r->free_next = rtc_free;
    rtc_free = r;
    pthread_mutex_unlock(&rtc_free_mu);
}

static la_cblock_t *new_block(la_cprod_t *p) {
    la_cblock_t *b = malloc(sizeof *b);
    if (!b) return NULL;
    b->owner = p;
    b->fnext = NULL;
    b->mark = 0;
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
            prod_release(p);
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
    la_cblock_t *b = p ? new_block(p) : NULL;
    if (!b) {
        free(p);
        la_handle_put(slot);
        errno = ENOMEM;
        return NULL;
    }
    struct la_postq *q = r->q; /* live: the handle is pinned, so not closed yet */
    p->tblk = b;
    p->h = h;
    p->rt = r;
    p->q = q;
    atomic_fetch_add(&q->refs, 1);
    pthread_mutex_lock(&q->mu);
    p->next = q->prods;
    q->prods = p;
    pthread_mutex_unlock(&q->mu);
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
    struct la_postq *q = p->q;
    uintptr_t top = atomic_load_explicit(&q->top, memory_order_relaxed);
    /* Counted before it is published (the CAS below releases it), so the
     * loop never takes more than get_stats sees posted. Owner only: a plain
     * store, no read-modify-write. */
    uint64_t posted = atomic_load_explicit(&p->posted, memory_order_relaxed);
    atomic_store_explicit(&p->posted, posted + 1, memory_order_relaxed);
    /* Claim the entry's place in the order and publish it in one step: grow
     * this thread's run if it is still on top, else push a new run. Then
     * look at the sleep flag: with the loop's "raise the flag, then look for
     * work" this is a Dekker pair (both sequentially consistent), so either
     * the loop sees the entry or we see the flag. */
    if (p->run && top == ((uintptr_t)p->run | (p->rcount - 1)) && p->rcount < LA_RUNMAX && c < LA_CB) {
        b->s[c].a = key;
        b->s[c].b = data;
        if (atomic_compare_exchange_strong_explicit(&q->top, &top, top + 1, memory_order_seq_cst,
                                                    memory_order_relaxed)) {
            p->tcount = c + 1;
            p->rcount++;
            goto published;
        }
        /* Sealed meanwhile (a push above it, or the loop took it). */
    }
    if (__builtin_expect(c + 2 > LA_CB, 0)) {
        /* Reuse the block the loop handed back, if any: no malloc in a
         * steady stream. */
        la_cblock_t *nb = atomic_exchange_explicit(&p->spare, NULL, memory_order_acquire);
        if (!nb && !(nb = new_block(p))) {
            atomic_store_explicit(&p->posted, posted, memory_order_relaxed);
            return ASYNC_E_NOMEM;
        }
        p->tblk = b = nb;
        c = 0;
    }
    la_cslot_t *hd = &b->s[c];
    hd->b = (uintptr_t)b;
    b->s[c + 1].a = key;
    b->s[c + 1].b = data;
    do hd->a = top;
    while (!atomic_compare_exchange_weak_explicit(&q->top, &top, (uintptr_t)hd, memory_order_seq_cst,
                                                  memory_order_relaxed));
    p->run = hd;
    p->rcount = 1;
    p->tcount = c + 2;
published:;
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
                atomic_fetch_add_explicit(&pr->sh.rings, 1, memory_order_relaxed); /* stats */
#if defined(_WIN32)
                /* The doorbell is an I/O completion port, not a descriptor. */
                if (pr->bell.kind == LA_DOORBELL_IOCP) la_win_ring(pr->bell.fd);
#else
                uint64_t v = 1;
                char ch = 'r';
                ssize_t w;
                do w = pr->bell.kind == LA_DOORBELL_EVENTFD ? la_write_nc(pr->bell.fd, &v, sizeof v)
                                                            : la_write_nc(pr->bell.fd, &ch, 1);
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

/* 1 if some entry is not taken yet. Loop thread only. */
int la_rtc_pending(la_rtc_t *r) {
    struct la_postq *q = r->q;
    if (!q) return 0;
    pthread_mutex_lock(&q->mu);
    int any = q->list != 0 || atomic_load_explicit(&q->top, memory_order_seq_cst) != 0 ||
              atomic_load_explicit(&r->sigmask, memory_order_seq_cst) != 0;
    pthread_mutex_unlock(&q->mu);
    return any;
}

uint64_t la_rtc_pending_count(la_rtc_t *r) {
    struct la_postq *q = r->q;
    if (!q) return 0;
    pthread_mutex_lock(&q->mu);
    /* Records are freed only under q->mu (reap): the walk is safe. Every
     * entry taken was counted by its poster before it was published, so
     * posted >= taken but for a post counted and not published yet, and
     * one that failed for memory and takes its count back. */
    uint64_t posted = q->retired;
    for (la_cprod_t *p = q->prods; p; p = p->next) posted += atomic_load_explicit(&p->posted, memory_order_relaxed);
    uint64_t taken = q->taken;
    pthread_mutex_unlock(&q->mu);
    return posted > taken ? posted - taken : 0;
}

/* Frees the orphans whose entries are all delivered (under q->mu). */
static void reap(struct la_postq *q) {
    la_cprod_t **pp = &q->prods;
    while (*pp) {
        la_cprod_t *p = *pp;
        /* orphan is stored after the thread's last post: tblk and tcount
         * are final. p's runs come out in its order, so all are delivered
         * once the last one is. Nobody else writes into p's blocks (a post
         * writes its own slots). */
        if (atomic_load(&p->orphan) && (p->tcount == 0 || (p->cblk == p->tblk && p->cend == p->tcount))) {
            *pp = p->next;
            atomic_fetch_sub(&q->orphans, 1);
            q->retired += atomic_load_explicit(&p->posted, memory_order_relaxed);
            prod_free(p);
        } else {
            pp = &p->next;
        }
    }
}

/* Moves up to max entries into out (pairs) or ev (completion events), oldest
 * first (the order of the pushes); hands drained blocks back to their
 * producers and frees drained orphans. Loop thread only. */
static inline int take(la_rtc_t *r, la_pair_t *out, io_event_t *ev, int max) {
    struct la_postq *q = r->q;
    int n = 0;
    if (!q) return 0; /* recycled: nothing to take (no waiter should be here) */
    /* Nothing to take and nothing to reap: no lock (an fd wake's wait came
     * here for nothing, ~70 ns with the lock). Only the waiter writes list;
     * a post that lands after these loads is the next wait's (the sleep
     * protocol looks at the stack through la_rtc_pending, not here). */
    if (q->list == 0 && atomic_load_explicit(&q->top, memory_order_acquire) == 0 &&
        atomic_load_explicit(&r->sigmask, memory_order_relaxed) == 0 &&
        atomic_load_explicit(&q->orphans, memory_order_relaxed) == 0)
        return 0;
    pthread_mutex_lock(&q->mu);
    /* Signals first (sigwatch.c): one event per watched signal, whatever
     * the number that arrived. */
    if (atomic_load_explicit(&r->sigmask, memory_order_relaxed) != 0) n = la_sig_take(r, out, ev, max);
    for (;;) {
        uintptr_t t = q->list;
        uint32_t pos = q->lpos;
        while (t && n < max) {
            la_cslot_t *hd = LA_RUN(t);
            uint32_t len = LA_RUNLEN(t);
            la_cblock_t *b = (la_cblock_t *)hd->b;
            la_cprod_t *p = b->owner;
            if (pos == 0 && p->cblk != b) {
                /* The producer's runs come in its order and it has moved
                 * on: all of its block before is delivered. That block
                 * becomes the spare (the old spare is freed). */
                if (p->cblk) free(atomic_exchange_explicit(&p->spare, p->cblk, memory_order_acq_rel));
                p->cblk = b;
                /* cend is "delivered up to" in cblk: here, up to this run's
                 * head. Left at the old block's end, a run cut short by max
                 * could make reap free p and this block under the loop. */
                p->cend = (uint32_t)(hd - b->s);
            }
            const la_cslot_t *e = hd + 1;
            if (ev) {
                for (; pos < len && n < max; pos++) {
                    io_event_t *o = &ev[n++];
                    o->fd = -1;
                    o->event_type = ASYNC_EVENT_COMPLETION;
                    o->completion_key = e[pos].a;
                    o->data = e[pos].b;
                    o->context = NULL;
                }
            } else {
                for (; pos < len && n < max; pos++, n++) {
                    out[n].key = e[pos].a;
                    out[n].data = e[pos].b;
                    out[n].type = ASYNC_EVENT_COMPLETION;
                }
            }
            if (pos < len) break;
            p->cend = (uint32_t)(hd - b->s) + 1 + len;
            t = hd->a;
            pos = 0;
        }
        q->list = t;
        q->lpos = pos;
        if (t || n == max) break;
        /* Everything on the stack is newer than what was in the list.
         * Reverse the runs: each head's link then names the newer run. */
        uintptr_t st = atomic_exchange_explicit(&q->top, 0, memory_order_acquire);
        if (!st) break;
        uintptr_t prev = 0;
        while (st) {
            la_cslot_t *hd = LA_RUN(st);
            uintptr_t older = hd->a;
            hd->a = prev;
            prev = st;
            st = older;
        }
        q->list = prev;
        q->lpos = 0;
    }
    if (n) q->taken += (uint64_t)n;
    if (atomic_load_explicit(&q->orphans, memory_order_relaxed) != 0) reap(q);
    pthread_mutex_unlock(&q->mu);
    return n;
}

int la_rtc_take(la_rtc_t *r, la_pair_t *out, int max) { return take(r, out, NULL, max); }

int la_rtc_take_events(la_rtc_t *r, io_event_t *out, int max) { return take(r, NULL, out, max); }
