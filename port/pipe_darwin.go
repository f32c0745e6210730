//go:build darwin

package port

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// pipe2 makes a non-blocking, close-on-exec pipe. Darwin has no pipe2, so
// the fork lock keeps a concurrent fork+exec from inheriting the pipe.
func pipe2(p *[2]int) error {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	if err := unix.Pipe(p[:]); err != nil {
		return err
	}
	for _, fd := range p {
		unix.CloseOnExec(fd)
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(p[0])
			unix.Close(p[1])
			return err
		}
	}
	return nil
}
