/* Timeouts of the fiber I/O calls: INT_MAX waits, 1 ms timeouts racing
 * readiness (every byte read exactly once; a cancelled receive or accept
 * takes nothing and never writes into a stack given back), a timeout that
 * bounds a whole write while the peer trickles, and signals raining on a
 * waiting thread (the timeout neither ends early nor restarts). Every wait
 * is bounded. */
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>

#include "check.h"
#include "net.h"

/* ---- huge timeouts ------------------------------------------------------------ */

static int ht_fd;

static void ht_body(void *arg) {
    (void)arg;
    char b[4];
    CHECK_EQ(async_fiber_read(ht_fd, b, 1, INT_MAX), 1);
    CHECK(async_fiber_wait_fd(ht_fd, ASYNC_EVENT_READ, INT_MAX) & ASYNC_EVENT_READ);
    CHECK_EQ(async_fiber_read(ht_fd, b, 1, INT_MAX - 1), 1);
}

static void *ht_feeder(void *arg) {
    int w = (int)(intptr_t)arg;
    sleep_ms(100);
    CHECK_EQ(write(w, "a", 1), 1);
    sleep_ms(100);
    CHECK_EQ(write(w, "b", 1), 1);
    return NULL;
}

/* timeout_ms INT_MAX (and INT_MAX - 1) waits, it does not time out at once
 * (a deadline that overflowed would), on sockets (ring path) and pipes. */
CASE(huge_timeout) { // uring adversarial
    async_sched_t *s = sched_new(2);
    for (int k = 0; k < 2; k++) {
        int a[2];
        if (k == 0)
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a), 0);
        else
            CHECK_EQ(pipe2(a, O_CLOEXEC), 0);
        ht_fd = a[0];
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, ht_feeder, (void *)(intptr_t)a[1]), 0);
        on_fiber(s, ht_body, NULL);
        pthread_join(th, NULL);
        close_pair(a);
    }
    async_sched_destroy(s);
}

/* Fills socket and pipe buffers. */
static char bigbuf[8 << 20];

/* ---- tiny timeouts: a cancelled receive or accept loses nothing --------------------------- */

#define TT_BYTES 60000

static void *tt_feed(void *arg) {
    int w = (int)(intptr_t)arg;
    unsigned char b[997];
    size_t off = 0;
    while (off < TT_BYTES) {
        size_t k = TT_BYTES - off < sizeof b ? TT_BYTES - off : sizeof b;
        for (size_t i = 0; i < k; i++) b[i] = (unsigned char)((off + i) * 7 + ((off + i) >> 8));
        ssize_t r = write(w, b, k);
        CHECK(r > 0);
        off += (size_t)r;
        usleep(1500); /* slower than the reader's 1 ms timeout */
    }
    return NULL;
}

static atomic_int tt_timeouts;

static void tt_reader(void *arg) {
    int fd = (int)(intptr_t)arg;
    unsigned char b[1500];
    size_t got = 0;
    while (got < TT_BYTES) {
        ssize_t r = async_fiber_read(fd, b, sizeof b, 1);
        if (r < 0) {
            CHECK_ERR(ASYNC_E_TIMEDOUT);
            atomic_fetch_add(&tt_timeouts, 1);
            continue;
        }
        CHECK(r > 0);
        for (ssize_t i = 0; i < r; i++) {
            size_t o = got + (size_t)i;
            if (b[i] != (unsigned char)(o * 7 + (o >> 8))) {
                fprintf(stderr, "byte %zu wrong (a cancelled receive lost data)\n", o);
                CHECK(0);
            }
        }
        got += (size_t)r;
    }
}

CASE(tiny_timeout_read) { // uring adversarial
    async_sched_t *s = sched_new(2);
    int sp[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, tt_feed, (void *)(intptr_t)sp[1]), 0);
    on_fiber(s, tt_reader, (void *)(intptr_t)sp[0]);
    pthread_join(th, NULL);
    printf("timeouts: %d\n", atomic_load(&tt_timeouts));
    close_pair(sp);
    async_sched_destroy(s);
}

