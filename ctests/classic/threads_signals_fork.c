/* The classic loop with other threads, signals and fork: completions
 * posted from workers while the main loop waits all arrive once; deinit
 * racing posts and a wait fails them cleanly; a signal during a wait
 * returns 0 (the driver then checks its flags); after fork the child's
 * calls fail and the parent's loop goes on. Registered for epoll and
 * poll. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/time.h>
#include <sys/wait.h>

#define ASYNC_TEST_CLASSIC /* the classic headers and check.h (rt.h) */
#include "rt.h"

/* ---- completions from workers while the main loop waits ---------------------------- */

#define NPOST 20000
#define NW 4

typedef struct {
    async_runtime_t *rt;
    int id;
} pw_t;

static void *pw_proc(void *arg)
{
    pw_t *p = arg;
    int i;
    for (i = 0; i < NPOST; i++) {
        while (async_runtime_post_completion(p->rt, (uintptr_t)p->id, (uintptr_t)i) != 0)
            CHECK(0);
        if (async_worker_should_stop(async_worker_current()))
            break;
    }
    return NULL;
}

CASE(posts_workers) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    async_worker_t *w[NW];
    pw_t p[NW];
    int next[NW] = {0}, i, got = 0, rounds = 0;
    CHECK(rt);
    for (i = 0; i < NW; i++) {
        p[i].rt = rt;
        p[i].id = i + 1;
        w[i] = async_worker_create(pw_proc, &p[i], 0);
        CHECK(w[i]);
    }
    while (got < NW * NPOST) {
        int n = rounds % 2 ? async_runtime_wait(rt, ev, 1 + rounds % MAXEV, NULL) : waittv(rt, 5, 0);
        CHECK(n >= 0);
        for (i = 0; i < n; i++) {
            int id = (int)ev[i].completion_key - 1;
            CHECK(id >= 0 && id < NW);
            CHECK_EQ(ev[i].fd, -1);
            CHECK_EQ(ev[i].event_type, EVENT_READ);
            CHECK(ev[i].context == NULL && ev[i].buffer == NULL);
            CHECK_EQ(ev[i].bytes_transferred, next[id]);
            next[id]++;
            got++;
        }
        rounds++;
    }
    for (i = 0; i < NW; i++) {
        CHECK(async_worker_join(w[i], 10000));
        async_worker_destroy(w[i]);
    }
    CHECK_EQ(waittv(rt, 0, 0), 0);
    async_runtime_deinit(rt);
}

/* ---- deinit racing posts and a wait ------------------------------------------------- */

static atomic_int g_stop;

static void *spam_posts(void *arg)
{
    async_runtime_t *rt = arg;
    while (!atomic_load(&g_stop)) {
        if (async_runtime_post_completion(rt, 1, 2) != 0) {
            int e = async_last_error();
            CHECK(e == ASYNC_E_BADHANDLE || e == ASYNC_E_CLOSED);
            break;
        }
        async_runtime_wakeup(rt);
        async_runtime_get_console_type(rt);
    }
    return NULL;
}

static void *waiter_proc(void *arg)
{
    async_runtime_t *rt = arg;
    for (;;) {
        struct timeval tv = {10, 0};
        io_event_t e[8];
        int n = async_runtime_wait(rt, e, 8, &tv);
        if (n < 0) {
            int err = async_last_error();
            CHECK(err == ASYNC_E_BADHANDLE || err == ASYNC_E_CLOSED);
            break;
        }
    }
    return NULL;
}

CASE(deinit_race) // poll adversarial
{
    int round;
    for (round = 0; round < 200; round++) {
        async_runtime_t *rt = async_runtime_init();
        pthread_t a, b, c;
        int sp[2];
        CHECK(rt);
        CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
        CHECK_EQ(async_runtime_add(rt, sp[0], EVENT_READ | EVENT_WRITE, &round), 0);
        atomic_store(&g_stop, 0);
        start_thread(&a, spam_posts, rt);
        start_thread(&b, spam_posts, rt);
        start_thread(&c, waiter_proc, rt);
        if (round % 3)
            sleep_ms(1);
        async_runtime_deinit(rt);
        atomic_store(&g_stop, 1);
        join_within(a, 10000, "poster a");
        join_within(b, 10000, "poster b");
        join_within(c, 10000, "waiter");
        close_pair(sp);
    }
}

