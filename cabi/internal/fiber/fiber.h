/* Internal declarations of the fiber layer (the C files of cabi/internal/fiber). Not installed.
 *
 * Model: a scheduler (la_sched_t) owns N worker pthreads; each runs a C loop
 * (sched.c) that switches into fibers (stackful, la_ctx_switch). A
 * fiber leaves the loop's stack only through la_ctx_switch, with an action
 * telling the loop what to do next (yield, park, exit, or "trap": run a
 * function on the loop's own stack and switch straight back — the way Go
 * exports are called from fibers, see la_call_off_fiber).
 *
 * Parking protocol (never lose a wake-up, never run a fiber whose context is
 * not saved):
 *   - the fiber calls la_park_prepare(): state = PARKING, claim = 0, then
 *     registers itself with wakers (under their locks), then la_park_commit();
 *   - a waker first wins the claim with CAS(claim, 0 -> reason) (under the
 *     lock of the structure it found the fiber in) and only then calls
 *     la_fiber_wake(): PARKED -> RUNNABLE + enqueue, or PARKING -> NOTIFIED;
 *   - after the switch the loop CASes PARKING -> PARKED; if it finds NOTIFIED
 *     it enqueues the fiber itself.
 *   - after resuming, the fiber unregisters from every waker (under their
 *     locks) before it returns (a waker that unlinked it already, as a
 *     channel completing an operation does, spares it that); claim tells why
 *     it woke.
 */
#ifndef LA_FIBER_H
#define LA_FIBER_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"

#if defined(__clang__) /* clang does not clone functions (nor know noclone) */
#define LA_NOINLINE __attribute__((noinline))
#else
#define LA_NOINLINE __attribute__((noinline, noclone))
#endif

/* ---- context switch (switch_<arch>.S) ------------------------------ */
/* Saves the callee-saved state on the current stack, stores the stack pointer
 * in *save, loads `to` and resumes there. */
void la_ctx_switch(void **save, void *to);
/* First code a new fiber runs (asm): calls la_fiber_main(fiber). */
void la_ctx_trampoline(void);
/* Prepares a fresh stack [lo, hi) so that switching to the returned sp runs
 * la_fiber_main(arg). */
void *la_ctx_make(void *hi, void *arg);
#if defined(_WIN32)
/* Windows: la_ctx_make's frame for switch_windows_amd64.S (arg is the
 * la_fiber_t whose stack hi tops), with its TIB stack fields. */
void *la_ctx_make_win64(void *hi, void *arg);
#endif

/* ---- fiber states, park reasons ------------------------------------------- */
enum {
    LA_FS_NEW = 0,
    LA_FS_RUNNABLE,
    LA_FS_RUNNING,
    LA_FS_PARKING,
    LA_FS_PARKED,
    LA_FS_NOTIFIED,
    LA_FS_DONE
};

/* claim values (why a park ended) */
enum {
    LA_W_WAITING = 0,
    LA_W_READY = 1,     /* the awaited thing happened */
    LA_W_TIMEDOUT = 2,
    LA_W_CANCELLED = 3, /* scheduler shutdown, async_fiber_cancel, a scope's cancel */
    LA_W_CLOSED = 4,    /* channel closed / object destroyed */
    LA_W_STOPPED = 5,   /* async_worker_signal_stop of the waiting worker (la_wpark_t) */
    LA_W_IDLE = -1      /* not parked (initial value) */
};

/* park kinds: which cancellations end a park. NORMAL: every one (shutdown,
 * the fiber's own cancel, its deadline); SHIELDED (a NORMAL park inside
 * async_fiber_shield_begin/_end): shutdown only; BLOCKING (the blocking
 * pool, a scope join, an io_uring op's wait for its CQE): none. A park of a
 * kind other than NORMAL sets kind and claim under the fiber's clk, which a
 * canceller holds from its look at the kind to its wake-up (cancel.c). */
