/* Fiber I/O on descriptors that are not stream sockets: regular files,
 * /dev/null, directories, eventfds (also one at its maximum, whose write must
 * park), ptys (also one whose other side is gone), pipes, SCM_RIGHTS
 * ancillary data on a unix stream (a read stops there; no read may then
 * park), and a file whose O_NONBLOCK was taken away behind the library's
 * back. On fibers and on plain threads; every wait is bounded. */
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <termios.h>

#include "check.h"
#include "net.h"

/* A regular file, /dev/null, an eventfd: never "not ready"; a directory:
 * read fails (EISDIR) without hanging. The same answers on a fiber and on a
 * plain thread. */
static void kinds_body(void *arg) {
    (void)arg;
    char path[] = "/tmp/libasync-test-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    CHECK_EQ(async_fiber_write(fd, "hello", 5, 1000), 5);
    CHECK_EQ(lseek(fd, 0, SEEK_SET), 0);
    char b[16];
    CHECK_EQ(async_fiber_read(fd, b, sizeof b, 1000), 5);
    CHECK(memcmp(b, "hello", 5) == 0);
    CHECK_EQ(async_fiber_read(fd, b, sizeof b, 1000), 0); /* end of file */
    CHECK_EQ(async_fiber_read(fd, b, sizeof b, -1), 0);
    /* a regular file is always ready (poll(2) says so) */
    int ev = async_fiber_wait_fd(fd, ASYNC_EVENT_READ | ASYNC_EVENT_WRITE, 1000);
    if (ev < 0) fprintf(stderr, "wait_fd(regular file) -> err %d\n", async_last_error());
    CHECK(ev >= 0);
    CHECK(ev & ASYNC_EVENT_READ);
    close(fd);

    int dn = open("/dev/null", O_RDWR | O_CLOEXEC);
    CHECK(dn >= 0);
    CHECK_EQ(async_fiber_read(dn, b, sizeof b, 1000), 0);
    CHECK_EQ(async_fiber_write(dn, "abc", 3, 1000), 3);
    ev = async_fiber_wait_fd(dn, ASYNC_EVENT_WRITE, 1000);
    if (ev < 0) fprintf(stderr, "wait_fd(/dev/null) -> err %d\n", async_last_error());
    CHECK(ev >= 0 && (ev & ASYNC_EVENT_WRITE));
    close(dn);

#if defined(__linux__) /* eventfd */
    int e = eventfd(0, EFD_CLOEXEC);
    CHECK(e >= 0);
    uint64_t one = 1, got = 0;
    CHECK_FAIL(async_fiber_read(e, &got, sizeof got, 20) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(async_fiber_write(e, &one, sizeof one, 1000), 8);
    CHECK_EQ(async_fiber_read(e, &got, sizeof got, 1000), 8);
    CHECK_EQ(got, 1);
    close(e);
#endif

    int d = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(d >= 0);
    async_clear_error();
    ssize_t r = async_fiber_read(d, b, sizeof b, 200);
    int er = async_last_error();
    printf("read(directory) -> %zd err %d (%s)\n", r, er, async_strerror(er));
    CHECK(r == -1);
    CHECK(er != ASYNC_E_TIMEDOUT); /* it is never "not ready" */
    async_clear_error();
    ev = async_fiber_wait_fd(d, ASYNC_EVENT_READ, 200);
    er = async_last_error();
    printf("wait_fd(directory) -> %d err %d (%s)\n", ev, er, async_strerror(er));
    CHECK(ev >= 0 || er != ASYNC_E_TIMEDOUT);
    close(d);
}

CASE(fd_kinds_fiber) { on_new_sched(2, kinds_body); } // uring adversarial

CASE(fd_kinds_thread) { kinds_body(NULL); } // adversarial

/* Fills socket and pipe buffers. */
static char bigbuf[8 << 20];

/* ---- O_NONBLOCK taken away behind the library's back, or a fresh blocking
 * file on a number the library made non-blocking before: a read with a
 * timeout never blocks the worker -------------------------------------------------------------- */

static atomic_int nb_done;

static void nb_body(void *arg) {
    (void)arg;
    char b[4];
    for (int round = 0; round < 3; round++) {
        int p[2];
        CHECK_EQ(pipe2(p, O_CLOEXEC), 0); /* blocking */
        CHECK_EQ(write(p[1], "a", 1), 1);
        CHECK_EQ(async_fiber_read(p[0], b, sizeof b, 1000), 1); /* now O_NONBLOCK */
        if (round == 1) {
            /* the host clears it */
            int fl = fcntl(p[0], F_GETFL);
            CHECK_EQ(fcntl(p[0], F_SETFL, fl & ~O_NONBLOCK), 0);
        }
        if (round == 2) {
            /* the number gets a new, blocking pipe */
            int q[2];
            CHECK_EQ(pipe2(q, O_CLOEXEC), 0);
            CHECK_EQ(dup2(q[0], p[0]), p[0]);
            close(q[0]);
            close(p[1]);
            p[1] = q[1];
        }
        CHECK_FAIL(async_fiber_read(p[0], b, sizeof b, 100) == -1, ASYNC_E_TIMEDOUT);
        CHECK_FAIL(async_fiber_wait_fd(p[0], ASYNC_EVENT_READ, 50) == -1, ASYNC_E_TIMEDOUT);
        /* and the write side: a full pipe made blocking again */
        int fl = fcntl(p[1], F_GETFL);
        CHECK_EQ(fcntl(p[1], F_SETFL, fl | O_NONBLOCK), 0);
        while (write(p[1], bigbuf, 65536) > 0) {
        }
        CHECK_EQ(fcntl(p[1], F_SETFL, fl & ~O_NONBLOCK), 0);
        CHECK_FAIL(async_fiber_write(p[1], "z", 1, 100) == -1, ASYNC_E_TIMEDOUT);
        close_pair(p);
    }
    atomic_store(&nb_done, 1);
}

static void *nb_thread(void *arg) {
    nb_body(arg);
    return NULL;
}

CASE(nonblock_lost) { // uring adversarial
    async_sched_t *s = sched_new(1);
    CHECK(async_fiber_spawn(s, nb_body, NULL, 0) != NULL);
    double t0 = now_ms();
    while (!atomic_load(&nb_done)) {
        if (now_ms() - t0 > 10000) {
            fprintf(stderr, "a fiber read blocked its worker (O_NONBLOCK gone)\n");
            _exit(1);
        }
        sleep_ms(5);
    }
    async_sched_destroy(s);
    atomic_store(&nb_done, 0);
    pthread_t th;
    start_thread(&th, nb_thread, NULL);
    join_within(th, 10000, "plain-thread read with O_NONBLOCK gone");
}

static atomic_int nk_done;

/* eventfd, pty, pipe EPIPE on a fiber and on a plain thread */
static void misc_fds_body(void *arg)
{
    (void)arg;
    uint64_t v = 5, got = 0;
    int efd = eventfd(0, EFD_CLOEXEC);
    CHECK(efd >= 0);
    CHECK_EQ(async_fiber_write(efd, &v, 8, BOUND_MS), 8);
    CHECK_EQ(async_fiber_read(efd, &got, 8, BOUND_MS), 8);
    CHECK_EQ(got, 5);
    CHECK(async_fiber_read(efd, &got, 8, 1) < 0);
    CHECK_ERR(ASYNC_E_TIMEDOUT);
    close(efd);

    int p[2];
    CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    close(p[0]);
    CHECK(async_fiber_write(p[1], "x", 1, BOUND_MS) < 0);
    CHECK_ERR(ASYNC_E_CLOSED);
    sigset_t pend;
    sigpending(&pend);
    CHECK(!sigismember(&pend, SIGPIPE));
    close(p[1]);

    int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (m >= 0 && grantpt(m) == 0 && unlockpt(m) == 0) {
        char *name = ptsname(m);
        int sl = name ? open(name, O_RDWR | O_NOCTTY | O_CLOEXEC) : -1;
        if (sl >= 0) {
            struct termios t;
            char buf[16];
            CHECK_EQ(tcgetattr(sl, &t), 0);
            cfmakeraw(&t);
            CHECK_EQ(tcsetattr(sl, TCSANOW, &t), 0);
            CHECK_EQ(async_fiber_write(m, "ptyok", 5, BOUND_MS), 5);
            size_t tot = 0;
            while (tot < 5) {
                ssize_t n = async_fiber_read(sl, buf + tot, sizeof buf - tot, BOUND_MS);
                CHECK(n > 0);
                tot += (size_t)n;
            }
            CHECK(memcmp(buf, "ptyok", 5) == 0);
            close(sl);
        }
    }
    if (m >= 0)
        close(m);
    atomic_fetch_add(&nk_done, 1);
}

CASE(eventfd_pty_pipe_fiber) // uring adversarial
{
    async_sched_t *s = sched_new(2);
    atomic_store(&nk_done, 0);
    CHECK(async_fiber_spawn(s, misc_fds_body, NULL, 0) != NULL);
    wait_count(&nk_done, 1, "misc fds fiber");
    sched_finish(s, BOUND_MS);
}

CASE(eventfd_pty_pipe_plain) // adversarial
{
    atomic_store(&nk_done, 0);
    misc_fds_body(NULL);
}

/* ---- a Unix stream read stops at ancillary data: no read may then park ---- */

static int sc_fd[2];

static atomic_int sc_done;

static void sc_reader(void *arg)
{
    (void)arg;
    char buf[100];
    size_t tot = 0;
    while (tot < 9) {
        ssize_t n = async_fiber_read(sc_fd[1], buf + tot, sizeof buf - tot, BOUND_MS);
        CHECK(n > 0);
        tot += (size_t)n;
    }
    CHECK(memcmp(buf, "abcdefghi", 9) == 0);
    atomic_fetch_add(&sc_done, 1);
}

static void send_with_fd(int sock, const char *data, size_t n, int fd)
{
    struct iovec iov = {(void *)data, n};
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr m;
    memset(&m, 0, sizeof m);
    memset(&u, 0, sizeof u);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = u.b;
    m.msg_controllen = sizeof u.b;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    CHECK_EQ(sendmsg(sock, &m, 0), (ssize_t)n);
}

static void scm_case(int owned, int busy)
{
    async_sched_t *s = sched_new(2);
    int extra = open("/dev/null", O_RDONLY | O_CLOEXEC);
    CHECK(extra >= 0);
    atomic_store(&sc_done, 0);
    if (busy)
        busy_start(s, 2);
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sc_fd), 0);
    own_if(s, sc_fd[1], owned);
    CHECK_EQ(write(sc_fd[0], "abc", 3), 3);
    send_with_fd(sc_fd[0], "def", 3, extra);
    send_with_fd(sc_fd[0], "ghi", 3, extra);
    CHECK(async_fiber_spawn(s, sc_reader, NULL, 0) != NULL);
    wait_count(&sc_done, 1, "reader across ancillary data");
    atomic_store(&busy_stop, 1);
    sched_finish(s, BOUND_MS);
    close_pair(sc_fd);
    close(extra);
}

