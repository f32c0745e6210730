// Package base is what every subsystem of cabi's C half shares: the handle
// table (handles.c), the last-error slot, the error texts and the fork flag
// behind the entry check LA_ENTRY (errors.c), and the Windows stand-ins for
// POSIX pieces (sys_windows.c). It calls no other package.
package base

/*
#cgo CFLAGS: -I${SRCDIR}/../../../include -O2 -Wall
#cgo windows LDFLAGS: -lws2_32 -static-libgcc -Wl,-Bstatic -lwinpthread -Wl,-Bdynamic
*/
import "C"
