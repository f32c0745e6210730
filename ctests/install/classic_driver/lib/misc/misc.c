/* Includes the driver's src/ header, which includes async/*.h and the
 * console worker (platform_mutex_t), through the top include path. */
#include "src/backend.h"
#include "misc/misc.h"

int misc_console_capacity(void) {
    return sizeof(platform_mutex_t) > 0 && sizeof(console_worker_context_t) > 0 ? CONSOLE_MAX_LINE : 0;
}
