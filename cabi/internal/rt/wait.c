/* async_runtime_wait, driven from C.
 *
 * The wait runs one way: C raises the sleep flag, checks its own producer
 * queues (completions.c), sleeps in epoll_wait on the runtime's poller,
 * drains the doorbell and hands out C-posted completions itself, copying
 * each once, from its producer block into the caller's io_event_t. Go
 * (la_go_rt_step) is entered only when the poll harvested fd records, or Go
 * may have work (Shared.gowork: a timer added, a Go-side post) or a timer
 * may be due (Shared.next_due): it translates the fd records (contexts,
 * stale registrations), pops expired timers and publishes next_due again.
 * A wake-up by completions alone never enters Go.
 *
 * Pollers that C cannot drive (poll, kqueue and IOCP today: r->raw == 0) wait
 * in Go (la_go_rt_wait_go) after the same fast path.
 *
 * Lifetime: the call pins the handle only to find the record and raise the
 * busy flag; the record then stays valid while the flag is up, because
 * deinit (runtime.go) marks the record closed, rings the doorbell and
 * waits for the flag to drop before it closes the poller or recycles the
 * record. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#endif

#include "_cgo_export.h"
#include "rt.h"

/* The fd poll may be skipped while other events are ready (a poll is a
 * syscall), but never more than this many times in a row nor for longer
 * than LA_POLL_EVERY: fd events cannot starve (libasync's Prepare keeps the
 * same budget for waits driven in Go). */
#define LA_MAX_SKIPPED 8
#define LA_POLL_EVERY 1000000 /* ns */

/* ---- wakeups (async_runtime_wakeup) --------------------------------------
 * A wakeup is the flag sh.wakereq, raised before the doorbell rings. The
 * wait that takes the flag down returns (with the events that are ready, 0
 * or more), and no other wait returns for that wakeup: a wait takes it when
 * it begins (then it does not sleep) and after each poll (sort_bell; the Go
 * wait likewise, libasync's takeWakeup). A ring found with the flag down
 * ends a sleep and nothing more: the wait sleeps again. A relaxed load
 * comes first, so a wait with no wakeup pending pays no read-modify-write
 * and no system call. */
static inline int take_wakeup(la_shared_t *sh) {
    return atomic_load_explicit(&sh->wakereq, memory_order_relaxed) && atomic_exchange(&sh->wakereq, 0);
}

/* ---- stats (async_runtime_get_stats) ------------------------------------
 * Only the thread that holds r->waiting writes these counters (the flag's
 * compare-and-swap and its release order one waiter after the other), so a
 * relaxed load and store make each update: no read-modify-write, no fence;
 * get_stats reads them with relaxed loads from any thread. */
static inline void stat_add(_Atomic uint64_t *c, uint64_t n) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n, memory_order_relaxed);
}

/* Counts n events of the caller's array by kind (each bit of event_type).
 * A batch is mostly of one type (completions, timers, READ): that costs a
 * compare per event; a mixed batch is counted bit by bit. */
static void count_events(la_rtc_t *r, const io_event_t *ev, int n) {
    if (n <= 0) return;
    const uint32_t mask = (1u << ASYNC_RUNTIME_STATS_EVENT_KINDS) - 1;
    uint32_t t0 = ev[0].event_type, mixed = 0;
    for (int i = 1; i < n; i++) mixed |= ev[i].event_type ^ t0;
    if (!mixed) {
        for (uint32_t t = t0 & mask; t; t &= t - 1) stat_add(&r->st.events[__builtin_ctz(t)], (uint64_t)n);
    } else {
        uint32_t k[ASYNC_RUNTIME_STATS_EVENT_KINDS] = {0}, seen = 0;
        for (int i = 0; i < n; i++) {
            uint32_t t = ev[i].event_type & mask;
            seen |= t;
            for (; t; t &= t - 1) k[__builtin_ctz(t)]++;
        }
        for (; seen; seen &= seen - 1) {
            int b = __builtin_ctz(seen);
            stat_add(&r->st.events[b], k[b]);
        }
    }
    stat_add(&r->st.events_total, (uint64_t)n);
}

/* n events from la_rtc_take_events (the fast paths): completions, after
 * the SIGNAL events of the watched signals, which take hands out first
 * (completions.c). So one look at the first event tells whether all are
 * completions (then two adds); otherwise they are counted by type. */
