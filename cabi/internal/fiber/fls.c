/* Fiber-local storage: values per key and per fiber that follow the fiber
 * across worker threads. Off a fiber a plain thread has its own values
 * (kept under a pthread key), so code that runs on either sees "its own".
 *
 * Keys: a table of LA_FKEY_MAX entries; a key is seq * LA_FKEY_MAX + index
 * with seq from a process-wide counter, so a deleted key never validates
 * again, also once its index carries a new key. A fiber's (or thread's)
 * values are an array indexed by key index; each entry remembers which key
 * stored it, so a value of a deleted key is not seen by the next key of that
 * index (and gets no destructor).
 *
 * Destructors run when the fiber's function returns, on the fiber's own
 * stack, as that fiber, before the fiber counts as done (so before a joiner
 * returns); on a plain thread, at its exit (pthread key destructor). As
 * pthread does: a value is set to NULL before its destructor gets it, NULL
 * values get no call, and values set again by destructors get up to
 * LA_FLS_ROUNDS rounds in all. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "fiber_int.h"

#define LA_FKEY_MAX 1024
#define LA_FLS_ROUNDS 4

typedef struct {
    _Atomic uint64_t key; /* 0: free */
    void (*dtor)(void *); /* under klk */
} la_fkey_t;

static la_fkey_t keys[LA_FKEY_MAX];
static la_spin_t klk;   /* create, delete, and the destructor look-up */
static uint64_t key_seq; /* under klk */

typedef struct {
    uint64_t key;
    void *val;
} la_fent_t;

struct la_fls {
    size_t cap;
    la_fent_t e[];
};

/* The index of a live key, or -1. */
static int key_index(async_fiber_key_t key) {
    if (key < LA_FKEY_MAX) return -1;
    int idx = (int)(key % LA_FKEY_MAX);
    return atomic_load_explicit(&keys[idx].key, memory_order_acquire) == key ? idx : -1;
}

int async_fiber_key_create(async_fiber_key_t *key, void (*destructor)(void *)) {
    LA_ENTRY(-1);
    if (!key) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    la_spin_lock(&klk);
    int idx = 0;
    while (idx < LA_FKEY_MAX && atomic_load_explicit(&keys[idx].key, memory_order_relaxed)) idx++;
    if (idx == LA_FKEY_MAX) {
        la_spin_unlock(&klk);
        la_set_error(ASYNC_E_NOMEM);
        return -1;
    }
    uint64_t k = ++key_seq * LA_FKEY_MAX + (uint64_t)idx;
    keys[idx].dtor = destructor;
    atomic_store_explicit(&keys[idx].key, k, memory_order_release);
    la_spin_unlock(&klk);
    *key = k;
    return 0;
}

int async_fiber_key_delete(async_fiber_key_t key) {
    LA_ENTRY(-1);
    la_spin_lock(&klk);
    int idx = key_index(key);
    if (idx >= 0) {
        atomic_store_explicit(&keys[idx].key, 0, memory_order_release);
        keys[idx].dtor = NULL;
    }
    la_spin_unlock(&klk);
    if (idx < 0) {
        la_set_error(ASYNC_E_BADHANDLE);
        return -1;
    }
    return 0;
}

/* ---- the calling fiber's or thread's values --------------------------------------- */

static pthread_key_t tkey;
static pthread_once_t tkey_once = PTHREAD_ONCE_INIT;
static int tkey_err;

static void run_rounds(void);

/* A plain thread's exit. glibc has set the pthread value to NULL: put it
 * back while the destructors run, so their own get/set calls see it. */
static void thread_exit(void *p) {
    pthread_setspecific(tkey, p);
    run_rounds();
    p = pthread_getspecific(tkey); /* a destructor may have grown it */
    pthread_setspecific(tkey, NULL);
    free(p);
}

static void tkey_init(void) { tkey_err = pthread_key_create(&tkey, thread_exit); }

/* The values of the caller: its fiber's (*fp = the fiber), or its thread's
 * (*fp = NULL). */
