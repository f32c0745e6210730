/* The console and the standard descriptors: a second add_console replaces
 * the first; the examples with stdin closed, stdout unwritable (a full disk)
 * and at their descriptor limit with clients still connecting; the library
 * loaded into a program started with its standard descriptors closed.
 * Registered for epoll and poll. */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>

#define ASYNC_TEST_CLASSIC /* the classic headers and check.h (rt.h) */
#include "rt.h"

/* ---- console ------------------------------------------------------------------------- */

CASE(console_twice) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    int p[2], saved = dup(0), a, b, n;
    CHECK(rt && saved >= 0);
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(dup2(p[0], 0), 0);
    CHECK_EQ(async_runtime_add_console(rt, &a), 0);
    CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_PIPE);
    CHECK_EQ(async_runtime_add_console(rt, &b), 0);
    CHECK(async_runtime_get_console_ctx(rt) == &b);
    CHECK_EQ(write(p[1], "hi\n", 3), 3);
    n = waittv(rt, 5, 0);
    CHECK_EQ(n, 1);
    CHECK(ev[0].context == &b);
    CHECK_EQ(ev[0].fd, 0);
    /* EOF (the writer closes): READ (and maybe CLOSE), read returns the rest then 0 */
    close(p[1]);
    n = waittv(rt, 5, 0);
    CHECK_EQ(n, 1);
    CHECK(ev[0].event_type & EVENT_READ);
    CHECK_EQ(async_runtime_remove(rt, 0), 0);
    fprintf(stderr, "after remove: type %d ctx %p\n", async_runtime_get_console_type(rt),
            async_runtime_get_console_ctx(rt));
    CHECK_EQ(waittv(rt, 0, 0), 0);
    /* stdin closed */
    close(0);
    CHECK_EQ(async_runtime_add_console(rt, &a), 0);
    CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_NONE);
    CHECK_EQ(waittv(rt, 0, 0), 0);
    async_runtime_deinit(rt);
    CHECK_EQ(dup2(saved, 0), 0);
    close(saved);
    close(p[0]);
}

/* ---- the examples under hostile standard descriptors ------------------------------- */

/* Runs argv with stdin closed (in_closed) or /dev/null, stdout /dev/full
 * (out_full) or a pipe read into out; stderr into the same pipe. Returns the
 * wait status; fails if the program has not ended within 30 s. */
static int run_prog(char *const argv[], int in_closed, int out_full, char *out, size_t cap)
{
    int p[2], st = 0;
    size_t have = 0;
    double t0 = now_ms();
    pid_t pid = fork_piped(p);
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY), full = open("/dev/full", O_WRONLY);
        dup2(p[1], 2);
        dup2(out_full ? full : p[1], 1);
        if (in_closed)
            close(0);
        else
            dup2(null, 0);
        close_pair(p);
        close(null);
        close(full);
        execv(argv[0], argv);
        _exit(99);
    }
    close(p[1]);
    for (;;) {
        struct pollfd pf = {p[0], POLLIN, 0};
        int left = 30000 - (int)(now_ms() - t0);
        if (left <= 0 || poll(&pf, 1, left) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fprintf(stderr, "%s did not end within 30 s; its output:\n%.*s\n", argv[0], (int)have, out);
            CHECK(0);
        }
        char buf[4096];
        ssize_t r = read(p[0], buf, sizeof buf);
        if (r <= 0)
            break;
        if (have + (size_t)r < cap) {
            memcpy(out + have, buf, (size_t)r);
            have += (size_t)r;
        }
    }
    out[have] = 0;
    close(p[0]);
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (now_ms() - t0 > 30000) {
            kill(pid, SIGKILL);
            CHECK(0);
        }
        sleep_ms(5);
    }
    return st;
}

static char g_out[1 << 16];

/* console_worker started with stdin closed: no descriptor of the program
 * (the runtime's, the listening socket) may become "stdin" for the console
 * reader; a closed stdin is the end of input, as /dev/null is. */
CASE(example_console_closed_stdin) // poll adversarial
{
#ifdef ASYNC_TEST_CONSOLE_WORKER
    char *argv[] = {ASYNC_TEST_CONSOLE_WORKER, "--port", "0", "--heartbeat", "0", NULL};
    int st = run_prog(argv, 1, 0, g_out, sizeof g_out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(g_out, "console: end of input, shutting down") != NULL);
#else
    printf("examples not built: skipped\n");
#endif
}

/* async_dns whose stdout cannot be written (a full disk): the answers are
 * lost, so the exit status must say so, not 0; and with stdin and stdout
 * closed its own descriptors never receive its output. */
CASE(example_dns_lost_output) // poll adversarial
{
#ifdef ASYNC_TEST_ASYNC_DNS
    char *argv[] = {ASYNC_TEST_ASYNC_DNS, "localhost", NULL};
    int st = run_prog(argv, 0, 0, g_out, sizeof g_out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(g_out, "localhost: ") != NULL);
    st = run_prog(argv, 0, 1, g_out, sizeof g_out);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        fprintf(stderr, "async_dns exited 0 with its output lost (stdout /dev/full)\n");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    CHECK(strstr(g_out, "async_dns: ") != NULL); /* said on stderr */
#else
    printf("examples not built: skipped\n");
#endif
}

