//go:build windows

package port

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// These tests run the IOCP backend on real sockets. On Linux CI they run
// under wine (scripts/cross.sh), which implements IOCTL_AFD_POLL.

func newTestIOCP(t *testing.T) Poller {
	t.Helper()
	p, err := NewNamed("iocp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.DialTCP("tcp4", nil, l.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// sockFd is the SOCKET of a conn as the core's int fd.
func sockFd(t *testing.T, c syscall.Conn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	rc.Control(func(s uintptr) { fd = int(s) })
	return fd
}

// waitFor waits until fd reports all of want, or fails after d.
func waitFor(t *testing.T, p Poller, fd int, want uint32, d time.Duration) uint32 {
	t.Helper()
	evs := make([]Event, 8)
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		n, _, err := p.Wait(evs, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs[:n] {
			if e.Fd == fd && e.Events&want == want {
				return e.Events
			}
		}
	}
	t.Fatalf("fd %d: events %#x not reported within %v", fd, want, d)
	return 0
}

// quiet checks that fd reports nothing of mask within d.
func quiet(t *testing.T, p Poller, fd int, mask uint32, d time.Duration) {
	t.Helper()
	evs := make([]Event, 8)
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		n, _, err := p.Wait(evs, 20)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs[:n] {
			if e.Fd == fd && e.Events&mask != 0 {
				t.Fatalf("fd %d: unexpected events %#x", fd, e.Events)
			}
		}
	}
}

func TestIOCPReadinessLevelTriggered(t *testing.T) {
	p := newTestIOCP(t)
	c, s := tcpPair(t)
	fd := sockFd(t, s)
	if err := p.Add(fd, EventRead); err != nil {
		t.Fatal(err)
	}
	if err := p.Add(fd, EventRead); !errors.Is(err, ErrExists) {
		t.Fatalf("double add: %v", err)
	}
	quiet(t, p, fd, EventRead, 100*time.Millisecond)
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 3; round++ { // unread data is reported again
		waitFor(t, p, fd, EventRead, 5*time.Second)
	}
	buf := make([]byte, 8)
	if n, err := s.Read(buf); n != 1 || err != nil {
		t.Fatalf("read: %d %v", n, err)
	}
	quiet(t, p, fd, EventRead, 100*time.Millisecond)

	// Modify to write: an idle socket is writable, and stays so.
	if err := p.Modify(fd, EventWrite); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 2; round++ {
		waitFor(t, p, fd, EventWrite, 5*time.Second)
	}
	// Back to read only: no more write events once the old poll is gone.
	if err := p.Modify(fd, EventRead); err != nil {
		t.Fatal(err)
	}
	waitSettled(p)
	quiet(t, p, fd, EventWrite, 100*time.Millisecond)

	// The peer's close is a hang-up (AFD's disconnect, which is also what
	// its shutdown(SD_SEND) gives): CLOSE when asked for, while it lasts.
	if err := p.Modify(fd, EventRead|EventClose); err != nil {
		t.Fatal(err)
	}
	c.Close()
	for round := 0; round < 2; round++ {
		waitFor(t, p, fd, EventClose, 5*time.Second)
	}
	if err := p.Remove(fd); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{p.Remove(fd), p.Modify(fd, EventRead)} {
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("after remove: %v", err)
		}
	}
	quiet(t, p, fd, ^uint32(0), 100*time.Millisecond)
}

// waitSettled lets a poll cancelled by Modify complete.
func waitSettled(p Poller) {
	evs := make([]Event, 8)
	for i := 0; i < 3; i++ {
		p.Wait(evs, 10)
	}
}

