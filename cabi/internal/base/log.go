package base

/*
#include <stdlib.h>
#include "base.h"
*/
import "C"

import "unsafe"

// Log levels (async.h ASYNC_LOG_*).
const (
	LogFatal = 0
	LogError = 1
	LogWarn  = 2
	LogInfo  = 3
	LogDebug = 4
)

// Log sends msg (one line, no trailing newline) to the host's log handler
// (async_set_log_handler) when its level lets it through. Never on a fiber
// stack (it is Go).
func Log(level int, msg string) {
	if C.la_log_enabled(C.int(level)) == 0 {
		return
	}
	cs := C.CString(msg)
	C.la_log_str(C.int(level), cs)
	C.free(unsafe.Pointer(cs))
}
