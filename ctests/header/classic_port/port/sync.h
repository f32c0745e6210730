/* A stand-in for a driver's port/sync.h (see socket_comm.h here). */
#ifndef TEST_PORT_SYNC_H
#define TEST_PORT_SYNC_H
typedef struct platform_event_s {
    uint64_t opaque[4];
} platform_event_t;
bool platform_event_wait(platform_event_t *event, int timeout_ms);
#endif
