package libasync

// Tests of the Runtime that need no descriptor: completions, Wakeup, Wait
// timeouts (huge and negative ones too) and waiters, the backend choice, the
// Go part of a wait driven from outside Go, and the Shared counters.

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libasync/libasync/port"
)

func TestCompletionsExactlyOnceInOrder(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		const producers, per = 8, 50000
		var wg sync.WaitGroup
		for p := 0; p < producers; p++ {
			wg.Add(1)
			go func(p int) {
				defer wg.Done()
				for i := 0; i < per; i++ {
					// Keys and data above 2^32 must arrive intact.
					if err := rt.Post(uintptr(p)<<40|1, uintptr(i)<<33|uintptr(p)); err != nil {
						t.Error(err)
						return
					}
				}
			}(p)
		}
		next := make([]int, producers)
		ev := make([]Event, 3) // small: the rest stays queued
		for got := 0; got < producers*per; {
			// Producers are still posting: 10 s without an event is a
			// hang, even on a loaded or emulated host.
			n, err := rt.Wait(ev, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Fatalf("timed out after %d completions", got)
			}
			for _, e := range ev[:n] {
				p := int(e.Key >> 40)
				if e.Type != EventCompletion || e.Fd != -1 || e.Key&1 != 1 || int(e.Data&0xff) != p {
					t.Fatalf("bad event %+v", e)
				}
				if i := int(e.Data >> 33); i != next[p] {
					t.Fatalf("producer %d: got %d, want %d", p, i, next[p])
				}
				next[p]++
				got++
			}
		}
		wg.Wait()
		if n, _ := rt.Wait(ev, 0); n != 0 {
			t.Fatalf("%d extra events", n)
		}
	})
}

func TestWakeupReturnsWithoutEvent(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		go func() {
			time.Sleep(20 * time.Millisecond)
			rt.Wakeup()
		}()
		ev := make([]Event, 4)
		start := time.Now()
		n, err := rt.Wait(ev, -1)
		if err != nil || n != 0 {
			t.Fatalf("n=%d err=%v", n, err)
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("wakeup did not wake the wait")
		}
		// A wakeup with no waiter makes the next wait return at once.
		rt.Wakeup()
		if n, err := rt.Wait(ev, -1); n != 0 || err != nil {
			t.Fatalf("n=%d err=%v", n, err)
		}
	})
}

// A Wakeup ends exactly one Wait early: the next one, even when that Wait
// does not sleep (timeout 0, or a completion already queued). The Wait
// after it sleeps its whole timeout.
func TestWakeupEndsOneWaitThatDoesNotSleep(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		ev := make([]Event, 4)
		sleeps := func(what string) {
			t.Helper()
			start := time.Now()
			if n, err := rt.Wait(ev, 100*time.Millisecond); n != 0 || err != nil {
				t.Fatalf("%s: n=%d err=%v", what, n, err)
			}
			if el := time.Since(start); el < 100*time.Millisecond {
				t.Fatalf("%s: wait(100 ms) returned after %v: the wakeup was not taken", what, el)
			}
		}
		if err := rt.Wakeup(); err != nil {
			t.Fatal(err)
		}
		if n, err := rt.Wait(ev, 0); n != 0 || err != nil {
			t.Fatalf("wait(0): n=%d err=%v", n, err)
		}
		sleeps("after wait(0)")

		if err := rt.Wakeup(); err != nil {
			t.Fatal(err)
		}
		if err := rt.Post(5, 6); err != nil {
			t.Fatal(err)
		}
		if n, err := rt.Wait(ev, 100*time.Millisecond); n != 1 || err != nil || ev[0].Key != 5 {
			t.Fatalf("wait with a completion: n=%d err=%v ev=%+v", n, err, ev[0])
		}
		sleeps("after the completion")
	})
}

