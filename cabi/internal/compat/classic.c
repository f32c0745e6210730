/* The classic lib/async runtime API (include/async/async_classic.h) on the
 * modern one (include/async.h). Every function here is a translation: the
 * registrations, the waiting and the completions are the modern runtime's.
 * What the classic API has and the modern one lacks lives here, per runtime,
 * in a small table keyed by the runtime's handle (cl_rt_t, under cl_mu):
 *  - the console: its detected type and context, and whether stdin is
 *    registered by async_runtime_add_console;
 *  - regular files: epoll refuses them (EPERM) and poll(2) reports them
 *    always ready. A classic registration of a regular file is kept here and
 *    reported by the classic wait without the poller: readable while unread
 *    data remains and once more at the end of the file (so that the reader
 *    sees the end), then quiet until the file grows; writable always.
 * The classic io_event_t (48 bytes on LP64) is cl_event_t below; the header
 * declares it (layout.c checks both against the same offsets).
 *
 * This file includes async.h (the modern declarations) and never the classic
 * header: the two declare different io_event_t types. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "fiber.h" /* la_call_off_fiber; base.h, async.h: on Windows winsock2.h, then windows.h */
#include "rt.h"
#if !defined(_WIN32)
#include <sys/time.h>
#include <unistd.h>
#endif

/* package rt's Go export (rt/runtime.go); op: an la_rt_fd_op_t (rt.h). */
int la_go_rt_fd(uint64_t h, int op, int fd, uint32_t events, uintptr_t ctx);

enum { CL_READ = 0x01, CL_WRITE = 0x02, CL_ERROR = 0x04, CL_CLOSE = 0x08 };
enum { CL_CONSOLE_NONE = 0, CL_CONSOLE_REAL, CL_CONSOLE_PIPE, CL_CONSOLE_FILE };

typedef struct {
#if defined(_WIN32)
    uintptr_t fd; /* SOCKET */
    void *handle;
#else
    int fd;
#endif
    uintptr_t completion_key;
    uint32_t event_type;
    void *context;
    size_t bytes_transferred;
    void *buffer;
} cl_event_t;

#if defined(_WIN32) && UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(cl_event_t) == 56 && offsetof(cl_event_t, completion_key) == 16 &&
                   offsetof(cl_event_t, event_type) == 24 && offsetof(cl_event_t, context) == 32 &&
                   offsetof(cl_event_t, bytes_transferred) == 40 && offsetof(cl_event_t, buffer) == 48,
               "classic io_event_t layout (Win64)");
#elif UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(cl_event_t) == 48 && offsetof(cl_event_t, completion_key) == 8 &&
                   offsetof(cl_event_t, event_type) == 16 && offsetof(cl_event_t, context) == 24 &&
                   offsetof(cl_event_t, bytes_transferred) == 32 && offsetof(cl_event_t, buffer) == 40,
               "classic io_event_t layout (LP64)");
#endif

#if defined(_WIN32)
#define CL_NOFD ((uintptr_t)~(uintptr_t)0) /* INVALID_SOCKET */
#else
#define CL_NOFD (-1)
#endif

/* A regular file registered by the classic add (see the top). */
typedef struct {
    int fd;
    uint32_t events;
    void *ctx;
    int eof_told; /* its end was reported readable once */
    int gone;     /* closed without remove: reported once as ERROR|CLOSE */
#if !defined(_WIN32)
    dev_t dev; /* the file registered: a number closed and reused by */
    ino_t ino; /* another file is not this registration */
#endif
} cl_file_t;

#if defined(_WIN32)
/* Windows: the context of each classic registration, which the completions
 * of async_runtime_post_read/post_write carry. */
typedef struct {
    uintptr_t fd;
    void *ctx;
} cl_reg_t;
#endif

typedef struct cl_rt {
    uint64_t h;
#if defined(_WIN32)
    cl_reg_t *regs;
    int nregs, capregs;
#endif
    int console_type;
    void *console_ctx;
    int console_reg; /* stdin registered by add_console (and not removed) */
    cl_file_t *files;
    int nfiles, capfiles;
    int toggle; /* max_events 1: files and the poller take turns */
    struct cl_rt *next;
} cl_rt_t;

static pthread_mutex_t cl_mu = PTHREAD_MUTEX_INITIALIZER;
static cl_rt_t *cl_list;

