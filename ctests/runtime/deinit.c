/* async_runtime_deinit: with completions, timers, fds and an attached queue
 * still pending (none leaks, none reaches a later runtime, the fds stay the
 * caller's), racing calls from other threads (each fails with
 * ASYNC_E_CLOSED or ASYNC_E_BADHANDLE, never crashes); the descriptor
 * numbers it frees are reused at once by new files without stray events. */
#include "check.h"
#include "rt.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/stat.h>
#if defined(__linux__)
#include <sys/eventfd.h>
#endif

static int pend_a, pend_b;

CASE(deinit_pending_fds_timers) // poll
{
    async_runtime_t *rt = mkrt();
    int p[2], i;
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], "x", 1) == 1);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ | ASYNC_EVENT_WRITE, &pend_a), 0);
    CHECK_EQ(async_runtime_add(rt, p[1], ASYNC_EVENT_WRITE, &pend_b), 0);
    for (i = 0; i < 10000; i++)
        CHECK_EQ(async_runtime_post_completion(rt, (uintptr_t)i, (uintptr_t)i), 0);
    for (i = 0; i < 20; i++)
        CHECK(async_runtime_add_timer(rt, (uint64_t)(i % 2 ? 0 : 100000), (uint64_t)(i % 3 ? 0 : 5), 1) != 0);
    sleep_ms(30); /* some timers expired, undelivered */
    async_runtime_deinit(rt);
    /* registered fds are the caller's: still open */
    CHECK(fcntl(p[0], F_GETFD) != -1);
    CHECK(fcntl(p[1], F_GETFD) != -1);
    CHECK_FAIL(async_runtime_post_completion(rt, 1, 1) == -1, ASYNC_E_BADHANDLE);
    /* a fresh runtime works and sees none of it */
    rt = mkrt();
    {
        io_event_t ev[4];
        CHECK_EQ(wait_ok(rt, ev, 4, 50), 0);
        CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0); /* fd free for reuse */
        CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
        CHECK_EQ(ev[0].fd, p[0]);
        CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    }
    async_runtime_deinit(rt);
    close_pair(p);
}

/* --- deinit with pending work ------------------------------------------- */
/*
 * Deinit while the runtime holds 10000 undelivered completions, expired and
 * future timers, a repeating timer, readable registered fds and an attached
 * queue with messages (its completion pending). Checked: the runtime handle
 * is dead for every call; the fds are still open and can be added to a new
 * runtime; the queue keeps its messages, enqueue still works and posts
 * nothing, attach to the dead runtime is BADHANDLE, detach works, and
 * attaching to a new runtime posts one completion at once (non-empty); the
 * new runtime sees nothing of the old one's work.
 */