func TestWaitTimeoutNotEarly(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		ev := make([]Event, 4)
		for _, ms := range []int{1, 5, 30} {
			start := time.Now()
			n, err := rt.Wait(ev, time.Duration(ms)*time.Millisecond)
			if n != 0 || err != nil {
				t.Fatalf("n=%d err=%v", n, err)
			}
			if el := time.Since(start); el < time.Duration(ms)*time.Millisecond {
				t.Fatalf("wait(%d ms) returned after %v", ms, el)
			}
		}
	})
}

func TestSecondWaiterBusyAndCloseWakesWaiter(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		res := make(chan error, 1)
		go func() {
			for {
				_, err := rt.Wait(make([]Event, 1), -1)
				if !errors.Is(err, ErrBusy) {
					res <- err
					return
				}
				// Lost the race with the probe below: again.
				time.Sleep(time.Millisecond)
			}
		}()
		// Probe until the goroutine is inside its wait: no sleep is long
		// enough on a slow host (qemu, wine, -race), but its wait is seen.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			n, err := rt.Wait(make([]Event, 1), 0)
			if errors.Is(err, ErrBusy) {
				break
			}
			if err != nil || n != 0 || time.Now().After(deadline) {
				t.Fatalf("second waiter: n=%d err=%v", n, err)
			}
		}
		rt.Close()
		if err := <-res; !errors.Is(err, ErrClosed) {
			t.Fatalf("waiter after close: %v", err)
		}
		if err := rt.Post(1, 1); !errors.Is(err, ErrClosed) {
			t.Fatalf("post after close: %v", err)
		}
	})
}

// Step, the Go part of a wait driven from outside Go, hands out expired
// timers and Go-side posts, never the Source's entries, and publishes in
// Shared when Go next has work: GoWork and NextDue.
func TestStepPublishesGoWorkAndNextDue(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		out := make([]Event, 4)
		if n, err := rt.step(out, nil, 0); err != nil || n != 0 {
			t.Fatalf("idle Step = %d, %v; want 0, nil", n, err)
		}
		if g := atomic.LoadInt32(&rt.sh.GoWork); g != 0 {
			t.Fatalf("GoWork = %d after an idle Step, want 0", g)
		}
		if d := atomic.LoadInt64(&rt.sh.NextDue); d != math.MaxInt64 {
			t.Fatalf("NextDue = %d with no timer, want MaxInt64", d)
		}
		id, err := rt.AddTimer(20, 0, 7)
		if err != nil {
			t.Fatal(err)
		}
		if g := atomic.LoadInt32(&rt.sh.GoWork); g != 1 {
			t.Fatalf("GoWork = %d after AddTimer, want 1", g)
		}
		if n, _ := rt.step(out, nil, 0); n != 0 {
			t.Fatalf("Step before the timer is due returned %d events", n)
		}
		due := atomic.LoadInt64(&rt.sh.NextDue)
		if _, now := rt.now(); due < now+15e6 || due > now+25e6 {
			t.Fatalf("NextDue = %d ns, now %d: want about 20 ms ahead", due, now)
		}
		for {
			if _, now := rt.now(); now >= due {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err := rt.Post(3, 4); err != nil {
			t.Fatal(err)
		}
		n, err := rt.step(out, nil, 0)
		if err != nil || n != 2 {
			t.Fatalf("Step after the due time = %d, %v; want the timer and the post", n, err)
		}
		var sawTimer, sawPost bool
		for _, e := range out[:n] {
			sawTimer = sawTimer || (e.Type == EventTimer && e.Key == 7 && e.Data == uintptr(id))
			sawPost = sawPost || (e.Type == EventCompletion && e.Key == 3 && e.Data == 4)
		}
		if !sawTimer || !sawPost {
			t.Fatalf("events %+v: want timer key 7 and completion 3/4", out[:n])
		}
		if d := atomic.LoadInt64(&rt.sh.NextDue); d != math.MaxInt64 {
			t.Fatalf("NextDue = %d after the one-shot fired, want MaxInt64", d)
		}
		rt.Close()
		if _, err := rt.step(out, nil, 0); err != ErrClosed {
			t.Fatalf("Step after Close: %v, want ErrClosed", err)
		}
	})
}

