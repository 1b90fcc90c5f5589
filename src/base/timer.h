/* base/timer.h — monotonic clock in nanoseconds. */
#ifndef INFERD_BASE_TIMER_H
#define INFERD_BASE_TIMER_H

#include <stdint.h>
#include <time.h>

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double now_s(void) { return (double)now_ns() * 1e-9; }

#endif
