package libasync

import (
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"
)

func mustQueue(t *testing.T, capacity, max int, flags QueueFlags) *Queue {
	t.Helper()
	q, err := NewQueue(capacity, max, flags)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestQueueRejectsBadConfig(t *testing.T) {
	for _, c := range []struct {
		capacity, max int
		flags         QueueFlags
	}{{0, 8, 0}, {8, 0, 0}, {-1, 8, 0}, {8, 8, DropOldest | BlockWriter}, {8, 8, 0x80}} {
		if _, err := NewQueue(c.capacity, c.max, c.flags); !errors.Is(err, ErrInval) {
			t.Errorf("NewQueue(%d,%d,%#x) = %v, want ErrInval", c.capacity, c.max, c.flags, err)
		}
	}
}

func TestQueueFIFOAndCopy(t *testing.T) {
	q := mustQueue(t, 4, 8, 0)
	msg := []byte("abc")
	if err := q.Enqueue(msg); err != nil {
		t.Fatal(err)
	}
	msg[0] = 'X' // the queue holds a copy
	if err := q.Enqueue([]byte("defg")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	n, err := q.Dequeue(buf)
	if err != nil || string(buf[:n]) != "abc" {
		t.Fatalf("got %q, %v", buf[:n], err)
	}
	n, err = q.Dequeue(buf)
	if err != nil || string(buf[:n]) != "defg" {
		t.Fatalf("got %q, %v", buf[:n], err)
	}
	if _, err := q.Dequeue(buf); !errors.Is(err, ErrEmpty) {
		t.Fatalf("empty queue: %v", err)
	}
}

func TestQueueSizeErrors(t *testing.T) {
	q := mustQueue(t, 2, 4, 0)
	if err := q.Enqueue([]byte("12345")); !errors.Is(err, ErrTooBig) {
		t.Fatalf("oversize: %v", err)
	}
	if err := q.Enqueue(nil); !errors.Is(err, ErrInval) {
		t.Fatalf("empty message: %v", err)
	}
	q.Enqueue([]byte("abcd"))
	n, err := q.Dequeue(make([]byte, 2))
	if !errors.Is(err, ErrBufSize) || n != 4 {
		t.Fatalf("small buffer: n=%d err=%v", n, err)
	}
	if q.IsEmpty() {
		t.Fatal("message must stay at the head after ErrBufSize")
	}
}

func TestQueuePolicies(t *testing.T) {
	q := mustQueue(t, 3, 8, 0)
	for i := 0; i < 3; i++ {
		q.Enqueue([]byte{byte(i)})
	}
	if err := q.Enqueue([]byte{9}); !errors.Is(err, ErrFull) {
		t.Fatalf("no policy, full: %v", err)
	}
	d := mustQueue(t, 3, 8, DropOldest)
	for i := 0; i < 10; i++ {
		if err := d.Enqueue([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	st := d.Stats()
	if st.Dropped != 7 || st.CurrentSize != 3 || st.EnqueueCount != 10 {
		t.Fatalf("drop-oldest stats %+v", st)
	}
	buf := make([]byte, 1)
	for want := 7; want < 10; want++ {
		if _, err := d.Dequeue(buf); err != nil || int(buf[0]) != want {
			t.Fatalf("survivor %d: got %d %v", want, buf[0], err)
		}
	}
}

func TestQueueBlockWriterWokenByDequeueClearClose(t *testing.T) {
	for _, how := range []string{"dequeue", "clear", "close"} {
		q := mustQueue(t, 1, 8, BlockWriter)
		q.Enqueue([]byte("a"))
		done := make(chan error, 1)
		go func() { done <- q.Enqueue([]byte("b")) }()
		select {
		case err := <-done:
			t.Fatalf("%s: writer did not block: %v", how, err)
		case <-time.After(20 * time.Millisecond):
		}
		switch how {
		case "dequeue":
			q.Dequeue(make([]byte, 8))
		case "clear":
			q.Clear()
		case "close":
			q.Close()
		}
		err := <-done
		if how == "close" {
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("close: writer got %v", err)
			}
		} else if err != nil {
			t.Fatalf("%s: writer got %v", how, err)
		}
	}
}

func TestQueueTimeouts(t *testing.T) {
	q := mustQueue(t, 1, 8, 0)
	start := time.Now()
	if _, err := q.DequeueTimeout(make([]byte, 8), 30*time.Millisecond); !errors.Is(err, ErrTimedOut) {
		t.Fatalf("dequeue: %v", err)
	}
	if time.Since(start) < 30*time.Millisecond {
		t.Fatal("dequeue timed out early")
	}
	q.Enqueue([]byte("x"))
	if err := q.EnqueueTimeout([]byte("y"), 10*time.Millisecond); !errors.Is(err, ErrTimedOut) {
		t.Fatalf("enqueue: %v", err)
	}
	// A waiting reader is woken by a writer.
	r := mustQueue(t, 1, 8, 0)
	got := make(chan string, 1)
	go func() {
		b := make([]byte, 8)
		n, err := r.DequeueTimeout(b, -1)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(b[:n])
	}()
	time.Sleep(10 * time.Millisecond)
	r.Enqueue([]byte("hi"))
	if s := <-got; s != "hi" {
		t.Fatalf("reader got %q", s)
	}
}

// Many producers and consumers: every message arrives exactly once and in
// order per producer, whatever the policy that lets writers wait.
func TestQueueMPMCSequences(t *testing.T) {
	const producers, consumers, per = 4, 4, 20000
	q := mustQueue(t, 64, 16, BlockWriter)
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			var b [16]byte
			for i := 0; i < per; i++ {
				binary.LittleEndian.PutUint64(b[:], uint64(p))
				binary.LittleEndian.PutUint64(b[8:], uint64(i))
				if err := q.Enqueue(b[:]); err != nil {
					t.Error(err)
					return
				}
			}
		}(p)
	}
	type rec struct{ p, i uint64 }
	out := make(chan []rec, consumers)
	var total sync.WaitGroup
	for c := 0; c < consumers; c++ {
		total.Add(1)
		go func() {
			defer total.Done()
			var mine []rec
			b := make([]byte, 16)
			for {
				_, err := q.DequeueTimeout(b, 200*time.Millisecond)
				if errors.Is(err, ErrTimedOut) {
					break
				}
				if err != nil {
					t.Error(err)
					break
				}
				mine = append(mine, rec{binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])})
			}
			out <- mine
		}()
	}
	wg.Wait()
	total.Wait()
	close(out)
	seen := make([][]bool, producers)
	for p := range seen {
		seen[p] = make([]bool, per)
	}
	n := 0
	for mine := range out {
		last := make([]int64, producers)
		for i := range last {
			last[i] = -1
		}
		for _, r := range mine {
			if seen[r.p][r.i] {
				t.Fatalf("duplicate %d/%d", r.p, r.i)
			}
			seen[r.p][r.i] = true
			if int64(r.i) <= last[r.p] {
				t.Fatalf("reordered within one consumer: %d after %d", r.i, last[r.p])
			}
			last[r.p] = int64(r.i)
			n++
		}
	}
	if n != producers*per {
		t.Fatalf("got %d messages, want %d", n, producers*per)
	}
}

func TestQueueAttachPostsOncePerTransition(t *testing.T) {
	rt, err := NewRuntime()
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	q := mustQueue(t, 8, 8, SignalOnData)
	if err := mustQueue(t, 8, 8, 0).Attach(rt, 1, 2); !errors.Is(err, ErrInval) {
		t.Fatalf("attach without SignalOnData: %v", err)
	}
	if err := q.Attach(rt, 7, 99); err != nil {
		t.Fatal(err)
	}
	q.Enqueue([]byte("a"))
	q.Enqueue([]byte("b")) // not a transition
	ev := make([]Event, 8)
	n, err := rt.Wait(ev, 0)
	if err != nil || n != 1 || ev[0].Type != EventCompletion || ev[0].Key != 7 || ev[0].Data != 99 {
		t.Fatalf("n=%d err=%v ev=%+v", n, err, ev[0])
	}
	q.Dequeue(make([]byte, 8))
	q.Dequeue(make([]byte, 8))
	q.Enqueue([]byte("c")) // transition again
	if n, _ := rt.Wait(ev, 0); n != 1 {
		t.Fatalf("second transition: %d events", n)
	}
}