static void cl_free(cl_rt_t *r) {
    free(r->files);
#if defined(_WIN32)
    free(r->regs);
#endif
    free(r);
}

/* rt's entry, or NULL; with create, made if rt is a live runtime. Under cl_mu.
 * An entry whose runtime is no longer live was left by a modern
 * async_runtime_deinit (a runtime handle is the same for both APIs, and the
 * modern deinit does not know this table): it is dropped here, so that its
 * console and files are forgotten as the classic deinit forgets them and the
 * table does not grow with every such runtime. */
static cl_rt_t *cl_find(async_runtime_t *rt, int create) {
    uint64_t h = LA_H(rt);
    for (cl_rt_t **p = &cl_list; *p;) {
        cl_rt_t *r = *p;
        if (!la_handle_live(r->h, LA_T_RUNTIME)) {
            *p = r->next;
            cl_free(r);
            continue;
        }
        if (r->h == h) return r;
        p = &r->next;
    }
    if (!create || !la_handle_live(h, LA_T_RUNTIME)) return NULL;
    cl_rt_t *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->h = h;
    r->next = cl_list;
    cl_list = r;
    return r;
}

static cl_file_t *cl_file(cl_rt_t *r, int fd) {
    for (int i = 0; r && i < r->nfiles; i++)
        if (r->files[i].fd == fd) return &r->files[i];
    return NULL;
}

#if defined(_WIN32)
static cl_reg_t *cl_reg(cl_rt_t *r, uintptr_t fd) {
    for (int i = 0; r && i < r->nregs; i++)
        if (r->regs[i].fd == fd) return &r->regs[i];
    return NULL;
}

/* Records fd's context (ctx) or forgets it (forget). Under cl_mu. */
static void cl_reg_set(async_runtime_t *rt, uintptr_t fd, void *ctx, int forget) {
    cl_rt_t *r = cl_find(rt, !forget);
    cl_reg_t *g = r ? cl_reg(r, fd) : NULL;
    if (forget) {
        if (g) *g = r->regs[--r->nregs];
        return;
    }
    if (!r) return;
    if (!g) {
        if (r->nregs == r->capregs) {
            int cap = r->capregs ? 2 * r->capregs : 16;
            cl_reg_t *nr = realloc(r->regs, (size_t)cap * sizeof *nr);
            if (!nr) return; /* its completions then carry a NULL context */
            r->regs = nr;
            r->capregs = cap;
        }
        g = &r->regs[r->nregs++];
        g->fd = fd;
    }
    g->ctx = ctx;
}
#endif

static int cl_fail(int code) {
    la_set_error(code);
    return -1;
}

/* The classic API watches READ and/or WRITE; ERROR and CLOSE are always
 * reported (and may be passed). CLOSE is not asked from the modern runtime:
 * a classic driver learns of a read-side hang-up by reading 0 bytes, as the
 * classic epoll backend had it (it reported CLOSE only for EPOLLHUP). */
static int cl_bits(uint32_t events, uint32_t *out) {
    if (events & ~(uint32_t)(CL_READ | CL_WRITE | CL_ERROR | CL_CLOSE)) return 0;
    *out = events & (CL_READ | CL_WRITE);
    return 1;
}

