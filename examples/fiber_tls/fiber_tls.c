/*
 * fiber_tls.c — TLS over a socket on libasync fibers or plain threads (see
 * fiber_tls.h for the contract).
 *
 * Invariants:
 * - Every OpenSSL call that touches the connection is one ft_step: the
 *   thread's error queue is cleared just before it and SSL_get_error, the
 *   queue's reason and the socket's errno are read just after it, before
 *   anything can park. A fiber may change threads only at the park in
 *   ft_run, between two steps, so no step sees another step's errors.
 * - The BIO never blocks: recv/send with MSG_DONTWAIT; EAGAIN becomes
 *   OpenSSL's "retry", which ft_step turns into the direction to wait for.
 * - state only moves forward: NEW -> OPEN -> (SENT_CLOSE) and to BROKEN
 *   from anywhere; BROKEN is final.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "fiber_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 /* macOS, BSD: set SO_NOSIGPIPE on the socket instead */
#endif

enum { FT_NEW, FT_OPEN, FT_SENT_CLOSE, FT_BROKEN };
enum { FT_HANDSHAKE, FT_READ, FT_WRITE, FT_SHUTDOWN };

struct fiber_tls {
    SSL *ssl;
    async_fd_t fd;
    int state;
    int err;          /* the last failed call's code */
    int bio_errno;    /* errno of the BIO's last failed recv/send in this step */
    int bio_eof;      /* recv returned 0: the peer closed its side */
    char detail[256]; /* OpenSSL's reason for the last FIBER_TLS_E_PROTOCOL */
};

/* ---- the BIO: recv/send on t->fd, never blocking --------------------------- */

