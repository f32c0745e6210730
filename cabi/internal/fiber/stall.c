/* The stall detector (docs/DEBUGGING.md): a monitor thread per scheduler
 * (async_sched_set_stall_ms, ASYNC_FIBER_STALL_MS) samples each worker's
 * dispatch count and running fiber, and logs a fiber that runs past the
 * threshold without parking or yielding (with the CPU time its thread got
 * meanwhile), and again when it switches out. The workers pay two relaxed
 * stores per dispatch (w->run_id, n_run: sched.c). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fiber_int.h"

/* ---- the stall detector ------------------------------------------------------------ */

typedef struct {
    uint64_t n, id, since;
    uint64_t cpu_since; /* the worker thread's CPU time at since (0: unknown) */
    clockid_t cpu;
    int has_cpu;
    int reported;
} la_wsample_t;

struct la_stallmon {
    la_sched_t *s;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ms;   /* threshold (under mu) */
    int stop; /* under mu */
    la_wsample_t *w; /* one per worker (the monitor thread's) */
};

static pthread_mutex_t stall_mu = PTHREAD_MUTEX_INITIALIZER; /* s->stall */
static __thread int tls_on_monitor;

int la_on_stall_monitor(void) { return tls_on_monitor; }

/* The name of live fiber id of s (under its list's lock), "" if gone. */
static void name_of(la_sched_t *s, uint64_t id, char out[ASYNC_FIBER_NAME_MAX]) {
    out[0] = 0;
    for (int i = 0; i <= s->nw; i++) {
        la_flist_t *l = la_flist_at(s, i);
        int found = 0;
        la_spin_lock(&l->lk);
        for (la_fiber_t *f = l->head; f; f = f->all_next)
            if (f->id == id) {
                memcpy(out, f->name, ASYNC_FIBER_NAME_MAX);
                out[ASYNC_FIBER_NAME_MAX - 1] = 0;
                found = 1;
                break;
            }
        la_spin_unlock(&l->lk);
        if (found) return;
    }
}

