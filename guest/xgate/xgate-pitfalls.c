/* The PKU pitfalls of Connor et al. (USENIX Security 2020) and Jenny
 * (USENIX Security 2022), tried against the kernel key (key 15, the
 * [xgate-data] page) and against an application domain's key.
 *
 * `xgate-pitfalls` prints one line per attempt, `pit CASE TARGET: OUTCOME`,
 * and judges nothing: tests/integration/test_xgate.py holds the table of
 * expected outcomes (docs/xgates.md lists it).  An OUTCOME is an errno name,
 * SEGV_PKUERR, a signal that ended a child, or "LEAK"/"CHANGED"/"OPEN" when an
 * attempt got at the protected bytes.  The kernel-key cases run first, in a
 * process without domains; then one domain is created and every case runs
 * again against it.  Built static, with -mno-red-zone. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <elf.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <pthread.h>
#include <ucontext.h>
#include <unistd.h>

#include "xgate-check.h"
#include "xgate.h"
#include "xgate_abi.h"

#define SECRET 0x5ec2e7L

static const char *target = "";
static volatile long *victim;      /* the protected page under attack */
static long victim_value;          /* what it holds (read through a gate for the domain) */
static int domain = -1;
static unsigned domain_bits;       /* AD|WD of the domain key */

static unsigned protected_bits(void) { return XGATE_KEY_BITS | domain_bits; }
static int all_closed(unsigned pkru) { return (pkru & protected_bits()) == protected_bits(); }

static void report(const char *name, const char *outcome)
{
    printf("pit %s %s: %s\n", name, target, outcome);
    fflush(stdout);
}

static const char *err_name(int e)
{
    switch (e) {
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case EFAULT: return "EFAULT";
    case EIO: return "EIO";
    case EINVAL: return "EINVAL";
    case ENOSYS: return "ENOSYS";
    case EBUSY: return "EBUSY";
    case ENOMEM: return "ENOMEM";
    case ESRCH: return "ESRCH";
    default: return "E?";
    }
}

/* The current value of the victim, as its owner sees it. */
static long current_value(void)
{
    return domain >= 0 ? xgate_domain_call(domain, 0) : victim_value;
}

/* A syscall-style attempt on the victim: the outcome of rc/errno, or LEAK
 * when it returned bytes, CHANGED when the victim's value moved. */
static void judge(const char *name, long rc, int err, const long *got)
{
    char buf[64];
    if (rc < 0) {
        report(name, err_name(err));
        return;
    }
    if (got && *got == victim_value)
        report(name, "LEAK");
    else if (current_value() != victim_value)
        report(name, "CHANGED");
    else {
        snprintf(buf, sizeof buf, "rc=%ld", rc);
        report(name, buf);
    }
}

/* ---- through /proc, process_vm_*, ptrace --------------------------------------- */

static void proc_self_mem(void)
{
    long got = 0, forged = 0x666;
    int fd = open("/proc/self/mem", O_RDWR);
    errno = 0;
    long rc = pread(fd, &got, sizeof got, (off_t)(uintptr_t)victim);
    judge("proc-self-mem-read", rc, errno, &got);
    errno = 0;
    rc = pwrite(fd, &forged, sizeof forged, (off_t)(uintptr_t)victim);
    judge("proc-self-mem-write", rc, errno, NULL);
    close(fd);
}

/* Runs fn in a child that attacks its parent; the child writes one line. */
static void from_child(void (*fn)(pid_t parent))
{
    pid_t parent = getpid();
    pid_t c = fork();
    if (c == 0) {
        fn(parent);
        _exit(0);
    }
    int st;
    waitpid(c, &st, 0);
}

