/* The classic header's io_event_t has the layout classic.c writes
 * (cl_event_t): fd, [Windows: handle], completion_key, event_type, context,
 * bytes_transferred, buffer — 48 bytes on LP64 POSIX, 56 on Win64. This file
 * includes only the classic header. */
#include <stddef.h>

#include "async/async_runtime.h"

#if defined(_WIN32) && UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(io_event_t) == 56 && offsetof(io_event_t, handle) == 8 &&
                   offsetof(io_event_t, completion_key) == 16 && offsetof(io_event_t, event_type) == 24 &&
                   offsetof(io_event_t, context) == 32 && offsetof(io_event_t, bytes_transferred) == 40 &&
                   offsetof(io_event_t, buffer) == 48,
               "classic io_event_t layout (Win64)");
#elif UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(io_event_t) == 48 && offsetof(io_event_t, completion_key) == 8 &&
                   offsetof(io_event_t, event_type) == 16 && offsetof(io_event_t, context) == 24 &&
                   offsetof(io_event_t, bytes_transferred) == 32 && offsetof(io_event_t, buffer) == 40,
               "classic io_event_t layout (LP64)");
#endif
_Static_assert(EVENT_READ == 0x01 && EVENT_WRITE == 0x02 && EVENT_ERROR == 0x04 && EVENT_CLOSE == 0x08,
               "classic event bits");
_Static_assert(CONSOLE_TYPE_NONE == 0 && CONSOLE_TYPE_REAL == 1 && CONSOLE_TYPE_PIPE == 2 && CONSOLE_TYPE_FILE == 3,
               "classic console types");
