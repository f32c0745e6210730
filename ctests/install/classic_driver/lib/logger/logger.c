#include <stdarg.h>
#include <stdio.h>
#include "logger/logger.h"

void debug_message(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}