static void child_proc_mem(pid_t parent)
{
    char path[64];
    long got = 0, forged = 0x666;
    snprintf(path, sizeof path, "/proc/%d/mem", parent);
    errno = 0;
    int fd = open(path, O_RDWR);
    if (fd < 0) {
        report("proc-pid-mem-read", err_name(errno));
        report("proc-pid-mem-write", err_name(errno));
        return;
    }
    errno = 0;
    long rc = pread(fd, &got, sizeof got, (off_t)(uintptr_t)victim);
    /* judged here on the bytes alone: the child cannot call the parent's domain */
    report("proc-pid-mem-read", rc < 0 ? err_name(errno) : got == victim_value ? "LEAK" : "rc>=0");
    errno = 0;
    rc = pwrite(fd, &forged, sizeof forged, (off_t)(uintptr_t)victim);
    report("proc-pid-mem-write", rc < 0 ? err_name(errno) : "WROTE");
}

static void child_process_vm(pid_t parent)
{
    long got = 0, forged = 0x666;
    struct iovec l = {&got, sizeof got}, r = {(void *)victim, sizeof got};
    errno = 0;
    long rc = process_vm_readv(parent, &l, 1, &r, 1, 0);
    report("process_vm_readv", rc < 0 ? err_name(errno) : got == victim_value ? "LEAK" : "rc>=0");
    struct iovec w = {&forged, sizeof forged};
    errno = 0;
    rc = process_vm_writev(parent, &w, 1, &r, 1, 0);
    report("process_vm_writev", rc < 0 ? err_name(errno) : "WROTE");
}

static void child_ptrace_attach(pid_t parent)
{
    /* SEIZE, not ATTACH: no SIGSTOP left pending in the parent; exit detaches. */
    errno = 0;
    long rc = ptrace(PTRACE_SEIZE, parent, 0, 0);
    report("ptrace-attach", rc < 0 ? err_name(errno) : "ATTACHED");
}

/* The tracer is the parent, the tracee a child (with the same layout, and with
 * the domain when there is one): peek, poke, and an xstate regset carrying PKRU. */
static void ptrace_tracee(void)
{
    int p[2];
    if (pipe(p) < 0)
        return;
    pid_t c = fork();
    if (c == 0) {
        close(p[0]);
        errno = 0;
        long rc = ptrace(PTRACE_TRACEME, 0, 0, 0);
        int e = errno;
        if (write(p[1], &e, sizeof e) < 0 || rc < 0)
            _exit(3);
        raise(SIGSTOP);
        /* After the tracer's attempts: still closed? */
        _exit(all_closed(rdpkru()) ? 0 : 1);
    }
    close(p[1]);
    int e = 0;
    if (read(p[0], &e, sizeof e) != sizeof e)
        e = -1;
    close(p[0]);
    if (e) {
        report("ptrace-traceme", err_name(e));
        waitpid(c, NULL, 0);
        return;
    }
    report("ptrace-traceme", "TRACED");
    int st;
    waitpid(c, &st, 0);
    errno = 0;
    long v = ptrace(PTRACE_PEEKDATA, c, (void *)victim, 0);
    report("ptrace-peek", errno ? err_name(errno) : v == victim_value ? "LEAK" : "rc>=0");
    errno = 0;
    long rc = ptrace(PTRACE_POKEDATA, c, (void *)victim, (void *)0x666);
    report("ptrace-poke", rc < 0 ? err_name(errno) : "WROTE");
    /* Registers: the xstate regset with the PKRU component set and PKRU = 0. */
    static unsigned char xs[8192] __attribute__((aligned(64)));
    struct iovec io = {xs, sizeof xs};
    errno = 0;
    rc = ptrace(PTRACE_GETREGSET, c, (void *)NT_X86_XSTATE, &io);
    if (rc == 0) {
        uint64_t *bv = (uint64_t *)(xs + 512);
        *bv |= 1u << 9;
        unsigned a, b, cc, d;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(cc), "=d"(d) : "a"(0xd), "c"(9));
        if (b && b + 4 <= io.iov_len)
            memset(xs + b, 0, 4);
        errno = 0;
        rc = ptrace(PTRACE_SETREGSET, c, (void *)NT_X86_XSTATE, &io);
    }
    report("ptrace-setregset-pkru", rc < 0 ? err_name(errno) : "SET");
    ptrace(PTRACE_CONT, c, 0, 0);
    waitpid(c, &st, 0);
    report("ptrace-tracee-after", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "closed" : "OPEN");
}

