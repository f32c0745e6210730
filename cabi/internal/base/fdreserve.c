/* Two descriptors kept for Go's own network poller (see gopoller.go).
 *
 * Go starts its poller (epoll_create + eventfd on Linux: two descriptors)
 * with the first Go timer, and cannot fail that step softly: the process
 * aborts ("runtime: netpollinit failed"). A host may take every free
 * descriptor at the top of main, before its first libasync call. This
 * constructor runs while the library is loaded (before main, or inside
 * dlopen), takes two descriptors, and base.StartGoPoller gives them back
 * (la_fd_reserve_release) just before it makes Go start the poller, on the
 * host's thread inside async_runtime_init, so that the lowest free numbers
 * are the ones Go's epoll_create and eventfd get.
 *
 * The release and the constructor may run in either order (Go's
 * initialization runs on a thread of its own, concurrently with later
 * constructors and main); the atomic exchange closes whatever was reserved
 * exactly once, and a reservation made after the release is closed at
 * once. The constructor never calls into Go (Go's initialization may still
 * be running; a call would wait for it). C code that runs before the release
 * (another constructor, a function of the C half such as async_queue_create,
 * or the fiber scheduler's own epoll) sees two descriptors fewer: at the
 * limit it fails as it would one descriptor later. */
#if !defined(_WIN32)
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <unistd.h>

#include "base.h"

_Atomic int la_go_poller_up;
static _Atomic int resv[2] = {-1, -1};
static atomic_int released;

/* Standard descriptors closed when the library is loaded are opened on
 * /dev/null, first (priority 101: before the unprioritised constructors of
 * this object, Go's runtime start among them), as Go's runtime does for Go
 * programs (checkfds) but not for libraries. Left closed, the lowest free
 * numbers 0-2 would go to whatever opens next: Go's initialisation thread,
 * which opens files while the host's main runs, the reservation below and
 * then Go's epoll and eventfd, the runtime's own descriptors. A host would
 * read one of them as its stdin or write its output into it, and could not
 * fill the numbers itself without racing Go's thread. */
#if defined(__APPLE__)
#define LA_CTOR_FIRST __attribute__((constructor)) /* Mach-O has no constructor priorities */
#else
#define LA_CTOR_FIRST __attribute__((constructor(101)))
#endif
LA_CTOR_FIRST static void la_fd_std_fill(void) {
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
        int n = open("/dev/null", O_RDWR); /* the lowest free number: fd */
        if (n >= 0 && n != fd) {
            dup2(n, fd);
            close(n);
        }
    }
}

/* The reservation never holds 0, 1 or 2 (were one still closed, e.g. /dev/null
 * missing): released into Go's poller, the number would become Go's epoll or
 * eventfd, which the host would then read as stdin or write its output into. */
__attribute__((constructor)) static void la_fd_reserve(void) {
    for (int i = 0; i < 2; i++) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && fd <= 2) {
            int high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
            close(fd);
            fd = high;
        }
        if (fd >= 0) atomic_store(&resv[i], fd);
    }
    if (atomic_load(&released)) la_fd_reserve_release(); /* Go was first */
}

int la_fd_reserve_release(void) {
    int n = 0;
    atomic_store(&released, 1);
    for (int i = 0; i < 2; i++) {
        int fd = atomic_exchange(&resv[i], -1);
        if (fd >= 0) {
            close(fd);
            n++;
        }
    }
    return n;
}

int la_fd_probe(int n) {
    int fds[8], k = 0, err = 0;
    if (n > 8) n = 8;
    while (k < n) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            err = errno;
            break;
        }
        fds[k++] = fd;
    }
    while (k > 0) close(fds[--k]);
    return err;
}
#else
#include "base.h"
_Atomic int la_go_poller_up;
int la_fd_reserve_release(void) { return 0; }
int la_fd_probe(int n) {
    (void)n;
    return 0;
}
#endif
