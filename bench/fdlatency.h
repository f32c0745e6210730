/*
 * The wake of fdlatency_*.c: the sender writes one byte to a non-blocking
 * pipe whose read end the loop thread waits on (latency.h's protocol).
 */
#ifndef FDLATENCY_H
#define FDLATENCY_H

#include "latency.h"

#include <fcntl.h>
#include <unistd.h>

static int pfd[2]; /* [0]: the loop's read end; [1]: the sender's */

static void sender_thread_start(void) {}

static void send_wake(uint64_t t0) {
    (void)t0;
    if (write(pfd[1], "x", 1) != 1) FAIL("pipe write: %s", strerror(errno));
}

/* latency_setup, then the pipe. */
static void fdlatency_setup(int argc, char **argv) {
    latency_setup(argc, argv);
    if (pipe2(pfd, O_NONBLOCK | O_CLOEXEC) != 0) FAIL("pipe: %s", strerror(errno));
}

#endif
