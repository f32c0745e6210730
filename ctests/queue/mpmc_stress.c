/* Queues under bounded-time random load (stress): many producers and
 * consumers on one queue under each overflow policy (none, DROP_OLDEST,
 * BLOCK_WRITER), with snapshots and clears from a watcher, and an attached
 * SIGNAL_ON_DATA queue under MPSC load. Every message is accounted for:
 * nothing lost (beyond what DROP_OLDEST drops and counts), duplicated,
 * corrupted or reordered per producer; an attached queue's completions
 * follow its empty -> non-empty transitions. Each case runs for
 * ASYNC_STRESS_SECONDS (default 3) with a printed seed (ASYNC_STRESS_SEED
 * repeats its choices); scripts/soak.sh runs them for minutes. */
#include "check.h"
#include "rt.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

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
        m.len = QS_HDR + rng_below(&r, QS_MSG - QS_HDR + 1);
        m.seq = seq;
        for (i = 0; i < m.len - QS_HDR; i++)
            m.pad[i] = qs_byte(p, seq, i);
        if (rng_below(&r, 4) == 0)
            ok = async_queue_enqueue_wait(qs.q, &m, m.len, rng_below(&r, 3) ? (int)rng_below(&r, 5) : 0);
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
        if (rng_below(&r, 256) == 0)
            sleep_us(rng_below(&r, 300));
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
        size_t bs = rng_below(&r, 8) == 0 ? 1 + rng_below(&r, 24) : sizeof m;
        size_t n = 0, k;
        /* read before the dequeue: if producers were done then, EMPTY means drained */
        bool done = atomic_load(&qs.producers_left) == 0;
        bool ok;
        memset(&m, 0, sizeof m);
        switch (rng_below(&r, 3)) {
        case 0:
            ok = async_queue_dequeue(qs.q, &m, bs, &n);
            break;
        case 1:
            ok = async_queue_dequeue_wait(qs.q, &m, bs, &n, 1 + (int)rng_below(&r, 5));
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
        if (rng_below(&r, 512) == 0)
            sleep_us(rng_below(&r, 300));
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
        if (qs.flags == ASYNC_QUEUE_DROP_OLDEST && rng_below(&r, 50) == 0) {
            async_queue_clear(qs.q);
            atomic_fetch_add(&qs.cleared, 1);
        }
        sleep_us(200 + rng_below(&r, 800));
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
        qs.capacity = 1 + rng_below(&r, 32);
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

CASE(stress_no_policy) { queue_stress("queue_none", 0); } // stress

CASE(stress_drop_oldest) { queue_stress("queue_drop_oldest", ASYNC_QUEUE_DROP_OLDEST); } // stress

CASE(stress_block_writer) { queue_stress("queue_block_writer", ASYNC_QUEUE_BLOCK_WRITER); } // stress

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
        if (rng_below(&r, 8) == 0)
            sleep_us(rng_below(&r, 500)); /* let the queue run dry: more transitions */
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
        if (rng_below(&r, 2))
            CHECK_EQ(async_runtime_post_completion(as.rt, AS_NOISE, (uintptr_t)i++), 0);
        else
            CHECK_EQ(async_runtime_wakeup(as.rt), 0);
        sleep_us(rng_below(&r, 2000));
    }
    atomic_store(&as.noise_posted, i);
    return NULL;
}

CASE(stress_attach) // poll stress
{
    pthread_t prod[AS_PROD], noise;
    static io_event_t ev[16];
    uint64_t next[AS_PROD] = {0}, noise_got = 0, signals = 0, drained = 0, reattaches = 0;
    uintptr_t key = AS_KEY0;
    double suspect_since = 0;
    rng_t r;
    int i;
    as.deadline = stress_begin_rng("attach", &r, 3200);
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
        int max = 1 + (int)rng_below(&r, 16), n, k;
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
        if (rng_below(&r, 300) == 0) {
            /* detach, let producers fill it a little, re-attach with a new key */
            CHECK_EQ(async_queue_attach(as.q, NULL, 0), 0);
            if (rng_below(&r, 2))
                sleep_us(rng_below(&r, 1000));
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

TEST_MAIN()
