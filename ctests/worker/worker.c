/* async_worker: state and result, join (zero, timeout, wakes, twice, bad,
 * self), stack sizes (absurd ones fail with INVAL or NOMEM), destroy of a
 * running worker, the native handle (none once the proc has returned),
 * async_worker_current, the stop fd (also polled, and signalled from a
 * signal handler), many workers, bad arguments. */
#include "check.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

/* A gate: procs block on it until the test opens it. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_open;

static void gate_open(void)
{
    pthread_mutex_lock(&g_mu);
    g_open = 1;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static void gate_wait(void)
{
    pthread_mutex_lock(&g_mu);
    while (!g_open)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

static void *gated_proc(void *ctx)
{
    gate_wait();
    return ctx;
}

static void *return_proc(void *ctx)
{
    return ctx;
}

static void *until_stop_proc(void *ctx)
{
    async_worker_t *self = async_worker_current();
    (void)ctx;
    CHECK(self != NULL);
    while (!async_worker_should_stop(self))
        sleep_ms(1);
    return (void *)(uintptr_t)0x5709;
}

/* ---------------------------------------------------------------------- */

CASE(state)
{
    async_worker_t *w = async_worker_create(gated_proc, (void *)(uintptr_t)1, 0);
    double t0;
    CHECK(w != NULL);
    CHECK_EQ(async_worker_get_state(w), ASYNC_WORKER_RUNNING);
    CHECK(!async_worker_should_stop(w));
    async_worker_signal_stop(w);
    CHECK_EQ(async_worker_get_state(w), ASYNC_WORKER_STOPPING);
    CHECK(async_worker_should_stop(w));
    async_worker_signal_stop(w); /* idempotent */
    CHECK_EQ(async_worker_get_state(w), ASYNC_WORKER_STOPPING);
    gate_open();
    CHECK(async_worker_join(w, -1));
    CHECK_EQ(async_worker_get_state(w), ASYNC_WORKER_STOPPED);
    async_worker_signal_stop(w); /* after the end: stays STOPPED */
    CHECK_EQ(async_worker_get_state(w), ASYNC_WORKER_STOPPED);
    async_worker_destroy(w);

    /* STOPPED once proc returns, without signal_stop and without join */
    w = async_worker_create(return_proc, NULL, 0);
    CHECK(w != NULL);
    t0 = now_ms();
    while (async_worker_get_state(w) != ASYNC_WORKER_STOPPED && now_ms() - t0 < 10000)
        sleep_ms(1);
    CHECK_EQ(async_worker_get_state(w), ASYNC_WORKER_STOPPED);
    CHECK(!async_worker_should_stop(w));
    async_worker_destroy(w);

    /* a cooperative loop ends on signal_stop */
    w = async_worker_create(until_stop_proc, NULL, 0);
    CHECK(w != NULL);
    sleep_ms(50);
    CHECK_EQ(async_worker_get_state(w), ASYNC_WORKER_RUNNING);
    async_worker_signal_stop(w);
    CHECK(async_worker_join(w, 10000));
    CHECK_EQ(async_worker_get_state(w), ASYNC_WORKER_STOPPED);
    CHECK(async_worker_result(w) == (void *)(uintptr_t)0x5709);
    async_worker_destroy(w);
}

CASE(result)
{
    async_worker_t *w = async_worker_create(gated_proc, (void *)(uintptr_t)0x1234, 0);
    CHECK(w != NULL);
    CHECK_FAIL(async_worker_result(w) == NULL, ASYNC_E_STATE); /* still running */
    gate_open();
    CHECK(async_worker_join(w, -1));
    CHECK(async_worker_result(w) == (void *)(uintptr_t)0x1234);
    CHECK(async_worker_result(w) == (void *)(uintptr_t)0x1234); /* stable */
    async_worker_destroy(w);
    w = async_worker_create(return_proc, NULL, 0);
    CHECK(w != NULL);
    CHECK(async_worker_join(w, -1));
    CHECK(async_worker_result(w) == NULL);
    async_worker_destroy(w);
}

