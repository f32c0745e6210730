//go:build linux && !la_kqueue

/* What io_uring.c (the ops) and io_uring_ring.c (making and freeing the
 * rings) share: a ring's record and the per-fd slots' table. */
#ifndef LA_IO_URING_INT_H
#define LA_IO_URING_INT_H
#include <linux/io_uring.h>
#include <pthread.h>

#include "fiber_int.h"

#ifndef IORING_SETUP_COOP_TASKRUN
#define IORING_SETUP_COOP_TASKRUN (1U << 8)
#endif
#ifndef IORING_SETUP_TASKRUN_FLAG
#define IORING_SETUP_TASKRUN_FLAG (1U << 9)
#endif
#ifndef IORING_SETUP_SUBMIT_ALL
#define IORING_SETUP_SUBMIT_ALL (1U << 7)
#endif
#ifndef IORING_SQ_TASKRUN
#define IORING_SQ_TASKRUN (1U << 2)
#endif

#define LA_UR_SQ 256
#define LA_UR_CQ 16384      /* up to 8 workers (256 KiB of CQ each) */
#define LA_UR_CQ_MANY 4096  /* more workers */

struct la_uring {
    la_spin_t sqlk; /* SQ writes and submits (the owner, and cancels from any worker) */
    la_spin_t cqlk; /* CQ reaping (the owner, or the worker in the poller) */
    int fd;
    unsigned sq_mask, sq_entries, cq_mask;
    _Atomic unsigned *sq_head, *sq_tail, *sq_flags;
    struct io_uring_sqe *sqes;
    unsigned sq_tail_local; /* written under sqlk */
    _Atomic unsigned *cq_head, *cq_tail;
    struct io_uring_cqe *cqes;
    void *sq_map, *cq_map;
    size_t sq_map_len, cq_map_len, sqes_len;
    _Atomic unsigned pending; /* hint: SQEs written since the last submit */
    uint16_t tag;             /* the tag of the last op started here (under sqlk; ur_key) */
    unsigned cancel_delay_us; /* test-only (cancel_late): 0, or how late a cancel goes in */
    _Atomic int late_n;       /* test-only: late cancels not written yet */
};

/* A descriptor number's record per scheduler: the busy bits (1 a receive
 * or accept, 2 a send or connect of a fiber of this scheduler is in a ring:
 * one of each per number) and, per direction, the key of its op and the
 * ring the op went to (0 and NULL between ops). The bits and the keys are
 * written by the fiber that holds the bit; la_uring_cancel_fd reads the
 * keys from any thread (a key it reads just as its op ends names no op any
 * more: ur_key). */
typedef struct {
    _Atomic unsigned char busy;
    _Atomic uint64_t key[2];
    la_uring_t *_Atomic ring[2];
} la_ubslot_t;

#define LA_UB_CHUNK 4096
#define LA_UB_CHUNKS 1024 /* fds below 4M, as the fd records (LA_FD_CHUNKS) */

struct la_ubusy {
    pthread_mutex_t mu;
    _Atomic(la_ubslot_t *) chunks[LA_UB_CHUNKS];
};

/* The per-fd slots' table of s (s->ubusy): made with the rings, freed with
 * them (io_uring_ring.c). 0, or -1 out of memory. */
int la_ubusy_init(la_sched_t *s);
void la_ubusy_free(la_sched_t *s);

#endif
