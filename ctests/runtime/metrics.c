/* Loop metrics, async_runtime_get_stats. Every count is checked against
 * what the case itself caused (completions posted, timers fired, fd events
 * returned, SIGNAL events counted as SIGNAL and not as COMPLETION, waits
 * that returned); idle time only loosely
 * (it grows by at least most of a 50 ms sleep, by nothing when no wait may
 * sleep, and never by more than the wall time around the waits). Every case
 * runs on epoll and on the poll backend. */
#include <fcntl.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/socket.h>

#include "check.h"

enum { K_READ = 0, K_WRITE = 1, K_ERROR = 2, K_CLOSE = 3, K_COMPLETION = 4, K_TIMER = 5 };

static async_runtime_stats_t get(async_runtime_t *rt) {
    async_runtime_stats_t st;
    memset(&st, 0xAB, sizeof st);
    CHECK_EQ(async_runtime_get_stats(rt, &st, sizeof st), (int)sizeof st);
    return st;
}

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* What a test saw its waits return, by kind. */
typedef struct {
    uint64_t waits, total, kind[ASYNC_RUNTIME_STATS_EVENT_KINDS];
} seen_t;

static int wait_seen(async_runtime_t *rt, io_event_t *ev, int max, int timeout, seen_t *s) {
    int n = async_runtime_wait(rt, ev, max, timeout);
    CHECK(n >= 0);
    s->waits++;
    s->total += (uint64_t)n;
    for (int i = 0; i < n; i++)
        for (int b = 0; b < ASYNC_RUNTIME_STATS_EVENT_KINDS; b++)
            if (ev[i].event_type & (1u << b)) s->kind[b]++;
    return n;
}

/* The counters moved from a to b by exactly what s saw. */
static void check_seen(const async_runtime_stats_t *a, const async_runtime_stats_t *b, const seen_t *s) {
    CHECK_EQ(b->iterations - a->iterations, s->waits);
    CHECK_EQ(b->events_total - a->events_total, s->total);
    for (int k = 0; k < ASYNC_RUNTIME_STATS_EVENT_KINDS; k++) {
        if (b->events[k] - a->events[k] != s->kind[k]) fprintf(stderr, "kind %d\n", k);
        CHECK_EQ(b->events[k] - a->events[k], s->kind[k]);
    }
}

/* ---- layout and a fresh runtime ----------------------------------------- */

CASE(stats_layout) { // poll
    CHECK_EQ(sizeof(async_runtime_stats_t), ASYNC_RUNTIME_STATS_MIN_SIZE);
    CHECK_EQ(offsetof(async_runtime_stats_t, iterations), 0);
    CHECK_EQ(offsetof(async_runtime_stats_t, idle_time_ns), 8);
    CHECK_EQ(offsetof(async_runtime_stats_t, events_total), 16);
    CHECK_EQ(offsetof(async_runtime_stats_t, events), 24);
    CHECK_EQ(offsetof(async_runtime_stats_t, completions_pending), 24 + 8 * ASYNC_RUNTIME_STATS_EVENT_KINDS);
    CHECK_EQ(offsetof(async_runtime_stats_t, wakeups), ASYNC_RUNTIME_STATS_MIN_SIZE - 8);
    CHECK_EQ(ASYNC_RUNTIME_STATS_EVENT_KINDS, 16);
    CHECK_EQ(ASYNC_EVENT_READ, 1u << K_READ);
    CHECK_EQ(ASYNC_EVENT_TIMER, 1u << K_TIMER);
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    async_runtime_stats_t st = get(rt), zero;
    memset(&zero, 0, sizeof zero);
    CHECK(memcmp(&st, &zero, sizeof st) == 0); /* every counter starts at 0 */
    async_runtime_deinit(rt);
    /* A recycled record starts from 0 again. */
    rt = async_runtime_init();
    CHECK(rt);
    CHECK_EQ(async_runtime_post_completion(rt, 1, 2), 0);
    io_event_t ev[4];
    CHECK_EQ(async_runtime_wait(rt, ev, 4, 0), 1);
    CHECK_EQ(async_runtime_add_timer(rt, 100000, 0, 1) != 0, 1);
    CHECK_EQ(async_runtime_wakeup(rt), 0);
    async_runtime_deinit(rt);
    rt = async_runtime_init();
    CHECK(rt);
    st = get(rt);
    CHECK(memcmp(&st, &zero, sizeof st) == 0);
    async_runtime_deinit(rt);
}

