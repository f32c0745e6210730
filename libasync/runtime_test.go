package libasync

import (
	"errors"
	"math"
	"math/rand"
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
			// hang (1 s was too short for a loaded host under qemu).
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

func TestTimersFireInOrderNotEarly(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		delays := []uint64{30, 1, 10, 0, 20}
		type want struct {
			delay uint64
			due   time.Time // added at + delay: the order that counts
		}
		ids := map[uint64]want{}
		for _, d := range delays {
			at := time.Now()
			id, err := rt.AddTimer(d, 0, uintptr(d))
			if err != nil || id == 0 {
				t.Fatal(id, err)
			}
			ids[id] = want{d, at.Add(time.Duration(d) * time.Millisecond)}
		}
		cancelled, _ := rt.AddTimer(15, 0, 999)
		if err := rt.CancelTimer(cancelled); err != nil {
			t.Fatal(err)
		}
		if err := rt.CancelTimer(cancelled); !errors.Is(err, ErrNotFound) {
			t.Fatalf("double cancel: %v", err)
		}
		ev := make([]Event, 8)
		var last time.Time
		for got := 0; got < len(delays); {
			n, err := rt.Wait(ev, 2*time.Second)
			if err != nil || n == 0 {
				t.Fatalf("n=%d err=%v", n, err)
			}
			for _, e := range ev[:n] {
				w, ok := ids[uint64(e.Data)]
				if e.Type != EventTimer || !ok || uint64(e.Key) != w.delay {
					t.Fatalf("bad timer event %+v", e)
				}
				if now := time.Now(); now.Before(w.due) {
					t.Fatalf("timer %d ms fired %v early", w.delay, w.due.Sub(now))
				}
				// Ticks are whole ms: timers due within the same ms may
				// fire in either order, later ones never first.
				if w.due.Before(last.Add(-time.Millisecond)) {
					t.Fatalf("timer due at %v fired after one due at %v", w.due, last)
				}
				if w.due.After(last) {
					last = w.due
				}
				got++
			}
		}
	})
}

func TestRepeatingTimerAndCancelOfExpired(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		id, _ := rt.AddTimer(5, 5, 1)
		ev := make([]Event, 8)
		fired := 0
		deadline := time.Now().Add(5 * time.Second)
		for fired < 5 && time.Now().Before(deadline) {
			n, _ := rt.Wait(ev, 100*time.Millisecond)
			for _, e := range ev[:n] {
				if e.Type == EventTimer && uint64(e.Data) == id {
					fired++
				}
			}
		}
		if fired < 5 {
			t.Fatalf("repeating timer fired %d times", fired)
		}
		rt.CancelTimer(id)
		// Expired but not delivered: cancel must still win.
		id2, _ := rt.AddTimer(1, 0, 2)
		time.Sleep(10 * time.Millisecond)
		rt.Wait(ev[:1], 0) // may deliver nothing or something else; make time pass
		rt.CancelTimer(id2)
		for i := 0; i < 3; i++ {
			n, _ := rt.Wait(ev, 5*time.Millisecond)
			for _, e := range ev[:n] {
				if e.Type == EventTimer && uint64(e.Data) == id2 {
					// Only acceptable if it was delivered before the cancel.
					t.Fatalf("cancelled timer delivered")
				}
			}
		}
	})
}

func TestTimerAddedWhileSleepingWakesWaiter(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		go func() {
			time.Sleep(20 * time.Millisecond)
			rt.AddTimer(1, 0, 5)
		}()
		ev := make([]Event, 1)
		n, err := rt.Wait(ev, 10*time.Second)
		if err != nil || n != 1 || ev[0].Type != EventTimer {
			t.Fatalf("n=%d err=%v", n, err)
		}
	})
}

// The wheel against a model: random adds, cancels and time jumps; every
// timer fires exactly once, never before its tick, and by the tick after.
func TestWheelAgainstModel(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	w := newWheel()
	type model struct {
		due    uint64
		period uint64
	}
	live := map[uint64]*model{}
	now := uint64(0)
	for step := 0; step < 20000; step++ {
		switch r.Intn(4) {
		case 0, 1:
			var d uint64
			switch r.Intn(4) {
			case 0:
				d = uint64(r.Intn(64))
			case 1:
				d = uint64(r.Intn(5000))
			case 2:
				d = uint64(r.Int63n(1 << 40))
			default:
				d = uint64(r.Intn(300000))
			}
			var period uint64
			if r.Intn(5) == 0 {
				period = uint64(1 + r.Intn(100))
			}
			id := w.add(now+d, period, uintptr(step))
			live[id] = &model{now + d, period}
		case 2:
			for id := range live {
				if !w.cancel(id) {
					t.Fatalf("cancel of live %x failed", id)
				}
				delete(live, id)
				break
			}
		case 3:
			jump := uint64(r.Intn(200))
			if r.Intn(50) == 0 {
				jump = uint64(r.Intn(1 << 20))
			}
			now += jump
			w.advance(now)
			for {
				_, id, ok := w.pop()
				if !ok {
					break
				}
				m := live[id]
				if m == nil {
					t.Fatalf("unknown timer %x fired", id)
				}
				if m.due > now {
					t.Fatalf("timer due %d fired at %d", m.due, now)
				}
				if m.period == 0 {
					delete(live, id)
				} else {
					for m.due <= now {
						m.due += m.period
					}
				}
			}
			for id, m := range live {
				if m.due <= now {
					t.Fatalf("timer %x due %d not fired at %d", id, m.due, now)
				}
			}
		}
		if w.live != len(live) {
			t.Fatalf("wheel has %d live, model %d", w.live, len(live))
		}
	}
}

// A period too long to add saturates instead of wrapping round to "now".
func TestWheelHugePeriodNeverRefires(t *testing.T) {
	w := newWheel()
	id := w.add(10, ^uint64(0), 1)
	w.advance(10)
	if _, got, ok := w.pop(); !ok || got != id {
		t.Fatal("timer did not fire once")
	}
	for now := uint64(11); now < 5000; now += 97 {
		w.advance(now)
		if _, _, ok := w.pop(); ok {
			t.Fatalf("fired again at %d", now)
		}
	}
	if !w.cancel(id) {
		t.Fatal("a repeating timer must stay cancellable")
	}
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