func TestIOCPCloseReportedWithoutReadInterest(t *testing.T) {
	p := newTestIOCP(t)
	c, s := tcpPair(t)
	fd := sockFd(t, s)
	if err := p.Add(fd, EventClose); err != nil { // no read or write interest
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	quiet(t, p, fd, ^uint32(0), 100*time.Millisecond) // data alone is not reported
	buf := make([]byte, 8)
	if n, err := s.Read(buf); n != 4 || err != nil {
		t.Fatalf("read: %d %v", n, err)
	}
	c.Close()
	if ev := waitFor(t, p, fd, EventClose, 5*time.Second); ev&EventRead != 0 {
		t.Fatalf("read reported without interest: %#x", ev)
	}
}

func TestIOCPBadFds(t *testing.T) {
	p := newTestIOCP(t)
	if err := p.Add(-1, EventRead); !errors.Is(err, ErrBadFd) {
		t.Fatalf("fd -1: %v", err)
	}
	r, w, err := os.Pipe() // a pipe has no readiness on Windows
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := p.Add(int(r.Fd()), EventRead); !errors.Is(err, ErrBadFd) {
		t.Fatalf("pipe handle: %v", err)
	}
	if err := p.Modify(int(r.Fd()), EventRead); !errors.Is(err, ErrBadFd) {
		t.Fatalf("modify pipe handle: %v", err)
	}
	_, s := tcpPair(t)
	if err := p.Remove(sockFd(t, s)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unregistered socket: %v", err)
	}
}

func TestIOCPClosedWithoutRemove(t *testing.T) {
	p := newTestIOCP(t)
	l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	fd := sockFd(t, l)
	if err := p.Add(fd, EventRead); err != nil {
		t.Fatal(err)
	}
	l.Close()
	for round := 0; round < 2; round++ { // reported until removed
		if ev := waitFor(t, p, fd, EventClose, 5*time.Second); ev&EventError == 0 {
			t.Fatalf("closed socket: %#x", ev)
		}
	}
	// Removing it forgets it and says it was closed, as epoll does.
	if err := p.Remove(fd); !errors.Is(err, ErrBadFd) {
		t.Fatalf("remove of a closed socket: %v", err)
	}
	if err := p.Remove(fd); !errors.Is(err, ErrBadFd) {
		t.Fatalf("second remove: %v", err)
	}
	quiet(t, p, fd, ^uint32(0), 50*time.Millisecond)

	// A closed socket seen by a wait does not block a new socket that
	// gets the same handle value.
	l2, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	fd2 := sockFd(t, l2)
	if err := p.Add(fd2, EventRead); err != nil {
		t.Fatal(err)
	}
	l2.Close()
	waitFor(t, p, fd2, EventClose, 5*time.Second)
	c, s := tcpPair(t)
	defer c.Close()
	if fd3 := sockFd(t, s); fd3 == fd2 {
		if err := p.Add(fd3, EventRead); err != nil {
			t.Fatalf("re-add of a reused handle value: %v", err)
		}
		c.Write([]byte("x"))
		waitFor(t, p, fd3, EventRead, 5*time.Second)
	} else {
		t.Logf("handle value not reused (%d vs %d)", fd3, fd2)
	}
}

func TestIOCPManySocketsAndAddWhileWaiting(t *testing.T) {
	p := newTestIOCP(t)
	const n = 80 // several AFD groups
	peers := make([]*net.TCPConn, n)
	fds := make([]int, n)
	for i := range fds {
		c, s := tcpPair(t)
		peers[i] = c
		fds[i] = sockFd(t, s)
		if err := p.Add(fds[i], EventRead); err != nil {
			t.Fatal(err)
		}
	}
	// A socket added while another thread sleeps in Wait is seen by it.
	c, s := tcpPair(t)
	late := sockFd(t, s)
	done := make(chan error, 1)
	go func() {
		evs := make([]Event, 4)
		for {
			k, _, err := p.Wait(evs, 5000)
			if err != nil || k == 0 {
				done <- errors.New("wait ended without the late socket")
				return
			}
			for _, e := range evs[:k] {
				if e.Fd == late {
					done <- nil
					return
				}
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	c.Write([]byte("x"))
	if err := p.Add(late, EventRead); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Every one of the n sockets reports its data, in batches of 16.
	for _, c := range peers {
		c.Write([]byte("y"))
	}
	seen := map[int]bool{}
	evs := make([]Event, 16)
	end := time.Now().Add(10 * time.Second)
	for len(seen) < n && time.Now().Before(end) {
		k, _, err := p.Wait(evs, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs[:k] {
			if e.Fd != late && e.Events&EventRead != 0 {
				seen[e.Fd] = true
			}
		}
	}
	if len(seen) != n {
		t.Fatalf("%d of %d sockets reported", len(seen), n)
	}
	for _, fd := range fds {
		if err := p.Remove(fd); err != nil {
			t.Fatal(err)
		}
	}
}

func TestIOCPWakeupAndRing(t *testing.T) {
	p := newTestIOCP(t)
	evs := make([]Event, 4)
	// Three wakeups before the wait are one wakeup: no phantom after it.
	for i := 0; i < 3; i++ {
		if err := p.Wakeup(); err != nil {
			t.Fatal(err)
		}
	}
	_, r, err := p.Wait(evs, 1000)
	if err != nil || !r.Woken {
		t.Fatalf("after wakeup: %+v %v", r, err)
	}
	start := time.Now()
	n, r, err := p.Wait(evs, 50)
	if err != nil || n != 0 || r.Woken || r.Rung {
		t.Fatalf("phantom: n=%d %+v %v", n, r, err)
	}
	if time.Since(start) < 40*time.Millisecond {
		t.Fatalf("timed wait returned early")
	}
	// A ring wakes the waiter but is not a wakeup.
	go func() { time.Sleep(20 * time.Millisecond); p.Ring() }()
	_, r, err = p.Wait(evs, 5000)
	if err != nil || !r.Rung || r.Woken {
		t.Fatalf("ring: %+v %v", r, err)
	}
	if _, kind := p.Doorbell(); kind != DoorbellIOCP {
		t.Fatalf("doorbell kind %d", kind)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Wakeup(); !errors.Is(err, ErrClosed) {
		t.Fatalf("wakeup after close: %v", err)
	}
	if _, _, err := p.Wait(evs, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("wait after close: %v", err)
	}
}

func TestIOCPCloseWithPendingPolls(t *testing.T) {
	p, err := NewNamed("iocp")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		_, s := tcpPair(t)
		if err := p.Add(sockFd(t, s), EventRead|EventWrite); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
}
