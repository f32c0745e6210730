/* A program written against the classic lib/async API (the
 * Neolith driver's: async/async_queue.h, async/async_worker.h,
 * async/async_runtime.h), on libasync's classic headers (docs/CLASSIC_API.md).
 *
 * The cases are written the way the driver uses the API: one main loop over
 * sockets with a 512-event array and struct timeval timeouts ({0,0} and
 * {10,0}), dispatch by context then by completion key, the console on stdin
 * (a pipe, a regular file), resolver-like workers that post completions, and
 * the 4-argument modify. Registered for the epoll and the poll backends. */
#include <fcntl.h>
#include <stdatomic.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>

/* The classic headers, and check.h's helpers without its include of async.h
 * (the modern header cannot share a translation unit with the classic one). */
#define ASYNC_TEST_CLASSIC
#include "rt.h"

#define MAX_EVENTS 512
#define RESOLVER_KEY ((uintptr_t)0x5e501)
#define CONSOLE_MARKER ((void *)0xc0450e)

static io_event_t g_events[MAX_EVENTS];

static int wait10(async_runtime_t *rt) /* the driver's blocking wait */
{
    struct timeval tv = {10, 0};
    return async_runtime_wait(rt, g_events, MAX_EVENTS, &tv);
}

static int wait0(async_runtime_t *rt) /* the driver's poll */
{
    struct timeval tv = {0, 0};
    return async_runtime_wait(rt, g_events, MAX_EVENTS, &tv);
}

