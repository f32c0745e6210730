/* async_sched_destroy racing the rest of the scheduler's API: spawns from
 * plain threads and from fibers, joins from plain threads, shutdown, run and
 * stats, and host threads sending to channels, spawning, dumping and opening,
 * readying and closing owned fds. The promises under test (include/async.h):
 *   - a spawn that returned a handle has its function run before
 *     async_sched_destroy returns (every accepted fiber runs);
 *   - a spawn that failed because the scheduler is shutting down or being
 *     destroyed says ASYNC_E_CANCELLED (ASYNC_E_BADHANDLE once destroy has
 *     invalidated the handle);
 *   - a join racing destroy returns 0 (the fiber returned) or -1 with
 *     ASYNC_E_BADHANDLE, and never touches freed memory (run under ASan).
 * Every case repeats its race many times; none sleeps to order events. */
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "fibers.h"

#define ROUNDS 60


/* Waits (bounded) until *v >= n. */
static void wait_at_least(atomic_long *v, long n) {
    double t0 = now_ms();
    while (atomic_load(v) < n) {
        CHECK(now_ms() - t0 < 30000);
        sched_yield();
    }
}

static int spawn_err_ok(int e) { return e == ASYNC_E_CANCELLED || e == ASYNC_E_BADHANDLE; }

/* ---- plain threads spawning while destroy runs ------------------------------- */

typedef struct {
    async_sched_t *s;
    atomic_long ran;      /* fibers whose function ran */
    atomic_long accepted; /* spawns that returned a handle */
    atomic_long cancelled;
    atomic_long badhandle;
    atomic_int stop;
} spawn_race_t;

static void count_fiber(void *arg) {
    spawn_race_t *r = arg;
    atomic_fetch_add(&r->ran, 1);
    async_fiber_yield();
}

static void *plain_spawner(void *arg) {
    spawn_race_t *r = arg;
    for (;;) {
        async_clear_error();
        async_fiber_t *f = async_fiber_spawn(r->s, count_fiber, r, 0);
        if (f) {
            atomic_fetch_add(&r->accepted, 1);
            continue;
        }
        int e = async_last_error();
        CHECK(spawn_err_ok(e));
        if (e == ASYNC_E_CANCELLED)
            atomic_fetch_add(&r->cancelled, 1);
        else
            atomic_fetch_add(&r->badhandle, 1);
        /* Once the scheduler refused, every later spawn must fail too. */
        for (int i = 0; i < 100; i++) {
            async_clear_error();
            CHECK(async_fiber_spawn(r->s, count_fiber, r, 0) == NULL);
            CHECK(spawn_err_ok(async_last_error()));
        }
        return NULL;
    }
}

CASE(spawn_vs_destroy) {
    enum { NT = 4 };
    long total = 0;
    for (int round = 0; round < ROUNDS; round++) {
        spawn_race_t r = {0};
        r.s = sched_new(round % 2 ? 2 : 1);
        pthread_t th[NT];
        for (int i = 0; i < NT; i++) CHECK_EQ(pthread_create(&th[i], NULL, plain_spawner, &r), 0);
        wait_at_least(&r.accepted, 50 + 10 * (round % 7));
        async_sched_destroy(r.s);
        for (int i = 0; i < NT; i++) CHECK_EQ(pthread_join(th[i], NULL), 0);
        /* destroy waited for every fiber it accepted */
        CHECK_EQ(atomic_load(&r.ran), atomic_load(&r.accepted));
        CHECK_EQ(atomic_load(&r.cancelled) + atomic_load(&r.badhandle), NT);
        total += atomic_load(&r.accepted);
    }
    printf("%ld spawns accepted in %d rounds\n", total, ROUNDS);
}

/* ---- fibers spawning fibers while destroy runs ------------------------------------ */

typedef struct {
    async_sched_t *s;  /* the scheduler being destroyed */
    async_sched_t *s2; /* another scheduler whose fibers spawn on s */
    atomic_long ran, accepted, refused, spawners_done;
} fiber_race_t;

static void count_fiber2(void *arg) {
    fiber_race_t *r = arg;
    atomic_fetch_add(&r->ran, 1);
    async_fiber_yield();
}

