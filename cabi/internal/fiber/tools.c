/* Fiber debugging tools (docs/DEBUGGING.md): fiber names, async_sched_dump
 * (also from a signal handler), and the list of schedulers the gdb helper
 * (scripts/gdb/libasync-gdb.py) walks; the stall detector is in stall.c.
 *
 * Nothing here is on the switch path except two relaxed stores per dispatch
 * (w->run_id, sched.c) and what a park records (la_fiber_note: what, object,
 * a coarse timestamp). Dumps read fibers under their list's spinlock (a
 * signal handler only try-locks it), copy them out, and format and write
 * with no lock held, by hand (no stdio: the same code runs in the handler). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fiber_int.h"

uint64_t la_coarse_ns(void) {
    struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int spin_trylock(la_spin_t *l) { return !atomic_exchange_explicit(&l->v, 1, memory_order_acquire); }

/* ---- the scheduler list (for gdb) ---------------------------------------------- */

/* Every scheduler between create and destroy, through dbg_next. Read by the
 * gdb helper (by name: keep it). */
__attribute__((used)) la_sched_t *la_dbg_sched_list;
static pthread_mutex_t dbg_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- names --------------------------------------------------------------------- *
 * A name is cut at a UTF-8 character boundary: at most 3 bytes are dropped
 * (a character has at most 3 continuation bytes), so bytes that are not
 * UTF-8 are cut at 28 to 31 bytes. */

/* The fiber of handle fh (NULL: the calling one), pinned in *slot (NULL
 * when it is the caller's own), or NULL with the error recorded: STATE off a
 * fiber, BADHANDLE for a handle that names none. */
static la_fiber_t *fiber_ref(async_fiber_t *fh, la_slot_t **slot) {
    *slot = NULL;
    la_fiber_t *f;
    if (!fh)
        f = atomic_load_explicit(&la_forked, memory_order_relaxed) ? NULL : la_current_fiber();
    else
        f = la_handle_get(LA_H(fh), LA_T_FIBER, slot);
    if (!f) la_set_error(fh ? ASYNC_E_BADHANDLE : ASYNC_E_STATE);
    return f;
}

static void name_lock(la_fiber_t *f) {
    if (f->home) la_spin_lock(&f->home->lk);
}

static void name_unlock(la_fiber_t *f) {
    if (f->home) la_spin_unlock(&f->home->lk);
}

int async_fiber_set_name(async_fiber_t *fh, const char *name) {
    LA_ENTRY(-1);
    char buf[ASYNC_FIBER_NAME_MAX];
    size_t n = 0;
    if (name) {
        while (n < ASYNC_FIBER_NAME_MAX && name[n]) n++;
        if (n == ASYNC_FIBER_NAME_MAX) {
            /* cut: never inside a UTF-8 sequence (name[n] is the first byte
             * left out: while it continues a character, drop that one) */
            n = ASYNC_FIBER_NAME_MAX - 1;
            for (int k = 0; k < 3 && n > 0 && ((unsigned char)name[n] & 0xC0) == 0x80; k++) n--;
        }
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)name[i];
            buf[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
        }
    }
    buf[n] = 0;
    la_slot_t *slot;
    la_fiber_t *f = fiber_ref(fh, &slot);
    if (!f) return -1;
    name_lock(f);
    memcpy(f->name, buf, n + 1);
    name_unlock(f);
    if (slot) la_handle_put(slot);
    return 0;
}

int async_fiber_get_name(async_fiber_t *fh, char *buf, size_t size) {
    LA_ENTRY(-1);
    if (!buf && size) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    la_slot_t *slot;
    la_fiber_t *f = fiber_ref(fh, &slot);
    if (!f) return -1;
    char copy[ASYNC_FIBER_NAME_MAX];
    name_lock(f);
    memcpy(copy, f->name, sizeof copy);
    name_unlock(f);
    if (slot) la_handle_put(slot);
    copy[sizeof copy - 1] = 0;
    size_t len = strlen(copy);
    if (size) {
        size_t k = len < size - 1 ? len : size - 1;
        memcpy(buf, copy, k);
        buf[k] = 0;
    }
    return (int)len;
}

/* ---- snapshots --------------------------------------------------------------------- */

