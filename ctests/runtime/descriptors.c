/* The descriptors of the library: close-on-exec, none leaked by a runtime's
 * life, Go's poller started by the first queue create (before a host can run
 * out of fds), and life at the RLIMIT_NOFILE limit: from the top of main,
 * with runtimes created and collected by Go's GC, with many runtimes; the
 * soft limit the host set is kept. */
#include "check.h"
#include "rt.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>

/* --- descriptors -------------------------------------------------------- */

#define MAX_FDS 4096

/* Marks open fds in set[]; returns how many. */
static int list_fds(unsigned char *set)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    CHECK(d != NULL);
    memset(set, 0, MAX_FDS);
    while ((e = readdir(d)) != NULL) {
        int fd;
        if (e->d_name[0] == '.')
            continue;
        fd = atoi(e->d_name);
        if (fd == dirfd(d))
            continue;
        CHECK(fd >= 0 && fd < MAX_FDS);
        set[fd] = 1;
        n++;
    }
    closedir(d);
    return n;
}

CASE(cloexec) // poll
{
    static unsigned char before[MAX_FDS], after[MAX_FDS];
    async_runtime_t *rt, *rt2;
    io_event_t ev[4];
    int p[2], fd, fresh = 0;
    CHECK(pipe(p) == 0);
    list_fds(before);
    rt = mkrt();
    rt2 = mkrt();
    CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, NULL), 0);
    CHECK(async_runtime_add_timer(rt, 0, 0, 1) != 0);
    CHECK(async_runtime_add_timer(rt2, 10, 10, 1) != 0);
    CHECK_EQ(async_runtime_post_completion(rt, 1, 2), 0);
    CHECK_EQ(async_runtime_wakeup(rt2), 0);
    CHECK(wait_some(rt, ev, 4, 5000) >= 1);
    (void)wait_ok(rt2, ev, 4, 50);
    list_fds(after);
    for (fd = 0; fd < MAX_FDS; fd++) {
        int fl;
        if (!after[fd] || before[fd])
            continue;
        fresh++;
        fl = fcntl(fd, F_GETFD);
        if (fl == -1) /* closed meanwhile by the library: fine */
            continue;
        if (!(fl & FD_CLOEXEC))
            fprintf(stderr, "fd %d opened by the library lacks FD_CLOEXEC\n", fd);
        CHECK(fl & FD_CLOEXEC);
    }
    CHECK(fresh >= 1); /* a runtime does open descriptors */
    CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
    async_runtime_deinit(rt);
    async_runtime_deinit(rt2);
    close_pair(p);
}

CASE(fd_leak) // poll
{
    /* init/deinit cycles do not leak descriptors */
    static unsigned char s1[MAX_FDS], s2[MAX_FDS];
    io_event_t ev[2];
    int i, n1, n2;
    for (i = 0; i < 3; i++) {
        async_runtime_t *rt = mkrt();
        CHECK(async_runtime_add_timer(rt, 0, 0, 1) != 0);
        (void)wait_some(rt, ev, 2, 1000);
        async_runtime_deinit(rt);
    }
    sleep_ms(50);
    n1 = list_fds(s1);
    for (i = 0; i < 50; i++) {
        async_runtime_t *rt = mkrt();
        CHECK(async_runtime_add_timer(rt, 0, 0, 1) != 0);
        CHECK_EQ(async_runtime_post_completion(rt, 1, 1), 0);
        (void)wait_some(rt, ev, 2, 1000);
        async_runtime_deinit(rt);
    }
    sleep_ms(50);
    n2 = list_fds(s2);
    if (n2 != n1)
        fprintf(stderr, "open fds: %d before, %d after 50 init/deinit cycles\n", n1, n2);
    CHECK(n2 <= n1);
}

/* --- nofile_load ------------------------------------------------------------ */

/* The child: the very first thing main does (the case runs before any
 * libasync call) is to lower RLIMIT_NOFILE and take every free descriptor,
 * while Go's initialization may still be running on its own thread. */
CHILD(nofile_load_child)
{
    struct rlimit rl = {64, 64};
    int fds[256], nfd = 0, fd;
    CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    while (nfd < 256 && (fd = open("/dev/null", O_RDONLY)) >= 0)
        fds[nfd++] = fd;
    CHECK(errno == EMFILE);
    async_runtime_t *rt = async_runtime_init();
    if (rt) {
        async_runtime_deinit(rt);
    } else {
        CHECK_ERR(ASYNC_E_SYS);
        CHECK_EQ(async_last_os_error(), EMFILE);
    }
    /* with two descriptors back, a runtime works */
    close(fds[--nfd]);
    close(fds[--nfd]);
    rt = async_runtime_init();
    CHECK(rt != NULL);
    io_event_t ev[2];
    CHECK_EQ(async_runtime_post_completion(rt, 1, 2), 0);
    CHECK_EQ(async_runtime_wait(rt, ev, 2, 1000), 1);
    async_runtime_deinit(rt);
    while (nfd > 0)
        close(fds[--nfd]);
}

