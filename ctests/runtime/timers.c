/* Timers of async_runtime_add_timer: one-shot and repeating, their order,
 * no bunching, cancel and ids, huge delays and periods, timers added while a
 * wait sleeps; no timer fires and no timed wait returns before its time;
 * when memory runs out adding a timer fails with ASYNC_E_NOMEM, every
 * completion queued still arrives, and timers work again once memory is
 * back. */
#include "check.h"
#include "proc.h"
#include "rt.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/wait.h>

/* --- timers ------------------------------------------------------------- */

CASE(timer_oneshot) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    const uintptr_t key = (uintptr_t)0xFEDCBA9876543210ull;
    double t0 = now_ms(), el;
    uint64_t id = async_runtime_add_timer(rt, 60, 0, key);
    CHECK(id != 0);
    CHECK_EQ(wait_some(rt, ev, 4, 10000), 1);
    el = now_ms() - t0;
    CHECK(el >= 60.0);
    CHECK(el < 5000.0);
    CHECK_EQ(ev[0].fd, -1);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_TIMER);
    CHECK(ev[0].completion_key == key);
    CHECK(ev[0].data == (uintptr_t)id);
    CHECK(ev[0].context == NULL);
    CHECK_EQ(wait_ok(rt, ev, 4, 200), 0); /* one-shot: fires once */
    CHECK_FAIL(async_runtime_cancel_timer(rt, id) == -1, ASYNC_E_NOTFOUND);
    /* delay 0 fires promptly */
    t0 = now_ms();
    id = async_runtime_add_timer(rt, 0, 0, 1);
    CHECK(id != 0);
    CHECK_EQ(wait_some(rt, ev, 4, 10000), 1);
    CHECK(now_ms() - t0 < 5000);
    CHECK(ev[0].data == (uintptr_t)id);
    CHECK(ev[0].completion_key == 1);
    async_runtime_deinit(rt);
}

CASE(timer_order) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    uintptr_t keys[3];
    int got = 0;
    double t0 = now_ms();
    CHECK(async_runtime_add_timer(rt, 150, 0, 150) != 0);
    CHECK(async_runtime_add_timer(rt, 50, 0, 50) != 0);
    CHECK(async_runtime_add_timer(rt, 100, 0, 100) != 0);
    while (got < 3 && now_ms() - t0 < 10000) {
        int n = wait_ok(rt, ev, 4, 1000), i;
        for (i = 0; i < n && got < 3; i++) {
            CHECK_EQ(ev[i].event_type, ASYNC_EVENT_TIMER);
            keys[got++] = ev[i].completion_key;
        }
    }
    CHECK_EQ(got, 3);
    CHECK_EQ(keys[0], 50);
    CHECK_EQ(keys[1], 100);
    CHECK_EQ(keys[2], 150);
    CHECK(now_ms() - t0 >= 150.0);
    async_runtime_deinit(rt);
}

CASE(timer_repeat) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[16];
    const int period = 50;
    int count = 0;
    double t0 = now_ms(), el;
    uint64_t id = async_runtime_add_timer(rt, (uint64_t)period, (uint64_t)period, 77);
    CHECK(id != 0);
    while (now_ms() - t0 < 1000) {
        int n = wait_ok(rt, ev, 16, 100), i;
        for (i = 0; i < n; i++) {
            CHECK_EQ(ev[i].event_type, ASYNC_EVENT_TIMER);
            CHECK_EQ(ev[i].fd, -1);
            CHECK_EQ(ev[i].completion_key, 77);
            CHECK(ev[i].data == (uintptr_t)id);
        }
        count += n;
    }
    el = now_ms() - t0;
    fprintf(stderr, "repeating timer: %d firings in %.0f ms (period %d)\n", count, el, period);
    CHECK(count >= 5);                               /* about 20 expected */
    CHECK(count <= (int)(el / period) + 1);          /* never early */
    CHECK_EQ(async_runtime_cancel_timer(rt, id), 0); /* a repeating timer stays valid */
    CHECK_EQ(wait_ok(rt, ev, 16, 200), 0);
    CHECK_FAIL(async_runtime_cancel_timer(rt, id) == -1, ASYNC_E_NOTFOUND);
    async_runtime_deinit(rt);
}