typedef struct {
    uint64_t id, obj, since;
    int state, worker, what;
    char name[ASYNC_FIBER_NAME_MAX];
} la_drec_t;

/* Copies up to cap fibers of s into r; returns how many there are. With
 * try, a list whose lock is taken is skipped (counted in *skipped). */
static size_t snap(la_sched_t *s, la_drec_t *r, size_t cap, int try, int *skipped) {
    size_t n = 0;
    for (int i = 0; i <= s->nw; i++) {
        la_flist_t *l = la_flist_at(s, i);
        if (try) {
            if (!spin_trylock(&l->lk)) {
                (*skipped)++;
                continue;
            }
        } else {
            la_spin_lock(&l->lk);
        }
        for (la_fiber_t *f = l->head; f; f = f->all_next, n++) {
            if (n >= cap) continue;
            la_drec_t *d = &r[n];
            la_wk_t *wk = __atomic_load_n(&f->wk, __ATOMIC_RELAXED);
            d->id = f->id;
            d->state = atomic_load_explicit(&f->state, memory_order_relaxed);
            d->worker = wk ? wk->idx : -1;
            d->what = atomic_load_explicit(&f->wait_what, memory_order_relaxed);
            d->obj = atomic_load_explicit(&f->wait_obj, memory_order_relaxed);
            d->since = atomic_load_explicit(&f->wait_since, memory_order_relaxed);
            memcpy(d->name, f->name, sizeof d->name);
            d->name[sizeof d->name - 1] = 0;
        }
        la_spin_unlock(&l->lk);
    }
    return n;
}

/* ---- formatting (async-signal-safe: no stdio, no malloc, no lock) ------------------- */

typedef struct {
    int fd;
    int err; /* errno of a failed write, or 0 */
    size_t n;
    char b[512];
} la_out_t;

static void out_flush(la_out_t *o) {
    size_t off = 0;
    while (off < o->n && !o->err) {
#if !defined(_WIN32)
        /* a pipe whose reader left is ASYNC_E_SYS (EPIPE), not a SIGPIPE
         * that kills the host (also in the dump-on-signal handler) */
        ssize_t w = la_write_nosigpipe(o->fd, o->b + off, o->n - off);
        int e = w < 0 ? (int)-w : 0;
#else
        ssize_t w = write(o->fd, o->b + off, o->n - off);
        int e = w < 0 ? errno : 0;
#endif
        if (w > 0)
            off += (size_t)w;
        else if (e == EINTR)
            continue;
        else
            o->err = w < 0 ? e : EIO;
    }
    o->n = 0;
}

static void out_s(la_out_t *o, const char *s) {
    for (; *s; s++) {
        if (o->n == sizeof o->b) out_flush(o);
        o->b[o->n++] = *s;
    }
}

