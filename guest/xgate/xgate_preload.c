/* LD_PRELOAD form of libxgate: glibc's identity calls, sched_getcpu,
 * clock_gettime and gettimeofday go through the gates for unmodified
 * dynamically linked programs.  A time call the clock gate cannot answer
 * goes to glibc's own (vDSO) function. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "xgate.h"

pid_t getpid(void) { return xgate_getpid(); }
pid_t gettid(void) { return xgate_gettid(); }
pid_t getppid(void) { return xgate_getppid(); }
uid_t getuid(void) { return xgate_getuid(); }
uid_t geteuid(void) { return xgate_geteuid(); }
gid_t getgid(void) { return xgate_getgid(); }
gid_t getegid(void) { return xgate_getegid(); }
int sched_getcpu(void) { return xgate_sched_getcpu(); }

int clock_gettime(clockid_t clk, struct timespec *ts)
{
    static int (*next)(clockid_t, struct timespec *);
    if (xgate_clock_gate(clk, ts) == 0)
        return 0;
    if (!next)
        next = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    if (!next) {
        errno = ENOSYS;
        return -1;
    }
    return next(clk, ts);
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    static int (*next)(struct timeval *, void *);
    struct timespec ts;
    if (!tz && xgate_clock_gate(CLOCK_REALTIME, &ts) == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
        return 0;
    }
    if (!next)
        next = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
    if (!next) {
        errno = ENOSYS;
        return -1;
    }
    return next(tv, tz);
}
