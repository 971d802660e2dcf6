#define _GNU_SOURCE
#include <stdint.h>
#include <time.h>
#include <x86intrin.h>

#include "hostclock.h"

static uint64_t raw_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

unsigned long pc_tsc_khz(unsigned sample_ms)
{
    uint64_t t0 = raw_ns(), c0 = __rdtsc();
    uint64_t until = t0 + (uint64_t)sample_ms * 1000000ULL, t1;
    do t1 = raw_ns(); while (t1 < until);
    uint64_t c1 = __rdtsc();
    if (c1 <= c0 || t1 <= t0) return 0;
    /* Rounded to a whole MHz: the rate is a constant of the CPU, and a
     * few ppm of sampling noise would only make every guest disagree. */
    uint64_t khz = (c1 - c0) * 1000000ULL / (t1 - t0);
    return (unsigned long)((khz + 500) / 1000 * 1000);
}
