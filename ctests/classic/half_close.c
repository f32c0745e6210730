/* A client's shutdown(SHUT_WR) over TCP, as a classic driver sees it: its
 * data, then EVENT_READ alone (never EVENT_CLOSE) with a 0-byte read; the
 * driver can still answer the half-closed client, which reads the answer.
 * A full close by the client after that is again READ (0 bytes) for the
 * classic registration. Registered for epoll and poll. */
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#define ASYNC_TEST_CLASSIC /* the classic headers and check.h (rt.h) */
#include "rt.h"

/* The next event of rt, which must be one READ for fd (exactly that type). */
static void expect_read_only(async_runtime_t *rt, int fd)
{
    CHECK_EQ(waittv(rt, 10, 0), 1);
    CHECK_EQ(ev[0].fd, fd);
    CHECK_EQ(ev[0].event_type, EVENT_READ);
}

CASE(half_close_read_then_zero) // poll
{
    async_runtime_t *rt = async_runtime_init();
    struct sockaddr_in addr;
    int l = loopback_listener(4, &addr), c, s, i, got_data = 0, ended = 0;
    char buf[16];
    CHECK(rt);
    c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(c >= 0);
    CHECK_EQ(connect(c, (struct sockaddr *)&addr, sizeof addr), 0);
    s = accept(l, NULL, NULL);
    CHECK(s >= 0);
    CHECK_EQ(fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK), 0);
    CHECK_EQ(async_runtime_add(rt, s, EVENT_READ, NULL), 0);

    CHECK_EQ(write(c, "hi", 2), 2);
    CHECK_EQ(shutdown(c, SHUT_WR), 0);
    /* the data first (one or two reads), then the end: READ each time */
    for (i = 0; i < 2 && !ended; i++) {
        expect_read_only(rt, s);
        ssize_t r = read(s, buf, sizeof buf);
        if (r == 0) {
            ended = 1;
        } else {
            CHECK_EQ(r, 2);
            CHECK(memcmp(buf, "hi", 2) == 0);
            got_data = 1;
        }
    }
    CHECK(got_data && ended);
    /* the half-closed client still reads the answer */
    CHECK_EQ(write(s, "bye", 3), 3);
    CHECK_EQ(read(c, buf, sizeof buf), 3);
    CHECK(memcmp(buf, "bye", 3) == 0);
    /* still READ (the end stays readable), and no CLOSE */
    expect_read_only(rt, s);
    CHECK_EQ(read(s, buf, sizeof buf), 0);
    /* the client's full close changes nothing for the classic registration */
    close(c);
    expect_read_only(rt, s);
    CHECK_EQ(read(s, buf, sizeof buf), 0);

    CHECK_EQ(async_runtime_remove(rt, s), 0);
    close(s);
    close(l);
    async_runtime_deinit(rt);
}

TEST_MAIN()