static void out_u(la_out_t *o, uint64_t v) {
    char t[24];
    int k = 0;
    do {
        t[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    char u[24];
    for (int i = 0; i < k; i++) u[i] = t[k - 1 - i];
    u[k] = 0;
    out_s(o, u);
}

/* Writes pre, v in decimal, then post. */
static void out_num(la_out_t *o, const char *pre, uint64_t v, const char *post) {
    out_s(o, pre);
    out_u(o, v);
    out_s(o, post);
}

static void out_x(la_out_t *o, uint64_t v) {
    char u[20] = "0x";
    int k = 0;
    char t[16];
    do {
        t[k++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    for (int i = 0; i < k; i++) u[2 + i] = t[k - 1 - i];
    u[2 + k] = 0;
    out_s(o, u);
}

static const char *state_name(int st) {
    switch (st) {
    case LA_FS_NEW:
    case LA_FS_RUNNABLE:
    case LA_FS_NOTIFIED: return "runnable";
    case LA_FS_RUNNING: return "running";
    case LA_FS_PARKING:
    case LA_FS_PARKED: return "parked";
    case LA_FS_DONE: return "done-unjoined";
    default: return "?";
    }
}

/* The words before the object's address, for a park on an object. */
static const char *object_wait(int what) {
    switch (what) {
    case LA_WAIT_CHAN_SEND: return ": chan send ";
    case LA_WAIT_CHAN_RECV: return ": chan recv ";
    case LA_WAIT_BLOCKING: return ": blocking call ";
    case LA_WAIT_QUEUE_READ: return ": queue read ";
    case LA_WAIT_SCOPE: return ": scope join ";
    default: return ": queue write ";
    }
}

static void out_wait(la_out_t *o, const la_drec_t *d, uint64_t now_ns) {
    uint64_t obj = d->obj;
    switch (d->what) {
    case LA_WAIT_SLEEP:
        out_num(o, ": sleep, wakes in ", obj > now_ns ? (obj - now_ns) / 1000000u : 0, " ms");
        break;
    case LA_WAIT_JOIN:
        out_num(o, ": join of fiber ", obj, "");
        break;
    case LA_WAIT_CHAN_SEND:
    case LA_WAIT_CHAN_RECV:
    case LA_WAIT_BLOCKING:
    case LA_WAIT_QUEUE_READ:
    case LA_WAIT_QUEUE_WRITE:
    case LA_WAIT_SCOPE:
        out_s(o, object_wait(d->what));
        out_x(o, obj);
        break;
    case LA_WAIT_SELECT:
        out_num(o, ": select of ", obj, " operations");
        break;
    case LA_WAIT_FD: {
        unsigned dirs = (unsigned)(obj >> 32);
        out_num(o, ": fd ", (uint32_t)obj, dirs == 3 ? " read+write" : dirs == 2 ? " write" : " read");
        break;
    }
    default: break;
    }
}

static void out_rec(la_out_t *o, const la_drec_t *d, uint64_t now_ns, uint64_t now_coarse) {
    out_num(o, "fiber ", d->id, " \"");
    out_s(o, d->name);
    out_s(o, "\" ");
    out_s(o, state_name(d->state));
    if (d->state == LA_FS_RUNNING && d->worker >= 0) {
        out_num(o, " on worker ", (uint64_t)d->worker, "");
    }
    if (d->state == LA_FS_PARKING || d->state == LA_FS_PARKED) {
        out_wait(o, d, now_ns);
        if (d->what != LA_WAIT_NONE) {
            out_num(o, ", for ", now_coarse > d->since ? (now_coarse - d->since) / 1000000u : 0, " ms");
        }
    }
    out_s(o, "\n");
}

/* Writes the dump of the n records (of total fibers) to o. */
static void out_dump(la_out_t *o, la_sched_t *s, const la_drec_t *r, size_t n, size_t total, int skipped,
                     int signo) {
    uint64_t now_ns = la_now_ns(), now_coarse = la_coarse_ns();
    out_s(o, "libasync: sched ");
    out_x(o, s->handle);
    out_num(o, ": ", (uint64_t)s->nw, " workers, ");
    out_num(o, "", total, " fibers");
    if (signo) out_num(o, " (signal ", (uint64_t)signo, ")");
    out_s(o, "\n");
    for (size_t i = 0; i < n; i++) out_rec(o, &r[i], now_ns, now_coarse);
    out_num(o, "libasync: end of dump: ", n, " fibers listed");
    if (total > n) out_num(o, ", ", total - n, " not listed");
    if (skipped) out_num(o, ", ", (uint64_t)skipped, " fiber lists skipped (locked)");
    out_s(o, "\n");
    out_flush(o);
}

int async_sched_dump(async_sched_t *sh, int fd) {
    LA_ENTRY(-1);
    if (fd < 0) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    la_sched_t *s = la_sched_use(sh);
    if (!s) return -1;
    size_t cap = 256, total = 0;
    la_drec_t *r = NULL;
    for (int tries = 0; tries < 8; tries++) {
        la_drec_t *nr = realloc(r, cap * sizeof *r);
        if (!nr) {
            free(r);
            la_sched_put(s);
            la_set_error(ASYNC_E_NOMEM);
            return -1;
        }
        r = nr;
        int skipped = 0;
        total = snap(s, r, cap, 0, &skipped);
        if (total <= cap) break;
        cap = total + total / 4 + 16; /* grew meanwhile: a larger buffer */
    }
    size_t n = total < cap ? total : cap;
    la_out_t o = {.fd = fd};
    /* write(2) (and sigtimedwait after EPIPE) are cancellation points: a
     * host thread whose deferred cancel is pending was unwound in there
     * with s pinned (la_sched_get), and async_sched_destroy then waited for
     * ever for the pin; and no libasync call is a cancellation point. */
    int cs = LA_CANCEL_KEPT;
    la_nocancel_enter(&cs);
    out_dump(&o, s, r, n, total, 0, 0);
    la_nocancel_leave(&cs);
    free(r);
    la_sched_put(s);
    if (o.err) {
        la_set_error_os(ASYNC_E_SYS, o.err);
        return -1;
    }
    return (int)n;
}

#if !defined(_WIN32)
/* ---- dump on a signal ---------------------------------------------------------------- */

#define LA_SIGREG 64
#define LA_SIGCAP 4096
#define LA_NSIG 65

typedef struct {
    _Atomic(la_sched_t *) s; /* set last, cleared first */
    _Atomic int signo, fd;
    _Atomic int inuse; /* handlers looking at this entry */
    _Atomic int busy;  /* a handler is using buf */
    la_drec_t *buf;    /* LA_SIGCAP records */
} la_sigreg_t;

static la_sigreg_t sigreg[LA_SIGREG];
static pthread_mutex_t sig_mu = PTHREAD_MUTEX_INITIALIZER; /* registrations */
static int sig_users[LA_NSIG]; /* registrations per signal (under sig_mu) */

/* Called by the common handler of base/sigown.c (one owner of the signal's
 * disposition, shared with the signal watches), which saves errno. Returns
 * 1 if a registration took the signal. A registration is published before
 * la_sigown_take installs the handler and withdrawn only after
 * la_sigown_drop put the host's action back: a signal that finds none is
 * raised again for the host's action (base.h). */
static int dump_signal(int signo) {
    int saved = errno, taken = 0;
    /* The handler runs on whatever thread the signal hit: a host thread
     * whose deferred cancel is pending was unwound at the dump's write(2)
     * with inuse counted and busy set (every later dump said "already
     * running", and unregistering, async_sched_destroy, waited for ever).
     * pthread_setcancelstate only flips the thread's cancel bits (glibc,
     * musl, macOS), so it is safe in a handler. */
    int cs = LA_CANCEL_KEPT;
    la_nocancel_enter(&cs);
    for (int i = 0; i < LA_SIGREG; i++) {
        la_sigreg_t *g = &sigreg[i];
        atomic_fetch_add(&g->inuse, 1);
        la_sched_t *s = atomic_load(&g->s);
        if (s && atomic_load(&g->signo) == signo) {
            taken = 1;
            la_out_t o = {.fd = atomic_load(&g->fd)};
            if (atomic_exchange(&g->busy, 1) == 0) {
                int skipped = 0;
                size_t total = snap(s, g->buf, LA_SIGCAP, 1, &skipped);
                out_dump(&o, s, g->buf, total < LA_SIGCAP ? total : LA_SIGCAP, total, skipped, signo);
                atomic_store(&g->busy, 0);
            } else {
                out_s(&o, "libasync: sched dump already running in another handler\n");
                out_flush(&o);
            }
        }
        atomic_fetch_sub(&g->inuse, 1);
    }
    la_nocancel_leave(&cs);
    errno = saved;
    return taken;
}

static int signo_ok(int signo) {
    switch (signo) {
    case SIGHUP:
    case SIGINT:
    case SIGQUIT:
    case SIGUSR1:
    case SIGUSR2:
    case SIGTERM:
    case SIGWINCH: return 1;
#if defined(SIGRTMIN) && defined(SIGRTMAX)
    default: return signo >= SIGRTMIN && signo <= SIGRTMAX && signo < LA_NSIG;
#else
    default: return 0; /* no real-time signals (macOS) */
#endif
    }
}

/* Withdraws registration g (under sig_mu): the signal's last one drops
 * the signal first (the host's action is back before g stops taking it);
 * waits for handlers using g. */
static void sig_withdraw_locked(la_sigreg_t *g) {
    int signo = atomic_load(&g->signo);
    if (--sig_users[signo] == 0) la_sigown_drop(signo, LA_SIGOWN_DUMP);
    atomic_store(&g->s, NULL);
    while (atomic_load(&g->inuse) != 0) sched_yield();
    free(g->buf);
    g->buf = NULL;
}

/* Drops s's registration (under sig_mu); waits for handlers using it. */
static void sig_unregister_locked(la_sched_t *s) {
    for (int i = 0; i < LA_SIGREG; i++)
        if (atomic_load(&sigreg[i].s) == s) sig_withdraw_locked(&sigreg[i]);
}

int async_sched_dump_on_signal(async_sched_t *sh, int signo, int fd) {
    LA_ENTRY(-1);
    int inval = signo != 0 && (!signo_ok(signo) || fd < 0);
    la_sched_t *s = la_sched_get(sh);
    if (!s) {
        la_set_error(inval ? ASYNC_E_INVAL : ASYNC_E_BADHANDLE);
        return -1;
    }
    int rc = 0;
    pthread_mutex_lock(&sig_mu);
    /* A call that fails leaves s with no registration (the header's
     * promise): the old one goes first, whatever the arguments. */
    sig_unregister_locked(s);
    if (inval) {
        rc = ASYNC_E_INVAL;
    } else if (signo) {
        la_sigreg_t *g = NULL;
        for (int i = 0; i < LA_SIGREG && !g; i++)
            if (!atomic_load(&sigreg[i].s) && atomic_load(&sigreg[i].inuse) == 0) g = &sigreg[i];
        la_drec_t *buf = g ? malloc(LA_SIGCAP * sizeof *buf) : NULL;
        if (!buf) {
            rc = ASYNC_E_NOMEM;
        } else {
            /* Published before the handler is installed: it takes every
             * signal from the first. */
            g->buf = buf;
            atomic_store(&g->busy, 0);
            atomic_store(&g->fd, fd);
            atomic_store(&g->signo, signo);
            atomic_store(&g->s, s);
            /* One owner of the disposition (base/sigown.c): the host's
             * action is saved by the first libasync user of signo (this or
             * a signal watch) and restored when the last goes. */
            if (sig_users[signo]++ == 0) rc = la_sigown_take(signo, LA_SIGOWN_DUMP, dump_signal); /* notes the errno */
            if (rc) sig_withdraw_locked(g); /* the drop is a no-op: nothing was taken */
        }
    }
    pthread_mutex_unlock(&sig_mu);
    la_sched_put(s);
    if (rc) {
        la_set_error(rc); /* ASYNC_E_SYS keeps the errno la_sigown_take noted */
        return -1;
    }
    return 0;
}

#else /* _WIN32: no POSIX signals */

static pthread_mutex_t sig_mu = PTHREAD_MUTEX_INITIALIZER;
static void sig_unregister_locked(la_sched_t *s) { (void)s; }

int async_sched_dump_on_signal(async_sched_t *sh, int signo, int fd) {
    LA_ENTRY(-1);
    (void)sh, (void)signo, (void)fd;
    la_set_error(ASYNC_E_NOTSUP);
    return -1;
}
#endif

/* ---- scheduler life ---------------------------------------------------------------- */

void la_tools_sched_created(la_sched_t *s) {
    pthread_mutex_lock(&dbg_mu);
    s->dbg_next = la_dbg_sched_list;
    la_dbg_sched_list = s;
    pthread_mutex_unlock(&dbg_mu);
    const char *e = getenv("ASYNC_FIBER_STALL_MS");
    if (e && *e) {
        char *end;
        long ms = strtol(e, &end, 10);
        int os = 0;
        if (*end || ms < 0 || ms > 3600000)
            la_log(ASYNC_LOG_WARN, "ASYNC_FIBER_STALL_MS=%s ignored (0 to 3600000)", e);
        else if (ms > 0 && la_stall_set(s, (int)ms, &os) != 0)
            la_log(ASYNC_LOG_WARN, "ASYNC_FIBER_STALL_MS: the stall monitor could not start");
    }
}

void la_tools_sched_gone(la_sched_t *s) {
    pthread_mutex_lock(&sig_mu);
    sig_unregister_locked(s);
    pthread_mutex_unlock(&sig_mu);
    int os = 0;
    la_stall_set(s, 0, &os);
    pthread_mutex_lock(&dbg_mu);
    for (la_sched_t **pp = &la_dbg_sched_list; *pp; pp = &(*pp)->dbg_next)
        if (*pp == s) {
            *pp = s->dbg_next;
            break;
        }
    pthread_mutex_unlock(&dbg_mu);
}