/* CPU time of worker sample p's thread in ns, or 0. */
static uint64_t cpu_ns(la_wsample_t *p) {
    struct timespec ts;
    if (!p->has_cpu || clock_gettime(p->cpu, &ts) != 0) return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void stall_scan(struct la_stallmon *m, int ms) {
    la_sched_t *s = m->s;
    uint64_t now = la_now_ns();
    for (int i = 0; i < s->nw; i++) {
        la_wk_t *w = &s->wks[i];
        la_wsample_t *p = &m->w[i];
        uint64_t n = atomic_load_explicit(&w->n_run, memory_order_relaxed);
        uint64_t id = atomic_load_explicit(&w->run_id, memory_order_relaxed);
        if (id != 0 && id == p->id && n == p->n) {
            if (!p->reported && now - p->since >= (uint64_t)ms * 1000000u) {
                char name[ASYNC_FIBER_NAME_MAX], cpu[64] = "";
                name_of(s, id, name);
                uint64_t c = cpu_ns(p);
                /* how much of it the worker thread was on a CPU: much less
                 * means the OS kept it off (an overloaded machine) */
                if (c && p->cpu_since && c >= p->cpu_since)
                    snprintf(cpu, sizeof cpu, ", on a CPU for %llu ms of it",
                             (unsigned long long)((c - p->cpu_since) / 1000000u));
                la_log(ASYNC_LOG_WARN,
                       "stall: fiber %llu \"%s\" has run for %llu ms on worker %d without parking or yielding "
                       "(threshold %d ms%s)",
                       (unsigned long long)id, name, (unsigned long long)((now - p->since) / 1000000u), i, ms, cpu);
                p->reported = 1;
            }
            continue;
        }
        if (p->reported)
            la_log(ASYNC_LOG_INFO, "stall: fiber %llu switched out after at least %llu ms on worker %d",
                   (unsigned long long)p->id, (unsigned long long)((now - p->since) / 1000000u), i);
        p->n = n;
        p->id = id;
        p->since = now;
        p->cpu_since = id ? cpu_ns(p) : 0; /* a syscall, only while a fiber runs */
        p->reported = 0;
    }
}

static void *stall_main(void *arg) {
    struct la_stallmon *m = arg;
    tls_on_monitor = 1;
    for (int i = 0; i < m->s->nw; i++)
#if defined(__APPLE__)
        m->w[i].has_cpu = 0; /* no pthread_getcpuclockid: the report shows no CPU time */
#else
        m->w[i].has_cpu = pthread_getcpuclockid(m->s->wks[i].th, &m->w[i].cpu) == 0;
#endif
#if !defined(_WIN32)
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
#endif
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        int ms = m->ms;
        int period = ms / 4;
        if (period < 1) period = 1;
        if (period > 250) period = 250;
        /* in the cv's clock (la_cond_abstime: monotonic on Linux, the
         * system clock on macOS and Windows); a wake-up a little early only
         * scans early */
        struct timespec ts = la_cond_abstime(la_deadline(period));
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
        if (m->stop) break;
        ms = m->ms;
        pthread_mutex_unlock(&m->mu);
        stall_scan(m, ms);
        pthread_mutex_lock(&m->mu);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

static void stall_stop(struct la_stallmon *m) {
    pthread_mutex_lock(&m->mu);
    m->stop = 1;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    int cs = LA_CANCEL_KEPT; /* not a cancellation point (base.h) */
    la_nocancel_enter(&cs);
    pthread_join(m->th, NULL);
    la_nocancel_leave(&cs);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m->w);
    free(m);
}

/* Sets s's threshold (0: off). 0 or an async_err_t (*os: errno). */
int la_stall_set(la_sched_t *s, int ms, int *os) {
    int rc = 0;
    struct la_stallmon *old = NULL;
    pthread_mutex_lock(&stall_mu);
    struct la_stallmon *m = s->stall;
    if (ms == 0) {
        old = m;
        s->stall = NULL;
    } else if (m) {
        pthread_mutex_lock(&m->mu);
        m->ms = ms;
        pthread_cond_signal(&m->cv);
        pthread_mutex_unlock(&m->mu);
    } else if (!(m = calloc(1, sizeof *m)) || !(m->w = calloc((size_t)s->nw, sizeof *m->w))) {
        free(m);
        rc = ASYNC_E_NOMEM;
    } else {
        m->s = s;
        m->ms = ms;
        pthread_mutex_init(&m->mu, NULL);
        la_cond_init_mono(&m->cv);
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256u * 1024u);
        int err = pthread_create(&m->th, &attr, stall_main, m);
        pthread_attr_destroy(&attr);
#if !defined(__APPLE__) /* darwin names only the calling thread */
        if (!err) pthread_setname_np(m->th, "la-stall");
#endif
        if (err) {
            pthread_mutex_destroy(&m->mu);
            pthread_cond_destroy(&m->cv);
            free(m->w);
            free(m);
            *os = err;
            rc = ASYNC_E_SYS;
        } else {
            s->stall = m;
        }
    }
    pthread_mutex_unlock(&stall_mu);
    if (old) stall_stop(old);
    return rc;
}

int async_sched_set_stall_ms(async_sched_t *sh, int ms) {
    LA_ENTRY(-1);
    if (ms < 0 || ms > 3600000) {
        la_set_error(ASYNC_E_INVAL);
        return -1;
    }
    if (tls_on_monitor) { /* a log handler on the monitor thread: it cannot join itself */
        la_set_error(ASYNC_E_STATE);
        return -1;
    }
    la_sched_t *s = la_sched_use(sh);
    if (!s) return -1;
    int os = 0;
    int rc = la_stall_set(s, ms, &os);
    la_sched_put(s);
    if (rc) {
        la_set_error_os(rc, os);
        return -1;
    }
    return 0;
}
