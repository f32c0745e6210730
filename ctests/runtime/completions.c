/* Completions through async_runtime_post_completion: delivered once each,
 * in order per producer, max_events respected, from one thread or eight
 * (every wait shape: blocking, timed, zero), with an exact
 * completions_pending at quiet points; a backlog of completions starves
 * neither fds nor timers, and several runtimes stay apart. */
#include "check.h"
#include "rt.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

static int ctx_a; /* a context for fd registrations */

/* --- completions -------------------------------------------------------- */

CASE(post_basic) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[8];
    int n;
    CHECK_EQ(async_runtime_post_completion(rt, UINTPTR_MAX, 0), 0);
    CHECK_EQ(async_runtime_post_completion(rt, 0, UINTPTR_MAX), 0);
    CHECK_EQ(async_runtime_post_completion(rt, (uintptr_t)0x8000000000000001ull, (uintptr_t)0x123456789ull), 0);
    n = wait_some(rt, ev, 8, 5000);
    CHECK_EQ(n, 3);
    CHECK_EQ(ev[0].fd, -1);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_COMPLETION);
    CHECK(ev[0].completion_key == UINTPTR_MAX);
    CHECK(ev[0].data == 0);
    CHECK(ev[1].completion_key == 0);
    CHECK(ev[1].data == UINTPTR_MAX);
    CHECK(ev[2].completion_key == (uintptr_t)0x8000000000000001ull);
    CHECK(ev[2].data == (uintptr_t)0x123456789ull);
    CHECK_EQ(ev[1].event_type, ASYNC_EVENT_COMPLETION);
    CHECK_EQ(ev[2].fd, -1);
    CHECK(ev[0].context == NULL && ev[1].context == NULL && ev[2].context == NULL);
    CHECK_EQ(wait_ok(rt, ev, 8, 0), 0); /* delivered exactly once */
    async_runtime_deinit(rt);
}

#define MPSC_PRODUCERS 8
#define MPSC_POSTS 1000000u
#define MPSC_KEY(p) (((uintptr_t)0xABCD << 48) | (uintptr_t)(p))
#define MPSC_DATA(p, s) ((uintptr_t)0xF000000000000000ull | ((uintptr_t)(p) << 36) | (uintptr_t)(s))

static async_runtime_t *g_mrt;
static pthread_barrier_t g_mbar;

static void *mpsc_producer(void *arg)
{
    uintptr_t p = (uintptr_t)arg;
    uint32_t s;
    pthread_barrier_wait(&g_mbar);
    for (s = 0; s < MPSC_POSTS; s++)
        CHECK_EQ(async_runtime_post_completion(g_mrt, MPSC_KEY(p), MPSC_DATA(p, s)), 0);
    return NULL;
}

CASE(mpsc) // poll timeout=180
{
    pthread_t th[MPSC_PRODUCERS];
    static io_event_t ev[512];
    uint64_t next[MPSC_PRODUCERS] = {0};
    uint64_t total = 0, want = (uint64_t)MPSC_PRODUCERS * MPSC_POSTS;
    int i;
    g_mrt = mkrt();
    CHECK(pthread_barrier_init(&g_mbar, NULL, MPSC_PRODUCERS + 1) == 0);
    for (i = 0; i < MPSC_PRODUCERS; i++)
        CHECK(pthread_create(&th[i], NULL, mpsc_producer, (void *)(uintptr_t)i) == 0);
    pthread_barrier_wait(&g_mbar);
    while (total < want) {
        int n = async_runtime_wait(g_mrt, ev, 512, 20000), k;
        CHECK(n > 0); /* producers are still posting: 20 s without an event is a hang */
        for (k = 0; k < n; k++) {
            uintptr_t p = ev[k].completion_key & 0xFFFF;
            CHECK_EQ(ev[k].event_type, ASYNC_EVENT_COMPLETION);
            CHECK_EQ(ev[k].fd, -1);
            CHECK(ev[k].completion_key == MPSC_KEY(p));
            CHECK(p < MPSC_PRODUCERS);
            /* in order per producer, each exactly once */
            if (ev[k].data != MPSC_DATA(p, next[p])) {
                fprintf(stderr, "producer %u: expected seq %llu, got data %#llx\n", (unsigned)p,
                        (unsigned long long)next[p], (unsigned long long)ev[k].data);
                CHECK(ev[k].data == MPSC_DATA(p, next[p]));
            }
            next[p]++;
        }
        total += (uint64_t)n;
    }
    for (i = 0; i < MPSC_PRODUCERS; i++)
        pthread_join(th[i], NULL);
    for (i = 0; i < MPSC_PRODUCERS; i++)
        CHECK_EQ(next[i], MPSC_POSTS);
    CHECK_EQ(wait_ok(g_mrt, ev, 512, 0), 0);
    pthread_barrier_destroy(&g_mbar);
    async_runtime_deinit(g_mrt);
}

