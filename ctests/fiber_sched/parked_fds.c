/* Fibers parked on fds while the fds change under them: hundreds of fds
 * ready at once (owned and plain), async_fiber_close of parked owned fds
 * during a burst and their numbers reused, plain fds closed with close(2)
 * and their numbers reused (or made owned) while a fiber waits, owned fds of
 * one scheduler closed by another's fibers during a destroy, and reads racing
 * their timeouts (no byte lost, none read twice). Every wait is bounded. */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "fibers.h"

/* ---- hundreds of fds ready at once ----------------------------------------- */

#define FB_N 256
#define FB_ROUNDS 20

static int fb_sv[FB_N][2];
static atomic_int fb_done, fb_exited;

static void fb_fiber(void *arg)
{
    int i = (int)(intptr_t)arg;
    int fd = fb_sv[i][1];
    for (int r = 0;; r++) {
        char b = 0;
        ssize_t n = async_fiber_read(fd, &b, 1, BOUND_MS);
        if (n == 0) break; /* the host shut its side down */
        if (n != 1) fprintf(stderr, "fiber %d round %d: read %zd err %d\n", i, r, n, async_last_error());
        CHECK_EQ(n, 1);
        CHECK_EQ(b, (char)r);
        CHECK_EQ(async_fiber_write(fd, &b, 1, BOUND_MS), 1);
        atomic_fetch_add(&fb_done, 1);
    }
    CHECK_EQ(async_fiber_close(fd), 0);
    atomic_fetch_add(&fb_exited, 1);
}

static void fd_burst(int nw)
{
    raise_nofile(4 * FB_N + 64);
    async_sched_t *s = sched_new(nw);
    atomic_store(&fb_done, 0);
    atomic_store(&fb_exited, 0);
    for (int i = 0; i < FB_N; i++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fb_sv[i]), 0);
        if (i % 2) CHECK_EQ(async_fiber_fd_open(s, fb_sv[i][1]), 0); /* half owned */
        CHECK(async_fiber_spawn(s, fb_fiber, (void *)(intptr_t)i, 0) != NULL);
    }
    for (int r = 0; r < FB_ROUNDS; r++) {
        if (r % 2) usleep(2000); /* asleep in the poller, or not yet */
        char b = (char)r;
        for (int i = 0; i < FB_N; i++) CHECK_EQ(write(fb_sv[i][0], &b, 1), 1);
        wait_count(&fb_done, (r + 1) * FB_N, "fd burst");
        for (int i = 0; i < FB_N; i++) {
            struct pollfd p = {fb_sv[i][0], POLLIN, 0};
            CHECK_EQ(poll(&p, 1, BOUND_MS), 1);
            char c;
            CHECK_EQ(read(fb_sv[i][0], &c, 1), 1);
            CHECK_EQ(c, b);
        }
    }
    for (int i = 0; i < FB_N; i++) CHECK_EQ(shutdown(fb_sv[i][0], SHUT_WR), 0);
    wait_count(&fb_exited, FB_N, "fibers that saw end of file");
    sched_finish(s, BOUND_MS);
    for (int i = 0; i < FB_N; i++) close(fb_sv[i][0]);
}

CASE(fd_burst_1w) { fd_burst(1); } // uring adversarial
CASE(fd_burst_2w) { fd_burst(2); } // uring adversarial

/* ---- async_fiber_close of parked owned fds during a burst; numbers reused ---- */

#define CP_N 128

static int cp_owned[CP_N][2], cp_plain[CP_N][2];
static atomic_int cp_closed, cp_data, cp_other;

static void cp_owned_fiber(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b;
    ssize_t n = async_fiber_read(fd, &b, 1, -1); /* only the close can end it */
    if (n == -1 && async_last_error() == ASYNC_E_CLOSED)
        atomic_fetch_add(&cp_closed, 1);
    else {
        fprintf(stderr, "owned read after async_fiber_close: %zd err %d\n", n, async_last_error());
        atomic_fetch_add(&cp_other, 1);
    }
}

static void cp_plain_fiber(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b;
    ssize_t n = async_fiber_read(fd, &b, 1, BOUND_MS);
    if (n == 1)
        atomic_fetch_add(&cp_data, 1);
    else {
        fprintf(stderr, "plain read: %zd err %d\n", n, async_last_error());
        atomic_fetch_add(&cp_other, 1);
    }
}

static void *cp_closer(void *arg)
{
    (void)arg;
    for (int i = 0; i < CP_N; i++) CHECK_EQ(async_fiber_close(cp_owned[i][1]), 0);
    return NULL;
}