CASE(join_zero)
{
    async_worker_t *w = async_worker_create(gated_proc, NULL, 0);
    double t0;
    CHECK(w != NULL);
    t0 = now_ms();
    CHECK_FAIL(!async_worker_join(w, 0), ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 < 5000); /* just checks: a join that waited would hang (the gate is closed) */
    gate_open();
    CHECK(async_worker_join(w, -1));
    CHECK(async_worker_join(w, 0));
    async_worker_destroy(w);
}

CASE(join_timeout)
{
    async_worker_t *w = async_worker_create(gated_proc, NULL, 0);
    double t0, el;
    CHECK(w != NULL);
    t0 = now_ms();
    CHECK_FAIL(!async_worker_join(w, 200), ASYNC_E_TIMEDOUT);
    el = now_ms() - t0;
    CHECK(el >= 200.0);
    CHECK(el < 200.0 + 2000.0); /* the margin the other timeouts get: a loaded or emulated host is late */
    CHECK_EQ(async_worker_get_state(w), ASYNC_WORKER_RUNNING);
    gate_open();
    CHECK(async_worker_join(w, -1));
    async_worker_destroy(w);
}

static void *sleep_proc(void *ctx)
{
    sleep_ms((int)(uintptr_t)ctx);
    return ctx;
}

CASE(join_wakes)
{
    /* join(n) returns when proc returns, not at the end of n */
    double t0 = now_ms(), el;
    async_worker_t *w = async_worker_create(sleep_proc, (void *)(uintptr_t)100, 0);
    CHECK(w != NULL);
    CHECK(async_worker_join(w, 20000));
    el = now_ms() - t0;
    CHECK(el >= 100.0);
    CHECK(el < 10000.0);
    async_worker_destroy(w);
}

static async_worker_t *g_jw;
static atomic_int g_joined;

static void *joiner_thread(void *arg)
{
    (void)arg;
    CHECK(async_worker_join(g_jw, -1));
    atomic_fetch_add(&g_joined, 1);
    return NULL;
}