// The counters behind async_runtime_get_stats that the Go core keeps in
// Shared: live timers, doorbell rings by posts and timers, explicit
// wakeups, and the time a wait spent blocked in the poller.
func TestSharedStatsCounters(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		sh := rt.sh
		ids := make([]uint64, 3)
		for i := range ids {
			id, err := rt.AddTimer(1, 0, uintptr(i))
			if err != nil {
				t.Fatal(err)
			}
			ids[i] = id
		}
		far, err := rt.AddTimer(3600*1000, 0, 9)
		if err != nil {
			t.Fatal(err)
		}
		if n := atomic.LoadInt64(&sh.Timers); n != 4 {
			t.Fatalf("Timers = %d after 4 adds", n)
		}
		if err := rt.CancelTimer(far); err != nil {
			t.Fatal(err)
		}
		if n := atomic.LoadInt64(&sh.Timers); n != 3 {
			t.Fatalf("Timers = %d after a cancel", n)
		}
		ev := make([]Event, 8)
		for got := 0; got < 3; {
			n, err := rt.Wait(ev, 5*time.Second)
			if err != nil || n == 0 {
				t.Fatalf("wait: %d %v", n, err)
			}
			got += n
		}
		if n := atomic.LoadInt64(&sh.Timers); n != 0 {
			t.Fatalf("Timers = %d after every one-shot fired", n)
		}
		// No waiter: a post rings nothing.
		if err := rt.Post(1, 1); err != nil {
			t.Fatal(err)
		}
		if r := atomic.LoadUint64(&sh.Rings); r != 0 {
			t.Fatalf("Rings = %d with nobody asleep", r)
		}
		if n, _ := rt.Wait(ev, 0); n != 1 {
			t.Fatalf("wait: %d", n)
		}
		for i := 0; i < 2; i++ {
			if err := rt.Wakeup(); err != nil {
				t.Fatal(err)
			}
		}
		if w := atomic.LoadUint64(&sh.Wakeups); w != 2 {
			t.Fatalf("Wakeups = %d after 2", w)
		}
		if _, err := rt.Wait(ev, 0); err != nil { // drains the wakeups
			t.Fatal(err)
		}
		// Polls add no idle time; a 50 ms sleep adds at least 40 ms.
		idle := atomic.LoadInt64(&sh.IdleNs)
		for i := 0; i < 10; i++ {
			if _, err := rt.Wait(ev, 0); err != nil {
				t.Fatal(err)
			}
		}
		if v := atomic.LoadInt64(&sh.IdleNs); v != idle {
			t.Fatalf("IdleNs grew by %d ns over polls", v-idle)
		}
		start := time.Now()
		for time.Since(start) < 50*time.Millisecond {
			if _, err := rt.Wait(ev, 50*time.Millisecond-time.Since(start)); err != nil {
				t.Fatal(err)
			}
		}
		wall := time.Since(start)
		d := atomic.LoadInt64(&sh.IdleNs) - idle
		if d < int64(40*time.Millisecond) || d > int64(wall) {
			t.Fatalf("IdleNs grew by %v over a %v sleep", time.Duration(d), wall)
		}
		// A sleeping waiter is rung by a post (bounded retries: it may
		// not be asleep yet when the post comes).
		done := make(chan struct{})
		go func() {
			defer close(done)
			for atomic.LoadUint64(&sh.Rings) == 0 {
				if n, err := rt.Wait(ev, 10*time.Second); err != nil || n == 0 {
					t.Errorf("wait: %d %v", n, err)
					return
				}
			}
		}()
		deadline := time.Now().Add(30 * time.Second)
		for atomic.LoadUint64(&sh.Rings) == 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
			if err := rt.Post(2, 2); err != nil {
				t.Fatal(err)
			}
		}
		<-done
		if atomic.LoadUint64(&sh.Rings) == 0 {
			t.Fatal("no post ever rang a sleeping waiter")
		}
	})
}

