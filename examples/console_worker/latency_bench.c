/*
 * console_latency_bench — how long a console line takes from being written to
 * being processed by console_worker's loop.
 *
 * It starts console_worker with its stdin and stdout on pipes, then, one line
 * at a time, writes "ping I", and waits for "pong I". Each sample is one round
 * trip: pipe write -> reader worker's poll/read -> async_queue -> completion
 * wakes async_runtime_wait -> command runs -> reply written to stdout ->
 * read here. It is an upper bound on "write to processing" (it includes the
 * reply's way back). Prints p50, p99 and max in microseconds.
 *
 * usage: console_latency_bench [-n LINES] [PATH-TO-console_worker]
 * Not a test: it asserts nothing. The target on a quiet machine is p99 < 1 ms.
 */
#include "child.h"

#ifndef CONSOLE_WORKER_PATH
#define CONSOLE_WORKER_PATH "./console_worker"
#endif

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    long n = 10000;
    const char *prog = CONSOLE_WORKER_PATH;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            n = strtol(argv[++i], NULL, 10);
            if (n < 1 || n > 10000000) {
                fprintf(stderr, "console_latency_bench: -n wants 1..10000000\n");
                return 2;
            }
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: console_latency_bench [-n LINES] [PATH-TO-console_worker]\n");
            return 2;
        } else {
            prog = argv[i];
        }
    }
    signal(SIGPIPE, SIG_IGN);

    char *args[] = {(char *)prog, "--port", "0", "--heartbeat", "0", NULL};
    struct child c;
    child_start(&c, args, CHILD_PIPE, NULL);
    child_port(&c);
    child_expect(&c, "commands:", 20000);

    int64_t *lat = malloc((size_t)n * sizeof *lat);
    REQUIRE(lat != NULL);
    const long warmup = n < 1000 ? n / 10 : 100;
    char line[64], reply[64];
    for (long i = -warmup; i < n; i++) {
        snprintf(line, sizeof line, "ping %ld\n", i);
        snprintf(reply, sizeof reply, "pong %ld\n", i);
        int64_t t0 = now_us();
        child_write(&c, line);
        child_expect(&c, reply, 20000);
        int64_t t1 = now_us();
        if (i >= 0)
            lat[i] = t1 - t0;
        if (c.len > (1u << 20)) { /* keep the output buffer small */
            c.len = c.scan = 0;
            c.out[0] = '\0';
        }
    }
    child_write(&c, "shutdown\n");
    child_require_clean_exit(&c, 20000);
    child_free(&c);

    qsort(lat, (size_t)n, sizeof *lat, cmp_i64);
    int64_t sum = 0;
    for (long i = 0; i < n; i++)
        sum += lat[i];
    printf("console line latency over %ld lines (write -> processed -> reply read), microseconds:\n", n);
    printf("  p50 %lld  p99 %lld  max %lld  mean %.1f\n", (long long)lat[n / 2], (long long)lat[(n * 99) / 100],
           (long long)lat[n - 1], (double)sum / (double)n);
    printf("  target p99 < 1000 us: %s\n", lat[(n * 99) / 100] < 1000 ? "met" : "NOT met");
    free(lat);
    return 0;
}
