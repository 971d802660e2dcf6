/* In-guest checks of XGates (tests/integration/test_xgate.py runs them).
 * `xgate-test NAME [ARG]` runs one check and prints `ok NAME ...` lines, or
 * `FAIL NAME: why` and exits 1.  Checks that must die (a mid-gate jump)
 * print `jumping` and are judged by their exit status. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/shm.h>
#include <sys/uio.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include "xgate-check.h"
#include "xgate.h"
#include "xgate_abi.h"

#define PKEY_DISABLE_WRITE_ 2
#define SW_PKRU_MAGIC 0x55524b50u

static int key_closed(unsigned pkru) { return (pkru & XGATE_KEY_BITS) == XGATE_KEY_BITS; }

/* The address of a named special mapping in /proc/self/maps, or 0. */
static unsigned long mapping(const char *name)
{
    char line[512];
    unsigned long start = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f)) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        size_t n = strlen(line), m = strlen(name);
        if (n >= m && !strcmp(line + n - m, name)) {
            start = strtoul(line, NULL, 16);
            break;
        }
    }
    fclose(f);
    return start;
}

/* Touching memory under a SIGSEGV catcher: the si_code, or 0 when no fault. */
static void check_data(void)
{
    volatile int *data = (volatile int *)mapping("[xgate-data]");
    EXPECT(data, "no [xgate-data] mapping");
    if (!data)
        return;
    int code = touch(data + 16, 0);
    EXPECT(code == SEGV_PKUERR && seg_pkey == XGATE_PKEY, "read: si_code %d pkey %d", code,
           seg_pkey);
    int wcode = touch(data + 16, 1);
    EXPECT(wcode != 0, "write did not fault");
    if (!failed)
        printf("ok data read si_code=%d (SEGV_PKUERR=%d) pkey=%d write si_code=%d\n", code,
               SEGV_PKUERR, seg_pkey, wcode);
}

/* "past": jump just past the first gate's opening WRPKRU, with eax set so
 * that an ERIM check on EAX alone would pass: the check on the live PKRU
 * must kill us.  "onto": jump onto its closing WRPKRU with EAX = 0 (every
 * key open), the classic ERIM gadget: the check after it must kill us. */
static void check_midgate(const char *how)
{
    unsigned char *gate = (unsigned char *)mapping("[xgate]");
    EXPECT(gate, "no [xgate] mapping");
    if (!gate)
        exit(1);
    unsigned char *w = memmem(gate, 256, "\x0f\x01\xef", 3);
    EXPECT(w, "no WRPKRU in gate 0");
    if (!w)
        exit(1);
    unsigned char *close = memmem(w + 3, 256 - (size_t)(w + 3 - gate), "\x0f\x01\xef", 3);
    EXPECT(close, "no closing WRPKRU in gate 0");
    if (!close)
        exit(1);
    unsigned open_val = rdpkru() & ~XGATE_KEY_BITS;
    printf("jumping %s\n", how);
    fflush(stdout);
    if (!strcmp(how, "past"))
        __asm__ volatile("jmp *%0" ::"r"(w + 3), "a"(open_val), "c"(0), "d"(0));
    else
        __asm__ volatile("jmp *%0" ::"r"(close), "a"(0), "c"(0), "d"(0));
    puts("survived");
    exit(0);
}

