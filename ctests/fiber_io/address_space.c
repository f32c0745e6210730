/* RLIMIT_AS: the address space runs out in a child process while fibers
 * ping-pong, while a runtime posts completions, timers and registrations,
 * and while host threads and fibers spawn: every constructor works or fails
 * with its documented error (NOMEM), and the process goes on. Each *_child
 * case runs only in the child its parent case starts (net.h, run_child).
 * Every wait is bounded. */
#include <fcntl.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sched.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "check.h"
#define BOUND_MS 20000 /* every wait of this file, in ms */
#include "net.h"

/* ---- the address space runs out (RLIMIT_AS) while fibers ping-pong ----------- */

typedef struct {
    async_chan_t *park;    /* never sent to: the spawned fibers wait on it */
    async_chan_t *ping, *pong;
    atomic_int pongs, parked_ended, bad, stop;
} as_t;

static as_t as;

static void as_parker(void *arg)
{
    (void)arg;
    int v;
    if (async_chan_recv(as.park, &v, -1) == 0 || async_last_error() != ASYNC_E_CLOSED)
        atomic_fetch_add(&as.bad, 1);
    atomic_fetch_add(&as.parked_ended, 1);
}

static void as_ponger(void *arg)
{
    (void)arg;
    int v;
    while (async_chan_recv(as.ping, &v, -1) == 0) {
        if (async_chan_send(as.pong, &v, -1) != 0) {
            atomic_fetch_add(&as.bad, 1);
            return;
        }
    }
}

static void as_pinger(void *arg)
{
    (void)arg;
    for (int i = 0; !atomic_load(&as.stop); i++) {
        int v = i, w = -1;
        if (async_chan_send(as.ping, &v, -1) != 0 || async_chan_recv(as.pong, &w, -1) != 0 || w != i) {
            atomic_fetch_add(&as.bad, 1);
            return;
        }
        atomic_fetch_add(&as.pongs, 1);
    }
    async_chan_close(as.ping);
}

static long vm_size_kb(void)
{
    return proc_status_field("VmSize: %ld kB");
}

static void as_set(rlim_t v)
{
    struct rlimit rl;
    CHECK_EQ(getrlimit(RLIMIT_AS, &rl), 0);
    rl.rlim_cur = v;
    CHECK_EQ(setrlimit(RLIMIT_AS, &rl), 0);
}

#define AS_MAX 200000

/* Every constructor at the limit: it works or fails with NOMEM (SYS for a
 * thread some report so), and the process goes on. */
