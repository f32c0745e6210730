/*
 * console_worker — a miniature driver main loop built on libasync.
 *
 * One async_runtime (the "loop", on the main thread) waits on:
 *   - a listening TCP socket on 127.0.0.1 and its clients,
 *   - a heartbeat timer,
 *   - console input: a worker thread reads stdin (a terminal in line mode, a
 *     pipe or a file) and hands whole lines to the loop through an async_queue
 *     (drop-oldest, 256 lines x 4096 bytes) attached to the runtime, so the
 *     queue's first line wakes the loop with a completion.
 *
 * Console commands: help, who, say TEXT, stats, ping TOKEN, shutdown.
 * EOF on a pipe or file shuts down gracefully; on a terminal Ctrl-D is
 * ignored. Ctrl-C (SIGINT), SIGTERM and SIGHUP shut down gracefully.
 *
 * Lines: a console line longer than 4096 bytes is cut (the first 4096 bytes
 * are run, the rest dropped, counted by `stats`); a last console line
 * without a newline is still run at end of input. A client's line is shown
 * on the console as "client #N: ..."; one longer than 1024 bytes is shown
 * in 1024-byte pieces, a line each; a client's last line without a newline
 * is shown when it disconnects.
 *
 * The reader never polls on a timer: it blocks in poll() on stdin and on its
 * worker's stop descriptor, which becomes readable at async_worker_signal_stop.
 *
 * Usage: console_worker [--port N] [--heartbeat MS] [--verbose]
 *   --port N        TCP port on 127.0.0.1 (0, the default, picks a free one;
 *                   the chosen address is printed as "listening on 127.0.0.1:PORT")
 *   --heartbeat MS  heartbeat timer period (default 1000; 0 disables it)
 *   --verbose       print each heartbeat
 */
#define _GNU_SOURCE 1
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "async.h"

#define LINE_MAX_BYTES 4096   /* one queue message: a line without its newline */
#define QUEUE_CAPACITY 256    /* lines waiting for the loop; beyond that the oldest is dropped */
#define MAX_CLIENTS 64
#define CLIENT_OUT_MAX 65536  /* bytes queued for one slow client before it is disconnected */
#define MAX_EVENTS 64

/* Completion keys and the timer key used on the runtime. */
enum {
    KEY_CONSOLE_LINES = 1, /* the console queue went non-empty (posted by the queue itself) */
    KEY_CONSOLE_END = 2,   /* the reader stopped: data = an end_reason */
    KEY_CONSOLE_TTY_EOF = 3, /* Ctrl-D on a terminal: ignored, the loop prints a hint */
    KEY_HEARTBEAT = 4      /* the heartbeat timer */
};

enum end_reason { END_EOF = 1, END_ERROR = 2 };

/* ---------------------------------------------------------------------- */
/* The console reader (runs on a libasync worker thread)                   */
/* ---------------------------------------------------------------------- */

/* Shared between the loop and the reader. It has static storage, so a reader
 * that were ever detached (see shutdown) could never touch freed memory. */
struct console {
    int fd;                    /* the descriptor read (stdin) */
    bool is_tty;
    async_queue_t *lines;      /* reader -> loop */
    async_runtime_t *rt;       /* for the end-of-input completion */
    atomic_ulong truncated;    /* lines longer than LINE_MAX_BYTES (cut) */
    int read_errno;            /* set before END_ERROR is posted */
};

static struct console g_console;

/* Hands one line (without its newline; a trailing '\r' removed) to the loop.
 * Empty lines carry no command and are skipped (a queue message is never
 * empty). With DROP_OLDEST the enqueue never blocks. */
static bool deliver_line(struct console *c, const char *line, size_t len)
{
    if (len > 0 && line[len - 1] == '\r')
        len--;
    if (len == 0)
        return true;
    return async_queue_enqueue(c->lines, line, len);
}