static void check_mem(const char *file)
{
    long pg = sysconf(_SC_PAGESIZE);
    void *p = mmap(NULL, pg, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT(p == MAP_FAILED && errno == EPERM, "W+X mmap: %s", p == MAP_FAILED ? strerror(errno) : "mapped");
    unsigned char *a = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT(a != MAP_FAILED, "mmap anon: %s", strerror(errno));
    if (a == MAP_FAILED)
        return;
    memset(a, 0x90, 2 * pg);
    a[0] = 0xc3;
    int r = mprotect(a, 2 * pg, PROT_READ | PROT_EXEC);
    EXPECT(r == 0, "clean mprotect(PROT_EXEC): %s", strerror(errno));
    EXPECT(mprotect(a, 2 * pg, PROT_READ | PROT_WRITE | PROT_EXEC) < 0 && errno == EPERM,
           "W+X mprotect allowed");
    static const int offs[] = {1, 4094, 4095, 777};
    for (unsigned i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        int o = offs[i];
        mprotect(a, 2 * pg, PROT_READ | PROT_WRITE);
        memset(a, 0x90, 2 * pg);
        memcpy(a + o, "\x0f\x01\xef", 3);
        r = mprotect(a, 2 * pg, PROT_READ | PROT_EXEC);
        EXPECT(r < 0 && errno == EPERM, "mprotect with WRPKRU at %d: %s", o, r ? strerror(errno) : "allowed");
    }
    int fd = open(file, O_RDONLY);
    EXPECT(fd >= 0, "open %s: %s", file, strerror(errno));
    if (fd >= 0) {
        off_t len = lseek(fd, 0, SEEK_END);
        void *m = mmap(NULL, (size_t)len, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
        EXPECT(m == MAP_FAILED && errno == EPERM, "mmap(PROT_EXEC) of %s: %s", file,
               m == MAP_FAILED ? strerror(errno) : "mapped");
        m = mmap(NULL, (size_t)len, PROT_READ, MAP_PRIVATE, fd, 0);
        EXPECT(m != MAP_FAILED, "mmap(PROT_READ) of %s: %s", file, strerror(errno));
        if (m != MAP_FAILED)
            EXPECT(mprotect(m, (size_t)len, PROT_READ | PROT_EXEC) < 0 && errno == EPERM,
                   "mprotect(PROT_EXEC) of %s allowed", file);
        close(fd);
    }
    if (!failed)
        printf("ok mem W+X refused, WRPKRU at 1/4094/4095/777 refused, file mmap/mprotect refused\n");
}

static volatile unsigned in_handler;
static void on_usr1(int sig)
{
    (void)sig;
    in_handler = rdpkru();
}

static void *thread_pkru(void *arg)
{
    (void)arg;
    return (void *)(uintptr_t)rdpkru();
}

static void check_pkru(char *self)
{
    unsigned v = rdpkru();
    EXPECT(key_closed(v), "main: %#x", v);
    signal(SIGUSR1, on_usr1);
    raise(SIGUSR1);
    EXPECT(key_closed(in_handler), "signal handler: %#x", in_handler);
    pthread_t t;
    void *tv;
    pthread_create(&t, NULL, thread_pkru, NULL);
    pthread_join(t, &tv);
    EXPECT(key_closed((unsigned)(uintptr_t)tv), "thread: %#x", (unsigned)(uintptr_t)tv);
    pid_t pid = fork();
    if (pid == 0)
        _exit(key_closed(rdpkru()) ? 0 : 1);
    int st;
    waitpid(pid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork child: status %#x", st);
    if (failed)
        return;
    printf("ok pkru main=%#x handler=%#x thread=%#x fork=closed\n", v, in_handler,
           (unsigned)(uintptr_t)tv);
    fflush(stdout);
    char *argv[] = {self, "pkru-exec", NULL};
    execv("/proc/self/exe", argv);
    FAIL("exec: %s", strerror(errno));
}

static long sys(long nr) { return syscall(nr); }

static void compare_ids(const char *where)
{
    EXPECT(xgate_getpid() == sys(SYS_getpid), "%s getpid %d/%ld", where, xgate_getpid(), sys(SYS_getpid));
    EXPECT(xgate_gettid() == sys(SYS_gettid), "%s gettid %d/%ld", where, xgate_gettid(), sys(SYS_gettid));
    EXPECT(xgate_getppid() == sys(SYS_getppid), "%s getppid", where);
    EXPECT((long)xgate_getuid() == sys(SYS_getuid), "%s getuid %u/%ld", where, xgate_getuid(), sys(SYS_getuid));
    EXPECT((long)xgate_geteuid() == sys(SYS_geteuid), "%s geteuid", where);
    EXPECT((long)xgate_getgid() == sys(SYS_getgid), "%s getgid", where);
    EXPECT((long)xgate_getegid() == sys(SYS_getegid), "%s getegid", where);
}

static void *thread_ids(void *arg)
{
    (void)arg;
    for (int i = 0; i < 200; i++)
        compare_ids("thread");
    return NULL;
}

static long long ns_of(const struct timespec *t) { return (long long)t->tv_sec * 1000000000LL + t->tv_nsec; }

/* The clock gate's reading lies between two syscall readings, for every
 * clock it answers; the hres clocks must be answered by the gate here. */
static void compare_clocks(void)
{
    static const clockid_t clocks[] = {CLOCK_REALTIME, CLOCK_MONOTONIC, CLOCK_REALTIME_COARSE,
                                       CLOCK_MONOTONIC_COARSE};
    for (unsigned i = 0; i < sizeof clocks / sizeof clocks[0]; i++)
        for (int n = 0; n < 1000; n++) {
            struct timespec a, g, b;
            syscall(SYS_clock_gettime, clocks[i], &a);
            long r = xgate_clock_gate(clocks[i], &g);
            syscall(SYS_clock_gettime, clocks[i], &b);
            EXPECT(r == 0, "clock %d: gate said %ld", (int)clocks[i], r);
            if (r)
                return;
            EXPECT(ns_of(&a) <= ns_of(&g) && ns_of(&g) <= ns_of(&b) && g.tv_nsec < 1000000000,
                   "clock %d: %lld not in [%lld, %lld]", (int)clocks[i], ns_of(&g), ns_of(&a),
                   ns_of(&b));
            if (failed)
                return;
        }
    struct timespec t;
    EXPECT(xgate_clock_gate(CLOCK_PROCESS_CPUTIME_ID, &t) == -ENOSYS, "cputime clock answered");
    EXPECT(xgate_clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) == 0, "cputime fallback failed");
    struct timeval a, g, b;
    syscall(SYS_gettimeofday, &a, NULL);
    xgate_gettimeofday(&g, NULL);
    syscall(SYS_gettimeofday, &b, NULL);
    long long ua = a.tv_sec * 1000000LL + a.tv_usec, ug = g.tv_sec * 1000000LL + g.tv_usec,
              ub = b.tv_sec * 1000000LL + b.tv_usec;
    EXPECT(ua <= ug && ug <= ub, "gettimeofday %lld not in [%lld, %lld]", ug, ua, ub);
}

static void check_gates(void)
{
    EXPECT(xgate_available(), "no gate page");
    compare_ids("main");
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, thread_ids, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    pid_t pid = fork();
    if (pid == 0) {
        compare_ids("fork child");
        if (setresgid(2001, 2002, 2003) < 0 || setresuid(1001, 1002, 1003) < 0)
            FAIL("setresuid: %s", strerror(errno));
        compare_ids("after setuid");
        EXPECT(xgate_getuid() == 1001 && xgate_geteuid() == 1002 && xgate_getgid() == 2001 &&
               xgate_getegid() == 2002, "ids after setresuid: %u %u %u %u", xgate_getuid(),
               xgate_geteuid(), xgate_getgid(), xgate_getegid());
        _exit(failed);
    }
    int st;
    waitpid(pid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork child failed");
    int same = 0;
    for (int i = 0; i < 10 && !same; i++) {
        unsigned cpu;
        int g = xgate_sched_getcpu();
        syscall(SYS_getcpu, &cpu, NULL, NULL);
        same = g == (int)cpu;
    }
    EXPECT(same, "sched_getcpu differs from getcpu");
    compare_clocks();
    if (!failed)
        printf("ok gates pid=%d tid=%d ppid=%d uid=%u gid=%u cpu=%d equal to syscalls, also in "
               "4 threads, after fork and after setresuid; clocks between syscall readings\n", xgate_getpid(), xgate_gettid(),
               xgate_getppid(), xgate_getuid(), xgate_getgid(), xgate_sched_getcpu());
}

static volatile long *secret;
static void secret_init(void *data)
{
    ((long *)data)[0] = 0x5ec2e7;
}
static long secret_handler(long arg)
{
    return secret[0] + arg;
}

static void check_domain(void)
{
    void *data;
    int d = xgate_domain_create(4096, secret_init, secret_handler, &data);
    EXPECT(d >= 0, "create: %s", strerror(errno));
    if (d < 0)
        return;
    secret = data;
    long v = xgate_domain_call(d, 1);
    EXPECT(v == 0x5ec2e7 + 1, "call returned %#lx", v);
    int code = touch((volatile int *)data, 0);
    EXPECT(code == SEGV_PKUERR, "direct read: si_code %d", code);
    int key = seg_pkey;
    /* The handler called directly (not through the gate) runs closed. */
    struct sigaction sa = {.sa_sigaction = on_fault, .sa_flags = SA_SIGINFO | SA_NODEFER};
    sigaction(SIGSEGV, &sa, NULL);
    seg_code = 0;
    if (!sigsetjmp(jb, 1))
        v = secret_handler(0);
    signal(SIGSEGV, SIG_DFL);
    EXPECT(seg_code == SEGV_PKUERR, "direct handler call: si_code %d", seg_code);
    EXPECT(syscall(SYS_pkey_mprotect, data, 4096, PROT_READ, 0) < 0 && errno == EPERM,
           "retagging the domain's memory allowed");
    EXPECT(syscall(SYS_pkey_free, key) < 0, "pkey_free of the domain key allowed");
    long got = 0;
    int fd = open("/proc/self/mem", O_RDONLY);
    ssize_t n = fd >= 0 ? pread(fd, &got, sizeof got, (off_t)(uintptr_t)data) : -1;
    EXPECT(n != sizeof got || got != 0x5ec2e7, "/proc/self/mem read the secret");
    /* A forged domain index or handler is refused by the gate. */
    EXPECT(xgate_domain_call(7, 0) == -22, "domain 7 accepted");
    if (!failed)
        printf("ok domain call=%#lx direct read si_code=%d key=%d, direct handler faults, "
               "retag/free/proc-mem refused\n", xgate_domain_call(d, 0), code, key);
}

/* Sealing: nothing outside the handler changes a domain's layout or protection. */
static volatile long *brk_secret;
static long brk_handler(long arg) { return brk_secret[0] + arg; }
static void *idle_thread(void *arg) { (void)arg; pause(); return NULL; }

/* vfork in a function of its own: nothing of the caller's frame to clobber. */
__attribute__((noinline)) static int vfork_status(void)
{
    int st = -1;
    pid_t vp = vfork();
    if (vp == 0)
        _exit(7);
    if (vp > 0)
        waitpid(vp, &st, 0);
    return st;
}

#define REFUSED(call, err, what)                                                   \
    do {                                                                           \
        errno = 0;                                                                 \
        long rc_ = (long)(call);                                                   \
        EXPECT(rc_ == -1 && errno == (err), "%s: rc %ld, %s", what, rc_, strerror(errno)); \
        if (rc_ == -1 && errno == (err))                                           \
            refused++;                                                             \
    } while (0)

static void check_seal(char *self)
{
    void *data;
    int refused = 0;
    int d = xgate_domain_create(8192, secret_init, secret_handler, &data);
    EXPECT(d >= 0, "create: %s", strerror(errno));
    if (d < 0)
        return;
    secret = data;
    char *p = data;
    char *other = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REFUSED(munmap(p, 4096), EPERM, "munmap");
    REFUSED(munmap(p + 4096, 8192), EPERM, "munmap of its second page and beyond");
    REFUSED(mmap(p, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0),
            EPERM, "mmap(MAP_FIXED) over");
    REFUSED(mmap(p - 4096, 8192, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0), EPERM,
            "mmap(MAP_FIXED) overlapping");
    REFUSED(mremap(p, 8192, 16384, MREMAP_MAYMOVE), EPERM, "mremap grow");
    REFUSED(mremap(p, 8192, 4096, 0), EPERM, "mremap shrink");
    REFUSED(mremap(p, 4096, 4096, MREMAP_MAYMOVE | MREMAP_FIXED, other), EPERM, "mremap of it");
    REFUSED(mremap(other, 4096, 4096, MREMAP_MAYMOVE | MREMAP_FIXED, p), EPERM, "mremap onto it");
    REFUSED(mprotect(p, 4096, PROT_READ), EPERM, "mprotect");
    REFUSED(mprotect(p, 8192, PROT_READ | PROT_WRITE), EPERM, "mprotect to the same rights");
    REFUSED(syscall(SYS_pkey_mprotect, p, 4096, PROT_READ | PROT_WRITE, 0), EPERM,
            "pkey_mprotect to key 0");
    int shm = shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
    REFUSED(shmat(shm, p, SHM_REMAP), EPERM, "shmat(SHM_REMAP) over");
    shmctl(shm, IPC_RMID, NULL);
    /* Not in this kernel at all. */
    REFUSED(syscall(SYS_madvise, p, 4096, MADV_DONTNEED), ENOSYS, "madvise");
    REFUSED(syscall(SYS_process_madvise, 0, NULL, 0, 0, 0), ENOSYS, "process_madvise");
    REFUSED(syscall(SYS_userfaultfd, 0), ENOSYS, "userfaultfd");
    /* brk: a second domain at the end of the heap; shrinking the break over it fails. */
    char *base = (char *)(((uintptr_t)sbrk(0) + 4095) & ~(uintptr_t)4095);
    EXPECT(brk(base + 8192) == 0, "brk grow: %s", strerror(errno));
    char *bd = mmap(base + 4096, 4096, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    long k2 = syscall(SYS_pkey_alloc, 0, 0);
    EXPECT(bd == base + 4096 && k2 > 0 &&
           syscall(SYS_pkey_mprotect, bd, 4096, PROT_READ | PROT_WRITE, k2) == 0,
           "brk domain setup: %s", strerror(errno));
    *(volatile long *)bd = 0xb4c;
    brk_secret = (volatile long *)bd;
    long d2 = syscall(SYS_prctl, PR_XGATE, PR_XGATE_DOMAIN, k2, (unsigned long)brk_handler, 0);
    EXPECT(d2 > 0, "second domain: %s", strerror(errno));
    /* The raw syscall: glibc's brk() reports success when the kernel keeps a higher break. */
    long kept = syscall(SYS_brk, base);
    EXPECT(kept == (long)(uintptr_t)(base + 8192), "brk shrink over the domain: break %#lx",
           kept);
    if (kept == (long)(uintptr_t)(base + 8192))
        refused++;
    /* Threads: none while a domain exists; vfork is allowed (the parent waits). */
    pthread_t t;
    int trc = pthread_create(&t, NULL, idle_thread, NULL);
    EXPECT(trc != 0, "pthread_create allowed");
    int st = vfork_status();
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 7, "vfork: status %#x", st);
    /* No other process reads, writes or attaches. */
    long stackvar = 0x57ac;
    pid_t me = getpid();
    pid_t c = fork();
    if (c == 0) {
        int bad = 0;
        errno = 0;
        if (ptrace(PTRACE_ATTACH, me, 0, 0) != -1 || errno != EPERM)
            bad |= 1;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/mem", me);
        errno = 0;
        if (open(path, O_RDWR) != -1 || errno != EACCES)
            bad |= 2;
        long got = 0;
        struct iovec l = {&got, sizeof got}, r = {&stackvar, sizeof stackvar};
        /* EPERM, or ENOSYS where the kernel has no CROSS_MEMORY_ATTACH (this guest) */
        errno = 0;
        if (process_vm_readv(me, &l, 1, &r, 1, 0) != -1 || (errno != EPERM && errno != ENOSYS))
            bad |= 4;
        errno = 0;
        if (process_vm_writev(me, &l, 1, &r, 1, 0) != -1 || (errno != EPERM && errno != ENOSYS))
            bad |= 8;
        /* The domains came along with fork, sealed as well. */
        if (xgate_domain_call(d, 1) != 0x5ec2e7 + 1)
            bad |= 16;
        if (munmap(p, 4096) != -1 || errno != EPERM)
            bad |= 32;
        /* exec: gone. */
        execl("/proc/self/exe", self, "domain-gone", (char *)NULL);
        _exit(64 | bad);
    }
    waitpid(c, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork child: status %#x (bits: 1 attach, "
           "2 proc mem, 4 readv, 8 writev, 16 call, 32 munmap, 64 exec)", st);
    long v = xgate_domain_call(d, 0), v2 = xgate_domain_call((int)d2, 0);
    EXPECT(v == 0x5ec2e7 && v2 == 0xb4c, "domains after: %#lx %#lx", v, v2);
    if (!failed)
        printf("ok seal %d layout changes refused; pthread_create=%d, vfork ok, fork child: "
               "attach/mem/process_vm refused, domain kept and sealed, gone after exec; "
               "data intact %#lx %#lx\n", refused, trc, v, v2);
}

/* After execve from a process with domains: none is left.  Threads work
 * again, the domain table is empty (the next domain gets index 0), and a call
 * of the unregistered index 0 is killed by the gate's check. */
static void check_domain_gone(void)
{
    pid_t c = fork();
    if (c == 0) {
        xgate_domain_call(0, 0);
        _exit(0);
    }
    int st;
    waitpid(c, &st, 0);
    EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "call of domain 0: status %#x", st);
    void *data;
    int d = xgate_domain_create(4096, secret_init, secret_handler, &data);
    EXPECT(d == 0, "first domain after exec: %d", d);
    pthread_t t;
    int trc = pthread_create(&t, NULL, idle_thread, NULL);
    EXPECT(trc != 0, "a thread beside the new domain: %d", trc);
    if (!failed)
        printf("ok domain-gone: a call of domain 0 is killed, the next domain is 0\n");
    exit(failed);
}

/* A domain is registered by a process that is alone in its mm: else EBUSY. */
static void check_domain_busy(void)
{
    pthread_t t;
    pthread_create(&t, NULL, idle_thread, NULL);
    void *data;
    errno = 0;
    int d = xgate_domain_create(4096, secret_init, secret_handler, &data);
    EXPECT(d < 0 && errno == EBUSY, "with a second thread: %d %s", d, strerror(errno));
    if (!failed)
        printf("ok domain-busy with a second thread: %s\n", strerror(errno));
}

/* Code runs across mapping boundaries: two pages, each clean alone, that form
 * a WRPKRU where they touch ("0f 01" | "ef"), by mprotect and by mmap, in
 * either order; and mremap never moves or grows code. */
static int write_file(const char *path, const unsigned char *page)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    int ok = fd >= 0 && write(fd, page, 4096) == 4096;
    if (fd >= 0)
        close(fd);
    return ok;
}

static void check_seam(void)
{
    static unsigned char lo[4096], hi[4096];
    memset(lo, 0x90, sizeof lo);
    memset(hi, 0x90, sizeof hi);
    lo[4094] = 0x0f;
    lo[4095] = 0x01;
    hi[0] = 0xef;
    hi[1] = 0xc3;
    int refused = 0;
    for (int order = 0; order < 2; order++) {
        char *r = mmap(NULL, 3 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        mmap(r, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        memcpy(r, lo, 4096);
        memcpy(r + 4096, hi, 4096);
        char *first = order ? r + 4096 : r, *second = order ? r : r + 4096;
        int a = mprotect(first, 4096, PROT_READ | PROT_EXEC);
        errno = 0;
        int b = mprotect(second, 4096, PROT_READ | PROT_EXEC);
        EXPECT(a == 0 && b < 0 && errno == EPERM, "mprotect seam (order %d): %d %d %s", order, a,
               b, strerror(errno));
        refused += a == 0 && b < 0;
        munmap(r, 3 * 4096);
    }
    EXPECT(write_file("/tmp/seam-lo", lo) && write_file("/tmp/seam-hi", hi), "files: %s",
           strerror(errno));
    for (int order = 0; order < 2; order++) {
        char *r = mmap(NULL, 3 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        int flo = open("/tmp/seam-lo", O_RDONLY), fhi = open("/tmp/seam-hi", O_RDONLY);
        void *a, *b;
        if (!order) {
            a = mmap(r, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, flo, 0);
            errno = 0;
            b = mmap(r + 4096, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, fhi, 0);
        } else {
            a = mmap(r + 4096, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, fhi, 0);
            errno = 0;
            b = mmap(r, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, flo, 0);
        }
        EXPECT(a != MAP_FAILED && b == MAP_FAILED && errno == EPERM, "mmap seam (order %d): %s",
               order, strerror(errno));
        refused += a != MAP_FAILED && b == MAP_FAILED;
        close(flo);
        close(fhi);
        munmap(r, 3 * 4096);
    }
    /* mremap: growing code would map bytes nobody vetted; moving it could make a seam. */
    int flo = open("/tmp/seam-lo", O_RDONLY);
    char *c = mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, flo, 0);
    errno = 0;
    void *g = mremap(c, 4096, 8192, MREMAP_MAYMOVE);
    EXPECT(g == MAP_FAILED && errno == EPERM, "mremap grow of code: %s", strerror(errno));
    errno = 0;
    void *m = mremap(c, 4096, 4096, MREMAP_MAYMOVE | MREMAP_FIXED, c + 1024 * 4096);
    EXPECT(m == MAP_FAILED && errno == EPERM, "mremap move of code: %s", strerror(errno));
    close(flo);
    if (!failed)
        printf("ok seam %d WRPKRUs across mapping boundaries refused (mprotect and mmap, both "
               "orders); mremap of code refused\n", refused);
}

/* A frame that claims every key open: the kernel must close the protected ones. */
static void on_usr1_forge(int sig, siginfo_t *si, void *ucv)
{
    (void)sig;
    (void)si;
    ucontext_t *uc = ucv;
    uint32_t *res = (uint32_t *)uc->uc_mcontext.fpregs->__glibc_reserved1;
    /* sw_reserved starts at byte 464 of the fxsave area = reserved1[12];
     * padding[0] (PKRU) is reserved1[17], padding[1] (magic) reserved1[18]. */
    in_handler = res[18] == SW_PKRU_MAGIC;
    res[17] = 0;
}

static void check_sigreturn(void)
{
    struct sigaction sa = {.sa_sigaction = on_usr1_forge, .sa_flags = SA_SIGINFO};
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
    unsigned v = rdpkru();
    EXPECT(in_handler, "no PKRU record in the signal frame");
    EXPECT(key_closed(v), "after a forged frame: %#x", v);
    volatile int *data = (volatile int *)mapping("[xgate-data]");
    int code = data ? touch(data, 0) : -1;
    EXPECT(code == SEGV_PKUERR, "data read after forged frame: si_code %d", code);
    if (!failed)
        printf("ok sigreturn forged PKRU=0 -> %#x, data still si_code=%d\n", v, code);
}

/* Without XGates: a pkey's rights survive a signal handler (PKRU rides in the
 * frame's reserved words now that it left XCR0). */
static void check_pkru_preserved(void)
{
    long k = syscall(SYS_pkey_alloc, 0, PKEY_DISABLE_WRITE_);
    EXPECT(k > 0, "pkey_alloc: %s", strerror(errno));
    unsigned before = rdpkru();
    signal(SIGUSR1, on_usr1);
    raise(SIGUSR1);
    unsigned after = rdpkru();
    EXPECT(before == after, "PKRU %#x before the handler, %#x after", before, after);
    EXPECT(before & (2u << (2 * k)), "write-disable of key %ld not set: %#x", k, before);
    if (!failed)
        printf("ok pkru-preserved key=%ld pkru=%#x handler=%#x after=%#x\n", k, before, in_handler, after);
}

/* XRSTOR with bit 9 requested and set in XSTATE_BV, PKRU image 0: it must not open key 15. */
static unsigned char xbuf[8192] __attribute__((aligned(64)));
static void check_xrstor(void)
{
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0xd), "c"(9));
    unsigned off = b;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    __asm__ volatile("xsave %0" : "+m"(xbuf) : "a"(~0u), "d"(~0u) : "memory");
    /* ld.so's way: a mask without PKRU restores fine. */
    __asm__ volatile("xrstor %0" ::"m"(xbuf), "a"(0xeeu), "d"(0u) : "memory");
    if (off && off + 4 <= sizeof xbuf)
        memset(xbuf + off, 0, 4);
    uint64_t *bv = (uint64_t *)(xbuf + 512);
    *bv |= 1u << 9;
    struct sigaction sa = {.sa_sigaction = on_fault, .sa_flags = SA_SIGINFO | SA_NODEFER};
    sigaction(SIGSEGV, &sa, NULL);
    seg_code = -1;
    volatile int faulted = 0;
    if (!sigsetjmp(jb, 1))
        __asm__ volatile("xrstor %0" ::"m"(xbuf), "a"(~0u), "d"(~0u) : "memory");
    else
        faulted = 1;
    signal(SIGSEGV, SIG_DFL);
    unsigned v = rdpkru();
    EXPECT(!(lo & (1u << 9)), "XCR0 %#x has PKRU", lo);
    EXPECT(key_closed(v), "after XRSTOR: %#x", v);
    if (!failed)
        printf("ok xrstor xcr0=%#x pkru-offset=%u faulted=%d pkru=%#x\n", lo, off, faulted, v);
}

static void check_pkey(void)
{
    long keys[16];
    int n = 0;
    long k;
    while (n < 16 && (k = syscall(SYS_pkey_alloc, 0, 0)) >= 0)
        keys[n++] = k;
    for (int i = 0; i < n; i++)
        EXPECT(keys[i] != XGATE_PKEY, "pkey_alloc returned %d", XGATE_PKEY);
    void *p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT(syscall(SYS_pkey_mprotect, p, 4096, PROT_READ, XGATE_PKEY) < 0 && errno == EINVAL,
           "pkey_mprotect(15) allowed");
    EXPECT(syscall(SYS_pkey_free, XGATE_PKEY) < 0, "pkey_free(15) allowed");
    if (!failed)
        printf("ok pkey allocated %d keys, none is 15; pkey_mprotect/pkey_free(15) refused\n", n);
}

/* What was vetted stays vetted: a file mapped executable cannot be opened
 * for writing afterwards, for the rest of the process's life (XGates on);
 * without XGates, as before, it can. */
static void check_denywrite(int xgates)
{
    const char *path = "/tmp/xgate-code";
    unsigned char code[4096];
    memset(code, 0xc3, sizeof code);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0755);
    EXPECT(fd >= 0 && write(fd, code, sizeof code) == (ssize_t)sizeof code, "write %s: %s", path,
           strerror(errno));
    close(fd);
    fd = open(path, O_RDONLY);
    void *m = mmap(NULL, sizeof code, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
    EXPECT(m != MAP_FAILED, "mmap(PROT_EXEC) of a clean file: %s", strerror(errno));
    close(fd);
    int w = open(path, O_WRONLY);
    int mapped_errno = errno;
    if (w >= 0)
        close(w);
    munmap(m, sizeof code);
    int w2 = open(path, O_WRONLY);
    int unmapped_errno = errno;
    if (w2 >= 0)
        close(w2);
    if (xgates) {
        EXPECT(w < 0 && mapped_errno == ETXTBSY, "open for writing while mapped: %s",
               w < 0 ? strerror(mapped_errno) : "allowed");
        EXPECT(w2 < 0 && unmapped_errno == ETXTBSY, "open for writing after munmap: %s",
               w2 < 0 ? strerror(unmapped_errno) : "allowed");
    } else {
        EXPECT(w >= 0 && w2 >= 0, "open for writing refused without XGates");
    }
    if (!failed)
        printf("ok denywrite xgates=%d writes %s\n", xgates, xgates ? "refused (ETXTBSY)" : "allowed");
}

static void check_exec_stray(const char *path)
{
    char *argv[] = {(char *)path, NULL};
    printf("execve %s\n", path);
    fflush(stdout);
    execv(path, argv);
    printf("ok exec-stray refused: %s\n", strerror(errno));
    failed = errno != EPERM;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    check = argc > 1 ? argv[1] : "";
    const char *arg = argc > 2 ? argv[2] : "";
    if (!strcmp(check, "status"))
        printf("ok status prctl=%ld available=%d pkru=%#x\n",
               syscall(SYS_prctl, PR_XGATE, PR_XGATE_STATUS, 0, 0, 0), xgate_available(), rdpkru());
    else if (!strcmp(check, "data"))
        check_data();
    else if (!strcmp(check, "midgate"))
        check_midgate(arg);
    else if (!strcmp(check, "mem"))
        check_mem(arg);
    else if (!strcmp(check, "pkru"))
        check_pkru(argv[0]);
    else if (!strcmp(check, "pkru-exec")) {
        unsigned v = rdpkru();
        EXPECT(key_closed(v), "after exec: %#x", v);
        if (!failed)
            printf("ok pkru-exec %#x\n", v);
    } else if (!strcmp(check, "gates"))
        check_gates();
    else if (!strcmp(check, "domain"))
        check_domain();
    else if (!strcmp(check, "seam"))
        check_seam();
    else if (!strcmp(check, "seal"))
        check_seal(argv[0]);
    else if (!strcmp(check, "domain-gone"))
        check_domain_gone();
    else if (!strcmp(check, "domain-busy"))
        check_domain_busy();
    else if (!strcmp(check, "sigreturn"))
        check_sigreturn();
    else if (!strcmp(check, "pkru-preserved"))
        check_pkru_preserved();
    else if (!strcmp(check, "xrstor"))
        check_xrstor();
    else if (!strcmp(check, "pkey"))
        check_pkey();
    else if (!strcmp(check, "denywrite"))
        check_denywrite(xgate_available());
    else if (!strcmp(check, "exec-stray"))
        check_exec_stray(arg);
    else {
        fprintf(stderr, "xgate-test: unknown check %s\n", check);
        return 2;
    }
    return failed;
}
