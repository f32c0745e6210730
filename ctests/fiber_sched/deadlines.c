/* Deadlines: a scope's deadline ends its fibers' parks in progress and
 * fails later ones with ASYNC_E_TIMEDOUT (sleep included), the earliest of
 * nested deadlines wins, a fiber's own deadline (async_fiber_set_deadline)
 * works alone and with its scope's, a call's own earlier timeout still
 * applies, a shield suspends the deadline; deadlines racing completions
 * lose no element, deadlines racing cancels end each call once; a passed
 * deadline spares the calls that complete at once (a socket read of data
 * already there included). */
#include <pthread.h>
#include <stdatomic.h>
#if !defined(_WIN32)
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#endif

#include "fibers.h"

typedef struct {
    atomic_int done;
    int rc[4], err[4];
    double t0, t[4];
} dl_t;

static async_chan_t *empty_c;

/* Sleeps long, receives from an empty channel without a timeout, sleeps 0,
 * receives with a long timeout: each fails with TIMEDOUT past the deadline. */
static void dl_waits(void *arg) {
    dl_t *d = arg;
    int v;
    d->rc[0] = async_fiber_sleep(3600 * 1000);
    d->err[0] = async_last_error();
    d->t[0] = now_ms();
    d->rc[1] = async_chan_recv(empty_c, &v, -1);
    d->err[1] = async_last_error();
    d->rc[2] = async_fiber_sleep(0);
    d->err[2] = async_last_error();
    d->rc[3] = async_chan_recv(empty_c, &v, 3600 * 1000);
    d->err[3] = async_last_error();
    atomic_store(&d->done, 1);
}

static void check_timed_out(dl_t *d, double after_ms) {
    wait_count(&d->done, 1, "deadline fiber");
    for (int i = 0; i < 4; i++) {
        CHECK_EQ(d->rc[i], -1);
        CHECK_EQ(d->err[i], ASYNC_E_TIMEDOUT);
    }
    CHECK(d->t[0] - d->t0 >= after_ms - 1); /* not before the deadline */
}

/* A scope with a 100 ms deadline: the fiber's parks end with TIMEDOUT once
 * it passed, later ones fail at once. */
CASE(deadline_scope_ends_parks) { // uring valgrind
    async_sched_t *s = sched_new(2);
    empty_c = async_chan_create(1, sizeof(int));
    dl_t d;
    memset(&d, 0, sizeof d);
    d.t0 = now_ms();
    async_scope_t *sc = async_scope_create(s, NULL, 100);
    CHECK(async_scope_spawn(sc, dl_waits, &d, 0) != NULL);
    CHECK_EQ(async_scope_join(sc, BOUND_MS), 0);
    check_timed_out(&d, 100);
    CHECK_EQ(async_scope_destroy(sc), 0);
    async_chan_destroy(empty_c);
    async_sched_destroy(s);
}

/* Nested deadlines: the earlier one wins, whether it is the parent's or the
 * child's. */
CASE(deadline_nested_earliest) {
    async_sched_t *s = sched_new(2);
    empty_c = async_chan_create(1, sizeof(int));
    dl_t d1, d2;
    memset(&d1, 0, sizeof d1);
    memset(&d2, 0, sizeof d2);
    d1.t0 = d2.t0 = now_ms();
    async_scope_t *p1 = async_scope_create(s, NULL, 3600 * 1000), *c1 = async_scope_create(s, p1, 80);
    async_scope_t *p2 = async_scope_create(s, NULL, 80), *c2 = async_scope_create(s, p2, 3600 * 1000);
    CHECK(async_scope_spawn(c1, dl_waits, &d1, 0) != NULL);
    CHECK(async_scope_spawn(c2, dl_waits, &d2, 0) != NULL);
    CHECK_EQ(async_scope_join(p1, BOUND_MS), 0);
    CHECK_EQ(async_scope_join(p2, BOUND_MS), 0);
    check_timed_out(&d1, 80);
    check_timed_out(&d2, 80);
    async_chan_destroy(empty_c);
    async_sched_destroy(s);
}

