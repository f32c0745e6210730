/*
 * fiber_tls.h — TLS through OpenSSL (1.1.1 or 3.x; tested with 3.0) over a
 * socket, on libasync fibers or plain threads.
 *
 * A module an application can copy (fiber_tls.h + fiber_tls.c; link
 * OpenSSL's libssl and libcrypto). libasync itself never uses OpenSSL.
 *
 * The pattern: every OpenSSL call is made with the socket never blocking;
 * when OpenSSL says SSL_ERROR_WANT_READ or SSL_ERROR_WANT_WRITE the caller
 * parks in async_fiber_wait_fd (a plain thread blocks in poll(2)) for the
 * time left of the call's timeout, then makes the call again. The park
 * happens only between OpenSSL calls: a fiber may resume on another worker
 * thread, and OpenSSL keeps an error queue per thread, so each OpenSSL call
 * clears it first and reads its result (SSL_get_error, the error's reason)
 * right after, on the same thread. The socket I/O itself is recv/send with
 * MSG_DONTWAIT (MSG_NOSIGNAL: a closed peer is never a SIGPIPE), so the fd's
 * own flags are left as they are.
 *
 * Use:
 *   fiber_tls_t *t = fiber_tls_create(ctx, fd);
 *   if (t && fiber_tls_accept(t, 10000) == 0) {
 *       ssize_t n = fiber_tls_read(t, buf, sizeof buf, 30000);
 *       ... fiber_tls_write(t, reply, len, 30000) ...
 *       fiber_tls_shutdown(t, 1000);
 *   } else if (t) {
 *       log(fiber_tls_strerror(fiber_tls_error(t)), fiber_tls_error_detail(t));
 *   }
 *   fiber_tls_destroy(t);
 *   async_fiber_close(fd);
 *
 * Errors: the calls that can fail return -1 and keep the reason in t:
 * fiber_tls_error(t) is one of libasync's codes (async.h), or
 * FIBER_TLS_E_PROTOCOL. A failure other than a read's ASYNC_E_TIMEDOUT or
 * ASYNC_E_CANCELLED leaves t broken: every later call on it but
 * fiber_tls_destroy and the error getters fails with ASYNC_E_STATE (the
 * connection is lost: a handshake or record was cut in the middle, or the
 * peer is gone); destroy t and close the fd.
 *
 * Threading: a fiber_tls_t is used by one fiber or thread at a time: an SSL
 * object is not safe for a read on one fiber and a write on another at once
 * (a request/response protocol reads and writes in turn on one fiber).
 * Different fiber_tls_t may share one SSL_CTX and run on any threads or
 * fibers at once. Each call but create, destroy and the getters may park
 * (block a plain thread).
 *
 * Stack: a handshake with OpenSSL 3.0 (P-256 or RSA 4096 certificates) fits
 * in 16 KiB of fiber stack; libasync's default of 64 KiB leaves the rest to
 * the application.
 */
#ifndef FIBER_TLS_H
#define FIBER_TLS_H

