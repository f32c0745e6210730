//go:build linux && !la_kqueue

/* io_uring for fiber I/O on Linux (ASYNC_FIBER_IO=uring; docs/FIBERS.md
 * "io_uring"). The rings are written by hand with the raw system calls
 * (io_uring_setup, io_uring_enter, io_uring_register + mmap) and
 * <linux/io_uring.h>: libasync.so is built by `go build`, also cross-built
 * for arm64, and a liburing link dependency would have to be present for
 * every build and every consumer; what is used of it here is small.
 *
 * One ring per worker (no SQ contention between workers). A fiber's
 * async_fiber_read/write/accept/connect on a socket (and recvfrom/sendto,
 * net_posix.c: RECVMSG/SENDMSG with the msghdr on the fiber's stack, which
 * the kernel reads at submission and writes the source's length back into
 * at completion) writes an SQE into the
 * ring of the worker it runs on, with user_data = the key of its la_uop_t
 * (the record is on the fiber's stack; the key is its address and a tag,
 * ur_key), and parks. The SQEs are not submitted at once: the worker
 * submits what is pending in one io_uring_enter when it runs out of local
 * work, and every 61st dispatch when it stays busy (la_uring_flush, from
 * sched.c's find_work). The same call reaps the CQ (a memory read, no system
 * call) and readies the fibers whose ops completed. Each ring's fd is in the
 * scheduler's epoll set (EPOLLET, registered once): the worker blocked in
 * the poller wakes on CQEs of any ring and reaps them there, so idle
 * workers, kicks and timers work as with plain epoll.
 *
 * Timeouts and shutdown: the fiber's park has its deadline as usual; when it
 * ends by timeout (or by shutdown: CANCELLED) the fiber submits
 * IORING_OP_ASYNC_CANCEL for its op's key and parks again, not cancellable,
 * until the op's CQE came: the kernel never writes into a fiber's stack (the
 * buffer or the la_uop_t) after the call returned. A key names one op, not a
 * stack slot: the next op whose record has the same address has another tag,
 * so a cancel that reaches the kernel after its op ended finds nothing and
 * never ends that next op. An op that completed anyway keeps its result
 * (data read is returned, an accepted fd too). Every fiber waits for its CQE
 * before it returns, so no op is in flight when a scheduler frees its rings
 * (a cancel request may still be: it holds no user memory).
 *
 * Not through the ring: calls from plain threads, timeout 0 (one try: the
 * poller path's non-blocking syscall), fds that are not sockets (the op
 * returns ENOTSOCK and the poller path takes over: pipes keep their SIGPIPE
 * handling), and async_fiber_wait_fd. connect(2) itself is called directly
 * (its result semantics differ between kernels under IORING_OP_CONNECT);
 * the wait for it is an IORING_OP_POLL_ADD. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "io_uring_int.h"

/* The per-op helpers run twice per echo round trip: inlined into the four
 * calls (no prologue, no frame of their own on the fiber's stack). */
#define LA_UR_HOT static inline __attribute__((always_inline))

/* An op in flight: on the stack of the fiber that waits for it. Its key is
 * also in its fd's slot (la_ubslot_t) from op_start to the end of the call:
 * async_fiber_close finds there the ops of a number whose file was closed
 * with close(2) and replaced (la_uring_cancel_fd). */
typedef struct la_uop {
    la_fiber_t *f; /* the fiber, its park prepared before the SQE could reach the kernel */
    int res;
    int prep;     /* op_start's la_park_prepare: 0, or why no park was prepared */
    la_spin_t lk; /* done and waiting: an op whose first park ended early */
    int done;     /* complete() came after that park ended */
    int waiting;  /* the fiber is parked again (not cancellable) for the CQE */
    uint64_t key; /* its SQE's user_data and its cancels' key (ur_key) */
} la_uop_t;

/* An op's key (user_data): the record's address in the low 48 bits and the
 * ring's 16-bit op count in the bits above. A cancel names its op by key, so
 * it can only reach that op: a later op whose record has the same address
 * (the same stack depth, the same fiber or the next one on that stack) has
 * another tag until 65536 more ops started on the ring. Fiber stacks are
 * mmap'ed without an address hint, below 2^47 (x86-64) or 2^48 (arm64), where
 * Linux places every mapping not asked for higher; my_ring sends a stack
 * above (never made here) to the poller path. 0 is no op (a cancel's CQE). */
#define LA_UR_ADDR_BITS 48
#define LA_UR_ADDR_MASK ((UINT64_C(1) << LA_UR_ADDR_BITS) - 1)

