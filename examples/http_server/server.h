/*
 * server.h — the HTTP/1.1 server of the http_server example: an accept
 * loop and one fiber per connection, grouped in scopes so that a graceful
 * stop can end them in order (stop accepting, let requests in flight
 * finish, close idle connections, cancel what is left after a bound).
 */
#ifndef HTTP_SERVER_SERVER_H
#define HTTP_SERVER_SERVER_H

#include <pthread.h>
#include <stdatomic.h>

#include "async.h"
#include "http_parse.h"

typedef struct {
    const char *host;   /* numeric address to listen on (NULL: 0.0.0.0) */
    int port;           /* 0: a free port (server_start reports it) */
    int backlog;        /* <= 0: SOMAXCONN */
    int idle_ms;        /* a connection's wait for its next request head, and each body read and write */
    int drain_ms;       /* graceful stop: how long requests in flight may take before they are cancelled */
    http_limits_t limits;
    struct ssl_ctx_st *tls; /* an OpenSSL SSL_CTX with the certificate: HTTPS (built with fiber_tls only) */
} server_config_t;

struct conn;

typedef struct server {
    server_config_t cfg;
    async_sched_t *sched;
    async_fd_t lfd;            /* the listener, owned by sched */
    int port;                  /* the port it listens on */
    int spare_fd;              /* kept open to shed clients when descriptors run out */
    size_t in_cap;             /* bytes of each connection's input buffer (>= limits.max_head) */
    async_scope_t *accepting;  /* the accept loop */
    async_scope_t *conns;      /* the connection fibers */
    atomic_int stopping;       /* set once: answers say "Connection: close", idle connections end */
    atomic_int live;           /* connection fibers running */
    pthread_mutex_t mu;        /* guards the list (held for a few instructions, never across a park) */
    struct conn *list;         /* open connections, for the stop to find the idle ones */
} server_t;

/* Listens (on a fiber of sched: the listener and its connections are then
 * owned by sched) and starts the accept loop. Returns 0, or -1 with a
 * message on stderr. */
int server_start(server_t *sv, async_sched_t *sched, const server_config_t *cfg);

/* Graceful stop, on a fiber that is not one of the server's: closes the
 * listener, ends idle keep-alive connections, lets the others finish their
 * request (answered with "Connection: close") for up to cfg.drain_ms, then
 * cancels the rest and waits for them. Frees the server's scopes. */
void server_stop(server_t *sv);

#endif /* HTTP_SERVER_SERVER_H */