CASE(timer_no_bunching) // poll
{
    /* missed periods are skipped, not delivered in a burst */
    async_runtime_t *rt = mkrt();
    io_event_t ev[64];
    uint64_t id = async_runtime_add_timer(rt, 10, 10, 5);
    int n;
    CHECK(id != 0);
    sleep_ms(300); /* ~30 periods pass without a wait */
    n = wait_some(rt, ev, 64, 5000);
    CHECK(n >= 1);
    CHECK(n <= 2);
    CHECK_EQ(async_runtime_cancel_timer(rt, id), 0);
    async_runtime_deinit(rt);
}

CASE(timer_cancel) // poll
{
    async_runtime_t *rt = mkrt();
    io_event_t ev[4];
    uint64_t a, b, c;
    /* pending */
    a = async_runtime_add_timer(rt, 100, 0, 1);
    CHECK(a != 0);
    CHECK_EQ(async_runtime_cancel_timer(rt, a), 0);
    CHECK_FAIL(async_runtime_cancel_timer(rt, a) == -1, ASYNC_E_NOTFOUND);
    /* expired but not yet delivered: one-shot and repeating */
    b = async_runtime_add_timer(rt, 10, 0, 2);
    c = async_runtime_add_timer(rt, 10, 10, 3);
    CHECK(b != 0 && c != 0);
    sleep_ms(100);
    CHECK_EQ(async_runtime_cancel_timer(rt, b), 0);
    CHECK_EQ(async_runtime_cancel_timer(rt, c), 0);
    CHECK_EQ(wait_ok(rt, ev, 4, 300), 0); /* none of the three is delivered */
    /* unknown ids */
    CHECK_FAIL(async_runtime_cancel_timer(rt, 0) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_cancel_timer(rt, 0x123456789ull) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_cancel_timer(rt, UINT64_MAX) == -1, ASYNC_E_NOTFOUND);
    /* cancelling one timer leaves the others */
    a = async_runtime_add_timer(rt, 30, 0, 10);
    b = async_runtime_add_timer(rt, 30, 0, 11);
    CHECK_EQ(async_runtime_cancel_timer(rt, a), 0);
    CHECK_EQ(wait_some(rt, ev, 4, 5000), 1);
    CHECK(ev[0].data == (uintptr_t)b);
    CHECK_EQ(ev[0].completion_key, 11);
    CHECK_EQ(wait_ok(rt, ev, 4, 100), 0);
    async_runtime_deinit(rt);
}

CASE(timer_ids) // poll
{
    async_runtime_t *rt = mkrt(), *other = mkrt();
    static uint64_t ids[200];
    int i, j;
    for (i = 0; i < 200; i++) {
        ids[i] = async_runtime_add_timer(rt, 60000, 0, (uintptr_t)i);
        CHECK(ids[i] != 0);
        for (j = 0; j < i; j++)
            CHECK(ids[j] != ids[i]);
    }
    for (i = 0; i < 200; i++) {
        /* an id belongs to its runtime */
        CHECK_FAIL(async_runtime_cancel_timer(other, ids[i]) == -1, ASYNC_E_NOTFOUND);
        CHECK_EQ(async_runtime_cancel_timer(rt, ids[i]), 0);
    }
    async_runtime_deinit(rt);
    async_runtime_deinit(other);
}

/* Counts the events of waits for `ms` (at least one wait). */
static int count_events(async_runtime_t *rt, int ms)
{
    io_event_t ev[16];
    int total = 0;
    double t0 = now_ms();
    do
        total += wait_ok(rt, ev, 16, 20);
    while (now_ms() - t0 < ms);
    return total;
}

/* A timer with delay 10 ms and the given period fires once: the first firing
 * is awaited (a loaded host may deliver it late), then 300 ms bring no more. */
static void fires_once(async_runtime_t *rt, uint64_t period)
{
    io_event_t ev[16];
    uint64_t c = async_runtime_add_timer(rt, 10, period, 3);
    int n;
    CHECK(c != 0);
    n = wait_some(rt, ev, 16, 10000);
    if (n != 1)
        fprintf(stderr, "timer (delay 10, repeat %llu): %d events in the first wait\n", (unsigned long long)period, n);
    CHECK_EQ(n, 1);
    CHECK(ev[0].data == (uintptr_t)c);
    n = count_events(rt, 300);
    if (n != 0)
        fprintf(stderr, "timer (delay 10, repeat %llu) fired %d more times in 300 ms\n", (unsigned long long)period, n);
    CHECK_EQ(n, 0);
    CHECK_EQ(async_runtime_cancel_timer(rt, c), 0);
}