#define TA_CONNS 300

static struct sockaddr_in ta_sa;

static void *ta_clients(void *arg) {
    int *cfds = arg;
    for (int i = 0; i < TA_CONNS; i++) {
        int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(c >= 0);
        CHECK_EQ(connect(c, (struct sockaddr *)&ta_sa, sizeof ta_sa), 0);
        cfds[i] = c;
        if (i % 3 == 0) usleep(300);
    }
    return NULL;
}

static atomic_int ta_accepted;

static void ta_acceptor(void *arg) {
    int l = (int)(intptr_t)arg;
    double t0 = now_ms();
    while (atomic_load(&ta_accepted) < TA_CONNS) {
        int a = async_fiber_accept(l, NULL, NULL, 1);
        if (a < 0) {
            CHECK_ERR(ASYNC_E_TIMEDOUT);
            if (now_ms() - t0 > 20000) break;
            continue;
        }
        atomic_fetch_add(&ta_accepted, 1);
        close(a);
    }
}

CASE(tiny_timeout_accept) { // uring adversarial
    async_sched_t *s = sched_new(2);
    int l = loopback_listener(512, &ta_sa);
    static int cfds[TA_CONNS];
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, ta_clients, cfds), 0);
    on_fiber(s, ta_acceptor, (void *)(intptr_t)l);
    pthread_join(th, NULL);
    printf("accepted %d of %d\n", atomic_load(&ta_accepted), TA_CONNS);
    CHECK_EQ(atomic_load(&ta_accepted), TA_CONNS);
    for (int i = 0; i < TA_CONNS; i++) close(cfds[i]);
    close(l);
    async_sched_destroy(s);
}

/* ---- signals (a host handler without SA_RESTART) raining on a waiting thread:
 * the timeout neither ends early nor restarts from the beginning --------------------------------------- */

static void on_usr1(int sig) { (void)sig; }

static atomic_int rain_stop;

typedef struct {
    pthread_t target[3];
    int n;
} rain_t;

static void *rain(void *arg) {
    rain_t *r = arg;
    while (!atomic_load(&rain_stop)) {
        for (int i = 0; i < r->n; i++) pthread_kill(r->target[i], SIGUSR1);
        usleep(2000);
    }
    return NULL;
}

static atomic_int eintr_err[4];

static double eintr_ms[4];

static void *eintr_thread(void *arg) {
    int fd = (int)(intptr_t)arg;
    char b[4];
    double t0 = now_ms();
    ssize_t r = async_fiber_read(fd, b, sizeof b, 300);
    eintr_ms[0] = now_ms() - t0;
    atomic_store(&eintr_err[0], r < 0 ? async_last_error() : 0);
    t0 = now_ms();
    int ev = async_fiber_wait_fd(fd, ASYNC_EVENT_READ, 300);
    eintr_ms[1] = now_ms() - t0;
    atomic_store(&eintr_err[1], ev < 0 ? async_last_error() : 0);
    return NULL;
}

CASE(timeout_under_signal_rain) { // adversarial
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK; /* no SA_RESTART */
    CHECK_EQ(sigaction(SIGUSR1, &sa, NULL), 0);
    int p[2];
    CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    rain_t r = {{0}, 1};
    pthread_t th;
    start_thread(&th, eintr_thread, (void *)(intptr_t)p[0]);
    r.target[0] = th;
    pthread_t rt;
    atomic_store(&rain_stop, 0);
    start_thread(&rt, rain, &r);
    join_within(th, 10000, "a plain thread's read under a rain of signals");
    atomic_store(&rain_stop, 1);
    pthread_join(rt, NULL);
    printf("read %d after %.0f ms, wait_fd %d after %.0f ms\n", atomic_load(&eintr_err[0]), eintr_ms[0],
           atomic_load(&eintr_err[1]), eintr_ms[1]);
    CHECK_EQ(atomic_load(&eintr_err[0]), ASYNC_E_TIMEDOUT);
    CHECK_EQ(atomic_load(&eintr_err[1]), ASYNC_E_TIMEDOUT);
    CHECK(eintr_ms[0] >= 299 && eintr_ms[1] >= 299);
    close_pair(p);
}

