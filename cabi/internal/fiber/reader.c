/* The buffered reader (async_reader_*): frames cut at a delimiter byte out
 * of one descriptor, read with async_fiber_read (so it parks on a fiber,
 * blocks a plain thread, and takes whichever I/O path the fd's scheduler
 * uses, on every platform).
 *
 * One allocation per reader: the header and its buffer buf[cap], cap =
 * max(max_len, 4096). The unread bytes are buf[start, end). A frame never
 * needs more than max_len bytes from start, so when cap - start < max_len
 * (and no frame is complete) the unread bytes move to the front: the only
 * copy, of fewer than max_len bytes, made only when the buffer's tail
 * cannot hold the frame. The first `scanned` unread bytes are known to hold
 * no `scan_delim` byte: a frame arriving in many pieces is searched once.
 * Frames are returned in place: *out points into buf. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "async.h"
#include "base.h"

#define READER_MAX_LEN ((size_t)64 << 20)
#define READER_MIN_CAP ((size_t)4096)

struct async_reader {
    async_fd_t fd;
    size_t max_len;
    size_t cap;
    size_t start, end; /* unread bytes: buf[start, end) */
    size_t scanned;    /* buf[start, start + scanned) holds no scan_delim byte */
    int scan_delim;
    char buf[];
};

#if defined(_WIN32)
#define READER_BAD_FD(fd) ((fd) == (async_fd_t)~(uintptr_t)0) /* INVALID_SOCKET */
#else
#define READER_BAD_FD(fd) ((fd) < 0)
#endif

async_reader_t *async_reader_create(async_fd_t fd, size_t max_len) {
    LA_ENTRY(NULL);
    if (max_len == 0 || max_len > READER_MAX_LEN) {
        la_set_error(ASYNC_E_INVAL);
        return NULL;
    }
    if (READER_BAD_FD(fd)) {
        la_set_error(ASYNC_E_BADFD);
        return NULL;
    }
    size_t cap = max_len < READER_MIN_CAP ? READER_MIN_CAP : max_len;
    async_reader_t *r = malloc(sizeof *r + cap);
    if (!r) {
        la_set_error(ASYNC_E_NOMEM);
        return NULL;
    }
    r->fd = fd;
    r->max_len = max_len;
    r->cap = cap;
    r->start = r->end = 0;
    r->scanned = 0;
    r->scan_delim = -1;
    return r;
}

void async_reader_destroy(async_reader_t *r) {
    free(r);
}

size_t async_reader_buffered(const async_reader_t *r) {
    return r ? r->end - r->start : 0;
}

/* Hands out the next n unread bytes as a frame: *out points at them. */
static ssize_t take(async_reader_t *r, size_t n, const char **out) {
    *out = r->buf + r->start;
    r->start += n;
    r->scanned = 0;
    return (ssize_t)n;
}

/* The length of the complete frame at start (delimiter included), or 0 if
 * the first min(unread, max_len) bytes hold no delim. */
static size_t frame_len(async_reader_t *r, int delim) {
    size_t avail = r->end - r->start;
    size_t lim = avail < r->max_len ? avail : r->max_len;
    if (r->scan_delim != delim) {
        r->scan_delim = delim;
        r->scanned = 0;
    }
    if (r->scanned >= lim) return 0;
    const char *from = r->buf + r->start + r->scanned;
    const char *p = memchr(from, (unsigned char)delim, lim - r->scanned);
    if (p) return (size_t)(p - (r->buf + r->start)) + 1;
    r->scanned = lim;
    return 0;
}

/* Makes room after end for the rest of a frame of at most max_len bytes:
 * an empty buffer starts over at 0; else the unread bytes move to the front
 * when the tail from start is shorter than max_len. */
static void make_room(async_reader_t *r) {
    size_t avail = r->end - r->start;
    if (avail == 0) {
        r->start = r->end = 0;
    } else if (r->cap - r->start < r->max_len) {
        memmove(r->buf, r->buf + r->start, avail);
        r->start = 0;
        r->end = avail;
    }
}

/* The time left until deadline as a timeout_ms for the next read. */
static int ms_left(int timeout_ms, uint64_t deadline) {
    return timeout_ms <= 0 ? timeout_ms : la_ms_left(deadline);
}

ssize_t async_reader_read_until(async_reader_t *r, int delim, const char **out, int timeout_ms) {
    LA_ENTRY(-1);
    if (!r || !out || la_check_timeout(timeout_ms)) {
        if (!r || !out) la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    uint64_t deadline = la_deadline(timeout_ms);
    for (;;) {
        size_t n = frame_len(r, delim);
        if (n) return take(r, n, out);
        size_t avail = r->end - r->start;
        if (avail >= r->max_len) {
            take(r, r->max_len, out);
            la_set_error(ASYNC_E_TOOBIG);
            return -1;
        }
        make_room(r);
        /* cap - start >= max_len > avail: there is room after end */
        ssize_t got = async_fiber_read(r->fd, r->buf + r->end, r->cap - r->end, ms_left(timeout_ms, deadline));
        if (got < 0) return -1;
        if (got == 0) return r->end > r->start ? take(r, r->end - r->start, out) : 0;
        r->end += (size_t)got;
    }
}

ssize_t async_reader_read(async_reader_t *r, void *buf, size_t n, int timeout_ms) {
    LA_ENTRY(-1);
    if (!r) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    size_t avail = r->end - r->start;
    if (avail == 0 || n == 0) return async_fiber_read(r->fd, buf, n, timeout_ms);
    if (la_check_timeout(timeout_ms)) return -1;
    if (!buf || n > (size_t)SSIZE_MAX) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    if (n > avail) n = avail;
    memcpy(buf, r->buf + r->start, n);
    r->start += n;
    r->scanned = r->scanned > n ? r->scanned - n : 0;
    return (ssize_t)n;
}
