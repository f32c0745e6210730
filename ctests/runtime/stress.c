/* Bounded-time stress tests: many threads (and fibers) hammer one object at
 * random while every message, completion, timer and fd event is accounted
 * for: nothing lost, duplicated or reordered per producer.
 *
 * Each case runs for ASYNC_STRESS_SECONDS (default 3). The random choices
 * come from a seed printed at the start (ASYNC_STRESS_SEED repeats them; the
 * thread interleaving is of course not repeatable). Cases that need exact
 * bookkeeping run in rounds of at most about a second, so memory stays flat
 * however long they run (scripts/soak.sh runs them for minutes).
 *
 * Run one case: test_stress CASE. The runtime cases are registered again with
 * ASYNC_BACKEND=poll (see CMakeLists.txt). */
#include "check.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>

/* --- common ------------------------------------------------------------- */

static uint64_t g_seed;

/* Prints the seed and returns the case's deadline (now_ms() based). */
static double stress_begin(const char *name)
{
    const char *s = getenv("ASYNC_STRESS_SECONDS");
    const char *sd = getenv("ASYNC_STRESS_SEED");
    double sec = s && *s ? atof(s) : 3.0;
    setvbuf(stdout, NULL, _IOLBF, 0); /* a failed CHECK ends with _exit: keep what was printed */
    if (sec < 0.2)
        sec = 0.2;
    g_seed = sd && *sd ? strtoull(sd, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    printf("%s: %.1f s, ASYNC_STRESS_SEED=%llu, backend %s\n", name, sec, (unsigned long long)g_seed,
           getenv("ASYNC_BACKEND") ? getenv("ASYNC_BACKEND") : "default");
    fflush(stdout);
    return now_ms() + sec * 1000.0;
}

typedef struct {
    uint64_t s;
} rng_t;

static void rng_init(rng_t *r, uint64_t stream)
{
    r->s = g_seed ^ (stream * 0x9E3779B97F4A7C15ull) ^ 0xD1B54A32D192ED03ull;
    if (r->s == 0)
        r->s = 1;
}

/* A number in [0, n); n > 0. */
static uint32_t rnd(rng_t *r, uint32_t n)
{
    uint64_t x = r->s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    r->s = x;
    return (uint32_t)((x >> 11) % n);
}

static void sleep_us(unsigned us)
{
    struct timespec ts;
    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (long)(us % 1000000) * 1000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A fixed-size bit set with atomic test-and-set. */
typedef struct {
    _Atomic uint64_t *w;
    size_t bits;
} bitmap_t;

static void bm_init(bitmap_t *b, size_t bits)
{
    b->bits = bits;
    b->w = calloc((bits + 63) / 64, sizeof(uint64_t));
    CHECK(b->w != NULL);
}

static void bm_clear(bitmap_t *b)
{
    memset((void *)b->w, 0, (b->bits + 63) / 64 * sizeof(uint64_t));
}

/* Sets bit i; false if it was already set (a duplicate). */
static bool bm_set(bitmap_t *b, uint64_t i)
{
    uint64_t m = (uint64_t)1 << (i % 64);
    CHECK(i < b->bits);
    return (atomic_fetch_or(&b->w[i / 64], m) & m) == 0;
}

/* Number of set bits among the first n. */
static uint64_t bm_count(bitmap_t *b, uint64_t n)
{
    uint64_t c = 0, i;
    for (i = 0; i < n; i++)
        c += (atomic_load(&b->w[i / 64]) >> (i % 64)) & 1;
    return c;
}

static void bm_free(bitmap_t *b)
{
    free((void *)b->w);
    b->w = NULL;
}


/* --- queue MPMC under each policy ---------------------------------------- */
/*
 * 4 producers and 4 consumers share one queue of random capacity (1..32).
 * Messages have random lengths (16..64 bytes) and a payload derived from
 * (producer, seq). Producers mix enqueue and enqueue_wait with random
 * timeouts; consumers mix dequeue, dequeue_wait with random timeouts and
 * buffers that are sometimes too small (BUFSIZE: the message must stay).
 * A stats thread checks every snapshot: enqueued = dequeued + dropped + left.
 * Checked per round: each consumer sees each producer's sequence strictly
 * increasing; no message is received twice; payloads are intact; with no
 * policy and BLOCK_WRITER every message arrives, with DROP_OLDEST
 * received + dropped = sent (a clearing thread adds drops too).
 */

enum { QS_PROD = 4, QS_CONS = 4, QS_ROUND_MAX = 1 << 17, QS_MSG = 64, QS_HDR = 16 };

typedef struct {
    uint32_t producer, len;
    uint64_t seq;
    unsigned char pad[QS_MSG - QS_HDR];
} qs_msg_t;

static struct {
    async_queue_t *q;
    int flags;
    size_t capacity;
    double deadline;
    atomic_int producers_left;
    _Atomic uint64_t sent[QS_PROD];
    _Atomic uint64_t received;
    _Atomic uint64_t bufsize_seen, full_seen, timedout_seen, cleared;
    bitmap_t seen[QS_PROD];
    int round;
} qs;

static unsigned char qs_byte(uint32_t p, uint64_t seq, size_t i)
{
    return (unsigned char)(seq * 31u + p * 7u + i * 13u + 1u);
}

static void *qs_producer(void *arg)
{
    uint32_t p = (uint32_t)(uintptr_t)arg;
    rng_t r;
    uint64_t seq = 0;
    qs_msg_t m;
    rng_init(&r, 100 + (uint64_t)qs.round * 64 + p);
    while (seq < QS_ROUND_MAX && now_ms() < qs.deadline) {
        size_t i;
        bool ok;
        m.producer = p;
        m.len = QS_HDR + rnd(&r, QS_MSG - QS_HDR + 1);
        m.seq = seq;
        for (i = 0; i < m.len - QS_HDR; i++)
            m.pad[i] = qs_byte(p, seq, i);
        if (rnd(&r, 4) == 0)
            ok = async_queue_enqueue_wait(qs.q, &m, m.len, rnd(&r, 3) ? (int)rnd(&r, 5) : 0);
        else
            ok = async_queue_enqueue(qs.q, &m, m.len);
        if (!ok) {
            int e = async_last_error();
            /* DROP_OLDEST never fails; the others may be full or time out */
            if (qs.flags == ASYNC_QUEUE_DROP_OLDEST || (e != ASYNC_E_FULL && e != ASYNC_E_TIMEDOUT))
                CHECK(!"unexpected enqueue failure");
            atomic_fetch_add(e == ASYNC_E_FULL ? &qs.full_seen : &qs.timedout_seen, 1);
            sched_yield();
            continue;
        }
        seq++;
        atomic_store(&qs.sent[p], seq);
        if (rnd(&r, 256) == 0)
            sleep_us(rnd(&r, 300));
    }
    atomic_fetch_sub(&qs.producers_left, 1);
    return NULL;
}

static void *qs_consumer(void *arg)
{
    uint32_t c = (uint32_t)(uintptr_t)arg;
    int64_t last[QS_PROD];
    rng_t r;
    qs_msg_t m;
    int i;
    rng_init(&r, 200 + (uint64_t)qs.round * 64 + c);
    for (i = 0; i < QS_PROD; i++)
        last[i] = -1;
    for (;;) {
        size_t bs = rnd(&r, 8) == 0 ? 1 + rnd(&r, 24) : sizeof m;
        size_t n = 0, k;
        /* read before the dequeue: if producers were done then, EMPTY means drained */
        bool done = atomic_load(&qs.producers_left) == 0;
        bool ok;
        memset(&m, 0, sizeof m);
        switch (rnd(&r, 3)) {
        case 0:
            ok = async_queue_dequeue(qs.q, &m, bs, &n);
            break;
        case 1:
            ok = async_queue_dequeue_wait(qs.q, &m, bs, &n, 1 + (int)rnd(&r, 5));
            break;
        default:
            ok = async_queue_dequeue_wait(qs.q, &m, bs, &n, 0);
            break;
        }
        if (!ok) {
            int e = async_last_error();
            if (e == ASYNC_E_BUFSIZE) {
                /* the needed size is reported and the message stays queued */
                CHECK(n > bs && n >= QS_HDR && n <= QS_MSG);
                atomic_fetch_add(&qs.bufsize_seen, 1);
                continue;
            }
            if (e != ASYNC_E_EMPTY && e != ASYNC_E_TIMEDOUT)
                CHECK(!"unexpected dequeue failure");
            if (done)
                break;
            continue;
        }
        CHECK(n >= QS_HDR && n <= bs);
        CHECK(m.producer < QS_PROD);
        CHECK_EQ(m.len, n);
        for (k = 0; k < n - QS_HDR; k++)
            if (m.pad[k] != qs_byte(m.producer, m.seq, k)) {
                fprintf(stderr, "producer %u seq %llu: byte %zu corrupted\n", m.producer,
                        (unsigned long long)m.seq, k);
                CHECK(!"payload intact");
            }
        if ((int64_t)m.seq <= last[m.producer]) {
            fprintf(stderr, "consumer %u: producer %u seq %llu after seq %lld (reordered or duplicated)\n", c,
                    m.producer, (unsigned long long)m.seq, (long long)last[m.producer]);
            CHECK(!"per-producer order");
        }
        last[m.producer] = (int64_t)m.seq;
        if (!bm_set(&qs.seen[m.producer], m.seq)) {
            fprintf(stderr, "producer %u seq %llu received twice\n", m.producer, (unsigned long long)m.seq);
            CHECK(!"exactly once");
        }
        atomic_fetch_add(&qs.received, 1);
        if (rnd(&r, 512) == 0)
            sleep_us(rnd(&r, 300));
    }
    return NULL;
}

/* Snapshots must be consistent; the clearing variant also clears. */
static void *qs_watcher(void *arg)
{
    rng_t r;
    async_queue_stats_t prev, st;
    (void)arg;
    rng_init(&r, 300 + (uint64_t)qs.round);
    memset(&prev, 0, sizeof prev);
    while (atomic_load(&qs.producers_left) > 0) {
        async_queue_get_stats(qs.q, &st);
        CHECK_EQ(st.capacity, qs.capacity);
        CHECK_EQ(st.max_msg_size, QS_MSG);
        CHECK(st.current_size <= st.capacity);
        CHECK_EQ(st.enqueue_count, st.dequeue_count + st.dropped_count + st.current_size);
        CHECK(st.enqueue_count >= prev.enqueue_count && st.dequeue_count >= prev.dequeue_count &&
              st.dropped_count >= prev.dropped_count);
        prev = st;
        (void)async_queue_is_empty(qs.q);
        (void)async_queue_is_full(qs.q);
        if (qs.flags == ASYNC_QUEUE_DROP_OLDEST && rnd(&r, 50) == 0) {
            async_queue_clear(qs.q);
            atomic_fetch_add(&qs.cleared, 1);
        }
        sleep_us(200 + rnd(&r, 800));
    }
    return NULL;
}

static void queue_stress(const char *name, int flags)
{
    uint64_t rounds = 0, total = 0, dropped_total = 0;
    int i;
    qs.deadline = stress_begin(name);
    qs.flags = flags;
    for (i = 0; i < QS_PROD; i++)
        bm_init(&qs.seen[i], QS_ROUND_MAX);
    do {
        pthread_t prod[QS_PROD], cons[QS_CONS], watcher;
        async_queue_stats_t st;
        uint64_t sent = 0;
        rng_t r;
        rng_init(&r, (uint64_t)qs.round);
        qs.capacity = 1 + rnd(&r, 32);
        qs.q = async_queue_create(qs.capacity, QS_MSG, (async_queue_flags_t)flags);
        CHECK(qs.q != NULL);
        atomic_store(&qs.producers_left, QS_PROD);
        atomic_store(&qs.received, 0);
        for (i = 0; i < QS_PROD; i++) {
            atomic_store(&qs.sent[i], 0);
            bm_clear(&qs.seen[i]);
        }
        start_thread(&watcher, qs_watcher, NULL);
        for (i = 0; i < QS_CONS; i++)
            start_thread(&cons[i], qs_consumer, (void *)(uintptr_t)i);
        for (i = 0; i < QS_PROD; i++)
            start_thread(&prod[i], qs_producer, (void *)(uintptr_t)i);
        for (i = 0; i < QS_PROD; i++)
            join_within(prod[i], 60000, "a producer");
        for (i = 0; i < QS_CONS; i++)
            join_within(cons[i], 60000, "a consumer");
        join_within(watcher, 60000, "the stats thread");
        for (i = 0; i < QS_PROD; i++) {
            uint64_t s = atomic_load(&qs.sent[i]), got = bm_count(&qs.seen[i], s);
            sent += s;
            if (flags != ASYNC_QUEUE_DROP_OLDEST && got != s)
                fprintf(stderr, "round %d: producer %d sent %llu, %llu received\n", qs.round, i,
                        (unsigned long long)s, (unsigned long long)got);
            if (flags != ASYNC_QUEUE_DROP_OLDEST)
                CHECK_EQ(got, s);
            /* nothing beyond what was sent */
            CHECK_EQ(bm_count(&qs.seen[i], QS_ROUND_MAX), got);
        }
        async_queue_get_stats(qs.q, &st);
        CHECK_EQ(st.current_size, 0);
        CHECK_EQ(st.enqueue_count, sent);
        CHECK_EQ(st.dequeue_count, atomic_load(&qs.received));
        CHECK_EQ(st.enqueue_count, st.dequeue_count + st.dropped_count);
        if (flags != ASYNC_QUEUE_DROP_OLDEST)
            CHECK_EQ(st.dropped_count, 0);
        total += sent;
        dropped_total += st.dropped_count;
        async_queue_destroy(qs.q);
        qs.round++;
        rounds++;
    } while (now_ms() < qs.deadline);
    for (i = 0; i < QS_PROD; i++)
        bm_free(&qs.seen[i]);
    printf("%s: %llu rounds, %llu messages, %llu dropped, %llu clears, %llu BUFSIZE, %llu FULL, %llu TIMEDOUT\n",
           name, (unsigned long long)rounds, (unsigned long long)total, (unsigned long long)dropped_total,
           (unsigned long long)atomic_load(&qs.cleared), (unsigned long long)atomic_load(&qs.bufsize_seen),
           (unsigned long long)atomic_load(&qs.full_seen), (unsigned long long)atomic_load(&qs.timedout_seen));
    CHECK(total > 0);
    if (flags == ASYNC_QUEUE_DROP_OLDEST)
        CHECK(dropped_total > 0); /* the policy was exercised */
}

static void t_queue_none(void)
{
    queue_stress("queue_none", 0);
}

static void t_queue_drop_oldest(void)
{
    queue_stress("queue_drop_oldest", ASYNC_QUEUE_DROP_OLDEST);
}

static void t_queue_block_writer(void)
{
    queue_stress("queue_block_writer", ASYNC_QUEUE_BLOCK_WRITER);
}

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
        uint32_t burst = rnd(&r, 4) == 0 ? 1 + rnd(&r, 4) : 1 + rnd(&r, 256), b, pause;
        if (seq - atomic_load(&cs.taken[p]) > CS_BACKLOG) {
            sleep_us(200);
            continue;
        }
        for (b = 0; b < burst; b++) {
            CHECK_EQ(async_runtime_post_completion(cs.rt, CS_KEY(p), CS_DATA(p, seq)), 0);
            seq++;
            atomic_store(&cs.posted[p], seq);
        }
        pause = rnd(&r, 10);
        if (pause >= 8)
            sleep_us(rnd(&r, 2000));
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
        uint32_t n = rnd(&r, 3) == 0 ? 1 + rnd(&r, 50) : 1, i;
        for (i = 0; i < n; i++)
            CHECK_EQ(async_runtime_wakeup(cs.rt), 0);
        atomic_fetch_add(&cs.wakeups, n);
        sleep_us(rnd(&r, 4) == 0 ? 5000 + rnd(&r, 20000) : rnd(&r, 1000));
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

static void t_stress_completions(void)
{
    pthread_t prod[CS_PROD], waker;
    static io_event_t ev[64];
    uint64_t next[CS_PROD] = {0}, received = 0, waits = 0, empty_waits = 0;
    bool waker_running = true;
    rng_t r;
    int i;
    cs.deadline = stress_begin("completions");
    rng_init(&r, 1200);
    cs.rt = mkrt();
    atomic_store(&cs.producers_left, CS_PROD);
    start_thread(&waker, cs_waker, NULL);
    for (i = 0; i < CS_PROD; i++)
        start_thread(&prod[i], cs_producer, (void *)(uintptr_t)i);
    for (;;) {
        bool producing = atomic_load(&cs.producers_left) > 0;
        uint64_t before = cs_posted_total(); /* all of these were posted before the wait */
        int max = 1 + (int)rnd(&r, 64), timeout, n, k;
        double t0, el;
        if (!producing && waker_running) {
            atomic_store(&cs.waker_stop, 1);
            join_within(waker, 10000, "the waker thread");
            waker_running = false;
        }
        if (!producing && received == before)
            break;
        if (producing)
            timeout = (int[]){0, 1, 2, 5, -1}[rnd(&r, 5)];
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
        i = rnd(&r, TS_SLOTS);
        s = &ts.slot[t][i];
        if (s->armed && ts_settled(s))
            s->armed = 0;
        if (!s->armed) {
            uint32_t d = rnd(&r, 100), g = atomic_load(&s->gen) + 1;
            uint64_t id;
            s->delay = d < 70 ? rnd(&r, 20) : d < 90 ? rnd(&r, 5) : d < 98 ? 64 + rnd(&r, 400) : 3600000;
            s->period = s->delay < 1000 && rnd(&r, 100) < 15 ? 1 + rnd(&r, 7) : 0;
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
        } else if (!s->cancel_tried && (s->period != 0 || s->delay > 1000 ? rnd(&r, 3) == 0 : rnd(&r, 10) == 0)) {
            ts_cancel(s);
        }
        if (rnd(&r, 16) == 0)
            sleep_us(rnd(&r, 200));
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

static void t_stress_timers(void)
{
    pthread_t th[TS_THREADS];
    static io_event_t ev[64];
    uint64_t waits = 0;
    rng_t r;
    int i;
    ts.deadline = stress_begin("timers");
    rng_init(&r, 2100);
    ts.rt = mkrt();
    atomic_store(&ts.threads_left, TS_THREADS);
    for (i = 0; i < TS_THREADS; i++)
        start_thread(&th[i], ts_thread, (void *)(uintptr_t)i);
    while (atomic_load(&ts.threads_left) > 0) {
        uint64_t seq = atomic_fetch_add(&ts.wseq, 1) + 1;
        int max = 1 + (int)rnd(&r, 64), n, k;
        double now;
        n = async_runtime_wait(ts.rt, ev, max, (int[]){0, 1, 3, 10}[rnd(&r, 4)]);
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

/* --- attach + SIGNAL_ON_DATA under MPSC load --------------------------------- */
/*
 * 6 producers enqueue (producer, seq) into a BLOCK_WRITER queue attached to a
 * runtime; the loop drains the queue on each of its completions, with random
 * max_events, while another thread posts unrelated completions and wakeups,
 * and the loop itself detaches and re-attaches with a new key now and then.
 * Checked: strict order and exactly once per producer; every queue
 * completion carries data == queue and a key attached at some point; and the
 * consumer never stalls: the queue is never seen non-empty for 5 s without
 * a completion (a lost empty -> non-empty transition).
 */

enum { AS_PROD = 6 };
#define AS_KEY0 ((uintptr_t)0xA77AC000u)
#define AS_NOISE ((uintptr_t)0x5E5E5E5Eu)

typedef struct {
    uint64_t producer, seq;
} as_msg_t;

static struct {
    async_runtime_t *rt;
    async_queue_t *q;
    double deadline;
    _Atomic uint64_t sent[AS_PROD];
    atomic_int producers_left, noise_stop;
    _Atomic uint64_t noise_posted, enqueue_timeouts;
} as;

static void *as_producer(void *arg)
{
    uint64_t p = (uint64_t)(uintptr_t)arg, seq = 0;
    rng_t r;
    rng_init(&r, 3000 + p);
    while (now_ms() < as.deadline) {
        as_msg_t m = {p, seq};
        if (!async_queue_enqueue_wait(as.q, &m, sizeof m, 1000)) {
            CHECK_ERR(ASYNC_E_TIMEDOUT); /* the loop is slow; tolerated, the stall check is the loop's */
            atomic_fetch_add(&as.enqueue_timeouts, 1);
            continue;
        }
        seq++;
        atomic_store(&as.sent[p], seq);
        if (rnd(&r, 8) == 0)
            sleep_us(rnd(&r, 500)); /* let the queue run dry: more transitions */
    }
    atomic_fetch_sub(&as.producers_left, 1);
    return NULL;
}

static void *as_noise(void *arg)
{
    rng_t r;
    uint64_t i = 0;
    (void)arg;
    rng_init(&r, 3100);
    while (!atomic_load(&as.noise_stop)) {
        if (rnd(&r, 2))
            CHECK_EQ(async_runtime_post_completion(as.rt, AS_NOISE, (uintptr_t)i++), 0);
        else
            CHECK_EQ(async_runtime_wakeup(as.rt), 0);
        sleep_us(rnd(&r, 2000));
    }
    atomic_store(&as.noise_posted, i);
    return NULL;
}

static void t_attach(void)
{
    pthread_t prod[AS_PROD], noise;
    static io_event_t ev[16];
    uint64_t next[AS_PROD] = {0}, noise_got = 0, signals = 0, drained = 0, reattaches = 0;
    uintptr_t key = AS_KEY0;
    double suspect_since = 0;
    rng_t r;
    int i;
    as.deadline = stress_begin("attach");
    rng_init(&r, 3200);
    as.rt = mkrt();
    as.q = async_queue_create(32, sizeof(as_msg_t),
                              (async_queue_flags_t)(ASYNC_QUEUE_BLOCK_WRITER | ASYNC_QUEUE_SIGNAL_ON_DATA));
    CHECK(as.q != NULL);
    CHECK_EQ(async_queue_attach(as.q, as.rt, key), 0);
    atomic_store(&as.producers_left, AS_PROD);
    start_thread(&noise, as_noise, NULL);
    for (i = 0; i < AS_PROD; i++)
        start_thread(&prod[i], as_producer, (void *)(uintptr_t)i);
    for (;;) {
        bool producing = atomic_load(&as.producers_left) > 0, got_signal = false;
        int max = 1 + (int)rnd(&r, 16), n, k;
        if (!producing && async_queue_is_empty(as.q))
            break;
        n = async_runtime_wait(as.rt, ev, max, 200);
        CHECK(n >= 0 && n <= max);
        for (k = 0; k < n; k++) {
            as_msg_t m;
            size_t sz;
            CHECK_EQ(ev[k].event_type, ASYNC_EVENT_COMPLETION);
            if (ev[k].completion_key == AS_NOISE) {
                CHECK(ev[k].data == (uintptr_t)noise_got);
                noise_got++;
                continue;
            }
            /* a queue completion: any key attached so far, data = the queue */
            CHECK(ev[k].completion_key >= AS_KEY0 && ev[k].completion_key <= key);
            CHECK(ev[k].data == (uintptr_t)as.q);
            signals++;
            got_signal = true;
            while (async_queue_dequeue(as.q, &m, sizeof m, &sz)) {
                CHECK_EQ(sz, sizeof m);
                CHECK(m.producer < AS_PROD);
                if (m.seq != next[m.producer]) {
                    fprintf(stderr, "producer %llu: expected %llu got %llu\n", (unsigned long long)m.producer,
                            (unsigned long long)next[m.producer], (unsigned long long)m.seq);
                    CHECK(!"exactly once, in order per producer");
                }
                next[m.producer]++;
                drained++;
            }
            CHECK_ERR(ASYNC_E_EMPTY);
        }
        if (got_signal || async_queue_is_empty(as.q)) {
            suspect_since = 0;
        } else if (suspect_since == 0) {
            suspect_since = now_ms();
        } else if (now_ms() - suspect_since > 5000) {
            /* non-empty since then, nobody else dequeues, and no completion */
            CHECK(!"a queue that went non-empty posted no completion (lost transition)");
        }
        if (rnd(&r, 300) == 0) {
            /* detach, let producers fill it a little, re-attach with a new key */
            CHECK_EQ(async_queue_attach(as.q, NULL, 0), 0);
            if (rnd(&r, 2))
                sleep_us(rnd(&r, 1000));
            key++;
            CHECK_EQ(async_queue_attach(as.q, as.rt, key), 0);
            reattaches++;
        }
    }
    for (i = 0; i < AS_PROD; i++) {
        join_within(prod[i], 10000, "a producer");
        CHECK_EQ(next[i], atomic_load(&as.sent[i]));
    }
    atomic_store(&as.noise_stop, 1);
    join_within(noise, 10000, "the noise thread");
    {
        /* the rest of the noise arrives too */
        double t0 = now_ms();
        while (noise_got < atomic_load(&as.noise_posted) && now_ms() - t0 < 10000) {
            int n = async_runtime_wait(as.rt, ev, 16, 100), k;
            CHECK(n >= 0);
            for (k = 0; k < n; k++)
                if (ev[k].completion_key == AS_NOISE) {
                    CHECK(ev[k].data == (uintptr_t)noise_got);
                    noise_got++;
                }
        }
        CHECK_EQ(noise_got, atomic_load(&as.noise_posted));
    }
    printf("attach: %llu messages drained on %llu completions, %llu re-attaches, %llu noise, %llu enqueue timeouts\n",
           (unsigned long long)drained, (unsigned long long)signals, (unsigned long long)reattaches,
           (unsigned long long)noise_got, (unsigned long long)atomic_load(&as.enqueue_timeouts));
    CHECK(drained > 0);
    async_queue_destroy(as.q);
    async_runtime_deinit(as.rt);
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
    int mode = (int)rnd(r, FM_COUNT), p[2];
    uint32_t g = atomic_load(&s->gen) + 1, ev;
    if (mode == FM_WRITE || mode == FM_BOTH || rnd(r, 2))
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
        if (rnd(r, 2))
            sleep_us(rnd(r, 500)); /* give the loop a chance to misreport */
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
        i = rnd(&r, FS_SLOTS);
        s = &fs.slot[t][i];
        if (!s->busy) {
            fs_arm(t, i, s, &r);
        } else if (atomic_load(&s->acked) == atomic_load(&s->gen)) {
            fs_disarm(s);
        } else if (rnd(&r, 50) == 0) {
            fs_disarm(s); /* removed before it was reported */
            atomic_fetch_add(&fs.aborted, 1);
        } else if (now_ms() - s->t_armed > 10000) {
            fprintf(stderr, "thread %u slot %u mode %d: no event within 10 s\n", t, i, atomic_load(&s->mode));
            CHECK(!"no fd event lost");
        }
        if (rnd(&r, 8) == 0)
            sleep_us(rnd(&r, 300));
    }
    for (i = 0; i < FS_SLOTS; i++)
        if (fs.slot[t][i].busy)
            fs_disarm(&fs.slot[t][i]);
    for (i = 0; i < FS_IDLE; i++) {
        CHECK_EQ(async_runtime_remove(fs.rt, idle[i][0]), 0);
        close(idle[i][0]);
        close(idle[i][1]);
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
        /* counted, reported at the end (see t_fds) */
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
        /* counted, reported at the end (see t_fds) */
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

static void t_fds(void)
{
    pthread_t th[FS_THREADS];
    static io_event_t ev[32];
    uint64_t events = 0, waits = 0;
    int ended = 0, i;
    rng_t r;
    fs.deadline = stress_begin("fds");
    rng_init(&r, 4100);
    fs.rt = mkrt();
    for (i = 0; i < FS_THREADS; i++)
        start_thread(&th[i], fs_thread, (void *)(uintptr_t)i);
    while (ended < FS_THREADS) {
        int max = 1 + (int)rnd(&r, 32), n, k;
        n = async_runtime_wait(fs.rt, ev, max, (int[]){-1, -1, 0, 1, 5}[rnd(&r, 5)]);
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

/* --- fibers parked and woken from threads and fibers -------------------------- */
/*
 * Rounds of up to a second. 12 channels of random capacity (0, 1 or 8), one
 * receiver fiber each; 4 more receivers wait in async_chan_select on their
 * own channel and a shared one. 8 sender fibers and 3 sender threads send
 * (sender, seq) to random channels with random timeouts (0, 1..10 ms, -1),
 * sleeping or yielding at random, so fibers park and are woken by fibers and
 * by plain threads on both sides. Two more fibers park in
 * async_queue_dequeue_wait on a queue a thread feeds. At the end of a round
 * the channels are closed; receivers drain them and return. Checked: each
 * receiver sees each sender's seqs strictly increasing; every message sent
 * successfully is received exactly once; nothing else is received.
 */

enum { FP_CH = 12, FP_SEL = 4, FP_SF = 8, FP_ST = 3, FP_SENDERS = FP_SF + FP_ST, FP_MAX = 1 << 18, FP_QMAX = 1 << 14 };

typedef struct {
    uint32_t sender, pad;
    uint64_t seq;
} fp_msg_t;

static struct {
    async_sched_t *s;
    async_chan_t *ch[FP_CH + 1]; /* [FP_CH] is shared by the select receivers */
    async_queue_t *q;
    double round_end;
    int round;
    _Atomic uint64_t sent[FP_SENDERS], received, qsent, qgot;
    atomic_int senders_left;
    bitmap_t seen[FP_SENDERS], qseen;
    _Atomic uint64_t timeouts, fulls;
} fp;

static void fp_take(int64_t *last, const fp_msg_t *m, int who)
{
    CHECK(m->sender < FP_SENDERS);
    if ((int64_t)m->seq <= last[m->sender]) {
        fprintf(stderr, "receiver %d: sender %u seq %llu after %lld\n", who, m->sender, (unsigned long long)m->seq,
                (long long)last[m->sender]);
        CHECK(!"per-sender order");
    }
    last[m->sender] = (int64_t)m->seq;
    if (!bm_set(&fp.seen[m->sender], m->seq))
        CHECK(!"a message was received twice");
    atomic_fetch_add(&fp.received, 1);
}

static void fp_receiver(void *arg)
{
    int c = (int)(intptr_t)arg, i;
    int64_t last[FP_SENDERS];
    rng_t r;
    fp_msg_t m;
    rng_init(&r, 5000 + (uint64_t)fp.round * 64 + (uint64_t)c);
    for (i = 0; i < FP_SENDERS; i++)
        last[i] = -1;
    for (;;) {
        int rc = async_chan_recv(fp.ch[c], &m, rnd(&r, 3) ? -1 : 1 + (int)rnd(&r, 20));
        if (rc == 0) {
            fp_take(last, &m, c);
            if (rnd(&r, 64) == 0) /* fall behind now and then: senders time out */
                CHECK_EQ(async_fiber_sleep(1 + rnd(&r, 3)), 0);
            continue;
        }
        if (async_last_error() == ASYNC_E_CLOSED)
            return;
        CHECK_ERR(ASYNC_E_TIMEDOUT);
    }
}

static void fp_selector(void *arg)
{
    int c = (int)(intptr_t)arg, i, open_own = 1, open_shared = 1;
    int64_t last[2][FP_SENDERS]; /* order holds per channel: [0] own, [1] shared */
    rng_t r;
    rng_init(&r, 5100 + (uint64_t)fp.round * 64 + (uint64_t)c);
    for (i = 0; i < FP_SENDERS; i++)
        last[0][i] = last[1][i] = -1;
    while (open_own || open_shared) {
        fp_msg_t m1, m2;
        async_chan_op_t ops[2];
        size_t n = 0;
        int idx;
        if (open_own)
            ops[n++] = (async_chan_op_t){fp.ch[c], ASYNC_CHAN_RECV, &m1, -1};
        if (open_shared)
            ops[n++] = (async_chan_op_t){fp.ch[FP_CH], ASYNC_CHAN_RECV, &m2, -1};
        idx = async_chan_select(ops, n, rnd(&r, 2) ? -1 : 1 + (int)rnd(&r, 10));
        if (idx < 0) {
            CHECK_ERR(ASYNC_E_TIMEDOUT);
            continue;
        }
        CHECK(idx < (int)n);
        if (ops[idx].status == ASYNC_E_CLOSED) {
            if (ops[idx].chan == fp.ch[c])
                open_own = 0;
            else
                open_shared = 0;
            continue;
        }
        CHECK_EQ(ops[idx].status, 0);
        fp_take(last[ops[idx].chan == fp.ch[c] ? 0 : 1], (const fp_msg_t *)ops[idx].elem, 100 + c);
    }
}

/* One send attempt of (sender, seq); true if sent. */
static bool fp_send_one(uint32_t sender, uint64_t seq, rng_t *r)
{
    fp_msg_t m = {sender, 0, seq};
    int timeout = (int[]){0, 1, 5, 10, -1}[rnd(r, 5)];
    async_chan_t *c = fp.ch[rnd(r, FP_CH + 1)];
    if (async_chan_send(c, &m, timeout) == 0)
        return true;
    if (async_last_error() == ASYNC_E_FULL)
        atomic_fetch_add(&fp.fulls, 1);
    else {
        CHECK_ERR(ASYNC_E_TIMEDOUT);
        atomic_fetch_add(&fp.timeouts, 1);
    }
    return false;
}

static void fp_sender_fiber(void *arg)
{
    uint32_t id = (uint32_t)(uintptr_t)arg;
    uint64_t seq = 0;
    rng_t r;
    rng_init(&r, 5200 + (uint64_t)fp.round * 64 + id);
    while (seq < FP_MAX && now_ms() < fp.round_end) {
        if (fp_send_one(id, seq, &r))
            atomic_store(&fp.sent[id], ++seq);
        switch (rnd(&r, 16)) {
        case 0:
            CHECK_EQ(async_fiber_sleep(1 + rnd(&r, 2)), 0);
            break;
        case 1:
            async_fiber_yield();
            break;
        }
    }
    atomic_fetch_sub(&fp.senders_left, 1);
}

static void *fp_sender_thread(void *arg)
{
    uint32_t id = (uint32_t)(uintptr_t)arg;
    uint64_t seq = 0;
    rng_t r;
    rng_init(&r, 5300 + (uint64_t)fp.round * 64 + id);
    while (seq < FP_MAX && now_ms() < fp.round_end) {
        if (fp_send_one(id, seq, &r))
            atomic_store(&fp.sent[id], ++seq);
        if (rnd(&r, 16) == 0)
            sleep_us(rnd(&r, 1000));
    }
    atomic_fetch_sub(&fp.senders_left, 1);
    return NULL;
}

/* Parks in queue waits; the feeder thread below wakes it. */
static void fp_queue_fiber(void *arg)
{
    int64_t last = -1;
    rng_t r;
    (void)arg;
    rng_init(&r, 5400 + (uint64_t)fp.round * 64 + (uint64_t)(uintptr_t)arg);
    for (;;) {
        uint64_t v;
        size_t n;
        if (async_queue_dequeue_wait(fp.q, &v, sizeof v, &n, rnd(&r, 2) ? 50 : -1)) {
            if (v == UINT64_MAX)
                return; /* end marker, one per queue fiber */
            CHECK((int64_t)v > last);
            last = (int64_t)v;
            CHECK(bm_set(&fp.qseen, v));
            atomic_fetch_add(&fp.qgot, 1);
            continue;
        }
        CHECK_ERR(ASYNC_E_TIMEDOUT);
    }
}

static void *fp_queue_feeder(void *arg)
{
    uint64_t v = 0;
    rng_t r;
    (void)arg;
    rng_init(&r, 5500 + (uint64_t)fp.round);
    while (v < FP_QMAX && now_ms() < fp.round_end) {
        CHECK(async_queue_enqueue_wait(fp.q, &v, sizeof v, -1));
        v++;
        atomic_store(&fp.qsent, v);
        sleep_us(rnd(&r, 1000));
    }
    return NULL;
}

static void t_fibers_park(void)
{
    double deadline = stress_begin("fibers_park");
    uint64_t total = 0, qtotal = 0;
    int i;
    for (i = 0; i < FP_SENDERS; i++)
        bm_init(&fp.seen[i], FP_MAX);
    bm_init(&fp.qseen, FP_QMAX);
    do {
        async_sched_config_t cfg = {2, 32 * 1024, 0};
        pthread_t st[FP_ST], feeder;
        uint64_t sent = 0, end = UINT64_MAX;
        rng_t r;
        rng_init(&r, 5600 + (uint64_t)fp.round);
        fp.round_end = now_ms() + 1000;
        if (fp.round_end > deadline)
            fp.round_end = deadline;
        fp.s = async_sched_create(&cfg);
        CHECK(fp.s != NULL);
        fp.q = async_queue_create(4, sizeof(uint64_t), (async_queue_flags_t)0);
        CHECK(fp.q != NULL);
        for (i = 0; i <= FP_CH; i++) {
            fp.ch[i] = async_chan_create((size_t[]){0, 1, 8}[rnd(&r, 3)], sizeof(fp_msg_t));
            CHECK(fp.ch[i] != NULL);
        }
        for (i = 0; i < FP_SENDERS; i++) {
            bm_clear(&fp.seen[i]);
            atomic_store(&fp.sent[i], 0);
        }
        bm_clear(&fp.qseen);
        atomic_store(&fp.received, 0);
        atomic_store(&fp.qsent, 0);
        atomic_store(&fp.qgot, 0);
        atomic_store(&fp.senders_left, FP_SENDERS);
        for (i = 0; i < FP_CH; i++)
            CHECK(async_fiber_spawn(fp.s, i < FP_SEL ? fp_selector : fp_receiver, (void *)(intptr_t)i, 0));
        for (i = 0; i < 2; i++)
            CHECK(async_fiber_spawn(fp.s, fp_queue_fiber, (void *)(intptr_t)i, 0));
        for (i = 0; i < FP_SF; i++)
            CHECK(async_fiber_spawn(fp.s, fp_sender_fiber, (void *)(uintptr_t)i, 0));
        for (i = 0; i < FP_ST; i++)
            start_thread(&st[i], fp_sender_thread, (void *)(uintptr_t)(FP_SF + i));
        start_thread(&feeder, fp_queue_feeder, NULL);
        for (i = 0; i < FP_ST; i++)
            join_within(st[i], 30000, "a sender thread");
        join_within(feeder, 30000, "the queue feeder");
        for (i = 0; i < 2; i++)
            CHECK(async_queue_enqueue_wait(fp.q, &end, sizeof end, 10000));
        /* the sender fibers end by themselves; then close the channels */
        {
            double t0 = now_ms();
            while (atomic_load(&fp.senders_left) > 0) {
                CHECK(now_ms() - t0 < 30000);
                sleep_ms(1);
            }
        }
        for (i = 0; i <= FP_CH; i++)
            async_chan_close(fp.ch[i]);
        CHECK_EQ(async_sched_run(fp.s), 0);
        for (i = 0; i < FP_SENDERS; i++) {
            uint64_t s = atomic_load(&fp.sent[i]), got = bm_count(&fp.seen[i], s);
            if (got != s)
                fprintf(stderr, "round %d: sender %d sent %llu, %llu received\n", fp.round, i, (unsigned long long)s,
                        (unsigned long long)got);
            CHECK_EQ(got, s);
            CHECK_EQ(bm_count(&fp.seen[i], FP_MAX), s);
            sent += s;
        }
        CHECK_EQ(atomic_load(&fp.received), sent);
        CHECK_EQ(atomic_load(&fp.qgot), atomic_load(&fp.qsent));
        CHECK_EQ(bm_count(&fp.qseen, atomic_load(&fp.qsent)), atomic_load(&fp.qsent));
        total += sent;
        qtotal += atomic_load(&fp.qgot);
        for (i = 0; i <= FP_CH; i++)
            async_chan_destroy(fp.ch[i]);
        async_queue_destroy(fp.q);
        async_sched_destroy(fp.s);
        fp.round++;
    } while (now_ms() < deadline);
    for (i = 0; i < FP_SENDERS; i++)
        bm_free(&fp.seen[i]);
    bm_free(&fp.qseen);
    printf("fibers_park: %d rounds, %llu channel messages, %llu queue messages, %llu send timeouts, %llu full\n",
           fp.round, (unsigned long long)total, (unsigned long long)qtotal,
           (unsigned long long)atomic_load(&fp.timeouts), (unsigned long long)atomic_load(&fp.fulls));
    CHECK(total > 0 && qtotal > 0);
}

/* --- fiber echo soak: connections held open, fd count and RSS flat ------------ */
/*
 * ASYNC_SOAK_CONNS connections (default 500; scripts/soak.sh uses 10000) to
 * an echo server of one fiber per connection in this process, for the
 * case's time. The clients run as fibers in a second process (this binary,
 * case echo_clients, started with posix_spawn), so each side needs only one
 * descriptor per connection. Each client sends a message of random length
 * (1..256 bytes), reads it back, checks it, sleeps 0..49 ms and repeats.
 * This (server) process samples its VmRSS and open fds every 200 ms.
 * Checked: every echo intact and every connection served; once all
 * connections are up and a quarter of the time has passed (warm-up), the fd
 * count never rises above that baseline + 8 and RSS never above
 * baseline + max(baseline / 4, 16 MiB).
 */

static struct {
    async_sched_t *s;
    int lfd, nconn;
    struct sockaddr_in addr;
    double deadline;
    atomic_int accepted, served, failures;
    _Atomic uint64_t echoed, echoes;
} es;

static long rss_kb(void)
{
    char line[256];
    long kb = -1;
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f != NULL);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kb = atol(line + 6);
    fclose(f);
    CHECK(kb > 0);
    return kb;
}

static int fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    CHECK(d != NULL);
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own fd */
}


/* The connection count both sides use: ASYNC_SOAK_CONNS, scaled down to what
 * RLIMIT_NOFILE allows. */
static int es_conns(void)
{
    const char *nc = getenv("ASYNC_SOAK_CONNS");
    int n = nc && *nc ? atoi(nc) : 500, fds;
    CHECK(n >= 1);
    fds = raise_nofile(n + 256);
    if (fds < n + 256) {
        n = fds - 256;
        printf("RLIMIT_NOFILE %d: scaled to %d connections\n", fds, n);
        CHECK(n >= 100);
    }
    return n;
}

static void es_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char buf[512];
    for (;;) {
        ssize_t n = async_fiber_read(fd, buf, sizeof buf, -1);
        if (n <= 0)
            break;
        if (async_fiber_write(fd, buf, (size_t)n, -1) != n) {
            atomic_fetch_add(&es.failures, 1);
            break;
        }
        atomic_fetch_add(&es.echoed, (uint64_t)n);
    }
    close(fd);
    atomic_fetch_add(&es.served, 1);
}

static void es_acceptor(void *arg)
{
    int i;
    (void)arg;
    for (i = 0; i < es.nconn; i++) {
        int fd = async_fiber_accept(es.lfd, NULL, NULL, 60000);
        if (fd < 0) {
            fprintf(stderr, "accept: %s\n", async_strerror(async_last_error()));
            atomic_fetch_add(&es.failures, 1);
            return;
        }
        CHECK(async_fiber_spawn(es.s, es_conn, (void *)(intptr_t)fd, 0));
        atomic_fetch_add(&es.accepted, 1);
    }
}

static void es_client(void *arg)
{
    uint32_t id = (uint32_t)(uintptr_t)arg, m = 0;
    char out[256], in[256];
    rng_t r;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    rng_init(&r, 6000 + id);
    if (fd < 0 || async_fiber_connect(fd, (struct sockaddr *)&es.addr, sizeof es.addr, 60000) != 0) {
        fprintf(stderr, "connect: %s\n", async_strerror(async_last_error()));
        atomic_fetch_add(&es.failures, 1);
        if (fd >= 0)
            close(fd);
        return;
    }
    while (now_ms() < es.deadline) {
        size_t len = 1 + rnd(&r, sizeof out), i, got = 0;
        for (i = 0; i < len; i++)
            out[i] = (char)(id * 31u + m * 7u + (uint32_t)i);
        if (async_fiber_write(fd, out, len, 30000) != (ssize_t)len)
            goto fail;
        while (got < len) {
            ssize_t n = async_fiber_read(fd, in + got, len - got, 30000);
            if (n <= 0)
                goto fail;
            got += (size_t)n;
        }
        if (memcmp(in, out, len) != 0)
            goto fail;
        atomic_fetch_add(&es.echoes, 1);
        m++;
        if (async_fiber_sleep(rnd(&r, 50)) != 0)
            goto fail;
    }
    close(fd);
    return;
fail:
    fprintf(stderr, "client %u failed at message %u: %s\n", id, m, async_strerror(async_last_error()));
    atomic_fetch_add(&es.failures, 1);
    close(fd);
}

/* Not a ctest case: the client side of echo_soak, in its own process.
 * ASYNC_ECHO_PORT names the server's port; ASYNC_ECHO_END_MS how long to run. */
static void t_echo_clients(void)
{
    const char *port = getenv("ASYNC_ECHO_PORT"), *ms = getenv("ASYNC_ECHO_END_MS");
    int i;
    CHECK(port && ms);
    g_seed = (uint64_t)getpid();
    es.nconn = es_conns();
    es.deadline = now_ms() + atof(ms);
    es.addr.sin_family = AF_INET;
    es.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    es.addr.sin_port = htons((uint16_t)atoi(port));
    es.s = async_sched_create(NULL);
    CHECK(es.s != NULL);
    for (i = 0; i < es.nconn; i++)
        CHECK(async_fiber_spawn(es.s, es_client, (void *)(uintptr_t)i, 0));
    CHECK_EQ(async_sched_run(es.s), 0);
    printf("echo_clients: %d connections, %llu echoes checked, %d failures\n", es.nconn,
           (unsigned long long)atomic_load(&es.echoes), atomic_load(&es.failures));
    CHECK_EQ(atomic_load(&es.failures), 0);
    CHECK(atomic_load(&es.echoes) >= (uint64_t)es.nconn);
    async_sched_destroy(es.s);
}

extern char **environ;

static void t_echo_soak(void)
{
    double start = now_ms(), deadline = stress_begin("echo_soak"), warm, next_sample;
    long rss0 = 0, rss_max = 0, rss_first;
    int fd0 = 0, fd_max = 0, one = 1, status = 0;
    socklen_t al = sizeof es.addr;
    char self[4096], port[16], end_ms[32], *argv[3];
    ssize_t len;
    pid_t child, r;
    es.nconn = es_conns();
    es.deadline = deadline;
    warm = start + (deadline - start) / 4;
    es.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(es.lfd >= 0);
    setsockopt(es.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    es.addr.sin_family = AF_INET;
    es.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(es.lfd, (struct sockaddr *)&es.addr, sizeof es.addr), 0);
    CHECK_EQ(getsockname(es.lfd, (struct sockaddr *)&es.addr, &al), 0);
    CHECK_EQ(listen(es.lfd, 4096), 0);
    /* the clients: this binary again, in a new process */
    len = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(len > 0);
    self[len] = 0;
    snprintf(port, sizeof port, "%u", (unsigned)ntohs(es.addr.sin_port));
    snprintf(end_ms, sizeof end_ms, "%.0f", deadline - now_ms());
    CHECK_EQ(setenv("ASYNC_ECHO_PORT", port, 1), 0);
    CHECK_EQ(setenv("ASYNC_ECHO_END_MS", end_ms, 1), 0);
    fflush(stdout);
    {
        /* Under qemu-user (no binfmt) this binary can only be started
         * through the emulator: ASYNC_TEST_EMULATOR names it. */
        const char *emu = getenv("ASYNC_TEST_EMULATOR");
        char *eargv[4] = {(char *)emu, self, (char *)"echo_clients", NULL};
        argv[0] = self;
        argv[1] = (char *)"echo_clients";
        argv[2] = NULL;
        if (emu && *emu)
            CHECK_EQ(posix_spawnp(&child, emu, NULL, NULL, eargv, environ), 0);
        else
            CHECK_EQ(posix_spawn(&child, self, NULL, NULL, argv, environ), 0);
    }
    es.s = async_sched_create(NULL);
    CHECK(es.s != NULL);
    rss_first = rss_kb();
    CHECK(async_fiber_spawn(es.s, es_acceptor, NULL, 0));
    /* sample while the clients run (this thread does not run fibers) */
    next_sample = now_ms();
    while ((r = waitpid(child, &status, WNOHANG)) == 0) {
        double now = now_ms();
        if (now > deadline + 120000) {
            kill(child, SIGKILL);
            CHECK(!"the client process hung");
        }
        if (now >= next_sample) {
            long rss = rss_kb();
            int n = fd_count();
            next_sample = now + 200;
            if (rss0 == 0 && now >= warm && now < deadline && atomic_load(&es.accepted) == es.nconn) {
                rss0 = rss;
                fd0 = n;
                printf("echo_soak: baseline after warm-up: %d fds, RSS %ld KiB (%ld KiB before start)\n", fd0, rss0,
                       rss_first);
            } else if (rss0 != 0 && now < deadline) {
                if (rss > rss_max)
                    rss_max = rss;
                if (n > fd_max)
                    fd_max = n;
            }
        }
        sleep_ms(20);
    }
    CHECK_EQ(r, child);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0); /* the clients checked every echo */
    CHECK_EQ(async_sched_run(es.s), 0);
    printf("echo_soak: %d connections, %d served, %llu bytes echoed; after warm-up max %d fds (baseline %d), max "
           "RSS %ld KiB (baseline %ld)\n",
           es.nconn, atomic_load(&es.served), (unsigned long long)atomic_load(&es.echoed), fd_max, fd0, rss_max,
           rss0);
    CHECK_EQ(atomic_load(&es.failures), 0);
    CHECK_EQ(atomic_load(&es.served), es.nconn);
    CHECK(rss0 > 0); /* a baseline was taken */
    CHECK(fd_max <= fd0 + 8);
    CHECK(rss_max <= rss0 + (rss0 / 4 > 16384 ? rss0 / 4 : 16384));
    close(es.lfd);
    async_sched_destroy(es.s);
}

static const test_case_t cases[] = {
    T(queue_none), // stress
    T(queue_drop_oldest), // stress
    T(queue_block_writer), // stress
    T(stress_completions), // poll stress
    T(stress_timers), // poll stress
    T(attach), // poll stress
    T(fds), // poll stress
    T(fibers_park), // stress
    T(echo_soak), // stress
    {"echo_clients", t_echo_clients}, /* started by echo_soak; not a ctest case */
};

TEST_MAIN(cases)
