//go:build linux

package libasync

// Adversarial pass 15: the Go API (Queue, Runtime, the ports) used as a Go
// programmer would, and misused. Every wait is bounded: a hang fails.

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/libasync/libasync/port"
	"golang.org/x/sys/unix"
)

// adv15Limit is how long any one blocking step may take before the test
// fails instead of hanging: well under the test's own deadline.
func adv15Limit(t *testing.T) time.Duration {
	d := 20 * time.Second
	if dl, ok := t.Deadline(); ok {
		if r := time.Until(dl) / 2; r < d {
			d = r
		}
	}
	return d
}

// adv15Within runs f in a goroutine and fails the test if it does not
// return within adv15Limit.
func adv15Within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(adv15Limit(t)):
		t.Fatalf("%s: did not return (hang)", what)
	}
}

func adv15Pipe(t *testing.T) (r, w int) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0], p[1]
}

// An fd number above the kernel's int range named another descriptor: the
// pollers passed it to epoll_ctl/fstat/poll, which keep the low 32 bits, so
// Remove(fd + 2^32) silently removed fd's registration (epoll: its events
// were never reported again), Add(fd + 2^32) said ErrExists (epoll) or
// watched fd a second time (poll). Such a number names no descriptor:
// ErrBadFd, and fd's own registration is untouched.
func TestAdv15FdNumberBeyondInt32(t *testing.T) {
	if math.MaxInt == math.MaxInt32 {
		t.Skip("32-bit int")
	}
	backends(t, func(t *testing.T, rt *Runtime) {
		r, w := adv15Pipe(t)
		if err := rt.Add(r, EventRead, 7); err != nil {
			t.Fatal(err)
		}
		for _, huge := range []int{r + 1<<32, r - 1<<32, math.MaxInt, 1 << 31} {
			if err := rt.Add(huge, EventRead, 8); !errors.Is(err, ErrBadFd) {
				t.Errorf("Add(%d): %v, want ErrBadFd", huge, err)
			}
			if err := rt.Modify(huge, EventWrite); !errors.Is(err, ErrBadFd) {
				t.Errorf("Modify(%d): %v, want ErrBadFd", huge, err)
			}
			if err := rt.Remove(huge); !errors.Is(err, ErrBadFd) {
				t.Errorf("Remove(%d): %v, want ErrBadFd", huge, err)
			}
		}
		unix.Write(w, []byte("x"))
		ev := make([]Event, 8)
		n, err := rt.Wait(ev, 2*time.Second) // ready at once: no need to wait longer
		if err != nil || n != 1 || ev[0].Fd != r || ev[0].Context != 7 || ev[0].Type&EventRead == 0 {
			t.Fatalf("after the bad calls: n=%d err=%v ev=%+v (want one read event of fd %d ctx 7)", n, err, ev[:n], r)
		}
		if err := rt.Remove(r); err != nil {
			t.Fatalf("Remove(%d): %v", r, err)
		}
	})
}

