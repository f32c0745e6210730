/*
 * server.c — accept loop and connection fibers of the http_server example.
 *
 * A connection fiber reads into a fixed buffer, answers every complete
 * request the buffer holds (pipelining) into one output buffer, and writes
 * that with one write: one read and one write per batch of requests, and
 * no allocation per request (the connection's buffers are allocated once,
 * when it is accepted). A batch of one request, the common case, is
 * answered straight from the thread's answer cache (http_ok_response),
 * without a copy: the connection's output buffer is touched only when the
 * socket has no room, so ten thousand idle connections do not each keep
 * output lines in the cache.
 */
#define _GNU_SOURCE 1
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifdef HTTP_SERVER_TLS
#include "fiber_tls.h"
#endif

enum {
    OUT_CAP = 16384,   /* answers batched before one write */
    MIN_IN_CAP = 16384, /* input buffer, at least max_head */
    LINGER_MS = 2000,  /* after an error answer: how long unread input is drained before the close */
    LINGER_BYTES = 1 << 20,
    TLS_CLOSE_MS = 1000 /* how long the close_notify of a TLS connection may wait for room */
};

struct conn {
    struct conn *prev, *next; /* server_t.list */
    server_t *sv;
    async_fd_t fd;
    struct fiber_tls *tls; /* HTTPS: the TLS endpoint over fd; NULL: plain HTTP */
    atomic_int idle;  /* 1 while it waits for a new request with nothing buffered */
    int64_t deadline; /* when the head being waited for must be complete (monotonic ms) */
    size_t len;       /* bytes in in[] */
    size_t outlen;    /* bytes in out[] */
    /* The batch's first answer while out[] is empty: in this thread's answer cache, not copied. Never held
     * across a park (flush_out sends it or moves it into out[] first). */
    const char *pend;
    size_t pendlen;
    char *out;        /* OUT_CAP bytes, after in[] */
    char in[];        /* sv->in_cap bytes, next to the fields above */
};

/* What to do after a batch: go on; write the answers and close; the same
 * with unread input left (linger first); close at once (a write failed). */
enum { KEEP_OPEN, CLOSE_AFTER, CLOSE_LINGER, CLOSE_BROKEN };

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------------ */
/* The list of open connections                                         */
/* ------------------------------------------------------------------ */

static void list_add(server_t *sv, struct conn *c)
{
    pthread_mutex_lock(&sv->mu);
    c->prev = NULL;
    c->next = sv->list;
    if (sv->list)
        sv->list->prev = c;
    sv->list = c;
    pthread_mutex_unlock(&sv->mu);
}

