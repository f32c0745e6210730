/* test_adv9.c — adversarial pass 9: the classic lib/async API
 * (include/async/async_*.h, docs/NEOLITH.md), used the way the Neolith driver
 * uses it and the way a hostile caller would (docs/RELIABILITY.md,
 * "Adversarial pass 9 (the classic API)"). Registered for epoll and poll. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>

#include "async/async_queue.h"
#include "async/async_runtime.h"
#include "async/async_worker.h"

/* check.h's helpers without its include of async.h (see test_classic.c). */
#define ASYNC_H
#include "check.h"

/* Modern entry points used by the mixing cases, declared by hand (async.h
 * cannot share this translation unit). */
uint64_t async_runtime_add_timer(async_runtime_t *rt, uint64_t delay_ms, uint64_t repeat_ms, uintptr_t key);
int async_runtime_add_signal(async_runtime_t *rt, int signo, uintptr_t key);

#define MAXEV 64
static io_event_t ev[MAXEV];

static int waittv(async_runtime_t *rt, long sec, long usec)
{
    struct timeval tv;
    tv.tv_sec = (time_t)sec;
    tv.tv_usec = (suseconds_t)usec;
    return async_runtime_wait(rt, ev, MAXEV, &tv);
}

/* ---- timevals ----------------------------------------------------------------- */

typedef struct {
    async_runtime_t *rt;
    atomic_int go;
} poster_t;

static void *post_later(void *arg)
{
    poster_t *p = arg;
    while (!atomic_load(&p->go))
        sleep_ms(1);
    sleep_ms(100);
    CHECK_EQ(async_runtime_post_completion(p->rt, 77, 1), 0);
    return NULL;
}

/* A huge timeval must wait (until the completion), not return at once or
 * spin. */
static void huge_one(long sec, long usec)
{
    async_runtime_t *rt = async_runtime_init();
    poster_t p;
    pthread_t th;
    int n;
    CHECK(rt);
    p.rt = rt;
    atomic_store(&p.go, 0);
    start_thread(&th, post_later, &p);
    atomic_store(&p.go, 1);
    n = waittv(rt, sec, usec);
    if (n == 0) {
        fprintf(stderr, "timeval {%ld,%ld} returned 0 at once\n", sec, usec);
    }
    CHECK_EQ(n, 1);
    CHECK_EQ(ev[0].completion_key, 77);
    join_within(th, 10000, "poster");
    async_runtime_deinit(rt);
}

static void t_tv_huge(void)
{
    huge_one(LONG_MAX, 0);
    huge_one(LONG_MAX, 999999);
    huge_one(LONG_MAX / 1000 + 1, 0);
    huge_one((long)INT_MAX, 0);
    huge_one(0, LONG_MAX);
    huge_one(9223372036854775L, 807000);
}

/* tv_usec >= 1000000 is more seconds (as select(2) would refuse, but the
 * classic backend computed sec*1000 + usec/1000): {0, 200000000} is 200 s, so a
 * completion ends it; {0,-1} and {-1, 999999} do not wait. */
static void t_tv_odd(void)
{
    async_runtime_t *rt = async_runtime_init();
    double t0;
    CHECK(rt);
    huge_one(0, 200000000);
    t0 = now_ms();
    CHECK_EQ(waittv(rt, 0, -1), 0);
    CHECK_EQ(waittv(rt, -1, 999999), 0);
    CHECK_EQ(waittv(rt, LONG_MIN, 0), 0);
    CHECK_EQ(waittv(rt, 0, LONG_MIN), 0);
    CHECK_EQ(waittv(rt, LONG_MIN, LONG_MIN), 0);
    CHECK(now_ms() - t0 < 5000);
    /* {1, -999000}: 1 ms total */
    t0 = now_ms();
    CHECK_EQ(waittv(rt, 1, -999000), 0);
    CHECK(now_ms() - t0 >= 1);
    CHECK(now_ms() - t0 < 900);
    async_runtime_deinit(rt);
}

/* ---- bad arguments and handles ------------------------------------------------------ */

