/* Windows tests of the fiber layer of libasync.dll (the Win64 context switch,
 * fiber stacks and their overflow report, the IOCP/AFD fiber poller, socket
 * I/O, channels, sleep, join, blocking offload, shutdown). The POSIX fiber
 * ctests (the fiber_ folders of ctests/) use fork, pipes and int fds; docs/PLATFORMS.md
 * lists which of their cases have a counterpart here and which cannot run.
 * Built with mingw-w64 (POSIX threads from winpthreads, ctests/common/check.h) and
 * run under wine by scripts/cross.sh, one process per case:
 *   win_fiber.exe <case>
 * A failed CHECK prints file:line and exits 1. */
#include <winsock2.h>
#include <ws2tcpip.h>
#include <windows.h>

#include <stdatomic.h>

#include "check.h"


/* Waits until n fibers of s are parked; fails after 60 s. */

/* ---- spawn, yield, join, current ----------------------------------------------- */

static atomic_int counter;

static void yielder(void *arg) {
    (void)arg;
    for (int i = 0; i < 100; i++) {
        atomic_fetch_add(&counter, 1);
        async_fiber_yield();
    }
}

typedef struct {
    async_sched_t *s;
    async_fiber_t *self;
    int joined;
} parent_t;

static void parent_fiber(void *arg) {
    parent_t *p = arg;
    p->self = async_fiber_current();
    CHECK(p->self != NULL);
    async_fiber_t *k[10];
    for (int i = 0; i < 10; i++) CHECK((k[i] = async_fiber_spawn(p->s, yielder, NULL, ASYNC_FIBER_JOINABLE)));
    for (int i = 0; i < 10; i++) CHECK_EQ(async_fiber_join(k[i], -1), 0);
    CHECK_FAIL(async_fiber_join(p->self, -1) == -1, ASYNC_E_STATE);
    p->joined = 1;
}

CASE(spawn_yield_join) {
    CHECK(async_fiber_current() == NULL);
    parent_t p = {sched_new(2), NULL, 0};
    async_fiber_t *f = async_fiber_spawn(p.s, parent_fiber, &p, ASYNC_FIBER_JOINABLE);
    CHECK(f);
    for (int i = 0; i < 10; i++) CHECK(async_fiber_spawn(p.s, yielder, NULL, 0));
    CHECK_EQ(async_fiber_join(f, 30000), 0);
    CHECK(p.self == f && p.joined);
    CHECK_EQ(async_sched_run(p.s), 0);
    CHECK_EQ(atomic_load(&counter), 2000);
    async_sched_stats_t st;
    CHECK_EQ(async_sched_get_stats(p.s, &st, NULL, 0), 0);
    CHECK_EQ(st.fibers_spawned, 21);
    CHECK_EQ(st.fibers_finished, 21);
    CHECK_EQ(st.guard_mode, 2);
    async_sched_destroy(p.s);
}

static void add_one(void *arg) {
    atomic_fetch_add((atomic_int *)arg, 1);
    async_fiber_yield();
    atomic_fetch_add((atomic_int *)arg, 1);
}

/* Many fibers at once (each one a stack) on 4 workers, run twice (the
 * stacks are reused). */
CASE(many_fibers) {
    enum { N = 20000 };
    async_sched_t *s = sched_new(4);
    atomic_int n = 0;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) CHECK(async_fiber_spawn(s, add_one, &n, 0));
        CHECK_EQ(async_sched_run(s), 0);
        CHECK_EQ(atomic_load(&n), 2 * N * (round + 1));
    }
    async_sched_destroy(s);
}

/* ---- stacks -------------------------------------------------------------------- */

/* ~1 KiB a frame: 48 levels use most of a 64 KiB stack. */
__attribute__((noinline)) static int deep(int n) {
    volatile char pad[1000];
    pad[0] = (char)n;
    pad[999] = (char)n;
    if (n == 0) return pad[0] + pad[999];
    return deep(n - 1) + 1 + (pad[999] - (char)n); /* not a tail call */
}

static void deep_fiber(void *arg) {
    /* the TIB describes the fiber's stack while it runs */
    ULONG_PTR lo = 0, hi = 0;
    GetCurrentThreadStackLimits(&lo, &hi);
    volatile char here = 0;
    CHECK((ULONG_PTR)&here > lo && (ULONG_PTR)&here < hi);
    CHECK(hi - lo <= 256 * 1024);
    NT_TIB *tib = (NT_TIB *)NtCurrentTeb();
    CHECK((ULONG_PTR)tib->StackLimit <= (ULONG_PTR)&here && (ULONG_PTR)&here < (ULONG_PTR)tib->StackBase);
    int r = deep(48);
    async_fiber_yield();
    *(int *)arg = r;
}

