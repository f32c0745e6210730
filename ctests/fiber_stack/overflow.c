/* Fiber stacks and their overflow detection (docs/FIBERS.md "Stack overflow").
 *
 * Kernels without MADV_GUARD_INSTALL (Linux < 6.13) are simulated with a
 * seccomp filter that makes madvise(..., MADV_GUARD_INSTALL) fail with
 * EINVAL, as such a kernel does. Crashing cases run in a child process (this
 * executable re-executed with a *_child case) whose stderr and end are
 * checked. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "fibers.h"

#if defined(__linux__)
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif

/* Makes madvise(MADV_GUARD_INSTALL) fail with EINVAL in every thread of
 * this process from now on. 0 on success, -1 if seccomp is not available
 * (not Linux, or an emulator). */
static int no_madv_guard(void) {
#if defined(__linux__) && defined(SECCOMP_SET_MODE_FILTER) && defined(__NR_seccomp)
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_madvise, 0, 3),
        /* the low 32 bits of the advice (little-endian targets) */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_GUARD_INSTALL, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EINVAL & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    if (syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0) return -1;
    /* check it works (an emulator may accept the filter and ignore it) */
    return -1 + (madvise(NULL, 0, MADV_GUARD_INSTALL) != 0 && errno == EINVAL && 1);
#else
    return -1;
#endif
}

static int guard_mode_of(async_sched_t *s) {
    async_sched_stats_t st;
    CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
    return st.guard_mode;
}

/* ---- automatic mode: an overflow is always reported ---------------------------------- */

CHILD(auto_overflow_child) {
    if (getenv("ASYNC_TEST_NO_MADV_GUARD") && no_madv_guard() != 0) {
        fprintf(stderr, "no seccomp: skipped\n");
        exit(77);
    }
    async_sched_config_t cfg = {1, 32 * 1024, 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    fprintf(stderr, "guard_mode %d\n", guard_mode_of(s));
    CHECK(async_fiber_spawn(s, overflow_32k, NULL, 0));
    async_sched_run(s);
    fprintf(stderr, "survived\n");
    exit(0);
}

/* guard_mode 0 (automatic), with and without MADV_GUARD_INSTALL: the
 * overflow is reported and the process aborts. */
CASE(auto_overflow) { // valgrind
    static const char *envs[] = {NULL, "ASYNC_TEST_NO_MADV_GUARD=1"};
    for (int i = 0; i < 2; i++) {
        if (!envs[i] && madv_guard_ignored("native auto mode"))
            continue;
        char out[4096];
        int st = run_self_case_out("auto_overflow_child", envs[i], out, sizeof out);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 77) continue;
        CHECK(strstr(out, "libasync: fiber stack overflow in fiber ") != NULL);
        CHECK(strstr(out, "survived") == NULL);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
        /* without MADV_GUARD_INSTALL: an mprotect guard page */
        if (envs[i]) CHECK(strstr(out, "guard_mode 2\n") && strstr(out, "guard page hit"));
    }
}

/* ---- each explicit mode: the overflow is reported, then the process aborts ---------- */

/* A 32 KiB stack in guard mode ASYNC_TEST_GUARD overflowed by overflow_32k: in the
 * guard modes (1, 2) the overflow hits the guard page; in canary mode (3)
 * it stays in the slot's own spare page and is found at the next switch. */
/* Runs fn as the first fiber of a new scheduler with 32 KiB stacks in
 * guard_mode (the lowest stack of its arena), then exits. */
static void run_first_fiber(int guard_mode, void (*fn)(void *)) {
    async_sched_config_t cfg = {1, 32 * 1024, guard_mode};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    CHECK(async_fiber_spawn(s, fn, NULL, 0));
    async_sched_run(s);
    fprintf(stderr, "survived\n");
    exit(0);
}

CHILD(mode_overflow_child) {
    const char *m = getenv("ASYNC_TEST_GUARD");
    run_first_fiber(m ? atoi(m) : 0, overflow_32k);
}

/* Guard modes 1, 2 and 3: the whole report line (fiber id, how it was
 * found, the advice) on stderr, then SIGABRT. */
