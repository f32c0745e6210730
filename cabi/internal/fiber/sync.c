/* Fiber mutexes and condition variables: they park a fiber and block a
 * plain thread, through the same waiters as channels (waiters.c), so fibers
 * of any scheduler and plain threads may share one.
 *
 * A mutex is a spinlock, an owner and a FIFO of parked lockers (nodes on the
 * waiters' stacks). The owner is the fiber (its handle: fibers migrate
 * between threads, and a handle is never issued twice), or, off a fiber, the
 * thread (a process-unique number of the thread). Unlock hands the mutex
 * straight to the first waiter whose claim it wins (la_waiter_claim, under
 * the lock), so a new locker never overtakes a waiter (FIFO, no starvation);
 * a waiter whose claim a timeout or a shutdown won is skipped.
 *
 * A condition variable is a spinlock and a FIFO of waiters. cond_wait
 * registers the caller on the condition variable and releases the mutex
 * under the mutex's lock (lock order: mutex, then condition variable), so a
 * signal sent by whoever takes the mutex next finds the waiter: no lost
 * wake-up. After waking it takes the mutex again (a park that shutdown does
 * not cancel: the caller returns holding the mutex, as pthread_cond_wait).
 *
 * Lifetime, as channels (chan.c): a call pins the handle only while it runs
 * without parking; a parked node is counted in nparked until it is done with
 * the object. The side that completes a node (wins its claim through the
 * object) uncounts it; a node woken otherwise unlinks and uncounts itself.
 * Destroy invalidates the handle, wakes every waiter with ASYNC_E_CLOSED, and
 * whoever brings nparked to 0 on a dead object frees it. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdlib.h>

#include "fiber_int.h"

typedef struct la_snode {
    la_waiter_t *w;
    uint64_t who;  /* the waiter's identity (a mutex waiter becomes owner) */
    int status;    /* set by the completing side: 0 or ASYNC_E_CLOSED */
    int listed;
    struct la_snode *prev, *next;
} la_snode_t;

typedef struct {
    la_snode_t *head, *tail;
} la_sq_t;

/* What a mutex and a condition variable have alike: a lock, the queue of
 * parked waiters and their count, and whether the handle is gone (dead:
 * the last waiter to leave frees the object). */
typedef struct {
    la_spin_t lk;
    int dead, nparked;
    la_sq_t q;
} la_sobj_t;

typedef struct {
    la_sobj_t o;
    uint64_t owner; /* 0: unlocked */
} la_mutex_t;

typedef la_sobj_t la_cond_t;
_Static_assert(offsetof(la_mutex_t, o) == 0, "a mutex is freed through its la_sobj_t");

LA_LIST_DEFINE(sq, la_sq_t, la_snode_t)

/* Pops the first node whose claim we win (the others were woken by a timeout
 * or a shutdown and uncount themselves); *nparked counts the taken one out.
 * The object's lock is held. */
static la_snode_t *sq_take(la_sq_t *q, int *nparked) {
    while (q->head) {
        la_snode_t *n = q->head;
        sq_remove(q, n);
        if (la_waiter_claim(n->w, LA_W_READY)) {
            (*nparked)--;
            return n;
        }
    }
    return NULL;
}

/* ---- who is calling ------------------------------------------------------------- */

/* Thread identities: type byte 0xFE (fiber handles carry LA_T_FIBER there),
 * a process-wide counter above. Read only off a fiber (a plain thread never
 * migrates), in a function of its own. */
static _Atomic uint64_t next_thread_id = 1;
static __thread uint64_t tls_thread_id;

static LA_NOINLINE uint64_t thread_id(void) {
    __asm__ volatile("" ::: "memory");
    uint64_t *p = &tls_thread_id;
    if (!*p) *p = (atomic_fetch_add(&next_thread_id, 1) << 32) | (0xFEull << LA_IDX_BITS);
    return *p;
}

static uint64_t self_id(void) {
    la_fiber_t *f = la_current_fiber();
    return f ? f->handle : thread_id();
}

/* ---- what a mutex and a condition variable share --------------------------- */

/* Claims every parked waiter with CLOSED (the object's lock held); returns
 * the list to signal after unlocking (through next). */
static la_snode_t *drain_closed(la_sq_t *q, int *nparked) {
    la_snode_t *list = NULL, *n;
    while ((n = sq_take(q, nparked))) {
        n->status = ASYNC_E_CLOSED;
        n->next = list;
        list = n;
    }
    return list;
}

static void signal_list(la_snode_t *list) {
    while (list) {
        la_snode_t *nx = list->next;
        la_waiter_signal(list->w);
        list = nx;
    }
}

/* A zeroed object of size bytes (a mutex or a condition variable) behind a
 * new handle of type: the handle, or 0 with ASYNC_E_NOMEM recorded. */