CASE(deep_recursion) {
    ULONG_PTR lo0, hi0, lo1, hi1;
    GetCurrentThreadStackLimits(&lo0, &hi0);
    async_sched_t *s = sched_new(1);
    int r = -1;
    CHECK(async_fiber_spawn(s, deep_fiber, &r, 0));
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(r, 48);
    async_sched_destroy(s);
    GetCurrentThreadStackLimits(&lo1, &hi1);
    CHECK(lo0 == lo1 && hi0 == hi1);
}

static void unbounded(void *arg) {
    volatile char pad[512];
    pad[0] = 1;
    if (arg) unbounded(arg);
    pad[1] = pad[0];
}

/* Child of t_overflow: a fiber recursing without end. */
CASE(overflow_child) {
    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, unbounded, s, 0));
    async_sched_run(s);
    printf("the overflow was not caught\n");
    exit(0);
}

/* Runs this program with argv[1] = child_case; its exit code, with what it
 * wrote to stderr in out. */
static char self_path[MAX_PATH];

static DWORD run_child(const char *child_case, char *out, size_t cap) {
    SECURITY_ATTRIBUTES sa = {sizeof sa, NULL, TRUE};
    HANDLE rd, wr;
    CHECK(CreatePipe(&rd, &wr, &sa, 0));
    SetHandleInformation(rd, HANDLE_FLAG_INHERIT, 0);
    STARTUPINFOA si;
    memset(&si, 0, sizeof si);
    si.cb = sizeof si;
    si.dwFlags = STARTF_USESTDHANDLES;
    si.hStdInput = GetStdHandle(STD_INPUT_HANDLE);
    si.hStdOutput = wr;
    si.hStdError = wr;
    PROCESS_INFORMATION pi;
    char cmd[2 * MAX_PATH];
    snprintf(cmd, sizeof cmd, "\"%s\" %s", self_path, child_case);
    CHECK(CreateProcessA(NULL, cmd, NULL, NULL, TRUE, 0, NULL, NULL, &si, &pi));
    CloseHandle(wr);
    size_t n = 0;
    DWORD got;
    while (n + 1 < cap && ReadFile(rd, out + n, (DWORD)(cap - 1 - n), &got, NULL) && got > 0) n += got;
    out[n] = 0;
    CloseHandle(rd);
    CHECK_EQ(WaitForSingleObject(pi.hProcess, 60000), WAIT_OBJECT_0);
    DWORD code = 0;
    GetExitCodeProcess(pi.hProcess, &code);
    CloseHandle(pi.hProcess);
    CloseHandle(pi.hThread);
    return code;
}

CASE(overflow) {
    char out[4096];
    DWORD code = run_child("overflow_child", out, sizeof out);
    printf("child exit %lu, output:\n%s", (unsigned long)code, out);
    CHECK(strstr(out, "fiber stack overflow in fiber") != NULL);
    CHECK(strstr(out, "; raise async_sched_config_t.stack_size or ASYNC_FIBER_STACK_KB)") != NULL);
    CHECK_EQ(code, 3);
}

CASE(guard_modes) {
    async_sched_config_t c1 = {1, 0, 1}, c2 = {1, 32 * 1024, 2}, c3 = {1, 0, 3};
    CHECK_FAIL(async_sched_create(&c1) == NULL, ASYNC_E_NOTSUP);
    CHECK_FAIL(async_sched_create(&c3) == NULL, ASYNC_E_NOTSUP);
    async_sched_t *s = async_sched_create(&c2);
    CHECK(s);
    atomic_store(&counter, 0);
    for (int i = 0; i < 10; i++) CHECK(async_fiber_spawn(s, yielder, NULL, 0));
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&counter), 1000);
    async_sched_stats_t st;
    CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
    CHECK_EQ(st.guard_mode, 2);
    CHECK_EQ(st.stack_size, 32 * 1024);
    async_sched_destroy(s);
}

/* ---- unwinding on a fiber stack --------------------------------------------------
 * msvcrt's longjmp on x64 unwinds with RtlUnwindEx, which checks every frame
 * against the TIB's StackLimit..StackBase; a stack walk must end at the
 * fiber's first frame (la_ctx_trampoline's unwind data). */
#include <setjmp.h>

static jmp_buf jb;
static volatile int jump_value = 7;

__attribute__((noinline)) static void jump_back(int depth) {
    volatile char pad[256];
    pad[0] = (char)depth;
    if (depth > 0) {
        jump_back(depth - 1);
    } else {
        async_fiber_yield(); /* resume, then unwind across the switch */
        if (jump_value) longjmp(jb, jump_value);
    }
    pad[1] = pad[0];
}

static void unwind_fiber(void *arg) {
    int *out = arg;
    volatile int jumped = 0;
    int r = setjmp(jb);
    if (r == 0) {
        jump_back(20);
    } else {
        jumped = r;
    }
    void *frames[64];
    USHORT n = RtlCaptureStackBackTrace(0, 64, frames, NULL);
    out[0] = jumped;
    out[1] = n;
}

