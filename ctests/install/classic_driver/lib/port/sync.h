/* The driver's port/sync.h: opaque storage, and (as the driver's) it relies
 * on its includer for uint64_t and bool; the classic async_worker.h included
 * it. */
#pragma once
typedef struct platform_mutex_s {
    uint64_t _opaque[10];
} platform_mutex_t;
typedef struct platform_event_s {
    uint64_t _opaque[20];
} platform_event_t;
bool platform_mutex_init(platform_mutex_t *mutex);
void platform_mutex_destroy(platform_mutex_t *mutex);
void platform_mutex_lock(platform_mutex_t *mutex);
void platform_mutex_unlock(platform_mutex_t *mutex);