CASE(join_twice)
{
    pthread_t th[2];
    int i;
    g_jw = async_worker_create(gated_proc, (void *)(uintptr_t)3, 0);
    CHECK(g_jw != NULL);
    /* two threads join concurrently; both return true */
    for (i = 0; i < 2; i++)
        CHECK(pthread_create(&th[i], NULL, joiner_thread, NULL) == 0);
    sleep_ms(50);
    CHECK_EQ(atomic_load(&g_joined), 0);
    gate_open();
    for (i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ(atomic_load(&g_joined), 2);
    CHECK(async_worker_join(g_jw, -1));
    CHECK(async_worker_join(g_jw, -1));
    CHECK(async_worker_join(g_jw, 0));
    CHECK(async_worker_join(g_jw, 10));
    CHECK(async_worker_result(g_jw) == (void *)(uintptr_t)3);
    async_worker_destroy(g_jw);
}

CASE(join_inval)
{
    async_worker_t *w = async_worker_create(gated_proc, NULL, 0);
    CHECK(w != NULL);
    CHECK_FAIL(!async_worker_join(w, -2), ASYNC_E_INVAL);
    CHECK_FAIL(!async_worker_join(w, -100), ASYNC_E_INVAL);
    gate_open();
    CHECK(async_worker_join(w, -1));
    async_worker_destroy(w);
}

static atomic_int g_self_err0, g_self_err1, g_self_ok;

static void *self_join_proc(void *ctx)
{
    async_worker_t *self = async_worker_current();
    (void)ctx;
    if (self == NULL)
        return NULL;
    async_clear_error();
    if (!async_worker_join(self, 0))
        atomic_store(&g_self_err0, async_last_error());
    async_clear_error();
    if (!async_worker_join(self, -1)) /* must not deadlock */
        atomic_store(&g_self_err1, async_last_error());
    atomic_store(&g_self_ok, 1);
    return (void *)(uintptr_t)1;
}

CASE(join_self)
{
    async_worker_t *w = async_worker_create(self_join_proc, NULL, 0);
    CHECK(w != NULL);
    CHECK(async_worker_join(w, 10000));
    CHECK_EQ(atomic_load(&g_self_ok), 1);
    CHECK_EQ(atomic_load(&g_self_err0), ASYNC_E_STATE);
    CHECK_EQ(atomic_load(&g_self_err1), ASYNC_E_STATE);
    async_worker_destroy(w);
}

static void *stack_size_proc(void *ctx)
{
    pthread_attr_t attr;
    size_t size = 0;
    (void)ctx;
    if (pthread_getattr_np(pthread_self(), &attr) != 0)
        return NULL;
    pthread_attr_getstacksize(&attr, &size);
    pthread_attr_destroy(&attr);
    return (void *)(uintptr_t)size;
}

static void *big_local_proc(void *ctx)
{
    volatile unsigned char buf[1024 * 1024];
    size_t i, sum = 0;
    (void)ctx;
    for (i = 0; i < sizeof buf; i += 512)
        buf[i] = (unsigned char)i;
    for (i = 0; i < sizeof buf; i += 512)
        sum += buf[i];
    return (void *)(uintptr_t)(sum + 1);
}

CASE(stack_size)
{
    const size_t sizes[3] = {4u << 20, 2u << 20, 300000};
    async_worker_t *w;
    int i;
    for (i = 0; i < 3; i++) {
        size_t got;
        w = async_worker_create(stack_size_proc, NULL, sizes[i]);
        CHECK(w != NULL);
        CHECK(async_worker_join(w, 10000));
        got = (size_t)(uintptr_t)async_worker_result(w);
        if (got < sizes[i])
            fprintf(stderr, "requested stack %zu, thread has %zu\n", sizes[i], got);
        CHECK(got >= sizes[i]);
        async_worker_destroy(w);
    }
    /* a proc with a 1 MiB local array runs on a 2 MiB stack */
    w = async_worker_create(big_local_proc, NULL, 2u << 20);
    CHECK(w != NULL);
    CHECK(async_worker_join(w, 10000));
    CHECK(async_worker_result(w) != NULL);
    async_worker_destroy(w);
    /* tiny and default sizes work (rounded up to the platform minimum) */
    w = async_worker_create(return_proc, (void *)(uintptr_t)9, 1);
    CHECK(w != NULL);
    CHECK(async_worker_join(w, 10000));
    CHECK(async_worker_result(w) == (void *)(uintptr_t)9);
    async_worker_destroy(w);
    w = async_worker_create(stack_size_proc, NULL, 0);
    CHECK(w != NULL);
    CHECK(async_worker_join(w, 10000));
    CHECK(async_worker_result(w) != NULL);
    async_worker_destroy(w);
}

static int g_done_pipe[2], g_ready_pipe[2];

static void *notify_at_exit_proc(void *ctx)
{
    char c = 'x';
    gate_wait();
    sleep_ms(20);
    CHECK(write(g_done_pipe[1], &c, 1) == 1);
    return ctx;
}

/* Blocks on its own stop descriptor; reports on g_done_pipe whether it woke
 * because of it and what async_worker_current() says afterwards. */
static void *stop_fd_waiter_proc(void *ctx)
{
    async_worker_t *self = async_worker_current();
    struct pollfd pfd;
    char c = 'r';
    int n;
    (void)ctx;
    pfd.fd = self ? async_worker_stop_fd(self) : -1;
    pfd.events = POLLIN;
    pfd.revents = 0;
    CHECK(write(g_ready_pipe[1], &c, 1) == 1);
    do
        n = poll(&pfd, 1, 20000);
    while (n < 0 && errno == EINTR);
    if (n != 1 || !(pfd.revents & POLLIN))
        c = 'T'; /* not woken by the stop descriptor */
    else if (async_worker_current() != NULL)
        c = 'C'; /* the handle should be invalid at once */
    else
        c = 'k';
    CHECK(write(g_done_pipe[1], &c, 1) == 1);
    return ctx;
}

CASE(destroy_running)
{
    async_worker_t *w;
    struct pollfd pfd;
    char c;
    CHECK(pipe(g_done_pipe) == 0);
    CHECK(pipe(g_ready_pipe) == 0);
    pfd.fd = g_done_pipe[0];
    pfd.events = POLLIN;

    /* destroy asks a running worker to stop, then detaches it */
    w = async_worker_create(stop_fd_waiter_proc, NULL, 0);
    CHECK(w != NULL);
    CHECK(read(g_ready_pipe[0], &c, 1) == 1); /* the proc holds its stop fd */
    async_worker_destroy(w);
    CHECK_FAIL(async_worker_get_state(w) == ASYNC_WORKER_STOPPED, ASYNC_E_BADHANDLE);
    CHECK_FAIL(!async_worker_join(w, 0), ASYNC_E_BADHANDLE);
    pfd.revents = 0;
    CHECK_EQ(poll(&pfd, 1, 15000), 1);
    CHECK(read(g_done_pipe[0], &c, 1) == 1);
    if (c != 'k')
        fprintf(stderr, "detached proc: %s\n",
                c == 'T' ? "its stop fd did not become readable" : "async_worker_current() was not NULL");
    CHECK_EQ(c, 'k');

    /* a proc that ignores the stop request keeps running after destroy and
     * finishes later; nothing crashes */
    w = async_worker_create(notify_at_exit_proc, (void *)(uintptr_t)1, 0);
    CHECK(w != NULL);
    async_worker_destroy(w);
    sleep_ms(50);
    pfd.revents = 0;
    CHECK_EQ(poll(&pfd, 1, 0), 0); /* still running: the gate is closed */
    gate_open();
    pfd.revents = 0;
    CHECK_EQ(poll(&pfd, 1, 10000), 1); /* the proc finished */
    CHECK(read(g_done_pipe[0], &c, 1) == 1);
    sleep_ms(100); /* let the record be freed */

    /* more workers can be created and destroyed afterwards */
    w = async_worker_create(return_proc, (void *)(uintptr_t)2, 0);
    CHECK(w != NULL);
    CHECK(async_worker_join(w, 10000));
    async_worker_destroy(w);
    close_pair(g_done_pipe);
    close_pair(g_ready_pipe);
}

static pthread_t g_native_self;
static atomic_int g_native_name_ok;

static void *native_proc(void *ctx)
{
    char name[32] = "";
    (void)ctx;
    g_native_self = pthread_self();
    gate_wait(); /* the test has named the thread by now */
    if (pthread_getname_np(pthread_self(), name, sizeof name) == 0 && strcmp(name, "ctest-native") == 0)
        atomic_store(&g_native_name_ok, 1);
    return NULL;
}

CASE(native_handle)
{
    async_worker_t *w = async_worker_create(native_proc, NULL, 0);
    pthread_t t;
    CHECK(w != NULL);
    t = async_worker_get_native_handle(w);
    CHECK_EQ(pthread_setname_np(t, "ctest-native"), 0);
    gate_open();
    CHECK(async_worker_join(w, 10000));
    CHECK(pthread_equal(t, g_native_self));
    CHECK_EQ(atomic_load(&g_native_name_ok), 1);
    async_worker_destroy(w);
}

static async_worker_t *volatile g_cw;
static atomic_int g_cur_ok;

static void *current_proc(void *ctx)
{
    (void)ctx;
    gate_wait(); /* g_cw is set by then */
    atomic_store(&g_cur_ok, async_worker_current() == g_cw ? 1 : 2);
    return NULL;
}

static void *plain_thread(void *arg)
{
    (void)arg;
    return async_worker_current();
}

CASE(current)
{
    pthread_t th;
    void *r = (void *)1;
    CHECK(async_worker_current() == NULL);
    CHECK(pthread_create(&th, NULL, plain_thread, NULL) == 0);
    pthread_join(th, &r);
    CHECK(r == NULL);
    g_cw = async_worker_create(current_proc, NULL, 0);
    CHECK(g_cw != NULL);
    gate_open();
    CHECK(async_worker_join(g_cw, 10000));
    CHECK_EQ(atomic_load(&g_cur_ok), 1);
    async_worker_destroy(g_cw);
    CHECK(async_worker_current() == NULL);
}

static int readable(int fd, int timeout)
{
    struct pollfd pfd;
    pfd.fd = fd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    return poll(&pfd, 1, timeout) == 1 && (pfd.revents & POLLIN);
}

CASE(stop_fd)
{
    async_worker_t *w = async_worker_create(gated_proc, NULL, 0);
    int fd;
    CHECK(w != NULL);
    fd = async_worker_stop_fd(w);
    CHECK(fd >= 0);
    CHECK(fcntl(fd, F_GETFD) != -1);
    CHECK_EQ(async_worker_stop_fd(w), fd);
    CHECK(!readable(fd, 0));
    async_worker_signal_stop(w);
    CHECK(readable(fd, 5000));
    CHECK(readable(fd, 0)); /* stays readable */
    async_worker_signal_stop(w);
    CHECK(readable(fd, 0));
    gate_open();
    CHECK(async_worker_join(w, 10000));
    CHECK(readable(fd, 0));
    async_worker_destroy(w);
}

static int g_never_pipe[2];

static void *poll_proc(void *ctx)
{
    async_worker_t *self = async_worker_current();
    struct pollfd pfd[2];
    int n;
    (void)ctx;
    if (!self)
        return NULL;
    pfd[0].fd = g_never_pipe[0];
    pfd[0].events = POLLIN;
    pfd[1].fd = async_worker_stop_fd(self);
    pfd[1].events = POLLIN;
    pfd[0].revents = pfd[1].revents = 0;
    do
        n = poll(pfd, 2, -1);
    while (n < 0 && errno == EINTR);
    if (n == 1 && pfd[1].revents == POLLIN && pfd[0].revents == 0 && async_worker_should_stop(self))
        return (void *)(uintptr_t)1;
    return (void *)(uintptr_t)2;
}

CASE(stop_fd_poll)
{
    async_worker_t *w;
    CHECK(pipe(g_never_pipe) == 0);
    w = async_worker_create(poll_proc, NULL, 0);
    CHECK(w != NULL);
    sleep_ms(100);
    CHECK_FAIL(!async_worker_join(w, 0), ASYNC_E_TIMEDOUT); /* blocked in poll */
    async_worker_signal_stop(w);
    CHECK(async_worker_join(w, 10000));
    CHECK(async_worker_result(w) == (void *)(uintptr_t)1);
    async_worker_destroy(w);
    close_pair(g_never_pipe);
}

static async_worker_t *g_sw;

static void on_sigusr1(int sig)
{
    (void)sig;
    async_worker_signal_stop(g_sw);
}

CASE(signal_stop_from_handler)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigusr1;
    sa.sa_flags = SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    g_sw = async_worker_create(until_stop_proc, NULL, 0);
    CHECK(g_sw != NULL);
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    CHECK(raise(SIGUSR1) == 0); /* the handler runs before raise returns */
    CHECK(async_worker_should_stop(g_sw));
    CHECK(async_worker_join(g_sw, 10000));
    CHECK(async_worker_result(g_sw) == (void *)(uintptr_t)0x5709);
    async_worker_destroy(g_sw);
}

