// Package rt is the C half of async_runtime and its Go glue. The public
// functions (api.c) post completions (completions.c) and run the wait in C
// (wait.c); everything else calls the la_go_* exports below, which drive the
// Go core (libasync.Runtime, through internal/boundary for what is not its
// Go API).
//
// Rules of this boundary:
//   - every export validates its handle through the handle table and never
//     trusts a pointer it was given beyond the sizes it was told;
//   - every export returns an async_err_t code (0 = success) and recovers any
//     panic into ASYNC_E_INTERNAL: a Go panic never reaches C;
//   - C never keeps a Go pointer: handles are integers (see base.h);
//   - nothing here blocks except the documented waits.
package rt

/*
#cgo CFLAGS: -I${SRCDIR}/../base -I${SRCDIR}/../fiber -I${SRCDIR}/../../../include -O2 -Wall
#include <stdlib.h>
#include "rt.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/cgo"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/libasync/libasync/cabi/internal/base"    // handles, errors, Go's poller
	_ "github.com/libasync/libasync/cabi/internal/fiber" // la_call_off_fiber
	"github.com/libasync/libasync/internal/boundary"
	"github.com/libasync/libasync/libasync"
	"github.com/libasync/libasync/port"
)

// guard turns a panic into ASYNC_E_INTERNAL. It must be deferred directly.
func guard(rc *C.int) {
	if r := recover(); r != nil {
		msg := fmt.Sprintf("internal error (the call fails with ASYNC_E_INTERNAL): %v", r)
		if os.Getenv("ASYNC_DEBUG") != "" {
			msg += "\n" + strings.TrimRight(string(debug.Stack()), "\n")
		}
		base.Log(base.LogError, msg)
		*rc = C.int(libasync.EInternal)
	}
}

// code is err's async_err_t. For ASYNC_E_SYS it also notes the OS error
// number behind err (0 if it carries none) for async_last_os_error: on the
// calling thread, or the fiber whose Go call this is (la_note_os_error).
func code(err error) C.int {
	c := libasync.CodeOf(err)
	if c == libasync.ESys {
		var en syscall.Errno
		errors.As(err, &en)
		C.la_note_os_error(C.int(en))
	}
	return C.int(c)
}

// backendOnce: an unknown ASYNC_BACKEND is reported once (through the log hook).
var backendOnce sync.Once

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
	idxMask   = C.LA_IDX_MASK // the slot index bits of a handle (base.h)
)

// slotIndex is la_handle_idx: the slot index of handle h.
func slotIndex(h uint64) uint32 { return uint32(h) & idxMask }

type object struct {
	h  uint64
	rt *rtObject
}

type rtObject struct {
	rt      *libasync.Runtime
	waiting *int32           // in C memory: the wait's busy flag (wait.c)
	evs     []libasync.Event // in C memory (growWaitBufs)
	src     *cSource
	rtc     *C.la_rtc_t
	token   cgo.Handle     // how C names this object to Go (la_go_rt_step)
	raw     port.RawPoller // nil: the wait sleeps in Go
	fds     []port.Event   // fd events of one step (raw pollers)
	poller  port.Poller
	step    func(out []libasync.Event, fds []port.Event, regSeq uint64) (int, error)
	setObs  func(boundary.RegObserver)
}

// regIDer is a poller whose records carry a registration id (epoll).
type regIDer interface{ RegID(fd int) (int32, bool) }

// fdMap keeps the runtime's C fd map (fdmap.c) in step with its
// registrations, so that the C wait translates the records of live
// registrations without entering Go (libasync calls it under its
// registration lock).
type fdMap struct {
	r   *C.la_rtc_t
	ids regIDer
}

func (m fdMap) Registered(fd int, ctx uintptr, seq uint64) {
	if id, ok := m.ids.RegID(fd); ok {
		C.la_fdmap_set(m.r, C.int(fd), C.int32_t(id), C.uintptr_t(ctx), C.uint64_t(seq))
	} else {
		C.la_fdmap_del(m.r, C.int(fd), C.uint64_t(seq))
	}
}

func (m fdMap) Unregistered(fd int, seq uint64) { C.la_fdmap_del(m.r, C.int(fd), C.uint64_t(seq)) }

// la_shared_t mirrors boundary.Shared: the sizes must agree (compile-time check).
var (
	_ [unsafe.Sizeof(C.la_shared_t{}) - unsafe.Sizeof(boundary.Shared{})]byte
	_ [unsafe.Sizeof(boundary.Shared{}) - unsafe.Sizeof(C.la_shared_t{})]byte
)

// cSource drains the runtime's C-side completion queues (completions.c),
// which async_runtime_post_completion feeds without entering Go.
type cSource struct {
	r   *C.la_rtc_t
	buf []C.la_pair_t // in C memory
}

// cMem is C's allocator for what grows with use (boundary.Mem): out of
// memory, malloc returns NULL and the call fails with ASYNC_E_NOMEM, where
// the Go heap would abort the process.
type cMem struct{}

func (cMem) Realloc(p unsafe.Pointer, size uintptr) unsafe.Pointer {
	return C.realloc(p, C.size_t(size))
}

func (cMem) Free(p unsafe.Pointer) { C.free(p) }

// waitReserve events per wait are allocated with the runtime, so that a wait
// can always deliver, even when memory has run out since.
const waitReserve = 64

func (s *cSource) Pending() bool { return C.la_rtc_pending(s.r) != 0 }

func (s *cSource) Take(out []libasync.Event) int {
	if len(out) > cap(s.buf) {
		out = out[:cap(s.buf)] // s.buf grows with o.evs (growWaitBufs)
	}
	if len(out) == 0 {
		return 0
	}
	n := int(C.la_rtc_take(s.r, &s.buf[0], C.int(len(out))))
	for i := 0; i < n; i++ {
		// A completion, or a signal's event (sigwatch.c: Key, count in Data).
		out[i].Key, out[i].Data, out[i].Type = uintptr(s.buf[i].key), uintptr(s.buf[i].data), uint32(s.buf[i]._type)
	}
	return n
}

var objects [maxChunks]atomic.Pointer[[chunkSize]atomic.Pointer[object]]

func objSlot(h uint64) *atomic.Pointer[object] {
	idx := slotIndex(h)
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
	idx := slotIndex(h)
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
	// Go's own poller first, while a failure can still be an error code
	// rather than Go's abort (base/gopoller.go).
	if err := base.StartGoPoller(); err != nil {
		var en syscall.Errno
		errors.As(err, &en)
		C.la_note_os_error(C.int(en))
		return C.int(libasync.ESys)
	}
	p, err := port.New()
	if err != nil {
		if errors.Is(err, port.ErrBackend) {
			backendOnce.Do(func() {
				base.Log(base.LogWarn, fmt.Sprintf("the environment variable ASYNC_BACKEND=%q names no poller "+
					"backend of this build (available: %s); async_runtime_init fails with ASYNC_E_NOTSUP",
					os.Getenv("ASYNC_BACKEND"), strings.Join(port.Backends(), ", ")))
			})
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
	lrt, hooks := boundary.NewRuntime(p, src, (*boundary.Shared)(unsafe.Pointer(C.la_rtc_shared(r))))
	rt := lrt.(*libasync.Runtime)
	h := C.la_handle_alloc(C.LA_T_RUNTIME, unsafe.Pointer(r))
	if h == 0 {
		rt.Close()
		C.la_rtc_recycle(r)
		return C.int(libasync.ENoMem)
	}
	ro := &rtObject{rt: rt, rtc: r, src: src, poller: p, step: hooks.Step, setObs: hooks.SetRegObserver,
		waiting: (*int32)(unsafe.Pointer(C.la_rtc_wait_flag(r)))}
	if rp, ok := p.(port.RawPoller); ok {
		ro.raw = rp
	}
	if hooks.SetMem(cMem{}, waitReserve) != nil || !ro.growWaitBufs(waitReserve) {
		C.la_handle_free(h, C.LA_T_RUNTIME)
		C.la_rtc_close(r)
		rt.Close()
		C.la_rtc_recycle(r)
		ro.freeWaitBufs()
		return C.int(libasync.ENoMem)
	}
	ro.token = cgo.NewHandle(ro)
	r.token = C.uintptr_t(ro.token)
	if ro.raw != nil {
		atomic.StoreInt32((*int32)(unsafe.Pointer(&r.sh.rawfd)), int32(ro.raw.RawFD()))
		r.raw = 1
		if ids, ok := p.(regIDer); ok {
			ro.setObs(fdMap{r: r, ids: ids})
		}
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
	C.la_rtc_close(o.rt.rtc) // a wait that sleeps in C returns CLOSED once woken
	if o.rt.raw != nil {
		// It sleeps on the poller's descriptors: wake it and let it leave
		// before Close closes them (their numbers could be reused).
		_ = o.rt.poller.Ring()
		for atomic.LoadInt32(o.rt.waiting) != 0 {
			time.Sleep(20 * time.Microsecond)
		}
	}
	err := o.rt.rt.Close() // wakes a wait in Go and waits for it to leave
	for atomic.LoadInt32(o.rt.waiting) != 0 {
		runtime.Gosched() // C clears the flag just after
	}
	o.rt.setObs(nil) // returns once no add, modify or remove writes the fd map
	C.la_rtc_recycle(o.rt.rtc)
	o.rt.token.Delete()
	o.rt.freeWaitBufs()
	if err == libasync.ErrClosed {
		err = nil
	}
	return code(err)
}

// la_go_rt_fd: op is an la_rt_fd_op_t (rt.h): add, modify, remove, or modify
// with a new context.
//
//export la_go_rt_fd
func la_go_rt_fd(h C.uint64_t, op C.int, fd C.int, events C.uint32_t, ctx C.uintptr_t) (rc C.int) {
	defer guard(&rc)
	o := getRuntime(h)
	if o == nil {
		return C.int(libasync.EBadHandle)
	}
	switch op {
	case C.LA_RT_FD_ADD:
		return code(o.rt.Add(int(fd), uint32(events), uintptr(ctx)))
	case C.LA_RT_FD_MODIFY:
		return code(o.rt.Modify(int(fd), uint32(events)))
	case C.LA_RT_FD_MODIFY_CTX:
		return code(o.rt.ModifyContext(int(fd), uint32(events), uintptr(ctx)))
	default:
		return code(o.rt.Remove(int(fd)))
	}
}

// The wait is driven from C (wait.c), which calls Go only for what Go owns:
// la_go_rt_step when fd events or timers may be ready (pollers C can drive,
// port.RawPoller), la_go_rt_wait_go for the whole wait otherwise. C has
// already validated the arguments and raised the busy flag.

// waitBuf returns the wait's event buffer for max events: grown up to 2^16
// (more per call buys nothing) if memory allows, else what there is (at
// least waitReserve).
func (o *rtObject) waitBuf(max C.int) []libasync.Event {
	if cap(o.evs) < int(max) {
		o.growWaitBufs(min(int(max), 1<<16))
	}
	return o.evs[:min(int(max), cap(o.evs))]
}

// growWaitBufs makes the wait's buffers, all in C memory, hold n events:
// o.evs and the C source's (the Go-driven wait), and once, for pollers C
// drives, o.fds: the fd events of one step (C hands over at most
// LA_RAW_MAX records). All or nothing: false leaves them as they were.
func (o *rtObject) growWaitBufs(n int) bool {
	if cap(o.evs) >= n {
		return true
	}
	// calloc, not C.malloc: cgo's C.malloc aborts the process on NULL.
	evs := C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(libasync.Event{})))
	pairs := C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.la_pair_t{})))
	var fds unsafe.Pointer
	if o.raw != nil && o.fds == nil {
		fds = C.calloc(C.LA_RAW_MAX, C.size_t(unsafe.Sizeof(port.Event{})))
	}
	if evs == nil || pairs == nil || (o.raw != nil && o.fds == nil && fds == nil) {
		C.free(evs)
		C.free(pairs)
		C.free(fds)
		return false
	}
	C.free(unsafe.Pointer(unsafe.SliceData(o.evs)))
	C.free(unsafe.Pointer(unsafe.SliceData(o.src.buf)))
	o.evs = unsafe.Slice((*libasync.Event)(evs), n)
	o.src.buf = unsafe.Slice((*C.la_pair_t)(pairs), n)
	if fds != nil {
		o.fds = unsafe.Slice((*port.Event)(fds), C.LA_RAW_MAX)
	}
	return true
}

func (o *rtObject) freeWaitBufs() {
	C.free(unsafe.Pointer(unsafe.SliceData(o.evs)))
	C.free(unsafe.Pointer(unsafe.SliceData(o.src.buf)))
	C.free(unsafe.Pointer(unsafe.SliceData(o.fds)))
	o.evs, o.src.buf, o.fds = nil, nil, nil
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

func tokenObject(tok C.uintptr_t) *rtObject {
	o, _ := cgo.Handle(tok).Value().(*rtObject)
	return o
}

// la_go_rt_step translates nraw epoll records (the doorbell's taken out),
// harvested by a poll that began at registration sequence regseq, and
// collects fd events, expired timers and Go-side completions into events.
// It never blocks.
//
//export la_go_rt_step
func la_go_rt_step(tok C.uintptr_t, events *C.io_event_t, max C.int, raw unsafe.Pointer, nraw C.int, regseq C.uint64_t, out *C.int) (rc C.int) {
	defer guard(&rc)
	o := tokenObject(tok)
	if o == nil || o.raw == nil {
		return C.int(libasync.EInternal)
	}
	nfd := 0
	if nraw > 0 {
		nfd, _ = o.raw.ConsumeRaw(raw, int(nraw), o.fds)
		// A rebuilt epoll set has a new descriptor (port: ghosts).
		atomic.StoreInt32((*int32)(unsafe.Pointer(&o.rtc.sh.rawfd)), int32(o.raw.RawFD()))
	}
	evs := o.waitBuf(max)
	n, err := o.step(evs, o.fds[:nfd], uint64(regseq))
	if err != nil {
		return code(err)
	}
	writeEvents(events, evs[:n])
	*out = C.int(n)
	return 0
}

// la_go_rt_wait_go is the whole wait, in Go, for pollers C cannot drive.
//
//export la_go_rt_wait_go
func la_go_rt_wait_go(tok C.uintptr_t, events *C.io_event_t, max C.int, timeout C.int, out *C.int) (rc C.int) {
	defer guard(&rc)
	o := tokenObject(tok)
	if o == nil {
		return C.int(libasync.EInternal)
	}
	d, _ := duration(timeout)
	evs := o.waitBuf(max)
	n, err := o.rt.Wait(evs, d)
	if err != nil {
		return code(err)
	}
	writeEvents(events, evs[:n])
	*out = C.int(n)
	return 0
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