static inline void count_taken(la_rtc_t *r, const io_event_t *ev, int n) {
    if (__builtin_expect(ev[0].event_type != ASYNC_EVENT_COMPLETION, 0)) {
        count_events(r, ev, n);
        return;
    }
    stat_add(&r->st.events[4 /* ASYNC_EVENT_COMPLETION */], (uint64_t)n);
    stat_add(&r->st.events_total, (uint64_t)n);
}
_Static_assert(ASYNC_EVENT_COMPLETION == 1u << 4, "completion bit");

#if !defined(_WIN32)
static int64_t clock_ns(const la_shared_t *sh) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec - sh->start;
}

#if defined(__linux__) /* c_wait's */
/* Whole ms until ns from now, rounded up: a sleep never ends early. */
static int ms_until(int64_t ns) {
    if (ns <= 0) return 0;
    int64_t ms = (ns + 999999) / 1000000;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}
#endif

/* 1 if the fd poll budget is spent: the fds must be polled now. */
static int poll_due(la_shared_t *sh, int64_t now) {
    return atomic_load(&sh->nfds) > 0 &&
           (atomic_load_explicit(&sh->skipped, memory_order_relaxed) >= LA_MAX_SKIPPED ||
            now - atomic_load_explicit(&sh->last_poll, memory_order_relaxed) >= LA_POLL_EVERY);
}

static void count_skip(la_shared_t *sh) {
    int32_t s = atomic_load_explicit(&sh->skipped, memory_order_relaxed);
    if (s < LA_MAX_SKIPPED) atomic_store_explicit(&sh->skipped, s + 1, memory_order_relaxed);
}

/* The hand-out of a fast path: the C-posted completions (and signals) are
 * the only events possible, so the fds and Go are not looked at. 1 if it
 * handed some out (*out set), 0 if there were none. */
static inline int take_fast(la_rtc_t *r, io_event_t *ev, int max, int *out) {
    int n = la_rtc_take_events(r, ev, max);
    if (n == 0) return 0;
    count_skip(&r->sh);
    count_taken(r, ev, n);
    *out = n;
    return 1;
}
#endif

#if defined(__linux__)
#define LA_BELL_DRAIN 4096u
/* Reads the eventfd doorbell, resetting its counter (and with it the edge
 * a poll has not reported yet: epoll looks at the counter when it reports).
 * What it held does not tell a wakeup (the flag does, see take_wakeup): a
 * wakeup whose flag an earlier wait took down may write its 2^32 after
 * that, and the periodic drain would report it a second time. */
static void drain_bell(la_rtc_t *r) {
    uint64_t v = 0;
    ssize_t k;
    r->bell_unread = 0;
    do k = la_read_nc(r->bell.fd, &v, sizeof v);
    while (k < 0 && errno == EINTR);
}

/* Translates n raw epoll records (the doorbell taken out), harvested by a
 * poll that began at regseq, into fd events at ev[*n..max), as libasync's
 * collectFds does: records of a registration changed since the poll began
 * are dropped. The poll harvests no more records than fit (see poll_once),
 * so every other record is reported. Returns 0, writing nothing, if some
 * record is not of a live registration the fd map knows: then Go takes the
 * whole batch. */
static int translate_fds(la_rtc_t *r, const struct epoll_event *raw, int nraw, uint64_t regseq, io_event_t *ev,
                         int *n, int max) {
    uintptr_t ctxs[LA_RAW_MAX];
    unsigned char keep[LA_RAW_MAX];
    for (int i = 0; i < nraw; i++) {
        int fd = (int)(uint32_t)raw[i].data.u64;
        int32_t rid = (int32_t)(raw[i].data.u64 >> 32), id;
        uint64_t seq;
        if (!la_fdmap_get(r, fd, &id, &ctxs[i], &seq) || id != rid) return 0;
        keep[i] = seq <= regseq;
    }
    for (int k = 0; k < nraw && *n < max; k++) {
        if (!keep[k]) continue;
        uint32_t e = raw[k].events, bits = 0;
        if (e & EPOLLIN) bits |= ASYNC_EVENT_READ;
        if (e & EPOLLOUT) bits |= ASYNC_EVENT_WRITE;
        if (e & EPOLLERR) bits |= ASYNC_EVENT_ERROR;
        if (e & (EPOLLHUP | EPOLLRDHUP)) bits |= ASYNC_EVENT_CLOSE;
        io_event_t *o = &ev[(*n)++];
        o->fd = (int)(uint32_t)raw[k].data.u64;
        o->event_type = bits;
        o->completion_key = 0;
        o->data = 0;
        o->context = (void *)ctxs[k];
    }
    return 1;
}

