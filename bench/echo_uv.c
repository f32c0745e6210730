/*
 * TCP echo server, libuv peer: one loop, one static read buffer (alloc_cb
 * hands out the same 64 KiB every time), replies with uv_try_write; only
 * what uv_try_write cannot take right away (never seen with these sizes) is
 * copied and queued with uv_write.
 *
 * usage: echo_uv   (see echo.h)
 */
#include "echo.h"

#include <signal.h>
#include <uv.h>

static char buf[65536];

typedef struct {
    uv_write_t req;
    uv_buf_t b;
} wreq_t;

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b) {
    (void)h, (void)hint;
    *b = uv_buf_init(buf, sizeof buf);
}

static void on_close(uv_handle_t *h) { free(h); }

static void on_written(uv_write_t *req, int status) {
    wreq_t *w = (wreq_t *)req;
    if (status < 0 && !uv_is_closing((uv_handle_t *)req->handle)) uv_close((uv_handle_t *)req->handle, on_close);
    free(w->b.base);
    free(w);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
    if (n < 0) {
        uv_close((uv_handle_t *)s, on_close);
        return;
    }
    if (n == 0) return;
    uv_buf_t out = uv_buf_init(b->base, (unsigned)n);
    int w = uv_try_write(s, &out, 1);
    if (w == n) return;
    if (w < 0 && w != UV_EAGAIN) {
        uv_close((uv_handle_t *)s, on_close);
        return;
    }
    if (w < 0) w = 0;
    wreq_t *r = malloc(sizeof *r);
    r->b = uv_buf_init(malloc((size_t)(n - w)), (unsigned)(n - w));
    memcpy(r->b.base, b->base + w, (size_t)(n - w));
    uv_write(&r->req, s, &r->b, 1, on_written);
}

static void on_conn(uv_stream_t *server, int status) {
    if (status < 0) return;
    uv_tcp_t *c = malloc(sizeof *c);
    uv_tcp_init(server->loop, c);
    if (uv_accept(server, (uv_stream_t *)c) != 0) {
        uv_close((uv_handle_t *)c, on_close);
        return;
    }
    uv_tcp_nodelay(c, 1);
    uv_read_start((uv_stream_t *)c, on_alloc, on_read);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    int lfd = echo_listen();
    uv_loop_t *loop = uv_default_loop();
    uv_tcp_t server;
    uv_tcp_init(loop, &server);
    if (uv_tcp_open(&server, lfd) != 0 || uv_listen((uv_stream_t *)&server, 4096, on_conn) != 0) {
        fprintf(stderr, "echo_uv: listen failed\n");
        return 1;
    }
    return uv_run(loop, UV_RUN_DEFAULT);
}