static atomic_int own_ok;
static void own_deadline(void *arg) {
    (void)arg;
    int v;
    CHECK_FAIL(async_fiber_set_deadline(-2) == -1, ASYNC_E_INVAL);
    CHECK_EQ(async_fiber_set_deadline(50), 0);
    CHECK_FAIL(async_chan_recv(empty_c, &v, -1) == -1, ASYNC_E_TIMEDOUT);
    CHECK_FAIL(async_fiber_sleep(0) == -1, ASYNC_E_TIMEDOUT);
    /* a shield suspends it (the call's own timeout stays) */
    CHECK_EQ(async_fiber_shield_begin(), 0);
    CHECK_EQ(async_fiber_sleep(1), 0);
    CHECK_FAIL(async_chan_recv(empty_c, &v, 20) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(async_fiber_shield_end(), 0);
    CHECK_EQ(async_fiber_set_deadline(-1), 0); /* cleared */
    CHECK_EQ(async_fiber_sleep(1), 0);
    /* a later deadline than the call's own timeout: the call's applies */
    CHECK_EQ(async_fiber_set_deadline(3600 * 1000), 0);
    double t0 = now_ms();
    CHECK_FAIL(async_chan_recv(empty_c, &v, 30) == -1, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 < 3600 * 1000);
    CHECK_EQ(async_fiber_set_deadline(-1), 0);
    atomic_store(&own_ok, 1);
}

static atomic_int inscope_ok;
static void own_in_scope(void *arg) {
    (void)arg;
    /* the scope's 60 ms deadline stays when the fiber clears its own */
    CHECK_EQ(async_fiber_set_deadline(-1), 0);
    CHECK_FAIL(async_fiber_sleep(3600 * 1000) == -1, ASYNC_E_TIMEDOUT);
    atomic_store(&inscope_ok, 1);
}

/* A fiber's own deadline: set, shielded, cleared, later than a call's
 * timeout; inside a scope the scope's stays. Off a fiber: STATE. */
CASE(deadline_own) { // valgrind
    async_sched_t *s = sched_new(2);
    empty_c = async_chan_create(1, sizeof(int));
    CHECK(async_fiber_spawn(s, own_deadline, NULL, 0) != NULL);
    async_scope_t *sc = async_scope_create(s, NULL, 60);
    CHECK(async_scope_spawn(sc, own_in_scope, NULL, 0) != NULL);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&own_ok), 1);
    CHECK_EQ(atomic_load(&inscope_ok), 1);
    CHECK_FAIL(async_fiber_set_deadline(10) == -1, ASYNC_E_STATE);
    async_chan_destroy(empty_c);
    async_sched_destroy(s);
}

/* ---- races ------------------------------------------------------------------ */

#define RACERS 400
static async_chan_t *race_c;
static atomic_int race_got, race_timedout, race_bad;

static void deadline_receiver(void *arg) {
    (void)arg;
    CHECK_EQ(async_fiber_set_deadline(1), 0);
    long v;
    if (async_chan_recv(race_c, &v, -1) == 0)
        atomic_fetch_add(&race_got, 1);
    else if (async_last_error() == ASYNC_E_TIMEDOUT)
        atomic_fetch_add(&race_timedout, 1);
    else
        atomic_fetch_add(&race_bad, 1);
}

static atomic_int race_sent;
static void *race_sender(void *arg) {
    (void)arg;
    for (long i = 0; i < RACERS; i++)
        if (async_chan_send(race_c, &i, 2) == 0) atomic_fetch_add(&race_sent, 1);
    return NULL;
}

/* 400 receivers with 1 ms deadlines on a rendezvous channel racing a
 * thread's sends with 2 ms timeouts, on 16 workers: every element either
 * arrives (its send succeeded) or stays with the sender. */
CASE(deadline_races_handoff) { // uring adversarial timeout=120
    async_sched_t *s = sched_new(16);
    race_c = async_chan_create(0, sizeof(long));
    for (int i = 0; i < RACERS; i++) CHECK(async_fiber_spawn(s, deadline_receiver, NULL, 0) != NULL);
    pthread_t th;
    start_thread(&th, race_sender, NULL);
    join_within(th, BOUND_MS, "sender");
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&race_bad), 0);
    CHECK_EQ(atomic_load(&race_got), atomic_load(&race_sent));
    CHECK_EQ(atomic_load(&race_got) + atomic_load(&race_timedout), RACERS);
    async_chan_destroy(race_c);
    async_sched_destroy(s);
}

#define DC_FIBERS 200
static atomic_int dc_cancelled, dc_timedout, dc_other, dc_later_ok;
static async_fiber_t *dc_f[DC_FIBERS];

static void deadline_or_cancel(void *arg) {
    (void)arg;
    CHECK_EQ(async_fiber_set_deadline(2), 0);
    int rc = async_fiber_sleep(3600 * 1000);
    int e = async_last_error();
    if (rc == 0) atomic_fetch_add(&dc_other, 1);
    else if (e == ASYNC_E_CANCELLED) atomic_fetch_add(&dc_cancelled, 1);
    else if (e == ASYNC_E_TIMEDOUT) atomic_fetch_add(&dc_timedout, 1);
    else atomic_fetch_add(&dc_other, 1);
    /* the next park fails at once, with one of the two */
    rc = async_fiber_sleep(3600 * 1000);
    e = async_last_error();
    if (rc == -1 && (e == ASYNC_E_CANCELLED || e == ASYNC_E_TIMEDOUT)) atomic_fetch_add(&dc_later_ok, 1);
}

