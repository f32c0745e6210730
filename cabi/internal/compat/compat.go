// Package compat is the classic lib/async API of include/async/ (the API the
// Neolith MUD driver's lib/async declares), in C: thin translations onto the
// public functions of include/async.h, linked into libasync by a blank import
// from cabi. See docs/NEOLITH.md.
package compat

/*
#cgo CFLAGS: -I${SRCDIR}/../../../include -I${SRCDIR}/../.. -O2 -Wall
#cgo windows LDFLAGS: -lws2_32
*/
import "C"
