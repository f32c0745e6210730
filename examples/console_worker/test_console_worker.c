/*
 * test_console_worker — drives the console_worker program from outside, as a
 * user or a script would: through a pipe, a file, a pseudo-terminal, TCP
 * clients on 127.0.0.1 and signals.
 *
 * usage: test_console_worker CASE PATH-TO-console_worker
 * CASE: pipe_order | pipe_flood | eof | tcp_say | tcp_lines | sigpipe | pty | signals | bad_args
 *
 * No timing assertions: every wait has a generous deadline that only turns a
 * hang into a failure.
 */
#include "child.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define WAIT_MS 20000 /* deadline for any single expected output */

static const char *g_prog;

static void start(struct child *c, enum child_stdin mode, const char *file, const char *extra)
{
    char *argv[8] = {(char *)g_prog, "--port", "0", "--heartbeat", "50", NULL, NULL};
    if (extra)
        argv[5] = (char *)extra;
    child_start(c, argv, mode, file);
}

/* Splits the output into lines and returns the numbers N of "pong N" lines in
 * output order (count in *n). */
static long *pongs(const char *out, size_t *n)
{
    size_t cap = 1024;
    long *v = malloc(cap * sizeof *v);
    REQUIRE(v != NULL);
    *n = 0;
    for (const char *p = out; (p = strstr(p, "pong ")) != NULL; p += 5) {
        if (p != out && p[-1] != '\n')
            continue; /* not at the start of a line */
        if (*n == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
            REQUIRE(v != NULL);
        }
        v[(*n)++] = strtol(p + 5, NULL, 10);
    }
    return v;
}

/* The program's output ends with last (unless NULL), it exits cleanly, and
 * c is freed. */
static void expect_exit(struct child *c, const char *last)
{
    if (last)
        child_expect(c, last, WAIT_MS);
    child_require_clean_exit(c, WAIT_MS);
    child_free(c);
}

/* N lines written to a pipe are processed in order, each exactly once;
 * closing the pipe (EOF) shuts the program down cleanly. N < 256, the
 * queue's capacity, so no line can be dropped. */
static void case_pipe_order(void)
{
    enum { N = 200 };
    struct child c;
    start(&c, CHILD_PIPE, NULL, NULL);
    child_port(&c);
    char *buf = malloc(N * 16);
    REQUIRE(buf != NULL);
    size_t off = 0;
    for (int i = 0; i < N; i++)
        off += (size_t)sprintf(buf + off, "ping %d\n", i);
    child_write(&c, buf); /* all at once: the reader sees many lines per read() */
    free(buf);
    child_expect(&c, "pong 199\n", WAIT_MS);
    child_close_input(&c);
    child_expect(&c, "console: end of input, shutting down\n", WAIT_MS);
    child_expect(&c, "bye\n", WAIT_MS);
    child_require_clean_exit(&c, WAIT_MS);

    size_t n;
    long *v = pongs(c.out, &n);
    if (n != N)
        FAIL("expected %d pongs, got %zu", N, n);
    for (size_t i = 0; i < n; i++)
        if (v[i] != (long)i)
            FAIL("line %zu processed as pong %ld (out of order or duplicated)", i, v[i]);
    free(v);
    child_free(&c);
}

/* A flood far larger than the queue: the reader never blocks (drop-oldest),
 * so lines may be dropped, but the survivors keep their order, none is
 * duplicated, and processed + dropped accounts for every line. */
