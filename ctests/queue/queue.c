/* async_queue: FIFO order and copies, many producers and consumers, the
 * overflow policies (none, DROP_OLDEST, BLOCK_WRITER: woken by dequeue,
 * clear and destroy), enqueue_wait / dequeue_wait (timeouts, wakeups,
 * destroy), buffer sizes and bad arguments, clear, stats, big messages, and
 * a queue attached to a runtime (SIGNAL_ON_DATA completions, replaced,
 * destroyed, from a worker, the runtime gone). Also built for Windows by
 * scripts/cross.sh. */
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>

#define Q_FLAGS(x) ((async_queue_flags_t)(x))

static async_queue_t *mkq(size_t cap, size_t size, int flags)
{
    async_queue_t *q = async_queue_create(cap, size, Q_FLAGS(flags));
    CHECK(q != NULL);
    return q;
}

static void enq_int(async_queue_t *q, int v)
{
    CHECK(async_queue_enqueue(q, &v, sizeof v));
}

static int deq_int(async_queue_t *q)
{
    int v = -1;
    size_t n = 0;
    CHECK(async_queue_dequeue(q, &v, sizeof v, &n));
    CHECK_EQ(n, sizeof v);
    return v;
}

static void stats(async_queue_t *q, async_queue_stats_t *s)
{
    memset(s, 0xAB, sizeof *s);
    async_queue_get_stats(q, s);
}

/* ---------------------------------------------------------------------- */

CASE(fifo)
{
    async_queue_t *q = mkq(8, 16, 0);
    char buf[16];
    size_t n;
    int i;
    CHECK(async_queue_is_empty(q));
    CHECK(!async_queue_is_full(q));
    for (i = 0; i < 8; i++) {
        char msg[16];
        memset(msg, 'a' + i, sizeof msg);
        CHECK(async_queue_enqueue(q, msg, (size_t)i + 1)); /* lengths 1..8 */
        CHECK(!async_queue_is_empty(q));
    }
    CHECK(async_queue_is_full(q));
    for (i = 0; i < 8; i++) {
        int j;
        memset(buf, 0, sizeof buf);
        n = 999;
        CHECK(async_queue_dequeue(q, buf, sizeof buf, &n));
        CHECK_EQ(n, i + 1);
        for (j = 0; j < i + 1; j++)
            CHECK_EQ(buf[j], 'a' + i);
        CHECK(!async_queue_is_full(q));
    }
    CHECK(async_queue_is_empty(q));
    CHECK_FAIL(!async_queue_dequeue(q, buf, sizeof buf, &n), ASYNC_E_EMPTY);
    /* out_size may be NULL */
    enq_int(q, 42);
    {
        int v = 0;
        CHECK(async_queue_dequeue(q, &v, sizeof v, NULL));
        CHECK_EQ(v, 42);
    }
    async_queue_destroy(q);
}

CASE(copy)
{
    async_queue_t *q = mkq(4, 64, 0);
    char src[32], dst[64];
    size_t n = 0, i;
    memset(src, 'x', sizeof src);
    CHECK(async_queue_enqueue(q, src, sizeof src));
    memset(src, 'y', sizeof src); /* the queue must hold its own copy */
    memset(dst, '#', sizeof dst);
    CHECK(async_queue_dequeue(q, dst, sizeof dst, &n));
    CHECK_EQ(n, sizeof src);
    for (i = 0; i < sizeof src; i++)
        CHECK_EQ(dst[i], 'x');
    for (i = sizeof src; i < sizeof dst; i++) /* nothing written past the message */
        CHECK_EQ(dst[i], '#');
    /* a message of exactly max_msg_size bytes round-trips */
    {
        unsigned char big[64], out[64];
        for (i = 0; i < sizeof big; i++)
            big[i] = (unsigned char)(i * 7 + 3);
        CHECK(async_queue_enqueue(q, big, sizeof big));
        CHECK(async_queue_dequeue(q, out, sizeof out, &n));
        CHECK_EQ(n, 64);
        CHECK(memcmp(big, out, sizeof big) == 0);
    }
    async_queue_destroy(q);
}

/* --- MPMC: 4 producers x 4 consumers through a small blocking queue ----- */

#define MP_PRODUCERS 4
#define MP_CONSUMERS 4
#define MP_PER_PRODUCER 50000
#define MP_POISON 0xFFFFu

typedef struct {
    uint32_t producer;
    uint32_t seq;
} mp_msg_t;

static async_queue_t *g_mpq;
static atomic_uchar g_mp_seen[MP_PRODUCERS][MP_PER_PRODUCER];
static atomic_long g_mp_count;

static void *mp_producer(void *arg)
{
    uint32_t p = (uint32_t)(uintptr_t)arg, s;
    for (s = 0; s < MP_PER_PRODUCER; s++) {
        mp_msg_t m;
        m.producer = p;
        m.seq = s;
        CHECK(async_queue_enqueue(g_mpq, &m, sizeof m));
    }
    return NULL;
}