static void nonblock(int fd)
{
    CHECK(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
}

/* ---- layout ------------------------------------------------------------------- */

CASE(layout) // poll
{
    io_event_t e;
    CHECK_EQ(sizeof(void *) == 8 ? sizeof(io_event_t) : 48, 48);
    CHECK_EQ(offsetof(io_event_t, fd), 0);
    CHECK_EQ(offsetof(io_event_t, completion_key), sizeof(void *));
    CHECK_EQ(offsetof(io_event_t, event_type), 2 * sizeof(void *));
    CHECK_EQ(offsetof(io_event_t, context), 3 * sizeof(void *));
    CHECK_EQ(offsetof(io_event_t, bytes_transferred), 4 * sizeof(void *));
    CHECK_EQ(offsetof(io_event_t, buffer), 5 * sizeof(void *));
    CHECK_EQ(sizeof e.fd, sizeof(int));
    CHECK_EQ(EVENT_READ, 1);
    CHECK_EQ(EVENT_WRITE, 2);
    CHECK_EQ(EVENT_ERROR, 4);
    CHECK_EQ(EVENT_CLOSE, 8);
    CHECK_EQ(CONSOLE_TYPE_NONE, 0);
    CHECK_EQ(CONSOLE_TYPE_REAL, 1);
    CHECK_EQ(CONSOLE_TYPE_PIPE, 2);
    CHECK_EQ(CONSOLE_TYPE_FILE, 3);
    CHECK_EQ(ASYNC_QUEUE_SIGNAL_ON_DATA, 4);
    CHECK_EQ(ASYNC_WORKER_STOPPING, 2);
}

/* ---- a server main loop ------------------------------------------------------- */

#define NCLIENTS 40
#define NMSG 20

typedef struct {
    int fd;
} port_def_t;

typedef struct {
    int fd;
    char out[4096];
    size_t outlen;
    int msgs;
    int closed;
    int want_write;
} conn_t;

/* Each client sends NMSG lines and reads back the echo, then closes. */
static void *client_proc(void *arg)
{
    int port = (int)(intptr_t)arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    char buf[64], back[64];
    int i;
    CHECK(fd >= 0);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    for (i = 0; i < NMSG; i++) {
        size_t got = 0;
        int len = snprintf(buf, sizeof buf, "msg %03d\n", i);
        CHECK_EQ(write(fd, buf, (size_t)len), len);
        while (got < (size_t)len) {
            ssize_t r = read(fd, back + got, (size_t)len - got);
            CHECK(r > 0);
            got += (size_t)r;
        }
        CHECK(memcmp(buf, back, (size_t)len) == 0);
    }
    close(fd);
    return NULL;
}

static void *client_worker(void *ctx)
{
    return client_proc(ctx);
}

CASE(server) // poll
{
    async_runtime_t *rt = async_runtime_init();
    port_def_t listener;
    conn_t *conns = calloc(NCLIENTS, sizeof *conns);
    async_worker_t *clients[NCLIENTS];
    struct sockaddr_in sa;
    socklen_t slen = sizeof sa;
    int i, accepted = 0, finished = 0, loops = 0;
    CHECK(rt && conns);

    listener.fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(listener.fd >= 0);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(listener.fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK(listen(listener.fd, NCLIENTS) == 0);
    CHECK(getsockname(listener.fd, (struct sockaddr *)&sa, &slen) == 0);
    nonblock(listener.fd);
    CHECK_EQ(async_runtime_add(rt, listener.fd, EVENT_READ, &listener), 0);

    for (i = 0; i < NCLIENTS; i++) {
        clients[i] = async_worker_create(client_worker, (void *)(intptr_t)ntohs(sa.sin_port), 0);
        CHECK(clients[i]);
    }

    while (finished < NCLIENTS) {
        int n = (loops++ & 1) ? wait0(rt) : wait10(rt);
        CHECK(n >= 0);
        CHECK(loops < 1000000);
        for (i = 0; i < n; i++) {
            io_event_t *ev = &g_events[i];
            if (ev->context == &listener) {
                CHECK_EQ(ev->fd, listener.fd);
                CHECK(ev->event_type & EVENT_READ);
                for (;;) {
                    int c = accept(listener.fd, NULL, NULL);
                    if (c < 0) {
                        CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
                        break;
                    }
                    CHECK(accepted < NCLIENTS);
                    nonblock(c);
                    conns[accepted].fd = c;
                    CHECK_EQ(async_runtime_add(rt, c, EVENT_READ, &conns[accepted]), 0);
                    accepted++;
                }
            } else if (ev->context) {
                conn_t *cn = ev->context;
                CHECK(cn >= conns && cn < conns + NCLIENTS);
                CHECK_EQ(ev->fd, cn->fd); /* the real fd in every I/O event */
                CHECK_EQ(ev->completion_key, 0);
                CHECK(!cn->closed);
                if (ev->event_type & (EVENT_READ | EVENT_CLOSE | EVENT_ERROR)) {
                    char buf[512];
                    ssize_t r = read(cn->fd, buf, sizeof buf);
                    if (r > 0) {
                        CHECK(cn->outlen + (size_t)r <= sizeof cn->out);
                        memcpy(cn->out + cn->outlen, buf, (size_t)r);
                        cn->outlen += (size_t)r;
                    } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                        CHECK_EQ(async_runtime_remove(rt, cn->fd), 0);
                        close(cn->fd);
                        cn->closed = 1;
                        finished++;
                        continue;
                    }
                }
                if (cn->outlen && (ev->event_type & EVENT_WRITE)) {
                    ssize_t w = write(cn->fd, cn->out, cn->outlen);
                    CHECK(w > 0);
                    memmove(cn->out, cn->out + w, cn->outlen - (size_t)w);
                    cn->outlen -= (size_t)w;
                }
                /* flow control, as the driver does it: the same context back */
                if (cn->outlen && !cn->want_write) {
                    CHECK_EQ(async_runtime_modify(rt, cn->fd, EVENT_READ | EVENT_WRITE, cn), 0);
                    cn->want_write = 1;
                } else if (!cn->outlen && cn->want_write) {
                    CHECK_EQ(async_runtime_modify(rt, cn->fd, EVENT_READ, cn), 0);
                    cn->want_write = 0;
                }
            } else {
                CHECK(!"an event without context or key");
            }
        }
    }
    CHECK_EQ(accepted, NCLIENTS);
    for (i = 0; i < NCLIENTS; i++) {
        CHECK(async_worker_join(clients[i], 10000));
        async_worker_destroy(clients[i]);
    }
    CHECK_EQ(async_runtime_remove(rt, listener.fd), 0);
    close(listener.fd);
    async_runtime_deinit(rt);
    free(conns);
}

/* ---- resolver-like workers ------------------------------------------------------ */

#define NREQ 3000
#define NRESOLVERS 4

typedef struct {
    uint32_t id;
    char name[28];
} dns_req_t;

typedef struct {
    async_runtime_t *rt;
    async_queue_t *requests;
} resolver_ctx_t;

static void *resolver_proc(void *arg)
{
    resolver_ctx_t *rc = arg;
    async_worker_t *self = async_worker_current();
    CHECK(self);
    while (!async_worker_should_stop(self)) {
        dns_req_t req;
        size_t len = 0;
        if (!async_queue_dequeue(rc->requests, &req, sizeof req, &len)) {
            sleep_ms(1);
            continue;
        }
        CHECK_EQ(len, sizeof req);
        /* the answer travels in the completion: key + data */
        while (async_runtime_post_completion(rc->rt, RESOLVER_KEY, (uintptr_t)req.id + 1) != 0)
            sleep_ms(1);
    }
    return NULL;
}

CASE(resolver) // poll
{
    async_runtime_t *rt = async_runtime_init();
    resolver_ctx_t rc;
    async_worker_t *w[NRESOLVERS];
    unsigned char *seen = calloc(NREQ, 1);
    int i, got = 0, sent = 0;
    CHECK(rt && seen);
    rc.rt = rt;
    rc.requests = async_queue_create(256, sizeof(dns_req_t), ASYNC_QUEUE_BLOCK_WRITER);
    CHECK(rc.requests);
    for (i = 0; i < NRESOLVERS; i++)
        CHECK((w[i] = async_worker_create(resolver_proc, &rc, 0)) != NULL);
    while (got < NREQ) {
        int n;
        while (sent < NREQ && !async_queue_is_full(rc.requests)) {
            dns_req_t req;
            memset(&req, 0, sizeof req);
            req.id = (uint32_t)sent++;
            snprintf(req.name, sizeof req.name, "host%u.example", req.id);
            CHECK(async_queue_enqueue(rc.requests, &req, sizeof req));
        }
        n = wait10(rt);
        CHECK(n > 0); /* something is always outstanding: a 10 s silence is a lost completion */
        CHECK(n <= MAX_EVENTS);
        for (i = 0; i < n; i++) {
            io_event_t *ev = &g_events[i];
            size_t id;
            CHECK(ev->context == NULL); /* dispatch by context first, then by key */
            CHECK_EQ(ev->completion_key, RESOLVER_KEY);
            CHECK_EQ(ev->event_type, EVENT_READ);
            CHECK_EQ(ev->fd, -1);
            CHECK(ev->buffer == NULL);
            id = ev->bytes_transferred;
            CHECK(id >= 1 && id <= NREQ);
            CHECK(!seen[id - 1]);
            seen[id - 1] = 1;
            got++;
        }
    }
    CHECK_EQ(wait0(rt), 0);
    for (i = 0; i < NRESOLVERS; i++) {
        async_worker_signal_stop(w[i]);
        CHECK(async_worker_join(w[i], 10000));
        CHECK_EQ(async_worker_get_state(w[i]), ASYNC_WORKER_STOPPED);
        async_worker_destroy(w[i]);
    }
    async_queue_destroy(rc.requests);
    async_runtime_deinit(rt);
    free(seen);
}

/* ---- 512 events at once ----------------------------------------------------------- */

#define NPAIRS 300

CASE(many_events) // poll
{
    async_runtime_t *rt = async_runtime_init();
    int sp[NPAIRS][2];
    int i, n, nfd = 0, ncomp = 0;
    struct rlimit rl;
    CHECK(rt);
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_cur < 4 * NPAIRS && rl.rlim_max >= 4 * NPAIRS) {
        rl.rlim_cur = 4 * NPAIRS;
        CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    }
    for (i = 0; i < NPAIRS; i++) {
        CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp[i]) == 0);
        CHECK_EQ(async_runtime_add(rt, sp[i][0], EVENT_READ, &sp[i]), 0);
        CHECK_EQ(write(sp[i][1], "x", 1), 1);
        CHECK_EQ(async_runtime_post_completion(rt, 7, (uintptr_t)i), 0);
    }
    /* 600 things are ready: every wait reports at most 512, no descriptor
     * twice in one result; all are reported, no completion is lost */
    {
        unsigned char fdseen[NPAIRS] = {0};
        int rounds = 0;
        while (nfd < NPAIRS || ncomp < NPAIRS) {
            unsigned char once[NPAIRS] = {0};
            CHECK(rounds++ < 10000);
            n = wait10(rt);
            CHECK(n > 0 && n <= MAX_EVENTS);
            for (i = 0; i < n; i++) {
                io_event_t *ev = &g_events[i];
                if (ev->context) {
                    int k = (int)((int(*)[2])ev->context - sp);
                    CHECK(k >= 0 && k < NPAIRS);
                    CHECK_EQ(ev->fd, sp[k][0]);
                    CHECK_EQ(ev->event_type, EVENT_READ);
                    CHECK(!once[k]);
                    once[k] = 1;
                    if (!fdseen[k]) {
                        fdseen[k] = 1;
                        nfd++;
                    }
                } else {
                    CHECK_EQ(ev->completion_key, 7);
                    CHECK_EQ(ev->fd, -1);
                    CHECK_EQ(ev->bytes_transferred, ncomp); /* FIFO from one thread */
                    ncomp++;
                }
            }
        }
    }
    CHECK_EQ(ncomp, NPAIRS);
    for (i = 0; i < NPAIRS; i++) {
        CHECK_EQ(async_runtime_remove(rt, sp[i][0]), 0);
        close_pair(sp[i]);
    }
    async_runtime_deinit(rt);
}