enum { LA_PK_NORMAL = 0, LA_PK_BLOCKING = 1, LA_PK_SHIELDED = 2 };

/* bits of la_fiber.ctl: any set sends la_park_prepare to its slow path.
 * CANCEL is set by cancellers (sticky); DEADLINE and SHIELD by the fiber
 * itself (DEADLINE: dl holds an effective deadline; SHIELD: shield > 0). */
enum { LA_CTL_CANCEL = 1, LA_CTL_DEADLINE = 2, LA_CTL_SHIELD = 4 };

typedef struct la_sched la_sched_t;
typedef struct la_wk la_wk_t;
typedef struct la_fiber la_fiber_t;

/* A list of fibers (through all_prev/all_next) under a spinlock. */
typedef struct {
    la_spin_t lk;
    la_fiber_t *head;
} la_flist_t;

typedef struct {
    char *base;      /* lowest address of the slot (guard page first) */
    size_t size;     /* usable stack bytes (above the guard); the highest
                        LA_STACK_TOP_RESERVE of them hold no frame */
    uint32_t arena;  /* index in the global arena table */
    uint32_t slot;
} la_stack_t;
/* canary mode keeps its top canary there (stacks.c) */
#define LA_STACK_TOP_RESERVE 64
#if defined(_WIN32)
/* stacks_windows.c writes it in the first word of the top reserve of every
 * fiber stack: the overflow handler reads it at TIB StackBase - 64 to tell a
 * fiber stack from a thread's before it looks at thread-local data. */
#define LA_WIN_STACK_MAGIC 0x6c61666962657221ULL
/* stacks_windows.c: a fiber on st exited (its last frame saved at sp): st
 * keeps what it committed so far for the next fiber's TIB StackLimit. */
void la_stack_win_exit(la_stack_t *st, void *sp, size_t page);
#endif

struct la_fiber {
    /* The fields every dispatch and park touch come first, in the record's
     * first two cache lines (a 1000-connection echo server touches a
     * thousand records in turn; the single-worker look-ahead prefetches
     * these two lines, sched.c prefetch_ahead). */
    void *sp; /* saved stack pointer while switched out */
    _Atomic int state;
    _Atomic int claim;
    _Atomic int park_kind;
    _Atomic int ctl; /* LA_CTL_* */
    la_sched_t *s;
    la_wk_t *wk; /* the worker it last ran on (stored relaxed: dumps read it racily) */
    uint64_t id;
    /* debugging (tools.c: async_sched_dump, gdb): what the fiber parks on
     * (LA_WAIT_*) and since when (coarse monotonic ns), written by the
     * fiber itself before it parks, read racily by dumps */
    _Atomic uint64_t wait_obj;
    _Atomic uint64_t wait_since;
    _Atomic int wait_what;
    unsigned flags;
    int last_error;
    int last_os_error; /* with last_error == ASYNC_E_SYS: the errno */
    la_stack_t stack;
    void (*fn)(void *);
    void *arg;
    uint64_t handle;
    void *asan_fake;
    void *tsan_fiber; /* TSan's context of the fiber (TSan hosts), NULL until it first runs */
    la_fiber_t *next; /* run queues */
    la_fiber_t *all_prev, *all_next; /* in *home: the fibers of the scheduler */
    la_flist_t *home;
    uint32_t hidx; /* handle slot, kept reserved while the record is cached */
    /* timer (timers.c): the deadline of the timed park (0: none; under
     * s->tmu) and whether the record has an entry in s's heap */
    uint64_t tdl;
    _Atomic unsigned char tq;
    /* join */
    la_spin_t jlk;
    int done;
    _Atomic int joining;
    struct la_waiter *joiner;
    /* fiber-local values (fls.c): NULL until the fiber sets one, NULL again
     * once la_fls_fiber_exit ran */
    struct la_fls *fls;
    /* (async_fiber_set_name, async_sched_dump, gdb): written and read
     * under home->lk */
    char name[32]; /* ASYNC_FIBER_NAME_MAX, NUL-terminated */
    /* cancellation and deadlines (cancel.c, scope.c): clk orders a
     * canceller's look at park_kind and its CAS of claim against a park of
     * another kind; shield, dl and odl are the fiber's own. dl: effective
     * deadline (min of odl and the scope's, 0: none); scope and sc_prev /
     * sc_next (its place in the scope's list) change under the scheduler's
     * scmu. */
    la_spin_t clk;
    int shield;
    uint64_t dl, odl;
    struct la_scope *scope;
    la_fiber_t *sc_prev, *sc_next;
};