/* Deadlines (2 ms) racing cancels from a thread: each sleep ends once,
 * with CANCELLED or TIMEDOUT, never 0. */
CASE(deadline_races_cancel) { // adversarial timeout=120
    async_sched_t *s = sched_new(16);
    for (int i = 0; i < DC_FIBERS; i++) CHECK((dc_f[i] = async_fiber_spawn(s, deadline_or_cancel, NULL, ASYNC_FIBER_JOINABLE)) != NULL);
    for (int i = 0; i < DC_FIBERS; i++) {
        if (i % 40 == 0) sleep_ms(1); /* the later ones meet their deadline first */
        CHECK_EQ(async_fiber_cancel(dc_f[i]), 0);
    }
    for (int i = 0; i < DC_FIBERS; i++) CHECK_EQ(async_fiber_join(dc_f[i], BOUND_MS), 0);
    CHECK_EQ(atomic_load(&dc_other), 0);
    CHECK_EQ(atomic_load(&dc_cancelled) + atomic_load(&dc_timedout), DC_FIBERS);
    CHECK_EQ(atomic_load(&dc_later_ok), DC_FIBERS);
    printf("cancelled %d, timed out %d\n", atomic_load(&dc_cancelled), atomic_load(&dc_timedout));
    async_sched_destroy(s);
}

#define DD_FIBERS 300
typedef struct {
    async_scope_t *outer, *inner;
    int own_ms;
    double t0, t;
    int rc, err;
} dd_t;
static dd_t dd[DD_FIBERS];
static async_chan_t *dd_c;

static void dd_fiber(void *arg) {
    dd_t *d = arg;
    if (d->own_ms >= 0) CHECK_EQ(async_fiber_set_deadline(d->own_ms), 0);
    d->rc = async_chan_recv(dd_c, NULL, -1);
    d->err = async_last_error();
    d->t = now_ms();
}

/* 300 fibers, each under an outer and an inner scope deadline and its own,
 * all 0-3 ms apart: each receive ends once, with TIMEDOUT, never before the
 * earliest of the three. */
CASE(deadline_races_deadlines) { // uring adversarial timeout=120
    async_sched_t *s = sched_new(16);
    dd_c = async_chan_create(1, sizeof(int));
    for (int i = 0; i < DD_FIBERS; i++) {
        dd_t *d = &dd[i];
        int a = i % 4, b = (i / 4) % 4, own = (i / 16) % 5 - 1;
        d->t0 = now_ms();
        d->outer = async_scope_create(s, NULL, a);
        d->inner = async_scope_create(s, d->outer, b);
        d->own_ms = own;
        CHECK(d->outer && d->inner);
        CHECK(async_scope_spawn(d->inner, dd_fiber, d, 0) != NULL);
    }
    CHECK_EQ(async_sched_run(s), 0);
    for (int i = 0; i < DD_FIBERS; i++) {
        dd_t *d = &dd[i];
        int a = i % 4, b = (i / 4) % 4, own = (i / 16) % 5 - 1;
        int first = a < b ? a : b;
        if (own >= 0 && own < first) first = own;
        CHECK_EQ(d->rc, -1);
        CHECK_EQ(d->err, ASYNC_E_TIMEDOUT);
        CHECK(d->t - d->t0 >= first - 1);
        CHECK_EQ(async_scope_join(d->outer, 0), 0);
        CHECK_EQ(async_scope_destroy(d->inner), 0);
        CHECK_EQ(async_scope_destroy(d->outer), 0);
    }
    async_chan_destroy(dd_c);
    async_sched_destroy(s);
}

/* A deadline that has passed fails only the calls that would have to
 * wait: a send to a waiting receiver, a send with room, a receive of a
 * buffered element, a lock of a free mutex and a join of a returned fiber
 * still complete; a sleep (even of 0 ms) and a receive that would wait fail
 * with ASYNC_E_TIMEDOUT. */
typedef struct {
    async_chan_t *rendezvous;
    async_fiber_t *returned;
    async_mutex_t *m;
    int rc[7], err[7];
} past_t;
static atomic_int past_receiver_got;
static void past_receiver(void *arg) {
    async_chan_t *c = arg;
    int v = 0;
    if (async_chan_recv(c, &v, BOUND_MS) == 0 && v == 42) atomic_store(&past_receiver_got, 1);
}
static void past_deadline_calls(void *arg) {
    past_t *p = arg;
    CHECK_EQ(async_fiber_set_deadline(0), 0);
    async_chan_t *b = async_chan_create(1, sizeof(int));
    CHECK(b != NULL);
    int v = 42, i = 0;
#define PAST_CALL(call)                                                                                      \
    do {                                                                                                       \
        async_clear_error();                                                                                   \
        p->rc[i] = (call);                                                                                     \
        p->err[i++] = async_last_error();                                                                      \
    } while (0)
    PAST_CALL(async_chan_send(p->rendezvous, &v, -1));
    PAST_CALL(async_chan_send(b, &v, -1));
    PAST_CALL(async_chan_recv(b, &v, -1));
    PAST_CALL(async_mutex_lock(p->m, -1));
    PAST_CALL(async_fiber_join(p->returned, -1));
    PAST_CALL(async_fiber_sleep(0));
    PAST_CALL(async_chan_recv(b, &v, -1));
#undef PAST_CALL
    CHECK_EQ(async_mutex_unlock(p->m), 0);
    async_chan_destroy(b);
}