/* ---- the kernel as a confused deputy ------------------------------------------- */

static void deputies(void)
{
    int p[2], s[2];
    long got = 0;
    if (pipe(p) < 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, s) < 0)
        return;
    errno = 0;
    long rc = write(p[1], (void *)victim, sizeof(long));
    if (rc > 0 && read(p[0], &got, sizeof got) > 0)
        rc = got == victim_value ? 0 : rc;
    judge("write-from", rc, errno, &got);
    struct iovec iov = {(void *)victim, sizeof(long)};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    errno = 0;
    got = 0;
    rc = sendmsg(s[0], &m, 0);
    if (rc > 0 && read(s[1], &got, sizeof got) > 0)
        rc = got == victim_value ? 0 : rc;
    judge("sendmsg-from", rc, errno, &got);
    errno = 0;
    got = 0;
    rc = vmsplice(p[1], &iov, 1, 0);
    if (rc > 0 && read(p[0], &got, sizeof got) > 0)
        rc = got == victim_value ? 0 : rc;
    judge("vmsplice-from", rc, errno, &got);
    errno = 0;
    rc = syscall(SYS_io_uring_setup, 4, calloc(1, 120));
    report("io_uring", rc < 0 ? err_name(errno) : "AVAILABLE");
    /* The kernel writing into protected memory for us. */
    int z = open("/dev/zero", O_RDONLY);
    errno = 0;
    rc = read(z, (void *)victim, sizeof(long));
    judge("read-into", rc, errno, NULL);
    close(z);
    close(p[0]);
    close(p[1]);
    close(s[0]);
    close(s[1]);
}

/* ---- signals -------------------------------------------------------------------- */

static volatile unsigned handler_pkru;
static volatile int forge_mode;
#define SW_PKRU_MAGIC 0x55524b50u

static void on_usr1_forge(int sig, siginfo_t *si, void *ucv)
{
    (void)sig;
    (void)si;
    ucontext_t *uc = ucv;
    handler_pkru = rdpkru();
    unsigned char *fx = (unsigned char *)uc->uc_mcontext.fpregs;
    if (forge_mode == 1) {
        /* software-reserved words: padding[0] (PKRU) at byte 464 + 5 * 4 */
        uint32_t *res = (uint32_t *)(fx + 464);
        if (res[6] == SW_PKRU_MAGIC)
            res[5] = 0;
    } else {
        /* the XSAVE area: XSTATE_BV bit 9 and a PKRU image of 0 */
        uint64_t *bv = (uint64_t *)(fx + 512);
        *bv |= 1u << 9;
        unsigned a, b, c, d;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0xd), "c"(9));
        if (b)
            memset(fx + b, 0, 4);
    }
}

static void forged_frames(void)
{
    static const char *names[] = {"", "sigreturn-sw-reserved", "sigreturn-xsave-area"};
    for (int mode = 1; mode <= 2; mode++) {
        pid_t c = fork();
        if (c == 0) {
            forge_mode = mode;
            struct sigaction sa = {.sa_sigaction = on_usr1_forge, .sa_flags = SA_SIGINFO};
            sigaction(SIGUSR1, &sa, NULL);
            raise(SIGUSR1);
            _exit(all_closed(rdpkru()) && all_closed(handler_pkru) ? 0 : 1);
        }
        int st;
        waitpid(c, &st, 0);
        char buf[32];
        if (WIFSIGNALED(st))
            snprintf(buf, sizeof buf, "killed by %d", WTERMSIG(st));
        else
            snprintf(buf, sizeof buf, "%s", WEXITSTATUS(st) == 0 ? "closed" : "OPEN");
        report(names[mode], buf);
    }
}

