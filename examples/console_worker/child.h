/*
 * child.h — run console_worker as a child process and talk to it, for the
 * test driver and the latency bench (plain POSIX; no libasync needed).
 *
 * A child runs either with pipes (stdin from a pipe or a file, stdout into a
 * pipe; stderr is inherited so its diagnostics reach the test log) or on a
 * pseudo-terminal made with forkpty() (stdin, stdout and stderr are the pty;
 * the child is a session leader whose foreground process group gets SIGINT
 * when ^C is written, exactly like a user's terminal).
 */
#ifndef CHILD_H
#define CHILD_H

#define _GNU_SOURCE 1
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...)                                                                                              \
    do {                                                                                                       \
        fprintf(stderr, "%s:%d: FAILED: ", __FILE__, __LINE__);                                               \
        fprintf(stderr, __VA_ARGS__);                                                                          \
        fputc('\n', stderr);                                                                                   \
        exit(1);                                                                                               \
    } while (0)

#define REQUIRE(cond)                                                                                          \
    do {                                                                                                       \
        if (!(cond))                                                                                           \
            FAIL("%s", #cond);                                                                                 \
    } while (0)

enum child_stdin { CHILD_PIPE, CHILD_FILE, CHILD_PTY };

struct child {
    pid_t pid;
    int in_fd;    /* write here to type on the child's console (-1 once closed) */
    int out_fd;   /* the child's stdout (for a pty: its terminal output) */
    char *out;    /* everything read so far, NUL-terminated */
    size_t len, cap;
    size_t scan;  /* child_expect searches from here */
    bool eof;
    int status;   /* waitpid status once reaped */
    bool reaped;
};

static inline int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Starts `argv` (argv[0] is the path). For CHILD_FILE, stdin_file is opened
 * as the child's stdin. */
static inline void child_start(struct child *c, char *const argv[], enum child_stdin mode, const char *stdin_file)
{
    memset(c, 0, sizeof *c);
    c->cap = 1 << 16;
    c->out = malloc(c->cap);
    REQUIRE(c->out != NULL);
    c->out[0] = '\0';
    c->in_fd = -1;
    fflush(NULL);
    if (mode == CHILD_PTY) {
        int master;
        pid_t pid = forkpty(&master, NULL, NULL, NULL);
        if (pid < 0)
            FAIL("forkpty: %s (is /dev/ptmx available?)", strerror(errno));
        if (pid == 0) {
            signal(SIGPIPE, SIG_DFL); /* as from a shell: not our SIG_IGN */
            execv(argv[0], argv);
            _exit(127);
        }
        c->pid = pid;
        c->in_fd = master;
        c->out_fd = dup(master);
        REQUIRE(c->out_fd >= 0);
        return;
    }
    int inp[2] = {-1, -1}, outp[2];
    REQUIRE(pipe2(outp, O_CLOEXEC) == 0);
    if (mode == CHILD_PIPE)
        REQUIRE(pipe2(inp, O_CLOEXEC) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int in = mode == CHILD_PIPE ? inp[0] : open(stdin_file, O_RDONLY);
        if (in < 0 || dup2(in, 0) < 0 || dup2(outp[1], 1) < 0)
            _exit(126);
        signal(SIGPIPE, SIG_DFL); /* as from a shell: not our SIG_IGN */
        execv(argv[0], argv);
        _exit(127);
    }
    c->pid = pid;
    close(outp[1]);
    c->out_fd = outp[0];
    if (mode == CHILD_PIPE) {
        close(inp[0]);
        c->in_fd = inp[1];
    }
}

/* Reads what is available within timeout_ms into c->out. false at EOF or
 * timeout. A pty reports EIO once the child is gone: that is EOF too. */
static inline bool child_read_some(struct child *c, int timeout_ms)
{
    if (c->eof)
        return false;
    struct pollfd p = {.fd = c->out_fd, .events = POLLIN};
    int r = poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR)
        return true;
    REQUIRE(r >= 0);
    if (r == 0)
        return false;
    if (c->cap - c->len < 4097) {
        c->cap *= 2;
        c->out = realloc(c->out, c->cap);
        REQUIRE(c->out != NULL);
    }
    ssize_t n = read(c->out_fd, c->out + c->len, 4096);
    if (n < 0 && errno == EINTR)
        return true;
    if (n <= 0) {
        c->eof = true;
        return false;
    }
    c->len += (size_t)n;
    c->out[c->len] = '\0';
    return true;
}

