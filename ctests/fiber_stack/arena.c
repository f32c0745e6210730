/* Fiber stack arenas are recycled: a scheduler's stacks come from 32 MiB arenas listed in a
 * process-wide table of 65536 entries; async_sched_destroy must give the
 * entries (and the small per-arena arrays) back, so that
 *   - a process may create and destroy schedulers for ever: more than 65536
 *     arenas over the life of the process, never ASYNC_E_NOMEM while no
 *     scheduler is alive and memory is plentiful;
 *   - a create/destroy cycle leaves no C heap behind.
 * Each case runs in a process of its own (a fresh table). No case asserts a
 * speed. */
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "fibers.h"

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#include <malloc.h>
#define LA_TEST_MALLINFO2 1
#endif

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LA_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define LA_TEST_ASAN 1
#endif
#ifdef LA_TEST_ASAN
/* sanitizer/allocator_interface.h, not installed everywhere */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

#define ARENA_TABLE 65536 /* LA_MAX_ARENAS in cabi/internal/fiber/stacks.c */

static void sleeper(void *arg) {
    (void)arg;
    async_fiber_sleep(600000); /* until destroy */
}

/* Cycles of: create (4 MiB stacks: 8 slots per 32 MiB arena, the fewest an
 * arena holds), spawn `fibers` fibers that stay alive (one arena per 8),
 * destroy. Past 65536 arenas in all, then a plain create. */
CASE(many_arenas) { // timeout=300 tsan_soak
    const int fibers = 4096;
    const int per_cycle = fibers / 8;
    const int cycles = ARENA_TABLE / per_cycle + ARENA_TABLE / per_cycle / 8; /* ~73700 arenas */
    for (int c = 0; c < cycles; c++) {
        async_sched_config_t cfg = {0};
        cfg.workers = 1;
        cfg.stack_size = 4u << 20;
        async_sched_t *s = async_sched_create(&cfg);
        if (!s) fprintf(stderr, "cycle %d (~%d arenas so far): create failed: %d\n", c, c * per_cycle, async_last_error());
        CHECK(s != NULL);
        if (c == 0) {
            async_sched_stats_t st;
            CHECK_EQ(async_sched_get_stats(s, &st, NULL, 0), 0);
            CHECK(st.stack_size >= (4u << 20)); /* else fewer arenas than counted */
        }
        for (int k = 0; k < fibers; k++) {
            if (!async_fiber_spawn(s, sleeper, NULL, 0)) {
                fprintf(stderr, "cycle %d (~%d arenas so far): spawn %d failed: %d\n", c, c * per_cycle + k / 8, k,
                        async_last_error());
                CHECK(0);
            }
        }
        async_sched_destroy(s);
    }
    async_sched_t *s = async_sched_create(NULL);
    CHECK(s != NULL);
    CHECK(async_fiber_spawn(s, sleeper, NULL, 0) != NULL);
    async_sched_destroy(s);
}

static size_t heap_in_use(void) {
#if defined(LA_TEST_ASAN)
    return __sanitizer_get_current_allocated_bytes();
#elif defined(LA_TEST_MALLINFO2)
    return mallinfo2().uordblks;
#else
    return 0;
#endif
}

static void churn(int n) {
    for (int c = 0; c < n; c++) {
        async_sched_config_t cfg = {0};
        cfg.workers = 1;
        async_sched_t *s = async_sched_create(&cfg);
        CHECK(s != NULL);
        CHECK(async_fiber_spawn(s, sleeper, NULL, 0) != NULL);
        async_sched_destroy(s);
    }
}

/* The C heap in use after N more cycles does not grow with N (a cycle that
 * kept its arena's owner array would leak ~4 KB with the default stacks).
 * Not timing: a byte count, with a generous bound (1 KB per cycle). */
CASE(heap_per_cycle) {
#if !defined(LA_TEST_ASAN) && !defined(LA_TEST_MALLINFO2)
    fprintf(stderr, "no heap counter on this libc: only the cycles run\n");
#endif
    const int n = 400;
    churn(100); /* warm: thread caches, malloc arenas, lazy tables */
    size_t m1 = heap_in_use();
    churn(n);
    size_t m2 = heap_in_use();
    long grew = (long)m2 - (long)m1;
    fprintf(stderr, "C heap in use: %zu -> %zu after %d cycles (%+ld bytes)\n", m1, m2, n, grew);
    CHECK(grew < (long)n * 1024);
}

/* ---- the SIGSEGV handler on recycled entries ---------------------------------------- */

static void napper(void *arg) {
    (void)arg;
    async_fiber_sleep(3000); /* short: a missed overflow ends with "survived" */
}

