//go:build linux

package port

import (
	"math"
	"testing"
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
