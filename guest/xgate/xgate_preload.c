/* LD_PRELOAD form of libxgate: glibc's identity calls and sched_getcpu go
 * through the gates for unmodified dynamically linked programs.
 * clock_gettime and gettimeofday are left to glibc, whose vDSO path already
 * answers them without entering the kernel (docs/xgates.md says why). */
#define _GNU_SOURCE
#include <sched.h>
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
