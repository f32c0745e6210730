/* Classic registrations whose fds are closed and reused: a socket or a
 * regular file closed without remove, its number reused by a socket or a
 * file, reports only for the new registration; a context changed from
 * another thread while the main loop waits is never torn (each event
 * carries one of the contexts set). Registered for epoll and poll. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>

#define ASYNC_TEST_CLASSIC /* the classic headers and check.h (rt.h) */
#include "rt.h"

/* ---- fds closed and reused while registered ---------------------------------------- */

CASE(fd_reuse) // poll adversarial
{
    async_runtime_t *rt = async_runtime_init();
    int sp[2], sp2[2], a, b, n, i, seen;
    CHECK(rt);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    CHECK_EQ(async_runtime_add(rt, sp[0], EVENT_READ, &a), 0);
    close_pair(sp);
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
    close_pair(sp2);
    async_runtime_deinit(rt);
}

static int tmpfile_fd(const char *content)
{
    char path[] = "/tmp/classic_fileXXXXXX";
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
 * once as ERROR|CLOSE and never again (docs/CLASSIC_API.md), never the new
 * file's readiness with the old context; the new file can then be added. */
CASE(file_reuse_file) // poll adversarial
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
CASE(file_reuse_sock) // poll adversarial
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
 * than #k (docs/CLASSIC_API.md: events reported after the call carry the new context). */
CASE(modify_race) // poll adversarial
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
    close_pair(sp);
    async_runtime_deinit(rt);
}

TEST_MAIN()