/* Called before c->fd is closed: while c is listed its fd is open. */
static void list_remove(server_t *sv, struct conn *c)
{
    pthread_mutex_lock(&sv->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        sv->list = c->next;
    if (c->next)
        c->next->prev = c->prev;
    pthread_mutex_unlock(&sv->mu);
}

/* Ends the read of every connection that waits for a new request: its read
 * returns 0 and the fiber closes it. The others notice sv->stopping after
 * their current batch. */
static void list_end_idle(server_t *sv)
{
    pthread_mutex_lock(&sv->mu);
    for (struct conn *c = sv->list; c; c = c->next)
        if (atomic_load(&c->idle))
            shutdown(c->fd, SHUT_RD);
    pthread_mutex_unlock(&sv->mu);
}

/* ------------------------------------------------------------------ */
/* A connection                                                         */
/* ------------------------------------------------------------------ */

/* The connection's reads and writes: through TLS for HTTPS. */
static ssize_t conn_read(struct conn *c, void *buf, size_t n, int timeout_ms)
{
#ifdef HTTP_SERVER_TLS
    if (c->tls)
        return fiber_tls_read(c->tls, buf, n, timeout_ms);
#endif
    return async_fiber_read(c->fd, buf, n, timeout_ms);
}

static ssize_t conn_write(struct conn *c, const void *buf, size_t n, int timeout_ms)
{
#ifdef HTTP_SERVER_TLS
    if (c->tls)
        return fiber_tls_write(c->tls, buf, n, timeout_ms);
#endif
    return async_fiber_write(c->fd, buf, n, timeout_ms);
}

/* Moves the pending answer into out[], ahead of what comes next. */
static void pend_to_out(struct conn *c)
{
    if (!c->pend)
        return;
    memcpy(c->out, c->pend, c->pendlen);
    c->outlen = c->pendlen;
    c->pend = NULL;
}

/* Sends what of the pending answer the socket takes at once, without a park (plain HTTP); the rest goes
 * into out[]. -1: the connection is unusable. */
static int pend_send(struct conn *c)
{
    const char *p = c->pend;
    size_t n = c->pendlen;
    ssize_t k = 0;
    if (!c->tls) {
#ifdef MSG_NOSIGNAL
        k = send(c->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
#else
        k = send(c->fd, p, n, MSG_DONTWAIT); /* fiber workers block SIGPIPE */
#endif
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        if (k < 0)
            k = 0;
    }
    c->pend = NULL;
    memcpy(c->out, p + k, n - (size_t)k);
    c->outlen = n - (size_t)k;
    return 0;
}

/* Writes the pending answer and out[] (one write each at most). -1: the connection is unusable. */
static int flush_out(struct conn *c)
{
    if (c->pend && pend_send(c) < 0)
        return -1;
    if (c->outlen == 0)
        return 0;
    ssize_t n = conn_write(c, c->out, c->outlen, c->sv->cfg.idle_ms);
    c->outlen = 0;
    return n < 0 ? -1 : 0;
}

/* Appends bytes to out[], writing out[] first when they do not fit. */
static int append_out(struct conn *c, const char *p, size_t n)
{
    pend_to_out(c);
    if (c->outlen + n > OUT_CAP && flush_out(c) < 0)
        return -1;
    memcpy(c->out + c->outlen, p, n);
    c->outlen += n;
    return 0;
}

/* Reads and drops the body bytes that are not in the buffer yet (the
 * buffer is consumed: c->len is 0 on return). Answers already batched are
 * written first, so they do not wait for a slow body. -1: close. */
static int skip_body(struct conn *c, uint64_t left)
{
    if (flush_out(c) < 0)
        return -1;
    c->len = 0;
    while (left > 0) {
        size_t want = left < c->sv->in_cap ? (size_t)left : c->sv->in_cap;
        ssize_t n = conn_read(c, c->in, want, c->sv->cfg.idle_ms);
        if (n <= 0)
            return -1;
        left -= (uint64_t)n;
    }
    return 0;
}

/* Answers every complete request at the start of in[]; the partial head
 * that may follow is moved to the front. */
static int answer_batch(struct conn *c, time_t now)
{
    server_t *sv = c->sv;
    size_t pos = 0;
    while (pos < c->len) {
        http_request_t req;
        int r = http_parse_request(c->in + pos, c->len - pos, &sv->cfg.limits, &req);
        if (r == HTTP_PARSE_NEED_MORE)
            break;
        if (r == HTTP_PARSE_ERROR) {
            char err[256];
            size_t n = http_error_response(err, sizeof err, req.status, now);
            return append_out(c, err, n) < 0 ? CLOSE_BROKEN : CLOSE_LINGER;
        }
        int head_only = req.method == HTTP_HEAD;
        size_t have = c->len - pos - req.head_len;
        if (req.content_length > have) { /* the body goes on past the buffer */
            if (skip_body(c, req.content_length - have) < 0)
                return CLOSE_BROKEN;
            pos = 0; /* skip_body emptied the buffer */
            now = time(NULL);
        } else {
            pos += req.head_len + (size_t)req.content_length;
        }
        /* Read once the whole request is in: a stop that began during its body closes after this answer. */
        int keep = req.keep_alive && !atomic_load_explicit(&sv->stopping, memory_order_relaxed);
        pend_to_out(c);
        if (c->outlen + HTTP_OK_MAX > OUT_CAP && flush_out(c) < 0) /* room first: no park while ok is used */
            return CLOSE_BROKEN;
        size_t n;
        const char *ok = http_ok_response(now, keep, head_only, &n);
        if (c->outlen == 0) {
            c->pend = ok;
            c->pendlen = n;
        } else {
            memcpy(c->out + c->outlen, ok, n);
            c->outlen += n;
        }
        /* Requests after a "close" are not answered. The client did not ask for a close the stop makes, so it
         * may have sent more already: that close lingers. */
        if (!keep)
            return pos < c->len || req.keep_alive ? CLOSE_LINGER : CLOSE_AFTER;
    }
    if (pos > 0) {
        memmove(c->in, c->in + pos, c->len - pos);
        c->len -= pos;
    }
    return KEEP_OPEN;
}

/* Closes our side for writing and reads what the client still sends, for a
 * while, so that the close does not reset the connection (which could
 * drop the answer just sent before the client reads it). The bytes read
 * are dropped undecoded, also under TLS. */
static void linger(struct conn *c)
{
#ifdef HTTP_SERVER_TLS
    if (c->tls)
        fiber_tls_shutdown(c->tls, TLS_CLOSE_MS);
#endif
    if (shutdown(c->fd, SHUT_WR) < 0)
        return;
    int64_t end = mono_ms() + LINGER_MS;
    size_t total = 0;
    for (;;) {
        int64_t left = end - mono_ms();
        if (left <= 0 || total > LINGER_BYTES)
            return;
        ssize_t n = async_fiber_read(c->fd, c->in, c->sv->in_cap, (int)left);
        if (n <= 0)
            return;
        total += (size_t)n;
    }
}

/* The read timeout for the next read: the head must be complete by
 * c->deadline. 0: the deadline has passed. */
static int read_timeout(const struct conn *c)
{
    int64_t left = c->deadline - mono_ms();
    return left > 0 ? (int)left : 0;
}

/* Serves requests until the client closes, a timeout, an error, a
 * "Connection: close", or the server's stop. */
static void serve(struct conn *c)
{
    server_t *sv = c->sv;
    c->deadline = mono_ms() + sv->cfg.idle_ms;
    bool parse = false; /* the bytes read may complete a head (the buffer holds a partial head only) */
    for (;;) {
        int r = parse ? answer_batch(c, time(NULL)) : KEEP_OPEN;
        if (r == CLOSE_BROKEN || flush_out(c) < 0)
            return;
        if (r == CLOSE_LINGER)
            linger(c);
        if (r != KEEP_OPEN)
            return;
        int timeout;
        if (c->len == 0) { /* waiting for a new request: the idle timeout starts now */
            atomic_store(&c->idle, 1); /* then read stopping: the stop sees idle=1 or we see stopping */
            if (atomic_load(&sv->stopping)) {
                /* The stop may have found it busy (its read was not ended): requests may wait unread behind
                 * the answers, and a close with unread input resets the connection, which drops the answers
                 * still queued in the socket. */
                linger(c);
                return;
            }
            c->deadline = mono_ms() + sv->cfg.idle_ms;
            timeout = sv->cfg.idle_ms;
        } else if ((timeout = read_timeout(c)) == 0) {
            return; /* a head that did not come within the idle timeout */
        }
        ssize_t n = conn_read(c, c->in + c->len, sv->in_cap - c->len, timeout);
        atomic_store_explicit(&c->idle, 0, memory_order_relaxed);
        if (n <= 0)
            return; /* 0: the client closed; -1: timeout, reset, or cancelled by the stop */
        /* Without a new LF no head can complete (a bad line is refused once it ends, or at the size limit), so
         * a head trickling in is parsed again per line, not per byte. */
        parse = memchr(c->in + c->len, '\n', (size_t)n) || c->len + (size_t)n >= sv->cfg.limits.max_head;
        c->len += (size_t)n;
    }
}

/* HTTPS: the TLS handshake, within the idle timeout. 0: serve. */
static int tls_begin(struct conn *c)
{
#ifdef HTTP_SERVER_TLS
    if (c->sv->cfg.tls) {
        c->tls = fiber_tls_create(c->sv->cfg.tls, c->fd);
        if (!c->tls || fiber_tls_accept(c->tls, c->sv->cfg.idle_ms) < 0)
            return -1;
    }
#else
    (void)c;
#endif
    return 0;
}

/* HTTPS: close_notify (if the connection is still sound), and the TLS state goes. */
static void tls_end(struct conn *c)
{
#ifdef HTTP_SERVER_TLS
    if (c->tls) {
        fiber_tls_shutdown(c->tls, TLS_CLOSE_MS); /* fails at once on a broken one, or once sent by linger */
        fiber_tls_destroy(c->tls);
    }
#else
    (void)c;
#endif
}

static void conn_main(void *arg)
{
    struct conn *c = arg;
    server_t *sv = c->sv;
    if (tls_begin(c) == 0)
        serve(c);
    tls_end(c);
    list_remove(sv, c);
    async_fiber_close(c->fd);
    free(c);
    atomic_fetch_sub(&sv->live, 1);
}

/* Starts the fiber of a new connection; closes fd if it cannot. */
static void conn_start(server_t *sv, async_fd_t fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* answers are whole writes: no Nagle delay */
    struct conn *c = malloc(sizeof *c + sv->in_cap + OUT_CAP);
    if (!c) {
        async_fiber_close(fd);
        return;
    }
    c->sv = sv;
    c->fd = fd;
    c->tls = NULL;
    atomic_init(&c->idle, 0);
    c->len = c->outlen = 0;
    c->pend = NULL;
    c->out = c->in + sv->in_cap;
    list_add(sv, c);
    atomic_fetch_add(&sv->live, 1);
    if (!async_scope_spawn(sv->conns, conn_main, c, 0)) { /* ASYNC_E_NOMEM, or the server stops */
        list_remove(sv, c);
        async_fiber_close(fd);
        free(c);
        atomic_fetch_sub(&sv->live, 1);
    }
}

/* ------------------------------------------------------------------ */
/* Accepting                                                            */
/* ------------------------------------------------------------------ */

/* Out of descriptors: accept's EMFILE comes before it looks for a
 * connection, so retrying at once would spin. Shed the clients waiting now
 * with the spare descriptor, then let the other fibers run and close. */
static void out_of_fds(server_t *sv)
{
    if (sv->spare_fd >= 0) {
        close(sv->spare_fd);
        async_fd_t fd;
        while ((fd = async_fiber_accept(sv->lfd, NULL, NULL, 0)) >= 0)
            async_fiber_close(fd);
        sv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    async_fiber_sleep(100);
}

static void acceptor(void *arg)
{
    server_t *sv = arg;
    async_fiber_set_name(NULL, "http-accept");
    while (!atomic_load(&sv->stopping)) {
        async_fd_t fd = async_fiber_accept(sv->lfd, NULL, NULL, -1);
        if (fd < 0) {
            int err = async_last_error();
            if (err == ASYNC_E_NOMEM) {
                out_of_fds(sv);
                continue;
            }
            if (err == ASYNC_E_SYS)
                continue; /* the OS refused this one connection */
            return;       /* ASYNC_E_CANCELLED: the server stops */
        }
        conn_start(sv, fd);
    }
}

int server_start(server_t *sv, async_sched_t *sched, const server_config_t *cfg)
{
    memset(sv, 0, sizeof *sv);
    sv->cfg = *cfg;
    sv->sched = sched;
    sv->lfd = -1;
    if (!sv->cfg.limits.max_head)
        sv->cfg.limits.max_head = HTTP_DEFAULT_MAX_HEAD;
    sv->in_cap = sv->cfg.limits.max_head < MIN_IN_CAP ? MIN_IN_CAP : sv->cfg.limits.max_head;
    pthread_mutex_init(&sv->mu, NULL);
    struct sockaddr_storage ss;
    socklen_t slen;
    if (async_sockaddr_parse(cfg->host, cfg->port, &ss, &slen) < 0) {
        fprintf(stderr, "http_server: bad address %s: %s\n", cfg->host ? cfg->host : "(any)",
                async_strerror(async_last_error()));
        return -1;
    }
    sv->lfd = async_fiber_listen((struct sockaddr *)&ss, slen, cfg->backlog, 0);
    if (sv->lfd < 0) {
        int err = async_last_error();
        fprintf(stderr, "http_server: listen: %s\n", err == ASYNC_E_EXISTS ? "address in use" : async_strerror(err));
        return -1;
    }
    slen = sizeof ss;
    getsockname(sv->lfd, (struct sockaddr *)&ss, &slen);
    sv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    sv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    sv->accepting = async_scope_create(sched, NULL, -1);
    sv->conns = async_scope_create(sched, NULL, -1);
    if (!sv->accepting || !sv->conns || !async_scope_spawn(sv->accepting, acceptor, sv, 0)) {
        fprintf(stderr, "http_server: start: %s\n", async_strerror(async_last_error()));
        server_stop(sv);
        return -1;
    }
    return 0;
}

void server_stop(server_t *sv)
{
    atomic_store(&sv->stopping, 1);
    if (sv->accepting) { /* 1. stop accepting, then close the listener: new clients are refused */
        async_scope_cancel(sv->accepting);
        async_scope_join(sv->accepting, -1);
        async_scope_destroy(sv->accepting);
        sv->accepting = NULL;
    }
    if (sv->lfd >= 0)
        async_fiber_close(sv->lfd);
    sv->lfd = -1;
    if (sv->conns) {
        list_end_idle(sv); /* 2. idle keep-alive connections end now */
        if (async_scope_join(sv->conns, sv->cfg.drain_ms) < 0) {
            async_scope_cancel(sv->conns); /* 3. what is still running after the drain is cancelled */
            async_scope_join(sv->conns, -1);
        }
        async_scope_destroy(sv->conns);
        sv->conns = NULL;
    }
    if (sv->spare_fd >= 0)
        close(sv->spare_fd);
    sv->spare_fd = -1;
    pthread_mutex_destroy(&sv->mu);
}
