package libasync

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libasync/libasync/internal/boundary"
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
	// EventSignal is a watched signal's event; only the C boundary's Source
	// produces it (async_runtime_add_signal).
	EventSignal uint32 = 0x40
)

// Event is one thing Wait reports: fd readiness (Fd >= 0, Context as given to
// Add), a completion (Fd -1, Key and Data as posted) or a timer (Fd -1, Key,
// Data = the timer id).
//
// Its fields are Fd int, Type uint32, Key, Data and Context uintptr.
type Event = boundary.Event

type completion struct{ key, data uintptr }

// fdReg is one fd's registration: its context and the regSeq value at its
// last change. An event harvested by a poll that began before that change
// belongs to an older registration and is dropped (readiness is
// level-triggered: if it still holds it is reported again), so no event is
// ever reported for a removed fd, with another fd's context, or for events
// the caller no longer asked for.
type fdReg struct {
	ctx uintptr
	seq uint64
}

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

	mu       sync.Mutex // pending, closed (for posters)
	pending  []completion
	npending atomic.Int64
	closed   bool
	shut     atomic.Bool

	sh    *boundary.Shared // the sleep flag and what a wait driven outside Go needs
	shBox boundary.Shared
	src   boundary.Source

	mem boundary.Mem         // see setMem
	obs boundary.RegObserver // see setRegObserver; under cmu

	waitMu sync.Mutex // held by the one waiter
	wcall  waitCall
	batch  []completion
	bhead  int
	evbuf  []port.Event
	rot    int

	tmu   sync.Mutex // the wheel
	wheel *wheel
	tver  atomic.Uint64 // bumped by AddTimer: a sleeping waiter's plan is stale

	cmu sync.RWMutex // fd contexts
	ctx map[int]fdReg
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
	rt := &Runtime{poller: p, wheel: newWheel(), ctx: map[int]fdReg{}}
	rt.sh = &rt.shBox
	rt.sh.GoWork = 1
	rt.sh.Start = nanotime()
	return rt
}

// newRuntimeWithSource is NewRuntimeWith with an external completion source
// whose feeders read the sleep flag sh.Sleeping; sh (which may live in C
// memory, zeroed) is the state shared with a fast path outside Go. The C
// boundary reaches it through boundary.NewRuntime (boundary.go).
func newRuntimeWithSource(p port.Poller, src boundary.Source, sh *boundary.Shared) *Runtime {
	rt := NewRuntimeWith(p)
	*sh = boundary.Shared{GoWork: 1, Start: rt.sh.Start, NextDue: math.MaxInt64, WakeAt: math.MaxInt64}
	rt.src, rt.sh = src, sh
	return rt
}

// setMem makes the runtime keep what grows with use (the timer slab, the
// poller's event buffer) in m, and reserves a poller buffer for reserve
// events, so that running out of memory is an error (AddTimer: ErrNoMem)
// or a shorter batch (Wait delivers with the buffer it has), never an
// abort. Call it before any other method. ErrNoMem if the reservation
// fails.
func (rt *Runtime) setMem(m boundary.Mem, reserve int) error {
	rt.mem = m
	rt.wheel.mem = m
	if !rt.growEvbuf(reserve) {
		return ErrNoMem
	}
	return nil
}

// growEvbuf makes the poller buffer hold n events (in rt.mem if set).
func (rt *Runtime) growEvbuf(n int) bool {
	if cap(rt.evbuf) >= n {
		return true
	}
	if rt.mem == nil {
		rt.evbuf = make([]port.Event, n)
		return true
	}
	p := rt.mem.Realloc(unsafe.Pointer(unsafe.SliceData(rt.evbuf)), uintptr(n)*unsafe.Sizeof(port.Event{}))
	if p == nil {
		return false
	}
	rt.evbuf = unsafe.Slice((*port.Event)(p), n)
	return true
}

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

