// Command cabi is libasync's C library, built with -buildmode=c-shared
// (libasync.so, libasync.dll) or c-archive (libasync.a). It only assembles
// the subsystems, each a cgo package of its own under internal/ whose C
// functions implement part of include/async.h; cgo links them into one
// library, where their C code calls each other's:
//
//	base    handles, last-error slot, error texts, fork flag (LA_ENTRY)
//	fiber   scheduler, context switch, stacks, fault signals, fds, channels
//	rt      async_runtime: C completion path and wait, Go glue to libasync
//	queue   async_queue in C
//	worker  async_worker in C
//	compat  the classic lib/async API (include/async/), onto the functions above
//
// On Windows exports_windows.c lists the DLL's exports.
package main

/*
#cgo CFLAGS: -I${SRCDIR}/../include
*/
import "C"

import (
	_ "github.com/libasync/libasync/cabi/internal/base"
	_ "github.com/libasync/libasync/cabi/internal/compat"
	_ "github.com/libasync/libasync/cabi/internal/fiber"
	_ "github.com/libasync/libasync/cabi/internal/queue"
	_ "github.com/libasync/libasync/cabi/internal/rt"
	_ "github.com/libasync/libasync/cabi/internal/worker"
)

func main() {}
