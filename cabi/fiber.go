package main

// Queue waits for fibers: a fiber must not block inside Go, so the queue
// shims (shim.c) call these exports on the worker's stack; when the queue
// operation would block they register a FiberWait whose notification readies
// the fiber (la_fiber_queue_notify), and the fiber parks in C, then retries.

/*
#include <stdint.h>
#include "la.h"
void la_fiber_queue_notify(uintptr_t token);
*/
import "C"

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/libasync/libasync/libasync"
)

// laRegistered (returned as rc) means: parked registration *out was made.
const laRegistered = -2

var (
	fiberWaits   sync.Map // uint64 -> *libasync.FiberWait
	fiberWaitSeq atomic.Uint64
)

func keepWait(fw *libasync.FiberWait, out *C.uint64_t) C.int {
	id := fiberWaitSeq.Add(1)
	fiberWaits.Store(id, fw)
	*out = C.uint64_t(id)
	return laRegistered
}

func notifier(token C.uintptr_t) func() {
	return func() { C.la_fiber_queue_notify(token) }
}

//export la_go_queue_enqueue_fiber
func la_go_queue_enqueue_fiber(h C.uint64_t, data unsafe.Pointer, size C.size_t, mode C.int, token C.uintptr_t, out *C.uint64_t) (rc C.int) {
	defer guard(&rc)
	q := getQueue(h)
	if q == nil {
		return C.int(libasync.EBadHandle)
	}
	if data == nil || size == 0 {
		return C.int(libasync.EInval)
	}
	if uint64(size) > 1<<40 {
		return C.int(libasync.ETooBig)
	}
	msg := unsafe.Slice((*byte)(data), int(size))
	wait := mode == 1 || q.Flags()&libasync.BlockWriter != 0
	fw, err := q.EnqueueOrRegister(msg, wait, notifier(token))
	if fw != nil {
		return keepWait(fw, out)
	}
	return code(err)
}

//export la_go_queue_dequeue_fiber
func la_go_queue_dequeue_fiber(h C.uint64_t, buf unsafe.Pointer, size C.size_t, outSize *C.size_t, token C.uintptr_t, out *C.uint64_t) (rc C.int) {
	defer guard(&rc)
	q := getQueue(h)
	if q == nil {
		return C.int(libasync.EBadHandle)
	}
	if buf == nil && size > 0 {
		return C.int(libasync.EInval)
	}
	var b []byte
	if buf != nil {
		if uint64(size) > 1<<40 {
			size = 1 << 40
		}
		b = unsafe.Slice((*byte)(buf), int(size))
	}
	n, fw, err := q.DequeueOrRegister(b, notifier(token))
	if fw != nil {
		return keepWait(fw, out)
	}
	if outSize != nil && (err == nil || err == libasync.ErrBufSize) {
		*outSize = C.size_t(n)
	}
	return code(err)
}

// la_go_queue_fiber_end ends registration id: cancel 0 = notified (Done),
// 1 = gave up (Cancel).
//
//export la_go_queue_fiber_end
func la_go_queue_fiber_end(id C.uint64_t, cancel C.int) (rc C.int) {
	defer guard(&rc)
	v, ok := fiberWaits.LoadAndDelete(uint64(id))
	if !ok {
		return C.int(libasync.EInternal)
	}
	fw := v.(*libasync.FiberWait)
	if cancel != 0 {
		fw.Cancel()
	} else {
		fw.Done()
	}
	return 0
}