/* ---- timeval timeouts ---------------------------------------------------------------- */

static async_runtime_t *g_wake_rt;
static atomic_int g_waiting;

static void *waker(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_waiting))
        sleep_ms(1);
    sleep_ms(20);
    CHECK_EQ(async_runtime_wakeup(g_wake_rt), 0);
    return NULL;
}

CASE(timeval) // poll
{
    async_runtime_t *rt = async_runtime_init();
    struct timeval tv;
    pthread_t th;
    double t0;
    CHECK(rt);
    /* {0,0}: a poll */
    CHECK_EQ(wait0(rt), 0);
    /* 1.5 ms: never less (a partial millisecond rounds up) */
    tv.tv_sec = 0;
    tv.tv_usec = 1500;
    t0 = now_ms();
    CHECK_EQ(async_runtime_wait(rt, g_events, MAX_EVENTS, &tv), 0);
    CHECK(now_ms() - t0 >= 1.5);
    /* 30 ms */
    tv.tv_sec = 0;
    tv.tv_usec = 30000;
    t0 = now_ms();
    CHECK_EQ(async_runtime_wait(rt, g_events, MAX_EVENTS, &tv), 0);
    CHECK(now_ms() - t0 >= 30);
    /* a negative timeval does not wait */
    tv.tv_sec = -1;
    tv.tv_usec = 0;
    CHECK_EQ(async_runtime_wait(rt, g_events, MAX_EVENTS, &tv), 0);
    /* NULL blocks until woken */
    g_wake_rt = rt;
    atomic_store(&g_waiting, 1);
    start_thread(&th, waker, NULL);
    CHECK_EQ(async_runtime_wait(rt, g_events, MAX_EVENTS, NULL), 0);
    join_within(th, 10000, "waker");
    /* a completion ends a NULL wait too */
    CHECK_EQ(async_runtime_post_completion(rt, 9, 1), 0);
    CHECK_EQ(async_runtime_wait(rt, g_events, MAX_EVENTS, NULL), 1);
    CHECK_EQ(g_events[0].completion_key, 9);
    async_runtime_deinit(rt);
}