CASE(deinit_pending_with_queue) // poll
{
    async_runtime_t *rt = mkrt(), *rt2;
    async_queue_t *q = async_queue_create(16, sizeof(int), ASYNC_QUEUE_SIGNAL_ON_DATA);
    io_event_t ev[16];
    uint64_t timer;
    int p[2], i, v, n;
    seed("deinit_pending");
    CHECK(q != NULL);
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], "x", 1) == 1);
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0);
    CHECK_EQ(async_runtime_add(rt, p[1], ASYNC_EVENT_WRITE, NULL), 0);
    for (i = 0; i < 10000; i++)
        CHECK_EQ(async_runtime_post_completion(rt, 1, (uintptr_t)i), 0);
    for (i = 0; i < 50; i++)
        CHECK(async_runtime_add_timer(rt, (uint64_t)(i % 3 == 0 ? 0 : 100000), 0, 2) != 0);
    timer = async_runtime_add_timer(rt, 1, 1, 3);
    CHECK(timer != 0);
    CHECK_EQ(async_queue_attach(q, rt, 4), 0);
    for (v = 0; v < 3; v++)
        CHECK(async_queue_enqueue(q, &v, sizeof v));
    sleep_ms(20); /* timers expire undelivered */
    async_runtime_deinit(rt);
    /* the dead handle */
    CHECK_FAIL(async_runtime_post_completion(rt, 1, 1) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_wait(rt, ev, 16, 0) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_cancel_timer(rt, timer) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_remove(rt, p[0]) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_queue_attach(q, rt, 5) == -1, ASYNC_E_BADHANDLE);
    /* the queue lives on */
    v = 3;
    CHECK(async_queue_enqueue(q, &v, sizeof v));
    CHECK_EQ(async_queue_attach(q, NULL, 0), 0);
    rt2 = mkrt();
    CHECK_EQ(collect_events(rt2, ev, 16, 50, 16), 0); /* nothing of the old runtime */
    CHECK_EQ(async_queue_attach(q, rt2, 6), 0);
    n = collect_events(rt2, ev, 16, 5000, 1);
    CHECK_EQ(n, 1);
    CHECK(ev[0].completion_key == 6 && ev[0].data == (uintptr_t)q);
    for (i = 0; i < 4; i++) {
        CHECK(async_queue_dequeue(q, &v, sizeof v, NULL));
        CHECK_EQ(v, i);
    }
    CHECK(async_queue_is_empty(q));
    /* the fds were not closed and can be registered again */
    CHECK(fcntl(p[0], F_GETFD) != -1 && fcntl(p[1], F_GETFD) != -1);
    CHECK_EQ(async_runtime_add(rt2, p[0], ASYNC_EVENT_READ, &v), 0);
    n = collect_events(rt2, ev, 16, 5000, 1);
    CHECK_EQ(n, 1);
    CHECK(ev[0].fd == p[0] && ev[0].context == &v);
    CHECK_EQ(async_runtime_remove(rt2, p[0]), 0);
    CHECK_EQ(collect_events(rt2, ev, 16, 50, 16), 0);
    async_queue_destroy(q);
    async_runtime_deinit(rt2);
    close_pair(p);
}

/* --- deinit racing calls from threads ------------------------------------ */
/*
 * Rounds for about 2 s: a runtime with an attached DROP_OLDEST queue is hit
 * by 3 posting threads, a timer thread (add/cancel), a wakeup thread, an fd
 * thread (add/modify/remove), a queue writer and a waiting thread; the main
 * thread deinits it after a random 0..15 ms and at once creates a new
 * runtime (which may take the freed handle slot). Checked: every thread's
 * calls succeed until they fail, then fail with CLOSED (while the deinit is
 * under way) or BADHANDLE, never succeed again, and once the deinit has
 * returned fail with BADHANDLE; the queue is unaffected; the
 * new runtime receives none of the old one's completions or timers.
 */

enum { DR_POSTERS = 3 };
#define DR_KEY ((uintptr_t)0xD1ED)

static struct {
    async_runtime_t *rt;
    async_queue_t *q;
    atomic_int stop, failed, deinit_done;
    int fdpipe[2];
} dr;

/* Called after an op failed: CLOSED (deinit under way) or BADHANDLE; it never
 * succeeds again, and once deinit has returned it is BADHANDLE. */
static void dr_after_failure(int (*op)(uint32_t *), uint32_t *rs)
{
    int i, e = async_last_error();
    if (e != ASYNC_E_BADHANDLE && e != ASYNC_E_CLOSED) {
        fprintf(stderr, "a call on the dying runtime failed with %d (%s)\n", e, async_strerror(e));
        CHECK(!"CLOSED or BADHANDLE");
    }
    for (i = 0; i < 50 || !atomic_load(&dr.deinit_done); i++) {
        bool after = atomic_load(&dr.deinit_done);
        async_clear_error();
        CHECK(op(rs) != 0); /* never succeeds again */
        e = async_last_error();
        CHECK(e == ASYNC_E_BADHANDLE || (!after && e == ASYNC_E_CLOSED));
    }
    atomic_fetch_add(&dr.failed, 1);
}

static int dr_post(uint32_t *rs)
{
    return async_runtime_post_completion(dr.rt, DR_KEY, rnd_r(rs, 1000));
}

