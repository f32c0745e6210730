/* Owned descriptors: bugs an adversarial pass (header only, "break this")
 * found in async_fiber_fd_open / async_fiber_close (docs/RELIABILITY.md,
 * "Adversarial pass 4"). Each case failed before its fix.
 *
 * This program interposes close() and send() (libasync calls them through
 * the PLT), only for the one fd a case names, to widen windows that a loaded
 * machine's preemption opens anyway. */
#include <fcntl.h>
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

/* A fiber's write on an owned fd that was running (woken, inside send())
 * when async_fiber_close dropped the ownership took a fresh look, found the
 * fd plain, parked on it the one-shot way, and the close(2) that followed
 * removed that registration: the write waited for its timeout (for ever with
 * -1). Every call now keeps the generation its first look saw; a later look
 * that finds it changed ends the call with ASYNC_E_CLOSED. */
static int wfd;
static char big[4 << 20];
static _Atomic int werr = -1;

static void big_writer(void *arg) {
    (void)arg;
    ssize_t r = async_fiber_write(wfd, big, sizeof big, 30000);
    atomic_store(&werr, r < 0 ? async_last_error() : 0);
}

static void t_close_while_running(void) {
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
        /* before: the write ended only at its 30 s timeout */
        CHECK_EQ(async_fiber_join(f, 10000), 0);
        int e = atomic_load(&werr);
        printf("round %d: write -> %d (%s)\n", i, e, async_strerror(e));
        CHECK(e == ASYNC_E_CLOSED || e == ASYNC_E_BADFD);
        close(sv[1]);
    }
    async_sched_destroy(s);
}

/* s1 owns a number whose file was closed with close(2) (a bug the header
 * names) and reused by a new file: async_fiber_fd_open(s2, number) gave
 * ASYNC_E_EXISTS, and s1's parked reader of the old file was never woken.
 * The header promises fd_open detects that the old file is gone, from any
 * scheduler: now s2 owns the new file and s1's reader gets ASYNC_E_CLOSED. */
static int rfd;
static _Atomic int rerr = -1;

static void reader(void *arg) {
    (void)arg;
    char b[8];
    ssize_t r = async_fiber_read(rfd, b, sizeof b, 20000);
    atomic_store(&rerr, r < 0 ? async_last_error() : 0);
}

static void t_stale_other_sched(void) {
    async_sched_t *s1 = sched_new(2), *s2 = sched_new(1);
    int sv[2], nv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    rfd = sv[0];
    CHECK_EQ(async_fiber_fd_open(s1, rfd), 0);
    async_fiber_t *f = async_fiber_spawn(s1, reader, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    sched_wait_parked(s1, 1);
    CHECK_EQ(close(rfd), 0); /* behind the library's back */
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, nv), 0);
    CHECK_EQ(nv[0], rfd); /* the lowest free number: the same */
    CHECK_EQ(async_fiber_fd_open(s2, nv[0]), 0);
    CHECK_EQ(async_fiber_join(f, 10000), 0);
    CHECK_EQ(atomic_load(&rerr), ASYNC_E_CLOSED);
    /* s2 really owns it now; a third scheduler cannot take it */
    async_sched_t *s3 = sched_new(1);
    CHECK_FAIL(async_fiber_fd_open(s3, nv[0]) == -1, ASYNC_E_EXISTS);
    /* and s1 does not still own it either: s2's close works, s1 is untouched */
    CHECK_EQ(async_fiber_close(nv[0]), 0);
    close(nv[1]);
    close(sv[1]);
    async_sched_destroy(s3);
    async_sched_destroy(s1);
    async_sched_destroy(s2);
}

/* async_fiber_fd_open of a file it cannot own (a regular file: BADFD) left
 * O_NONBLOCK set on it. A failed call now leaves the file as it was. */
static void t_failed_open_keeps_flags(void) {
    async_sched_t *s = sched_new(1);
    char path[] = "/tmp/libasync-adv4-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    int before = fcntl(fd, F_GETFL);
    CHECK(!(before & O_NONBLOCK));
    CHECK_FAIL(async_fiber_fd_open(s, fd) == -1, ASYNC_E_BADFD);
    CHECK_EQ(fcntl(fd, F_GETFL), before);
    close(fd);
    async_sched_destroy(s);
}

static const test_case_t cases[] = {
    T(close_while_running), // adversarial
    T(stale_other_sched), // adversarial
    T(failed_open_keeps_flags), // adversarial
};

TEST_MAIN(cases)