CASE(nofile_load) // poll timeout=120 adversarial
{
    for (int i = 0; i < 5; i++) {
        int st = run_self_case("nofile_load_child", NULL);
        CHECK(WIFEXITED(st));
        CHECK_EQ(WEXITSTATUS(st), 0);
    }
}

/* --- poller_first_create ---------------------------------------------------- */

/* Go's own epoll descriptors in this process (anon_inode:[eventpoll]). */
static int count_eventpoll(void)
{
    char path[64], link[128];
    int n = 0;
    for (int fd = 0; fd < 1024; fd++) {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t k = readlink(path, link, sizeof link - 1);
        if (k <= 0)
            continue;
        link[k] = 0;
        if (strcmp(link, "anon_inode:[eventpoll]") == 0)
            n++;
    }
    return n;
}

/* The child: a host that never makes a runtime (queues, workers, fibers
 * only) still gets Go's poller started by its first create, before it can
 * run out of descriptors; otherwise Go starts it lazily (after a garbage
 * collection), and at the descriptor limit that aborts the process. */
CHILD(poller_first_create_child)
{
    CHECK_EQ(count_eventpoll(), 0);
    async_queue_t *q = async_queue_create(4, 8, 0);
    CHECK(q != NULL);
    CHECK(count_eventpoll() >= 1);
    async_queue_destroy(q);
}

CASE(poller_first_create) // poll adversarial
{
    if (getenv("ASYNC_TEST_EMULATOR") && *getenv("ASYNC_TEST_EMULATOR")) {
        printf("skipped under an emulator (its own descriptors are in /proc/self/fd)\n");
        return;
    }
    int st = run_self_case("poller_first_create_child", NULL);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
}

/* --- nofile_kept ------------------------------------------------------------- */

/* Go's runtime raises the soft RLIMIT_NOFILE to the hard limit while it
 * initializes, concurrently with the host's main; the host's limit must
 * stay (a select(2) host at 1024 must not get fds above FD_SETSIZE): the
 * one it started with, or the one it sets at the top of main. */
/* The soft limit nofile_kept starts its children with. A child compares
 * against it, not against a limit read at the top of its main: Go's
 * initialization runs concurrently and the limit it holds for a moment
 * (docs/EMBEDDING.md) may be what such a read sees. */
#define NOFILE_START 256

CHILD(nofile_kept_child)
{
    struct rlimit now;
    async_runtime_t *rt = async_runtime_init(); /* Go's initialization is done once this returns */
    CHECK(rt != NULL);
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
    CHECK_EQ(now.rlim_cur, NOFILE_START);
    async_runtime_deinit(rt);
    exit(0);
}

CHILD(nofile_host_child)
{
    struct rlimit rl, now;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    rl.rlim_cur = 100; /* the host's own choice, while Go may still be initializing */
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    sleep_ms(50);
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
    CHECK_EQ(now.rlim_cur, 100);
    async_runtime_deinit(rt);
    exit(0);
}

CASE(nofile_kept) // poll adversarial
{
    struct rlimit saved, low;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
    if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < 300) {
        printf("skipped: hard limit %lu too low\n", (unsigned long)saved.rlim_max);
        return;
    }
    low = saved;
    low.rlim_cur = NOFILE_START; /* well below hard - 1 */
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
    int st1 = run_self_case("nofile_kept_child", NULL);
    int st2 = run_self_case("nofile_host_child", NULL);
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
    CHECK(WIFEXITED(st1) && WEXITSTATUS(st1) == 0);
    CHECK(WIFEXITED(st2) && WEXITSTATUS(st2) == 0);
}

/* --- nofile_gc ------------------------------------------------------------- */

/* The child: every descriptor taken but the two a runtime needs, runtimes
 * made and destroyed (Go allocates, GOGC=1 collects often); then the table
 * is full for good and the Go heap is churned again. Go's own poller starts
 * with the first Go timer (the scavenger's, after a GC): it must have
 * started before the table filled up, or the process aborts. */
