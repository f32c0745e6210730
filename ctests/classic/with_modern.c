/* The classic API mixed with modern translation units in one program:
 * timers and signal watches added through the modern entry points arrive
 * through the classic wait, and the modern async_runtime_deinit of a runtime
 * with classic state (console, registrations) frees it. Registered for
 * epoll and poll. */
#include <signal.h>
#include <stdatomic.h>
#include <sys/time.h>

#define ASYNC_TEST_CLASSIC /* the classic headers and check.h (rt.h) */
#include "rt.h"

/* Modern entry points, declared by hand (async.h cannot share this
 * translation unit). */
uint64_t async_runtime_add_timer(async_runtime_t *rt, uint64_t delay_ms, uint64_t repeat_ms, uintptr_t key);
int async_runtime_add_signal(async_runtime_t *rt, int signo, uintptr_t key);

/* ---- mixing with modern translation units ---------------------------------------------- */

CASE(mix_timer) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    uint64_t id;
    CHECK(rt);
    id = async_runtime_add_timer(rt, 1, 0, 0xabc);
    CHECK(id != 0);
    CHECK_EQ(waittv(rt, 5, 0), 1);
    CHECK_EQ(ev[0].completion_key, 0xabc);
    CHECK_EQ(ev[0].bytes_transferred, (size_t)id);
    CHECK_EQ(ev[0].fd, -1);
    fprintf(stderr, "timer event_type %u\n", ev[0].event_type);
    async_runtime_deinit(rt);
}

CASE(mix_signal) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    int n;
    CHECK(rt);
    CHECK_EQ(async_runtime_add_signal(rt, SIGUSR2, 0x5151), 0);
    raise(SIGUSR2);
    n = waittv(rt, 5, 0);
    fprintf(stderr, "signal: n %d fd %d key %lx type %u data %zu\n", n, ev[0].fd,
            (unsigned long)ev[0].completion_key, ev[0].event_type, ev[0].bytes_transferred);
    CHECK_EQ(n, 1);
    CHECK_EQ(ev[0].completion_key, 0x5151);
    CHECK_EQ(ev[0].fd, -1);
    async_runtime_deinit(rt);
}

/* ---- the modern deinit of a runtime with classic state --------------------------------- */

/* The modern async_runtime_deinit (what a modern translation unit calls) on
 * a runtime that has a console: the classic state goes too, as with the
 * classic deinit (get_console_type NONE afterwards), and no state is kept
 * per runtime destroyed that way. Declared by hand: from here on
 * async_runtime_deinit is the modern function. */
#undef async_runtime_deinit
void async_runtime_deinit(async_runtime_t *rt);

CASE(mix_deinit) // poll adversarial
{
    int p[2], saved = dup(0), a, i, fd;
    char path[] = "/tmp/classic_mixXXXXXX";
    CHECK(saved >= 0);
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(dup2(p[0], 0), 0);
    fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    for (i = 0; i < 2000; i++) {
        async_runtime_t *rt = async_runtime_init();
        CHECK(rt);
        CHECK_EQ(async_runtime_add_console(rt, &a), 0);
        CHECK_EQ(async_runtime_add(rt, fd, EVENT_READ, &a), 0); /* a regular file: classic state */
        CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_PIPE);
        async_runtime_deinit(rt); /* the modern one */
        CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_NONE);
        CHECK(async_runtime_get_console_ctx(rt) == NULL);
    }
    CHECK_EQ(dup2(saved, 0), 0);
    close(saved);
    close_pair(p);
    close(fd);
}

TEST_MAIN()