static void *mp_consumer(void *arg)
{
    long last[MP_PRODUCERS];
    int i;
    (void)arg;
    for (i = 0; i < MP_PRODUCERS; i++)
        last[i] = -1;
    for (;;) {
        mp_msg_t m;
        size_t n = 0;
        CHECK(async_queue_dequeue_wait(g_mpq, &m, sizeof m, &n, 30000));
        CHECK_EQ(n, sizeof m);
        if (m.producer == MP_POISON)
            break;
        CHECK(m.producer < MP_PRODUCERS);
        CHECK(m.seq < MP_PER_PRODUCER);
        /* per-producer order as seen by one consumer */
        CHECK((long)m.seq > last[m.producer]);
        last[m.producer] = (long)m.seq;
        CHECK_EQ(atomic_fetch_add(&g_mp_seen[m.producer][m.seq], 1), 0);
        atomic_fetch_add(&g_mp_count, 1);
    }
    return NULL;
}

CASE(mpmc) // timeout=120
{
    pthread_t prod[MP_PRODUCERS], cons[MP_CONSUMERS];
    async_queue_stats_t st;
    int i, j;
    g_mpq = mkq(64, sizeof(mp_msg_t), ASYNC_QUEUE_BLOCK_WRITER);
    for (i = 0; i < MP_CONSUMERS; i++)
        CHECK(pthread_create(&cons[i], NULL, mp_consumer, NULL) == 0);
    for (i = 0; i < MP_PRODUCERS; i++)
        CHECK(pthread_create(&prod[i], NULL, mp_producer, (void *)(uintptr_t)i) == 0);
    for (i = 0; i < MP_PRODUCERS; i++)
        pthread_join(prod[i], NULL);
    for (i = 0; i < MP_CONSUMERS; i++) { /* FIFO: poison comes after every message */
        mp_msg_t m;
        m.producer = MP_POISON;
        m.seq = 0;
        CHECK(async_queue_enqueue(g_mpq, &m, sizeof m));
    }
    for (i = 0; i < MP_CONSUMERS; i++)
        pthread_join(cons[i], NULL);
    CHECK_EQ(atomic_load(&g_mp_count), (long)MP_PRODUCERS * MP_PER_PRODUCER);
    for (i = 0; i < MP_PRODUCERS; i++)
        for (j = 0; j < MP_PER_PRODUCER; j++)
            CHECK_EQ(atomic_load(&g_mp_seen[i][j]), 1);
    stats(g_mpq, &st);
    CHECK_EQ(st.enqueue_count, (uint64_t)MP_PRODUCERS * MP_PER_PRODUCER + MP_CONSUMERS);
    CHECK_EQ(st.dequeue_count, st.enqueue_count);
    CHECK_EQ(st.dropped_count, 0);
    CHECK_EQ(st.current_size, 0);
    async_queue_destroy(g_mpq);
}

/* --- policies ----------------------------------------------------------- */

CASE(drop_oldest)
{
    async_queue_t *q = mkq(4, sizeof(int), ASYNC_QUEUE_DROP_OLDEST);
    async_queue_stats_t st;
    double t0;
    int i;
    for (i = 0; i < 10; i++)
        enq_int(q, i);
    CHECK(async_queue_is_full(q));
    stats(q, &st);
    CHECK_EQ(st.dropped_count, 6);
    CHECK_EQ(st.enqueue_count, 10);
    CHECK_EQ(st.current_size, 4);
    /* the survivors are the newest, still in order */
    for (i = 6; i < 10; i++)
        CHECK_EQ(deq_int(q), i);
    CHECK(async_queue_is_empty(q));
    /* enqueue_wait never waits with DROP_OLDEST */
    for (i = 0; i < 4; i++)
        enq_int(q, 100 + i);
    i = 104;
    t0 = now_ms();
    CHECK(async_queue_enqueue_wait(q, &i, sizeof i, 5000));
    CHECK(now_ms() - t0 < 2000);
    stats(q, &st);
    CHECK_EQ(st.dropped_count, 7);
    CHECK_EQ(deq_int(q), 101);
    async_queue_destroy(q);
}

CASE(full_nopolicy)
{
    async_queue_t *q = mkq(2, sizeof(int), 0);
    async_queue_stats_t st;
    int v = 3;
    double t0;
    enq_int(q, 1);
    enq_int(q, 2);
    CHECK(async_queue_is_full(q));
    t0 = now_ms();
    CHECK_FAIL(!async_queue_enqueue(q, &v, sizeof v), ASYNC_E_FULL);
    CHECK(now_ms() - t0 < 2000); /* fails at once */
    /* timeout 0 does not wait: fails at once with FULL */
    t0 = now_ms();
    CHECK_FAIL(!async_queue_enqueue_wait(q, &v, sizeof v, 0), ASYNC_E_FULL);
    CHECK(now_ms() - t0 < 2000);
    CHECK_FAIL(!async_queue_enqueue_wait(q, &v, sizeof v, 30), ASYNC_E_TIMEDOUT);
    stats(q, &st);
    CHECK_EQ(st.enqueue_count, 2);
    CHECK_EQ(st.dropped_count, 0);
    CHECK_EQ(st.current_size, 2);
    CHECK_EQ(deq_int(q), 1);
    CHECK_EQ(deq_int(q), 2);
    async_queue_destroy(q);
}

