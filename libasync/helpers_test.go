package libasync

import (
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
