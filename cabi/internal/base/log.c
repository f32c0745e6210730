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
    struct la_logrec *prev; /* older records of the same bucket, kept reachable */
} la_logrec_t;

static la_logrec_t log_default = {ASYNC_LOG_WARN, NULL, NULL, NULL};
static la_logrec_t *_Atomic log_cur = &log_default;

/* Every record ever made, in a hash of push-only lists (lock-free: a forked
 * child may call async_set_log_handler while a thread of the parent was in
 * the middle of it). A record set again is reused: a host that switches
 * between a few handlers keeps a few records, not one per call. Finding one
 * looks at its bucket only: O(1) on average up to about LA_LOG_BUCKETS
 * distinct records ever set (then the buckets grow longer: O(n /
 * LA_LOG_BUCKETS)). A record is pushed with a compare-and-swap on its
 * bucket's head, after a look at the bucket from that head: two threads
 * setting the same new (level, fn, ctx) at once make one record (the loser
 * of the swap finds the winner's, frees its own and uses that). The buckets
 * are static (untouched ones cost no memory). */
#define LA_LOG_BUCKETS 16384
static la_logrec_t *_Atomic log_all[LA_LOG_BUCKETS];

static size_t log_bucket(int level, async_log_fn fn, void *ctx) {
    uint64_t h = (uint64_t)(uintptr_t)fn * 0x9e3779b97f4a7c15ull;
    h ^= ((uint64_t)(uintptr_t)ctx + (uint64_t)level) * 0xc2b2ae3d27d4eb4full;
    h ^= h >> 29;
    return (size_t)(h % LA_LOG_BUCKETS);
}

/* The record of (level, fn, ctx) in the list from p down to stop, or NULL. */
static la_logrec_t *log_find(la_logrec_t *p, la_logrec_t *stop, int level, async_log_fn fn, void *ctx) {
    for (; p && p != stop; p = p->prev)
        if (p->level == level && p->fn == fn && p->ctx == ctx) return p;
    return NULL;
}

int async_set_log_handler(int level, async_log_fn fn, void *ctx) {
    if (level < ASYNC_LOG_OFF || level > ASYNC_LOG_DEBUG) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    la_logrec_t *r = NULL;
    if (!fn && level == log_default.level) r = &log_default;
    la_logrec_t *_Atomic *b = &log_all[log_bucket(level, fn, ctx)];
    la_logrec_t *head = atomic_load_explicit(b, memory_order_acquire);
    if (!r) r = log_find(head, NULL, level, fn, ctx);
    if (!r) {
        la_logrec_t *n = malloc(sizeof *n);
        if (!n) {
            la_set_error(ASYNC_E_NOMEM);
            return -1;
        }
        n->level = level;
        n->fn = fn;
        n->ctx = ctx;
        for (;;) {
            n->prev = head;
            la_logrec_t *seen = head;
            if (atomic_compare_exchange_weak_explicit(b, &head, n, memory_order_release, memory_order_acquire)) {
                r = n;
                break;
            }
            /* Pushed meanwhile: records from the new head down to the one
             * already looked at; one of them may be ours. */
            if ((r = log_find(head, seen, level, fn, ctx)) != NULL) {
                free(n);
                break;
            }
        }
    }
    atomic_store_explicit(&log_cur, r, memory_order_release);
    return 0;
}

int la_log_enabled(int level) {
    la_logrec_t *r = atomic_load_explicit(&log_cur, memory_order_acquire);
    return level <= r->level;
}

/* A message is one line (async_log_fn's promise): a control character in
 * it (a newline in an environment variable's value, say) would let the
 * message forge further "libasync:" lines. So every message passes here:
 * one trailing newline is dropped and every other control character is
 * written as an escape (\n, \r, \t, \xHH). Copies msg into buf (cap
 * bytes, truncated, NUL-terminated) and returns its length. Async-signal-safe. */
static size_t log_line(const char *msg, char *buf, size_t cap) {
    static const char hex[] = "0123456789abcdef";
    size_t n = 0, len = strlen(msg);
    if (len > 0 && msg[len - 1] == '\n') len--;
    for (size_t i = 0; i < len && n + 4 < cap; i++) {
        unsigned char c = (unsigned char)msg[i];
        if (c >= 0x20 && c != 0x7f) {
            buf[n++] = (char)c;
            continue;
        }
        buf[n++] = '\\';
        switch (c) {
        case '\n': buf[n++] = 'n'; break;
        case '\r': buf[n++] = 'r'; break;
        case '\t': buf[n++] = 't'; break;
        default:
            buf[n++] = 'x';
            buf[n++] = hex[c >> 4];
            buf[n++] = hex[c & 15];
        }
    }
    buf[n] = 0;
    return n;
}

/* 1 if msg needs log_line: it holds a control character (a trailing
 * newline included: the handler gets the line without it). */
static int log_dirty(const char *msg) {
    for (const char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) return 1;
    return 0;
}

/* The handler's call with msg made one line (its own frame: the usual,
 * clean message costs the report on a small signal stack nothing). */
static __attribute__((noinline)) void log_call_clean(la_logrec_t *r, int level, const char *msg) {
    char buf[1024];
    log_line(msg, buf, sizeof buf);
    r->fn(level, buf, r->ctx);
}

/* Async-signal-safe when no handler is set or the handler is. */
void la_log_str(int level, const char *msg) {
    la_logrec_t *r = atomic_load_explicit(&log_cur, memory_order_acquire);
    if (level > r->level || level < ASYNC_LOG_FATAL) return;
    if (r->fn) {
        int saved = errno;
        if (log_dirty(msg))
            log_call_clean(r, level, msg);
        else
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
    n += log_line(msg, buf + n, sizeof buf - 1 - n);
    buf[n++] = '\n';
    int saved = errno;
#if !defined(_WIN32)
    ssize_t w = la_write_nc(2, buf, n); /* not a cancellation point (base.h) */
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