/* ---- bad input ------------------------------------------------------------ */

CASE(stats_badinput) { // poll
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    unsigned char buf[sizeof(async_runtime_stats_t) + 64], ref[sizeof buf];
    async_runtime_stats_t *st = (async_runtime_stats_t *)(void *)buf;
    memset(ref, 0xAB, sizeof ref);
    const size_t bad[] = {0, 1, 8, ASYNC_RUNTIME_STATS_MIN_SIZE - 8, ASYNC_RUNTIME_STATS_MIN_SIZE - 1,
                          ASYNC_RUNTIME_STATS_MIN_SIZE + 4};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(buf, ref, sizeof buf);
        CHECK_FAIL(async_runtime_get_stats(rt, st, bad[i]) == -1, ASYNC_E_INVAL);
        CHECK(memcmp(buf, ref, sizeof buf) == 0); /* untouched */
    }
    CHECK_FAIL(async_runtime_get_stats(rt, NULL, sizeof *st) == -1, ASYNC_E_INVAL);
    /* bad handles, also one of another type */
    memcpy(buf, ref, sizeof buf);
    CHECK_FAIL(async_runtime_get_stats(NULL, st, sizeof *st) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_get_stats((async_runtime_t *)(uintptr_t)0x12345, st, sizeof *st) == -1,
               ASYNC_E_BADHANDLE);
    async_queue_t *q = async_queue_create(4, 8, 0);
    CHECK(q);
    CHECK_FAIL(async_runtime_get_stats((async_runtime_t *)q, st, sizeof *st) == -1, ASYNC_E_BADHANDLE);
    async_queue_destroy(q);
    CHECK(memcmp(buf, ref, sizeof buf) == 0);
    /* A caller's struct larger than the library's (a newer header): the
     * known part filled, the rest zeroed, the filled size returned. */
    CHECK_EQ(async_runtime_post_completion(rt, 1, 1), 0);
    CHECK_EQ(async_runtime_get_stats(rt, st, sizeof buf), (int)sizeof(async_runtime_stats_t));
    CHECK_EQ(st->completions_pending, 1);
    CHECK_EQ(st->iterations, 0);
    for (size_t i = sizeof(async_runtime_stats_t); i < sizeof buf; i++) CHECK_EQ(buf[i], 0);
    /* Exactly the minimum. */
    CHECK_EQ(async_runtime_get_stats(rt, st, ASYNC_RUNTIME_STATS_MIN_SIZE), (int)ASYNC_RUNTIME_STATS_MIN_SIZE);
    /* after deinit */
    async_runtime_deinit(rt);
    memcpy(buf, ref, sizeof buf);
    CHECK_FAIL(async_runtime_get_stats(rt, st, sizeof *st) == -1, ASYNC_E_BADHANDLE);
    CHECK(memcmp(buf, ref, sizeof buf) == 0);
}

/* ---- completions ---------------------------------------------------------- */

CASE(stats_completions) { // poll
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    enum { N = 1000 };
    async_runtime_stats_t a = get(rt);
    for (int i = 0; i < N; i++) CHECK_EQ(async_runtime_post_completion(rt, (uintptr_t)i, 0), 0);
    async_runtime_stats_t b = get(rt);
    CHECK_EQ(b.completions_pending, N);
    CHECK_EQ(b.events_total, 0);
    CHECK_EQ(b.iterations, 0);
    CHECK_EQ(b.doorbell_writes, 0); /* nobody was asleep */
    /* drain in small batches: pending goes down by what each wait returned */
    io_event_t ev[37];
    seen_t s = {0};
    uint64_t got = 0;
    while (got < N) {
        int n = wait_seen(rt, ev, 37, 0, &s);
        got += (uint64_t)n;
        for (int i = 0; i < n; i++) CHECK_EQ(ev[i].event_type, ASYNC_EVENT_COMPLETION);
        CHECK_EQ(get(rt).completions_pending, N - got);
        CHECK(s.waits < 10 * N);
    }
    /* a few empty polls count as iterations too */
    for (int i = 0; i < 5; i++) CHECK_EQ(wait_seen(rt, ev, 37, 0, &s), 0);
    async_runtime_stats_t c = get(rt);
    check_seen(&a, &c, &s);
    CHECK_EQ(c.events[K_COMPLETION], N);
    CHECK_EQ(c.completions_pending, 0);
    CHECK_EQ(c.idle_time_ns, 0); /* no wait could sleep */
    async_runtime_deinit(rt);
}