/* console_worker at its descriptor limit with clients still connecting: a
 * connection it cannot accept (EMFILE) must be answered (refused, "server
 * full" or closed), not left pending, which kept the listening socket
 * readable and the loop spinning on it for ever. Each client reads its first
 * line; a deadline only turns a client left without an answer into a
 * failure. */
CASE(example_console_emfile) // poll adversarial
{
#ifdef ASYNC_TEST_CONSOLE_WORKER
    int in[2], out[2], port = 0, i, refused = 0, st;
    char buf[512];
    size_t have = 0;
    pid_t pid;
    int clients[200], nc = 0;
    CHECK_EQ(pipe(in), 0);
    pid = fork_piped(out);
    if (pid == 0) {
        struct rlimit rl;
        char *argv[] = {ASYNC_TEST_CONSOLE_WORKER, "--port", "0", "--heartbeat", "0", NULL};
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(out[1], 2);
        close_pair(in);
        close_pair(out);
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = 40;
        setrlimit(RLIMIT_NOFILE, &rl);
        execv(argv[0], argv);
        _exit(99);
    }
    close(in[0]);
    close(out[1]);
    while (!port) {
        struct pollfd pf = {out[0], POLLIN, 0};
        char *at;
        ssize_t r;
        CHECK(poll(&pf, 1, 30000) == 1);
        r = read(out[0], buf + have, sizeof buf - 1 - have);
        CHECK(r > 0);
        have += (size_t)r;
        buf[have] = 0;
        if ((at = strstr(buf, "listening on 127.0.0.1:")) != NULL && strchr(at, '\n'))
            port = atoi(at + strlen("listening on 127.0.0.1:"));
    }
    for (i = 0; i < 200 && !refused; i++) {
        struct sockaddr_in sa;
        struct pollfd pf;
        char line[64];
        ssize_t r;
        int c = socket(AF_INET, SOCK_STREAM, 0);
        CHECK(c >= 0);
        memset(&sa, 0, sizeof sa);
        sa.sin_family = AF_INET;
        sa.sin_port = htons((uint16_t)port);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        CHECK_EQ(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
        pf.fd = c;
        pf.events = POLLIN;
        pf.revents = 0;
        if (poll(&pf, 1, 10000) != 1) {
            fprintf(stderr, "client %d: no answer within 10 s (the server cannot accept it)\n", i);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            CHECK(0);
        }
        r = read(c, line, sizeof line - 1);
        line[r > 0 ? r : 0] = 0;
        if (r > 0 && strncmp(line, "welcome", 7) == 0) {
            clients[nc++] = c;
            continue;
        }
        refused = 1; /* "server full", EOF or a reset */
        close(c);
    }
    CHECK(refused);
    /* the server still serves: drop the clients, then end its input */
    while (nc > 0)
        close(clients[--nc]);
    close(in[1]);
    {
        double t0 = now_ms();
        char sink[4096];
        for (;;) {
            struct pollfd pf = {out[0], POLLIN, 0};
            CHECK(now_ms() - t0 < 30000);
            if (poll(&pf, 1, 1000) == 1 && read(out[0], sink, sizeof sink) <= 0)
                break;
        }
        while (waitpid(pid, &st, WNOHANG) == 0) {
            CHECK(now_ms() - t0 < 30000);
            sleep_ms(5);
        }
    }
    close(out[0]);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
#else
    printf("examples not built: skipped\n");
#endif
}

/* Started with stdin closed (by std_closed): the library, loaded before
 * main, opened /dev/null on descriptor 0, so that nothing else (Go's
 * initialisation, the library's descriptors) takes the number; the runtime's
 * descriptors are above 2. */
CHILD(std_closed_probe)
{
    struct stat st, nul;
    int i;
    CHECK_EQ(stat("/dev/null", &nul), 0);
    if (fstat(0, &st) != 0 || !S_ISCHR(st.st_mode) || st.st_rdev != nul.st_rdev) {
        fprintf(stderr, "descriptor 0 is not /dev/null at the top of main\n");
        CHECK(0);
    }
    for (i = 0; i < 20; i++) {
        async_runtime_t *rt = async_runtime_init();
        CHECK(rt);
        CHECK(async_runtime_get_event_loop_handle(rt) > 2);
        async_runtime_deinit(rt);
    }
    CHECK_EQ(fstat(0, &st), 0);
    CHECK(S_ISCHR(st.st_mode) && st.st_rdev == nul.st_rdev);
}

CASE(std_closed) // poll adversarial
{
    char self[4096];
    ssize_t len;
    int st;
    const char *emu = getenv("ASYNC_TEST_EMULATOR");
    if (emu && *emu) {
        /* qemu-user opens descriptors of its own (the guest binary) before
         * the guest's constructors run: a closed 0 is taken by the emulator
         * before libasync loads (failed under qemu-aarch64 in cross.sh) */
        printf("under an emulator: skipped\n");
        return;
    }
    len = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(len > 0);
    self[len] = 0;
    char *argv[] = {self, "std_closed_probe", NULL};
    st = run_prog(argv, 1, 0, g_out, sizeof g_out);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fprintf(stderr, "%s", g_out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

TEST_MAIN()
