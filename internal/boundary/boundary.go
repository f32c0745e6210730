// Package boundary is what package libasync shows the C boundary (cabi) and
// nobody else: a runtime fed by an external completion source, the state it
// shares with a fast path outside Go, and its wait taken apart so that C can
// do the sleeping. Package libasync sets NewRuntime when it initializes; the
// public Go API stays libasync's.
package boundary

import (
	"time"

	"github.com/libasync/libasync/port"
)

// Event is libasync.Event (an alias there).
type Event struct {
	Fd      int
	Type    uint32
	Key     uintptr
	Data    uintptr
	Context uintptr
}

// Shared is the part of a Runtime's state that a fast path outside Go reads
// and updates: the C boundary's async_runtime_wait hands out completions of
// its Source without entering Go while nothing else can be ready (GoWork 0,
// no timer due before NextDue, and the fd poll budget below not spent). It
// may live in C memory; every access is atomic. Times are ns since the
// runtime started (the monotonic clock).
type Shared struct {
	Sleeping int32 // 1 while the waiter may block in the poller (see Source)
	GoWork   int32 // 1: completions from Post or expired timers may be ready
	Skipped  int32 // fd polls skipped in a row while other work was ready
	_        int32
	LastPoll int64 // when the fds were last polled
	NextDue  int64 // no timer is due before this (MaxInt64: none); valid while GoWork is 0
	Nfds     int64 // registrations (an upper bound: epoll forgets closed fds)
}

// Source is a queue of completions kept outside the runtime, drained by Wait
// beside what Post queued: the C boundary keeps one lock-free queue per
// posting thread there, so that posting from C never enters Go.
//
// Whoever feeds a Source must, after publishing an entry, read the sleep
// flag (sequentially consistent) and, if it is 1 and a compare-and-swap to 0
// succeeds, ring the poller's doorbell (port.Poller.Doorbell). libasync's Wait raises the
// flag before it may block and then calls Pending, so no entry is missed.
type Source interface {
	// Pending reports whether entries wait to be taken.
	Pending() bool
	// Take moves up to len(out) entries into out (Key and Data) and
	// returns how many; entries of one feeder come out in FIFO order.
	Take(out []Event) int
}

// Waiter is one libasync Runtime.Wait taken apart. Use: loop { Prepare;
// poll for ms if asked, into Buf; Finish } until Finish says done; then End.
// Only the thread that began it may use it.
type Waiter interface {
	// Buf is where the poller's events go (len: as many as out can take).
	Buf() []port.Event
	// Prepare advances the timers and says how long the poller may block
	// (ms: -1 forever), or poll false when there is no need to poll.
	Prepare() (ms int, poll bool)
	// Finish takes the poller's result (nfd events in Buf, or polled false
	// when Prepare said not to poll) and collects events into out; done
	// says the wait is over.
	Finish(nfd int, res port.WaitResult, perr error, polled bool) (n int, done bool, err error)
	// End finishes the wait and publishes what the fast path needs.
	End()
}

// Hooks are what the C boundary needs of a runtime beyond libasync's API.
type Hooks struct {
	// BeginWait starts a wait (libasync.ErrBusy if another is in progress).
	BeginWait func(out []Event, timeout time.Duration) (Waiter, error)
}

// NewRuntime makes a *libasync.Runtime on p that also drains src, with sh
// (which may live in C memory) as its shared state; set by package libasync.
var NewRuntime func(p port.Poller, src Source, sh *Shared) (rt any, h Hooks)