/* SIGALRM every 100 us while gates run: every handler must start closed. */
static volatile long alarms, alarms_open, alarms_in_gate;
static unsigned long gate_base;
static void on_alarm(int sig, siginfo_t *si, void *ucv)
{
    (void)sig;
    (void)si;
    ucontext_t *uc = ucv;
    alarms++;
    if (!all_closed(rdpkru()))
        alarms_open++;
    unsigned long ip = (unsigned long)uc->uc_mcontext.gregs[REG_RIP];
    if (ip - gate_base < 4096)
        alarms_in_gate++;
}

static void signal_in_gate(void)
{
    syscall(SYS_prctl, PR_XGATE, PR_XGATE_BASE, &gate_base, 0, 0);
    struct sigaction sa = {.sa_sigaction = on_alarm, .sa_flags = SA_SIGINFO | SA_RESTART};
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 100}, {0, 100}};
    setitimer(ITIMER_REAL, &it, NULL);
    long bad = 0;
    for (int i = 0; i < 3000; i++) {
        if (domain >= 0 ? xgate_domain_call(domain, 0) != victim_value
                        : xgate_getpid() != (pid_t)syscall(SYS_getpid))
            bad++;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    signal(SIGALRM, SIG_DFL);
    char buf[96];
    snprintf(buf, sizeof buf, "%s", alarms_open ? "OPEN" : bad ? "WRONG" : "closed");
    report("signal-in-gate", buf);
    printf("signal-in-gate %s: %ld alarms, %ld landed in [xgate], %ld open, %ld wrong results\n",
           target, alarms, alarms_in_gate, alarms_open, bad);
}

/* ---- layout changes ------------------------------------------------------------- */

