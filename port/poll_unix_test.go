//go:build unix

package port

import (
	"testing"

	"golang.org/x/sys/unix"
)

// Registration changes made while a thread waits must not fill the doorbell
// pipe: an explicit wakeup rung after them has to reach the waiter. The
// waiter here is simulated (waiting set as Wait sets it around its poll) so
// that it cannot run and drain in between, as a starved thread would not.
func TestPollRingsDoNotSwallowWakeup(t *testing.T) {
	pl, err := newPoll()
	if err != nil {
		t.Fatal(err)
	}
	p := pl.(*pollPoller)
	defer p.Close()
	var fds [2]int
	if err := unix.Pipe(fds[:]); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if err := p.Add(fds[0], EventRead); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.waiting = true
	p.mu.Unlock()
	// more changes than a pipe holds bytes (64 KiB on Linux, 16 KiB to
	// 64 KiB elsewhere)
	for i := 0; i < 70000; i++ {
		ev := uint32(EventRead)
		if i%2 == 0 {
			ev = EventWrite
		}
		if err := p.Modify(fds[0], ev); err != nil {
			t.Fatalf("modify %d: %v", i, err)
		}
	}
	if err := p.Wakeup(); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.waiting = false
	p.rang = false
	p.mu.Unlock()
	evs := make([]Event, 4)
	_, r, err := p.Wait(evs, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Woken {
		t.Fatalf("the wakeup was lost behind the registration rings (rung %v)", r.Rung)
	}
}