/* ---- the 4-argument modify ---------------------------------------------------------- */

CASE(modify_context) // poll
{
    async_runtime_t *rt = async_runtime_init();
    int sp[2], a, b;
    CHECK(rt);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    CHECK_EQ(async_runtime_add(rt, sp[0], EVENT_READ, &a), 0);
    CHECK_EQ(write(sp[1], "x", 1), 1);
    CHECK_EQ(wait10(rt), 1);
    CHECK(g_events[0].context == &a);
    /* a changed context updates the registration */
    CHECK_EQ(async_runtime_modify(rt, sp[0], EVENT_READ, &b), 0);
    CHECK_EQ(wait10(rt), 1);
    CHECK(g_events[0].context == &b);
    CHECK_EQ(g_events[0].fd, sp[0]);
    CHECK_EQ(g_events[0].event_type, EVENT_READ);
    CHECK_EQ(async_runtime_modify(rt, sp[0], EVENT_READ | EVENT_WRITE, &b), 0);
    CHECK_EQ(wait10(rt), 1);
    CHECK_EQ(g_events[0].event_type, EVENT_READ | EVENT_WRITE);
    CHECK_EQ(async_runtime_modify(rt, sp[0], EVENT_WRITE, &a), 0);
    CHECK_EQ(wait10(rt), 1);
    CHECK_EQ(g_events[0].event_type, EVENT_WRITE);
    CHECK(g_events[0].context == &a);
    /* errors */
    CHECK_FAIL(async_runtime_modify(rt, sp[1], EVENT_READ, &a) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_modify(rt, sp[0], 0x40, &a) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(rt, sp[0], EVENT_READ, &a) == -1, ASYNC_E_EXISTS);
    CHECK_EQ(async_runtime_remove(rt, sp[0]), 0);
    CHECK_FAIL(async_runtime_remove(rt, sp[0]) == -1, ASYNC_E_NOTFOUND);
    close_pair(sp);
    async_runtime_deinit(rt);
}

