//go:build unix

package port

import "golang.org/x/sys/unix"

// pipeBell is the self-pipe doorbell of the poll and kqueue backends: C code
// writes a RingByte or WakeupByte to wfd (async_runtime_wakeup does so from
// signal handlers); the waiter watches rfd and drains it.
type pipeBell struct {
	rfd, wfd int
	buf      [128]byte
}

func newPipeBell() (pipeBell, error) {
	var p [2]int
	if err := pipe2(&p); err != nil {
		return pipeBell{}, err
	}
	return pipeBell{rfd: p[0], wfd: p[1]}, nil
}

// drain empties the pipe and reports whether it held a WakeupByte.
func (b *pipeBell) drain() bool {
	woken := false
	for {
		n, err := unix.Read(b.rfd, b.buf[:])
		for i := 0; i < n; i++ {
			if b.buf[i] == WakeupByte {
				woken = true
			}
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil || n < len(b.buf) {
			return woken
		}
	}
}

// write rings the doorbell with byte c.
func (b *pipeBell) write(c byte) error {
	buf := [1]byte{c}
	return ringFd(b.wfd, buf[:])
}

// ringFd writes b to a doorbell descriptor (an eventfd or a pipe), again
// when a signal interrupts the write. A doorbell that refuses the write
// (EAGAIN: a saturated eventfd counter, a full pipe) wakes the waiter
// anyway, so that counts as rung.
func ringFd(fd int, b []byte) error {
	for {
		_, err := unix.Write(fd, b)
		switch err {
		case nil, unix.EAGAIN:
			return nil
		case unix.EINTR:
			continue
		}
		return err
	}
}

func (b *pipeBell) close() {
	unix.Close(b.rfd)
	unix.Close(b.wfd)
}

// guardedBell is the doorbell of the poll and kqueue backends behind their
// guard: their Ring, Wakeup and Doorbell.
type guardedBell struct {
	guard
	pipeBell
}

func (b *guardedBell) Ring() error   { return b.ring(RingByte) }
func (b *guardedBell) Wakeup() error { return b.ring(WakeupByte) }

// ring writes the doorbell unless the poller is closed (its fd number may
// then belong to somebody else).
func (b *guardedBell) ring(c byte) error {
	if err := b.lockOpen(); err != nil {
		return err
	}
	defer b.mu.Unlock()
	return b.write(c)
}

func (b *guardedBell) Doorbell() (int, int) { return b.wfd, DoorbellPipe }
