/* Bad values for every public function (handles are api/bad_handles.c's
 * and fiber_sched.badinput's): timeouts below -1 (-2 and INT_MIN), zero and
 * huge sizes, NULL buffers, unknown flags and event bits, bad fds (-1,
 * INT_MIN, INT_MAX, closed, a directory, a pipe where a socket is needed),
 * bad configs. Each call fails with its documented code and changes
 * nothing. */
#include "check.h"
#include "rt.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

static void nop_fiber(void *a) { (void)a; }

static void *quick(void *a)
{
    return a;
}

/* Timeouts below -1 that every timed call refuses. */
static const int bad_to[] = {-2, -1000, INT_MIN};

/* Descriptors the calls are given: a pipe, a number just closed, a
 * directory, a listening socket and a plain (unconnected) one. */
static struct {
    int p[2], closed, dirfd, lsock, plain;
    struct sockaddr_in sa;
} bv;

static void open_fds(void)
{
    CHECK(pipe(bv.p) == 0);
    bv.closed = fcntl(bv.p[0], F_DUPFD_CLOEXEC, 900); /* a number far above the ones opened below */
    CHECK(bv.closed >= 900);
    close(bv.closed);
    bv.dirfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(bv.dirfd >= 0);
    bv.lsock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(bv.lsock >= 0);
    memset(&bv.sa, 0, sizeof bv.sa);
    bv.sa.sin_family = AF_INET;
    bv.sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(bv.lsock, (struct sockaddr *)&bv.sa, sizeof bv.sa), 0);
    CHECK_EQ(listen(bv.lsock, 4), 0);
    bv.plain = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); /* neither listening nor connected */
    CHECK(bv.plain >= 0);
}

static void close_fds(void)
{
    close_pair(bv.p);
    close(bv.dirfd);
    close(bv.lsock);
    close(bv.plain);
}

