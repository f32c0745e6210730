/* Channels between fibers and plain threads: a million ints in order over
 * buffered and rendezvous channels; close wakes every parked receiver with
 * ASYNC_E_CLOSED after a buffered channel drains; full, empty and timed-out
 * operations; destroy wakes a parked receiver; destroy racing send, recv,
 * select and close from threads and fibers; bad input.
 * scripts/cross.sh builds this file for Windows and runs its cases under
 * wine, except those inside #if !defined(_WIN32). */
#include <pthread.h>
#include <stdatomic.h>

#include "fibers.h"

static void int_producer(void *arg) {
    int_stream_t *p = arg;
    for (long i = 0; i < p->n; i++) CHECK_EQ(async_chan_send(p->c, &i, -1), 0);
    async_chan_close(p->c);
}

static void exchange(size_t cap, long n) {
    async_sched_t *s = sched_new(2);
    int_stream_t p = {async_chan_create(cap, sizeof(long)), n, 0};
    CHECK(p.c);
    double t0 = now_ms();
    CHECK(async_fiber_spawn(s, int_consumer, &p, 0));
    CHECK(async_fiber_spawn(s, int_producer, &p, 0));
    CHECK_EQ(async_sched_run(s), 0);
    printf("cap %zu: %ld ints in %.0f ms\n", cap, n, now_ms() - t0);
    CHECK_EQ(p.bad, 0);
    async_chan_destroy(p.c);
    async_sched_destroy(s);
}

CASE(chan_1m_buffered) { exchange(64, 1000000); } // valgrind
CASE(chan_1m_rendezvous) { exchange(0, 1000000); } // valgrind

typedef struct {
    async_chan_t *c;
    atomic_int closed_seen, got;
} close_ctx_t;

static void recv_until_closed(void *arg) {
    close_ctx_t *x = arg;
    int v;
    for (;;) {
        if (async_chan_recv(x->c, &v, -1) == 0) {
            atomic_fetch_add(&x->got, 1);
            continue;
        }
        CHECK_ERR(ASYNC_E_CLOSED);
        atomic_fetch_add(&x->closed_seen, 1);
        return;
    }
}

CASE(chan_close) { // valgrind
    async_sched_t *s = sched_new(2);
    /* parked receivers on a rendezvous channel all wake with CLOSED */
    close_ctx_t x = {async_chan_create(0, sizeof(int)), 0, 0};
    for (int i = 0; i < 50; i++) CHECK(async_fiber_spawn(s, recv_until_closed, &x, 0));
    sched_wait_parked(s, 50);
    int v = 7;
    CHECK_EQ(async_chan_send(x.c, &v, 1000), 0); /* a plain thread sends to a fiber */
    async_chan_close(x.c);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&x.closed_seen), 50);
    CHECK_EQ(atomic_load(&x.got), 1);
    CHECK_FAIL(async_chan_send(x.c, &v, -1) == -1, ASYNC_E_CLOSED);
    CHECK_FAIL(async_chan_try_recv(x.c, &v) == -1, ASYNC_E_CLOSED);
    async_chan_destroy(x.c);
    CHECK_FAIL(async_chan_send(x.c, &v, 0) == -1, ASYNC_E_BADHANDLE);

    /* a buffered channel drains before reporting CLOSED */
    async_chan_t *b = async_chan_create(4, sizeof(int));
    for (int i = 0; i < 4; i++) CHECK_EQ(async_chan_try_send(b, &i), 0);
    CHECK_FAIL(async_chan_try_send(b, &v) == -1, ASYNC_E_FULL);
    CHECK_FAIL(async_chan_send(b, &v, 20) == -1, ASYNC_E_TIMEDOUT);
    async_chan_close(b);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ(async_chan_recv(b, &v, -1), 0);
        CHECK_EQ(v, i);
    }
    CHECK_FAIL(async_chan_recv(b, &v, -1) == -1, ASYNC_E_CLOSED);
    async_chan_destroy(b);
    /* empty */
    b = async_chan_create(1, 3);
    char e3[3];
    CHECK_FAIL(async_chan_try_recv(b, e3) == -1, ASYNC_E_EMPTY);
    double t0 = now_ms();
    CHECK_FAIL(async_chan_recv(b, e3, 30) == -1, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 29.9);
    async_chan_destroy(b);
    /* destroy wakes a parked receiver too */
    x.c = async_chan_create(2, sizeof(int));
    atomic_store(&x.closed_seen, 0);
    CHECK(async_fiber_spawn(s, recv_until_closed, &x, 0));
    sched_wait_parked(s, 1); /* a recv that began after the destroy would see BADHANDLE */
    async_chan_destroy(x.c);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&x.closed_seen), 1);
    /* bad input */
    CHECK_FAIL(async_chan_create(1, 0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create((size_t)1 << 30, 8) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_send(NULL, &v, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_chan_recv((async_chan_t *)s, &v, 0) == -1, ASYNC_E_BADHANDLE);
    b = async_chan_create(1, sizeof(int));
    CHECK_FAIL(async_chan_send(b, NULL, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_send(b, &v, -5) == -1, ASYNC_E_INVAL);
    async_chan_destroy(b);
    async_chan_close(NULL);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    async_sched_destroy(s);
}

#if !defined(_WIN32)

/* ---- chan destroy racing everything ------------------------------------ */

static async_chan_t *_Atomic dr_c;
static atomic_int dr_stop;

static void *dr_user(void *arg)
{
    long k = (long)(intptr_t)arg;
    while (!atomic_load(&dr_stop)) {
        async_chan_t *c = dr_c;
        long v = 1;
        async_chan_op_t ops[3];
        switch (k % 4) {
        case 0:
            async_chan_send(c, &v, 1);
            break;
        case 1:
            async_chan_recv(c, &v, 1);
            break;
        case 2:
            memset(ops, 0, sizeof ops);
            ops[0].chan = c;
            ops[0].dir = ASYNC_CHAN_RECV;
            ops[1].chan = c;
            ops[1].dir = ASYNC_CHAN_SEND;
            ops[1].elem = &v;
            ops[2].chan = c;
            ops[2].dir = ASYNC_CHAN_RECV;
            async_chan_select(ops, 3, 1);
            break;
        default:
            async_chan_close(c);
            async_chan_try_send(c, &v);
            async_chan_try_recv(c, &v);
            break;
        }
    }
    return NULL;
}

static void dr_fiber(void *arg) { dr_user(arg); }

CASE(chan_destroy_race) // adversarial
{
    pthread_t t[4];
    async_sched_t *s = sched_new(2);
    int i;
    double t0;
    dr_c = async_chan_create(0, sizeof(long));
    for (i = 0; i < 4; i++)
        start_thread(&t[i], dr_user, (void *)(intptr_t)i);
    for (i = 0; i < 8; i++)
        CHECK(async_fiber_spawn(s, dr_fiber, (void *)(intptr_t)i, 0) != NULL);
    t0 = now_ms();
    for (i = 0; now_ms() - t0 < 2000; i++) {
        async_chan_t *old = dr_c;
        dr_c = async_chan_create((size_t)(i % 3), sizeof(long));
        CHECK(dr_c != NULL);
        async_chan_destroy(old);
    }
    atomic_store(&dr_stop, 1);
    for (i = 0; i < 4; i++)
        join_within(t[i], 30000, "user");
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    async_chan_destroy(dr_c);
}

#endif /* !_WIN32 */

TEST_MAIN()
