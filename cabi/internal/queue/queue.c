/* async_queue in C: the queue behind the public queue functions (api.c).
 *
 * A call into Go costs 80-100 ns, more than a whole enqueue, so the C API's
 * queue lives here. (libasync.Queue stays the Go API's queue.)
 *
 * Design: one mutex per queue guards a ring of fixed-size slots; the critical
 * section is an index update and a memcpy. Waiters are counted, so nobody
 * signals anything unless someone actually sleeps:
 *   - plain threads sleep on two condition variables (readers, writers);
 *   - fibers park through la_waiter_t nodes kept in two FIFO lists, so a
 *     queue wait suspends the fiber, never its worker thread;
 *   - async_worker threads wait in the same lists (la_waiter_init_park), so
 *     that async_worker_signal_stop can end their wait and only theirs.
 * Condition variables are signalled after the mutex is released, so the
 * woken thread does not run straight into a held lock.
 *
 * Lifetimes: la_queue_t records are never freed, only recycled (their mutex
 * and condition variables stay initialized for good). A call finds the record
 * through the handle table without pinning (la_handle_peek) and then checks,
 * under the record's mutex, that the record still belongs to its handle
 * (q->h == h): a stale handle fails with BADHANDLE even if the record was
 * recycled for another queue. Destroy clears q->h and wakes every waiter;
 * waiters count themselves in q->inside, and the record is recycled only
 * once the last of them has left, so a waiter never wakes up in a queue that
 * was meanwhile handed to someone else (it sees q->h != h: ASYNC_E_CLOSED).
 *
 * Memory: queues up to LA_Q_INLINE bytes of slots get one block up front;
 * bigger ones allocate a slot's buffer when the slot is first used (sized to
 * the message, grown when needed), so memory follows what is queued rather
 * than capacity x max_msg_size. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fiber.h"
#include "queue.h"
#include "rt.h"

#define LA_Q_INLINE (1u << 20)
#define LA_Q_MAX_CAP ((size_t)1 << 30)
#define LA_Q_MAX_MSG ((size_t)1 << 40)

enum { Q_DROP = ASYNC_QUEUE_DROP_OLDEST, Q_BLOCK = ASYNC_QUEUE_BLOCK_WRITER, Q_SIGNAL = ASYNC_QUEUE_SIGNAL_ON_DATA };

/* One message: its buffer's size (lazy slots), its length, its bytes. */
typedef struct {
    size_t cap, len;
    unsigned char data[];
} la_qslot_t;

/* A parked fiber (on its own stack). */
typedef struct la_qnode {
    la_waiter_t *w;
    struct la_qnode *prev, *next;
    int listed;
} la_qnode_t;

typedef struct {
    la_qnode_t *head, *tail;
} la_qlist_t;

typedef struct la_queue {
    pthread_mutex_t mu;
    pthread_cond_t rcv, wcv; /* plain threads waiting for a message / for room */
    uint64_t h;              /* the live handle; 0 once destroyed */
    size_t cap, maxmsg, stride;
    unsigned flags;
    unsigned char *block;    /* inline slots (stride bytes each), or NULL */
    la_qslot_t **lazy;       /* lazily allocated slots otherwise */
    size_t head, count;
    uint64_t enq, deq, dropped;
    int rthreads, wthreads;  /* plain threads asleep in rcv / wcv */
    int rpend, wpend;        /* signals sent to them, not yet taken up */
    la_qlist_t rfib, wfib;   /* parked fibers */
    int inside;              /* waiters that will look at the record again */
    uint64_t rt;             /* SIGNAL_ON_DATA: runtime handle (0: none) */
    uintptr_t key;
    int npend;               /* the last SIGNAL_ON_DATA post failed (NOMEM) */
    struct la_queue *free_next;
} la_queue_t;

static pthread_mutex_t free_mu = PTHREAD_MUTEX_INITIALIZER;
static la_queue_t *free_list;

/* ---- records --------------------------------------------------------------- */

static la_queue_t *record_new(void) {
    pthread_mutex_lock(&free_mu);
    la_queue_t *q = free_list;
    if (q) free_list = q->free_next;
    pthread_mutex_unlock(&free_mu);
    if (q) return q;
    q = calloc(1, sizeof *q);
    if (!q) return NULL;
    /* A default mutex: glibc's adaptive one (spin first) measured slower
     * with 4 producers on 2 cores, and no faster with 1. */
    pthread_mutex_init(&q->mu, NULL);
    la_cond_init_mono(&q->rcv);
    la_cond_init_mono(&q->wcv);
    return q;
}

