/* async_chan_select: the first ready operation of several (recv and send)
 * completes, timeouts 0 and short, a closed channel completes with status
 * ASYNC_E_CLOSED, bad input; many fibers selecting on shared channels
 * against many senders get every value exactly once; a select with a send
 * and a recv on one rendezvous channel does not match itself.
 * scripts/cross.sh builds this file for Windows and runs its cases under
 * wine, except those inside #if !defined(_WIN32). */
#include <pthread.h>
#include <stdatomic.h>

#include "fibers.h"

/* ---- one selector, two senders, a quit channel ------------------------------ */

typedef struct {
    async_chan_t *a, *b, *quit;
    long from_a, from_b;
    int quit_seen;
} sel_ctx_t;

static void selector(void *arg) {
    sel_ctx_t *x = arg;
    long va, vb;
    for (;;) {
        async_chan_op_t ops[3] = {
            {x->a, ASYNC_CHAN_RECV, &va, -1}, {x->b, ASYNC_CHAN_RECV, &vb, -1}, {x->quit, ASYNC_CHAN_RECV, NULL, -1}};
        int i = async_chan_select(ops, 3, -1);
        CHECK(i >= 0 && i < 3);
        CHECK_EQ(ops[i].status, 0);
        if (i == 0) x->from_a += va;
        if (i == 1) x->from_b += vb;
        if (i == 2) {
            x->quit_seen = 1;
            return;
        }
    }
}

static void sel_sender(void *arg) {
    async_chan_t *c = arg;
    for (long i = 1; i <= 1000; i++) CHECK_EQ(async_chan_send(c, &i, -1), 0);
}

