/* Fibers parked and woken under bounded-time random load (stress): channel
 * receivers and selectors woken by sender fibers and threads, fibers parked
 * in queue waits woken by a feeder thread; every message is taken once and
 * in order per sender. Runs for ASYNC_STRESS_SECONDS (default 3) with a
 * printed seed (ASYNC_STRESS_SEED); scripts/soak.sh runs it for minutes. */
#include "check.h"
#include "rt.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

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
        int rc = async_chan_recv(fp.ch[c], &m, rng_below(&r, 3) ? -1 : 1 + (int)rng_below(&r, 20));
        if (rc == 0) {
            fp_take(last, &m, c);
            if (rng_below(&r, 64) == 0) /* fall behind now and then: senders time out */
                CHECK_EQ(async_fiber_sleep(1 + rng_below(&r, 3)), 0);
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
        idx = async_chan_select(ops, n, rng_below(&r, 2) ? -1 : 1 + (int)rng_below(&r, 10));
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
    int timeout = (int[]){0, 1, 5, 10, -1}[rng_below(r, 5)];
    async_chan_t *c = fp.ch[rng_below(r, FP_CH + 1)];
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

/* Sends sender id's messages in order until FP_MAX or the round's end
 * (random stream base + round * 64 + id), calling pause after each try;
 * then counts the sender out. */
static void fp_send_all(uint32_t id, uint64_t base, void (*pause)(rng_t *))
{
    uint64_t seq = 0;
    rng_t r;
    rng_init(&r, base + (uint64_t)fp.round * 64 + id);
    while (seq < FP_MAX && now_ms() < fp.round_end) {
        if (fp_send_one(id, seq, &r))
            atomic_store(&fp.sent[id], ++seq);
        pause(&r);
    }
    atomic_fetch_sub(&fp.senders_left, 1);
}

/* A fiber sender's pause: now and then a short sleep or a yield. */
static void fp_fiber_pause(rng_t *r)
{
    switch (rng_below(r, 16)) {
    case 0:
        CHECK_EQ(async_fiber_sleep(1 + rng_below(r, 2)), 0);
        break;
    case 1:
        async_fiber_yield();
        break;
    }
}

/* A thread sender's pause: now and then up to 1 ms asleep. */
static void fp_thread_pause(rng_t *r)
{
    if (rng_below(r, 16) == 0)
        sleep_us(rng_below(r, 1000));
}

static void fp_sender_fiber(void *arg)
{
    fp_send_all((uint32_t)(uintptr_t)arg, 5200, fp_fiber_pause);
}

static void *fp_sender_thread(void *arg)
{
    fp_send_all((uint32_t)(uintptr_t)arg, 5300, fp_thread_pause);
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
        if (async_queue_dequeue_wait(fp.q, &v, sizeof v, &n, rng_below(&r, 2) ? 50 : -1)) {
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
        sleep_us(rng_below(&r, 1000));
    }
    return NULL;
}

CASE(fibers_park) // stress
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
            fp.ch[i] = async_chan_create((size_t[]){0, 1, 8}[rng_below(&r, 3)], sizeof(fp_msg_t));
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

TEST_MAIN()