static void t_badargs(void)
{
    async_runtime_t *rt = async_runtime_init();
    int sp[2];
    struct timeval tv = {0, 0};
    CHECK(rt);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    CHECK_FAIL(async_runtime_wait(NULL, ev, MAXEV, &tv) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_wait(rt, NULL, MAXEV, &tv) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, 0, &tv) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_wait(rt, ev, -5, &tv) == -1, ASYNC_E_INVAL);
    CHECK_FAIL(async_runtime_add(NULL, sp[0], EVENT_READ, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_add(rt, -1, EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add(rt, INT_MAX, EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_modify(NULL, sp[0], EVENT_READ, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_modify(rt, sp[0], EVENT_READ, NULL) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_modify(rt, -1, EVENT_READ, NULL) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_remove(NULL, sp[0]) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_remove(rt, sp[0]) == -1, ASYNC_E_NOTFOUND);
    CHECK_FAIL(async_runtime_remove(rt, -1) == -1, ASYNC_E_BADFD);
    CHECK_FAIL(async_runtime_add_console(NULL, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_EQ(async_runtime_get_console_type(NULL), CONSOLE_TYPE_NONE);
    CHECK(async_runtime_get_console_ctx(NULL) == NULL);
    CHECK_FAIL(async_runtime_get_event_loop_handle(NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_post_completion(NULL, 1, 1) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_wakeup(NULL) == -1, ASYNC_E_BADHANDLE);
    async_runtime_deinit(NULL);
    /* unknown event bits */
    async_clear_error();
    {
        int r = async_runtime_add(rt, sp[0], 0x100, NULL);
        fprintf(stderr, "add 0x100 -> %d err %d\n", r, async_last_error());
        if (r == 0)
            CHECK_EQ(async_runtime_remove(rt, sp[0]), 0);
    }
    /* add twice */
    CHECK_EQ(async_runtime_add(rt, sp[0], EVENT_READ, NULL), 0);
    CHECK_FAIL(async_runtime_add(rt, sp[0], EVENT_READ, NULL) == -1, ASYNC_E_EXISTS);
    CHECK_EQ(async_runtime_add(rt, sp[1], 0, NULL), 0);
    CHECK_EQ(async_runtime_add(rt, sp[1], EVENT_ERROR | EVENT_CLOSE, NULL) == -1, 1);
    CHECK_EQ(async_runtime_modify(rt, sp[1], EVENT_ERROR | EVENT_CLOSE, NULL), 0);
    CHECK_EQ(waittv(rt, 0, 0), 0);
    CHECK_EQ(async_runtime_remove(rt, sp[0]), 0);
    CHECK_EQ(async_runtime_remove(rt, sp[1]), 0);
    /* a stale handle */
    async_runtime_deinit(rt);
    CHECK_FAIL(async_runtime_wait(rt, ev, MAXEV, &tv) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_add(rt, sp[0], EVENT_READ, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_modify(rt, sp[0], EVENT_READ, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_remove(rt, sp[0]) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_add_console(rt, NULL) == -1, ASYNC_E_BADHANDLE);
    CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_NONE);
    CHECK_FAIL(async_runtime_get_event_loop_handle(rt) == -1, ASYNC_E_BADHANDLE);
    CHECK_FAIL(async_runtime_post_completion(rt, 1, 1) == -1, ASYNC_E_BADHANDLE);
    async_runtime_deinit(rt); /* twice: nothing */
    /* garbage handles */
    CHECK_FAIL(async_runtime_wait((async_runtime_t *)(uintptr_t)0x1234, ev, MAXEV, &tv) == -1,
               ASYNC_E_BADHANDLE);
    async_runtime_deinit((async_runtime_t *)(uintptr_t)0x1234);
    CHECK_EQ(async_runtime_get_console_type((async_runtime_t *)(uintptr_t)0xdead), CONSOLE_TYPE_NONE);
    close(sp[0]);
    close(sp[1]);
}

/* ---- fds closed and reused while registered ---------------------------------------- */

static void t_fd_reuse(void)
{
    async_runtime_t *rt = async_runtime_init();
    int sp[2], sp2[2], a, b, n, i, seen;
    CHECK(rt);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    CHECK_EQ(async_runtime_add(rt, sp[0], EVENT_READ, &a), 0);
    close(sp[0]);
    close(sp[1]);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp2) == 0);
    CHECK_EQ(sp2[0], sp[0]);
    /* the old file's events never come with the new number */
    for (i = 0; i < 3; i++) {
        n = waittv(rt, 0, 0);
        CHECK(n >= 0);
        if (n > 0)
            fprintf(stderr, "stale event fd %d type %u ctx %p\n", ev[0].fd, ev[0].event_type, ev[0].context);
    }
    CHECK_EQ(async_runtime_add(rt, sp2[0], EVENT_READ, &b), 0);
    CHECK_EQ(write(sp2[1], "y", 1), 1);
    seen = 0;
    for (i = 0; i < 5 && !seen; i++) {
        n = waittv(rt, 1, 0);
        CHECK(n >= 0);
        while (n-- > 0) {
            CHECK(ev[n].context == &b);
            CHECK_EQ(ev[n].event_type & EVENT_READ, EVENT_READ);
            seen = 1;
        }
    }
    CHECK(seen);
    CHECK_EQ(async_runtime_remove(rt, sp2[0]), 0);
    close(sp2[0]);
    close(sp2[1]);
    async_runtime_deinit(rt);
}

static int tmpfile_fd(const char *content)
{
    char path[] = "/tmp/adv9_fileXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    if (content)
        CHECK_EQ(write(fd, content, strlen(content)), (ssize_t)strlen(content));
    CHECK_EQ(lseek(fd, 0, SEEK_SET), 0);
    return fd;
}

/* A registered regular file closed without remove, its number reused by
 * another regular file that was not added: the old registration is reported
 * once as ERROR|CLOSE and never again (docs/NEOLITH.md), never the new
 * file's readiness with the old context; the new file can then be added. */
static void t_file_reuse_file(void)
{
    async_runtime_t *rt = async_runtime_init();
    int fa, fb, a, b, n, i, errs = 0, keep;
    CHECK(rt);
    fa = tmpfile_fd("aaaa");
    CHECK_EQ(async_runtime_add(rt, fa, EVENT_READ, &a), 0);
    CHECK_EQ(waittv(rt, 0, 0), 1);
    keep = dup(fa); /* A stays open: its inode is not reused by B */
    CHECK(keep >= 0);
    close(fa);
    fb = tmpfile_fd("bbbbbbbb");
    CHECK_EQ(fb, fa);
    for (i = 0; i < 4; i++) {
        n = waittv(rt, 0, 0);
        CHECK(n >= 0);
        while (n-- > 0) {
            CHECK_EQ(ev[n].fd, fb);
            CHECK(ev[n].context == &a);
            if (ev[n].event_type != (EVENT_ERROR | EVENT_CLOSE))
                fprintf(stderr, "the new file reported with the old context: type %u\n", ev[n].event_type);
            CHECK_EQ(ev[n].event_type, EVENT_ERROR | EVENT_CLOSE);
            errs++;
        }
    }
    CHECK_EQ(errs, 1);
    CHECK_EQ(async_runtime_add(rt, fb, EVENT_READ, &b), 0);
    n = waittv(rt, 0, 0);
    CHECK_EQ(n, 1);
    CHECK(ev[0].context == &b);
    CHECK_EQ(ev[0].event_type, EVENT_READ);
    CHECK_EQ(async_runtime_remove(rt, fb), 0);
    close(fb);
    close(keep);
    async_runtime_deinit(rt);
}

/* A socket closed without remove, its number reused by a regular file that
 * is then added: one registration, the file's (no duplicate with the
 * socket's context, also on the poll backend, which watches numbers). */
static void t_file_reuse_sock(void)
{
    async_runtime_t *rt = async_runtime_init();
    int sp[2], f, a, b, n, i, rounds;
    CHECK(rt);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    CHECK_EQ(async_runtime_add(rt, sp[0], EVENT_READ, &a), 0);
    close(sp[0]);
    f = tmpfile_fd("hello");
    CHECK_EQ(f, sp[0]);
    CHECK_EQ(async_runtime_add(rt, f, EVENT_READ, &b), 0);
    for (rounds = 0; rounds < 3; rounds++) {
        n = waittv(rt, 0, 0);
        CHECK(n >= 0);
        for (i = 0; i < n; i++) {
            if (ev[i].context != &b)
                fprintf(stderr, "event fd %d type %u with the socket's context\n", ev[i].fd, ev[i].event_type);
            CHECK(ev[i].context == &b);
        }
    }
    CHECK_EQ(async_runtime_remove(rt, f), 0);
    CHECK_EQ(waittv(rt, 0, 0), 0);
    close(f);
    close(sp[1]);
    async_runtime_deinit(rt);
}

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

static void t_posts_workers(void)
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

static void t_deinit_race(void)
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
        close(sp[0]);
        close(sp[1]);
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
static void t_eintr(void)
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

static void t_fork(void)
{
    async_runtime_t *rt = async_runtime_init();
    int sp[2], st;
    pid_t pid;
    CHECK(rt);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    CHECK_EQ(async_runtime_add(rt, sp[0], EVENT_READ, NULL), 0);
    CHECK_EQ(async_runtime_post_completion(rt, 3, 4), 0);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    CHECK(pid >= 0);
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
    close(sp[0]);
    close(sp[1]);
}

/* ---- mixing with modern translation units ---------------------------------------------- */

static void t_mix_timer(void)
{
    async_runtime_t *rt = async_runtime_init();
    uint64_t id;
    CHECK(rt);
    id = async_runtime_add_timer(rt, 1, 0, 0xabc);
    CHECK(id != 0);
    CHECK_EQ(waittv(rt, 5, 0), 1);
    CHECK_EQ(ev[0].completion_key, 0xabc);
    CHECK_EQ(ev[0].bytes_transferred, (size_t)id);
    CHECK_EQ(ev[0].fd, -1);
    fprintf(stderr, "timer event_type %u\n", ev[0].event_type);
    async_runtime_deinit(rt);
}

static void t_mix_signal(void)
{
    async_runtime_t *rt = async_runtime_init();
    int n;
    CHECK(rt);
    CHECK_EQ(async_runtime_add_signal(rt, SIGUSR2, 0x5151), 0);
    raise(SIGUSR2);
    n = waittv(rt, 5, 0);
    fprintf(stderr, "signal: n %d fd %d key %lx type %u data %zu\n", n, ev[0].fd,
            (unsigned long)ev[0].completion_key, ev[0].event_type, ev[0].bytes_transferred);
    CHECK_EQ(n, 1);
    CHECK_EQ(ev[0].completion_key, 0x5151);
    CHECK_EQ(ev[0].fd, -1);
    async_runtime_deinit(rt);
}

/* ---- console ------------------------------------------------------------------------- */

static void t_console_twice(void)
{
    async_runtime_t *rt = async_runtime_init();
    int p[2], saved = dup(0), a, b, n;
    CHECK(rt && saved >= 0);
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(dup2(p[0], 0), 0);
    CHECK_EQ(async_runtime_add_console(rt, &a), 0);
    CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_PIPE);
    CHECK_EQ(async_runtime_add_console(rt, &b), 0);
    CHECK(async_runtime_get_console_ctx(rt) == &b);
    CHECK_EQ(write(p[1], "hi\n", 3), 3);
    n = waittv(rt, 5, 0);
    CHECK_EQ(n, 1);
    CHECK(ev[0].context == &b);
    CHECK_EQ(ev[0].fd, 0);
    /* EOF (the writer closes): READ (and maybe CLOSE), read returns the rest then 0 */
    close(p[1]);
    n = waittv(rt, 5, 0);
    CHECK_EQ(n, 1);
    CHECK(ev[0].event_type & EVENT_READ);
    CHECK_EQ(async_runtime_remove(rt, 0), 0);
    fprintf(stderr, "after remove: type %d ctx %p\n", async_runtime_get_console_type(rt),
            async_runtime_get_console_ctx(rt));
    CHECK_EQ(waittv(rt, 0, 0), 0);
    /* stdin closed */
    close(0);
    CHECK_EQ(async_runtime_add_console(rt, &a), 0);
    CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_NONE);
    CHECK_EQ(waittv(rt, 0, 0), 0);
    async_runtime_deinit(rt);
    CHECK_EQ(dup2(saved, 0), 0);
    close(saved);
    close(p[0]);
}

/* ---- many sockets: accept storm, clients that vanish ------------------------------------ */

#define NCONN 300

static void *storm(void *arg)
{
    int port = (int)(intptr_t)arg, i;
    for (i = 0; i < NCONN; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa;
        CHECK(fd >= 0);
        memset(&sa, 0, sizeof sa);
        sa.sin_family = AF_INET;
        sa.sin_port = htons((uint16_t)port);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
            if (i % 3 == 0) {
                struct linger l = {1, 0};
                setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l); /* RST */
            } else if (i % 3 == 1) {
                (void)!write(fd, "hello\n", 6);
            }
        }
        close(fd);
    }
    return NULL;
}

static void t_accept_storm(void)
{
    async_runtime_t *rt = async_runtime_init();
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    int lfd, accepted = 0, closed = 0, i, guard = 0;
    pthread_t th;
    static char live[65536];
    CHECK(rt);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(lfd >= 0);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    CHECK_EQ(listen(lfd, 1024), 0);
    CHECK_EQ(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    CHECK(fcntl(lfd, F_SETFL, O_NONBLOCK) == 0);
    CHECK_EQ(async_runtime_add(rt, lfd, EVENT_READ, &lfd), 0);
    start_thread(&th, storm, (void *)(intptr_t)ntohs(sa.sin_port));
    while (closed < NCONN && guard++ < 100000) {
        int n = waittv(rt, 10, 0);
        CHECK(n > 0);
        for (i = 0; i < n; i++) {
            if (ev[i].context == &lfd) {
                int c;
                while ((c = accept(lfd, NULL, NULL)) >= 0) {
                    CHECK(c < 65536);
                    CHECK(fcntl(c, F_SETFL, O_NONBLOCK) == 0);
                    CHECK_EQ(async_runtime_add(rt, c, EVENT_READ, (void *)(intptr_t)(c + 1)), 0);
                    live[c] = 1;
                    accepted++;
                }
            } else {
                int fd = (int)(intptr_t)ev[i].context - 1;
                char buf[64];
                ssize_t r;
                CHECK_EQ(ev[i].fd, fd);
                CHECK(live[fd]);
                r = read(fd, buf, sizeof buf);
                if (r <= 0) {
                    CHECK_EQ(async_runtime_remove(rt, fd), 0);
                    close(fd);
                    live[fd] = 0;
                    closed++;
                }
            }
        }
    }
    join_within(th, 30000, "storm");
    CHECK_EQ(accepted, NCONN);
    CHECK_EQ(closed, NCONN);
    async_runtime_deinit(rt);
    close(lfd);
}

/* ---- RLIMIT_NOFILE low --------------------------------------------------------------- */

static void t_nofile(void)
{
    struct rlimit old, rl;
    async_runtime_t *rts[64];
    int i, n = 0, fds[64], nf = 0;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
    {
        async_runtime_t *warm = async_runtime_init(); /* the Go runtime's poller first */
        CHECK(warm);
        async_runtime_deinit(warm);
    }
    rl = old;
    rl.rlim_cur = 32;
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    for (;;) {
        int f = open("/dev/null", O_RDONLY);
        if (f < 0)
            break;
        if (nf < 64)
            fds[nf++] = f;
        else {
            close(f);
            break;
        }
    }
    /* no descriptor free */
    async_clear_error();
    rts[0] = async_runtime_init();
    CHECK(rts[0] == NULL);
    CHECK(async_last_error() == ASYNC_E_SYS || async_last_error() == ASYNC_E_NOMEM);
    /* one free, two, three */
    for (i = 0; i < 3 && nf > 0; i++) {
        close(fds[--nf]);
        async_runtime_t *r = async_runtime_init();
        if (r) {
            rts[n++] = r;
            CHECK_EQ(async_runtime_post_completion(r, 1, 1), 0);
            CHECK_EQ(async_runtime_wait(r, ev, MAXEV, &(struct timeval){0, 0}), 1);
            CHECK_EQ(async_runtime_add_console(r, NULL), 0);
        }
    }
    for (i = 0; i < n; i++)
        async_runtime_deinit(rts[i]);
    while (nf > 0)
        close(fds[--nf]);
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
}

/* ---- the modern deinit of a runtime with classic state --------------------------------- */

/* The modern async_runtime_deinit (what a modern translation unit calls) on
 * a runtime that has a console: the classic state goes too, as with the
 * classic deinit (get_console_type NONE afterwards), and no state is kept
 * per runtime destroyed that way. Declared by hand: from here on
 * async_runtime_deinit is the modern function. */
#undef async_runtime_deinit
void async_runtime_deinit(async_runtime_t *rt);

static void t_mix_deinit(void)
{
    int p[2], saved = dup(0), a, i, fd;
    char path[] = "/tmp/adv9_mixXXXXXX";
    CHECK(saved >= 0);
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(dup2(p[0], 0), 0);
    fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    for (i = 0; i < 2000; i++) {
        async_runtime_t *rt = async_runtime_init();
        CHECK(rt);
        CHECK_EQ(async_runtime_add_console(rt, &a), 0);
        CHECK_EQ(async_runtime_add(rt, fd, EVENT_READ, &a), 0); /* a regular file: classic state */
        CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_PIPE);
        async_runtime_deinit(rt); /* the modern one */
        CHECK_EQ(async_runtime_get_console_type(rt), CONSOLE_TYPE_NONE);
        CHECK(async_runtime_get_console_ctx(rt) == NULL);
    }
    CHECK_EQ(dup2(saved, 0), 0);
    close(saved);
    close(p[0]);
    close(p[1]);
    close(fd);
}

/* ---- the examples under hostile standard descriptors ------------------------------- */

#include <poll.h>
#include <signal.h>

/* Runs argv with stdin closed (in_closed) or /dev/null, stdout /dev/full
 * (out_full) or a pipe read into out; stderr into the same pipe. Returns the
 * wait status; fails if the program has not ended within 30 s. */
static int run_prog(char *const argv[], int in_closed, int out_full, char *out, size_t cap)
{
    int p[2], st = 0;
    size_t have = 0;
    double t0 = now_ms();
    pid_t pid;
    CHECK_EQ(pipe(p), 0);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY), full = open("/dev/full", O_WRONLY);
        dup2(p[1], 2);
        dup2(out_full ? full : p[1], 1);
        if (in_closed)
            close(0);
        else
            dup2(null, 0);
        close(p[0]);
        close(p[1]);
        close(null);
        close(full);
        execv(argv[0], argv);
        _exit(99);
    }
    close(p[1]);
    for (;;) {
        struct pollfd pf = {p[0], POLLIN, 0};
        int left = 30000 - (int)(now_ms() - t0);
        if (left <= 0 || poll(&pf, 1, left) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fprintf(stderr, "%s did not end within 30 s; its output:\n%.*s\n", argv[0], (int)have, out);
            CHECK(0);
        }
        char buf[4096];
        ssize_t r = read(p[0], buf, sizeof buf);
        if (r <= 0)
            break;
        if (have + (size_t)r < cap) {
            memcpy(out + have, buf, (size_t)r);
            have += (size_t)r;
        }
    }
    out[have] = 0;
    close(p[0]);
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (now_ms() - t0 > 30000) {
            kill(pid, SIGKILL);
            CHECK(0);
        }
        sleep_ms(5);
    }
    return st;
}

