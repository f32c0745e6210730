/* async_fiber_cancel: the cancelled fiber's parked call (each kind of wait)
 * fails with ASYNC_E_CANCELLED, and so does each later call that has to
 * wait, while calls that complete at once still do; other fibers are not
 * touched; async_fiber_blocking runs to its end; a shield defers the cancel
 * (not a shutdown); a hand-off racing the cancel is either delivered or
 * stays with the sender; cancels racing wake-ups, exits, joins, migration
 * between 16 workers and the scheduler's destroy neither crash nor lose a
 * fiber; a cancel racing a cond signal, a joined fiber's exit or a
 * socket's data loses neither the signal, the handle nor a byte; a
 * cancelled read of data already there returns it; a cancel
 * reaches a returned fiber's key destructors; a fiber's cancel, shield and
 * deadline never pass to the fibers spawned after it. */
#include <pthread.h>
#include <stdatomic.h>
#if !defined(_WIN32)
#include <sys/socket.h>
#endif

#include "fibers.h"

static void long_sleeper(void *arg) {
    (void)arg;
    async_fiber_sleep(3600 * 1000);
}

#if !defined(_WIN32) /* pipes, socketpair */
enum { C_SLEEP, C_RECV, C_SEND, C_SELECT, C_WAITFD, C_READ, C_WRITE, C_ACCEPT, C_JOIN, C_QDEQ, C_LOCK, C_COND, C_NKINDS };
static const char *kind_names[C_NKINDS] = {"sleep", "recv",   "send", "select",        "wait_fd", "read",
                                           "write", "accept", "join", "queue_dequeue", "lock",    "cond_wait"};

static struct {
    async_chan_t *empty, *full, *seven;
    int pipe_r, pipe2_r, sock_w, lfd;
    async_fiber_t *sleeper;
    async_queue_t *qempty;
    async_mutex_t *held, *cm;
    async_cond_t *cv;
} cw;

typedef struct {
    int kind;
    atomic_int returned;
    int rc, err, later_err, later_recv;
} cx_t;

/* The wait of kind; *err: the error of a cond wait (the others leave it to
 * the caller). */
static int wait_one(int kind, int *err) {
    int v = 0;
    char buf[64];
    switch (kind) {
    case C_SLEEP: return async_fiber_sleep(3600 * 1000);
    case C_RECV: return async_chan_recv(cw.empty, &v, -1);
    case C_SEND: return async_chan_send(cw.full, &v, -1);
    case C_SELECT: {
        async_chan_op_t ops[2] = {{cw.empty, ASYNC_CHAN_RECV, &v, 0}, {cw.full, ASYNC_CHAN_SEND, &v, 0}};
        return async_chan_select(ops, 2, -1);
    }
    case C_WAITFD: return async_fiber_wait_fd(cw.pipe2_r, ASYNC_EVENT_READ, -1);
    case C_READ: return (int)async_fiber_read(cw.pipe_r, buf, sizeof buf, -1);
    case C_WRITE: {
        static char big[1 << 20];
        return (int)async_fiber_write(cw.sock_w, big, sizeof big, -1);
    }
    case C_ACCEPT: return async_fiber_accept(cw.lfd, NULL, NULL, -1);
    case C_JOIN: return async_fiber_join(cw.sleeper, -1);
    case C_QDEQ: return async_queue_dequeue_wait(cw.qempty, &v, sizeof v, NULL, -1) ? 0 : -1;
    case C_LOCK: return async_mutex_lock(cw.held, -1);
    default: {
        CHECK_EQ(async_mutex_lock(cw.cm, -1), 0);
        int rc = async_cond_wait(cw.cv, cw.cm, -1);
        *err = async_last_error();
        CHECK_EQ(async_mutex_unlock(cw.cm), 0); /* the wait took the mutex back */
        return rc;
    }
    }
}

static void cx_waiter(void *arg) {
    cx_t *x = arg;
    int cerr = 0;
    x->rc = wait_one(x->kind, &cerr);
    x->err = x->kind == C_COND ? cerr : async_last_error();
    /* a later park fails at once; a call that completes at once works */
    CHECK_FAIL(async_fiber_sleep(1000) == -1, ASYNC_E_CANCELLED);
    x->later_err = async_last_error();
    int v = 0;
    x->later_recv = async_chan_recv(cw.seven, &v, -1) == 0 && v == 7;
    CHECK_EQ(async_chan_send(cw.seven, &v, 0), 0);
    CHECK_EQ(async_fiber_cancelled(), 1);
    atomic_fetch_add(&x->returned, 1);
}

static void blocking_nap(void *arg) {
    sleep_ms(200);
    atomic_store((atomic_int *)arg, 1);
}

