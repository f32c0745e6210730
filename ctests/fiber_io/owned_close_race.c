/* async_fiber_close racing a fiber's call that is running (woken, inside
 * send()) on the owned fd: the call ends with ASYNC_E_CLOSED instead of
 * parking on the number the close gives back. This program interposes
 * close() and send() (libasync calls them through the PLT), only for the one
 * fd the case names, to widen the window a loaded machine's preemption opens
 * anyway. */
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#include "check.h"

static _Atomic int slow_close_fd = -1, slow_send_fd = -1;

#if defined(__linux__) /* elsewhere (darwin, built only) the windows are not widened */

int close(int fd) {
    if (fd >= 0 && fd == atomic_load(&slow_close_fd)) usleep(20000);
    return (int)syscall(SYS_close, fd);
}

ssize_t send(int fd, const void *b, size_t n, int fl) {
    if (fd >= 0 && fd == atomic_load(&slow_send_fd)) usleep(5000);
    return syscall(SYS_sendto, fd, b, n, fl, NULL, 0);
}
#endif

/* A fiber's write on an owned fd is running (woken, inside send()) when
 * async_fiber_close drops the ownership: its next look must not find the fd
 * plain and park on it the one-shot way (the close(2) that follows removes
 * that registration, and the write would wait for its timeout, for ever with
 * -1). A call keeps the generation its first look saw; a later look that
 * finds it changed ends the call with ASYNC_E_CLOSED. */
static int wfd;

static char big[4 << 20];

static _Atomic int werr = -1;

static void big_writer(void *arg) {
    (void)arg;
    ssize_t r = async_fiber_write(wfd, big, sizeof big, 30000);
    atomic_store(&werr, r < 0 ? async_last_error() : 0);
}

CASE(owned_close_while_write_runs) { // adversarial
    async_sched_t *s = sched_new(2);
    for (int i = 0; i < 3; i++) {
        int sv[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        int z = 4096;
        CHECK_EQ(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &z, sizeof z), 0);
        wfd = sv[0];
        CHECK_EQ(async_fiber_fd_open(s, wfd), 0);
        atomic_store(&werr, -1);
        async_fiber_t *f = async_fiber_spawn(s, big_writer, NULL, ASYNC_FIBER_JOINABLE);
        CHECK(f != NULL);
        sched_wait_parked(s, 1); /* the buffer is full: parked (owned) */
        atomic_store(&slow_send_fd, wfd);
        static char sink[8192];
        CHECK(read(sv[1], sink, sizeof sink) > 0); /* room: the writer wakes, enters send() */
        usleep(1000);
        atomic_store(&slow_close_fd, wfd);
        CHECK_EQ(async_fiber_close(wfd), 0);
        atomic_store(&slow_close_fd, -1);
        atomic_store(&slow_send_fd, -1);
        /* woken by the close, not at its 30 s timeout */
        CHECK_EQ(async_fiber_join(f, 10000), 0);
        int e = atomic_load(&werr);
        printf("round %d: write -> %d (%s)\n", i, e, async_strerror(e));
        CHECK(e == ASYNC_E_CLOSED || e == ASYNC_E_BADFD);
        close(sv[1]);
    }
    async_sched_destroy(s);
}

TEST_MAIN()