/* ---- worker parking (waiters.c) -------------------------------------------- */
/* The parking spot of an async_worker thread, in its worker record: a stop
 * flag and a futex word that every wake-up of that thread's stoppable waits
 * bumps. la_wpark_stop is lock-free and async-signal-safe (a store, an add
 * and a futex wake), which is what lets async_worker_signal_stop stay
 * async-signal-safe while it wakes the worker's own waits. */
typedef struct la_wpark {
    _Atomic uint32_t seq;
    _Atomic int stop;
    _Atomic int pins; /* wakers between their claim and their kick */
} la_wpark_t;
/* The calling thread's worker spot (set by the worker thread itself for its
 * whole life), or NULL on any other thread. The sleep is a futex on Linux,
 * WaitOnAddress on Windows (stubs_windows.c). */
void la_wpark_set_self(la_wpark_t *p);
la_wpark_t *la_wpark_self(void);
/* Sets the stop flag and wakes the stoppable wait of p's thread, if any.
 * Returns 1 the first time. */
int la_wpark_stop(la_wpark_t *p);
/* The worker thread's last word: waits until no waker still holds p pinned
 * (la_waiter_wake_later), so that the record can be freed. */
void la_wpark_drain(la_wpark_t *p);

/* What a parked fiber waits on (async_sched_dump); the obj of each. */
enum {
    LA_WAIT_NONE = 0,
    LA_WAIT_SLEEP,     /* obj: deadline (la_now_ns) */
    LA_WAIT_JOIN,      /* obj: id of the joined fiber */
    LA_WAIT_CHAN_SEND, /* obj: channel handle */
    LA_WAIT_CHAN_RECV, /* obj: channel handle */
    LA_WAIT_SELECT,    /* obj: number of operations */
    LA_WAIT_FD,        /* obj: fd | directions (1 read, 2 write) << 32 */
    LA_WAIT_BLOCKING,  /* obj: the function's address */
    LA_WAIT_QUEUE_READ,  /* obj: queue handle */
    LA_WAIT_QUEUE_WRITE, /* obj: queue handle */
    LA_WAIT_SCOPE,       /* obj: scope handle (async_scope_join) */
    LA_WAIT_KINDS
};

/* A coarse monotonic clock in ns (a few ms resolution, a few ns to read). */
uint64_t la_coarse_ns(void);
/* la_coarse_ns as the worker running f last read it (sched.c): behind by
 * at most the worker's last 16 dispatches, and no clock read (a read per
 * park cost 10% of a channel round trip). */
uint64_t la_fiber_coarse_now(la_fiber_t *f);

/* Records on f (the calling fiber; NULL: a plain thread, nothing to do) what
 * it is about to park on and when. */
static inline void la_fiber_note(la_fiber_t *f, int what, uint64_t obj) {
    if (!f) return;
    atomic_store_explicit(&f->wait_what, what, memory_order_relaxed);
    atomic_store_explicit(&f->wait_obj, obj, memory_order_relaxed);
    atomic_store_explicit(&f->wait_since, la_fiber_coarse_now(f), memory_order_relaxed);
}

