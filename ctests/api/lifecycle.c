/* Lifecycle tests (issue 10, items 9, 11, 15): handle generations that must
 * not wrap, workers that end by pthread_exit or cancellation, and the OS
 * error behind ASYNC_E_SYS. One case per ctest test (see CMakeLists.txt). */
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/resource.h>

#include "check.h"

/* ---- item 9: handle generations ----------------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* Under qemu (ASYNC_TEST_EMULATOR) and ASan, 2^24 cycles take too long (over
 * 10 s): the library's test hook ASYNC_TEST_HANDLE_GEN (read once, by the
 * first handle allocation) starts every fresh slot just below the generation
 * where a 24-bit counter wrapped, and a few thousand cycles cross that
 * point. Only the full count fails on a library without the hook. */
static long wrap_cycles(void) {
    if (SANITIZED || getenv("ASYNC_TEST_EMULATOR")) {
        CHECK_EQ(setenv("ASYNC_TEST_HANDLE_GEN", "16776960", 1), 0); /* 2^24 - 256 */
        return 4096;
    }
    return (1L << 24) + 64;
}

/* A destroyed queue handle never names the slot's next queues: 2^24+ create
 * and destroy cycles (one slot, reused each time) never hand out the
 * destroyed handle's value again, and it stays invalid. */
static void t_handle_wrap_queue(void) {
    long n = wrap_cycles();
    async_queue_t *h0 = async_queue_create(1, 8, (async_queue_flags_t)0);
    CHECK(h0 != NULL);
    async_queue_destroy(h0);
    for (long i = 0; i < n; i++) {
        async_queue_t *q = async_queue_create(1, 8, (async_queue_flags_t)0);
        if (q == h0) {
            fprintf(stderr, "cycle %ld: a new queue got the destroyed handle %p\n", i, (void *)q);
            CHECK(q != h0);
        }
        async_queue_destroy(q);
    }
    async_queue_t *q = async_queue_create(1, 8, (async_queue_flags_t)0);
    CHECK(q != NULL);
    CHECK_FAIL(!async_queue_enqueue(h0, "x", 1), ASYNC_E_BADHANDLE);
    CHECK(async_queue_is_empty(q));
    async_queue_destroy(q);
}

/* The same with the handle of a slot whose last generation was used: the
 * slot is retired, the stale handles of every type stay invalid. */
#define NEAR_END "4294967000" /* 2^32 - 296 */

static void t_handle_exhausted_queue(void) {
    CHECK_EQ(setenv("ASYNC_TEST_HANDLE_GEN", NEAR_END, 1), 0);
    async_queue_t *first = async_queue_create(1, 8, (async_queue_flags_t)0);
    CHECK(first != NULL);
    async_queue_destroy(first);
    async_queue_t *prev = first;
    for (int i = 0; i < 1000; i++) {
        async_queue_t *q = async_queue_create(1, 8, (async_queue_flags_t)0);
        CHECK(q != NULL);
        CHECK(q != first && q != prev);
        CHECK_FAIL(!async_queue_enqueue(prev, "x", 1), ASYNC_E_BADHANDLE);
        CHECK(async_queue_enqueue(q, "x", 1));
        async_queue_destroy(q);
        prev = q;
    }
    CHECK_FAIL(!async_queue_enqueue(first, "x", 1), ASYNC_E_BADHANDLE);
}

static void t_handle_exhausted_chan(void) {
    CHECK_EQ(setenv("ASYNC_TEST_HANDLE_GEN", NEAR_END, 1), 0);
    int v = 1;
    async_chan_t *first = async_chan_create(1, sizeof v);
    CHECK(first != NULL);
    async_chan_destroy(first);
    for (int i = 0; i < 1000; i++) {
        async_chan_t *c = async_chan_create(1, sizeof v);
        CHECK(c != NULL);
        CHECK(c != first);
        CHECK_EQ(async_chan_try_send(c, &v), 0);
        async_chan_destroy(c);
    }
    async_chan_t *c = async_chan_create(1, sizeof v);
    CHECK(c != NULL);
    async_clear_error();
    CHECK(async_chan_try_send(first, &v) != 0);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    CHECK_EQ(async_chan_try_send(c, &v), 0);
    async_chan_destroy(c);
}

/* Fibers spawned from a fiber reuse the worker's cached records and their
 * handle slots (la_handle_reuse): past the slot's last generation a new slot
 * is taken, and a joined fiber's handle never names a later fiber. */
static void nothing(void *arg) { (void)arg; }

typedef struct {
    async_sched_t *s;
    async_fiber_t *first;
    int ok;
} respawn_t;