/* --- blocked writers ---------------------------------------------------- */

/* One queue call on a thread of its own (start_writer, start_reader) and
 * what it gave: an enqueue of value (timeout -2: async_queue_enqueue, else
 * async_queue_enqueue_wait) or an async_queue_dequeue_wait into value. */
typedef struct {
    async_queue_t *q;
    bool write;
    int timeout;
    int value;
    size_t size;
    int ok, err;
    double elapsed;
    atomic_int done;
} qcall_t;

typedef qcall_t writer_t;
typedef qcall_t reader_t;

static void *qcall_thread(void *arg)
{
    qcall_t *c = (qcall_t *)arg;
    double t0 = now_ms();
    bool ok;
    if (!c->write)
        ok = async_queue_dequeue_wait(c->q, &c->value, sizeof c->value, &c->size, c->timeout);
    else if (c->timeout == -2)
        ok = async_queue_enqueue(c->q, &c->value, sizeof c->value);
    else
        ok = async_queue_enqueue_wait(c->q, &c->value, sizeof c->value, c->timeout);
    c->ok = ok;
    c->err = ok ? 0 : async_last_error();
    c->elapsed = now_ms() - t0;
    atomic_store(&c->done, 1);
    return NULL;
}

static void start_qcall(pthread_t *th, qcall_t *c, async_queue_t *q, bool write, int value, int timeout)
{
    memset(c, 0, sizeof *c);
    c->q = q;
    c->write = write;
    c->value = value;
    c->timeout = timeout;
    atomic_store(&c->done, 0);
    CHECK(pthread_create(th, NULL, qcall_thread, c) == 0);
}

static void start_writer(pthread_t *th, writer_t *w, async_queue_t *q, int value, int timeout)
{
    start_qcall(th, w, q, true, value, timeout);
}

CASE(block_writer_dequeue)
{
    async_queue_t *q = mkq(1, sizeof(int), ASYNC_QUEUE_BLOCK_WRITER);
    pthread_t th;
    writer_t w;
    enq_int(q, 1);
    start_writer(&th, &w, q, 2, -2);
    sleep_ms(150);
    CHECK_EQ(atomic_load(&w.done), 0); /* still blocked: the queue is full */
    CHECK_EQ(deq_int(q), 1);           /* makes room: the writer wakes */
    pthread_join(th, NULL);
    CHECK(w.ok);
    CHECK_EQ(deq_int(q), 2);
    async_queue_destroy(q);
}

CASE(block_writer_clear)
{
    async_queue_t *q = mkq(2, sizeof(int), ASYNC_QUEUE_BLOCK_WRITER);
    async_queue_stats_t st;
    pthread_t th;
    writer_t w;
    enq_int(q, 1);
    enq_int(q, 2);
    start_writer(&th, &w, q, 3, -2);
    sleep_ms(150);
    CHECK_EQ(atomic_load(&w.done), 0);
    async_queue_clear(q);
    pthread_join(th, NULL);
    CHECK(w.ok);
    stats(q, &st);
    CHECK_EQ(st.dropped_count, 2);
    CHECK_EQ(st.current_size, 1);
    CHECK_EQ(deq_int(q), 3);
    async_queue_destroy(q);
}

CASE(enqueue_wait_timeout)
{
    int flags[2] = {0, ASYNC_QUEUE_BLOCK_WRITER};
    int i;
    for (i = 0; i < 2; i++) {
        async_queue_t *q = mkq(1, sizeof(int), flags[i]);
        int v = 2;
        double t0, el;
        enq_int(q, 1);
        t0 = now_ms();
        CHECK_FAIL(!async_queue_enqueue_wait(q, &v, sizeof v, 150), ASYNC_E_TIMEDOUT);
        el = now_ms() - t0;
        CHECK(el >= 150.0);
        CHECK(el < 150.0 + 2000.0);
        /* the failed enqueue changed nothing */
        CHECK_EQ(deq_int(q), 1);
        CHECK(async_queue_is_empty(q));
        async_queue_destroy(q);
    }
}

CASE(enqueue_wait_woken)
{
    /* a writer waiting for room (no policy) wakes when a reader makes room */
    async_queue_t *q = mkq(1, sizeof(int), 0);
    pthread_t th;
    writer_t w;
    enq_int(q, 1);
    start_writer(&th, &w, q, 2, 20000);
    sleep_ms(150);
    CHECK_EQ(atomic_load(&w.done), 0);
    CHECK_EQ(deq_int(q), 1);
    pthread_join(th, NULL);
    CHECK(w.ok);
    CHECK(w.elapsed < 15000);
    CHECK_EQ(deq_int(q), 2);
    async_queue_destroy(q);
}

