package libasync

import (
	"math"
	"math/bits"
	"unsafe"

	"github.com/libasync/libasync/internal/boundary"
)

// A hierarchical timing wheel with 1 ms ticks: 6 levels of 64 slots cover
// 2^36 ms (about two years); later deadlines are parked at the top level and
// re-placed as time approaches. Timers live in a slab and are linked by index,
// so a million timers are one allocation the garbage collector does not scan
// pointer by pointer. Ids carry a generation, so a stale id never cancels a
// newer timer. The wheel itself is not locked: Runtime guards it.

const (
	wheelBits   = 6
	wheelSlots  = 1 << wheelBits
	wheelLevels = 6
	wheelMax    = uint64(1)<<(wheelBits*wheelLevels) - 1 // furthest placeable distance
	nilTimer    = int32(-1)
)

type timerState uint8

const (
	tFree timerState = iota
	tWheel
	tReady
)

type timerEntry struct {
	expiry     uint64 // tick at which it is due
	period     uint64 // 0: one-shot
	key        uintptr
	gen        uint32
	state      timerState
	level      int8
	slot       int8
	prev, next int32
}

type timerList struct{ head, tail int32 }

type wheel struct {
	elapsed  uint64 // every timer due at or before this tick was moved to ready
	slab     []timerEntry
	free     []int32
	slots    [wheelLevels][wheelSlots]timerList
	occupied [wheelLevels]uint64
	ready    timerList
	nready   int
	live     int
	mem      boundary.Mem // nil: slab and free list live in the Go heap
}

func newWheel() *wheel {
	w := &wheel{}
	for l := range w.slots {
		for s := range w.slots[l] {
			w.slots[l][s] = timerList{nilTimer, nilTimer}
		}
	}
	w.ready = timerList{nilTimer, nilTimer}
	return w
}

func timerID(idx int32, gen uint32) uint64 { return uint64(gen)<<32 | uint64(uint32(idx)+1) }

func (w *wheel) lookup(id uint64) (int32, bool) {
	idx := int64(uint32(id)) - 1
	if idx < 0 || idx >= int64(len(w.slab)) {
		return 0, false
	}
	e := &w.slab[idx]
	if e.state == tFree || e.gen != uint32(id>>32) {
		return 0, false
	}
	return int32(idx), true
}

func (w *wheel) push(l *timerList, i int32) {
	e := &w.slab[i]
	e.prev, e.next = l.tail, nilTimer
	if l.tail == nilTimer {
		l.head = i
	} else {
		w.slab[l.tail].next = i
	}
	l.tail = i
}

func (w *wheel) unlink(l *timerList, i int32) {
	e := &w.slab[i]
	if e.prev == nilTimer {
		l.head = e.next
	} else {
		w.slab[e.prev].next = e.next
	}
	if e.next == nilTimer {
		l.tail = e.prev
	} else {
		w.slab[e.next].prev = e.prev
	}
	e.prev, e.next = nilTimer, nilTimer
}

// add schedules a timer due at tick expiry and returns its id, or 0 when
// the slab could not grow (only with a Mem: the Go heap cannot fail softly).
func (w *wheel) add(expiry, period uint64, key uintptr) uint64 {
	var i int32
	if n := len(w.free); n > 0 {
		i = w.free[n-1]
		w.free = w.free[:n-1]
	} else {
		if len(w.slab) == cap(w.slab) && w.mem != nil && !w.grow() {
			return 0
		}
		w.slab = append(w.slab, timerEntry{})
		i = int32(len(w.slab) - 1)
	}
	e := &w.slab[i]
	e.gen++
	if e.gen == 0 {
		e.gen = 1
	}
	e.expiry, e.period, e.key = expiry, period, key
	w.live++
	w.place(i)
	return timerID(i, e.gen)
}

// grow doubles the slab in w.mem. The free list grows first to the same
// capacity: it never holds more entries than the slab, so release and pop
// append to it without allocating.
func (w *wheel) grow() bool {
	n := 2 * cap(w.slab)
	if n < 64 {
		n = 64
	}
	if n > math.MaxInt32 {
		return false
	}
	if cap(w.free) < n {
		p := w.mem.Realloc(unsafe.Pointer(unsafe.SliceData(w.free)), uintptr(n)*unsafe.Sizeof(int32(0)))
		if p == nil {
			return false
		}
		w.free = unsafe.Slice((*int32)(p), n)[:len(w.free)]
	}
	p := w.mem.Realloc(unsafe.Pointer(unsafe.SliceData(w.slab)), uintptr(n)*unsafe.Sizeof(timerEntry{}))
	if p == nil {
		return false
	}
	w.slab = unsafe.Slice((*timerEntry)(p), n)[:len(w.slab)]
	return true
}

