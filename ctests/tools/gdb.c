/* The gdb helper scripts/gdb/libasync-gdb.py, run in a real gdb against a
 * child (this executable, case gdb_target) with parked fibers: it lists the
 * fibers with their names and states and prints a parked fiber's stack. */
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>

#include "fibers.h"

/* ---- gdb ----------------------------------------------------------------------------- */

static async_chan_t *gch;

__attribute__((noinline)) void gdb_parked_in_recv(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "gdb-reader");
    int v;
    async_chan_recv(gch, &v, -1);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void gdb_deep(int n) {
    if (n == 0) {
        async_fiber_sleep(600000);
        return;
    }
    gdb_deep(n - 1);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void gdb_sleeper_fn(void *arg) {
    (void)arg;
    async_fiber_set_name(NULL, "gdb-sleeper");
    gdb_deep(2);
    __asm__ volatile("" ::: "memory");
}

/* gdb stops here */
__attribute__((noinline)) void gdb_ready(void) { __asm__ volatile("" ::: "memory"); }

CASE(gdb_target) {
    async_sched_config_t cfg = {.workers = 2};
    async_sched_t *s = async_sched_create(&cfg);
    CHECK(s);
    gch = async_chan_create(0, sizeof(int));
    CHECK(async_fiber_spawn(s, gdb_parked_in_recv, NULL, 0));
    CHECK(async_fiber_spawn(s, gdb_sleeper_fn, NULL, 0));
    wait_counts(s, 2, 0); /* both parked: their workers switched away from them */
    gdb_ready();
    async_sched_shutdown(s, 10000);
    async_sched_destroy(s);
    async_chan_destroy(gch);
}

CASE(gdb) { // timeout=180
    const char *emu = getenv("ASYNC_TEST_EMULATOR");
    if (emu && *emu) { /* this binary is another architecture's (qemu-user) */
        printf("under an emulator: skipped\n");
        return;
    }
    if (system("gdb --version >/dev/null 2>&1") != 0) {
        printf("gdb not found: skipped\n");
        return;
    }
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(len > 0);
    self[len] = 0;
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "gdb -nx -batch -q -ex 'set pagination off' -ex 'set auto-load safe-path /' "
             "-ex 'source %s/scripts/gdb/libasync-gdb.py' -ex 'break gdb_ready' -ex 'run' "
             "-ex 'info fibers' -ex 'fiber bt gdb-reader' -ex 'fiber bt gdb-sleeper' -ex 'bt 1' "
             "-ex 'fiber bt nosuchfiber' -ex 'kill' --args %s gdb_target 2>&1",
             ASYNC_SOURCE_DIR, self);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    static char out[1 << 16];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    pclose(p);
    printf("%s\n", out);
    if (strstr(out, "ptrace: Operation not permitted") || strstr(out, "Couldn't get registers")) {
        printf("ptrace not permitted here: skipped\n");
        return;
    }
    CHECK(strstr(out, "\"gdb-reader\""));
    CHECK(strstr(out, "\"gdb-sleeper\""));
    CHECK(strstr(out, "chan recv 0x"));
    /* the parked fibers' own functions, found by unwinding their stacks */
    const char *r = strstr(out, "\"gdb-reader\" (parked):");
    CHECK(r);
    const char *sl = strstr(r, "\"gdb-sleeper\" (parked):");
    CHECK(sl);
    const char *fn = strstr(r, "gdb_parked_in_recv");
    CHECK(fn && fn < sl);
    CHECK(strstr(r, "async_chan_recv") && strstr(r, "async_chan_recv") < sl);
    CHECK(strstr(sl, "gdb_deep") && strstr(sl, "gdb_sleeper_fn") && strstr(sl, "async_fiber_sleep"));
    /* registers restored: the thread is still in gdb_ready */
    CHECK(strstr(sl, "#0  gdb_ready"));
    CHECK(strstr(out, "libasync: no fiber nosuchfiber"));
}

TEST_MAIN()