static void *cp_writer(void *arg)
{
    (void)arg;
    for (int i = 0; i < CP_N; i++) CHECK_EQ(write(cp_plain[i][0], "x", 1), 1);
    return NULL;
}

/* The new owner of a reused number: a fiber reads it, the host writes. */
static atomic_int cp_new_got;
static void cp_new_fiber(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b;
    ssize_t n = async_fiber_read(fd, &b, 1, BOUND_MS);
    if (n != 1) fprintf(stderr, "read on the reused number %d: %zd err %d\n", fd, n, async_last_error());
    CHECK_EQ(n, 1);
    atomic_fetch_add(&cp_new_got, 1);
    CHECK_EQ(async_fiber_close(fd), 0);
}

static void close_parked(int nw)
{
    raise_nofile(8 * CP_N + 64);
    async_sched_t *s = sched_new(nw);
    for (int round = 0; round < 5; round++) {
        atomic_store(&cp_closed, 0);
        atomic_store(&cp_data, 0);
        atomic_store(&cp_other, 0);
        atomic_store(&cp_new_got, 0);
        for (int i = 0; i < CP_N; i++) {
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, cp_owned[i]), 0);
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, cp_plain[i]), 0);
            CHECK_EQ(async_fiber_fd_open(s, cp_owned[i][1]), 0);
            CHECK(async_fiber_spawn(s, cp_owned_fiber, (void *)(intptr_t)cp_owned[i][1], 0) != NULL);
            CHECK(async_fiber_spawn(s, cp_plain_fiber, (void *)(intptr_t)cp_plain[i][1], 0) != NULL);
        }
        sched_wait_parked(s, 2 * CP_N);
        pthread_t a, b;
        start_thread(&a, cp_closer, NULL);
        start_thread(&b, cp_writer, NULL);
        join_within(a, BOUND_MS, "closer");
        join_within(b, BOUND_MS, "writer");
        /* the closed numbers come back at once: owned by s again, read by
         * new fibers */
        int nsv[CP_N][2];
        for (int i = 0; i < CP_N; i++) {
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, nsv[i]), 0);
            if (round % 2 == 0) CHECK_EQ(async_fiber_fd_open(s, nsv[i][1]), 0); /* odd rounds: plain */
            CHECK(async_fiber_spawn(s, cp_new_fiber, (void *)(intptr_t)nsv[i][1], 0) != NULL);
        }
        for (int i = 0; i < CP_N; i++) CHECK_EQ(write(nsv[i][0], "y", 1), 1);
        wait_count(&cp_closed, CP_N, "owned reads ended by async_fiber_close");
        wait_count(&cp_data, CP_N, "plain reads");
        wait_count(&cp_new_got, CP_N, "reads on reused numbers");
        CHECK_EQ(atomic_load(&cp_other), 0);
        for (int i = 0; i < CP_N; i++) {
            close(cp_owned[i][0]);
            close_pair(cp_plain[i]);
            close(nsv[i][0]);
        }
    }
    sched_finish(s, BOUND_MS);
}

CASE(close_parked_1w) { close_parked(1); } // uring adversarial
CASE(close_parked_2w) { close_parked(2); } // uring adversarial

/* ---- a plain fd closed with close(2) and its number reused while parked ---- */

static atomic_int rp_ended;

static void rp_fiber(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b[8];
    /* timeout_ms is always honoured, also when the number was closed and
     * reused: whatever the result, the call ends */
    (void)async_fiber_read(fd, b, sizeof b, 50);
    atomic_fetch_add(&rp_ended, 1);
}

CASE(reuse_parked) // uring adversarial notsan
{
    async_sched_t *s = sched_new(2);
    atomic_store(&rp_ended, 0);
    for (int r = 0; r < 200; r++) {
        int sv[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        CHECK(async_fiber_spawn(s, rp_fiber, (void *)(intptr_t)sv[1], 0) != NULL);
        if (r % 2) usleep(200);
        close(sv[1]);
        int nv[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, nv), 0); /* likely takes sv[1]'s number */
        if (r % 3 == 0) CHECK_EQ(write(nv[0], "z", 1), 1);
        wait_count(&rp_ended, r + 1, "read parked on a reused number");
        close(sv[0]);
        close_pair(nv);
    }
    sched_finish(s, BOUND_MS);
}

/* ---- reads racing their timeouts: no byte lost, none duplicated ------------- */

#define TR_N 24
#define TR_BYTES 3000

