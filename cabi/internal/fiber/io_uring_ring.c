//go:build linux && !la_kqueue

/* io_uring rings: made per worker when a scheduler starts with
 * ASYNC_FIBER_IO=uring (or refused, with the reason logged: epoll is used
 * then), and freed with the scheduler. io_uring.c tells the design. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "io_uring_int.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define LA_UR_VALGRIND 1
#endif
#endif
#ifndef LA_UR_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

/* ---- system calls ----------------------------------------------------------- */

LA_NOINLINE static int ur_setup(unsigned entries, struct io_uring_params *p) {
    long r = syscall(__NR_io_uring_setup, entries, p);
    return r < 0 ? -errno : (int)r;
}

LA_NOINLINE static int ur_register(int fd, unsigned op, void *arg, unsigned n) {
    long r = syscall(__NR_io_uring_register, fd, op, arg, n);
    return r < 0 ? -errno : (int)r;
}

/* ---- rings ------------------------------------------------------------------ */

static void ring_close(la_uring_t *r) {
    if (r->sqes && r->sqes != MAP_FAILED) munmap(r->sqes, r->sqes_len);
    if (r->cq_map && r->cq_map != MAP_FAILED && r->cq_map != r->sq_map) munmap(r->cq_map, r->cq_map_len);
    if (r->sq_map && r->sq_map != MAP_FAILED) munmap(r->sq_map, r->sq_map_len);
    if (r->fd >= 0) close(r->fd);
    r->fd = -1;
    r->sqes = NULL;
    r->sq_map = r->cq_map = NULL;
}

static const unsigned la_ur_ops[] = {IORING_OP_RECV,     IORING_OP_SEND,    IORING_OP_ACCEPT,      IORING_OP_POLL_ADD,
                                     IORING_OP_RECVMSG,  IORING_OP_SENDMSG, IORING_OP_ASYNC_CANCEL};

/* 1 if the kernel release is at least major.minor. */
static int kernel_at_least(int major, int minor) {
    struct utsname u;
    if (uname(&u) != 0) return 0;
    int ma = 0, mi = 0;
    if (sscanf(u.release, "%d.%d", &ma, &mi) != 2) return 0;
    return ma > major || (ma == major && mi >= minor);
}