typedef struct {
    async_runtime_t *rt;
    int n;
} poster_t;

static void *poster(void *arg) {
    poster_t *p = arg;
    for (int i = 0; i < p->n; i++) CHECK_EQ(async_runtime_post_completion(p->rt, 7, (uintptr_t)i), 0);
    return NULL;
}

/* Posts from threads that exit before the loop takes their entries (their
 * records become orphans, freed as they drain: their counts must stay). */
CASE(stats_completions_threads) { // poll
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    enum { T = 4, M = 3000 };
    pthread_t th[T];
    poster_t p = {rt, M};
    for (int i = 0; i < T; i++) start_thread(&th[i], poster, &p);
    for (int i = 0; i < T; i++) join_within(th[i], 30000, "poster");
    CHECK_EQ(get(rt).completions_pending, T * M);
    io_event_t ev[100];
    seen_t s = {0};
    uint64_t got = 0;
    while (got < T * M) {
        got += (uint64_t)wait_seen(rt, ev, 100, 0, &s);
        CHECK_EQ(get(rt).completions_pending, T * M - got);
        CHECK(s.waits < 100 * T * M);
    }
    /* and a second generation of threads after the first was freed */
    for (int i = 0; i < T; i++) start_thread(&th[i], poster, &p);
    for (int i = 0; i < T; i++) join_within(th[i], 30000, "poster");
    CHECK_EQ(get(rt).completions_pending, T * M);
    while (got < 2 * T * M) got += (uint64_t)wait_seen(rt, ev, 100, 0, &s);
    async_runtime_stats_t st = get(rt);
    CHECK_EQ(st.completions_pending, 0);
    CHECK_EQ(st.events[K_COMPLETION], 2 * T * M);
    CHECK_EQ(st.events_total, 2 * T * M);
    CHECK_EQ(st.iterations, s.waits);
    async_runtime_deinit(rt);
}

/* ---- timers ----------------------------------------------------------- */

CASE(stats_timers) { // poll
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    enum { K = 5 };
    uint64_t far = async_runtime_add_timer(rt, 3600 * 1000, 0, 99);
    CHECK(far);
    CHECK_EQ(get(rt).timers_armed, 1);
    CHECK_EQ(async_runtime_cancel_timer(rt, far), 0);
    CHECK_EQ(get(rt).timers_armed, 0);
    CHECK_FAIL(async_runtime_cancel_timer(rt, far) == -1, ASYNC_E_NOTFOUND);
    CHECK_EQ(get(rt).timers_armed, 0);

    for (int i = 0; i < K; i++) CHECK(async_runtime_add_timer(rt, 1 + (uint64_t)i, 0, (uintptr_t)i));
    uint64_t rep = async_runtime_add_timer(rt, 1, 1, 100);
    CHECK(rep);
    async_runtime_stats_t a = get(rt);
    CHECK_EQ(a.timers_armed, K + 1);
    io_event_t ev[8];
    seen_t s = {0};
    int oneshots = 0, repeats = 0;
    double t0 = now_ms();
    while (oneshots < K || repeats < 3) {
        int n = wait_seen(rt, ev, 8, 20, &s);
        for (int i = 0; i < n; i++) {
            CHECK_EQ(ev[i].event_type, ASYNC_EVENT_TIMER);
            if (ev[i].completion_key == 100)
                repeats++;
            else
                oneshots++;
        }
        CHECK(now_ms() - t0 < 30000);
    }
    async_runtime_stats_t b = get(rt);
    check_seen(&a, &b, &s);
    CHECK_EQ(b.events[K_TIMER], (uint64_t)(oneshots + repeats));
    CHECK_EQ(b.timers_armed, 1); /* the repeating one */
    CHECK_EQ(async_runtime_cancel_timer(rt, rep), 0);
    CHECK_EQ(get(rt).timers_armed, 0);
    async_runtime_deinit(rt);
}