static atomic_int bl_done, bl_rc, bl_after;
static void cx_blocking(void *arg) {
    (void)arg;
    atomic_store(&bl_rc, async_fiber_blocking(blocking_nap, &bl_done));
    atomic_store(&bl_after, async_fiber_sleep(1000) == -1 && async_last_error() == ASYNC_E_CANCELLED);
}

static atomic_int bystander_ok;
static void bystander(void *arg) {
    (void)arg;
    atomic_store(&bystander_ok, async_fiber_sleep(300) == 0 && !async_fiber_cancelled());
}

/* One fiber parked in each kind of wait, one in a blocking call: each
 * cancel ends exactly its fiber's wait; a fiber nobody cancelled sleeps on. */
CASE(cancel_each_wait) { // uring valgrind
    async_sched_t *s = sched_new(2);
    cw.empty = async_chan_create(1, sizeof(int));
    cw.full = async_chan_create(1, sizeof(int));
    cw.seven = async_chan_create(1, sizeof(int));
    int seven = 7;
    CHECK_EQ(async_chan_send(cw.full, &seven, 0), 0);
    CHECK_EQ(async_chan_send(cw.seven, &seven, 0), 0);
    int p[2], p2[2], sp[2];
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(pipe(p2), 0);
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
    cw.pipe_r = p[0];
    cw.pipe2_r = p2[0];
    cw.sock_w = sp[0];
    struct sockaddr_in addr;
    cw.lfd = loopback_listener(4, &addr);
    cw.sleeper = async_fiber_spawn(s, long_sleeper, NULL, ASYNC_FIBER_JOINABLE);
    cw.qempty = async_queue_create(1, sizeof(int), 0);
    cw.held = async_mutex_create();
    cw.cm = async_mutex_create();
    cw.cv = async_cond_create();
    CHECK_EQ(async_mutex_lock(cw.held, 0), 0); /* held by this thread */
    cx_t x[C_NKINDS];
    async_fiber_t *f[C_NKINDS];
    memset(x, 0, sizeof x);
    for (int k = 0; k < C_NKINDS; k++) {
        x[k].kind = k;
        CHECK((f[k] = async_fiber_spawn(s, cx_waiter, &x[k], 0)) != NULL);
    }
    async_fiber_t *bf = async_fiber_spawn(s, cx_blocking, NULL, 0);
    CHECK(bf != NULL);
    spawn_until_parked(s, bystander, NULL, C_NKINDS + 3);
    for (int k = 0; k < C_NKINDS; k++) {
        CHECK_EQ(atomic_load(&x[k].returned), 0);
        CHECK_EQ(async_fiber_cancel(f[k]), 0);
        wait_count(&x[k].returned, 1, kind_names[k]);
        if (x[k].rc != -1 || x[k].err != ASYNC_E_CANCELLED)
            fprintf(stderr, "wait %s: rc %d err %d\n", kind_names[k], x[k].rc, x[k].err);
        CHECK_EQ(x[k].rc, -1);
        CHECK_EQ(x[k].err, ASYNC_E_CANCELLED);
        CHECK_EQ(x[k].later_err, ASYNC_E_CANCELLED);
        CHECK_EQ(x[k].later_recv, 1);
        for (int j = k + 1; j < C_NKINDS; j++) CHECK_EQ(atomic_load(&x[j].returned), 0);
    }
    CHECK_EQ(async_fiber_cancel(bf), 0);
    CHECK_EQ(async_fiber_cancel(cw.sleeper), 0);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&bl_done), 1);
    CHECK_EQ(atomic_load(&bl_rc), 0); /* the blocking call ran to its end */
    CHECK_EQ(atomic_load(&bl_after), 1);
    CHECK_EQ(atomic_load(&bystander_ok), 1);
    CHECK_EQ(async_fiber_join(cw.sleeper, 0), 0);
    CHECK_EQ(async_mutex_unlock(cw.held), 0);
    async_sched_destroy(s);
    close_pair(p);
    close_pair(p2);
    close_pair(sp);
    close(cw.lfd);
    async_chan_destroy(cw.empty);
    async_chan_destroy(cw.full);
    async_chan_destroy(cw.seven);
    async_queue_destroy(cw.qempty);
    async_mutex_destroy(cw.held);
    async_mutex_destroy(cw.cm);
    async_cond_destroy(cw.cv);
}
#endif /* !_WIN32 */

static atomic_int go_park, early_state, early_sleep, early_err, early_recv;
static async_chan_t *early_c;

static void runs_then_parks(void *arg) {
    (void)arg;
    while (!atomic_load(&go_park)) async_fiber_yield();
    atomic_store(&early_state, async_fiber_cancelled());
    int v = 0;
    atomic_store(&early_recv, async_chan_recv(early_c, &v, -1) == 0 && v == 5); /* buffered: completes */
    atomic_store(&early_sleep, async_fiber_sleep(0));
    atomic_store(&early_err, async_last_error());
}