// A wait that comes while Close holds the wait lock (Close sets shut, then
// waits there for the waiter to leave) is told ErrClosed, not ErrBusy; a wait
// that finds another wait in progress is still ErrBusy.
func TestWaitDuringCloseIsClosedNotBusy(t *testing.T) {
	rt, err := NewRuntime()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]Event, 4)
	rt.waitMu.Lock() // another wait in progress
	if _, err := rt.Wait(out, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("wait while another waits: %v, want ErrBusy", err)
	}
	rt.shut.Store(true) // what Close does before it takes the lock
	if _, err := rt.Wait(out, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("wait while Close holds the wait lock: %v, want ErrClosed", err)
	}
	rt.shut.Store(false)
	rt.waitMu.Unlock()
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
}

// Huge and negative Wait timeouts: a Wait that may sleep for ever (or for
// MaxInt64 ns, whose deadline overflows) still ends on Wakeup, on a Post and
// on a timer.
func TestWaitHugeOrNegativeTimeoutEndsOnWake(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		ev := make([]Event, 4)
		for _, to := range []time.Duration{-1, math.MinInt64, math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 / 2} {
			for _, how := range []string{"wakeup", "post", "timer"} {
				result := startWait(t, rt, ev, to)
				// Let it sleep (no way to observe it from outside but the
				// sleep flag), then wake it.
				for i := 0; i < 1000 && atomic.LoadInt32(&rt.sh.Sleeping) == 0; i++ {
					time.Sleep(100 * time.Microsecond)
				}
				switch how {
				case "wakeup":
					rt.Wakeup()
				case "post":
					rt.Post(1, 2)
				case "timer":
					rt.AddTimer(1, 0, 3)
				}
				what := fmt.Sprintf("timeout %d, %s", to, how)
				if n, err := result(what); err != nil || (how != "wakeup" && n != 1) {
					t.Fatalf("%s: n=%d err=%v", what, n, err)
				}
			}
		}
	})
}

// Post and Wakeup storms from several goroutines while the waiter's short
// waits time out: every completion exactly once, in each poster's order;
// no Wait hangs; timers added meanwhile never fire early.
func TestPostWakeupStormExactlyOnceInOrder(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		const posters, per = 4, 5000
		var wg sync.WaitGroup
		for p := 0; p < posters; p++ {
			wg.Add(1)
			go func(p int) {
				defer wg.Done()
				for i := 0; i < per; i++ {
					if err := rt.Post(uintptr(p), uintptr(i)); err != nil {
						t.Errorf("post: %v", err)
						return
					}
					if i%64 == 0 {
						time.Sleep(50 * time.Microsecond)
					}
				}
			}(p)
		}
		stop := make(chan struct{})
		var storm sync.WaitGroup
		for k := 0; k < 2; k++ {
			repeat(t, &storm, stop, 20*time.Microsecond, func(int) error { return rt.Wakeup() })
		}
		timers := timerLog{added: map[uint64]timerAdded{}}
		repeat(t, &storm, stop, 300*time.Microsecond, func(i int) error {
			return timers.add(rt, uint64(i%4), 99)
		})
		next := make([]uintptr, posters)
		total := 0
		ev := make([]Event, 7)
		deadline := time.Now().Add(testLimit(t))
		for total < posters*per {
			n, err := rt.Wait(ev, time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			for _, e := range ev[:n] {
				switch e.Type {
				case EventCompletion:
					if e.Key >= posters || e.Data != next[e.Key] {
						t.Fatalf("poster %d: got %d want %d", e.Key, e.Data, next[e.Key])
					}
					next[e.Key]++
					total++
				case EventTimer:
					timers.fired(t, e, now, 99)
				default:
					t.Fatalf("unexpected event %+v", e)
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d of %d completions", total, posters*per)
			}
		}
		close(stop)
		within(t, "posters", wg.Wait)
		within(t, "wakers and timers", storm.Wait)
		// Nothing more than was posted.
		for i := 0; i < 3; i++ {
			n, _ := rt.Wait(ev, time.Millisecond)
			for _, e := range ev[:n] {
				if e.Type == EventCompletion {
					t.Fatalf("extra completion %+v", e)
				}
			}
		}
	})
}

