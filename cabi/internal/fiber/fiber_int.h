/* Scheduler and worker structures (internal to the fiber_*.c files). */
#ifndef LA_FIBER_INT_H
#define LA_FIBER_INT_H

#if !defined(_WIN32)
#include <signal.h> /* la_block_sigpipe */
#endif

#include "fiber.h"
#include "poller.h"

#define LA_RUNQ 256
#define LA_MAX_WORKERS 1024

#define LA_SCACHE 128 /* stacks a worker keeps (spill/refill half) */
#define LA_FCACHE 128 /* fiber records a worker keeps */

enum { LA_ACT_YIELD = 1, LA_ACT_PARK, LA_ACT_EXIT, LA_ACT_TRAP };

typedef struct la_uring la_uring_t; /* io_uring.c (Linux) */

/* Single-writer counter: relaxed load + store, no locked instruction. */
#define LA_BUMP(c) atomic_store_explicit(&(c), atomic_load_explicit(&(c), memory_order_relaxed) + 1, memory_order_relaxed)

struct la_wk {
    la_sched_t *s;
    int idx;
    pthread_t th;
    void *loop_sp;
    la_fiber_t *cur; /* running fiber (also during a trap) */
    int in_trap;
    int action;
    void (*trap_fn)(void *);
    void *trap_arg;
    int lifo_streak;
    uint32_t tick;
    uint64_t rng;
    void *asan_fake;
    void *tsan_self; /* TSan's context of this worker thread (TSan hosts) */
    const void *stk_bottom;
    size_t stk_size;
    _Atomic uint64_t n_run, n_started, n_steal, n_park; /* written by this worker only */
    _Atomic uint64_t n_spawned, n_finished;
    _Atomic uint64_t run_id; /* id of the fiber it runs, 0 in its loop (stall monitor) */
    /* fd parks begun on this worker minus those ended on it (a fiber may
     * park on one worker and resume on another): written by this worker
     * only, summed by la_fd_waiters. A shared counter here cost two locked
     * read-modify-writes per park, on a line every worker bounced. */
    _Atomic long fdwait;
    /* A coarse clock of this worker (la_coarse_ns), read every 16th dispatch
     * and after an idle sleep, so that a park can note when it began
     * (async_sched_dump) without a clock read of its own: worker-only. */
    uint64_t coarse;
    uint32_t coarse_tick;
    /* periodic fd polls skipped in a row for want of room in the ring
     * (sched.c, find_work): worker-only */
    uint32_t poll_skips;
    /* Caches of this worker (touched by it only): finished fiber records
     * (each keeping its reserved handle slot), stacks, fiber ids. */
    la_fiber_t *fcache;
    int nfcache, nscache;
    uint64_t id_next, id_end;
    int64_t lease; /* units of s->live held in reserve (see live_take) */
    la_stack_t scache[LA_SCACHE];
    /* the live fibers spawned on this worker (f->home) */
    la_flist_t fl;
    la_uring_t *ur; /* this worker's io_uring (ASYNC_FIBER_IO=uring), or NULL */
    _Alignas(64) _Atomic uint32_t head;
    _Atomic uint32_t tail;
    /* apart from head and tail: a spinning worker's sweeps read those, and
     * must not take the line its owner writes on every wake-up */
    _Alignas(64) _Atomic(la_fiber_t *) runnext;
    _Alignas(64) _Atomic(la_fiber_t *) ring[LA_RUNQ];
} __attribute__((aligned(64)));

typedef struct la_fdrec la_fdrec_t;

/* A slot of a scheduler's timer heap (timers.c). */
typedef struct {
    uint64_t deadline;
    la_fiber_t *f;
    uint32_t hidx; /* f->hidx, the index of f's position in tpos */
} la_tslot_t;

