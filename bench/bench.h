/*
 * Small helpers shared by the benchmark programs in bench/.
 *
 * Every program prints exactly one result line on stdout:
 *     ok=1 key=value key=value ...
 * or, when a correctness check fails,
 *     ok=0 error="what went wrong" ...
 * bench/run.sh prefixes the line with the row and implementation names and
 * bench/report turns the lines into the table. Programs take their sizes from
 * argv so run.sh owns every op count in one place.
 */
#ifndef BENCH_H
#define BENCH_H

#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* argv[i] as a positive count, or `def` when absent. */
static inline long arg_long(int argc, char **argv, int i, long def) {
    if (i >= argc) return def;
    char *end = NULL;
    long v = strtol(argv[i], &end, 10);
    if (end == argv[i] || *end != '\0' || v <= 0) {
        fprintf(stderr, "bad argument %d: %s\n", i, argv[i]);
        exit(2);
    }
    return v;
}

/* The process's write-like syscall count (write, writev, pwrite, ...) from
 * /proc/self/io; it sums every thread of the process, dead ones included.
 * Returns -1 if the kernel does not provide it. */
static inline long long proc_syscw(void) {
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return -1;
    char line[128];
    long long v = -1;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "syscw: %lld", &v) == 1) break;
    }
    fclose(f);
    return v;
}

static inline int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v[0..n) and returns the p-th percentile (0 < p <= 100, nearest rank). */
static inline uint64_t percentile(uint64_t *v, size_t n, double p) {
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, cmp_u64);
    size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999);
    if (rank < 1) rank = 1;
    if (rank > n) rank = n;
    return v[rank - 1];
}

#define FAIL(...)                                   \
    do {                                            \
        printf("ok=0 error=\"");                    \
        printf(__VA_ARGS__);                        \
        printf("\"\n");                             \
        fflush(stdout);                             \
        exit(1);                                    \
    } while (0)

#endif
