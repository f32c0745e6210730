//go:build linux

package port

import "golang.org/x/sys/unix"

// pollRdHup asks poll(2) to report a peer's half-close as a hang-up.
const pollRdHup = unix.POLLRDHUP
