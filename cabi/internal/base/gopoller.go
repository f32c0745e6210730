package base

/*
#include "base.h"
*/
import "C"

import (
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/libasync/libasync/internal/nofile"
)

// Go's runtime starts its own network poller (on Linux an epoll descriptor
// and an eventfd) lazily, with the first timer in its heap, and cannot fail
// that step softly: the process aborts ("runtime: netpollinit failed"). The
// garbage collector's scavenger sets such a timer after a collection, so a
// host that runs at its RLIMIT_NOFILE limit could see the process abort long
// after every libasync call had returned. StartGoPoller starts the poller
// first, while libasync can still say no.
//
// Not at package init: in a c-shared library that runs on Go's own thread,
// concurrently with the host's main, which may be taking every free
// descriptor at that moment. Two descriptors were reserved by a C
// constructor while the library loaded (fdreserve.c); StartGoPoller gives
// them back and starts the poller at once, on the thread of the host's first
// async_runtime_init, which is inside libasync then and takes no descriptor
// in between. If loading found none free (a dlopen at the limit), or another
// host thread took them, the runtime's creation fails with ASYNC_E_SYS
// (EMFILE) and the next one tries again.
var (
	pollerMu sync.Mutex
	pollerUp atomic.Bool
)

// StartGoPoller makes Go start its poller if it has not yet; it returns the
// errno (EMFILE, ENFILE) when the two descriptors the poller needs are not
// free, and then leaves it unstarted.
func StartGoPoller() error {
	if pollerUp.Load() {
		return nil
	}
	pollerMu.Lock()
	defer pollerMu.Unlock()
	if pollerUp.Load() {
		return nil
	}
	if C.la_fd_reserve_release() < 2 {
		if e := C.la_fd_probe(2); e != 0 {
			return syscall.Errno(e)
		}
	}
	time.AfterFunc(time.Hour, func() {}).Stop()
	pollerUp.Store(true)
	atomic.StoreInt32((*int32)(unsafe.Pointer(&C.la_go_poller_up)), 1)
	return nil
}

// la_go_start_poller is StartGoPoller for the C half: the first
// async_sched_create, async_queue_create and async_worker_create start the
// poller too (best effort, la_ensure_go_poller), so that a host that never
// makes a runtime is covered as well.
//
//export la_go_start_poller
func la_go_start_poller() (rc C.int) {
	defer func() {
		if recover() != nil {
			rc = C.int(syscall.EINVAL)
		}
	}()
	if err := StartGoPoller(); err != nil {
		if e, ok := err.(syscall.Errno); ok {
			return C.int(e)
		}
		return C.int(syscall.EINVAL)
	}
	return 0
}

// Go's syscall package raised RLIMIT_NOFILE while it initialized, unless
// internal/nofile kept it from doing so: put the host's limit back (this
// package is initialized after syscall).
func init() { nofile.Restore() }