#if !defined(_WIN32)
static int cl_is_regular(int fd) {
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

/* fd still holds f's file (else it was closed without remove, and its
 * number may be another file's now). *st gets fd's fstat. */
static int cl_file_same(const cl_file_t *f, struct stat *st) {
    return fstat(f->fd, st) == 0 && S_ISREG(st->st_mode) && st->st_dev == f->dev && st->st_ino == f->ino;
}
#endif

/* ---- the Go call of the 4-argument modify ---------------------------------- */

typedef struct {
    uint64_t h;
    int fd, rc;
    uint32_t events;
    uintptr_t ctx;
} cl_modify_t;

static void cl_modify_go(void *arg) {
    cl_modify_t *m = arg;
    m->rc = la_go_rt_fd(m->h, LA_RT_FD_MODIFY_CTX, m->fd, m->events, m->ctx);
}

static int cl_modern_modify(async_runtime_t *rt, async_fd_t fd, uint32_t events, void *ctx) {
#if defined(_WIN32)
    if (fd > (async_fd_t)INT32_MAX) return cl_fail(ASYNC_E_BADFD);
#endif
    cl_modify_t m = {.h = LA_H(rt), .fd = (int)fd, .events = events, .ctx = (uintptr_t)ctx};
    la_call_off_fiber(cl_modify_go, &m);
    return m.rc ? cl_fail(m.rc) : 0;
}

/* ---- lifecycle and registrations ------------------------------------------- */

void async_classic_runtime_deinit(async_runtime_t *rt) {
    LA_ENTRY();
    async_runtime_deinit(rt);
    pthread_mutex_lock(&cl_mu);
    for (cl_rt_t **p = &cl_list; *p; p = &(*p)->next) {
        if ((*p)->h == LA_H(rt)) {
            cl_rt_t *r = *p;
            *p = r->next;
            cl_free(r);
            break;
        }
    }
    pthread_mutex_unlock(&cl_mu);
}

int async_classic_runtime_modify(async_runtime_t *rt, async_fd_t fd, uint32_t events, void *context) {
    LA_ENTRY(-1);
    uint32_t ev;
    if (!cl_bits(events, &ev)) return cl_fail(ASYNC_E_INVAL);
    pthread_mutex_lock(&cl_mu);
    cl_rt_t *r = cl_find(rt, 0);
    cl_file_t *f = r ? cl_file(r, (int)fd) : NULL;
    if (f) {
        f->events = ev;
        f->ctx = context;
        if (r->console_reg && fd == 0) r->console_ctx = context;
        pthread_mutex_unlock(&cl_mu);
        async_runtime_wakeup(rt); /* a sleeping wait reports it at once */
        return 0;
    }
    int rc = cl_modern_modify(rt, fd, ev, context);
    if (rc == 0 && r && r->console_reg && fd == 0) r->console_ctx = context;
#if defined(_WIN32)
    if (rc == 0) cl_reg_set(rt, fd, context, 0);
#endif
    pthread_mutex_unlock(&cl_mu);
    return rc;
}

int async_classic_runtime_add(async_runtime_t *rt, async_fd_t fd, uint32_t events, void *context) {
    LA_ENTRY(-1);
    uint32_t ev;
    if (!cl_bits(events, &ev)) return cl_fail(ASYNC_E_INVAL);
    pthread_mutex_lock(&cl_mu);
    cl_rt_t *r = cl_find(rt, 0);
#if !defined(_WIN32)
    cl_file_t *stale = r ? cl_file(r, fd) : NULL;
    struct stat sst;
    if (stale && (stale->gone || !cl_file_same(stale, &sst))) {
        /* a regular file closed without remove; its number is reused */
        *stale = r->files[--r->nfiles];
        if (fd == 0) r->console_reg = 0;
    }
#endif
    if (r && r->console_reg && fd == 0) {
        /* stdin, registered by add_console: this registration takes it over. */
        pthread_mutex_unlock(&cl_mu);
        return async_classic_runtime_modify(rt, fd, events, context);
    }
#if !defined(_WIN32)
    if (cl_is_regular(fd)) {
        if (!r && !(r = cl_find(rt, 1))) {
            pthread_mutex_unlock(&cl_mu);
            return cl_fail(la_handle_live(LA_H(rt), LA_T_RUNTIME) ? ASYNC_E_NOMEM : ASYNC_E_BADHANDLE);
        }
        if (cl_file(r, fd)) {
            pthread_mutex_unlock(&cl_mu);
            return cl_fail(ASYNC_E_EXISTS);
        }
        if (r->nfiles == r->capfiles) {
            int cap = r->capfiles ? 2 * r->capfiles : 4;
            cl_file_t *nf = realloc(r->files, (size_t)cap * sizeof *nf);
            if (!nf) {
                pthread_mutex_unlock(&cl_mu);
                return cl_fail(ASYNC_E_NOMEM);
            }
            r->files = nf;
            r->capfiles = cap;
        }
        struct stat st;
        if (fstat(fd, &st) != 0) {
            pthread_mutex_unlock(&cl_mu);
            return cl_fail(ASYNC_E_BADFD);
        }
        /* A registration of this number in the poller is a closed file's
         * (the number is a regular file's now, which never goes there): the
         * poll backend, which watches numbers, would report this file with
         * that context. Drop it, as a modern add of the number would. */
        int saved = async_last_error();
        if (async_runtime_remove(rt, fd) != 0) la_set_error(saved);
        r->files[r->nfiles++] = (cl_file_t){.fd = fd, .events = ev, .ctx = context, .dev = st.st_dev, .ino = st.st_ino};
        pthread_mutex_unlock(&cl_mu);
        async_runtime_wakeup(rt); /* a sleeping wait reports it at once */
        return 0;
    }
#endif
#if defined(_WIN32)
    int rc = async_runtime_add(rt, fd, ev, context);
    if (rc == 0) cl_reg_set(rt, fd, context, 0);
    pthread_mutex_unlock(&cl_mu);
    return rc;
#else
    pthread_mutex_unlock(&cl_mu);
    return async_runtime_add(rt, fd, ev, context);
#endif
}

int async_classic_runtime_remove(async_runtime_t *rt, async_fd_t fd) {
    LA_ENTRY(-1);
    pthread_mutex_lock(&cl_mu);
    cl_rt_t *r = cl_find(rt, 0);
    cl_file_t *f = r ? cl_file(r, (int)fd) : NULL;
    int rc = 0;
    if (f)
        *f = r->files[--r->nfiles];
#if !defined(_WIN32)
    else if (cl_is_regular(fd) && la_handle_live(LA_H(rt), LA_T_RUNTIME))
        rc = cl_fail(ASYNC_E_NOTFOUND); /* never in the poller (see add) */
#endif
    else
        rc = async_runtime_remove(rt, fd);
    if (rc == 0 && r && fd == 0) r->console_reg = 0;
#if defined(_WIN32)
    if (rc == 0) cl_reg_set(rt, fd, NULL, 1);
#endif
    pthread_mutex_unlock(&cl_mu);
    return rc;
}

/* ---- waiting ---------------------------------------------------------------- */

#if !defined(_WIN32)
/* What f is ready for. Readable while its offset is below its size, and
 * once at the end (*at_end). A descriptor that is no longer a regular file
 * was closed without remove (its number may be reused): it is reported once
 * as ERROR|CLOSE (*gone), as the poll backend reports a closed registered
 * fd, and never again. */
static uint32_t cl_file_ready(const cl_file_t *f, int *at_end, int *gone) {
    struct stat st;
    *at_end = *gone = 0;
    if (f->gone) return 0;
    if (!cl_file_same(f, &st)) {
        *gone = 1;
        return CL_ERROR | CL_CLOSE;
    }
    uint32_t bits = f->events & CL_WRITE;
    if (f->events & CL_READ) {
        off_t pos = lseek(f->fd, 0, SEEK_CUR);
        *at_end = pos >= 0 && pos >= st.st_size;
        if (!*at_end || !f->eof_told) bits |= CL_READ;
    }
    return bits;
}
#endif

/* Appends the ready regular files to out (at most room); marks an end told. */
static int cl_files_collect(cl_rt_t *r, cl_event_t *out, int room, int probe_only) {
    int n = 0;
#if !defined(_WIN32)
    for (int i = 0; r && i < r->nfiles && n < room; i++) {
        cl_file_t *f = &r->files[i];
        int at_end, gone;
        uint32_t bits = cl_file_ready(f, &at_end, &gone);
        if (!bits) continue;
        if (!probe_only) {
            if (gone)
                f->gone = 1;
            else if (bits & CL_READ)
                f->eof_told = at_end;
            memset(&out[n], 0, sizeof out[n]);
            out[n].fd = f->fd;
            out[n].event_type = bits;
            out[n].context = f->ctx;
        }
        n++;
    }
#else
    (void)r, (void)out, (void)room, (void)probe_only;
#endif
    return n;
}

/* A timeval as the modern timeout: NULL blocks. The timeval's value is
 * tv_sec + tv_usec / 10^6 whatever the fields hold (tv_usec may be negative
 * or above 999999, as the classic backend's sec * 1000 + usec / 1000 read
 * it), computed without overflow: a value <= 0 does not wait, a partial
 * millisecond rounds up (never a busy spin), and one of INT_MAX ms (24.8
 * days) or more waits INT_MAX ms. */
static int cl_timeout_ms(const struct timeval *tv) {
    if (!tv) return -1;
    long long sec = (long long)tv->tv_sec, usec = (long long)tv->tv_usec;
    long long carry = usec / 1000000, rem = usec % 1000000; /* rem has usec's sign */
    if (rem < 0) {
        rem += 1000000;
        carry--;
    }
    if (__builtin_add_overflow(sec, carry, &sec)) return carry > 0 ? INT_MAX : 0;
    if (sec < 0 || (sec == 0 && rem == 0)) return 0;
    if (sec > INT_MAX / 1000) return INT_MAX;
    long long ms = sec * 1000 + (rem + 999) / 1000;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

#if defined(_WIN32)
/* One overlapped read or write of async_runtime_post_read/post_write. The
 * system thread pool's completion port (BindIoCompletionCallback) runs
 * cl_io_done when it ends, which posts it to the runtime as a completion
 * whose key is CL_IO_KEY; the classic wait turns that into the classic
 * event (fd, context, EVENT_READ or EVENT_WRITE, bytes_transferred, buffer)
 * and frees it. */
typedef struct {
    OVERLAPPED ov; /* first */
    uint64_t h;
    uintptr_t fd;
    void *buf;
    void *ctx;
    uint32_t op;
    DWORD err, bytes;
} cl_io_t;

static VOID CALLBACK cl_io_done(DWORD err, DWORD bytes, LPOVERLAPPED ov) {
    cl_io_t *io = (cl_io_t *)ov;
    io->err = err;
    io->bytes = bytes;
    if (async_runtime_post_completion((async_runtime_t *)(uintptr_t)io->h, (uintptr_t)&cl_io_done, (uintptr_t)io) != 0)
        free(io); /* the runtime is gone */
}
#define CL_IO_KEY ((uintptr_t)&cl_io_done) /* no caller can post this key by chance */
#endif

static void cl_translate(cl_event_t *c, const io_event_t *e) {
    memset(c, 0, sizeof *c);
#if defined(_WIN32)
    if ((e->event_type & ASYNC_EVENT_COMPLETION) && e->completion_key == CL_IO_KEY) {
        cl_io_t *io = (cl_io_t *)e->data;
        c->fd = io->fd;
        c->event_type = io->op | (io->err ? CL_ERROR : 0);
        c->context = io->ctx;
        c->bytes_transferred = io->bytes;
        c->buffer = io->buf;
        free(io);
        return;
    }
#endif
    if (e->event_type & (ASYNC_EVENT_COMPLETION | ASYNC_EVENT_TIMER | ASYNC_EVENT_SIGNAL)) {
        c->fd = CL_NOFD;
        c->completion_key = e->completion_key;
        c->event_type = CL_READ;
        c->bytes_transferred = (size_t)e->data;
    } else {
        c->fd = e->fd;
        c->event_type = e->event_type & (CL_READ | CL_WRITE | CL_ERROR | CL_CLOSE);
        c->context = e->context;
    }
}

/* One modern wait per classic wait (a second one would report a
 * level-triggered descriptor twice in one result): its buffer is on the
 * stack up to CL_STACK events, else allocated for the call; if that
 * allocation fails the call makes do with the stack buffer (as the modern
 * wait, it never fails for memory). */
#define CL_STACK 128

int async_classic_runtime_wait(async_runtime_t *rt, cl_event_t *events, int max_events, struct timeval *timeout) {
    LA_ENTRY(-1);
    if (!events || max_events < 1) return cl_fail(ASYNC_E_INVAL);
    int ms = cl_timeout_ms(timeout);

    pthread_mutex_lock(&cl_mu);
    cl_rt_t *r = cl_find(rt, 0);
    int files_ready = r ? cl_files_collect(r, NULL, INT_MAX, 1) : 0;
    int poll_room = max_events;
    if (files_ready) {
        if (max_events > 1)
            poll_room = max_events - 1; /* at least one file event */
        else if ((r->toggle ^= 1) != 0)
            poll_room = 0; /* one slot: the files and the poller take turns */
    }
    pthread_mutex_unlock(&cl_mu);
    if (files_ready) ms = 0; /* something is ready: do not sleep */

    int n = 0;
    if (poll_room > 0) {
        io_event_t stackbuf[CL_STACK];
        io_event_t *buf = stackbuf;
        if (poll_room > CL_STACK && !(buf = malloc((size_t)poll_room * sizeof *buf))) {
            buf = stackbuf; /* out of memory: fewer events this call, never a failure */
            poll_room = CL_STACK;
        }
        n = async_runtime_wait(rt, buf, poll_room, ms);
        for (int i = 0; i < n; i++) cl_translate(&events[i], &buf[i]);
        if (buf != stackbuf) free(buf);
        if (n < 0) return -1;
    }
    if (files_ready) {
        pthread_mutex_lock(&cl_mu);
        r = cl_find(rt, 0);
        n += r ? cl_files_collect(r, events + n, max_events - n, 0) : 0;
        pthread_mutex_unlock(&cl_mu);
    }
    return n;
}

/* ---- the console -------------------------------------------------------------- */

static int cl_console_detect(void) {
#if !defined(_WIN32)
    struct stat st;
    if (isatty(STDIN_FILENO)) return CL_CONSOLE_REAL;
    if (fstat(STDIN_FILENO, &st) != 0) return CL_CONSOLE_NONE;
    if (S_ISFIFO(st.st_mode)) return CL_CONSOLE_PIPE;
    if (S_ISREG(st.st_mode)) return CL_CONSOLE_FILE;
    return CL_CONSOLE_NONE;
#else
    HANDLE in = GetStdHandle(STD_INPUT_HANDLE);
    DWORD mode;
    if (in == NULL || in == INVALID_HANDLE_VALUE) return CL_CONSOLE_NONE;
    if (GetConsoleMode(in, &mode)) return CL_CONSOLE_REAL;
    switch (GetFileType(in)) {
    case FILE_TYPE_PIPE: return CL_CONSOLE_PIPE;
    case FILE_TYPE_DISK: return CL_CONSOLE_FILE;
    default: return CL_CONSOLE_NONE;
    }
#endif
}

int async_classic_runtime_add_console(async_runtime_t *rt, void *context) {
    LA_ENTRY(-1);
    int type = cl_console_detect();
    pthread_mutex_lock(&cl_mu);
    cl_rt_t *r = cl_find(rt, 1);
    if (!r) {
        pthread_mutex_unlock(&cl_mu);
        return cl_fail(la_handle_live(LA_H(rt), LA_T_RUNTIME) ? ASYNC_E_NOMEM : ASYNC_E_BADHANDLE);
    }
    r->console_type = type;
    r->console_ctx = context;
    int registered = r->console_reg;
    pthread_mutex_unlock(&cl_mu);
#if !defined(_WIN32)
    if (type == CL_CONSOLE_NONE) return 0; /* nothing to watch (e.g. /dev/null, closed stdin) */
    int rc;
    if (registered) {
        rc = async_classic_runtime_modify(rt, STDIN_FILENO, CL_READ, context);
    } else {
        rc = async_classic_runtime_add(rt, STDIN_FILENO, CL_READ, context);
        if (rc != 0 && async_last_error() == ASYNC_E_EXISTS) /* the caller added stdin itself */
            rc = async_classic_runtime_modify(rt, STDIN_FILENO, CL_READ, context);
    }
    if (rc != 0) return -1;
    pthread_mutex_lock(&cl_mu);
    if ((r = cl_find(rt, 0)) != NULL) r->console_reg = 1;
    pthread_mutex_unlock(&cl_mu);
    return 0;
#else
    (void)registered; /* Windows: detected and recorded, not watched (docs/NEOLITH.md) */
    return 0;
#endif
}

int async_classic_runtime_get_console_type(async_runtime_t *rt) {
    LA_ENTRY(CL_CONSOLE_NONE);
    pthread_mutex_lock(&cl_mu);
    cl_rt_t *r = cl_find(rt, 0);
    int t = r ? r->console_type : CL_CONSOLE_NONE;
    pthread_mutex_unlock(&cl_mu);
    return t;
}

void *async_classic_runtime_get_console_ctx(async_runtime_t *rt) {
    LA_ENTRY(NULL);
    pthread_mutex_lock(&cl_mu);
    cl_rt_t *r = cl_find(rt, 0);
    void *c = r ? r->console_ctx : NULL;
    pthread_mutex_unlock(&cl_mu);
    return c;
}

#if !defined(_WIN32)
int async_classic_runtime_get_event_loop_handle(async_runtime_t *rt) {
    LA_ENTRY(-1);
    la_slot_t *slot;
    la_doorbell_t *bell = la_handle_get(LA_H(rt), LA_T_RUNTIME, &slot);
    if (!bell) return cl_fail(ASYNC_E_BADHANDLE);
    int fd = bell->fd;
    la_handle_put(slot);
    return fd;
}

/* Readiness-based, as the classic epoll and poll backends: a read or write
 * is done by the driver on the socket's readiness event, so there is nothing
 * to start. A live runtime answers 0. */
static int cl_post_noop(async_runtime_t *rt) {
    LA_ENTRY(-1);
    if (!la_handle_live(LA_H(rt), LA_T_RUNTIME)) return cl_fail(ASYNC_E_BADHANDLE);
    return 0;
}

int async_classic_runtime_post_read(async_runtime_t *rt, int fd, void *buffer, size_t len) {
    (void)fd, (void)buffer, (void)len;
    return cl_post_noop(rt);
}

int async_classic_runtime_post_write(async_runtime_t *rt, int fd, void *buffer, size_t len) {
    (void)fd, (void)buffer, (void)len;
    return cl_post_noop(rt);
}
#else
/* ---- Windows: overlapped reads and writes ------------------------------------------ */

static int cl_post_io(async_runtime_t *rt, uintptr_t fd, void *buffer, size_t len, uint32_t op) {
    if ((!buffer && len) || len > 0x7fffffffu) return cl_fail(ASYNC_E_INVAL);
    pthread_mutex_lock(&cl_mu);
    cl_rt_t *r = cl_find(rt, 0);
    cl_reg_t *g = r ? cl_reg(r, fd) : NULL;
    void *ctx = g ? g->ctx : NULL;
    pthread_mutex_unlock(&cl_mu);
    if (!la_handle_live(LA_H(rt), LA_T_RUNTIME)) return cl_fail(ASYNC_E_BADHANDLE);
    if (fd == (uintptr_t)INVALID_SOCKET) return cl_fail(ASYNC_E_BADFD);
    cl_io_t *io = calloc(1, sizeof *io);
    if (!io) return cl_fail(ASYNC_E_NOMEM);
    io->h = LA_H(rt);
    io->fd = fd;
    io->buf = buffer;
    io->ctx = ctx;
    io->op = op;
    /* Fails harmlessly (ERROR_INVALID_PARAMETER) once the socket is bound;
     * a bad socket is reported by WSARecv/WSASend below. */
    BindIoCompletionCallback((HANDLE)fd, cl_io_done, 0);
    WSABUF wb;
    wb.len = (ULONG)len;
    wb.buf = buffer;
    DWORD flags = 0;
    int rc = op == CL_READ ? WSARecv((SOCKET)fd, &wb, 1, NULL, &flags, &io->ov, NULL)
                           : WSASend((SOCKET)fd, &wb, 1, NULL, 0, &io->ov, NULL);
    if (rc == SOCKET_ERROR) {
        int err = WSAGetLastError();
        if (err != WSA_IO_PENDING) {
            free(io);
            return cl_fail(err == WSAENOTSOCK || err == WSAEBADF || err == WSA_INVALID_HANDLE ? ASYNC_E_BADFD
                                                                                                 : ASYNC_E_SYS);
        }
    }
    return 0; /* the completion comes through the runtime, also for an immediate success */
}

int async_classic_runtime_post_read(async_runtime_t *rt, uintptr_t fd, void *buffer, size_t len) {
    return cl_post_io(rt, fd, buffer, len, CL_READ);
}

int async_classic_runtime_post_write(async_runtime_t *rt, uintptr_t fd, void *buffer, size_t len) {
    return cl_post_io(rt, fd, buffer, len, CL_WRITE);
}

/* Not implemented (docs/CLASSIC_API.md). */
HANDLE async_classic_runtime_get_console_event(async_runtime_t *rt) {
    (void)rt;
    la_set_error(ASYNC_E_NOTSUP);
    return NULL;
}
#endif

/* libasync's worker has no platform_event_t (docs/CLASSIC_API.md). */
void *async_classic_worker_get_stop_event(async_worker_t *worker) {
    (void)worker;
    LA_ENTRY(NULL);
    la_set_error(ASYNC_E_NOTSUP);
    return NULL;
}
