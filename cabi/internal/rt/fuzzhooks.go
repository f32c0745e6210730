package rt

// Thin wrappers over completions.c for the differential fuzzer
// (FuzzCompletionsDiff in fuzz_test.go): cgo is not allowed in _test.go
// files. They are unexported and nothing in the library calls them, so the
// Go linker drops them from libasync.so; what stays is cgo's few-instruction
// C call stubs, which are local symbols (cabi/exports.map exports exactly
// async.h). No build tag, so that plain `go test ./cabi/...` replays the
// seed corpus in testdata/fuzz.

/*
#include "rt.h"
*/
import "C"

import "unsafe"

// fuzzRTC is the C side of a runtime without its Go side: a la_rtc_t under
// a runtime handle, so that la_rt_post finds it. Its doorbell is no
// descriptor: nothing ever raises its sleep flag, so no post rings it.
type fuzzRTC struct {
	h uint64
	r *C.la_rtc_t
}

func fuzzRTCNew() *fuzzRTC {
	r := C.la_rtc_new(-1, C.LA_DOORBELL_EVENTFD)
	if r == nil {
		return nil
	}
	h := C.la_handle_alloc(C.LA_T_RUNTIME, unsafe.Pointer(r))
	if h == 0 {
		C.la_rtc_recycle(r)
		return nil
	}
	return &fuzzRTC{h: uint64(h), r: r}
}

// close is la_go_rt_deinit's C part: retire the handle, close, recycle.
func (f *fuzzRTC) close() {
	C.la_handle_free(C.uint64_t(f.h), C.LA_T_RUNTIME)
	C.la_rtc_close(f.r)
	C.la_rtc_recycle(f.r)
}

// fuzzPost is la_rt_post on the calling thread (async_runtime_post_completion).
func fuzzPost(h uint64, key, data uintptr) int {
	return int(C.la_rt_post(C.uint64_t(h), C.uintptr_t(key), C.uintptr_t(data)))
}

// take takes up to max (>= 0) entries, as pairs (la_rtc_take) or as
// completion events (la_rtc_take_events); it returns {key, data} either way,
// and ok false if an event was not a completion event.
func (f *fuzzRTC) take(max int, events bool) (keys, data []uintptr, ok bool) {
	ok = true
	n := 0
	if events {
		ev := make([]C.io_event_t, max+1)
		n = int(C.la_rtc_take_events(f.r, (*C.io_event_t)(unsafe.Pointer(&ev[0])), C.int(max)))
		for i := 0; i < n; i++ {
			e := &ev[i]
			if int64(e.fd) != -1 || // fd is a SOCKET (unsigned) on Windows
				e.event_type != C.ASYNC_EVENT_COMPLETION || e.context != nil {
				ok = false
			}
			keys = append(keys, uintptr(e.completion_key))
			data = append(data, uintptr(e.data))
		}
	} else {
		ps := make([]C.la_pair_t, max+1)
		n = int(C.la_rtc_take(f.r, (*C.la_pair_t)(unsafe.Pointer(&ps[0])), C.int(max)))
		for i := 0; i < n; i++ {
			keys = append(keys, uintptr(ps[i].key))
			data = append(data, uintptr(ps[i].data))
		}
	}
	return keys, data, ok
}

func (f *fuzzRTC) pending() bool { return C.la_rtc_pending(f.r) != 0 }
