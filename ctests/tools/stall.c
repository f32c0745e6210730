/* The stall detector (docs/DEBUGGING.md): a fiber that keeps its worker
 * longer than the stall threshold is reported once through the log handler
 * (which may call libasync), the detector's thread comes and goes with the
 * schedulers that use it, and ASYNC_FIBER_STALL_MS turns it on for new
 * schedulers (a bad value is ignored, with a message). */
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <dirent.h>

#include "fibers.h"

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[8192];
static atomic_int warns, infos, hog_warns;

static void log_fn(int level, const char *msg, void *ctx) {
    (void)ctx;
    if (strncmp(msg, "stall:", 6) != 0) return;
    pthread_mutex_lock(&log_mu);
    size_t l = strlen(log_buf);
    snprintf(log_buf + l, sizeof log_buf - l, "%d %s\n", level, msg);
    pthread_mutex_unlock(&log_mu);
    atomic_fetch_add(level == ASYNC_LOG_WARN ? &warns : &infos, 1);
    if (level == ASYNC_LOG_WARN && strstr(msg, "\"hog\"")) atomic_fetch_add(&hog_warns, 1);
}

static atomic_int hog_go;
static atomic_int yielder_go;

static void hog(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "hog");
    while (!atomic_load(&hog_go)) {
    }
}

static void polite_fiber(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "polite");
    while (!atomic_load(&yielder_go)) async_fiber_yield();
}

/* Threads of this process named "la-stall" (the monitor threads). */
static int count_threads(void) {
    DIR *d = opendir("/proc/self/task");
    CHECK(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[300], comm[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(comm, sizeof comm, f) && strncmp(comm, "la-stall", 8) == 0) n++;
        fclose(f);
    }
    closedir(d);
    return n;
}

/* count_threads() once it equals want (bounded). A joined thread can stay
 * in /proc/self/task for a moment after pthread_join returned (the kernel
 * clears the joined tid before the task is gone; seen under qemu-user). */
static int threads_settle(int want) {
    int n = count_threads();
    for (int i = 0; i < 5000 && n != want; i++) {
        sleep_ms(1);
        n = count_threads();
    }
    return n;
}

static void wait_atomic(atomic_int *v, int want, const char *what) {
    for (int i = 0; i < 20000 && atomic_load(v) < want; i++) sleep_ms(1);
    if (atomic_load(v) < want) {
        fprintf(stderr, "log:\n%s", log_buf);
        fprintf(stderr, "%s did not happen\n", what);
        CHECK(0);
    }
}