static int ft_bio_write(BIO *b, const char *data, size_t n, size_t *written)
{
    fiber_tls_t *t = BIO_get_data(b);
    ssize_t r;
    BIO_clear_retry_flags(b);
    do {
        r = send((int)t->fd, data, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (r < 0 && errno == EINTR);
    if (r >= 0) {
        *written = (size_t)r;
        return 1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        BIO_set_retry_write(b);
    else
        t->bio_errno = errno;
    return 0;
}

static int ft_bio_read(BIO *b, char *data, size_t n, size_t *got)
{
    fiber_tls_t *t = BIO_get_data(b);
    ssize_t r;
    BIO_clear_retry_flags(b);
    do {
        r = recv((int)t->fd, data, n, MSG_DONTWAIT);
    } while (r < 0 && errno == EINTR);
    if (r > 0) {
        *got = (size_t)r;
        return 1;
    }
    if (r == 0)
        t->bio_eof = 1;
    else if (errno == EAGAIN || errno == EWOULDBLOCK)
        BIO_set_retry_read(b);
    else
        t->bio_errno = errno;
    return 0;
}

static long ft_bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    fiber_tls_t *t = BIO_get_data(b);
    (void)num;
    (void)ptr;
    switch (cmd) {
    case BIO_CTRL_FLUSH: /* nothing is buffered here */
        return 1;
    case BIO_CTRL_EOF:
        return t != NULL && t->bio_eof;
    default:
        return 0;
    }
}

static BIO_METHOD *ft_method;
static pthread_once_t ft_method_once = PTHREAD_ONCE_INIT;

/* The BIO method is made once and kept for the process's life. */
static void ft_method_init(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "fiber_tls socket");
    if (m == NULL)
        return;
    if (!BIO_meth_set_write_ex(m, ft_bio_write) || !BIO_meth_set_read_ex(m, ft_bio_read) ||
        !BIO_meth_set_ctrl(m, ft_bio_ctrl)) {
        BIO_meth_free(m);
        return;
    }
    ft_method = m;
}

/* ---- create / destroy -------------------------------------------------------- */

fiber_tls_t *fiber_tls_create(SSL_CTX *ctx, async_fd_t fd)
{
    fiber_tls_t *t;
    BIO *bio;
    if (ctx == NULL || (int)fd < 0 || pthread_once(&ft_method_once, ft_method_init) != 0 || ft_method == NULL)
        return NULL;
    t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->fd = fd;
    t->state = FT_NEW;
    t->ssl = SSL_new(ctx);
    bio = BIO_new(ft_method);
    if (t->ssl == NULL || bio == NULL) {
        BIO_free(bio);
        SSL_free(t->ssl);
        free(t);
        ERR_clear_error();
        return NULL;
    }
    BIO_set_data(bio, t);
    BIO_set_init(bio, 1);
    SSL_set_bio(t->ssl, bio, bio); /* the SSL owns the BIO from here */
    /* write-all loops over records; a retried write may pass a moved buffer */
    SSL_set_mode(t->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    return t;
}

void fiber_tls_destroy(fiber_tls_t *t)
{
    if (t == NULL)
        return;
    SSL_free(t->ssl);
    free(t);
}

int fiber_tls_error(const fiber_tls_t *t)
{
    return t ? t->err : ASYNC_E_INVAL;
}

const char *fiber_tls_error_detail(const fiber_tls_t *t)
{
    return t && t->err == FIBER_TLS_E_PROTOCOL ? t->detail : "";
}

const char *fiber_tls_strerror(int code)
{
    if (code == FIBER_TLS_E_PROTOCOL)
        return "TLS protocol failure";
    return async_strerror(code);
}

SSL *fiber_tls_ssl(fiber_tls_t *t)
{
    return t ? t->ssl : NULL;
}

/* ---- one OpenSSL call, and the loop around it --------------------------------- */

/* Fills t->detail with the reason of the error queue's last entry (and the
 * certificate check's verdict when that failed). Called right after the
 * failed call, on its thread. */
static void ft_note_detail(fiber_tls_t *t, unsigned long e)
{
    long v = SSL_get_verify_result(t->ssl);
    const char *reason = e ? ERR_reason_error_string(e) : NULL;
    if (reason == NULL)
        reason = "TLS failure";
    if (v != X509_V_OK)
        snprintf(t->detail, sizeof t->detail, "%s: %s", reason, X509_verify_cert_error_string(v));
    else
        snprintf(t->detail, sizeof t->detail, "%s", reason);
}

/* Maps a failed step's SSL_get_error result to a code. */
static int ft_code(fiber_tls_t *t, int ssl_err)
{
    unsigned long e = ERR_peek_last_error();
    if (ssl_err == SSL_ERROR_ZERO_RETURN)
        return ASYNC_E_CLOSED; /* close_notify in the middle of a handshake */
    if (ssl_err == SSL_ERROR_SYSCALL || (ssl_err == SSL_ERROR_SSL && ERR_GET_LIB(e) == ERR_LIB_SYS)) {
        switch (t->bio_errno) {
        case 0: /* end of stream (OpenSSL 1.1) */
        case ECONNRESET:
        case ECONNABORTED:
        case ECONNREFUSED:
        case EPIPE:
        case ENOTCONN:
            return ASYNC_E_CLOSED;
        case EBADF:
        case ENOTSOCK:
            return ASYNC_E_BADFD;
        default:
            return ASYNC_E_SYS;
        }
    }
    if (ssl_err == SSL_ERROR_SSL) {
#ifdef SSL_R_UNEXPECTED_EOF_WHILE_READING
        if (ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING)
            return ASYNC_E_CLOSED;
#endif
        ft_note_detail(t, e);
        return FIBER_TLS_E_PROTOCOL;
    }
    return ASYNC_E_INTERNAL; /* WANT_X509_LOOKUP, WANT_ASYNC...: callbacks this module does not install */
}

/* One OpenSSL call of kind op. Returns 1 when it completed (*done: bytes
 * read or written; 0 for a read at close_notify), 0 when it must wait for
 * *ev on the fd, -1 on failure (t->err set). */
static int ft_step(fiber_tls_t *t, int op, void *buf, size_t n, size_t *done, uint32_t *ev)
{
    int r, ssl_err;
    *done = 0;
    t->bio_errno = 0;
    ERR_clear_error();
    switch (op) {
    case FT_HANDSHAKE:
        r = SSL_do_handshake(t->ssl);
        break;
    case FT_READ:
        r = SSL_read_ex(t->ssl, buf, n, done);
        break;
    case FT_WRITE:
        r = SSL_write_ex(t->ssl, buf, n, done);
        break;
    default:
        r = SSL_shutdown(t->ssl);
        if (r == 0) /* sent; the peer's close_notify is not awaited */
            r = 1;
        break;
    }
    if (r == 1)
        return 1;
    ssl_err = SSL_get_error(t->ssl, r);
    if (ssl_err == SSL_ERROR_WANT_READ || ssl_err == SSL_ERROR_WANT_WRITE) {
        *ev = ssl_err == SSL_ERROR_WANT_READ ? ASYNC_EVENT_READ : ASYNC_EVENT_WRITE;
        ERR_clear_error();
        return 0;
    }
    if (op == FT_READ && ssl_err == SSL_ERROR_ZERO_RETURN) {
        ERR_clear_error();
        return 1;
    }
    t->err = ft_code(t, ssl_err);
    ERR_clear_error();
    return -1;
}

static int64_t ft_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ms left until deadline (-1: none), for async_fiber_wait_fd. */
static int ft_left(int64_t deadline)
{
    int64_t left;
    if (deadline < 0)
        return -1;
    left = deadline - ft_now_ms();
    return left <= 0 ? 0 : left > INT32_MAX ? INT32_MAX : (int)left;
}

/* Repeats step op until it completes, parking between tries for the
 * direction OpenSSL asks for, within timeout_ms for the whole. Returns as
 * ft_step (never 0); a failure leaves t broken unless it is a read's
 * timeout or cancel. */
static int ft_run(fiber_tls_t *t, int op, void *buf, size_t n, size_t *done, int timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? -1 : ft_now_ms() + timeout_ms;
    for (;;) {
        uint32_t ev = 0;
        int r = ft_step(t, op, buf, n, done, &ev);
        if (r == 1)
            return 1;
        if (r == 0 && async_fiber_wait_fd(t->fd, ev, ft_left(deadline)) >= 0)
            continue;
        if (r == 0)
            t->err = async_last_error();
        if (!(op == FT_READ && (t->err == ASYNC_E_TIMEDOUT || t->err == ASYNC_E_CANCELLED)))
            t->state = FT_BROKEN;
        return -1;
    }
}

/* Checks a call's arguments and t's state (the states the call accepts are
 * from_state..to_state); sets t->err and returns -1 when they are wrong. */
static int ft_enter(fiber_tls_t *t, int timeout_ms, int from_state, int to_state)
{
    if (timeout_ms < -1) {
        t->err = ASYNC_E_INVAL;
        return -1;
    }
    if (t->state < from_state || t->state > to_state) {
        t->err = ASYNC_E_STATE;
        return -1;
    }
    return 0;
}

/* ---- the calls ------------------------------------------------------------------ */

/* Runs the handshake or the shutdown (op) on t; on success t moves to
 * state next. */
static int ft_change(fiber_tls_t *t, int op, int next, int timeout_ms)
{
    size_t done;
    if (ft_run(t, op, NULL, 0, &done, timeout_ms) < 0)
        return -1;
    t->state = next;
    return 0;
}

int fiber_tls_accept(fiber_tls_t *t, int timeout_ms)
{
    if (t == NULL || ft_enter(t, timeout_ms, FT_NEW, FT_NEW) != 0)
        return -1;
    SSL_set_accept_state(t->ssl);
    return ft_change(t, FT_HANDSHAKE, FT_OPEN, timeout_ms);
}

/* 1 if name is a numeric IPv4 or IPv6 address. */
static int ft_is_ip(const char *name)
{
    unsigned char ip[16];
    return inet_pton(AF_INET, name, ip) == 1 || inet_pton(AF_INET6, name, ip) == 1;
}

/* Sets what the server's certificate must match (and the SNI name) before
 * the client's handshake. */
static int ft_set_peer_name(fiber_tls_t *t, const char *name)
{
    if (ft_is_ip(name))
        return X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), name) == 1 ? 0 : -1;
    if (SSL_set_tlsext_host_name(t->ssl, name) != 1 || SSL_set1_host(t->ssl, name) != 1)
        return -1;
    return 0;
}