static void record_recycle(la_queue_t *q) {
    pthread_mutex_lock(&free_mu);
    q->free_next = free_list;
    free_list = q;
    pthread_mutex_unlock(&free_mu);
}

/* Releases the slots (under q->mu). */
static void slots_free(la_queue_t *q) {
    if (q->lazy)
        for (size_t i = 0; i < q->cap; i++) free(q->lazy[i]);
    free(q->lazy);
    free(q->block);
    q->lazy = NULL;
    q->block = NULL;
}

static inline la_qslot_t *slot_at(la_queue_t *q, size_t i) {
    if (q->block) return (la_qslot_t *)(q->block + i * q->stride);
    return q->lazy[i];
}

/* Finds h's record and locks it; NULL if h is not a live queue. */
static la_queue_t *q_lock(uint64_t h) {
    la_queue_t *q = la_handle_peek(h, LA_T_QUEUE);
    if (!q) return NULL;
    pthread_mutex_lock(&q->mu);
    if (__builtin_expect(q->h != h, 0)) {
        pthread_mutex_unlock(&q->mu);
        return NULL;
    }
    return q;
}

/* ---- waiting ----------------------------------------------------------------- */

LA_LIST_DEFINE(list, la_qlist_t, la_qnode_t)

/* Wakes one parked fiber of l (under q->mu); 1 if one was woken. Fibers that
 * already woke for another reason (timeout, shutdown) are skipped. */
static int wake_fiber(la_qlist_t *l, int reason) {
    while (l->head) {
        la_qnode_t *n = l->head;
        list_remove(l, n);
        if (la_waiter_wake(n->w, reason)) return 1;
    }
    return 0;
}

/* What to signal once q->mu is released. */
enum { SIG_R = 1, SIG_W = 2 };

/* Wakes a parked fiber of a side for each event (a message, a free slot).
 * Sleeping threads get at most one signal in flight per side: the thread
 * that takes it up passes the wake-up on when it is done (settle), so a
 * burst of messages costs the producer one signal, not one each. */
static void wake_fibers(la_queue_t *q, int reader) { wake_fiber(reader ? &q->rfib : &q->wfib, LA_W_READY); }

/* The same on the hot paths: a worker thread's waiter is woken only after
 * the unlock (*kick, la_wpark_kick_unpin), like the threads on the
 * condition variables (signal_after). */
static void wake_fibers_later(la_queue_t *q, int reader, la_wpark_t **kick) {
    la_qlist_t *l = reader ? &q->rfib : &q->wfib;
    while (l->head) {
        la_qnode_t *n = l->head;
        list_remove(l, n);
        if (la_waiter_wake_later(n->w, LA_W_READY, kick)) return;
    }
}

/* Run before every unlock that may leave messages or room behind: if
 * threads sleep on a side that can go on, make sure one has been signalled.
 * Returns the SIG_* bits to signal after the unlock. */
static int settle(la_queue_t *q) {
    int sig = 0;
    if (q->rthreads && !q->rpend && q->count > 0) {
        q->rpend = 1;
        sig |= SIG_R;
    }
    if (q->wthreads && !q->wpend && q->count < q->cap) {
        q->wpend = 1;
        sig |= SIG_W;
    }
    return sig;
}

static void signal_after(la_queue_t *q, int sig) {
    if (sig & SIG_R) pthread_cond_signal(&q->rcv);
    if (sig & SIG_W) pthread_cond_signal(&q->wcv);
}

