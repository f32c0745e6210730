package libasync

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libasync/libasync/port"
)

// Event types, identical to the ASYNC_EVENT_* values of async.h.
const (
	EventRead       uint32 = port.EventRead
	EventWrite      uint32 = port.EventWrite
	EventError      uint32 = port.EventError
	EventClose      uint32 = port.EventClose
	EventCompletion uint32 = 0x10
	EventTimer      uint32 = 0x20
)

// Event is one thing Wait reports: fd readiness (Fd >= 0, Context as given to
// Add), a completion (Fd -1, Key and Data as posted) or a timer (Fd -1, Key,
// Data = the timer id).
type Event struct {
	Fd      int
	Type    uint32
	Key     uintptr
	Data    uintptr
	Context uintptr
}

type completion struct{ key, data uintptr }

// Runtime is an event loop waited on by one thread at a time. Every other
// method may be called from any goroutine or thread.
//
// A completion travels like this: Post appends it to pending under mu and,
// only if the waiter announced it may sleep (sleeping == 1), rings the
// poller's doorbell; Wait swaps pending with its private batch in O(1) and
// hands out entries from the batch, keeping what does not fit for the next
// call. The sleeping flag and the pending check form a Dekker pair (both
// sequentially consistent), so no post is ever missed and a busy stream costs
// no syscall at all.
type Runtime struct {
	poller port.Poller
	start  time.Time

	mu       sync.Mutex // pending, closed (for posters)
	pending  []completion
	npending atomic.Int64
	closed   bool
	shut     atomic.Bool

	sleeping *int32 // 1 while the waiter may block in the poller (see Source)
	sleepBox int32
	src      Source
	wakeAt   atomic.Int64 // tick the sleeping waiter will wake at (MaxInt64: never)

	waitMu sync.Mutex // held by the one waiter
	batch  []completion
	bhead  int
	evbuf  []port.Event
	rot    int

	tmu   sync.Mutex // the wheel
	wheel *wheel
	tver  atomic.Uint64 // bumped by AddTimer: a sleeping waiter's plan is stale

	cmu  sync.RWMutex // fd contexts
	ctx  map[int]uintptr
	nfds atomic.Int64 // registrations (an upper bound: epoll forgets closed fds)

	skipped  int   // fd polls skipped in a row while other work was ready
	lastPoll int64 // ns of the last fd poll
}

// Fd polls may be skipped while completions or timers are ready (a poll is a
// syscall, expensive in a busy loop), but never more than this many times in
// a row nor for longer than pollEvery, so fd events cannot starve.
const (
	maxSkippedPolls = 8
	pollEvery       = int64(time.Millisecond)
)

// NewRuntime makes a runtime on the default poller (see port.New).
func NewRuntime() (*Runtime, error) {
	p, err := port.New()
	if err != nil {
		if errors.Is(err, port.ErrBackend) {
			return nil, ErrNotSup
		}
		return nil, err
	}
	return NewRuntimeWith(p), nil
}

// NewRuntimeWith makes a runtime on the given poller, which it then owns.
func NewRuntimeWith(p port.Poller) *Runtime {
	rt := &Runtime{poller: p, start: time.Now(), wheel: newWheel(), ctx: map[int]uintptr{}}
	rt.sleeping = &rt.sleepBox
	return rt
}

// Source is a queue of completions kept outside the runtime, drained by Wait
// beside what Post queued: the C boundary keeps one lock-free queue per
// posting thread there, so that posting from C never enters Go.
//
// Whoever feeds a Source must, after publishing an entry, read the sleep
// flag (sequentially consistent) and, if it is 1 and a compare-and-swap to 0
// succeeds, ring the poller's doorbell (port.Poller.Doorbell). Wait raises the
// flag before it may block and then calls Pending, so no entry is missed.
type Source interface {
	// Pending reports whether entries wait to be taken.
	Pending() bool
	// Take moves up to len(out) entries into out (Key and Data) and
	// returns how many; entries of one feeder come out in FIFO order.
	Take(out []Event) int
}