CASE(overflow_each_mode) { // valgrind
    static const char *envs[] = {"ASYNC_TEST_GUARD=1", "ASYNC_TEST_GUARD=2", "ASYNC_TEST_GUARD=3"};
    for (int i = 0; i < 3; i++) {
        if (i == 0 && madv_guard_ignored("mode 1"))
            continue;
        char out[4096];
        check_overflow_child("mode_overflow_child", envs[i], out, sizeof out);
        CHECK(strstr(out, "libasync: fiber stack overflow in fiber ") != NULL);
        CHECK(strstr(out, "; raise async_sched_config_t.stack_size or ASYNC_FIBER_STACK_KB)\n") != NULL);
    }
}

/* ---- canary mode: the lowest stack of an arena ----------------------------------------- */

static atomic_int below_up;

static void *nap_forever(void *arg) {
    (void)arg;
    atomic_store(&below_up, 1);
    for (;;) usleep(50);
    return NULL;
}

/* Starts a thread whose stack ends right below the slot of the calling
 * fiber (a 32 KiB stack; `top` is in its first frame), if that address is
 * free: glibc keeps a thread's control block at the top of its stack, so
 * it is what an overflow running out of the bottom of the slot would reach
 * first. The thread naps without end: the kernel looks at its control block
 * each time it wakes. 1 if started. */
