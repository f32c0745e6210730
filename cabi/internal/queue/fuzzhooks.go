package queue

// Thin wrappers over queue.c's entry points for the differential fuzzer
// (FuzzQueueDiff in fuzz_test.go): cgo is not allowed in _test.go files.
// They are unexported and nothing in the library calls them, so the Go
// linker drops them from libasync.so; what stays is cgo's few-instruction C
// call stubs, which are local symbols (cabi/exports.map exports exactly
// async.h). No build tag, so that plain `go test ./cabi/...` replays the
// seed corpus in testdata/fuzz.

/*
#include "queue.h"
*/
import "C"

import "unsafe"

// qStats is async_queue_stats_t.
type qStats struct {
	Capacity, CurrentSize, MaxMsgSize   uint64
	EnqueueCount, DequeueCount, Dropped uint64
}

func cqCreate(capacity, maxMsg uint64, flags uint) (uint64, int) {
	var h C.uint64_t
	rc := C.la_q_create(C.size_t(capacity), C.size_t(maxMsg), C.unsigned(flags), &h)
	return uint64(h), int(rc)
}

func cqDestroy(h uint64) int { return int(C.la_q_destroy(C.uint64_t(h))) }

// cqEnqueue never waits (timeout 0); wait != 0 enqueues as a waiting call
// would (LA_Q_FULL_WAIT), else as one that fails when full.
func cqEnqueue(h uint64, data []byte, wait int) int {
	var p unsafe.Pointer
	if len(data) > 0 {
		p = unsafe.Pointer(&data[0])
	}
	full := C.la_q_full_t(C.LA_Q_FULL_FAIL)
	if wait != 0 {
		full = C.LA_Q_FULL_WAIT
	}
	return int(C.la_q_enqueue(C.uint64_t(h), p, C.size_t(len(data)), full, 0))
}

// cqDequeue never waits; buf may be nil (size 0). Returns the size C
// reported (the message's length on success and on BUFSIZE).
func cqDequeue(h uint64, buf []byte) (int, int) {
	var p unsafe.Pointer
	if len(buf) > 0 {
		p = unsafe.Pointer(&buf[0])
	}
	var n C.size_t = ^C.size_t(0)
	rc := C.la_q_dequeue(C.uint64_t(h), p, C.size_t(len(buf)), &n, 0)
	return int(n), int(rc)
}

// cqIsEmpty and cqIsFull: la_q_query's answer and its result code.
func cqIsEmpty(h uint64) (bool, int) { return cqQuery(h, C.LA_Q_IS_EMPTY) }
func cqIsFull(h uint64) (bool, int)  { return cqQuery(h, C.LA_Q_IS_FULL) }

func cqQuery(h uint64, what C.la_q_query_t) (bool, int) {
	var out C.int = -1
	rc := C.la_q_query(C.uint64_t(h), what, &out)
	return out != 0, int(rc)
}

func cqClear(h uint64) int { return int(C.la_q_clear(C.uint64_t(h))) }

func cqStats(h uint64) (qStats, int) {
	var st C.async_queue_stats_t
	rc := C.la_q_stats(C.uint64_t(h), &st)
	return qStats{uint64(st.capacity), uint64(st.current_size), uint64(st.max_msg_size),
		uint64(st.enqueue_count), uint64(st.dequeue_count), uint64(st.dropped_count)}, int(rc)
}
