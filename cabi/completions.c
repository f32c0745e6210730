/* The C side of a runtime: its doorbell, its sleep flag, and the lock-free
 * completion path used by async_runtime_post_completion.
 *
 * Posting from C must not cross into Go: a crossing costs 50-100 ns, more
 * than the whole operation. So a post writes one entry into a block owned by
 * its thread (found through a small thread-local cache) and links it onto the
 * runtime's queue with one compare-and-swap; the only other shared write is
 * the rare doorbell ring when the loop may be asleep.
 *
 * Order. The queue is one lock-free stack per runtime (la_cq_t.top): a post
 * pushes its entry with a single successful compare-and-swap, which both
 * claims its place and publishes it. The successful CASes on `top` form one
 * total order (its modification order) that contains happens-before: if post
 * A happens before post B (program order of a thread, of a fiber that moved
 * to another worker in between, or any synchronisation such as a mutex or a
 * semaphore between them), A's CAS comes first. The loop thread takes the
 * whole stack with one exchange, reverses it, and delivers oldest first; what
 * does not fit in max_events waits in its private list, which is older than
 * anything still on the stack. There is no gap: an entry is either on the
 * stack, complete, or not ordered yet, so a poster preempted anywhere never
 * holds back other posts and never makes the loop spin or sleep on it.
 *
 * Memory. Entries live in 4 KiB blocks of their producer record (one per
 * thread and runtime). A producer's entries are delivered in its program
 * order, so when the loop delivers a block's last entry the whole block is
 * free: it is handed back as the producer's spare (a steady stream allocates
 * nothing). A post writes only its own entry and `top`, never an entry of
 * another thread, so a late post into a closed runtime touches memory that
 * its record keeps alive.
 *
 * Lifetimes: a la_cq_t is referenced by its runtime (until la_rtc_recycle)
 * and by every producer record whose thread still holds it; the last one
 * frees it with every record and block left. A thread that exits orphans its
 * records; the loop frees an orphan once all its entries are delivered.
 * la_rtc_t records are never freed, only recycled, so a late reader of a
 * stale one reads valid memory; anything that acts on a runtime first pins
 * its handle. A record points at its la_cq_t, never at a recycled la_rtc_t's
 * queue, so a late post can never land in another runtime.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "la.h"
#if defined(_WIN32)
#include "la_windows.h"
#endif

#define LA_CB 127 /* entries per block: a block is 4 KiB on 64-bit */

struct la_cblock;
typedef struct la_cnode {
    struct la_cnode *next; /* on the stack: the older entry; in the loop's list: the newer */
    uintptr_t key, data;
    struct la_cblock *blk; /* the block this entry is in (set once) */
} la_cnode_t;

typedef struct la_cblock {
    la_cprod_t *owner;
    struct la_cblock *fnext; /* la_cq_free's list of blocks to free */
    int mark;                /* la_cq_free: already on that list */
    uint32_t taken;          /* entries delivered (loop; reset by the owner on reuse) */
    la_cnode_t e[LA_CB];
} la_cblock_t;

struct la_cq {
    la_cnode_t *_Atomic top; /* the posts not taken yet, newest first */
    char pad[64 - sizeof(void *)];
    _Atomic int refs;    /* the runtime + each record whose thread holds it */
    _Atomic int orphans; /* records whose thread let go, not freed yet */
    pthread_mutex_t mu;  /* the loop's side: list, records, take */
    la_cnode_t *list;    /* taken from the stack, not delivered: oldest first */
    la_cprod_t *prods;
};

struct la_cprod {
    /* owner thread */
    la_cblock_t *tblk;
    uint32_t tcount;
    uint64_t h;
    la_rtc_t *rt;
    struct la_cq *q;
    struct la_cprod *tnext; /* the owner thread's list */
    _Atomic int dead;       /* the runtime was closed */
    _Atomic int orphan;     /* the owner thread let go of this record */
    la_cblock_t *_Atomic spare; /* a drained block handed back for reuse */
    /* loop thread (under q->mu) */
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
    free(p->tblk);
    free(p);
}

/* Frees a queue nobody can post to or take from any more: every record,
 * every block still holding queued entries, the rest. */