/* ---- signals ------------------------------------------------------------------------ */

static volatile sig_atomic_t g_sigs;
static void on_sig(int s)
{
    (void)s;
    g_sigs++;
}

static atomic_int g_kill_done;
static async_runtime_t *g_kill_rt;

static void *kill_main(void *arg)
{
    pthread_t m = *(pthread_t *)arg;
    int i;
    for (i = 0; i < 20; i++) {
        sleep_ms(5);
        pthread_kill(m, SIGUSR1);
    }
    atomic_store(&g_kill_done, 1);
    CHECK_EQ(async_runtime_wakeup(g_kill_rt), 0);
    return NULL;
}

/* A signal during the wait returns 0 (the driver then checks its flags); it
 * never fails with -1 or loses a completion. */
CASE(eintr) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    struct sigaction sa;
    pthread_t self = pthread_self(), th;
    int got = 0, guard = 0;
    CHECK(rt);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sig;
    sigaction(SIGUSR1, &sa, NULL);
    g_kill_rt = rt;
    start_thread(&th, kill_main, &self);
    while (!atomic_load(&g_kill_done) && guard++ < 100000) {
        int n = async_runtime_wait(rt, ev, MAXEV, guard % 2 ? NULL : &(struct timeval){30, 0});
        if (n < 0)
            fprintf(stderr, "wait -1, err %d\n", async_last_error());
        CHECK(n >= 0);
        got += n;
    }
    join_within(th, 10000, "killer");
    CHECK_EQ(got, 0);
    CHECK(g_sigs > 0);
    CHECK_EQ(async_runtime_post_completion(rt, 5, 6), 0);
    CHECK_EQ(waittv(rt, 0, 0), 1);
    async_runtime_deinit(rt);
}

/* ---- fork ---------------------------------------------------------------------------- */

CASE(fork) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    int sp[2], st;
    pid_t pid;
    CHECK(rt);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    CHECK_EQ(async_runtime_add(rt, sp[0], EVENT_READ, NULL), 0);
    CHECK_EQ(async_runtime_post_completion(rt, 3, 4), 0);
    pid = fork_flushed();
    if (pid == 0) {
        struct timeval tv = {0, 0};
        if (async_runtime_wait(rt, ev, MAXEV, &tv) != -1 || async_last_error() != ASYNC_E_FORKED)
            _exit(3);
        if (async_runtime_add(rt, sp[1], EVENT_READ, NULL) != -1 || async_last_error() != ASYNC_E_FORKED)
            _exit(4);
        if (async_runtime_modify(rt, sp[0], EVENT_READ, NULL) != -1 || async_last_error() != ASYNC_E_FORKED)
            _exit(5);
        if (async_runtime_add_console(rt, NULL) != -1 || async_last_error() != ASYNC_E_FORKED)
            _exit(6);
        async_runtime_get_console_type(rt);
        async_runtime_deinit(rt);
        _exit(0);
    }
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fprintf(stderr, "child status %d\n", st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_EQ(write(sp[1], "z", 1), 1);
    {
        int comp = 0, rd = 0, i, n, tries = 0;
        while ((!comp || !rd) && tries++ < 10) {
            n = waittv(rt, 1, 0);
            CHECK(n >= 0);
            for (i = 0; i < n; i++) {
                if (ev[i].fd == -1 && ev[i].completion_key == 3 && ev[i].bytes_transferred == 4)
                    comp++;
                else if (ev[i].fd == sp[0])
                    rd = 1;
            }
        }
        CHECK_EQ(comp, 1);
        CHECK(rd);
    }
    async_runtime_deinit(rt);
    close_pair(sp);
}

TEST_MAIN()