CASE(unwind) {
    async_sched_t *s = sched_new(1);
    int out[2] = {0, 0};
    CHECK(async_fiber_spawn(s, unwind_fiber, out, 0));
    CHECK_EQ(async_sched_run(s), 0);
    printf("longjmp returned %d; a stack walk on the fiber saw %d frames\n", out[0], out[1]);
    CHECK_EQ(out[0], 7);
    CHECK(out[1] >= 2 && out[1] < 64);
    async_sched_destroy(s);
}

/* ---- xmm6-xmm15 across a switch ---------------------------------------------------
 * xmm_roundtrip(in, out, fn): loads xmm6..xmm15 from in[0..159], calls fn
 * (a yield), stores them to out; keeps its caller's xmm6-15 (Win64 ABI). */
void xmm_roundtrip(const unsigned char *in, unsigned char *out, void (*fn)(void));
__asm__(".text\n"
        ".globl xmm_roundtrip\n"
        "xmm_roundtrip:\n"
        "  pushq %rbx\n"
        "  subq $192, %rsp\n"
        "  movups %xmm6, 32(%rsp)\n  movups %xmm7, 48(%rsp)\n  movups %xmm8, 64(%rsp)\n"
        "  movups %xmm9, 80(%rsp)\n  movups %xmm10, 96(%rsp)\n  movups %xmm11, 112(%rsp)\n"
        "  movups %xmm12, 128(%rsp)\n  movups %xmm13, 144(%rsp)\n  movups %xmm14, 160(%rsp)\n"
        "  movups %xmm15, 176(%rsp)\n"
        "  movq %rdx, %rbx\n"
        "  movups 0(%rcx), %xmm6\n  movups 16(%rcx), %xmm7\n  movups 32(%rcx), %xmm8\n"
        "  movups 48(%rcx), %xmm9\n  movups 64(%rcx), %xmm10\n  movups 80(%rcx), %xmm11\n"
        "  movups 96(%rcx), %xmm12\n  movups 112(%rcx), %xmm13\n  movups 128(%rcx), %xmm14\n"
        "  movups 144(%rcx), %xmm15\n"
        "  call *%r8\n"
        "  movups %xmm6, 0(%rbx)\n  movups %xmm7, 16(%rbx)\n  movups %xmm8, 32(%rbx)\n"
        "  movups %xmm9, 48(%rbx)\n  movups %xmm10, 64(%rbx)\n  movups %xmm11, 80(%rbx)\n"
        "  movups %xmm12, 96(%rbx)\n  movups %xmm13, 112(%rbx)\n  movups %xmm14, 128(%rbx)\n"
        "  movups %xmm15, 144(%rbx)\n"
        "  movups 32(%rsp), %xmm6\n  movups 48(%rsp), %xmm7\n  movups 64(%rsp), %xmm8\n"
        "  movups 80(%rsp), %xmm9\n  movups 96(%rsp), %xmm10\n  movups 112(%rsp), %xmm11\n"
        "  movups 128(%rsp), %xmm12\n  movups 144(%rsp), %xmm13\n  movups 160(%rsp), %xmm14\n"
        "  movups 176(%rsp), %xmm15\n"
        "  addq $192, %rsp\n"
        "  popq %rbx\n"
        "  ret\n");

static void do_yield(void) { async_fiber_yield(); }

static atomic_int xmm_bad;

static void xmm_fiber(void *arg) {
    unsigned char in[160], out[160];
    for (int i = 0; i < 160; i++) in[i] = (unsigned char)((uintptr_t)arg * 37 + (unsigned)i);
    for (int round = 0; round < 50; round++) {
        memset(out, 0, sizeof out);
        xmm_roundtrip(in, out, do_yield);
        if (memcmp(in, out, sizeof in) != 0) atomic_fetch_add(&xmm_bad, 1);
    }
}

CASE(xmm_preserved) {
    /* one worker: every yield switches to another fiber with other values */
    async_sched_t *s = sched_new(1);
    for (uintptr_t i = 1; i <= 4; i++) CHECK(async_fiber_spawn(s, xmm_fiber, (void *)i, 0));
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&xmm_bad), 0);
    async_sched_destroy(s);
}

/* ---- channels ---------------------------------------------------------------------- */

typedef struct {
    async_chan_t *in, *out;
    long n;
} relay_t;

/* Receives n longs from in, sends each + 1 to out, closes out. */
static void relay_fiber(void *arg) {
    relay_t *r = arg;
    long v;
    for (long i = 0; i < r->n; i++) {
        CHECK_EQ(async_chan_recv(r->in, &v, 30000), 0);
        CHECK_EQ(v, i);
        v++;
        CHECK_EQ(async_chan_send(r->out, &v, 30000), 0);
    }
    CHECK_FAIL(async_chan_recv(r->in, &v, 30000) == -1, ASYNC_E_CLOSED);
    async_chan_close(r->out);
}