CASE(stall) {
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_INFO, log_fn, NULL), 0);
    async_sched_config_t cfg = {.workers = 2};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    CHECK_FAIL(async_sched_set_stall_ms(s, -1) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_set_stall_ms(s, 3600001) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_sched_set_stall_ms(NULL, 10) == -1, ASYNC_E_BADHANDLE);
    int base = count_threads();
    CHECK_EQ(base, 0);
    CHECK_EQ(async_sched_set_stall_ms(s, 0), 0); /* off when off: nothing */
    CHECK_EQ(threads_settle(base), base);
    CHECK_EQ(async_sched_set_stall_ms(s, 40), 0);
    CHECK_EQ(threads_settle(base + 1), base + 1); /* the monitor thread */
    CHECK_EQ(async_sched_set_stall_ms(s, 40), 0); /* again: still one */
    CHECK_EQ(threads_settle(base + 1), base + 1);
    /* a fiber that yields all the time runs beside it (it is reported only
     * if the OS keeps its worker thread off the CPU for 40 ms: a stall of
     * that worker all the same, so not asserted on this shared machine) */
    async_fiber_t *y = async_fiber_spawn(s, polite_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(y);
    async_fiber_t *h = async_fiber_spawn(s, hog, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(h);
    wait_atomic(&warns, 1, "the stall report");
    /* reported once per stall: wait for several more thresholds to pass
     * (the monitor samples every 10 ms: count its rounds by time only as a
     * lower bound; a second report would be a bug whenever it came) */
    sleep_ms(400);
    atomic_store(&hog_go, 1);
    wait_atomic(&infos, 1, "the end-of-stall message");
    atomic_store(&yielder_go, 1);
    CHECK_EQ(async_fiber_join(h, 10000), 0);
    CHECK_EQ(async_fiber_join(y, 10000), 0);
    pthread_mutex_lock(&log_mu);
    printf("%s", log_buf);
    CHECK_EQ(atomic_load(&hog_warns), 1);
    CHECK(strstr(log_buf, "\"hog\" has run for "));
    CHECK(strstr(log_buf, "without parking or yielding (threshold 40 ms, on a CPU for "));
    pthread_mutex_unlock(&log_mu);
    /* off: the monitor thread is gone */
    CHECK_EQ(async_sched_set_stall_ms(s, 0), 0);
    CHECK_EQ(threads_settle(base), base);
    /* destroy with the monitor on stops it */
    CHECK_EQ(async_sched_set_stall_ms(s, 1000), 0);
    CHECK_EQ(threads_settle(base + 1), base + 1);
    async_sched_destroy(s);
    CHECK_EQ(threads_settle(base), base);
}

/* A log handler on the monitor thread cannot stop the monitor or destroy the
 * scheduler (the monitor would join itself, or free what it scans):
 * ASYNC_E_STATE, and both still work from elsewhere afterwards. */
static async_sched_t *hs;
static atomic_int h_set_err = -1, h_destroy_err = -1;

static void selfish_log(int level, const char *msg, void *ctx) {
    (void)ctx;
    if (level != ASYNC_LOG_WARN || strncmp(msg, "stall:", 6) != 0 || atomic_load(&h_destroy_err) != -1) return;
    async_clear_error();
    int rc = async_sched_set_stall_ms(hs, 0);
    atomic_store(&h_set_err, rc == -1 ? async_last_error() : 0);
    async_clear_error();
    async_sched_destroy(hs);
    atomic_store(&h_destroy_err, async_last_error());
}

CASE(stall_handler_calls) {
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, selfish_log, NULL), 0);
    async_sched_config_t cfg = {.workers = 1};
    hs = async_sched_create(&cfg);
    CHECK(hs);
    CHECK_EQ(async_sched_set_stall_ms(hs, 20), 0);
    async_fiber_t *h = async_fiber_spawn(hs, hog, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(h);
    for (int i = 0; i < 20000 && atomic_load(&h_destroy_err) == -1; i++) sleep_ms(1);
    CHECK_EQ(atomic_load(&h_set_err), ASYNC_E_STATE);
    CHECK_EQ(atomic_load(&h_destroy_err), ASYNC_E_STATE);
    atomic_store(&hog_go, 1);
    CHECK_EQ(async_fiber_join(h, 10000), 0);
    CHECK_EQ(async_sched_set_stall_ms(hs, 0), 0);
    CHECK_EQ(threads_settle(0), 0);
    async_sched_destroy(hs);
}

/* ASYNC_FIBER_STALL_MS turns it on for new schedulers (run in a child) */
CASE(stall_env_child) {
    if (!getenv("ASYNC_FIBER_STALL_MS")) return;
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_INFO, log_fn, NULL), 0);
    async_sched_config_t cfg = {.workers = 1};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    async_fiber_t *h = async_fiber_spawn(s, hog, NULL, ASYNC_FIBER_JOINABLE);
    wait_atomic(&warns, 1, "the stall report");
    atomic_store(&hog_go, 1);
    CHECK_EQ(async_fiber_join(h, 10000), 0);
    async_sched_destroy(s);
}

CASE(stall_env) {
    int st = run_self_case("stall_env_child", "ASYNC_FIBER_STALL_MS=30");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char out[4096];
    st = run_self_case_out("sched_env_child", "ASYNC_FIBER_STALL_MS=bogus", out, sizeof out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(out, "ASYNC_FIBER_STALL_MS=bogus ignored"));
}

/* A scheduler created (and one fiber run) under the environment the parent
 * gives: stall_env checks what its log says. */
CHILD(sched_env_child) {
    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, nop_fiber, NULL, 0));
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
}

TEST_MAIN()