static void as_constructors(async_sched_t *s, int *nomem)
{
    async_clear_error();
    async_queue_t *q = async_queue_create(64, 64, 0);
    if (q) async_queue_destroy(q); else { CHECK_ERR(ASYNC_E_NOMEM); nomem[0]++; }
    async_chan_t *c = async_chan_create(64, 64);
    if (c) async_chan_destroy(c); else { CHECK_ERR(ASYNC_E_NOMEM); nomem[1]++; }
    async_mutex_t *m = async_mutex_create();
    if (m) async_mutex_destroy(m); else { CHECK_ERR(ASYNC_E_NOMEM); nomem[2]++; }
    /* async_runtime_init is not tried here: its Go half can abort the process
     * at this limit */
    async_clear_error();
    async_worker_t *w = async_worker_create(nop_proc, NULL, 0);
    if (w) {
        CHECK(async_worker_join(w, BOUND_MS));
        async_worker_destroy(w);
    } else {
        CHECK(err_in(async_last_error(), ASYNC_E_NOMEM, ASYNC_E_SYS));
        nomem[4]++;
    }
    if (!sched_try_create(2))
        nomem[5]++;
    /* a dump of every live fiber (built in memory first) */
    int dn = open("/dev/null", O_WRONLY | O_CLOEXEC);
    CHECK(dn >= 0);
    async_clear_error();
    if (async_sched_dump(s, dn) < 0) {
        CHECK_ERR(ASYNC_E_NOMEM);
        nomem[7]++;
    }
    close(dn);
    /* fiber-local storage off a fiber (a plain thread's values) */
    async_fiber_key_t key;
    async_clear_error();
    if (async_fiber_key_create(&key, NULL) == 0) {
        async_clear_error();
        if (async_fiber_setspecific(key, &key) == 0)
            CHECK(async_fiber_getspecific(key) == &key);
        else
            CHECK_ERR(ASYNC_E_NOMEM);
        CHECK_EQ(async_fiber_key_delete(key), 0);
    } else {
        CHECK_ERR(ASYNC_E_NOMEM);
    }
    /* an owned fd: its record may not fit; a plain thread's I/O on it works */
    int sp[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    async_clear_error();
    if (async_fiber_fd_open(s, sp[0]) != 0) {
        CHECK_ERR(ASYNC_E_NOMEM);
        nomem[6]++;
    }
    char b = 0;
    CHECK_EQ(async_fiber_write(sp[1], "z", 1, BOUND_MS), 1);
    CHECK_EQ(async_fiber_read(sp[0], &b, 1, BOUND_MS), 1);
    CHECK_EQ(b, 'z');
    CHECK_EQ(async_fiber_close(sp[0]), 0);
    CHECK_EQ(async_fiber_close(sp[1]), 0);
}

CASE(addr_space_load_child) // adversarial notsan
{
    if (!child_only())
        return;
    async_sched_t *s = sched_new(2);
    static async_fiber_t *fib[AS_MAX];
    as.park = async_chan_create(1, sizeof(int));
    as.ping = async_chan_create(0, sizeof(int));
    as.pong = async_chan_create(0, sizeof(int));
    CHECK(as.park && as.ping && as.pong);
    CHECK(async_fiber_spawn(s, as_ponger, NULL, 0) != NULL);
    CHECK(async_fiber_spawn(s, as_pinger, NULL, 0) != NULL);
    wait_count(&as.pongs, 100, "pongs before");
    /* warm the allocators, then leave 96 MiB of address space */
    long kb = vm_size_kb();
    CHECK(kb > 0);
    as_set((rlim_t)kb * 1024 + ((rlim_t)96 << 20));
    int n = 0, round_n[3] = {0, 0, 0};
    for (int round = 0; round < 3; round++) {
        n = 0;
        for (; n < AS_MAX; n++) {
            async_clear_error();
            fib[n] = async_fiber_spawn(s, as_parker, NULL, 0);
            if (!fib[n]) {
                if (async_last_error() != ASYNC_E_NOMEM)
                    fprintf(stderr, "spawn %d: error %d\n", n, async_last_error());
                CHECK_ERR(ASYNC_E_NOMEM);
                break;
            }
        }
        CHECK(n > 0 && n < AS_MAX);
        round_n[round] = n;
        /* at the limit: the ping-pong goes on, the constructors fail cleanly */
        int p0 = atomic_load(&as.pongs);
        wait_count(&as.pongs, p0 + 100, "pongs at the limit");
        int nomem[8] = {0};
        as_constructors(s, nomem);
        printf("round %d: %d fibers; NOMEM: queue %d chan %d mutex %d runtime %d worker %d sched %d fd_open %d "
               "dump %d\n",
               round, n, nomem[0], nomem[1], nomem[2], nomem[3], nomem[4], nomem[5], nomem[6], nomem[7]);
        /* and with malloc exhausted too (the ping-pong allocates nothing) */
        static void *hog[1 << 18];
        int nh = 0;
        while (nh < (1 << 18) && (hog[nh] = malloc(1024)) != NULL)
            nh++;
        memset(nomem, 0, sizeof nomem);
        as_constructors(s, nomem);
        p0 = atomic_load(&as.pongs);
        wait_count(&as.pongs, p0 + 100, "pongs with malloc exhausted");
        while (nh > 0)
            free(hog[--nh]);
        printf("  malloc exhausted: NOMEM: queue %d chan %d mutex %d runtime %d worker %d sched %d fd_open %d "
               "dump %d\n",
               nomem[0], nomem[1], nomem[2], nomem[3], nomem[4], nomem[5], nomem[6], nomem[7]);
        /* end them all: the memory comes back */
        async_chan_close(as.park);
        wait_count(&as.parked_ended, n, "parked fibers ended");
        for (double t0 = now_ms();;) { /* the parkers' stacks go back when they have finished */
            async_sched_stats_t st;
            CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
            if (st.fibers_spawned - st.fibers_finished == 2)
                break;
            CHECK(now_ms() - t0 < BOUND_MS);
            usleep(200);
        }
        async_chan_destroy(as.park);
        as.park = async_chan_create(1, sizeof(int));
        CHECK(as.park != NULL);
        atomic_store(&as.parked_ended, 0);
    }
    /* the same number again each round (give or take what the load holds) */
    CHECK(round_n[2] > round_n[0] / 2);
    as_set(RLIM_INFINITY);
    atomic_store(&as.stop, 1);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&as.bad), 0);
    async_sched_destroy(s);
    exit(0);
}

