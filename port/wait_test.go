package port

// Tests of what every backend's Wait shares: the timeout bound.

import (
	"math"
	"testing"
	"time"
)

// eachBackend runs f against a new poller of every backend this platform
// has, closed when f returns.
func eachBackend(t *testing.T, f func(t *testing.T, p Poller)) {
	for _, name := range Backends() {
		t.Run(name, func(t *testing.T) {
			p, err := NewNamed(name)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			f(t, p)
		})
	}
}

// A Wait's timeoutMs beyond the kernel's int (1<<32, 1<<40, MaxInt) waits,
// at most math.MaxInt32 ms, and any negative one waits forever: here each
// must still be waiting when the wakeup comes, and then report it.
func TestWaitHugeTimeoutMsStillWaits(t *testing.T) {
	if math.MaxInt == math.MaxInt32 {
		t.Skip("32-bit int")
	}
	eachBackend(t, func(t *testing.T, p Poller) {
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
