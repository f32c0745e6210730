/* test_adversarial_rt.c — runtime and queue promises an adversarial tester
 * (reading only include/async.h) found broken (docs/RELIABILITY.md, "Found by
 * adversarial tests").
 *
 * Cases:
 *   poller_first_create  a host that never makes a runtime: its first queue
 *                     create starts Go's poller (before it can run out of fds)
 *   nofile_load       a host at its RLIMIT_NOFILE limit from the top of main,
 *                     before any libasync call: async_runtime_init fails with
 *                     ASYNC_E_SYS/EMFILE (or succeeds) and the process ends
 *                     normally: Go's initialization runs concurrently with
 *                     main, and Go's own poller must not abort it (child
 *                     processes).
 *   fd_rotation       with more ready fds than max_events, every ready fd is
 *                     reported within a bounded number of waits.
 *   fd_rotation_flood the same while another thread floods completions.
 *   ghost_remove      a registered fd closed without remove while a dup keeps
 *                     its file, the number reused by a file not added:
 *                     remove ends the old registration.
 *   drop_signal       a full DROP_OLDEST + SIGNAL_ON_DATA queue (capacity 1
 *                     and 2) posts one completion per empty -> non-empty
 *                     transition, not one per enqueue that drops the head.
 */
#include "check.h"

#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>

/* --- nofile_load ------------------------------------------------------------ */

/* The child: the very first thing main does (the case runs before any
 * libasync call) is to lower RLIMIT_NOFILE and take every free descriptor,
 * while Go's initialization may still be running on its own thread. */
static void t_nofile_load_child(void)
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

static void t_nofile_load(void)
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
static void t_poller_first_create_child(void)
{
    CHECK_EQ(count_eventpoll(), 0);
    async_queue_t *q = async_queue_create(4, 8, 0);
    CHECK(q != NULL);
    CHECK(count_eventpoll() >= 1);
    async_queue_destroy(q);
}

static void t_poller_first_create(void)
{
    if (getenv("ASYNC_TEST_EMULATOR") && *getenv("ASYNC_TEST_EMULATOR")) {
        printf("skipped under an emulator (its own descriptors are in /proc/self/fd)\n");
        return;
    }
    int st = run_self_case("poller_first_create_child", NULL);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
}

/* --- fdmap_context ---------------------------------------------------------- */

/* The C wait translates the records of live registrations itself (the fd map
 * of cabi/internal/rt/fdmap.c, kept by Go): once add, modify or remove has
 * returned, a wait must report the new context and events, never the old
 * registration's, and nothing for a removed fd. */
static void t_fdmap_context(void)
{
    async_runtime_t *rt = async_runtime_init();
    int p[2];
    io_event_t ev[8];
    CHECK(rt != NULL);
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(write(p[1], "x", 1), 1); /* p[0] stays readable, p[1] writable */
    for (uintptr_t i = 1; i <= 2000; i++) {
        CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, (void *)i), 0);
        int n = async_runtime_wait(rt, ev, 8, 1000);
        CHECK_EQ(n, 1);
        CHECK_EQ(ev[0].fd, p[0]);
        CHECK(ev[0].context == (void *)i);
        CHECK(ev[0].event_type == ASYNC_EVENT_READ);
        if (i % 2) {
            /* asked for WRITE only on a read end: no event at all */
            CHECK_EQ(async_runtime_modify(rt, p[0], ASYNC_EVENT_WRITE), 0);
            CHECK_EQ(async_runtime_wait(rt, ev, 8, 0), 0);
        }
        CHECK_EQ(async_runtime_remove(rt, p[0]), 0);
        CHECK_EQ(async_runtime_wait(rt, ev, 8, 0), 0);
        /* the write end under the next context */
        CHECK_EQ(async_runtime_add(rt, p[1], ASYNC_EVENT_WRITE, (void *)(i + 100000)), 0);
        n = async_runtime_wait(rt, ev, 8, 1000);
        CHECK_EQ(n, 1);
        CHECK(ev[0].fd == p[1] && ev[0].context == (void *)(i + 100000));
        CHECK(ev[0].event_type == ASYNC_EVENT_WRITE);
        CHECK_EQ(async_runtime_remove(rt, p[1]), 0);
    }
    close(p[0]);
    close(p[1]);
    async_runtime_deinit(rt);
}

/* --- wait_zero_ready -------------------------------------------------------- */

/* A wait with timeout 0 reports a ready fd every time, also the first wait
 * of a new runtime: the fd poll may be skipped while other events are ready,
 * never when the wait would then return nothing (the poll backend returned 0
 * in ~9 of 10 back-to-back waits, and both backends on the first one). */