CASE(timer_huge) // poll
{
    /* huge delays and periods never overflow into "fire now" */
    async_runtime_t *rt = mkrt();
    uint64_t a, b;
    int n;
    a = async_runtime_add_timer(rt, UINT64_MAX, 0, 1);
    b = async_runtime_add_timer(rt, UINT64_MAX / 2 + 12345, UINT64_MAX, 2);
    CHECK(a != 0 && b != 0);
    n = count_events(rt, 200);
    if (n != 0)
        fprintf(stderr, "timers with delay UINT64_MAX and UINT64_MAX/2 fired %d times\n", n);
    CHECK_EQ(n, 0);
    CHECK_EQ(async_runtime_cancel_timer(rt, a), 0);
    CHECK_EQ(async_runtime_cancel_timer(rt, b), 0);
    /* delay 10 ms, period UINT64_MAX (or just below) ms: fires once */
    fires_once(rt, UINT64_MAX);
    fires_once(rt, UINT64_MAX - 1);
    async_runtime_deinit(rt);
}

static async_runtime_t *g_trt;
static _Atomic double g_tadd;

static void *add_timer_later(void *arg)
{
    (void)arg;
    sleep_ms(150);
    atomic_store(&g_tadd, now_ms());
    CHECK(async_runtime_add_timer(g_trt, 50, 0, 4242) != 0);
    return NULL;
}

CASE(timer_while_waiting) // poll
{
    /* a timer added by another thread during a wait fires in that wait */
    pthread_t th;
    io_event_t ev[4];
    double t0;
    g_trt = mkrt();
    CHECK(pthread_create(&th, NULL, add_timer_later, NULL) == 0);
    t0 = now_ms();
    CHECK_EQ(wait_some(g_trt, ev, 4, 10000), 1);
    CHECK(now_ms() - t0 < 9000);
    CHECK(now_ms() - atomic_load(&g_tadd) >= 50.0);
    CHECK_EQ(ev[0].event_type, ASYNC_EVENT_TIMER);
    CHECK_EQ(ev[0].completion_key, 4242);
    pthread_join(th, NULL);
    async_runtime_deinit(g_trt);
}

/* ---- timers and waits: never early ------------------------------------------ */

CASE(timers_never_early) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt);
    enum { NT = 300 };
    static double added[NT];
    static uint64_t ids[NT];
    static int delay[NT];
    unsigned seed = 12345;
    for (int i = 0; i < NT; i++) {
        seed = seed * 1103515245u + 12345u;
        delay[i] = (int)((seed >> 16) % 40);
        added[i] = now_ms();
        ids[i] = async_runtime_add_timer(rt, (uint64_t)delay[i], 0, (uintptr_t)i);
        CHECK(ids[i] != 0);
        if ((i & 15) == 0)
            CHECK_EQ(async_runtime_wakeup(rt), 0);
        if ((i & 7) == 0) {
            io_event_t ev1[2];
            int n = async_runtime_wait(rt, ev1, 2, 1);
            CHECK(n >= 0);
            for (int k = 0; k < n; k++) {
                int j = (int)ev1[k].completion_key;
                double at = now_ms();
                CHECK(at - added[j] >= delay[j]);
                ids[j] = 0;
            }
        }
    }
    io_event_t ev[MAXEV];
    double t0 = now_ms();
    for (;;) {
        int left = 0;
        for (int i = 0; i < NT; i++)
            left += ids[i] != 0;
        if (!left)
            break;
        CHECK(now_ms() - t0 < 30000);
        int n = async_runtime_wait(rt, ev, 3, 50);
        double at = now_ms();
        CHECK(n >= 0);
        for (int k = 0; k < n; k++) {
            CHECK_EQ(ev[k].event_type, ASYNC_EVENT_TIMER);
            int j = (int)ev[k].completion_key;
            CHECK(ids[j] != 0);
            CHECK_EQ(ev[k].data, (uintptr_t)ids[j]);
            if (at - added[j] < delay[j]) {
                fprintf(stderr, "timer %d of %d ms fired after %.3f ms\n", j, delay[j], at - added[j]);
                CHECK(at - added[j] >= delay[j]);
            }
            ids[j] = 0;
        }
    }
    /* Waits of 1..5 ms after wakeups consumed: each lasts at least n ms. */
    for (int i = 0; i < 200; i++) {
        int ms = 1 + i % 5;
        if (i % 10 == 0) {
            CHECK_EQ(async_runtime_wakeup(rt), 0);
            CHECK_EQ(async_runtime_wait(rt, ev, MAXEV, 1000), 0);
        }
        double s = now_ms();
        int n = async_runtime_wait(rt, ev, MAXEV, ms);
        double d = now_ms() - s;
        CHECK_EQ(n, 0);
        if (d < ms) {
            fprintf(stderr, "wait(%d) returned after %.3f ms\n", ms, d);
            CHECK(d >= ms);
        }
    }
    /* A repeating timer left alone for 20 periods fires once, not 20 times. */
    uint64_t rep = async_runtime_add_timer(rt, 10, 10, 99);
    CHECK(rep != 0);
    sleep_ms(200);
    int fired = 0;
    for (int k = 0; k < 3; k++) {
        int n = async_runtime_wait(rt, ev, MAXEV, 0);
        for (int i = 0; i < n; i++) {
            CHECK_EQ(ev[i].completion_key, 99);
            fired++;
        }
    }
    CHECK(fired >= 1 && fired <= 3); /* 3: a loaded machine may let a period pass between the waits */
    CHECK_EQ(async_runtime_cancel_timer(rt, rep), 0);
    check_quiet(rt, 1);
    async_runtime_deinit(rt);
}