static int tr_sv[TR_N][2];
static atomic_int tr_finished, tr_bad;

static void tr_fiber(void *arg)
{
    int i = (int)(intptr_t)arg;
    int fd = tr_sv[i][1];
    unsigned seed = (unsigned)i * 7919u + 1;
    unsigned char want = 0;
    int got = 0;
    while (got < TR_BYTES) {
        unsigned char b[64];
        size_t n = 1 + rand_r(&seed) % sizeof b;
        ssize_t r = async_fiber_read(fd, b, n, 1 + rand_r(&seed) % 3);
        if (r < 0) {
            if (async_last_error() == ASYNC_E_TIMEDOUT) continue;
            fprintf(stderr, "fiber %d: read failed with %d after %d bytes\n", i, async_last_error(), got);
            atomic_fetch_add(&tr_bad, 1);
            break;
        }
        if (r == 0) {
            fprintf(stderr, "fiber %d: end of file after %d bytes\n", i, got);
            atomic_fetch_add(&tr_bad, 1);
            break;
        }
        for (ssize_t k = 0; k < r; k++) {
            if (b[k] != want) {
                fprintf(stderr, "fiber %d: byte %d is %u, expected %u (lost or duplicated)\n", i, got, b[k], want);
                atomic_fetch_add(&tr_bad, 1);
                atomic_fetch_add(&tr_finished, 1);
                return;
            }
            want++;
            got++;
        }
    }
    atomic_fetch_add(&tr_finished, 1);
}

static void *tr_writer(void *arg)
{
    int half = (int)(intptr_t)arg;
    unsigned seed = 99u + (unsigned)half;
    int off[TR_N] = {0};
    for (int done = 0; done < TR_N / 2;) {
        done = 0;
        for (int j = 0; j < TR_N / 2; j++) {
            int i = half * (TR_N / 2) + j;
            if (off[i - half * (TR_N / 2)] >= TR_BYTES) {
                done++;
                continue;
            }
            int o = off[i - half * (TR_N / 2)];
            int n = 1 + rand_r(&seed) % 40;
            if (n > TR_BYTES - o) n = TR_BYTES - o;
            unsigned char b[64];
            for (int k = 0; k < n; k++) b[k] = (unsigned char)(o + k);
            CHECK_EQ(write(tr_sv[i][0], b, (size_t)n), n);
            off[i - half * (TR_N / 2)] += n;
        }
        if (rand_r(&seed) % 4 == 0) usleep(rand_r(&seed) % 3000);
    }
    return NULL;
}

static void timeout_race(int nw)
{
    async_sched_t *s = sched_new(nw);
    atomic_store(&tr_finished, 0);
    atomic_store(&tr_bad, 0);
    for (int i = 0; i < TR_N; i++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, tr_sv[i]), 0);
        if (i % 3 == 0) CHECK_EQ(async_fiber_fd_open(s, tr_sv[i][1]), 0);
        CHECK(async_fiber_spawn(s, tr_fiber, (void *)(intptr_t)i, 0) != NULL);
    }
    pthread_t a, b;
    start_thread(&a, tr_writer, (void *)(intptr_t)0);
    start_thread(&b, tr_writer, (void *)(intptr_t)1);
    join_within(a, 120000, "writer");
    join_within(b, 120000, "writer");
    wait_count(&tr_finished, TR_N, "readers racing their timeouts");
    CHECK_EQ(atomic_load(&tr_bad), 0);
    sched_finish(s, BOUND_MS);
    for (int i = 0; i < TR_N; i++) {
        async_fiber_close(tr_sv[i][1]);
        close(tr_sv[i][0]);
    }
}

CASE(timeout_race_1w) { timeout_race(1); } // uring adversarial
CASE(timeout_race_2w) { timeout_race(2); } // uring adversarial

/* ---- owned fds of one scheduler closed by another's fibers, during a destroy -- */

#define XC_N 64
static int xc_sv[XC_N][2];
static atomic_int xc_ended, xc_closed_ok;

static void xc_reader(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b;
    ssize_t r = async_fiber_read(fd, &b, 1, -1);
    int e = async_last_error();
    if (!(r == -1 && (e == ASYNC_E_CLOSED || e == ASYNC_E_CANCELLED)))
        fprintf(stderr, "owned read: %zd err %d\n", r, e);
    CHECK(r == -1 && (e == ASYNC_E_CLOSED || e == ASYNC_E_CANCELLED));
    atomic_fetch_add(&xc_ended, 1);
}