static inline uint64_t ur_key(la_uring_t *r, la_uop_t *op) {
    return (uint64_t)(uintptr_t)op | (uint64_t)++r->tag << LA_UR_ADDR_BITS;
}

static inline la_uop_t *ur_key_op(uint64_t key) { return (la_uop_t *)(uintptr_t)(key & LA_UR_ADDR_MASK); }

/* ---- system calls ----------------------------------------------------------- */

LA_NOINLINE static int ur_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
    long r = syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, NULL, (size_t)0);
    return r < 0 ? -errno : (int)r;
}

LA_NOINLINE static int ur_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) return -errno;
    if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -errno;
    return 0;
}

LA_NOINLINE static int ur_accept(int fd, struct sockaddr *a, socklen_t *l) {
    int r = accept4(fd, a, l, SOCK_NONBLOCK | SOCK_CLOEXEC);
    return r >= 0 ? r : -errno;
}

LA_NOINLINE static int ur_connect(int fd, const struct sockaddr *a, socklen_t l) {
    int r = connect(fd, a, l);
    return r == 0 ? 0 : -errno;
}

/* io_sys.c's mapping of errno values to async_err_t, and ECANCELED: an op
 * cancelled by async_fiber_close (la_uring_cancel_fd); a timeout or shutdown
 * cancel is told apart by op_err's why. */
static int ur_map_errno(int e) { return e == ECANCELED ? ASYNC_E_CLOSED : la_io_map_errno(e); }

/* Submits what is in r's SQ; r->sqlk held. Returns the io_uring_enter
 * result (or 0 when there was nothing). */
static int submit_locked(la_uring_t *r, unsigned flags) {
    unsigned n = r->sq_tail_local - atomic_load_explicit(r->sq_head, memory_order_acquire);
    atomic_store_explicit(&r->pending, 0, memory_order_relaxed);
    if (n == 0 && !flags) return 0;
    int e;
    do e = ur_enter(r->fd, n, 0, flags);
    while (e == -EINTR);
    return e;
}

/* Completes the op of one CQE. An op has one CQE and its fiber waits for it,
 * so the record a CQE names is live, and so is its fiber. The fiber is
 * parked for this op (op_start prepared the park before the SQE was
 * visible), so a claim won here is its wake-up; a claim lost means its park
 * ended early (deadline, cancel, shutdown) or was refused, and the fiber
 * takes op->lk to park again for this CQE or to see that it came. */
static void complete(la_uring_t *r, struct io_uring_cqe *c) {
    (void)r;
    if (!c->user_data) return; /* a cancel request's own CQE */
    la_uop_t *op = ur_key_op(c->user_data);
    la_tsan_acquire(op); /* op_start's, through the kernel */
    la_fiber_t *f = op->f;
    op->res = c->res;
    int z = LA_W_WAITING;
    if (atomic_compare_exchange_strong(&f->claim, &z, LA_W_READY)) {
        la_fiber_wake(f); /* op may be gone once f runs */
        return;
    }
    int wake = 0;
    la_spin_lock(&op->lk);
    op->done = 1;
    z = LA_W_WAITING;
    if (op->waiting && atomic_compare_exchange_strong(&f->claim, &z, LA_W_READY)) wake = 1;
    la_spin_unlock(&op->lk);
    /* op may be gone now; f, claimed, lives until it is woken */
    if (wake) la_fiber_wake(f);
}

/* Reaps up to max CQEs of r (0: all); returns how many. */
static int reap_cq(la_uring_t *r, int max) {
    unsigned tail = atomic_load_explicit(r->cq_tail, memory_order_acquire);
    if (atomic_load_explicit(r->cq_head, memory_order_relaxed) == tail) return 0;
    int n = 0;
    la_spin_lock(&r->cqlk);
    unsigned head = atomic_load_explicit(r->cq_head, memory_order_relaxed);
    for (;;) {
        tail = atomic_load_explicit(r->cq_tail, memory_order_acquire);
        if (head == tail || (max && n >= max)) break;
        while (head != tail && (max == 0 || n < max)) {
            struct io_uring_cqe c = r->cqes[head & r->cq_mask];
            head++;
            /* the next op (on its fiber's stack, cold by now), fetched while
             * this one completes; a prefetch never faults */
            if (head != tail) __builtin_prefetch(ur_key_op(r->cqes[head & r->cq_mask].user_data), 1);
            /* give the slot back before the op's fiber can run */
            atomic_store_explicit(r->cq_head, head, memory_order_release);
            complete(r, &c);
            n++;
        }
    }
    la_spin_unlock(&r->cqlk);
    return n;
}