CASE(addr_space_load) // uring adversarial notsan
{
#if defined(__SANITIZE_ADDRESS__)
    printf("skipped under ASan (its shadow needs the address space)\n");
    return;
#endif
    run_child("addr_space_load_child");
}

/* ---- a runtime's completions, timers and registrations at RLIMIT_AS ----------- */

#define RA_POSTS 4000000

CASE(addr_space_runtime_child) // adversarial notsan
{
    if (!child_only())
        return;
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    long kb = vm_size_kb();
    as_set((rlim_t)kb * 1024 + ((rlim_t)64 << 20));
    /* completions until NOMEM */
    long posted = 0;
    for (; posted < RA_POSTS; posted++) {
        async_clear_error();
        if (async_runtime_post_completion(rt, 7, (uintptr_t)posted) != 0) {
            CHECK_ERR(ASYNC_E_NOMEM);
            break;
        }
    }
    /* timers until NOMEM */
    long timers = 0;
    for (; timers < RA_POSTS; timers++) {
        async_clear_error();
        if (async_runtime_add_timer(rt, 100000, 0, 9) == 0) {
            CHECK_ERR(ASYNC_E_NOMEM);
            break;
        }
    }
    /* (no async_runtime_add here: its registration map is in the Go heap,
     * whose growth can abort the process at this limit) */
    printf("posted %ld, timers %ld\n", posted, timers);
    /* everything posted is delivered, in order, also at the limit */
    static io_event_t ev[256];
    long got = 0;
    double t0 = now_ms();
    while (got < posted) {
        int m = async_runtime_wait(rt, ev, 256, 1000);
        CHECK(m >= 0);
        for (int i = 0; i < m; i++) {
            if (ev[i].event_type == ASYNC_EVENT_COMPLETION) {
                CHECK_EQ(ev[i].data, (uintptr_t)got);
                got++;
            } else {
                CHECK_EQ(ev[i].event_type, ASYNC_EVENT_TIMER); /* none is due: never */
            }
        }
        CHECK(now_ms() - t0 < 2 * BOUND_MS);
    }
    as_set(RLIM_INFINITY);
    /* and posting works again */
    CHECK_EQ(async_runtime_post_completion(rt, 8, 1), 0);
    async_runtime_deinit(rt);
    exit(0);
}

CASE(addr_space_runtime) // adversarial notsan
{
#if defined(__SANITIZE_ADDRESS__)
    printf("skipped under ASan (its shadow needs the address space)\n");
    return;
#endif
    run_child("addr_space_runtime_child");
}

/* ---- spawns racing at the RLIMIT_AS edge: host threads and fibers ------------- */

typedef struct {
    async_sched_t *s;
    async_chan_t *gate;          /* closed at the end: every holder returns */
    atomic_int ok, ran, nomem, other, stop;
    atomic_int ready, go;        /* the spawners start together, limit set */
} ch_t;

static ch_t chs;

static void ch_holder(void *arg)
{
    /* odd ones hold their stack until the end, even ones return at once */
    atomic_fetch_add(&chs.ran, 1);
    if ((intptr_t)arg & 1) {
        int v;
        (void)async_chan_recv(chs.gate, &v, -1);
    }
}