struct la_sched {
    uint64_t handle;
    _Atomic int refs;
    int nw;
    size_t page;
    la_wk_t *wks;
    la_stackpool_t *pool;
    /* global run queue: overflow of the workers' rings (under gmu) */
    pthread_mutex_t gmu;
    la_fiber_t *ghead, *gtail;
    _Atomic size_t glen;
    /* fibers readied by threads outside s: a lock-free stack (push: CAS;
     * a worker takes all with one exchange) */
    _Alignas(64) _Atomic(la_fiber_t *) inbox;
    /* idle workers: nspinning counts the workers looking for work plus the
     * sleepers woken to look (a sleeper that takes one of `wakeups`, or the
     * poller woken while poll_spin is set, inherits the waker's unit) */
    _Alignas(64) _Atomic int nidle, nspinning;
    pthread_mutex_t imu;
    pthread_cond_t icv;
    int nsleep, wakeups, poll_kicked, poll_spin;
    /* a worker sits in the fd poller: written under imu, read without it
     * (la_poller_busy) */
    _Atomic int poller_active;
    _Atomic int stopping; /* destroy: workers exit */
    _Atomic int shutdown; /* parks are cancelled */
    _Atomic int destroying; /* async_sched_destroy began (joins refuse to pin s) */
    /* fds */
    la_poller_t poller;
    pthread_mutex_t fdmu;
    _Atomic(la_fdrec_t *) *fdchunks;
    /* timers */
    pthread_mutex_t tmu;
    la_tslot_t *heap;
    size_t hlen, hcap;
    int32_t *tpos; /* by handle slot: heap index, -1 when not in the heap */
    size_t tposcap;
    _Atomic uint64_t next_deadline;
    /* fibers: every live or unjoined fiber is in the list of the worker
     * that spawned it, or in fl when a plain thread did */
    pthread_mutex_t fmu; /* with fcv: wait_idle */
    pthread_cond_t fcv;
    la_flist_t fl;
    _Atomic int64_t live;
    _Atomic uint64_t spawned; /* by plain threads */
    /* stall.c: the stall monitor (NULL: off); tools.c: the list gdb walks */
    struct la_stallmon *stall;
    la_sched_t *dbg_next;
    /* io_uring.c: the workers' rings (NULL: fiber I/O goes through the
     * poller) and its one-reader-one-writer bits per fd */
    la_uring_t *uring;
    struct la_ubusy *ubusy;
    /* scope.c: the scope tree (children, fiber lists, joiners) and the list
     * of s's scopes, under scmu */
    pthread_mutex_t scmu;
    struct la_scope *scopes;
};

la_sched_t *la_sched_get(async_sched_t *h);
/* la_sched_get for an API call's handle: NULL with ASYNC_E_BADHANDLE set. */
la_sched_t *la_sched_use(async_sched_t *h);
void la_sched_put(la_sched_t *s);
int la_waiter_claim(la_waiter_t *w, int reason);
void la_waiter_signal(la_waiter_t *w);
size_t la_stackpool_stack_size(la_stackpool_t *p);

/* for the public functions of api.c: sched_fibers.c (fiber records, lists,
 * the live count) and sched.c (the poller kick, readying, switching out, the
 * worker thread) */
la_fiber_t *la_fiber_new(la_sched_t *s, la_wk_t *w, int *rc);
/* async_fiber_spawn, into the scope behind handle scope when not 0
 * (async_scope_spawn) */
async_fiber_t *la_fiber_spawn_in(async_sched_t *sh, uint64_t scope, void (*fn)(void *), void *arg, unsigned flags);
void la_fiber_release(la_fiber_t *f, la_wk_t *w);
void la_flist_add(la_flist_t *l, la_fiber_t *f);
la_flist_t *la_flist_at(la_sched_t *s, int i);
void la_flist_del(la_fiber_t *f);
void la_kick_poller(la_sched_t *s);
void la_live_take(la_wk_t *w);
void la_live_drop(la_sched_t *s, int64_t n);
void la_ready_on(la_wk_t *w, la_fiber_t *f, int lifo);
void la_switch_out(la_fiber_t *f, int action);
void *la_worker_main(void *arg);

/* sched.c, for sched_idle.c: a worker's take of the global queue (a fair
 * share, up to max: one to run, the rest into w's ring), of the inbox, of
 * its own ring and LIFO slot; a non-blocking poll of the fds (the number of
 * fd events). */
la_fiber_t *la_global_get(la_sched_t *s, la_wk_t *w, int max);
la_fiber_t *la_inbox_get(la_sched_t *s, la_wk_t *w);
la_fiber_t *la_local_get(la_wk_t *w);
int la_poll_now(la_sched_t *s);

