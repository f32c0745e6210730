// Compile-only check: async.h is valid C++11 with C linkage and warning-free
// under -std=c++11 -Wall -Wextra -pedantic -Werror.
#include "async.h"
#include "async.h" // include guard

#include <type_traits>

static_assert(std::is_same<decltype(&async_queue_enqueue), bool (*)(async_queue_t *, const void *, size_t)>::value,
              "async_queue_enqueue signature");
static_assert(std::is_same<decltype(&async_runtime_add_timer),
                           uint64_t (*)(async_runtime_t *, uint64_t, uint64_t, uintptr_t)>::value,
              "async_runtime_add_timer signature");
static_assert(std::is_same<async_fd_t, int>::value, "async_fd_t is int on POSIX");
static_assert(sizeof(((io_event_t *)0)->completion_key) == sizeof(void *), "uintptr_t key");

int header_cxx11_probe();

int header_cxx11_probe()
{
    io_event_t ev = io_event_t();
    async_queue_stats_t st = async_queue_stats_t();
    async_worker_proc_t proc = nullptr;
    const char *(*ver)(void) = &async_version_string;
    int (*vnum)(void) = &async_version;
    int (*wait)(async_runtime_t *, io_event_t *, int, int) = &async_runtime_wait;
    async_worker_t *(*create)(async_worker_proc_t, void *, size_t) = &async_worker_create;
    async_queue_t *(*qcreate)(size_t, size_t, async_queue_flags_t) = &async_queue_create;
    async_queue_flags_t f = static_cast<async_queue_flags_t>(ASYNC_QUEUE_DROP_OLDEST | ASYNC_QUEUE_SIGNAL_ON_DATA);
    ev.event_type = ASYNC_EVENT_TIMER;
    (void)proc;
    (void)ver;
    (void)vnum;
    (void)wait;
    (void)create;
    (void)qcreate;
    (void)st;
    return static_cast<int>(ev.event_type) + static_cast<int>(f) + ASYNC_E_FORKED;
}
