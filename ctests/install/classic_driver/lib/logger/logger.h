#pragma once
void debug_message(const char *fmt, ...);