/* One round of c_wait: what its phases found and decided. */
typedef struct {
    int64_t now;
    int go_ready;  /* Go may have work: gowork raised, or a timer due */
    int must_poll; /* the fd poll budget is spent */
    int c_ready;   /* C-posted completions (or signals) wait */
    int ms;        /* the poll's timeout: 0 none, -1 for ever */
    int do_poll;   /* the fds are polled this round */
    int room;      /* records the poll may harvest: min(max_events, LA_RAW_MAX) */
    int nraw;      /* fd records the poll harvested (the doorbell taken out) */
    int woken;     /* an explicit wakeup (async_runtime_wakeup) */
    int intr;      /* the poll was interrupted by a signal */
    uint64_t regseq; /* the registration sequence when the poll began */
} la_round_t;

/* Plans the round's sleep: ms stays 0 (no sleep) while something is ready;
 * else the time to the deadline or the next timer, with the sleep flag
 * raised (and taken down again if a poster came in between). */
static inline void plan_sleep(la_rtc_t *r, la_round_t *rd, int64_t deadline) {
    la_shared_t *sh = &r->sh;
    rd->ms = 0;
    if (rd->go_ready || rd->c_ready) return;
    int64_t due = atomic_load(&sh->next_due);
    int64_t wake = deadline < due ? deadline : due;
    rd->ms = wake == INT64_MAX ? -1 : ms_until(wake - rd->now);
    if (rd->ms == 0) return;
    atomic_store(&sh->wake_at, wake);
    atomic_store(&sh->sleeping, 1);
    /* Dekker with the posters (completions.c, Go's Post and AddTimer):
     * after raising the flag, look again. */
    if (atomic_load(&sh->gowork) || la_rtc_pending(r)) {
        atomic_store(&sh->sleeping, 0);
        rd->ms = 0;
        rd->c_ready = 1;
    }
}

/* Takes the doorbell's records out of the k raw ones the poll harvested,
 * keeping the others (rd->nraw) in order, and takes a wakeup made before
 * the poll ended (also one whose ring has not landed yet, or whose signal
 * handler interrupted the poll). The doorbell is edge-triggered
 * (port/epoll_linux.go): a ring needs no read(2) to be over. It is read when
 * the wait takes a wakeup, and every LA_BELL_DRAIN unread edges, so the
 * counter never nears its limit. */
static inline void sort_bell(la_rtc_t *r, struct epoll_event *raw, int k, la_round_t *rd) {
    int rung = 0;
    for (int i = 0; i < k; i++) {
        if (raw[i].data.fd == r->bell.fd)
            rung = 1;
        else
            raw[rd->nraw++] = raw[i];
    }
    if (take_wakeup(&r->sh)) {
        rd->woken = 1;
        drain_bell(r);
    } else if (rung && ++r->bell_unread >= LA_BELL_DRAIN) {
        drain_bell(r);
    }
}

/* The calling thread's signal mask with SIGURG added, for a poll that may
 * sleep; NULL (no mask) if the mask cannot be read. Go's runtime sends
 * SIGURG to preempt goroutines, also to a host thread while it runs Go
 * code in the wait (la_go_rt_step); landing in the sleep it would end the
 * wait with EINTR, which the wait reports as "a signal interrupted the
 * wait". Blocked for the sleep, EINTR stays the host's own signals'
 * (port's waitMask keeps the same rule for the waits Go drives); a pending
 * SIGURG is handled as soon as the poll returns. */
static sigset_t *sleep_mask(sigset_t *set) {
    if (pthread_sigmask(SIG_BLOCK, NULL, set) != 0) return NULL;
    sigaddset(set, SIGURG);
    return set;
}

/* Polls the fds once, for up to rd->ms (the raw system call), and sorts out
 * the doorbell. 0, or ASYNC_E_CLOSED / ASYNC_E_SYS. */
