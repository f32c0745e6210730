/* Scopes (include/async.h "Cancellation, scopes and deadlines";
 * docs/FIBERS.md): a tree of groups of fibers per scheduler. A scope knows
 * its direct fibers (a list through sc_prev/sc_next), its child scopes, and
 * `live`: the fibers in it and below that have not returned. Cancelling a
 * scope marks it and every scope below cancelled and cancels each of their
 * fibers (la_fiber_cancel); a fiber spawned into a cancelled scope starts
 * cancelled. A scope's deadline is fixed at its creation (the earliest of
 * its own and its parent's); its fibers take it at spawn (f->dl). A join
 * waits until live is 0, in a park no cancellation ends (LA_PK_BLOCKING).
 *
 * The tree, the fiber lists, live and the joiners change under the
 * scheduler's scmu. A fiber leaves its scope on the worker loop after it
 * returned (sched.c fiber_finish), before its record is released: a scope's
 * list holds only records that are alive.
 *
 * Lifetime: the handle holds one reference, every call in progress one
 * more (taken while the handle's slot is pinned, after the call pinned the
 * scheduler); the record is freed with the last. async_scope_destroy
 * refuses a scope with live fibers or child scopes, so no fiber and no
 * child points to a destroyed scope. async_sched_destroy frees the scopes
 * left once every fiber returned and every call on s left (la_scopes_free). */
#include <stdlib.h>

#include "fiber_int.h"

typedef struct la_sjoin {
    la_waiter_t *w;
    struct la_sjoin *next;
} la_sjoin_t;

struct la_scope {
    la_sched_t *s;
    uint64_t handle;
    struct la_scope *parent, *child, *sib_next, *sib_prev; /* the tree */
    struct la_scope *all_next, *all_prev;                  /* s->scopes */
    la_fiber_t *fibers;
    int64_t live;
    uint64_t dl;
    int cancelled, dead;
    la_sjoin_t *joiners;
    _Atomic int refs;
};
typedef struct la_scope la_scope_t;

uint64_t la_scope_deadline(const la_scope_t *sc) { return sc->dl; }

static void scope_unref(la_scope_t *sc) {
    if (atomic_fetch_sub(&sc->refs, 1) == 1) free(sc);
}

/* The scope behind h with a reference and its scheduler pinned (as
 * async_fiber_join pins it), or NULL with the error recorded. */
static la_scope_t *scope_use(async_scope_t *h) {
    la_slot_t *slot;
    la_scope_t *sc = la_handle_get(LA_H(h), LA_T_SCOPE, &slot);
    if (!sc) {
        la_set_error(ASYNC_E_BADHANDLE);
        return NULL;
    }
    la_sched_t *s = sc->s;
    /* destroy sets destroying before it waits for refs to reach 0 (both
     * seq_cst): either it waits for this call or this call backs off while
     * the slot still holds sc (destroy frees the scopes' handles, waiting
     * for their slots, before it frees s). */
    atomic_fetch_add(&s->refs, 1);
    if (atomic_load(&s->destroying)) {
        atomic_fetch_sub(&s->refs, 1);
        la_handle_put(slot);
        la_set_error(ASYNC_E_BADHANDLE);
        return NULL;
    }
    atomic_fetch_add(&sc->refs, 1);
    la_handle_put(slot);
    return sc;
}

static void scope_done(la_scope_t *sc) {
    la_sched_t *s = sc->s;
    scope_unref(sc);
    la_sched_put(s);
}

/* The next scope after sc in a walk of root's subtree (depth first, no
 * recursion: a deep tree must not exhaust a fiber's stack), or NULL. */
static la_scope_t *walk_next(la_scope_t *root, la_scope_t *sc) {
    if (sc->child) return sc->child;
    while (sc != root) {
        if (sc->sib_next) return sc->sib_next;
        sc = sc->parent;
    }
    return NULL;
}

/* 1 if sc is f's scope or one above it (under scmu). */
static int scope_holds(const la_scope_t *sc, const la_fiber_t *f) {
    for (const la_scope_t *p = f ? f->scope : NULL; p; p = p->parent)
        if (p == sc) return 1;
    return 0;
}

