/* The stack overflow report, shared by every platform's stacks file.
 *
 * Async-signal-safe and small: it runs in a fault handler on an alternate
 * signal stack (POSIX) or on the few pages Windows guarantees after an
 * overflow, so no stdio, no malloc, and the caller owns the buffer. */
#include "fiber_int.h"

static size_t put_str(char *buf, size_t n, size_t cap, const char *s) {
    while (*s && n < cap) buf[n++] = *s++;
    return n;
}

size_t la_stack_report_format(char *buf, size_t size, const char *what, uint64_t fiber_id, const char *how) {
    static const char tail[] = "; raise async_sched_config_t.stack_size or ASYNC_FIBER_STACK_KB)";
    char digits[24];
    size_t nd = 0, n = 0;
    /* room for the digits, " (", the tail and the NUL, whatever `what` and
     * `how` hold */
    size_t cap = size - (sizeof digits + 2 + sizeof tail);
    n = put_str(buf, n, cap, "fiber stack overflow");
    n = put_str(buf, n, cap < 128 ? cap : 128, what);
    do {
        digits[nd++] = (char)('0' + fiber_id % 10);
        fiber_id /= 10;
    } while (fiber_id);
    while (nd) buf[n++] = digits[--nd];
    buf[n++] = ' ';
    buf[n++] = '(';
    n = put_str(buf, n, cap, how);
    n = put_str(buf, n, size - 1, tail);
    buf[n] = 0;
    return n;
}

void la_stack_overflow_abort(uint64_t fiber_id, const char *how) {
    la_stack_report_abort(" in fiber ", fiber_id, how);
}
