package libasync

// Tests of Queue: configuration and bad input, FIFO order and copies, the
// full policies, blocking and timeouts (huge and negative ones too), growth
// of the ring, many producers and consumers, Close racing every method,
// and Attach to a runtime.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"sync"
	"sync/atomic"
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

// A queue of the largest capacity (2^30) costs memory only for what it
// holds: its ring grows with what is queued, and it works as a queue through
// several growths, wrapped or not. Capacities and sizes out of range are
// ErrInval.
func TestQueueHugeCapacityGrowsWithUse(t *testing.T) {
	q, err := NewQueue(1<<30, 1<<40, BlockWriter)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, err := NewQueue(1<<30+1, 1, 0); !errors.Is(err, ErrInval) {
		t.Fatalf("capacity 2^30+1: %v", err)
	}
	for _, c := range []int{-1, 0, math.MinInt} {
		if _, err := NewQueue(c, 1, 0); !errors.Is(err, ErrInval) {
			t.Fatalf("capacity %d: %v", c, err)
		}
		if _, err := NewQueue(1, c, 0); !errors.Is(err, ErrInval) {
			t.Fatalf("maxMsg %d: %v", c, err)
		}
	}
	// It works as a queue through several growths, wrapped or not.
	buf := make([]byte, 8)
	next, want := uint64(0), uint64(0)
	for round := 0; round < 3000; round++ {
		for i := 0; i < round%7+1; i++ {
			binary.LittleEndian.PutUint64(buf, next)
			next++
			if err := q.Enqueue(buf); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < round%5; i++ {
			n, err := q.Dequeue(buf)
			if errors.Is(err, ErrEmpty) {
				break
			}
			if err != nil || n != 8 || binary.LittleEndian.Uint64(buf) != want {
				t.Fatalf("dequeue: n=%d err=%v got %d want %d", n, err, binary.LittleEndian.Uint64(buf), want)
			}
			want++
		}
	}
	st := q.Stats()
	if st.Capacity != 1<<30 || uint64(st.CurrentSize) != next-want || q.IsFull() {
		t.Fatalf("stats %+v", st)
	}
}

// A small queue grown to its capacity keeps FIFO order and its full
// policies (capacity not a power of two, head anywhere).
func TestQueueGrowthKeepsOrderAndPolicies(t *testing.T) {
	for _, flags := range []QueueFlags{0, DropOldest, BlockWriter} {
		q := mustQueue(t, 37, 8, flags)
		var model []uint64
		buf := make([]byte, 8)
		seq := uint64(0)
		for step := 0; step < 5000; step++ {
			if step%3 != 2 {
				binary.LittleEndian.PutUint64(buf, seq)
				err := q.EnqueueWait(buf, 0, false)
				switch {
				case len(model) < 37:
					if err != nil {
						t.Fatalf("flags %d: enqueue: %v", flags, err)
					}
					model = append(model, seq)
				case flags == DropOldest:
					if err != nil {
						t.Fatalf("flags %d: enqueue drop: %v", flags, err)
					}
					model = append(model[1:], seq)
				default:
					if !errors.Is(err, ErrFull) {
						t.Fatalf("flags %d: enqueue full: %v", flags, err)
					}
				}
				seq++
			} else if len(model) > 0 && step%7 != 0 {
				n, err := q.Dequeue(buf)
				if err != nil || n != 8 || binary.LittleEndian.Uint64(buf) != model[0] {
					t.Fatalf("flags %d: dequeue %d %v got %d want %d", flags, n, err, binary.LittleEndian.Uint64(buf), model[0])
				}
				model = model[1:]
			}
			if q.IsFull() != (len(model) == 37) || q.Stats().CurrentSize != len(model) {
				t.Fatalf("flags %d: full=%v size=%d model=%d", flags, q.IsFull(), q.Stats().CurrentSize, len(model))
			}
		}
		q.Clear()
		if !q.IsEmpty() {
			t.Fatal("not empty after Clear")
		}
		q.Close()
	}
}

// Bad input to the queue: documented errors, nothing lost.
func TestQueueBadInputLosesNothing(t *testing.T) {
	q := mustQueue(t, 2, 4, 0)
	defer q.Close()
	for _, d := range [][]byte{nil, {}} {
		if err := q.Enqueue(d); !errors.Is(err, ErrInval) {
			t.Fatalf("empty message: %v", err)
		}
	}
	if err := q.EnqueueTimeout(make([]byte, 5), -time.Hour); !errors.Is(err, ErrTooBig) {
		t.Fatalf("oversized: %v", err)
	}
	if err := q.Enqueue([]byte("abcd")); err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{nil, {}, make([]byte, 3)} {
		if n, err := q.DequeueTimeout(b, time.Duration(math.MaxInt64)); !errors.Is(err, ErrBufSize) || n != 4 {
			t.Fatalf("small buffer %d: n=%d err=%v", len(b), n, err)
		}
	}
	q.Enqueue([]byte("e"))
	// Full, no policy: a huge or negative timeout still fails at once
	// when not allowed to wait, and times out when allowed to, briefly.
	if err := q.EnqueueWait([]byte("f"), time.Duration(math.MaxInt64), false); !errors.Is(err, ErrFull) {
		t.Fatalf("full, no wait: %v", err)
	}
	if err := q.EnqueueTimeout([]byte("f"), time.Millisecond); !errors.Is(err, ErrTimedOut) {
		t.Fatalf("full, 1ms: %v", err)
	}
	b := make([]byte, 4)
	if n, err := q.Dequeue(b); err != nil || string(b[:n]) != "abcd" {
		t.Fatalf("head after the bad calls: %q %v", b[:n], err)
	}
	if n, err := q.DequeueTimeout(b, math.MinInt64); err != nil || string(b[:n]) != "e" {
		t.Fatalf("second: %q %v", b[:n], err)
	}
	if _, err := q.DequeueTimeout(b, time.Millisecond); !errors.Is(err, ErrTimedOut) {
		t.Fatalf("empty, 1ms: %v", err)
	}
	if st := q.Stats(); st.EnqueueCount != 2 || st.DequeueCount != 2 || st.Dropped != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Concurrent producers and consumers under each full policy: every message
// arrives whole (length and checksum), at most once, in each producer's
// order; nothing is lost but what DropOldest counts as dropped.
func TestQueueMPMCWholeMessagesOncePerPolicy(t *testing.T) {
	const producers, consumers, per = 4, 3, 3000
	for _, tc := range []struct {
		name  string
		flags QueueFlags
	}{{"fail", 0}, {"drop_oldest", DropOldest}, {"block_writer", BlockWriter}} {
		t.Run(tc.name, func(t *testing.T) {
			q := mustQueue(t, 16, 64, tc.flags)
			defer q.Close()
			var prodWG sync.WaitGroup
			for p := 0; p < producers; p++ {
				prodWG.Add(1)
				go func(p int) {
					defer prodWG.Done()
					buf := make([]byte, 64)
					for i := 0; i < per; i++ {
						msg := checkedMsg(buf, p, i)
						err := q.EnqueueTimeout(msg, 50*time.Millisecond)
						for errors.Is(err, ErrTimedOut) {
							err = q.EnqueueTimeout(msg, 50*time.Millisecond)
						}
						if err != nil {
							t.Errorf("enqueue: %v", err)
							return
						}
					}
				}(p)
			}
			var mu sync.Mutex
			last := make([]int64, producers)
			for i := range last {
				last[i] = -1
			}
			var got atomic.Uint64
			stop := make(chan struct{})
			var consWG sync.WaitGroup
			for c := 0; c < consumers; c++ {
				consWG.Add(1)
				go func() {
					defer consWG.Done()
					buf := make([]byte, 64)
					for {
						n, err := q.DequeueTimeout(buf, 5*time.Millisecond)
						if errors.Is(err, ErrTimedOut) {
							select {
							case <-stop:
								return
							default:
								continue
							}
						}
						if err != nil {
							t.Errorf("dequeue: %v", err)
							return
						}
						p, i, err := readCheckedMsg(buf[:n], producers)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						// Several consumers: one producer's messages may
						// come out of order across consumers, never twice.
						if int64(i) == last[p] {
							t.Errorf("duplicate p=%d i=%d", p, i)
						}
						if int64(i) > last[p] {
							last[p] = int64(i)
						}
						mu.Unlock()
						got.Add(1)
					}
				}()
			}
			within(t, "producers", prodWG.Wait)
			// Wait until everything not dropped was taken.
			deadline := time.Now().Add(testLimit(t))
			for {
				st := q.Stats()
				if got.Load()+st.Dropped == producers*per && st.CurrentSize == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("got %d + dropped %d != %d (size %d)", got.Load(), st.Dropped, producers*per, st.CurrentSize)
				}
				time.Sleep(time.Millisecond)
			}
			close(stop)
			within(t, "consumers", consWG.Wait)
			st := q.Stats()
			if st.EnqueueCount != producers*per || st.DequeueCount != got.Load() ||
				got.Load()+st.Dropped != producers*per || (tc.flags != DropOldest && st.Dropped != 0) {
				t.Fatalf("stats %+v got %d", st, got.Load())
			}
		})
	}
}

// checkedMsg writes message i of producer p into buf (64 bytes) and returns
// it: 12 to 63 bytes long depending on p and i, carrying p, i and the
// checksum of its payload.
func checkedMsg(buf []byte, p, i int) []byte {
	n := 12 + (i*7+p)%52
	binary.LittleEndian.PutUint32(buf[0:], uint32(p))
	binary.LittleEndian.PutUint32(buf[4:], uint32(i))
	for k := 12; k < n; k++ {
		buf[k] = byte(i*31 + k + p)
	}
	binary.LittleEndian.PutUint32(buf[8:], crc32.ChecksumIEEE(buf[12:n]))
	return buf[:n]
}

// readCheckedMsg returns the producer and index of a message made by
// checkedMsg, or an error if msg is torn or not such a message.
func readCheckedMsg(msg []byte, producers int) (p, i int, err error) {
	if len(msg) < 12 || crc32.ChecksumIEEE(msg[12:]) != binary.LittleEndian.Uint32(msg[8:]) {
		return 0, 0, fmt.Errorf("torn message (len %d)", len(msg))
	}
	p, i = int(binary.LittleEndian.Uint32(msg)), int(binary.LittleEndian.Uint32(msg[4:]))
	if p >= producers || len(msg) != 12+(i*7+p)%52 {
		return 0, 0, fmt.Errorf("bad message p=%d i=%d len=%d", p, i, len(msg))
	}
	return p, i, nil
}

// One consumer: each producer's messages come in order, exactly once, with
// DropOldest losing only what it counts.
func TestQueueSingleConsumerSeesProducerOrder(t *testing.T) {
	const producers, per = 3, 4000
	for _, flags := range []QueueFlags{DropOldest, BlockWriter} {
		q := mustQueue(t, 8, 8, flags)
		var wg sync.WaitGroup
		for p := 0; p < producers; p++ {
			wg.Add(1)
			go func(p int) {
				defer wg.Done()
				var b [8]byte
				for i := 0; i < per; i++ {
					binary.LittleEndian.PutUint32(b[:], uint32(p))
					binary.LittleEndian.PutUint32(b[4:], uint32(i))
					if err := q.EnqueueTimeout(b[:], testLimit(t)); err != nil {
						t.Errorf("enqueue: %v", err)
						return
					}
				}
			}(p)
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		last := []int64{-1, -1, -1}
		var got uint64
		buf := make([]byte, 8)
		deadline := time.Now().Add(testLimit(t))
	loop:
		for {
			n, err := q.DequeueTimeout(buf, time.Millisecond)
			switch {
			case err == nil:
				p, i := binary.LittleEndian.Uint32(buf), int64(binary.LittleEndian.Uint32(buf[4:]))
				if n != 8 || p >= producers || i <= last[p] {
					t.Fatalf("flags %d: p=%d i=%d after %d", flags, p, i, last[p])
				}
				if flags == BlockWriter && i != last[p]+1 {
					t.Fatalf("block_writer lost p=%d %d..%d", p, last[p], i)
				}
				last[p] = i
				got++
			case errors.Is(err, ErrTimedOut):
				select {
				case <-done:
					if q.IsEmpty() {
						break loop
					}
				default:
				}
			default:
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatal("consumer: no end")
			}
		}
		if st := q.Stats(); got+st.Dropped != producers*per {
			t.Fatalf("flags %d: got %d dropped %d", flags, got, st.Dropped)
		}
		q.Close()
	}
}

// Close racing every queue method: no panic, no hang, blocked callers and
// every later call get ErrClosed.
func TestQueueCloseRacingEveryMethod(t *testing.T) {
	for round := 0; round < 20; round++ {
		rt, err := NewRuntime()
		if err != nil {
			t.Fatal(err)
		}
		q := mustQueue(t, 4, 16, BlockWriter|SignalOnData)
		closeWhileBusy(t, 8, time.Duration(round%4)*time.Millisecond, func(g int) func(i int) error {
			buf := make([]byte, 16)
			return func(i int) error { return queueOp(q, rt, (g+i)%9, buf) }
		}, q.Close)
		if err := q.Enqueue([]byte("z")); !errors.Is(err, ErrClosed) {
			t.Fatalf("enqueue after close: %v", err)
		}
		if _, err := q.DequeueTimeout(make([]byte, 4), -1); !errors.Is(err, ErrClosed) {
			t.Fatalf("dequeue after close: %v", err)
		}
		if err := q.Attach(rt, 1, 1); !errors.Is(err, ErrClosed) {
			t.Fatalf("attach after close: %v", err)
		}
		q.Close() // twice: harmless
		if !q.IsEmpty() || q.IsFull() {
			t.Fatal("closed queue not empty")
		}
		rt.Close()
	}
}

// queueOp is operation op (0 to 8) of q's methods, with the errors a
// concurrent caller may expect (empty, full, timed out) taken as success.
func queueOp(q *Queue, rt *Runtime, op int, buf []byte) error {
	var err error
	switch op {
	case 0:
		err = q.Enqueue([]byte("hello"))
	case 1:
		err = q.EnqueueTimeout([]byte("x"), -1)
	case 2:
		_, err = q.DequeueTimeout(buf, -1)
	case 3:
		_, err = q.Dequeue(buf)
	case 4:
		q.Clear()
		q.IsEmpty()
		q.IsFull()
		q.Stats()
	case 5:
		err = q.Attach(rt, 1, 2)
	case 6:
		err = q.Attach(nil, 0, 0)
	case 7:
		err = q.EnqueueWait([]byte("y"), time.Millisecond, true)
	case 8:
		_, err = q.DequeueTimeout(buf, time.Millisecond)
	}
	if errors.Is(err, ErrEmpty) || errors.Is(err, ErrTimedOut) || errors.Is(err, ErrFull) {
		return nil
	}
	return err
}

// Attach: to a closed runtime (the queue then posts nothing, as after the
// C runtime's deinit), twice (the second replaces the first), nil detaches.
func TestQueueAttachClosedRuntimeReattachDetach(t *testing.T) {
	rt1, err := NewRuntime()
	if err != nil {
		t.Fatal(err)
	}
	rt2, err := NewRuntime()
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.Close()
	rt1.Close()
	q := mustQueue(t, 4, 4, SignalOnData)
	defer q.Close()
	if err := q.Attach(rt1, 1, 1); err != nil {
		t.Fatalf("attach to a closed runtime: %v", err)
	}
	if err := q.Enqueue([]byte("a")); err != nil {
		t.Fatalf("enqueue with a closed runtime attached: %v", err)
	}
	if err := q.Attach(rt2, 2, 2); err != nil { // non-empty: posts at once
		t.Fatal(err)
	}
	if err := q.Attach(rt2, 3, 3); err != nil { // again: posts again, new key
		t.Fatal(err)
	}
	ev := make([]Event, 8)
	n, err := rt2.Wait(ev, testLimit(t))
	if err != nil || n != 2 || ev[0].Key != 2 || ev[1].Key != 3 {
		t.Fatalf("n=%d err=%v ev=%+v", n, err, ev[:n])
	}
	buf := make([]byte, 4)
	q.Dequeue(buf)
	q.Enqueue([]byte("b"))
	if n, err := rt2.Wait(ev, testLimit(t)); err != nil || n != 1 || ev[0].Key != 3 {
		t.Fatalf("after re-attach n=%d err=%v ev=%+v", n, err, ev[:n])
	}
	q.Attach(nil, 0, 0)
	q.Dequeue(buf)
	q.Enqueue([]byte("c"))
	if n, err := rt2.Wait(ev, 0); err != nil || n != 0 {
		t.Fatalf("detached: n=%d err=%v", n, err)
	}
	if err := mustQueue(t, 1, 1, 0).Attach(rt2, 1, 1); !errors.Is(err, ErrInval) {
		t.Fatalf("attach without SignalOnData: %v", err)
	}
}

// Blocked queue callers with huge and negative timeouts (time.Now().Add
// overflows for MaxInt64) are woken by the other side, and by Close.
func TestQueueHugeTimeoutWaitersWoken(t *testing.T) {
	for _, to := range []time.Duration{-1, math.MinInt64, math.MaxInt64, math.MaxInt64 - 1} {
		q := mustQueue(t, 1, 4, BlockWriter)
		res := make(chan error, 2)
		buf := make([]byte, 4)
		go func() { _, err := q.DequeueTimeout(buf, to); res <- err }()
		time.Sleep(time.Millisecond) // usually blocked by now; either way it must get the message
		q.Enqueue([]byte("a"))
		select {
		case err := <-res:
			if err != nil || buf[0] != 'a' {
				t.Fatalf("timeout %d: dequeue %v %q", to, err, buf[:1])
			}
		case <-time.After(testLimit(t)):
			t.Fatalf("timeout %d: blocked reader not woken by Enqueue", to)
		}
		q.Enqueue([]byte("b"))
		go func() { res <- q.EnqueueTimeout([]byte("c"), to) }()
		time.Sleep(time.Millisecond)
		if n, err := q.DequeueTimeout(buf, time.Second); err != nil || string(buf[:n]) != "b" {
			t.Fatalf("timeout %d: %q %v", to, buf[:n], err)
		}
		select {
		case err := <-res:
			if err != nil {
				t.Fatalf("timeout %d: blocked writer: %v", to, err)
			}
		case <-time.After(testLimit(t)):
			t.Fatalf("timeout %d: blocked writer not woken by Dequeue", to)
		}
		go func() { res <- q.EnqueueTimeout([]byte("d"), to) }() // full again: blocks
		go func() { time.Sleep(time.Millisecond); q.Close() }()
		select {
		case err := <-res:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("timeout %d: writer at Close: %v", to, err)
			}
		case <-time.After(testLimit(t)):
			t.Fatalf("timeout %d: blocked writer not woken by Close", to)
		}
	}
}
