// Package queue is the C API's async_queue (queue.c, api.c): a bounded ring
// of byte messages in C. Waits park a calling fiber (package fiber); a
// SIGNAL_ON_DATA queue posts its completion through package rt.
package queue

/*
#cgo CFLAGS: -I${SRCDIR}/../base -I${SRCDIR}/../fiber -I${SRCDIR}/../rt -I${SRCDIR}/../../../include -O2 -Wall
*/
import "C"

import (
	_ "github.com/libasync/libasync/cabi/internal/base"  // handles, errors
	_ "github.com/libasync/libasync/cabi/internal/fiber" // parking
	_ "github.com/libasync/libasync/cabi/internal/rt"    // la_rt_post
)