static void layout(void)
{
    char *v = (char *)victim;
    char *other = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    errno = 0;
    long rc = munmap(v, 4096);
    judge("munmap", rc, errno, NULL);
    errno = 0;
    void *m = mmap(v, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    judge("mmap-fixed-over", m == MAP_FAILED ? -1 : 0, errno, NULL);
    errno = 0;
    m = mremap(v, 4096, 4096, MREMAP_MAYMOVE | MREMAP_FIXED, other);
    judge("mremap-of", m == MAP_FAILED ? -1 : 0, errno, NULL);
    errno = 0;
    m = mremap(other, 4096, 4096, MREMAP_MAYMOVE | MREMAP_FIXED, v);
    judge("mremap-onto", m == MAP_FAILED ? -1 : 0, errno, NULL);
    errno = 0;
    rc = mprotect(v, 4096, PROT_READ | PROT_WRITE);
    judge("mprotect", rc, errno, NULL);
    errno = 0;
    rc = syscall(SYS_pkey_mprotect, v, 4096, PROT_READ, 0);
    judge("pkey_mprotect", rc, errno, NULL);
    int shm = shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
    errno = 0;
    m = shmat(shm, v, SHM_REMAP);
    judge("shmat-remap-over", m == (void *)-1 ? -1 : 0, errno, NULL);
    shmctl(shm, IPC_RMID, NULL);
    errno = 0;
    rc = syscall(SYS_madvise, v, 4096, MADV_DONTNEED);
    judge("madvise-dontneed", rc, errno, NULL);
    errno = 0;
    rc = syscall(SYS_process_madvise, 0, NULL, 0, 0, 0);
    report("process_madvise", rc < 0 ? err_name(errno) : "AVAILABLE");
    errno = 0;
    rc = syscall(SYS_userfaultfd, 0);
    report("userfaultfd", rc < 0 ? err_name(errno) : "AVAILABLE");
}

/* ---- inheritance ---------------------------------------------------------------- */

static void *thread_pkru(void *arg)
{
    (void)arg;
    return (void *)(uintptr_t)rdpkru();
}

static void inheritance(const char *self)
{
    pid_t c = fork();
    if (c == 0) {
        /* closed in the child, and the domain (if any) still answers */
        int ok = all_closed(rdpkru()) && current_value() == victim_value;
        _exit(ok ? 0 : 1);
    }
    int st;
    waitpid(c, &st, 0);
    report("fork-child", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "closed" : "OPEN");
    pthread_t t;
    void *tv = NULL;
    int rc = pthread_create(&t, NULL, thread_pkru, NULL);
    if (rc == 0) {
        pthread_join(t, &tv);
        report("clone-thread", all_closed((unsigned)(uintptr_t)tv) ? "closed" : "OPEN");
    } else {
        report("clone-thread", err_name(rc));
    }
    c = fork();
    if (c == 0) {
        execl("/proc/self/exe", self, "after-exec", (char *)NULL);
        _exit(3);
    }
    waitpid(c, &st, 0);
    report("exec", !WIFEXITED(st) ? "killed" : WEXITSTATUS(st) == 0 ? "closed"
                   : WEXITSTATUS(st) == 3 ? "exec failed" : "OPEN");
}

/* In the exec'd image: key 15 closed, and no domain left (a thread can be
 * made, which a process with a domain cannot). */
static int after_exec(void)
{
    unsigned v = rdpkru();
    pthread_t t;
    void *tv = NULL;
    if (pthread_create(&t, NULL, thread_pkru, NULL) != 0)
        return 1;
    pthread_join(t, &tv);
    return (v & XGATE_KEY_BITS) == XGATE_KEY_BITS ? 0 : 1;
}

static void all_cases(const char *self)
{
    proc_self_mem();
    from_child(child_proc_mem);
    from_child(child_process_vm);
    from_child(child_ptrace_attach);
    ptrace_tracee();
    deputies();
    forged_frames();
    signal_in_gate();
    layout();
    inheritance(self);
}

static void dom_init(void *data) { ((long *)data)[0] = SECRET; }
static long dom_handler(long arg) { return ((volatile long *)victim)[0] + arg; }

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && !strcmp(argv[1], "after-exec"))
        return after_exec();
    if (!xgate_available()) {
        printf("FAIL pitfalls: no XGates\n");
        return 1;
    }
    /* The kernel key: [xgate-data]; its first slot word is the kernel's. */
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "[xgate-data]"))
            victim = (volatile long *)strtoul(line, NULL, 16);
    if (f)
        fclose(f);
    if (!victim) {
        printf("FAIL pitfalls: no [xgate-data]\n");
        return 1;
    }
    victim_value = 0x7fffffffffffL; /* never the page's contents: only errors or rc count */
    target = "k15";
    all_cases(argv[0]);
    /* An application domain. */
    void *data;
    domain = xgate_domain_create(4096, dom_init, dom_handler, &data);
    if (domain < 0) {
        printf("FAIL pitfalls: domain: %s\n", strerror(errno));
        return 1;
    }
    victim = data;
    victim_value = SECRET;
    target = "dom";
    struct sigaction sa = {.sa_sigaction = on_fault, .sa_flags = SA_SIGINFO | SA_NODEFER};
    sigaction(SIGSEGV, &sa, NULL);
    seg_code = 0;
    if (!sigsetjmp(jb, 1))
        (void)*victim;
    signal(SIGSEGV, SIG_DFL);
    if (seg_pkey <= 0 || seg_pkey >= 15) {
        printf("FAIL pitfalls: domain key %d\n", seg_pkey);
        return 1;
    }
    domain_bits = 3u << (2 * seg_pkey);
    report("direct-read", seg_code == SEGV_PKUERR ? "SEGV_PKUERR" : "LEAK");
    alarms = alarms_open = alarms_in_gate = 0;
    all_cases(argv[0]);
    printf("ok pitfalls\n");
    return 0;
}
