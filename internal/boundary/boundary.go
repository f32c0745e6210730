// Package boundary is what package libasync shows the C boundary (cabi) and
// nobody else: a runtime fed by an external completion source, the state it
// shares with a fast path outside Go, and its wait taken apart so that C can
// do the sleeping. Package libasync sets NewRuntime when it initializes; the
// public Go API stays libasync's.
package boundary

import (
	"unsafe"

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
	Sleeping int32  // 1 while the waiter may block in the poller (see Source)
	GoWork   int32  // 1: completions from Post or expired timers may be ready
	Skipped  int32  // fd polls skipped in a row while other work was ready
	RawFD    int32  // the descriptor a wait driven outside Go sleeps on (see Step)
	WakeReq  int32  // 1: an explicit wakeup that no wait has taken yet (see Runtime.Wakeup)
	_        int32  // keeps the int64 fields 8-aligned, as in C, on every ABI
	LastPoll int64  // when the fds were last polled
	NextDue  int64  // no timer is due before this (MaxInt64: none); valid while GoWork is 0
	Nfds     int64  // registrations (an upper bound: epoll forgets closed fds)
	RegSeq   uint64 // bumped by every Add, Modify and Remove (see fdReg)
	WakeAt   int64  // when the sleeping waiter wakes by itself (MaxInt64: never)
	Start    int64  // the runtime's clock origin: monotonic ns (runtime.nanotime)

	// Counters for async_runtime_get_stats, read from any thread.
	IdleNs  int64  // ns the waiter spent blocked in the poller (polls with a timeout != 0); waiter only
	Timers  int64  // timers added and not yet cancelled or (one-shot) delivered; under the timer lock
	Rings   uint64 // doorbell writes by posts and timers that found the waiter asleep
	Wakeups uint64 // explicit wakeups (Runtime.Wakeup, async_runtime_wakeup) that rang the doorbell
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
	// Take moves up to len(out) entries into out (Key, Data and Type: 0
	// for a completion, or another event type the feeder produces, such as
	// the C boundary's signal events) and returns how many; entries of one
	// feeder come out in FIFO order.
	Take(out []Event) int
}

// Mem is memory outside the Go heap (C's malloc, for the C boundary). The Go
// runtime cannot fail an allocation softly: when the address space runs out
// it aborts the process. Realloc resizes the block at p (nil: a new block)
// to size bytes and returns it, or nil if memory ran out (p is then left
// as it was); Free releases a block (nil is a no-op).
type Mem interface {
	Realloc(p unsafe.Pointer, size uintptr) unsafe.Pointer
	Free(p unsafe.Pointer)
}

// RegObserver is told every change of an fd registration, under the
// runtime's registration lock, after the poller accepted it, so that a wait
// driven outside Go can translate the poller's records of live
// registrations itself (cabi's fd map). seq is the registration's
// Shared.RegSeq value.
type RegObserver interface {
	Registered(fd int, ctx uintptr, seq uint64)
	Unregistered(fd int, seq uint64)
}

// Hooks are what the C boundary needs of a runtime beyond libasync's API.
type Hooks struct {
	// SetRegObserver installs o (nil: none). It returns once no call of the
	// previous observer is in progress.
	SetRegObserver func(o RegObserver)
	// Step is one wait driven from outside Go (libasync's Runtime.step): it
	// advances the timers, collects fd events (fds, harvested by a poll
	// that began when Shared.RegSeq was regSeq), expired timers and Post's
	// completions into out, and publishes GoWork and NextDue. Never blocks.
	Step func(out []Event, fds []port.Event, regSeq uint64) (int, error)
	// SetMem keeps what grows with use in m and reserves a poller buffer
	// for reserve events (libasync's Runtime.setMem); call it first.
	SetMem func(m Mem, reserve int) error
}

// NewRuntime makes a *libasync.Runtime on p that also drains src, with sh
// (which may live in C memory) as its shared state; set by package libasync.
var NewRuntime func(p port.Poller, src Source, sh *Shared) (rt any, h Hooks)
