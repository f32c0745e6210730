/* Windows pieces of the C half of cabi (sys_windows.c). Not installed.
 * Included by worker.c and completions.c only when _WIN32 is defined. */
#ifndef LA_SYS_WINDOWS_H
#define LA_SYS_WINDOWS_H

#include <stddef.h>
#include <stdint.h>

/* winpthreads has no PTHREAD_STACK_MIN; Windows itself has no small minimum
 * (it rounds to its allocation granularity), the worker minimum applies. */
#ifndef PTHREAD_STACK_MIN
#define PTHREAD_STACK_MIN 16384
#endif

/* A worker's stop descriptor on Windows: select()/WSAPoll() accept only
 * sockets, so it is the read end of a connected loopback TCP pair (both
 * non-blocking and not inheritable). la_win_stop_signal sends one byte, which
 * stays unread, so the read end stays readable. SOCKET values are kernel
 * handles, which fit in 31 bits; larger ones are refused. 0 or -1. */
int la_win_stop_pair(int *rfd, int *wfd);
int la_win_stop_signal(int wfd); /* send(2)'s result */
void la_win_stop_close(int rfd, int wfd);

/* Rings a runtime's doorbell, an I/O completion port (port.DoorbellIOCP):
 * posts the packet port/iocp_windows.go calls keyRing, which wakes the
 * waiter without being reported. */
void la_win_ring(int iocp);

/* The page size (GetSystemInfo). */
size_t la_win_page_size(void);

#endif