static void fiber_spawner(void *arg) {
    fiber_race_t *r = arg;
    for (long n = 0;; n++) {
        async_clear_error();
        if (async_fiber_spawn(r->s, count_fiber2, r, 0)) {
            atomic_fetch_add(&r->accepted, 1);
            if (n % 4 == 0) async_fiber_yield();
            continue;
        }
        CHECK(spawn_err_ok(async_last_error()));
        atomic_fetch_add(&r->refused, 1);
        break;
    }
    atomic_fetch_add(&r->spawners_done, 1);
}

CASE(fiber_spawn_vs_destroy) {
    enum { NF = 3, NF2 = 2 };
    async_sched_t *s2 = sched_new(1);
    for (int round = 0; round < ROUNDS; round++) {
        fiber_race_t r = {0};
        r.s = sched_new(round % 2 ? 2 : 1);
        r.s2 = s2;
        /* spawners on s itself (they are live: destroy waits for them) and
         * on s2 (they pin s for each spawn) */
        for (int i = 0; i < NF; i++) CHECK(async_fiber_spawn(r.s, fiber_spawner, &r, 0) != NULL);
        for (int i = 0; i < NF2; i++) CHECK(async_fiber_spawn(s2, fiber_spawner, &r, 0) != NULL);
        wait_at_least(&r.accepted, 100 + 10 * (round % 7));
        async_sched_destroy(r.s);
        /* s's spawners have returned (destroy waited); s2's stop at their
         * first refusal, which is BADHANDLE at the latest now */
        wait_at_least(&r.spawners_done, NF + NF2);
        CHECK_EQ(atomic_load(&r.ran), atomic_load(&r.accepted));
        CHECK_EQ(atomic_load(&r.refused), NF + NF2);
    }
    CHECK_EQ(async_sched_run(s2), 0);
    async_sched_destroy(s2);
}

/* ---- plain threads joining while destroy runs --------------------------------------- */

enum { JF = 64, JT = 4 };

typedef struct {
    async_sched_t *s;
    async_fiber_t *f[JF];
    atomic_long ran, joined, badhandle, started;
} join_race_t;

static void join_target(void *arg) {
    join_race_t *r = arg;
    atomic_fetch_add(&r->ran, 1);
    /* parked until shutdown cancels it (or a few yields for some) */
    if (atomic_load(&r->ran) % 2)
        async_fiber_sleep(60000);
    else
        for (int i = 0; i < 3; i++) async_fiber_yield();
}

typedef struct {
    join_race_t *r;
    int first;
} joiner_arg_t;

static void *plain_joiner(void *arg) {
    joiner_arg_t *a = arg;
    join_race_t *r = a->r;
    atomic_fetch_add(&r->started, 1);
    for (int i = a->first; i < JF; i += JT) {
        async_clear_error();
        int rc = async_fiber_join(r->f[i], 30000);
        if (rc == 0) {
            atomic_fetch_add(&r->joined, 1);
        } else {
            CHECK_EQ(rc, -1);
            CHECK_ERR(ASYNC_E_BADHANDLE);
            atomic_fetch_add(&r->badhandle, 1);
        }
    }
    return NULL;
}

CASE(join_vs_destroy) {
    long joined = 0, bad = 0;
    for (int round = 0; round < ROUNDS; round++) {
        join_race_t r = {0};
        r.s = sched_new(round % 2 ? 2 : 1);
        for (int i = 0; i < JF; i++) CHECK((r.f[i] = async_fiber_spawn(r.s, join_target, &r, ASYNC_FIBER_JOINABLE)));
        wait_at_least(&r.ran, JF);
        pthread_t th[JT];
        joiner_arg_t a[JT];
        for (int i = 0; i < JT; i++) {
            a[i] = (joiner_arg_t){&r, i};
            CHECK_EQ(pthread_create(&th[i], NULL, plain_joiner, &a[i]), 0);
        }
        wait_at_least(&r.started, JT);
        async_sched_destroy(r.s);
        for (int i = 0; i < JT; i++) CHECK_EQ(pthread_join(th[i], NULL), 0);
        CHECK_EQ(atomic_load(&r.joined) + atomic_load(&r.badhandle), JF);
        joined += atomic_load(&r.joined);
        bad += atomic_load(&r.badhandle);
    }
    printf("joins: %ld returned 0, %ld BADHANDLE\n", joined, bad);
}

/* ---- shutdown, run, stats and a second destroy racing destroy ---------------------- */

typedef struct {
    async_sched_t *s;
    int kind;
    atomic_long *started;
} other_arg_t;

static void sleeper(void *arg) {
    (void)arg;
    async_fiber_sleep(60000);
}

