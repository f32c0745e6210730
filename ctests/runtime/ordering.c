/* Order of completions: async_runtime_post_completion
 * delivers completions in an order consistent with happens-before, i.e. in
 * program order of a thread or of a fiber (even when the fiber moves between
 * worker threads), and in the order of any two posts that are ordered by
 * synchronisation (a mutex, a semaphore hand-off) across threads.
 *
 * Every case drains on the main thread while the posts are under way, with
 * max_events rotating through 1..64 so partial takes are covered, and checks
 * the exact sequence: each completion exactly once, in order. */
#include <semaphore.h>
#include <stdatomic.h>

#include "check.h"

/* High bits in the key and the data, so a truncated or mixed-up field shows. */
#define KEY_TAG ((uintptr_t)0x5a << (sizeof(uintptr_t) * 8 - 8))
#define DATA_TAG ((uintptr_t)0x3c << (sizeof(uintptr_t) * 8 - 8))


/* Drains until `total` completions have arrived, calling check(e) for each;
 * fails if none arrives for 30 s (a lost wake-up or a stuck gap). */
static void drain(async_runtime_t *rt, uint64_t total, void (*check)(const io_event_t *e)) {
    io_event_t ev[64];
    uint64_t got = 0;
    int max = 1;
    double last = now_ms();
    while (got < total) {
        int n = async_runtime_wait(rt, ev, max, 1000);
        CHECK(n >= 0 && n <= max);
        if (n == 0) {
            CHECK(now_ms() - last < 30000);
            continue;
        }
        last = now_ms();
        for (int i = 0; i < n; i++) {
            CHECK_EQ(ev[i].event_type, ASYNC_EVENT_COMPLETION);
            CHECK_EQ(ev[i].fd, -1);
            CHECK(ev[i].context == NULL);
            check(&ev[i]);
        }
        got += (uint64_t)n;
        max = max % 64 + 1;
    }
    /* Nothing more: exactly once. */
    CHECK_EQ(async_runtime_wait(rt, ev, 64, 0), 0);
}

/* ---- a fiber that migrates between workers posts 1..N ---------------------- */

enum { MF = 16, MN = 4000 };
static async_runtime_t *mig_rt;
static uintptr_t mig_next[MF];
static int mig_moved[MF];

/* pthread_self() is a "const" function: gcc may reuse its value across a
 * yield, which is exactly what must not happen on a fiber. */
__attribute__((noinline)) static pthread_t thread_now(void) {
    __asm__ volatile("" ::: "memory");
    return pthread_self();
}

static void mig_fiber(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    pthread_t first = thread_now();
    for (uintptr_t i = 1; i <= MN; i++) {
        CHECK_EQ(async_runtime_post_completion(mig_rt, KEY_TAG | id, DATA_TAG | i), 0);
        if (!pthread_equal(thread_now(), first)) mig_moved[id] = 1;
        if (i % 500 == 0)
            async_fiber_sleep(1); /* parked and woken: likely resumed elsewhere */
        else
            async_fiber_yield();
    }
}

static void mig_check(const io_event_t *e) {
    uintptr_t id = e->completion_key & ~KEY_TAG;
    CHECK_EQ(e->completion_key & KEY_TAG, KEY_TAG);
    CHECK(id < MF);
    CHECK_EQ(e->data & DATA_TAG, DATA_TAG);
    CHECK_EQ(e->data & ~DATA_TAG, ++mig_next[id]);
}

/* Mode 0 drains while the fibers post; mode 1 drains once every fiber is
 * done, when the backlog is spread over every worker the fibers ran on.
 * Whether a fiber moves is up to the scheduler, so rounds are repeated (up
 * to 40) until some fiber has moved in each mode; every round checks the
 * order in full. */
