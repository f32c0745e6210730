//go:build !windows

/* fd waits for fibers: one poller per scheduler (poller.h; epoll on Linux),
 * one-shot registrations.
 *
 * Each fd number gets a record (kept for the scheduler's life) holding at
 * most one parked reader and one parked writer, and no readiness: a wait
 * tries the syscall (or poll(2) with timeout 0), and only if that would block
 * parks, arming the fd for its direction. Readiness kept across parks would
 * outlive what it describes: a HUP or ERR seen on one file would still be
 * "ready" for the next file with the same number (or, for an ICMP error on a
 * UDP socket, after the error was read), and every park would return at once
 * for ever. The arm asks the kernel instead, which knows the file's state
 * now. A park also ends with ASYNC_E_TIMEDOUT once its deadline has passed,
 * whatever the fd reports, so a wait on an fd that keeps reporting HUP or
 * ERR while its syscall says EAGAIN still ends on time (and every round
 * of it parks, so the worker runs its other fibers meanwhile).
 *
 * Registration: the fd is added once and re-armed by every park with
 * EPOLL_CTL_MOD (one system call, under the record's lock, for the
 * directions its waiters want); ENOENT means the number is not registered
 * (first wait, or the fd was closed and its number reused: the kernel drops a
 * registration when the file's last reference goes), and then it is added.
 * Arming checks the file's current readiness, so a wait never misses what is
 * already there, whatever the record believes. That lets a read skip its first
 * attempt when the previous read on this (stream) fd drained it (returned
 * less than asked): it parks at once, and the arm reports data that came in
 * meanwhile; when that park fails (a passed deadline, a cancel, another
 * reader parked) the read is tried all the same, since only a read that has
 * to wait may fail so. An event disarms the fd; if a waiter of the other direction
 * remains, the poller re-arms it.
 *
 * Owned fds (async_fiber_fd_open; async_fiber_accept on a fiber, on a
 * listening socket its scheduler owns): the fd is
 * registered once, edge-triggered for both directions (la_poller_own), and
 * no park touches the poller again. The record counts the events dispatched
 * per direction (sin, sout): a call reads the count before its syscall, and
 * when the syscall says EAGAIN it parks only if the count is unchanged
 * (under the record's lock, where the event bumps it and claims the
 * waiter), so an edge that came between the syscall and the park is not
 * lost: every arrival after the syscall's check makes a later event. The
 * read hint is kept as "the last short read saw count n": while the count
 * is still n nothing came since (or its event is on its way and wakes the
 * park), so the read parks at once; only for TCP, where a short read means
 * the queue was empty (a Unix socket stops at ancillary data, a packet pipe
 * at a packet), and off for good once urgent data (EPOLLPRI) was seen (a
 * read stops at its mark). Ownership ends only through the library
 * (async_fiber_close, or the scheduler's end): the registration goes, gen
 * is bumped and the parked fibers wake with ASYNC_E_CLOSED; a call that
 * began before (its gen is older) fails with ASYNC_E_CLOSED instead of
 * parking. A number closed with close(2) behind the library's back keeps a
 * stale "owned" record: async_fiber_fd_open (the poller then says the
 * number is not registered) and async_fiber_accept (a number the kernel
 * just handed out) take such a record over. The owner of each number is
 * also kept process-wide (owner_slot: the scheduler's handle), so that
 * async_fiber_close finds it from any thread, and two schedulers cannot
 * own one number. Fibers of other schedulers and plain threads use the
 * one-shot path (their records are not owned) or poll(2).
 *
 * errno is read only inside the small noinline helpers of io_sys.c: after a
 * park the fiber may run on another thread, and gcc may cache errno's
 * address.
 *
 * The files: io.c (the records, and the poller's events), io_sys.c (the
 * system calls, reporting -errno), io_park.c (parking on an fd), io_owned.c
 * (owned fds: async_fiber_fd_open, async_fiber_close), io_api.c (waits,
 * reads, writes, accepts, connects). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

#include "fiber_int.h"

/* Takes a fresh look. Returns 1 if the ownership the call began under has
 * ended since (async_fiber_close, or the number taken over): the call fails
 * with ASYNC_E_CLOSED. Every look after the first must check this: a call
 * that was not parked when the close came (it was running its syscall, or
 * was just woken) would otherwise find the fd plain, park on it the one-shot
 * way, and the close(2) that follows would drop that registration silently:
 * the fiber would wait for its timeout, or for ever. */