static void bad_queue_values(async_runtime_t *rt)
{
    async_queue_t *q = async_queue_create(2, 8, (async_queue_flags_t)0);
    async_queue_stats_t qs;
    char buf[64] = {0};
    size_t n = 0;
    int i;
    CHECK(q != NULL);
    CHECK_FAIL(async_queue_create(0, 8, (async_queue_flags_t)0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(8, 0, (async_queue_flags_t)0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(8, 8, (async_queue_flags_t)0x100) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_create(8, 8, (async_queue_flags_t)(ASYNC_QUEUE_DROP_OLDEST | ASYNC_QUEUE_BLOCK_WRITER)) == NULL,
               ASYNC_E_INVAL);
    /* absurd sizes: refused (INVAL or NOMEM), never attempted */
    async_clear_error();
    CHECK(async_queue_create(SIZE_MAX, 8, (async_queue_flags_t)0) == NULL);
    CHECK(async_last_error() == ASYNC_E_INVAL || async_last_error() == ASYNC_E_NOMEM);
    async_clear_error();
    CHECK(async_queue_create(8, SIZE_MAX, (async_queue_flags_t)0) == NULL);
    CHECK(async_last_error() == ASYNC_E_INVAL || async_last_error() == ASYNC_E_NOMEM);
    CHECK_FAIL(!async_queue_enqueue(q, NULL, 4), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_enqueue(q, buf, 0), ASYNC_E_INVAL);
    CHECK_FAIL(!async_queue_enqueue(q, buf, 9), ASYNC_E_TOOBIG);
    CHECK_FAIL(!async_queue_enqueue(q, buf, SIZE_MAX), ASYNC_E_TOOBIG); /* a "negative" size: never read */
    for (i = 0; i < 3; i++) {
        CHECK_FAIL(!async_queue_enqueue_wait(q, buf, 4, bad_to[i]), ASYNC_E_INVAL);
        CHECK_FAIL(!async_queue_dequeue_wait(q, buf, sizeof buf, &n, bad_to[i]), ASYNC_E_INVAL);
    }
    CHECK(async_queue_enqueue(q, buf, 4));
    CHECK_FAIL(!async_queue_dequeue(q, NULL, 8, &n), ASYNC_E_INVAL);
    n = 0;
    CHECK_FAIL(!async_queue_dequeue(q, NULL, 0, &n), ASYNC_E_BUFSIZE);
    CHECK_EQ(n, 4);
    CHECK_FAIL(!async_queue_dequeue(q, buf, 3, &n), ASYNC_E_BUFSIZE);
    async_clear_error();
    async_queue_get_stats(q, NULL);
    CHECK_ERR(ASYNC_E_INVAL);
    CHECK_FAIL(async_queue_attach(q, rt, 1) == -1, ASYNC_E_INVAL); /* no SIGNAL_ON_DATA */
    async_queue_get_stats(q, &qs);
    CHECK_EQ(qs.current_size, 1); /* nothing above changed the queue */
    CHECK_EQ(qs.enqueue_count, 1);
    async_queue_destroy(q);
}

static void bad_worker_values(void)
{
    async_worker_t *w = async_worker_create(quick, NULL, 0);
    int i;
    CHECK(w != NULL);
    CHECK_FAIL(async_worker_create(NULL, NULL, 0) == NULL, ASYNC_E_INVAL);
    async_clear_error();
    CHECK(async_worker_create(quick, NULL, SIZE_MAX) == NULL);
    CHECK(async_last_error() == ASYNC_E_INVAL || async_last_error() == ASYNC_E_NOMEM ||
          async_last_error() == ASYNC_E_SYS);
    for (i = 0; i < 3; i++)
        CHECK_FAIL(!async_worker_join(w, bad_to[i]), ASYNC_E_INVAL);
    CHECK(async_worker_join(w, 10000));
    async_worker_destroy(w);
}

static void bad_runtime_values(async_runtime_t *rt)
{
    io_event_t ev[4];
    int i;
    CHECK_FAIL(async_runtime_add(rt, -1, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, INT_MIN, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, INT_MAX, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, bv.closed, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, bv.p[0], 0x40, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(rt, bv.p[0], 0xFFFFFFFFu, NULL) == -1, ASYNC_E_INVAL);
    if (!backend_is_poll())
        CHECK_FAIL(async_runtime_add(rt, bv.dirfd, ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_modify(rt, -1, ASYNC_EVENT_READ) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_modify(rt, bv.p[0], ASYNC_EVENT_READ) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_remove(rt, -1) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_remove(rt, INT_MAX) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_remove(rt, bv.p[0]) == -1, ASYNC_E_NOTFOUND);
    CHECK_EQ(async_runtime_add(rt, bv.p[0], ASYNC_EVENT_READ, NULL), 0);
    CHECK_FAIL(async_runtime_modify(rt, bv.p[0], 0x40) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(rt, bv.p[0], ASYNC_EVENT_READ, NULL) == -1, ASYNC_E_EXISTS);
    CHECK_EQ(async_runtime_remove(rt, bv.p[0]), 0);
    CHECK_FAIL(async_runtime_wait(rt, NULL, 4, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, -1, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, INT_MIN, 0) == -1, ASYNC_E_INVAL);
    for (i = 0; i < 3; i++)
        CHECK_FAIL(async_runtime_wait(rt, ev, 4, bad_to[i]) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_cancel_timer(rt, 0) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_cancel_timer(rt, UINT64_MAX) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_cancel_timer(rt, 0x123456789ull) == -1, ASYNC_E_NOTFOUND);
    {
        /* extreme (valid) timer values are accepted and cancellable */
        uint64_t a = async_runtime_add_timer(rt, UINT64_MAX, UINT64_MAX, 1);
        uint64_t b = async_runtime_add_timer(rt, UINT64_MAX - 1, 0, 2);
        CHECK(a != 0 && b != 0 && a != b);
        CHECK_EQ(async_runtime_cancel_timer(rt, a), 0);
        CHECK_EQ(async_runtime_cancel_timer(rt, b), 0);
    }
    CHECK_EQ(async_runtime_wait(rt, ev, 4, 0), 0);
}

/* Scheduler, fibers and the fiber I/O calls, called on this plain thread
 * (they block it, as documented). */
static void bad_fiber_values(async_chan_t *ch)
{
    async_sched_config_t one = {1, 0, 0};
    async_sched_t *s = async_sched_create(&one);
    async_sched_stats_t ss;
    async_fiber_t *jf;
    char buf[64] = {0};
    int i;
    CHECK(s != NULL);
    CHECK_FAIL(async_fiber_accept(bv.plain, NULL, NULL, 0) == -1, ASYNC_E_INVAL); /* not listening */
    {
        async_sched_config_t bad[] = {{-1, 0, 0}, {1025, 0, 0}, {INT_MIN, 0, 0}, {1, 1, 0},
                                      {1, SIZE_MAX, 0}, {1, 0, 4}, {1, 0, -1}};
        for (i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++)
            CHECK_FAIL(async_sched_create(&bad[i]) == NULL, ASYNC_E_INVAL);
    }
    CHECK_FAIL(async_sched_shutdown(s, -2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_shutdown(s, INT_MIN) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(s, NULL, NULL, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(s, &ss, NULL, -1) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_get_stats(s, &ss, NULL, 2) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_spawn(s, NULL, NULL, 0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_spawn(s, nop_fiber, NULL, 0x100) == NULL, ASYNC_E_INVAL);
    jf = async_fiber_spawn(s, nop_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(jf != NULL);
    for (i = 0; i < 3; i++)
        CHECK_FAIL(async_fiber_join(jf, bad_to[i]) == -1, ASYNC_E_INVAL);
    CHECK_EQ(async_fiber_join(jf, 10000), 0);
    CHECK_FAIL(async_fiber_join(jf, 0) == -1, ASYNC_E_BADHANDLE); /* joined: gone */
    CHECK_FAIL(async_fiber_blocking(NULL, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_wait_fd(-1, ASYNC_EVENT_READ, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_wait_fd(INT_MAX, ASYNC_EVENT_READ, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_wait_fd(bv.closed, ASYNC_EVENT_READ, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_wait_fd(bv.p[0], 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_wait_fd(bv.p[0], 0x40, 0) == -1, ASYNC_E_INVAL);
    for (i = 0; i < 3; i++) {
        CHECK_FAIL(async_fiber_wait_fd(bv.p[0], ASYNC_EVENT_READ, bad_to[i]) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_read(bv.p[0], buf, 4, bad_to[i]) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_write(bv.p[1], buf, 4, bad_to[i]) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_accept(bv.lsock, NULL, NULL, bad_to[i]) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_connect(bv.plain, (struct sockaddr *)&bv.sa, sizeof bv.sa, bad_to[i]) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_chan_send(ch, buf, bad_to[i]) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_chan_recv(ch, buf, bad_to[i]) == -1, ASYNC_E_INVAL);
    }
    CHECK_FAIL(async_fiber_read(bv.p[0], NULL, 4, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_read(-1, buf, 4, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_read(bv.closed, buf, 4, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_write(bv.p[1], NULL, 4, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_write(-1, buf, 4, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_write(bv.dirfd, buf, 4, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_accept(-1, NULL, NULL, 0) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_fiber_accept(bv.p[0], NULL, NULL, 0) == -1, ASYNC_E_BADFD); /* not a socket */
    CHECK_FAIL(async_fiber_accept(bv.lsock, (struct sockaddr *)&bv.sa, NULL, 0) == -1, ASYNC_E_INVAL); /* addr, no len */
    CHECK_FAIL(async_fiber_accept(bv.lsock, NULL, NULL, 0) == -1, ASYNC_E_TIMEDOUT); /* the good call, for contrast */
    CHECK_FAIL(async_fiber_connect(bv.plain, NULL, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_connect(bv.plain, (struct sockaddr *)&bv.sa, 3, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_connect(bv.p[0], (struct sockaddr *)&bv.sa, sizeof bv.sa, 0) == -1, ASYNC_E_BADFD);
    async_sched_destroy(s);
}

static void bad_chan_values(async_chan_t *ch)
{
    int i;
    CHECK_FAIL(async_chan_create(1, 0) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(1, (1u << 20) + 1) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create((1u << 24) + 1, 1) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_create(1u << 24, 1u << 10) == NULL, ASYNC_E_INVAL); /* > 1 GiB */
    CHECK_FAIL(async_chan_create(SIZE_MAX, SIZE_MAX) == NULL, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_send(ch, NULL, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_chan_try_send(ch, NULL) == -1, ASYNC_E_INVAL);
    {
        async_chan_op_t ops[65];
        memset(ops, 0, sizeof ops);
        CHECK_FAIL(async_chan_select(NULL, 1, 0) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_chan_select(ops, 0, 0) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_chan_select(ops, 65, 0) == -1, ASYNC_E_INVAL);
        ops[0].chan = ch;
        ops[0].dir = 3;
        CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_INVAL);
        ops[0].dir = ASYNC_CHAN_SEND;
        ops[0].elem = NULL;
        CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_INVAL);
        ops[0].dir = ASYNC_CHAN_RECV;
        for (i = 0; i < 3; i++)
            CHECK_FAIL(async_chan_select(ops, 1, bad_to[i]) == -1, ASYNC_E_INVAL);
        ops[0].chan = NULL;
        CHECK_FAIL(async_chan_select(ops, 1, 0) == -1, ASYNC_E_BADHANDLE);
    }
    CHECK_FAIL(async_chan_try_recv(ch, NULL) == -1, ASYNC_E_EMPTY); /* nothing was sent by the calls above */
}

CASE(bad_values) // poll
{
    async_runtime_t *rt = mkrt();
    async_chan_t *ch = async_chan_create(1, sizeof(int));
    CHECK(ch != NULL);
    open_fds();
    bad_queue_values(rt);
    bad_worker_values();
    bad_runtime_values(rt);
    bad_fiber_values(ch);
    bad_chan_values(ch);
    /* strerror of anything */
    CHECK(strcmp(async_strerror(INT_MIN), "unknown error") == 0);
    CHECK(strcmp(async_strerror(-1), "unknown error") == 0);
    async_chan_destroy(ch);
    async_runtime_deinit(rt);
    close_fds();
}

TEST_MAIN()
