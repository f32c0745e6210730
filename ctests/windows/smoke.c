/* Windows tests of libasync.dll that the POSIX C tests (ctests/) cannot
 * cover: the runtime on SOCKETs (IOCP + AFD poll), the IOCP doorbell from C,
 * worker stop descriptors as sockets, join timeouts, and the fiber calls on a
 * plain thread (windows/fiber.c tests the fibers).
 * Built with mingw-w64 and run under wine by scripts/cross.sh:
 *   win_smoke.exe            runs every case
 *   win_smoke.exe <case>     runs one
 * Prints one line per case and "N passed, M failed". */
#include <winsock2.h>
#include <ws2tcpip.h>
#include <windows.h>

#include <stdio.h>
#include <string.h>

#include "async.h"

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

static uint64_t now_ms(void) { return GetTickCount64(); }

/* A connected loopback TCP pair. */
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

/* Waits up to ms for an event on fd carrying all of `want`; returns its bits. */
static uint32_t wait_fd(async_runtime_t *rt, SOCKET fd, uint32_t want, int ms, void **ctx) {
    io_event_t ev[8];
    uint64_t end = now_ms() + (uint64_t)ms;
    while (now_ms() < end) {
        int n = async_runtime_wait(rt, ev, 8, 50);
        if (n < 0) return 0;
        for (int i = 0; i < n; i++)
            if (ev[i].fd == (async_fd_t)fd && (ev[i].event_type & want) == want) {
                if (ctx) *ctx = ev[i].context;
                return ev[i].event_type;
            }
    }
    return 0;
}

static void t_basics(void) {
    CHECK(strcmp(async_version_string(), "") != 0);
    CHECK(strcmp(async_strerror(ASYNC_E_NOTSUP), "unknown error") != 0);
    CHECK(async_runtime_add(NULL, 0, ASYNC_EVENT_READ, NULL) == -1);
    CHECK(async_last_error() == ASYNC_E_BADHANDLE);
}

static void t_completions_timers(void) {
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    io_event_t ev[4];
    CHECK(async_runtime_post_completion(rt, 7, 42) == 0);
    CHECK(async_runtime_wait(rt, ev, 4, 1000) == 1);
    CHECK(ev[0].event_type == ASYNC_EVENT_COMPLETION && ev[0].completion_key == 7 && ev[0].data == 42);
    CHECK(ev[0].fd == (async_fd_t)-1);
    uint64_t t0 = now_ms();
    uint64_t id = async_runtime_add_timer(rt, 30, 0, 9);
    CHECK(id != 0);
    CHECK(async_runtime_wait(rt, ev, 4, 5000) == 1);
    CHECK(ev[0].event_type == ASYNC_EVENT_TIMER && ev[0].completion_key == 9 && ev[0].data == id);
    CHECK(now_ms() - t0 >= 25); /* GetTickCount64 has ~16 ms steps */
    async_runtime_deinit(rt);
}

static DWORD WINAPI wake_later(LPVOID arg) {
    Sleep(50);
    async_runtime_wakeup((async_runtime_t *)arg);
    return 0;
}

static void t_wakeup(void) {
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    io_event_t ev[4];
    /* Three wakeups with nobody waiting: the next wait returns at once, the
     * one after it does not (no phantom). */
    for (int i = 0; i < 3; i++) CHECK(async_runtime_wakeup(rt) == 0);
    uint64_t t0 = now_ms();
    CHECK(async_runtime_wait(rt, ev, 4, 5000) == 0);
    CHECK(now_ms() - t0 < 2000);
    t0 = now_ms();
    CHECK(async_runtime_wait(rt, ev, 4, 100) == 0);
    CHECK(now_ms() - t0 >= 80);
    /* From another thread while this one waits forever. */
    HANDLE th = CreateThread(NULL, 0, wake_later, rt, 0, NULL);
    CHECK(th);
    CHECK(async_runtime_wait(rt, ev, 4, -1) == 0);
    WaitForSingleObject(th, INFINITE);
    CloseHandle(th);
    async_runtime_deinit(rt);
    CHECK(async_runtime_wakeup(rt) == -1 && async_last_error() == ASYNC_E_BADHANDLE);
}