/* reap_cq, and the completions the kernel kept aside when the CQ was full
 * (IORING_FEAT_NODROP): they come into the CQ only with an io_uring_enter
 * with GETEVENTS, which any thread may make. */
static int reap(la_uring_t *r, int max) {
    int n = reap_cq(r, max);
    if ((max == 0 || n < max) &&
        (atomic_load_explicit(r->sq_flags, memory_order_relaxed) & IORING_SQ_CQ_OVERFLOW)) {
        ur_enter(r->fd, 0, 0, IORING_ENTER_GETEVENTS);
        n += reap_cq(r, max ? max - n : 0);
    }
    return n;
}

int la_uring_flush(la_uring_t *r, int max) {
    unsigned fl = atomic_load_explicit(r->sq_flags, memory_order_relaxed);
    unsigned get = (fl & (IORING_SQ_CQ_OVERFLOW | IORING_SQ_TASKRUN)) ? IORING_ENTER_GETEVENTS : 0;
    if (atomic_load_explicit(&r->pending, memory_order_relaxed) || get) {
        la_spin_lock(&r->sqlk);
        submit_locked(r, get);
        la_spin_unlock(&r->sqlk);
    }
    return reap(r, max);
}

int la_uring_reap_others(la_sched_t *s, la_uring_t *own) {
    int n = 0;
    for (int i = 0; i < s->nw; i++) {
        la_uring_t *r = &s->uring[i];
        if (r != own) n += reap(r, LA_RUNQ / 2);
    }
    return n;
}

/* la_poller_wait's callback when s has rings: a ring's fd reports CQEs, or
 * an fd event for io.c. */
void la_uring_event(void *ctx, void *rec, unsigned got) {
    la_sched_t *s = ctx;
    la_uring_t *r = rec;
    if (s->uring && r >= s->uring && r < s->uring + s->nw) {
        /* Its own ring: a share, like an epoll_wait's 128 events (the rest
         * is reaped by its next flush, before it idles again). Another
         * worker's ring: all, for its owner may be asleep. */
        la_wk_t *w = la_current_worker();
        reap(r, w && w->ur == r ? LA_RUNQ / 2 : 0);
        return;
    }
    la_io_event(ctx, rec, got);
}

/* Submits r's SQ (r->sqlk held) until it has a free entry. */
LA_NOINLINE static void sqe_make_room(la_uring_t *r) {
    for (;;) {
        unsigned head = atomic_load_explicit(r->sq_head, memory_order_acquire);
        if (r->sq_tail_local - head < r->sq_entries) return;
        int e = submit_locked(r, 0);
        if (e == -EBUSY || e == -EAGAIN) {
            /* the CQ backlog is full: make room there first */
            la_spin_unlock(&r->sqlk);
            reap(r, 0);
            sched_yield();
            la_spin_lock(&r->sqlk);
        }
    }
}

/* A free SQE of r, zeroed (r->sqlk held); submits to make room when the SQ
 * is full. */
LA_UR_HOT struct io_uring_sqe *sqe_get(la_uring_t *r) {
    if (r->sq_tail_local - atomic_load_explicit(r->sq_head, memory_order_acquire) >= r->sq_entries)
        sqe_make_room(r);
    struct io_uring_sqe *q = &r->sqes[r->sq_tail_local & r->sq_mask];
    memset(q, 0, sizeof *q);
    return q;
}

LA_UR_HOT void sqe_push(la_uring_t *r) {
    r->sq_tail_local++;
    atomic_store_explicit(r->sq_tail, r->sq_tail_local, memory_order_release);
    atomic_store_explicit(&r->pending, 1, memory_order_relaxed);
}

/* Writes a cancel of the op with key into r's SQ (r->sqlk held). */
static void sqe_cancel_key(la_uring_t *r, uint64_t key) {
    struct io_uring_sqe *q = sqe_get(r);
    q->opcode = IORING_OP_ASYNC_CANCEL;
    q->fd = -1;
    q->addr = key;
    q->user_data = 0;
    sqe_push(r);
}

static void cancel_key_now(la_uring_t *r, uint64_t key) {
    la_spin_lock(&r->sqlk);
    sqe_cancel_key(r, key);
    submit_locked(r, 0);
    la_spin_unlock(&r->sqlk);
}

/* ---- test-only: late cancels ---------------------------------------------------- */