static void ch_spawn_one(intptr_t i)
{
    async_clear_error();
    if (async_fiber_spawn(chs.s, ch_holder, (void *)i, 0))
        atomic_fetch_add(&chs.ok, 1);
    else if (async_last_error() == ASYNC_E_NOMEM)
        atomic_fetch_add(&chs.nomem, 1);
    else
        atomic_fetch_add(&chs.other, 1);
}

static void ch_spawner_fiber(void *arg)
{
    (void)arg;
    while (!atomic_load(&chs.go))
        async_fiber_yield();
    for (intptr_t i = 0; !atomic_load(&chs.stop); i++) {
        ch_spawn_one(i);
        if (i % 8 == 0)
            async_fiber_yield();
    }
}

static void *ch_spawner_thread(void *arg)
{
    (void)arg;
    async_clear_error(); /* the thread's first call into the library */
    atomic_fetch_add(&chs.ready, 1);
    while (!atomic_load(&chs.go))
        sched_yield();
    for (intptr_t i = 0; !atomic_load(&chs.stop); i++)
        ch_spawn_one(i);
    return NULL;
}

CASE(addr_space_spawn_race_child) // adversarial notsan
{
    if (!child_only())
        return;
    memset(&chs, 0, sizeof chs);
    /* one malloc arena: a thread's 64 MiB arena reserved at the limit would
     * take the whole headroom the stacks are measured against */
#if defined(M_ARENA_MAX)
    CHECK_EQ(mallopt(M_ARENA_MAX, 1), 1);
#endif
    chs.s = sched_new(2);
    chs.gate = async_chan_create(0, sizeof(int));
    CHECK(chs.gate != NULL);
    /* every spawner exists before the limit and waits for the start: once
     * one spawns, the limit may be reached at any moment */
    CHECK(async_fiber_spawn(chs.s, ch_spawner_fiber, NULL, 0) != NULL);
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        start_thread(&th[i], ch_spawner_thread, NULL);
    wait_count(&chs.ready, 2, "spawner threads ready");
    as_set((rlim_t)vm_size_kb() * 1024 + ((rlim_t)64 << 20));
    atomic_store(&chs.go, 1);
    wait_count(&chs.nomem, 5000, "spawns refused at the limit");
    atomic_store(&chs.stop, 1);
    for (int i = 0; i < 2; i++)
        join_within(th[i], BOUND_MS, "spawner thread");
    async_chan_close(chs.gate);
    CHECK_EQ(async_sched_run(chs.s), 0);
    printf("spawned %d, ran %d, NOMEM %d, other %d\n", atomic_load(&chs.ok), atomic_load(&chs.ran),
           atomic_load(&chs.nomem), atomic_load(&chs.other));
    CHECK_EQ(atomic_load(&chs.other), 0);
    CHECK_EQ(atomic_load(&chs.ran), atomic_load(&chs.ok)); /* every accepted spawn ran */
    async_sched_stats_t st;
    CHECK_EQ(async_sched_get_stats(chs.s, &st, NULL, 0), 0);
    CHECK_EQ(st.fibers_spawned, st.fibers_finished);
    /* the stacks came back: as many holders as fit at first fit again */
    async_chan_destroy(chs.gate);
    chs.gate = async_chan_create(0, sizeof(int));
    int n = 0;
    for (; n < AS_MAX; n++)
        if (!async_fiber_spawn(chs.s, ch_holder, (void *)1, 0))
            break;
    CHECK_ERR(ASYNC_E_NOMEM);
    printf("holders after: %d\n", n);
    CHECK(n > 500);
    async_chan_close(chs.gate);
    CHECK_EQ(async_sched_run(chs.s), 0);
    as_set(RLIM_INFINITY);
    async_sched_destroy(chs.s);
    async_chan_destroy(chs.gate);
    exit(0);
}

CASE(addr_space_spawn_race) // adversarial notsan
{
#if defined(__SANITIZE_ADDRESS__)
    printf("skipped under ASan (its shadow needs the address space)\n");
    return;
#endif
    run_child("addr_space_spawn_race_child");
}

TEST_MAIN()
