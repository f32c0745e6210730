/* The event loop under bounded-time random load (stress): completions from
 * 8 threads, timers added and cancelled from many threads, fds added,
 * modified and removed from threads while the loop waits. Every completion,
 * timer and fd event is accounted for: nothing lost, duplicated or reordered
 * per producer. Each case runs for ASYNC_STRESS_SECONDS (default 3) with a
 * printed seed (ASYNC_STRESS_SEED repeats its choices; the thread
 * interleaving is not repeatable), in rounds of about a second so memory
 * stays flat however long it runs (scripts/soak.sh runs it for minutes). */
#include "check.h"
#include "rt.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/socket.h>

/* --- completions from 8 threads ------------------------------------------- */
/*
 * 8 producers post (key = producer, data = producer:seq) in bursts of random
 * size with random pauses, so the loop alternates between busy and asleep
 * (the doorbell path). A waker thread calls async_runtime_wakeup in random
 * bursts. The loop waits with random max_events (1..64) and random timeouts
 * (0, 1..5 ms, -1). Every (key, data) must come out exactly once and in
 * order per producer; a wait that times out while completions posted before
 * it began are still undelivered is a lost wake-up. Producers stay at most
 * CS_BACKLOG ahead of the loop, so memory stays bounded on long runs.
 */

enum { CS_PROD = 8, CS_BACKLOG = 20000 };
#define CS_KEY(p) ((uintptr_t)0xC0FFEE00u + (uintptr_t)(p))
#define CS_DATA(p, s) (((uintptr_t)(p) << 56) | (uintptr_t)(s))

static struct {
    async_runtime_t *rt;
    double deadline;
    _Atomic uint64_t posted[CS_PROD], taken[CS_PROD];
    atomic_int producers_left, waker_stop;
    _Atomic uint64_t wakeups;
} cs;

static void *cs_producer(void *arg)
{
    uint32_t p = (uint32_t)(uintptr_t)arg;
    uint64_t seq = 0;
    rng_t r;
    rng_init(&r, 1000 + p);
    while (now_ms() < cs.deadline) {
        uint32_t burst = rng_below(&r, 4) == 0 ? 1 + rng_below(&r, 4) : 1 + rng_below(&r, 256), b, pause;
        if (seq - atomic_load(&cs.taken[p]) > CS_BACKLOG) {
            sleep_us(200);
            continue;
        }
        for (b = 0; b < burst; b++) {
            CHECK_EQ(async_runtime_post_completion(cs.rt, CS_KEY(p), CS_DATA(p, seq)), 0);
            seq++;
            atomic_store(&cs.posted[p], seq);
        }
        pause = rng_below(&r, 10);
        if (pause >= 8)
            sleep_us(rng_below(&r, 2000));
        else if (pause >= 5)
            sched_yield();
    }
    atomic_fetch_sub(&cs.producers_left, 1);
    return NULL;
}

static void *cs_waker(void *arg)
{
    rng_t r;
    (void)arg;
    rng_init(&r, 1100);
    while (!atomic_load(&cs.waker_stop)) {
        uint32_t n = rng_below(&r, 3) == 0 ? 1 + rng_below(&r, 50) : 1, i;
        for (i = 0; i < n; i++)
            CHECK_EQ(async_runtime_wakeup(cs.rt), 0);
        atomic_fetch_add(&cs.wakeups, n);
        sleep_us(rng_below(&r, 4) == 0 ? 5000 + rng_below(&r, 20000) : rng_below(&r, 1000));
    }
    return NULL;
}

static uint64_t cs_posted_total(void)
{
    uint64_t t = 0;
    int i;
    for (i = 0; i < CS_PROD; i++)
        t += atomic_load(&cs.posted[i]);
    return t;
}

