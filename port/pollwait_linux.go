//go:build linux

package port

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// pollWait is poll(2) that keeps Go's preemption signal out of the wait
// (see waitMask). It calls ppoll directly: x/sys/unix.Ppoll passes a sigset
// size of 0, which the kernel rejects with EINVAL when a mask is given.
func pollWait(fds []unix.PollFd, timeoutMs int) (int, error) {
	if timeoutMs == 0 {
		return unix.Poll(fds, 0)
	}
	ts := waitTimespec(timeoutMs)
	var set unix.Sigset_t
	var p unsafe.Pointer
	if len(fds) > 0 {
		p = unsafe.Pointer(&fds[0])
	}
	r, _, e := unix.Syscall6(unix.SYS_PPOLL, uintptr(p), uintptr(len(fds)), uintptr(unsafe.Pointer(ts)),
		uintptr(unsafe.Pointer(waitMask(&set))), kernelSigsetSize, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
