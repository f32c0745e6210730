/* async_runtime_wait's loop: Go does the work, C does the sleeping.
 * See la_go_rt_wait_begin in main.go for why. */
#include <errno.h>
#if defined(__linux__)
#include <sys/epoll.h>
#endif

#include "_cgo_export.h"
#include "la.h"

static int raw_wait(const la_sleep_t *sl) {
#if defined(__linux__)
    return epoll_wait(sl->fd, (struct epoll_event *)sl->raw, sl->rawcap, sl->ms);
#else
    (void)sl;
    errno = ENOSYS; /* no raw poller here: Go never asks */
    return -1;
#endif
}

int la_go_rt_wait(uint64_t h, io_event_t *events, int max, int timeout, int *out) {
    la_sleep_t sl = {0};
    int rc = la_go_rt_wait_begin(h, events, max, timeout, out, &sl);
    while (rc == 0 && !sl.done) {
        int n = raw_wait(&sl);
        int err = n < 0 ? errno : 0;
        rc = la_go_rt_wait_finish(sl.token, events, out, n < 0 ? 0 : n, err, &sl);
    }
    return rc;
}