int fiber_tls_connect(fiber_tls_t *t, const char *server_name, int timeout_ms)
{
    if (t == NULL || ft_enter(t, timeout_ms, FT_NEW, FT_NEW) != 0)
        return -1;
    if (server_name != NULL && *server_name != '\0' && ft_set_peer_name(t, server_name) != 0) {
        ERR_clear_error();
        t->err = ASYNC_E_NOMEM;
        return -1;
    }
    SSL_set_connect_state(t->ssl);
    return ft_change(t, FT_HANDSHAKE, FT_OPEN, timeout_ms);
}

ssize_t fiber_tls_read(fiber_tls_t *t, void *buf, size_t n, int timeout_ms)
{
    size_t done;
    if (t == NULL)
        return -1;
    if (buf == NULL && n > 0) {
        t->err = ASYNC_E_INVAL;
        return -1;
    }
    if (ft_enter(t, timeout_ms, FT_OPEN, FT_SENT_CLOSE) != 0)
        return -1;
    if (n == 0)
        return 0;
    if (ft_run(t, FT_READ, buf, n, &done, timeout_ms) < 0)
        return -1;
    return (ssize_t)done;
}

ssize_t fiber_tls_write(fiber_tls_t *t, const void *buf, size_t n, int timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? -1 : ft_now_ms() + timeout_ms;
    size_t sent = 0;
    if (t == NULL)
        return -1;
    if ((buf == NULL && n > 0) || n > SSIZE_MAX) {
        t->err = ASYNC_E_INVAL;
        return -1;
    }
    if (ft_enter(t, timeout_ms, FT_OPEN, FT_OPEN) != 0)
        return -1;
    /* partial writes are on: each step sends at least one record */
    while (sent < n) {
        size_t done;
        if (ft_run(t, FT_WRITE, (char *)buf + sent, n - sent, &done, ft_left(deadline)) < 0)
            return -1;
        sent += done;
    }
    return (ssize_t)n;
}

