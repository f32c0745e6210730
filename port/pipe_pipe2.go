//go:build linux || freebsd || netbsd || openbsd || dragonfly

package port

import "golang.org/x/sys/unix"

// pipe2 makes a non-blocking, close-on-exec pipe atomically.
func pipe2(p *[2]int) error {
	return unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK)
}
