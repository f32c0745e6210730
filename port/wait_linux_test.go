package port

// Tests of what every backend's Wait shares, on Linux: the harvest bound.

import (
	"math"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A Wait with more room than epoll_wait accepts (INT_MAX/12 records)
// harvests at most MaxHarvest records, into a raw buffer sized for that
// bound: the ready fd and the wakeup are reported. evs lives in lazily
// mapped memory (MAP_NORESERVE): nothing is committed.
func TestWaitHugeEvsHarvestsBounded(t *testing.T) {
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
	eachBackend(t, func(t *testing.T, p Poller) {
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