/* sched_idle.c, for the worker loop (sched.c). la_spin: looks for work in
 * the other workers' rings, the global queue and the inbox (bounded == 0:
 * one sweep that also takes LIFO slots; else sweeps for up to LA_SPIN_NS,
 * then that one). la_idle_park: sleeps until woken (the first idle worker in
 * the poller); 1 if a waker handed it a unit of nspinning. */
la_fiber_t *la_spin(la_wk_t *w, int bounded);
int la_idle_park(la_wk_t *w);

/* Becomes a spinning worker unless half of the busy workers already spin,
 * or no other worker is busy (la_spin). */
static inline int la_spin_begin(la_sched_t *s) {
    int busy = s->nw - atomic_load_explicit(&s->nidle, memory_order_relaxed); /* this one too */
    if (busy < 2 || 2 * atomic_load_explicit(&s->nspinning, memory_order_relaxed) >= busy) return 0;
    atomic_fetch_add(&s->nspinning, 1);
    return 1;
}

/* sched_fibers.c, for the worker loop: a released stack goes to w's cache
 * (w: a worker of s running this code, or NULL: to the pool). */
void la_stack_release(la_sched_t *s, la_wk_t *w, la_stack_t *st);
/* s->live counts the live fibers plus the units workers hold in reserve
 * (w->lease, LA_LEASE at a time: la_live_take). */
#define LA_LEASE 64
static inline void la_live_sub(la_sched_t *s, la_wk_t *w, int64_t n) {
    w->lease -= n;
    la_live_drop(s, n);
}

/* timers.c */
int la_timers_fire(la_sched_t *s);
static inline int la_timers_due(la_sched_t *s) {
    uint64_t d = atomic_load_explicit(&s->next_deadline, memory_order_acquire);
    return d != UINT64_MAX && d <= la_now_ns();
}
/* Fires due timers; returns how many fibers it woke. */
static inline int la_timers_run(la_sched_t *s) { return la_timers_due(s) ? la_timers_fire(s) : 0; }

/* config.c */
int la_default_workers(void);
size_t la_default_stack(void);

/* fd parks (io_park.c, io_windows.c): the current fiber f begins (+1) or ends
 * (-1) an fd wait; f->wk is the worker it runs on now. */
static inline void la_fdwait_add(la_fiber_t *f, long d) {
    la_wk_t *w = f->wk;
    atomic_store_explicit(&w->fdwait, atomic_load_explicit(&w->fdwait, memory_order_relaxed) + d,
                          memory_order_relaxed);
}
/* The checks of async_fiber_wait_fd (io_api.c, io_windows.c) before its fd:
 * 1 (the error recorded) if timeout_ms or events is not valid. */
static inline int la_wait_fd_bad_args(uint32_t events, int timeout_ms) {
    if (la_check_timeout(timeout_ms)) return 1;
    if (events == 0 || (events & ~(ASYNC_EVENT_READ | ASYNC_EVENT_WRITE))) {
        la_set_error(ASYNC_E_INVAL);
        return 1;
    }
    return 0;
}
/* The checks the buffer calls (async_fiber_read, write, recvfrom, sendto;
 * io_api.c, net_posix.c, io_windows.c) share before their fd: 1 (the error
 * recorded) if timeout_ms is not valid, buf is NULL with bytes to move, or
 * n is more than the ssize_t result can tell (ASYNC_E_INVAL here, before
 * the kernel, whose EFAULT would map to ASYNC_E_SYS). */
static inline int la_buf_bad_args(const void *buf, size_t n, int timeout_ms) {
    if (la_check_timeout(timeout_ms)) return 1;
    if ((!buf && n > 0) || n > ((size_t)-1 >> 1)) {
        la_set_error(ASYNC_E_INVAL);
        return 1;
    }
    return 0;
}
/* Whether some fiber of s may wait for an fd (a hint: the busy workers poll
 * the fds only then). */
static inline int la_fd_waiters(la_sched_t *s) {
    long n = 0;
    for (int i = 0; i < s->nw; i++) n += atomic_load_explicit(&s->wks[i].fdwait, memory_order_relaxed);
    return n > 0;
}
/* Whether a worker sits in the fd poller (a hint without imu: a stale one
 * costs a needless or a skipped non-blocking poll). */
static inline int la_poller_busy(la_sched_t *s) {
    return atomic_load_explicit(&s->poller_active, memory_order_relaxed);
}

