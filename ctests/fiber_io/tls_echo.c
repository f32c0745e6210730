/* TLS through OpenSSL on fibers and plain threads (examples/fiber_tls): an
 * echo over loopback with many concurrent fiber clients and with plain-thread
 * clients; cancels, scope cancels and timeouts in the middle of a handshake
 * and of a read; a read that times out in the middle of a record and goes
 * on with it; a peer that closes in the middle of a record or without
 * close_notify; a write that times out; certificate, host name and
 * plain-text peers refused as protocol failures; bad arguments. The key and
 * self-signed certificate are made in-process at the start of each case
 * (no files, no openssl command). Built only where OpenSSL is found. */
#define BOUND_MS 20000 /* each call's bound: 200 handshakes share 2 CPUs */
#include "check.h"
#include "net.h"

#include "fiber_tls.h"

#include <netinet/tcp.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

/* ---- contexts, schedulers, checks ------------------------------------------ */

/* The server's context (a P-256 key, a certificate for "localhost") and a
 * client's that verifies the peer and trusts only that certificate. */
static SSL_CTX *srv_ctx, *cli_ctx;

static void tls_setup(void)
{
    EVP_PKEY *key;
    X509 *cert;
    CHECK_EQ(fiber_tls_self_signed("localhost", 1, &key, &cert), 0);
    srv_ctx = SSL_CTX_new(TLS_server_method());
    cli_ctx = SSL_CTX_new(TLS_client_method());
    CHECK(srv_ctx != NULL && cli_ctx != NULL);
    CHECK_EQ(SSL_CTX_use_certificate(srv_ctx, cert), 1);
    CHECK_EQ(SSL_CTX_use_PrivateKey(srv_ctx, key), 1);
    CHECK_EQ(SSL_CTX_set_min_proto_version(srv_ctx, TLS1_2_VERSION), 1);
    SSL_CTX_set_verify(cli_ctx, SSL_VERIFY_PEER, NULL);
    CHECK_EQ(X509_STORE_add_cert(SSL_CTX_get_cert_store(cli_ctx), cert), 1);
    X509_free(cert);
    EVP_PKEY_free(key);
}

static void tls_teardown(void)
{
    SSL_CTX_free(srv_ctx);
    SSL_CTX_free(cli_ctx);
    srv_ctx = cli_ctx = NULL;
}

static void tls_fail(const char *file, int line, const char *expr, const fiber_tls_t *t)
{
    fprintf(stderr, "%s:%d: %s failed: %s %s\n", file, line, expr, fiber_tls_strerror(fiber_tls_error(t)),
            fiber_tls_error_detail(t));
    fflush(stderr);
    _exit(1);
}

/* expr (a fiber_tls call on t) is true; else the case fails with t's error. */
#define TLS_OK(expr, t)                                                                                        \
    do {                                                                                                       \
        if (!(expr))                                                                                           \
            tls_fail(__FILE__, __LINE__, #expr, t);                                                            \
    } while (0)

/* expr fails (is true) with t's error code. */
#define TLS_FAILS(expr, t, code)                                                                               \
    do {                                                                                                       \
        CHECK(expr);                                                                                           \
        CHECK_EQ(fiber_tls_error(t), code);                                                                    \
    } while (0)

/* A socket connected to addr (on a fiber or a plain thread). */
static int tcp_connect(const struct sockaddr_in *addr)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    CHECK_EQ(async_fiber_connect(fd, (const struct sockaddr *)addr, sizeof *addr, BOUND_MS), 0);
    return fd;
}

/* ---- servers: an acceptor fiber, a fiber per connection ---------------------- */

/* A loopback listener whose acceptor fiber starts conn(fd) on a fiber for
 * each of its conns connections. */
typedef struct {
    async_sched_t *s;
    int lfd, conns;
    struct sockaddr_in addr;
    void (*conn)(void *);
} listener_t;

static void acceptor(void *arg)
{
    listener_t *l = arg;
    int i;
    for (i = 0; i < l->conns; i++) {
        int fd = async_fiber_accept(l->lfd, NULL, NULL, BOUND_MS);
        CHECK(fd >= 0);
        CHECK(async_fiber_spawn(l->s, l->conn, (void *)(intptr_t)fd, 0) != NULL);
    }
}

/* Starts l's acceptor on s; an owned listener hands out owned connections. */
static void listener_start(listener_t *l, async_sched_t *s, int conns, void (*conn)(void *), int owned)
{
    l->s = s;
    l->conns = conns;
    l->conn = conn;
    l->lfd = loopback_listener(1024, &l->addr);
    own_if(s, l->lfd, owned);
    CHECK(async_fiber_spawn(s, acceptor, l, 0) != NULL);
}