static void case_pipe_flood(void)
{
    enum { N = 20000 };
    struct child c;
    start(&c, CHILD_PIPE, NULL, NULL);
    child_port(&c);
    /* A writer process, so a full pipe cannot deadlock us against the child. */
    fflush(NULL);
    pid_t w = fork();
    REQUIRE(w >= 0);
    if (w == 0) {
        close(c.out_fd);
        char line[32];
        for (int i = 0; i < N; i++) {
            sprintf(line, "ping %d\n", i);
            child_write(&c, line);
        }
        child_write(&c, "stats\n");
        _exit(0);
    }
    child_close_input(&c); /* the writer holds the pipe now; its exit is our EOF */
    child_expect(&c, "stats: ", WAIT_MS);
    child_expect(&c, "console: end of input, shutting down\n", WAIT_MS);
    child_require_clean_exit(&c, WAIT_MS);
    int wst;
    REQUIRE(waitpid(w, &wst, 0) == w && WIFEXITED(wst) && WEXITSTATUS(wst) == 0);

    size_t n;
    long *v = pongs(c.out, &n);
    for (size_t i = 1; i < n; i++)
        if (v[i] <= v[i - 1])
            FAIL("pong %ld after pong %ld: out of order or duplicated", v[i], v[i - 1]);
    const char *st = strstr(c.out, "stats: ");
    unsigned long long lines = 0, dropped = 0;
    REQUIRE(sscanf(st, "stats: lines=%llu dropped=%llu", &lines, &dropped) == 2);
    /* "lines" counts the stats command itself. */
    if (lines != n + 1 || n + dropped != N)
        FAIL("%zu pongs, stats lines=%llu dropped=%llu: %d lines are not accounted for", n, lines, dropped, N);
    printf("pipe_flood: %zu of %d lines processed, %llu dropped by the drop-oldest queue\n", n, N, dropped);
    free(v);
    child_free(&c);
}

/* End of input from a file (last line without a newline) and from /dev/null
 * shuts down cleanly; an open pipe keeps the program running. */
static void case_eof(void)
{
    char path[] = "/tmp/console_worker_test_XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    const char head[] = "ping a\n\n   who   \r\nbogus\nping ", tail[] = "\nstats\nping last";
    static char longline[5000]; /* a line longer than a queue message (4096 bytes) */
    memset(longline, 'y', sizeof longline);
    REQUIRE(write(fd, head, sizeof head - 1) == (ssize_t)(sizeof head - 1));
    REQUIRE(write(fd, longline, sizeof longline) == (ssize_t)sizeof longline);
    REQUIRE(write(fd, tail, sizeof tail - 1) == (ssize_t)(sizeof tail - 1));
    close(fd);

    struct child c;
    start(&c, CHILD_FILE, path, NULL);
    child_expect(&c, "pong a\n", WAIT_MS);
    child_expect(&c, "who: 0 client(s)\n", WAIT_MS);
    child_expect(&c, "unknown command: bogus", WAIT_MS);
    /* cut to 4096 bytes: "ping " and 4091 y's */
    static char want[4096 + 8];
    memcpy(want, "\npong ", 6);
    memset(want + 6, 'y', 4096 - 5);
    memcpy(want + 6 + 4096 - 5, "\n", 2);
    child_expect(&c, want, WAIT_MS);
    child_expect(&c, "stats: lines=5 dropped=0 truncated=1 ", WAIT_MS);
    child_expect(&c, "pong last\n", WAIT_MS);
    child_expect(&c, "console: end of input, shutting down\n", WAIT_MS);
    expect_exit(&c, "bye\n");
    unlink(path);

    start(&c, CHILD_FILE, "/dev/null", NULL);
    expect_exit(&c, "console: end of input, shutting down\n");

    /* A pipe that stays open: still running after heartbeats went by. */
    start(&c, CHILD_PIPE, NULL, NULL);
    child_port(&c);
    usleep(300 * 1000);
    child_write(&c, "stats\n");
    child_expect(&c, "stats: lines=1 ", WAIT_MS);
    REQUIRE(waitpid(c.pid, &c.status, WNOHANG) == 0);
    REQUIRE(strstr(c.out, "end of input") == NULL);
    child_close_input(&c);
    expect_exit(&c, "console: end of input, shutting down\n");
}