/* --- blocked readers ---------------------------------------------------- */

static void start_reader(pthread_t *th, reader_t *r, async_queue_t *q, int timeout)
{
    start_qcall(th, r, q, false, 0, timeout);
}

CASE(dequeue_wait_timeout)
{
    async_queue_t *q = mkq(4, sizeof(int), 0);
    int v;
    size_t n;
    double t0 = now_ms(), el;
    CHECK_FAIL(!async_queue_dequeue_wait(q, &v, sizeof v, &n, 150), ASYNC_E_TIMEDOUT);
    el = now_ms() - t0;
    CHECK(el >= 150.0);
    CHECK(el < 150.0 + 2000.0);
    /* timeout 0 does not wait: an empty queue fails at once with EMPTY */
    t0 = now_ms();
    CHECK_FAIL(!async_queue_dequeue_wait(q, &v, sizeof v, &n, 0), ASYNC_E_EMPTY);
    CHECK(now_ms() - t0 < 1000);
    /* a message already there is returned at once */
    enq_int(q, 9);
    t0 = now_ms();
    CHECK(async_queue_dequeue_wait(q, &v, sizeof v, &n, 10000));
    CHECK(now_ms() - t0 < 5000);
    CHECK_EQ(v, 9);
    async_queue_destroy(q);
}

CASE(dequeue_wait_woken)
{
    async_queue_t *q = mkq(4, sizeof(int), 0);
    pthread_t th;
    reader_t r;
    start_reader(&th, &r, q, -1);
    sleep_ms(150);
    CHECK_EQ(atomic_load(&r.done), 0);
    enq_int(q, 77);
    pthread_join(th, NULL);
    CHECK(r.ok);
    CHECK_EQ(r.value, 77);
    CHECK_EQ(r.size, sizeof(int));
    /* with a finite timeout it also wakes long before the timeout */
    start_reader(&th, &r, q, 20000);
    sleep_ms(100);
    enq_int(q, 78);
    pthread_join(th, NULL);
    CHECK(r.ok);
    CHECK_EQ(r.value, 78);
    CHECK(r.elapsed < 15000);
    async_queue_destroy(q);
}

/* A caller parked on a queue wakes with CLOSED when the queue is destroyed:
 *   PARK_DEQ  dequeue_wait(-1) on an empty queue,
 *   PARK_BW   enqueue on a full BLOCK_WRITER queue,
 *   PARK_ENQ  enqueue_wait(20000) on a full queue without a policy.
 * Nothing public says the caller has parked, so the test sleeps first. On a
 * slow host (wine, qemu, a loaded CI) the thread may reach its call only after
 * the destroy and then fails with BADHANDLE: that attempt proves nothing and
 * is repeated with a longer sleep. Any other outcome fails the test, and so
 * does never seeing CLOSED. */
enum { PARK_DEQ, PARK_BW, PARK_ENQ };

static void destroy_wakes_parked(int kind)
{
    int attempt, sleep_for = 200;
    for (attempt = 0; attempt < 5; attempt++, sleep_for *= 2) {
        async_queue_t *q = mkq(1, sizeof(int), kind == PARK_BW ? ASYNC_QUEUE_BLOCK_WRITER : 0);
        pthread_t th;
        reader_t r;
        writer_t w;
        atomic_int *done;
        int ok, err;
        double elapsed;
        if (kind == PARK_DEQ) {
            start_reader(&th, &r, q, -1);
            done = &r.done;
        } else {
            enq_int(q, 1);
            start_writer(&th, &w, q, 2, kind == PARK_BW ? -2 : 20000);
            done = &w.done;
        }
        sleep_ms(sleep_for);
        CHECK_EQ(atomic_load(done), 0);
        async_queue_destroy(q);
        join_within(th, 30000, "caller parked on the queue");
        ok = kind == PARK_DEQ ? r.ok : w.ok;
        err = kind == PARK_DEQ ? r.err : w.err;
        elapsed = kind == PARK_DEQ ? r.elapsed : w.elapsed;
        CHECK(!ok);
        if (err == ASYNC_E_BADHANDLE) {
            fprintf(stderr, "the call began after the destroy (slept %d ms); again\n", sleep_for);
            continue;
        }
        CHECK_EQ(err, ASYNC_E_CLOSED);
        CHECK(elapsed < 15000); /* woken by the destroy, not by a timeout */
        return;
    }
    CHECK(!"the caller never parked before the destroy");
}

CASE(dequeue_wait_destroy) { destroy_wakes_parked(PARK_DEQ); }
CASE(block_writer_destroy) { destroy_wakes_parked(PARK_BW); }
CASE(enqueue_wait_destroy) { destroy_wakes_parked(PARK_ENQ); }

/* --- sizes and arguments ------------------------------------------------ */