static void *console_reader(void *arg)
{
    struct console *c = arg;
    int stop_fd = async_worker_stop_fd(async_worker_current());
    static char line[LINE_MAX_BYTES]; /* only one reader exists */
    size_t len = 0;
    bool cutting = false; /* inside an over-long line: drop bytes until '\n' */
    char chunk[4096];
    int reason = 0;

    while (reason == 0) {
        struct pollfd p[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = stop_fd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) { /* blocks: no timeout, no busy loop */
            if (errno == EINTR)
                continue;
            c->read_errno = errno;
            reason = END_ERROR;
            break;
        }
        if (p[1].revents != 0)
            return NULL; /* async_worker_signal_stop: the loop is shutting down */
        if (p[0].revents & POLLNVAL) { /* stdin is closed: same as end of input */
            reason = END_EOF;
            break;
        }
        if (p[0].revents == 0)
            continue;
        ssize_t n = read(c->fd, chunk, sizeof chunk);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            if (c->is_tty && errno == EIO) { /* the terminal hung up */
                reason = END_EOF;
                break;
            }
            c->read_errno = errno;
            reason = END_ERROR;
            break;
        }
        if (n == 0) {
            /* A terminal reports Ctrl-D as a 0-byte read and stays usable:
             * keep running. A hung-up terminal reports POLLHUP: stop. */
            if (c->is_tty && !(p[0].revents & POLLHUP)) {
                async_runtime_post_completion(c->rt, KEY_CONSOLE_TTY_EOF, 0);
                continue;
            }
            reason = END_EOF;
            break;
        }
        for (ssize_t i = 0; i < n; i++) {
            char ch = chunk[i];
            if (ch == '\n') {
                if (!cutting && !deliver_line(c, line, len))
                    return NULL; /* the queue is gone: shutting down */
                len = 0;
                cutting = false;
            } else if (cutting) {
                /* drop the rest of an over-long line */
            } else if (len == sizeof line) {
                atomic_fetch_add(&c->truncated, 1);
                if (!deliver_line(c, line, len)) /* deliver the first 4096 bytes */
                    return NULL;
                cutting = true;
            } else {
                line[len++] = ch;
            }
        }
    }
    if (!cutting && len > 0) /* a last line without a newline still counts */
        deliver_line(c, line, len);
    /* Posted after the last enqueue: the loop drains the queue before acting on it. */
    async_runtime_post_completion(c->rt, KEY_CONSOLE_END, (uintptr_t)reason);
    return NULL;
}

/* ---------------------------------------------------------------------- */
/* TCP clients                                                             */
/* ---------------------------------------------------------------------- */

struct client {
    int fd;
    unsigned id;
    bool dead;         /* closed during this batch of events; freed after it */
    char peer[64];
    char in[1024];     /* a partial line received from the client */
    size_t in_len;
    char *out;         /* bytes not yet accepted by the socket */
    size_t out_len;
    struct client *next;
};

struct server {
    async_runtime_t *rt;
    int listen_fd;
    struct client *clients;  /* live clients, newest first */
    struct client *graveyard; /* closed clients, freed at the end of the batch */
    unsigned next_client_id;
    size_t nclients;
    uint64_t lines_processed;
    uint64_t heartbeats;
    uint64_t heartbeat_timer;
    bool verbose;
    bool quit;
};

/* A descriptor kept in reserve (on /dev/null) so that a connection can still
 * be accepted and refused when the process is out of descriptors. */
static int g_spare_fd = -1;

/* The listening socket's context in io_event_t; clients use their struct. */
static char g_listener_tag;

