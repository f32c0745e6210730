package libasync

import (
	"sync"
	"time"
)

// QueueFlags select a Queue's full policy and signalling.
type QueueFlags uint32

// Queue flags, identical to async_queue_flags_t.
const (
	DropOldest   QueueFlags = 0x01 // full: drop the head, count it, succeed
	BlockWriter  QueueFlags = 0x02 // full: wait for room
	SignalOnData QueueFlags = 0x04 // notify an attached runtime on empty -> non-empty
)

// QueueStats is a consistent snapshot of a Queue's counters.
type QueueStats struct {
	Capacity, CurrentSize, MaxMsgSize   int
	EnqueueCount, DequeueCount, Dropped uint64
}

// Queue is a bounded FIFO of copied messages, safe for any number of
// producers and consumers. The ring grows (doubling, up to capacity) as
// messages accumulate, and message buffers are allocated on first use of a
// ring slot and reused afterwards, so memory follows what is actually
// queued: a queue of capacity 2^30 costs nothing until it fills.
type Queue struct {
	mu       sync.Mutex
	capacity int
	maxMsg   int
	flags    QueueFlags
	slots    [][]byte // the ring: len grows up to capacity (see grow)
	head     int
	count    int
	enq      uint64
	deq      uint64
	dropped  uint64
	closed   bool
	readers  waitList // consumers waiting for a message
	writers  waitList // producers waiting for room
	notifyRt *Runtime
	notifyK  uintptr
	notifyD  uintptr
}

// NewQueue makes a queue of capacity messages of at most maxMsg bytes.
func NewQueue(capacity, maxMsg int, flags QueueFlags) (*Queue, error) {
	if capacity <= 0 || maxMsg <= 0 || flags&^(DropOldest|BlockWriter|SignalOnData) != 0 ||
		flags&(DropOldest|BlockWriter) == DropOldest|BlockWriter {
		return nil, ErrInval
	}
	if capacity > 1<<30 {
		return nil, ErrInval
	}
	return &Queue{capacity: capacity, maxMsg: maxMsg, flags: flags, slots: make([][]byte, min(capacity, initialSlots))}, nil
}

// initialSlots is the ring's first size, whatever the capacity: the ring
// grows with what is queued (see grow), so that a large capacity (up to
// 2^30 slots, 24 GiB of slice headers at once) costs nothing until it
// fills.
const initialSlots = 16

// grow doubles the ring (at most to capacity), unwrapping it so that the
// head is at 0; it keeps the slot buffers for reuse. Under mu, when full.
func (q *Queue) grow() {
	n := min(2*len(q.slots), q.capacity)
	s := make([][]byte, n)
	k := copy(s, q.slots[q.head:])
	copy(s[k:], q.slots[:q.head])
	q.slots, q.head = s, 0
}

// Flags returns the flags the queue was made with.
func (q *Queue) Flags() QueueFlags { return q.flags }

// Enqueue copies data to the tail. When full it drops the head (DropOldest),
// waits forever for room (BlockWriter), or fails with ErrFull.
func (q *Queue) Enqueue(data []byte) error {
	return q.EnqueueWait(data, -1, q.flags&BlockWriter != 0)
}

// EnqueueTimeout is Enqueue that, when full and not DropOldest, waits up to
// timeout for room (timeout < 0: forever).
func (q *Queue) EnqueueTimeout(data []byte, timeout time.Duration) error {
	return q.EnqueueWait(data, timeout, true)
}

// EnqueueWait copies data to the tail; wait says whether a full queue
// (without DropOldest) may be waited on, up to timeout (< 0: forever).
func (q *Queue) EnqueueWait(data []byte, timeout time.Duration, wait bool) error {
	if len(data) == 0 {
		return ErrInval
	}
	if len(data) > q.maxMsg {
		return ErrTooBig
	}
	var b blocking
	q.mu.Lock()
	for {
		if q.closed {
			q.mu.Unlock()
			return ErrClosed
		}
		if q.count < q.capacity {
			if q.count == len(q.slots) {
				q.grow()
			}
			break
		}
		if q.flags&DropOldest != 0 {
			q.dropHead()
			q.dropped++
			break
		}
		if !wait || timeout == 0 {
			q.mu.Unlock()
			return ErrFull
		}
		if !q.block(&q.writers, &b, timeout) {
			q.mu.Unlock()
			return ErrTimedOut
		}
	}
	tail := q.head + q.count
	if tail >= len(q.slots) {
		tail -= len(q.slots)
	}
	buf := q.slots[tail]
	if cap(buf) < len(data) {
		buf = make([]byte, len(data), roundUp(len(data), q.maxMsg))
	}
	buf = buf[:len(data)]
	copy(buf, data)
	q.slots[tail] = buf
	q.count++
	q.enq++
	if q.count == 1 && q.notifyRt != nil {
		// Posting under q.mu keeps exactly one notification per transition.
		_ = q.notifyRt.Post(q.notifyK, q.notifyD)
	}
	q.readers.wakeOne()
	q.mu.Unlock()
	return nil
}