static inline int poll_once(la_rtc_t *r, struct epoll_event *raw, la_round_t *rd, int *cs) {
    la_shared_t *sh = &r->sh;
    rd->regseq = atomic_load(&sh->reg_seq); /* before the poll: see libasync's fdReg */
    atomic_store_explicit(&sh->skipped, 0, memory_order_relaxed);
    atomic_store_explicit(&sh->last_poll, rd->now, memory_order_relaxed);
    /* A poll that may block is timed (idle_ns): one clock read more, only
     * then; the one after is needed anyway. */
    int64_t t0 = rd->ms != 0 ? clock_ns(sh) : 0;
    /* Not a cancellation point (base.h): a cancel in the sleep would leave
     * r->waiting up (every later wait: BUSY). The old state comes back when
     * la_rt_wait returns. */
    if (rd->ms != 0) la_nocancel_enter(cs);
    /* The raw system call: libc's epoll_wait is a cancellation point even
     * when ms is 0 (and cancellation is disabled only for a wait that may
     * sleep). A sleep blocks SIGURG (sleep_mask). It harvests at most rd->room
     * records, all of which are handed out (fd records go first): the
     * kernel moves each level-triggered record it returns to the tail of
     * its ready list, behind every fd not yet returned, and appends a
     * registration that is added ready there too, so the ready fds take
     * turns in a queue that adds and removes elsewhere do not reorder. A
     * record harvested and then left out would go to the tail unreported. */
    sigset_t set;
    sigset_t *mask = rd->ms != 0 ? sleep_mask(&set) : NULL;
    int k = (int)syscall(SYS_epoll_pwait, atomic_load(&sh->rawfd), raw, rd->room, rd->ms, mask,
                         (size_t)(_NSIG / 8));
    int err = errno;
    rd->now = clock_ns(sh);
    if (rd->ms != 0) {
        atomic_store(&sh->sleeping, 0);
        atomic_store_explicit(&sh->idle_ns, atomic_load_explicit(&sh->idle_ns, memory_order_relaxed) + (rd->now - t0),
                              memory_order_relaxed);
    }
    if (atomic_load(&r->closed)) return ASYNC_E_CLOSED;
    if (k < 0) {
        if (err != EINTR) {
            la_note_os_error(err); /* async_last_os_error */
            return ASYNC_E_SYS;
        }
        rd->intr = 1;
        k = 0;
    }
    sort_bell(r, raw, k, rd);
    return 0;
}

/* Gathers the round's events into ev[*n..max) in source order. Fd records
 * go first (they are level-triggered, and polled only once per budget while
 * completions flow); otherwise C's and Go's sources take turns at going
 * first. Records of live registrations are translated here (fd map); any
 * other (a ghost, a stray, a registration being changed) sends the whole
 * batch to Go, which knows what to do with them. 0 or Go's error. */
static inline int gather(la_rtc_t *r, io_event_t *ev, int max, int *n, struct epoll_event *raw, la_round_t *rd,
                         int *cs) {
    la_shared_t *sh = &r->sh;
    int go_first = rd->nraw > 0 || (r->rot++ & 1);
    if (rd->nraw > 0 && *n < max && translate_fds(r, raw, rd->nraw, rd->regseq, ev, n, max)) rd->nraw = 0;
    if (!go_first) *n += la_rtc_take_events(r, ev + *n, max - *n);
    if (*n < max && (rd->nraw > 0 || atomic_load(&sh->gowork) || rd->now >= atomic_load(&sh->next_due))) {
        int got = 0;
        la_nocancel_enter(cs); /* Go: no cancellation point in there (base.h) */
        int rc = la_go_rt_step(r->token, ev + *n, max - *n, raw, rd->nraw, rd->regseq, &got);
        if (rc != 0) return rc;
        *n += got;
    }
    if (go_first && *n < max) *n += la_rtc_take_events(r, ev + *n, max - *n);
    return 0;
}

/* The wait of a runtime whose poller C drives (epoll): rounds of fast path,
 * sleep planning, one poll, gathering, until an event, a wakeup, a signal
 * or the deadline. */