#include <stddef.h>
#include <sys/types.h>

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "async.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The TLS protocol failed: the peer is not speaking TLS, or no protocol
 * version, cipher or group both sides accept, a certificate that does not
 * verify or does not match the name given to fiber_tls_connect, a record
 * that does not decrypt, an alert from the peer. fiber_tls_error_detail
 * says which (OpenSSL's reason). Far above libasync's own codes. */
#define FIBER_TLS_E_PROTOCOL 1000

typedef struct fiber_tls fiber_tls_t;

/* A TLS endpoint over the connected stream socket fd, with ctx's settings
 * (certificate, verification, versions). ctx may be freed by the caller
 * afterwards (OpenSSL counts its references). fd is not owned: it stays open
 * after fiber_tls_destroy, and the caller closes it (async_fiber_close for
 * a descriptor a scheduler owns). Returns NULL when ctx is NULL, fd < 0,
 * or OpenSSL is out of memory. Never parks. */
fiber_tls_t *fiber_tls_create(SSL_CTX *ctx, async_fd_t fd);

/* The server's handshake (the peer connects): waits for the ClientHello,
 * answers, and returns 0 once the handshake is complete, or -1. timeout_ms
 * bounds the whole call (-1: none; 0: only what can be done without
 * waiting). Errors (fiber_tls_error): ASYNC_E_INVAL (timeout_ms < -1),
 * ASYNC_E_STATE (not a new endpoint), ASYNC_E_TIMEDOUT (timeout_ms, or the
 * fiber's deadline), ASYNC_E_CANCELLED (the fiber or its scope was
 * cancelled, or its scheduler shuts down), ASYNC_E_CLOSED (the peer closed
 * or reset the connection), FIBER_TLS_E_PROTOCOL, and the
 * errors of async_fiber_wait_fd (ASYNC_E_BADFD, ASYNC_E_BUSY; ASYNC_E_CLOSED
 * when the owned fd is closed with async_fiber_close meanwhile),
 * ASYNC_E_SYS (another socket error; errno is not kept). Parks. */
int fiber_tls_accept(fiber_tls_t *t, int timeout_ms);

/* The client's handshake. server_name (may be NULL): a host name is sent as
 * SNI and is the name the server's certificate must match when ctx verifies
 * the peer (SSL_VERIFY_PEER; the match is OpenSSL's X509_check_host); a
 * numeric IPv4 or IPv6 address is not sent (SNI takes names only) and the
 * certificate must match that address instead. Errors: as fiber_tls_accept,
 * and ASYNC_E_NOMEM (server_name could not be stored). Parks. */
int fiber_tls_connect(fiber_tls_t *t, const char *server_name, int timeout_ms);

/* Reads up to n decrypted bytes: at least 1, as soon as some are there
 * (what a record holds is returned across calls); 0 when the peer ended
 * the TLS stream with close_notify (and for n 0). timeout_ms bounds the
 * whole call. A peer that closes the socket without close_notify, even
 * between two records, is ASYNC_E_CLOSED: a truncated stream, never taken
 * for a clean end. ASYNC_E_TIMEDOUT and ASYNC_E_CANCELLED keep t usable:
 * a record that was partly received stays buffered and the next read goes
 * on with it. Errors: ASYNC_E_INVAL (buf NULL with n > 0, timeout_ms < -1),
 * ASYNC_E_STATE (no handshake yet, or t is broken), ASYNC_E_TIMEDOUT,
 * ASYNC_E_CANCELLED, ASYNC_E_CLOSED, FIBER_TLS_E_PROTOCOL, and those of
 * async_fiber_wait_fd. Parks. */
ssize_t fiber_tls_read(fiber_tls_t *t, void *buf, size_t n, int timeout_ms);

/* Encrypts and sends all n bytes (returns n) or fails, with t broken (how
 * much reached the peer is not told). timeout_ms bounds the whole call.
 * Errors: as fiber_tls_read (ASYNC_E_STATE also after fiber_tls_shutdown).
 * Parks. */
ssize_t fiber_tls_write(fiber_tls_t *t, const void *buf, size_t n, int timeout_ms);

/* Sends close_notify (the end of this side's stream; a close_notify of the
 * peer is not waited for: fiber_tls_read returns 0 when it comes) and
 * returns 0, or -1. Later writes fail with ASYNC_E_STATE; reads go on.
 * Errors: as fiber_tls_write. Parks. */
int fiber_tls_shutdown(fiber_tls_t *t, int timeout_ms);

/* Frees t (NULL: nothing) without sending anything; the fd stays open. */
void fiber_tls_destroy(fiber_tls_t *t);

/* The code of t's last failed call (0 if none failed; ASYNC_E_INVAL for
 * t NULL). */
int fiber_tls_error(const fiber_tls_t *t);

/* OpenSSL's words for t's last FIBER_TLS_E_PROTOCOL failure, e.g.
 * "certificate verify failed: self-signed certificate" or "wrong version
 * number"; "" for the other codes. Valid until the next call on t. */
const char *fiber_tls_error_detail(const fiber_tls_t *t);

/* A static English description of a code: FIBER_TLS_E_PROTOCOL's, else
 * async_strerror's. */
const char *fiber_tls_strerror(int code);

/* The OpenSSL object, for what this module does not wrap (the peer's
 * certificate, the ALPN protocol chosen, the version). Do not read or
 * write through it. NULL for t NULL. */
SSL *fiber_tls_ssl(fiber_tls_t *t);

/* For tests and local development: a new P-256 key and a self-signed
 * certificate for host (CN and subjectAltName; a numeric IPv4 or IPv6
 * address becomes an IP entry, anything else a DNS entry), valid from one
 * hour ago for days days. Returns 0 and sets *key and *cert (free them with
 * EVP_PKEY_free and X509_free), or -1 (host NULL or empty, days < 1, or
 * OpenSSL failed). Never parks (it computes for a fraction of a ms). */
int fiber_tls_self_signed(const char *host, int days, EVP_PKEY **key, X509 **cert);

#ifdef __cplusplus
}
#endif

#endif /* FIBER_TLS_H */
