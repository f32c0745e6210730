#pragma once
/* 1 if stdin is a terminal (the driver's console_mode.h sets its modes) */
int console_is_terminal(void);