CASE(order_fiber_migrate) { // poll
    int moved_in[2] = {0, 0}, round;
    for (round = 0; round < 40 && !(moved_in[0] && moved_in[1]); round++) {
        int mode = round % 2;
        mig_rt = mkrt();
        memset(mig_next, 0, sizeof mig_next);
        memset(mig_moved, 0, sizeof mig_moved);
        async_sched_t *s = sched_new(4);
        for (uintptr_t f = 0; f < MF; f++) CHECK(async_fiber_spawn(s, mig_fiber, (void *)f, 0));
        if (mode == 1) CHECK_EQ(async_sched_run(s), 0);
        drain(mig_rt, (uint64_t)MF * MN, mig_check);
        CHECK_EQ(async_sched_run(s), 0);
        int moved = 0;
        for (int f = 0; f < MF; f++) {
            CHECK_EQ(mig_next[f], MN);
            moved += mig_moved[f];
        }
        printf("round %d (mode %d): %d of %d fibers changed threads while posting\n", round, mode, moved, MF);
        fflush(stdout);
        moved_in[mode] |= moved > 0;
        async_sched_destroy(s);
        async_runtime_deinit(mig_rt);
    }
    CHECK(moved_in[0] && moved_in[1]); /* otherwise this case tested nothing */
}

/* ---- posts ordered by a mutex: the shared counter arrives in order ---------- */

enum { XT = 4, XN = 25000 };
static async_runtime_t *x_rt;
static pthread_mutex_t x_mu = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t x_counter, x_next;

/* Posts the next value of x_counter under x_mu, with key `key`: the posts
 * of every thread together count up. */
static void x_post_next(uintptr_t key) {
    pthread_mutex_lock(&x_mu);
    uintptr_t v = ++x_counter;
    CHECK_EQ(async_runtime_post_completion(x_rt, KEY_TAG | key, DATA_TAG | v), 0);
    pthread_mutex_unlock(&x_mu);
}

static void *x_poster(void *arg) {
    for (int i = 0; i < XN; i++) {
        x_post_next((uintptr_t)arg);
        if (i % 64 == 0) sched_yield(); /* let the others take the lock too */
    }
    return NULL;
}

static void x_check(const io_event_t *e) {
    CHECK((e->completion_key & ~KEY_TAG) < XT);
    CHECK_EQ(e->data & DATA_TAG, DATA_TAG);
    CHECK_EQ(e->data & ~DATA_TAG, ++x_next);
}

CASE(order_mutex) { // poll
    x_rt = mkrt();
    pthread_t th[XT];
    for (uintptr_t i = 0; i < XT; i++) start_thread(&th[i], x_poster, (void *)i);
    drain(x_rt, (uint64_t)XT * XN, x_check);
    for (int i = 0; i < XT; i++) join_within(th[i], 30000, "poster");
    CHECK_EQ(x_next, (uintptr_t)XT * XN);
    async_runtime_deinit(x_rt);
}

/* ---- a semaphore hands a baton around: strictly alternating threads -------- */

enum { ST = 3, SN = 6000 };
static async_runtime_t *s_rt;
static sem_t s_sem[ST];
static uintptr_t s_counter, s_next;

static void *s_poster(void *arg) {
    uintptr_t me = (uintptr_t)arg;
    for (int i = 0; i < SN; i++) {
        while (sem_wait(&s_sem[me]) != 0) CHECK(errno == EINTR);
        uintptr_t v = ++s_counter;
        CHECK_EQ(async_runtime_post_completion(s_rt, KEY_TAG | me, DATA_TAG | v), 0);
        CHECK_EQ(sem_post(&s_sem[(me + 1) % ST]), 0);
    }
    return NULL;
}

static void s_check(const io_event_t *e) {
    uintptr_t v = e->data & ~DATA_TAG;
    CHECK_EQ(v, ++s_next);
    CHECK_EQ(e->completion_key & ~KEY_TAG, (v - 1) % ST);
}

CASE(order_semaphore) { // poll
    s_rt = mkrt();
    pthread_t th[ST];
    for (int i = 0; i < ST; i++) CHECK_EQ(sem_init(&s_sem[i], 0, i == 0), 0);
    for (uintptr_t i = 0; i < ST; i++) start_thread(&th[i], s_poster, (void *)i);
    drain(s_rt, (uint64_t)ST * SN, s_check);
    for (int i = 0; i < ST; i++) join_within(th[i], 30000, "poster");
    for (int i = 0; i < ST; i++) sem_destroy(&s_sem[i]);
    async_runtime_deinit(s_rt);
}

