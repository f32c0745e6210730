/*
 * TCP echo server, io_uring peer (liburing): one thread, one ring. A
 * multishot accept hands out the connections; every connection has one
 * 4 KiB buffer (as echo_async's fibers have on their stacks) and always one
 * request in flight: a recv into the buffer, then a send of what it got (the
 * rest again if the send was short), then the next recv. The loop submits
 * everything it prepared and waits for at least one completion in one
 * io_uring_submit_and_wait, then reaps every completion that is there.
 * The ring is set up single-issuer with deferred task work when the kernel
 * has it (6.1+: completions are run only when this thread waits), plain
 * otherwise.
 *
 * usage: echo_uring   (see echo.h)
 */
#include "echo.h"

#include <liburing.h>
#include <signal.h>

enum { OP_ACCEPT, OP_RECV, OP_SEND };
#define BUF 4096
#define UD(fd, op) (((uint64_t)(unsigned)(fd) << 2) | (op))

typedef struct {
    char *buf;
    unsigned len, off; /* send: bytes to echo, bytes already sent */
} conn_t;

static struct io_uring ring;
static conn_t *conns; /* by fd */
static int nconns;

static struct io_uring_sqe *sqe_get(void) {
    struct io_uring_sqe *s;
    while (!(s = io_uring_get_sqe(&ring))) io_uring_submit(&ring); /* SQ full: hand it over first */
    return s;
}

static void arm_accept(int lfd) {
    struct io_uring_sqe *s = sqe_get();
    io_uring_prep_multishot_accept(s, lfd, NULL, NULL, SOCK_CLOEXEC);
    io_uring_sqe_set_data64(s, UD(lfd, OP_ACCEPT));
}

static void arm_recv(int fd) {
    struct io_uring_sqe *s = sqe_get();
    io_uring_prep_recv(s, fd, conns[fd].buf, BUF, 0);
    io_uring_sqe_set_data64(s, UD(fd, OP_RECV));
}

static void arm_send(int fd) {
    conn_t *c = &conns[fd];
    struct io_uring_sqe *s = sqe_get();
    io_uring_prep_send(s, fd, c->buf + c->off, c->len - c->off, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(s, UD(fd, OP_SEND));
}

static void drop(int fd) {
    close(fd);
    conns[fd].len = conns[fd].off = 0; /* the buffer stays for the next connection on this number */
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    int lfd = echo_listen();
    nconns = echo_max_fds();
    conns = calloc((size_t)nconns, sizeof *conns);
    if (!conns) {
        fprintf(stderr, "echo_uring: out of memory\n");
        return 1;
    }
    /* Every connection has one request in flight: room for 16k completions
     * (the kernel keeps overflowing ones anyway, IORING_FEAT_NODROP). */
    struct io_uring_params p = {.flags = IORING_SETUP_CQSIZE | IORING_SETUP_SINGLE_ISSUER |
                                         IORING_SETUP_DEFER_TASKRUN,
                                .cq_entries = 16384};
    int err = io_uring_queue_init_params(1024, &ring, &p);
    if (err == -EINVAL) {
        p = (struct io_uring_params){.flags = IORING_SETUP_CQSIZE, .cq_entries = 16384};
        err = io_uring_queue_init_params(1024, &ring, &p);
    }
    if (err < 0) {
        fprintf(stderr, "echo_uring: io_uring_queue_init: %s\n", strerror(-err));
        return 1;
    }
    arm_accept(lfd);
    for (;;) {
        err = io_uring_submit_and_wait(&ring, 1);
        if (err < 0 && err != -EINTR && err != -EAGAIN && err != -EBUSY) {
            fprintf(stderr, "echo_uring: io_uring_submit_and_wait: %s\n", strerror(-err));
            return 1;
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            seen++;
            uint64_t ud = io_uring_cqe_get_data64(cqe);
            int fd = (int)(ud >> 2), res = cqe->res;
            switch ((int)(ud & 3)) {
            case OP_ACCEPT:
                if (!(cqe->flags & IORING_CQE_F_MORE)) arm_accept(lfd); /* multishot ended: re-arm */
                if (res < 0) {
                    if (res != -EINTR && res != -ECONNABORTED)
                        fprintf(stderr, "echo_uring: accept: %s\n", strerror(-res));
                    break;
                }
                if (res >= nconns || (!conns[res].buf && !(conns[res].buf = malloc(BUF)))) {
                    close(res);
                    break;
                }
                echo_nodelay(res);
                arm_recv(res);
                break;
            case OP_RECV:
                if (res <= 0) {
                    drop(fd); /* 0: closed by the peer; < 0: reset or error */
                    break;
                }
                conns[fd].len = (unsigned)res;
                conns[fd].off = 0;
                arm_send(fd);
                break;
            case OP_SEND:
                if (res < 0) {
                    drop(fd);
                    break;
                }
                conns[fd].off += (unsigned)res;
                if (conns[fd].off < conns[fd].len)
                    arm_send(fd); /* short send: the rest */
                else
                    arm_recv(fd);
                break;
            }
        }
        io_uring_cq_advance(&ring, seen);
    }
}
