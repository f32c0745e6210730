package libasync

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzQueueModel drives a Queue with a random operation sequence and checks
// every answer against a slice model: contents, order, drops, errors, stats.
//
//	go test -run - -fuzz FuzzQueueModel ./libasync
func FuzzQueueModel(f *testing.F) {
	f.Add(uint8(3), uint8(4), uint8(1), []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(uint8(1), uint8(1), uint8(0), []byte{0, 0, 1, 1, 2, 3, 0, 4})
	f.Add(uint8(8), uint8(16), uint8(2), []byte{0x30, 0x41, 0x52, 0x63, 0x74})
	f.Fuzz(func(t *testing.T, capacity, maxMsg, policy uint8, ops []byte) {
		cp, mx := int(capacity%16)+1, int(maxMsg%32)+1
		var flags QueueFlags
		switch policy % 3 {
		case 1:
			flags = DropOldest
		case 2:
			flags = BlockWriter // never waits here: the model avoids full enqueues
		}
		q, err := NewQueue(cp, mx, flags)
		if err != nil {
			t.Fatal(err)
		}
		var model [][]byte
		var enq, deq, dropped uint64
		for i, op := range ops {
			size := int(op>>3) % (mx + 2) // sometimes 0, sometimes too big
			switch op & 7 {
			case 0, 1, 2: // enqueue
				msg := bytes.Repeat([]byte{byte(i)}, size)
				if flags == BlockWriter && len(model) == cp && size > 0 && size <= mx {
					err = q.EnqueueWait(msg, 0, false) // would block: check it refuses instead
					if !errors.Is(err, ErrFull) {
						t.Fatalf("op %d: full non-waiting enqueue: %v", i, err)
					}
					continue
				}
				err = q.Enqueue(msg)
				switch {
				case size == 0:
					if !errors.Is(err, ErrInval) {
						t.Fatalf("op %d: empty message: %v", i, err)
					}
				case size > mx:
					if !errors.Is(err, ErrTooBig) {
						t.Fatalf("op %d: oversize: %v", i, err)
					}
				case len(model) == cp && flags == DropOldest:
					if err != nil {
						t.Fatalf("op %d: drop-oldest: %v", i, err)
					}
					model = append(model[1:], msg)
					dropped++
					enq++
				case len(model) == cp:
					if !errors.Is(err, ErrFull) {
						t.Fatalf("op %d: full: %v", i, err)
					}
				default:
					if err != nil {
						t.Fatalf("op %d: enqueue: %v", i, err)
					}
					model = append(model, msg)
					enq++
				}
			case 3, 4, 5: // dequeue into a buffer of a random size
				buf := make([]byte, size)
				n, err := q.Dequeue(buf)
				switch {
				case len(model) == 0:
					if !errors.Is(err, ErrEmpty) {
						t.Fatalf("op %d: empty dequeue: %v", i, err)
					}
				case len(model[0]) > size:
					if !errors.Is(err, ErrBufSize) || n != len(model[0]) {
						t.Fatalf("op %d: small buffer: n=%d %v", i, n, err)
					}
				default:
					if err != nil || !bytes.Equal(buf[:n], model[0]) {
						t.Fatalf("op %d: got %v %v, want %v", i, buf[:n], err, model[0])
					}
					model = model[1:]
					deq++
				}
			case 6:
				q.Clear()
				dropped += uint64(len(model))
				model = nil
			case 7:
				if q.IsEmpty() != (len(model) == 0) || q.IsFull() != (len(model) == cp) {
					t.Fatalf("op %d: empty/full disagree with %d of %d", i, len(model), cp)
				}
			}
			s := q.Stats()
			if s.CurrentSize != len(model) || s.EnqueueCount != enq || s.DequeueCount != deq || s.Dropped != dropped {
				t.Fatalf("op %d: stats %+v, model size %d enq %d deq %d dropped %d", i, s, len(model), enq, deq, dropped)
			}
		}
	})
}

// FuzzWheel checks the timer wheel against a model for arbitrary add,
// cancel and advance sequences: nothing fires early, late, twice, or after
// cancel.
//
//	go test -run - -fuzz FuzzWheel ./libasync
func FuzzWheel(f *testing.F) {
	f.Add([]byte{0, 10, 1, 200, 2, 3, 50, 3, 255})
	f.Add([]byte{0, 255, 0, 255, 3, 255, 3, 255, 3, 255, 1, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		w := newWheel()
		live := wheelModel{}
		var ids []uint64
		now := uint64(0)
		for i := 0; i+1 < len(ops); i += 2 {
			arg := uint64(ops[i+1])
			switch ops[i] % 4 {
			case 0: // add, delays spread over every wheel level
				d := arg * arg * arg * (1 + arg%7)
				var period uint64
				if arg%5 == 0 {
					period = arg%13 + 1
				}
				id := w.add(now+d, period, 0)
				live[id] = &modelTimer{now + d, period}
				ids = append(ids, id)
			case 1: // cancel (maybe a dead id)
				if len(ids) == 0 {
					continue
				}
				id := ids[int(arg)%len(ids)]
				_, want := live[id]
				if w.cancel(id) != want {
					t.Fatalf("cancel(%x) = %v, want %v", id, !want, want)
				}
				delete(live, id)
			default: // advance
				now += arg * arg * (arg%3 + 1)
				live.advance(t, w, now)
			}
		}
	})
}

// FuzzCompletions posts a fuzzed sequence of (key, data) pairs interleaved
// with waits of fuzzed sizes; every pair must come out once, in order, intact.
//
//	go test -run - -fuzz FuzzCompletions ./libasync
func FuzzCompletions(f *testing.F) {
	f.Add([]byte{1, 2, 3, 0x81, 4, 5, 0x83, 0x80})
	f.Fuzz(func(t *testing.T, ops []byte) {
		rt, err := NewRuntime()
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		var want []Event
		ev := make([]Event, 8)
		for i, op := range ops {
			if op&0x80 == 0 {
				key := uintptr(op) << 56 >> 1
				data := uintptr(i)<<32 | uintptr(op)
				rt.Post(key, data)
				want = append(want, Event{Fd: -1, Type: EventCompletion, Key: key, Data: data})
				continue
			}
			n, err := rt.Wait(ev[:int(op&7)+1], 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ev[:n] {
				if len(want) == 0 || e != want[0] {
					t.Fatalf("got %+v, want %+v", e, want)
				}
				want = want[1:]
			}
		}
		for len(want) > 0 {
			n, _ := rt.Wait(ev, 0)
			if n == 0 {
				t.Fatalf("%d completions lost", len(want))
			}
			for _, e := range ev[:n] {
				if e != want[0] {
					t.Fatalf("got %+v, want %+v", e, want[0])
				}
				want = want[1:]
			}
		}
	})
}
