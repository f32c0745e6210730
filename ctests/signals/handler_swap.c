/* The swap of a signal's action loses no signal: while libasync's handler
 * is installed and removed over and over (the first user of a signal
 * replaces the host's action, the last one puts it back), every signal
 * that arrives is taken by a libasync user that is still registered or
 * acted on by the host's action, never by neither. With the dump on a
 * signal (async_sched_dump_on_signal) each arrival is seen at once (a dump
 * in a file or a host handler call), so every one is checked; with a
 * runtime's watch, a signal the handler counted for the watch goes with
 * the watch's removal (async_runtime_remove_signal drops the counts not
 * delivered yet), so there the churn checks that signals landing on the
 * swapping thread itself (re-raised while the swap runs) end and that the
 * host's action is back and working. */
#include "check.h"
#include "rt.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/stat.h>

static atomic_int host_calls;
static void host_count(int sig)
{
    (void)sig;
    atomic_fetch_add(&host_calls, 1);
}

static int host_installed(int sig)
{
    struct sigaction cur;
    CHECK_EQ(sigaction(sig, NULL, &cur), 0);
    return !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == host_count;
}

static off_t fd_size(int fd)
{
    struct stat st;
    CHECK_EQ(fstat(fd, &st), 0);
    return st.st_size;
}

/* ---- the dump on a signal ----------------------------------------------------- */

typedef struct {
    int sig, fd;
    atomic_int stop;
    long sent, hosted, dumped, lost;
} dump_sender_t;

/* Raises sig on its own thread, one at a time: raise returns once the
 * handler ran (a signal libasync hands back comes again at the handler's
 * return, before that), so each one is classified at once: a host handler
 * call, or a dump written to the file, or neither (lost). */
static void *dump_sender(void *arg)
{
    dump_sender_t *d = arg;
    while (!atomic_load(&d->stop)) {
        int h0 = atomic_load(&host_calls);
        CHECK_EQ(raise(d->sig), 0);
        int h = atomic_load(&host_calls) - h0;
        int dumped = fd_size(d->fd) > 0;
        CHECK(h <= 1);
        CHECK(!(h && dumped)); /* taken by one of the two, not both */
        d->sent++;
        d->hosted += h;
        d->dumped += dumped;
        d->lost += !h && !dumped;
        if (dumped) CHECK_EQ(ftruncate(d->fd, 0), 0); /* O_APPEND: the next dump starts the file again */
    }
    return NULL;
}

CASE(swap_dump_loses_none) // timeout=120
{
    const int sig = SIGUSR1, cycles = 5000;
    install_handler(sig, host_count, SA_RESTART);
    async_sched_t *s = sched_new(1);
    char path[] = "/tmp/async_swap_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK_EQ(unlink(path), 0);
    CHECK_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_APPEND), 0);

    dump_sender_t d = {.sig = sig, .fd = fd};
    pthread_t th;
    start_thread(&th, dump_sender, &d);
    double t0 = now_ms();
    int i;
    for (i = 0; i < cycles && now_ms() - t0 < 60000; i++) {
        CHECK_EQ(async_sched_dump_on_signal(s, sig, fd), 0);
        if (i % 4 == 0) sched_yield(); /* now and then a longer stretch with the dump on */
        CHECK_EQ(async_sched_dump_on_signal(s, 0, fd), 0);
    }
    atomic_store(&d.stop, 1);
    join_within(th, 30000, "sender");
    printf("%d cycles: %ld signals, %ld to the host, %ld dumped, %ld lost\n", i, d.sent, d.hosted, d.dumped,
           d.lost);
    CHECK_EQ(d.lost, 0);
    CHECK_EQ(d.sent, d.hosted + d.dumped);
    CHECK(host_installed(sig));
    /* The host's action works on its own again. */
    int h0 = atomic_load(&host_calls);
    CHECK_EQ(raise(sig), 0);
    CHECK_EQ(atomic_load(&host_calls), h0 + 1);
    close(fd);
    async_sched_destroy(s);
    install_handler(sig, SIG_DFL, 0);
}

/* ---- a runtime's watch ------------------------------------------------------- */

typedef struct {
    int sig;
    pthread_t target; /* the thread that swaps */
    atomic_int stop;
    atomic_long sent;
} watch_sender_t;

/* Sends sig to the swapping thread (the handler runs inside its add and
 * remove calls) and raises it on its own thread, in turn. */
static void *watch_sender(void *arg)
{
    watch_sender_t *w = arg;
    for (long n = 0; !atomic_load(&w->stop); n++) {
        if (n & 1)
            CHECK_EQ(pthread_kill(w->target, w->sig), 0);
        else
            CHECK_EQ(raise(w->sig), 0);
        atomic_fetch_add(&w->sent, 1);
        if ((n & 31) == 0) sched_yield();
    }
    return NULL;
}

CASE(swap_watch_churn) // poll
{
    const int sig = SIGUSR2, cycles = 5000;
    install_handler(sig, host_count, SA_RESTART);
    int h_start = atomic_load(&host_calls);
    async_runtime_t *rt = mkrt();
    watch_sender_t w = {.sig = sig, .target = pthread_self()};
    pthread_t th;
    start_thread(&th, watch_sender, &w);
    long counted = 0;
    io_event_t evs[4];
    double t0 = now_ms();
    int i;
    /* At least `cycles` swaps and 2000 signals (the sender may start late). */
    for (i = 0; (i < cycles || atomic_load(&w.sent) < 2000) && now_ms() - t0 < 30000; i++) {
        CHECK_EQ(async_runtime_add_signal(rt, sig, 9), 0);
        int n = async_runtime_wait(rt, evs, 4, 0);
        CHECK(n >= 0);
        for (int k = 0; k < n; k++) {
            CHECK_EQ(evs[k].event_type, ASYNC_EVENT_SIGNAL);
            counted += (long)evs[k].data;
        }
        CHECK_EQ(async_runtime_remove_signal(rt, sig), 0);
    }
    atomic_store(&w.stop, 1);
    join_within(th, 30000, "sender");
    long sent = atomic_load(&w.sent), hosted = atomic_load(&host_calls) - h_start;
    printf("%d cycles: %ld signals, %ld to the host, %ld counted by the watch\n", i, sent, hosted, counted);
    /* A standard signal merges with one still pending, so no exact count;
     * but none is taken twice. */
    CHECK(hosted + counted <= sent);
    CHECK(host_installed(sig));
    int h0 = atomic_load(&host_calls);
    CHECK_EQ(raise(sig), 0);
    CHECK_EQ(atomic_load(&host_calls), h0 + 1);
    CHECK_EQ(async_runtime_wait(rt, evs, 4, 0), 0);
    async_runtime_deinit(rt);
    install_handler(sig, SIG_DFL, 0);
}

TEST_MAIN()