static void respawner(void *arg) {
    respawn_t *r = arg;
    for (int i = 0; i < 1000; i++) {
        async_fiber_t *f = async_fiber_spawn(r->s, nothing, NULL, ASYNC_FIBER_JOINABLE);
        if (!f) return;
        if (i == 0) r->first = f;
        else if (f == r->first) return;
        if (async_fiber_join(f, 10000) != 0) return;
    }
    r->ok = async_fiber_join(r->first, 0) != 0 && async_last_error() == ASYNC_E_BADHANDLE;
}

static void t_handle_exhausted_fiber(void) {
    CHECK_EQ(setenv("ASYNC_TEST_HANDLE_GEN", NEAR_END, 1), 0);
    async_sched_config_t cfg = {1, 0, 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s != NULL);
    respawn_t r = {s, NULL, 0};
    CHECK(async_fiber_spawn(s, respawner, &r, 0) != NULL);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK(r.ok);
    async_sched_destroy(s);
}

/* ---- item 11: workers that end without returning ------------------------- */

static int fd_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

/* Worker calls are C and do not wait for the Go runtime, which starts in the
 * background when the library loads and opens descriptors of its own (its
 * poller): one of them could take a stop descriptor's number just after it
 * is closed. A runtime call waits for that start; make one first. */
static void go_started(void) {
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    async_runtime_deinit(rt);
}

/* Joins w (bounded), checks it is STOPPED with a NULL result, destroys it and
 * waits (bounded) for its stop descriptor to be closed. */
static void finish_worker(async_worker_t *w) {
    int fd = async_worker_stop_fd(w);
    CHECK(fd >= 0);
    CHECK(async_worker_join(w, 10000));
    CHECK_EQ(async_worker_get_state(w), ASYNC_WORKER_STOPPED);
    async_clear_error();
    CHECK(async_worker_result(w) == NULL);
    CHECK_ERR(ASYNC_OK);
    async_worker_destroy(w);
    double t0 = now_ms();
    while (fd_open(fd)) {
        if (now_ms() - t0 > 10000) {
            fprintf(stderr, "the stop descriptor %d is still open 10 s after destroy\n", fd);
            CHECK(!fd_open(fd));
        }
        sleep_ms(1);
    }
}

static void *exits(void *ctx) {
    (void)ctx;
    pthread_exit((void *)7);
    return NULL;
}

static void t_worker_pthread_exit(void) {
    go_started();
    for (int i = 0; i < 3; i++) {
        async_worker_t *w = async_worker_create(exits, NULL, 0);
        CHECK(w != NULL);
        finish_worker(w);
    }
}

static atomic_int spinning;

static void *waits_for_cancel(void *ctx) {
    (void)ctx;
    atomic_store(&spinning, 1);
    for (;;) {
        pthread_testcancel();
        sleep_ms(1);
    }
    return NULL;
}

static void t_worker_cancel(void) {
    go_started();
    atomic_store(&spinning, 0);
    async_worker_t *w = async_worker_create(waits_for_cancel, NULL, 0);
    CHECK(w != NULL);
    double t0 = now_ms();
    while (!atomic_load(&spinning)) {
        CHECK(now_ms() - t0 < 10000);
        sleep_ms(1);
    }
    CHECK_EQ(pthread_cancel(async_worker_get_native_handle(w)), 0);
    finish_worker(w);
}

/* ---- item 15: the OS error behind ASYNC_E_SYS ---------------------------- */

/* The lowest descriptor limit that leaves no free descriptor. */
static struct rlimit exhaust_fds(void) {
    struct rlimit old;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
    int maxfd = 0;
    for (int fd = 0; fd < 4096; fd++)
        if (fd_open(fd)) maxfd = fd;
    struct rlimit lim = old;
    lim.rlim_cur = (rlim_t)maxfd + 1;
    /* fill any hole below the limit */
    for (int fd = 0; fd <= maxfd; fd++)
        if (!fd_open(fd)) CHECK(dup2(0, fd) == fd);
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &lim), 0);
    return old;
}

static void t_os_error_not_sys(void) {
    async_clear_error();
    CHECK_EQ(async_last_os_error(), 0);
    CHECK_FAIL(!async_queue_enqueue(NULL, "x", 1), ASYNC_E_BADHANDLE);
    CHECK_EQ(async_last_os_error(), 0);
}

/* ASYNC_E_SYS from Go (the poller's epoll_create/eventfd) and from C (the
 * scheduler's) carries the errno: EMFILE with no descriptor left. */
