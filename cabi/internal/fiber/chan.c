/* Channels: bounded FIFOs of fixed-size elements (capacity 0: rendezvous),
 * usable from fibers (they park) and plain threads (they block), with select.
 *
 * A channel is a spinlock, a ring buffer and two queues of parked operations
 * (nodes on the waiters' stacks). A completing side first wins the waiter's
 * claim (la_waiter_claim) under the channel lock, then copies the element,
 * unlinks the node, and signals the waiter after unlocking. Select locks its
 * channels in address order, and a select waiter shares one claim among its
 * nodes, so exactly one of its operations happens.
 *
 * Lifetime: an operation pins the channel's handle slot (la_handle_get) only
 * while it runs without parking; destroy invalidates the handle and waits for
 * those pins. A parked operation is counted in nparked instead (under lk)
 * until it is done with the channel: the side that completes it (wins its
 * claim through the channel) uncounts it, so a woken operation never touches
 * the channel again; one woken otherwise (timeout, shutdown) unlinks its node
 * and uncounts itself. Whoever brings nparked to 0 on a destroyed channel
 * frees it. An uncontended operation thus costs the pin, the lock and the
 * partner's claim. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "fiber_int.h"

typedef struct la_chan la_chan_t;

typedef struct la_cnode {
    la_waiter_t *w;
    void *elem; /* send: source; recv: destination (may be NULL: discard) */
    int idx;    /* index in the select */
    int *won;   /* set to idx by the completing side */
    int *status; /* set to 0 or ASYNC_E_CLOSED by the completing side */
    int listed;
    struct la_cnode *prev, *next;
} la_cnode_t;

typedef struct {
    la_cnode_t *head, *tail;
} la_cq_t;

struct la_chan {
    la_spin_t lk;
    size_t cap, esz;
    char *buf;
    size_t head, count;
    int closed, dead;
    int nparked; /* parked operations still to come back (see above) */
    la_cq_t sendq, recvq;
};

LA_LIST_DEFINE(cq, la_cq_t, la_cnode_t)

/* Pops the first waiter of q whose claim we win (others are unlinked: they
 * were already woken by something else, and uncount themselves). c->lk held. */
static la_cnode_t *cq_take(la_chan_t *c, la_cq_t *q) {
    while (q->head) {
        la_cnode_t *n = q->head;
        cq_remove(q, n);
        if (la_waiter_claim(n->w, LA_W_READY)) {
            c->nparked--;
            return n;
        }
    }
    return NULL;
}

static la_chan_t *chan_pin(async_chan_t *h, la_slot_t **slot) { return la_handle_get(LA_H(h), LA_T_CHAN, slot); }

static void chan_free(la_chan_t *c) {
    free(c->buf);
    free(c);
}

/* A parked operation woken by something other than the channel: unlink n
 * (if still listed) and uncount it. */
static void unpark(la_chan_t *c, la_cq_t *q, la_cnode_t *n) {
    la_spin_lock(&c->lk);
    cq_remove(q, n);
    int last = --c->nparked == 0 && c->dead;
    la_spin_unlock(&c->lk);
    if (last) chan_free(c);
}

async_chan_t *async_chan_create(size_t capacity, size_t elem_size) {
    LA_ENTRY(NULL);
    if (elem_size == 0 || elem_size > (1u << 20) || capacity > (1u << 24) ||
        capacity * elem_size > ((size_t)1 << 30)) {
        la_set_error(ASYNC_E_INVAL);
        return NULL;
    }
    la_chan_t *c = calloc(1, sizeof *c);
    uint64_t h;
    if (!c) {
        la_set_error(ASYNC_E_NOMEM);
        return NULL;
    }
    c->cap = capacity;
    c->esz = elem_size;
    if (capacity && !(c->buf = malloc(capacity * elem_size))) {
        free(c);
        la_set_error(ASYNC_E_NOMEM);
        return NULL;
    }
    if (!(h = la_handle_alloc(LA_T_CHAN, c))) {
        free(c->buf);
        free(c);
        la_set_error(ASYNC_E_NOMEM);
        return NULL;
    }
    return (async_chan_t *)(uintptr_t)h;
}

/* Wakes every parked operation with CLOSED (c->lk held); returns the list to
 * signal after unlocking (linked through next). */
static la_cnode_t *close_locked(la_chan_t *c) {
    la_cnode_t *list = NULL, *n;
    c->closed = 1;
    while ((n = cq_take(c, &c->recvq)) || (n = cq_take(c, &c->sendq))) {
        *n->won = n->idx;
        *n->status = ASYNC_E_CLOSED;
        n->next = list;
        list = n;
    }
    return list;
}

static void signal_list(la_cnode_t *list) {
    while (list) {
        la_cnode_t *nx = list->next;
        la_waiter_signal(list->w);
        list = nx;
    }
}