CASE(deadline_passed_spares_calls_that_complete_at_once) { // adversarial
    async_sched_t *s = sched_new(2);
    past_t p = {async_chan_create(0, sizeof(int)), NULL, async_mutex_create(), {0}, {0}};
    CHECK(p.rendezvous != NULL && p.m != NULL);
    spawn_until_parked(s, past_receiver, p.rendezvous, 1);
    CHECK((p.returned = async_fiber_spawn(s, nop_fiber, NULL, ASYNC_FIBER_JOINABLE)) != NULL);
    async_sched_stats_t st;
    for (double t0 = now_ms();; sleep_ms(1)) {
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        if (st.fibers_done_unjoined == 1) break;
        CHECK(now_ms() - t0 < BOUND_MS);
    }
    async_fiber_t *f = async_fiber_spawn(s, past_deadline_calls, &p, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    CHECK_EQ(async_fiber_join(f, BOUND_MS), 0);
    for (int i = 0; i < 5; i++) CHECK_EQ(p.rc[i], 0);
    CHECK_EQ(p.rc[5], -1);
    CHECK_EQ(p.err[5], ASYNC_E_TIMEDOUT);
    CHECK_EQ(p.rc[6], -1);
    CHECK_EQ(p.err[6], ASYNC_E_TIMEDOUT);
    CHECK_EQ(atomic_load(&past_receiver_got), 1);
    async_chan_destroy(p.rendezvous);
    async_mutex_destroy(p.m);
    sched_finish(s, BOUND_MS);
}

#if !defined(_WIN32) /* socketpair, poll */
/* A passed deadline spares a socket read that finds data, also after a
 * short read (a read that drained the stream waits first next time, and
 * that wait cannot happen): a plain unix socket and an owned TCP one. */
typedef struct {
    int fd, peer;
    int n, rc[4], err[4];
} past_read_t;
static void past_read_fiber(void *arg) {
    past_read_t *p = arg;
    char buf[8];
    CHECK_EQ(async_fiber_set_deadline(50), 0);
    CHECK_FAIL(async_fiber_read(p->fd, buf, sizeof buf, BOUND_MS) == -1, ASYNC_E_TIMEDOUT);
    for (int i = 0; i < 4; i++) {
        struct pollfd pf = {p->fd, POLLIN, 0};
        CHECK_EQ(write(p->peer, "ab", 2), 2);
        CHECK_EQ(poll(&pf, 1, BOUND_MS), 1);
        async_clear_error();
        p->rc[i] = (int)async_fiber_read(p->fd, buf, sizeof buf, BOUND_MS);
        p->err[i] = async_last_error();
    }
    CHECK_FAIL(async_fiber_read(p->fd, buf, sizeof buf, BOUND_MS) == -1, ASYNC_E_TIMEDOUT);
}

CASE(deadline_passed_spares_a_read_of_data_there) { // uring adversarial
    for (int owned = 0; owned < 2; owned++) {
        async_sched_t *s = sched_new(2);
        int sv[2];
        if (owned) {
            struct sockaddr_in a;
            int l = loopback_listener(1, &a);
            sv[1] = socket(AF_INET, SOCK_STREAM, 0);
            CHECK_EQ(connect(sv[1], (struct sockaddr *)&a, sizeof a), 0);
            sv[0] = accept(l, NULL, NULL);
            CHECK(sv[0] >= 0);
            close(l);
            CHECK_EQ(async_fiber_fd_open(s, sv[0]), 0);
        } else {
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        }
        past_read_t p = {sv[0], sv[1], 0, {0}, {0}};
        async_fiber_t *f = async_fiber_spawn(s, past_read_fiber, &p, ASYNC_FIBER_JOINABLE);
        CHECK(f != NULL);
        CHECK_EQ(async_fiber_join(f, BOUND_MS), 0);
        for (int i = 0; i < 4; i++) {
            CHECK_EQ(p.err[i], 0);
            CHECK_EQ(p.rc[i], 2);
        }
        if (owned)
            CHECK_EQ(async_fiber_close(sv[0]), 0);
        else
            close(sv[0]);
        close(sv[1]);
        sched_finish(s, BOUND_MS);
    }
}
#endif /* !_WIN32 */

TEST_MAIN()