int fiber_tls_shutdown(fiber_tls_t *t, int timeout_ms)
{
    if (t == NULL || ft_enter(t, timeout_ms, FT_OPEN, FT_OPEN) != 0)
        return -1;
    return ft_change(t, FT_SHUTDOWN, FT_SENT_CLOSE, timeout_ms);
}

/* ---- a self-signed certificate, for tests and local development --------------- */

/* Adds host as the certificate's subjectAltName (IP or DNS entry). */
static int ft_add_san(X509 *cert, const char *host)
{
    char value[300];
    X509_EXTENSION *ext;
    X509V3_CTX v3;
    int ok;
    if (snprintf(value, sizeof value, "%s:%s", ft_is_ip(host) ? "IP" : "DNS", host) >= (int)sizeof value)
        return -1;
    X509V3_set_ctx(&v3, cert, cert, NULL, NULL, 0);
    ext = X509V3_EXT_conf_nid(NULL, &v3, NID_subject_alt_name, value);
    if (ext == NULL)
        return -1;
    ok = X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
    return ok == 1 ? 0 : -1;
}

/* A P-256 key. */
static EVP_PKEY *ft_new_key(void)
{
    EVP_PKEY *key = NULL;
    EVP_PKEY_CTX *kc = EVP_PKEY_CTX_new_id(EVP_PKEY_EC, NULL);
    if (kc == NULL)
        return NULL;
    if (EVP_PKEY_keygen_init(kc) != 1 || EVP_PKEY_CTX_set_ec_paramgen_curve_nid(kc, NID_X9_62_prime256v1) != 1 ||
        EVP_PKEY_keygen(kc, &key) != 1)
        key = NULL;
    EVP_PKEY_CTX_free(kc);
    return key;
}

int fiber_tls_self_signed(const char *host, int days, EVP_PKEY **key, X509 **cert)
{
    EVP_PKEY *k = NULL;
    X509 *c = NULL;
    X509_NAME *name;
    if (host == NULL || *host == '\0' || strlen(host) > 253 || days < 1 || key == NULL || cert == NULL)
        return -1;
    k = ft_new_key();
    c = X509_new();
    if (k == NULL || c == NULL || X509_set_version(c, 2) != 1 ||
        ASN1_INTEGER_set(X509_get_serialNumber(c), (long)(ft_now_ms() & 0x7fffffff)) != 1 ||
        X509_gmtime_adj(X509_getm_notBefore(c), -3600) == NULL ||
        X509_gmtime_adj(X509_getm_notAfter(c), (long)days * 86400) == NULL || X509_set_pubkey(c, k) != 1)
        goto fail;
    name = X509_get_subject_name(c);
    if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)host, -1, -1, 0) != 1 ||
        X509_set_issuer_name(c, name) != 1 || ft_add_san(c, host) != 0 || X509_sign(c, k, EVP_sha256()) <= 0)
        goto fail;
    *key = k;
    *cert = c;
    return 0;
fail:
    ERR_clear_error();
    X509_free(c);
    EVP_PKEY_free(k);
    return -1;
}
