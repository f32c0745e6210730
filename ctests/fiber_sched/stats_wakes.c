/* The scheduler's stats against every kind of park: the moment the stats
 * count a fiber parked, the wake sent from the host (a send of 0 ms, an
 * unlock, a condition variable's signal, a signal, a byte written,
 * async_fiber_close, async_fiber_cancel) reaches it, on 1, 2 and 16
 * workers. A lost wake shows as a waiter still parked after 5 s. */
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "fibers.h"

#define ROUNDS 300
#define WAKE_MS 5000

static atomic_int got;
static atomic_int bad;
static atomic_int gen; /* the round the host has prepared */

/* One kind of park: park(i) runs on a fiber and returns 0 when the park
 * ended as the wake means; wake(i) runs on the host once `parked` fibers
 * are counted parked; prepare(i) and after(i) (either may be NULL) run on
 * the host before and after each round. A kind with fresh set runs each
 * round on a new joinable fiber (its handle in cur). */
typedef struct {
    int (*park)(int i);
    void (*prepare)(int i);
    void (*wake)(int i);
    size_t parked;
    int fresh;
    void (*after)(int i);
} park_kind_t;

static const park_kind_t *kind;
static async_fiber_t *cur;
static async_sched_t *owner_s; /* the scheduler of the round in progress */

static void park_once(void *arg)
{
    int i = (int)(intptr_t)arg;
    if (kind->park(i) != 0)
        atomic_fetch_add(&bad, 1);
    atomic_fetch_add(&got, 1);
}

/* Waits (yielding: counted running, not parked) until the host prepared
 * round i, then parks ROUNDS times. */
static void park_loop(void *arg)
{
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        while (atomic_load(&gen) <= i)
            async_fiber_yield();
        park_once((void *)(intptr_t)i);
    }
}

static void run_kind(const park_kind_t *k, int workers)
{
    async_sched_t *s = sched_new(workers);
    owner_s = s;
    kind = k;
    atomic_store(&got, 0);
    atomic_store(&bad, 0);
    atomic_store(&gen, 0);
    if (!k->fresh)
        CHECK(async_fiber_spawn(s, park_loop, NULL, 0) != NULL);
    for (int i = 0; i < ROUNDS; i++) {
        if (k->prepare)
            k->prepare(i);
        if (k->fresh)
            CHECK((cur = async_fiber_spawn(s, park_once, (void *)(intptr_t)i, ASYNC_FIBER_JOINABLE)) != NULL);
        else
            atomic_store(&gen, i + 1);
        sched_spin_parked(s, k->parked);
        k->wake(i);
        wait_count_within(&got, i + 1, WAKE_MS, "the woken fiber returned from its park");
        if (k->fresh)
            CHECK_EQ(async_fiber_join(cur, WAKE_MS), 0);
        if (k->after)
            k->after(i);
    }
    CHECK_EQ(atomic_load(&bad), 0);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
}

static void run_all_widths(const park_kind_t *k)
{
    run_kind(k, 1);
    run_kind(k, 2);
    run_kind(k, 16);
}

/* ---- channels: send, select ---- */
static async_chan_t *ch[2];

static void chans_open(void)
{
    for (int j = 0; j < 2; j++)
        CHECK((ch[j] = async_chan_create(0, sizeof(int))) != NULL);
}

static void chans_close(void)
{
    for (int j = 0; j < 2; j++)
        async_chan_destroy(ch[j]);
}

static int send_park(int i) { return async_chan_send(ch[0], &i, BOUND_MS); }

static void send_wake(int i)
{
    int v = -1;
    CHECK_EQ(async_chan_recv(ch[0], &v, 0), 0);
    CHECK_EQ(v, i);
}

CASE(parked_chan_sender_takes_a_receive_of_0ms) // adversarial
{
    static const park_kind_t k = {send_park, NULL, send_wake, 1, 0, NULL};
    chans_open();
    run_all_widths(&k);
    chans_close();
}

static int recv_park(int i)
{
    int v = -1;
    return async_chan_recv(ch[0], &v, BOUND_MS) == 0 && v == i ? 0 : -1;
}

static void recv_wake(int i) { CHECK_EQ(async_chan_send(ch[0], &i, 0), 0); }

CASE(parked_chan_receiver_takes_a_send_of_0ms) // adversarial
{
    static const park_kind_t k = {recv_park, NULL, recv_wake, 1, 0, NULL};
    chans_open();
    run_all_widths(&k);
    chans_close();
}

static int select_park(int i)
{
    int a = -1, b = -1;
    async_chan_op_t ops[2] = {{ch[0], ASYNC_CHAN_RECV, &a, 0}, {ch[1], ASYNC_CHAN_RECV, &b, 0}};
    int r = async_chan_select(ops, 2, BOUND_MS);
    return r == i % 2 && (r == 0 ? a : b) == i ? 0 : -1;
}