CASE(chan_select) { // valgrind
    async_sched_t *s = sched_new(2);
    sel_ctx_t x = {async_chan_create(0, sizeof(long)), async_chan_create(3, sizeof(long)),
                   async_chan_create(0, 1), 0, 0, 0};
    async_fiber_t *sf = async_fiber_spawn(s, selector, &x, ASYNC_FIBER_JOINABLE);
    async_fiber_t *s1 = async_fiber_spawn(s, sel_sender, x.a, ASYNC_FIBER_JOINABLE);
    async_fiber_t *s2 = async_fiber_spawn(s, sel_sender, x.b, ASYNC_FIBER_JOINABLE);
    CHECK(sf && s1 && s2);
    CHECK_EQ(async_fiber_join(s1, -1), 0);
    CHECK_EQ(async_fiber_join(s2, -1), 0);
    char q = 1;
    CHECK_EQ(async_chan_send(x.quit, &q, -1), 0); /* rendezvous: the selector took it */
    CHECK_EQ(async_fiber_join(sf, -1), 0);
    CHECK_EQ(x.from_a, 500500);
    CHECK_EQ(x.from_b, 500500);
    CHECK_EQ(x.quit_seen, 1);

    /* nothing ready: timeout 0 and a short timeout, from a plain thread */
    long v = 42, r = 0;
    async_chan_op_t ops[2] = {{x.a, ASYNC_CHAN_SEND, &v, -1}, {x.b, ASYNC_CHAN_RECV, &r, -1}};
    CHECK_FAIL(async_chan_select(ops, 2, 0) == -1, ASYNC_E_TIMEDOUT);
    double t0 = now_ms();
    CHECK_FAIL(async_chan_select(ops, 2, 30) == -1, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 29.9);
    /* a buffered element makes the recv ready */
    long seven = 7;
    CHECK_EQ(async_chan_send(x.b, &seven, 0), 0);
    CHECK_EQ(async_chan_select(ops, 2, -1), 1);
    CHECK_EQ(r, 7);
    CHECK_EQ(ops[1].status, 0);
    /* a select that sends: a fiber receives on a */
    int_stream_t p = {x.a, 1, 0};
    async_fiber_t *rf = async_fiber_spawn(s, int_consumer, &p, ASYNC_FIBER_JOINABLE);
    long zero = 0;
    ops[0].elem = &zero;
    CHECK_EQ(async_chan_select(ops, 2, 5000), 0);
    async_chan_close(x.a);
    CHECK_EQ(async_fiber_join(rf, -1), 0);
    CHECK_EQ(p.bad, 0);
    /* closed channel: the op completes with status CLOSED */
    CHECK_EQ(async_chan_select(ops, 2, -1), 0);
    CHECK_EQ(ops[0].status, ASYNC_E_CLOSED);
    /* bad input */
    CHECK_FAIL(async_chan_select(NULL, 1, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_select(ops, 0, 0) == -1, ASYNC_E_INVAL);
    ops[1].dir = 9;
    CHECK_FAIL(async_chan_select(ops, 2, 0) == -1, ASYNC_E_INVAL);
    ops[1].dir = ASYNC_CHAN_RECV;
    ops[1].chan = NULL;
    CHECK_FAIL(async_chan_select(ops, 2, 0) == -1, ASYNC_E_BADHANDLE);
    async_chan_destroy(x.a);
    async_chan_destroy(x.b);
    async_chan_destroy(x.quit);
    async_sched_destroy(s);
}

/* many fibers select on shared channels against many senders: every value
 * is received exactly once */
typedef struct {
    async_chan_t *c[4], *done;
    atomic_long sum, count;
} fan_t;

static void fan_recv(void *arg) {
    fan_t *x = arg;
    long v;
    for (;;) {
        async_chan_op_t ops[5];
        for (int i = 0; i < 4; i++) ops[i] = (async_chan_op_t){x->c[i], ASYNC_CHAN_RECV, &v, -1};
        ops[4] = (async_chan_op_t){x->done, ASYNC_CHAN_RECV, NULL, -1};
        int i = async_chan_select(ops, 5, -1);
        CHECK(i >= 0);
        if (i == 4) {
            CHECK_EQ(ops[4].status, ASYNC_E_CLOSED);
            return;
        }
        CHECK_EQ(ops[i].status, 0);
        atomic_fetch_add(&x->sum, v);
        atomic_fetch_add(&x->count, 1);
    }
}

static fan_t *fan_g;
static void fan_send(void *arg) {
    long base = (long)(intptr_t)arg;
    for (long i = 1; i <= 2000; i++) {
        long v = base * 2000 + i;
        CHECK_EQ(async_chan_send(fan_g->c[i % 4], &v, -1), 0);
    }
}

CASE(chan_select_stress) { // valgrind
    async_sched_t *s = sched_new(0);
    fan_t x;
    for (int i = 0; i < 4; i++) x.c[i] = async_chan_create(i, sizeof(long)); /* capacities 0..3 */
    x.done = async_chan_create(0, 1);
    atomic_init(&x.sum, 0);
    atomic_init(&x.count, 0);
    fan_g = &x;
    async_fiber_t *rs[16], *ss[16];
    for (int i = 0; i < 16; i++) CHECK((rs[i] = async_fiber_spawn(s, fan_recv, &x, ASYNC_FIBER_JOINABLE)));
    for (int i = 0; i < 16; i++)
        CHECK((ss[i] = async_fiber_spawn(s, fan_send, (void *)(intptr_t)i, ASYNC_FIBER_JOINABLE)));
    for (int i = 0; i < 16; i++) CHECK_EQ(async_fiber_join(ss[i], -1), 0);
    /* all sent; wait until received, then release the receivers */
    for (double t0 = now_ms(); atomic_load(&x.count) < 32000 && now_ms() - t0 < 60000;) sleep_ms(2);
    async_chan_close(x.done);
    for (int i = 0; i < 16; i++) CHECK_EQ(async_fiber_join(rs[i], -1), 0);
    CHECK_EQ(atomic_load(&x.count), 32000);
    long expect = 0;
    for (long b = 0; b < 16; b++)
        for (long i = 1; i <= 2000; i++) expect += b * 2000 + i;
    CHECK_EQ(atomic_load(&x.sum), expect);
    for (int i = 0; i < 4; i++) async_chan_destroy(x.c[i]);
    async_chan_destroy(x.done);
    async_sched_destroy(s);
}

#if !defined(_WIN32)

/* ---- select with one channel twice (send + recv, rendezvous) ---------- */

CASE(select_self) // adversarial
{
    async_chan_t *c = async_chan_create(0, sizeof(int));
    int v = 7, out = 0;
    async_chan_op_t ops[2];
    CHECK(c != NULL);
    memset(ops, 0, sizeof ops);
    ops[0].chan = c;
    ops[0].dir = ASYNC_CHAN_SEND;
    ops[0].elem = &v;
    ops[1].chan = c;
    ops[1].dir = ASYNC_CHAN_RECV;
    ops[1].elem = &out;
    CHECK_FAIL(async_chan_select(ops, 2, 0) == -1, ASYNC_E_TIMEDOUT);
    CHECK_FAIL(async_chan_select(ops, 2, 50) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(out, 0);
    async_chan_destroy(c);
}

#endif /* !_WIN32 */

TEST_MAIN()