static void t_os_error_sys(void) {
    async_runtime_t *rt = async_runtime_init(); /* Go is up before the limit */
    CHECK(rt != NULL);
    async_runtime_deinit(rt);
    struct rlimit old = exhaust_fds();
    async_clear_error();
    CHECK(async_runtime_init() == NULL);
    int e = async_last_error(), oe = async_last_os_error();
    async_clear_error();
    CHECK(async_sched_create(NULL) == NULL);
    int e2 = async_last_error(), oe2 = async_last_os_error();
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
    CHECK_EQ(e, ASYNC_E_SYS);
    CHECK_EQ(oe, EMFILE);
    CHECK_EQ(e2, ASYNC_E_SYS);
    CHECK_EQ(oe2, EMFILE);
    /* a later error of another kind resets it */
    CHECK_FAIL(!async_queue_enqueue(NULL, "x", 1), ASYNC_E_BADHANDLE);
    CHECK_EQ(async_last_os_error(), 0);
    async_clear_error();
    CHECK_EQ(async_last_os_error(), 0);
}

/* On a fiber the OS error is the fiber's, like the error code: kept across
 * a yield (the fiber may move to another worker) and unseen by the thread
 * that runs the scheduler. */
typedef struct {
    atomic_int stage; /* 1: the fiber may fail, 2: it failed, 3: checked */
    int e, oe;
} fib_err_t;

static void fails_sys(void *arg) {
    fib_err_t *x = arg;
    while (atomic_load(&x->stage) != 1) async_fiber_yield();
    async_clear_error();
    async_runtime_t *rt = async_runtime_init();
    if (rt) async_runtime_deinit(rt);
    atomic_store(&x->stage, 2);
    while (atomic_load(&x->stage) != 3) async_fiber_yield();
    x->e = async_last_error();
    x->oe = async_last_os_error();
}

static void t_os_error_fiber(void) {
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    async_runtime_deinit(rt);
    async_sched_config_t cfg = {2, 0, 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s != NULL);
    fib_err_t x = {0, 0, 0};
    CHECK(async_fiber_spawn(s, fails_sys, &x, 0) != NULL);
    struct rlimit old = exhaust_fds();
    atomic_store(&x.stage, 1);
    double t0 = now_ms();
    while (atomic_load(&x.stage) != 2) {
        if (now_ms() - t0 > 30000) {
            setrlimit(RLIMIT_NOFILE, &old);
            CHECK(!"the fiber did not fail within 30 s");
        }
        sleep_ms(1);
    }
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
    async_clear_error();
    atomic_store(&x.stage, 3);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(async_last_os_error(), 0);
    CHECK_EQ(x.e, ASYNC_E_SYS);
    CHECK_EQ(x.oe, EMFILE);
    async_sched_destroy(s);
}

/* ASYNC_BACKEND naming no backend: init fails with ASYNC_E_NOTSUP and says
 * why on stderr, once. ctest runs this case with ASYNC_BACKEND=bogus. */
static void t_backend_unknown(void) {
    const char *b = getenv("ASYNC_BACKEND");
    CHECK(b != NULL && strcmp(b, "bogus") == 0);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    fflush(stderr);
    int saved = dup(2);
    CHECK(saved >= 0);
    CHECK(dup2(p[1], 2) == 2);
    close(p[1]);
    async_clear_error();
    async_runtime_t *r1 = async_runtime_init();
    int e1 = async_last_error();
    async_clear_error();
    async_runtime_t *r2 = async_runtime_init();
    int e2 = async_last_error();
    CHECK(dup2(saved, 2) == 2);
    close(saved);
    char buf[4096];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(p[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
    buf[n] = 0;
    close(p[0]);
    fprintf(stderr, "captured stderr: [%s]\n", buf);
    CHECK(r1 == NULL && r2 == NULL);
    CHECK_EQ(e1, ASYNC_E_NOTSUP);
    CHECK_EQ(e2, ASYNC_E_NOTSUP);
    char *m = strstr(buf, "ASYNC_BACKEND");
    CHECK(m != NULL);
    CHECK(strstr(buf, "bogus") != NULL);
    CHECK(strstr(m + 1, "ASYNC_BACKEND") == NULL); /* once */
}

static const test_case_t cases[] = {
    T(handle_wrap_queue), // timeout=120
    T(handle_exhausted_queue),
    T(handle_exhausted_chan),
    T(handle_exhausted_fiber),
    T(worker_pthread_exit),
    T(worker_cancel),
    T(os_error_not_sys),
    T(os_error_sys), // poll
    T(os_error_fiber),
    T(backend_unknown), // env=ASYNC_BACKEND=bogus
};

TEST_MAIN(cases)