static void select_wake(int i) { CHECK_EQ(async_chan_send(ch[i % 2], &i, 0), 0); }

CASE(parked_select_takes_a_send_of_0ms) // adversarial
{
    static const park_kind_t k = {select_park, NULL, select_wake, 1, 0, NULL};
    chans_open();
    run_all_widths(&k);
    chans_close();
}

/* ---- mutex: the host holds it, the fiber waits to lock ---- */
static async_mutex_t *mx;

static int lock_park(int i)
{
    (void)i;
    if (async_mutex_lock(mx, BOUND_MS) != 0)
        return -1;
    return async_mutex_unlock(mx);
}

static void lock_prepare(int i)
{
    (void)i;
    CHECK_EQ(async_mutex_lock(mx, BOUND_MS), 0);
}

static void lock_wake(int i)
{
    (void)i;
    CHECK_EQ(async_mutex_unlock(mx), 0);
}

CASE(parked_mutex_locker_takes_the_unlock) // adversarial
{
    static const park_kind_t k = {lock_park, lock_prepare, lock_wake, 1, 0, NULL};
    CHECK((mx = async_mutex_create()) != NULL);
    run_all_widths(&k);
    async_mutex_destroy(mx);
}

/* ---- condition variable: its signal is not taken under the waiter's
 * mutex, so a signal sent before the waiter is queued wakes nobody ---- */
static async_mutex_t *cv_m;
static async_cond_t *cv_c;
static atomic_int cv_sig; /* the rounds signalled */

static int cond_park(int i)
{
    int r = 0;
    CHECK_EQ(async_mutex_lock(cv_m, -1), 0);
    while (r == 0 && atomic_load(&cv_sig) <= i)
        r = async_cond_wait(cv_c, cv_m, BOUND_MS);
    CHECK_EQ(async_mutex_unlock(cv_m), 0);
    return r;
}

static void cond_wake(int i)
{
    atomic_store(&cv_sig, i + 1);
    CHECK_EQ(async_cond_signal(cv_c), 0);
}

CASE(parked_cond_waiter_takes_the_signal) // adversarial
{
    static const park_kind_t k = {cond_park, NULL, cond_wake, 1, 0, NULL};
    CHECK((cv_m = async_mutex_create()) != NULL);
    CHECK((cv_c = async_cond_create()) != NULL);
    static const int widths[] = {1, 2, 16}; /* as run_all_widths, the signalled rounds counted afresh */
    for (size_t j = 0; j < sizeof widths / sizeof widths[0]; j++) {
        atomic_store(&cv_sig, 0);
        run_kind(&k, widths[j]);
    }
    async_cond_destroy(cv_c);
    async_mutex_destroy(cv_m);
}

/* ---- sleep, ended by a cancel ---- */
static int sleep_park(int i)
{
    (void)i;
    return async_fiber_sleep(BOUND_MS) == -1 && async_last_error() == ASYNC_E_CANCELLED ? 0 : -1;
}

static void cancel_wake(int i)
{
    (void)i;
    CHECK_EQ(async_fiber_cancel(cur), 0);
}

CASE(parked_sleeper_takes_a_cancel) // adversarial
{
    static const park_kind_t k = {sleep_park, NULL, cancel_wake, 1, 1, NULL};
    run_all_widths(&k);
}

/* ---- fd waits: a plain socket (both I/O paths), an owned one ---- */
static int sv[2];

static int read_park(int i)
{
    char c = 0;
    return async_fiber_read(sv[0], &c, 1, BOUND_MS) == 1 && c == (char)i ? 0 : -1;
}

static void byte_wake(int i)
{
    char c = (char)i;
    CHECK_EQ(write(sv[1], &c, 1), 1);
}

static void fd_kind(void)
{
    static const park_kind_t k = {read_park, NULL, byte_wake, 1, 0, NULL};
    for (int w = 0; w < 3; w++) {
        int workers = w == 0 ? 1 : w == 1 ? 2 : 16;
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        run_kind(&k, workers);
        close_pair(sv);
    }
}

CASE(parked_socket_reader_takes_a_byte) // adversarial uring
{
    fd_kind();
}

static int owned_read_park(int i)
{
    if (i == 0 && async_fiber_fd_open(NULL, sv[0]) != 0)
        return -1;
    return read_park(i);
}

CASE(parked_owned_reader_takes_a_byte) // adversarial
{
    static const park_kind_t k = {owned_read_park, NULL, byte_wake, 1, 0, NULL};
    for (int w = 0; w < 3; w++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        run_kind(&k, w == 0 ? 1 : w == 1 ? 2 : 16);
        CHECK_EQ(async_fiber_close(sv[0]), 0);
        close(sv[1]);
    }
}

