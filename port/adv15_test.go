//go:build linux

package port

import (
	"math"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A Wait with more room than epoll_wait accepts (INT_MAX/12 records) got
// EINVAL, reported as ErrClosed on an open poller, and its raw buffer
// followed len(evs) (2 GiB here). The harvest is bounded by MaxHarvest.
// evs lives in lazily mapped memory: nothing is committed.
func TestAdv15EpollHugeEvs(t *testing.T) {
	if math.MaxInt == math.MaxInt32 {
		t.Skip("32-bit int")
	}
	const n = 179_000_000
	size := n * int(unsafe.Sizeof(Event{}))
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_NORESERVE)
	if err != nil {
		t.Skipf("cannot map %d bytes: %v", size, err)
	}
	defer unix.Munmap(b)
	evs := unsafe.Slice((*Event)(unsafe.Pointer(&b[0])), n)
	for _, name := range Backends() {
		t.Run(name, func(t *testing.T) {
			p, err := NewNamed(name)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var fds [2]int
			if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fds[0])
			defer unix.Close(fds[1])
			if err := p.Add(fds[0], EventRead); err != nil {
				t.Fatal(err)
			}
			unix.Write(fds[1], []byte("x"))
			p.Wakeup()
			got, r, err := p.Wait(evs, 1000)
			if err != nil || got != 1 || evs[0].Fd != fds[0] || !r.Woken {
				t.Fatalf("Wait with len(evs) %d: n=%d r=%+v err=%v", n, got, r, err)
			}
		})
	}
}

// Wait's timeoutMs beyond the kernel's int: epoll_pwait kept the low 32
// bits (1<<32 ms became 0: a busy return at once; 1<<32+5 became 5 ms), and
// the poll port's ms*1e6 overflowed for MaxInt (a negative timespec: EINVAL
// as an error). A huge timeout waits (at most MaxInt32 ms); here it must
// still be waiting when the wakeup comes.
func TestAdv15PortHugeTimeoutMs(t *testing.T) {
	if math.MaxInt == math.MaxInt32 {
		t.Skip("32-bit int")
	}
	for _, name := range Backends() {
		t.Run(name, func(t *testing.T) {
			p, err := NewNamed(name)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			evs := make([]Event, 4)
			for _, ms := range []int{1 << 32, 1<<32 + 1, 1 << 40, math.MaxInt, math.MinInt, -2} {
				type res struct {
					n   int
					r   WaitResult
					err error
				}
				done := make(chan res, 1)
				go func() {
					for {
						n, r, err := p.Wait(evs, ms)
						if r.Interrupted && err == nil {
							continue
						}
						done <- res{n, r, err}
						return
					}
				}()
				select {
				case x := <-done:
					t.Fatalf("timeoutMs %d: returned before the wakeup: n=%d r=%+v err=%v", ms, x.n, x.r, x.err)
				case <-time.After(30 * time.Millisecond):
				}
				p.Wakeup()
				select {
				case x := <-done:
					if x.err != nil || !x.r.Woken {
						t.Fatalf("timeoutMs %d: n=%d r=%+v err=%v", ms, x.n, x.r, x.err)
					}
				case <-time.After(10 * time.Second):
					p.Close()
					t.Fatalf("timeoutMs %d: not woken", ms)
				}
			}
		})
	}
}
