#pragma once
/* How long a console line the driver's backend holds at most. */
int misc_console_capacity(void);
