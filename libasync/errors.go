// Package libasync is the platform-free core of libasync: a bounded message
// queue with full policies and a one-waiter event loop (fd readiness,
// completions posted from any goroutine or thread, timers on a hierarchical
// wheel). Go programs can use it directly. The C library (package cabi) is
// not a thin wrapper: it has its own queue, workers, completion path and
// fiber scheduler in C, and uses this package for the runtime's control
// plane (fd registrations, timers, the wait's policy); see
// docs/ARCHITECTURE.md. The error codes below are checked against async.h
// when cabi compiles (cabi/internal/base/errors.go).
package libasync

import "errors"

// Code is an error code; the values are those of async_err_t in async.h.
type Code int

// The error codes of include/async.h.
const (
	OK         Code = 0
	EInval     Code = 1
	EBadHandle Code = 2
	ENoMem     Code = 3
	ETooBig    Code = 4
	EBufSize   Code = 5
	EEmpty     Code = 6
	EFull      Code = 7
	ETimedOut  Code = 8
	EClosed    Code = 9
	EBusy      Code = 10
	EExists    Code = 11
	ENotFound  Code = 12
	EBadFd     Code = 13
	ESys       Code = 14
	EInternal  Code = 15
	ECancelled Code = 16
	ENotSup    Code = 17
	EForked    Code = 18
	EState     Code = 19
)

// Error is an error carrying a Code.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Errors returned by the core; compare with errors.Is or read the Code with
// CodeOf.
var (
	ErrInval    = &Error{EInval, "invalid argument"}
	ErrTooBig   = &Error{ETooBig, "message larger than the queue's max message size"}
	ErrBufSize  = &Error{EBufSize, "buffer too small for the message"}
	ErrEmpty    = &Error{EEmpty, "queue is empty"}
	ErrFull     = &Error{EFull, "queue is full"}
	ErrTimedOut = &Error{ETimedOut, "timed out"}
	ErrClosed   = &Error{EClosed, "closed"}
	ErrBusy     = &Error{EBusy, "another thread is already waiting on this runtime"}
	ErrExists   = &Error{EExists, "fd already registered"}
	ErrNotFound = &Error{ENotFound, "not registered"}
	ErrBadFd    = &Error{EBadFd, "bad file descriptor"}
	ErrNotSup   = &Error{ENotSup, "not supported"}
	ErrNoMem    = &Error{ENoMem, "out of memory"}
)

// CodeOf returns the Code of err: OK for nil, ESys for errors that carry no
// code (operating-system failures).
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	if e, ok := err.(*Error); ok { // no allocation: see Runtime.SetMem
		return e.Code
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ESys
}