/* --- nomem_timers ---------------------------------------------------------- */

/* ASan's allocator works in address space reserved at start, so RLIMIT_AS
 * does not limit malloc there: under ASan the child runs with a soft RSS
 * limit instead (past it, every malloc returns NULL until RSS drops; see
 * t_nomem_timers), and touches what it takes. */
#if defined(__SANITIZE_ADDRESS__)
#define NM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NM_ASAN 1
#endif
#endif
#ifndef NM_ASAN
#define NM_ASAN 0
#endif

/* Takes every byte malloc will give (largest chunks first), chained. */
static void *hog_memory(size_t *total)
{
    void *head = NULL;
    *total = 0;
    /* ASan: only chunks it maps on their own, which free unmaps (RSS drops) */
    for (size_t sz = (size_t)1 << 24; sz >= (NM_ASAN ? (size_t)1 << 18 : 64); sz /= 2) {
        void *p;
        while ((p = malloc(sz)) != NULL) {
            if (NM_ASAN) {
                memset(p, 1, sz); /* count in RSS */
                usleep(sz >> 10); /* ~1 GB/s: the limit is checked every 100 ms */
            }
            *(void **)p = head;
            head = p;
            *total += sz;
        }
    }
    return head;
}

/* Frees the hog. Under ASan, malloc returns NULL until the RSS check (every
 * 100 ms) has seen RSS drop: waits for that before the library runs on, as
 * Go's runtime aborts when it cannot allocate for a thread it starts. */
static void free_hog(void *head)
{
    while (head) {
        void *n = *(void **)head;
        free(head);
        head = n;
    }
    if (!NM_ASAN)
        return;
    double t0 = now_ms();
    void *p;
    while ((p = malloc((size_t)1 << 16)) == NULL) {
        CHECK(now_ms() - t0 < 10000);
        sleep_ms(5);
    }
    free(p);
}

#define NM_PRE 3000