/* Waits (up to timeout_ms) until `text` appears in the output after the
 * previous match; returns where it starts and moves past it. Fails the test
 * (printing the output) otherwise. */
static inline const char *child_expect(struct child *c, const char *text, int timeout_ms)
{
    int64_t deadline = now_us() + (int64_t)timeout_ms * 1000;
    for (;;) {
        char *hit = strstr(c->out + c->scan, text);
        if (hit) {
            c->scan = (size_t)(hit - c->out) + strlen(text);
            return hit;
        }
        int64_t left = deadline - now_us();
        if (left <= 0 || c->eof) {
            fprintf(stderr, "---- child output so far ----\n%s\n-----------------------------\n", c->out);
            FAIL("did not see \"%s\" within %d ms%s", text, timeout_ms, c->eof ? " (child output ended)" : "");
        }
        child_read_some(c, (int)(left / 1000) + 1);
    }
}

static inline void child_write(struct child *c, const char *text)
{
    size_t len = strlen(text), off = 0;
    REQUIRE(c->in_fd >= 0);
    while (off < len) {
        ssize_t n = write(c->in_fd, text + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        REQUIRE(n > 0);
        off += (size_t)n;
    }
}

static inline void child_close_input(struct child *c)
{
    if (c->in_fd >= 0 && c->in_fd != c->out_fd)
        close(c->in_fd);
    c->in_fd = -1;
}

/* Reads the output to its end and reaps the child, within timeout_ms;
 * returns the waitpid status. On timeout the child is killed and the test
 * fails. */
static inline int child_wait(struct child *c, int timeout_ms)
{
    int64_t deadline = now_us() + (int64_t)timeout_ms * 1000;
    while (!c->reaped) {
        pid_t r = waitpid(c->pid, &c->status, WNOHANG);
        REQUIRE(r >= 0);
        if (r == c->pid) {
            c->reaped = true;
            break;
        }
        if (now_us() > deadline) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &c->status, 0);
            fprintf(stderr, "---- child output ----\n%s\n----------------------\n", c->out);
            FAIL("child %d did not exit within %d ms", (int)c->pid, timeout_ms);
        }
        if (!child_read_some(c, 20) && c->eof)
            usleep(10000);
    }
    while (child_read_some(c, 200)) /* whatever is still buffered */
        ;
    return c->status;
}

/* The child must have exited by itself with status 0 (not by a signal). */
static inline void child_require_clean_exit(struct child *c, int timeout_ms)
{
    int st = child_wait(c, timeout_ms);
    if (WIFSIGNALED(st)) {
        fprintf(stderr, "---- child output ----\n%s\n----------------------\n", c->out);
        FAIL("child killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "---- child output ----\n%s\n----------------------\n", c->out);
        FAIL("child exited with status %d", WEXITSTATUS(st));
    }
}

static inline void child_free(struct child *c)
{
    child_close_input(c);
    if (c->out_fd >= 0)
        close(c->out_fd);
    free(c->out);
    c->out = NULL;
}

/* Reads "listening on 127.0.0.1:PORT" and returns PORT. */
static inline unsigned child_port(struct child *c)
{
    const char *hit = child_expect(c, "listening on 127.0.0.1:", 20000);
    size_t at = (size_t)(hit - c->out) + strlen("listening on 127.0.0.1:");
    while (!strchr(c->out + at, '\n')) /* the rest of the line */
        REQUIRE(child_read_some(c, 20000));
    unsigned port = (unsigned)strtoul(c->out + at, NULL, 10);
    REQUIRE(port > 0 && port < 65536);
    return port;
}

#endif /* CHILD_H */