static int dr_timer(uint32_t *rs)
{
    uint64_t id = async_runtime_add_timer(dr.rt, rnd_r(rs, 3), rnd_r(rs, 2), DR_KEY);
    if (id == 0)
        return -1;
    if (rnd_r(rs, 2) && async_runtime_cancel_timer(dr.rt, id) != 0 && async_last_error() != ASYNC_E_NOTFOUND)
        return -1; /* NOTFOUND: the waiter delivered it */
    return 0;
}

static int dr_wakeup(uint32_t *rs)
{
    (void)rs;
    return async_runtime_wakeup(dr.rt);
}

static int dr_fd(uint32_t *rs)
{
    if (async_runtime_add(dr.rt, dr.fdpipe[0], ASYNC_EVENT_READ, NULL) != 0)
        return -1;
    if (rnd_r(rs, 2) && async_runtime_modify(dr.rt, dr.fdpipe[0], ASYNC_EVENT_READ | ASYNC_EVENT_WRITE) != 0)
        return -1;
    return async_runtime_remove(dr.rt, dr.fdpipe[0]);
}

static void *dr_thread(void *arg)
{
    int (*op)(uint32_t *) = (int (*)(uint32_t *))arg;
    uint32_t rs = (uint32_t)(uintptr_t)&rs;
    while (!atomic_load(&dr.stop)) {
        if (op(&rs) != 0) {
            dr_after_failure(op, &rs);
            return NULL;
        }
    }
    CHECK(!"stopped before the runtime was gone");
    return NULL;
}

static void *dr_waiter(void *arg)
{
    io_event_t ev[8];
    uint32_t rs = (uint32_t)(uintptr_t)&rs;
    (void)arg;
    for (;;) {
        int n = async_runtime_wait(dr.rt, ev, 8, rnd_r(&rs, 3) == 0 ? -1 : 5);
        if (n < 0) {
            CHECK(async_last_error() == ASYNC_E_CLOSED || async_last_error() == ASYNC_E_BADHANDLE);
            atomic_fetch_add(&dr.failed, 1);
            return NULL;
        }
    }
}

static void *dr_writer(void *arg)
{
    int v = 0;
    (void)arg;
    while (!atomic_load(&dr.stop)) {
        CHECK(async_queue_enqueue(dr.q, &v, sizeof v)); /* the queue is not affected */
        v++;
        if (v % 64 == 0)
            sched_yield();
    }
    return NULL;
}

CASE(deinit_race) // poll
{
    int (*ops[])(uint32_t *) = {dr_post, dr_post, dr_post, dr_timer, dr_wakeup, dr_fd};
    enum { NOPS = sizeof ops / sizeof ops[0] };
    double deadline;
    int rounds = 0, i;
    seed("deinit_race");
    deadline = now_ms() + 2000;
    CHECK(pipe(dr.fdpipe) == 0);
    dr.q = async_queue_create(8, sizeof(int), (async_queue_flags_t)(ASYNC_QUEUE_DROP_OLDEST | ASYNC_QUEUE_SIGNAL_ON_DATA));
    CHECK(dr.q != NULL);
    do {
        pthread_t th[NOPS], waiter, writer;
        async_runtime_t *rt2;
        io_event_t ev[64];
        int n, k;
        dr.rt = mkrt();
        CHECK_EQ(async_queue_attach(dr.q, dr.rt, DR_KEY), 0);
        atomic_store(&dr.stop, 0);
        atomic_store(&dr.failed, 0);
        atomic_store(&dr.deinit_done, 0);
        for (i = 0; i < NOPS; i++)
            start_thread(&th[i], dr_thread, (void *)ops[i]);
        start_thread(&waiter, dr_waiter, NULL);
        start_thread(&writer, dr_writer, NULL);
        sleep_ms((int)rnd(16));
        async_runtime_deinit(dr.rt);
        atomic_store(&dr.deinit_done, 1);
        rt2 = mkrt(); /* may reuse the slot: the old handle must not reach it */
        for (i = 0; i < NOPS; i++)
            join_within(th[i], 10000, "a thread calling the dying runtime");
        join_within(waiter, 10000, "the waiter");
        atomic_store(&dr.stop, 1);
        join_within(writer, 10000, "the queue writer");
        CHECK_EQ(atomic_load(&dr.failed), NOPS + 1);
        n = collect_events(rt2, ev, 64, 20, 64);
        for (k = 0; k < n; k++)
            fprintf(stderr, "the new runtime got key %#llx type %#x\n", (unsigned long long)ev[k].completion_key,
                    ev[k].event_type);
        CHECK_EQ(n, 0);
        CHECK(async_queue_enqueue(dr.q, &n, sizeof n)); /* detached by the deinit: posts nothing */
        CHECK_EQ(collect_events(rt2, ev, 64, 5, 64), 0);
        async_runtime_deinit(rt2);
        async_queue_clear(dr.q);
        rounds++;
    } while (now_ms() < deadline);
    printf("deinit_race: %d rounds\n", rounds);
    async_queue_destroy(dr.q);
    close_pair(dr.fdpipe);
}