CASE(bufsize)
{
    async_queue_t *q = mkq(4, 32, 0);
    char msg[10] = "0123456789", small[4], big[32];
    size_t n;
    async_queue_stats_t st;
    CHECK(async_queue_enqueue(q, msg, 10));
    CHECK(async_queue_enqueue(q, "ab", 2));
    n = 0;
    CHECK_FAIL(!async_queue_dequeue(q, small, sizeof small, &n), ASYNC_E_BUFSIZE);
    CHECK_EQ(n, 10);
    /* NULL buffer with size 0 asks for the head's size */
    n = 0;
    CHECK_FAIL(!async_queue_dequeue(q, NULL, 0, &n), ASYNC_E_BUFSIZE);
    CHECK_EQ(n, 10);
    /* out_size NULL: still BUFSIZE, no crash */
    CHECK_FAIL(!async_queue_dequeue(q, small, sizeof small, NULL), ASYNC_E_BUFSIZE);
    /* dequeue_wait reports it too */
    n = 0;
    CHECK_FAIL(!async_queue_dequeue_wait(q, small, 9, &n, 100), ASYNC_E_BUFSIZE);
    CHECK_EQ(n, 10);
    stats(q, &st);
    CHECK_EQ(st.current_size, 2);
    CHECK_EQ(st.dequeue_count, 0);
    /* the message stayed at the head */
    CHECK(async_queue_dequeue(q, big, 10, &n));
    CHECK_EQ(n, 10);
    CHECK(memcmp(big, msg, 10) == 0);
    CHECK(async_queue_dequeue(q, big, sizeof big, &n));
    CHECK_EQ(n, 2);
    CHECK(memcmp(big, "ab", 2) == 0);
    async_queue_destroy(q);
}

CASE(toobig)
{
    async_queue_t *q = mkq(4, 8, 0);
    char buf[16] = {0};
    async_queue_stats_t st;
    CHECK_FAIL(!async_queue_enqueue(q, buf, 9), ASYNC_E_TOOBIG);
    CHECK_FAIL(!async_queue_enqueue_wait(q, buf, 16, 100), ASYNC_E_TOOBIG);
    CHECK(async_queue_enqueue(q, buf, 8));
    stats(q, &st);
    CHECK_EQ(st.enqueue_count, 1);
    CHECK_EQ(st.current_size, 1);
    async_queue_destroy(q);
}

CASE(inval)
{
    async_queue_t *q = mkq(4, 8, 0);
    int v = 1;
    size_t n;
    async_queue_stats_t st;
    CHECK_FAIL(!async_queue_enqueue(q, NULL, 4), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_enqueue(q, &v, 0), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_enqueue_wait(q, NULL, 4, 10), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_enqueue_wait(q, &v, 0, 10), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_enqueue_wait(q, &v, sizeof v, -2), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_enqueue_wait(q, &v, sizeof v, -1000), ASYNC_E_INVAL);
    CHECK(async_queue_is_empty(q)); /* nothing was enqueued */
    enq_int(q, 5);
    CHECK_FAIL(!async_queue_dequeue(q, NULL, 4, &n), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_dequeue_wait(q, NULL, 4, &n, 10), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_dequeue_wait(q, &v, sizeof v, &n, -2), ASYNC_E_INVAL);
    memset(&st, 0, sizeof st);
    async_queue_get_stats(q, &st);
    CHECK_EQ(st.current_size, 1); /* the message is still there */
    async_clear_error();
    async_queue_get_stats(q, NULL);
    CHECK_ERR(ASYNC_E_INVAL);
    CHECK_EQ(deq_int(q), 5);
    async_queue_destroy(q);
}

CASE(create_inval)
{
    async_queue_t *q;
    CHECK_FAIL(async_queue_create(0, 8, Q_FLAGS(0)) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(8, 0, Q_FLAGS(0)) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(0, 0, Q_FLAGS(0)) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(8, 8, Q_FLAGS(ASYNC_QUEUE_DROP_OLDEST | ASYNC_QUEUE_BLOCK_WRITER)) == NULL,
               ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(8, 8, Q_FLAGS(0x08)) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(8, 8, Q_FLAGS(0x40000000)) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(8, 8, Q_FLAGS(ASYNC_QUEUE_SIGNAL_ON_DATA | 0x100)) == NULL, ASYNC_E_INVAL);
    /* absurd sizes (the documented limits: capacity 2^30, max_msg_size 2^40) */
    CHECK_FAIL(async_queue_create(((size_t)1 << 30) + 1, 8, Q_FLAGS(0)) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(8, ((size_t)1 << 40) + 1, Q_FLAGS(0)) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(SIZE_MAX, SIZE_MAX, Q_FLAGS(0)) == NULL, ASYNC_E_INVAL);
    /* every valid combination works */
    q = mkq(1, 1, ASYNC_QUEUE_DROP_OLDEST | ASYNC_QUEUE_SIGNAL_ON_DATA);
    async_queue_destroy(q);
    q = mkq(1, 1, ASYNC_QUEUE_BLOCK_WRITER | ASYNC_QUEUE_SIGNAL_ON_DATA);
    async_queue_destroy(q);
    q = mkq(1, 1, ASYNC_QUEUE_SIGNAL_ON_DATA);
    async_queue_destroy(q);
}

