// Package compat is the classic lib/async API of include/async/ (the API the
// Neolith MUD driver's lib/async declares), in C: thin translations onto the
// public functions of include/async.h, linked into libasync by a blank import
// from cabi. See docs/NEOLITH.md.
package compat

/*
#cgo CFLAGS: -I${SRCDIR}/../base -I${SRCDIR}/../fiber -I${SRCDIR}/../rt -I${SRCDIR}/../../../include -O2 -Wall
#cgo windows LDFLAGS: -lws2_32
*/
import "C"

import (
	_ "github.com/libasync/libasync/cabi/internal/base"  // handles, errors
	_ "github.com/libasync/libasync/cabi/internal/fiber" // la_call_off_fiber
	_ "github.com/libasync/libasync/cabi/internal/rt"    // la_go_rt_fd
)
