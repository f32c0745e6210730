/* The classic lib/async header name; everything is in async/async_classic.h
 * (docs/CLASSIC_API.md). */
#ifndef ASYNC_CLASSIC_RUNTIME_H
#define ASYNC_CLASSIC_RUNTIME_H
#include "async_classic.h"
#endif