/* ---- waiters (a fiber or a plain thread blocked on something) ------------- */
typedef struct la_waiter {
    la_fiber_t *f; /* NULL: a plain thread */
    la_wpark_t *park; /* a worker thread's stoppable wait (la_waiter_init_park) */
    _Atomic int *claim;
    _Atomic int tclaim;
    int signalled;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} la_waiter_t;

/* Prepares w for the calling context. Returns 0, or an async_err_t
 * (ASYNC_E_CANCELLED when the fiber's scheduler is shutting down). */
int la_waiter_init(la_waiter_t *w, int kind);
/* Prepares w for a wait of the calling worker thread (p = la_wpark_self())
 * that la_wpark_stop(p) ends with LA_W_STOPPED. Returns 0, or
 * ASYNC_E_CANCELLED at once when p was already stopped (a stop signalled
 * before the wait began is not lost). */
int la_waiter_init_park(la_waiter_t *w, la_wpark_t *p);
/* Claims w with `reason` and wakes it; 1 if this call won the claim. Must be
 * called while w is known to be alive (under the lock of the structure w is
 * registered in). */
int la_waiter_wake(la_waiter_t *w, int reason);
/* Like la_waiter_wake, but a worker thread's waiter (la_waiter_init_park) is
 * only claimed: its spot is pinned and stored in *kick (when *kick is NULL;
 * otherwise it is woken at once), and the caller wakes it with
 * la_wpark_kick_unpin once it has released its lock, so that the woken
 * thread does not run straight into that lock. */
int la_waiter_wake_later(la_waiter_t *w, int reason, la_wpark_t **kick);
void la_wpark_kick_unpin(la_wpark_t *p);
/* Blocks/parks until claimed or until deadline_ns (0: none). Returns the
 * claim reason. Call la_waiter_done afterwards. */
int la_waiter_wait(la_waiter_t *w, uint64_t deadline_ns);
void la_waiter_done(la_waiter_t *w);
/* deadline in ns from a timeout in ms (-1: 0 = none). */
int la_reason_err(int reason);

/* ---- scheduler internals shared by the fiber_*.c files ------------------ */
/* The fiber running on this thread, or NULL (plain thread or worker loop). */
la_fiber_t *la_current_fiber(void);
la_wk_t *la_current_worker(void);
/* Makes a claimed fiber runnable (state machine above). */
void la_fiber_wake(la_fiber_t *f);
/* Park the current fiber (after la_park_prepare + registration). */
void la_park_commit(la_fiber_t *f);
int la_park_prepare(la_fiber_t *f, int kind);
/* cancel.c: the slow path of la_park_prepare (ctl set, s shutting down, or
 * a kind other than NORMAL). */
int la_park_prepare_slow(la_fiber_t *f, int kind);
/* Ends a park f published (claim WAITING) before it registered anywhere:
 * f runs on; returns rc. */
int la_park_back_out(la_fiber_t *f, int rc);
/* What the current park of f (DEADLINE set) waits until: for a NORMAL park
 * the earlier of the call's deadline (0: none) and f->dl, else the call's. */
uint64_t la_park_deadline(la_fiber_t *f, uint64_t deadline);
/* Ends f's current park with LA_W_CANCELLED if its kind allows (shutdown:
 * 1 for the scheduler's, which ends SHIELDED parks too). */
void la_fiber_cancel_park(la_fiber_t *f, int shutdown);
/* Sets f's cancel bit, then ends its current park (f kept alive by the
 * caller). */
void la_fiber_cancel(la_fiber_t *f);
/* Recomputes f->dl (and its ctl bit) from its own deadline and its scope's:
 * by f itself, or before f runs. */
void la_fiber_deadline_update(la_fiber_t *f);
/* scope.c: a fiber of a scope returned (the worker loop, before its record
 * is released or marked done); the scheduler's scopes at its destroy. */