/* ---- hang-up: the data before it is read, then 0 --------------------------------------- */

CASE(hangup) // poll
{
    async_runtime_t *rt = async_runtime_init();
    int sp[2], n, i, seen_end = 0;
    char buf[16];
    ssize_t r;
    CHECK(rt);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    nonblock(sp[0]);
    CHECK_EQ(async_runtime_add(rt, sp[0], EVENT_READ, sp), 0);
    CHECK_EQ(write(sp[1], "bye", 3), 3);
    close(sp[1]);
    for (i = 0; i < 10 && !seen_end; i++) {
        n = wait10(rt);
        CHECK_EQ(n, 1);
        CHECK_EQ(g_events[0].fd, sp[0]);
        CHECK(g_events[0].context == sp);
        CHECK(g_events[0].event_type & EVENT_READ); /* the driver reads on READ */
        r = read(sp[0], buf, sizeof buf);
        if (r == 3)
            CHECK(memcmp(buf, "bye", 3) == 0);
        else {
            CHECK_EQ(r, 0);
            seen_end = 1;
        }
    }
    CHECK(seen_end);
    CHECK_EQ(async_runtime_remove(rt, sp[0]), 0);
    close(sp[0]);
    async_runtime_deinit(rt);
}

/* ---- the console ------------------------------------------------------------------------- */

CASE(console_pipe) // poll
{
    async_runtime_t *rt = async_runtime_init();
    int p[2], n, eof = 0;
    char buf[64];
    ssize_t r;
    CHECK(rt);
    CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_NONE);
    CHECK(async_runtime_get_console_ctx(rt) == NULL);
    CHECK(pipe(p) == 0);
    CHECK(dup2(p[0], STDIN_FILENO) == STDIN_FILENO);
    close(p[0]);
    CHECK_EQ(async_runtime_add_console(rt, CONSOLE_MARKER), 0);
    CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_PIPE);
    CHECK(async_runtime_get_console_ctx(rt) == CONSOLE_MARKER);
    CHECK_EQ(wait0(rt), 0);
    CHECK_EQ(write(p[1], "look\n", 5), 5);
    n = wait10(rt);
    CHECK_EQ(n, 1);
    CHECK_EQ(g_events[0].fd, STDIN_FILENO);
    CHECK(g_events[0].context == CONSOLE_MARKER);
    CHECK(g_events[0].event_type & EVENT_READ);
    CHECK_EQ(read(STDIN_FILENO, buf, sizeof buf), 5);
    CHECK(memcmp(buf, "look\n", 5) == 0);
    CHECK_EQ(wait0(rt), 0);
    /* the driver's own registration of stdin takes the console over */
    CHECK_EQ(async_runtime_add(rt, STDIN_FILENO, EVENT_READ, &n), 0);
    CHECK_EQ(write(p[1], "x", 1), 1);
    CHECK_EQ(wait10(rt), 1);
    CHECK(g_events[0].context == &n);
    CHECK(async_runtime_get_console_ctx(rt) == &n);
    CHECK_EQ(read(STDIN_FILENO, buf, sizeof buf), 1);
    /* the writer goes: readable, read gives 0, the driver removes it */
    close(p[1]);
    while (!eof) {
        n = wait10(rt);
        CHECK_EQ(n, 1);
        CHECK_EQ(g_events[0].fd, STDIN_FILENO);
        r = read(STDIN_FILENO, buf, sizeof buf);
        CHECK(r >= 0);
        eof = r == 0;
    }
    CHECK_EQ(async_runtime_remove(rt, STDIN_FILENO), 0);
    CHECK_EQ(wait0(rt), 0);
    async_runtime_deinit(rt);
}

