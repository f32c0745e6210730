/* The log hook (async_set_log_handler): every message libasync writes for
 * the host goes through la_log / la_log_str. The handler is one immutable
 * record swapped atomically, so a message never sees half of a change and
 * delivering one takes no lock: la_log_str is async-signal-safe (the fiber
 * stack overflow report calls it from a SIGSEGV handler). Replaced records
 * are kept (never freed): a thread that loaded the old record just before a
 * change may still be inside the old handler. Setting takes no lock either
 * (async_set_log_handler works in a forked child). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if !defined(_WIN32)
#include <unistd.h>
#else
#include <io.h>
#endif

#include "base.h"

typedef struct la_logrec {
    int level;
    async_log_fn fn; /* NULL: the default (stderr) */
    void *ctx;
    struct la_logrec *prev; /* older records, kept reachable */
} la_logrec_t;

static la_logrec_t log_default = {ASYNC_LOG_WARN, NULL, NULL, NULL};
static la_logrec_t *_Atomic log_cur = &log_default;

/* Every record ever made, newest first (push-only, lock-free: a forked
 * child may call async_set_log_handler while a thread of the parent was in
 * the middle of it). A record set again is reused: a host that switches
 * between a few handlers keeps a few records, not one per call. */
static la_logrec_t *_Atomic log_all;

int async_set_log_handler(int level, async_log_fn fn, void *ctx) {
    if (level < ASYNC_LOG_OFF || level > ASYNC_LOG_DEBUG) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    la_logrec_t *r = NULL;
    if (!fn && level == log_default.level) r = &log_default;
    for (la_logrec_t *p = atomic_load_explicit(&log_all, memory_order_acquire); p && !r; p = p->prev)
        if (p->level == level && p->fn == fn && p->ctx == ctx) r = p;
    if (!r) {
        r = malloc(sizeof *r);
        if (!r) {
            la_set_error(ASYNC_E_NOMEM);
            return -1;
        }
        r->level = level;
        r->fn = fn;
        r->ctx = ctx;
        la_logrec_t *head = atomic_load_explicit(&log_all, memory_order_relaxed);
        do r->prev = head;
        while (!atomic_compare_exchange_weak_explicit(&log_all, &head, r, memory_order_release,
                                                      memory_order_relaxed));
    }
    atomic_store_explicit(&log_cur, r, memory_order_release);
    return 0;
}

int la_log_enabled(int level) {
    la_logrec_t *r = atomic_load_explicit(&log_cur, memory_order_acquire);
    return level <= r->level;
}

/* Async-signal-safe when no handler is set or the handler is. */
void la_log_str(int level, const char *msg) {
    la_logrec_t *r = atomic_load_explicit(&log_cur, memory_order_acquire);
    if (level > r->level || level < ASYNC_LOG_FATAL) return;
    if (r->fn) {
        int saved = errno;
        r->fn(level, msg, r->ctx);
        errno = saved;
        return;
    }
    /* The default: one write of "libasync: <msg>\n" to stderr (one write,
     * so lines of several threads do not interleave), as libasync wrote
     * before there was a hook. */
    char buf[1024];
    size_t n = 0;
    for (const char *p = "libasync: "; *p; p++) buf[n++] = *p;
    for (const char *p = msg; *p && n < sizeof buf - 2; p++) buf[n++] = *p;
    if (n == 0 || buf[n - 1] != '\n') buf[n++] = '\n';
    int saved = errno;
#if !defined(_WIN32)
    ssize_t w = write(2, buf, n);
#else
    int w = _write(2, buf, (unsigned)n);
#endif
    (void)w;
    errno = saved;
}

void la_log(int level, const char *fmt, ...) {
    if (!la_log_enabled(level)) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    la_log_str(level, msg);
}