void async_chan_close(async_chan_t *h) {
    LA_ENTRY();
    la_slot_t *slot;
    la_chan_t *c = chan_pin(h, &slot);
    if (!c) {
        la_set_error(ASYNC_E_BADHANDLE);
        return;
    }
    la_spin_lock(&c->lk);
    la_cnode_t *list = close_locked(c);
    la_spin_unlock(&c->lk);
    la_handle_put(slot);
    signal_list(list);
}

void async_chan_destroy(async_chan_t *h) {
    LA_ENTRY();
    la_chan_t *c = la_handle_free(LA_H(h), LA_T_CHAN);
    if (!c) {
        la_set_error(ASYNC_E_BADHANDLE);
        return;
    }
    la_spin_lock(&c->lk);
    la_cnode_t *list = close_locked(c);
    c->dead = 1;
    int last = c->nparked == 0;
    la_spin_unlock(&c->lk);
    signal_list(list);
    if (last) chan_free(c);
}

/* ---- one operation, c->lk held ------------------------------------------------ */

/* Tries to complete a send at once. 1 done, 0 would block; *status 0 or
 * ASYNC_E_CLOSED. *wake: a waiter to signal after unlocking. */
static int try_send_locked(la_chan_t *c, const void *elem, int *status, la_cnode_t **wake) {
    *wake = NULL;
    if (c->closed) {
        *status = ASYNC_E_CLOSED;
        return 1;
    }
    la_cnode_t *r = cq_take(c, &c->recvq);
    if (r) {
        if (r->elem) memcpy(r->elem, elem, c->esz);
        *r->won = r->idx;
        *r->status = 0;
        *wake = r;
        *status = 0;
        return 1;
    }
    if (c->count < c->cap) {
        size_t tail = (c->head + c->count) % c->cap;
        memcpy(c->buf + tail * c->esz, elem, c->esz);
        c->count++;
        *status = 0;
        return 1;
    }
    return 0;
}

static int try_recv_locked(la_chan_t *c, void *elem, int *status, la_cnode_t **wake) {
    *wake = NULL;
    if (c->count > 0) {
        if (elem) memcpy(elem, c->buf + c->head * c->esz, c->esz);
        c->head = (c->head + 1) % c->cap;
        c->count--;
        /* a parked sender fills the freed slot */
        la_cnode_t *s = cq_take(c, &c->sendq);
        if (s) {
            size_t tail = (c->head + c->count) % c->cap;
            memcpy(c->buf + tail * c->esz, s->elem, c->esz);
            c->count++;
            *s->won = s->idx;
            *s->status = 0;
            *wake = s;
        }
        *status = 0;
        return 1;
    }
    la_cnode_t *s = cq_take(c, &c->sendq);
    if (s) {
        if (elem) memcpy(elem, s->elem, c->esz);
        *s->won = s->idx;
        *s->status = 0;
        *wake = s;
        *status = 0;
        return 1;
    }
    if (c->closed) {
        *status = ASYNC_E_CLOSED;
        return 1;
    }
    return 0;
}

/* dir: 0 send, 1 recv. Returns 0 or an async_err_t. */
static int chan_op(async_chan_t *h, int dir, void *elem, int timeout_ms) {
    if (timeout_ms < -1 || (!elem && dir == 0)) return ASYNC_E_INVAL;
    la_slot_t *slot;
    la_chan_t *c = chan_pin(h, &slot);
    if (!c) return ASYNC_E_BADHANDLE;
    int status = 0, won = -1;
    la_cnode_t *wake;
    la_spin_lock(&c->lk);
    int done = dir == 0 ? try_send_locked(c, elem, &status, &wake) : try_recv_locked(c, elem, &status, &wake);
    if (done || timeout_ms == 0) {
        la_spin_unlock(&c->lk);
        la_handle_put(slot);
        if (wake) la_waiter_signal(wake->w);
        if (!done) return dir == 0 ? ASYNC_E_FULL : ASYNC_E_EMPTY;
        return status;
    }
    la_waiter_t w;
    int rc = la_waiter_init(&w, LA_PK_NORMAL);
    la_fiber_note(w.f, dir == 0 ? LA_WAIT_CHAN_SEND : LA_WAIT_CHAN_RECV, LA_H(h)); /* w.f: no second TLS read */
    if (rc) {
        la_spin_unlock(&c->lk);
        la_handle_put(slot);
        return rc;
    }
    la_cq_t *q = dir == 0 ? &c->sendq : &c->recvq;
    la_cnode_t node = {.w = &w, .elem = elem, .idx = 0, .won = &won, .status = &status};
    cq_push(q, &node);
    c->nparked++;
    la_spin_unlock(&c->lk);
    la_handle_put(slot);
    int why = la_waiter_wait(&w, la_deadline(timeout_ms));
    if (why != LA_W_READY) unpark(c, q, &node);
    la_waiter_done(&w);
    if (why == LA_W_READY) return status;
    return la_reason_err(why);
}

int async_chan_send(async_chan_t *c, const void *elem, int timeout_ms) {
    LA_ENTRY(-1);
    int rc = chan_op(c, 0, (void *)elem, timeout_ms);
    if (rc) {
        la_set_error(rc);
        return -1;
    }
    return 0;
}