// NewRuntimeWithSource is NewRuntimeWith with an external completion source
// whose feeders read the sleep flag at sleepFlag (which may live in C
// memory; it is only accessed atomically).
func NewRuntimeWithSource(p port.Poller, src Source, sleepFlag *int32) *Runtime {
	rt := NewRuntimeWith(p)
	rt.src, rt.sleeping = src, sleepFlag
	return rt
}

// Backend names the poller in use.
func (rt *Runtime) Backend() string { return rt.poller.Name() }

// Poller exposes the poller (for the C boundary's signal-safe doorbell).
func (rt *Runtime) Poller() port.Poller { return rt.poller }

func mapPortErr(err error) error {
	switch err {
	case nil:
		return nil
	case port.ErrExists:
		return ErrExists
	case port.ErrNotFound:
		return ErrNotFound
	case port.ErrBadFd:
		return ErrBadFd
	case port.ErrClosed:
		return ErrClosed
	}
	return err
}

const fdEventMask = EventRead | EventWrite | EventError | EventClose

// Add watches fd for events (EventRead|EventWrite; error and close are
// always reported); ctx comes back in its events.
func (rt *Runtime) Add(fd int, events uint32, ctx uintptr) error {
	if events&^fdEventMask != 0 {
		return ErrInval
	}
	if fd < 0 {
		return ErrBadFd
	}
	rt.cmu.Lock()
	defer rt.cmu.Unlock()
	if err := mapPortErr(rt.poller.Add(fd, events)); err != nil {
		return err
	}
	if _, ok := rt.ctx[fd]; !ok {
		rt.nfds.Add(1)
	}
	rt.ctx[fd] = ctx
	return nil
}

// Modify changes the watched events of fd.
func (rt *Runtime) Modify(fd int, events uint32) error {
	if events&^fdEventMask != 0 {
		return ErrInval
	}
	if fd < 0 {
		return ErrBadFd
	}
	return mapPortErr(rt.poller.Modify(fd, events))
}

// Remove stops watching fd.
func (rt *Runtime) Remove(fd int) error {
	if fd < 0 {
		return ErrBadFd
	}
	rt.cmu.Lock()
	defer rt.cmu.Unlock()
	if err := mapPortErr(rt.poller.Remove(fd)); err != nil {
		return err
	}
	if _, ok := rt.ctx[fd]; ok {
		rt.nfds.Add(-1)
		delete(rt.ctx, fd)
	}
	return nil
}

// Post queues a completion for the waiter. It never blocks and never fails
// for want of room; it fails only with ErrClosed after Close.
func (rt *Runtime) Post(key, data uintptr) error {
	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
		return ErrClosed
	}
	rt.pending = append(rt.pending, completion{key, data})
	rt.npending.Add(1)
	rt.mu.Unlock()
	if atomic.LoadInt32(rt.sleeping) != 0 && atomic.CompareAndSwapInt32(rt.sleeping, 1, 0) {
		_ = rt.poller.Ring() // ErrClosed after Close: nobody to wake
	}
	return nil
}

// Wakeup makes a blocked Wait return without an event; with no waiter, the
// next Wait returns at once.
func (rt *Runtime) Wakeup() error {
	if rt.shut.Load() {
		return ErrClosed
	}
	return mapPortErr(rt.poller.Wakeup())
}

// now is the current tick: whole milliseconds since the runtime started.
func (rt *Runtime) now() (tick uint64, ns int64) {
	ns = int64(time.Since(rt.start))
	return uint64(ns / 1e6), ns
}

