#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include "port/sync.h"

_Static_assert(sizeof(pthread_mutex_t) <= sizeof(platform_mutex_t), "platform_mutex_t holds a pthread mutex");

bool platform_mutex_init(platform_mutex_t *m) { return pthread_mutex_init((pthread_mutex_t *)m, NULL) == 0; }
void platform_mutex_destroy(platform_mutex_t *m) { pthread_mutex_destroy((pthread_mutex_t *)m); }
void platform_mutex_lock(platform_mutex_t *m) { pthread_mutex_lock((pthread_mutex_t *)m); }
void platform_mutex_unlock(platform_mutex_t *m) { pthread_mutex_unlock((pthread_mutex_t *)m); }