/* ---- timeout_ms bounds the whole write, also when the peer trickles ------------------------------------ */

static atomic_int trickle_stop;

/* Reads 512 bytes every 2 ms until told to stop; never blocks (the writer
 * may have given up and the buffer run dry before the stop comes). */
static void *trickler(void *arg) {
    int fd = (int)(intptr_t)arg;
    char b[512];
    CHECK_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
    while (!atomic_load(&trickle_stop)) {
        if (read(fd, b, sizeof b) < 0 && errno != EAGAIN) break;
        usleep(2000);
    }
    return NULL;
}

static double trickle_ms;

static atomic_int trickle_err = -1;

static void trickle_body(void *arg) {
    int fd = (int)(intptr_t)arg;
    double t0 = now_ms();
    ssize_t r = async_fiber_write(fd, bigbuf, 4 << 20, 300);
    trickle_ms = now_ms() - t0;
    atomic_store(&trickle_err, r < 0 ? async_last_error() : 0);
}

CASE(write_trickle) { // uring adversarial
    async_sched_t *s = sched_new(2);
    for (int mode = 0; mode < 2; mode++) {
        int sp[2];
        if (mode == 0) {
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
            int z = 4096;
            setsockopt(sp[0], SOL_SOCKET, SO_SNDBUF, &z, sizeof z);
            setsockopt(sp[1], SOL_SOCKET, SO_RCVBUF, &z, sizeof z);
        } else {
            CHECK_EQ(pipe2(sp, O_CLOEXEC), 0);
            int t = sp[0];
            sp[0] = sp[1];
            sp[1] = t;
        }
        atomic_store(&trickle_stop, 0);
        pthread_t th;
        start_thread(&th, trickler, (void *)(intptr_t)sp[1]);
        on_fiber(s, trickle_body, (void *)(intptr_t)sp[0]);
        atomic_store(&trickle_stop, 1);
        pthread_join(th, NULL);
        printf("mode %d: write -> err %d after %.0f ms\n", mode, atomic_load(&trickle_err), trickle_ms);
        CHECK_EQ(atomic_load(&trickle_err), ASYNC_E_TIMEDOUT);
        CHECK(trickle_ms < 5000); /* 300 ms asked: not restarted at every bit of progress */
        close_pair(sp);
    }
    async_sched_destroy(s);
}

/* ---- timeouts racing readiness: every byte read exactly once ---- */

#define TR_FDS 8

#define TR_BYTES 3000

static int tr_sv[TR_FDS][2];

static atomic_int tr_got[TR_FDS], tr_done;

static unsigned char tr_seen[TR_FDS][TR_BYTES];

static void tr_reader(void *arg)
{
    int i = (int)(intptr_t)arg;
    unsigned char buf[64];
    int total = 0, next = 0, it = 0;
    while (total < TR_BYTES) {
        ssize_t n = async_fiber_read(tr_sv[i][1], buf, (size_t)(1 + it % 37), (it % 3) ? 1 : 0);
        it++;
        if (n < 0) {
            int e = async_last_error();
            CHECK_EQ(e, ASYNC_E_TIMEDOUT);
            async_fiber_yield();
            continue;
        }
        CHECK(n > 0);
        for (ssize_t k = 0; k < n; k++) {
            CHECK_EQ(buf[k], (unsigned char)(next & 0xff));
            next++;
        }
        total += (int)n;
    }
    atomic_store(&tr_got[i], total);
    atomic_fetch_add(&tr_done, 1);
}

static void tr_writer(void *arg)
{
    int i = (int)(intptr_t)arg;
    for (int k = 0; k < TR_BYTES;) {
        unsigned char buf[16];
        int n = 1 + k % 13;
        if (n > TR_BYTES - k)
            n = TR_BYTES - k;
        for (int j = 0; j < n; j++)
            buf[j] = (unsigned char)((k + j) & 0xff);
        CHECK_EQ(async_fiber_write(tr_sv[i][0], buf, (size_t)n, BOUND_MS), n);
        k += n;
        if (k % 5 == 0)
            async_fiber_yield();
    }
    atomic_fetch_add(&tr_done, 1);
}