/* The echo server, on an owned listener. */
static struct {
    listener_t l;
    atomic_int served;
} es;

/* Echoes decrypted bytes until the client's close_notify, answers it with
 * its own, and closes. */
static void echo_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    size_t cap = 16384;
    char *buf = malloc(cap);
    fiber_tls_t *t = fiber_tls_create(srv_ctx, fd);
    CHECK(buf != NULL && t != NULL);
    TLS_OK(fiber_tls_accept(t, BOUND_MS) == 0, t);
    for (;;) {
        ssize_t n = fiber_tls_read(t, buf, cap, BOUND_MS);
        TLS_OK(n >= 0, t);
        if (n == 0)
            break;
        TLS_OK(fiber_tls_write(t, buf, (size_t)n, BOUND_MS) == n, t);
    }
    TLS_OK(fiber_tls_shutdown(t, BOUND_MS) == 0, t);
    fiber_tls_destroy(t);
    free(buf);
    CHECK_EQ(async_fiber_close(fd), 0);
    atomic_fetch_add(&es.served, 1);
}

static void echo_start(async_sched_t *s, int conns)
{
    memset(&es, 0, sizeof es);
    listener_start(&es.l, s, conns, echo_conn, 1);
}

static void echo_stop(void)
{
    wait_count(&es.served, es.l.conns, "connections served");
    CHECK_EQ(async_fiber_close(es.l.lfd), 0);
}

/* One client: msgs messages of varied length (every fifth spans several
 * records), each echoed back whole and intact, then close_notify both
 * ways. The same code on a fiber and on a plain thread. */
static void echo_client(int id, int msgs)
{
    size_t cap = 40000;
    unsigned char *out = malloc(cap), *in = malloc(cap);
    int fd = tcp_connect(&es.l.addr), m;
    fiber_tls_t *t = fiber_tls_create(cli_ctx, fd);
    CHECK(out != NULL && in != NULL && t != NULL);
    TLS_OK(fiber_tls_connect(t, "localhost", BOUND_MS) == 0, t);
    for (m = 0; m < msgs; m++) {
        size_t len = m % 5 == 4 ? 20000 + (size_t)(id * 97 + m * 13) % 20000 : 1 + (size_t)(id * 31 + m * 7) % 2000;
        size_t i, got = 0;
        for (i = 0; i < len; i++)
            out[i] = (unsigned char)(id * 7 + m * 3 + (int)i);
        TLS_OK(fiber_tls_write(t, out, len, BOUND_MS) == (ssize_t)len, t);
        while (got < len) {
            ssize_t n = fiber_tls_read(t, in + got, len - got, BOUND_MS);
            TLS_OK(n > 0, t);
            got += (size_t)n;
        }
        CHECK(memcmp(in, out, len) == 0);
    }
    TLS_OK(fiber_tls_shutdown(t, BOUND_MS) == 0, t);
    TLS_OK(fiber_tls_read(t, in, cap, BOUND_MS) == 0, t); /* the server's close_notify */
    fiber_tls_destroy(t);
    close(fd);
    free(out);
    free(in);
}

static atomic_int clients_done;

static void echo_client_fiber(void *arg)
{
    echo_client((int)(intptr_t)arg, 20);
    atomic_fetch_add(&clients_done, 1);
}

/* 200 fiber clients of 20 messages each at once, on a server of the same
 * scheduler: every message comes back intact and every connection ends with
 * close_notify both ways. */
CASE(echo_many_fiber_clients) // uring timeout=180
{
    int i, n = 200;
    async_sched_t *s;
    tls_setup();
    s = sched_new(2);
    echo_start(s, n);
    atomic_store(&clients_done, 0);
    for (i = 0; i < n; i++)
        CHECK(async_fiber_spawn(s, echo_client_fiber, (void *)(intptr_t)i, 0) != NULL);
    wait_count_within(&clients_done, n, 150000, "clients done");
    echo_stop();
    sched_finish(s, BOUND_MS);
    tls_teardown();
}

static void *echo_client_thread(void *arg)
{
    int i, base = (int)(intptr_t)arg;
    for (i = 0; i < 5; i++)
        echo_client(base + i, 20);
    return NULL;
}

/* Plain-thread clients (poll(2) waits) against the fiber server: 4 threads
 * of 5 connections in turn, 20 messages each. */