static void t_wait_zero_ready(void)
{
    for (int round = 0; round < 20; round++) {
        async_runtime_t *rt = async_runtime_init();
        int p[2];
        io_event_t ev[4];
        CHECK(rt != NULL);
        CHECK_EQ(pipe(p), 0);
        CHECK_EQ(write(p[1], "x", 1), 1);
        CHECK_EQ(async_runtime_add(rt, p[0], ASYNC_EVENT_READ, (void *)7), 0);
        for (int i = 0; i < 100; i++) {
            int n = async_runtime_wait(rt, ev, 1 + i % 4, 0);
            if (n != 1)
                fprintf(stderr, "round %d, wait %d: %d events\n", round, i, n);
            CHECK_EQ(n, 1);
            CHECK(ev[0].context == (void *)7 && (ev[0].event_type & ASYNC_EVENT_READ));
        }
        close(p[0]);
        close(p[1]);
        async_runtime_deinit(rt);
    }
}

/* --- reuse_readd ------------------------------------------------------------ */

/* A registered fd closed without remove, its number reused by a new socket,
 * added again, while another thread waits: the add must succeed and the new
 * file's events carry the new context. A rebuild of the epoll set (after a
 * ghost) used to re-add the old registration for whatever file held the
 * number then: the add failed with EXISTS and the new file's hang-up came
 * with the old context (~1 in 200 iterations). */
static async_runtime_t *reuse_rt;
static atomic_int reuse_stop;

static void *reuse_waiter(void *arg)
{
    io_event_t ev[8];
    (void)arg;
    while (!atomic_load(&reuse_stop))
        async_runtime_wait(reuse_rt, ev, 8, 1);
    return NULL;
}

static void t_reuse_readd(void)
{
    pthread_t w;
    int prev = -1, fails = 0;
    reuse_rt = async_runtime_init();
    CHECK(reuse_rt != NULL);
    atomic_store(&reuse_stop, 0);
    start_thread(&w, reuse_waiter, NULL);
    for (uintptr_t g = 1; g <= 20000; g++) {
        int sv[2];
        if (prev >= 0)
            close(prev); /* registered, closed without remove */
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        if (async_runtime_add(reuse_rt, sv[0], ASYNC_EVENT_READ, (void *)g) != 0) {
            if (fails++ < 3)
                fprintf(stderr, "iteration %lu: add of fd %d failed: %s\n", (unsigned long)g, sv[0],
                        async_strerror(async_last_error()));
        }
        close(sv[1]); /* the registered file is now hung up (ready) */
        prev = sv[0];
    }
    atomic_store(&reuse_stop, 1);
    join_within(w, 10000, "reuse waiter");
    CHECK_EQ(fails, 0);
    close(prev);
    async_runtime_deinit(reuse_rt);
}

/* --- fd_rotation ------------------------------------------------------------ */

#define ROT_FDS 5
static async_runtime_t *rot_rt;
static atomic_int rot_stop;

static void *rot_flooder(void *arg)
{
    (void)arg;
    while (!atomic_load(&rot_stop)) {
        for (int i = 0; i < 256; i++)
            if (async_runtime_post_completion(rot_rt, 1, (uintptr_t)i) != 0)
                break;
        sleep_ms(1);
    }
    return NULL;
}

/* k always-ready fds (unread data in pipes), waits with max_events = max:
 * within every run of 2k fd events (2k waits without a flood) each of the k
 * fds has been reported. */