int la_fd_snap(la_fdrec_t *r, la_fdsnap_t *sn) {
    sn->r = r;
    sn->owned = r && atomic_load(&r->owned);
    if (sn->owned) {
        sn->gen = atomic_load(&r->gen);
        sn->sin = atomic_load(&r->sin);
        sn->sout = atomic_load(&r->sout);
    }
    if (!sn->taken) {
        sn->taken = 1;
        sn->began = sn->owned;
        sn->bgen = sn->gen;
        return 0;
    }
    return sn->began && atomic_load(&r->gen) != sn->bgen;
}

int la_io_init(la_sched_t *s) {
    pthread_mutex_init(&s->fdmu, NULL);
    s->fdchunks = calloc(LA_FD_CHUNKS, sizeof *s->fdchunks);
    return s->fdchunks ? 0 : -1;
}

void la_io_free(la_sched_t *s) {
    if (!s->fdchunks) return;
    la_io_owners_drop(s);
    for (size_t i = 0; i < LA_FD_CHUNKS; i++) free(atomic_load(&s->fdchunks[i]));
    free(s->fdchunks);
    s->fdchunks = NULL;
    pthread_mutex_destroy(&s->fdmu);
}

la_fdrec_t *la_fdrec(la_sched_t *s, int fd) {
    if (fd < 0 || fd >= LA_FD_CHUNK * LA_FD_CHUNKS) return NULL;
    size_t ci = (size_t)fd / LA_FD_CHUNK;
    la_fdrec_t *c = atomic_load_explicit(&s->fdchunks[ci], memory_order_acquire);
    if (!c) {
        pthread_mutex_lock(&s->fdmu);
        c = atomic_load(&s->fdchunks[ci]);
        if (!c) {
            c = calloc(LA_FD_CHUNK, sizeof *c);
            if (c) atomic_store_explicit(&s->fdchunks[ci], c, memory_order_release);
        }
        pthread_mutex_unlock(&s->fdmu);
        if (!c) return NULL;
    }
    return &c[(size_t)fd % LA_FD_CHUNK];
}

/* A hint from the poller (poller_epoll.c) about the event it dispatches
 * next: the parked reader's waiter record (on its fiber's stack, usually a
 * cache miss by now) is fetched while this event is handled. rw is read
 * without the lock: a stale value only makes a useless prefetch, and a
 * prefetch never faults. Only the waiter record: the claim word it points
 * to cannot be fetched before the record itself has arrived. */
void la_io_prefetch(void *rec) {
    la_fdrec_t *r = rec;
    la_waiter_t *w = __atomic_load_n(&r->rw, __ATOMIC_RELAXED);
    if (w) __builtin_prefetch(w, 1);
}

/* An event for record p (la_poller_wait's callback, on whichever worker
 * polled): counts it on an owned record, and claims and wakes the waiters
 * of its directions. */
void la_io_event(void *ctx, void *p, unsigned ev) {
    la_sched_t *s = ctx;
    la_fdrec_t *r = p;
    la_waiter_t *wake[2] = {NULL, NULL};
    la_spin_lock(&r->lk);
    int owned = atomic_load_explicit(&r->owned, memory_order_relaxed);
    if (owned) {
        /* relaxed: a park compares the counts under lk (the unlock
         * publishes them); an unlocked look that reads an older count only
         * sends the caller to that locked compare */
        if (ev & LA_PF_IN)
            atomic_store_explicit(&r->sin, atomic_load_explicit(&r->sin, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
        if (ev & LA_PF_OUT)
            atomic_store_explicit(&r->sout, atomic_load_explicit(&r->sout, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
        if (ev & LA_PF_PRI) atomic_store_explicit(&r->tcp, 0, memory_order_relaxed);
    }
    if (r->rw && (ev & LA_PF_IN) && la_waiter_claim(r->rw, LA_W_READY)) {
        wake[0] = r->rw;
        if (r->ww == r->rw) r->ww = NULL;
        la_fdrec_set_rw(r, NULL);
    }
    if (r->ww && (ev & LA_PF_OUT) && la_waiter_claim(r->ww, LA_W_READY)) {
        wake[1] = r->ww;
        if (r->rw == r->ww) la_fdrec_set_rw(r, NULL);
        r->ww = NULL;
    }
    /* the event disarmed a one-shot fd: re-arm for a waiter still there (rare) */
    if (!owned && (r->rw || r->ww)) la_io_arm(s, r, la_io_arm_mask(r));
    la_spin_unlock(&r->lk);
    /* claimed fibers cannot run before these calls: they are still alive */
    if (wake[0]) la_waiter_signal(wake[0]);
    if (wake[1]) la_waiter_signal(wake[1]);
}

