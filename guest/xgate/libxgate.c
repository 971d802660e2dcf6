/* libxgate (xgate.h): finds this process's [xgate] page once, then calls its
 * gates like C functions.  The page's address never changes for the life
 * of an mm, and fork copies it, so the cached address stays right in a
 * child; execve starts a new image with a fresh cache. */
#define _GNU_SOURCE
#include "xgate.h"
#include "xgate_abi.h"

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

/* 0: not looked up yet, 1: no XGates here, else the gate page. */
static unsigned long gate_page;

static unsigned long page(void)
{
    unsigned long p = __atomic_load_n(&gate_page, __ATOMIC_RELAXED);
    if (!p) {
        unsigned long base = 0;
        p = syscall(SYS_prctl, PR_XGATE, PR_XGATE_BASE, &base, 0, 0) == 0 && base ? base : 1;
        __atomic_store_n(&gate_page, p, __ATOMIC_RELAXED);
    }
    return p;
}

int xgate_available(void)
{
    return page() != 1;
}

typedef long (*gate0)(void);

/* A gate answers, or says -ENOSYS (e.g. a CPU past the data page's slots):
 * then the syscall does. */
static long call(int gate, long nr)
{
    unsigned long p = page();
    if (p != 1) {
        long r = ((gate0)(p + ((unsigned long)gate << XGATE_SLOT_SHIFT)))();
        if (r >= 0)
            return r;
    }
    return syscall(nr);
}

pid_t xgate_getpid(void) { return (pid_t)call(XGATE_G_GETPID, SYS_getpid); }
pid_t xgate_gettid(void) { return (pid_t)call(XGATE_G_GETTID, SYS_gettid); }
pid_t xgate_getppid(void) { return (pid_t)call(XGATE_G_GETPPID, SYS_getppid); }
uid_t xgate_getuid(void) { return (uid_t)call(XGATE_G_GETUID, SYS_getuid); }
uid_t xgate_geteuid(void) { return (uid_t)call(XGATE_G_GETEUID, SYS_geteuid); }
gid_t xgate_getgid(void) { return (gid_t)call(XGATE_G_GETGID, SYS_getgid); }
gid_t xgate_getegid(void) { return (gid_t)call(XGATE_G_GETEGID, SYS_getegid); }

int xgate_sched_getcpu(void)
{
    unsigned long p = page();
    unsigned cpu;
    if (p != 1)
        return (int)((gate0)(p + ((unsigned long)XGATE_G_GETCPU << XGATE_SLOT_SHIFT)))();
    if (syscall(SYS_getcpu, &cpu, NULL, NULL) < 0)
        return -1;
    return (int)cpu;
}

typedef long (*gate_clock)(long, struct timespec *);

long xgate_clock_gate(clockid_t clk, struct timespec *ts)
{
    unsigned long p = page();
    if (p == 1)
        return -ENOSYS;
    return ((gate_clock)(p + ((unsigned long)XGATE_G_CLOCK << XGATE_SLOT_SHIFT)))((long)clk, ts);
}

int xgate_clock_gettime(clockid_t clk, struct timespec *ts)
{
    if (xgate_clock_gate(clk, ts) == 0)
        return 0;
    return (int)syscall(SYS_clock_gettime, clk, ts);
}

int xgate_gettimeofday(struct timeval *tv, void *tz)
{
    struct timespec ts;
    if (tz || !tv || xgate_clock_gate(CLOCK_REALTIME, &ts) != 0)
        return (int)syscall(SYS_gettimeofday, tv, tz);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

int xgate_domain_create(size_t size, void (*init)(void *data), xgate_handler handler,
                        void **data)
{
    if (!xgate_available() || !size || !handler) {
        errno = xgate_available() ? EINVAL : EOPNOTSUPP;
        return -1;
    }
    /* Access rights 0: open for this thread until the registration. */
    long key = syscall(SYS_pkey_alloc, 0, 0);
    if (key < 0)
        return -1;
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        goto fail_key;
    if (syscall(SYS_pkey_mprotect, mem, size, PROT_READ | PROT_WRITE, key) < 0)
        goto fail_map;
    if (init)
        init(mem);
    long d = syscall(SYS_prctl, PR_XGATE, PR_XGATE_DOMAIN, key, (unsigned long)handler, 0);
    if (d < 0)
        goto fail_map;
    *data = mem;
    return (int)d;
fail_map:
    munmap(mem, size);
fail_key:
    syscall(SYS_pkey_free, key);
    return -1;
}

typedef long (*gate2)(long, long);

long xgate_domain_call(int domain, long arg)
{
    sigset_t all, old;
    unsigned long p = page();
    if (p == 1) {
        errno = EOPNOTSUPP;
        return -1;
    }
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
    long r = ((gate2)(p + ((unsigned long)XGATE_G_DCALL << XGATE_SLOT_SHIFT)))(domain, arg);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return r;
}
