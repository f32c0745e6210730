/* The monotonic clock and deadlines every wait of the library uses. */
#include <pthread.h>
#include <time.h>
#if defined(_WIN32)
#include <winsock2.h> /* before windows.h (async.h includes it) */
#include <windows.h>
#endif

#include "base.h"

#if defined(_WIN32)
/* QueryPerformanceCounter: GetTickCount64 moves in 15.6 ms steps, so a
 * deadline counted from it could end a wait (a fiber's sleep) up to a step
 * before its time. */
uint64_t la_now_ns(void) {
    static volatile LONGLONG freq;
    LONGLONG f = freq;
    if (!f) {
        LARGE_INTEGER q;
        QueryPerformanceFrequency(&q);
        freq = f = q.QuadPart;
    }
    LARGE_INTEGER c;
    QueryPerformanceCounter(&c);
    uint64_t t = (uint64_t)c.QuadPart, uf = (uint64_t)f;
    return t / uf * 1000000000u + t % uf * 1000000000u / uf;
}
#else
uint64_t la_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#endif

uint64_t la_deadline(int timeout_ms) {
    if (timeout_ms < 0) return 0;
    return la_now_ns() + (uint64_t)timeout_ms * 1000000u;
}

int la_ms_left(uint64_t deadline) {
    if (!deadline) return -1;
    uint64_t now = la_now_ns();
    if (now >= deadline) return 0;
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

void la_cond_init_mono(pthread_cond_t *cv) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
#if !defined(__APPLE__) && !defined(_WIN32)
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
#endif
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

struct timespec la_cond_abstime(uint64_t deadline_ns) {
    struct timespec ts;
#if defined(__APPLE__) || defined(_WIN32)
    uint64_t now = la_now_ns(), left = deadline_ns > now ? deadline_ns - now : 0;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t t = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + left;
    ts.tv_sec = (time_t)(t / 1000000000u);
    ts.tv_nsec = (long)(t % 1000000000u);
#else
    ts.tv_sec = (time_t)(deadline_ns / 1000000000u);
    ts.tv_nsec = (long)(deadline_ns % 1000000000u);
#endif
    return ts;
}