static void say_console(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say_console(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static void client_close(struct server *s, struct client *cl, const char *why)
{
    if (cl->dead)
        return;
    async_runtime_remove(s->rt, cl->fd); /* before close(), as the header asks */
    close(cl->fd);
    cl->dead = true;
    for (struct client **pp = &s->clients; *pp; pp = &(*pp)->next) {
        if (*pp == cl) {
            *pp = cl->next;
            break;
        }
    }
    cl->next = s->graveyard; /* events later in this batch may still name it */
    s->graveyard = cl;
    s->nclients--;
    if (why)
        say_console("client #%u %s", cl->id, why);
}

static void free_graveyard(struct server *s)
{
    while (s->graveyard) {
        struct client *cl = s->graveyard;
        s->graveyard = cl->next;
        free(cl->out);
        free(cl);
    }
}

/* Writes as much of the client's pending output as the socket takes. Never
 * blocks: MSG_DONTWAIT. MSG_NOSIGNAL: a vanished peer gives EPIPE, not a
 * SIGPIPE that would kill the process. */
static void client_flush(struct server *s, struct client *cl)
{
    size_t off = 0;
    while (off < cl->out_len) {
        ssize_t n = send(cl->fd, cl->out + off, cl->out_len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            client_close(s, cl, "disconnected (write failed)");
            return;
        }
        off += (size_t)n;
    }
    memmove(cl->out, cl->out + off, cl->out_len - off);
    cl->out_len -= off;
    /* Watch for writability only while output is pending (level-triggered). */
    async_runtime_modify(s->rt, cl->fd, ASYNC_EVENT_READ | (cl->out_len ? ASYNC_EVENT_WRITE : 0));
}

static void client_send(struct server *s, struct client *cl, const char *data, size_t len)
{
    if (cl->dead)
        return;
    if (cl->out_len + len > CLIENT_OUT_MAX) {
        client_close(s, cl, "disconnected (too slow to read)");
        return;
    }
    if (cl->out == NULL && (cl->out = malloc(CLIENT_OUT_MAX)) == NULL) {
        client_close(s, cl, "disconnected (out of memory)");
        return;
    }
    memcpy(cl->out + cl->out_len, data, len);
    cl->out_len += len;
    client_flush(s, cl);
}

static void accept_clients(struct server *s)
{
    for (;;) {
        struct sockaddr_in addr;
        socklen_t alen = sizeof addr;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&addr, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if ((errno == EMFILE || errno == ENFILE) && g_spare_fd >= 0) {
                /* Out of descriptors: a connection left pending keeps the
                 * listening socket readable, and the level-triggered loop
                 * would spin on it. Give up the spare descriptor to accept
                 * it, tell it, close it, and take the spare back. */
                close(g_spare_fd);
                fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd >= 0) {
                    static const char full[] = "server full\n";
                    send(fd, full, sizeof full - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
                    close(fd);
                    say_console("refused a client: out of descriptors");
                }
                g_spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
                if (fd >= 0)
                    continue;
            }
            return; /* EAGAIN: no more pending connections (or a transient error) */
        }
        if (s->nclients >= MAX_CLIENTS) {
            static const char full[] = "server full\n";
            send(fd, full, sizeof full - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            close(fd);
            continue;
        }
        struct client *cl = calloc(1, sizeof *cl);
        if (cl == NULL) {
            close(fd);
            continue;
        }
        cl->fd = fd;
        cl->id = ++s->next_client_id;
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
        snprintf(cl->peer, sizeof cl->peer, "%s:%u", ip, (unsigned)ntohs(addr.sin_port));
        if (async_runtime_add(s->rt, fd, ASYNC_EVENT_READ, cl) != 0) {
            say_console("cannot watch a new client: %s", async_strerror(async_last_error()));
            close(fd);
            free(cl);
            continue;
        }
        cl->next = s->clients;
        s->clients = cl;
        s->nclients++;
        say_console("client #%u connected from %s", cl->id, cl->peer);
        char hello[64];
        int n = snprintf(hello, sizeof hello, "welcome, you are client #%u\n", cl->id);
        client_send(s, cl, hello, (size_t)n);
    }
}

/* Shows the client's buffered line (a trailing '\r' removed) and empties
 * the buffer. */
static void client_show_line(struct client *cl)
{
    size_t len = cl->in_len;
    if (len > 0 && cl->in[len - 1] == '\r')
        len--;
    say_console("client #%u: %.*s", cl->id, (int)len, cl->in);
    cl->in_len = 0;
}

/* Lines received from a client are shown on the console, one
 * "client #N: ..." line each. A line longer than the buffer (1024 bytes) is
 * shown in pieces of 1024 bytes, each as a line of its own; a last line
 * without a newline is shown when the client disconnects. */
static void client_readable(struct server *s, struct client *cl)
{
    char buf[4096];
    ssize_t n = recv(cl->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    if (n <= 0) {
        if (cl->in_len > 0)
            client_show_line(cl);
        client_close(s, cl, "disconnected");
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == '\n') {
            client_show_line(cl);
            continue;
        }
        if (cl->in_len == sizeof cl->in)
            client_show_line(cl); /* a full buffer: show this piece, go on */
        cl->in[cl->in_len++] = buf[i];
    }
}

static void on_fd_event(struct server *s, const io_event_t *ev)
{
    if (ev->context == &g_listener_tag) {
        accept_clients(s);
        return;
    }
    struct client *cl = ev->context;
    if (cl->dead)
        return; /* closed earlier in this batch */
    if (ev->event_type & ASYNC_EVENT_WRITE)
        client_flush(s, cl);
    if (!cl->dead && (ev->event_type & (ASYNC_EVENT_READ | ASYNC_EVENT_CLOSE | ASYNC_EVENT_ERROR)))
        client_readable(s, cl); /* reads pending data first; EOF or an error closes */
}

/* ---------------------------------------------------------------------- */
/* Console commands (run on the loop thread)                               */
/* ---------------------------------------------------------------------- */

static const char HELP[] = "commands: help, who, say TEXT, stats, ping TOKEN, shutdown";

static void run_command(struct server *s, char *line, size_t len)
{
    line[len] = '\0';
    while (*line == ' ' || *line == '\t')
        line++;
    len = strlen(line);
    while (len > 0 && (line[len - 1] == ' ' || line[len - 1] == '\t'))
        line[--len] = '\0';
    if (len == 0)
        return;
    s->lines_processed++;

    char *arg = strpbrk(line, " \t");
    if (arg) {
        *arg++ = '\0';
        while (*arg == ' ' || *arg == '\t')
            arg++;
    } else {
        arg = line + len; /* "" */
    }

    if (strcmp(line, "help") == 0) {
        say_console("%s", HELP);
    } else if (strcmp(line, "who") == 0) {
        char buf[MAX_CLIENTS * 40 + 64];
        int off = snprintf(buf, sizeof buf, "who: %zu client(s)", s->nclients);
        const char *sep = ": ";
        for (struct client *cl = s->clients; cl && off < (int)sizeof buf; cl = cl->next) {
            off += snprintf(buf + off, sizeof buf - (size_t)off, "%s#%u %s", sep, cl->id, cl->peer);
            sep = ", ";
        }
        say_console("%s", buf);
    } else if (strcmp(line, "say") == 0) {
        if (*arg == '\0') {
            say_console("usage: say TEXT");
            return;
        }
        size_t n = strlen(arg);
        arg[n] = '\n'; /* within the buffer: line has room for LINE_MAX_BYTES + 1 */
        size_t sent = 0;
        for (struct client *cl = s->clients, *next; cl; cl = next) {
            next = cl->next; /* client_send may close cl */
            client_send(s, cl, arg, n + 1);
            sent += !cl->dead;
        }
        say_console("said to %zu client(s)", sent);
    } else if (strcmp(line, "stats") == 0) {
        async_queue_stats_t st;
        async_queue_get_stats(g_console.lines, &st);
        say_console("stats: lines=%llu dropped=%llu truncated=%lu heartbeats=%llu clients=%zu",
                    (unsigned long long)s->lines_processed, (unsigned long long)st.dropped_count,
                    atomic_load(&g_console.truncated), (unsigned long long)s->heartbeats, s->nclients);
    } else if (strcmp(line, "ping") == 0) {
        say_console("pong %s", arg);
    } else if (strcmp(line, "shutdown") == 0 || strcmp(line, "quit") == 0 || strcmp(line, "exit") == 0) {
        say_console("shutting down");
        s->quit = true;
    } else {
        say_console("unknown command: %s (type help)", line);
    }
}

/* Dequeues every waiting line. The queue posted one completion when it went
 * non-empty; lines that arrive while we drain are taken by this loop or
 * announced by the next completion, so none is missed. */
static void drain_console(struct server *s)
{
    static char line[LINE_MAX_BYTES + 2]; /* + room for '\n' and '\0' */
    size_t len;
    while (!s->quit && async_queue_dequeue(g_console.lines, line, LINE_MAX_BYTES, &len))
        run_command(s, line, len);
}

static void on_completion(struct server *s, const io_event_t *ev)
{
    switch (ev->completion_key) {
    case KEY_CONSOLE_LINES:
        drain_console(s);
        break;
    case KEY_CONSOLE_END:
        drain_console(s); /* every line read before the end is processed first */
        if (!s->quit) {
            if (ev->data == END_ERROR)
                say_console("console: read error (%s), shutting down", strerror(g_console.read_errno));
            else
                say_console("console: end of input, shutting down");
            s->quit = true;
        }
        break;
    case KEY_CONSOLE_TTY_EOF:
        say_console("Ctrl-D ignored on a terminal: type 'shutdown' or press Ctrl-C to quit");
        break;
    }
}

/* ---------------------------------------------------------------------- */
/* Signals                                                                 */
/* ---------------------------------------------------------------------- */

static volatile sig_atomic_t g_signal;
static async_runtime_t *volatile g_signal_rt;

/* async_runtime_wakeup is async-signal-safe: the handler may run on any
 * thread, and the wakeup makes the loop's async_runtime_wait return so it
 * sees g_signal. */
static void on_signal(int sig)
{
    g_signal = sig;
    if (g_signal_rt)
        async_runtime_wakeup(g_signal_rt);
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* A client that disconnects must not kill us (send also uses MSG_NOSIGNAL),
     * nor a reader of our stdout that went away. */
    signal(SIGPIPE, SIG_IGN);
}

/* ---------------------------------------------------------------------- */
/* main                                                                    */
/* ---------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: console_worker [--port N] [--heartbeat MS] [--verbose]\n"
               "  --port N        TCP port on 127.0.0.1 (default 0: pick a free port)\n"
               "  --heartbeat MS  heartbeat period in ms (default 1000, 0 = off)\n"
               "  --verbose       print every heartbeat\n"
               "Console lines over 4096 bytes are cut (the rest is dropped); a last line\n"
               "without a newline still runs at end of input. A client's lines are shown\n"
               "as \"client #N: ...\", in 1024-byte pieces when longer; a client's last line\n"
               "without a newline is shown when it disconnects.\n");
}

static bool parse_uint(const char *s, unsigned long max, unsigned long *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || *s == '-' || v > max)
        return false;
    *out = v;
    return true;
}

static int open_listener(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

int main(int argc, char **argv)
{
    unsigned long port = 0, heartbeat_ms = 1000;
    struct server s = {.listen_fd = -1};

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--port") == 0 && i + 1 < argc) {
            if (!parse_uint(argv[++i], 65535, &port)) {
                fprintf(stderr, "console_worker: bad port '%s' (0..65535)\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--heartbeat") == 0 && i + 1 < argc) {
            if (!parse_uint(argv[++i], 86400000, &heartbeat_ms)) {
                fprintf(stderr, "console_worker: bad heartbeat '%s' (0..86400000 ms)\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--verbose") == 0) {
            s.verbose = true;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "console_worker: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }

    g_spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    s.rt = async_runtime_init();
    if (s.rt == NULL) {
        fprintf(stderr, "console_worker: async_runtime_init: %s\n", async_strerror(async_last_error()));
        return 1;
    }
    g_signal_rt = s.rt;
    install_signals();

    s.listen_fd = open_listener((unsigned)port);
    if (s.listen_fd < 0) {
        fprintf(stderr, "console_worker: cannot listen on 127.0.0.1:%lu: %s\n", port, strerror(errno));
        async_runtime_deinit(s.rt);
        return 1;
    }
    struct sockaddr_in bound;
    socklen_t blen = sizeof bound;
    getsockname(s.listen_fd, (struct sockaddr *)&bound, &blen);
    if (async_runtime_add(s.rt, s.listen_fd, ASYNC_EVENT_READ, &g_listener_tag) != 0) {
        fprintf(stderr, "console_worker: async_runtime_add: %s\n", async_strerror(async_last_error()));
        close(s.listen_fd);
        async_runtime_deinit(s.rt);
        return 1;
    }
    if (heartbeat_ms > 0)
        s.heartbeat_timer = async_runtime_add_timer(s.rt, heartbeat_ms, heartbeat_ms, KEY_HEARTBEAT);

    /* Console: queue first, attached so its first line wakes the loop; then the reader. */
    g_console.fd = STDIN_FILENO;
    g_console.is_tty = isatty(STDIN_FILENO);
    g_console.rt = s.rt;
    g_console.lines = async_queue_create(QUEUE_CAPACITY, LINE_MAX_BYTES,
                                         ASYNC_QUEUE_DROP_OLDEST | ASYNC_QUEUE_SIGNAL_ON_DATA);
    async_worker_t *reader = NULL;
    if (g_console.lines == NULL || async_queue_attach(g_console.lines, s.rt, KEY_CONSOLE_LINES) != 0 ||
        (reader = async_worker_create(console_reader, &g_console, 0)) == NULL) {
        fprintf(stderr, "console_worker: console setup: %s\n", async_strerror(async_last_error()));
        return 1;
    }

    setvbuf(stdout, NULL, _IOLBF, 0);
    say_console("listening on 127.0.0.1:%u", (unsigned)ntohs(bound.sin_port));
    say_console("console_worker (libasync %s): type a command and press Enter; Ctrl-C quits", async_version_string());
    say_console("%s", HELP);

    /* The main loop. */
    io_event_t evs[MAX_EVENTS];
    while (!s.quit) {
        int n = async_runtime_wait(s.rt, evs, MAX_EVENTS, -1);
        if (n < 0) {
            fprintf(stderr, "console_worker: async_runtime_wait: %s\n", async_strerror(async_last_error()));
            break;
        }
        for (int i = 0; i < n && !s.quit; i++) {
            const io_event_t *ev = &evs[i];
            if (ev->event_type & ASYNC_EVENT_COMPLETION) {
                on_completion(&s, ev);
            } else if (ev->event_type & ASYNC_EVENT_TIMER) {
                if (ev->completion_key == KEY_HEARTBEAT) {
                    s.heartbeats++;
                    if (s.verbose)
                        say_console("heartbeat %llu", (unsigned long long)s.heartbeats);
                }
            } else {
                on_fd_event(&s, ev);
            }
        }
        free_graveyard(&s);
        if (g_signal && !s.quit) {
            say_console("caught %s, shutting down", strsignal(g_signal));
            s.quit = true;
        }
    }

    /* Graceful shutdown. 1: stop the reader. It sleeps in poll() on stdin and
     * its stop descriptor, so it returns at once; the join timeout only guards
     * against a bug. If it ever expired, destroy would detach the thread, which
     * touches nothing but g_console (static) and handles that then fail with
     * ASYNC_E_BADHANDLE. */
    async_worker_signal_stop(reader);
    if (!async_worker_join(reader, 2000))
        fprintf(stderr, "console_worker: console reader did not stop in 2 s; detaching it\n");
    async_worker_destroy(reader);
    async_queue_attach(g_console.lines, NULL, 0);
    async_queue_destroy(g_console.lines);

    /* 2: say goodbye to the clients (best effort: never blocks) and close them. */
    while (s.clients) {
        static const char bye[] = "server shutting down\n";
        struct client *cl = s.clients;
        client_send(&s, cl, bye, sizeof bye - 1);
        client_close(&s, cl, NULL);
    }
    free_graveyard(&s);

    /* 3: the loop's own resources. */
    if (s.heartbeat_timer)
        async_runtime_cancel_timer(s.rt, s.heartbeat_timer);
    async_runtime_remove(s.rt, s.listen_fd);
    close(s.listen_fd);
    g_signal_rt = NULL;
    async_runtime_deinit(s.rt);
    say_console("bye");
    return 0;
}
