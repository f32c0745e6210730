/* Windows test of the classic lib/async API (include/async/, docs/CLASSIC_API.md)
 * on libasync.dll: overlapped reads and writes (async_runtime_post_read /
 * post_write) delivered by the classic wait with bytes_transferred and
 * buffer, completions, timevals, and the console type. Built with mingw-w64
 * and run under wine by scripts/cross.sh. Prints one line per case and
 * "N passed, M failed". */
#include "async/async_runtime.h"
#include "async/async_queue.h"
#include "async/async_worker.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

static int failed;

#define CHECK(e)                                                                                             \
    do {                                                                                                     \
        if (!(e)) {                                                                                          \
            fprintf(stderr, "  %s:%d: CHECK failed: %s (async_last_error=%d)\n", __FILE__, __LINE__, #e,     \
                    async_last_error());                                                                     \
            failed = 1;                                                                                      \
            return;                                                                                          \
        }                                                                                                    \
    } while (0)

static io_event_t events[512];

static void tcp_pair(SOCKET *a, SOCKET *b) {
    SOCKET l = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    struct sockaddr_in sa;
    int len = sizeof sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(l, (struct sockaddr *)&sa, sizeof sa);
    listen(l, 1);
    getsockname(l, (struct sockaddr *)&sa, &len);
    *a = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    connect(*a, (struct sockaddr *)&sa, sizeof sa);
    *b = accept(l, NULL, NULL);
    closesocket(l);
}

/* The next event that is not a readiness event of fd (the registration also
 * reports readiness); at most 20 waits of 10 s. */
static io_event_t *next_io(async_runtime_t *rt, SOCKET fd) {
    struct timeval tv = {10, 0};
    for (int round = 0; round < 20; round++) {
        int n = async_runtime_wait(rt, events, 512, &tv);
        for (int i = 0; i < n; i++)
            if (events[i].fd == fd && events[i].buffer != NULL) return &events[i];
    }
    return NULL;
}

static void t_overlapped(void) {
    async_runtime_t *rt = async_runtime_init();
    SOCKET a, b;
    char rbuf[32], wbuf[] = "pong";
    int ctx;
    io_event_t *ev;
    CHECK(rt);
    tcp_pair(&a, &b);
    CHECK(a != INVALID_SOCKET && b != INVALID_SOCKET);
    CHECK(async_runtime_add(rt, a, 0, &ctx) == 0);
    /* a read posted before the data arrives */
    CHECK(async_runtime_post_read(rt, a, rbuf, sizeof rbuf) == 0);
    CHECK(send(b, "hello", 5, 0) == 5);
    ev = next_io(rt, a);
    CHECK(ev != NULL);
    CHECK(ev->event_type == EVENT_READ);
    CHECK(ev->bytes_transferred == 5);
    CHECK(ev->buffer == rbuf);
    CHECK(ev->context == &ctx);
    CHECK(ev->completion_key == 0);
    CHECK(memcmp(rbuf, "hello", 5) == 0);
    /* a write */
    CHECK(async_runtime_post_write(rt, a, wbuf, 4) == 0);
    ev = next_io(rt, a);
    CHECK(ev != NULL);
    CHECK(ev->event_type == EVENT_WRITE);
    CHECK(ev->bytes_transferred == 4);
    CHECK(ev->buffer == wbuf);
    {
        char got[8];
        CHECK(recv(b, got, sizeof got, 0) == 4);
        CHECK(memcmp(got, "pong", 4) == 0);
    }
    /* the peer closes: a read completes with 0 bytes */
    closesocket(b);
    CHECK(async_runtime_post_read(rt, a, rbuf, sizeof rbuf) == 0);
    ev = next_io(rt, a);
    CHECK(ev != NULL);
    CHECK((ev->event_type & EVENT_READ) != 0);
    CHECK(ev->bytes_transferred == 0);
    /* errors */
    CHECK(async_runtime_post_read(rt, a, NULL, 4) == -1 && async_last_error() == ASYNC_E_INVAL);
    CHECK(async_runtime_post_read(NULL, a, rbuf, 4) == -1 && async_last_error() == ASYNC_E_BADHANDLE);
    CHECK(async_runtime_remove(rt, a) == 0);
    closesocket(a);
    async_runtime_deinit(rt);
}

static void t_completions(void) {
    async_runtime_t *rt = async_runtime_init();
    struct timeval tv = {0, 0};
    CHECK(rt);
    CHECK(async_runtime_wait(rt, events, 512, &tv) == 0);
    for (uintptr_t i = 0; i < 600; i++) CHECK(async_runtime_post_completion(rt, 42, i) == 0);
    uintptr_t next = 0;
    tv.tv_sec = 10;
    while (next < 600) {
        int n = async_runtime_wait(rt, events, 512, &tv);
        CHECK(n > 0 && n <= 512);
        for (int i = 0; i < n; i++) {
            CHECK(events[i].completion_key == 42);
            CHECK(events[i].event_type == EVENT_READ);
            CHECK(events[i].fd == INVALID_SOCKET);
            CHECK(events[i].bytes_transferred == next);
            next++;
        }
    }
    async_runtime_deinit(rt);
}

static void t_console(void) {
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    CHECK(async_runtime_get_console_type(rt) == CONSOLE_TYPE_NONE);
    CHECK(async_runtime_add_console(rt, (void *)rt) == 0);
    CHECK(async_runtime_get_console_ctx(rt) == (void *)rt);
    CHECK(async_runtime_get_console_event(rt) == NULL && async_last_error() == ASYNC_E_NOTSUP);
    async_runtime_deinit(rt);
    CHECK(async_runtime_get_console_type(rt) == CONSOLE_TYPE_NONE);
}

static void t_layout(void) {
    CHECK(sizeof(io_event_t) == 56);
    CHECK(offsetof(io_event_t, completion_key) == 16);
    CHECK(offsetof(io_event_t, buffer) == 48);
}

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {{"layout", t_layout}, {"completions", t_completions}, {"overlapped", t_overlapped},
                 {"console", t_console}};
    WSADATA wsa;
    int pass = 0, fail = 0;
    WSAStartup(MAKEWORD(2, 2), &wsa);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0) continue;
        failed = 0;
        cases[i].fn();
        printf("%s classic.%s\n", failed ? "FAIL" : "ok", cases[i].name);
        if (failed)
            fail++;
        else
            pass++;
    }
    printf("win_classic: %d passed, %d failed\n", pass, fail);
    return fail != 0;
}