static void t_sockets(void) {
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    SOCKET c, s;
    tcp_pair(&c, &s);
    CHECK(c != INVALID_SOCKET && s != INVALID_SOCKET);
    int tag;
    CHECK(async_runtime_add(rt, s, ASYNC_EVENT_READ, &tag) == 0);
    CHECK(async_runtime_add(rt, s, ASYNC_EVENT_READ, &tag) == -1 && async_last_error() == ASYNC_E_EXISTS);
    CHECK(send(c, "hi", 2, 0) == 2);
    void *ctx = NULL;
    for (int round = 0; round < 2; round++) { /* level-triggered */
        CHECK(wait_fd(rt, s, ASYNC_EVENT_READ, 5000, &ctx) != 0);
        CHECK(ctx == &tag);
    }
    char buf[8];
    CHECK(recv(s, buf, sizeof buf, 0) == 2);
    CHECK(async_runtime_modify(rt, s, ASYNC_EVENT_WRITE) == 0);
    CHECK(wait_fd(rt, s, ASYNC_EVENT_WRITE, 5000, NULL) != 0);
    /* A peer's close is CLOSE only when asked for (a read-side hang-up). */
    CHECK(async_runtime_modify(rt, s, ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE) == 0);
    closesocket(c);
    CHECK(wait_fd(rt, s, ASYNC_EVENT_CLOSE, 5000, NULL) != 0);
    CHECK(async_runtime_remove(rt, s) == 0);
    CHECK(async_runtime_remove(rt, s) == -1 && async_last_error() == ASYNC_E_NOTFOUND);
    closesocket(s);
    /* Not a socket: an event handle. */
    HANDLE e = CreateEventW(NULL, TRUE, FALSE, NULL);
    CHECK(async_runtime_add(rt, (async_fd_t)e, ASYNC_EVENT_READ, NULL) == -1);
    CHECK(async_last_error() == ASYNC_E_BADFD);
    CloseHandle(e);
    CHECK(async_runtime_add(rt, (async_fd_t)INVALID_SOCKET, ASYNC_EVENT_READ, NULL) == -1);
    CHECK(async_last_error() == ASYNC_E_BADFD);
    async_runtime_deinit(rt);
}

/* A worker that sleeps in select() on its stop descriptor. */
static void *stop_proc(void *arg) {
    (void)arg;
    async_worker_t *self = async_worker_current();
    SOCKET fd = (SOCKET)(uintptr_t)async_worker_stop_fd(self);
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(fd, &rs);
    struct timeval tv = {10, 0};
    int n = select(0, &rs, NULL, NULL, &tv);
    return (void *)(uintptr_t)(n == 1 && async_worker_should_stop(self) ? 1 : 2);
}

static void t_worker_stop_fd(void) {
    WSADATA wsa;
    WSAStartup(MAKEWORD(2, 2), &wsa);
    async_worker_t *w = async_worker_create(stop_proc, NULL, 0);
    CHECK(w);
    CHECK(async_worker_stop_fd(w) >= 0);
    uint64_t t0 = now_ms();
    CHECK(!async_worker_join(w, 100) && async_last_error() == ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 80 && now_ms() - t0 < 5000);
    async_worker_signal_stop(w);
    CHECK(async_worker_join(w, 5000));
    CHECK(async_worker_result(w) == (void *)1);
    CHECK(async_worker_get_state(w) == ASYNC_WORKER_STOPPED);
    async_worker_destroy(w);
}

static void *small_stack_proc(void *arg) {
    volatile char buf[32 * 1024];
    buf[0] = 1;
    return (void *)((uintptr_t)arg + buf[0]);
}

static void t_worker_stack(void) {
    async_worker_t *w = async_worker_create(small_stack_proc, (void *)41, 100 * 1024);
    CHECK(w);
    CHECK(async_worker_join(w, 5000));
    CHECK(async_worker_result(w) == (void *)42);
    async_worker_destroy(w);
}

static void mark(void *arg) { *(int *)arg = 1; }

/* The fiber calls on a plain thread; the fibers themselves are tested by
 * scripts/win_fiber.c. */
static void t_fibers_plain_thread(void) {
    async_sched_t *s = async_sched_create(NULL);
    CHECK(s != NULL);
    async_sched_destroy(s);
    async_chan_t *c = async_chan_create(1, 8);
    CHECK(c != NULL);
    async_chan_destroy(c);
    CHECK(async_fiber_current() == NULL);
    int done = 0;
    CHECK(async_fiber_blocking(mark, &done) == 0 && done == 1);
    CHECK(async_fiber_sleep(1) == 0);
}

static void t_queue_attach(void) {
    async_runtime_t *rt = async_runtime_init();
    async_queue_t *q = async_queue_create(4, 16, ASYNC_QUEUE_SIGNAL_ON_DATA);
    CHECK(rt && q);
    CHECK(async_queue_attach(q, rt, 5) == 0);
    CHECK(async_queue_enqueue(q, "x", 1));
    io_event_t ev[2];
    CHECK(async_runtime_wait(rt, ev, 2, 5000) == 1);
    CHECK(ev[0].event_type == ASYNC_EVENT_COMPLETION && ev[0].completion_key == 5);
    CHECK(ev[0].data == (uintptr_t)q);
    async_queue_destroy(q);
    async_runtime_deinit(rt);
}

static const struct {
    const char *name;
    void (*fn)(void);
} cases[] = {
    {"basics", t_basics},
    {"completions_timers", t_completions_timers},
    {"wakeup", t_wakeup},
    {"sockets", t_sockets},
    {"worker_stop_fd", t_worker_stop_fd},
    {"worker_stack", t_worker_stack},
    {"fibers_plain_thread", t_fibers_plain_thread},
    {"queue_attach", t_queue_attach},
};

int main(int argc, char **argv) {
    WSADATA wsa;
    WSAStartup(MAKEWORD(2, 2), &wsa);
    int pass = 0, fail = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0) continue;
        failed = 0;
        cases[i].fn();
        printf("%s %s\n", failed ? "FAIL" : "ok  ", cases[i].name);
        if (failed)
            fail++;
        else
            pass++;
    }
    printf("win_smoke: %d passed, %d failed\n", pass, fail);
    return fail || pass == 0 ? 1 : 0;
}