/* A cancel that reaches a running fiber: its first park fails, a receive
 * of a buffered element before it still completes. */
CASE(cancel_before_park) { // valgrind
    async_sched_t *s = sched_new(2);
    early_c = async_chan_create(1, sizeof(int));
    int five = 5;
    CHECK_EQ(async_chan_send(early_c, &five, 0), 0);
    async_fiber_t *f = async_fiber_spawn(s, runs_then_parks, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    CHECK_EQ(async_fiber_cancel(f), 0);
    CHECK_EQ(async_fiber_cancel(f), 0); /* idempotent */
    atomic_store(&go_park, 1);
    CHECK_EQ(async_fiber_join(f, BOUND_MS), 0);
    CHECK_EQ(atomic_load(&early_state), 1);
    CHECK_EQ(atomic_load(&early_recv), 1);
    CHECK_EQ(atomic_load(&early_sleep), -1);
    CHECK_EQ(atomic_load(&early_err), ASYNC_E_CANCELLED);
    CHECK_FAIL(async_fiber_cancel(f) == -1, ASYNC_E_BADHANDLE); /* joined */
    CHECK_FAIL(async_fiber_cancel(NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_fiber_cancel((async_fiber_t *)early_c) == -1, ASYNC_E_BADHANDLE);
    CHECK_EQ(async_fiber_cancelled(), 0); /* a plain thread */
    async_chan_destroy(early_c);
    async_sched_destroy(s);
}

/* A returned joinable fiber: cancelling it changes nothing. */
CASE(cancel_returned) {
    async_sched_t *s = sched_new(1);
    async_fiber_t *f = async_fiber_spawn(s, nop_fiber, NULL, ASYNC_FIBER_JOINABLE);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(async_fiber_cancel(f), 0);
    CHECK_EQ(async_fiber_join(f, 0), 0);
    async_sched_destroy(s);
}

static atomic_int sh_in_shield, sh_sleep1, sh_end_bad, sh_sleep2, sh_err2, sh_nested;
static void shielded(void *arg) {
    (void)arg;
    CHECK_FAIL(async_fiber_shield_end() == -1, ASYNC_E_STATE);
    atomic_store(&sh_end_bad, 1);
    CHECK_EQ(async_fiber_shield_begin(), 0);
    CHECK_EQ(async_fiber_shield_begin(), 0);
    atomic_store(&sh_in_shield, 1);
    atomic_store(&sh_sleep1, async_fiber_sleep(300) == 0); /* the cancel arrives meanwhile */
    CHECK_EQ(async_fiber_cancelled(), 1);
    CHECK_EQ(async_fiber_shield_end(), 0);
    atomic_store(&sh_nested, async_fiber_sleep(1) == 0); /* still shielded (nested) */
    CHECK_EQ(async_fiber_shield_end(), 0);
    atomic_store(&sh_sleep2, async_fiber_sleep(1000));
    atomic_store(&sh_err2, async_last_error());
}

/* A shield keeps a cancel out of its parks (nested), the first park after
 * the last shield_end fails. */
CASE(shield_defers_cancel) { // valgrind
    async_sched_t *s = sched_new(2);
    async_fiber_t *f = async_fiber_spawn(s, shielded, NULL, 0);
    CHECK(f != NULL);
    wait_count(&sh_in_shield, 1, "shield begun");
    sched_wait_parked(s, 1);
    CHECK_EQ(async_fiber_cancel(f), 0);
    CHECK_EQ(async_sched_run(s), 0);
    CHECK_EQ(atomic_load(&sh_end_bad), 1);
    CHECK_EQ(atomic_load(&sh_sleep1), 1);
    CHECK_EQ(atomic_load(&sh_nested), 1);
    CHECK_EQ(atomic_load(&sh_sleep2), -1);
    CHECK_EQ(atomic_load(&sh_err2), ASYNC_E_CANCELLED);
    CHECK_FAIL(async_fiber_shield_begin() == -1, ASYNC_E_STATE); /* a plain thread */
    CHECK_FAIL(async_fiber_shield_end() == -1, ASYNC_E_STATE);
    async_sched_destroy(s);
}

static atomic_int sd_shield_rc, sd_shield_err;
static void shielded_sleeper(void *arg) {
    (void)arg;
    CHECK_EQ(async_fiber_shield_begin(), 0);
    atomic_store(&sd_shield_rc, async_fiber_sleep(3600 * 1000));
    atomic_store(&sd_shield_err, async_last_error());
    CHECK_EQ(async_fiber_shield_end(), 0);
}

/* A shield does not hold a scheduler shutdown off. */
CASE(shield_not_against_shutdown) {
    async_sched_t *s = sched_new(2);
    spawn_until_parked(s, shielded_sleeper, NULL, 1);
    CHECK_EQ(async_sched_shutdown(s, BOUND_MS), 0);
    CHECK_EQ(atomic_load(&sd_shield_rc), -1);
    CHECK_EQ(atomic_load(&sd_shield_err), ASYNC_E_CANCELLED);
    async_sched_destroy(s);
}

/* ---- races ---------------------------------------------------------------- */

#define HANDOFFS 400
static async_chan_t *ho_c;
static atomic_int ho_got, ho_cancelled, ho_done;

static void ho_receiver(void *arg) {
    (void)arg;
    long v;
    int rc = async_chan_recv(ho_c, &v, BOUND_MS);
    if (rc == 0)
        atomic_fetch_add(&ho_got, 1);
    else if (async_last_error() == ASYNC_E_CANCELLED)
        atomic_fetch_add(&ho_cancelled, 1);
    atomic_fetch_add(&ho_done, 1);
}

static atomic_int ho_sent;
static atomic_int ho_turn;
static void *ho_sender(void *arg) {
    (void)arg;
    for (int i = 0; i < HANDOFFS; i++) {
        while (atomic_load(&ho_turn) != 2 * i + 1) {
        }
        long v = i;
        if (async_chan_send(ho_c, &v, 2) == 0) atomic_fetch_add(&ho_sent, 1);
        atomic_store(&ho_turn, 2 * i + 2);
    }
    return NULL;
}

/* A rendezvous hand-off from a thread racing a cancel of the receiving
 * fiber, 400 times on 16 workers: each element is either received (the
 * send succeeded) or stays with the sender (its send failed). */
CASE(cancel_races_handoff) { // uring adversarial timeout=120
    async_sched_t *s = sched_new(16);
    ho_c = async_chan_create(0, sizeof(long));
    pthread_t th;
    start_thread(&th, ho_sender, NULL);
    for (int i = 0; i < HANDOFFS; i++) {
        async_fiber_t *f = async_fiber_spawn(s, ho_receiver, NULL, 0);
        CHECK(f != NULL);
        if (i % 3) sched_wait_parked(s, 1);
        atomic_store(&ho_turn, 2 * i + 1);
        async_fiber_cancel(f); /* 0, or BADHANDLE when it already returned */
        while (atomic_load(&ho_turn) != 2 * i + 2) {
        }
        wait_count(&ho_done, i + 1, "receiver returned");
    }
    join_within(th, BOUND_MS, "sender");
    CHECK_EQ(atomic_load(&ho_got), atomic_load(&ho_sent));
    CHECK_EQ(atomic_load(&ho_got) + atomic_load(&ho_cancelled), HANDOFFS);
    printf("received %d, cancelled %d\n", atomic_load(&ho_got), atomic_load(&ho_cancelled));
    long v;
    CHECK_FAIL(async_chan_try_recv(ho_c, &v) == -1, ASYNC_E_EMPTY);
    async_chan_destroy(ho_c);
    async_sched_destroy(s);
}

#define MOVERS 64
static atomic_int mv_cancelled, mv_other;
static async_fiber_t *mv_f[MOVERS];

/* Sleeps, yields and parks on a channel until a park fails: that failure
 * must be the cancel. */
static void mover(void *arg) {
    async_chan_t *c = arg;
    for (unsigned i = 0;; i++) {
        int rc;
        if (i % 3 == 0)
            rc = async_fiber_sleep(i % 2);
        else if (i % 3 == 1)
            rc = async_chan_recv(c, NULL, 1) == 0 || async_last_error() == ASYNC_E_TIMEDOUT ? 0 : -1;
        else {
            async_fiber_yield();
            rc = 0;
        }
        if (rc != 0) {
            atomic_fetch_add(async_last_error() == ASYNC_E_CANCELLED ? &mv_cancelled : &mv_other, 1);
            return;
        }
    }
}

static void *mv_canceller(void *arg) {
    int half = *(int *)arg;
    for (int i = half; i < MOVERS; i += 2) {
        sleep_ms(i % 3);
        CHECK_EQ(async_fiber_cancel(mv_f[i]), 0);
    }
    return NULL;
}

/* 64 fibers moving between 16 workers (sleeps, timed receives, yields),
 * cancelled by two threads: each ends with exactly its cancel. */
CASE(cancel_races_migration) { // uring adversarial timeout=120
    async_sched_t *s = sched_new(16);
    async_chan_t *c = async_chan_create(1, sizeof(int));
    for (int i = 0; i < MOVERS; i++) CHECK((mv_f[i] = async_fiber_spawn(s, mover, c, ASYNC_FIBER_JOINABLE)) != NULL);
    pthread_t t[2];
    int halves[2] = {0, 1};
    for (int i = 0; i < 2; i++) start_thread(&t[i], mv_canceller, &halves[i]);
    for (int i = 0; i < 2; i++) join_within(t[i], BOUND_MS, "canceller");
    for (int i = 0; i < MOVERS; i++) CHECK_EQ(async_fiber_join(mv_f[i], BOUND_MS), 0);
    CHECK_EQ(atomic_load(&mv_cancelled), MOVERS);
    CHECK_EQ(atomic_load(&mv_other), 0);
    async_chan_destroy(c);
    async_sched_destroy(s);
}

#define EXITERS 4000
static _Atomic(async_fiber_t *) ex_f[EXITERS];
static atomic_int ex_published, ex_bad;

static void short_life(void *arg) {
    if ((uintptr_t)arg % 2) async_fiber_sleep(0);
    else async_fiber_yield();
}

static void *ex_canceller(void *arg) {
    (void)arg;
    for (int i = 0; i < EXITERS; i++) {
        while (atomic_load(&ex_published) <= i) {
        }
        if (async_fiber_cancel(ex_f[i]) != 0 && async_last_error() != ASYNC_E_BADHANDLE) atomic_fetch_add(&ex_bad, 1);
    }
    return NULL;
}

/* Cancels racing the fibers' exits and joins (joinable and detached, the
 * detached records reused by later spawns): 0 or BADHANDLE, never another
 * fiber's cancel, never a crash. */
CASE(cancel_races_exit_join) { // adversarial timeout=120
    async_sched_t *s = sched_new(16);
    pthread_t th;
    start_thread(&th, ex_canceller, NULL);
    for (int i = 0; i < EXITERS; i++) {
        ex_f[i] = async_fiber_spawn(s, short_life, (void *)(uintptr_t)i, i % 2 ? ASYNC_FIBER_JOINABLE : 0);
        CHECK(ex_f[i] != NULL);
        atomic_store(&ex_published, i + 1);
        if (i % 2) CHECK_EQ(async_fiber_join(ex_f[i], BOUND_MS), 0);
    }
    join_within(th, BOUND_MS, "canceller");
    CHECK_EQ(atomic_load(&ex_bad), 0);
    CHECK_EQ(async_sched_run(s), 0);
    async_sched_destroy(s);
}

static atomic_int dr_stop;
static _Atomic(async_fiber_t *) dr_f[256];
static void *dr_canceller(void *arg) {
    (void)arg;
    while (!atomic_load(&dr_stop))
        for (int i = 0; i < 256; i++) {
            int rc = async_fiber_cancel(dr_f[i]);
            CHECK(rc == 0 || async_last_error() == ASYNC_E_BADHANDLE);
        }
    return NULL;
}

/* Cancels of parked and joinable fibers racing async_sched_destroy: each
 * 0 or BADHANDLE, never a crash (ASan). */
CASE(cancel_races_destroy) { // adversarial timeout=120
    for (int round = 0; round < 20; round++) {
        async_sched_t *s = sched_new(4);
        for (int i = 0; i < 256; i++) {
            dr_f[i] = async_fiber_spawn(s, i % 2 ? long_sleeper : nop_fiber, NULL, i % 4 < 2 ? ASYNC_FIBER_JOINABLE : 0);
            CHECK(dr_f[i] != NULL);
        }
        atomic_store(&dr_stop, 0);
        pthread_t th;
        start_thread(&th, dr_canceller, NULL);
        sleep_ms(round % 3);
        async_sched_destroy(s);
        atomic_store(&dr_stop, 1);
        join_within(th, BOUND_MS, "canceller");
        for (int i = 0; i < 256; i++) CHECK_FAIL(async_fiber_cancel(dr_f[i]) == -1, ASYNC_E_BADHANDLE);
    }
}

#define BL_FIBERS 8
static atomic_int bl_stop, bl_early, bl_rounds;
static _Atomic(async_fiber_t *) bl_f[BL_FIBERS];

typedef struct {
    volatile int step; /* written by the blocking function, on the fiber's stack */
} bl_job_t;

static void bl_job(void *arg) {
    bl_job_t *j = arg;
    for (int i = 0; i < 50; i++) j->step = i + 1;
    spin_us(20);
    j->step = 100;
}

/* A park that a wake-up or a cancel ends, then a blocking call: the
 * blocking function ran to its end when the call returns. */
static void bl_fiber(void *arg) {
    async_chan_recv((async_chan_t *)arg, NULL, 2);
    bl_job_t j = {0};
    if (async_fiber_blocking(bl_job, &j) == 0 && j.step != 100) atomic_fetch_add(&bl_early, 1);
    atomic_fetch_add(&bl_rounds, 1);
}

static void *bl_waker(void *arg) {
    async_chan_t *c = arg;
    int v = 0;
    while (!atomic_load(&bl_stop)) {
        async_chan_try_send(c, &v);
        for (int i = 0; i < BL_FIBERS; i++) async_fiber_cancel(bl_f[i]);
    }
    return NULL;
}

/* Cancels racing wake-ups of fibers whose next park is a blocking call,
 * 300 rounds of 8 fresh fibers: a cancel aimed at the first park never
 * ends the blocking one (its function would still use the fiber's
 * stack). */
CASE(cancel_races_blocking) { // adversarial timeout=120
    async_sched_t *s = sched_new(16);
    async_chan_t *c = async_chan_create(4, sizeof(int));
    pthread_t th;
    start_thread(&th, bl_waker, c);
    for (int r = 0; r < 300; r++) {
        async_fiber_t *f[BL_FIBERS];
        for (int i = 0; i < BL_FIBERS; i++) {
            CHECK((f[i] = async_fiber_spawn(s, bl_fiber, c, ASYNC_FIBER_JOINABLE)) != NULL);
            bl_f[i] = f[i];
        }
        for (int i = 0; i < BL_FIBERS; i++) CHECK_EQ(async_fiber_join(f[i], BOUND_MS), 0);
    }
    atomic_store(&bl_stop, 1);
    join_within(th, BOUND_MS, "waker");
    CHECK_EQ(atomic_load(&bl_rounds), 300 * BL_FIBERS);
    CHECK_EQ(atomic_load(&bl_early), 0);
    async_chan_destroy(c);
    async_sched_destroy(s);
}

/* A fiber whose function returned still runs its fiber-local destructors
 * as itself: a cancel that arrives while a destructor parks returns 0 and
 * ends that park with ASYNC_E_CANCELLED; once the fiber is joined its
 * handle is gone (ASYNC_E_BADHANDLE). */
static async_fiber_key_t kd_key;
static atomic_int kd_in_dtor, kd_dtor_rc = 99;
static void kd_dtor(void *v) {
    (void)v;
    atomic_store(&kd_in_dtor, 1);
    int rc = async_fiber_sleep(3600 * 1000);
    atomic_store(&kd_dtor_rc, rc == 0 ? 0 : async_last_error());
}
static void kd_sets_key(void *arg) {
    (void)arg;
    CHECK_EQ(async_fiber_setspecific(kd_key, (void *)1), 0);
}

CASE(cancel_reaches_key_destructors) { // adversarial
    async_sched_t *s = sched_new(2);
    CHECK_EQ(async_fiber_key_create(&kd_key, kd_dtor), 0);
    async_fiber_t *f = async_fiber_spawn(s, kd_sets_key, NULL, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    wait_count(&kd_in_dtor, 1, "destructor");
    sched_wait_parked(s, 1);
    CHECK_EQ(async_fiber_cancel(f), 0);
    CHECK_EQ(async_fiber_join(f, BOUND_MS), 0);
    CHECK_EQ(atomic_load(&kd_dtor_rc), ASYNC_E_CANCELLED);
    CHECK_EQ(async_fiber_cancel(f), -1);
    CHECK_ERR(ASYNC_E_BADHANDLE);
    CHECK_EQ(async_fiber_key_delete(kd_key), 0);
    sched_finish(s, BOUND_MS);
}

/* A cond signal and a cancel of its oldest waiter at the same moment, 400
 * rounds: when the cancelled wait fails, the signal wakes the next waiter
 * instead of being lost. */
static async_mutex_t *cs_m;
static async_cond_t *cs_cv;
static atomic_int cs_parked;
typedef struct {
    int timeout_ms, rc, err;
} cs_wait_t;
static void cs_waiter(void *arg) {
    cs_wait_t *w = arg;
    CHECK_EQ(async_mutex_lock(cs_m, -1), 0);
    atomic_fetch_add(&cs_parked, 1);
    w->rc = async_cond_wait(cs_cv, cs_m, w->timeout_ms);
    w->err = async_last_error();
    CHECK_EQ(async_mutex_unlock(cs_m), 0);
}

/* Returns once n waiters are queued on cs_cv: a waiter counts itself while it
 * holds cs_m, and cond_wait releases cs_m only after it queued the waiter,
 * so holding cs_m with the count at n means all n are queued. */
static void wait_queued_on_cond(int n) {
    double t0 = now_ms();
    for (;;) {
        CHECK_EQ(async_mutex_lock(cs_m, -1), 0);
        int k = atomic_load(&cs_parked);
        CHECK_EQ(async_mutex_unlock(cs_m), 0);
        if (k >= n) return;
        CHECK(now_ms() - t0 < BOUND_MS);
        sleep_ms(1);
    }
}

CASE(cancel_never_swallows_cond_signal) { // adversarial timeout=120
    async_sched_t *s = sched_new(4);
    cs_m = async_mutex_create();
    int cancelled = 0;
    for (int r = 0; r < 400; r++) {
        cs_cv = async_cond_create();
        atomic_store(&cs_parked, 0);
        cs_wait_t w1 = {-1, 9, 0}, w2 = {BOUND_MS, 9, 0};
        async_fiber_t *f1 = async_fiber_spawn(s, cs_waiter, &w1, ASYNC_FIBER_JOINABLE);
        wait_queued_on_cond(1);
        async_fiber_t *f2 = async_fiber_spawn(s, cs_waiter, &w2, ASYNC_FIBER_JOINABLE);
        wait_queued_on_cond(2);
        sched_wait_parked(s, 2);
        if (r % 2) {
            CHECK_EQ(async_cond_signal(cs_cv), 0);
            CHECK_EQ(async_fiber_cancel(f1), 0);
        } else {
            CHECK_EQ(async_fiber_cancel(f1), 0);
            CHECK_EQ(async_cond_signal(cs_cv), 0);
        }
        CHECK_EQ(async_fiber_join(f1, BOUND_MS), 0);
        if (w1.rc == 0)
            CHECK_EQ(async_cond_signal(cs_cv), 0); /* the first took it: wake the second */
        else {
            CHECK_EQ(w1.err, ASYNC_E_CANCELLED);
            cancelled++;
        }
        CHECK_EQ(async_fiber_join(f2, BOUND_MS), 0);
        CHECK_EQ(w2.rc, 0); /* woken by a signal, not by its timeout */
        async_cond_destroy(cs_cv);
    }
    CHECK(cancelled > 0);
    async_mutex_destroy(cs_m);
    sched_finish(s, BOUND_MS);
}

/* A fiber waiting in async_fiber_join is cancelled while its target
 * returns, 2000 rounds: a join that succeeded freed the handle (a second
 * join is ASYNC_E_BADHANDLE); one that failed with ASYNC_E_CANCELLED left
 * it valid (a second join succeeds). */
typedef struct {
    async_fiber_t *target;
    int rc, err;
} jr_t;
static void jr_joiner(void *arg) {
    jr_t *j = arg;
    j->rc = async_fiber_join(j->target, -1);
    j->err = async_last_error();
}
static void jr_naps(void *arg) {
    (void)arg;
    async_fiber_sleep(1);
}

CASE(cancel_of_joiner_races_target_exit) { // adversarial timeout=120
    async_sched_t *s = sched_new(4);
    int joined = 0, cancelled = 0;
    for (int r = 0; r < 2000; r++) {
        jr_t j = {async_fiber_spawn(s, r % 2 ? jr_naps : nop_fiber, NULL, ASYNC_FIBER_JOINABLE), 9, 0};
        CHECK(j.target != NULL);
        async_fiber_t *jf = async_fiber_spawn(s, jr_joiner, &j, ASYNC_FIBER_JOINABLE);
        CHECK(jf != NULL);
        spin_us((r * 131) % 400);
        CHECK_EQ(async_fiber_cancel(jf), 0);
        CHECK_EQ(async_fiber_join(jf, BOUND_MS), 0);
        if (j.rc == 0) {
            joined++;
            CHECK_EQ(async_fiber_join(j.target, 0), -1);
            CHECK_ERR(ASYNC_E_BADHANDLE);
        } else {
            cancelled++;
            CHECK_EQ(j.err, ASYNC_E_CANCELLED);
            CHECK_EQ(async_fiber_join(j.target, BOUND_MS), 0);
        }
    }
    CHECK_EQ(joined + cancelled, 2000);
    sched_finish(s, BOUND_MS);
}

#if !defined(_WIN32) /* socketpair */
/* A fiber's socket read cancelled while data arrives, 400 rounds, both I/O
 * paths: the read either returns the bytes or fails with ASYNC_E_CANCELLED
 * and leaves them in the socket. */
static int sd_sp[2];
static atomic_int sd_started;
typedef struct {
    ssize_t n;
    int err;
} sd_t;
static void sd_reader(void *arg) {
    sd_t *d = arg;
    char buf[64];
    atomic_store(&sd_started, 1);
    d->n = async_fiber_read(sd_sp[0], buf, sizeof buf, -1);
    d->err = async_last_error();
}

CASE(cancel_races_socket_data) { // uring adversarial timeout=120
    async_sched_t *s = sched_new(2);
    for (int r = 0; r < 400; r++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sd_sp), 0);
        sd_t d = {99, 0};
        atomic_store(&sd_started, 0);
        async_fiber_t *f = async_fiber_spawn(s, sd_reader, &d, ASYNC_FIBER_JOINABLE);
        CHECK(f != NULL);
        wait_count(&sd_started, 1, "reader");
        spin_us((r * 37) % 300);
        if (r % 2) {
            CHECK_EQ(write(sd_sp[1], "abc", 3), 3);
            CHECK_EQ(async_fiber_cancel(f), 0);
        } else {
            CHECK_EQ(async_fiber_cancel(f), 0);
            CHECK_EQ(write(sd_sp[1], "abc", 3), 3);
        }
        CHECK_EQ(async_fiber_join(f, BOUND_MS), 0);
        if (d.n != 3) {
            CHECK_EQ(d.n, -1);
            CHECK_EQ(d.err, ASYNC_E_CANCELLED);
            char b[8];
            CHECK_EQ(recv(sd_sp[0], b, sizeof b, MSG_DONTWAIT), 3);
        }
        close_pair(sd_sp);
    }
    sched_finish(s, BOUND_MS);
}

/* A cancelled fiber's socket read that finds data still returns it, also
 * after a short read (a read that drained the stream waits first next
 * time, and that wait cannot happen). */
static void cancelled_reads(void *arg) {
    int *sv = arg;
    char buf[8];
    CHECK_FAIL(async_fiber_read(sv[0], buf, sizeof buf, 20) == -1, ASYNC_E_TIMEDOUT);
    CHECK_EQ(write(sv[1], "ab", 2), 2);
    CHECK_EQ(async_fiber_read(sv[0], buf, sizeof buf, BOUND_MS), 2);
    CHECK_EQ(async_fiber_cancel(async_fiber_current()), 0);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(write(sv[1], "ab", 2), 2);
        CHECK_EQ(async_fiber_read(sv[0], buf, sizeof buf, BOUND_MS), 2);
    }
    CHECK_FAIL(async_fiber_read(sv[0], buf, sizeof buf, BOUND_MS) == -1, ASYNC_E_CANCELLED);
}

