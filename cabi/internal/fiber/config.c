/* A scheduler's defaults: ASYNC_WORKERS or the CPUs this process may use
 * (affinity, cgroup v2 quota); ASYNC_FIBER_STACK_KB or 64 KiB stacks. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(_WIN32)
#include <winsock2.h> /* before windows.h (async.h includes it) */
#include <windows.h>
#endif

#include "fiber_int.h"

/* ---- configuration -------------------------------------------------------------- */

int la_default_workers(void) {
    const char *e = getenv("ASYNC_WORKERS");
    if (e && *e) {
        int n = atoi(e);
        if (n > 0 && n <= LA_MAX_WORKERS) return n;
    }
    int n = 1;
#if defined(_WIN32)
    DWORD_PTR pm = 0, sm = 0;
    if (GetProcessAffinityMask(GetCurrentProcess(), &pm, &sm) && pm) n = __builtin_popcountll((unsigned long long)pm);
#elif defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#else
    long on = sysconf(_SC_NPROCESSORS_ONLN); /* no affinity masks to read */
    if (on > 0) n = on > LA_MAX_WORKERS ? LA_MAX_WORKERS : (int)on;
#endif
#if !defined(_WIN32)
    /* cgroup v2 quota (Linux; elsewhere the file is not there). fopen, fgets
     * and fclose are cancellation points: a host thread whose deferred
     * cancel is pending would be unwound inside async_sched_create (no
     * libasync call is a cancellation point, include/async.h). */
    int cs = LA_CANCEL_KEPT;
    la_nocancel_enter(&cs);
    FILE *fp = fopen("/proc/self/cgroup", "r");
    if (fp) {
        char line[512], path[600];
        while (fgets(line, sizeof line, fp)) {
            if (strncmp(line, "0::", 3) != 0) continue;
            line[strcspn(line, "\n")] = 0;
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/cpu.max", line + 3);
            FILE *q = fopen(path, "r");
            if (q) {
                char quota[64];
                long period = 0;
                if (fscanf(q, "%63s %ld", quota, &period) == 2 && strcmp(quota, "max") != 0 && period > 0) {
                    long qv = atol(quota);
                    int lim = (int)((qv + period - 1) / period);
                    if (lim >= 1 && lim < n) n = lim;
                }
                fclose(q);
            }
        }
        fclose(fp);
    }
    la_nocancel_leave(&cs);
#endif
    if (n < 1) n = 1;
    if (n > LA_MAX_WORKERS) n = LA_MAX_WORKERS;
    return n;
}

size_t la_default_stack(void) {
    const char *e = getenv("ASYNC_FIBER_STACK_KB");
    if (e && *e) {
        long kb = atol(e);
        if (kb >= 16 && kb <= 1024 * 1024) return (size_t)kb * 1024;
    }
    return 64 * 1024;
}

/* ASYNC_FIBER_IO: "uring" asks for io_uring (Linux; epoll when the kernel
 * refuses it), "epoll" or unset: the poller. */
int la_default_fiber_io_uring(void) {
    const char *e = getenv("ASYNC_FIBER_IO");
    return e && (strcmp(e, "uring") == 0 || strcmp(e, "io_uring") == 0);
}