static uint64_t sobj_new(size_t size, int type) {
    void *o = calloc(1, size);
    uint64_t h;
    if (!o || !(h = la_handle_alloc(type, o))) {
        free(o);
        la_set_error(ASYNC_E_NOMEM);
        return 0;
    }
    return h;
}

/* The destroy of handle h of a mutex or a condition variable (type): the
 * object is dead, its parked waiters wake with ASYNC_E_CLOSED, and the last
 * one to leave frees it (here if none is parked). */
static void sobj_destroy(uint64_t h, int type) {
    la_sobj_t *o = la_handle_free(h, type); /* an la_cond_t, or an la_mutex_t's first member */
    if (!o) {
        la_set_error(ASYNC_E_BADHANDLE);
        return;
    }
    la_spin_lock(&o->lk);
    la_snode_t *list = drain_closed(&o->q, &o->nparked);
    o->dead = 1;
    int last = o->nparked == 0;
    la_spin_unlock(&o->lk);
    signal_list(list);
    if (last) free(o);
}

/* A node woken by something other than the object: unlinks it (if still
 * listed) and uncounts it. 1 if it was the last waiter of a dead object:
 * the caller frees it. */
static inline int sobj_unpark(la_sobj_t *o, la_snode_t *n) {
    la_spin_lock(&o->lk);
    sq_remove(&o->q, n);
    int last = --o->nparked == 0 && o->dead;
    la_spin_unlock(&o->lk);
    return last;
}

/* ---- mutex ---------------------------------------------------------------------- */

async_mutex_t *async_mutex_create(void) {
    LA_ENTRY(NULL);
    return (async_mutex_t *)(uintptr_t)sobj_new(sizeof(la_mutex_t), LA_T_MUTEX);
}

void async_mutex_destroy(async_mutex_t *h) {
    LA_ENTRY();
    sobj_destroy(LA_H(h), LA_T_MUTEX);
}

/* sobj_unpark for m: a dead mutex goes with its last waiter. */
static void mutex_unpark(la_mutex_t *m, la_snode_t *n) {
    if (sobj_unpark(&m->o, n)) free(m);
}

/* Gives m up (m->o.lk held, the caller owns it): to the first waiter, or to
 * nobody. Returns the waiter to signal after unlocking, or NULL. */
static la_snode_t *release_locked(la_mutex_t *m) {
    la_snode_t *n = sq_take(&m->o.q, &m->o.nparked);
    if (n) {
        m->owner = n->who;
        n->status = 0;
    } else {
        m->owner = 0;
    }
    return n;
}

/* kind: LA_PK_NORMAL, or LA_PK_BLOCKING for the re-lock of cond_wait (not
 * cancelled by a shutdown). Returns 0 or an async_err_t. */
static int mutex_lock(async_mutex_t *h, int timeout_ms, int kind) {
    if (timeout_ms < -1) return ASYNC_E_INVAL;
    uint64_t me = self_id();
    la_slot_t *slot;
    la_mutex_t *m = la_handle_get(LA_H(h), LA_T_MUTEX, &slot);
    if (!m) return ASYNC_E_BADHANDLE;
    la_spin_lock(&m->o.lk);
    int rc = -1;
    if (m->owner == 0) {
        m->owner = me;
        rc = 0;
    } else if (m->owner == me) {
        rc = ASYNC_E_STATE;
    } else if (timeout_ms == 0) {
        rc = ASYNC_E_BUSY;
    }
    if (rc >= 0) {
        la_spin_unlock(&m->o.lk);
        la_handle_put(slot);
        return rc;
    }
    la_waiter_t w;
    if ((rc = la_waiter_init(&w, kind)) != 0) {
        la_spin_unlock(&m->o.lk);
        la_handle_put(slot);
        return rc;
    }
    la_snode_t node = {.w = &w, .who = me};
    sq_push(&m->o.q, &node);
    m->o.nparked++;
    la_spin_unlock(&m->o.lk);
    la_handle_put(slot);
    int why = la_waiter_wait(&w, la_deadline(timeout_ms));
    if (why != LA_W_READY) mutex_unpark(m, &node);
    la_waiter_done(&w);
    /* READY: unlock handed us m (status 0) or destroy woke us (CLOSED) */
    return why == LA_W_READY ? node.status : la_reason_err(why);
}

int async_mutex_lock(async_mutex_t *m, int timeout_ms) {
    LA_ENTRY(-1);
    return la_ok(mutex_lock(m, timeout_ms, LA_PK_NORMAL)) ? 0 : -1;
}

int async_mutex_trylock(async_mutex_t *m) {
    LA_ENTRY(-1);
    return la_ok(mutex_lock(m, 0, LA_PK_NORMAL)) ? 0 : -1;
}