static void la_cq_free(struct la_cq *q) {
    la_cblock_t *blocks = NULL;
    la_cnode_t *lists[2] = {q->list, atomic_load(&q->top)};
    for (int i = 0; i < 2; i++) {
        for (la_cnode_t *n = lists[i]; n; n = n->next) {
            la_cblock_t *b = n->blk;
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
        la_cblock_t *bs[2] = {p->tblk, atomic_load(&p->spare)};
        for (int i = 0; i < 2; i++) {
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

static void la_cq_unref(struct la_cq *q) {
    if (atomic_fetch_sub(&q->refs, 1) == 1) la_cq_free(q);
}

/* The owner thread lets go of p (it exits, or p's runtime is closed); p may
 * be freed by the loop at once. */
static void prod_release(la_cprod_t *p) {
    struct la_cq *q = p->q;
    atomic_fetch_add(&q->orphans, 1);
    atomic_store(&p->orphan, 1);
    la_cq_unref(q);
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
    struct la_cq *q = calloc(1, sizeof *q);
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
            la_cq_free(q);
            return NULL;
        }
    }
    r->bell.fd = fd;
    r->bell.kind = kind;
    memset(&r->sh, 0, sizeof r->sh);
    atomic_store(&r->sh.gowork, 1); /* nothing published yet: Go first */
    atomic_store(&r->waiting, 0);
    atomic_store(&r->closed, 0);
    r->q = q;
    r->free_next = NULL;
    return r;
}

/* Closes the runtime's C side: producers are told (their threads let go of
 * them at their next post or exit). Call after la_handle_free (no new
 * producer can register then). A waiter may still take until
 * la_rtc_recycle. */
void la_rtc_close(la_rtc_t *r) {
    struct la_cq *q = r->q;
    pthread_mutex_lock(&q->mu);
    atomic_store(&r->closed, 1);
    for (la_cprod_t *p = q->prods; p; p = p->next) atomic_store(&p->dead, 1);
    pthread_mutex_unlock(&q->mu);
}

/* After la_rtc_close, once no thread waits on r any more. */
void la_rtc_recycle(la_rtc_t *r) {
    struct la_cq *q = r->q;
    r->q = NULL;
    if (q) la_cq_unref(q);
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
    b->taken = 0;
    for (int i = 0; i < LA_CB; i++) b->e[i].blk = b;
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
    struct la_cq *q = r->q; /* live: the handle is pinned, so not closed yet */
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
    if (__builtin_expect(c == LA_CB, 0)) {
        /* Reuse the block the loop handed back, if any: no malloc in a
         * steady stream. (It may be this very block, drained.) */
        la_cblock_t *nb = atomic_exchange_explicit(&p->spare, NULL, memory_order_acquire);
        if (nb)
            nb->taken = 0; /* the loop is done with it: it handed it back */
        else if (!(nb = new_block(p)))
            return ASYNC_E_NOMEM;
        p->tblk = b = nb;
        c = 0;
    }
    la_cnode_t *n = &b->e[c];
    n->key = key;
    n->data = data;
    p->tcount = c + 1;
    /* Claim the place in the order and publish in one step. Then look at
     * the sleep flag: with the loop's "raise the flag, then look for work"
     * this is a Dekker pair (both sequentially consistent), so either the
     * loop sees the entry or we see the flag. */
    struct la_cq *q = p->q;
    la_cnode_t *top = atomic_load_explicit(&q->top, memory_order_relaxed);
    do n->next = top;
    while (!atomic_compare_exchange_weak_explicit(&q->top, &top, n, memory_order_seq_cst, memory_order_relaxed));
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

/* Called by Go just before its runtime takes its start time, so that C's
 * "ns since start" is never behind Go's: C never thinks a timer is not due
 * when Go would (it may think one due a little early, by the time between
 * the two clock reads; then Go is entered and finds nothing, which is
 * harmless). */
void la_rtc_set_start(la_rtc_t *r) {
#if defined(_WIN32)
    r->start_ns = 0; /* no C fast path there (rtwait.c) */
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    r->start_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
#endif
}

/* 1 if some entry is not taken yet. Loop thread only. */
int la_rtc_pending(la_rtc_t *r) {
    struct la_cq *q = r->q;
    pthread_mutex_lock(&q->mu);
    int any = q->list != NULL || atomic_load_explicit(&q->top, memory_order_seq_cst) != NULL;
    pthread_mutex_unlock(&q->mu);
    return any;
}

/* Frees the orphans whose entries are all delivered (under q->mu). */
static void reap(struct la_cq *q) {
    la_cprod_t **pp = &q->prods;
    while (*pp) {
        la_cprod_t *p = *pp;
        /* orphan is stored after the thread's last post: tblk and tcount
         * are final. p's entries come out in its order, so all are
         * delivered once those of its current block are. Nobody else
         * writes into p's blocks (a post writes its own entry). */
        if (atomic_load(&p->orphan) && p->tblk->taken == p->tcount) {
            *pp = p->next;
            atomic_fetch_sub(&q->orphans, 1);
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
    struct la_cq *q = r->q;
    int n = 0;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        la_cnode_t *x = q->list;
        while (x && n < max) {
            la_cnode_t *nx = x->next;
            if (ev) {
                io_event_t *o = &ev[n++];
                o->fd = -1;
                o->event_type = ASYNC_EVENT_COMPLETION;
                o->completion_key = x->key;
                o->data = x->data;
                o->context = NULL;
            } else {
                out[n].key = x->key;
                out[n++].data = x->data;
            }
            /* Counted in the block, not the record: the record's line is
             * the poster's, written at every post. */
            la_cblock_t *b = x->blk;
            b->taken++;
            if (x == &b->e[LA_CB - 1]) {
                /* The producer's entries come in its order: all of b is
                 * delivered. It becomes the spare (the old one is freed). */
                la_cblock_t *old = atomic_exchange_explicit(&b->owner->spare, b, memory_order_acq_rel);
                free(old);
            }
            x = nx;
        }
        q->list = x;
        if (x || n == max) break;
        /* Everything on the stack is newer than what was in the list. */
        la_cnode_t *s = atomic_exchange_explicit(&q->top, NULL, memory_order_acquire);
        if (!s) break;
        la_cnode_t *prev = NULL;
        while (s) {
            la_cnode_t *nx = s->next;
            s->next = prev;
            prev = s;
            s = nx;
        }
        q->list = prev;
    }
    if (atomic_load_explicit(&q->orphans, memory_order_relaxed) != 0) reap(q);
    pthread_mutex_unlock(&q->mu);
    return n;
}

int la_rtc_take(la_rtc_t *r, la_pair_t *out, int max) { return take(r, out, NULL, max); }

int la_rtc_take_events(la_rtc_t *r, io_event_t *out, int max) { return take(r, NULL, out, max); }