/* ---- fd events ------------------------------------------------------------ */

CASE(stats_fd_events) { // poll
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    int p[2], sv[2];
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, (void *)1), 0);
    async_runtime_stats_t a = get(rt);
    io_event_t ev[8];
    seen_t s = {0};
    /* nothing ready */
    CHECK_EQ(wait_seen(rt, ev, 8, 0, &s), 0);
    /* one READ */
    CHECK_EQ(write(p[1], "x", 1), 1);
    CHECK_EQ(wait_seen(rt, ev, 8, 1000, &s), 1);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_READ);
    /* level-triggered: again, until read */
    CHECK_EQ(wait_seen(rt, ev, 8, 0, &s), 1);
    char c;
    CHECK_EQ(read(p[0], &c, 1), 1);
    CHECK_EQ(wait_seen(rt, ev, 8, 0, &s), 0);
    /* a socket readable and writable: one event, counted under both bits */
    CHECK_EQ(write(sv[1], "y", 1), 1);
    CHECK_EQ(async_runtime_add(rt, sv[0], ASYNC_EVENT_READ | ASYNC_EVENT_WRITE, (void *)2), 0);
    CHECK_EQ(wait_seen(rt, ev, 8, 1000, &s), 1);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_READ | ASYNC_EVENT_WRITE);
    CHECK_EQ(async_runtime_remove(rt, sv[0]), 0);
    /* the writer gone: a hang-up, ERROR|CLOSE */
    close(p[1]);
    int n = wait_seen(rt, ev, 8, 1000, &s);
    CHECK_EQ(n, 1);
    CHECK(ev[0].event_type & ASYNC_EVENT_CLOSE);
    /* mixed with a completion in one wait */
    CHECK_EQ(async_runtime_post_completion(rt, 5, 5), 0);
    int got = 0;
    for (int i = 0; i < 10 && got < 2; i++) got += wait_seen(rt, ev, 8, 100, &s);
    CHECK(got >= 2);
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    async_runtime_stats_t b = get(rt);
    check_seen(&a, &b, &s);
    CHECK_EQ(b.events[K_READ] - a.events[K_READ], s.kind[K_READ]);
    CHECK(b.events[K_READ] - a.events[K_READ] >= 3);
    CHECK(b.events[K_WRITE] - a.events[K_WRITE] >= 1);
    CHECK(b.events[K_CLOSE] - a.events[K_CLOSE] >= 2);
    CHECK_EQ(b.events[K_COMPLETION] - a.events[K_COMPLETION], 1);
    /* more kinds than events: the total counts entries, not bits */
    CHECK(b.events_total - a.events_total < s.kind[K_READ] + s.kind[K_WRITE] + s.kind[K_ERROR] + s.kind[K_CLOSE] +
                                                s.kind[K_COMPLETION]);
    close(p[0]);
    close_pair(sv);
    async_runtime_deinit(rt);
}

/* ---- iterations ----------------------------------------------------------- */

static void *busy_waiter(void *arg) {
    async_runtime_t *rt = arg;
    io_event_t ev[4];
    int n;
    /* until the main thread wakes it; BUSY while a wait(0) of the main
     * thread is in progress (it loses too, uncounted: seen under qemu) */
    while ((n = async_runtime_wait(rt, ev, 4, -1)) == -1 && async_last_error() == ASYNC_E_BUSY) sleep_ms(1);
    CHECK(n >= 0);
    return NULL;
}