static void timeout_race(int workers, int kind, int owned)
{
    async_sched_t *s = sched_new(workers);
    atomic_store(&tr_done, 0);
    busy_start(s, workers);
    for (int i = 0; i < TR_FDS; i++) {
        make_pair(kind, tr_sv[i]);
        own_if(s, tr_sv[i][1], owned);
        CHECK(async_fiber_spawn(s, tr_reader, (void *)(intptr_t)i, 0) != NULL);
        CHECK(async_fiber_spawn(s, tr_writer, (void *)(intptr_t)i, 0) != NULL);
    }
    wait_count(&tr_done, 2 * TR_FDS, "timeout race fibers");
    atomic_store(&busy_stop, 1);
    sched_finish(s, BOUND_MS);
    for (int i = 0; i < TR_FDS; i++) {
        CHECK_EQ(atomic_load(&tr_got[i]), TR_BYTES);
        close_pair(tr_sv[i]);
    }
    (void)tr_seen;
}

CASE(timeout_race_tcp) { timeout_race(3, 1, 0); } // uring adversarial

CASE(timeout_race_tcp_owned) { timeout_race(2, 1, 1); } // uring adversarial

CASE(timeout_race_unix_owned) { timeout_race(4, 0, 1); } // uring adversarial

#define LA_TEST_NOINLINE __attribute__((noinline))

/* ---- timeouts lose no data ------------------------------------------------------- */

#define TO_BYTES 20000

typedef struct {
    int fd;
    atomic_int done;
    int got, timeouts, bad;
} tord_t;

static void to_reader(void *arg) {
    tord_t *t = arg;
    unsigned char buf[64];
    while (t->got < TO_BYTES) {
        ssize_t r = async_fiber_read(t->fd, buf, sizeof buf, 1);
        if (r < 0) {
            if (async_last_error() != ASYNC_E_TIMEDOUT) {
                t->bad = 1;
                break;
            }
            t->timeouts++;
            continue;
        }
        if (r == 0) {
            t->bad = 2;
            break;
        }
        for (ssize_t i = 0; i < r; i++)
            if (buf[i] != (unsigned char)(t->got + i)) t->bad = 3;
        t->got += (int)r;
    }
    atomic_store(&t->done, 1);
}

/* A reader with a 1 ms timeout against a writer that trickles bytes: every
 * park races its cancellation against the data; each byte arrives once, in
 * order (a cancelled receive that got data returns it). */
CASE(timeout_read_no_loss) { // linux uring
    async_sched_t *s = sched_new(1);
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    tord_t t = {.fd = sv[0]};
    CHECK(async_fiber_spawn(s, to_reader, &t, 0) != NULL);
    unsigned char b[7];
    int sent = 0;
    while (sent < TO_BYTES) {
        int n = TO_BYTES - sent < 7 ? TO_BYTES - sent : 1 + sent % 7;
        for (int i = 0; i < n; i++) b[i] = (unsigned char)(sent + i);
        CHECK_EQ(write(sv[1], b, (size_t)n), n);
        sent += n;
        if (sent % 97 < 7) {
            struct timespec ts = {0, 900000};
            nanosleep(&ts, NULL);
        }
    }
    wait_count_within(&t.done, 1, 30000, "reader");
    CHECK_EQ(t.bad, 0);
    CHECK_EQ(t.got, TO_BYTES);
    printf("%d timeouts\n", t.timeouts);
    async_sched_destroy(s);
    close_pair(sv);
}

/* ---- a timed-out receive never writes into a stack that was given back ---------- */

typedef struct {
    async_sched_t *s;
    int fd;
    atomic_int step;
    int err;
    int intact;
    ssize_t later;
} reuse_t;

