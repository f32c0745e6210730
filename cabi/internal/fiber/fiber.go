// Package fiber is the C fiber layer of cabi: the M:N scheduler (sched.c),
// its context switch (switch_<arch>.S), stacks (stacks.c), fault signals
// (signals.c), fiber fds (io.c), channels (chan.c) and the blocking pool
// (blocking.c). Every public async_sched_*, async_fiber_* and async_chan_*
// function is here. Windows has its own switch (switch_windows_amd64.S),
// stacks (stacks_windows.c), overflow handler (signals_windows.c), poller
// (poller_windows.c: IOCP + AFD polls) and socket I/O (io_windows.c).
// It has no Go code: Go never runs on a fiber stack (see la_call_off_fiber).
package fiber

/*
#cgo CFLAGS: -I${SRCDIR}/../base -I${SRCDIR}/../../../include -O2 -Wall
*/
import "C"

import _ "github.com/libasync/libasync/cabi/internal/base" // handles, errors