static void *feeder(void *arg) {
    relay_t *r = arg;
    for (long i = 0; i < r->n; i++) CHECK_EQ(async_chan_send(r->in, &i, 30000), 0);
    async_chan_close(r->in);
    return NULL;
}

static void chan_case(size_t cap) {
    async_sched_t *s = sched_new(2);
    /* wine's emulated thread wake-ups make each rendezvous slow: fewer */
    relay_t r = {async_chan_create(cap, sizeof(long)), async_chan_create(cap, sizeof(long)), cap ? 20000 : 2000};
    CHECK(r.in && r.out);
    CHECK(async_fiber_spawn(s, relay_fiber, &r, 0));
    pthread_t th;
    start_thread(&th, feeder, &r);
    long v;
    for (long i = 0; i < r.n; i++) {
        CHECK_EQ(async_chan_recv(r.out, &v, 30000), 0);
        CHECK_EQ(v, i + 1);
    }
    CHECK_FAIL(async_chan_recv(r.out, &v, 30000) == -1, ASYNC_E_CLOSED);
    join_within(th, 30000, "feeder");
    CHECK_EQ(async_sched_run(s), 0);
    async_chan_destroy(r.in);
    async_chan_destroy(r.out);
    async_sched_destroy(s);
}

CASE(chan_thread_buffered) { chan_case(16); }
CASE(chan_thread_rendezvous) { chan_case(0); }

/* ---- sleep ------------------------------------------------------------------------ */

static atomic_int wake_seq;

static void sleep_fiber(void *arg) {
    int *slot = arg;
    CHECK_EQ(async_fiber_sleep((uint64_t)slot[0]), 0);
    slot[1] = atomic_fetch_add(&wake_seq, 1);
}

CASE(sleep_order) {
    /* one worker: timers fire in deadline order and wake in that order */
    async_sched_t *s = sched_new(1);
    int slots[5][2] = {{80, -1}, {10, -1}, {160, -1}, {40, -1}, {0, -1}};
    for (int i = 0; i < 5; i++) CHECK(async_fiber_spawn(s, sleep_fiber, slots[i], 0));
    double t0 = now_ms();
    CHECK_EQ(async_sched_run(s), 0);
    CHECK(now_ms() - t0 >= 159.0);
    CHECK_EQ(slots[4][1], 0);
    CHECK_EQ(slots[1][1], 1);
    CHECK_EQ(slots[3][1], 2);
    CHECK_EQ(slots[0][1], 3);
    CHECK_EQ(slots[2][1], 4);
    /* a plain thread sleeps the thread */
    t0 = now_ms();
    CHECK_EQ(async_fiber_sleep(20), 0);
    CHECK(now_ms() - t0 >= 19.0);
    async_sched_destroy(s);
}

/* ---- blocking offload ---------------------------------------------------------------- */

typedef struct {
    HANDLE ev;
    DWORD worker_tid, blocking_tid;
    int done;
} blk_t;

static void blocking_fn(void *arg) {
    blk_t *b = arg;
    b->blocking_tid = GetCurrentThreadId();
    /* set by the other fiber: runs only if the worker is not blocked here */
    CHECK_EQ(WaitForSingleObject(b->ev, 30000), WAIT_OBJECT_0);
}

static void blocker_fiber(void *arg) {
    blk_t *b = arg;
    b->worker_tid = GetCurrentThreadId();
    CHECK_EQ(async_fiber_blocking(blocking_fn, b), 0);
    b->done = 1;
}

static void setter_fiber(void *arg) {
    blk_t *b = arg;
    async_fiber_sleep(5);
    SetEvent(b->ev);
}

CASE(blocking) {
    async_sched_t *s = sched_new(1);
    blk_t b = {CreateEventA(NULL, TRUE, FALSE, NULL), 0, 0, 0};
    CHECK(b.ev);
    CHECK(async_fiber_spawn(s, blocker_fiber, &b, 0));
    CHECK(async_fiber_spawn(s, setter_fiber, &b, 0));
    CHECK_EQ(async_sched_run(s), 0);
    CHECK(b.done);
    CHECK(b.blocking_tid != 0 && b.blocking_tid != b.worker_tid);
    CloseHandle(b.ev);
    async_sched_destroy(s);
}

/* ---- shutdown with parked fibers ------------------------------------------------------ */

static void nop_fiber(void *arg) { (void)arg; }

static atomic_int cancelled;

static void park_recv(void *arg) {
    long v;
    if (async_chan_recv(arg, &v, -1) == -1 && async_last_error() == ASYNC_E_CANCELLED)
        atomic_fetch_add(&cancelled, 1);
}

static void park_sleep(void *arg) {
    (void)arg;
    if (async_fiber_sleep(3600 * 1000) == -1 && async_last_error() == ASYNC_E_CANCELLED)
        atomic_fetch_add(&cancelled, 1);
}