/* ASYNC_TEST_URING_CANCEL_DELAY_US=N, read once by la_uring_open, is for the
 * library's own tests (not in async.h, not for users): every timeout or
 * shutdown cancel (cancel_op) goes in N microseconds late, from a thread of
 * its own, as a cancel held up anywhere between the fiber and the kernel
 * would. The op may complete meanwhile and its fiber start the next one, its
 * record at the same address: the late cancel must not reach that one
 * (ur_key). la_uring_close waits for the late cancels still to come. */
typedef struct {
    la_uring_t *r;
    uint64_t key;
} la_late_cancel_t;

static void *late_cancel_main(void *arg) {
    la_late_cancel_t lc = *(la_late_cancel_t *)arg;
    free(arg);
    uint64_t until = la_now_ns() + (uint64_t)lc.r->cancel_delay_us * 1000;
    while (la_now_ns() < until) usleep(1000);
    cancel_key_now(lc.r, lc.key);
    atomic_fetch_sub(&lc.r->late_n, 1); /* r is not touched after this */
    return NULL;
}

/* 1 when the cancel of key was handed to a late thread. */
static int cancel_late(la_uring_t *r, uint64_t key) {
    la_late_cancel_t *lc = malloc(sizeof *lc);
    pthread_t t;
    if (!lc) return 0;
    *lc = (la_late_cancel_t){r, key};
    atomic_fetch_add(&r->late_n, 1);
    if (pthread_create(&t, NULL, late_cancel_main, lc) == 0) {
        pthread_detach(t);
        return 1;
    }
    atomic_fetch_sub(&r->late_n, 1);
    free(lc);
    return 0;
}

/* Cancels op (in r): the request goes in at once (late only under the test
 * variable). */
static void cancel_op(la_uring_t *r, la_uop_t *op) {
    if (r->cancel_delay_us && cancel_late(r, op->key)) return;
    cancel_key_now(r, op->key);
}

static la_ubslot_t *busy_find(la_sched_t *s, int fd);

/* Cancels every op of s on fd (async_fiber_close of an owned fd): by file
 * (IORING_ASYNC_CANCEL_FD: the ops on the file fd names now), and by key
 * (the ops started on that number before its file was closed with close(2)
 * and the number reused: the kernel matches CANCEL_FD by file, so those
 * went on waiting, with timeout -1 for ever, where the epoll path wakes
 * them). At most a reader and a writer per number and scheduler (the busy
 * bits), so two keys; a key is only compared by the kernel, never read. */
void la_uring_cancel_fd(la_sched_t *s, int fd) {
    if (!s->uring) return;
    la_ubslot_t *b = busy_find(s, fd);
    uint64_t keys[2] = {0, 0};
    la_uring_t *kr[2] = {NULL, NULL};
    for (int d = 0; b && d < 2; d++) {
        keys[d] = atomic_load(&b->key[d]);
        kr[d] = atomic_load(&b->ring[d]);
    }
    for (int i = 0; i < s->nw; i++) {
        la_uring_t *r = &s->uring[i];
        la_spin_lock(&r->sqlk);
        struct io_uring_sqe *q = sqe_get(r);
        q->opcode = IORING_OP_ASYNC_CANCEL;
        q->fd = fd;
        q->cancel_flags = IORING_ASYNC_CANCEL_FD | IORING_ASYNC_CANCEL_ALL;
        q->user_data = 0;
        sqe_push(r);
        for (int d = 0; d < 2; d++)
            if (keys[d] && kr[d] == r) sqe_cancel_key(r, keys[d]);
        submit_locked(r, 0); /* what was queued before goes first */
        la_spin_unlock(&r->sqlk);
    }
}

void la_uring_submit(la_uring_t *r) {
    if (!atomic_load_explicit(&r->pending, memory_order_relaxed)) return;
    la_spin_lock(&r->sqlk);
    submit_locked(r, 0);
    la_spin_unlock(&r->sqlk);
}

/* Dekker with la_uring_submit_others: this worker published its SQEs
 * (pending) before it looks for a free worker; a free worker counts itself
 * (nidle, nspinning) before it looks at pending. One of the two submits. */
void la_uring_before_run(la_sched_t *s, la_uring_t *r) {
    if (!atomic_load_explicit(&r->pending, memory_order_relaxed)) return;
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&s->nidle) > 0 || atomic_load(&s->nspinning) > 0) la_uring_submit(r);
}

void la_uring_submit_others(la_sched_t *s, la_uring_t *own) {
    for (int i = 0; i < s->nw; i++) {
        la_uring_t *r = &s->uring[i];
        if (r != own && atomic_load(&r->pending)) la_uring_submit(r);
    }
}