/* ---- deinit racing everything; descriptor numbers reused -------------------- */

typedef struct {
    async_runtime_t *_Atomic rt;
    atomic_int stop;
    int kind;
} hammer_t;

static void *hammer(void *arg)
{
    hammer_t *h = arg;
    async_runtime_stats_t st;
    io_event_t ev[4];
    unsigned i = 0;
    while (!atomic_load(&h->stop)) {
        async_runtime_t *rt = atomic_load(&h->rt);
        if (h->kind == 3) {
            /* a blocking waiter: deinit must end its wait (CLOSED), and a
             * wait on the dead handle fails at once (BADHANDLE) */
            int n = async_runtime_wait(rt, ev, 4, 5000);
            if (n < 0) {
                int e = async_last_error();
                CHECK(e == ASYNC_E_CLOSED || e == ASYNC_E_BADHANDLE || e == ASYNC_E_BUSY);
            }
            continue;
        }
        switch ((h->kind + i++) % 4) {
        case 0: async_runtime_wakeup(rt); break;
        case 1: async_runtime_post_completion(rt, 1, 2); break;
        case 2: async_runtime_get_stats(rt, &st, sizeof st); break;
        case 3: async_runtime_wait(rt, ev, 4, 0); break;
        }
    }
    return NULL;
}

CASE(deinit_reuse) // poll adversarial
{
    hammer_t h;
    atomic_store(&h.stop, 0);
    pthread_t th[4];
    hammer_t hs[4];
    for (int round = 0; round < 300; round++) {
        async_runtime_t *rt = async_runtime_init();
        CHECK(rt);
        for (int i = 0; i < 4; i++) {
            atomic_store(&hs[i].rt, rt);
            atomic_store(&hs[i].stop, 0);
            hs[i].kind = i;
            start_thread(&th[i], hammer, &hs[i]);
        }
        if (round & 1)
            sched_yield();
        else
            sleep_ms(1);
        async_runtime_deinit(rt);
        /* Take the freed numbers: pipes and eventfds. */
        int fds[16], nf = 0;
        for (int i = 0; i < 4; i++) {
            int p[2];
            CHECK_EQ(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
            fds[nf++] = p[0];
            fds[nf++] = p[1];
#if defined(__linux__)
            int e = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
#else
            int e = dup(p[0]); /* no eventfd: another number taken */
#endif
            CHECK(e >= 0);
            fds[nf++] = e;
        }
        sleep_ms(2); /* the hammers go on with the stale handle */
        for (int i = 0; i < 4; i++) {
            atomic_store(&hs[i].stop, 1);
            join_within(th[i], 10000, "hammer");
        }
        for (int i = 0; i < nf; i++) {
            char buf[64];
            ssize_t k = read(fds[i], buf, sizeof buf);
            if (k > 0 || (k < 0 && errno != EAGAIN && errno != EBADF && errno != EINVAL)) {
                /* the write ends of pipes fail with EBADF on read: fine */
                fprintf(stderr, "round %d: fd %d got %zd stray bytes (errno %d)\n", round, fds[i], k, errno);
                CHECK(k <= 0);
            }
        }
        for (int i = 0; i < nf; i++)
            close(fds[i]);
    }
}

TEST_MAIN()