CHILD(recycled_overflow_child) {
    int mode = atoi(getenv("ASYNC_TEST_MODE"));
    /* arenas of 8 slots (owner arrays of 8), freed: their entries are
     * taken again below by arenas of ~900 slots (bigger owner arrays) */
    for (int c = 0; c < 3; c++) {
        async_sched_config_t cfg = {1, 4u << 20, mode};
        async_sched_t *s = async_sched_create(&cfg);
        CHECK(s);
        for (int k = 0; k < 20; k++) CHECK(async_fiber_spawn(s, sleeper, NULL, 0));
        async_sched_destroy(s);
    }
    async_sched_config_t cfg = {1, 32 * 1024, mode};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    for (int k = 0; k < 2000; k++) CHECK(async_fiber_spawn(s, napper, NULL, 0));
    CHECK(async_fiber_spawn(s, overflow_32k, NULL, 0));
    async_sched_run(s);
    fprintf(stderr, "survived\n");
    exit(0);
}

/* An overflow on a stack whose arena took a recycled table entry (with a
 * new, bigger owner array) is still found by the SIGSEGV handler in the
 * table (its guard page) and reported, in the automatic mode and with
 * mprotect guards; in canary mode, at its switch. */
CASE(recycled_overflow) {
    static const char *envs[] = {"ASYNC_TEST_MODE=0", "ASYNC_TEST_MODE=2", "ASYNC_TEST_MODE=3"};
    for (int i = 0; i < 3; i++) {
        if (i == 0 && madv_guard_ignored("auto mode"))
            continue;
        char out[4096];
        check_overflow_child("recycled_overflow_child", envs[i], out, sizeof out);
        CHECK(strstr(out, "libasync: fiber stack overflow in fiber ") != NULL);
        CHECK(strstr(out, "survived") == NULL);
        if (i < 2) CHECK(strstr(out, "guard page hit") != NULL); /* found through the table */
        else CHECK(strstr(out, "canary overwritten") != NULL);
    }
}

/* ---- the handler's readers while entries are recycled --------------------------------- */

static char *probe;
static long page_sz;
static atomic_int churning;

/* Runs after libasync's handler looked the address up in the table (it
 * chains to the handler installed before it): makes the page readable. */
static void probe_fault(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    char *a = (char *)si->si_addr;
    if (a >= probe && a < probe + page_sz && mprotect(probe, (size_t)page_sz, PROT_READ | PROT_WRITE) == 0) return;
    signal(sig, SIG_DFL); /* anything else: the fault repeats and kills */
}

static void *churn_entries(void *arg) {
    (void)arg;
    for (int c = 0; c < 300; c++) {
        /* alternately small and big arenas: owner arrays are reused,
         * outgrown and replaced while the other thread faults */
        async_sched_config_t cfg = {0};
        cfg.workers = 1;
        cfg.stack_size = c % 2 ? 4u << 20 : 64u << 10;
        async_sched_t *s = async_sched_create(&cfg);
        CHECK(s != NULL);
        for (int k = 0; k < (c % 2 ? 40 : 600); k++) CHECK(async_fiber_spawn(s, sleeper, NULL, 0) != NULL);
        async_sched_destroy(s);
    }
    atomic_store(&churning, 0);
    return NULL;
}

/* SIGSEGVs (not in a fiber stack: libasync's handler scans the whole table
 * and passes them on) while another thread recycles table entries: no
 * crash, every fault passed on. */
CASE(fault_during_recycle) { // tsan_soak
    page_sz = sysconf(_SC_PAGESIZE);
    probe = mmap(NULL, (size_t)page_sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(probe != MAP_FAILED);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = probe_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(SIGSEGV, &sa, NULL), 0);
    /* libasync's handler goes in front of it now, and a live scheduler's
     * arenas stay in the table throughout */
    async_sched_config_t cfg = {0};
    cfg.workers = 1;
    async_sched_t *keep = async_sched_create(&cfg);
    CHECK(keep != NULL);
    for (int k = 0; k < 100; k++) CHECK(async_fiber_spawn(keep, sleeper, NULL, 0) != NULL);
    atomic_store(&churning, 1);
    pthread_t t;
    start_thread(&t, churn_entries, NULL);
    long faults = 0;
    while (atomic_load(&churning)) {
        CHECK_EQ(mprotect(probe, (size_t)page_sz, PROT_NONE), 0);
        probe[faults % page_sz] = 1; /* faults, passed on, made writable, done again */
        faults++;
    }
    join_within(t, 120000, "churn");
    fprintf(stderr, "%ld faults during 300 create/destroy cycles\n", faults);
    CHECK(faults > 0);
    async_sched_destroy(keep);
}

TEST_MAIN()