CASE(completions_from_threads) // poll stress
{
    pthread_t prod[CS_PROD], waker;
    static io_event_t ev[64];
    uint64_t next[CS_PROD] = {0}, received = 0, waits = 0, empty_waits = 0;
    bool waker_running = true;
    rng_t r;
    int i;
    cs.deadline = stress_begin_rng("completions", &r, 1200);
    cs.rt = mkrt();
    atomic_store(&cs.producers_left, CS_PROD);
    start_thread(&waker, cs_waker, NULL);
    for (i = 0; i < CS_PROD; i++)
        start_thread(&prod[i], cs_producer, (void *)(uintptr_t)i);
    for (;;) {
        bool producing = atomic_load(&cs.producers_left) > 0;
        uint64_t before = cs_posted_total(); /* all of these were posted before the wait */
        int max = 1 + (int)rng_below(&r, 64), timeout, n, k;
        double t0, el;
        if (!producing && waker_running) {
            atomic_store(&cs.waker_stop, 1);
            join_within(waker, 10000, "the waker thread");
            waker_running = false;
        }
        if (!producing && received == before)
            break;
        if (producing)
            timeout = (int[]){0, 1, 2, 5, -1}[rng_below(&r, 5)];
        else
            timeout = 10000; /* nobody wakes us now: only the completions can */
        t0 = now_ms();
        n = async_runtime_wait(cs.rt, ev, max, timeout);
        el = now_ms() - t0;
        CHECK(n >= 0 && n <= max);
        waits++;
        for (k = 0; k < n; k++) {
            uintptr_t p = ev[k].completion_key - CS_KEY(0);
            CHECK_EQ(ev[k].event_type, ASYNC_EVENT_COMPLETION);
            CHECK_EQ(ev[k].fd, -1);
            CHECK(ev[k].context == NULL);
            CHECK(p < CS_PROD);
            if (ev[k].data != CS_DATA(p, next[p])) {
                fprintf(stderr, "producer %u: expected seq %llu, got data %#llx\n", (unsigned)p,
                        (unsigned long long)next[p], (unsigned long long)ev[k].data);
                CHECK(!"exactly once, in order per producer");
            }
            next[p]++;
            atomic_store(&cs.taken[p], next[p]);
        }
        received += (uint64_t)n;
        if (n == 0) {
            empty_waits++;
            if (timeout > 0 && el >= timeout && received < before) {
                fprintf(stderr, "a %d ms wait timed out with %llu completions posted before it undelivered\n",
                        timeout, (unsigned long long)(before - received));
                CHECK(!"no lost wake-up");
            }
        }
    }
    for (i = 0; i < CS_PROD; i++) {
        join_within(prod[i], 10000, "a producer");
        CHECK_EQ(next[i], atomic_load(&cs.posted[i]));
    }
    CHECK_EQ(async_runtime_wait(cs.rt, ev, 64, 0), 0); /* nothing extra */
    printf("completions: %llu delivered in %llu waits (%llu empty), %llu wakeups\n", (unsigned long long)received,
           (unsigned long long)waits, (unsigned long long)empty_waits,
           (unsigned long long)atomic_load(&cs.wakeups));
    CHECK(received > 0);
    async_runtime_deinit(cs.rt);
}

/* --- timers added and cancelled from many threads --------------------------- */
/*
 * 6 threads each own 512 timer slots. A thread picks a slot at random: a free
 * slot gets a new timer (one-shot with a delay of 0..19 ms mostly, some
 * 64..463 ms to cross wheel levels, a few of an hour that must be cancelled;
 * 15% repeat every 1..7 ms), an armed one may be cancelled. The loop thread
 * waits with random max_events and timeouts. The key carries (thread, slot,
 * generation); a slot is reused only once its timer is settled (fired, or
 * cancelled and no longer deliverable). Checked: the id in data is the id
 * add_timer returned; nothing fires early (the k-th firing of a repeating
 * timer not before delay + (k-1) * period); a one-shot fires at most once and
 * either fires or is cancelled successfully, never both; no event after a
 * successful cancel (for repeating timers: in no wait that began after the
 * cancel returned); cancel of a delivered one-shot gives NOTFOUND; and at
 * the end every timer is settled (none lost).
 */

enum { TS_THREADS = 6, TS_SLOTS = 512 };
#define TS_MAGIC ((uintptr_t)0x71 << 56)
#define TS_KEY(t, i, g) (TS_MAGIC | ((uintptr_t)(t) << 48) | ((uintptr_t)(i) << 32) | (uintptr_t)(g))

