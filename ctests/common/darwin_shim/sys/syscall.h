/* darwin_shim.h's stand-in for Linux's <sys/syscall.h> (not in the macOS
 * headers zig carries): the numbers the tests use, and syscall(2), which
 * darwin deprecates. Calls fail with ENOSYS. */
#ifndef LA_DARWIN_SHIM_SYSCALL_H
#define LA_DARWIN_SHIM_SYSCALL_H
#include <errno.h>
#define SYS_tgkill (-1)
#define __NR_seccomp (-1)
static inline long la_shim_syscall(long n, ...) {
    (void)n;
    errno = ENOSYS;
    return -1;
}
#define syscall la_shim_syscall
#endif