static void *other_caller(void *arg) {
    other_arg_t *a = arg;
    atomic_fetch_add(a->started, 1);
    async_clear_error();
    switch (a->kind) {
    case 0: {
        int rc = async_sched_shutdown(a->s, 30000);
        if (rc != 0) CHECK_ERR(ASYNC_E_BADHANDLE);
        break;
    }
    case 1: {
        int rc = async_sched_run(a->s);
        if (rc != 0) CHECK_ERR(ASYNC_E_BADHANDLE);
        break;
    }
    case 2:
        for (int i = 0; i < 200; i++) {
            async_sched_stats_t st;
            async_clear_error();
            if (async_sched_get_stats(a->s, &st, NULL, 0) < 0) {
                CHECK_ERR(ASYNC_E_BADHANDLE);
                break;
            }
        }
        break;
    case 3:
        async_sched_destroy(a->s); /* the second destroy: BADHANDLE or first */
        break;
    }
    return NULL;
}

CASE(shutdown_vs_destroy) {
    for (int round = 0; round < ROUNDS; round++) {
        async_sched_t *s = sched_new(round % 2 ? 2 : 1);
        for (int i = 0; i < 16; i++) CHECK(async_fiber_spawn(s, sleeper, NULL, i % 2 ? ASYNC_FIBER_JOINABLE : 0));
        atomic_long started = 0;
        pthread_t th[4];
        other_arg_t a[4];
        for (int i = 0; i < 4; i++) {
            a[i] = (other_arg_t){s, i, &started};
            CHECK_EQ(pthread_create(&th[i], NULL, other_caller, &a[i]), 0);
        }
        wait_at_least(&started, 4);
        async_sched_destroy(s);
        for (int i = 0; i < 4; i++) CHECK_EQ(pthread_join(th[i], NULL), 0);
        async_clear_error();
        CHECK(async_fiber_spawn(s, sleeper, NULL, 0) == NULL);
        CHECK_ERR(ASYNC_E_BADHANDLE);
    }
}

/* ---- plain threads waking fibers of s (channel sends) while destroy runs ----------- */

typedef struct {
    async_sched_t *s;
    async_chan_t *c;
    atomic_long sent, received;
    atomic_int stop;
} wake_race_t;

static void chan_receiver(void *arg) {
    wake_race_t *r = arg;
    long v;
    /* ends at the first CANCELLED (destroy's shutdown) */
    while (async_chan_recv(r->c, &v, -1) == 0) atomic_fetch_add(&r->received, 1);
    CHECK_ERR(ASYNC_E_CANCELLED);
}

static void *chan_sender(void *arg) {
    wake_race_t *r = arg;
    long v = 1;
    while (!atomic_load(&r->stop)) {
        async_clear_error();
        if (async_chan_send(r->c, &v, 50) == 0)
            atomic_fetch_add(&r->sent, 1);
        else
            CHECK_ERR(ASYNC_E_TIMEDOUT);
    }
    return NULL;
}

CASE(wake_vs_destroy) {
    enum { NR = 8, NS = 3 };
    for (int round = 0; round < ROUNDS; round++) {
        wake_race_t r = {0};
        r.s = sched_new(round % 2 ? 2 : 1);
        CHECK((r.c = async_chan_create(0, sizeof(long))));
        for (int i = 0; i < NR; i++) CHECK(async_fiber_spawn(r.s, chan_receiver, &r, 0));
        pthread_t th[NS];
        for (int i = 0; i < NS; i++) CHECK_EQ(pthread_create(&th[i], NULL, chan_sender, &r), 0);
        wait_at_least(&r.received, 200 + 37 * (round % 7));
        async_sched_destroy(r.s);
        atomic_store(&r.stop, 1);
        for (int i = 0; i < NS; i++) CHECK_EQ(pthread_join(th[i], NULL), 0);
        /* rendezvous: a send returned 0 only when a receiver took the element */
        CHECK_EQ(atomic_load(&r.received), atomic_load(&r.sent));
        async_chan_destroy(r.c);
    }
}

/* ---- the documented order: CANCELLED from the moment shutdown began ---------------- */

static atomic_int cancel_seen;