// AddTimer starts a timer due after delay ms, repeating every period ms if
// period > 0, and returns its id (never 0).
func (rt *Runtime) AddTimer(delay, period uint64, key uintptr) (uint64, error) {
	_, ns := rt.now()
	// Due at the first tick boundary at or after now + delay: never early.
	due := uint64(math.MaxUint64)
	if delay < (math.MaxUint64-uint64(ns))/1e6-2 {
		due = (uint64(ns) + delay*1e6 + 1e6 - 1) / 1e6
	}
	rt.tmu.Lock()
	if rt.shut.Load() {
		rt.tmu.Unlock()
		return 0, ErrClosed
	}
	id := rt.wheel.add(due, period, key)
	rt.tver.Add(1)
	rt.tmu.Unlock()
	// Wake a sleeping waiter whose sleep would outlast this timer.
	if atomic.LoadInt32(rt.sleeping) != 0 && due < uint64(rt.wakeAt.Load()) &&
		atomic.CompareAndSwapInt32(rt.sleeping, 1, 0) {
		_ = rt.poller.Ring()
	}
	return id, nil
}

// CancelTimer cancels a pending timer, also one that expired but was not
// yet delivered. ErrNotFound for unknown, fired one-shot or cancelled ids.
func (rt *Runtime) CancelTimer(id uint64) error {
	rt.tmu.Lock()
	defer rt.tmu.Unlock()
	if rt.shut.Load() {
		return ErrClosed
	}
	if !rt.wheel.cancel(id) {
		return ErrNotFound
	}
	return nil
}

// Wait fills out with events and returns how many. timeout < 0 waits
// forever, 0 polls, otherwise at least timeout (rounded up to whole ms).
// It returns early with 0 on Wakeup or when a signal interrupted the wait.
func (rt *Runtime) Wait(out []Event, timeout time.Duration) (int, error) {
	if len(out) == 0 {
		return 0, ErrInval
	}
	if !rt.waitMu.TryLock() {
		return 0, ErrBusy
	}
	defer rt.waitMu.Unlock()
	if rt.shut.Load() {
		return 0, ErrClosed
	}
	var deadline int64 = -1 // ns since start; -1: forever
	if timeout >= 0 {
		_, ns := rt.now()
		deadline = ns + int64(timeout)
	}
	if cap(rt.evbuf) < len(out) {
		rt.evbuf = make([]port.Event, len(out))
	}
	for {
		tick, ns := rt.now()
		rt.tmu.Lock()
		rt.wheel.advance(tick)
		haveTimers := rt.wheel.nready > 0
		nextTick, _, _, haveNext := rt.wheel.next()
		tver := rt.tver.Load()
		rt.tmu.Unlock()

		ms := 0 // how long the poller may sleep
		if !haveTimers && rt.bhead == len(rt.batch) && rt.npending.Load() == 0 {
			ms = -1
			wake := int64(math.MaxInt64)
			if deadline >= 0 {
				wake = deadline
			}
			if haveNext && nextTick < uint64(math.MaxInt64/1000000) && int64(nextTick)*1e6 < wake {
				wake = int64(nextTick) * 1e6
			}
			if wake != math.MaxInt64 {
				ms = msUntil(wake - ns)
			}
			if ms != 0 {
				if wake == math.MaxInt64 {
					rt.wakeAt.Store(math.MaxInt64)
				} else {
					rt.wakeAt.Store(wake / 1e6)
				}
				atomic.StoreInt32(rt.sleeping, 1)
				// Dekker with Post, AddTimer and the Source's feeders:
				// after announcing sleep, look again for what they may
				// have added meanwhile.
				if rt.npending.Load() != 0 || rt.tver.Load() != tver || (rt.src != nil && rt.src.Pending()) {
					atomic.StoreInt32(rt.sleeping, 0)
					ms = 0
				}
			}
		}
		var nfd int
		var res port.WaitResult
		var err error
		if ms == 0 && (rt.nfds.Load() == 0 || (rt.skipped < maxSkippedPolls && ns-rt.lastPoll < pollEvery)) {
			// Other work is ready: skip the syscall this time. A rung
			// doorbell is drained at the next real poll.
			rt.skipped++
		} else {
			rt.skipped, rt.lastPoll = 0, ns
			nfd, res, err = rt.poller.Wait(rt.evbuf[:len(out)], ms)
			atomic.StoreInt32(rt.sleeping, 0)
		}
		if rt.shut.Load() {
			return 0, ErrClosed
		}
		if err != nil {
			return 0, mapPortErr(err)
		}
		n := rt.collect(out, rt.evbuf[:nfd])
		if n > 0 || res.Woken || res.Interrupted || timeout == 0 {
			return n, nil
		}
		if deadline >= 0 {
			if _, ns := rt.now(); ns >= deadline {
				return 0, nil
			}
		}
		// Only a doorbell, a cascade or an early poller return: go on.
	}
}