typedef struct {
    _Atomic uint32_t gen; /* the generation in flight; 0: never used */
    int armed;            /* owner only */
    bool cancel_tried;    /* owner only */
    uint64_t delay, period;
    double t_add;         /* written before gen (release), read after it (acquire) */
    _Atomic uint64_t id;  /* 0 until add_timer returned */
    _Atomic uint32_t fired;
    _Atomic int cancel_ok;
    _Atomic uint64_t cancel_seq;
} ts_slot_t;

static struct {
    async_runtime_t *rt;
    double deadline;
    ts_slot_t slot[TS_THREADS][TS_SLOTS];
    _Atomic uint64_t wseq;  /* bumped before each wait */
    _Atomic uint64_t wdone; /* the last wait whose events were all processed */
    atomic_int threads_left;
    _Atomic uint64_t added, cancelled, cancel_late, fired_once, fired_repeat;
} ts;

/* Settled: no event for this generation can come any more. */
static bool ts_settled(ts_slot_t *s)
{
    if (s->period == 0)
        return atomic_load(&s->fired) == 1 || atomic_load(&s->cancel_ok);
    return atomic_load(&s->cancel_ok) && atomic_load(&ts.wdone) > atomic_load(&s->cancel_seq);
}

static void ts_cancel(ts_slot_t *s)
{
    uint64_t id = atomic_load(&s->id);
    s->cancel_tried = true;
    if (async_runtime_cancel_timer(ts.rt, id) == 0) {
        atomic_store(&s->cancel_seq, atomic_load(&ts.wseq));
        atomic_store(&s->cancel_ok, 1);
        if (s->period == 0 && atomic_load(&s->fired) != 0)
            CHECK(!"a one-shot timer was delivered and then cancelled successfully");
        atomic_fetch_add(&ts.cancelled, 1);
    } else {
        /* only a delivered one-shot may be unknown */
        CHECK_ERR(ASYNC_E_NOTFOUND);
        if (s->period != 0)
            CHECK(!"cancel of a live repeating timer failed");
        atomic_fetch_add(&ts.cancel_late, 1);
    }
}

static void *ts_thread(void *arg)
{
    uint32_t t = (uint32_t)(uintptr_t)arg, i;
    rng_t r;
    double end;
    rng_init(&r, 2000 + t);
    while (now_ms() < ts.deadline) {
        ts_slot_t *s;
        i = rng_below(&r, TS_SLOTS);
        s = &ts.slot[t][i];
        if (s->armed && ts_settled(s))
            s->armed = 0;
        if (!s->armed) {
            uint32_t d = rng_below(&r, 100), g = atomic_load(&s->gen) + 1;
            uint64_t id;
            s->delay = d < 70 ? rng_below(&r, 20) : d < 90 ? rng_below(&r, 5) : d < 98 ? 64 + rng_below(&r, 400) : 3600000;
            s->period = s->delay < 1000 && rng_below(&r, 100) < 15 ? 1 + rng_below(&r, 7) : 0;
            s->cancel_tried = false;
            atomic_store(&s->id, 0);
            atomic_store(&s->fired, 0);
            atomic_store(&s->cancel_ok, 0);
            s->t_add = now_ms();
            atomic_store(&s->gen, g);
            s->armed = 1;
            id = async_runtime_add_timer(ts.rt, s->delay, s->period, TS_KEY(t, i, g));
            CHECK(id != 0);
            atomic_store(&s->id, id);
            atomic_fetch_add(&ts.added, 1);
        } else if (!s->cancel_tried && (s->period != 0 || s->delay > 1000 ? rng_below(&r, 3) == 0 : rng_below(&r, 10) == 0)) {
            ts_cancel(s);
        }
        if (rng_below(&r, 16) == 0)
            sleep_us(rng_below(&r, 200));
    }
    /* cancel what would never end on its own, then wait for the rest */
    for (i = 0; i < TS_SLOTS; i++) {
        ts_slot_t *s = &ts.slot[t][i];
        if (s->armed && !s->cancel_tried && (s->period != 0 || s->delay > 1000))
            ts_cancel(s);
    }
    end = now_ms() + 10000;
    for (i = 0; i < TS_SLOTS; i++) {
        ts_slot_t *s = &ts.slot[t][i];
        while (s->armed && !ts_settled(s)) {
            if (now_ms() > end) {
                fprintf(stderr, "thread %u slot %u: timer (delay %llu, period %llu) neither fired nor cancelled\n",
                        t, i, (unsigned long long)s->delay, (unsigned long long)s->period);
                CHECK(!"no timer lost");
            }
            sleep_ms(1);
        }
    }
    atomic_fetch_sub(&ts.threads_left, 1);
    return NULL;
}