static int connect_client(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    struct timeval tv = {.tv_sec = WAIT_MS / 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Reads from a client socket until `text` has arrived (fails on timeout/EOF).
 * `acc` accumulates what was received (NUL-terminated). */
static void client_expect(int fd, char *acc, size_t cap, const char *text)
{
    while (!strstr(acc, text)) {
        size_t len = strlen(acc);
        REQUIRE(len + 1 < cap);
        ssize_t n = recv(fd, acc + len, cap - len - 1, 0);
        if (n <= 0)
            FAIL("client did not receive \"%s\" (got \"%s\")", text, acc);
        acc[len + (size_t)n] = '\0';
    }
}

/* Starts the program on pipes and connects its first TCP client, whose
 * welcome line is then in in. Returns the client's socket; the server's
 * port goes to *port unless port is NULL. */
static int start_first_client(struct child *c, char *in, size_t cap, unsigned *port)
{
    start(c, CHILD_PIPE, NULL, NULL);
    unsigned p = child_port(c);
    if (port)
        *port = p;
    int a = connect_client(p);
    client_expect(a, in, cap, "welcome, you are client #1\n");
    return a;
}

/* TCP clients see `say` broadcasts; a client's lines reach the console; a
 * client that vanishes (reset) does not kill the server (no SIGPIPE). */
static void case_tcp_say(void)
{
    struct child c;
    unsigned port;
    char a_in[4096] = "", b_in[4096] = "";
    int a = start_first_client(&c, a_in, sizeof a_in, &port);
    int b = connect_client(port);
    client_expect(b, b_in, sizeof b_in, "welcome, you are client #2\n");

    child_write(&c, "who\n");
    child_expect(&c, "who: 2 client(s): ", WAIT_MS);
    child_write(&c, "say hello world\n");
    child_expect(&c, "said to 2 client(s)\n", WAIT_MS);
    client_expect(a, a_in, sizeof a_in, "hello world\n");
    client_expect(b, b_in, sizeof b_in, "hello world\n");

    static const char hi[] = "hi from a\r\n";
    REQUIRE(send(a, hi, sizeof hi - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof hi - 1));
    child_expect(&c, "client #1: hi from a\n", WAIT_MS);

    /* b resets its connection; the server may still write to it before it
     * notices (EPIPE/ECONNRESET), which must not raise a fatal SIGPIPE. */
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    REQUIRE(setsockopt(b, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0);
    close(b);
    child_write(&c, "say after 1\nsay after 2\nsay after 3\n");
    client_expect(a, a_in, sizeof a_in, "after 1\nafter 2\nafter 3\n");
    child_expect(&c, "client #2 disconnected", WAIT_MS);
    child_write(&c, "who\n");
    child_expect(&c, "who: 1 client(s): #1 127.0.0.1:", WAIT_MS);

    /* A third client that closes normally, then more broadcasts. */
    int d = connect_client(port);
    char d_in[256] = "";
    client_expect(d, d_in, sizeof d_in, "welcome, you are client #3\n");
    close(d);
    child_write(&c, "say x\nsay y\n");
    client_expect(a, a_in, sizeof a_in, "x\ny\n");

    child_write(&c, "shutdown\n");
    child_expect(&c, "shutting down\n", WAIT_MS);
    client_expect(a, a_in, sizeof a_in, "server shutting down\n");
    char tail[64];
    REQUIRE(recv(a, tail, sizeof tail, 0) == 0); /* the server closed it */
    close(a);
    expect_exit(&c, "bye\n");
}

/* A client's line longer than the server's 1024-byte buffer is shown in
 * 1024-byte pieces, a console line each; a last line without a newline is
 * shown when the client disconnects, before its "disconnected" line. */
static void case_tcp_lines(void)
{
    struct child c;
    char in[256] = "";
    int a = start_first_client(&c, in, sizeof in, NULL);

    enum { LONG = 1500 };
    char *line = malloc(LONG + 2);
    REQUIRE(line != NULL);
    for (int i = 0; i < LONG; i++)
        line[i] = (char)('a' + (i >= 1024));
    line[LONG] = '\n';
    line[LONG + 1] = '\0';
    REQUIRE(send(a, line, LONG + 1, MSG_NOSIGNAL) == (ssize_t)(LONG + 1));
    char *want = malloc(LONG + 64);
    REQUIRE(want != NULL);
    snprintf(want, LONG + 64, "client #1: %.*s\nclient #1: %.*s\n", 1024, line, LONG - 1024, line + 1024);
    child_expect(&c, want, WAIT_MS);
    free(want);
    free(line);

    static const char last[] = "last words";
    REQUIRE(send(a, last, sizeof last - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof last - 1));
    close(a);
    child_expect(&c, "client #1: last words\nclient #1 disconnected\n", WAIT_MS);

    child_write(&c, "shutdown\n");
    expect_exit(&c, "bye\n");
}

/* SIGPIPE never kills the program: with its stdout gone (the reader closed
 * the pipe), replies fail with EPIPE, yet it keeps serving TCP clients and
 * shuts down cleanly. */
static void case_sigpipe(void)
{
    struct child c;
    char a_in[4096] = "";
    int a = start_first_client(&c, a_in, sizeof a_in, NULL);
    close(c.out_fd); /* nobody reads the child's stdout any more */
    c.out_fd = -1;
    c.eof = true;
    child_write(&c, "ping 1\nwho\nsay still alive\n"); /* each reply hits a broken pipe */
    client_expect(a, a_in, sizeof a_in, "still alive\n");
    child_write(&c, "shutdown\n");
    client_expect(a, a_in, sizeof a_in, "server shutting down\n");
    close(a);
    expect_exit(&c, NULL);
}

/* A terminal session on a pseudo-terminal: commands typed in line mode are
 * answered, Ctrl-D is ignored, Ctrl-C shuts down cleanly. */
static void case_pty(void)
{
    struct child c;
    start(&c, CHILD_PTY, NULL, NULL);
    child_port(&c);
    child_expect(&c, "commands: help, who, say TEXT", WAIT_MS);
    child_write(&c, "help\n");
    child_expect(&c, "commands: help", WAIT_MS);
    child_write(&c, "who\n");
    child_expect(&c, "who: 0 client(s)", WAIT_MS);
    child_write(&c, "\x04"); /* Ctrl-D at the start of a line: a 0-byte read */
    child_expect(&c, "Ctrl-D ignored on a terminal", WAIT_MS);
    child_write(&c, "ping still here\n");
    child_expect(&c, "pong still here", WAIT_MS);
    /* Line editing is the terminal's: backspace (^? with the default erase char) */
    child_write(&c, "ping ab\x7f" "c\n");
    child_expect(&c, "pong ac", WAIT_MS);
    child_write(&c, "\x03"); /* Ctrl-C: the pty sends SIGINT to the foreground group */
    child_expect(&c, "caught Interrupt, shutting down", WAIT_MS);
    expect_exit(&c, "bye");

    /* The shutdown command on a terminal. */
    start(&c, CHILD_PTY, NULL, NULL);
    child_port(&c);
    child_write(&c, "shutdown\n");
    expect_exit(&c, "bye");
}

/* SIGINT and SIGTERM shut down cleanly while stdin is an idle pipe. */
static void case_signals(void)
{
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    const char *names[] = {"caught Interrupt", "caught Terminated", "caught Hangup"};
    for (int i = 0; i < 3; i++) {
        struct child c;
        start(&c, CHILD_PIPE, NULL, NULL);
        child_port(&c);
        child_write(&c, "ping 1\n");
        child_expect(&c, "pong 1\n", WAIT_MS);
        REQUIRE(kill(c.pid, sigs[i]) == 0);
        child_expect(&c, names[i], WAIT_MS);
        expect_exit(&c, "bye\n");
    }
}

/* Bad command-line arguments give a clear message and status 2. */
static void case_bad_args(void)
{
    const char *bad[][3] = {{"--port", "70000", NULL}, {"--port", "abc", NULL}, {"--heartbeat", "-5", NULL},
                            {"--bogus", NULL, NULL},   {"--port", NULL, NULL}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[4] = {(char *)g_prog, (char *)bad[i][0], (char *)bad[i][1], NULL};
        struct child c;
        child_start(&c, argv, CHILD_FILE, "/dev/null");
        int st = child_wait(&c, WAIT_MS);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 2)
            FAIL("'%s %s' should exit with status 2", bad[i][0], bad[i][1] ? bad[i][1] : "");
        REQUIRE(strstr(c.out, "listening") == NULL);
        child_free(&c);
    }
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s CASE PATH-TO-console_worker\n", argv[0]);
        return 2;
    }
    g_prog = argv[2];
    signal(SIGPIPE, SIG_IGN);
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {{"pipe_order", case_pipe_order}, {"pipe_flood", case_pipe_flood}, {"eof", case_eof},
                 {"tcp_say", case_tcp_say},       {"pty", case_pty},               {"signals", case_signals},
                 {"bad_args", case_bad_args},     {"sigpipe", case_sigpipe},       {"tcp_lines", case_tcp_lines}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (strcmp(argv[1], cases[i].name) == 0) {
            cases[i].fn();
            printf("%s: ok\n", argv[1]);
            return 0;
        }
    }
    fprintf(stderr, "unknown case '%s'\n", argv[1]);
    return 2;
}