/* a fresh owned socket each round, closed under the parked reader */
static int closed_read_park(int i)
{
    (void)i;
    char c;
    return async_fiber_read(sv[0], &c, 1, BOUND_MS) == -1 && async_last_error() == ASYNC_E_CLOSED ? 0 : -1;
}

static void closed_prepare(int i)
{
    (void)i;
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
}

static void close_wake(int i)
{
    (void)i;
    CHECK_EQ(async_fiber_close(sv[0]), 0);
    close(sv[1]);
}

static void closed_prepare_owned(int i)
{
    closed_prepare(i);
    CHECK_EQ(async_fiber_fd_open(owner_s, sv[0]), 0);
}

CASE(parked_owned_reader_takes_async_fiber_close) // adversarial
{
    static const park_kind_t k = {closed_read_park, closed_prepare_owned, close_wake, 1, 1, NULL};
    run_all_widths(&k);
}

static int cancelled_read_park(int i)
{
    (void)i;
    char c;
    return async_fiber_read(sv[0], &c, 1, BOUND_MS) == -1 && async_last_error() == ASYNC_E_CANCELLED ? 0 : -1;
}

CASE(parked_socket_reader_takes_a_cancel) // adversarial uring
{
    static const park_kind_t k = {cancelled_read_park, NULL, cancel_wake, 1, 1, NULL};
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    run_all_widths(&k);
    close_pair(sv);
}

/* writers on a full socket, woken by the host draining it (prepare fills
 * it again each round) */
static void fill_writer_end(int i)
{
    (void)i;
    static char junk[65536];
    /* MSG_DONTWAIT: the socket stays blocking, so io_uring's send waits in
     * the ring (an O_NONBLOCK socket's would fail at once) */
    while (send(sv[0], junk, sizeof junk, MSG_DONTWAIT) > 0) {
    }
    while (send(sv[0], junk, 1, MSG_DONTWAIT) > 0) {
    }
}

static int write_park(int i)
{
    (void)i;
    return async_fiber_write(sv[0], "w", 1, BOUND_MS) == 1 ? 0 : -1;
}

static int wait_both_park(int i)
{
    (void)i;
    int ev = async_fiber_wait_fd(sv[0], ASYNC_EVENT_READ | ASYNC_EVENT_WRITE, BOUND_MS);
    return ev > 0 && (ev & ASYNC_EVENT_WRITE) ? 0 : -1;
}

static void drain_wake(int i)
{
    (void)i;
    static char b[65536];
    while (read(sv[1], b, sizeof b) > 0) {
    }
}

static void writer_kind(int (*park)(int))
{
    park_kind_t k = {park, fill_writer_end, drain_wake, 1, 0, NULL};
    for (int w = 0; w < 3; w++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        CHECK_EQ(fcntl(sv[1], F_SETFL, O_NONBLOCK), 0);
        run_kind(&k, w == 0 ? 1 : w == 1 ? 2 : 16);
        close_pair(sv);
    }
}

CASE(parked_socket_writer_takes_room) // adversarial uring
{
    writer_kind(write_park);
}

static int cancelled_write_park(int i)
{
    (void)i;
    return async_fiber_write(sv[0], "w", 1, BOUND_MS) == -1 && async_last_error() == ASYNC_E_CANCELLED ? 0 : -1;
}

/* a fresh socket each round: a cancelled write leaves its stream unusable */
static void full_pair_prepare(int i)
{
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fill_writer_end(i);
}

static void close_full_pair(int i)
{
    (void)i;
    close_pair(sv);
}

CASE(parked_socket_writer_takes_a_cancel) // adversarial uring
{
    static const park_kind_t k = {cancelled_write_park, full_pair_prepare, cancel_wake, 1, 1, close_full_pair};
    run_all_widths(&k);
}

CASE(parked_read_write_waiter_takes_room) // adversarial
{
    writer_kind(wait_both_park);
}

/* ---- wait_signal ---- */
static int signal_park(int i)
{
    (void)i;
    return async_fiber_wait_signal(SIGUSR1, BOUND_MS) >= 1 ? 0 : -1;
}

static void signal_wake(int i)
{
    (void)i;
    CHECK_EQ(kill(getpid(), SIGUSR1), 0);
}

CASE(parked_signal_waiter_takes_the_signal) // adversarial linux
{
    static const park_kind_t k = {signal_park, NULL, signal_wake, 1, 0, NULL};
    CHECK_EQ(async_fiber_watch_signal(SIGUSR1), 0);
    run_all_widths(&k);
    CHECK_EQ(async_fiber_unwatch_signal(SIGUSR1), 0);
}

/* ---- join and scope join: the joiner and its target both parked ---- */

