package queue

import (
	"bytes"
	"errors"
	"testing"

	"github.com/libasync/libasync/libasync"
)

// Flag values of async_queue_flags_t (include/async.h); libasync's
// QueueFlags use the same bits.
const (
	fDrop   = 0x01
	fBlock  = 0x02
	fSignal = 0x04
)

// pattern is the message source: message i is pattern[i%251:][:size], so
// neighbouring messages differ.
var pattern = func() []byte {
	p := make([]byte, 1<<21+512)
	x := uint32(2463534242)
	for i := range p {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		p[i] = byte(x)
	}
	return p
}()

type reader struct {
	b []byte
	i int
}

func (r *reader) next() byte {
	if r.i >= len(r.b) {
		return 0
	}
	c := r.b[r.i]
	r.i++
	return c
}

func (r *reader) more() bool { return r.i < len(r.b) }

// code is the async_err_t of a libasync error.
func code(err error) int { return int(libasync.CodeOf(err)) }

// FuzzQueueDiff drives the C API's queue (queue.c, through fuzzhooks.go)
// and libasync.Queue, the Go model, with the same operation sequence and
// compares every answer: error codes, sizes, the bytes dequeued, is_empty,
// is_full and the stats. Only non-blocking operations (timeouts 0).
//
// libasync.Queue has the C queue's semantics (same error codes, same
// DROP_OLDEST and BLOCK_WRITER behaviour, BUFSIZE leaving the message at the
// head, clear counting drops); the one difference is that NewQueue has no
// upper bound on the message size, where la_q_create refuses more than
// 2^40 bytes: the driver expects INVAL there itself. On a handle that was
// destroyed (or a create that failed) the C queue answers BADHANDLE.
//
//	go test -run - -fuzz FuzzQueueDiff ./cabi/internal/queue
func FuzzQueueDiff(f *testing.F) {
	// create(cap sel, max sel, flags), then ops (see the switch below)
	f.Add([]byte{3, 4, 0, 0, 5, 0, 6, 2, 1, 2, 3, 4, 5, 2, 0, 2, 4})
	f.Add([]byte{1, 1, fDrop, 0, 1, 0, 2, 0, 1, 2, 1, 5, 4, 3, 5})
	f.Add([]byte{2, 7, fBlock, 0, 1, 8, 1, 0, 3, 0, 4, 2, 2, 2, 3, 5})
	f.Add([]byte{13, 13, 0, 0, 1, 0, 3, 0, 2, 2, 1, 2, 3, 2, 2, 5, 3, 5})
	f.Add([]byte{5, 9, fSignal, 6, 15, 1, 0, 7, 0, 6, 14, 14, 0, 0, 4, 6, 2, 3, 3, 0, 4, 7, 5})
	f.Add([]byte{4, 12, fDrop, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 2, 3, 2, 1, 2, 4, 5, 3, 5})
	f.Add([]byte{0, 3, 0x83, 6, 4, 4, 0x80, 0, 1, 6, 1, 2, 3, 8, 1, 2, 1})
	f.Fuzz(queueDiff)
}