// lockChange checks the arguments of an Add or Modify, locks cmu and makes
// the change in the poller. On nil cmu stays locked, for the caller to
// record the registration; on an error it is unlocked: ErrInval for an
// unknown event bit, ErrBadFd for a negative fd, or the poller's error.
func (rt *Runtime) lockChange(fd int, events uint32, change func(int, uint32) error) error {
	if events&^fdEventMask != 0 {
		return ErrInval
	}
	if fd < 0 {
		return ErrBadFd
	}
	rt.cmu.Lock()
	if err := mapPortErr(change(fd, events)); err != nil {
		rt.cmu.Unlock()
		return err
	}
	return nil
}

// Add watches fd for events (EventRead|EventWrite|EventClose; errors and a
// hang-up of both sides are always reported, a read-side hang-up alone only
// with EventClose: see port.Poller); ctx comes back in its events.
// ErrBadFd for a number that names no open descriptor (negative, above
// math.MaxInt32 on Unix, or not open), ErrExists if fd is registered.
func (rt *Runtime) Add(fd int, events uint32, ctx uintptr) error {
	if err := rt.lockChange(fd, events, rt.poller.Add); err != nil {
		return err
	}
	defer rt.cmu.Unlock()
	if _, ok := rt.ctx[fd]; !ok {
		atomic.AddInt64(&rt.sh.Nfds, 1)
	}
	r := fdReg{ctx, atomic.AddUint64(&rt.sh.RegSeq, 1)}
	rt.ctx[fd] = r
	if rt.obs != nil {
		rt.obs.Registered(fd, r.ctx, r.seq)
	}
	return nil
}

// Modify changes the watched events of fd.
func (rt *Runtime) Modify(fd int, events uint32) error {
	return rt.modify(fd, events, 0, false)
}

// ModifyContext changes the watched events of fd and the context its
// events carry from now on (events harvested before the change are dropped,
// as for any change of a registration).
func (rt *Runtime) ModifyContext(fd int, events uint32, ctx uintptr) error {
	return rt.modify(fd, events, ctx, true)
}

func (rt *Runtime) modify(fd int, events uint32, ctx uintptr, setCtx bool) error {
	if err := rt.lockChange(fd, events, rt.poller.Modify); err != nil {
		return err
	}
	defer rt.cmu.Unlock()
	if r, ok := rt.ctx[fd]; ok {
		r.seq = atomic.AddUint64(&rt.sh.RegSeq, 1)
		if setCtx {
			r.ctx = ctx
		}
		rt.ctx[fd] = r
		if rt.obs != nil {
			rt.obs.Registered(fd, r.ctx, r.seq)
		}
	}
	return nil
}

// Remove stops watching fd.
func (rt *Runtime) Remove(fd int) error {
	if fd < 0 {
		return ErrBadFd
	}
	rt.cmu.Lock()
	defer rt.cmu.Unlock()
	err := mapPortErr(rt.poller.Remove(fd))
	if err != nil && err != ErrBadFd {
		return err
	}
	// ErrBadFd: closed while registered, so the registration is gone too.
	if _, ok := rt.ctx[fd]; ok {
		atomic.AddInt64(&rt.sh.Nfds, -1)
		delete(rt.ctx, fd)
		seq := atomic.AddUint64(&rt.sh.RegSeq, 1)
		if rt.obs != nil {
			rt.obs.Unregistered(fd, seq)
		}
	}
	return err
}

// setRegObserver installs o (boundary.Hooks.SetRegObserver): taking cmu
// waits for a registration change in progress, which may be calling the
// previous observer.
func (rt *Runtime) setRegObserver(o boundary.RegObserver) {
	rt.cmu.Lock()
	rt.obs = o
	rt.cmu.Unlock()
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
	atomic.StoreInt32(&rt.sh.GoWork, 1)
	if atomic.LoadInt32(&rt.sh.Sleeping) != 0 && atomic.CompareAndSwapInt32(&rt.sh.Sleeping, 1, 0) {
		atomic.AddUint64(&rt.sh.Rings, 1)
		_ = rt.poller.Ring() // ErrClosed after Close: nobody to wake
	}
	return nil
}

