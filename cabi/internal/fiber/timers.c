/* Fiber timers: a min-heap of parked fibers by deadline, per scheduler.
 * The worker that polls sleeps until the earliest deadline (next_deadline);
 * adding an earlier one kicks it.
 *
 * The heap and the position of each fiber in it live in two arrays of the
 * scheduler: a slot holds the deadline, the fiber and its handle slot
 * index (hidx), and tpos[hidx] is the slot's index (-1: not in the heap).
 * Sifting moves slots and updates tpos only, never a fiber record: a
 * timeout set and cleared on every park of 10k connections touches no cold
 * fiber memory. Every tpos entry is -1 unless its fiber is in the heap (a
 * handle slot can be reused by a fiber of another scheduler).
 *
 * Entries are removed lazily. A fiber's entry says "look at this fiber at
 * that time"; the deadline of its timed park is f->tdl (0: not in a timed
 * park), written under tmu. A park that ends early only clears tdl; the
 * next timed park of the fiber keeps the entry when its key is not later
 * than the new deadline (an idle timeout renewed on every read costs no
 * heap operation), else moves it earlier. When an entry comes due, the
 * fiber's tdl decides: passed, the park times out; later, the entry moves
 * to tdl; 0, the entry goes. A fiber has at most one entry; the record's
 * release removes it (la_timer_forget). */
#include <stdlib.h>

#include "fiber_int.h"

static void heap_set(la_sched_t *s, int i, la_tslot_t v) {
    s->heap[i] = v;
    s->tpos[v.hidx] = i;
}

static void heap_up(la_sched_t *s, int i) {
    la_tslot_t v = s->heap[i];
    while (i > 0) {
        int p = (i - 1) / 2;
        if (s->heap[p].deadline <= v.deadline) break;
        heap_set(s, i, s->heap[p]);
        i = p;
    }
    heap_set(s, i, v);
}

static void heap_down(la_sched_t *s, int i) {
    int n = (int)s->hlen;
    la_tslot_t v = s->heap[i];
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = l;
        if (l >= n) break;
        if (r < n && s->heap[r].deadline < s->heap[l].deadline) m = r;
        if (s->heap[m].deadline >= v.deadline) break;
        heap_set(s, i, s->heap[m]);
        i = m;
    }
    heap_set(s, i, v);
}

static void heap_remove(la_sched_t *s, int i) {
    la_tslot_t *h = s->heap;
    int last = (int)--s->hlen;
    s->tpos[h[i].hidx] = -1;
    if (i != last) {
        uint64_t gone = h[i].deadline;
        h[i] = h[last];
        if (h[i].deadline < gone)
            heap_up(s, i);
        else
            heap_down(s, i);
    }
    atomic_store(&s->next_deadline, s->hlen ? h[0].deadline : UINT64_MAX);
}

/* Room for one more slot and for tpos[hidx]; 0, or -1 out of memory. */
static int timers_grow(la_sched_t *s, uint32_t hidx) {
    if (s->hlen == s->hcap) {
        size_t nc = s->hcap ? s->hcap * 2 : 256;
        la_tslot_t *nh = realloc(s->heap, nc * sizeof *nh);
        if (!nh) return -1;
        s->heap = nh;
        s->hcap = nc;
    }
    if (hidx >= s->tposcap) {
        size_t nc = s->tposcap ? s->tposcap : 256;
        while (nc <= hidx) nc *= 2;
        int32_t *np = realloc(s->tpos, nc * sizeof *np);
        if (!np) return -1;
        for (size_t k = s->tposcap; k < nc; k++) np[k] = -1;
        s->tpos = np;
        s->tposcap = nc;
    }
    return 0;
}

/* Makes f's entry due at deadline at the latest; 1 if it is now the
 * earliest. tmu held, room made. */
static int entry_arm(la_sched_t *s, la_fiber_t *f, uint64_t deadline) {
    int i = s->tpos[f->hidx];
    if (i >= 0) {
        if (s->heap[i].deadline <= deadline) return 0; /* due first: it moves on to tdl then */
        s->heap[i].deadline = deadline;
        heap_up(s, i);
    } else {
        i = (int)s->hlen++;
        s->heap[i] = (la_tslot_t){deadline, f, f->hidx};
        heap_up(s, i);
        atomic_store_explicit(&f->tq, 1, memory_order_relaxed);
    }
    if (s->heap[0].f != f) return 0;
    atomic_store(&s->next_deadline, deadline);
    return 1;
}

void la_timer_add(la_sched_t *s, la_fiber_t *f, uint64_t deadline) {
    pthread_mutex_lock(&s->tmu);
    if (timers_grow(s, f->hidx) != 0) {
        /* Out of memory: fire at once rather than hang. */
        pthread_mutex_unlock(&s->tmu);
        int z = 0;
        if (atomic_compare_exchange_strong(&f->claim, &z, LA_W_TIMEDOUT)) la_fiber_wake(f);
        return;
    }
    f->tdl = deadline;
    int earliest = entry_arm(s, f, deadline);
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
    f->tdl = 0;
    pthread_mutex_unlock(&s->tmu);
}

void la_timer_forget_slow(la_sched_t *s, la_fiber_t *f) {
    pthread_mutex_lock(&s->tmu);
    f->tdl = 0;
    if (f->hidx < s->tposcap && s->tpos[f->hidx] >= 0) {
        heap_remove(s, s->tpos[f->hidx]);
        atomic_store_explicit(&f->tq, 0, memory_order_release);
    }
    pthread_mutex_unlock(&s->tmu);
}

/* Fires due timers; returns how many fibers it woke. */
int la_timers_fire(la_sched_t *s) {
    uint64_t now = la_now_ns();
    la_fiber_t *woken[64];
    int n = 0;
    pthread_mutex_lock(&s->tmu);
    while (s->hlen && s->heap[0].deadline <= now && n < 64) {
        la_fiber_t *f = s->heap[0].f;
        uint64_t tdl = f->tdl;
        if (tdl > now) { /* a later park's deadline: the entry waits for it */
            s->heap[0].deadline = tdl;
            heap_down(s, 0);
            atomic_store(&s->next_deadline, s->heap[0].deadline);
            continue;
        }
        heap_remove(s, 0);
        int z = 0, won = 0;
        if (tdl) { /* its timed park is due (else: not in a timed park) */
            f->tdl = 0;
            won = atomic_compare_exchange_strong(&f->claim, &z, LA_W_TIMEDOUT);
        }
        /* the last look at f, before la_timer_forget may see the 0 */
        atomic_store_explicit(&f->tq, 0, memory_order_release);
        if (won) woken[n++] = f;
    }
    pthread_mutex_unlock(&s->tmu);
    for (int i = 0; i < n; i++) la_fiber_wake(woken[i]);
    return n;
}