static void spawn_after_shutdown(void *arg) {
    async_sched_t *s = arg;
    /* parked until the shutdown cancels it; then spawning on s must fail */
    CHECK_EQ(async_fiber_sleep(60000), -1);
    CHECK_ERR(ASYNC_E_CANCELLED);
    async_clear_error();
    CHECK(async_fiber_spawn(s, sleeper, NULL, 0) == NULL);
    CHECK_ERR(ASYNC_E_CANCELLED);
    atomic_store(&cancel_seen, 1);
}

CASE(spawn_cancelled) {
    async_sched_t *s = sched_new(2);
    CHECK(async_fiber_spawn(s, spawn_after_shutdown, s, 0));
    CHECK_EQ(async_sched_shutdown(s, 30000), 0);
    CHECK_EQ(atomic_load(&cancel_seen), 1);
    CHECK_FAIL(async_fiber_spawn(s, sleeper, NULL, 0) == NULL, ASYNC_E_CANCELLED);
    async_sched_destroy(s);
    CHECK_FAIL(async_fiber_spawn(s, sleeper, NULL, 0) == NULL, ASYNC_E_BADHANDLE);
}

/* ---- host threads sending, spawning, dumping and closing while destroy runs ---------- */

typedef struct {
    async_sched_t *s;
    async_chan_t *c;
    int devnull;
    atomic_int stop;
} dr_t;

static void dr_fiber(void *arg)
{
    dr_t *d = arg;
    int v;
    while (async_chan_recv(d->c, &v, 1000) == 0 || async_last_error() == ASYNC_E_TIMEDOUT) {
    }
}

static void dr_fd_fiber(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b;
    (void)async_fiber_read(fd, &b, 1, 1000);
}

static void *dr_host(void *arg)
{
    dr_t *d = arg;
    unsigned seed = (unsigned)(uintptr_t)pthread_self();
    while (!atomic_load(&d->stop)) {
        int v = 1;
        int pick = rand_r(&seed) % 4;
        /* Under TSan no fd branch: its fiber may read the number after the
         * close (it had not started), a race on the fd TSan reports. */
        if (ASYNC_TEST_TSAN && pick == 2) pick = 3;
        switch (pick) {
        case 3: {
            /* a dump racing the parks, wake-ups and the destroy */
            int r = async_sched_dump(d->s, d->devnull);
            if (r < 0) CHECK_ERR(ASYNC_E_BADHANDLE);
            async_sched_stats_t st;
            if (async_sched_get_stats(d->s, &st, NULL, 0) != 0) CHECK_ERR(ASYNC_E_BADHANDLE);
            break;
        }
        case 0:
            (void)async_chan_try_send(d->c, &v);
            break;
        case 1: {
            async_fiber_t *f = async_fiber_spawn(d->s, dr_fiber, d, 0);
            if (!f) {
                int e = async_last_error();
                CHECK(e == ASYNC_E_CANCELLED || e == ASYNC_E_BADHANDLE);
            }
            break;
        }
        default: {
            int sv[2];
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
            int owned = async_fiber_fd_open(d->s, sv[1]) == 0;
            async_fiber_t *f = async_fiber_spawn(d->s, dr_fd_fiber, (void *)(intptr_t)sv[1], 0);
            (void)f;
            (void)write(sv[0], "q", 1);
            (void)owned;
            /* the fiber may still be parked on it: async_fiber_close wakes it */
            CHECK_EQ(async_fiber_close(sv[1]), 0);
            close(sv[0]);
        }
        }
    }
    return NULL;
}

CASE(destroy_vs_host_wakes) // uring adversarial
{
    for (int round = 0; round < 30; round++) {
        dr_t d;
        d.s = sched_new(1 + round % 2);
        d.c = async_chan_create(8, sizeof(int));
        CHECK(d.c != NULL);
        atomic_store(&d.stop, 0);
        d.devnull = open("/dev/null", O_WRONLY);
        CHECK(d.devnull >= 0);
        for (int i = 0; i < 8; i++) CHECK(async_fiber_spawn(d.s, dr_fiber, &d, 0) != NULL);
        pthread_t th[3];
        for (int i = 0; i < 3; i++) start_thread(&th[i], dr_host, &d);
        usleep(5000 + 1000 * (round % 7));
        async_chan_close(d.c); /* dr_fiber loops end */
        async_sched_destroy(d.s);
        atomic_store(&d.stop, 1);
        for (int i = 0; i < 3; i++) join_within(th[i], BOUND_MS, "host thread");
        async_chan_destroy(d.c);
        close(d.devnull);
    }
}

TEST_MAIN()