/* ---- per-fd slots (busy bits, keys of the ops in flight) ----------------------- */

/* fd's slot, made on first use; NULL when out of memory (fd in range). */
LA_UR_HOT la_ubslot_t *busy_slot(la_sched_t *s, int fd) {
    struct la_ubusy *b = s->ubusy;
    size_t ci = (size_t)fd / LA_UB_CHUNK;
    la_ubslot_t *c = atomic_load_explicit(&b->chunks[ci], memory_order_acquire);
    if (!c) {
        pthread_mutex_lock(&b->mu);
        c = atomic_load(&b->chunks[ci]);
        if (!c) {
            c = calloc(LA_UB_CHUNK, sizeof *c);
            if (c) atomic_store_explicit(&b->chunks[ci], c, memory_order_release);
        }
        pthread_mutex_unlock(&b->mu);
        if (!c) return NULL;
    }
    return &c[(size_t)fd % LA_UB_CHUNK];
}

/* fd's slot if one was made (no op went to a ring for a number without). */
static la_ubslot_t *busy_find(la_sched_t *s, int fd) {
    if (fd < 0 || fd >= LA_UB_CHUNK * LA_UB_CHUNKS || !s->ubusy) return NULL;
    la_ubslot_t *c = atomic_load_explicit(&s->ubusy->chunks[(size_t)fd / LA_UB_CHUNK], memory_order_acquire);
    return c ? &c[(size_t)fd % LA_UB_CHUNK] : NULL;
}

/* Takes fd's direction bit (1 read, 2 write): 0, or an async_err_t, or -1
 * for an fd beyond the table (negative, or 4M and above: a number that is
 * not open, or one the ring path does not track): the caller leaves it to
 * the poller path, which answers ASYNC_E_BADFD for a closed one (never
 * ASYNC_E_NOMEM for a number out of the table's range). With one worker
 * every fiber of s runs on its thread, one at a time, and nobody else
 * writes the bits: a plain read and write. */
LA_UR_HOT int busy_take(la_sched_t *s, int fd, unsigned bit, la_ubslot_t **slot) {
    if (fd < 0 || fd >= LA_UB_CHUNK * LA_UB_CHUNKS) return -1;
    la_ubslot_t *b = busy_slot(s, fd);
    if (!b) return ASYNC_E_NOMEM;
    if (s->nw == 1) {
        unsigned char v = atomic_load_explicit(&b->busy, memory_order_relaxed);
        if (v & bit) return ASYNC_E_BUSY;
        atomic_store_explicit(&b->busy, (unsigned char)(v | bit), memory_order_relaxed);
    } else if (atomic_fetch_or(&b->busy, (unsigned char)bit) & bit) {
        return ASYNC_E_BUSY;
    }
    *slot = b;
    return 0;
}

LA_UR_HOT void busy_drop(la_sched_t *s, la_ubslot_t *b, unsigned bit) {
    atomic_store_explicit(&b->key[bit - 1], 0, memory_order_relaxed);
    if (s->nw == 1)
        atomic_store_explicit(&b->busy, atomic_load_explicit(&b->busy, memory_order_relaxed) & (unsigned char)~bit,
                              memory_order_relaxed);
    else
        atomic_fetch_and(&b->busy, (unsigned char)~bit);
}

/* ---- ops ---------------------------------------------------------------------- */

/* The ring of the calling fiber's worker, or NULL when the call does not go
 * through io_uring. */
LA_UR_HOT la_uring_t *my_ring(la_fiber_t **fp, int timeout_ms) {
    if (timeout_ms == 0) return NULL;
    /* fp is the caller's local, on the stack its la_uop_t will be on */
    if ((uintptr_t)fp >> LA_UR_ADDR_BITS) return NULL; /* no room for a key's tag (ur_key) */
    la_fiber_t *f = la_current_fiber();
    if (!f || !f->s->uring) return NULL;
    *fp = f;
    return la_current_worker()->ur;
}

/* The end of an op whose park ended early: cancels it and parks again,
 * not cancellable, until its CQE came (the kernel never writes into the
 * fiber's stack after the call returned). Returns the CQE's result. */