// msUntil converts a positive delay in ns to whole ms, rounding up, so a
// sleep never ends early and never spins on a sub-millisecond remainder.
func msUntil(ns int64) int {
	if ns <= 0 {
		return 0
	}
	ms := (ns + 1e6 - 1) / 1e6
	if ms > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(ms)
}

// collect fills out from the three sources, rotating which goes first so
// that none can starve the others when out is small.
func (rt *Runtime) collect(out []Event, fds []port.Event) int {
	n := 0
	rt.rot++
	for k := 0; k < 3 && n < len(out); k++ {
		switch (rt.rot + k) % 3 {
		case 0:
			if len(fds) > 0 {
				rt.cmu.RLock()
				for _, e := range fds {
					if n == len(out) {
						break
					}
					out[n] = Event{Fd: e.Fd, Type: e.Events, Context: rt.ctx[e.Fd]}
					n++
				}
				rt.cmu.RUnlock()
			}
		case 1:
			rt.tmu.Lock()
			for n < len(out) {
				key, id, ok := rt.wheel.pop()
				if !ok {
					break
				}
				out[n] = Event{Fd: -1, Type: EventTimer, Key: key, Data: uintptr(id)}
				n++
			}
			rt.tmu.Unlock()
		case 2:
			n = rt.takeCompletions(out, n)
			if rt.src != nil && n < len(out) {
				k := rt.src.Take(out[n:])
				for i := n; i < n+k; i++ {
					out[i].Fd, out[i].Type, out[i].Context = -1, EventCompletion, 0
				}
				n += k
			}
		}
	}
	return n
}

func (rt *Runtime) takeCompletions(out []Event, n int) int {
	if rt.bhead == len(rt.batch) {
		if rt.npending.Load() == 0 {
			return n
		}
		// Swap the shared slice with the drained private one: O(1) under
		// the lock, whatever the backlog.
		rt.mu.Lock()
		rt.batch, rt.pending = rt.pending, rt.batch[:0]
		rt.npending.Store(0)
		rt.mu.Unlock()
		rt.bhead = 0
	}
	for n < len(out) && rt.bhead < len(rt.batch) {
		c := rt.batch[rt.bhead]
		rt.bhead++
		out[n] = Event{Fd: -1, Type: EventCompletion, Key: c.key, Data: c.data}
		n++
	}
	if rt.bhead == len(rt.batch) {
		rt.batch, rt.bhead = rt.batch[:0], 0
	}
	return n
}

// Close ends the runtime: a blocked Wait returns ErrClosed, pending
// completions and timers are dropped, the poller's descriptors are closed.
// Registered fds stay open (they are the caller's).
func (rt *Runtime) Close() error {
	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
		return ErrClosed
	}
	rt.closed = true
	rt.pending = nil
	rt.mu.Unlock()
	rt.tmu.Lock()
	rt.shut.Store(true)
	rt.tmu.Unlock()
	_ = rt.poller.Ring()
	rt.waitMu.Lock() // the waiter, if any, has left
	rt.batch = nil
	rt.wheel = newWheel()
	rt.waitMu.Unlock()
	return mapPortErr(rt.poller.Close())
}
