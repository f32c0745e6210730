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

// la_go_bind does nothing: a host thread's first call into Go binds one of
// Go's thread records to it (and sets its signal mask), and
// la_call_off_fiber makes that call on its own, between a save and a restore
// of the host's mask, before the thread's first real Go call.
//
//export la_go_bind
func la_go_bind() {}