static char g_out[1 << 16];

/* console_worker started with stdin closed: no descriptor of the program
 * (the runtime's, the listening socket) may become "stdin" for the console
 * reader; a closed stdin is the end of input, as /dev/null is. */
static void t_example_console_closed_stdin(void)
{
#ifdef ASYNC_TEST_CONSOLE_WORKER
    char *argv[] = {ASYNC_TEST_CONSOLE_WORKER, "--port", "0", "--heartbeat", "0", NULL};
    int st = run_prog(argv, 1, 0, g_out, sizeof g_out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(g_out, "console: end of input, shutting down") != NULL);
#else
    printf("examples not built: skipped\n");
#endif
}

/* async_dns whose stdout cannot be written (a full disk): the answers are
 * lost, so the exit status must say so, not 0; and with stdin and stdout
 * closed its own descriptors never receive its output. */
static void t_example_dns_lost_output(void)
{
#ifdef ASYNC_TEST_ASYNC_DNS
    char *argv[] = {ASYNC_TEST_ASYNC_DNS, "localhost", NULL};
    int st = run_prog(argv, 0, 0, g_out, sizeof g_out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(g_out, "localhost: ") != NULL);
    st = run_prog(argv, 0, 1, g_out, sizeof g_out);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        fprintf(stderr, "async_dns exited 0 with its output lost (stdout /dev/full)\n");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    CHECK(strstr(g_out, "async_dns: ") != NULL); /* said on stderr */
#else
    printf("examples not built: skipped\n");
#endif
}

