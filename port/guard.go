package port

import "sync"

// guard is a poller's lock and closed flag. mu guards closed and whatever
// else the poller's own fields say; once closed, no call touches the
// poller's descriptors again (their numbers may name somebody else's files
// by then).
type guard struct {
	mu     sync.Mutex
	closed bool
}

// lockOpen locks mu and returns nil, or ErrClosed (mu unlocked) if the
// poller is closed.
func (g *guard) lockOpen() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// lockFd is lockOpen for a call about fd: ErrBadFd, without locking, for a
// number no Unix descriptor can have (see badFdNumber).
func (g *guard) lockFd(fd int) error {
	if badFdNumber(fd) {
		return ErrBadFd
	}
	return g.lockOpen()
}

// shut is Close: it marks the poller closed and runs release under mu, once;
// ErrClosed on every later call.
func (g *guard) shut(release func()) error {
	if err := g.lockOpen(); err != nil {
		return err
	}
	defer g.mu.Unlock()
	g.closed = true
	release()
	return nil
}
