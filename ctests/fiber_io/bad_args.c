/* Fiber I/O calls with bad arguments: every call on a descriptor that is not
 * open (negative, closed, far above RLIMIT_NOFILE, INT_MAX) fails at once
 * with ASYNC_E_BADFD, and bad buffers or lengths never crash nor read bytes
 * from beyond the buffer, on a fiber and on a plain thread. */
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "check.h"
#include "net.h"

/* ---- bad descriptors ------------------------------------------------------- */

/* Every call on a descriptor that is not open (negative, closed, far above
 * RLIMIT_NOFILE, INT_MAX) fails at once with ASYNC_E_BADFD, on a fiber and
 * on a plain thread, with any timeout. */
static void bad_fd_calls(int fd, const char *where) {
    char b[4];
    struct sockaddr_in sa = refused_addr();
    int tmos[] = {0, 50, -1};
    for (int i = 0; i < 3; i++) {
        int t = tmos[i];
        async_clear_error();
        ssize_t r = async_fiber_read(fd, b, sizeof b, t);
        if (r != -1 || async_last_error() != ASYNC_E_BADFD)
            fprintf(stderr, "%s read fd %d t %d -> %zd err %d\n", where, fd, t, r, async_last_error());
        CHECK(r == -1);
        CHECK_ERR(ASYNC_E_BADFD);
        CHECK_FAIL(async_fiber_write(fd, "x", 1, t) == -1, ASYNC_E_BADFD);
        CHECK_FAIL(async_fiber_wait_fd(fd, ASYNC_EVENT_READ, t) == -1, ASYNC_E_BADFD);
        CHECK_FAIL(async_fiber_wait_fd(fd, ASYNC_EVENT_WRITE, t) == -1, ASYNC_E_BADFD);
        CHECK_FAIL(async_fiber_accept(fd, NULL, NULL, t) == -1, ASYNC_E_BADFD);
        CHECK_FAIL(async_fiber_connect(fd, (struct sockaddr *)&sa, sizeof sa, t) == -1, ASYNC_E_BADFD);
        /* n 0 on a closed fd: "returns 0 at once if fd is open" */
        CHECK_FAIL(async_fiber_read(fd, b, 0, t) == -1, ASYNC_E_BADFD);
        CHECK_FAIL(async_fiber_write(fd, b, 0, t) == -1, ASYNC_E_BADFD);
    }
}

static int bad_fds[5];

static void bad_fd_fiber(void *arg) {
    (void)arg;
    for (int i = 0; i < 5; i++) bad_fd_calls(bad_fds[i], "fiber");
}

CASE(bad_fds) { // uring adversarial
    struct rlimit rl;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    int hi = fcntl(0, F_DUPFD_CLOEXEC, 900); /* far above what the schedulers take */
    CHECK(hi >= 900);
    close(hi);
    bad_fds[0] = -1;
    bad_fds[1] = hi; /* closed */
    bad_fds[2] = rl.rlim_cur < (1 << 20) ? (int)rl.rlim_cur + 7 : (1 << 20) + 7;
    bad_fds[3] = INT_MAX;
    bad_fds[4] = INT_MIN;
    async_sched_t *s = sched_new(2);
    on_fiber(s, bad_fd_fiber, NULL);
    for (int i = 0; i < 5; i++) bad_fd_calls(bad_fds[i], "thread");
    async_sched_destroy(s);
}

/* ---- bad arguments: never a crash, never bytes from beyond the buffer ---------------- */

static void badargs_body(void *arg) {
    (void)arg;
    int sp[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    int p[2];
    CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    char b[8] = "abcdefg";
    int fds[2] = {sp[0], p[1]};
    for (int i = 0; i < 2; i++) {
        int fd = fds[i];
        /* n beyond SSIZE_MAX: the result could not be returned */
        CHECK_FAIL(async_fiber_write(fd, b, (size_t)SSIZE_MAX + 1, 100) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_write(fd, b, SIZE_MAX, 100) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_write(fd, NULL, 4, 100) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_wait_fd(fd, 0, 100) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_wait_fd(fd, 0x80000000u, 100) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_write(fd, b, 1, -2) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_write(fd, b, 1, INT_MIN) == -1, ASYNC_E_INVAL);
    }
    int rfds[2] = {sp[1], p[0]};
    CHECK_EQ(write(sp[0], "x", 1), 1);
    CHECK_EQ(write(p[1], "x", 1), 1);
    for (int i = 0; i < 2; i++) {
        int fd = rfds[i];
        CHECK_FAIL(async_fiber_read(fd, b, (size_t)SSIZE_MAX + 1, 100) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_read(fd, NULL, 4, 100) == -1, ASYNC_E_INVAL);
        CHECK_FAIL(async_fiber_read(fd, b, 1, -2) == -1, ASYNC_E_INVAL);
        /* the byte is still there */
        CHECK_EQ(async_fiber_read(fd, b, 8, 1000), 1);
    }
    CHECK_FAIL(async_fiber_connect(sp[0], NULL, 16, 100) == -1, ASYNC_E_INVAL);
    close_pair(sp);
    close_pair(p);
}

CASE(badargs_fiber) { on_new_sched(2, badargs_body); } // uring adversarial

CASE(badargs_thread) { badargs_body(NULL); } // adversarial

TEST_MAIN()