/* Reads into a buffer deep on its stack and times out. */
static LA_TEST_NOINLINE void reuse_first(void *arg) {
    reuse_t *x = arg;
    volatile char pad[8192];
    pad[0] = 1;
    char buf[4096];
    ssize_t r = async_fiber_read(x->fd, buf, sizeof buf, 20);
    x->err = r < 0 ? async_last_error() : -1;
    (void)pad[0];
    atomic_store(&x->step, 1);
}

/* Runs on the stack the first fiber gave back (one worker: its cache hands
 * it out next) and fills the same region; the peer's data must not land in
 * it. */
static LA_TEST_NOINLINE void reuse_second(void *arg) {
    reuse_t *x = arg;
    volatile char area[24576]; /* covers the first fiber's frames */
    for (size_t i = 0; i < sizeof area; i++) area[i] = 0x5a;
    atomic_store(&x->step, 2);
    while (atomic_load(&x->step) != 3) async_fiber_sleep(1);
    async_fiber_sleep(30); /* time for a stray receive to land */
    x->intact = 1;
    for (size_t i = 0; i < sizeof area; i++)
        if (area[i] != 0x5a) x->intact = 0;
    char buf[64];
    x->later = async_fiber_read(x->fd, buf, sizeof buf, 5000);
    atomic_store(&x->step, 4);
}

/* Spawned on the worker, one after the other: the second gets the stack
 * the first gave back (the worker's stack cache is LIFO). */
static void reuse_driver(void *arg) {
    reuse_t *x = arg;
    async_fiber_t *a = async_fiber_spawn(x->s, reuse_first, x, ASYNC_FIBER_JOINABLE);
    CHECK(a != NULL);
    CHECK_EQ(async_fiber_join(a, 30000), 0);
    CHECK(async_fiber_spawn(x->s, reuse_second, x, 0) != NULL);
}

CASE(timeout_read_stack_reuse) { // linux uring
    async_sched_t *s = sched_new(1);
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    reuse_t x = {.fd = sv[0], .s = s};
    CHECK(async_fiber_spawn(s, reuse_driver, &x, 0) != NULL);
    wait_count_within(&x.step, 2, 30000, "second fiber");
    CHECK_EQ(x.err, ASYNC_E_TIMEDOUT);
    char data[64];
    memset(data, 0xee, sizeof data);
    CHECK_EQ(write(sv[1], data, sizeof data), (ssize_t)sizeof data);
    atomic_store(&x.step, 3);
    wait_count_within(&x.step, 4, 30000, "second fiber's read");
    CHECK_EQ(x.intact, 1);
    CHECK_EQ(x.later, (ssize_t)sizeof data); /* the cancelled receive took nothing */
    async_sched_destroy(s);
    close_pair(sv);
}

/* ---- accept: a timed-out accept takes no connection ----------------------------- */

static void acc_fiber(void *arg) {
    io_probe_t *m = arg;
    m->r1 = async_fiber_accept(m->fd, NULL, NULL, 20);
    m->e1 = async_last_error();
    atomic_store(&m->step, 1);
    while (atomic_load(&m->step) != 2) async_fiber_sleep(1);
    m->r2 = async_fiber_accept(m->fd, NULL, NULL, 10000);
    atomic_store(&m->step, 3);
}

CASE(accept_timeout_takes_nothing) { // linux uring
    async_sched_t *s = sched_new(1);
    struct sockaddr_in a;
    int lfd = loopback_listener(1024, &a);
    io_probe_t m;
    memset(&m, 0, sizeof m);
    m.fd = lfd;
    CHECK(async_fiber_spawn(s, acc_fiber, &m, 0) != NULL);
    wait_count_within(&m.step, 1, 30000, "accept timeout");
    CHECK_EQ(m.r1, -1);
    CHECK_EQ(m.e1, ASYNC_E_TIMEDOUT);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK_EQ(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    atomic_store(&m.step, 2);
    wait_count_within(&m.step, 3, 30000, "accept");
    CHECK(m.r2 >= 0);
    close((int)m.r2);
    close(c);
    async_sched_destroy(s);
    close(lfd);
}

TEST_MAIN()