static int thread_below(char *top) {
#if defined(__linux__) && defined(MAP_FIXED_NOREPLACE)
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t slot = ((uintptr_t)top + pg - 1) / pg * pg - (32 * 1024 + pg);
    size_t sz = 256 * 1024;
    void *want = (void *)(slot - sz);
    void *m = mmap(want, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (m == MAP_FAILED) return 0;
    if (m != want) {
        munmap(m, sz);
        return 0;
    }
    pthread_attr_t at;
    pthread_t t;
    CHECK_EQ(pthread_attr_init(&at), 0);
    CHECK_EQ(pthread_attr_setstack(&at, m, sz), 0);
    CHECK_EQ(pthread_create(&t, &at, nap_forever, NULL), 0);
    for (int k = 0; k < 10000 && !atomic_load(&below_up); k++) sleep_ms(1);
    return 1;
#else
    (void)top;
    return 0;
#endif
}

/* Recurses in ~1 KiB frames, each written whole, until a frame lies below
 * limit, then computes for 20 ms before it yields. */
__attribute__((noinline)) static int recurse_then_spin(char *limit, int depth) {
    volatile char buf[1024];
    memset((char *)buf, depth, sizeof buf);
    if ((char *)buf > limit) return recurse_then_spin(limit, depth + 1) + buf[depth % 1024];
    spin_us(20000);
    async_fiber_yield();
    return buf[0];
}

/* Overflows its 32 KiB stack through the page under it (the spare page in
 * canary mode) and 1 KiB further, then runs on for a while before its
 * switch. */
static void overflow_over_thread(void *arg) {
    char top;
    (void)arg;
    fprintf(stderr, "thread below the stack: %s\n", thread_below(&top) ? "yes" : "no");
    char *limit = (char *)((uintptr_t)&top - 32 * 1024 - (uintptr_t)sysconf(_SC_PAGESIZE) - 1024);
    printf("%d\n", recurse_then_spin(limit, 0));
}

CHILD(canary_lowest_child) { run_first_fiber(3, overflow_over_thread); }

/* Canary mode, again and again: an overflow out of the lowest stack of an
 * arena is reported and ends in SIGABRT in every run, never in a bare
 * SIGSEGV, whatever lies below the arena. Two overflows: overflow_32k
 * (the first call of a lazily bound function at its bottom dips past the
 * spare page), and one written whole 1 KiB past the spare page that
 * computes for 20 ms before its switch, with another thread's stack right
 * below the slot where that address is free. */
CASE(canary_overflow_always_reported) {
    int below = 0;
    for (int i = 0; i < 50; i++) {
        char out[4096];
        check_overflow_child("mode_overflow_child", "ASYNC_TEST_GUARD=3", out, sizeof out);
        check_overflow_child("canary_lowest_child", NULL, out, sizeof out);
        below += strstr(out, "thread below the stack: yes") != NULL;
    }
    printf("%d of 50 runs had a thread's stack right below the overflowing one\n", below);
}

/* ---- automatic mode past the mapping budget -------------------------------------------- */

static async_chan_t *hold;

static void parked(void *arg) {
    (void)arg;
    async_chan_recv(hold, NULL, -1); /* until closed */
}

/* Without MADV_GUARD_INSTALL, automatic mode guards stacks with mprotect
 * while the mapping budget lasts, then refuses new stacks (ASYNC_E_NOMEM):
 * it never switches to canary mode behind the caller's back. */
CASE(auto_budget) { // valgrind
    /* (under valgrind automatic mode is 2 anyway; seccomp is not needed) */
    int forced = !getenv("ASYNC_TEST_EMULATOR") && no_madv_guard() == 0;
    /* a small budget keeps the case light; without it the budget is
     * (vm.max_map_count - 5530) / 2 */
    setenv("ASYNC_FIBER_MPROTECT_MAX", "2000", 1);
    async_sched_config_t cfg = {2, 16 * 1024, 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    if (!forced && guard_mode_of(s) == 1) {
        printf("skipped: seccomp unavailable\n");
        async_sched_destroy(s);
        return;
    }
    CHECK_EQ(guard_mode_of(s), 2);
    hold = async_chan_create(0, 1);
    CHECK(hold);
    int n = 0, limit = 40000; /* above the default budget too */
    async_clear_error();
    while (n < limit && async_fiber_spawn(s, parked, NULL, 0)) n++;
    printf("%d fibers spawned, then error %d\n", n, async_last_error());
    CHECK(n < limit);
    CHECK_ERR(ASYNC_E_NOMEM);
    CHECK(n > 1000 && n <= 2000);
    CHECK_EQ(guard_mode_of(s), 2);
    async_chan_close(hold);
    CHECK_EQ(async_sched_run(s), 0);
    /* the stacks are reused: spawning works again */
    CHECK(async_fiber_spawn(s, parked, NULL, 0));
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    async_chan_destroy(hold);
}

/* guard_mode 2 explicitly: the same budget (a kernel mapping limit reached
 * by fiber guards would break the rest of the process: Go's heap, threads). */
CASE(mprotect_budget) { // valgrind
    setenv("ASYNC_FIBER_MPROTECT_MAX", "2000", 1);
    async_sched_config_t cfg = {1, 16 * 1024, 2};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    hold = async_chan_create(0, 1);
    CHECK(hold);
    int n = 0, limit = 40000;
    while (n < limit && async_fiber_spawn(s, parked, NULL, 0)) n++;
    printf("%d fibers spawned, then error %d\n", n, async_last_error());
    CHECK(n < limit);
    CHECK_ERR(ASYNC_E_NOMEM);
    CHECK(n > 1000 && n <= 2000);
    async_chan_close(hold);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
    async_chan_destroy(hold);
}

/* ---- canary mode (opt-in): an overflow into a neighbouring stack -------------------- */

#define NV 32
static async_chan_t *go_ch;
static char *victim_at[NV];
static _Atomic int victims_ready;

/* Parks with a pattern on its stack; checks it when resumed. */
static void victim(void *arg) {
    int i = (int)(intptr_t)arg;
    volatile unsigned char pat[512];
    for (size_t k = 0; k < sizeof pat; k++) pat[k] = (unsigned char)(k * 7 + (size_t)i);
    victim_at[i] = (char *)pat;
    atomic_fetch_add(&victims_ready, 1);
    async_chan_recv(go_ch, NULL, -1);
    for (size_t k = 0; k < sizeof pat; k++)
        if (pat[k] != (unsigned char)(k * 7 + (size_t)i)) {
            fprintf(stderr, "victim %d resumed on a corrupted stack (silent)\n", i);
            break;
        }
}

/* The stray writes themselves, out of ASan's sight (ASan would report them
 * first: they are outside any object on purpose). */
__attribute__((noinline, no_sanitize_address)) static void scribble(char *from, char *to) {
    for (volatile char *p = from; p < to; p++) *p = (char)0xAA;
}

/* Writes below its own stack into the slot under it, over the top of the
 * neighbour's stack (from the neighbour's pattern up: not over the channel
 * waiter deeper down, which a sender would trip over first), without touching its own canary (the writes of an
 * oversized frame that jumps over it), then yields. */
static void smasher(void *arg) {
    int full = (int)(intptr_t)arg;
    volatile char me;
    char *lo = (char *)((uintptr_t)&me - 32 * 1024); /* below this fiber's stack */
    char *target = NULL;
    for (int i = 0; i < NV; i++)
        if (victim_at[i] && victim_at[i] < lo && victim_at[i] > lo - 36 * 1024) target = victim_at[i];
    if (!target) {
        fprintf(stderr, "no neighbour below the smasher\n");
        exit(3);
    }
    if (full) {
        /* a frame fully written: also over the own canary */
        scribble(target, (char *)((uintptr_t)&me - 1024));
    } else {
        scribble(target, lo);
    }
    async_fiber_yield();
    fprintf(stderr, "smasher survived its switch\n");
    for (int i = 0; i < NV; i++) async_chan_send(go_ch, "", -1);
}

CHILD(canary_child) {
    int full = getenv("ASYNC_TEST_FULL_FRAME") != NULL;
    async_sched_config_t cfg = {1, 32 * 1024, 3};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    CHECK_EQ(guard_mode_of(s), 3);
    go_ch = async_chan_create(NV, 1);
    CHECK(go_ch);
    /* stacks from a plain thread come straight from the pool in address
     * order: the smasher's slot lies between victims */
    for (int i = 0; i < NV / 2; i++) CHECK(async_fiber_spawn(s, victim, (void *)(intptr_t)i, 0));
    for (int k = 0; k < 10000 && atomic_load(&victims_ready) < NV / 2; k++) sleep_ms(1);
    CHECK(async_fiber_spawn(s, smasher, (void *)(intptr_t)full, 0));
    for (int i = NV / 2; i < NV; i++) CHECK(async_fiber_spawn(s, victim, (void *)(intptr_t)i, 0));
    async_sched_run(s);
    fprintf(stderr, "child ran to the end\n");
    exit(0);
}

/* Canary mode: a write from an overflowing fiber over the top of the stack
 * below it is found before that fiber resumes, whether or not the writer
 * broke its own canary; the report names the fiber; the process aborts. */
CASE(canary_neighbour) { // valgrind
    static const char *envs[] = {NULL, "ASYNC_TEST_FULL_FRAME=1"};
    for (int i = 0; i < 2; i++) {
        char out[8192];
        check_overflow_child("canary_child", envs[i], out, sizeof out);
        CHECK(strstr(out, "no neighbour") == NULL);
        CHECK(strstr(out, "(silent)") == NULL);
        CHECK(strstr(out, "ran to the end") == NULL);
        if (envs[i])
            CHECK(strstr(out, "canary overwritten") != NULL); /* the smasher itself, at its switch */
        else /* found before the victim resumed */
            CHECK(strstr(out, "smasher survived its switch") && strstr(out, "the top of the stack of fiber 16 "));
    }
}

/* ---- not a ctest: how many stacks each mode gives (measurement) ----------------------- */

CHILD(capacity) {
    const char *m = getenv("ASYNC_TEST_GUARD");
    if (getenv("ASYNC_TEST_NO_MADV_GUARD")) CHECK_EQ(no_madv_guard(), 0);
    async_sched_config_t cfg = {1, 16 * 1024, m ? atoi(m) : 0};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    hold = async_chan_create(0, 1);
    int n = 0, limit = getenv("ASYNC_TEST_LIMIT") ? atoi(getenv("ASYNC_TEST_LIMIT")) : 200000;
    async_clear_error();
    while (n < limit && async_fiber_spawn(s, parked, NULL, 0)) n++;
    printf("guard_mode %d: %d fibers, then error %d\n", guard_mode_of(s), n, n < limit ? async_last_error() : 0);
    async_chan_close(hold);
    async_sched_run(s);
    async_sched_destroy(s);
}

TEST_MAIN()
