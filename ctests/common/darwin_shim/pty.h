/* darwin_shim.h's <pty.h>: darwin declares these in <util.h>, which the
 * macOS headers zig carries lack; libSystem has both functions. */
#ifndef LA_DARWIN_SHIM_PTY_H
#define LA_DARWIN_SHIM_PTY_H
#include <sys/ioctl.h>
#include <sys/types.h>
#include <termios.h>
int openpty(int *amaster, int *aslave, char *name, struct termios *termp, struct winsize *winp);
pid_t forkpty(int *amaster, char *name, struct termios *termp, struct winsize *winp);
#endif
