package libasync

// Helpers shared by the package's tests: every backend, bounded waits, and
// a Close racing every method.

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libasync/libasync/port"
)

// backends runs f against every poller this platform has.
func backends(t *testing.T, f func(t *testing.T, rt *Runtime)) {
	for _, name := range port.Backends() {
		t.Run(name, func(t *testing.T) {
			p, err := port.NewNamed(name)
			if err != nil {
				t.Fatal(err)
			}
			rt := NewRuntimeWith(p)
			defer rt.Close()
			f(t, rt)
		})
	}
}

// testLimit is how long any one blocking step may take before the test
// fails instead of hanging: well under the test's own deadline.
func testLimit(t *testing.T) time.Duration {
	d := 20 * time.Second
	if dl, ok := t.Deadline(); ok {
		if r := time.Until(dl) / 2; r < d {
			d = r
		}
	}
	return d
}

// within runs f in a goroutine and fails the test if it does not return
// within testLimit.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(testLimit(t)):
		t.Fatalf("%s: did not return (hang)", what)
	}
}

// startWait starts rt.Wait(ev, timeout) in a goroutine. The function it
// returns gives that Wait's result; if the Wait has not returned within
// testLimit, it closes rt (which frees the waiter) and fails the test.
func startWait(t *testing.T, rt *Runtime, ev []Event, timeout time.Duration) func(what string) (int, error) {
	type result struct {
		n   int
		err error
	}
	res := make(chan result, 1)
	go func() {
		n, err := rt.Wait(ev, timeout)
		res <- result{n, err}
	}()
	return func(what string) (int, error) {
		t.Helper()
		select {
		case r := <-res:
			return r.n, r.err
		case <-time.After(testLimit(t)):
			rt.Close()
			t.Fatalf("%s: Wait did not return", what)
			return 0, nil
		}
	}
}

// closeWhileBusy checks a Close racing every method of an object. It
// starts n goroutines together; goroutine g makes op := newOp(g) and calls
// op(0), op(1), ... until it returns ErrClosed. After pause, closeFn closes
// the object. The test fails if op returns ErrClosed before closeFn was
// called or any other error, or if a goroutine has not ended within
// testLimit of the close.
func closeWhileBusy(t *testing.T, n int, pause time.Duration, newOp func(g int) func(i int) error, closeFn func()) {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	var closing atomic.Bool
	bad := make(chan error, n)
	for g := 0; g < n; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			<-start
			op := newOp(g)
			for i := 0; ; i++ {
				err := op(i)
				if errors.Is(err, ErrClosed) {
					if !closing.Load() {
						bad <- errors.New("ErrClosed before Close")
					}
					return
				}
				if err != nil {
					bad <- err
					return
				}
			}
		}(g)
	}
	close(start)
	time.Sleep(pause)
	closing.Store(true)
	closeFn()
	within(t, "callers after Close", wg.Wait)
	close(bad)
	for err := range bad {
		t.Fatal(err)
	}
}