CASE(console_file) // poll
{
    async_runtime_t *rt = async_runtime_init();
    char path[] = "/tmp/libasync_classic_XXXXXX";
    int fd = mkstemp(path), n, i;
    char buf[8];
    size_t total = 0;
    CHECK(rt && fd >= 0);
    unlink(path);
    CHECK_EQ(write(fd, "say hi\nquit\n", 12), 12);
    CHECK(lseek(fd, 0, SEEK_SET) == 0);
    CHECK(dup2(fd, STDIN_FILENO) == STDIN_FILENO);
    close(fd);
    CHECK_EQ(async_runtime_add_console(rt, CONSOLE_MARKER), 0); /* epoll refuses files: still 0 */
    CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_FILE);
    /* readable while unread data remains, even with a blocking wait */
    for (i = 0; total < 12; i++) {
        CHECK(i < 100);
        n = wait10(rt);
        CHECK_EQ(n, 1);
        CHECK_EQ(g_events[0].fd, STDIN_FILENO);
        CHECK(g_events[0].context == CONSOLE_MARKER);
        CHECK_EQ(g_events[0].event_type, EVENT_READ);
        total += (size_t)read(STDIN_FILENO, buf, 5);
    }
    CHECK_EQ(total, 12);
    /* once more at the end, so that the reader sees it, then quiet */
    CHECK_EQ(wait10(rt), 1);
    CHECK_EQ(read(STDIN_FILENO, buf, sizeof buf), 0);
    CHECK_EQ(wait0(rt), 0);
    {
        struct timeval tv = {0, 20000};
        CHECK_EQ(async_runtime_wait(rt, g_events, MAX_EVENTS, &tv), 0);
    }
    /* completions still come while the file is registered */
    CHECK_EQ(async_runtime_post_completion(rt, RESOLVER_KEY, 5), 0);
    CHECK_EQ(wait10(rt), 1);
    CHECK_EQ(g_events[0].completion_key, RESOLVER_KEY);
    CHECK_EQ(async_runtime_remove(rt, STDIN_FILENO), 0);
    CHECK_FAIL(async_runtime_remove(rt, STDIN_FILENO) == -1, ASYNC_E_NOTFOUND);
    async_runtime_deinit(rt);
}

/* A regular file added by the driver itself (as it adds STDIN_FILENO), with
 * max_events 1: the file and the poller take turns. */
