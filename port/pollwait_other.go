//go:build unix && !linux

package port

import "golang.org/x/sys/unix"

// pollWait is plain poll(2). Here a Go preemption signal (SIGURG) landing
// during the wait can end it early with EINTR, which the runtime reports as
// an interrupted wait (0 events); see docs/PLATFORMS.md.
func pollWait(fds []unix.PollFd, timeoutMs int) (int, error) {
	return unix.Poll(fds, timeoutMs)
}