static void rotation(int k, int max, int flood)
{
    int p[ROT_FDS][2];
    long last[ROT_FDS];
    io_event_t ev[ROT_FDS];
    long fdev = 0;
    pthread_t t;
    CHECK(k <= ROT_FDS && max <= ROT_FDS);
    rot_rt = async_runtime_init();
    CHECK(rot_rt != NULL);
    for (int i = 0; i < k; i++) {
        CHECK(pipe(p[i]) == 0);
        CHECK(write(p[i][1], "x", 1) == 1);
        CHECK_EQ(async_runtime_add(rot_rt, p[i][0], ASYNC_EVENT_READ, (void *)(intptr_t)(i + 1)), 0);
        last[i] = 0;
    }
    atomic_store(&rot_stop, 0);
    if (flood)
        start_thread(&t, rot_flooder, NULL);
    /* bounded: without a flood every wait reports fds; with one, a poll
     * happens at least every 9th wait */
    for (long w = 0; w < 200000 && fdev < 40L * k; w++) {
        int n = async_runtime_wait(rot_rt, ev, max, 1000);
        CHECK(n >= 0);
        CHECK(flood || n > 0);
        for (int j = 0; j < n; j++) {
            if (ev[j].event_type == ASYNC_EVENT_COMPLETION)
                continue;
            int i = (int)(intptr_t)ev[j].context - 1;
            CHECK(i >= 0 && i < k);
            fdev++;
            last[i] = fdev;
        }
        for (int i = 0; i < k; i++) {
            if (fdev - last[i] > 2L * k) {
                fprintf(stderr, "k=%d max=%d flood=%d: fd %d not reported in the last %ld fd events\n", k, max,
                        flood, i, fdev - last[i]);
                CHECK(!"a ready fd starves");
            }
        }
    }
    CHECK(fdev >= 40L * k);
    atomic_store(&rot_stop, 1);
    if (flood)
        join_within(t, 10000, "flooder");
    for (int i = 0; i < k; i++) {
        CHECK_EQ(async_runtime_remove(rot_rt, p[i][0]), 0);
        close(p[i][0]);
        close(p[i][1]);
    }
    async_runtime_deinit(rot_rt);
}

static void t_fd_rotation(void)
{
    rotation(3, 1, 0);
    rotation(5, 2, 0);
    rotation(5, 1, 0);
    rotation(2, 1, 0);
}

static void t_fd_rotation_flood(void)
{
    rotation(3, 1, 1);
    rotation(5, 2, 1);
}

/* --- drop_signal -------------------------------------------------------------- */

/* Completions with key 7 that a few non-blocking waits hand out. */
static int drain_signals(async_runtime_t *rt)
{
    io_event_t ev[16];
    int got = 0;
    for (int i = 0; i < 20; i++) {
        int n = async_runtime_wait(rt, ev, 16, 0);
        CHECK(n >= 0);
        for (int j = 0; j < n; j++) {
            CHECK_EQ(ev[j].event_type, ASYNC_EVENT_COMPLETION);
            CHECK_EQ(ev[j].completion_key, 7);
            got++;
        }
    }
    return got;
}

static void drop_signal(size_t cap)
{
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    async_queue_t *q = async_queue_create(cap, 4, ASYNC_QUEUE_SIGNAL_ON_DATA | ASYNC_QUEUE_DROP_OLDEST);
    CHECK(q != NULL);
    CHECK_EQ(async_queue_attach(q, rt, 7), 0);
    char buf[4];
    size_t len;
    /* fill, then 5 more into the full queue: one transition, one post */
    for (size_t i = 0; i < cap + 5; i++)
        CHECK(async_queue_enqueue(q, "m", 1));
    CHECK_EQ(drain_signals(rt), 1);
    /* the queue stays full (never empty): no more posts */
    for (int i = 0; i < 5; i++)
        CHECK(async_queue_enqueue(q, "m", 1));
    CHECK_EQ(drain_signals(rt), 0);
    async_queue_stats_t st;
    async_queue_get_stats(q, &st);
    CHECK_EQ(st.current_size, cap);
    CHECK_EQ(st.dropped_count, 10);
    /* emptied, then filled again: one more post */
    for (size_t i = 0; i < cap; i++)
        CHECK(async_queue_dequeue(q, buf, sizeof buf, &len));
    for (int i = 0; i < 5; i++)
        CHECK(async_queue_enqueue(q, "m", 1));
    CHECK_EQ(drain_signals(rt), 1);
    async_queue_destroy(q);
    async_runtime_deinit(rt);
}

static void t_drop_signal(void)
{
    drop_signal(1);
    drop_signal(2);
    drop_signal(3);
}

/* --- ghost_remove ------------------------------------------------------------ */

/* A registered fd closed without remove while a dup keeps its file open, and
 * the number then reused by a file that is not added: epoll keeps the old
 * registration (keyed by the old file). async_runtime_remove of the number
 * must end it (it returned ASYNC_E_NOTFOUND, and the old file went on being
 * reported under the number with the old context for ever); afterwards the
 * number can be added for the new file and only the new file is reported. */