/* Wakes sc's joiners (under scmu: a registered waiter is alive). */
static void wake_joiners(la_scope_t *sc) {
    for (la_sjoin_t *j = sc->joiners; j; j = j->next) la_waiter_wake(j->w, LA_W_READY);
}

int la_scope_enter(la_sched_t *s, uint64_t h, la_fiber_t *f) {
    la_slot_t *slot;
    la_scope_t *sc = la_handle_get(h, LA_T_SCOPE, &slot);
    if (!sc) return ASYNC_E_BADHANDLE;
    int rc = 0;
    pthread_mutex_lock(&s->scmu);
    if (sc->s != s || sc->dead) {
        rc = ASYNC_E_BADHANDLE;
    } else {
        f->scope = sc;
        f->sc_prev = NULL;
        f->sc_next = sc->fibers;
        if (sc->fibers) sc->fibers->sc_prev = f;
        sc->fibers = f;
        for (la_scope_t *p = sc; p; p = p->parent) p->live++;
        if (sc->cancelled) atomic_fetch_or(&f->ctl, LA_CTL_CANCEL);
        la_fiber_deadline_update(f);
    }
    pthread_mutex_unlock(&s->scmu);
    la_handle_put(slot);
    return rc;
}

void la_scope_fiber_exit(la_fiber_t *f) {
    la_sched_t *s = f->s;
    la_scope_t *sc = f->scope;
    pthread_mutex_lock(&s->scmu);
    if (f->sc_prev)
        f->sc_prev->sc_next = f->sc_next;
    else
        sc->fibers = f->sc_next;
    if (f->sc_next) f->sc_next->sc_prev = f->sc_prev;
    f->scope = NULL;
    for (la_scope_t *p = sc; p; p = p->parent)
        if (--p->live == 0) wake_joiners(p);
    pthread_mutex_unlock(&s->scmu);
}

void la_scopes_free(la_sched_t *s) {
    la_scope_t *sc = s->scopes;
    s->scopes = NULL;
    while (sc) {
        la_scope_t *nx = sc->all_next;
        la_handle_free(sc->handle, LA_T_SCOPE);
        scope_unref(sc);
        sc = nx;
    }
}

/* ---- public API ------------------------------------------------------------------ */

async_scope_t *async_scope_create(async_sched_t *sh, async_scope_t *parent, int timeout_ms) {
    LA_ENTRY(NULL);
    if (la_check_timeout(timeout_ms)) return NULL;
    la_sched_t *s = la_sched_use(sh);
    if (!s) return NULL;
    la_scope_t *pa = NULL;
    if (parent && !(pa = scope_use(parent))) {
        la_sched_put(s);
        return NULL;
    }
    la_scope_t *sc = calloc(1, sizeof *sc);
    int rc = 0;
    if (pa && pa->s != s) rc = ASYNC_E_INVAL;
    else if (!sc) rc = ASYNC_E_NOMEM;
    else if (!(sc->handle = la_handle_alloc(LA_T_SCOPE, sc))) rc = ASYNC_E_NOMEM;
    if (!rc) {
        sc->s = s;
        sc->dl = la_deadline(timeout_ms);
        atomic_store(&sc->refs, 1);
        pthread_mutex_lock(&s->scmu);
        if (pa && pa->dead) {
            rc = ASYNC_E_BADHANDLE;
        } else {
            if (pa) {
                sc->parent = pa;
                if (pa->dl && (!sc->dl || pa->dl < sc->dl)) sc->dl = pa->dl;
                sc->cancelled = pa->cancelled;
                sc->sib_next = pa->child;
                if (pa->child) pa->child->sib_prev = sc;
                pa->child = sc;
            }
            sc->all_next = s->scopes;
            if (s->scopes) s->scopes->all_prev = sc;
            s->scopes = sc;
        }
        pthread_mutex_unlock(&s->scmu);
        if (rc) la_handle_free(sc->handle, LA_T_SCOPE);
    }
    if (pa) scope_done(pa);
    la_sched_put(s);
    if (rc) {
        free(sc);
        la_set_error(rc);
        return NULL;
    }
    return (async_scope_t *)(uintptr_t)sc->handle;
}