CASE(stats_iterations) { // poll
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    io_event_t ev[4];
    seen_t s = {0};
    async_runtime_stats_t a = get(rt);
    for (int i = 0; i < 50; i++) wait_seen(rt, ev, 4, 0, &s);
    for (int i = 0; i < 3; i++) wait_seen(rt, ev, 4, 1, &s);
    /* failed waits do not count */
    CHECK_FAIL(async_runtime_wait(rt, ev, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, NULL, 4, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, 4, -2) == -1, ASYNC_E_INVAL);
    /* nor does the loser of two waiters (ASYNC_E_BUSY) */
    pthread_t th;
    start_thread(&th, busy_waiter, rt);
    int busy = 0;
    double t0 = now_ms();
    while (!busy) {
        async_clear_error();
        if (async_runtime_wait(rt, ev, 4, 0) == -1) {
            CHECK_ERR(ASYNC_E_BUSY);
            busy = 1;
        } else {
            s.waits++; /* the thread had not begun its wait yet: this one counted */
            sleep_ms(1);
        }
        CHECK(now_ms() - t0 < 30000);
    }
    CHECK_EQ(async_runtime_wakeup(rt), 0);
    join_within(th, 30000, "waiter");
    s.waits++; /* the thread's wait */
    async_runtime_stats_t b = get(rt);
    CHECK_EQ(b.iterations - a.iterations, s.waits);
    CHECK_EQ(b.events_total, 0);
    CHECK_EQ(b.wakeups, 1);
    async_runtime_deinit(rt);
}

/* ---- idle time ------------------------------------------------------------ */

/* Waits with nothing to do until 50 ms have passed (a wait interrupted by a
 * signal returns 0 early: the next one sleeps the rest). */
static void sleep_50ms(async_runtime_t *rt) {
    io_event_t ev[4];
    double t0 = now_ms(), left;
    while ((left = 50 - (now_ms() - t0)) > 0) CHECK_EQ(async_runtime_wait(rt, ev, 4, (int)left + 1), 0);
}

CASE(stats_idle) { // poll
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    io_event_t ev[4];
    /* No wait that may not sleep adds idle time: polls, and waits with
     * work ready. */
    for (int i = 0; i < 100; i++) CHECK_EQ(async_runtime_wait(rt, ev, 4, 0), 0);
    CHECK_EQ(get(rt).idle_time_ns, 0);
    CHECK_EQ(async_runtime_post_completion(rt, 1, 1), 0);
    CHECK_EQ(async_runtime_wait(rt, ev, 4, 1000), 1);
    CHECK_EQ(get(rt).idle_time_ns, 0);
    /* 50 ms of waits with nothing to do: at least 40 ms idle (the rest is
     * the time between and around the polls), and never more than the wall
     * time. */
    int64_t w0 = mono_ns();
    uint64_t i0 = get(rt).idle_time_ns;
    sleep_50ms(rt);
    uint64_t i1 = get(rt).idle_time_ns;
    int64_t w1 = mono_ns();
    printf("idle after a 50 ms wait: %.3f ms (wall %.3f ms)\n", (double)(i1 - i0) / 1e6, (double)(w1 - w0) / 1e6);
    CHECK(i1 - i0 >= 40 * 1000000ull);
    CHECK(i1 - i0 <= (uint64_t)(w1 - w0));
    /* Polls afterwards add nothing more. */
    for (int i = 0; i < 100; i++) CHECK_EQ(async_runtime_wait(rt, ev, 4, 0), 0);
    CHECK_EQ(get(rt).idle_time_ns, i1);
    /* With an fd registered (the fd poll path) the same holds. */
    int p[2];
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0);
    for (int i = 0; i < 100; i++) CHECK_EQ(async_runtime_wait(rt, ev, 4, 0), 0);
    CHECK_EQ(get(rt).idle_time_ns, i1);
    w0 = mono_ns();
    sleep_50ms(rt);
    uint64_t i2 = get(rt).idle_time_ns;
    w1 = mono_ns();
    CHECK(i2 - i1 >= 40 * 1000000ull);
    CHECK(i2 - i1 <= (uint64_t)(w1 - w0));
    /* A timer's sleep is idle too. */
    CHECK(async_runtime_add_timer(rt, 50, 0, 1));
    w0 = mono_ns();
    int n = 0;
    while (n == 0) n = async_runtime_wait(rt, ev, 4, -1);
    w1 = mono_ns();
    uint64_t i3 = get(rt).idle_time_ns;
    CHECK_EQ(n, 1);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_TIMER);
    CHECK(i3 - i2 >= 40 * 1000000ull);
    CHECK(i3 - i2 <= (uint64_t)(w1 - w0));
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    close_pair(p);
    async_runtime_deinit(rt);
}

