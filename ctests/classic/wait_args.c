/* What the classic wait makes of its arguments: a huge timeval waits (it
 * is neither "return at once" nor an overflow into a short sleep), a
 * tv_usec of a second or more counts as seconds; bad arguments and handles
 * fail with the documented value; the wait never fails for memory (its
 * event buffer beyond the stack). Registered for epoll and poll. */
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/time.h>
#include <sys/wait.h>

#define ASYNC_TEST_CLASSIC /* the classic headers and check.h (rt.h) */
#include "rt.h"

/* ---- timevals ----------------------------------------------------------------- */

typedef struct {
    async_runtime_t *rt;
    atomic_int go;
} poster_t;

static void *post_later(void *arg)
{
    poster_t *p = arg;
    while (!atomic_load(&p->go))
        sleep_ms(1);
    sleep_ms(100);
    CHECK_EQ(async_runtime_post_completion(p->rt, 77, 1), 0);
    return NULL;
}

/* A huge timeval must wait (until the completion), not return at once or
 * spin. */
static void huge_one(long sec, long usec)
{
    async_runtime_t *rt = async_runtime_init();
    poster_t p;
    pthread_t th;
    int n;
    CHECK(rt);
    p.rt = rt;
    atomic_store(&p.go, 0);
    start_thread(&th, post_later, &p);
    atomic_store(&p.go, 1);
    n = waittv(rt, sec, usec);
    if (n == 0) {
        fprintf(stderr, "timeval {%ld,%ld} returned 0 at once\n", sec, usec);
    }
    CHECK_EQ(n, 1);
    CHECK_EQ(ev[0].completion_key, 77);
    join_within(th, 10000, "poster");
    async_runtime_deinit(rt);
}

CASE(tv_huge) // poll adversarial
{
    huge_one(LONG_MAX, 0);
    huge_one(LONG_MAX, 999999);
    huge_one(LONG_MAX / 1000 + 1, 0);
    huge_one((long)INT_MAX, 0);
    huge_one(0, LONG_MAX);
    huge_one(9223372036854775L, 807000);
}

/* tv_usec >= 1000000 is more seconds (as select(2) would refuse, but the
 * classic backend computed sec*1000 + usec/1000): {0, 200000000} is 200 s, so a
 * completion ends it; {0,-1} and {-1, 999999} do not wait. */
CASE(tv_odd) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    double t0;
    CHECK(rt);
    huge_one(0, 200000000);
    t0 = now_ms();
    CHECK_EQ(waittv(rt, 0, -1), 0);
    CHECK_EQ(waittv(rt, -1, 999999), 0);
    CHECK_EQ(waittv(rt, LONG_MIN, 0), 0);
    CHECK_EQ(waittv(rt, 0, LONG_MIN), 0);
    CHECK_EQ(waittv(rt, LONG_MIN, LONG_MIN), 0);
    CHECK(now_ms() - t0 < 5000);
    /* {1, -999000}: 1 ms total */
    t0 = now_ms();
    CHECK_EQ(waittv(rt, 1, -999000), 0);
    CHECK(now_ms() - t0 >= 1);
    CHECK(now_ms() - t0 < 900);
    async_runtime_deinit(rt);
}

/* ---- bad arguments and handles ------------------------------------------------------ */