LA_NOINLINE static int op_wait_slow(la_fiber_t *f, la_uring_t *r, la_uop_t *op) {
    cancel_op(r, op);
    for (;;) {
        la_spin_lock(&op->lk);
        if (op->done) {
            la_spin_unlock(&op->lk);
            return op->res;
        }
        la_park_prepare(f, LA_PK_BLOCKING); /* never fails for this kind */
        op->waiting = 1;
        la_spin_unlock(&op->lk);
        if (la_fiber_park_until(f, 0) == LA_W_READY) return op->res; /* claimed by complete() */
    }
}

/* Runs the op whose SQE the caller prepared (sqlk held, the SQE pushed):
 * parks until its CQE, cancelling it at the deadline or at shutdown.
 * Returns the CQE's result; *why: LA_W_READY, or why the park ended early
 * (LA_W_TIMEDOUT, LA_W_CANCELLED), whatever the result. */
LA_UR_HOT int op_wait(la_fiber_t *f, la_uring_t *r, la_uop_t *op, uint64_t deadline, int *why) {
    la_spin_unlock(&r->sqlk);
    int got = op->prep == ASYNC_E_TIMEDOUT ? LA_W_TIMEDOUT
              : op->prep                   ? LA_W_CANCELLED
                                           : la_fiber_park_until(f, deadline);
    *why = got;
    if (got == LA_W_READY) return op->res; /* claimed by complete(), which set res first */
    return op_wait_slow(f, r, op);
}

/* Starts op on the ring of the worker the fiber f runs on now (its owner
 * submits): prepares f's park (complete() claims it; not when deadline has
 * passed), then an SQE with opcode, fd, addr, len (capped at what one op
 * takes) and op as its user_data, for the caller to complete, sqe_push and
 * hand to op_wait. b: fd's slot, whose bit for dir (1, 2) the caller holds:
 * the op's key and ring go there. *rp: that ring, its sqlk held. */
LA_UR_HOT struct io_uring_sqe *op_start(la_fiber_t *f, la_uop_t *op, la_uring_t **rp, unsigned char opcode, int fd,
                                        const void *addr, size_t len, la_ubslot_t *b, unsigned dir,
                                        uint64_t deadline) {
    op->f = f;
    op->res = 0;
    op->lk = (la_spin_t){0};
    op->done = 0;
    op->waiting = 0;
    la_fiber_note(f, LA_WAIT_FD, (uint64_t)(uint32_t)fd | (uint64_t)dir << 32);
    op->prep = deadline && la_now_ns() >= deadline ? ASYNC_E_TIMEDOUT : la_park_prepare(f, LA_PK_NORMAL);
    la_tsan_release(op); /* to the reaper of its CQE (complete) */
    la_uring_t *r = la_current_worker()->ur;
    la_spin_lock(&r->sqlk);
    struct io_uring_sqe *q = sqe_get(r);
    q->opcode = opcode;
    q->fd = fd;
    q->addr = (uint64_t)(uintptr_t)addr;
    q->len = len > 0x7ffff000u ? 0x7ffff000u : (unsigned)len;
    op->key = ur_key(r, op);
    q->user_data = op->key;
    atomic_store_explicit(&b->ring[dir - 1], r, memory_order_relaxed);
    atomic_store_explicit(&b->key[dir - 1], op->key, memory_order_relaxed);
    *rp = r;
    return q;
}

/* The end of an accept or connect that failed with err (recorded): *ret
 * -1, and the call was handled here. */
static int ur_fail(int *ret, int err) {
    la_set_error(err);
    *ret = -1;
    return 1;
}

/* The error of an op that ended with res < 0 after a park that ended for
 * why. A park ended by a cancel, stop or timeout reports that reason over
 * what only says the op did not happen: cancelled, interrupted, would
 * block. */
static int op_err(int res, int why) {
    if (why != LA_W_READY && (res == -ECANCELED || res == -EINTR || res == -EAGAIN)) return la_reason_err(why);
    return ur_map_errno(-res);
}