CASE(clear)
{
    async_queue_t *q = mkq(8, sizeof(int), 0);
    async_queue_stats_t st;
    int i;
    for (i = 0; i < 5; i++)
        enq_int(q, i);
    CHECK_EQ(deq_int(q), 0);
    async_queue_clear(q);
    CHECK(async_queue_is_empty(q));
    stats(q, &st);
    CHECK_EQ(st.dropped_count, 4);
    CHECK_EQ(st.current_size, 0);
    CHECK_EQ(st.enqueue_count, 5);
    CHECK_EQ(st.dequeue_count, 1);
    async_queue_clear(q); /* clearing an empty queue drops nothing */
    stats(q, &st);
    CHECK_EQ(st.dropped_count, 4);
    enq_int(q, 50); /* still usable */
    CHECK_EQ(deq_int(q), 50);
    async_queue_destroy(q);
}

CASE(stats)
{
    async_queue_t *q = mkq(3, 24, ASYNC_QUEUE_DROP_OLDEST);
    async_queue_stats_t st;
    int i;
    stats(q, &st);
    CHECK_QUEUE_STATS(st, 3, 24, 0, 0, 0, 0);
    for (i = 0; i < 5; i++)
        enq_int(q, i); /* 2 dropped */
    CHECK_EQ(deq_int(q), 2);
    stats(q, &st);
    CHECK_QUEUE_STATS(st, 3, 24, 2, 5, 1, 2);
    /* failed calls are not counted */
    {
        char big[25] = {0};
        CHECK(!async_queue_enqueue(q, big, sizeof big));
    }
    CHECK_EQ(deq_int(q), 3);
    CHECK_EQ(deq_int(q), 4);
    CHECK(!async_queue_dequeue(q, &i, sizeof i, NULL));
    stats(q, &st);
    CHECK_EQ(st.enqueue_count, 5);
    CHECK_EQ(st.dequeue_count, 3);
    CHECK_EQ(st.dropped_count, 2);
    CHECK_EQ(st.current_size, 0);
    async_queue_destroy(q);
}

/* Snapshots taken while 2 producers and 2 consumers run must be consistent:
 * enqueued = dequeued + dropped + current, current <= capacity. */
static async_queue_t *g_sq;
static atomic_int g_sq_stop;

static void *sq_producer(void *arg)
{
    int v = 0;
    (void)arg;
    while (!atomic_load(&g_sq_stop))
        CHECK(async_queue_enqueue(g_sq, &v, sizeof v));
    return NULL;
}

static void *sq_consumer(void *arg)
{
    int v, k = 0;
    (void)arg;
    while (!atomic_load(&g_sq_stop)) {
        (void)async_queue_dequeue(g_sq, &v, sizeof v, NULL);
        if (++k % 64 == 0)
            async_queue_clear(g_sq);
    }
    return NULL;
}