CASE(cancelled_read_takes_data_there) { // uring adversarial
    async_sched_t *s = sched_new(2);
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    async_fiber_t *f = async_fiber_spawn(s, cancelled_reads, sv, ASYNC_FIBER_JOINABLE);
    CHECK(f != NULL);
    CHECK_EQ(async_fiber_join(f, BOUND_MS), 0);
    close_pair(sv);
    sched_finish(s, BOUND_MS);
}
#endif /* !_WIN32 */

/* Fibers that return shielded (1 to 5 deep), with a deadline and, half of
 * them, cancelled, leave nothing to the fibers spawned after them: those
 * start uncancelled, with no deadline and no shield, and a cancel ends
 * their park. */
static atomic_int ni_bad, ni_parked;
static void ni_leaves_state(void *arg) {
    int k = (int)(intptr_t)arg;
    for (int i = 0; i < 1 + k % 5; i++) CHECK_EQ(async_fiber_shield_begin(), 0);
    CHECK_EQ(async_fiber_set_deadline(k % 3), 0);
    if (k % 2) CHECK_EQ(async_fiber_cancel(async_fiber_current()), 0);
}
static void ni_fresh(void *arg) {
    (void)arg;
    if (async_fiber_cancelled()) atomic_fetch_add(&ni_bad, 1);
    if (async_fiber_sleep(3) != 0) atomic_fetch_add(&ni_bad, 1);
    if (async_fiber_shield_end() != -1 || async_last_error() != ASYNC_E_STATE) atomic_fetch_add(&ni_bad, 1);
    atomic_fetch_add(&ni_parked, 1);
    if (async_fiber_sleep(3600 * 1000) == 0 || async_last_error() != ASYNC_E_CANCELLED) atomic_fetch_add(&ni_bad, 1);
}

