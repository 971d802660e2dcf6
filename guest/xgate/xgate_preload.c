/* LD_PRELOAD form of libxgate: glibc's identity calls, sched_getcpu,
 * clock_gettime and gettimeofday go through the gates for unmodified
 * dynamically linked programs.  A time call the clock gate cannot answer
 * goes to glibc's own (vDSO) function.
 * With XGATE_PRELOAD_COUNT set, a process prints on stderr at exit how many
 * calls the gates answered (`xgate-preload: N gate calls`). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>

#include "xgate.h"

/* Calls the gates answered: the identity gates whenever XGates are on, the
 * clock gate when it did not say -ENOSYS. */
static unsigned long gate_calls;
#define COUNTED(expr) (__atomic_fetch_add(&gate_calls, xgate_available() ? 1 : 0, \
                                          __ATOMIC_RELAXED), (expr))

pid_t getpid(void) { return COUNTED(xgate_getpid()); }
pid_t gettid(void) { return COUNTED(xgate_gettid()); }
pid_t getppid(void) { return COUNTED(xgate_getppid()); }
uid_t getuid(void) { return COUNTED(xgate_getuid()); }
uid_t geteuid(void) { return COUNTED(xgate_geteuid()); }
gid_t getgid(void) { return COUNTED(xgate_getgid()); }
gid_t getegid(void) { return COUNTED(xgate_getegid()); }
int sched_getcpu(void) { return COUNTED(xgate_sched_getcpu()); }

__attribute__((destructor)) static void report_gate_calls(void)
{
    if (getenv("XGATE_PRELOAD_COUNT"))
        fprintf(stderr, "xgate-preload: %lu gate calls\n",
                __atomic_load_n(&gate_calls, __ATOMIC_RELAXED));
}

int clock_gettime(clockid_t clk, struct timespec *ts)
{
    static int (*next)(clockid_t, struct timespec *);
    if (xgate_clock_gate(clk, ts) == 0) {
        __atomic_fetch_add(&gate_calls, 1, __ATOMIC_RELAXED);
        return 0;
    }
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
        __atomic_fetch_add(&gate_calls, 1, __ATOMIC_RELAXED);
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