/* io.c, io_sys.c */
#if !defined(_WIN32)
/* write(2) without SIGPIPE (a broken pipe gives -EPIPE); -errno on failure */
ssize_t la_write_nosigpipe(int fd, const void *buf, size_t n);
#endif
int la_io_init(la_sched_t *s);
void la_io_free(la_sched_t *s);
/* la_poller_wait's callback: an event (LA_PF_*) for rec; ctx is the la_sched_t. */
void la_io_event(void *ctx, void *rec, unsigned got);
void la_io_prefetch(void *rec);

/* ---- fd records (io*.c, POSIX; io.c tells the design) ---- */
#if !defined(_WIN32)
#include <sys/socket.h>
#include <sys/types.h>
#define LA_FD_CHUNK 1024
#define LA_FD_CHUNKS 4096 /* fds below 4M */

struct la_fdrec {
    la_spin_t lk;
    int fd;                /* the number (set by the first park) */
    /* parked reader / writer (under lk; rw is stored with la_fdrec_set_rw:
     * the poller's prefetch hint, la_io_prefetch, reads it without lk) */
    la_waiter_t *rw, *ww;
    _Atomic char drained;  /* hint: the last fiber read returned less than asked */
    _Atomic char stream;   /* read hint usable: stream socket or pipe (at ADD) */
    /* owned fds (see the top); owned, gen, sin and sout change under lk */
    _Atomic char owned;         /* registered edge-triggered for good */
    _Atomic char tcp;           /* owned: the read hint is usable */
    _Atomic unsigned gen;       /* bumped when an ownership ends */
    _Atomic unsigned sin, sout; /* owned: events dispatched per direction */
    _Atomic unsigned dseq;      /* owned: sin before the last short read */
};

/* What a call saw of its fd's record before its syscall (owned fds), and
 * what its first look saw. Start it zeroed (LA_FDSNAP_START). */
typedef struct {
    la_fdrec_t *r;
    int owned;
    unsigned gen, sin, sout;
    int taken; /* la_fd_snap ran before in this call */
    int began; /* the call's first look saw the fd owned, with gen bgen */
    unsigned bgen;
} la_fdsnap_t;
#define LA_FDSNAP_START {0}

/* io.c: s's record of fd (allocated on first use), NULL if fd is out of
 * range or memory is short. */
la_fdrec_t *la_fdrec(la_sched_t *s, int fd);
/* io.c: takes a fresh look at r (NULL: no record). Returns 1 if the
 * ownership the call began under has ended since (async_fiber_close, or the
 * number taken over): the call fails with ASYNC_E_CLOSED. */
int la_fd_snap(la_fdrec_t *r, la_fdsnap_t *sn);
/* la_fd_snap in a call's retry loop: 1 (ASYNC_E_CLOSED recorded) if the
 * call must end. */
static inline int la_fd_snap_closed(la_fdrec_t *r, la_fdsnap_t *sn) {
    if (!la_fd_snap(r, sn)) return 0;
    la_set_error(ASYNC_E_CLOSED);
    return 1;
}
/* Sets r's parked reader (under r->lk; see struct la_fdrec). */
static inline void la_fdrec_set_rw(la_fdrec_t *r, la_waiter_t *w) { __atomic_store_n(&r->rw, w, __ATOMIC_RELAXED); }
/* The poller directions r's parked waiters want (under r->lk). */
static inline unsigned la_io_arm_mask(la_fdrec_t *r) { return (r->rw ? LA_PF_IN : 0u) | (r->ww ? LA_PF_OUT : 0u); }

/* io_sys.c: the system calls; each returns its result or -errno. */
int la_io_arm(la_sched_t *s, la_fdrec_t *r, unsigned want); /* (re)arms r->fd one-shot */
int la_io_poll1(int fd, short events, int timeout);         /* revents, 0: timeout */
int la_io_fd_open(int fd);                                  /* 0 if fd is open */
int la_io_nonblock_undoable(int fd, int *was);              /* *was: old flags, -1 unchanged */
void la_io_setfl(int fd, int fl);                           /* keeps errno */
ssize_t la_io_read_now(int fd, void *buf, size_t n);        /* one non-blocking read */
ssize_t la_io_write_now(int fd, const void *buf, size_t n); /* one non-blocking write */
int la_io_accept_now(int fd, struct sockaddr *a, socklen_t *l);
int la_io_connect_now(int fd, const struct sockaddr *a, socklen_t l);
int la_io_sockerr(int fd);                                  /* -SO_ERROR */
/* errno -> async_err_t (an unknown one is noted for async_last_os_error) */
int la_io_map_errno(int e);