// roundUp sizes a slot buffer: small messages get at least 64 bytes so that
// slowly growing sizes do not reallocate each time; never above max.
func roundUp(n, max int) int {
	c := 64
	for c < n {
		c <<= 1
	}
	if c > max {
		return max
	}
	return c
}

func (q *Queue) dropHead() {
	q.head++
	if q.head == len(q.slots) {
		q.head = 0
	}
	q.count--
}

// Dequeue copies the head message into buf and removes it, returning its
// length. ErrBufSize (with the needed length) leaves it at the head.
func (q *Queue) Dequeue(buf []byte) (int, error) {
	return q.DequeueTimeout(buf, 0)
}

// DequeueTimeout is Dequeue that waits up to timeout (< 0: forever) for a
// message.
func (q *Queue) DequeueTimeout(buf []byte, timeout time.Duration) (int, error) {
	var b blocking
	q.mu.Lock()
	for {
		if q.closed {
			q.mu.Unlock()
			return 0, ErrClosed
		}
		if q.count > 0 {
			break
		}
		if timeout == 0 {
			q.mu.Unlock()
			return 0, ErrEmpty
		}
		if !q.block(&q.readers, &b, timeout) {
			q.mu.Unlock()
			return 0, ErrTimedOut
		}
	}
	msg := q.slots[q.head]
	if len(msg) > len(buf) {
		n := len(msg)
		// Another reader may fit it: pass the wake-up on.
		q.readers.wakeOne()
		q.mu.Unlock()
		return n, ErrBufSize
	}
	n := copy(buf, msg)
	q.dropHead()
	q.deq++
	q.writers.wakeOne()
	if q.count > 0 {
		q.readers.wakeOne()
	}
	q.mu.Unlock()
	return n, nil
}

// blocking is one Enqueue's or Dequeue's waiting state: its waiter and
// deadline, made by its first block.
type blocking struct {
	w        *waiter
	deadline time.Time // zero: none
}

// block parks the caller on list until woken or b's deadline, timeout from
// the first block (< 0: none). Called and returns with q.mu held; false
// means the deadline passed.
func (q *Queue) block(list *waitList, b *blocking, timeout time.Duration) bool {
	if b.w == nil {
		b.w = newWaiter()
		if timeout > 0 {
			b.deadline = time.Now().Add(timeout)
		}
	}
	w := b.w
	list.push(w)
	q.mu.Unlock()
	ok := w.wait(b.deadline)
	q.mu.Lock()
	if !ok {
		if list.remove(w) {
			return false
		}
		// Woken just as the deadline passed: take the wake-up and retry,
		// so that it is not lost for the others.
		w.drain()
	}
	return true
}

// IsEmpty reports whether the queue holds no message.
func (q *Queue) IsEmpty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.count == 0
}

// IsFull reports whether the queue holds capacity messages.
func (q *Queue) IsFull() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.count == q.capacity
}

// Clear discards every message (counted as dropped) and wakes blocked writers.
func (q *Queue) Clear() {
	q.mu.Lock()
	q.dropped += uint64(q.count)
	q.head, q.count = 0, 0
	q.writers.wakeAll()
	q.mu.Unlock()
}

// Stats returns a consistent snapshot of the counters.
func (q *Queue) Stats() QueueStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return QueueStats{Capacity: q.capacity, CurrentSize: q.count, MaxMsgSize: q.maxMsg,
		EnqueueCount: q.enq, DequeueCount: q.deq, Dropped: q.dropped}
}

// Attach makes the queue (made with SignalOnData) post (key, data) to rt on
// every empty -> non-empty transition; rt == nil detaches. A non-empty queue
// posts once at once. Attaching again replaces the runtime and key. Once rt
// is closed (before or after Attach) the queue simply posts nothing; its
// Enqueue is unaffected. ErrInval without SignalOnData, ErrClosed after the
// queue's Close.
func (q *Queue) Attach(rt *Runtime, key, data uintptr) error {
	if q.flags&SignalOnData == 0 {
		return ErrInval
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ErrClosed
	}
	q.notifyRt, q.notifyK, q.notifyD = rt, key, data
	if rt != nil && q.count > 0 {
		_ = rt.Post(key, data)
	}
	return nil
}

// Close discards the messages and wakes every blocked caller with ErrClosed.
// Later calls fail with ErrClosed.
func (q *Queue) Close() {
	q.mu.Lock()
	q.closed = true
	q.slots = nil
	q.count = 0
	q.notifyRt = nil
	q.readers.wakeAll()
	q.writers.wakeAll()
	q.mu.Unlock()
}
