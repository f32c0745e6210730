package libasync

import _ "unsafe" // go:linkname

// nanotime is the Go runtime's monotonic clock (CLOCK_MONOTONIC on Linux,
// the clock C code outside Go reads with clock_gettime), so that Go and the
// C half of a runtime measure time from one origin with one clock.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64