void la_scope_fiber_exit(la_fiber_t *f);
void la_scopes_free(la_sched_t *s);
/* scope.c: a scope's effective deadline (fixed at its creation; 0: none) */
uint64_t la_scope_deadline(const struct la_scope *sc);
/* scope.c, for async_scope_spawn: puts the new fiber f (not yet runnable)
 * into the scope behind handle h on s; 0 or an async_err_t. */
int la_scope_enter(la_sched_t *s, uint64_t h, la_fiber_t *f);
/* timers */
void la_timer_add(la_sched_t *s, la_fiber_t *f, uint64_t deadline);
void la_timer_del(la_sched_t *s, la_fiber_t *f);
/* Removes f's timer entry, if any (the record is released). tq is set
 * only by f's own parks, all before its release: a 0 read here is not
 * stale. A worker that took the entry away stored the 0 with release
 * after its last look at f: the acquire orders that look before the
 * record's reuse or free. */
void la_timer_forget_slow(la_sched_t *s, la_fiber_t *f);
static inline void la_timer_forget(la_sched_t *s, la_fiber_t *f) {
    if (atomic_load_explicit(&f->tq, memory_order_acquire)) la_timer_forget_slow(s, f);
}

/* Parks f (the calling fiber, its park prepared and registered) until
 * claimed or until deadline (0: none; the fiber's own deadline bounds a
 * NORMAL park too). Returns the claim reason. */
static inline int la_fiber_park_until(la_fiber_t *f, uint64_t deadline) {
    la_sched_t *s = f->s;
    if (atomic_load_explicit(&f->ctl, memory_order_relaxed) & LA_CTL_DEADLINE)
        deadline = la_park_deadline(f, deadline); /* the earlier of the call's and the fiber's */
    if (deadline) la_timer_add(s, f, deadline);
    la_park_commit(f);
    int r = atomic_load(&f->claim);
    if (deadline && r != LA_W_TIMEDOUT) la_timer_del(s, f);
    return r;
}

/* ---- stacks (stacks.c) ---------------------------------------------- */
typedef struct la_stackpool la_stackpool_t;
/* A stack pool's guard mode: the values of async_sched_config_t.guard_mode
 * (include/async.h; stacks.c tells what each does). */
enum { LA_GUARD_AUTO = 0, LA_GUARD_MADVISE = 1, LA_GUARD_MPROTECT = 2, LA_GUARD_CANARY = 3 };
la_stackpool_t *la_stackpool_new(size_t stack_size, int guard_mode);
void la_stackpool_free(la_stackpool_t *p);
int la_stack_get(la_stackpool_t *p, la_stack_t *out, uint64_t fiber_id);
void la_stack_put(la_stackpool_t *p, la_stack_t *st);
/* Up to n stacks (fewer when the pool has fewer free and more than none),
 * owned by nobody; the count, or -async_err_t. One lock for the batch. */
int la_stack_get_many(la_stackpool_t *p, la_stack_t *out, int n);
void la_stack_put_many(la_stackpool_t *p, const la_stack_t *st, int n);
/* Records which fiber uses st (for the overflow message; 0: none). */
void la_stack_own(const la_stack_t *st, uint64_t fiber_id);
int la_stackpool_guard_mode(la_stackpool_t *p);
/* canary mode: 1 if the canary of st is intact */
int la_stack_canary_ok(la_stackpool_t *p, const la_stack_t *st);
/* canary mode: aborts with a report if either canary of fiber id's stack is
 * broken (at every switch out, before every resume and at exit) */
void la_stack_check(la_stackpool_t *p, const la_stack_t *st, uint64_t id);
/* signal handler helper (canary mode): a live fiber whose lowest canary is
 * broken, or 0; *top_broken: one whose top canary is broken, or 0 */
uint64_t la_stack_canary_scan(uint64_t *top_broken);
/* prints "libasync: fiber stack overflow" + what + id + how, aborts
 * (stacks.c, stacks_windows.c: each platform dies its own way) */