/* 0, or a reason (static string) why the ring could not be made. */
static const char *ring_open(la_uring_t *r, int solo, unsigned ncq) {
    memset(r, 0, sizeof *r);
    r->fd = -1;
    struct io_uring_params p;
    unsigned want = IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL;
    /* One worker: completions run as task work when it enters the kernel
     * anyway (it submits, polls), so no IPI is needed to interrupt it. With
     * several workers an idle worker reaps a busy one's ring: there the
     * default (an interrupt) keeps completions prompt. */
    if (solo) want |= IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
    memset(&p, 0, sizeof p);
    p.flags = want;
    p.cq_entries = ncq;
    int fd = ur_setup(LA_UR_SQ, &p);
    if (fd == -EINVAL && solo) {
        memset(&p, 0, sizeof p);
        p.flags = IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL;
        p.cq_entries = ncq;
        fd = ur_setup(LA_UR_SQ, &p);
    }
    if (fd < 0) return fd == -ENOSYS                   ? "io_uring_setup: not implemented"
                       : fd == -EPERM                    ? "io_uring_setup: not permitted"
                       : fd == -EMFILE || fd == -ENFILE ? "io_uring_setup: no descriptor left"
                       : fd == -ENOMEM                   ? "io_uring_setup: out of memory"
                                                         : "io_uring_setup failed";
    r->fd = fd;
    unsigned need = IORING_FEAT_NODROP | IORING_FEAT_SUBMIT_STABLE | IORING_FEAT_FAST_POLL;
    if ((p.features & need) != need) return "kernel lacks io_uring features (NODROP, SUBMIT_STABLE, FAST_POLL)";
    /* the opcodes used */
    size_t plen = sizeof(struct io_uring_probe) + 256 * sizeof(struct io_uring_probe_op);
    struct io_uring_probe *pr = calloc(1, plen);
    if (!pr) return "out of memory";
    int e = ur_register(fd, IORING_REGISTER_PROBE, pr, 256);
    int ok = e >= 0;
    for (size_t i = 0; ok && i < sizeof la_ur_ops / sizeof la_ur_ops[0]; i++)
        ok = la_ur_ops[i] <= pr->last_op && (pr->ops[la_ur_ops[i]].flags & IO_URING_OP_SUPPORTED);
    free(pr);
    if (!ok) return "kernel lacks io_uring opcodes (RECV, SEND, ACCEPT, POLL_ADD, RECVMSG, SENDMSG, ASYNC_CANCEL)";

    r->sq_map_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_map_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        if (r->cq_map_len > r->sq_map_len) r->sq_map_len = r->cq_map_len;
        r->cq_map_len = r->sq_map_len;
    }
    r->sq_map = mmap(NULL, r->sq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
    if (r->sq_map == MAP_FAILED) return "mmap of the SQ ring failed";
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        r->cq_map = r->sq_map;
    } else {
        r->cq_map = mmap(NULL, r->cq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_CQ_RING);
        if (r->cq_map == MAP_FAILED) return "mmap of the CQ ring failed";
    }
    r->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sqes = mmap(NULL, r->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED) return "mmap of the SQEs failed";
    char *sq = r->sq_map, *cq = r->cq_map;
    r->sq_head = (_Atomic unsigned *)(sq + p.sq_off.head);
    r->sq_tail = (_Atomic unsigned *)(sq + p.sq_off.tail);
    r->sq_flags = (_Atomic unsigned *)(sq + p.sq_off.flags);
    r->sq_mask = *(unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_entries = p.sq_entries;
    unsigned *arr = (unsigned *)(sq + p.sq_off.array);
    for (unsigned i = 0; i < p.sq_entries; i++) arr[i] = i; /* SQE i at slot i, for good */
    r->cq_head = (_Atomic unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (_Atomic unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = *(unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    r->sq_tail_local = atomic_load_explicit(r->sq_tail, memory_order_relaxed);
    return NULL;
}

int la_uring_open(la_sched_t *s) {
    if (RUNNING_ON_VALGRIND) {
        /* memcheck sees neither the kernel's writes into the buffers nor its
         * reads of the SQEs: every received byte would be "uninitialised" */
        la_log(ASYNC_LOG_INFO, "fiber I/O: io_uring unavailable (under valgrind): epoll is used");
        return -1;
    }
    if (!kernel_at_least(5, 19)) {
        la_log(ASYNC_LOG_INFO, "fiber I/O: io_uring needs Linux 5.19 or later: epoll is used");
        return -1;
    }
    la_uring_t *rings = calloc((size_t)s->nw, sizeof *rings);
    if (!rings || la_ubusy_init(s) != 0) {
        free(rings);
        la_ubusy_free(s);
        la_log(ASYNC_LOG_INFO, "fiber I/O: io_uring unavailable (out of memory): epoll is used");
        return -1;
    }
    const char *why = NULL;
    int i;
    for (i = 0; i < s->nw && !why; i++) {
        why = ring_open(&rings[i], s->nw == 1, s->nw <= 8 ? LA_UR_CQ : LA_UR_CQ_MANY);
        if (!why) {
            struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.ptr = &rings[i]};
            if (epoll_ctl(s->poller.fd, EPOLL_CTL_ADD, rings[i].fd, &ev) != 0) why = "epoll_ctl of a ring failed";
        }
    }
    if (why) {
        for (int j = 0; j < i; j++) ring_close(&rings[j]);
        free(rings);
        la_ubusy_free(s);
        la_log(ASYNC_LOG_INFO, "fiber I/O: io_uring unavailable (%s): epoll is used", why);
        return -1;
    }
    const char *late = getenv("ASYNC_TEST_URING_CANCEL_DELAY_US"); /* test-only: cancel_late */
    unsigned delay_us = late ? (unsigned)strtoul(late, NULL, 10) : 0;
    for (i = 0; i < s->nw; i++) {
        rings[i].cancel_delay_us = delay_us;
        s->wks[i].ur = &rings[i];
    }
    s->uring = rings;
    la_log(ASYNC_LOG_INFO, "fiber I/O: io_uring (%d rings)", s->nw);
    return 0;
}

void la_uring_close(la_sched_t *s) {
    if (!s->uring) return;
    for (int i = 0; i < s->nw; i++) {
        while (atomic_load(&s->uring[i].late_n)) usleep(1000); /* test-only late cancels (cancel_late) */
        ring_close(&s->uring[i]);
        s->wks[i].ur = NULL;
    }
    free(s->uring);
    s->uring = NULL;
    la_ubusy_free(s);
}

/* ---- per-fd slots' table -------------------------------------------------------- */

int la_ubusy_init(la_sched_t *s) {
    s->ubusy = calloc(1, sizeof *s->ubusy);
    if (!s->ubusy) return -1;
    pthread_mutex_init(&s->ubusy->mu, NULL);
    return 0;
}

void la_ubusy_free(la_sched_t *s) {
    if (!s->ubusy) return;
    for (size_t i = 0; i < LA_UB_CHUNKS; i++) free(atomic_load(&s->ubusy->chunks[i]));
    pthread_mutex_destroy(&s->ubusy->mu);
    free(s->ubusy);
    s->ubusy = NULL;
}

