/* libxgate: XGates gate calls and application domains for guest programs
 * (docs/xgates.md).  Link libxgate.c statically, or LD_PRELOAD
 * libxgate-preload.so to route unmodified glibc programs' calls.
 *
 * Every call works without XGates too: it then makes the syscall, so a
 * program behaves the same with XGates on or off. */
#ifndef PARACELL_XGATE_H
#define PARACELL_XGATE_H

#include <stddef.h>
#include <sys/types.h>
#include <time.h>

/* 1 when this process runs with XGates (the gate page is mapped), else 0. */
int xgate_available(void);

/* Gate calls: the same results as the syscalls, without entering the kernel. */
pid_t xgate_getpid(void);
pid_t xgate_gettid(void);
pid_t xgate_getppid(void);
uid_t xgate_getuid(void);
uid_t xgate_geteuid(void);
gid_t xgate_getgid(void);
gid_t xgate_getegid(void);
int xgate_sched_getcpu(void);

/* Time from the kernel's vDSO data page, read by kernel-provided code in the
 * gate page (CLOCK_REALTIME/MONOTONIC with a TSC clocksource, and their
 * _COARSE forms).  xgate_clock_gate returns 0, or -ENOSYS when the gate cannot
 * answer (other clocks, another clocksource, no XGates); the other two fall
 * back to the syscall then. */
struct timespec;
struct timeval;
long xgate_clock_gate(clockid_t clk, struct timespec *ts);
int xgate_clock_gettime(clockid_t clk, struct timespec *ts);
int xgate_gettimeofday(struct timeval *tv, void *tz);

/* Application domains: a protection key of its own, memory tagged with it,
 * and one handler, registered with the kernel at creation, that is the only
 * code ever run with the key open.  init(data) runs once, before the
 * registration closes the key, to fill the memory.  Create domains before
 * starting threads: other threads keep whatever access they had.
 * Returns the domain (>= 0), or -1 with errno set. */
typedef long (*xgate_handler)(long arg);
int xgate_domain_create(size_t size, void (*init)(void *data), xgate_handler handler,
                        void **data);
/* Runs the domain's handler with its key open and returns what it returns.
 * Signals are blocked meanwhile: a signal handler must never run while the
 * domain is open (the kernel would close it under the handler). */
long xgate_domain_call(int domain, long arg);

#endif