CASE(stats_consistent)
{
    pthread_t th[4];
    int i, n = 0;
    double t0;
    g_sq = mkq(16, sizeof(int), ASYNC_QUEUE_DROP_OLDEST);
    atomic_store(&g_sq_stop, 0);
    for (i = 0; i < 4; i++)
        CHECK(pthread_create(&th[i], NULL, i < 2 ? sq_producer : sq_consumer, NULL) == 0);
    t0 = now_ms();
    while (now_ms() - t0 < 500) {
        async_queue_stats_t st;
        stats(g_sq, &st);
        CHECK_EQ(st.capacity, 16);
        CHECK(st.current_size <= 16);
        CHECK_EQ(st.enqueue_count, st.dequeue_count + st.dropped_count + st.current_size);
        n++;
    }
    atomic_store(&g_sq_stop, 1);
    for (i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    CHECK(n > 10);
    async_queue_destroy(g_sq);
}

/* Messages of 1 MiB max: the queue allocates a slot's buffer when it is
 * first used and grows it for a bigger message; every length round-trips
 * intact, in order, through growth, DROP_OLDEST and BUFSIZE. */
CASE(big_msgs)
{
    const size_t max = (size_t)1 << 20;
    const size_t sizes[] = {1, 100, 65, max, 3, max - 1, 4096, 64};
    const size_t nsizes = sizeof sizes / sizeof sizes[0];
    unsigned char *in = malloc(max), *out = malloc(max);
    async_queue_t *q = mkq(3, max, ASYNC_QUEUE_DROP_OLDEST);
    async_queue_stats_t st;
    size_t i, j, n;
    CHECK(in != NULL && out != NULL);
    for (i = 0; i < nsizes; i++) {
        for (j = 0; j < sizes[i]; j++)
            in[j] = (unsigned char)(i * 31 + j * 7);
        CHECK(async_queue_enqueue(q, in, sizes[i]));
        if (i < 2)
            continue;
        /* keep two queued: the slots are reused with other sizes */
        n = 0;
        CHECK_FAIL(!async_queue_dequeue(q, out, sizes[i - 2] - 1, &n), ASYNC_E_BUFSIZE);
        CHECK_EQ(n, sizes[i - 2]);
        CHECK(async_queue_dequeue(q, out, max, &n));
        CHECK_EQ(n, sizes[i - 2]);
        for (j = 0; j < n; j++)
            CHECK_EQ(out[j], (unsigned char)((i - 2) * 31 + j * 7));
    }
    /* fill past the capacity: the oldest is dropped */
    for (i = 0; i < 4; i++) {
        memset(in, (int)i, 200 * (i + 1));
        CHECK(async_queue_enqueue(q, in, 200 * (i + 1)));
    }
    stats(q, &st);
    CHECK_EQ(st.current_size, 3);
    CHECK_EQ(st.dropped_count, 3); /* the 2 left from the loop, then message 0 */
    for (i = 1; i < 4; i++) {
        CHECK(async_queue_dequeue(q, out, max, &n));
        CHECK_EQ(n, 200 * (i + 1));
        CHECK(out[0] == i && out[n - 1] == i);
    }
    CHECK(async_queue_is_empty(q));
    async_queue_destroy(q);
    free(in);
    free(out);
}

/* --- attach to a runtime ------------------------------------------------ */

/* Collects events for up to `ms`, returns how many; all must be completions
 * (key, data = q). */
static int drain_completions(async_runtime_t *rt, uintptr_t key, async_queue_t *q, int ms)
{
    io_event_t ev[16];
    int total = 0;
    double t0 = now_ms();
    for (;;) {
        int left = ms - (int)(now_ms() - t0), i, n;
        if (left < 0)
            left = 0;
        n = async_runtime_wait(rt, ev, 16, left);
        CHECK(n >= 0);
        for (i = 0; i < n; i++) {
            CHECK_EQ(ev[i].event_type, ASYNC_EVENT_COMPLETION);
            CHECK_EQ(ev[i].fd, -1);
            CHECK_EQ(ev[i].completion_key, key);
            CHECK_EQ(ev[i].data, (uintptr_t)q);
        }
        total += n;
        if (left == 0)
            return total;
    }
}

CASE(attach_signal) // poll
{
    async_runtime_t *rt = async_runtime_init();
    async_queue_t *q = mkq(16, sizeof(int), ASYNC_QUEUE_SIGNAL_ON_DATA);
    const uintptr_t key = (uintptr_t)0xC0FFEE12345ull;
    int round, i;
    CHECK(rt != NULL);
    CHECK_EQ(async_queue_attach(q, rt, key), 0);
    CHECK_EQ(drain_completions(rt, key, q, 50), 0); /* empty: nothing posted */
    for (round = 1; round <= 4; round++) {
        for (i = 0; i < round * 2; i++) /* several messages, one transition */
            enq_int(q, i);
        CHECK_EQ(drain_completions(rt, key, q, 100), 1);
        for (i = 0; i < round * 2; i++)
            CHECK_EQ(deq_int(q), i);
        CHECK_FAIL(!async_queue_dequeue(q, &i, sizeof i, NULL), ASYNC_E_EMPTY);
    }
    /* non-empty -> non-empty after a partial dequeue posts nothing */
    enq_int(q, 1);
    enq_int(q, 2);
    CHECK_EQ(drain_completions(rt, key, q, 50), 1);
    CHECK_EQ(deq_int(q), 1);
    enq_int(q, 3);
    CHECK_EQ(drain_completions(rt, key, q, 100), 0);
    /* clear empties it: the next enqueue is a transition again */
    async_queue_clear(q);
    enq_int(q, 4);
    CHECK_EQ(drain_completions(rt, key, q, 100), 1);
    /* detach: no more completions */
    CHECK_EQ(async_queue_attach(q, NULL, 0), 0);
    async_queue_clear(q);
    enq_int(q, 5);
    CHECK_EQ(drain_completions(rt, key, q, 100), 0);
    /* attaching a non-empty queue posts one completion at once */
    CHECK_EQ(async_queue_attach(q, rt, key), 0);
    CHECK_EQ(drain_completions(rt, key, q, 100), 1);
    async_queue_destroy(q);
    async_runtime_deinit(rt);
}

CASE(attach_replace) // poll
{
    /* attaching again replaces the previous runtime and key */
    async_runtime_t *rt1 = async_runtime_init(), *rt2 = async_runtime_init();
    async_queue_t *q = mkq(4, sizeof(int), ASYNC_QUEUE_SIGNAL_ON_DATA);
    CHECK(rt1 != NULL && rt2 != NULL);
    CHECK_EQ(async_queue_attach(q, rt1, 1), 0);
    CHECK_EQ(async_queue_attach(q, rt2, 2), 0);
    enq_int(q, 1);
    CHECK_EQ(drain_completions(rt1, 1, q, 50), 0);
    CHECK_EQ(drain_completions(rt2, 2, q, 100), 1);
    CHECK_EQ(deq_int(q), 1);
    /* same runtime, new key */
    CHECK_EQ(async_queue_attach(q, rt2, 3), 0);
    enq_int(q, 2);
    CHECK_EQ(drain_completions(rt2, 3, q, 100), 1);
    CHECK_EQ(deq_int(q), 2);
    async_queue_destroy(q);
    async_runtime_deinit(rt1);
    async_runtime_deinit(rt2);
}

CASE(attach_destroyed) // poll
{
    /* a completion posted before the queue was destroyed still carries the
     * old handle; calls on it fail with BADHANDLE */
    async_runtime_t *rt = async_runtime_init();
    async_queue_t *q = mkq(4, sizeof(int), ASYNC_QUEUE_SIGNAL_ON_DATA);
    int v;
    CHECK(rt != NULL);
    CHECK_EQ(async_queue_attach(q, rt, 8), 0);
    enq_int(q, 1);
    async_queue_destroy(q);
    CHECK_EQ(drain_completions(rt, 8, q, 200), 1); /* key 8, data == the old handle */
    CHECK_FAIL(!async_queue_dequeue(q, &v, sizeof v, NULL), ASYNC_E_BADHANDLE);
    async_runtime_deinit(rt);
}

CASE(attach_noflag) // poll
{
    async_runtime_t *rt = async_runtime_init();
    async_queue_t *q = mkq(4, 4, 0);
    async_queue_t *q2 = mkq(4, 4, ASYNC_QUEUE_DROP_OLDEST);
    io_event_t ev[4];
    CHECK(rt != NULL);
    CHECK_FAIL(async_queue_attach(q, rt, 1) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_attach(q2, rt, 1) == -1, ASYNC_E_INVAL);
    enq_int(q, 1);
    CHECK_EQ(async_runtime_wait(rt, ev, 4, 50), 0);
    async_queue_destroy(q);
    async_queue_destroy(q2);
    async_runtime_deinit(rt);
}

static async_queue_t *g_wq;

static void *attach_worker_proc(void *ctx)
{
    int i;
    (void)ctx;
    sleep_ms(100); /* the main thread is blocked in async_runtime_wait by now */
    for (i = 0; i < 3; i++)
        CHECK(async_queue_enqueue(g_wq, &i, sizeof i));
    return (void *)(uintptr_t)7;
}

CASE(attach_worker) // poll
{
    async_runtime_t *rt = async_runtime_init();
    async_worker_t *w;
    io_event_t ev[4];
    double t0;
    int n, i;
    CHECK(rt != NULL);
    g_wq = mkq(8, sizeof(int), ASYNC_QUEUE_SIGNAL_ON_DATA);
    CHECK_EQ(async_queue_attach(g_wq, rt, 99), 0);
    w = async_worker_create(attach_worker_proc, NULL, 0);
    CHECK(w != NULL);
    t0 = now_ms();
    do
        n = async_runtime_wait(rt, ev, 4, 10000);
    while (n == 0 && now_ms() - t0 < 10000);
    CHECK_EQ(n, 1);
    CHECK(now_ms() - t0 < 9000);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_COMPLETION);
    CHECK_EQ(ev[0].completion_key, 99);
    CHECK_EQ(ev[0].data, (uintptr_t)g_wq);
    CHECK(async_worker_join(w, 10000));
    CHECK(async_worker_result(w) == (void *)(uintptr_t)7);
    async_worker_destroy(w);
    /* the consumer dequeues until EMPTY */
    for (i = 0; i < 3; i++)
        CHECK_EQ(deq_int((async_queue_t *)(uintptr_t)ev[0].data), i);
    CHECK_FAIL(!async_queue_dequeue(g_wq, &i, sizeof i, NULL), ASYNC_E_EMPTY);
    async_queue_destroy(g_wq);
    async_runtime_deinit(rt);
}

CASE(attach_rt_gone) // poll
{
    /* the runtime is deinitialized while the queue stays attached: the queue
     * keeps working and simply posts nothing */
    async_runtime_t *rt = async_runtime_init();
    async_queue_t *q = mkq(4, sizeof(int), ASYNC_QUEUE_SIGNAL_ON_DATA);
    CHECK(rt != NULL);
    CHECK_EQ(async_queue_attach(q, rt, 5), 0);
    async_runtime_deinit(rt);
    enq_int(q, 1);
    CHECK_EQ(deq_int(q), 1);
    enq_int(q, 2);
    async_queue_destroy(q);
    /* and the other way round: a destroyed queue with a live runtime */
    rt = async_runtime_init();
    CHECK(rt != NULL);
    q = mkq(4, sizeof(int), ASYNC_QUEUE_SIGNAL_ON_DATA);
    CHECK_EQ(async_queue_attach(q, rt, 5), 0);
    async_queue_destroy(q);
    {
        io_event_t ev[2];
        CHECK_EQ(async_runtime_wait(rt, ev, 2, 20), 0);
    }
    async_runtime_deinit(rt);
}

TEST_MAIN()
