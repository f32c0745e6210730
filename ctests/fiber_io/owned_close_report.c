/* The log hook's report of an owned descriptor closed with close(2): when
 * its number is owned again (async_fiber_fd_open by the same or another
 * scheduler, async_fiber_accept or async_fiber_listen handing the number
 * out), one ASYNC_LOG_WARN message names the fd. An fd closed with
 * async_fiber_close, and one left open by async_sched_destroy, are never
 * reported. The hook runs with no lock of the library held: it may call
 * the library (here async_fiber_close). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "net.h"

static atomic_int reports, report_level, report_fd;
static int hook_close_fd = -1; /* a spare fd the hook closes through the library */

static void hook(int level, const char *msg, void *ctx) {
    (void)ctx;
    int fd = -1;
    if (sscanf(msg, "fd %d: owned descriptor was closed with close(2)", &fd) != 1) return;
    atomic_store(&report_level, level);
    atomic_store(&report_fd, fd);
    atomic_fetch_add(&reports, 1);
    if (hook_close_fd >= 0) {
        CHECK_EQ(async_fiber_close(hook_close_fd), 0); /* takes the ownership lock */
        hook_close_fd = -1;
    }
}

static void hook_on(void) {
    atomic_store(&reports, 0);
    atomic_store(&report_fd, -1);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    close(p[1]);
    hook_close_fd = p[0];
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, hook, NULL), 0);
}

static void hook_off(void) {
    CHECK_EQ(async_set_log_handler(ASYNC_LOG_WARN, NULL, NULL), 0);
    if (hook_close_fd >= 0) close(hook_close_fd);
    hook_close_fd = -1;
}

static void expect_report(int fd) {
    CHECK_EQ(atomic_load(&reports), 1);
    CHECK_EQ(atomic_load(&report_level), ASYNC_LOG_WARN);
    CHECK_EQ(atomic_load(&report_fd), fd);
}

/* An open socket now under number fd (which must be free). */
static void reuse_number(int fd) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    if (sv[0] != fd) {
        CHECK_EQ(dup2(sv[0], fd), fd);
        close(sv[0]);
    }
    close(sv[1]);
}

/* An fd owned by s, then closed with close(2) (the bug reported). */
static int owned_then_closed(async_sched_t *s) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    CHECK_EQ(async_fiber_fd_open(s, sv[0]), 0);
    close(sv[1]);
    close(sv[0]);
    return sv[0];
}

CASE(report_at_fd_open_same_sched) { // notsan
    async_sched_t *s = sched_new(1);
    hook_on();
    int fd = owned_then_closed(s);
    reuse_number(fd);
    CHECK_EQ(atomic_load(&reports), 0);
    CHECK_EQ(async_fiber_fd_open(s, fd), 0);
    expect_report(fd);
    CHECK_EQ(hook_close_fd, -1); /* the hook's library call returned */
    CHECK_EQ(async_fiber_close(fd), 0);
    hook_off();
    async_sched_destroy(s);
}

CASE(report_at_fd_open_other_sched) { // notsan
    async_sched_t *s1 = sched_new(1), *s2 = sched_new(1);
    hook_on();
    int fd = owned_then_closed(s1);
    reuse_number(fd);
    CHECK_EQ(async_fiber_fd_open(s2, fd), 0);
    expect_report(fd);
    CHECK_EQ(async_fiber_close(fd), 0);
    hook_off();
    async_sched_destroy(s1);
    async_sched_destroy(s2);
}

/* ---- numbers handed out by accept and listen --------------------------------------- */

typedef struct {
    int stale, got;
    struct sockaddr_in addr;
} handout_t;

/* On a fiber: an owned fd closed with close(2); then its number comes back
 * from accept on an owned listener (the lowest free number, if no other
 * thread takes it first: then no report is due and none is checked). */
static void accept_handout(void *arg) {
    handout_t *x = arg;
    struct sockaddr_storage ss;
    socklen_t l;
    CHECK_EQ(async_sockaddr_parse("127.0.0.1", 0, &ss, &l), 0);
    int lfd = async_fiber_listen((struct sockaddr *)&ss, l, 4, 0);
    CHECK(lfd >= 0);
    l = sizeof ss;
    CHECK_EQ(getsockname(lfd, (struct sockaddr *)&ss, &l), 0);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(c >= 0);
    CHECK_EQ(async_fiber_connect(c, (struct sockaddr *)&ss, l, 20000), 0);
    x->stale = owned_then_closed(NULL);
    x->got = async_fiber_accept(lfd, NULL, NULL, 20000);
    CHECK(x->got >= 0);
    CHECK_EQ(async_fiber_close(x->got), 0);
    close(c);
    CHECK_EQ(async_fiber_close(lfd), 0);
}

static void listen_handout(void *arg) {
    handout_t *x = arg;
    x->stale = owned_then_closed(NULL);
    struct sockaddr_storage ss;
    socklen_t l;
    CHECK_EQ(async_sockaddr_parse("127.0.0.1", 0, &ss, &l), 0);
    x->got = async_fiber_listen((struct sockaddr *)&ss, l, 4, 0);
    CHECK(x->got >= 0);
    CHECK_EQ(async_fiber_close(x->got), 0);
}

static void handout(void (*fn)(void *)) {
    async_sched_t *s = sched_new(1);
    hook_on();
    handout_t x = {-1, -1, {0}};
    on_fiber(s, fn, &x);
    if (x.got == x.stale) {
        expect_report(x.stale);
    } else {
        printf("number %d taken by another thread meanwhile (got %d): report not checked\n", x.stale, x.got);
        CHECK_EQ(atomic_load(&reports), 0);
    }
    hook_off();
    async_sched_destroy(s);
}

CASE(report_at_accept) { handout(accept_handout); } // uring notsan
CASE(report_at_listen) { handout(listen_handout); } // uring notsan

/* ---- no report for an fd closed the right way ---------------------------------------------- */

CASE(no_report_after_async_fiber_close_or_destroy) {
    async_sched_t *s = sched_new(1);
    hook_on();
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    CHECK_EQ(async_fiber_fd_open(s, sv[0]), 0);
    CHECK_EQ(async_fiber_close(sv[0]), 0);
    reuse_number(sv[0]);
    CHECK_EQ(async_fiber_fd_open(s, sv[0]), 0);
    /* left open, owned by nobody, when its scheduler goes */
    async_sched_destroy(s);
    close(sv[0]);
    reuse_number(sv[0]);
    s = sched_new(1);
    CHECK_EQ(async_fiber_fd_open(s, sv[0]), 0);
    CHECK_EQ(async_fiber_close(sv[0]), 0);
    close(sv[1]);
    CHECK_EQ(atomic_load(&reports), 0);
    hook_off();
    async_sched_destroy(s);
}

TEST_MAIN()