CHILD(nofile_child)
{
    struct rlimit rl;
    int fds[256], nfd = 0, fd;
    io_event_t ev[8];
    /* Go's initialization runs on its own thread when the library loads and
     * raises RLIMIT_NOFILE's soft limit: have it done before lowering. */
    async_runtime_deinit(mkrt());
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    rl.rlim_cur = 64;
    CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    while (nfd < 256 && (fd = open("/dev/null", O_RDONLY)) >= 0)
        fds[nfd++] = fd;
    CHECK(errno == EMFILE);
    CHECK(nfd >= 4);
    close(fds[--nfd]);
    close(fds[--nfd]);
    double t0 = now_ms();
    for (int i = 0; now_ms() - t0 < 1500; i++) {
        async_runtime_t *rt = async_runtime_init();
        if (!rt) {
            CHECK(async_last_error() == ASYNC_E_SYS || async_last_error() == ASYNC_E_NOMEM);
            continue;
        }
        /* the table may be full here: fail cleanly, never abort */
        async_runtime_t *rt2 = async_runtime_init();
        if (rt2)
            async_runtime_deinit(rt2);
        CHECK(async_runtime_post_completion(rt, 1, (uintptr_t)i) == 0);
        uint64_t id = async_runtime_add_timer(rt, 3600000, 0, 2);
        CHECK(id != 0);
        CHECK(async_runtime_wait(rt, ev, 8, 0) == 1);
        CHECK_EQ(async_runtime_cancel_timer(rt, id), 0);
        sleep_ms(1);
        async_runtime_deinit(rt);
    }
    while (nfd < 256 && (fd = open("/dev/null", O_RDONLY)) >= 0)
        fds[nfd++] = fd;
    for (int i = 0; i < 20000; i++) {
        async_runtime_t *rt = async_runtime_init();
        CHECK(rt == NULL);
        if (i % 1000 == 0)
            sleep_ms(2);
    }
    while (nfd > 0)
        close(fds[--nfd]);
    printf("nofile_child: done\n");
}

CASE(nofile_gc) // poll
{
    int st = run_self_case("nofile_child", "GOGC=1");
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
}

/* ---- RLIMIT_NOFILE, many runtimes ---------------------------------------------- */

CASE(nofile_many) // poll adversarial
{
    /* Warm up the library (Go's poller) before lowering the limit. */
    async_runtime_t *first = async_runtime_init();
    CHECK(first);
    struct rlimit old, lim;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
    int maxfd = 0;
    for (int fd = 0; fd < 1024; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            maxfd = fd;
    lim = old;
    lim.rlim_cur = (rlim_t)maxfd + 40;
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &lim), 0);
    /* Fill every free number (holes below maxfd too), then free 30. */
    static int fill[1100];
    int nfill = 0;
    for (;;) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            break;
        CHECK(nfill < 1100);
        fill[nfill++] = fd;
    }
    CHECK(nfill >= 30);
    for (int i = 0; i < 30; i++)
        close(fill[--nfill]);
    async_runtime_t *rts[200];
    int n = 0;
    for (; n < 200; n++) {
        async_clear_error();
        rts[n] = async_runtime_init();
        if (!rts[n]) {
            CHECK_ERR(ASYNC_E_SYS);
            break;
        }
    }
    CHECK(n > 0 && n < 200);
    /* Every runtime still works at the limit. */
    io_event_t ev[4];
    for (int i = 0; i < n; i++) {
        CHECK_EQ(async_runtime_post_completion(rts[i], (uintptr_t)i, 1), 0);
        CHECK_EQ(async_runtime_wakeup(rts[i]), 0);
        CHECK_EQ(async_runtime_add_timer(rts[i], 0, 0, 9) != 0, 1);
    }
    for (int i = 0; i < n; i++) {
        int got = 0, timer = 0;
        for (int k = 0; k < 10 && !(got && timer); k++) {
            int m = async_runtime_wait(rts[i], ev, 4, 1000);
            CHECK(m >= 0);
            for (int j = 0; j < m; j++) {
                if (ev[j].event_type == ASYNC_EVENT_COMPLETION) {
                    CHECK_EQ(ev[j].completion_key, i);
                    got++;
                } else {
                    CHECK_EQ(ev[j].event_type, ASYNC_EVENT_TIMER);
                    timer++;
                }
            }
        }
        CHECK_EQ(got, 1);
        CHECK_EQ(timer, 1);
    }
    for (int i = 0; i < n; i++)
        async_runtime_deinit(rts[i]);
    /* The descriptors came back: as many again. */
    int m = 0;
    for (; m < n; m++) {
        rts[m] = async_runtime_init();
        CHECK(rts[m]);
    }
    for (int i = 0; i < m; i++)
        async_runtime_deinit(rts[i]);
    for (int i = 0; i < nfill; i++)
        close(fill[i]);
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
    async_runtime_deinit(first);
}

TEST_MAIN()