CASE(badargs) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    int sp[2];
    struct timeval tv = {0, 0};
    CHECK(rt);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    CHECK_FAIL(async_runtime_wait(NULL, ev, MAXEV, &tv) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_wait(rt, NULL, MAXEV, &tv) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, 0, &tv) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, -5, &tv) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(NULL, sp[0], EVENT_READ, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_add(rt, -1, EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, INT_MAX, EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_modify(NULL, sp[0], EVENT_READ, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_modify(rt, sp[0], EVENT_READ, NULL) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_modify(rt, -1, EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_remove(NULL, sp[0]) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_remove(rt, sp[0]) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_remove(rt, -1) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add_console(NULL, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_EQ(async_runtime_get_console_type(NULL), CONSOLE_TYPE_NONE);
    CHECK(async_runtime_get_console_ctx(NULL) == NULL);
    CHECK_FAIL(async_runtime_get_event_loop_handle(NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_post_completion(NULL, 1, 1) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_wakeup(NULL) == -1, ASYNC_E_BADHANDLE);
    async_runtime_deinit(NULL);
    /* unknown event bits */
    async_clear_error();
    {
        int r = async_runtime_add(rt, sp[0], 0x100, NULL);
        fprintf(stderr, "add 0x100 -> %d err %d\n", r, async_last_error());
        if (r == 0)
            CHECK_EQ(async_runtime_remove(rt, sp[0]), 0);
    }
    /* add twice */
    CHECK_EQ(async_runtime_add(rt, sp[0], EVENT_READ, NULL), 0);
    CHECK_FAIL(async_runtime_add(rt, sp[0], EVENT_READ, NULL) == -1, ASYNC_E_EXISTS);
    CHECK_EQ(async_runtime_add(rt, sp[1], 0, NULL), 0);
    CHECK_EQ(async_runtime_add(rt, sp[1], EVENT_ERROR | EVENT_CLOSE, NULL) == -1, 1);
    CHECK_EQ(async_runtime_modify(rt, sp[1], EVENT_ERROR | EVENT_CLOSE, NULL), 0);
    CHECK_EQ(waittv(rt, 0, 0), 0);
    CHECK_EQ(async_runtime_remove(rt, sp[0]), 0);
    CHECK_EQ(async_runtime_remove(rt, sp[1]), 0);
    /* a stale handle */
    async_runtime_deinit(rt);
    CHECK_FAIL(async_runtime_wait(rt, ev, MAXEV, &tv) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_add(rt, sp[0], EVENT_READ, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_modify(rt, sp[0], EVENT_READ, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_remove(rt, sp[0]) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_add_console(rt, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_NONE);
    CHECK_FAIL(async_runtime_get_event_loop_handle(rt) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_post_completion(rt, 1, 1) == -1, ASYNC_E_BADHANDLE);
    async_runtime_deinit(rt); /* twice: nothing */
    /* garbage handles */
    CHECK_FAIL(async_runtime_wait((async_runtime_t *)(uintptr_t)0x1234, ev, MAXEV, &tv) == -1,
               ASYNC_E_BADHANDLE);
    async_runtime_deinit((async_runtime_t *)(uintptr_t)0x1234);
    CHECK_EQ(async_runtime_get_console_type((async_runtime_t *)(uintptr_t)0xdead), CONSOLE_TYPE_NONE);
    close_pair(sp);
}

/* ---- the wait never fails for memory ------------------------------------------------------- */

/* A classic wait with more room than its stack buffer allocates one for the
 * call; when that fails (here: a max_events whose buffer cannot be had) it
 * must still deliver, with fewer events per call, as the modern wait does
 * ("never fails for memory"), not fail with ASYNC_E_NOMEM: a driver takes a
 * failed wait as fatal. (Only 3 events are ready: the 64-entry array is
 * never written beyond them.) */
CHILD(wait_nomem_child)
{
    async_runtime_t *rt = async_runtime_init();
    int n;
    CHECK(rt);
    CHECK_EQ(async_runtime_post_completion(rt, 1, 10), 0);
    CHECK_EQ(async_runtime_post_completion(rt, 2, 20), 0);
    CHECK_EQ(async_runtime_post_completion(rt, 3, 30), 0);
    async_clear_error();
    n = async_runtime_wait(rt, ev, INT_MAX / 2, &(struct timeval){1, 0});
    if (n < 0)
        fprintf(stderr, "wait failed: %d\n", async_last_error());
    CHECK_EQ(n, 3);
    CHECK_EQ(ev[2].completion_key, 3);
    CHECK_EQ(ev[2].bytes_transferred, 30);
    async_runtime_deinit(rt);
}

/* Runs wait_nomem_child with ASan's malloc returning NULL (not aborting) on
 * an allocation that cannot be had, as the C library's does. */
CASE(wait_nomem) // poll adversarial
{
    static char env[1024];
    const char *old = getenv("ASAN_OPTIONS");
    int st;
    snprintf(env, sizeof env, "ASAN_OPTIONS=%s%sallocator_may_return_null=1", old ? old : "",
             old && *old ? ":" : "");
    st = run_self_case("wait_nomem_child", env);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
}

TEST_MAIN()