static void park_fd(void *arg) {
    if (async_fiber_wait_fd((async_fd_t)(uintptr_t)arg, ASYNC_EVENT_READ, -1) == -1 &&
        async_last_error() == ASYNC_E_CANCELLED)
        atomic_fetch_add(&cancelled, 1);
}

/* A connected loopback TCP pair. */
static void tcp_pair(SOCKET *a, SOCKET *b) {
    SOCKET l = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    CHECK(l != INVALID_SOCKET);
    struct sockaddr_in sa;
    int len = sizeof sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(l, (struct sockaddr *)&sa, sizeof sa), 0);
    CHECK_EQ(listen(l, 1), 0);
    CHECK_EQ(getsockname(l, (struct sockaddr *)&sa, &len), 0);
    *a = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    CHECK_EQ(connect(*a, (struct sockaddr *)&sa, sizeof sa), 0);
    *b = accept(l, NULL, NULL);
    CHECK(*b != INVALID_SOCKET);
    closesocket(l);
}

CASE(shutdown_parked) {
    async_sched_t *s = sched_new(2);
    async_chan_t *c = async_chan_create(0, sizeof(long));
    SOCKET a, b;
    tcp_pair(&a, &b);
    for (int i = 0; i < 5; i++) {
        CHECK(async_fiber_spawn(s, park_recv, c, 0));
        CHECK(async_fiber_spawn(s, park_sleep, NULL, 0));
    }
    CHECK(async_fiber_spawn(s, park_fd, (void *)(uintptr_t)a, 0));
    sched_wait_parked(s, 11);
    CHECK_EQ(async_sched_shutdown(s, 30000), 0);
    CHECK_EQ(atomic_load(&cancelled), 11);
    CHECK_FAIL(async_fiber_spawn(s, nop_fiber, NULL, 0) == NULL, ASYNC_E_CANCELLED);
    async_sched_destroy(s);
    async_chan_destroy(c);
    closesocket(a);
    closesocket(b);
}

/* ---- sockets -------------------------------------------------------------------------- */

typedef struct {
    SOCKET l;
    struct sockaddr_in addr;
    int served;
} srv_t;

static void echo_server(void *arg) {
    srv_t *sv = arg;
    for (int k = 0; k < 3; k++) {
        async_fd_t c = async_fiber_accept((async_fd_t)sv->l, NULL, NULL, 30000);
        CHECK(c != (async_fd_t)INVALID_SOCKET);
        char buf[256];
        for (;;) {
            ssize_t n = async_fiber_read(c, buf, sizeof buf, 30000);
            CHECK(n >= 0);
            if (n == 0) break;
            CHECK_EQ(async_fiber_write(c, buf, (size_t)n, 30000), n);
        }
        closesocket((SOCKET)c);
        sv->served++;
    }
}

static void echo_client(void *arg) {
    srv_t *sv = arg;
    SOCKET s = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    CHECK(s != INVALID_SOCKET);
    CHECK_EQ(async_fiber_connect((async_fd_t)s, (struct sockaddr *)&sv->addr, sizeof sv->addr, 30000), 0);
    /* nothing to read yet: the wait times out */
    CHECK_FAIL(async_fiber_wait_fd((async_fd_t)s, ASYNC_EVENT_READ, 30) == -1, ASYNC_E_TIMEDOUT);
    int w = async_fiber_wait_fd((async_fd_t)s, ASYNC_EVENT_WRITE, 30000);
    CHECK(w > 0 && (w & ASYNC_EVENT_WRITE));
    /* heap: 200 KB would overflow the 64 KiB fiber stack */
    char *big = malloc(100000), *back = malloc(100000);
    CHECK(big && back);
    for (size_t i = 0; i < 100000; i++) big[i] = (char)(i * 7);
    CHECK_EQ(async_fiber_write((async_fd_t)s, big, 100000, 30000), (ssize_t)100000);
    size_t got = 0;
    while (got < 100000) {
        ssize_t n = async_fiber_read((async_fd_t)s, back + got, 100000 - got, 30000);
        CHECK(n > 0);
        got += (size_t)n;
    }
    CHECK(memcmp(big, back, 100000) == 0);
    shutdown(s, SD_SEND);
    CHECK_EQ(async_fiber_read((async_fd_t)s, back, 1, 30000), 0);
    closesocket(s);
    free(big);
    free(back);
}