static void recv_one(void *arg)
{
    (void)arg;
    int v;
    if (async_chan_recv(ch[0], &v, BOUND_MS) != 0)
        atomic_fetch_add(&bad, 1);
}

static int join_park(int i)
{
    (void)i;
    async_fiber_t *t = async_fiber_spawn(owner_s, recv_one, NULL, ASYNC_FIBER_JOINABLE);
    return t != NULL && async_fiber_join(t, BOUND_MS) == 0 ? 0 : -1;
}

static int scope_join_park(int i)
{
    (void)i;
    async_scope_t *sc = async_scope_create(owner_s, NULL, -1);
    if (sc == NULL || async_scope_spawn(sc, recv_one, NULL, 0) == NULL)
        return -1;
    int r = async_scope_join(sc, BOUND_MS);
    return r == 0 && async_scope_destroy(sc) == 0 ? 0 : -1;
}

static void chan_wake(int i) { CHECK_EQ(async_chan_send(ch[0], &i, 0), 0); }

static void joins(int (*park)(int))
{
    park_kind_t k = {park, NULL, chan_wake, 2, 0, NULL};
    chans_open();
    run_all_widths(&k);
    chans_close();
}

CASE(parked_joiner_wakes_when_its_target_takes_a_send) // adversarial
{
    joins(join_park);
}

CASE(parked_scope_joiner_wakes_when_its_fiber_takes_a_send) // adversarial
{
    joins(scope_join_park);
}

/* ---- many fibers counted parked at once ---- */
#define MANY 64

static async_chan_t *many_ch[MANY];

static void many_receiver(void *arg)
{
    async_chan_t *c = arg;
    for (int i = 0; i < 50; i++) {
        int v = -1;
        if (async_chan_recv(c, &v, BOUND_MS) != 0 || v != i)
            atomic_fetch_add(&bad, 1);
        atomic_fetch_add(&got, 1);
    }
}

CASE(all_fibers_counted_parked_take_sends_of_0ms) // adversarial
{
    for (int w = 0; w < 3; w++) {
        async_sched_t *s = sched_new(w == 0 ? 1 : w == 1 ? 2 : 16);
        atomic_store(&got, 0);
        atomic_store(&bad, 0);
        for (int j = 0; j < MANY; j++) {
            CHECK((many_ch[j] = async_chan_create(0, sizeof(int))) != NULL);
            CHECK(async_fiber_spawn(s, many_receiver, many_ch[j], 0) != NULL);
        }
        for (int i = 0; i < 50; i++) {
            sched_spin_parked(s, MANY);
            for (int j = 0; j < MANY; j++)
                CHECK_EQ(async_chan_send(many_ch[j], &i, 0), 0);
            wait_count_within(&got, (i + 1) * MANY, WAKE_MS, "every receiver took its value");
        }
        CHECK_EQ(atomic_load(&bad), 0);
        CHECK_EQ(async_sched_run(s), 0);
        async_sched_destroy(s);
        for (int j = 0; j < MANY; j++)
            async_chan_destroy(many_ch[j]);
    }
}

/* ---- the state counts add up to the live fibers ---- */
static void hold(void *arg)
{
    int v;
    async_chan_recv(arg, &v, BOUND_MS);
}

CASE(state_counts_add_up_to_live_fibers) // adversarial
{
    async_sched_t *s = sched_new(2);
    async_chan_t *c = async_chan_create(0, sizeof(int));
    CHECK(c != NULL);
    async_fiber_t *j[4];
    for (int i = 0; i < 4; i++)
        CHECK((j[i] = async_fiber_spawn(s, nop_fiber, NULL, ASYNC_FIBER_JOINABLE)) != NULL);
    for (int i = 0; i < 8; i++)
        CHECK(async_fiber_spawn(s, hold, c, 0) != NULL);
    sched_wait_parked(s, 8);
    async_sched_stats_t st;
    double t0 = now_ms();
    do {
        CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
        CHECK(now_ms() - t0 < BOUND_MS);
    } while (st.fibers_done_unjoined != 4);
    CHECK_EQ(st.fibers_spawned, 12);
    CHECK_EQ(st.fibers_finished, 4);
    CHECK_EQ(st.fibers_runnable + st.fibers_running + st.fibers_parked + st.fibers_done_unjoined, 12);
    for (int i = 0; i < 8; i++)
        CHECK_EQ(async_chan_send(c, &i, BOUND_MS), 0);
    for (int i = 0; i < 4; i++)
        CHECK_EQ(async_fiber_join(j[i], BOUND_MS), 0);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
    CHECK_EQ(st.fibers_runnable + st.fibers_running + st.fibers_parked + st.fibers_done_unjoined, 0);
    async_sched_destroy(s);
    async_chan_destroy(c);
}

TEST_MAIN()