// Wakeup makes a blocked Wait return without an event; with no waiter, the
// next Wait returns at once (with what is ready, if anything) and takes it:
// one Wakeup ends at most one Wait early (see takeWakeup).
func (rt *Runtime) Wakeup() error {
	if rt.shut.Load() {
		return ErrClosed
	}
	// Raised before the ring: a wait the ring wakes finds it up. C's
	// async_runtime_wakeup does the same without entering Go.
	atomic.StoreInt32(&rt.sh.WakeReq, 1)
	err := mapPortErr(rt.poller.Wakeup())
	if err == nil {
		atomic.AddUint64(&rt.sh.Wakeups, 1)
	}
	return err
}

// takeWakeup takes down the wakeup flag (Shared.WakeReq) and reports
// whether it was up. The flag is the wakeup: the wait that takes it returns,
// the doorbell's ring only ends a sleep. A wait takes it when it begins and
// after each poll, so a Wakeup made while no wait sleeps ends the next wait,
// whether or not that one would have slept, and no other. Waiter only; a
// plain load first, so a wait with none pending pays no read-modify-write.
func (rt *Runtime) takeWakeup() bool {
	return atomic.LoadInt32(&rt.sh.WakeReq) != 0 && atomic.SwapInt32(&rt.sh.WakeReq, 0) != 0
}