int la_uring_read(int fd, void *buf, size_t n, int timeout_ms, ssize_t *ret) {
    la_fiber_t *f = NULL;
    la_uring_t *r = my_ring(&f, timeout_ms);
    if (!r) return 0;
    la_ubslot_t *b;
    int e = busy_take(f->s, fd, 1, &b);
    if (e < 0) return 0; /* the poller path */
    if (e == ASYNC_E_BUSY) {
        /* Another receive of this scheduler is in the ring for this number
         * (perhaps of a file closed since, the number reused). As on the
         * epoll path, only a call that has to wait is refused: data already
         * there is returned (async.h, async_fiber_wait_fd). */
        ssize_t k;
        do k = la_io_read_now(fd, buf, n); /* io_sys.c's: a socket or not */
        while (k == -EINTR);
        if (k >= 0) {
            *ret = k;
            return 1;
        }
        if (k != -EAGAIN && k != -EWOULDBLOCK) e = ur_map_errno((int)-k);
    }
    if (e) {
        la_set_error(e);
        *ret = -1;
        return 1;
    }
    uint64_t deadline = la_deadline(timeout_ms);
    la_uop_t op;
    int why, res;
    do {
        op_start(f, &op, &r, IORING_OP_RECV, fd, buf, n, b, 1, deadline);
        sqe_push(r);
        res = op_wait(f, r, &op, deadline, &why);
    } while (res == -EINTR && why == LA_W_READY);
    busy_drop(f->s, b, 1);
    if (res >= 0) {
        *ret = res;
        return 1;
    }
    if (res == -ENOTSOCK || (res == -EAGAIN && why == LA_W_READY)) return 0; /* the poller path */
    la_set_error(op_err(res, why));
    *ret = -1;
    return 1;
}

int la_uring_write(int fd, const void *buf, size_t n, int timeout_ms, ssize_t *ret, size_t *done) {
    la_fiber_t *f = NULL;
    la_uring_t *r = my_ring(&f, timeout_ms);
    if (!r) return 0;
    la_ubslot_t *b;
    int e = busy_take(f->s, fd, 2, &b);
    if (e < 0) return 0; /* the poller path */
    if (e) {
        la_set_error(e);
        *ret = -1;
        return 1;
    }
    uint64_t deadline = la_deadline(timeout_ms);
    la_uop_t op;
    int why = LA_W_READY, res = 0;
    while (*done < n) {
        struct io_uring_sqe *q = op_start(f, &op, &r, IORING_OP_SEND, fd, (const char *)buf + *done, n - *done, b, 2,
                                           deadline);
        q->msg_flags = MSG_NOSIGNAL;
        sqe_push(r);
        res = op_wait(f, r, &op, deadline, &why);
        if (res > 0) *done += (size_t)res;
        if (why != LA_W_READY) break;
        if (res < 0 && res != -EINTR) break;
    }
    busy_drop(f->s, b, 2);
    if (*done == n) {
        *ret = (ssize_t)n;
        return 1;
    }
    /* Not a socket: the poller path does the whole call, whatever ended the
     * park (it completes a write that need not wait, e.g. a pipe with room,
     * also for a cancelled fiber, and reports the reason when it must wait). */
    if (res == -ENOTSOCK || (why == LA_W_READY && res == -EAGAIN)) return 0; /* the poller path goes on from *done */
    la_set_error(res < 0 ? op_err(res, why) : la_reason_err(why));
    *ret = -1;
    return 1;
}

int la_uring_accept(int lfd, struct sockaddr *addr, socklen_t *len, int timeout_ms, int *ret) {
    la_fiber_t *f = NULL;
    la_uring_t *r = my_ring(&f, timeout_ms);
    if (!r) return 0;
    int e = ur_nonblock(lfd); /* as promised (io_sys.c does the same) */
    if (e) return ur_fail(ret, ur_map_errno(-e));
    /* A connection already queued is taken at once: an accept per ring
     * round would let a backlog of thousands grow until the kernel drops
     * the handshakes (the clients then see resets). */
    int res;
    do res = ur_accept(lfd, addr, len);
    while (res == -EINTR || res == -ECONNABORTED);
    if (res >= 0) {
        *ret = res;
        return 1;
    }
    if (res != -EAGAIN) return ur_fail(ret, res == -EMFILE || res == -ENFILE ? ASYNC_E_NOMEM : ur_map_errno(-res));
    la_ubslot_t *b;
    if ((e = busy_take(f->s, lfd, 1, &b)) < 0) return 0; /* the poller path */
    if (e) return ur_fail(ret, e);
    uint64_t deadline = la_deadline(timeout_ms);
    la_uop_t op;
    int why;
    do {
        struct io_uring_sqe *q = op_start(f, &op, &r, IORING_OP_ACCEPT, lfd, addr, 0, b, 1, deadline);
        q->addr2 = (uint64_t)(uintptr_t)len;
        q->accept_flags = SOCK_NONBLOCK | SOCK_CLOEXEC;
        sqe_push(r);
        res = op_wait(f, r, &op, deadline, &why);
    } while ((res == -EINTR || res == -ECONNABORTED) && why == LA_W_READY);
    busy_drop(f->s, b, 1);
    if (res >= 0) {
        *ret = res;
        return 1;
    }
    if (res == -EAGAIN && why == LA_W_READY) return 0;
    int err = res == -EMFILE || res == -ENFILE ? ASYNC_E_NOMEM : op_err(res, why);
    return ur_fail(ret, err);
}