/* io_park.c: park the current fiber f on fd for dirs (1 read, 2 write, 3
 * either) until ready or the deadline (the caller has checked that it has
 * not passed: la_io_next_deadline); la_io_wait_dir for a thread or a
 * fiber. 0 (retry the syscall) or an async_err_t. */
int la_io_fd_park(la_fiber_t *f, int fd, int dirs, uint64_t deadline);
int la_io_owned_park(la_fiber_t *f, int fd, int dirs, const la_fdsnap_t *sn, uint64_t deadline);
/* A call's deadline is taken from the clock at its first wait, so a call
 * that never waits reads no clock: *dl starts at LA_DL_UNSET (then 0: no
 * deadline, else la_now_ns's time). */
#define LA_DL_UNSET UINT64_MAX
int la_io_next_deadline(uint64_t *dl, int timeout_ms);
int la_io_wait_dir(int fd, int dir, uint64_t *dl, int timeout_ms, const la_fdsnap_t *sn);

/* io_owned.c: makes fd owned by s (fresh: the kernel just handed the
 * number out); drops s's ownerships at its end. */
int la_io_own_fd(la_sched_t *s, int fd, int fresh);
void la_io_owners_drop(la_sched_t *s);
#endif

/* net.c: the checks of async_fiber_listen's and async_fiber_udp_bind's
 * addr, len and flags: the size of addr's family (IPv4 or IPv6), or 0 with
 * ASYNC_E_INVAL recorded. */
socklen_t la_bind_addr_len(const struct sockaddr *addr, socklen_t len, unsigned flags);

/* config.c: 1 when ASYNC_FIBER_IO asks for io_uring */
int la_default_fiber_io_uring(void);

/* io_uring.c (docs/FIBERS.md "io_uring"): fiber reads, writes, accepts and
 * connects through per-worker rings. Each la_uring_* call returns 1 when it
 * handled the call (*ret set, the error recorded) and 0 when the caller goes
 * on with its poller path (not on a fiber of a scheduler with rings, timeout
 * 0, not a socket). */
#if defined(__linux__) && !defined(LA_POLLER_KQUEUE)
#define LA_URING 1
#include <sys/socket.h>
#include <sys/types.h>
/* Opens a ring per worker (s->wks allocated, s->poller open); -1 (logged at
 * INFO) when io_uring is unavailable. */
int la_uring_open(la_sched_t *s);
void la_uring_close(la_sched_t *s);
/* The worker's turn: submits its pending SQEs, reaps up to max of its CQEs
 * (readies their fibers; 0: all); returns the number of CQEs reaped. A
 * share at a time keeps the run queue from overflowing into the global
 * queue, where fibers would wait behind every later completion. */
int la_uring_flush(la_uring_t *r, int max);
/* Reaps the CQEs waiting in the other workers' rings (their owners may
 * sleep on the condition variable, where a completion does not wake them);
 * a memory read per ring when they are empty. Returns the number reaped. */
int la_uring_reap_others(la_sched_t *s, la_uring_t *own);
/* Submits r's pending SQEs now (a memory read when there are none). */
void la_uring_submit(la_uring_t *r);
/* A busy worker about to run another fiber: submits its pending SQEs now if
 * another worker is idle or spinning (nw > 1). */
void la_uring_before_run(la_sched_t *s, la_uring_t *r);
/* A worker that just counted itself idle or spinning: submits the pending
 * SQEs of the other workers' rings. */
void la_uring_submit_others(la_sched_t *s, la_uring_t *own);
/* Cancels every op in s's rings on fd (async_fiber_close of an fd s owns):
 * they end with ASYNC_E_CLOSED, and drop their hold on the file. */
