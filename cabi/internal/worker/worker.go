// Package worker is async_worker: threads that run C procedures (worker.c),
// pure C on POSIX threads (winpthreads on Windows).
package worker

/*
#cgo CFLAGS: -I${SRCDIR}/../base -I${SRCDIR}/../fiber -I${SRCDIR}/../../../include -O2 -Wall
*/
import "C"

import (
	_ "github.com/libasync/libasync/cabi/internal/base"  // handles, errors
	_ "github.com/libasync/libasync/cabi/internal/fiber" // la_current_fiber
)
