// Package fiber is the C fiber layer of cabi: the M:N scheduler (sched.c,
// sched_idle.c, sched_fibers.c), its context switch (switch_<arch>.S), stacks (stacks.c; the overflow report's
// text in stack_report.c), fault signals
// (signals.c), fiber fds (io.c, io_sys.c, io_park.c, io_owned.c, io_api.c), the buffered reader (reader.c), channels (chan.c), mutexes and condition
// variables (sync.c), fiber-local storage (fls.c), debugging tools (tools.c, stall.c)
// and the blocking pool (blocking.c). Every public async_sched_*, async_fiber_*,
// async_chan_*, async_mutex_* and async_cond_* function is here. Windows has its
// own switch (switch_windows_amd64.S), stacks (stacks_windows.c), overflow
// handler (signals_windows.c), poller (poller_windows.c: IOCP + AFD polls) and
// socket I/O (io_windows.c).
// It has no Go code: Go never runs on a fiber stack (see la_call_off_fiber).
package fiber

/*
#cgo CFLAGS: -I${SRCDIR}/../base -I${SRCDIR}/../../../include -O2 -Wall
#cgo windows LDFLAGS: -lsynchronization
*/
import "C"

import _ "github.com/libasync/libasync/cabi/internal/base" // handles, errors