void la_uring_cancel_fd(la_sched_t *s, int fd);
/* la_poller_wait's callback for a scheduler with rings. */
void la_uring_event(void *ctx, void *rec, unsigned got);
int la_uring_read(int fd, void *buf, size_t n, int timeout_ms, ssize_t *ret);
int la_uring_write(int fd, const void *buf, size_t n, int timeout_ms, ssize_t *ret, size_t *done);
int la_uring_accept(int lfd, struct sockaddr *addr, socklen_t *len, int timeout_ms, int *ret);
int la_uring_connect(int fd, const struct sockaddr *addr, socklen_t len, int timeout_ms, int *ret);
/* One sendmsg (send 1) or recvmsg (send 0) of m through the ring (net.c:
 * async_fiber_sendto, async_fiber_recvfrom); m and what it points at stay
 * valid until the call returns. *ret: the byte count, or -1. */
int la_uring_msg(int fd, struct msghdr *m, int send, int timeout_ms, ssize_t *ret);
/* 1 if the call may go through io_uring (io_uring.c decides the rest): the
 * caller is a fiber of an io_uring scheduler, and fd is not owned by it.
 * Owned descriptors keep their registered epoll path on an io_uring
 * scheduler too (async_fiber_close must reach the fibers parked on them,
 * and accept on an owned listener hands out owned fds): io_uring serves the
 * plain ones. An epoll scheduler's call stops at the first test (no look at
 * the fd table). Allocates nothing. */
static inline int la_uring_here(int fd) {
    la_fiber_t *f = la_current_fiber();
    if (!f || !f->s->uring) return 0;
    if (fd < 0 || fd >= LA_FD_CHUNK * LA_FD_CHUNKS) return 1;
    la_fdrec_t *c = atomic_load_explicit(&f->s->fdchunks[(size_t)fd / LA_FD_CHUNK], memory_order_acquire);
    return !(c && atomic_load_explicit(&c[(size_t)fd % LA_FD_CHUNK].owned, memory_order_relaxed));
}
#endif

/* Dispatches fd events (io.c, io_uring.c) after a kick or a timeout (the
 * worker loop: sched.c, sched_idle.c); returns the number of fd events.
 * *rang: as la_poller_wait. */
static inline int la_poll_events(la_sched_t *s, int timeout_ms, int *rang) {
#if defined(LA_URING)
    if (s->uring) return la_poller_wait(&s->poller, timeout_ms, la_uring_event, s, rang);
#endif
    return la_poller_wait(&s->poller, timeout_ms, la_io_event, s, rang);
}

/* A thread of the library (a worker, a blocking-pool thread) blocks SIGPIPE
 * for good: a write to a closed pipe or socket gives EPIPE, and the
 * process is not killed (io_sys.c, la_write_nosigpipe). No SIGPIPE on
 * Windows. */
static inline void la_block_sigpipe(void) {
#if !defined(_WIN32)
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
#endif
}

/* blocking.c: on a pool thread, the fiber whose job it runs; else NULL */
la_fiber_t *la_blocking_served(void);

/* A job of the blocking pool (blocking.c). w: the fiber parked until fn
 * returns (the job lives on its stack); NULL for a detached job (work.c),
 * whose fn owns the job and may free it. */
typedef struct la_pool_job {
    void (*fn)(void *);
    void *arg;
    la_waiter_t *w;
    struct la_pool_job *next;
} la_pool_job_t;
/* Queues job (FIFO), starting a pool thread when the queued jobs outnumber
 * the idle threads (up to 64). 0, or an async_err_t (ASYNC_E_NOMEM,
 * ASYNC_E_SYS with *os_err) if no thread could be started for it: then it
 * is not queued. */
int la_pool_push(la_pool_job_t *job, int *os_err);
/* Removes and returns the first queued (not started) job that match
 * accepts, or NULL. */
la_pool_job_t *la_pool_unqueue(int (*match)(const la_pool_job_t *, const void *), const void *ctx);

/* tools.c */
void la_tools_sched_created(la_sched_t *s);
/* before s is freed: stops its stall monitor, drops its dump-on-signal
 * registration (waits for a handler using s) */
void la_tools_sched_gone(la_sched_t *s);
/* stall.c: 1 on a stall monitor thread (a log handler called from it) */
int la_on_stall_monitor(void);
/* stall.c: sets s's stall threshold in ms (0: off, the monitor stops). 0 or
 * an async_err_t (*os: errno). */
int la_stall_set(la_sched_t *s, int ms, int *os);

#endif