static void ts_event(const io_event_t *e, uint64_t wseq, double now)
{
    uintptr_t key = e->completion_key;
    uint32_t t = (uint32_t)(key >> 48) & 0xFF, i = (uint32_t)(key >> 32) & 0xFFFF, g = (uint32_t)key;
    ts_slot_t *s;
    uint64_t delay, period, id;
    double t_add;
    uint32_t k;
    CHECK_EQ(e->event_type, ASYNC_EVENT_TIMER);
    CHECK_EQ(e->fd, -1);
    CHECK(e->context == NULL);
    CHECK((key & ((uintptr_t)0xFF << 56)) == TS_MAGIC && t < TS_THREADS && i < TS_SLOTS);
    s = &ts.slot[t][i];
    if (atomic_load(&s->gen) != g) {
        fprintf(stderr, "timer event for thread %u slot %u gen %u, but the slot is at gen %u (settled before)\n", t, i,
                g, atomic_load(&s->gen));
        CHECK(!"no event after a timer was settled");
    }
    delay = s->delay;
    period = s->period;
    t_add = s->t_add;
    id = atomic_load(&s->id);
    if (id != 0 && e->data != (uintptr_t)id) {
        fprintf(stderr, "timer event data %#llx, add_timer returned %#llx\n", (unsigned long long)e->data,
                (unsigned long long)id);
        CHECK(!"data is the timer id");
    }
    /* Read before fired counts this event: once it does, a one-shot slot is
     * settled, and its thread may re-arm it and cancel the next timer
     * (cancel_ok of the next generation) before the checks below. */
    int cancelled = atomic_load(&s->cancel_ok);
    uint64_t cancel_seq = atomic_load(&s->cancel_seq);
    k = atomic_fetch_add(&s->fired, 1) + 1;
    if (now + 0.01 < t_add + (double)delay + (double)(k - 1) * (double)period) {
        fprintf(stderr, "timer (delay %llu, period %llu) fired for the %u. time %.3f ms after add\n",
                (unsigned long long)delay, (unsigned long long)period, k, now - t_add);
        CHECK(!"no timer fires early");
    }
    if (period == 0 && k > 1)
        CHECK(!"a one-shot timer fired twice");
    if (cancelled) {
        if (period == 0)
            CHECK(!"a one-shot timer fired after a successful cancel");
        if (wseq > cancel_seq)
            CHECK(!"a repeating timer fired in a wait that began after its cancel");
    }
    atomic_fetch_add(period ? &ts.fired_repeat : &ts.fired_once, 1);
}