static void t_ghost_remove(void)
{
    static int old_ctx, new_ctx;
    io_event_t ev[8];
    int a[2], b[2];
    async_runtime_t *rt = async_runtime_init();
    CHECK(rt != NULL);
    CHECK_EQ(pipe(a), 0);
    int x = a[0];
    CHECK_EQ(async_runtime_add(rt, x, ASYNC_EVENT_READ, &old_ctx), 0);
    int keep = dup(x); /* keeps the old file open */
    CHECK(keep >= 0);
    close(x);
    CHECK_EQ(pipe(b), 0);
    if (b[0] != x) { /* the number x names the new pipe now, not added */
        CHECK_EQ(dup2(b[0], x), x);
        close(b[0]);
        b[0] = x;
    }
    CHECK_EQ(write(a[1], "g", 1), 1); /* the old file is readable */
    CHECK_EQ(async_runtime_remove(rt, x), 0);
    /* nothing is reported for x any more (the old file stays readable) */
    for (int i = 0; i < 5; i++) {
        int n = async_runtime_wait(rt, ev, 8, 20);
        CHECK(n >= 0);
        for (int j = 0; j < n; j++)
            CHECK(ev[j].fd != x);
    }
    CHECK_FAIL(async_runtime_remove(rt, x) == -1, ASYNC_E_NOTFOUND);
    /* the new file at x: added, reported with its own context only */
    CHECK_EQ(async_runtime_add(rt, x, ASYNC_EVENT_READ, &new_ctx), 0);
    CHECK_EQ(async_runtime_wait(rt, ev, 8, 0), 0);
    CHECK_EQ(write(b[1], "n", 1), 1);
    int seen = 0;
    for (int i = 0; i < 50 && !seen; i++) {
        int n = async_runtime_wait(rt, ev, 8, 100);
        CHECK(n >= 0);
        for (int j = 0; j < n; j++) {
            CHECK_EQ(ev[j].fd, x);
            CHECK(ev[j].context == &new_ctx);
            seen = 1;
        }
    }
    CHECK(seen);
    CHECK_EQ(async_runtime_remove(rt, x), 0);
    async_runtime_deinit(rt);
    close(keep);
    close(a[1]);
    close(b[0]);
    close(b[1]);
}

/* --- drop_nomem ------------------------------------------------------------- */

/* A full DROP_OLDEST queue whose enqueue fails with ASYNC_E_NOMEM (the new
 * message's slot cannot grow) must lose nothing: the head it would have
 * dropped stays, and dropped_count does not move. Before the fix the head
 * was dropped first, then NOMEM returned: two messages lost for one failed
 * call. A child process under RLIMIT_AS, so the allocation surely fails. */
static void t_drop_nomem_child(void)
{
    struct rlimit rl;
    char buf[8];
    size_t len;
    async_queue_stats_t st;
    /* slots are allocated per message up to max_msg (lazy slots) */
    async_queue_t *q = async_queue_create(2, (size_t)1 << 40, ASYNC_QUEUE_DROP_OLDEST);
    CHECK(q != NULL);
    CHECK(async_queue_enqueue(q, "A", 1));
    CHECK(async_queue_enqueue(q, "B", 1));
#if !defined(__SANITIZE_ADDRESS__)
    CHECK_EQ(getrlimit(RLIMIT_AS, &rl), 0);
    rl.rlim_cur = (rlim_t)1 << 40; /* far below what a 1 TiB slot needs, above what runs */
    CHECK_EQ(setrlimit(RLIMIT_AS, &rl), 0);
#else
    (void)rl; /* ASan's shadow needs more address space: its allocation cap does it (t_drop_nomem) */
#endif
    /* the huge message is never read: its slot cannot be allocated */
    static char small[1];
    CHECK_FAIL(!async_queue_enqueue(q, small, ((size_t)1 << 40) - 64), ASYNC_E_NOMEM);
    async_queue_get_stats(q, &st);
    CHECK_EQ(st.dropped_count, 0);
    CHECK_EQ(st.current_size, 2);
    CHECK(async_queue_dequeue(q, buf, sizeof buf, &len));
    CHECK(len == 1 && buf[0] == 'A');
    CHECK(async_queue_dequeue(q, buf, sizeof buf, &len));
    CHECK(len == 1 && buf[0] == 'B');
    /* and a DROP_OLDEST enqueue that fits still drops the head */
    CHECK(async_queue_enqueue(q, "C", 1));
    CHECK(async_queue_enqueue(q, "D", 1));
    CHECK(async_queue_enqueue(q, "E", 1));
    async_queue_get_stats(q, &st);
    CHECK_EQ(st.dropped_count, 1);
    CHECK(async_queue_dequeue(q, buf, sizeof buf, &len));
    CHECK(len == 1 && buf[0] == 'D');
    async_queue_destroy(q);
    exit(0);
}

