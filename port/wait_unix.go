//go:build unix

package port

import "golang.org/x/sys/unix"

// waitTimespec is a clamped timeout (see waitMs) as a timespec for ppoll and
// kevent: nil (forever) when negative.
func waitTimespec(ms int) *unix.Timespec {
	if ms < 0 {
		return nil
	}
	t := unix.NsecToTimespec(int64(ms) * 1e6)
	return &t
}
