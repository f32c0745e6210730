/* The classic loop with many descriptors: an accept storm of clients that
 * vanish, a low RLIMIT_NOFILE (accept fails with EMFILE and the loop goes
 * on), and descriptors above 1024 (FD_SETSIZE) on both backends.
 * Registered for epoll and poll. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>

#define ASYNC_TEST_CLASSIC /* the classic headers and check.h (rt.h) */
#include "rt.h"

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

CASE(accept_storm) // poll adversarial
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

CASE(nofile) // poll adversarial
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

/* ---- descriptors above 1024 (FD_SETSIZE), both backends ------------------------------------ */

CASE(high_fds) // poll adversarial
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
        close_pair(sp);
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
        close_pair(fds[i]);
    }
    async_runtime_deinit(rt);
}

TEST_MAIN()
