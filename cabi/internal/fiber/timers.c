/* Fiber timers: a min-heap of parked fibers by deadline, per scheduler.
 * The worker that polls sleeps until the earliest deadline (next_deadline);
 * adding an earlier one kicks it. */
#include <stdlib.h>

#include "fiber_int.h"

/* ---- timers (a min-heap of parked fibers by deadline) ---------------------------- */

static void heap_swap(la_fiber_t **h, int i, int j) {
    la_fiber_t *t = h[i];
    h[i] = h[j];
    h[j] = t;
    h[i]->heap_idx = i;
    h[j]->heap_idx = j;
}

static void heap_up(la_fiber_t **h, int i) {
    while (i > 0) {
        int p = (i - 1) / 2;
        if (h[p]->deadline <= h[i]->deadline) break;
        heap_swap(h, i, p);
        i = p;
    }
}

static void heap_down(la_fiber_t **h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l]->deadline < h[m]->deadline) m = l;
        if (r < n && h[r]->deadline < h[m]->deadline) m = r;
        if (m == i) break;
        heap_swap(h, i, m);
        i = m;
    }
}

static void heap_remove(la_sched_t *s, int i) {
    la_fiber_t **h = s->heap;
    int last = --s->hlen;
    h[i]->heap_idx = -1;
    if (i != last) {
        h[i] = h[last];
        h[i]->heap_idx = i;
        heap_down(h, last, i);
        heap_up(h, i);
    }
    atomic_store(&s->next_deadline, s->hlen ? h[0]->deadline : UINT64_MAX);
}

void la_timer_add(la_sched_t *s, la_fiber_t *f, uint64_t deadline) {
    pthread_mutex_lock(&s->tmu);
    if (s->hlen == s->hcap) {
        size_t nc = s->hcap ? s->hcap * 2 : 256;
        la_fiber_t **nh = realloc(s->heap, nc * sizeof *nh);
        if (!nh) {
            /* Out of memory: fire at once rather than hang. */
            pthread_mutex_unlock(&s->tmu);
            int z = 0;
            if (atomic_compare_exchange_strong(&f->claim, &z, LA_W_TIMEDOUT)) la_fiber_wake(f);
            return;
        }
        s->heap = nh;
        s->hcap = nc;
    }
    f->deadline = deadline;
    f->heap_idx = (int)s->hlen;
    s->heap[s->hlen++] = f;
    heap_up(s->heap, f->heap_idx);
    int earliest = s->heap[0] == f;
    atomic_store(&s->next_deadline, s->heap[0]->deadline);
    pthread_mutex_unlock(&s->tmu);
    if (earliest) {
        pthread_mutex_lock(&s->imu);
        if (la_poller_busy(s) && !s->poll_kicked) {
            s->poll_kicked = 1;
            la_poller_kick(&s->poller);
        }
        pthread_mutex_unlock(&s->imu);
    }
}

void la_timer_del(la_sched_t *s, la_fiber_t *f) {
    pthread_mutex_lock(&s->tmu);
    if (f->heap_idx >= 0) heap_remove(s, f->heap_idx);
    pthread_mutex_unlock(&s->tmu);
}

/* Fires due timers; returns how many fibers it woke. */
int la_timers_fire(la_sched_t *s) {
    uint64_t now = la_now_ns();
    la_fiber_t *woken[64];
    int n = 0;
    pthread_mutex_lock(&s->tmu);
    while (s->hlen && s->heap[0]->deadline <= now && n < 64) {
        la_fiber_t *f = s->heap[0];
        heap_remove(s, 0);
        int z = 0;
        if (atomic_compare_exchange_strong(&f->claim, &z, LA_W_TIMEDOUT)) woken[n++] = f;
    }
    pthread_mutex_unlock(&s->tmu);
    for (int i = 0; i < n; i++) la_fiber_wake(woken[i]);
    return n;
}