static void xc_closer(void *arg)
{
    int i = (int)(intptr_t)arg;
    if (i % 3 == 0) async_fiber_yield();
    CHECK_EQ(async_fiber_close(xc_sv[i][1]), 0);
    atomic_fetch_add(&xc_closed_ok, 1);
}

static void *xc_destroy(void *arg)
{
    async_sched_destroy(arg);
    return NULL;
}

CASE(cross_close) // uring adversarial
{
    raise_nofile(4 * XC_N + 64);
    async_sched_t *s2 = sched_new(2);
    for (int round = 0; round < 20; round++) {
        async_sched_t *s1 = sched_new(1 + round % 2);
        atomic_store(&xc_ended, 0);
        atomic_store(&xc_closed_ok, 0);
        for (int i = 0; i < XC_N; i++) {
            CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, xc_sv[i]), 0);
            CHECK_EQ(async_fiber_fd_open(s1, xc_sv[i][1]), 0);
            CHECK(async_fiber_spawn(s1, xc_reader, (void *)(intptr_t)xc_sv[i][1], 0) != NULL);
        }
        sched_wait_parked(s1, XC_N);
        pthread_t th;
        if (round % 2) start_thread(&th, xc_destroy, s1); /* the owner goes while its fds are closed */
        for (int i = 0; i < XC_N; i++) CHECK(async_fiber_spawn(s2, xc_closer, (void *)(intptr_t)i, 0) != NULL);
        wait_count(&xc_closed_ok, XC_N, "closes from the other scheduler");
        wait_count(&xc_ended, XC_N, "owned reads ended");
        if (round % 2)
            join_within(th, BOUND_MS, "destroy");
        else
            async_sched_destroy(s1);
        for (int i = 0; i < XC_N; i++) close(xc_sv[i][0]);
    }
    async_sched_destroy(s2);
}

/* ---- a plain fd made owned while a fiber waits on it, then async_fiber_close -- */

#define OW_N 32
static atomic_int ow_ended;

static void ow_reader(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char b;
    ssize_t r = async_fiber_read(fd, &b, 1, -1);
    int e = async_last_error();
    if (!(r == -1 && e == ASYNC_E_CLOSED)) fprintf(stderr, "read on fd %d: %zd err %d\n", fd, r, e);
    CHECK(r == -1);
    CHECK_EQ(e, ASYNC_E_CLOSED);
    atomic_fetch_add(&ow_ended, 1);
}

CASE(own_while_parked) // uring adversarial
{
    async_sched_t *s = sched_new(2);
    int sv[OW_N][2];
    atomic_store(&ow_ended, 0);
    for (int i = 0; i < OW_N; i++) {
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]), 0);
        CHECK(async_fiber_spawn(s, ow_reader, (void *)(intptr_t)sv[i][1], 0) != NULL);
    }
    sched_wait_parked(s, OW_N);
    for (int i = 0; i < OW_N; i++) {
        CHECK_EQ(async_fiber_fd_open(s, sv[i][1]), 0);
        CHECK_EQ(async_fiber_close(sv[i][1]), 0); /* wakes every fiber of s parked on it */
    }
    wait_count(&ow_ended, OW_N, "reads begun on a plain fd, ended by async_fiber_close once owned");
    sched_finish(s, BOUND_MS);
    for (int i = 0; i < OW_N; i++) close(sv[i][0]);
}

/* A plain fd closed with close(2) under a parked reader (timeout -1), its
 * number taken by a new socket that s then owns: async_fiber_close of the
 * number wakes every fiber of s parked on it, the old reader included. */
CASE(reuse_own_close) // uring adversarial notsan
{
    async_sched_t *s = sched_new(2);
    atomic_store(&ow_ended, 0);
    int done = 0;
    for (int round = 0; round < 50; round++) {
        int sv[2], nv[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        spawn_until_parked(s, ow_reader, (void *)(intptr_t)sv[1], 1);
        CHECK_EQ(close(sv[1]), 0);
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, nv), 0);
        int x = nv[0] == sv[1] ? nv[0] : nv[1] == sv[1] ? nv[1] : -1;
        CHECK(x >= 0); /* the lowest free number comes back */
        CHECK_EQ(async_fiber_fd_open(s, x), 0);
        CHECK_EQ(async_fiber_close(x), 0);
        done++;
        wait_count(&ow_ended, done, "a read on a closed plain fd whose number s owned and closed");
        close(sv[0]);
        close(nv[0] == x ? nv[1] : nv[0]);
    }
    sched_finish(s, BOUND_MS);
}

TEST_MAIN()
