package libasync

// Tests of timers: the wheel against a model and at its limits, and the
// runtime's timers (order, never early, repeating, cancel, bad ids).

import (
	"errors"
	"math"
	"math/rand"
	"testing"
	"time"
)

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
	live := wheelModel{}
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
			live[id] = &modelTimer{now + d, period}
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
			live.advance(t, w, now)
		}
		if w.live != len(live) {
			t.Fatalf("wheel has %d live, model %d", w.live, len(live))
		}
	}
}

// wheelModel is what a wheel must hold: the next due tick and the period
// of every live timer, by id.
type wheelModel map[uint64]*modelTimer

type modelTimer struct{ due, period uint64 }

// advance moves w and the model to tick now and checks what fires: only
// live timers that are due, each once, and every one that is due.
func (m wheelModel) advance(t *testing.T, w *wheel, now uint64) {
	t.Helper()
	w.advance(now)
	for {
		_, id, ok := w.pop()
		if !ok {
			break
		}
		mt := m[id]
		if mt == nil || mt.due > now {
			t.Fatalf("timer %x fired wrongly at %d (%+v)", id, now, mt)
		}
		if mt.period == 0 {
			delete(m, id)
		} else {
			for mt.due <= now {
				mt.due += mt.period
			}
		}
	}
	for id, mt := range m {
		if mt.due <= now {
			t.Fatalf("timer %x due %d not fired at %d", id, mt.due, now)
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

// Timer ids never issued, cancelled, or of a fired one-shot are ErrNotFound;
// a timer due in MaxUint64 ms never fires, one with a period of MaxUint64 ms
// fires once, and both stay cancellable once.
func TestTimerBadIdsAndExtremeDelays(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		for _, id := range []uint64{0, 1, math.MaxUint64, 1 << 32, 0xffffffff} {
			if err := rt.CancelTimer(id); !errors.Is(err, ErrNotFound) {
				t.Fatalf("CancelTimer(%#x): %v", id, err)
			}
		}
		far, err := rt.AddTimer(math.MaxUint64, math.MaxUint64, 1)
		if err != nil {
			t.Fatal(err)
		}
		huge, err := rt.AddTimer(0, math.MaxUint64, 2) // fires once, then never
		if err != nil {
			t.Fatal(err)
		}
		one, err := rt.AddTimer(0, 0, 3)
		if err != nil {
			t.Fatal(err)
		}
		ev := make([]Event, 8)
		seen := map[uintptr]int{}
		deadline := time.Now().Add(testLimit(t))
		for seen[2] == 0 || seen[3] == 0 {
			n, err := rt.Wait(ev, 10*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ev[:n] {
				if e.Type == EventTimer {
					seen[e.Key]++
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("timers never fired: %v", seen)
			}
		}
		for i := 0; i < 5; i++ {
			n, _ := rt.Wait(ev, 2*time.Millisecond)
			for _, e := range ev[:n] {
				if e.Type == EventTimer {
					seen[e.Key]++
				}
			}
		}
		if seen[1] != 0 || seen[2] != 1 || seen[3] != 1 {
			t.Fatalf("timer firings %v (want far 0, huge-period 1, one-shot 1)", seen)
		}
		if err := rt.CancelTimer(one); !errors.Is(err, ErrNotFound) {
			t.Fatalf("cancel of a fired one-shot: %v", err)
		}
		for _, id := range []uint64{far, huge} {
			if err := rt.CancelTimer(id); err != nil {
				t.Fatalf("cancel %#x: %v", id, err)
			}
			if err := rt.CancelTimer(id); !errors.Is(err, ErrNotFound) {
				t.Fatalf("second cancel %#x: %v", id, err)
			}
		}
	})
}