static struct la_fls *cur_get(la_fiber_t **fp) {
    la_fiber_t *f = la_current_fiber();
    *fp = f;
    if (f) return f->fls;
    pthread_once(&tkey_once, tkey_init);
    return tkey_err ? NULL : pthread_getspecific(tkey);
}

/* Stores the (grown) values of the caller; 0 or an async_err_t. */
static int cur_put(la_fiber_t *f, struct la_fls *fls) {
    if (f) {
        f->fls = fls;
        return 0;
    }
    if (tkey_err || pthread_setspecific(tkey, fls)) return ASYNC_E_NOMEM;
    return 0;
}

int async_fiber_setspecific(async_fiber_key_t key, void *value) {
    LA_ENTRY(-1);
    int idx = key_index(key);
    if (idx < 0) {
        la_set_error(ASYNC_E_BADHANDLE);
        return -1;
    }
    la_fiber_t *f;
    struct la_fls *fls = cur_get(&f);
    if (!f && tkey_err) {
        la_set_error(ASYNC_E_NOMEM);
        return -1;
    }
    if (!fls || (size_t)idx >= fls->cap) {
        if (!value) return 0; /* NULL is what an absent value reads as */
        size_t old = fls ? fls->cap : 0, cap = old ? old * 2 : 8;
        while (cap <= (size_t)idx) cap *= 2;
        if (cap > LA_FKEY_MAX) cap = LA_FKEY_MAX;
        struct la_fls *n = malloc(sizeof *n + cap * sizeof n->e[0]);
        if (!n) {
            la_set_error(ASYNC_E_NOMEM);
            return -1;
        }
        for (size_t i = 0; i < cap; i++) n->e[i] = i < old ? fls->e[i] : (la_fent_t){0, NULL};
        n->cap = cap;
        int rc = cur_put(f, n);
        if (rc) { /* the caller keeps its old values */
            free(n);
            la_set_error(rc);
            return -1;
        }
        free(fls);
        fls = n;
    }
    fls->e[idx].key = key;
    fls->e[idx].val = value;
    return 0;
}

void *async_fiber_getspecific(async_fiber_key_t key) {
    LA_ENTRY(NULL);
    int idx = key_index(key);
    if (idx < 0) {
        la_set_error(ASYNC_E_BADHANDLE);
        return NULL;
    }
    la_fiber_t *f;
    struct la_fls *fls = cur_get(&f);
    if (!fls || (size_t)idx >= fls->cap || fls->e[idx].key != key) return NULL;
    return fls->e[idx].val;
}

/* One round: every non-NULL value of a live key is cleared, then handed to
 * the key's destructor. The values are looked up again after each call (a
 * destructor may set values, which may move them). */
static void run_dtors(void) {
    la_fiber_t *f;
    struct la_fls *fls;
    for (size_t i = 0; (fls = cur_get(&f)) && i < fls->cap; i++) {
        la_fent_t ent = fls->e[i];
        if (!ent.val) continue;
        fls->e[i].val = NULL;
        la_spin_lock(&klk);
        void (*d)(void *) = atomic_load_explicit(&keys[i].key, memory_order_relaxed) == ent.key ? keys[i].dtor : NULL;
        la_spin_unlock(&klk);
        if (d) d(ent.val);
    }
}

static int any_value(const struct la_fls *fls) {
    for (size_t i = 0; fls && i < fls->cap; i++)
        if (fls->e[i].val && key_index(fls->e[i].key) >= 0) return 1;
    return 0;
}

/* Up to LA_FLS_ROUNDS rounds while values of live keys remain; the ones left
 * after that are dropped (as pthread does). */
static void run_rounds(void) {
    la_fiber_t *f;
    for (int r = 0; r < LA_FLS_ROUNDS && any_value(cur_get(&f)); r++) run_dtors();
}

/* The fiber's function returned (la_fiber_main, on its stack). f stays the
 * running fiber while destructors run; they may park (and move it). */
void la_fls_fiber_exit(la_fiber_t *f) {
    run_rounds();
    free(f->fls);
    f->fls = NULL;
}