CASE(max_events) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[64];
    uintptr_t i;
    int n;
    for (i = 0; i < 10; i++)
        CHECK_EQ(async_runtime_post_completion(rt, 7, i), 0);
    memset(ev, 0xEE, sizeof ev);
    CHECK_EQ(wait_some(rt, ev, 1, 5000), 1);
    CHECK(ev[0].data == 0);
    CHECK(ev[1].data == (uintptr_t)0xEEEEEEEEEEEEEEEEull); /* only max_events entries written */
    n = wait_some(rt, ev, 3, 5000);
    CHECK_EQ(n, 3);
    for (i = 0; i < 3; i++)
        CHECK(ev[i].data == 1 + i);
    n = wait_some(rt, ev, 64, 5000);
    CHECK_EQ(n, 6);
    for (i = 0; i < 6; i++)
        CHECK(ev[i].data == 4 + i);
    CHECK_EQ(wait_ok(rt, ev, 64, 0), 0);
    /* timers beyond max_events stay queued too */
    CHECK(async_runtime_add_timer(rt, 0, 0, 100) != 0);
    CHECK(async_runtime_add_timer(rt, 0, 0, 101) != 0);
    CHECK_EQ(async_runtime_post_completion(rt, 1, 1), 0);
    sleep_ms(50);
    {
        int got = 0, timers = 0, comps = 0;
        double t0 = now_ms();
        while (got < 3 && now_ms() - t0 < 5000) {
            n = wait_ok(rt, ev, 1, 100);
            if (n == 1) {
                got++;
                timers += ev[0].event_type == ASYNC_EVENT_TIMER;
                comps += ev[0].event_type == ASYNC_EVENT_COMPLETION;
            }
        }
        CHECK_EQ(timers, 2);
        CHECK_EQ(comps, 1);
    }
    CHECK_EQ(wait_ok(rt, ev, 64, 50), 0);
    async_runtime_deinit(rt);
}

CASE(two_runtimes) // poll
{
    async_runtime_t *a = mkrt(), *b = mkrt();
    io_event_t ev[4];
    CHECK(a != b);
    CHECK_EQ(async_runtime_post_completion(a, 1, 2), 0);
    CHECK(async_runtime_add_timer(a, 0, 0, 3) != 0);
    CHECK_EQ(wait_ok(b, ev, 4, 100), 0);
    CHECK_EQ(async_runtime_wakeup(b), 0);
    CHECK_EQ(wait_some(a, ev, 4, 5000) >= 1, 1);
    async_runtime_deinit(a);
    CHECK_EQ(async_runtime_post_completion(b, 4, 5), 0); /* b is still alive */
    CHECK_EQ(wait_some(b, ev, 4, 5000), 1);
    CHECK(ev[0].completion_key == 4 && ev[0].data == 5);
    async_runtime_deinit(b);
}

/* --- mixed sources and lifetime ----------------------------------------- */

CASE(mixed) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[8];
    int p[2], got = 0, fdev = 0, comp = 0, tim = 0;
    double t0 = now_ms();
    uint64_t id;
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], "x", 1) == 1);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_a), 0);
    CHECK_EQ(async_runtime_post_completion(rt, 11, 12), 0);
    id = async_runtime_add_timer(rt, 0, 0, 13);
    CHECK(id != 0);
    while ((comp == 0 || tim == 0 || fdev == 0) && now_ms() - t0 < 5000) {
        int n = wait_ok(rt, ev, 8, 100), i;
        for (i = 0; i < n; i++) {
            switch (ev[i].event_type) {
            case ASYNC_EVENT_COMPLETION:
                CHECK(ev[i].completion_key == 11 && ev[i].data == 12 && ev[i].fd == -1);
                comp++;
                break;
            case ASYNC_EVENT_TIMER:
                CHECK(ev[i].completion_key == 13 && ev[i].data == (uintptr_t)id && ev[i].fd == -1);
                tim++;
                break;
            default:
                CHECK_EQ(ev[i].fd, p[0]);
                CHECK(ev[i].event_type & ASYNC_EVENT_READ);
                CHECK(ev[i].context == (void *)&ctx_a);
                fdev++;
            }
        }
        got += n;
    }
    CHECK_EQ(comp, 1);
    CHECK_EQ(tim, 1);
    CHECK(fdev >= 1);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    async_runtime_deinit(rt);
    close_pair(p);
}

/* A backlog of completions must not starve fds or timers: the wait hands
 * completions out without entering Go only while nothing else can be ready,
 * so with the backlog far from drained, a readable fd and an expired timer
 * still come out within a few calls (the fd after at most 8 skipped polls),
 * and every completion still arrives exactly once, in order per producer. */
