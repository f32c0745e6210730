//go:build linux

package port

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// waitMask returns the calling thread's signal mask with SIGURG added, for
// epoll_pwait/ppoll. Go's runtime sends SIGURG to preempt goroutines; one
// landing while a host thread sleeps in the poller would end the wait with
// EINTR, which the runtime must report as "a signal interrupted the wait"
// (hosts rely on that to check their signal flags). Blocking SIGURG for the
// length of the wait keeps EINTR for the host's own signals only; a pending
// SIGURG is handled by Go as soon as the wait returns. The host's own mask
// is kept as it is.
func waitMask(set *unix.Sigset_t) *unix.Sigset_t {
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, nil, set); err != nil {
		return nil
	}
	sig := uint(unix.SIGURG) - 1
	set.Val[sig/64] |= 1 << (sig % 64)
	return set
}

// kernelSigsetSize is the size the kernel expects for a sigset (_NSIG/8).
const kernelSigsetSize = 8

// epollPwait is epoll_pwait(2), which x/sys/unix does not wrap on Linux.
func epollPwait(epfd int, events []unix.EpollEvent, msec int, mask *unix.Sigset_t) (int, error) {
	var p unsafe.Pointer
	if len(events) > 0 {
		p = unsafe.Pointer(&events[0])
	}
	r, _, e := unix.Syscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(p), uintptr(len(events)),
		uintptr(msec), uintptr(unsafe.Pointer(mask)), kernelSigsetSize)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
