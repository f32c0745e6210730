/* Process helpers for the C tests (Linux /proc and POSIX only): child
 * processes waited for with a bound, a thread's scheduling state, the
 * process's resident memory and open descriptors. Include after check.h. */
#ifndef PROC_H
#define PROC_H

#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>

/* Child-side check after fork: no stdio, no locks; the exit code n names the
 * failed check. */
#define CHILD_CHECK(n, expr)                                                                                   \
    do {                                                                                                       \
        if (!(expr))                                                                                           \
            _exit(n);                                                                                          \
    } while (0)

/* Waits for the child pid at most ms; a child still running then is killed
 * and the test fails with `what`. Returns the child's wait status. */
static inline int wait_child_within(pid_t pid, int ms, const char *what)
{
    double t0 = now_ms();
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        CHECK(r != -1);
        if (r == pid)
            return status;
        if (now_ms() - t0 > ms) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fprintf(stderr, "%s\n", what);
            CHECK(!"the child hung");
        }
        sleep_ms(2);
    }
}

/* Waits (at most ms) for the child pid, which must exit with 0; otherwise
 * says on stderr how it ended, then `what` (which says what an exit code
 * means). */
static inline void wait_child_ok(pid_t pid, int ms, const char *what)
{
    int status = wait_child_within(pid, ms, what);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "child: %s %d; %s\n", WIFEXITED(status) ? "exit code" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), what);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
}

/* true if the thread is asleep (S or D in /proc/self/task/<tid>/stat). */
static inline bool thread_asleep(int tid)
{
    char path[64], buf[512], *p;
    FILE *f;
    size_t n;
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    f = fopen(path, "r");
    if (!f)
        return false;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    p = strrchr(buf, ')'); /* the state follows the command name */
    return p && (p[2] == 'S' || p[2] == 'D');
}

/* A "Field:  N kB" line of /proc/self/status (VmRSS, VmSize, ...), or -1. */
static inline long status_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    CHECK(f != NULL);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && sscanf(line + n, ": %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* Resident memory of this process, in KiB. */
static inline long rss_kb(void)
{
    long kb = status_kb("VmRSS");
    CHECK(kb > 0);
    return kb;
}

/* Entries of a /proc directory (files of /proc/self/fd, threads of
 * /proc/self/task), its own descriptor included. */
static inline int count_dir(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    int n = 0;
    CHECK(d != NULL);
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

/* Open descriptors of this process. */
static inline int fd_count(void) { return count_dir("/proc/self/fd") - 1; /* the directory's own fd */ }

/* Threads of this process. */
static inline int count_threads(void) { return count_dir("/proc/self/task"); }

#endif