/* A deadline for the plain-thread wait (the condition variables' clock). */
static void thread_deadline(struct timespec *ts, int timeout_ms) {
#if defined(_WIN32)
    clock_gettime(CLOCK_REALTIME, ts);
#else
    clock_gettime(CLOCK_MONOTONIC, ts);
#endif
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

typedef struct {
    int timeout_ms;
    int started;
    int cs;             /* cancel state to put back at the end (base.h: LA_CANCEL_KEPT) */
    struct timespec ts; /* threads */
    uint64_t ns;        /* fibers */
} la_qwait_t;

/* Waits once for the reader (or writer) side of q, with q->mu held; returns
 * with it held. 0: look again; otherwise an async_err_t. A waiter whose
 * timeout passes looks once more before giving up, so a wake-up that raced
 * with the timeout is not lost. */
static int wait_side(la_queue_t *q, uint64_t h, int reader, la_qwait_t *wt) {
    la_fiber_t *f = la_current_fiber();
    /* An async_worker thread waits like a fiber (a node of its own), so that
     * async_worker_signal_stop can end its wait and only its wait. */
    la_wpark_t *wp = f ? NULL : la_wpark_self();
    if (!wt->started) {
        wt->started = 1;
        if (wt->timeout_ms > 0) {
            if (f || wp)
                wt->ns = la_deadline(wt->timeout_ms);
            else
                thread_deadline(&wt->ts, wt->timeout_ms);
        }
    }
    int rc = 0;
    q->inside++;
    /* Not a cancellation point (base.h): a cancel in the wait would unwind
     * with q->mu held (a cond wait) or a node of ours listed. The old state
     * comes back when the operation returns. */
    if (!f) la_nocancel_enter(&wt->cs);
    if (f || wp) {
        la_waiter_t w;
        la_fiber_note(f, reader ? LA_WAIT_QUEUE_READ : LA_WAIT_QUEUE_WRITE, h);
        rc = wp ? la_waiter_init_park(&w, wp) : la_waiter_init(&w, LA_PK_NORMAL);
        if (rc) {
            q->inside--;
            return rc; /* the scheduler is shutting down, or the worker was asked to stop */
        }
        la_qnode_t n = {.w = &w};
        la_qlist_t *l = reader ? &q->rfib : &q->wfib;
        list_push(l, &n);
        pthread_mutex_unlock(&q->mu);
        int why = la_waiter_wait(&w, wt->ns);
        pthread_mutex_lock(&q->mu);
        list_remove(l, &n);
        la_waiter_done(&w);
        if (why == LA_W_TIMEDOUT) rc = ASYNC_E_TIMEDOUT;
        else if (why != LA_W_READY && why != LA_W_CLOSED) rc = la_reason_err(why);
    } else {
        pthread_cond_t *cv = reader ? &q->rcv : &q->wcv;
        int *n = reader ? &q->rthreads : &q->wthreads;
        int *pend = reader ? &q->rpend : &q->wpend;
        (*n)++;
        if (wt->timeout_ms < 0)
            pthread_cond_wait(cv, &q->mu);
        else if (la_cond_timedwait_mono(cv, &q->mu, &wt->ts) == ETIMEDOUT)
            rc = ASYNC_E_TIMEDOUT;
        (*n)--;
        /* Whoever wakes takes the signal up (it may not be the one it was
         * meant for; settle() keeps the wake-ups going either way). */
        if (*pend) (*pend)--;
    }
    q->inside--;
    if (q->h != h) return ASYNC_E_CLOSED;
    /* A message (or room) that is there now is taken even when the wait ended
     * by its timeout or by a stop of the waiting worker. */
    if ((rc == ASYNC_E_TIMEDOUT || (wp && rc == ASYNC_E_CANCELLED)) && (reader ? q->count > 0 : q->count < q->cap))
        rc = 0;
    return rc;
}

/* Leaves a locked record; recycles it if it was destroyed and this was the
 * last waiter looking at it. */
static void q_unlock(la_queue_t *q) {
    int recycle = q->h == 0 && q->inside == 0;
    pthread_mutex_unlock(&q->mu);
    if (recycle) record_recycle(q);
}

/* The end of an enqueue or a dequeue, which holds q's lock until here:
 * settles the threads' signals (if q is still h's), unlocks, then signals
 * and kicks what the operation woke, and restores the cancel state. */
static inline void op_end(la_queue_t *q, uint64_t h, la_wpark_t *kick, la_qwait_t *wt) {
    int sig = q->h == h ? settle(q) : 0;
    q_unlock(q);
    signal_after(q, sig);
    if (kick) la_wpark_kick_unpin(kick);
    la_nocancel_leave(&wt->cs);
}

/* ---- the operations ------------------------------------------------------------- */

int la_q_create(size_t capacity, size_t max_msg, unsigned flags, uint64_t *out) {
    if (capacity == 0 || max_msg == 0 || (flags & ~(unsigned)(Q_DROP | Q_BLOCK | Q_SIGNAL)) ||
        (flags & (Q_DROP | Q_BLOCK)) == (Q_DROP | Q_BLOCK) || capacity > LA_Q_MAX_CAP || max_msg > LA_Q_MAX_MSG)
        return ASYNC_E_INVAL;
    size_t stride = sizeof(la_qslot_t) + ((max_msg + 15) & ~(size_t)15);
    unsigned char *block = NULL;
    la_qslot_t **lazy = NULL;
    if (max_msg <= LA_Q_INLINE && capacity <= LA_Q_INLINE / stride) {
        block = malloc(capacity * stride);
        if (!block) return ASYNC_E_NOMEM;
    } else {
        lazy = calloc(capacity, sizeof *lazy);
        if (!lazy) return ASYNC_E_NOMEM;
    }
    la_queue_t *q = record_new();
    if (!q) {
        free(block);
        free(lazy);
        return ASYNC_E_NOMEM;
    }
    /* Held across la_handle_alloc: a destroy through a forged copy of the
     * new handle then waits until the record is set up. A stale caller may
     * look at this recycled record at any time, hence the lock for all of it. */
    pthread_mutex_lock(&q->mu);
    q->cap = capacity;
    q->maxmsg = max_msg;
    q->stride = stride;
    q->flags = flags;
    q->block = block;
    q->lazy = lazy;
    q->head = q->count = 0;
    q->enq = q->deq = q->dropped = 0;
    q->rpend = q->wpend = 0;
    q->rt = 0;
    q->key = 0;
    q->npend = 0;
    uint64_t h = la_handle_alloc(LA_T_QUEUE, q);
    q->h = h;
    if (!h) {
        slots_free(q);
        pthread_mutex_unlock(&q->mu);
        record_recycle(q);
        return ASYNC_E_NOMEM;
    }
    pthread_mutex_unlock(&q->mu);
    *out = h;
    return 0;
}

int la_q_destroy(uint64_t h) {
    la_queue_t *q = la_handle_peek(h, LA_T_QUEUE);
    /* The handle table's compare-and-swap picks the one destroy that wins. */
    if (!q || !la_handle_free(h, LA_T_QUEUE)) return ASYNC_E_BADHANDLE;
    pthread_mutex_lock(&q->mu);
    q->h = 0;
    slots_free(q);
    q->count = 0;
    q->rt = 0;
    while (wake_fiber(&q->rfib, LA_W_CLOSED)) {
    }
    while (wake_fiber(&q->wfib, LA_W_CLOSED)) {
    }
    int rt = q->rthreads, wt = q->wthreads;
    /* Broadcast under the lock: once it is released the last waiter may
     * recycle the record. */
    if (rt) pthread_cond_broadcast(&q->rcv);
    if (wt) pthread_cond_broadcast(&q->wcv);
    q_unlock(q);
    return 0;
}

/* Posts the SIGNAL_ON_DATA completion (under q->mu, so that each transition
 * posts exactly once). A runtime that is gone ends the attachment. */
/* A post that fails for want of memory is retried by the next enqueue
 * (npend): otherwise the consumer, waiting for that completion, would never
 * drain the queue and no later transition would post again. */
static void notify(la_queue_t *q) {
    int rc = la_rt_post(q->rt, q->key, (uintptr_t)q->h);
    if (rc == ASYNC_E_BADHANDLE) q->rt = 0;
    q->npend = rc != 0 && q->rt != 0;
}

/* full: what to do when the queue is full (queue.h). */
int la_q_enqueue(uint64_t h, const void *data, size_t size, la_q_full_t full, int timeout_ms) {
    la_queue_t *q = q_lock(h);
    if (!q) return ASYNC_E_BADHANDLE;
    int rc = 0;
    la_wpark_t *kick = NULL; /* a worker thread to wake after the unlock */
    la_qwait_t wt = {.timeout_ms = timeout_ms, .cs = LA_CANCEL_KEPT};
    if (!data || size == 0 || timeout_ms < -1) {
        rc = ASYNC_E_INVAL;
        goto out;
    }
    if (size > q->maxmsg) {
        rc = ASYNC_E_TOOBIG;
        goto out;
    }
    int wait = full == LA_Q_FULL_BY_FLAG ? (q->flags & Q_BLOCK) != 0 : full == LA_Q_FULL_WAIT;
    int dropped = 0; /* the head makes room: the queue was full, not empty */
    while (q->count == q->cap) {
        if (q->flags & Q_DROP) {
            /* The head is dropped only once the new message's slot (the
             * head's own: tail == head in a full ring) is ready, so that a
             * NOMEM below loses nothing. */
            dropped = 1;
            break;
        }
        if (!wait || timeout_ms == 0) {
            rc = ASYNC_E_FULL;
            goto out;
        }
        if ((rc = wait_side(q, h, 0, &wt))) goto out;
    }
    size_t tail = q->head + q->count; /* == head when dropped */
    if (tail >= q->cap) tail -= q->cap;
    la_qslot_t *s = slot_at(q, tail);
    if (!q->block && (!s || s->cap < size)) {
        /* A lazy slot: at least 64 bytes, doubled up to the message. */
        size_t c = 64;
        while (c < size) c <<= 1;
        if (c > q->maxmsg) c = q->maxmsg;
        la_qslot_t *ns = realloc(s, sizeof *ns + c);
        if (!ns) {
            rc = ASYNC_E_NOMEM;
            wake_fibers(q, 0); /* the room is still there: pass on a wake-up we may have had */
            goto out;
        }
        ns->cap = c;
        q->lazy[tail] = s = ns;
    }
    if (dropped) {
        if (++q->head == q->cap) q->head = 0;
        q->count--;
        q->dropped++;
    }
    s->len = size;
    memcpy(s->data, data, size);
    q->count++;
    q->enq++;
    /* SIGNAL_ON_DATA posts on the empty -> non-empty transition only: with
     * capacity 1 a DROP_OLDEST enqueue into the full queue also ends with
     * count 1, but the queue was never empty. */
    if (((q->count == 1 && !dropped) || q->npend) && q->rt) notify(q);
    wake_fibers_later(q, 1, &kick);
out:
    op_end(q, h, kick, &wt);
    return rc;
}

int la_q_dequeue(uint64_t h, void *buf, size_t size, size_t *out_size, int timeout_ms) {
    la_queue_t *q = q_lock(h);
    if (!q) return ASYNC_E_BADHANDLE;
    int rc = 0;
    la_wpark_t *kick = NULL; /* a worker thread to wake after the unlock */
    la_qwait_t wt = {.timeout_ms = timeout_ms, .cs = LA_CANCEL_KEPT};
    if ((!buf && size > 0) || timeout_ms < -1) {
        rc = ASYNC_E_INVAL;
        goto out;
    }
    while (q->count == 0) {
        if (timeout_ms == 0) {
            rc = ASYNC_E_EMPTY;
            goto out;
        }
        if ((rc = wait_side(q, h, 1, &wt))) goto out;
    }
    la_qslot_t *s = slot_at(q, q->head);
    if (s->len > size) {
        if (out_size) *out_size = s->len;
        rc = ASYNC_E_BUFSIZE;
        wake_fibers(q, 1); /* another reader may fit it: pass the wake-up on */
        goto out;
    }
    memcpy(buf, s->data, s->len);
    if (out_size) *out_size = s->len;
    if (++q->head == q->cap) q->head = 0;
    q->count--;
    q->deq++;
    wake_fibers_later(q, 0, &kick);
out:
    op_end(q, h, kick, &wt);
    return rc;
}

int la_q_query(uint64_t h, la_q_query_t what, int *out) {
    la_queue_t *q = q_lock(h);
    if (!q) return ASYNC_E_BADHANDLE;
    *out = what == LA_Q_IS_EMPTY ? q->count == 0 : q->count == q->cap;
    pthread_mutex_unlock(&q->mu);
    return 0;
}

int la_q_clear(uint64_t h) {
    la_queue_t *q = q_lock(h);
    if (!q) return ASYNC_E_BADHANDLE;
    q->dropped += q->count;
    q->head = q->count = 0;
    while (wake_fiber(&q->wfib, LA_W_READY)) {
    }
    int wt = q->wthreads;
    pthread_mutex_unlock(&q->mu);
    if (wt) pthread_cond_broadcast(&q->wcv);
    return 0;
}

int la_q_stats(uint64_t h, async_queue_stats_t *st) {
    la_queue_t *q = q_lock(h);
    if (!q) return ASYNC_E_BADHANDLE;
    st->capacity = q->cap;
    st->current_size = q->count;
    st->max_msg_size = q->maxmsg;
    st->enqueue_count = q->enq;
    st->dequeue_count = q->deq;
    st->dropped_count = q->dropped;
    pthread_mutex_unlock(&q->mu);
    return 0;
}

int la_q_attach(uint64_t h, uint64_t rt, uintptr_t key) {
    la_queue_t *q = q_lock(h);
    if (!q) return ASYNC_E_BADHANDLE;
    int rc = 0;
    if (rt && !la_handle_live(rt, LA_T_RUNTIME))
        rc = ASYNC_E_BADHANDLE;
    else if (!(q->flags & Q_SIGNAL))
        rc = ASYNC_E_INVAL;
    else {
        q->rt = rt;
        q->key = key;
        q->npend = 0;
        if (rt && q->count > 0) notify(q);
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}