int async_scope_cancel(async_scope_t *h) {
    LA_ENTRY(-1);
    la_scope_t *root = scope_use(h);
    if (!root) return -1;
    la_sched_t *s = root->s;
    pthread_mutex_lock(&s->scmu);
    for (la_scope_t *sc = root; sc; sc = walk_next(root, sc)) {
        sc->cancelled = 1;
        for (la_fiber_t *f = sc->fibers; f; f = f->sc_next) la_fiber_cancel(f);
    }
    pthread_mutex_unlock(&s->scmu);
    scope_done(root);
    return 0;
}

int async_scope_join(async_scope_t *h, int timeout_ms) {
    LA_ENTRY(-1);
    if (la_check_timeout(timeout_ms)) return -1;
    la_scope_t *sc = scope_use(h);
    if (!sc) return -1;
    la_sched_t *s = sc->s;
    la_fiber_t *me = la_current_fiber();
    int rc = 0;
    pthread_mutex_lock(&s->scmu);
    if (scope_holds(sc, me) || scope_holds(sc, la_blocking_served())) {
        rc = ASYNC_E_STATE; /* it would wait for itself */
    } else if (sc->live > 0 && timeout_ms == 0) {
        rc = ASYNC_E_TIMEDOUT;
    } else if (sc->live > 0) {
        la_waiter_t w;
        la_fiber_note(me, LA_WAIT_SCOPE, LA_H(h));
        la_waiter_init(&w, LA_PK_BLOCKING); /* never fails for this kind */
        la_sjoin_t node = {&w, sc->joiners};
        sc->joiners = &node;
        pthread_mutex_unlock(&s->scmu);
        int r = la_waiter_wait(&w, la_deadline(timeout_ms));
        pthread_mutex_lock(&s->scmu);
        la_sjoin_t **pp = &sc->joiners;
        while (*pp != &node) pp = &(*pp)->next;
        *pp = node.next;
        la_waiter_done(&w);
        rc = r == LA_W_READY ? 0 : ASYNC_E_TIMEDOUT;
    }
    pthread_mutex_unlock(&s->scmu);
    scope_done(sc);
    if (rc) {
        la_set_error(rc);
        return -1;
    }
    return 0;
}

int async_scope_destroy(async_scope_t *h) {
    LA_ENTRY(-1);
    la_scope_t *sc = scope_use(h);
    if (!sc) return -1;
    la_sched_t *s = sc->s;
    int rc = 0;
    pthread_mutex_lock(&s->scmu);
    if (sc->dead) {
        rc = ASYNC_E_BADHANDLE; /* another destroy won */
    } else if (sc->live > 0 || sc->child) {
        rc = ASYNC_E_BUSY;
    } else {
        sc->dead = 1;
        la_scope_t *pa = sc->parent;
        if (pa) {
            if (sc->sib_prev)
                sc->sib_prev->sib_next = sc->sib_next;
            else
                pa->child = sc->sib_next;
            if (sc->sib_next) sc->sib_next->sib_prev = sc->sib_prev;
        }
        if (sc->all_prev)
            sc->all_prev->all_next = sc->all_next;
        else
            s->scopes = sc->all_next;
        if (sc->all_next) sc->all_next->all_prev = sc->all_prev;
    }
    pthread_mutex_unlock(&s->scmu);
    if (!rc) {
        la_handle_free(sc->handle, LA_T_SCOPE);
        scope_unref(sc); /* the handle's reference */
    }
    scope_done(sc);
    if (rc) {
        la_set_error(rc);
        return -1;
    }
    return 0;
}

async_fiber_t *async_scope_spawn(async_scope_t *h, void (*fn)(void *), void *arg, unsigned flags) {
    LA_ENTRY(NULL);
    la_slot_t *slot;
    la_scope_t *sc = la_handle_get(LA_H(h), LA_T_SCOPE, &slot);
    if (!sc) {
        la_set_error(ASYNC_E_BADHANDLE);
        return NULL;
    }
    /* s outlives the scopes' slots (la_scopes_free); the spawn validates
     * both handles again */
    uint64_t sh = sc->s->handle;
    la_handle_put(slot);
    return la_fiber_spawn_in((async_sched_t *)(uintptr_t)sh, LA_H(h), fn, arg, flags);
}