CASE(new_fibers_inherit_no_cancel_state) { // adversarial timeout=120
    enum { N = 50 };
    async_sched_t *s = sched_new(2);
    for (int r = 0; r < 20; r++) {
        async_fiber_t *f[N];
        for (int k = 0; k < N; k++)
            CHECK((f[k] = async_fiber_spawn(s, ni_leaves_state, (void *)(intptr_t)k, ASYNC_FIBER_JOINABLE)) != NULL);
        for (int k = 0; k < N; k++) CHECK_EQ(async_fiber_join(f[k], BOUND_MS), 0);
        atomic_store(&ni_parked, 0);
        for (int k = 0; k < N; k++)
            CHECK((f[k] = async_fiber_spawn(s, ni_fresh, NULL, ASYNC_FIBER_JOINABLE)) != NULL);
        wait_count(&ni_parked, N, "fresh fibers");
        sched_wait_parked(s, N);
        for (int k = 0; k < N; k++) CHECK_EQ(async_fiber_cancel(f[k]), 0);
        for (int k = 0; k < N; k++) CHECK_EQ(async_fiber_join(f[k], BOUND_MS), 0);
    }
    CHECK_EQ(atomic_load(&ni_bad), 0);
    sched_finish(s, BOUND_MS);
}

TEST_MAIN()