/* ---- doorbell writes and wakeups -------------------------------------- */

typedef struct {
    async_runtime_t *rt;
    _Atomic int stop;
    _Atomic uint64_t events; /* returned so far */
    _Atomic uint64_t waits;
} loop_t;

static void *loop_thread(void *arg) {
    loop_t *l = arg;
    io_event_t ev[16];
    while (!atomic_load(&l->stop)) {
        int n = async_runtime_wait(l->rt, ev, 16, -1);
        CHECK(n >= 0);
        atomic_fetch_add(&l->waits, 1);
        atomic_fetch_add(&l->events, (uint64_t)n);
    }
    return NULL;
}

static void wait_events(loop_t *l, uint64_t want) {
    double t0 = now_ms();
    while (atomic_load(&l->events) < want) {
        CHECK(now_ms() - t0 < 30000);
        sleep_ms(1);
    }
}

CASE(stats_doorbell) { // poll
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    /* no waiter: posts and timers ring nothing */
    for (int i = 0; i < 10; i++) CHECK_EQ(async_runtime_post_completion(rt, 1, 1), 0);
    CHECK(async_runtime_add_timer(rt, 1, 0, 1));
    async_runtime_stats_t st = get(rt);
    CHECK_EQ(st.doorbell_writes, 0);
    CHECK_EQ(st.wakeups, 0);
    /* explicit wakeups are counted apart, exactly */
    for (int i = 0; i < 3; i++) CHECK_EQ(async_runtime_wakeup(rt), 0);
    st = get(rt);
    CHECK_EQ(st.wakeups, 3);
    CHECK_EQ(st.doorbell_writes, 0);

    /* A loop that sleeps between posts: posts to a sleeping waiter ring it
     * (each ring ends a sleep: never more rings than posts and timers). */
    loop_t l = {rt, 0, 0, 0};
    pthread_t th;
    start_thread(&th, loop_thread, &l);
    uint64_t want = 11, posts = 10, timers = 1;
    wait_events(&l, want); /* what was queued */
    double t0 = now_ms();
    do {
        sleep_ms(5); /* the loop is most likely asleep again by now */
        CHECK_EQ(async_runtime_post_completion(rt, 2, 2), 0);
        posts++;
        wait_events(&l, ++want);
        CHECK(now_ms() - t0 < 30000);
    } while (get(rt).doorbell_writes == 0);
    uint64_t rings = get(rt).doorbell_writes;
    CHECK(rings <= posts + timers);
    /* a timer added while it sleeps forever rings it too */
    t0 = now_ms();
    do {
        sleep_ms(5);
        CHECK(async_runtime_add_timer(rt, 1, 0, 3));
        timers++;
        wait_events(&l, ++want);
        CHECK(now_ms() - t0 < 30000);
    } while (get(rt).doorbell_writes == rings);
    st = get(rt);
    CHECK(st.doorbell_writes <= posts + timers);
    CHECK(st.doorbell_writes <= st.iterations);
    atomic_store(&l.stop, 1);
    CHECK_EQ(async_runtime_wakeup(rt), 0);
    join_within(th, 30000, "loop");
    st = get(rt);
    CHECK_EQ(st.iterations, atomic_load(&l.waits));
    CHECK_EQ(st.events_total, atomic_load(&l.events));
    CHECK_EQ(st.events[K_COMPLETION], posts);
    CHECK_EQ(st.events[K_TIMER], timers);
    CHECK_EQ(st.timers_armed, 0);
    async_runtime_deinit(rt);
}

