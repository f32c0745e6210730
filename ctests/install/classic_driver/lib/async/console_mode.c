#include <unistd.h>
#include "console_mode.h"

int console_is_terminal(void) { return isatty(STDIN_FILENO); }
