//go:build windows

package rt

/*
#include <stdint.h>
*/
import "C"

import "github.com/libasync/libasync/libasync"

// la_go_rt_wakeup is async_runtime_wakeup on Windows. There the doorbell is
// an I/O completion port (port.DoorbellIOCP), and no signal handler runs on
// an interrupted thread, so the C shim calls Go instead of writing a
// descriptor itself; the IOCP poller coalesces wakeups.
//
//export la_go_rt_wakeup
func la_go_rt_wakeup(h C.uint64_t) (rc C.int) {
	defer guard(&rc)
	o := getRuntime(h)
	if o == nil {
		return C.int(libasync.EBadHandle)
	}
	return code(o.rt.Wakeup())
}