/* A queue's SIGNAL_ON_DATA posts are completions like any other. */
CASE(stats_queue_signal) { // poll
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    async_queue_t *q = async_queue_create(8, 8, ASYNC_QUEUE_SIGNAL_ON_DATA);
    CHECK(q);
    CHECK_EQ(async_queue_attach(q, rt, 42), 0);
    CHECK(async_queue_enqueue(q, "abc", 3));
    CHECK_EQ(get(rt).completions_pending, 1);
    io_event_t ev[4];
    CHECK_EQ(async_runtime_wait(rt, ev, 4, 1000), 1);
    CHECK_EQ(ev[0].completion_key, 42);
    async_runtime_stats_t st = get(rt);
    CHECK_EQ(st.completions_pending, 0);
    CHECK_EQ(st.events[K_COMPLETION], 1);
    async_queue_destroy(q);
    async_runtime_deinit(rt);
}

/* ---- concurrent readers -------------------------------------------------- */

typedef struct {
    async_runtime_t *rt;
    _Atomic int stop;
    _Atomic uint64_t reads;
    uint64_t max_posts; /* pending can never exceed what was posted */
    int expect_gone;    /* run until the handle dies (deinit) */
} reader_t;

static void *reader(void *arg) {
    reader_t *r = arg;
    async_runtime_stats_t prev, st;
    memset(&prev, 0, sizeof prev);
    for (;;) {
        int rc = async_runtime_get_stats(r->rt, &st, sizeof st);
        if (rc == -1) {
            CHECK_ERR(ASYNC_E_BADHANDLE);
            CHECK(r->expect_gone);
            return NULL;
        }
        CHECK_EQ(rc, (int)sizeof st);
        /* monotonic counters never go back */
        CHECK(st.iterations >= prev.iterations);
        CHECK(st.idle_time_ns >= prev.idle_time_ns);
        CHECK(st.events_total >= prev.events_total);
        for (int k = 0; k < ASYNC_RUNTIME_STATS_EVENT_KINDS; k++) CHECK(st.events[k] >= prev.events[k]);
        CHECK(st.doorbell_writes >= prev.doorbell_writes);
        CHECK(st.wakeups >= prev.wakeups);
        CHECK(st.completions_pending <= r->max_posts);
        CHECK(st.timers_armed <= 1);
        prev = st;
        atomic_fetch_add(&r->reads, 1);
        if (!r->expect_gone && atomic_load(&r->stop)) return NULL;
    }
}

static void *post_many(void *arg) {
    poster_t *p = arg;
    for (int i = 0; i < p->n; i++) {
        CHECK_EQ(async_runtime_post_completion(p->rt, 9, (uintptr_t)i), 0);
        if (i % 64 == 0) sched_yield();
    }
    return NULL;
}

CASE(stats_concurrent) { // poll
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    enum { P = 2, M = 20000, R = 2 };
    reader_t rd = {rt, 0, 0, (uint64_t)P * M, 0};
    pthread_t rth[R], pth[P];
    for (int i = 0; i < R; i++) start_thread(&rth[i], reader, &rd);
    poster_t p = {rt, M};
    for (int i = 0; i < P; i++) start_thread(&pth[i], post_many, &p);
    uint64_t tid = async_runtime_add_timer(rt, 1, 1, 7);
    CHECK(tid);
    io_event_t ev[64];
    seen_t s = {0};
    double t0 = now_ms();
    while (s.kind[K_COMPLETION] < (uint64_t)P * M) {
        wait_seen(rt, ev, 64, 5, &s);
        if (s.waits % 16 == 0) CHECK_EQ(async_runtime_wakeup(rt), 0);
        CHECK(now_ms() - t0 < 60000);
    }
    for (int i = 0; i < P; i++) join_within(pth[i], 30000, "poster");
    CHECK_EQ(async_runtime_cancel_timer(rt, tid), 0);
    /* wait out a timer event that may have been expired but not returned: cancel drops it */
    atomic_store(&rd.stop, 1);
    for (int i = 0; i < R; i++) join_within(rth[i], 30000, "reader");
    CHECK(atomic_load(&rd.reads) > 0);
    async_runtime_stats_t st = get(rt);
    CHECK_EQ(st.iterations, s.waits);
    CHECK_EQ(st.events_total, s.total);
    CHECK_EQ(st.events[K_COMPLETION], (uint64_t)P * M);
    CHECK_EQ(st.events[K_TIMER], s.kind[K_TIMER]);
    CHECK_EQ(st.completions_pending, 0);
    CHECK_EQ(st.timers_armed, 0);
    printf("reads %llu during %llu waits\n", (unsigned long long)atomic_load(&rd.reads),
           (unsigned long long)s.waits);
    async_runtime_deinit(rt);
}