CHILD(nomem_child)
{
    async_runtime_t *rt = mkrt();
    struct rlimit rl;
    io_event_t ev[256];
    size_t hogged;
    long timers = 0, posted = 0, got = 0, nomem_waits = 0;
    static unsigned char seen[1 << 20];
    /* Some completions are queued before memory runs out... */
    for (uintptr_t i = 0; i < NM_PRE; i++)
        CHECK_EQ(async_runtime_post_completion(rt, 5, i), 0);
    posted = NM_PRE;
    for (int i = 0; i < 100; i++)
        CHECK(async_runtime_add_timer(rt, 3600000, 0, 9) != 0);
    CHECK(getrlimit(RLIMIT_AS, &rl) == 0);
    if (!NM_ASAN) {
        rl.rlim_cur = (rlim_t)(status_kb("VmSize") + 32 * 1024) * 1024;
        CHECK(setrlimit(RLIMIT_AS, &rl) == 0);
    }
    void *hog = hog_memory(&hogged);
    /* ...timers until memory fails them: NOMEM, never an abort */
    for (;;) {
        async_clear_error();
        uint64_t id = async_runtime_add_timer(rt, 3600000, 0, 9);
        if (id == 0) {
            CHECK_ERR(ASYNC_E_NOMEM);
            break;
        }
        timers++;
        CHECK(timers < 50000000);
    }
    /* more posts: each either queued or NOMEM */
    for (uintptr_t i = NM_PRE; i < NM_PRE + 2000; i++) {
        async_clear_error();
        int rc = async_runtime_post_completion(rt, 5, (uintptr_t)posted);
        if (rc == 0) {
            posted++;
        } else {
            CHECK_EQ(rc, -1);
            CHECK_ERR(ASYNC_E_NOMEM);
        }
    }
    /* the first waits of this runtime, still without memory: they deliver
     * what is queued (or fail with a documented code) */
    for (int round = 0; round < 4; round++) {
        int n = async_runtime_wait(rt, ev, 256, 0);
        if (n < 0) {
            nomem_waits++;
            continue;
        }
        for (int i = 0; i < n; i++) {
            CHECK_EQ(ev[i].event_type, ASYNC_EVENT_COMPLETION);
            CHECK(ev[i].data < (uintptr_t)posted);
            CHECK_EQ(seen[ev[i].data]++, 0);
            got++;
        }
    }
    long got_starved = got;
    free_hog(hog);
    if (!NM_ASAN) {
        rl.rlim_cur = rl.rlim_max;
        CHECK(setrlimit(RLIMIT_AS, &rl) == 0);
    }
    double t0 = now_ms();
    while (got < posted && now_ms() - t0 < 10000) {
        int n = async_runtime_wait(rt, ev, 256, 10);
        CHECK(n >= 0);
        for (int i = 0; i < n; i++) {
            CHECK_EQ(ev[i].event_type, ASYNC_EVENT_COMPLETION);
            CHECK(ev[i].data < (uintptr_t)posted);
            CHECK_EQ(seen[ev[i].data]++, 0);
            got++;
        }
    }
    printf("nomem_child: %zu bytes hogged, %ld timers before NOMEM, %ld posted, %ld delivered while starved "
           "(%ld failed waits), %ld delivered\n",
           hogged, timers, posted, got_starved, nomem_waits, got);
    CHECK_EQ(nomem_waits, 0);
    CHECK(got_starved > 0);
    CHECK_EQ(got, posted);
    CHECK_EQ(async_runtime_wait(rt, ev, 256, 0), 0);
    /* timers work again (under ASan once the RSS check has seen it drop) */
    t0 = now_ms();
    while (async_runtime_add_timer(rt, 1, 0, 11) == 0) {
        CHECK_ERR(ASYNC_E_NOMEM);
        CHECK(now_ms() - t0 < 5000);
        sleep_ms(10);
    }
    async_runtime_deinit(rt);
}

CASE(nomem_timers) // poll timeout=120 notsan
{
    const char *emu_env = getenv("ASYNC_TEST_EMULATOR");
    if (emu_env && *emu_env) {
        /* RLIMIT_AS would bound qemu-user's own reservations, not the guest's. */
        printf("skipped under an emulator\n");
        return;
    }
    /* Under ASan, malloc must return NULL too, not abort; and RSS is what
     * runs out (see NM_ASAN). */
    static char env[1024];
    const char *old = getenv("ASAN_OPTIONS");
    char extra[160] = "";
    if (NM_ASAN)
        snprintf(extra, sizeof extra, ":quarantine_size_mb=0:soft_rss_limit_mb=%ld",
                 status_kb("VmRSS") / 1024 + 96);
    snprintf(env, sizeof env, "ASAN_OPTIONS=%s%sallocator_may_return_null=1%s", old ? old : "",
             old && *old ? ":" : "", extra);
    int st = run_self_case("nomem_child", env);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
}

TEST_MAIN()
