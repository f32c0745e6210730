/*
 * go_wakeups: what the Go runtime inside libasync costs an idle C host
 * (docs/EMBEDDING.md, "Timer wake-ups after a call into Go"). Prints the
 * process's threads, VmRSS and VmSize before and after the first call into
 * Go, then, for ROUNDS calls into Go made after 200 ms of quiet, how often
 * the threads other than main ran in each window after the call (the sum of
 * their run counts, /proc/self/task/<tid>/schedstat field 3: each is one
 * wake-up, nearly all of them Go's system monitor, sysmon).
 * MODE "call": the call is a trivial one (async_runtime_cancel_timer on a
 * dead runtime: a handle lookup in Go). MODE "timer": a live runtime with a
 * 200 ms timer, as a host loop has; the call is the async_runtime_wait that
 * returns its event (timers are kept in Go). MODE "fd": a live runtime with
 * a socket registered for READ; after 200 ms of quiet a byte arrives and the
 * call is the wait that returns the READ event (on epoll the wait enters Go
 * to translate the fd record; on poll it waits in Go); the windows start at
 * the byte's write.
 *
 *   gcc -O2 -Ibench -Iinclude -o go_wakeups bench/go_wakeups.c -Lbuild -lasync -Wl,-rpath,$PWD/build
 *   ./go_wakeups [rounds=20] [call|timer|fd]     (ASYNC_BACKEND=poll for the poll backend)
 */
#include "bench.h"

#include <async.h>
#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

static const double edges_ms[] = {0.5, 1, 2, 5, 10, 20, 50, 100, 200};
#define NEDGES (sizeof edges_ms / sizeof edges_ms[0])

/* The run counts of every thread but the caller, summed. */
static uint64_t others_runs(void) {
    char path[300];
    uint64_t sum = 0;
    pid_t self = (pid_t)gettid();
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    if (!d) FAIL("opendir /proc/self/task");
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || atoi(e->d_name) == self) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
        FILE *f = fopen(path, "r");
        unsigned long long run_ns, wait_ns, runs;
        if (f && fscanf(f, "%llu %llu %llu", &run_ns, &wait_ns, &runs) == 3) sum += runs;
        if (f) fclose(f);
    }
    closedir(d);
    return sum;
}

static void status(const char *when) {
    char line[128];
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) FAIL("/proc/self/status");
    printf("%s:", when);
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "Threads:", 8) || !strncmp(line, "VmRSS:", 6) || !strncmp(line, "VmSize:", 7)) {
            line[strcspn(line, "\n")] = 0;
            printf("  %s", line);
        }
    }
    printf("\n");
    fclose(f);
}

int main(int argc, char **argv) {
    long rounds = arg_long(argc, argv, 1, 20);
    double wakes[NEDGES] = {0}, during_wait = 0;
    sleep_us(300000);
    status("loaded, before any call into Go");
    async_runtime_t *rt = async_runtime_init();
    if (!rt) FAIL("async_runtime_init");
    async_runtime_deinit(rt); /* rt stays a dead handle: each call below only looks it up in Go */
    sleep_us(300000);
    status("after the first calls         ");
    const char *mode = argc > 2 ? argv[2] : "call";
    int timer_mode = strcmp(mode, "timer") == 0, fd_mode = strcmp(mode, "fd") == 0, sp[2];
    async_runtime_t *live = timer_mode || fd_mode ? async_runtime_init() : NULL;
    if ((timer_mode || fd_mode) && !live) FAIL("async_runtime_init");
    if (fd_mode && (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0 || async_runtime_add(live, sp[0], ASYNC_EVENT_READ, NULL) != 0))
        FAIL("socketpair or async_runtime_add");
    for (long r = 0; r < rounds; r++) {
        uint64_t base, t0;
        io_event_t ev;
        if (fd_mode) {
            char c;
            sleep_us(200000);
            base = others_runs();
            t0 = now_ns();
            if (write(sp[1], "x", 1) != 1) FAIL("write");
            if (async_runtime_wait(live, &ev, 1, -1) != 1 || read(sp[0], &c, 1) != 1) FAIL("wait or read");
        } else if (timer_mode) {
            uint64_t before = others_runs();
            if (async_runtime_add_timer(live, 200, 0, 1) == 0) FAIL("async_runtime_add_timer");
            if (async_runtime_wait(live, &ev, 1, -1) != 1) FAIL("async_runtime_wait");
            base = others_runs();
            t0 = now_ns();
            during_wait += (double)(base - before);
        } else {
            sleep_us(200000);
            base = others_runs();
            t0 = now_ns();
            async_runtime_cancel_timer(rt, 1); /* a trivial call into Go (ASYNC_E_BADHANDLE) */
        }
        for (size_t k = 0; k < NEDGES; k++) {
            while ((double)(now_ns() - t0) < edges_ms[k] * 1e6) {
                uint64_t left_us = (uint64_t)(edges_ms[k] * 1e3) - (now_ns() - t0) / 1000;
                sleep_us(left_us > 100 ? (long)(left_us - 50) : 20);
            }
            wakes[k] += (double)(others_runs() - base);
        }
    }
    printf("wake-ups of the other threads after %s (mean of %ld):\n",
           timer_mode ? "a wait that returned a timer event"
           : fd_mode  ? "a wait that returned a READ event"
                      : "a trivial call into Go",
           rounds);
    if (timer_mode) printf("  during the 200 ms waits themselves: %.1f wake-ups\n", during_wait / (double)rounds);
    double prev = 0, prev_ms = 0;
    for (size_t k = 0; k < NEDGES; k++) {
        double w = wakes[k] / (double)rounds;
        printf("  %6.1f - %6.1f ms: %6.1f wake-ups (%5.2f per ms)\n", prev_ms, edges_ms[k], w - prev,
               (w - prev) / (edges_ms[k] - prev_ms));
        prev = w;
        prev_ms = edges_ms[k];
    }
    return 0;
}
