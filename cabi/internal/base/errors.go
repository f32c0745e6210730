package base

/*
#include "base.h"
*/
import "C"

import "github.com/libasync/libasync/libasync"

// The error codes live in one table: async_err_t in include/async.h, whose
// texts are errors.c's (async_strerror). libasync's Codes (the Go API, which
// the Go glue returns to C) must have the same values: the declarations
// below do not compile when a value differs, and errors_test.go checks that
// codes covers every code async.h declares and that each has a text.
var (
	_ [0]int = [int(C.ASYNC_OK) - int(libasync.OK)]int{}
	_ [0]int = [int(libasync.OK) - int(C.ASYNC_OK)]int{}
	_ [0]int = [int(C.ASYNC_E_INVAL) - int(libasync.EInval)]int{}
	_ [0]int = [int(libasync.EInval) - int(C.ASYNC_E_INVAL)]int{}
	_ [0]int = [int(C.ASYNC_E_BADHANDLE) - int(libasync.EBadHandle)]int{}
	_ [0]int = [int(libasync.EBadHandle) - int(C.ASYNC_E_BADHANDLE)]int{}
	_ [0]int = [int(C.ASYNC_E_NOMEM) - int(libasync.ENoMem)]int{}
	_ [0]int = [int(libasync.ENoMem) - int(C.ASYNC_E_NOMEM)]int{}
	_ [0]int = [int(C.ASYNC_E_TOOBIG) - int(libasync.ETooBig)]int{}
	_ [0]int = [int(libasync.ETooBig) - int(C.ASYNC_E_TOOBIG)]int{}
	_ [0]int = [int(C.ASYNC_E_BUFSIZE) - int(libasync.EBufSize)]int{}
	_ [0]int = [int(libasync.EBufSize) - int(C.ASYNC_E_BUFSIZE)]int{}
	_ [0]int = [int(C.ASYNC_E_EMPTY) - int(libasync.EEmpty)]int{}
	_ [0]int = [int(libasync.EEmpty) - int(C.ASYNC_E_EMPTY)]int{}
	_ [0]int = [int(C.ASYNC_E_FULL) - int(libasync.EFull)]int{}
	_ [0]int = [int(libasync.EFull) - int(C.ASYNC_E_FULL)]int{}
	_ [0]int = [int(C.ASYNC_E_TIMEDOUT) - int(libasync.ETimedOut)]int{}
	_ [0]int = [int(libasync.ETimedOut) - int(C.ASYNC_E_TIMEDOUT)]int{}
	_ [0]int = [int(C.ASYNC_E_CLOSED) - int(libasync.EClosed)]int{}
	_ [0]int = [int(libasync.EClosed) - int(C.ASYNC_E_CLOSED)]int{}
	_ [0]int = [int(C.ASYNC_E_BUSY) - int(libasync.EBusy)]int{}
	_ [0]int = [int(libasync.EBusy) - int(C.ASYNC_E_BUSY)]int{}
	_ [0]int = [int(C.ASYNC_E_EXISTS) - int(libasync.EExists)]int{}
	_ [0]int = [int(libasync.EExists) - int(C.ASYNC_E_EXISTS)]int{}
	_ [0]int = [int(C.ASYNC_E_NOTFOUND) - int(libasync.ENotFound)]int{}
	_ [0]int = [int(libasync.ENotFound) - int(C.ASYNC_E_NOTFOUND)]int{}
	_ [0]int = [int(C.ASYNC_E_BADFD) - int(libasync.EBadFd)]int{}
	_ [0]int = [int(libasync.EBadFd) - int(C.ASYNC_E_BADFD)]int{}
	_ [0]int = [int(C.ASYNC_E_SYS) - int(libasync.ESys)]int{}
	_ [0]int = [int(libasync.ESys) - int(C.ASYNC_E_SYS)]int{}
	_ [0]int = [int(C.ASYNC_E_INTERNAL) - int(libasync.EInternal)]int{}
	_ [0]int = [int(libasync.EInternal) - int(C.ASYNC_E_INTERNAL)]int{}
	_ [0]int = [int(C.ASYNC_E_CANCELLED) - int(libasync.ECancelled)]int{}
	_ [0]int = [int(libasync.ECancelled) - int(C.ASYNC_E_CANCELLED)]int{}
	_ [0]int = [int(C.ASYNC_E_NOTSUP) - int(libasync.ENotSup)]int{}
	_ [0]int = [int(libasync.ENotSup) - int(C.ASYNC_E_NOTSUP)]int{}
	_ [0]int = [int(C.ASYNC_E_FORKED) - int(libasync.EForked)]int{}
	_ [0]int = [int(libasync.EForked) - int(C.ASYNC_E_FORKED)]int{}
	_ [0]int = [int(C.ASYNC_E_STATE) - int(libasync.EState)]int{}
	_ [0]int = [int(libasync.EState) - int(C.ASYNC_E_STATE)]int{}
)

// codes lists every code: its name in async.h, its C value, its Go Code.
var codes = [...]struct {
	name string
	c    C.int
	g    libasync.Code
}{
	{"ASYNC_OK", C.ASYNC_OK, libasync.OK},
	{"ASYNC_E_INVAL", C.ASYNC_E_INVAL, libasync.EInval},
	{"ASYNC_E_BADHANDLE", C.ASYNC_E_BADHANDLE, libasync.EBadHandle},
	{"ASYNC_E_NOMEM", C.ASYNC_E_NOMEM, libasync.ENoMem},
	{"ASYNC_E_TOOBIG", C.ASYNC_E_TOOBIG, libasync.ETooBig},
	{"ASYNC_E_BUFSIZE", C.ASYNC_E_BUFSIZE, libasync.EBufSize},
	{"ASYNC_E_EMPTY", C.ASYNC_E_EMPTY, libasync.EEmpty},
	{"ASYNC_E_FULL", C.ASYNC_E_FULL, libasync.EFull},
	{"ASYNC_E_TIMEDOUT", C.ASYNC_E_TIMEDOUT, libasync.ETimedOut},
	{"ASYNC_E_CLOSED", C.ASYNC_E_CLOSED, libasync.EClosed},
	{"ASYNC_E_BUSY", C.ASYNC_E_BUSY, libasync.EBusy},
	{"ASYNC_E_EXISTS", C.ASYNC_E_EXISTS, libasync.EExists},
	{"ASYNC_E_NOTFOUND", C.ASYNC_E_NOTFOUND, libasync.ENotFound},
	{"ASYNC_E_BADFD", C.ASYNC_E_BADFD, libasync.EBadFd},
	{"ASYNC_E_SYS", C.ASYNC_E_SYS, libasync.ESys},
	{"ASYNC_E_INTERNAL", C.ASYNC_E_INTERNAL, libasync.EInternal},
	{"ASYNC_E_CANCELLED", C.ASYNC_E_CANCELLED, libasync.ECancelled},
	{"ASYNC_E_NOTSUP", C.ASYNC_E_NOTSUP, libasync.ENotSup},
	{"ASYNC_E_FORKED", C.ASYNC_E_FORKED, libasync.EForked},
	{"ASYNC_E_STATE", C.ASYNC_E_STATE, libasync.EState},
}

// strerror is async_strerror (for errors_test.go, where cgo is not allowed).
func strerror(code int) string { return C.GoString(C.async_strerror(C.int(code))) }