/* Readers racing deinit: success or ASYNC_E_BADHANDLE, never a crash (ASan). */
CASE(stats_deinit_race) { // poll
    for (int round = 0; round < 20; round++) {
        async_runtime_t *rt = async_runtime_init();
        CHECK(rt);
        reader_t rd = {rt, 0, 0, 1000, 1};
        pthread_t rth[2];
        for (int i = 0; i < 2; i++) start_thread(&rth[i], reader, &rd);
        for (int i = 0; i < 100; i++) CHECK_EQ(async_runtime_post_completion(rt, 1, 1), 0);
        double t0 = now_ms();
        while (atomic_load(&rd.reads) < 10) {
            CHECK(now_ms() - t0 < 30000);
            sched_yield();
        }
        async_runtime_deinit(rt);
        for (int i = 0; i < 2; i++) join_within(rth[i], 30000, "reader");
    }
}

/* From a fiber: pure C, it neither parks nor enters Go on the fiber stack. */
typedef struct {
    async_runtime_t *rt;
    int rc;
    async_runtime_stats_t st;
} fiber_arg_t;

static void fiber_fn(void *arg) {
    fiber_arg_t *a = arg;
    a->rc = async_runtime_get_stats(a->rt, &a->st, sizeof a->st);
    async_clear_error();
    if (async_runtime_get_stats(a->rt, NULL, sizeof a->st) != -1 || async_last_error() != ASYNC_E_INVAL) a->rc = -2;
}

CASE(stats_fiber) { // poll
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    for (int i = 0; i < 3; i++) CHECK_EQ(async_runtime_post_completion(rt, 1, 1), 0);
    async_sched_t *s = async_sched_create(NULL);
    CHECK(s);
    fiber_arg_t a = {rt, 0, {0}};
    CHECK(async_fiber_spawn(s, fiber_fn, &a, 0));
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    CHECK_EQ(a.rc, (int)sizeof a.st);
    CHECK_EQ(a.st.completions_pending, 3);
    async_runtime_deinit(rt);
}

/* --- stats_signal ---------------------------------------------------------------- */

CASE(stats_signal) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    CHECK_EQ(async_runtime_add_signal(rt, SIGUSR2, 42), 0);
    io_event_t ev[8];
    uint64_t sigs = 0, comps = 0;
    for (int i = 0; i < 30; i++) {
        raise(SIGUSR2);
        if (i % 5 == 3) /* a signal and completions in one wait */
            for (int k = 0; k < 3; k++)
                CHECK_EQ(async_runtime_post_completion(rt, 7, (uintptr_t)k), 0);
        int n = async_runtime_wait(rt, ev, 8, i % 3 == 0 ? 0 : 1000);
        CHECK(n >= 0);
        for (int k = 0; k < n; k++) {
            if (ev[k].event_type == ASYNC_EVENT_SIGNAL)
                sigs++;
            else if (ev[k].event_type == ASYNC_EVENT_COMPLETION)
                comps++;
            else
                CHECK(!"unexpected event type");
        }
    }
    /* what is left */
    int n;
    while ((n = async_runtime_wait(rt, ev, 8, 0)) > 0)
        for (int k = 0; k < n; k++)
            ev[k].event_type == ASYNC_EVENT_SIGNAL ? sigs++ : comps++;
    CHECK(sigs >= 10);
    CHECK_EQ(comps, 18);
    async_runtime_stats_t st;
    CHECK(async_runtime_get_stats(rt, &st, sizeof st) > 0);
    CHECK_EQ(st.events[6], sigs);
    CHECK_EQ(st.events[4], comps);
    CHECK_EQ(st.events_total, sigs + comps);
    async_runtime_deinit(rt);
}

TEST_MAIN()