func queueDiff(t *testing.T, in []byte) {
	{
		r := &reader{b: in}
		var h uint64          // the C queue; 0 when the last create failed
		var m *libasync.Queue // the model; nil likewise
		var mx int            // the queue's max message size
		var stale []uint64    // destroyed handles
		defer func() {
			if h != 0 {
				cqDestroy(h)
			}
		}()
		create := func() {
			cs, ms, fl := r.next(), r.next(), r.next()
			var capacity uint64
			switch cs % 16 {
			case 15:
				capacity = 0
			case 14:
				capacity = 1<<30 + 1
			case 13:
				capacity = 40000 // slots allocated on first use (more than 1 MiB of them)
			default:
				capacity = 1 + uint64(cs%16)
			}
			var maxMsg uint64
			switch ms % 16 {
			case 15:
				maxMsg = 0
			case 14:
				maxMsg = 1<<40 + 1
			case 13:
				maxMsg = 1<<20 + 100 // slots allocated on first use, grown to the message
			case 12:
				maxMsg = 64
			default:
				maxMsg = 1 + uint64(ms%16)*3
			}
			if capacity == 40000 && maxMsg > 64 {
				maxMsg = 64 // 40000 slots of 1 MiB would be 40 GiB
			}
			flags := uint(fl & 7)
			if fl&0x80 != 0 {
				flags |= 0x40 // unknown
			}
			ch, crc := cqCreate(capacity, maxMsg, flags)
			var mq *libasync.Queue
			var merr error
			if maxMsg > 1<<40 {
				merr = libasync.ErrInval
			} else {
				mq, merr = libasync.NewQueue(int(capacity), int(maxMsg), libasync.QueueFlags(flags))
			}
			if crc != code(merr) {
				t.Fatalf("create(%d, %d, %#x): C %d, model %v", capacity, maxMsg, flags, crc, merr)
			}
			if crc == 0 && ch == 0 {
				t.Fatal("create succeeded with a zero handle")
			}
			h, m, mx = ch, mq, int(maxMsg)
		}
		create()
		for step := 0; r.more(); step++ {
			op := r.next()
			if m == nil && op%8 != 6 && op%8 != 7 {
				// No queue: every call on the failed create's zero handle is BADHANDLE.
				if rc := cqClear(h); rc != int(libasync.EBadHandle) {
					t.Fatalf("step %d: clear on no queue: %d", step, rc)
				}
				continue
			}
			switch op % 8 {
			case 0, 1: // enqueue; wait 0 or 1, timeout 0 either way
				s := r.next()
				var size int
				switch s % 8 {
				case 0:
					size = 0
				case 1:
					size = mx
				case 2:
					size = mx + 1
				case 3:
					size = mx - 1
				default:
					size = 1 + int(s)*7%mx
				}
				wait := int(op>>3) & 1
				msg := pattern[step%251:][:size]
				crc := cqEnqueue(h, msg, wait)
				merr := m.EnqueueWait(msg, 0, wait == 1)
				if crc != code(merr) {
					t.Fatalf("step %d: enqueue %d bytes (wait %d): C %d, model %v", step, size, wait, crc, merr)
				}
			case 2: // dequeue into a buffer too small, exact, large, or none
				s := r.next()
				st := m.Stats()
				head := 0
				if st.CurrentSize > 0 {
					// the model's head length: a probing dequeue with no buffer
					n, err := m.Dequeue(nil)
					if !errors.Is(err, libasync.ErrBufSize) {
						t.Fatalf("step %d: probe: %d %v", step, n, err)
					}
					head = n
				}
				var bl int
				switch s % 5 {
				case 0:
					bl = 0
				case 1:
					bl = head
				case 2:
					bl = head - 1
				case 3:
					bl = mx + 8
				default:
					bl = int(s) % (mx + 2)
				}
				if bl < 0 {
					bl = 0
				}
				var cbuf, mbuf []byte
				if bl > 0 {
					cbuf, mbuf = bytes.Repeat([]byte{0xEE}, bl), make([]byte, bl)
				}
				cn, crc := cqDequeue(h, cbuf)
				mn, merr := m.Dequeue(mbuf)
				if crc != code(merr) {
					t.Fatalf("step %d: dequeue into %d bytes: C %d, model %v", step, bl, crc, merr)
				}
				switch crc {
				case 0:
					if cn != mn || !bytes.Equal(cbuf[:cn], mbuf[:mn]) {
						t.Fatalf("step %d: dequeue: C %d bytes, model %d, or the bytes differ", step, cn, mn)
					}
					for _, c := range cbuf[cn:] {
						if c != 0xEE {
							t.Fatalf("step %d: dequeue of %d bytes wrote past the message", step, cn)
						}
					}
				case int(libasync.EBufSize):
					if cn != mn {
						t.Fatalf("step %d: BUFSIZE: C needs %d, model %d", step, cn, mn)
					}
					for _, c := range cbuf {
						if c != 0xEE {
							t.Fatalf("step %d: a refused dequeue wrote into the buffer", step)
						}
					}
				}
			case 3:
				if rc := cqClear(h); rc != 0 {
					t.Fatalf("step %d: clear: %d", step, rc)
				}
				m.Clear()
			case 4:
				e, rc1 := cqIsEmpty(h)
				full, rc2 := cqIsFull(h)
				if rc1 != 0 || rc2 != 0 || e != m.IsEmpty() || full != m.IsFull() {
					t.Fatalf("step %d: is_empty %v is_full %v (rc %d %d), model %v %v",
						step, e, full, rc1, rc2, m.IsEmpty(), m.IsFull())
				}
			case 5:
				cs, rc := cqStats(h)
				ms := m.Stats()
				want := qStats{uint64(ms.Capacity), uint64(ms.CurrentSize), uint64(ms.MaxMsgSize),
					ms.EnqueueCount, ms.DequeueCount, ms.Dropped}
				if rc != 0 || cs != want {
					t.Fatalf("step %d: stats: C %+v (rc %d), model %+v", step, cs, rc, want)
				}
			case 6: // destroy and create another
				if h != 0 {
					if rc := cqDestroy(h); rc != 0 {
						t.Fatalf("step %d: destroy: %d", step, rc)
					}
					m.Close()
					stale = append(stale, h)
				}
				create()
			case 7: // a destroyed handle answers BADHANDLE everywhere
				if len(stale) == 0 {
					continue
				}
				sh := stale[int(r.next())%len(stale)]
				_, rc1 := cqStats(sh)
				rc2 := cqEnqueue(sh, pattern[:1], 0)
				_, rc3 := cqDequeue(sh, make([]byte, 4))
				rc4 := cqDestroy(sh)
				if rc1 != 2 || rc2 != 2 || rc3 != 2 || rc4 != 2 {
					t.Fatalf("step %d: stale handle: %d %d %d %d", step, rc1, rc2, rc3, rc4)
				}
			}
		}
	}
}