CASE(sockets) {
    async_sched_t *s = sched_new(2);
    srv_t sv = {socket(AF_INET, SOCK_STREAM, IPPROTO_TCP), {0}, 0};
    CHECK(sv.l != INVALID_SOCKET);
    int len = sizeof sv.addr;
    sv.addr.sin_family = AF_INET;
    sv.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(sv.l, (struct sockaddr *)&sv.addr, sizeof sv.addr), 0);
    CHECK_EQ(listen(sv.l, 8), 0);
    CHECK_EQ(getsockname(sv.l, (struct sockaddr *)&sv.addr, &len), 0);
    async_fiber_t *srv = async_fiber_spawn(s, echo_server, &sv, ASYNC_FIBER_JOINABLE);
    CHECK(srv);
    for (int i = 0; i < 3; i++) CHECK(async_fiber_spawn(s, echo_client, &sv, 0));
    CHECK_EQ(async_fiber_join(srv, 60000), 0);
    CHECK_EQ(sv.served, 3);
    CHECK_EQ(async_sched_run(s), 0);
    closesocket(sv.l);
    async_sched_destroy(s);
}

/* ---- server helpers: listen, read_full, UDP ------------------------------------------ */

static int port_of(SOCKET s) {
    struct sockaddr_storage ss;
    int l = sizeof ss;
    CHECK_EQ(getsockname(s, (struct sockaddr *)&ss, &l), 0);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static atomic_int net_phase;
static async_sched_t *net_sched;

static void net_client(void *arg) {
    struct sockaddr_storage *a = arg;
    SOCKET c = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    CHECK(c != INVALID_SOCKET);
    CHECK_EQ(async_fiber_connect((async_fd_t)c, (struct sockaddr *)a, sizeof(struct sockaddr_in), 30000), 0);
    char chunk[100];
    for (int i = 0; i < 13; i++) { /* 1300 bytes in small writes */
        memset(chunk, 'a' + i, sizeof chunk);
        CHECK_EQ(async_fiber_write((async_fd_t)c, chunk, sizeof chunk, 30000), 100);
        async_fiber_sleep(1);
    }
    while (!atomic_load(&net_phase)) async_fiber_sleep(5);
    closesocket(c);
}

static void net_server(void *arg) {
    (void)arg;
    struct sockaddr_storage a;
    socklen_t l;
    CHECK_EQ(async_sockaddr_parse("127.0.0.1", 0, &a, &l), 0);
    async_fd_t lfd = async_fiber_listen((struct sockaddr *)&a, l, 0, 0);
    CHECK(lfd != (async_fd_t)INVALID_SOCKET);
    ((struct sockaddr_in *)&a)->sin_port = htons((u_short)port_of((SOCKET)lfd));
    CHECK_FAIL(async_fiber_listen((struct sockaddr *)&a, l, 0, 0) == (async_fd_t)INVALID_SOCKET, ASYNC_E_EXISTS);
    CHECK_FAIL(async_fiber_listen((struct sockaddr *)&a, l, 0, ASYNC_LISTEN_REUSEPORT) == (async_fd_t)INVALID_SOCKET,
               ASYNC_E_NOTSUP);
    CHECK_FAIL(async_fiber_listen((struct sockaddr *)&a, 4, 0, 0) == (async_fd_t)INVALID_SOCKET, ASYNC_E_INVAL);
    CHECK(async_fiber_spawn(net_sched, net_client, &a, 0));
    async_fd_t c = async_fiber_accept(lfd, NULL, NULL, 30000);
    CHECK(c != (async_fd_t)INVALID_SOCKET);
    char buf[1000];
    size_t got = 0;
    CHECK_EQ(async_fiber_read_full(c, buf, 1000, &got, 30000), 1000);
    CHECK_EQ(got, 1000);
    CHECK_EQ(buf[0], 'a');
    CHECK_EQ(buf[999], 'a' + 9);
    /* 300 more come, then nothing: a timeout with the 300 kept */
    CHECK_FAIL(async_fiber_read_full(c, buf, 1000, &got, 300) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(got, 300);
    CHECK_EQ(buf[299], 'a' + 12);
    atomic_store(&net_phase, 1);
    /* the peer's close: end of file, a short count */
    CHECK_EQ(async_fiber_read_full(c, buf, 10, &got, 30000), 0);
    CHECK_EQ(async_fiber_close(c), 0);
    CHECK_EQ(async_fiber_close(lfd), 0);
}

CASE(net_listen_read_full) {
    async_sched_t *s = net_sched = sched_new(2);
    CHECK(async_fiber_spawn(s, net_server, NULL, 0));
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
}

static void net_udp(void *arg) {
    (void)arg;
    struct sockaddr_storage sa, ca, from;
    socklen_t sl, cl, fl;
    CHECK_EQ(async_sockaddr_parse("127.0.0.1", 0, &sa, &sl), 0);
    CHECK_EQ(async_sockaddr_parse("127.0.0.1", 0, &ca, &cl), 0);
    async_fd_t srv = async_fiber_udp_bind((struct sockaddr *)&sa, sl, 0);
    async_fd_t cli = async_fiber_udp_bind((struct sockaddr *)&ca, cl, 0);
    CHECK(srv != (async_fd_t)INVALID_SOCKET && cli != (async_fd_t)INVALID_SOCKET);
    ((struct sockaddr_in *)&sa)->sin_port = htons((u_short)port_of((SOCKET)srv));
    int cport = port_of((SOCKET)cli);
    CHECK_FAIL(async_fiber_udp_bind((struct sockaddr *)&sa, sl, 0) == (async_fd_t)INVALID_SOCKET, ASYNC_E_EXISTS);
    char buf[100];
    /* the source address; a reply to it */
    CHECK_EQ(async_fiber_sendto(cli, "hello", 5, (struct sockaddr *)&sa, sl, 30000), 5);
    fl = sizeof from;
    CHECK_EQ(async_fiber_recvfrom(srv, buf, sizeof buf, (struct sockaddr *)&from, &fl, 30000), 5);
    CHECK_EQ(fl, sizeof(struct sockaddr_in));
    CHECK_EQ(ntohs(((struct sockaddr_in *)&from)->sin_port), cport);
    CHECK_EQ(async_fiber_sendto(srv, "back", 4, (struct sockaddr *)&from, fl, 30000), 4);
    CHECK_EQ(async_fiber_recvfrom(cli, buf, sizeof buf, NULL, NULL, 30000), 4);
    /* cut to the buffer; the empty datagram */
    memset(buf, 'x', sizeof buf);
    CHECK_EQ(async_fiber_sendto(cli, buf, sizeof buf, (struct sockaddr *)&sa, sl, 30000), 100);
    CHECK_EQ(async_fiber_recvfrom(srv, buf, 10, NULL, NULL, 30000), 10);
    CHECK_EQ(async_fiber_sendto(cli, NULL, 0, (struct sockaddr *)&sa, sl, 30000), 0);
    CHECK_EQ(async_fiber_recvfrom(srv, buf, sizeof buf, NULL, NULL, 30000), 0);
    /* nothing left; too large; bad input */
    CHECK_FAIL(async_fiber_recvfrom(srv, buf, sizeof buf, NULL, NULL, 50) == -1, ASYNC_E_TIMEDOUT);
    char *big = calloc(1, 70000);
    CHECK(big);
    CHECK_FAIL(async_fiber_sendto(cli, big, 70000, (struct sockaddr *)&sa, sl, 30000) == -1, ASYNC_E_TOOBIG);
    free(big);
    CHECK_FAIL(async_fiber_recvfrom(srv, buf, sizeof buf, (struct sockaddr *)&from, NULL, 50) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_sendto(srv, NULL, 4, (struct sockaddr *)&sa, sl, 50) == -1, ASYNC_E_INVAL);
    CHECK_EQ(async_fiber_close(srv), 0);
    CHECK_EQ(async_fiber_close(cli), 0);
}

CASE(net_udp) {
    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, net_udp, NULL, 0));
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    net_udp(NULL); /* and on this plain thread */
}