// repeat calls f(0), f(1), ... in a goroutine counted in wg, pausing
// between calls, until stop is closed or f fails (which fails the test).
func repeat(t *testing.T, wg *sync.WaitGroup, stop <-chan struct{}, pause time.Duration, f func(i int) error) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := f(i); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(pause)
		}
	}()
}

// timerLog records the timers added to a runtime, to check that each fires
// once and never early.
type timerLog struct {
	mu    sync.Mutex
	added map[uint64]timerAdded
}

type timerAdded struct {
	at    time.Time
	delay time.Duration
}

// add starts a one-shot timer of delayMs with key and records it (under
// the log's lock, so that it is recorded before it can be seen firing).
func (l *timerLog) add(rt *Runtime, delayMs uint64, key uintptr) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	at := time.Now()
	id, err := rt.AddTimer(delayMs, 0, key)
	if err != nil {
		return fmt.Errorf("AddTimer: %w", err)
	}
	l.added[id] = timerAdded{at, time.Duration(delayMs) * time.Millisecond}
	return nil
}

// fired checks the timer event e, seen at now: a recorded timer with key,
// not seen before, its delay passed.
func (l *timerLog) fired(t *testing.T, e Event, now time.Time, key uintptr) {
	t.Helper()
	l.mu.Lock()
	x, ok := l.added[uint64(e.Data)]
	delete(l.added, uint64(e.Data))
	l.mu.Unlock()
	if !ok || e.Key != key {
		t.Fatalf("unknown or duplicate timer %+v", e)
	}
	if el := now.Sub(x.at); el < x.delay {
		t.Fatalf("timer of %v fired after %v", x.delay, el)
	}
}

// Two goroutines calling Wait at once: exactly one waits, the other gets
// ErrBusy at once, and the runtime is usable afterwards.
func TestTwoWaitersOneIsBusy(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		for round := 0; round < 50; round++ {
			var busy, ok atomic.Int32
			var wg sync.WaitGroup
			for g := 0; g < 2; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := rt.Wait(make([]Event, 2), 20*time.Millisecond)
					switch {
					case errors.Is(err, ErrBusy):
						busy.Add(1)
						rt.Post(1, 1) // end the other's wait early
					case err == nil:
						ok.Add(1)
					default:
						t.Errorf("wait: %v", err)
					}
				}()
			}
			within(t, "two waiters", wg.Wait)
			if ok.Load() < 1 || ok.Load()+busy.Load() != 2 {
				t.Fatalf("ok %d busy %d", ok.Load(), busy.Load())
			}
			for { // drain
				n, _ := rt.Wait(make([]Event, 4), 0)
				if n == 0 {
					break
				}
			}
		}
	})
}

// NewRuntime with an unknown ASYNC_BACKEND: ErrNotSup, nothing made.
func TestUnknownBackendNotSupported(t *testing.T) {
	t.Setenv("ASYNC_BACKEND", "no-such-backend")
	if rt, err := NewRuntime(); rt != nil || !errors.Is(err, ErrNotSup) {
		t.Fatalf("rt %v err %v, want ErrNotSup", rt, err)
	}
	if _, err := port.NewNamed("no-such-backend"); !errors.Is(err, port.ErrBackend) {
		t.Fatalf("port.NewNamed: %v", err)
	}
}