// freeMem returns the memory of a wheel whose slab lives in w.mem.
func (w *wheel) freeMem() {
	if w.mem == nil {
		return
	}
	w.mem.Free(unsafe.Pointer(unsafe.SliceData(w.slab)))
	w.mem.Free(unsafe.Pointer(unsafe.SliceData(w.free)))
	w.slab, w.free = nil, nil
}

// place puts timer i in its wheel slot, or in the ready list if it is due.
func (w *wheel) place(i int32) {
	e := &w.slab[i]
	if e.expiry <= w.elapsed {
		e.state = tReady
		w.push(&w.ready, i)
		w.nready++
		return
	}
	at := e.expiry
	if at-w.elapsed > wheelMax {
		at = w.elapsed + wheelMax
	}
	// The level is set by the highest bit in which the deadline differs
	// from now: all timers of a level lie in the current slot of the level
	// above, so a lower level always expires first.
	x := (at ^ w.elapsed) | (wheelSlots - 1)
	if x > wheelMax {
		x = wheelMax
	}
	level := (63 - bits.LeadingZeros64(x)) / wheelBits
	slot := int((at >> (uint(level) * wheelBits)) & (wheelSlots - 1))
	e.state, e.level, e.slot = tWheel, int8(level), int8(slot)
	w.push(&w.slots[level][slot], i)
	w.occupied[level] |= 1 << uint(slot)
}

// cancel removes a pending or ready timer; false if id is not live.
func (w *wheel) cancel(id uint64) bool {
	i, ok := w.lookup(id)
	if !ok {
		return false
	}
	w.release(i)
	return true
}

func (w *wheel) release(i int32) {
	e := &w.slab[i]
	switch e.state {
	case tWheel:
		l := &w.slots[e.level][e.slot]
		w.unlink(l, i)
		if l.head == nilTimer {
			w.occupied[e.level] &^= 1 << uint(e.slot)
		}
	case tReady:
		w.unlink(&w.ready, i)
		w.nready--
	}
	e.state = tFree
	w.live--
	w.free = append(w.free, i)
}

// next returns the tick of the earliest slot boundary at which work is due
// (a timer fires or a slot cascades), or ok=false when the wheel is empty.
func (w *wheel) next() (tick uint64, level, slot int, ok bool) {
	for l := 0; l < wheelLevels; l++ {
		occ := w.occupied[l]
		if occ == 0 {
			continue
		}
		shift := uint(l) * wheelBits
		pos := int((w.elapsed >> shift) & (wheelSlots - 1))
		s := (bits.TrailingZeros64(bits.RotateLeft64(occ, -pos)) + pos) & (wheelSlots - 1)
		levelRange := uint64(1) << (shift + wheelBits)
		tick = w.elapsed&^(levelRange-1) + uint64(s)<<shift
		if tick <= w.elapsed {
			// Only the top level wraps (far deadlines are clamped there).
			tick += levelRange
		}
		return tick, l, s, true
	}
	return 0, 0, 0, false
}

// advance moves time to now: due timers go to the ready list, higher-level
// slots whose time came cascade down.
func (w *wheel) advance(now uint64) {
	for {
		tick, l, s, ok := w.next()
		if !ok || tick > now {
			break
		}
		if tick > w.elapsed {
			w.elapsed = tick
		}
		list := &w.slots[l][s]
		i := list.head
		*list = timerList{nilTimer, nilTimer}
		w.occupied[l] &^= 1 << uint(s)
		for i != nilTimer {
			nxt := w.slab[i].next
			w.slab[i].prev, w.slab[i].next = nilTimer, nilTimer
			w.place(i)
			i = nxt
		}
	}
	if now > w.elapsed {
		w.elapsed = now
	}
}

// pop takes the oldest ready timer: its key and id. A repeating timer is
// re-placed at its next period boundary after now (missed periods are
// skipped, the phase kept); a one-shot timer is freed.
func (w *wheel) pop() (key uintptr, id uint64, ok bool) {
	i := w.ready.head
	if i == nilTimer {
		return 0, 0, false
	}
	w.unlink(&w.ready, i)
	w.nready--
	e := &w.slab[i]
	key, id = e.key, timerID(i, e.gen)
	if e.period == 0 {
		e.state = tFree
		w.live--
		w.free = append(w.free, i)
		return key, id, true
	}
	// Next period boundary after now, saturating: a period too long to
	// add is a timer that never fires again (but stays cancellable).
	steps := uint64(1)
	if w.elapsed >= e.expiry {
		steps = (w.elapsed-e.expiry)/e.period + 1
	}
	hi, adv := bits.Mul64(steps, e.period)
	next, carry := bits.Add64(e.expiry, adv, 0)
	if hi != 0 || carry != 0 {
		next = math.MaxUint64
	}
	e.expiry = next
	w.place(i)
	return key, id, true
}