int async_chan_recv(async_chan_t *c, void *elem, int timeout_ms) {
    LA_ENTRY(-1);
    int rc = chan_op(c, 1, elem, timeout_ms);
    if (rc) {
        la_set_error(rc);
        return -1;
    }
    return 0;
}

int async_chan_try_send(async_chan_t *c, const void *elem) { return async_chan_send(c, elem, 0); }

int async_chan_try_recv(async_chan_t *c, void *elem) { return async_chan_recv(c, elem, 0); }

/* ---- select ----------------------------------------------------------------------- */

#define LA_SELECT_MAX 64

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (la_chan_t *const *)a, y = (uintptr_t) * (la_chan_t *const *)b;
    return x < y ? -1 : x > y;
}

static __thread uint32_t sel_rng = 0x12345678u;

static uint32_t sel_rand(void) {
    /* A fiber may move between threads between calls: the state is only a
     * source of variety, any value works. */
    uint32_t *p = &sel_rng;
    uint32_t x = *p;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *p = x;
    return x;
}

int async_chan_select(async_chan_op_t *ops, size_t n, int timeout_ms) {
    LA_ENTRY(-1);
    if (!ops || n == 0 || n > LA_SELECT_MAX || timeout_ms < -1) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    la_chan_t *chans[LA_SELECT_MAX], *order[LA_SELECT_MAX];
    la_slot_t *slots[LA_SELECT_MAX];
    int rc = 0;
    size_t got = 0;
    for (; got < n; got++) {
        if ((ops[got].dir != ASYNC_CHAN_SEND && ops[got].dir != ASYNC_CHAN_RECV) ||
            (ops[got].dir == ASYNC_CHAN_SEND && !ops[got].elem)) {
            rc = ASYNC_E_INVAL;
            break;
        }
        if (!(chans[got] = chan_pin(ops[got].chan, &slots[got]))) {
            rc = ASYNC_E_BADHANDLE;
            break;
        }
    }
    if (rc) {
        for (size_t i = 0; i < got; i++) la_handle_put(slots[i]);
        la_set_error(rc);
        return -1;
    }
    memcpy(order, chans, n * sizeof *order);
    qsort(order, n, sizeof *order, cmp_ptr);
    size_t nu = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || order[i] != order[i - 1]) order[nu++] = order[i];
    for (size_t i = 0; i < nu; i++) la_spin_lock(&order[i]->lk);

    int result = -1, status = 0, won = -1;
    la_cnode_t *wake = NULL;
    size_t start = sel_rand() % n;
    for (size_t k = 0; k < n && result < 0; k++) {
        size_t i = (start + k) % n;
        int done = ops[i].dir == ASYNC_CHAN_SEND ? try_send_locked(chans[i], ops[i].elem, &status, &wake)
                                                 : try_recv_locked(chans[i], ops[i].elem, &status, &wake);
        if (done) result = (int)i;
    }
    if (result >= 0 || timeout_ms == 0) {
        for (size_t i = nu; i-- > 0;) la_spin_unlock(&order[i]->lk);
        for (size_t i = 0; i < n; i++) la_handle_put(slots[i]);
        if (wake) la_waiter_signal(wake->w);
        if (result < 0) {
            la_set_error(ASYNC_E_TIMEDOUT);
            return -1;
        }
        ops[result].status = status;
        return result;
    }
    la_waiter_t w;
    la_cnode_t nodes[LA_SELECT_MAX];
    int statuses[LA_SELECT_MAX];
    rc = la_waiter_init(&w, LA_PK_NORMAL);
    la_fiber_note(w.f, LA_WAIT_SELECT, n);
    if (!rc) {
        for (size_t i = 0; i < n; i++) {
            nodes[i] = (la_cnode_t){.w = &w, .elem = ops[i].elem, .idx = (int)i, .won = &won,
                                    .status = &statuses[i]};
            cq_push(ops[i].dir == ASYNC_CHAN_SEND ? &chans[i]->sendq : &chans[i]->recvq, &nodes[i]);
            chans[i]->nparked++;
        }
    }
    for (size_t i = nu; i-- > 0;) la_spin_unlock(&order[i]->lk);
    for (size_t i = 0; i < n; i++) la_handle_put(slots[i]);
    int why = LA_W_CANCELLED;
    if (!rc) {
        why = la_waiter_wait(&w, la_deadline(timeout_ms));
        /* every node but the one a channel completed comes back */
        for (size_t i = 0; i < n; i++)
            if (why != LA_W_READY || (int)i != won)
                unpark(chans[i], ops[i].dir == ASYNC_CHAN_SEND ? &chans[i]->sendq : &chans[i]->recvq, &nodes[i]);
        la_waiter_done(&w);
    }
    if (why != LA_W_READY) {
        la_set_error(la_reason_err(why));
        return -1;
    }
    ops[won].status = statuses[won];
    return won;
}