static void *index_proc(void *ctx)
{
    sleep_ms(10);
    return (void *)((uintptr_t)ctx * 3 + 1);
}

CASE(many)
{
    async_worker_t *w[16];
    uintptr_t i;
    for (i = 0; i < 16; i++) {
        w[i] = async_worker_create(index_proc, (void *)i, 0);
        CHECK(w[i] != NULL);
    }
    for (i = 0; i < 16; i++) {
        CHECK(async_worker_join(w[i], 10000));
        CHECK(async_worker_result(w[i]) == (void *)(i * 3 + 1));
        async_worker_destroy(w[i]);
    }
}

CASE(create_inval)
{
    CHECK_FAIL(async_worker_create(NULL, NULL, 0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_worker_create(NULL, (void *)1, 1u << 20) == NULL, ASYNC_E_INVAL);
}

/* async_worker_get_native_handle once the worker's proc has returned gives
 * a zero-filled pthread_t with ASYNC_E_STATE: the thread no longer exists,
 * and glibc hands its id (the thread's descriptor) to the next thread it
 * creates, so a pthread_kill or pthread_cancel on a stale id would hit
 * another worker (here B). */
static atomic_int native_gate;
static void *native_quick(void *c) { return c; }
static void *native_slow(void *c)
{
    while (!atomic_load(&native_gate))
        sleep_ms(1);
    return c;
}

CASE(native_stopped) // adversarial
{
    pthread_t zero, t;
    memset(&zero, 0, sizeof zero);
    async_worker_t *a = async_worker_create(native_quick, NULL, 0);
    CHECK(a != NULL);
    CHECK(async_worker_join(a, 30000));
    CHECK_EQ(async_worker_get_state(a), ASYNC_WORKER_STOPPED);
    async_worker_t *b = async_worker_create(native_slow, NULL, 0);
    CHECK(b != NULL);
    async_clear_error();
    t = async_worker_get_native_handle(b);
    CHECK_ERR(ASYNC_OK);
    CHECK(memcmp(&t, &zero, sizeof t) != 0);
    async_clear_error();
    t = async_worker_get_native_handle(a);
    if (pthread_equal(t, async_worker_get_native_handle(b)))
        printf("A's stale id is B's thread\n");
    CHECK_ERR(ASYNC_E_STATE);
    CHECK(memcmp(&t, &zero, sizeof t) == 0);
    atomic_store(&native_gate, 1);
    CHECK(async_worker_join(b, 30000));
    CHECK_FAIL((t = async_worker_get_native_handle(b), 1), ASYNC_E_STATE);
    CHECK(memcmp(&t, &zero, sizeof t) == 0);
    async_worker_destroy(a);
    async_worker_destroy(b);
}

/* --- worker_huge_stack --------------------------------------------------------- */

static void *huge_proc(void *arg)
{
    return arg;
}

/* async_worker_create with absurd stack sizes: INVAL only when rounding up
 * to the page size overflows, NOMEM for any other stack the system cannot
 * provide (SIZE_MAX - 4096 too, although pthread_create refuses it with
 * EINVAL rather than ENOMEM). */
CASE(worker_huge_stack) // poll adversarial
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t inval[] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - (page - 2)};
    size_t nomem[] = {SIZE_MAX - (page - 1), SIZE_MAX - page, SIZE_MAX - 65535, (size_t)1 << 62, (size_t)1 << 50};
    for (size_t i = 0; i < sizeof inval / sizeof inval[0]; i++)
        CHECK_FAIL(async_worker_create(huge_proc, NULL, inval[i]) == NULL, ASYNC_E_INVAL);
    for (size_t i = 0; i < sizeof nomem / sizeof nomem[0]; i++) {
        async_clear_error();
        async_worker_t *w = async_worker_create(huge_proc, NULL, nomem[i]);
        if (w) { /* a system that could (overcommit): fine, it must work */
            CHECK(async_worker_join(w, 10000));
            async_worker_destroy(w);
            continue;
        }
        if (async_last_error() != ASYNC_E_NOMEM)
            fprintf(stderr, "stack_size %#zx: error %d, os error %d\n", nomem[i], async_last_error(),
                    async_last_os_error());
        CHECK_ERR(ASYNC_E_NOMEM);
    }
}

TEST_MAIN()
