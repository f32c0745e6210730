/* Errors: async_strerror for every code (and unknown ones), the
 * thread-local error state (async_last_error, async_clear_error: each
 * thread and fiber its own), the OS error behind ASYNC_E_SYS (from Go and
 * from C, kept on a fiber across a park) and not behind other codes, and an
 * ASYNC_BACKEND that names no backend (ASYNC_E_NOTSUP, said once). */
#include "check.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>

CASE(strerror)
{
    const char *s[ASYNC_E_STATE + 1];
    const int unknown[] = {ASYNC_E_STATE + 1, 20, 99, 1000, -1, -2, INT_MAX, INT_MIN};
    int i, j;
    for (i = ASYNC_OK; i <= ASYNC_E_STATE; i++) {
        s[i] = async_strerror(i);
        CHECK(s[i] != NULL);
        CHECK(s[i][0] != '\0');
        CHECK(strcmp(s[i], "unknown error") != 0);
        for (j = 0; j < i; j++) {
            if (strcmp(s[i], s[j]) == 0)
                fprintf(stderr, "codes %d and %d share \"%s\"\n", i, j, s[i]);
            CHECK(strcmp(s[i], s[j]) != 0);
        }
    }
    for (i = 0; i < (int)(sizeof unknown / sizeof unknown[0]); i++) {
        const char *u = async_strerror(unknown[i]);
        CHECK(u != NULL);
        CHECK(strcmp(u, "unknown error") == 0);
    }
}

static void *fresh_thread_error(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)async_last_error();
}

static void *thread_sets_inval(void *arg)
{
    (void)arg;
    CHECK(async_queue_create(0, 1, (async_queue_flags_t)0) == NULL);
    return (void *)(intptr_t)async_last_error();
}

CASE(last_error)
{
    pthread_t th;
    void *r;
    async_queue_t *q;
    /* nothing failed yet on this thread */
    CHECK_EQ(async_last_error(), ASYNC_OK);
    /* a new thread starts with ASYNC_OK even after failures elsewhere */
    async_queue_destroy(NULL);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    CHECK(pthread_create(&th, NULL, fresh_thread_error, NULL) == 0);
    pthread_join(th, &r);
    CHECK_EQ((intptr_t)r, ASYNC_OK);
    /* thread-local: another thread's failure does not change ours */
    CHECK(pthread_create(&th, NULL, thread_sets_inval, NULL) == 0);
    pthread_join(th, &r);
    CHECK_EQ((intptr_t)r, ASYNC_E_INVAL);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    /* successful calls do not reset it */
    q = async_queue_create(4, 4, (async_queue_flags_t)0);
    CHECK(q != NULL);
    CHECK(async_queue_enqueue(q, "abc", 3));
    CHECK_ERR(ASYNC_E_BADHANDLE);
    async_queue_destroy(q);
    CHECK_ERR(ASYNC_E_BADHANDLE);
}

static void *thread_clears(void *arg)
{
    (void)arg;
    async_queue_destroy(NULL);
    if (async_last_error() != ASYNC_E_BADHANDLE)
        return (void *)1;
    async_clear_error();
    return (void *)(intptr_t)async_last_error();
}

CASE(clear_error)
{
    pthread_t th;
    void *r;
    CHECK(async_queue_create(0, 0, (async_queue_flags_t)0) == NULL);
    CHECK_ERR(ASYNC_E_INVAL);
    async_clear_error();
    CHECK_ERR(ASYNC_OK);
    async_clear_error(); /* idempotent */
    CHECK_ERR(ASYNC_OK);
    /* thread-local: another thread clearing its error leaves ours */
    async_queue_destroy(NULL);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    CHECK(pthread_create(&th, NULL, thread_clears, NULL) == 0);
    pthread_join(th, &r);
    CHECK_EQ((intptr_t)r, ASYNC_OK);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    /* the void-function pattern: clear, call, check */
    async_clear_error();
    async_queue_clear(NULL);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    {
        async_queue_t *q = async_queue_create(2, 2, (async_queue_flags_t)0);
        CHECK(q != NULL);
        async_clear_error();
        async_queue_clear(q);
        CHECK_ERR(ASYNC_OK); /* it succeeded */
        async_queue_destroy(q);
    }
}

static int fd_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

/* ---- the OS error behind ASYNC_E_SYS -------------------------------------- */

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

CASE(os_error_not_sys) {
    async_clear_error();
    CHECK_EQ(async_last_os_error(), 0);
    CHECK_FAIL(!async_queue_enqueue(NULL, "x", 1), ASYNC_E_BADHANDLE);
    CHECK_EQ(async_last_os_error(), 0);
}

/* ASYNC_E_SYS from Go (the poller's epoll_create/eventfd) and from C (the
 * scheduler's) carries the errno: EMFILE with no descriptor left. */
CASE(os_error_sys) { // poll
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

CASE(os_error_fiber) {
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    async_runtime_deinit(rt);
    async_sched_t *s = sched_new(2);
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
CASE(backend_unknown) { // env=ASYNC_BACKEND=bogus
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

TEST_MAIN()
