// Command cabi is libasync's C boundary, built with -buildmode=c-shared or
// c-archive. The public functions of include/async.h are C (shim.c,
// worker.c, queue.c, fiber_*.c); those that need the Go core (the runtime)
// call the la_go_* exports below.
//
// Rules of this boundary:
//   - every export validates its handle through the handle table and never
//     trusts a pointer it was given beyond the sizes it was told;
//   - every export returns an async_err_t code (0 = success) and recovers any
//     panic into ASYNC_E_INTERNAL: a Go panic never reaches C;
//   - C never keeps a Go pointer: handles are integers (see la.h);
//   - nothing here blocks except the documented waits.
package main

/*
#cgo CFLAGS: -I${SRCDIR}/../include -O2 -Wall
#include <stdlib.h>
#include "la.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/cgo"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	_ "github.com/libasync/libasync/cabi/internal/compat" // the classic lib/async API (include/async/)
	"github.com/libasync/libasync/libasync"
	"github.com/libasync/libasync/port"
)

func main() {}

// guard turns a panic into ASYNC_E_INTERNAL. It must be deferred directly.
func guard(rc *C.int) {
	if r := recover(); r != nil {
		if os.Getenv("ASYNC_DEBUG") != "" {
			fmt.Fprintf(os.Stderr, "libasync: internal error: %v\n%s", r, debug.Stack())
		}
		*rc = C.int(libasync.EInternal)
	}
}

func code(err error) C.int { return C.int(libasync.CodeOf(err)) }

// duration converts a C timeout in ms (-1 forever) to the core's convention.
func duration(ms C.int) (time.Duration, bool) {
	if ms < -1 {
		return 0, false
	}
	if ms == -1 {
		return -1, true
	}
	return time.Duration(ms) * time.Millisecond, true
}

// ---------------------------------------------------------------------------
// The Go half of the handle table: the Go object behind each C slot index.

const (
	chunkBits = 12
	chunkSize = 1 << chunkBits
	maxChunks = 4096
)

type object struct {
	h  uint64
	rt *rtObject
}

type rtObject struct {
	rt      *libasync.Runtime
	waiting *int32 // in C memory: C's fast path takes it too (rtwait.c)
	evs     []libasync.Event
	rtc     *C.la_rtc_t

	// The C-driven wait (see la_go_rt_wait_begin).
	raw    port.RawPoller // nil: the poller waits in Go
	rawbuf unsafe.Pointer // C memory for epoll_wait's records
	rawcap int
	wcall  *libasync.WaitCall
	token  cgo.Handle // how C names this object across the sleep
}

// la_shared_t mirrors libasync.Shared: the sizes must agree (compile-time check).
var (
	_ [unsafe.Sizeof(C.la_shared_t{}) - unsafe.Sizeof(libasync.Shared{})]byte
	_ [unsafe.Sizeof(libasync.Shared{}) - unsafe.Sizeof(C.la_shared_t{})]byte
)

// cSource drains the runtime's C-side completion queues (completions.c),
// which async_runtime_post_completion feeds without entering Go.
type cSource struct {
	r   *C.la_rtc_t
	buf []C.la_pair_t
}

func (s *cSource) Pending() bool { return C.la_rtc_pending(s.r) != 0 }

func (s *cSource) Take(out []libasync.Event) int {
	if len(out) == 0 {
		return 0
	}
	if cap(s.buf) < len(out) {
		s.buf = make([]C.la_pair_t, len(out))
	}
	n := int(C.la_rtc_take(s.r, &s.buf[0], C.int(len(out))))
	for i := 0; i < n; i++ {
		out[i].Key, out[i].Data = uintptr(s.buf[i].key), uintptr(s.buf[i].data)
	}
	return n
}

var objects [maxChunks]atomic.Pointer[[chunkSize]atomic.Pointer[object]]

func objSlot(h uint64) *atomic.Pointer[object] {
	idx := uint32(h)
	if idx == 0 || idx >= maxChunks*chunkSize {
		return nil
	}
	c := objects[idx>>chunkBits].Load()
	if c == nil {
		return nil
	}
	return &c[idx&(chunkSize-1)]
}

func lookup(h uint64) *object {
	s := objSlot(h)
	if s == nil {
		return nil
	}
	o := s.Load()
	if o == nil || o.h != h {
		return nil
	}
	return o
}

func publish(h uint64, o *object) {
	idx := uint32(h)
	ci := idx >> chunkBits
	c := objects[ci].Load()
	if c == nil {
		objects[ci].CompareAndSwap(nil, new([chunkSize]atomic.Pointer[object]))
		c = objects[ci].Load()
	}
	o.h = h
	c[idx&(chunkSize-1)].Store(o)
}

// unpublish removes h's object if it is of the wanted kind (a handle of
// another type must never destroy a runtime); only one caller wins.
func unpublish(h uint64, isKind func(*object) bool) *object {
	s := objSlot(h)
	if s == nil {
		return nil
	}
	o := s.Load()
	if o == nil || o.h != h || !isKind(o) || !s.CompareAndSwap(o, nil) {
		return nil
	}
	return o
}

func isRuntime(o *object) bool { return o.rt != nil }

func getRuntime(h C.uint64_t) *rtObject {
	if o := lookup(uint64(h)); o != nil {
		return o.rt
	}
	return nil
}

// ---------------------------------------------------------------------------
// Runtime

//export la_go_rt_init
func la_go_rt_init(out *C.uint64_t) (rc C.int) {
	defer guard(&rc)
	p, err := port.New()
	if err != nil {
		if errors.Is(err, port.ErrBackend) {
			return C.int(libasync.ENotSup)
		}
		return code(err)
	}
	fd, kind := p.Doorbell()
	r := C.la_rtc_new(C.int(fd), C.int(kind))
	if r == nil {
		p.Close()
		return C.int(libasync.ENoMem)
	}
	src := &cSource{r: r}
	C.la_rtc_set_start(r) // before the Go runtime's start (see there)
	rt := libasync.NewRuntimeWithSource(p, src, (*libasync.Shared)(unsafe.Pointer(C.la_rtc_shared(r))))
	h := C.la_handle_alloc(C.LA_T_RUNTIME, unsafe.Pointer(r))
	if h == 0 {
		rt.Close()
		C.la_rtc_recycle(r)
		return C.int(libasync.ENoMem)
	}
	ro := &rtObject{rt: rt, rtc: r, waiting: (*int32)(unsafe.Pointer(C.la_rtc_wait_flag(r)))}
	if rp, ok := p.(port.RawPoller); ok {
		ro.raw = rp
		ro.token = cgo.NewHandle(ro)
	}
	publish(uint64(h), &object{rt: ro})
	*out = h
	return 0
}

//export la_go_rt_deinit
func la_go_rt_deinit(h C.uint64_t) (rc C.int) {
	defer guard(&rc)
	o := unpublish(uint64(h), isRuntime)
	if o == nil {
		return C.int(libasync.EBadHandle)
	}
	// Retire the handle first: la_handle_free waits for every thread that
	// pinned it (a signal-safe wakeup, a poster ringing the doorbell), so
	// nobody writes the doorbell after it is closed; new posts fail.
	C.la_handle_free(h, C.LA_T_RUNTIME)
	C.la_rtc_close(o.rt.rtc)
	err := o.rt.rt.Close() // waits for a waiter to leave
	for atomic.LoadInt32(o.rt.waiting) != 0 {
		runtime.Gosched() // a waiter on the poller-in-Go path clears it just after
	}
	C.la_rtc_recycle(o.rt.rtc)
	if o.rt.raw != nil {
		o.rt.token.Delete()
		C.free(o.rt.rawbuf)
		o.rt.rawbuf = nil
	}
	if err == libasync.ErrClosed {
		err = nil
	}
	return code(err)
}

// la_go_rt_fd: op 0 add, 1 modify, 2 remove, 3 modify with a new context.
//
//export la_go_rt_fd
func la_go_rt_fd(h C.uint64_t, op C.int, fd C.int, events C.uint32_t, ctx C.uintptr_t) (rc C.int) {
	defer guard(&rc)
	o := getRuntime(h)
	if o == nil {
		return C.int(libasync.EBadHandle)
	}
	switch op {
	case 0:
		return code(o.rt.Add(int(fd), uint32(events), uintptr(ctx)))
	case 1:
		return code(o.rt.Modify(int(fd), uint32(events)))
	case 3:
		return code(o.rt.ModifyContext(int(fd), uint32(events), uintptr(ctx)))
	default:
		return code(o.rt.Remove(int(fd)))
	}
}

// The wait is driven from C (rtwait.c): la_go_rt_wait_begin and
// la_go_rt_wait_finish do everything but the blocking itself; when the loop
// must sleep they hand C the poller's raw descriptor, and C sleeps in
// epoll_wait outside Go. A host thread blocked inside Go would keep Go's
// scheduler busy (sysmon retakes its P, wakes other threads, and the return
// needs a P again); blocked in C it costs Go nothing, which shortens the
// wake-up. Pollers that cannot be driven so (port.RawPoller) wait in Go.

// waitSetup validates a wait and returns its event buffer.
func waitSetup(o *rtObject, events *C.io_event_t, max C.int, timeout C.int) ([]libasync.Event, time.Duration, C.int) {
	d, ok := duration(timeout)
	if !ok || events == nil || max < 1 {
		return nil, 0, C.int(libasync.EInval)
	}
	if !atomic.CompareAndSwapInt32(o.waiting, 0, 1) {
		return nil, 0, C.int(libasync.EBusy)
	}
	if cap(o.evs) < int(max) {
		n := int(max)
		if n > 1<<16 {
			n = 1 << 16 // more per call buys nothing
		}
		if cap(o.evs) < n {
			o.evs = make([]libasync.Event, n)
		}
	}
	return o.evs[:min(int(max), cap(o.evs))], d, 0
}

func writeEvents(events *C.io_event_t, evs []libasync.Event) {
	dst := unsafe.Slice(events, len(evs))
	for i := range evs {
		e := &evs[i]
		c := &dst[i]
		c.fd = C.async_fd_t(e.Fd)
		c.event_type = C.uint32_t(e.Type)
		c.completion_key = C.uintptr_t(e.Key)
		c.data = C.uintptr_t(e.Data)
		*(*uintptr)(unsafe.Pointer(&c.context)) = e.Context
	}
}

// waitRun continues o's wait call until it is done or needs C to sleep.
// When polled is true, (nfd, res, perr) is a poller result to finish first.
func (o *rtObject) waitRun(events *C.io_event_t, out *C.int, sl *C.la_sleep_t, polled bool, nfd int, res port.WaitResult, perr error) C.int {
	w := o.wcall
	for {
		if polled {
			n, done, err := w.Finish(nfd, res, perr, true)
			if done {
				return o.waitDone(events, out, sl, n, err)
			}
		}
		ms, poll := w.Prepare()
		if !poll {
			n, done, err := w.Finish(0, port.WaitResult{}, nil, false)
			if done {
				return o.waitDone(events, out, sl, n, err)
			}
			polled = false
			continue
		}
		if ms == 0 {
			// A poll that does not block is as cheap from Go.
			nfd, res, perr = o.rt.Poller().Wait(w.Buf(), 0)
			polled = true
			continue
		}
		sl.done, sl.ms, sl.fd = 0, C.int(ms), C.int(o.raw.RawFD())
		sl.raw, sl.rawcap, sl.token = o.rawbuf, C.int(len(w.Buf())+1), C.uintptr_t(o.token)
		return 0
	}
}

// waitDone ends the wait call and hands its result to C.
func (o *rtObject) waitDone(events *C.io_event_t, out *C.int, sl *C.la_sleep_t, n int, err error) C.int {
	o.waitEnd()
	sl.done = 1
	if err != nil {
		return code(err)
	}
	writeEvents(events, o.evs[:n])
	*out = C.int(n)
	return 0
}

func (o *rtObject) waitEnd() {
	// End first, so that a fast-path wait (rtwait.c), which may start as
	// soon as the flag is clear, sees the state End publishes. Deinit waits
	// for the flag before it recycles the C memory the flag lives in.
	if o.wcall != nil {
		o.wcall.End()
		o.wcall = nil
	}
	atomic.StoreInt32(o.waiting, 0)
}

//export la_go_rt_wait_begin
func la_go_rt_wait_begin(h C.uint64_t, events *C.io_event_t, max C.int, timeout C.int, out *C.int, sl *C.la_sleep_t) (rc C.int) {
	defer guard(&rc)
	sl.done = 1
	o := getRuntime(h)
	if o == nil {
		return C.int(libasync.EBadHandle)
	}
	evs, d, rc := waitSetup(o, events, max, timeout)
	if rc != 0 {
		return rc
	}
	if o.raw == nil {
		defer atomic.StoreInt32(o.waiting, 0)
		n, err := o.rt.Wait(evs, d)
		if err != nil {
			return code(err)
		}
		writeEvents(events, evs[:n])
		*out = C.int(n)
		return 0
	}
	w, err := o.rt.BeginWait(evs, d)
	if err != nil {
		atomic.StoreInt32(o.waiting, 0)
		return code(err)
	}
	o.wcall = w
	ok := false
	defer func() {
		if !ok {
			o.waitEnd() // a panic must not leave the runtime busy forever
		}
	}()
	if !o.ensureRawBuf(len(w.Buf()) + 1) {
		o.waitEnd()
		ok = true
		return C.int(libasync.ENoMem)
	}
	rc = o.waitRun(events, out, sl, false, 0, port.WaitResult{}, nil)
	ok = true
	return rc
}

//export la_go_rt_wait_finish
func la_go_rt_wait_finish(tok C.uintptr_t, events *C.io_event_t, out *C.int, nraw C.int, errnum C.int, sl *C.la_sleep_t) (rc C.int) {
	defer guard(&rc)
	sl.done = 1
	o, _ := cgo.Handle(tok).Value().(*rtObject)
	if o == nil || o.wcall == nil {
		return C.int(libasync.EInternal)
	}
	ok := false
	defer func() {
		if !ok {
			o.waitEnd()
		}
	}()
	var res port.WaitResult
	var perr error
	nfd := 0
	switch {
	case errnum == C.int(syscall.EINTR):
		res.Interrupted = true
	case errnum != 0:
		perr = syscall.Errno(errnum)
	default:
		nfd, res = o.raw.ConsumeRaw(o.rawbuf, int(nraw), o.wcall.Buf())
	}
	rc = o.waitRun(events, out, sl, true, nfd, res, perr)
	ok = true
	return rc
}

// ensureRawBuf sizes the C buffer C's epoll_wait writes into.
func (o *rtObject) ensureRawBuf(n int) bool {
	if n <= o.rawcap {
		return true
	}
	b := C.realloc(o.rawbuf, C.size_t(n*o.raw.RawEventSize()))
	if b == nil {
		return false
	}
	o.rawbuf, o.rawcap = b, n
	return true
}

//export la_go_rt_add_timer
func la_go_rt_add_timer(h C.uint64_t, delay, repeat C.uint64_t, key C.uintptr_t, out *C.uint64_t) (rc C.int) {
	defer guard(&rc)
	o := getRuntime(h)
	if o == nil {
		return C.int(libasync.EBadHandle)
	}
	id, err := o.rt.AddTimer(uint64(delay), uint64(repeat), uintptr(key))
	if err != nil {
		return code(err)
	}
	*out = C.uint64_t(id)
	return 0
}

//export la_go_rt_cancel_timer
func la_go_rt_cancel_timer(h C.uint64_t, id C.uint64_t) (rc C.int) {
	defer guard(&rc)
	o := getRuntime(h)
	if o == nil {
		return C.int(libasync.EBadHandle)
	}
	return code(o.rt.CancelTimer(uint64(id)))
}