static int c_wait(la_rtc_t *r, io_event_t *ev, int max, int timeout, int *out, int *cs) {
    la_shared_t *sh = &r->sh;
    struct epoll_event raw[LA_RAW_MAX];
    la_round_t rd;
    rd.room = max < LA_RAW_MAX ? max : LA_RAW_MAX;
    rd.now = clock_ns(sh);
    int64_t deadline = timeout < 0 ? INT64_MAX : rd.now + (int64_t)timeout * 1000000;
    int force_poll = 0;
    for (;;) {
        if (atomic_load(&r->closed)) return ASYNC_E_CLOSED;
        int n = 0;
        rd.go_ready = atomic_load(&sh->gowork) || rd.now >= atomic_load(&sh->next_due);
        rd.must_poll = poll_due(sh, rd.now);
        if (!rd.go_ready && !rd.must_poll && take_fast(r, ev, max, out)) return 0;
        rd.c_ready = rd.go_ready || rd.must_poll ? la_rtc_pending(r) : 0;
        plan_sleep(r, &rd, deadline);
        int other_ready = rd.go_ready || rd.c_ready;
        rd.do_poll = rd.ms != 0 || (atomic_load(&sh->nfds) > 0 && (rd.must_poll || !other_ready || force_poll));
        rd.nraw = rd.woken = rd.intr = 0;
        rd.regseq = 0;
        if (rd.do_poll) {
            int rc = poll_once(r, raw, &rd, cs);
            if (rc != 0) return rc;
        } else if (other_ready) {
            count_skip(sh);
        }
        int rc = gather(r, ev, max, &n, raw, &rd, cs);
        if (rc != 0) return rc;
        if (n == 0 && !rd.do_poll && !rd.woken && !rd.intr && atomic_load(&sh->nfds) > 0 && !force_poll) {
            /* The poll was skipped for work that turned out to be nothing
             * (a stale gowork, an empty timer cascade): look at the fds
             * before returning 0, or wait(0) could miss a ready fd. */
            force_poll = 1;
            continue;
        }
        force_poll = 0;
        if (n > 0 || rd.woken || rd.intr || timeout == 0 || rd.now >= deadline) {
            count_events(r, ev, n);
            *out = n;
            return 0;
        }
    }
}
#endif

#if !defined(_WIN32)
/* The fast path of a wait that Go drives: while Go has nothing ready and
 * the fds need not be polled yet, the C-posted completions are the only
 * possible events. Returns 1 if it handed some out. */
static int fast_wait(la_rtc_t *r, io_event_t *ev, int max, int *out) {
    la_shared_t *sh = &r->sh;
    if (atomic_load(&sh->gowork)) return 0;
    int64_t now = clock_ns(sh);
    if (now >= atomic_load(&sh->next_due) || poll_due(sh, now)) return 0;
    return take_fast(r, ev, max, out);
}
#endif

int la_rt_wait(uint64_t h, io_event_t *events, int max, int timeout, int *out) {
    la_slot_t *slot;
    la_rtc_t *r = la_handle_get(h, LA_T_RUNTIME, &slot);
    if (!r) return ASYNC_E_BADHANDLE;
    if (!events || max < 1 || timeout < -1) {
        la_handle_put(slot);
        return ASYNC_E_INVAL;
    }
    int32_t idle = 0;
    if (!atomic_compare_exchange_strong(&r->waiting, &idle, 1)) {
        la_handle_put(slot);
        return ASYNC_E_BUSY;
    }
    la_handle_put(slot); /* r stays ours while the flag is up (see the top) */
    int rc;
    *out = 0;
    if (atomic_load(&r->closed)) {
        rc = ASYNC_E_CLOSED;
    } else {
        if (take_wakeup(&r->sh)) {
            /* A wakeup made before this wait: it returns without sleeping,
             * with what is ready. Its ring need not end a later sleep. */
            timeout = 0;
#if defined(__linux__)
            if (r->raw) drain_bell(r);
#endif
        }
#if defined(__linux__)
        if (r->raw) {
            int cs = LA_CANCEL_KEPT;
            rc = c_wait(r, events, max, timeout, out, &cs);
            if (rc == 0) stat_add(&r->st.iterations, 1);
            atomic_store(&r->waiting, 0);
            la_nocancel_leave(&cs);
            return rc;
        }
#endif
#if !defined(_WIN32)
        if (fast_wait(r, events, max, out)) {
            stat_add(&r->st.iterations, 1);
            atomic_store(&r->waiting, 0);
            return 0;
        }
#endif
        int cs = LA_CANCEL_KEPT;
        la_nocancel_enter(&cs); /* Go sleeps in there (poll, kqueue): not a cancellation point */
        rc = la_go_rt_wait_go(r->token, events, max, timeout, out);
        la_nocancel_leave(&cs);
        if (rc == 0) count_events(r, events, *out);
    }
    if (rc == 0) stat_add(&r->st.iterations, 1);
    atomic_store(&r->waiting, 0);
    return rc;
}