int la_uring_connect(int fd, const struct sockaddr *addr, socklen_t alen, int timeout_ms, int *ret) {
    la_fiber_t *f = NULL;
    la_uring_t *r = my_ring(&f, timeout_ms);
    if (!r) return 0;
    if (fd >= LA_UB_CHUNK * LA_UB_CHUNKS) return 0; /* untracked (busy_take): the poller path, before connect(2) */
    *ret = -1;
    int e = ur_nonblock(fd);
    if (!e) e = ur_connect(fd, addr, alen);
    if (e == 0) {
        *ret = 0;
        return 1;
    }
    if (e != -EINPROGRESS && e != -EINTR && e != -EALREADY) { /* EALREADY: in progress already (io_api.c) */
        return ur_fail(ret, ur_map_errno(-e));
    }
    la_ubslot_t *b;
    if ((e = busy_take(f->s, fd, 2, &b)) < 0) return 0; /* the poller path */
    if (e) return ur_fail(ret, e);
    uint64_t deadline = la_deadline(timeout_ms);
    la_uop_t op;
    int why, res;
    for (;;) {
        struct io_uring_sqe *q = op_start(f, &op, &r, IORING_OP_POLL_ADD, fd, NULL, 0, b, 2, deadline);
        q->poll32_events = POLLOUT;
        sqe_push(r);
        res = op_wait(f, r, &op, deadline, &why);
        if (why != LA_W_READY || res != 0) break;
    }
    busy_drop(f->s, b, 2);
    if (res > 0) { /* writable: the connect's outcome */
        e = la_io_sockerr(fd);
        if (e == 0) {
            *ret = 0;
            return 1;
        }
        return ur_fail(ret, ur_map_errno(-e));
    }
    return ur_fail(ret, op_err(res, why));
}

/* A receive that finds another receive of this scheduler in the ring for fd
 * (la_uring_read's rule): a datagram already there is taken at once, else
 * ASYNC_E_BUSY. */
LA_NOINLINE static int msg_busy_now(int fd, struct msghdr *m, ssize_t *ret) {
    ssize_t k;
    do k = recvmsg(fd, m, MSG_DONTWAIT);
    while (k < 0 && errno == EINTR);
    if (k >= 0) {
        *ret = k;
        return 1;
    }
    la_set_error(errno == EAGAIN || errno == EWOULDBLOCK ? ASYNC_E_BUSY : ur_map_errno(errno));
    *ret = -1;
    return 1;
}

int la_uring_msg(int fd, struct msghdr *m, int send, int timeout_ms, ssize_t *ret) {
    la_fiber_t *f = NULL;
    la_uring_t *r = my_ring(&f, timeout_ms);
    if (!r) return 0;
    unsigned bit = send ? 2 : 1;
    la_ubslot_t *b;
    int e = busy_take(f->s, fd, bit, &b);
    if (e < 0) return 0; /* the poller path */
    if (e == ASYNC_E_BUSY && !send) return msg_busy_now(fd, m, ret);
    if (e) {
        la_set_error(e);
        *ret = -1;
        return 1;
    }
    uint64_t deadline = la_deadline(timeout_ms);
    socklen_t namelen = m->msg_namelen;
    la_uop_t op;
    int why, res;
    do {
        m->msg_namelen = namelen;
        struct io_uring_sqe *q =
            op_start(f, &op, &r, send ? IORING_OP_SENDMSG : IORING_OP_RECVMSG, fd, m, 1, b, (int)bit, deadline);
        q->msg_flags = send ? MSG_NOSIGNAL : 0;
        sqe_push(r);
        res = op_wait(f, r, &op, deadline, &why);
    } while (res == -EINTR && why == LA_W_READY);
    busy_drop(f->s, b, bit);
    if (res >= 0) {
        *ret = res;
        return 1;
    }
    if (res == -ENOTSOCK || (res == -EAGAIN && why == LA_W_READY)) { /* the poller path */
        m->msg_namelen = namelen;
        return 0;
    }
    int bad_dest = send && (res == -EDESTADDRREQ || res == -EISCONN || res == -EAFNOSUPPORT);
    la_set_error(res == -EMSGSIZE ? ASYNC_E_TOOBIG : bad_dest ? ASYNC_E_INVAL : op_err(res, why));
    *ret = -1;
    return 1;
}