#define FLOOD_N 100000
static async_runtime_t *flood_rt;

static void *flood_producer(void *arg)
{
    for (uintptr_t i = 1; i <= FLOOD_N; i++) CHECK_EQ(async_runtime_post_completion(flood_rt, (uintptr_t)arg, i), 0);
    return NULL;
}

static void flood_check(io_event_t *e, uintptr_t *next, int *fdev, int *tim, uint64_t id, int fd)
{
    switch (e->event_type) {
    case ASYNC_EVENT_COMPLETION:
        CHECK(e->completion_key >= 1 && e->completion_key <= 2 && e->fd == -1 && e->context == NULL);
        CHECK_EQ(e->data, next[e->completion_key]);
        next[e->completion_key]++;
        break;
    case ASYNC_EVENT_TIMER:
        CHECK(e->completion_key == 77 && e->data == (uintptr_t)id && e->fd == -1);
        (*tim)++;
        break;
    default:
        CHECK_EQ(e->fd, fd);
        CHECK(e->context == (void *)&ctx_a);
        (*fdev)++;
    }
}

static void flood_case(int max)
{
    async_runtime_t *rt = flood_rt = mkrt();
    io_event_t ev[16];
    uintptr_t next[3] = {1, 1, 1};
    int p[2], fdev = 0, tim = 0, waits = 0;
    pthread_t th;
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], "x", 1) == 1);
    start_thread(&th, flood_producer, (void *)(uintptr_t)2);
    flood_producer((void *)(uintptr_t)1);
    join_within(th, 30000, "flood producer");
    /* The first wait goes through Go; later ones may not. */
    CHECK_EQ(wait_ok(rt, ev, max, 0), max);
    for (int i = 0; i < max; i++) flood_check(&ev[i], next, &fdev, &tim, 0, -1);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, &ctx_a), 0);
    uint64_t id = async_runtime_add_timer(rt, 1, 0, 77);
    CHECK(id != 0);
    usleep(5000); /* the timer is due */
    while ((fdev == 0 || tim == 0) && waits < 1000) {
        int n = wait_ok(rt, ev, max, 1000);
        CHECK(n >= 1 && n <= max);
        waits++;
        for (int i = 0; i < n; i++) flood_check(&ev[i], next, &fdev, &tim, id, p[0]);
    }
    CHECK(tim == 1 && fdev >= 1);
    CHECK(waits <= 40); /* not after the backlog (2 * FLOOD_N / max waits) */
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    for (;;) {
        int n = wait_ok(rt, ev, max, 0);
        if (n == 0) break;
        for (int i = 0; i < n; i++) flood_check(&ev[i], next, &fdev, &tim, id, p[0]);
    }
    CHECK_EQ(next[1], FLOOD_N + 1);
    CHECK_EQ(next[2], FLOOD_N + 1);
    CHECK_EQ(tim, 1);
    async_runtime_deinit(rt);
    close_pair(p);
}

CASE(flood_fair_max1) { flood_case(1); } // poll
CASE(flood_fair_max16) { flood_case(16); } // poll

/* Completions that arrive while the loop is busy come out of the next wait
 * (taken without entering Go), max_events at a time, FIFO, and a timer added
 * in between (which the C side learns of only through Go) is not lost. */
CASE(completions_then_timer) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    for (uintptr_t i = 1; i <= 10; i++) CHECK_EQ(async_runtime_post_completion(rt, 5, i), 0);
    CHECK_EQ(wait_ok(rt, ev, 1, 0), 1);
    CHECK(ev[0].event_type == ASYNC_EVENT_COMPLETION && ev[0].data == 1);
    uint64_t id = async_runtime_add_timer(rt, 0, 0, 9);
    CHECK(id != 0);
    uintptr_t next = 2;
    int tim = 0;
    double t0 = now_ms();
    while ((next <= 10 || !tim) && now_ms() - t0 < 5000) {
        int n = wait_ok(rt, ev, 4, 100);
        CHECK(n <= 4);
        for (int i = 0; i < n; i++) {
            if (ev[i].event_type == ASYNC_EVENT_TIMER) {
                CHECK(ev[i].completion_key == 9);
                tim++;
            } else {
                CHECK(ev[i].event_type == ASYNC_EVENT_COMPLETION && ev[i].completion_key == 5);
                CHECK_EQ(ev[i].data, next);
                next++;
            }
        }
        if (next > 10 && !tim) usleep(1000);
    }
    CHECK_EQ(tim, 1);
    CHECK_EQ(next, 11);
    CHECK_EQ(wait_ok(rt, ev, 4, 0), 0);
    async_runtime_deinit(rt);
}

/* ---- posts from many threads against every wait shape ----------------------- */

#define NPOST 4
#define PER_POST 100000