typedef struct {
    SOCKET s;
    int ev, err;
} fdw_t;

static void fd_waiter(void *arg) {
    fdw_t *w = arg;
    w->ev = async_fiber_wait_fd((async_fd_t)w->s, ASYNC_EVENT_READ, 30000);
    w->err = async_last_error();
}

/* A fiber parked on a socket is woken by data a plain thread sends, and a
 * closed peer is reported. */
CASE(wait_fd_wake) {
    async_sched_t *s = sched_new(1);
    SOCKET a, b;
    tcp_pair(&a, &b);
    fdw_t w = {a, -2, 0};
    CHECK(async_fiber_spawn(s, fd_waiter, &w, 0));
    sched_wait_parked(s, 1);
    CHECK_EQ(send(b, "x", 1, 0), 1);
    CHECK_EQ(async_sched_run(s), 0);
    printf("wait_fd after a send: %d (error %d)\n", w.ev, w.err);
    CHECK(w.ev > 0 && (w.ev & ASYNC_EVENT_READ));
    char c;
    CHECK_EQ(async_fiber_read((async_fd_t)a, &c, 1, 1000), 1); /* plain thread */
    w.ev = -2;
    CHECK(async_fiber_spawn(s, fd_waiter, &w, 0));
    sched_wait_parked(s, 1);
    closesocket(b);
    CHECK_EQ(async_sched_run(s), 0);
    printf("wait_fd after the peer closed: %d (error %d)\n", w.ev, w.err);
    CHECK(w.ev > 0 && (w.ev & ASYNC_EVENT_READ));
    CHECK_EQ(async_fiber_read((async_fd_t)a, &c, 1, 1000), 0);
    /* bad input */
    CHECK_FAIL(async_fiber_wait_fd((async_fd_t)a, 0, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_read((async_fd_t)INVALID_SOCKET, &c, 1, 0) == -1, ASYNC_E_BADFD);
    closesocket(a);
    CHECK_FAIL(async_fiber_read((async_fd_t)a, &c, 1, 0) == -1, ASYNC_E_BADFD);
    async_sched_destroy(s);
}

/* Reads and writes of 0 bytes return 0 at once on an open socket. */
static void zero_fiber(void *arg) {
    SOCKET a = *(SOCKET *)arg;
    char c;
    CHECK_EQ(async_fiber_read((async_fd_t)a, &c, 0, -1), 0);
    CHECK_EQ(async_fiber_write((async_fd_t)a, &c, 0, -1), 0);
    CHECK_FAIL(async_fiber_read((async_fd_t)a, NULL, 1, 0) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_fiber_read((async_fd_t)a, &c, 1, 0) == -1, ASYNC_E_TIMEDOUT);
    CHECK_FAIL(async_fiber_read((async_fd_t)a, &c, 1, -5) == -1, ASYNC_E_INVAL);
}

CASE(zero_len) {
    async_sched_t *s = sched_new(1);
    SOCKET a, b;
    tcp_pair(&a, &b);
    CHECK(async_fiber_spawn(s, zero_fiber, &a, 0));
    CHECK_EQ(async_sched_run(s), 0);
    char c;
    CHECK_EQ(async_fiber_read((async_fd_t)a, &c, 0, -1), 0); /* plain thread */
    closesocket(a);
    closesocket(b);
    async_sched_destroy(s);
}

/* A plain thread: the calls async.h defines off fibers. */
static void mark(void *arg) { *(int *)arg = 1; }

CASE(plain_thread) {
    CHECK(async_fiber_current() == NULL);
    int done = 0;
    CHECK_EQ(async_fiber_blocking(mark, &done), 0);
    CHECK_EQ(done, 1);
    async_fiber_yield();
}

/* Mutex, condition variable, fiber-local storage and names on Windows (the
 * same sync.c, fls.c and tools.c as on Linux): 32 fibers on 2 workers add to a
 * plain counter under the mutex, each with its own fiber-local value that must
 * survive its yields; a consumer fiber waits on the condition variable for
 * the total. */
static async_mutex_t *sy_mu;
static async_cond_t *sy_cv;
static async_fiber_key_t sy_key;
static long sy_count;
static atomic_int sy_dtors;

static void sy_dtor(void *v) {
    (void)v;
    atomic_fetch_add(&sy_dtors, 1);
}

static void sy_adder(void *arg) {
    CHECK_EQ(async_fiber_setspecific(sy_key, arg), 0);
    CHECK_EQ(async_fiber_set_name(NULL, "adder"), 0);
    for (int i = 0; i < 200; i++) {
        CHECK_EQ(async_mutex_lock(sy_mu, -1), 0);
        long c = sy_count;
        async_fiber_yield(); /* another fiber may run here: it must not get in */
        sy_count = c + 1;
        CHECK_EQ(async_cond_signal(sy_cv), 0);
        CHECK_EQ(async_mutex_unlock(sy_mu), 0);
        CHECK(async_fiber_getspecific(sy_key) == arg);
    }
    char name[ASYNC_FIBER_NAME_MAX];
    CHECK(async_fiber_get_name(NULL, name, sizeof name) >= 0);
    CHECK(strcmp(name, "adder") == 0);
}

static void sy_waiter(void *arg) {
    (void)arg;
    CHECK_EQ(async_mutex_lock(sy_mu, -1), 0);
    while (sy_count < 32 * 200) CHECK_EQ(async_cond_wait(sy_cv, sy_mu, 60000), 0);
    CHECK_EQ(async_mutex_unlock(sy_mu), 0);
}

CASE(sync_fls) {
    async_sched_t *s = sched_new(2);
    CHECK((sy_mu = async_mutex_create()) != NULL);
    CHECK((sy_cv = async_cond_create()) != NULL);
    CHECK_EQ(async_fiber_key_create(&sy_key, sy_dtor), 0);
    CHECK(async_fiber_spawn(s, sy_waiter, NULL, 0));
    for (intptr_t i = 1; i <= 32; i++) CHECK(async_fiber_spawn(s, sy_adder, (void *)i, 0));
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(sy_count, 32 * 200);
    CHECK_EQ(atomic_load(&sy_dtors), 32);
    CHECK_FAIL(async_sched_dump_on_signal(s, 3, 1) == -1, ASYNC_E_NOTSUP);
    async_sched_destroy(s);
    async_cond_destroy(sy_cv);
    async_mutex_destroy(sy_mu);
    CHECK_EQ(async_fiber_key_delete(sy_key), 0);
}

int main(int argc, char **argv) {
    WSADATA wsa;
    WSAStartup(MAKEWORD(2, 2), &wsa);
    GetModuleFileNameA(NULL, self_path, sizeof self_path);
    setvbuf(stdout, NULL, _IONBF, 0);
    return test_main_(test_cases_, test_ncases_, argc, argv);
}