CASE(scm_rights_owned) { scm_case(1, 0); } // uring adversarial

CASE(scm_rights_owned_busy) { scm_case(1, 1); } // uring adversarial

CASE(scm_rights_plain) { scm_case(0, 1); } // uring adversarial

/* ---- a pty whose other side is gone; an eventfd whose write must wait ---- */

static int pt_m, pt_res[4], pt_err[4];

static atomic_int pt_done;

static void pt_body(void *arg)
{
    (void)arg;
    char b[8];
    async_clear_error();
    pt_res[0] = (int)async_fiber_read(pt_m, b, sizeof b, 2000);
    pt_err[0] = async_last_error();
    async_clear_error();
    pt_res[1] = (int)async_fiber_write(pt_m, "x", 1, 2000);
    pt_err[1] = async_last_error();
    async_clear_error();
    pt_res[2] = async_fiber_wait_fd(pt_m, ASYNC_EVENT_READ, 2000);
    pt_err[2] = async_last_error();
    atomic_fetch_add(&pt_done, 1);
}

static void pty_gone(int fiber, int owned)
{
    pt_m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (pt_m < 0 || grantpt(pt_m) != 0 || unlockpt(pt_m) != 0) {
        fprintf(stderr, "no pty: skipped\n");
        return;
    }
    int sl = open(ptsname(pt_m), O_RDWR | O_NOCTTY | O_CLOEXEC);
    CHECK(sl >= 0);
    close(sl); /* hang-up */
    async_sched_t *s = sched_new(2);
    atomic_store(&pt_done, 0);
    own_if(s, pt_m, owned);
    if (fiber)
        CHECK(async_fiber_spawn(s, pt_body, NULL, 0) != NULL);
    else
        pt_body(NULL);
    wait_count(&pt_done, 1, "pty calls");
    /* the hang-up reads as end of file (Linux says EIO), as for a pipe */
    CHECK_EQ(pt_res[0], 0);
    CHECK_EQ(pt_err[0], 0);
    /* the wait returns at once with the hang-up */
    CHECK(pt_res[2] > 0 && (pt_res[2] & ASYNC_EVENT_CLOSE));
    sched_finish(s, BOUND_MS);
    close_as(pt_m, owned);
}