int async_mutex_unlock(async_mutex_t *h) {
    LA_ENTRY(-1);
    uint64_t me = self_id();
    la_slot_t *slot;
    la_mutex_t *m = la_handle_get(LA_H(h), LA_T_MUTEX, &slot);
    if (!m) {
        la_set_error(ASYNC_E_BADHANDLE);
        return -1;
    }
    la_spin_lock(&m->o.lk);
    if (m->owner != me) {
        la_spin_unlock(&m->o.lk);
        la_handle_put(slot);
        la_set_error(ASYNC_E_STATE);
        return -1;
    }
    la_snode_t *n = release_locked(m);
    la_spin_unlock(&m->o.lk);
    la_handle_put(slot);
    if (n) la_waiter_signal(n->w);
    return 0;
}

/* ---- condition variable --------------------------------------------------------- */

async_cond_t *async_cond_create(void) {
    LA_ENTRY(NULL);
    return (async_cond_t *)(uintptr_t)sobj_new(sizeof(la_cond_t), LA_T_COND);
}

void async_cond_destroy(async_cond_t *h) {
    LA_ENTRY();
    sobj_destroy(LA_H(h), LA_T_COND);
}

static void cond_unpark(la_cond_t *c, la_snode_t *n) {
    if (sobj_unpark(c, n)) free(c);
}

/* Returns 0 or an async_err_t; see async.h for who holds m afterwards. */
static int cond_wait(async_cond_t *ch, async_mutex_t *mh, int timeout_ms) {
    if (timeout_ms < -1) return ASYNC_E_INVAL;
    uint64_t me = self_id();
    la_slot_t *cslot, *mslot;
    la_cond_t *c = la_handle_get(LA_H(ch), LA_T_COND, &cslot);
    if (!c) return ASYNC_E_BADHANDLE;
    la_mutex_t *m = la_handle_get(LA_H(mh), LA_T_MUTEX, &mslot);
    if (!m) {
        la_handle_put(cslot);
        return ASYNC_E_BADHANDLE;
    }
    la_waiter_t w;
    la_snode_t node = {.w = &w, .who = me};
    la_spin_lock(&m->o.lk);
    int rc = m->owner != me ? ASYNC_E_STATE : la_waiter_init(&w, LA_PK_NORMAL);
    if (rc) {
        la_spin_unlock(&m->o.lk);
        la_handle_put(mslot);
        la_handle_put(cslot);
        return rc;
    }
    la_spin_lock(&c->lk);
    sq_push(&c->q, &node);
    c->nparked++;
    la_spin_unlock(&c->lk);
    la_snode_t *next = release_locked(m);
    la_spin_unlock(&m->o.lk);
    la_handle_put(mslot);
    la_handle_put(cslot);
    if (next) la_waiter_signal(next->w);

    int why = la_waiter_wait(&w, la_deadline(timeout_ms));
    if (why != LA_W_READY) cond_unpark(c, &node);
    la_waiter_done(&w);
    rc = why == LA_W_READY ? node.status : la_reason_err(why);
    /* Take m again, whatever woke us; a mutex destroyed meanwhile is gone. */
    int lrc = mutex_lock(mh, -1, LA_PK_BLOCKING);
    if (lrc) return lrc == ASYNC_E_CLOSED ? ASYNC_E_BADHANDLE : lrc;
    return rc;
}

int async_cond_wait(async_cond_t *c, async_mutex_t *m, int timeout_ms) {
    LA_ENTRY(-1);
    return la_ok(cond_wait(c, m, timeout_ms)) ? 0 : -1;
}

/* Wakes one waiter (all: 1), in FIFO order. */
static int cond_wake(async_cond_t *h, int all) {
    la_slot_t *slot;
    la_cond_t *c = la_handle_get(LA_H(h), LA_T_COND, &slot);
    if (!c) return ASYNC_E_BADHANDLE;
    la_snode_t *list = NULL, **tail = &list, *n;
    la_spin_lock(&c->lk);
    while ((n = sq_take(&c->q, &c->nparked))) { /* signalled in FIFO order */
        n->status = 0;
        n->next = NULL;
        *tail = n;
        tail = &n->next;
        if (!all) break;
    }
    la_spin_unlock(&c->lk);
    la_handle_put(slot);
    signal_list(list);
    return 0;
}

int async_cond_signal(async_cond_t *c) {
    LA_ENTRY(-1);
    return la_ok(cond_wake(c, 0)) ? 0 : -1;
}

int async_cond_broadcast(async_cond_t *c) {
    LA_ENTRY(-1);
    return la_ok(cond_wake(c, 1)) ? 0 : -1;
}