CASE(timers_from_threads) // poll stress
{
    pthread_t th[TS_THREADS];
    static io_event_t ev[64];
    uint64_t waits = 0;
    rng_t r;
    int i;
    ts.deadline = stress_begin_rng("timers", &r, 2100);
    ts.rt = mkrt();
    atomic_store(&ts.threads_left, TS_THREADS);
    for (i = 0; i < TS_THREADS; i++)
        start_thread(&th[i], ts_thread, (void *)(uintptr_t)i);
    while (atomic_load(&ts.threads_left) > 0) {
        uint64_t seq = atomic_fetch_add(&ts.wseq, 1) + 1;
        int max = 1 + (int)rng_below(&r, 64), n, k;
        double now;
        n = async_runtime_wait(ts.rt, ev, max, (int[]){0, 1, 3, 10}[rng_below(&r, 4)]);
        now = now_ms();
        CHECK(n >= 0 && n <= max);
        for (k = 0; k < n; k++)
            ts_event(&ev[k], seq, now);
        atomic_store(&ts.wdone, seq);
        waits++;
    }
    for (i = 0; i < TS_THREADS; i++)
        join_within(th[i], 10000, "a timer thread");
    /* every slot is settled; nothing more arrives */
    {
        int n = async_runtime_wait(ts.rt, ev, 64, 30);
        CHECK_EQ(n, 0);
    }
    printf("timers: %llu added, %llu one-shot fired, %llu repeat firings, %llu cancelled, %llu cancels too late, "
           "%llu waits\n",
           (unsigned long long)atomic_load(&ts.added), (unsigned long long)atomic_load(&ts.fired_once),
           (unsigned long long)atomic_load(&ts.fired_repeat), (unsigned long long)atomic_load(&ts.cancelled),
           (unsigned long long)atomic_load(&ts.cancel_late), (unsigned long long)waits);
    CHECK(atomic_load(&ts.fired_once) > 0 && atomic_load(&ts.cancelled) > 0 && atomic_load(&ts.fired_repeat) > 0);
    async_runtime_deinit(ts.rt);
}

/* --- fds added, modified and removed from threads while the loop waits ------ */
/*
 * 4 threads each cycle 16 slots: make a pipe or socketpair, register it in
 * one of five ways, make it ready, wait until the loop reports it, remove
 * and close it. Modes: READ then write; events 0, write, then modify to
 * READ (READ must not be reported before the modify); WRITE on a socket;
 * READ|WRITE; READ then close the peer (EOF). Now and then a slot is removed
 * before it was reported. Each thread also keeps 16 idle registrations. The
 * loop waits with random max_events and timeouts, -1 included, so an add
 * must wake a sleeping wait (the poll backend rebuilds its set). Checked:
 * every registration's event arrives (10 s bound), with the fd and context
 * given at add; none for a generation not yet registered.
 */

enum { FS_THREADS = 4, FS_SLOTS = 16, FS_IDLE = 16 };
#define FS_CTX(t, i, g) ((void *)(((uintptr_t)0xF5 << 56) | ((uintptr_t)(t) << 48) | ((uintptr_t)(i) << 32) | (g)))
#define FS_END ((uintptr_t)0xE4D)

enum { FM_READ, FM_MODIFY, FM_WRITE, FM_BOTH, FM_EOF, FM_COUNT };

typedef struct {
    _Atomic uint32_t gen;
    atomic_int fd;
    atomic_int mode;
    atomic_int armed; /* FM_MODIFY: READ may be reported */
    _Atomic uint32_t acked;
    /* owner only */
    int peer, busy;
    double t_armed;
} fs_slot_t;

static struct {
    async_runtime_t *rt;
    double deadline;
    fs_slot_t slot[FS_THREADS][FS_SLOTS];
    _Atomic uint64_t cycles, aborted, stale, null_ctx, early_read;
} fs;

static void fs_arm(uint32_t t, uint32_t i, fs_slot_t *s, rng_t *r)
{
    int mode = (int)rng_below(r, FM_COUNT), p[2];
    uint32_t g = atomic_load(&s->gen) + 1, ev;
    if (mode == FM_WRITE || mode == FM_BOTH || rng_below(r, 2))
        CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) == 0);
    else
        CHECK(pipe2(p, O_CLOEXEC) == 0);
    atomic_store(&s->gen, g); /* first: the loop re-reads it to tell a torn read (see fs_event) */
    atomic_store(&s->fd, p[0]);
    atomic_store(&s->mode, mode);
    atomic_store(&s->armed, mode != FM_MODIFY);
    s->peer = p[1];
    ev = mode == FM_MODIFY ? 0
         : mode == FM_WRITE ? ASYNC_EVENT_WRITE
         : mode == FM_BOTH  ? ASYNC_EVENT_READ | ASYNC_EVENT_WRITE
                            : ASYNC_EVENT_READ;
    CHECK_EQ(async_runtime_add(fs.rt, p[0], ev, FS_CTX(t, i, g)), 0);
    if (mode == FM_EOF) {
        close(p[1]);
        s->peer = -1;
    } else if (mode != FM_WRITE) {
        CHECK(write(p[1], "x", 1) == 1);
    }
    if (mode == FM_MODIFY) {
        if (rng_below(r, 2))
            sleep_us(rng_below(r, 500)); /* give the loop a chance to misreport */
        atomic_store(&s->armed, 1);
        CHECK_EQ(async_runtime_modify(fs.rt, p[0], ASYNC_EVENT_READ), 0);
    }
    s->busy = 1;
    s->t_armed = now_ms();
}