/* ---- short-lived threads: each posts under the mutex and exits ------------- */

enum { EW = 150, ET = 4, EN = 40 };

static void *e_poster(void *arg) {
    for (int i = 0; i < EN; i++) x_post_next((uintptr_t)arg);
    return NULL;
}

static void *e_spawner(void *arg) {
    (void)arg;
    for (int w = 0; w < EW; w++) {
        pthread_t th[ET];
        for (uintptr_t i = 0; i < ET; i++) start_thread(&th[i], e_poster, (void *)i);
        for (int i = 0; i < ET; i++) join_within(th[i], 30000, "poster");
    }
    return NULL;
}

/* Posting threads that exit leave records behind that the loop frees once
 * drained; the order holds across them. */
CASE(order_exiting_threads) { // poll
    x_rt = mkrt();
    x_counter = x_next = 0;
    pthread_t sp;
    start_thread(&sp, e_spawner, NULL);
    drain(x_rt, (uint64_t)EW * ET * EN, x_check);
    join_within(sp, 60000, "spawner");
    async_runtime_deinit(x_rt);
}

/* ---- posts from one thread to two runtimes, and to a runtime re-created ----- */

static async_runtime_t *r_rt;
static uintptr_t r_next;
static void r_check(const io_event_t *e) {
    CHECK_EQ(e->completion_key, KEY_TAG | 7);
    CHECK_EQ(e->data, ++r_next);
}

/* A runtime deinit'ed with completions queued, then a new one (which may
 * reuse the C side of the old one): none of the old completions shows up in
 * the new runtime, and the new one's are in order. */
CASE(order_recreate) { // poll
    for (int round = 0; round < 20; round++) {
        async_runtime_t *old = mkrt();
        for (uintptr_t i = 1; i <= 1000; i++) CHECK_EQ(async_runtime_post_completion(old, KEY_TAG | 9, i), 0);
        async_runtime_deinit(old);
        r_rt = mkrt();
        r_next = 0;
        for (uintptr_t i = 1; i <= 700; i++) CHECK_EQ(async_runtime_post_completion(r_rt, KEY_TAG | 7, i), 0);
        drain(r_rt, 700, r_check);
        async_runtime_deinit(r_rt);
    }
}

/* ---- a thread posts n, exits, and the loop drains one at a time ------------- */

/* The loop frees an exited thread's record only once every entry it posted
 * is delivered, also when the first run of a new block is half delivered
 * and the thread's last block filled to the same slot as the one before
 * (the end of the last run delivered is then still the end of the previous
 * block, which matches the producer's final slot count). The thread posts alone and the loop takes nothing
 * until it has exited, so the blocks fill the same way every time; n covers
 * several whole blocks whatever the block and run sizes are. */
static uintptr_t o_n;
static void *o_poster(void *arg) {
    (void)arg;
    for (uintptr_t i = 1; i <= o_n; i++) CHECK_EQ(async_runtime_post_completion(r_rt, KEY_TAG | 7, i), 0);
    return NULL;
}

CASE(order_orphan_partial) { // poll
    r_rt = mkrt();
    io_event_t ev[1];
    for (o_n = 1; o_n <= 1200; o_n += (o_n < 200 ? 1 : 3)) {
        pthread_t th;
        start_thread(&th, o_poster, NULL);
        join_within(th, 30000, "poster");
        for (uintptr_t i = 1; i <= o_n; i++) {
            CHECK_EQ(async_runtime_wait(r_rt, ev, 1, 1000), 1);
            CHECK_EQ(ev[0].event_type, ASYNC_EVENT_COMPLETION);
            CHECK_EQ(ev[0].completion_key, KEY_TAG | 7);
            CHECK_EQ(ev[0].data, i);
        }
        CHECK_EQ(async_runtime_wait(r_rt, ev, 1, 0), 0);
    }
    async_runtime_deinit(r_rt);
}

TEST_MAIN()