/* console_worker at its descriptor limit with clients still connecting: a
 * connection it cannot accept (EMFILE) must be answered (refused, "server
 * full" or closed), not left pending, which kept the listening socket
 * readable and the loop spinning on it for ever. Each client reads its first
 * line; a deadline only turns a client left without an answer into a
 * failure. */
static void t_example_console_emfile(void)
{
#ifdef ASYNC_TEST_CONSOLE_WORKER
    int in[2], out[2], port = 0, i, refused = 0, st;
    char buf[512];
    size_t have = 0;
    pid_t pid;
    int clients[200], nc = 0;
    CHECK_EQ(pipe(in), 0);
    CHECK_EQ(pipe(out), 0);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        struct rlimit rl;
        char *argv[] = {ASYNC_TEST_CONSOLE_WORKER, "--port", "0", "--heartbeat", "0", NULL};
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(out[1], 2);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = 40;
        setrlimit(RLIMIT_NOFILE, &rl);
        execv(argv[0], argv);
        _exit(99);
    }
    close(in[0]);
    close(out[1]);
    while (!port) {
        struct pollfd pf = {out[0], POLLIN, 0};
        char *at;
        ssize_t r;
        CHECK(poll(&pf, 1, 30000) == 1);
        r = read(out[0], buf + have, sizeof buf - 1 - have);
        CHECK(r > 0);
        have += (size_t)r;
        buf[have] = 0;
        if ((at = strstr(buf, "listening on 127.0.0.1:")) != NULL && strchr(at, '\n'))
            port = atoi(at + strlen("listening on 127.0.0.1:"));
    }
    for (i = 0; i < 200 && !refused; i++) {
        struct sockaddr_in sa;
        struct pollfd pf;
        char line[64];
        ssize_t r;
        int c = socket(AF_INET, SOCK_STREAM, 0);
        CHECK(c >= 0);
        memset(&sa, 0, sizeof sa);
        sa.sin_family = AF_INET;
        sa.sin_port = htons((uint16_t)port);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        CHECK_EQ(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
        pf.fd = c;
        pf.events = POLLIN;
        pf.revents = 0;
        if (poll(&pf, 1, 10000) != 1) {
            fprintf(stderr, "client %d: no answer within 10 s (the server cannot accept it)\n", i);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            CHECK(0);
        }
        r = read(c, line, sizeof line - 1);
        line[r > 0 ? r : 0] = 0;
        if (r > 0 && strncmp(line, "welcome", 7) == 0) {
            clients[nc++] = c;
            continue;
        }
        refused = 1; /* "server full", EOF or a reset */
        close(c);
    }
    CHECK(refused);
    /* the server still serves: drop the clients, then end its input */
    while (nc > 0)
        close(clients[--nc]);
    close(in[1]);
    {
        double t0 = now_ms();
        char sink[4096];
        for (;;) {
            struct pollfd pf = {out[0], POLLIN, 0};
            CHECK(now_ms() - t0 < 30000);
            if (poll(&pf, 1, 1000) == 1 && read(out[0], sink, sizeof sink) <= 0)
                break;
        }
        while (waitpid(pid, &st, WNOHANG) == 0) {
            CHECK(now_ms() - t0 < 30000);
            sleep_ms(5);
        }
    }
    close(out[0]);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
#else
    printf("examples not built: skipped\n");
#endif
}