// now is the current tick: whole milliseconds since the runtime started.
// The clock is the monotonic one that C code outside Go reads too
// (CLOCK_MONOTONIC on Linux), from the one origin Shared.Start.
func (rt *Runtime) now() (tick uint64, ns int64) {
	ns = nanotime() - rt.sh.Start
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
	if id == 0 {
		rt.tmu.Unlock()
		return 0, ErrNoMem
	}
	rt.tver.Add(1)
	rt.countTimers()
	rt.tmu.Unlock()
	atomic.StoreInt32(&rt.sh.GoWork, 1) // NextDue may be later than this timer
	// Wake a sleeping waiter whose sleep would outlast this timer.
	if atomic.LoadInt32(&rt.sh.Sleeping) != 0 && due < uint64(atomic.LoadInt64(&rt.sh.WakeAt))/1e6 &&
		atomic.CompareAndSwapInt32(&rt.sh.Sleeping, 1, 0) {
		atomic.AddUint64(&rt.sh.Rings, 1)
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
	rt.countTimers()
	return nil
}

// countTimers publishes the number of live timers (Shared.Timers, for
// async_runtime_get_stats). Under tmu.
func (rt *Runtime) countTimers() { atomic.StoreInt64(&rt.sh.Timers, int64(rt.wheel.live)) }

// Wait fills out with events and returns how many, at most
// port.MaxHarvest per call (what does not fit stays for the next call).
// timeout < 0 waits
// forever, 0 polls, otherwise at least timeout (rounded up to whole ms).
// It returns early with 0 on Wakeup or when a signal interrupted the wait;
// after a Wakeup made while no Wait slept, the next Wait returns without
// sleeping and takes it (the Wait after that sleeps as usual).
func (rt *Runtime) Wait(out []Event, timeout time.Duration) (int, error) {
	w, err := rt.beginWait(out, timeout)
	if err != nil {
		return 0, err
	}
	defer w.End()
	for {
		ms, poll := w.Prepare()
		var nfd int
		var res port.WaitResult
		var perr error
		if poll && ms != 0 {
			// It may block: the time counts as idle (Shared.IdleNs).
			t0 := nanotime()
			nfd, res, perr = rt.poller.Wait(w.Buf(), ms)
			atomic.StoreInt64(&rt.sh.IdleNs, atomic.LoadInt64(&rt.sh.IdleNs)+nanotime()-t0)
		} else if poll {
			nfd, res, perr = rt.poller.Wait(w.Buf(), ms)
		}
		if n, done, err := w.Finish(nfd, res, perr, poll); done {
			return n, err
		}
	}
}

// waitCall is one Wait taken apart, so that the blocking part can be done
// by someone else: the C boundary sleeps in epoll_wait itself, outside Go
// (see port.RawPoller), which spares a blocked host thread Go's syscall
// bookkeeping. Use: beginWait, then loop { Prepare; poll for ms if asked,
// into Buf; Finish } until Finish says done; then End. Only the goroutine or
// thread that called beginWait may use it.
type waitCall struct {
	rt       *Runtime
	out      []Event
	timeout  time.Duration
	deadline int64 // ns since start; -1: forever
	ns       int64 // the clock at Prepare
	regSeq   uint64
	mustPoll bool // the fd poll was skipped and nothing came: poll before giving up
}

// busyOrClosed is why waitMu could not be taken: Close holds it while it
// waits for the waiter to leave (it sets shut first), and a wait that comes
// then is told ErrClosed, not ErrBusy, as any wait racing Close is;
// otherwise another wait is in progress.
func (rt *Runtime) busyOrClosed() error {
	if rt.shut.Load() {
		return ErrClosed
	}
	return ErrBusy
}

// beginWait starts a wait (ErrBusy if another is in progress).
func (rt *Runtime) beginWait(out []Event, timeout time.Duration) (*waitCall, error) {
	if len(out) == 0 {
		return nil, ErrInval
	}
	if !rt.waitMu.TryLock() {
		return nil, rt.busyOrClosed()
	}
	if rt.shut.Load() {
		rt.waitMu.Unlock()
		return nil, ErrClosed
	}
	if len(out) > port.MaxHarvest {
		// The poller harvests no more per call, and the buffer for its
		// records would follow a huge out (see port.MaxHarvest).
		out = out[:port.MaxHarvest]
	}
	if rt.takeWakeup() {
		timeout = 0 // a Wakeup made before this wait: do not sleep
	}
	w := &rt.wcall
	*w = waitCall{rt: rt, out: out, timeout: timeout, deadline: -1}
	if timeout >= 0 {
		_, ns := rt.now()
		w.deadline = ns + int64(timeout)
	}
	if !rt.growEvbuf(len(out)) {
		// Out of memory: deliver with the buffer there is (setMem
		// reserved one), fewer events per call.
		if cap(rt.evbuf) == 0 {
			rt.waitMu.Unlock()
			return nil, ErrNoMem
		}
		w.out = out[:cap(rt.evbuf)]
	}
	return w, nil
}

// Buf is where the poller's events go (len: as many as out can take).
func (w *waitCall) Buf() []port.Event { return w.rt.evbuf[:len(w.out)] }

// End finishes the wait; the waitCall must not be used afterwards. It
// publishes in Shared what the fast path outside Go needs: whether work was
// left here (GoWork; Prepare cleared it, Post and AddTimer set it) and when
// the next timer is due.
func (w *waitCall) End() {
	rt := w.rt
	w.rt = nil
	rt.publish()
	rt.waitMu.Unlock()
}

// publish stores in Shared whether work was left in Go (GoWork) and when the
// next timer is due (NextDue), for the wait outside Go. Waiter only.
func (rt *Runtime) publish() {
	rt.tmu.Lock()
	ready := rt.wheel.nready > 0
	due := int64(math.MaxInt64)
	if tick, _, _, ok := rt.wheel.next(); ok && tick < uint64(math.MaxInt64/1000000) {
		due = int64(tick) * 1e6
	}
	rt.tmu.Unlock()
	atomic.StoreInt64(&rt.sh.NextDue, due)
	if ready || rt.bhead < len(rt.batch) || rt.npending.Load() != 0 {
		atomic.StoreInt32(&rt.sh.GoWork, 1)
	}
}

// Prepare advances the timers and says how long the poller may block (ms:
// -1 forever, 0 not at all) and whether to poll at all. When ms != 0 the
// sleep flag is raised: whoever adds work then rings the doorbell.
func (w *waitCall) Prepare() (ms int, poll bool) {
	rt := w.rt
	// Cleared before looking at the timers and Post's queue: whatever is
	// added after this sets it again (see End).
	atomic.StoreInt32(&rt.sh.GoWork, 0)
	tick, ns := rt.now()
	w.ns = ns
	w.regSeq = atomic.LoadUint64(&rt.sh.RegSeq) // before the poll: see fdReg
	rt.tmu.Lock()
	rt.wheel.advance(tick)
	haveTimers := rt.wheel.nready > 0
	nextTick, _, _, haveNext := rt.wheel.next()
	tver := rt.tver.Load()
	rt.tmu.Unlock()

	if !haveTimers && rt.bhead == len(rt.batch) && rt.npending.Load() == 0 {
		ms = -1
		wake := int64(math.MaxInt64)
		if w.deadline >= 0 {
			wake = w.deadline
		}
		if haveNext && nextTick < uint64(math.MaxInt64/1000000) && int64(nextTick)*1e6 < wake {
			wake = int64(nextTick) * 1e6
		}
		if wake != math.MaxInt64 {
			ms = msUntil(wake - ns)
		}
		if ms != 0 {
			atomic.StoreInt64(&rt.sh.WakeAt, wake)
			atomic.StoreInt32(&rt.sh.Sleeping, 1)
			// Dekker with Post, AddTimer and the Source's feeders: after
			// announcing sleep, look again for what they may have added.
			if rt.npending.Load() != 0 || rt.tver.Load() != tver || (rt.src != nil && rt.src.Pending()) {
				atomic.StoreInt32(&rt.sh.Sleeping, 0)
				ms = 0
			}
		}
	}
	sh := rt.sh
	if ms == 0 && !w.mustPoll && (atomic.LoadInt64(&sh.Nfds) == 0 ||
		(atomic.LoadInt32(&sh.Skipped) < maxSkippedPolls && ns-atomic.LoadInt64(&sh.LastPoll) < pollEvery)) {
		// Other work is ready: skip the syscall this time. A rung doorbell
		// is drained at the next real poll.
		if atomic.LoadInt32(&sh.Skipped) < maxSkippedPolls {
			atomic.AddInt32(&sh.Skipped, 1)
		}
		return 0, false
	}
	atomic.StoreInt32(&sh.Skipped, 0)
	atomic.StoreInt64(&sh.LastPoll, ns)
	return ms, true
}

// Finish takes the poller's result (nfd events in Buf, or polled=false when
// Prepare said not to poll) and collects events into out. done says the
// wait is over (n events, or err).
func (w *waitCall) Finish(nfd int, res port.WaitResult, perr error, polled bool) (n int, done bool, err error) {
	rt := w.rt
	if polled {
		atomic.StoreInt32(&rt.sh.Sleeping, 0)
	}
	if rt.shut.Load() {
		return 0, true, ErrClosed
	}
	if perr != nil {
		return 0, true, mapPortErr(perr)
	}
	n = rt.collect(w.out, rt.evbuf[:nfd], w.regSeq, true)
	// The flag, not res.Woken: a WakeupByte drained now may be of a wakeup
	// an earlier wait took already.
	woken := polled && rt.takeWakeup()
	if n > 0 || woken || res.Interrupted {
		return n, true, nil
	}
	if !polled && atomic.LoadInt64(&rt.sh.Nfds) > 0 && !w.mustPoll {
		// The poll was skipped for work that turned out to be nothing (a
		// stale GoWork, a cascade): look at the fds before returning 0, or a
		// ready fd would go unreported by wait(0).
		w.mustPoll = true
		return 0, false, nil
	}
	w.mustPoll = false
	if w.timeout == 0 {
		return 0, true, nil
	}
	if w.deadline >= 0 {
		if _, ns := rt.now(); ns >= w.deadline {
			return 0, true, nil
		}
	}
	// Only a doorbell, a cascade or an early poller return: go on.
	return 0, false, nil
}

// step is the Go part of a wait driven from outside Go (the C boundary's
// async_runtime_wait on a RawPoller): that caller sleeps on Shared.RawFD
// itself, drains the doorbell and hands out the Source's entries itself, and
// calls step only when fd events were harvested (fds, by a poll that began
// when Shared.RegSeq was regSeq) or Go may have work (GoWork, or a timer due
// at Shared.NextDue). step advances the timers, collects fd events, expired
// timers and Post's completions into out (not the Source's), and publishes
// GoWork and NextDue again. It never blocks. ErrBusy if a Wait of the Go API
// runs; ErrClosed after Close.
func (rt *Runtime) step(out []Event, fds []port.Event, regSeq uint64) (int, error) {
	if !rt.waitMu.TryLock() {
		return 0, rt.busyOrClosed()
	}
	defer rt.waitMu.Unlock()
	if rt.shut.Load() {
		return 0, ErrClosed
	}
	// Cleared before looking at the timers and Post's queue: whatever is
	// added after this sets it again.
	atomic.StoreInt32(&rt.sh.GoWork, 0)
	tick, _ := rt.now()
	rt.tmu.Lock()
	rt.wheel.advance(tick)
	rt.tmu.Unlock()
	n := 0
	if len(out) > 0 {
		n = rt.collect(out, fds, regSeq, false)
	}
	rt.publish()
	return n, nil
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

// collect fills out from the three sources. Harvested fd records go first:
// a record left out now is gone until the next poll, and while other events
// are ready the fds are polled only once per budget (Prepare, and the
// C-driven wait's twin), whereas timers and completions stay queued and are
// served by the waits that skip the poll. Timers and completions take turns
// at going first, so that neither starves the other when out is small.
func (rt *Runtime) collect(out []Event, fds []port.Event, regSeq uint64, withSrc bool) int {
	n := 0
	if len(fds) > 0 && len(out) > 0 {
		n = rt.collectFds(out, fds, regSeq)
	}
	rt.rot++
	for k := 0; k < 2 && n < len(out); k++ {
		switch (rt.rot + k) % 2 {
		case 0:
			rt.tmu.Lock()
			n0 := n
			for n < len(out) {
				key, id, ok := rt.wheel.pop()
				if !ok {
					break
				}
				out[n] = Event{Fd: -1, Type: EventTimer, Key: key, Data: uintptr(id)}
				n++
			}
			if n > n0 {
				rt.countTimers() // one-shot timers are gone once delivered
			}
			rt.tmu.Unlock()
		case 1:
			n = rt.takeCompletions(out, n)
			if withSrc && rt.src != nil && n < len(out) {
				k := rt.src.Take(out[n:])
				for i := n; i < n+k; i++ {
					out[i].Fd, out[i].Context = -1, 0
					if out[i].Type == 0 {
						out[i].Type = EventCompletion
					}
				}
				n += k
			}
		}
	}
	return n
}

// collectFds translates harvested fd records into out (len(out) > 0).
// A poller harvests no more records than out has room for (Buf, and the
// C-driven wait's poll), in the order that gives every ready fd its turn
// (see port.Poller's Wait), so every record is reported except those of a
// registration removed or changed since the poll began.
func (rt *Runtime) collectFds(out []Event, fds []port.Event, regSeq uint64) int {
	n := 0
	rt.cmu.RLock()
	for _, e := range fds {
		if n == len(out) {
			break
		}
		r, ok := rt.ctx[e.Fd]
		if !ok || r.seq > regSeq {
			continue // removed or changed since the poll began
		}
		out[n] = Event{Fd: e.Fd, Type: e.Events, Context: r.ctx}
		n++
	}
	rt.cmu.RUnlock()
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
	rt.wheel.freeMem()
	rt.wheel = newWheel()
	if rt.mem != nil {
		rt.mem.Free(unsafe.Pointer(unsafe.SliceData(rt.evbuf)))
		rt.evbuf = nil
	}
	rt.waitMu.Unlock()
	return mapPortErr(rt.poller.Close())
}