static void fs_disarm(fs_slot_t *s)
{
    int fd = atomic_load(&s->fd);
    CHECK_EQ(async_runtime_remove(fs.rt, fd), 0);
    close(fd);
    if (s->peer >= 0)
        close(s->peer);
    s->busy = 0;
    atomic_fetch_add(&fs.cycles, 1);
}

static void *fs_thread(void *arg)
{
    uint32_t t = (uint32_t)(uintptr_t)arg, i;
    int idle[FS_IDLE][2];
    rng_t r;
    rng_init(&r, 4000 + t);
    for (i = 0; i < FS_IDLE; i++) {
        CHECK(pipe2(idle[i], O_CLOEXEC) == 0);
        CHECK_EQ(async_runtime_add(fs.rt, idle[i][0], ASYNC_EVENT_READ, (void *)(uintptr_t)0x1D1E), 0);
    }
    while (now_ms() < fs.deadline) {
        fs_slot_t *s;
        i = rng_below(&r, FS_SLOTS);
        s = &fs.slot[t][i];
        if (!s->busy) {
            fs_arm(t, i, s, &r);
        } else if (atomic_load(&s->acked) == atomic_load(&s->gen)) {
            fs_disarm(s);
        } else if (rng_below(&r, 50) == 0) {
            fs_disarm(s); /* removed before it was reported */
            atomic_fetch_add(&fs.aborted, 1);
        } else if (now_ms() - s->t_armed > 10000) {
            fprintf(stderr, "thread %u slot %u mode %d: no event within 10 s\n", t, i, atomic_load(&s->mode));
            CHECK(!"no fd event lost");
        }
        if (rng_below(&r, 8) == 0)
            sleep_us(rng_below(&r, 300));
    }
    for (i = 0; i < FS_SLOTS; i++)
        if (fs.slot[t][i].busy)
            fs_disarm(&fs.slot[t][i]);
    for (i = 0; i < FS_IDLE; i++) {
        CHECK_EQ(async_runtime_remove(fs.rt, idle[i][0]), 0);
        close_pair(idle[i]);
    }
    CHECK_EQ(async_runtime_post_completion(fs.rt, FS_END, t), 0);
    return NULL;
}