/* Started with stdin closed (by std_closed): the library, loaded before
 * main, opened /dev/null on descriptor 0, so that nothing else (Go's
 * initialisation, the library's descriptors) takes the number; the runtime's
 * descriptors are above 2. */
static void t_std_closed_probe(void)
{
    struct stat st, nul;
    int i;
    CHECK_EQ(stat("/dev/null", &nul), 0);
    if (fstat(0, &st) != 0 || !S_ISCHR(st.st_mode) || st.st_rdev != nul.st_rdev) {
        fprintf(stderr, "descriptor 0 is not /dev/null at the top of main\n");
        CHECK(0);
    }
    for (i = 0; i < 20; i++) {
        async_runtime_t *rt = async_runtime_init();
        CHECK(rt);
        CHECK(async_runtime_get_event_loop_handle(rt) > 2);
        async_runtime_deinit(rt);
    }
    CHECK_EQ(fstat(0, &st), 0);
    CHECK(S_ISCHR(st.st_mode) && st.st_rdev == nul.st_rdev);
}

static void t_std_closed(void)
{
    char self[4096];
    ssize_t len;
    int st;
    const char *emu = getenv("ASYNC_TEST_EMULATOR");
    if (emu && *emu) {
        /* qemu-user opens descriptors of its own (the guest binary) before
         * the guest's constructors run: a closed 0 is taken by the emulator
         * before libasync loads (failed under qemu-aarch64 in cross.sh) */
        printf("under an emulator: skipped\n");
        return;
    }
    len = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(len > 0);
    self[len] = 0;
    char *argv[] = {self, "std_closed_probe", NULL};
    st = run_prog(argv, 1, 0, g_out, sizeof g_out);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fprintf(stderr, "%s", g_out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* ---- the wait never fails for memory ------------------------------------------------------- */

/* A classic wait with more room than its stack buffer allocates one for the
 * call; when that fails (here: a max_events whose buffer cannot be had) it
 * must still deliver, with fewer events per call, as the modern wait does
 * ("never fails for memory"), not fail with ASYNC_E_NOMEM: a driver takes a
 * failed wait as fatal. (Only 3 events are ready: the 64-entry array is
 * never written beyond them.) */
static void t_wait_nomem_child(void)
{
    async_runtime_t *rt = async_runtime_init();
    int n;
    CHECK(rt);
    CHECK_EQ(async_runtime_post_completion(rt, 1, 10), 0);
    CHECK_EQ(async_runtime_post_completion(rt, 2, 20), 0);
    CHECK_EQ(async_runtime_post_completion(rt, 3, 30), 0);
    async_clear_error();
    n = async_runtime_wait(rt, ev, INT_MAX / 2, &(struct timeval){1, 0});
    if (n < 0)
        fprintf(stderr, "wait failed: %d\n", async_last_error());
    CHECK_EQ(n, 3);
    CHECK_EQ(ev[2].completion_key, 3);
    CHECK_EQ(ev[2].bytes_transferred, 30);
    async_runtime_deinit(rt);
}

/* Runs wait_nomem_child with ASan's malloc returning NULL (not aborting) on
 * an allocation that cannot be had, as the C library's does. */
static void t_wait_nomem(void)
{
    static char env[1024];
    const char *old = getenv("ASAN_OPTIONS");
    int st;
    snprintf(env, sizeof env, "ASAN_OPTIONS=%s%sallocator_may_return_null=1", old ? old : "",
             old && *old ? ":" : "");
    st = run_self_case("wait_nomem_child", env);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
}

/* ---- modify from another thread while the main loop waits ----------------------------------- */

#define NMOD 2000
static atomic_int g_mod_seq; /* how many modifies have returned */
static int g_mod_fd;
static async_runtime_t *g_mod_rt;
static int g_ctx_tags[NMOD + 1];

static void *modifier(void *arg)
{
    int i;
    (void)arg;
    for (i = 1; i <= NMOD; i++) {
        CHECK_EQ(async_runtime_modify(g_mod_rt, g_mod_fd, EVENT_READ, &g_ctx_tags[i]), 0);
        atomic_store(&g_mod_seq, i);
        if (i % 16 == 0)
            sleep_ms(1);
    }
    return NULL;
}

/* An always readable socket whose context another thread keeps changing: a
 * wait that begins after modify #k returned never reports a context older
 * than #k (NEOLITH.md: events reported after the call carry the new context). */
static void t_modify_race(void)
{
    async_runtime_t *rt = async_runtime_init();
    int sp[2];
    pthread_t th;
    CHECK(rt);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    CHECK_EQ(write(sp[1], "x", 1), 1);
    CHECK_EQ(async_runtime_add(rt, sp[0], EVENT_READ, &g_ctx_tags[0]), 0);
    g_mod_fd = sp[0];
    g_mod_rt = rt;
    start_thread(&th, modifier, NULL);
    for (;;) {
        int before = atomic_load(&g_mod_seq), n, i;
        n = waittv(rt, 1, 0);
        CHECK(n >= 0);
        for (i = 0; i < n; i++) {
            int k = (int)((int *)ev[i].context - g_ctx_tags);
            CHECK(k >= 0 && k <= NMOD);
            if (k < before)
                fprintf(stderr, "context #%d reported by a wait begun after modify #%d returned\n", k, before);
            CHECK(k >= before);
        }
        if (before == NMOD)
            break;
    }
    join_within(th, 30000, "modifier");
    close(sp[0]);
    close(sp[1]);
    async_runtime_deinit(rt);
}

/* ---- descriptors above 1024 (FD_SETSIZE), both backends ------------------------------------ */

static void t_high_fds(void)
{
    async_runtime_t *rt = async_runtime_init();
    struct rlimit rl;
    int fds[8][2], i, seen = 0, rounds;
    CHECK(rt);
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max < 5000) {
        printf("hard RLIMIT_NOFILE below 5000: skipped\n");
        async_runtime_deinit(rt);
        return;
    }
    if (rl.rlim_cur < 5000) {
        rl.rlim_cur = 5000;
        CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
    for (i = 0; i < 8; i++) {
        int sp[2];
        CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
        fds[i][0] = 1100 + 500 * i;
        fds[i][1] = fds[i][0] + 1;
        CHECK_EQ(dup2(sp[0], fds[i][0]), fds[i][0]);
        CHECK_EQ(dup2(sp[1], fds[i][1]), fds[i][1]);
        close(sp[0]);
        close(sp[1]);
        CHECK_EQ(async_runtime_add(rt, fds[i][0], EVENT_READ, &fds[i][0]), 0);
        CHECK_EQ(write(fds[i][1], "q", 1), 1);
    }
    for (rounds = 0; rounds < 10 && seen != 0xff; rounds++) {
        int n = waittv(rt, 1, 0);
        CHECK(n >= 0);
        for (i = 0; i < n; i++) {
            int k = (int)(((int *)ev[i].context - &fds[0][0]) / 2);
            CHECK(k >= 0 && k < 8);
            CHECK_EQ(ev[i].fd, fds[k][0]);
            CHECK_EQ(ev[i].event_type, EVENT_READ);
            seen |= 1 << k;
        }
    }
    CHECK_EQ(seen, 0xff);
    for (i = 0; i < 8; i++) {
        CHECK_EQ(async_runtime_remove(rt, fds[i][0]), 0);
        close(fds[i][0]);
        close(fds[i][1]);
    }
    async_runtime_deinit(rt);
}

static const test_case_t cases[] = {
    T(tv_huge), // poll adversarial
    T(tv_odd), // poll adversarial
    T(badargs), // poll adversarial
    T(fd_reuse), // poll adversarial
    T(posts_workers), // poll adversarial
    T(deinit_race), // poll adversarial
    T(eintr), // poll adversarial
    T(fork), // poll adversarial
    T(mix_timer), // poll adversarial
    T(mix_signal), // poll adversarial
    T(console_twice), // poll adversarial
    T(accept_storm), // poll adversarial
    T(nofile), // poll adversarial
    T(mix_deinit), // poll adversarial
    T(file_reuse_file), // poll adversarial
    T(file_reuse_sock), // poll adversarial
    T(example_console_closed_stdin), // poll adversarial
    T(example_dns_lost_output), // poll adversarial
    T(std_closed_probe), /* run by std_closed only (not a ctest) */
    T(std_closed), // poll adversarial
    T(wait_nomem), // poll adversarial
    T(wait_nomem_child), /* run by wait_nomem only (not a ctest) */
    T(modify_race), // poll adversarial
    T(high_fds), // poll adversarial
    T(example_console_emfile), // poll adversarial
};

TEST_MAIN(cases)