void la_stack_report_abort(const char *what, uint64_t fiber_id, const char *how);
/* formats that report into buf (size >= 128; async-signal-safe;
 * stack_report.c); returns its length */
size_t la_stack_report_format(char *buf, size_t size, const char *what, uint64_t fiber_id, const char *how);
/* signal handler helper: fiber id whose guard page holds addr, or 0 */
uint64_t la_stack_guard_hit(uintptr_t addr, int *is_guard);
void la_stack_overflow_abort(uint64_t fiber_id, const char *how);

/* ---- signals (signals.c) ----------------------------------------------- */
int la_sig_install(void);
void la_sig_thread_init(void **altstack);
void la_sig_thread_fini(void *altstack);

/* ---- ASan fiber annotations (weak: present only in ASan hosts) ---------- */
#if defined(__APPLE__)
/* Mach-O links no weak undefined symbol without -undefined dynamic_lookup
 * (the symbol must be in a linked dylib): no annotations on darwin, where
 * an ASan host would see the fiber stacks as unknown memory. */
#define __sanitizer_start_switch_fiber ((void (*)(void **, const void *, size_t))0)
#define __sanitizer_finish_switch_fiber ((void (*)(void *, const void **, size_t *))0)
#else
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size)
    __attribute__((weak));
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old)
    __attribute__((weak));
#endif

/* ---- TSan fiber annotations (weak: present only in TSan hosts) ----------
 * Each fiber that runs has a TSan fiber context (sched.c: created on its
 * first run, destroyed when it finished), each worker thread its own
 * (taken on the worker); every la_ctx_switch is preceded by a switch of
 * TSan's context to the side it resumes. Not on darwin (as above). */
#if defined(__APPLE__)
#define __tsan_get_current_fiber ((void *(*)(void))0)
#define __tsan_create_fiber ((void *(*)(unsigned))0)
#define __tsan_destroy_fiber ((void (*)(void *))0)
#define __tsan_switch_to_fiber ((void (*)(void *, unsigned))0)
#define __tsan_acquire ((void (*)(void *))0)
#define __tsan_release ((void (*)(void *))0)
#else
void *__tsan_get_current_fiber(void) __attribute__((weak));
void *__tsan_create_fiber(unsigned flags) __attribute__((weak));
void __tsan_destroy_fiber(void *fiber) __attribute__((weak));
void __tsan_switch_to_fiber(void *fiber, unsigned flags) __attribute__((weak));
void __tsan_acquire(void *addr) __attribute__((weak));
void __tsan_release(void *addr) __attribute__((weak));
#endif
/* A hand-off TSan cannot see (through the kernel): la_tsan_release(a) on
 * the side that hands over, la_tsan_acquire(a) on the side that takes. */
static inline void la_tsan_release(void *a) {
    if (__tsan_release) __tsan_release(a);
}
static inline void la_tsan_acquire(void *a) {
    if (__tsan_acquire) __tsan_acquire(a);
}

/* ---- Go calls from fibers (offstack.c) ------------------------------------ */
/* Runs fn(arg) off any fiber stack: on a fiber, on its worker's own stack
 * (a "trap"); elsewhere, directly. The way every Go export is called. */
void la_call_off_fiber(void (*fn)(void *), void *arg);
/* Starts Go's own poller once per process, off any fiber stack (best effort:
 * at the descriptor limit it stays unstarted and a later call tries again);
 * one load when it is up. See cabi/internal/base/gopoller.go. */
void la_ensure_go_poller(void);
void la_fiber_trap(void (*fn)(void *), void *arg);


/* ---- fiber-local storage (fls.c) ------------------------------------------- */
/* Runs the destructors of the running fiber f's values and frees them (its
 * function returned; on its stack). */
void la_fls_fiber_exit(la_fiber_t *f);

/* ---- errors of the current fiber ----------------------------------------- */
int *la_fiber_error_slot(void);
int *la_fiber_os_error_slot(void);

#endif