// NewQueue(1<<30, ...) accepted (the documented maximum) allocated the whole
// slot array at once: 24 GiB, a fatal "out of memory" of the process on a
// smaller host, not an error. The ring grows with what is queued.
func TestAdv15QueueHugeCapacityIsLazy(t *testing.T) {
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
func TestAdv15QueueGrowthKeepsPolicies(t *testing.T) {
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
func TestAdv15QueueBadInput(t *testing.T) {
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
func TestAdv15QueueMPMCNoLossNoTear(t *testing.T) {
	const producers, consumers, per = 4, 3, 3000
	for _, tc := range []struct {
		name  string
		flags QueueFlags
	}{{"fail", 0}, {"drop_oldest", DropOldest}, {"block_writer", BlockWriter}} {
		t.Run(tc.name, func(t *testing.T) {
			q := mustQueue(t, 16, 64, tc.flags)
			defer q.Close()
			var sent atomic.Uint64
			var prodWG sync.WaitGroup
			for p := 0; p < producers; p++ {
				prodWG.Add(1)
				go func(p int) {
					defer prodWG.Done()
					msg := make([]byte, 64)
					for i := 0; i < per; i++ {
						n := 12 + (i*7+p)%52
						binary.LittleEndian.PutUint32(msg[0:], uint32(p))
						binary.LittleEndian.PutUint32(msg[4:], uint32(i))
						for k := 12; k < n; k++ {
							msg[k] = byte(i*31 + k + p)
						}
						binary.LittleEndian.PutUint32(msg[8:], crc32.ChecksumIEEE(msg[12:n]))
						for {
							err := q.EnqueueTimeout(msg[:n], 50*time.Millisecond)
							if err == nil {
								break
							}
							if !errors.Is(err, ErrTimedOut) {
								t.Errorf("enqueue: %v", err)
								return
							}
						}
						sent.Add(1)
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
						if n < 12 || crc32.ChecksumIEEE(buf[12:n]) != binary.LittleEndian.Uint32(buf[8:]) {
							t.Errorf("torn message (len %d)", n)
							return
						}
						p, i := binary.LittleEndian.Uint32(buf), binary.LittleEndian.Uint32(buf[4:])
						if int(p) >= producers || n != 12+(int(i)*7+int(p))%52 {
							t.Errorf("bad message p=%d i=%d len=%d", p, i, n)
							return
						}
						mu.Lock()
						// Several consumers: one producer's messages may be
						// reported out of order across consumers, but never
						// twice; order is checked per dequeue under mu only
						// loosely (see below).
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
			adv15Within(t, "producers", prodWG.Wait)
			// Wait until everything not dropped was taken.
			deadline := time.Now().Add(adv15Limit(t))
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
			adv15Within(t, "consumers", consWG.Wait)
			st := q.Stats()
			if st.EnqueueCount != producers*per || st.DequeueCount != got.Load() ||
				got.Load()+st.Dropped != producers*per || (tc.flags != DropOldest && st.Dropped != 0) {
				t.Fatalf("stats %+v got %d", st, got.Load())
			}
		})
	}
}

// One consumer: each producer's messages come in order, exactly once, with
// DropOldest losing only what it counts.
func TestAdv15QueueSingleConsumerOrder(t *testing.T) {
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
					if err := q.EnqueueTimeout(b[:], adv15Limit(t)); err != nil {
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
		deadline := time.Now().Add(adv15Limit(t))
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
func TestAdv15QueueCloseRacesEverything(t *testing.T) {
	for round := 0; round < 20; round++ {
		rt, err := NewRuntime()
		if err != nil {
			t.Fatal(err)
		}
		q := mustQueue(t, 4, 16, BlockWriter|SignalOnData)
		var wg sync.WaitGroup
		start := make(chan struct{})
		bad := make(chan error, 64)
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				<-start
				buf := make([]byte, 16)
				for i := 0; ; i++ {
					var err error
					switch (g + i) % 9 {
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
					if errors.Is(err, ErrClosed) {
						return
					}
					if err != nil && !errors.Is(err, ErrEmpty) && !errors.Is(err, ErrTimedOut) && !errors.Is(err, ErrFull) {
						bad <- err
						return
					}
				}
			}(g)
		}
		close(start)
		time.Sleep(time.Duration(round%4) * time.Millisecond)
		q.Close()
		adv15Within(t, "queue users after Close", wg.Wait)
		close(bad)
		for err := range bad {
			t.Fatalf("unexpected error: %v", err)
		}
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

// Attach: to a closed runtime (the queue then posts nothing, as after the
// C runtime's deinit), twice (the second replaces the first), nil detaches.
func TestAdv15QueueAttachClosedAndTwice(t *testing.T) {
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
	n, err := rt2.Wait(ev, adv15Limit(t))
	if err != nil || n != 2 || ev[0].Key != 2 || ev[1].Key != 3 {
		t.Fatalf("n=%d err=%v ev=%+v", n, err, ev[:n])
	}
	buf := make([]byte, 4)
	q.Dequeue(buf)
	q.Enqueue([]byte("b"))
	if n, err := rt2.Wait(ev, adv15Limit(t)); err != nil || n != 1 || ev[0].Key != 3 {
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

// Close racing every Runtime method, both backends: no panic, no hang, and
// afterwards every method says ErrClosed.
func TestAdv15RuntimeCloseRacesEverything(t *testing.T) {
	for _, name := range port.Backends() {
		t.Run(name, func(t *testing.T) {
			for round := 0; round < 30; round++ {
				p, err := port.NewNamed(name)
				if err != nil {
					t.Fatal(err)
				}
				rt := NewRuntimeWith(p)
				r, _ := adv15Pipe(t)
				var wg sync.WaitGroup
				start := make(chan struct{})
				var closing atomic.Bool
				bad := make(chan error, 64)
				for g := 0; g < 8; g++ {
					wg.Add(1)
					go func(g int) {
						defer wg.Done()
						<-start
						ev := make([]Event, 4)
						var ids []uint64
						for i := 0; ; i++ {
							var err error
							switch (g + i) % 10 {
							case 0:
								_, err = rt.Wait(ev, 2*time.Millisecond)
								if errors.Is(err, ErrBusy) {
									err = nil
								}
							case 1:
								err = rt.Post(uintptr(g), uintptr(i))
							case 2:
								err = rt.Wakeup()
							case 3:
								var id uint64
								id, err = rt.AddTimer(uint64(i%3), uint64(i%2), 1)
								if err == nil {
									ids = append(ids, id)
								}
							case 4:
								if len(ids) > 0 {
									err = rt.CancelTimer(ids[0])
									ids = ids[1:]
									if errors.Is(err, ErrNotFound) {
										err = nil // fired meanwhile
									}
								}
							case 5:
								err = rt.Add(r, EventRead, 1)
								if errors.Is(err, ErrExists) {
									err = nil
								}
							case 6:
								err = rt.Modify(r, EventRead|EventWrite)
								if errors.Is(err, ErrNotFound) {
									err = nil
								}
							case 7:
								err = rt.ModifyContext(r, EventRead, 9)
								if errors.Is(err, ErrNotFound) {
									err = nil
								}
							case 8:
								err = rt.Remove(r)
								if errors.Is(err, ErrNotFound) {
									err = nil
								}
							case 9:
								_, err = rt.Wait(ev, -1)
								if errors.Is(err, ErrBusy) {
									err = nil
								}
							}
							if errors.Is(err, ErrClosed) {
								if closing.Load() {
									return
								}
								bad <- errors.New("ErrClosed before Close")
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
				time.Sleep(time.Duration(round%5) * time.Millisecond)
				closing.Store(true)
				adv15Within(t, "Close", func() {
					if err := rt.Close(); err != nil {
						t.Errorf("Close: %v", err)
					}
				})
				// A Wait(-1) that started after the last Ring and before
				// shut cannot exist: Close waits for the waiter; those
				// still trying must all see ErrClosed now.
				adv15Within(t, "callers after Close", wg.Wait)
				close(bad)
				for err := range bad {
					t.Fatalf("round %d: %v", round, err)
				}
				adv15AllClosed(t, rt, r)
			}
		})
	}
}

func adv15AllClosed(t *testing.T, rt *Runtime, fd int) {
	t.Helper()
	ev := make([]Event, 1)
	checks := map[string]error{
		"Close":       rt.Close(),
		"Post":        rt.Post(1, 1),
		"Wakeup":      rt.Wakeup(),
		"Add":         rt.Add(fd, EventRead, 0),
		"Modify":      rt.Modify(fd, EventRead),
		"ModifyCtx":   rt.ModifyContext(fd, EventRead, 1),
		"Remove":      rt.Remove(fd),
		"CancelTimer": rt.CancelTimer(1),
	}
	_, checks["AddTimer"] = rt.AddTimer(1, 0, 0)
	_, checks["Wait"] = rt.Wait(ev, -1)
	_, checks["Wait0"] = rt.Wait(ev, 0)
	for what, err := range checks {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", what, err)
		}
	}
}

// Bad input to a runtime: documented errors, no panic, the runtime intact.
func TestAdv15RuntimeBadInput(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		r, w := adv15Pipe(t)
		if _, err := rt.Wait(nil, 0); !errors.Is(err, ErrInval) {
			t.Fatalf("Wait(nil): %v", err)
		}
		if _, err := rt.Wait([]Event{}, -1); !errors.Is(err, ErrInval) {
			t.Fatalf("Wait(empty): %v", err)
		}
		for _, fd := range []int{-1, math.MinInt} {
			if err := rt.Add(fd, EventRead, 0); !errors.Is(err, ErrBadFd) {
				t.Fatalf("Add(%d): %v", fd, err)
			}
			if err := rt.Remove(fd); !errors.Is(err, ErrBadFd) {
				t.Fatalf("Remove(%d): %v", fd, err)
			}
			if err := rt.Modify(fd, EventRead); !errors.Is(err, ErrBadFd) {
				t.Fatalf("Modify(%d): %v", fd, err)
			}
		}
		if err := rt.Add(r, 0x80, 0); !errors.Is(err, ErrInval) {
			t.Fatalf("unknown event bits: %v", err)
		}
		if err := rt.Remove(r); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Remove of an unregistered fd: %v", err)
		}
		if err := rt.Modify(r, EventRead); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Modify of an unregistered fd: %v", err)
		}
		// A descriptor number that is not open.
		dead, _ := unix.Dup(r)
		unix.Close(dead)
		if err := rt.Add(dead, EventRead, 0); !errors.Is(err, ErrBadFd) {
			t.Fatalf("Add of a closed fd: %v", err)
		}
		if err := rt.Add(r, EventRead, 5); err != nil {
			t.Fatal(err)
		}
		if err := rt.Add(r, EventWrite, 6); !errors.Is(err, ErrExists) {
			t.Fatalf("duplicate Add: %v", err)
		}
		// Timer ids never issued, cancelled, or of a fired one-shot.
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
		deadline := time.Now().Add(adv15Limit(t))
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
		// After all that, the fd still works, with its context.
		unix.Write(w, []byte("x"))
		n, err := rt.Wait(ev, adv15Limit(t))
		if err != nil || n != 1 || ev[0].Fd != r || ev[0].Context != 5 {
			t.Fatalf("n=%d err=%v ev=%+v", n, err, ev[:n])
		}
	})
}

// Huge and negative Wait timeouts: a Wait that may sleep for ever (or for
// MaxInt64 ns, whose deadline overflows) still ends on Wakeup, on a Post and
// on a timer.
func TestAdv15WaitHugeTimeouts(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		ev := make([]Event, 4)
		for _, to := range []time.Duration{-1, math.MinInt64, math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 / 2} {
			for _, how := range []string{"wakeup", "post", "timer"} {
				res := make(chan error, 1)
				var n int
				go func() {
					var err error
					n, err = rt.Wait(ev, to)
					res <- err
				}()
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
				select {
				case err := <-res:
					if err != nil || (how != "wakeup" && n != 1) {
						t.Fatalf("timeout %d, %s: n=%d err=%v", to, how, n, err)
					}
				case <-time.After(adv15Limit(t)):
					rt.Close()
					t.Fatalf("timeout %d, %s: Wait did not return", to, how)
				}
			}
		}
	})
}

// Post and Wakeup storms from several goroutines while the waiter's short
// waits time out: every completion exactly once, in each poster's order;
// no Wait hangs; timers added meanwhile never fire early.
func TestAdv15PostWakeupStorm(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		const posters, per = 4, 5000
		var wg sync.WaitGroup
		stop := make(chan struct{})
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
		var wakers sync.WaitGroup
		for k := 0; k < 2; k++ {
			wakers.Add(1)
			go func() {
				defer wakers.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if err := rt.Wakeup(); err != nil {
						t.Errorf("wakeup: %v", err)
						return
					}
					time.Sleep(20 * time.Microsecond)
				}
			}()
		}
		type tm struct {
			at    time.Time
			delay time.Duration
		}
		var tmu sync.Mutex
		timers := map[uint64]tm{}
		wakers.Add(1)
		go func() {
			defer wakers.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				d := uint64(i % 4)
				tmu.Lock()
				at := time.Now()
				id, err := rt.AddTimer(d, 0, 99)
				if err != nil {
					tmu.Unlock()
					t.Errorf("AddTimer: %v", err)
					return
				}
				timers[id] = tm{at, time.Duration(d) * time.Millisecond}
				tmu.Unlock()
				time.Sleep(300 * time.Microsecond)
			}
		}()
		next := make([]uintptr, posters)
		total := 0
		ev := make([]Event, 7)
		deadline := time.Now().Add(adv15Limit(t))
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
					tmu.Lock()
					x, ok := timers[uint64(e.Data)]
					delete(timers, uint64(e.Data))
					tmu.Unlock()
					if !ok || e.Key != 99 {
						t.Fatalf("unknown or duplicate timer %+v", e)
					}
					if el := now.Sub(x.at); el < x.delay {
						t.Fatalf("timer of %v fired after %v", x.delay, el)
					}
				default:
					t.Fatalf("unexpected event %+v", e)
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d of %d completions", total, posters*per)
			}
		}
		close(stop)
		adv15Within(t, "posters", wg.Wait)
		adv15Within(t, "wakers", wakers.Wait)
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

// Two goroutines calling Wait at once: exactly one waits, the other gets
// ErrBusy at once, and the runtime is usable afterwards.
func TestAdv15TwoWaiters(t *testing.T) {
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
			adv15Within(t, "two waiters", wg.Wait)
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

// RLIMIT_NOFILE exhausted: making runtimes fails with an error (no panic,
// no leaked descriptor of a half-made poller), and works again once
// descriptors are free.
func TestAdv15RuntimeFdExhaustion(t *testing.T) {
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	countFds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	for _, name := range port.Backends() {
		t.Run(name, func(t *testing.T) {
			base := countFds()
			// Room for a few runtimes only; the highest open fd must fit.
			lim := old
			lim.Cur = uint64(base + 40)
			if lim.Cur > old.Max {
				t.Skip("hard limit too low")
			}
			if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
				t.Skip(err)
			}
			var rts []*Runtime
			var ferr error
			func() {
				defer func() {
					if e := recover(); e != nil {
						ferr = errors.New("panic")
					}
					unix.Setrlimit(unix.RLIMIT_NOFILE, &old)
				}()
				for i := 0; i < 1000; i++ {
					p, err := port.NewNamed(name)
					if err != nil {
						ferr = err
						return
					}
					rts = append(rts, NewRuntimeWith(p))
				}
			}()
			if ferr == nil || ferr.Error() == "panic" || len(rts) == 0 {
				t.Fatalf("made %d runtimes, err %v (want EMFILE after a few)", len(rts), ferr)
			}
			if !errors.Is(ferr, unix.EMFILE) || CodeOf(ferr) != ESys {
				t.Fatalf("err %v code %d, want EMFILE/ESys", ferr, CodeOf(ferr))
			}
			// Each made runtime works; then all are released.
			for _, rt := range rts {
				rt.Post(1, 1)
				if n, err := rt.Wait(make([]Event, 1), adv15Limit(t)); n != 1 || err != nil {
					t.Fatalf("runtime made near the limit: n=%d err=%v", n, err)
				}
				if err := rt.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if got := countFds(); got != base {
				t.Fatalf("%d descriptors open after closing all, %d before", got, base)
			}
		})
	}
}

// adv15HugeEvents returns an out slice of n events backed by lazily mapped
// memory (MAP_NORESERVE: nothing is committed until written), so that a Wait
// with an out beyond epoll's limit costs no real memory; skips where the
// host refuses such a mapping.
func adv15HugeEvents(t *testing.T, n int) []Event {
	size := n * int(unsafe.Sizeof(Event{}))
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_NORESERVE)
	if err != nil {
		t.Skipf("cannot map %d bytes: %v", size, err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return unsafe.Slice((*Event)(unsafe.Pointer(&b[0])), n)
}

// A Wait whose out holds more than epoll_wait's limit (INT_MAX/12 records,
// about 179 million) failed with ErrClosed on an open runtime (the epoll
// port passed len(out)+1 as maxevents and took the EINVAL for a closed
// poller), after allocating gigabytes of buffers that followed len(out).
// Now the harvest is bounded (port.MaxHarvest): the events come, the
// runtime stays open.
func TestAdv15WaitHugeOut(t *testing.T) {
	if math.MaxInt == math.MaxInt32 {
		t.Skip("32-bit int")
	}
	out := adv15HugeEvents(t, 179_000_000)
	backends(t, func(t *testing.T, rt *Runtime) {
		r, w := adv15Pipe(t)
		if err := rt.Add(r, EventRead, 4); err != nil {
			t.Fatal(err)
		}
		unix.Write(w, []byte("x"))
		rt.Post(1, 2)
		got := map[uint32]int{}
		for i := 0; i < 3 && (got[EventRead] == 0 || got[EventCompletion] == 0); i++ {
			n, err := rt.Wait(out, 2*time.Second)
			if err != nil {
				t.Fatalf("Wait with len(out) %d: %v", len(out), err)
			}
			for _, e := range out[:n] {
				got[e.Type&(EventRead|EventCompletion)]++
			}
		}
		if got[EventRead] == 0 || got[EventCompletion] != 1 {
			t.Fatalf("events %v", got)
		}
	})
}

// Modify of a registered fd that was closed without Remove: the poll
// backend said nil (ModifyContext even took the new context), and once the
// number named another file, Modify said nil again and that file, never
// added, was reported with the context given to the failed ModifyContext.
// epoll says ErrBadFd, then ErrNotFound; so do both now. (The poll backend
// may still report the new file under the number's old context until
// Remove or Add, as documented for async_runtime_add; not with ctx 5.)
func TestAdv15ModifyClosedOrReusedFd(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(p[1])
		if err := rt.Add(p[0], EventRead, 1); err != nil {
			t.Fatal(err)
		}
		unix.Close(p[0])
		if err := rt.Modify(p[0], EventRead|EventWrite); !errors.Is(err, ErrBadFd) {
			t.Errorf("Modify of a closed fd: %v, want ErrBadFd", err)
		}
		if err := rt.ModifyContext(p[0], EventRead, 5); !errors.Is(err, ErrBadFd) {
			t.Errorf("ModifyContext of a closed fd: %v, want ErrBadFd", err)
		}
		q0, q1 := adv15Pipe(t)
		if q0 != p[0] {
			t.Skipf("fd number not reused (%d vs %d)", q0, p[0])
		}
		if err := rt.Modify(q0, EventRead); !errors.Is(err, ErrNotFound) {
			t.Errorf("Modify of a reused number: %v, want ErrNotFound", err)
		}
		if err := rt.ModifyContext(q0, EventRead, 5); !errors.Is(err, ErrNotFound) {
			t.Errorf("ModifyContext of a reused number: %v, want ErrNotFound", err)
		}
		unix.Write(q1, []byte("x"))
		ev := make([]Event, 4)
		n, err := rt.Wait(ev, 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ev[:n] {
			if e.Context == 5 {
				t.Errorf("event with the context of a failed ModifyContext: %+v", e)
			}
		}
		if err := rt.Remove(q0); err != nil {
			t.Fatalf("Remove of the old registration: %v", err)
		}
		if err := rt.Add(q0, EventRead, 9); err != nil {
			t.Fatal(err)
		}
		n, err = rt.Wait(ev, 2*time.Second)
		if err != nil || n != 1 || ev[0].Fd != q0 || ev[0].Context != 9 {
			t.Fatalf("after re-add: n=%d err=%v ev=%+v", n, err, ev[:n])
		}
	})
}

// Blocked queue callers with huge and negative timeouts (time.Now().Add
// overflows for MaxInt64) are woken by the other side, and by Close.
func TestAdv15QueueHugeTimeoutsWake(t *testing.T) {
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
		case <-time.After(adv15Limit(t)):
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
		case <-time.After(adv15Limit(t)):
			t.Fatalf("timeout %d: blocked writer not woken by Dequeue", to)
		}
		go func() { res <- q.EnqueueTimeout([]byte("d"), to) }() // full again: blocks
		go func() { time.Sleep(time.Millisecond); q.Close() }()
		select {
		case err := <-res:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("timeout %d: writer at Close: %v", to, err)
			}
		case <-time.After(adv15Limit(t)):
			t.Fatalf("timeout %d: blocked writer not woken by Close", to)
		}
	}
}

// Wakeup with nobody waiting: the next Wait returns at once (with 0), even
// with a long timeout and timers pending, on both backends.
func TestAdv15WakeupBeforeWait(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		r, _ := adv15Pipe(t)
		ev := make([]Event, 4)
		for _, withFd := range []bool{false, true} {
			if withFd {
				if err := rt.Add(r, EventRead, 1); err != nil {
					t.Fatal(err)
				}
			}
			id, _ := rt.AddTimer(1e6, 0, 1) // pending, far
			for _, to := range []time.Duration{-1, time.Hour} {
				if err := rt.Wakeup(); err != nil {
					t.Fatal(err)
				}
				done := make(chan struct{})
				var n int
				var err error
				go func() { n, err = rt.Wait(ev, to); close(done) }()
				select {
				case <-done:
					if n != 0 || err != nil {
						t.Fatalf("fd %v timeout %v: n=%d err=%v", withFd, to, n, err)
					}
				case <-time.After(adv15Limit(t)):
					rt.Close()
					t.Fatalf("fd %v timeout %v: Wait after Wakeup did not return", withFd, to)
				}
			}
			rt.CancelTimer(id)
		}
	})
}

// A registered fd closed without Remove while a dup keeps its file open
// (epoll keeps a ghost registration), its number reused by another file:
// Remove of the number works, the old file's readiness is never reported
// again, and the new file once added comes with its own context only.
func TestAdv15GhostOfDupAndReusedNumber(t *testing.T) {
	backends(t, func(t *testing.T, rt *Runtime) {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(p[1])
		if err := rt.Add(p[0], EventRead, 1); err != nil {
			t.Fatal(err)
		}
		d, err := unix.Dup(p[0])
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(d)
		unix.Close(p[0])
		q0, q1 := adv15Pipe(t)
		if q0 != p[0] {
			t.Skipf("fd number not reused (%d vs %d)", q0, p[0])
		}
		if err := rt.Remove(q0); err != nil {
			t.Fatalf("Remove of the reused number: %v", err)
		}
		unix.Write(p[1], []byte("old")) // the old file (still open through d) is readable
		ev := make([]Event, 4)
		for i := 0; i < 3; i++ {
			n, err := rt.Wait(ev, 5*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ev[:n] {
				t.Fatalf("event after Remove: %+v", e)
			}
		}
		if err := rt.Add(q0, EventRead, 2); err != nil {
			t.Fatalf("Add of the new file: %v", err)
		}
		unix.Write(q1, []byte("new"))
		seen := 0
		for i := 0; i < 5; i++ {
			n, err := rt.Wait(ev, 5*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ev[:n] {
				if e.Fd != q0 || e.Context != 2 {
					t.Fatalf("event %+v (want fd %d ctx 2 only)", e, q0)
				}
				seen++
			}
		}
		if seen == 0 {
			t.Fatal("the new file's readiness never came")
		}
	})
}

// NewRuntime with an unknown ASYNC_BACKEND: ErrNotSup, nothing made.
func TestAdv15UnknownBackend(t *testing.T) {
	t.Setenv("ASYNC_BACKEND", "no-such-backend")
	if rt, err := NewRuntime(); rt != nil || !errors.Is(err, ErrNotSup) {
		t.Fatalf("rt %v err %v, want ErrNotSup", rt, err)
	}
	if _, err := port.NewNamed("no-such-backend"); !errors.Is(err, port.ErrBackend) {
		t.Fatalf("port.NewNamed: %v", err)
	}
}