CASE(echo_thread_clients_fiber_server) // uring timeout=120
{
    pthread_t th[4];
    int i;
    async_sched_t *s;
    tls_setup();
    s = sched_new(2);
    echo_start(s, 20);
    for (i = 0; i < 4; i++)
        start_thread(&th[i], echo_client_thread, (void *)(intptr_t)(i * 5));
    for (i = 0; i < 4; i++)
        join_within(th[i], 100000, "client thread");
    echo_stop();
    sched_finish(s, BOUND_MS);
    tls_teardown();
}

/* ---- a connected pair, handshake done ---------------------------------------- */

typedef struct {
    int fd;
    fiber_tls_t *t;
    int timeout_ms; /* accept_kept_fiber's */
    ssize_t r;
    int err;
    atomic_int step;
} tls_end_t;

static void accept_fiber(void *arg)
{
    tls_end_t *e = arg;
    e->t = fiber_tls_create(srv_ctx, e->fd);
    CHECK(e->t != NULL);
    TLS_OK(fiber_tls_accept(e->t, BOUND_MS) == 0, e->t);
}

/* A TCP loopback pair, the server's end handshaken on a fiber of s and the
 * client's on this thread at the same time. */
static void tls_pair(async_sched_t *s, tls_end_t *srv, tls_end_t *cli)
{
    int sv[2];
    async_fiber_t *f;
    memset(srv, 0, sizeof *srv);
    memset(cli, 0, sizeof *cli);
    make_pair(1, sv);
    cli->fd = sv[0];
    srv->fd = sv[1];
    f = async_fiber_spawn(s, accept_fiber, srv, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    cli->t = fiber_tls_create(cli_ctx, cli->fd);
    CHECK(cli->t != NULL);
    TLS_OK(fiber_tls_connect(cli->t, "localhost", BOUND_MS) == 0, cli->t);
    CHECK_EQ(async_fiber_join(f, BOUND_MS), 0);
}

static void end_close(tls_end_t *e)
{
    fiber_tls_destroy(e->t);
    e->t = NULL;
    close(e->fd);
}

/* The server's handshake with e->timeout_ms, on a fiber; the result kept. */
static void accept_kept_fiber(void *arg)
{
    tls_end_t *e = arg;
    e->t = fiber_tls_create(srv_ctx, e->fd);
    CHECK(e->t != NULL);
    e->r = fiber_tls_accept(e->t, e->timeout_ms);
    e->err = fiber_tls_error(e->t);
}

/* A TCP loopback pair: the server's end (owned by s or plain) starts its
 * handshake on a joinable fiber (returned); *peer is the other end, for the
 * case to drive by hand. */
static async_fiber_t *accept_start(async_sched_t *s, tls_end_t *srv, int *peer, int timeout_ms, int owned)
{
    int sv[2];
    async_fiber_t *f;
    make_pair(1, sv);
    memset(srv, 0, sizeof *srv);
    srv->fd = sv[1];
    srv->timeout_ms = timeout_ms;
    *peer = sv[0];
    own_if(s, srv->fd, owned);
    f = async_fiber_spawn(s, accept_kept_fiber, srv, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    return f;
}

/* The bytes the client's SSL object would send for msg (one record for up
 * to 16 KiB), taken through a memory BIO instead of sent: a test can then
 * send part of a record. */
static size_t seal(fiber_tls_t *c, const void *msg, size_t n, unsigned char *out, size_t cap)
{
    SSL *ssl = fiber_tls_ssl(c);
    BIO *sock = SSL_get_wbio(ssl), *mem = BIO_new(BIO_s_mem());
    size_t w = 0;
    int len;
    CHECK(mem != NULL);
    CHECK_EQ(BIO_up_ref(sock), 1);
    SSL_set0_wbio(ssl, mem); /* drops one reference of sock: the rbio keeps another */
    CHECK_EQ(SSL_write_ex(ssl, msg, n, &w), 1);
    CHECK_EQ(w, n);
    len = BIO_read(mem, out, (int)cap);
    CHECK(len > 0 && (size_t)len < cap);
    SSL_set0_wbio(ssl, sock); /* frees mem */
    return (size_t)len;
}

static void send_raw(int fd, const void *p, size_t n)
{
    CHECK_EQ(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* ---- cancellation and timeouts in a read ---------------------------------------- */

/* Reads with no timeout; keeps the result and the error. */
static void read_fiber(void *arg)
{
    tls_end_t *e = arg;
    char buf[64];
    atomic_store(&e->step, 1);
    e->r = fiber_tls_read(e->t, buf, sizeof buf, -1);
    e->err = fiber_tls_error(e->t);
    atomic_store(&e->step, 2);
}

/* A read parked for data is ended by async_fiber_cancel with
 * ASYNC_E_CANCELLED; half a record already received meanwhile changes
 * nothing. */
CASE(read_cancelled_by_fiber_cancel) // uring
{
    tls_end_t srv, cli;
    unsigned char rec[256];
    size_t len;
    async_fiber_t *f;
    async_sched_t *s;
    tls_setup();
    s = sched_new(2);
    tls_pair(s, &srv, &cli);
    f = async_fiber_spawn(s, read_fiber, &srv, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    sched_wait_parked(s, 1);
    len = seal(cli.t, "hello", 5, rec, sizeof rec);
    send_raw(cli.fd, rec, len / 2);
    sleep_ms(50);
    CHECK_EQ(atomic_load(&srv.step), 1);
    CHECK_EQ(async_fiber_cancel(f), 0);
    CHECK_EQ(async_fiber_join(f, BOUND_MS), 0);
    CHECK_EQ(srv.r, -1);
    CHECK_EQ(srv.err, ASYNC_E_CANCELLED);
    end_close(&srv);
    end_close(&cli);
    sched_finish(s, BOUND_MS);
    tls_teardown();
}

/* Every read parked in a scope (8 connections) ends with ASYNC_E_CANCELLED
 * at async_scope_cancel, and the scope joins. */
CASE(reads_cancelled_by_scope_cancel) // uring
{
    enum { N = 8 };
    tls_end_t srv[N], cli[N];
    int i;
    async_sched_t *s;
    async_scope_t *sc;
    tls_setup();
    s = sched_new(2);
    sc = async_scope_create(s, NULL, -1);
    CHECK(sc != NULL);
    for (i = 0; i < N; i++) {
        tls_pair(s, &srv[i], &cli[i]);
        CHECK(async_scope_spawn(sc, read_fiber, &srv[i], 0) != NULL);
    }
    sched_wait_parked(s, N);
    CHECK_EQ(async_scope_cancel(sc), 0);
    CHECK_EQ(async_scope_join(sc, BOUND_MS), 0);
    for (i = 0; i < N; i++) {
        CHECK_EQ(srv[i].r, -1);
        CHECK_EQ(srv[i].err, ASYNC_E_CANCELLED);
        end_close(&srv[i]);
        end_close(&cli[i]);
    }
    CHECK_EQ(async_scope_destroy(sc), 0);
    sched_finish(s, BOUND_MS);
    tls_teardown();
}

/* The server's side of read_timeout_keeps_partial_record: half a record is
 * there; a read times out; once the rest came, the next read returns the
 * whole message; then the client's close_notify ends the stream. */
static tls_end_t rt_srv, rt_cli;
static unsigned char rt_rec[256];
static size_t rt_len;

static void rt_server(tls_end_t *e)
{
    char buf[64];
    double t0 = now_ms();
    TLS_FAILS(fiber_tls_read(e->t, buf, sizeof buf, 200) == -1, e->t, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 150);
    atomic_store(&e->step, 1);
    TLS_OK(fiber_tls_read(e->t, buf, sizeof buf, BOUND_MS) == 11, e->t);
    CHECK(memcmp(buf, "hello world", 11) == 0);
    TLS_OK(fiber_tls_read(e->t, buf, sizeof buf, BOUND_MS) == 0, e->t);
    atomic_store(&e->step, 2);
}

static void rt_server_fiber(void *arg)
{
    rt_server(arg);
}

static void *rt_server_thread(void *arg)
{
    rt_server(arg);
    return NULL;
}

static void rt_client(void)
{
    wait_flag(&rt_srv.step, BOUND_MS, "server read timed out");
    send_raw(rt_cli.fd, rt_rec + rt_len / 2, rt_len - rt_len / 2);
    TLS_OK(fiber_tls_shutdown(rt_cli.t, BOUND_MS) == 0, rt_cli.t);
}

/* A read that times out in the middle of a record leaves the endpoint
 * usable: the next read goes on with the record. Server on a fiber, then on
 * a plain thread. */
CASE(read_timeout_keeps_partial_record) // uring
{
    int on_thread;
    async_sched_t *s;
    tls_setup();
    s = sched_new(2);
    for (on_thread = 0; on_thread < 2; on_thread++) {
        pthread_t th;
        tls_pair(s, &rt_srv, &rt_cli);
        rt_len = seal(rt_cli.t, "hello world", 11, rt_rec, sizeof rt_rec);
        send_raw(rt_cli.fd, rt_rec, rt_len / 2);
        if (on_thread)
            start_thread(&th, rt_server_thread, &rt_srv);
        else
            CHECK(async_fiber_spawn(s, rt_server_fiber, &rt_srv, 0) != NULL);
        rt_client();
        wait_count(&rt_srv.step, 2, "server read the record");
        if (on_thread)
            join_within(th, BOUND_MS, "server thread");
        end_close(&rt_srv);
        end_close(&rt_cli);
    }
    sched_finish(s, BOUND_MS);
    tls_teardown();
}

/* A peer that closes its socket in the middle of a record, or between
 * records without close_notify: the read fails with ASYNC_E_CLOSED (a
 * truncated stream, never a clean end) and the endpoint is broken. */
CASE(peer_closes_mid_record_or_without_close_notify) // uring
{
    int mid;
    async_sched_t *s;
    tls_setup();
    s = sched_new(2);
    for (mid = 0; mid < 2; mid++) {
        tls_end_t srv, cli;
        unsigned char rec[256];
        size_t len;
        async_fiber_t *f;
        tls_pair(s, &srv, &cli);
        f = async_fiber_spawn(s, read_fiber, &srv, ASYNC_FIBER_JOINABLE);
        CHECK(f != NULL);
        sched_wait_parked(s, 1);
        if (mid) {
            len = seal(cli.t, "cut short", 9, rec, sizeof rec);
            send_raw(cli.fd, rec, len - 3);
        }
        CHECK_EQ(shutdown(cli.fd, SHUT_WR), 0); /* a FIN, whatever the client left unread */
        CHECK_EQ(async_fiber_join(f, BOUND_MS), 0);
        CHECK_EQ(srv.r, -1);
        CHECK_EQ(srv.err, ASYNC_E_CLOSED);
        {
            char b[8];
            TLS_FAILS(fiber_tls_read(srv.t, b, sizeof b, 0) == -1, srv.t, ASYNC_E_STATE);
        }
        end_close(&srv);
        end_close(&cli);
    }
    sched_finish(s, BOUND_MS);
    tls_teardown();
}

/* A write the peer does not read times out (the whole call is bounded) and
 * leaves the endpoint broken: the next write fails with ASYNC_E_STATE
 * without sending. */
static void write_timeout_fiber(void *arg)
{
    tls_end_t *e = arg;
    size_t chunk = 1 << 20;
    char *buf = calloc(1, chunk);
    int i;
    CHECK(buf != NULL);
    for (i = 0; i < 512; i++)
        if (fiber_tls_write(e->t, buf, chunk, 300) < 0)
            break;
    CHECK(i < 512);
    CHECK_EQ(fiber_tls_error(e->t), ASYNC_E_TIMEDOUT);
    TLS_FAILS(fiber_tls_write(e->t, buf, 1, BOUND_MS) == -1, e->t, ASYNC_E_STATE);
    TLS_FAILS(fiber_tls_shutdown(e->t, BOUND_MS) == -1, e->t, ASYNC_E_STATE);
    free(buf);
}

CASE(write_timeout_breaks_endpoint) // uring
{
    tls_end_t srv, cli;
    async_sched_t *s;
    tls_setup();
    s = sched_new(2);
    tls_pair(s, &srv, &cli);
    on_fiber(s, write_timeout_fiber, &srv);
    end_close(&srv);
    end_close(&cli);
    sched_finish(s, BOUND_MS);
    tls_teardown();
}

/* ---- cancellation and timeouts in a handshake ----------------------------------- */

/* A raw TCP peer that never answers: stall_conns connections accepted; each
 * reads what comes (a ClientHello, or nothing) and then waits for the
 * other side to close. hellos counts the ClientHellos read. */
static struct {
    listener_t l;
    atomic_int hellos, ended;
} st;

static void stall_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    unsigned char buf[4096];
    ssize_t n = async_fiber_read(fd, buf, sizeof buf, BOUND_MS);
    if (n > 0 && buf[0] == 0x16) /* a TLS handshake record */
        atomic_fetch_add(&st.hellos, 1);
    while (n > 0)
        n = async_fiber_read(fd, buf, sizeof buf, BOUND_MS);
    close(fd);
    atomic_fetch_add(&st.ended, 1);
}

static void stall_start(async_sched_t *s, int conns)
{
    memset(&st, 0, sizeof st);
    listener_start(&st.l, s, conns, stall_conn, 0);
}

/* A client handshake to the silent server, with no timeout: the result in
 * e->r and e->err. */
static void connect_fiber(void *arg)
{
    tls_end_t *e = arg;
    e->fd = tcp_connect(&st.l.addr);
    e->t = fiber_tls_create(cli_ctx, e->fd);
    CHECK(e->t != NULL);
    atomic_store(&e->step, 1);
    e->r = fiber_tls_connect(e->t, "localhost", -1);
    e->err = fiber_tls_error(e->t);
    atomic_store(&e->step, 2);
}

/* Client handshakes (5, in a scope) to a server that read their ClientHello
 * and never answers end with ASYNC_E_CANCELLED at async_scope_cancel; the
 * broken endpoints refuse reads with ASYNC_E_STATE. */
CASE(handshake_after_client_hello_cancelled_by_scope) // uring
{
    enum { N = 5 };
    tls_end_t cli[N];
    int i;
    async_sched_t *s;
    async_scope_t *sc;
    tls_setup();
    s = sched_new(2);
    stall_start(s, N);
    sc = async_scope_create(s, NULL, -1);
    CHECK(sc != NULL);
    memset(cli, 0, sizeof cli);
    for (i = 0; i < N; i++)
        CHECK(async_scope_spawn(sc, connect_fiber, &cli[i], 0) != NULL);
    wait_count(&st.hellos, N, "ClientHellos read");
    sched_wait_parked(s, 2 * N); /* the clients and the silent peers */
    CHECK_EQ(async_scope_cancel(sc), 0);
    CHECK_EQ(async_scope_join(sc, BOUND_MS), 0);
    for (i = 0; i < N; i++) {
        char b[4];
        CHECK_EQ(cli[i].r, -1);
        CHECK_EQ(cli[i].err, ASYNC_E_CANCELLED);
        TLS_FAILS(fiber_tls_read(cli[i].t, b, sizeof b, 0) == -1, cli[i].t, ASYNC_E_STATE);
        end_close(&cli[i]);
    }
    wait_count(&st.ended, N, "silent peers ended");
    close(st.l.lfd);
    CHECK_EQ(async_scope_destroy(sc), 0);
    sched_finish(s, BOUND_MS);
    tls_teardown();
}

/* Handshakes time out within their timeout_ms against a silent peer: a
 * client after its ClientHello, a server that got nothing. */
static void handshake_timeouts(void *arg)
{
    int fd, sv[2];
    fiber_tls_t *t;
    double t0;
    (void)arg;
    fd = tcp_connect(&st.l.addr);
    t = fiber_tls_create(cli_ctx, fd);
    CHECK(t != NULL);
    t0 = now_ms();
    TLS_FAILS(fiber_tls_connect(t, "localhost", 200) == -1, t, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 150);
    fiber_tls_destroy(t);
    close(fd);

    make_pair(1, sv);
    t = fiber_tls_create(srv_ctx, sv[1]);
    CHECK(t != NULL);
    t0 = now_ms();
    TLS_FAILS(fiber_tls_accept(t, 200) == -1, t, ASYNC_E_TIMEDOUT);
    CHECK(now_ms() - t0 >= 150);
    TLS_FAILS(fiber_tls_accept(t, 200) == -1, t, ASYNC_E_STATE);
    fiber_tls_destroy(t);
    close_pair(sv);
}

/* On a fiber, then on a plain thread. */
CASE(handshake_timeouts_against_silent_peer) // uring
{
    async_sched_t *s, *s2;
    tls_setup();
    s = sched_new(1);
    stall_start(s, 2);
    s2 = sched_new(2);
    on_fiber(s2, handshake_timeouts, NULL);
    handshake_timeouts(NULL);
    wait_count(&st.ended, 2, "silent peers ended");
    close(st.l.lfd);
    sched_finish(s2, BOUND_MS);
    sched_finish(s, BOUND_MS);
    tls_teardown();
}

/* A server handshake whose client connected and never sent a ClientHello,
 * with no timeout, ends with ASYNC_E_CANCELLED at async_fiber_cancel, and
 * (its fd owned) with ASYNC_E_CLOSED at async_fiber_close. */
CASE(handshake_before_client_hello_cancelled_or_closed) // uring
{
    int owned;
    async_sched_t *s;
    tls_setup();
    s = sched_new(2);
    for (owned = 0; owned < 2; owned++) {
        tls_end_t srv;
        int peer;
        async_fiber_t *f = accept_start(s, &srv, &peer, -1, owned);
        sched_wait_parked(s, 1);
        if (owned)
            CHECK_EQ(async_fiber_close(srv.fd), 0);
        else
            CHECK_EQ(async_fiber_cancel(f), 0);
        CHECK_EQ(async_fiber_join(f, BOUND_MS), 0);
        CHECK_EQ(srv.r, -1);
        CHECK_EQ(srv.err, owned ? ASYNC_E_CLOSED : ASYNC_E_CANCELLED);
        fiber_tls_destroy(srv.t);
        if (!owned)
            close(srv.fd);
        close(peer);
    }
    sched_finish(s, BOUND_MS);
    tls_teardown();
}

/* ---- protocol failures ------------------------------------------------------------ */

/* A client handshake with ctx and server_name against a fiber server;
 * both must fail: the client with FIBER_TLS_E_PROTOCOL and a detail holding
 * want, the server with a protocol failure (the client's alert) or
 * ASYNC_E_CLOSED. */
static void handshake_refused(async_sched_t *s, SSL_CTX *ctx, const char *server_name, const char *want)
{
    tls_end_t srv;
    int peer;
    fiber_tls_t *t;
    async_fiber_t *f = accept_start(s, &srv, &peer, BOUND_MS, 0);
    t = fiber_tls_create(ctx, peer);
    CHECK(t != NULL);
    TLS_FAILS(fiber_tls_connect(t, server_name, BOUND_MS) == -1, t, FIBER_TLS_E_PROTOCOL);
    if (strstr(fiber_tls_error_detail(t), want) == NULL) {
        fprintf(stderr, "detail \"%s\" does not hold \"%s\"\n", fiber_tls_error_detail(t), want);
        CHECK(0);
    }
    close(peer); /* so that the server does not wait for more */
    fiber_tls_destroy(t);
    CHECK_EQ(async_fiber_join(f, BOUND_MS), 0);
    CHECK_EQ(srv.r, -1);
    CHECK(err_in(srv.err, FIBER_TLS_E_PROTOCOL, ASYNC_E_CLOSED));
    end_close(&srv);
}

/* A certificate nobody trusts, and one for another name or address, fail
 * the client's handshake as protocol failures that say why. */
CASE(untrusted_or_misnamed_certificate_refused) // uring
{
    SSL_CTX *bare;
    async_sched_t *s;
    tls_setup();
    s = sched_new(2);
    bare = SSL_CTX_new(TLS_client_method());
    CHECK(bare != NULL);
    SSL_CTX_set_verify(bare, SSL_VERIFY_PEER, NULL);
    handshake_refused(s, bare, "localhost", "certificate verify failed");
    handshake_refused(s, cli_ctx, "other.example", "hostname mismatch");
    handshake_refused(s, cli_ctx, "127.0.0.1", "IP address mismatch");
    SSL_CTX_free(bare);
    sched_finish(s, BOUND_MS);
    tls_teardown();
}

/* A peer that speaks plain HTTP to the TLS server: a protocol failure. */
CASE(plain_text_peer_refused) // uring
{
    tls_end_t srv;
    int peer;
    const char req[] = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
    async_fiber_t *f;
    async_sched_t *s;
    tls_setup();
    s = sched_new(2);
    f = accept_start(s, &srv, &peer, BOUND_MS, 0);
    send_raw(peer, req, sizeof req - 1);
    CHECK_EQ(async_fiber_join(f, BOUND_MS), 0);
    CHECK_EQ(srv.r, -1);
    CHECK_EQ(srv.err, FIBER_TLS_E_PROTOCOL);
    CHECK(fiber_tls_error_detail(srv.t)[0] != '\0');
    end_close(&srv);
    close(peer);
    sched_finish(s, BOUND_MS);
    tls_teardown();
}

/* ---- arguments and states ------------------------------------------------------------ */

CASE(bad_arguments_and_states)
{
    tls_end_t srv, cli;
    fiber_tls_t *t;
    char b[8];
    EVP_PKEY *key = NULL;
    X509 *cert = NULL;
    async_sched_t *s;
    tls_setup();
    s = sched_new(2);
    CHECK(fiber_tls_create(NULL, 0) == NULL);
    CHECK(fiber_tls_create(srv_ctx, -1) == NULL);
    CHECK_EQ(fiber_tls_error(NULL), ASYNC_E_INVAL);
    CHECK(fiber_tls_ssl(NULL) == NULL);
    CHECK_EQ(fiber_tls_accept(NULL, 0), -1);
    CHECK_EQ(fiber_tls_read(NULL, b, 1, 0), -1);
    CHECK_EQ(fiber_tls_write(NULL, b, 1, 0), -1);
    fiber_tls_destroy(NULL);
    CHECK(strcmp(fiber_tls_strerror(FIBER_TLS_E_PROTOCOL), async_strerror(FIBER_TLS_E_PROTOCOL)) != 0);
    CHECK(strcmp(fiber_tls_strerror(ASYNC_E_CLOSED), async_strerror(ASYNC_E_CLOSED)) == 0);
    CHECK_EQ(fiber_tls_self_signed(NULL, 1, &key, &cert), -1);
    CHECK_EQ(fiber_tls_self_signed("", 1, &key, &cert), -1);
    CHECK_EQ(fiber_tls_self_signed("localhost", 0, &key, &cert), -1);
    CHECK(key == NULL && cert == NULL);

    /* a new endpoint: no read, write or shutdown before its handshake */
    t = fiber_tls_create(srv_ctx, 0);
    CHECK(t != NULL);
    CHECK_EQ(fiber_tls_error(t), 0);
    CHECK(fiber_tls_ssl(t) != NULL);
    TLS_FAILS(fiber_tls_read(t, b, sizeof b, 0) == -1, t, ASYNC_E_STATE);
    TLS_FAILS(fiber_tls_write(t, b, sizeof b, 0) == -1, t, ASYNC_E_STATE);
    TLS_FAILS(fiber_tls_shutdown(t, 0) == -1, t, ASYNC_E_STATE);
    TLS_FAILS(fiber_tls_accept(t, -2) == -1, t, ASYNC_E_INVAL);
    TLS_FAILS(fiber_tls_connect(t, NULL, -2) == -1, t, ASYNC_E_INVAL);
    CHECK_EQ(fiber_tls_error_detail(t)[0], '\0');
    fiber_tls_destroy(t);

    /* an open one */
    tls_pair(s, &srv, &cli);
    TLS_FAILS(fiber_tls_accept(srv.t, 0) == -1, srv.t, ASYNC_E_STATE);
    TLS_FAILS(fiber_tls_connect(cli.t, "localhost", 0) == -1, cli.t, ASYNC_E_STATE);
    TLS_FAILS(fiber_tls_read(cli.t, NULL, 1, 0) == -1, cli.t, ASYNC_E_INVAL);
    TLS_FAILS(fiber_tls_write(cli.t, NULL, 1, 0) == -1, cli.t, ASYNC_E_INVAL);
    TLS_FAILS(fiber_tls_read(cli.t, b, sizeof b, -2) == -1, cli.t, ASYNC_E_INVAL);
    TLS_OK(fiber_tls_read(cli.t, NULL, 0, 0) == 0, cli.t);
    TLS_OK(fiber_tls_write(cli.t, NULL, 0, 0) == 0, cli.t);
    /* nothing to read: a timeout of 0 looks once (the session tickets
     * that may come are not data) */
    TLS_FAILS(fiber_tls_read(cli.t, b, sizeof b, 0) == -1, cli.t, ASYNC_E_TIMEDOUT);
    TLS_OK(fiber_tls_write(cli.t, "ping", 4, BOUND_MS) == 4, cli.t);
    TLS_OK(fiber_tls_read(srv.t, b, sizeof b, BOUND_MS) == 4, srv.t);
    /* after shutdown: no more writes, reads go on */
    TLS_OK(fiber_tls_shutdown(cli.t, BOUND_MS) == 0, cli.t);
    TLS_FAILS(fiber_tls_write(cli.t, "x", 1, 0) == -1, cli.t, ASYNC_E_STATE);
    TLS_FAILS(fiber_tls_shutdown(cli.t, 0) == -1, cli.t, ASYNC_E_STATE);
    TLS_OK(fiber_tls_read(srv.t, b, sizeof b, BOUND_MS) == 0, srv.t);
    TLS_OK(fiber_tls_write(srv.t, "pong", 4, BOUND_MS) == 4, srv.t);
    TLS_OK(fiber_tls_read(cli.t, b, sizeof b, BOUND_MS) == 4, cli.t);
    CHECK(memcmp(b, "pong", 4) == 0);
    end_close(&srv);
    end_close(&cli);
    sched_finish(s, BOUND_MS);
    tls_teardown();
}

TEST_MAIN()