static void fs_event(const io_event_t *e)
{
    uintptr_t c = (uintptr_t)e->context;
    uint32_t t = (uint32_t)(c >> 48) & 0xFF, i = (uint32_t)(c >> 32) & 0xFFFF, g = (uint32_t)c, cur;
    fs_slot_t *s;
    int mode, fd, armed;
    CHECK(e->fd >= 0);
    CHECK(e->completion_key == 0 && e->data == 0);
    CHECK((e->event_type & ~(uint32_t)(ASYNC_EVENT_READ | ASYNC_EVENT_WRITE | ASYNC_EVENT_ERROR |
                                       ASYNC_EVENT_CLOSE)) == 0);
    if (c == 0x1D1E)
        CHECK(!"an idle registration (never written) reported an event");
    if (c == 0) {
        /* counted, reported at the end (see t_fds_from_threads) */
        if (atomic_fetch_add(&fs.null_ctx, 1) < 3)
            fprintf(stderr, "fd event with a NULL context: fd %d, events %#x\n", e->fd, e->event_type);
        return;
    }
    if ((c >> 56) != 0xF5 || t >= FS_THREADS || i >= FS_SLOTS) {
        fprintf(stderr, "fd event: fd %d type %#x context %p\n", e->fd, e->event_type, e->context);
        CHECK(!"the context given at add");
    }
    s = &fs.slot[t][i];
    /* a seqlock read: the owner stores gen before fd, mode and armed */
    cur = atomic_load(&s->gen);
    fd = atomic_load(&s->fd);
    mode = atomic_load(&s->mode);
    armed = atomic_load(&s->armed);
    if (g > cur)
        CHECK(!"an event for a registration not made yet");
    if (g < cur || atomic_load(&s->gen) != cur) {
        atomic_fetch_add(&fs.stale, 1); /* collected just before its remove; the slot moved on */
        return;
    }
    if (e->fd != fd) {
        fprintf(stderr, "event fd %d, registered fd %d\n", e->fd, fd);
        CHECK(!"the event carries the registered fd");
    }
    if ((e->event_type & ASYNC_EVENT_READ) && !armed) {
        /* counted, reported at the end (see t_fds_from_threads) */
        if (atomic_fetch_add(&fs.early_read, 1) < 3)
            fprintf(stderr, "READ reported for fd %d registered with events 0 (gen %u)\n", e->fd, g);
        return;
    }
    if ((mode == FM_WRITE && (e->event_type & ASYNC_EVENT_WRITE)) ||
        (mode == FM_BOTH && (e->event_type & (ASYNC_EVENT_READ | ASYNC_EVENT_WRITE))) ||
        (mode == FM_EOF && (e->event_type & (ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE))) ||
        ((mode == FM_READ || mode == FM_MODIFY) && (e->event_type & ASYNC_EVENT_READ)))
        atomic_store(&s->acked, g);
}

CASE(fds_from_threads) // poll stress
{
    pthread_t th[FS_THREADS];
    static io_event_t ev[32];
    uint64_t events = 0, waits = 0;
    int ended = 0, i;
    rng_t r;
    fs.deadline = stress_begin_rng("fds", &r, 4100);
    fs.rt = mkrt();
    for (i = 0; i < FS_THREADS; i++)
        start_thread(&th[i], fs_thread, (void *)(uintptr_t)i);
    while (ended < FS_THREADS) {
        int max = 1 + (int)rng_below(&r, 32), n, k;
        n = async_runtime_wait(fs.rt, ev, max, (int[]){-1, -1, 0, 1, 5}[rng_below(&r, 5)]);
        CHECK(n >= 0 && n <= max);
        waits++;
        for (k = 0; k < n; k++) {
            if (ev[k].event_type == ASYNC_EVENT_COMPLETION) {
                CHECK(ev[k].completion_key == FS_END);
                ended++;
                continue;
            }
            fs_event(&ev[k]);
            events++;
        }
    }
    for (i = 0; i < FS_THREADS; i++)
        join_within(th[i], 10000, "an fd thread");
    printf("fds: %llu register/ready/remove cycles (%llu removed early), %llu events (%llu just before remove, "
           "%llu with a NULL context), %llu waits\n",
           (unsigned long long)atomic_load(&fs.cycles), (unsigned long long)atomic_load(&fs.aborted),
           (unsigned long long)events, (unsigned long long)atomic_load(&fs.stale),
           (unsigned long long)atomic_load(&fs.null_ctx), (unsigned long long)waits);
    CHECK(atomic_load(&fs.cycles) > 0);
    CHECK_EQ(async_runtime_wait(fs.rt, ev, 32, 0), 0); /* everything was removed */
    if (atomic_load(&fs.null_ctx) != 0)
        fprintf(stderr, "%llu fd events came with a NULL context instead of the one given at add: an fd "
                        "removed by another thread while the wait was collecting still got reported\n",
                (unsigned long long)atomic_load(&fs.null_ctx));
    if (atomic_load(&fs.early_read) != 0)
        fprintf(stderr, "%llu READ events for registrations made with events 0 (not modified yet): readiness "
                        "of an fd removed while the wait was collecting went to the new registration of the "
                        "same fd number\n",
                (unsigned long long)atomic_load(&fs.early_read));
    CHECK_EQ(atomic_load(&fs.null_ctx), 0);
    CHECK_EQ(atomic_load(&fs.early_read), 0);
    async_runtime_deinit(fs.rt);
}

TEST_MAIN()