typedef struct {
    async_runtime_t *rt;
    int id;
    atomic_long *posted; /* posts returned, all threads */
} poster_t;

static void *poster(void *arg)
{
    poster_t *p = arg;
    for (long i = 0; i < PER_POST; i++) {
        CHECK_EQ(async_runtime_post_completion(p->rt, (uintptr_t)p->id, (uintptr_t)i), 0);
        atomic_fetch_add(p->posted, 1);
        if ((i & 1023) == 0)
            sleep_ms(1); /* let the loop fall asleep now and then */
    }
    return NULL;
}

CASE(post_shapes) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    atomic_long posted = 0;
    poster_t ps[NPOST];
    pthread_t th[NPOST];
    long next[NPOST] = {0};
    for (int i = 0; i < NPOST; i++) {
        ps[i] = (poster_t){rt, i, &posted};
        start_thread(&th[i], poster, &ps[i]);
    }
    long got = 0;
    io_event_t ev[MAXEV];
    unsigned it = 0;
    while (got < (long)NPOST * PER_POST) {
        it++;
        int max = 1 + (int)(it % 7);
        int shape = it % 3;
        int timeout = shape == 0 ? 5000 : shape == 1 ? 0 : 3000;
        long before = atomic_load(&posted);
        double t0 = now_ms();
        int n = async_runtime_wait(rt, ev, max, timeout);
        CHECK(n >= 0 && n <= max);
        if (n == 0 && timeout > 0 && got < before && now_ms() - t0 >= timeout) {
            fprintf(stderr, "lost wake-up: %ld posted before a wait(%d) that timed out with %ld delivered\n",
                    before, timeout, got);
            CHECK(0);
        }
        for (int i = 0; i < n; i++) {
            CHECK_EQ(ev[i].event_type, ASYNC_EVENT_COMPLETION);
            CHECK_EQ(ev[i].fd, -1);
            int id = (int)ev[i].completion_key;
            CHECK(id >= 0 && id < NPOST);
            if ((long)ev[i].data != next[id]) {
                fprintf(stderr, "thread %d: got %ld, expected %ld\n", id, (long)ev[i].data, next[id]);
                CHECK_EQ(ev[i].data, next[id]);
            }
            next[id]++;
            got++;
        }
    }
    for (int i = 0; i < NPOST; i++)
        join_within(th[i], 60000, "poster");
    CHECK_EQ(async_runtime_wait(rt, ev, MAXEV, 0), 0);
    async_runtime_stats_t st;
    CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
    CHECK_EQ(st.completions_pending, 0);
    CHECK_EQ(st.events[4], (long)NPOST * PER_POST);
    check_quiet(rt, 0);
    async_runtime_deinit(rt);
}

/* completions_pending is exact when no post runs: checked at quiet points
 * between rounds of short-lived posting threads (their records are
 * orphaned at exit and freed by the loop once delivered) and partial
 * takes of 1..5 events. */
typedef struct {
    async_runtime_t *rt;
    int n;
} shortpost_t;

static void *short_poster(void *arg)
{
    shortpost_t *p = arg;
    for (int i = 0; i < p->n; i++)
        CHECK_EQ(async_runtime_post_completion(p->rt, 1, (uintptr_t)i), 0);
    return NULL;
}

CASE(pending_exact) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    long posted = 0, got = 0;
    unsigned seed = 7;
    io_event_t ev[8];
    async_runtime_stats_t st;
    for (int round = 0; round < 400; round++) {
        int nt = 1 + round % 4;
        pthread_t th[4];
        shortpost_t sp[4];
        for (int i = 0; i < nt; i++) {
            seed = seed * 1103515245u + 12345u;
            sp[i].rt = rt;
            sp[i].n = (int)((seed >> 16) % 600); /* some cross a 4 KiB block */
            posted += sp[i].n;
            start_thread(&th[i], short_poster, &sp[i]);
        }
        for (int i = 0; i < nt; i++)
            join_within(th[i], 10000, "poster");
        /* The main thread posts too (its record lives on). */
        CHECK_EQ(async_runtime_post_completion(rt, 2, 0), 0);
        posted++;
        CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
        CHECK_EQ(st.completions_pending, posted - got);
        int takes = (int)(seed >> 8) % 40;
        for (int k = 0; k < takes; k++) {
            int n = async_runtime_wait(rt, ev, 1 + k % 5, 0);
            CHECK(n >= 0);
            got += n;
            CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
            CHECK_EQ(st.completions_pending, posted - got);
        }
    }
    while (got < posted) {
        int n = async_runtime_wait(rt, ev, 8, 1000);
        CHECK(n > 0);
        got += n;
    }
    CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
    CHECK_EQ(st.completions_pending, 0);
    CHECK_EQ(st.events[4], posted);
    async_runtime_deinit(rt);
}

TEST_MAIN()