static void t_drop_nomem(void)
{
    static char env[1024];
    if (getenv("ASYNC_TEST_EMULATOR")) {
        printf("skipped under an emulator: qemu-user does not apply RLIMIT_AS to the guest\n");
        return;
    }
    const char *old = getenv("ASAN_OPTIONS");
    snprintf(env, sizeof env, "ASAN_OPTIONS=%s%sallocator_may_return_null=1:max_allocation_size_mb=1024",
             old ? old : "", old && *old ? ":" : "");
    int st = run_self_case("drop_nomem_child", env);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
}

/* --- nofile_kept ------------------------------------------------------------- */

/* Go's runtime raises the soft RLIMIT_NOFILE to the hard limit while it
 * initializes, concurrently with the host's main (a select(2) host at 1024
 * found itself at hard - 1, and fds above FD_SETSIZE). The host's limit must
 * stay: the one it started with, or the one it sets at the top of main. */
static void t_nofile_kept_child(void)
{
    struct rlimit at_start, now;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &at_start), 0);
    async_runtime_t *rt = async_runtime_init(); /* Go's initialization is done once this returns */
    CHECK(rt != NULL);
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
    CHECK_EQ(now.rlim_cur, at_start.rlim_cur);
    CHECK_EQ(now.rlim_max, at_start.rlim_max);
    async_runtime_deinit(rt);
    exit(0);
}

static void t_nofile_host_child(void)
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

static void t_nofile_kept(void)
{
    struct rlimit saved, low;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
    if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < 300) {
        printf("skipped: hard limit %lu too low\n", (unsigned long)saved.rlim_max);
        return;
    }
    low = saved;
    low.rlim_cur = 256; /* the children start with it (well below hard - 1) */
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
    int st1 = run_self_case("nofile_kept_child", NULL);
    int st2 = run_self_case("nofile_host_child", NULL);
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
    CHECK(WIFEXITED(st1) && WEXITSTATUS(st1) == 0);
    CHECK(WIFEXITED(st2) && WEXITSTATUS(st2) == 0);
}

/* --- worker_huge_stack --------------------------------------------------------- */

static void *huge_proc(void *arg)
{
    return arg;
}

/* async_worker_create with absurd stack sizes: INVAL only when rounding up
 * to the page size overflows, NOMEM for any other stack the system cannot
 * provide (SIZE_MAX - 4096 gave ASYNC_E_SYS with EINVAL from pthread_create,
 * while its page-rounded value gave INVAL). */
static void t_worker_huge_stack(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t inval[] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - (page - 2)};
    size_t nomem[] = {SIZE_MAX - (page - 1), SIZE_MAX - page, SIZE_MAX - 65535, (size_t)1 << 62, (size_t)1 << 50};
    for (size_t i = 0; i < sizeof inval / sizeof inval[0]; i++)
        CHECK_FAIL(async_worker_create(huge_proc, NULL, inval[i]) == NULL, ASYNC_E_INVAL);
    for (size_t i = 0; i < sizeof nomem / sizeof nomem[0]; i++) {
        async_clear_error();
        async_worker_t *w = async_worker_create(huge_proc, NULL, nomem[i]);
        if (w) { /* a system that could (overcommit): fine, it must work */
            CHECK(async_worker_join(w, 10000));
            async_worker_destroy(w);
            continue;
        }
        if (async_last_error() != ASYNC_E_NOMEM)
            fprintf(stderr, "stack_size %#zx: error %d, os error %d\n", nomem[i], async_last_error(),
                    async_last_os_error());
        CHECK_ERR(ASYNC_E_NOMEM);
    }
}

static const test_case_t cases[] = {
    T(nofile_load), // poll timeout=120 adversarial
    T(poller_first_create), // poll adversarial
    T(fdmap_context), // poll adversarial
    T(wait_zero_ready), // poll adversarial
    T(reuse_readd), // poll adversarial
    T(fd_rotation), // poll adversarial
    T(fd_rotation_flood), // poll timeout=120 adversarial
    T(drop_signal), // poll adversarial
    T(ghost_remove), // poll adversarial
    T(drop_nomem), // poll adversarial
    T(nofile_kept), // poll adversarial
    T(worker_huge_stack), // poll adversarial
    {"nofile_load_child", t_nofile_load_child}, /* run by nofile_load; not a ctest case */
    {"poller_first_create_child", t_poller_first_create_child}, /* run by poller_first_create */
    {"drop_nomem_child", t_drop_nomem_child},                   /* run by drop_nomem */
    {"nofile_kept_child", t_nofile_kept_child},                 /* run by nofile_kept */
    {"nofile_host_child", t_nofile_host_child},                 /* run by nofile_kept */
};

TEST_MAIN(cases)