CASE(regular_file) // poll
{
    async_runtime_t *rt = async_runtime_init();
    char path[] = "/tmp/libasync_classic_XXXXXX";
    int fd = mkstemp(path), i, files = 0, comps = 0;
    struct timeval tv = {10, 0};
    CHECK(rt && fd >= 0);
    unlink(path);
    CHECK_EQ(write(fd, "abc", 3), 3);
    CHECK(lseek(fd, 0, SEEK_SET) == 0);
    CHECK_EQ(async_runtime_add(rt, fd, EVENT_READ | EVENT_WRITE, &fd), 0);
    CHECK_FAIL(async_runtime_add(rt, fd, EVENT_READ, &fd) == -1, ASYNC_E_EXISTS);
    for (i = 0; i < 10; i++)
        CHECK_EQ(async_runtime_post_completion(rt, 3, (uintptr_t)i), 0);
    for (i = 0; i < 20; i++) {
        CHECK_EQ(async_runtime_wait(rt, g_events, 1, &tv), 1);
        if (g_events[0].context == &fd) {
            CHECK_EQ(g_events[0].event_type, EVENT_READ | EVENT_WRITE);
            files++;
        } else {
            CHECK_EQ(g_events[0].completion_key, 3);
            CHECK_EQ(g_events[0].bytes_transferred, comps);
            comps++;
        }
    }
    CHECK_EQ(comps, 10);
    CHECK_EQ(files, 10);
    CHECK_EQ(async_runtime_modify(rt, fd, EVENT_WRITE, &i), 0);
    CHECK_EQ(wait10(rt), 1);
    CHECK(g_events[0].context == &i);
    CHECK_EQ(g_events[0].event_type, EVENT_WRITE);
    CHECK_EQ(async_runtime_remove(rt, fd), 0);
    CHECK_EQ(wait0(rt), 0);
    close(fd);
    async_runtime_deinit(rt);
}

/* A regular file closed without remove (a caller's bug): reported once as
 * ERROR|CLOSE, then quiet; its number, reused by a socket, can be added. */
CASE(regular_file_closed) // poll
{
    async_runtime_t *rt = async_runtime_init();
    char path[] = "/tmp/libasync_classic_XXXXXX";
    int fd = mkstemp(path), sp[2], ctx2;
    CHECK(rt && fd >= 0);
    unlink(path);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0); /* numbers other than fd's */
    CHECK_EQ(async_runtime_add(rt, fd, EVENT_READ, &fd), 0);
    CHECK_EQ(wait0(rt), 1); /* empty: its end, once */
    CHECK_EQ(wait0(rt), 0);
    close(fd);
    CHECK_EQ(wait0(rt), 1);
    CHECK_EQ(g_events[0].fd, fd);
    CHECK(g_events[0].context == &fd);
    CHECK_EQ(g_events[0].event_type, EVENT_ERROR | EVENT_CLOSE);
    CHECK_EQ(wait0(rt), 0);
    /* the number comes back as a socket */
    CHECK(dup2(sp[0], fd) == fd);
    close(sp[0]);
    CHECK_EQ(wait0(rt), 0);
    CHECK_EQ(async_runtime_add(rt, fd, EVENT_READ, &ctx2), 0);
    CHECK_EQ(wait0(rt), 0);
    CHECK_EQ(write(sp[1], "x", 1), 1);
    CHECK_EQ(wait10(rt), 1);
    CHECK(g_events[0].context == &ctx2);
    CHECK_EQ(g_events[0].event_type, EVENT_READ);
    CHECK_EQ(async_runtime_remove(rt, fd), 0);
    close(fd);
    close(sp[1]);
    async_runtime_deinit(rt);
}

/* ---- the event-loop handle, bad arguments and handles, no console after deinit ---- */

CASE(loop_handle_bad_args) // poll
{
    async_runtime_t *rt = async_runtime_init();
    struct timeval tv = {0, 0};
    CHECK(rt);
    CHECK(async_runtime_get_event_loop_handle(rt) >= 0);
    CHECK_FAIL(async_runtime_wait(rt, NULL, 4, &tv) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, g_events, 0, &tv) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(rt, -1, EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, 0, 0x100, NULL) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add_console(NULL, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_get_event_loop_handle(NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_EQ(async_runtime_get_console_type(NULL), CONSOLE_TYPE_NONE);
    CHECK(async_runtime_get_console_ctx(NULL) == NULL);
    CHECK_EQ(async_runtime_add_console(rt, CONSOLE_MARKER), 0);
    async_runtime_deinit(rt);
    /* deinit forgot the console */
    CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_NONE);
    CHECK_FAIL(async_runtime_wait(rt, g_events, 4, &tv) == -1, ASYNC_E_BADHANDLE);
    async_runtime_deinit(NULL);
}

TEST_MAIN()
