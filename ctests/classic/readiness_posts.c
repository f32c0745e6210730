/* The classic calls whose meaning belongs to completion-based platforms, on
 * a readiness-based one, as the classic epoll and poll backends had them:
 * async_runtime_post_read / post_write succeed and do nothing (the driver
 * reads on the readiness event; the buffer is never touched, no event comes
 * of the post), and async_worker_get_stop_event answers NULL with
 * ASYNC_E_NOTSUP. Registered for epoll and poll. */
#include <sys/socket.h>
#include <sys/time.h>

#define ASYNC_TEST_CLASSIC /* the classic headers and check.h (rt.h) */
#include "rt.h"

/* The driver's declarations, as its port/sync.h and the classic headers had
 * them: these assignments fail to compile if a signature differs. */
typedef struct platform_event_s platform_event_t;
static int (*const post_read_fn)(async_runtime_t *, socket_fd_t, void *, size_t) = async_runtime_post_read;
static int (*const post_write_fn)(async_runtime_t *, socket_fd_t, void *, size_t) = async_runtime_post_write;
static platform_event_t *(*const stop_event_fn)(async_worker_t *) = async_worker_get_stop_event;

static int all_bytes(const unsigned char *p, size_t n, unsigned char v)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

CASE(post_read_write_do_nothing) // poll
{
    async_runtime_t *rt = async_runtime_init();
    unsigned char rbuf[16], wbuf[16];
    char got[8];
    int sp[2], n;
    CHECK(rt);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    CHECK_EQ(async_runtime_add(rt, sp[0], EVENT_READ, sp), 0);
    memset(rbuf, 0xa5, sizeof rbuf);
    memset(wbuf, 'w', sizeof wbuf);
    /* the driver's call (src/comm.c), and with buffers: all succeed */
    CHECK_EQ(post_read_fn(rt, sp[0], NULL, 0), 0);
    CHECK_EQ(async_runtime_post_read(rt, sp[0], rbuf, sizeof rbuf), 0);
    CHECK_EQ(async_runtime_post_write(rt, sp[0], wbuf, sizeof wbuf), 0);
    CHECK_EQ(post_write_fn(rt, sp[0], NULL, 0), 0);
    /* the other arguments are not looked at */
    CHECK_EQ(async_runtime_post_read(rt, -1, NULL, 99), 0);
    CHECK_EQ(async_runtime_post_write(rt, 1 << 20, NULL, 99), 0);
    /* nothing was started: no event, nothing sent, the buffer untouched */
    CHECK_EQ(waittv(rt, 0, 20000), 0);
    CHECK(all_bytes(rbuf, sizeof rbuf, 0xa5));
    CHECK_EQ(recv(sp[1], got, sizeof got, MSG_DONTWAIT), -1);
    /* readiness still comes as before, with no buffer or byte count */
    CHECK_EQ(write(sp[1], "hi", 2), 2);
    n = waittv(rt, 10, 0);
    CHECK_EQ(n, 1);
    CHECK_EQ(ev[0].fd, sp[0]);
    CHECK(ev[0].context == sp);
    CHECK_EQ(ev[0].event_type, EVENT_READ);
    CHECK(ev[0].buffer == NULL);
    CHECK_EQ(ev[0].bytes_transferred, 0);
    CHECK_EQ(ev[0].completion_key, 0);
    CHECK(all_bytes(rbuf, sizeof rbuf, 0xa5));
    CHECK_EQ(read(sp[0], got, sizeof got), 2);
    CHECK_EQ(async_runtime_remove(rt, sp[0]), 0);
    close_pair(sp);
    async_runtime_deinit(rt);
}

CASE(post_bad_handle) // poll
{
    async_runtime_t *rt = async_runtime_init();
    char b[4];
    CHECK(rt);
    CHECK_FAIL(async_runtime_post_read(NULL, 0, b, sizeof b) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_post_write(NULL, 0, b, sizeof b) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_post_read((async_runtime_t *)(uintptr_t)0x1234, 0, b, 1) == -1, ASYNC_E_BADHANDLE);
    async_runtime_deinit(rt);
    CHECK_FAIL(async_runtime_post_read(rt, 0, b, sizeof b) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_post_write(rt, 0, b, sizeof b) == -1, ASYNC_E_BADHANDLE);
}

static _Atomic int proc_result = -1;

static void *stop_event_proc(void *arg)
{
    platform_event_t *e;
    (void)arg;
    async_clear_error();
    e = stop_event_fn(async_worker_current());
    atomic_store(&proc_result, e == NULL && async_last_error() == ASYNC_E_NOTSUP ? 1 : 0);
    return NULL;
}

CASE(stop_event_not_supported) // poll
{
    async_worker_t *w = async_worker_create(stop_event_proc, NULL, 0);
    CHECK(w);
    CHECK(async_worker_join(w, 10000));
    CHECK_EQ(atomic_load(&proc_result), 1);
    async_clear_error();
    CHECK(async_worker_get_stop_event(w) == NULL);
    CHECK_ERR(ASYNC_E_NOTSUP);
    async_worker_destroy(w);
    async_clear_error();
    CHECK(async_worker_get_stop_event(NULL) == NULL);
    CHECK_ERR(ASYNC_E_NOTSUP);
}

TEST_MAIN()