CASE(pty_gone_fiber) { pty_gone(1, 0); } // uring adversarial

CASE(pty_gone_owned) { pty_gone(1, 1); } // uring adversarial

CASE(pty_gone_plain) { pty_gone(0, 0); } // adversarial

static int ef_fd;

static atomic_int ef_state;

static void ef_writer(void *arg)
{
    (void)arg;
    uint64_t v = 0xfffffffffffffffeULL;
    CHECK_EQ(async_fiber_write(ef_fd, &v, 8, BOUND_MS), 8);
    atomic_store(&ef_state, 1);
    v = 1;
    CHECK_EQ(async_fiber_write(ef_fd, &v, 8, BOUND_MS), 8); /* parks: the counter is at its maximum */
    atomic_store(&ef_state, 3);
}

static void ef_reader(void *arg)
{
    (void)arg;
    uint64_t v = 0;
    atomic_store(&ef_state, 2);
    CHECK_EQ(async_fiber_read(ef_fd, &v, 8, BOUND_MS), 8);
    CHECK_EQ(v, 0xfffffffffffffffeULL);
}

static void eventfd_full(int owned)
{
    async_sched_t *s = sched_new(2);
    ef_fd = eventfd(0, EFD_CLOEXEC);
    CHECK(ef_fd >= 0);
    own_if(s, ef_fd, owned);
    atomic_store(&ef_state, 0);
    busy_start(s, 2);
    CHECK(async_fiber_spawn(s, ef_writer, NULL, 0) != NULL);
    wait_count(&ef_state, 1, "first eventfd write");
    sched_wait_parked(s, 1);
    CHECK(async_fiber_spawn(s, ef_reader, NULL, 0) != NULL);
    wait_count(&ef_state, 3, "eventfd writer after the read");
    atomic_store(&busy_stop, 1);
    sched_finish(s, BOUND_MS);
    close_as(ef_fd, owned);
}

CASE(eventfd_full_owned) { eventfd_full(1); } // uring adversarial

CASE(eventfd_full_plain) { eventfd_full(0); } // uring adversarial

TEST_MAIN()
