/* Checks of XGates with Debian's own glibc, dynamically linked (built on the
 * host, run in a rootfs that holds the host's unmodified libc.so.6):
 * tests/integration/test_xgate.py runs them with XGates on and off.
 *
 *   xgate-glibc pkeys     pkey_alloc/pkey_mprotect/pkey_set/pkey_get on every
 *                         key it gets; prints a transcript that must be the
 *                         same with XGates on and off
 *   xgate-glibc site      how glibc's pkey_set WRPKRU is mapped here
 *   xgate-glibc protected pkey_set, and a direct call of the WRPKRU site with
 *                         EAX = 0, try to open key 15 and a domain key
 *   xgate-glibc gp        the site with ECX != 0 (WRPKRU raises #GP)
 *   xgate-glibc preload   glibc's id calls equal the syscalls in the main
 *                         thread, 4 threads, a forked child, after setresuid
 *   xgate-glibc maps      the site in libc.so.6 mapped by hand: mmap(PROT_EXEC),
 *                         mprotect(PROT_EXEC) of a file copy and of anonymous
 *                         copies (a near miss, a restored WRPKRU), and
 *                         mremap(MREMAP_DONTUNMAP) of an executable mapping
 *
 * Built with -mno-red-zone: the direct call of the site pushes a return
 * address below the stack pointer. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "xgate-check.h"
#include "xgate.h"
#include "xgate_abi.h"

/* The site's bytes, compared through a volatile array: as a literal, the
 * compiler folds them into a cmp immediate, a WRPKRU in our own text. */
static volatile const unsigned char site_bytes[6] = {0x0f, 0x01, 0xef, 0x31, 0xc0, 0xc3};

static int site_at(const unsigned char *p, int from)
{
    for (int i = from; i < 6; i++)
        if (p[i] != site_bytes[i])
            return 0;
    return 1;
}

static unsigned key_bits(unsigned pkru, int key) { return (pkru >> (2 * key)) & 3; }

/* glibc's pkey_set WRPKRU, as mapped: "0f 01 ef 31 c0 c3" without XGates,
 * "cc 01 ef 31 c0 c3" (trapped) with. */
static const unsigned char *site(int *trapped)
{
    const unsigned char *f = dlsym(RTLD_DEFAULT, "pkey_set");
    for (int i = 0; f && i < 128; i++)
        if ((f[i] == 0x0f || f[i] == 0xcc) && site_at(f + i, 1)) {
            *trapped = f[i] == 0xcc;
            return f + i;
        }
    return NULL;
}

/* Calls the site as a function: it writes PKRU from EAX, then returns 0. */
static void call_site(const unsigned char *s, unsigned eax, unsigned ecx)
{
    __asm__ volatile("call *%[s]" : "+a"(eax), "+c"(ecx) : [s] "r"(s), "d"(0) : "memory", "cc");
}

static void check_pkeys(void)
{
    int keys[16], n = 0, k;
    volatile int *page[16];
    while (n < 16 && (k = pkey_alloc(0, 0)) >= 0)
        keys[n++] = k;
    printf("allocated %d keys:", n);
    for (int i = 0; i < n; i++)
        printf(" %d", keys[i]);
    printf("\n");
    static const int rights[] = {PKEY_DISABLE_WRITE, PKEY_DISABLE_ACCESS,
                                 PKEY_DISABLE_ACCESS | PKEY_DISABLE_WRITE, 0};
    for (int i = 0; i < n; i++) {
        page[i] = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        int rc = pkey_mprotect((void *)page[i], 4096, PROT_READ | PROT_WRITE, keys[i]);
        printf("key %d: pkey_mprotect=%d", keys[i], rc);
        for (unsigned r = 0; r < sizeof rights / sizeof rights[0]; r++) {
            rc = pkey_set(keys[i], rights[r]);
            int got = pkey_get(keys[i]);
            /* A fault's handler runs with the default PKRU, and the
             * longjmp out of it keeps that: set the rights again. */
            int rd = touch(page[i], 0);
            pkey_set(keys[i], rights[r]);
            int wr = touch(page[i], 1);
            printf(" | set(%d)=%d get=%d read=%d write=%d", rights[r], rc, got, rd, wr);
        }
        printf("\n");
    }
    static const int bad[][2] = {{16, 0}, {1, 4}, {-1, 0}};
    for (int i = 0; i < 3; i++) {
        errno = 0;
        int rc = pkey_set(bad[i][0], (unsigned)bad[i][1]);
        int e = errno;
        printf("pkey_set(%d, %d)=%d errno=%d\n", bad[i][0], bad[i][1], rc, e);
    }
    int freed = 0;
    for (int i = 0; i < n; i++)
        freed += pkey_free(keys[i]) == 0;
    printf("freed %d; realloc=%d\n", freed, pkey_alloc(0, 0));
    printf("ok pkeys\n");
}

static void check_site(void)
{
    int trapped = -1;
    const unsigned char *s = site(&trapped);
    EXPECT(s, "no pkey_set WRPKRU in libc");
    if (!failed)
        printf("ok site %s\n", trapped ? "trapped (cc 01 ef 31 c0 c3)" : "plain (0f 01 ef 31 c0 c3)");
}

static volatile long *secret;
static void secret_init(void *data) { ((long *)data)[0] = 0x5ec2e7; }
static long secret_handler(long arg) { return secret[0] + arg; }

/* pkey_set(15, 0), pkey_set(domain, 0) and the site with EAX = 0 (every key
 * open) must leave key 15 and the domain key closed. */
static void check_protected(void)
{
    EXPECT(xgate_available(), "no XGates");
    void *data = NULL;
    int d = xgate_domain_create(4096, secret_init, secret_handler, &data);
    EXPECT(d >= 0, "domain: %s", strerror(errno));
    if (failed)
        return;
    secret = data;
    int dkey = -1;
    touch(data, 0);
    dkey = seg_pkey;
    EXPECT(dkey > 0 && dkey < 15, "domain key %d", dkey);
    volatile int *kdata = NULL;
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "[xgate-data]"))
            kdata = (volatile int *)strtoul(line, NULL, 16);
    if (f)
        fclose(f);
    EXPECT(kdata, "no [xgate-data]");
    int trapped = 0;
    const unsigned char *s = site(&trapped);
    EXPECT(s && trapped, "site not trapped");
    if (failed)
        return;
    int rc15 = pkey_set(15, 0);
    unsigned after15 = rdpkru();
    int k15 = touch(kdata, 0), kp15 = seg_pkey;
    int rcd = pkey_set(dkey, 0);
    unsigned afterd = rdpkru();
    int dd = touch(data, 0), dpd = seg_pkey;
    call_site(s, 0, 0);
    unsigned after0 = rdpkru();
    int k0 = touch(kdata, 0), d0 = touch(data, 0);
    EXPECT(key_bits(after15, 15) == 3 && k15 == SEGV_PKUERR && kp15 == 15,
           "pkey_set(15, 0): pkru %#x, read si_code %d pkey %d", after15, k15, kp15);
    EXPECT(key_bits(afterd, dkey) == 3 && dd == SEGV_PKUERR && dpd == dkey,
           "pkey_set(%d, 0): pkru %#x, read si_code %d pkey %d", dkey, afterd, dd, dpd);
    EXPECT(after0 == ((3u << 30) | (3u << (2 * dkey))) && k0 == SEGV_PKUERR && d0 == SEGV_PKUERR,
           "site with EAX=0: pkru %#x, reads %d %d", after0, k0, d0);
    long v = xgate_domain_call(d, 1);
    EXPECT(v == 0x5ec2e7 + 1, "domain call after: %#lx", v);
    if (!failed)
        printf("ok protected pkey_set(15,0)=%d -> %#x read si_code=%d; pkey_set(%d,0)=%d -> "
               "%#x read si_code=%d; site(eax=0) -> %#x; domain call %#lx\n", rc15, after15, k15,
               dkey, rcd, afterd, dd, after0, v);
}

static void check_gp(void)
{
    int trapped = 0;
    const unsigned char *s = site(&trapped);
    EXPECT(s, "no site");
    if (failed)
        return;
    catch_faults(1);
    seg_sig = 0;
    if (!sigsetjmp(jb, 1))
        call_site(s, 0, 1);
    catch_faults(0);
    EXPECT(seg_sig == SIGSEGV, "ecx=1: signal %d", seg_sig);
    if (!failed)
        printf("ok gp ecx=1: signal %d si_code %#x\n", seg_sig, seg_code);
}

/* glibc's calls (routed by LD_PRELOAD when it is set) against the syscalls. */
static void compare_ids(const char *where)
{
    EXPECT(getpid() == syscall(SYS_getpid), "%s getpid", where);
    EXPECT(gettid() == syscall(SYS_gettid), "%s gettid %d/%ld", where, gettid(), syscall(SYS_gettid));
    EXPECT(getppid() == syscall(SYS_getppid), "%s getppid", where);
    EXPECT((long)getuid() == syscall(SYS_getuid), "%s getuid", where);
    EXPECT((long)geteuid() == syscall(SYS_geteuid), "%s geteuid", where);
    EXPECT((long)getgid() == syscall(SYS_getgid), "%s getgid", where);
    EXPECT((long)getegid() == syscall(SYS_getegid), "%s getegid", where);
}

static void *thread_ids(void *arg)
{
    (void)arg;
    for (int i = 0; i < 200; i++)
        compare_ids("thread");
    return NULL;
}

static void check_preload(void)
{
    Dl_info info = {0};
    dladdr((void *)dlsym(RTLD_DEFAULT, "getpid"), &info);
    const char *from = info.dli_fname ? strrchr(info.dli_fname, '/') : NULL;
    from = from ? from + 1 : "?";
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
        compare_ids("after setresuid");
        EXPECT(getuid() == 1001 && geteuid() == 1002 && getgid() == 2001 && getegid() == 2002,
               "ids after setresuid: %u %u %u %u", getuid(), geteuid(), getgid(), getegid());
        pthread_t c;
        pthread_create(&c, NULL, thread_ids, NULL);
        pthread_join(c, NULL);
        _exit(failed);
    }
    int st;
    waitpid(pid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork child failed");
    if (!failed)
        printf("ok preload getpid from %s xgates=%d: equal to syscalls in main, 4 threads, fork "
               "child, after setresuid and in a thread after it\n", from, xgate_available());
}

#define LIBC "/lib/x86_64-linux-gnu/libc.so.6"

/* The file offset of libc's pkey_set site, or -1. */
static long site_offset(void)
{
    static unsigned char buf[1 << 16];
    int fd = open(LIBC, O_RDONLY);
    long off = 0, found = -1;
    ssize_t n;
    while (fd >= 0 && found < 0 && (n = pread(fd, buf, sizeof buf, off)) > 6) {
        for (ssize_t i = 0; i + 6 <= n; i++)
            if (site_at(buf + i, 0)) {
                found = off + i;
                break;
            }
        off += n - 5;
    }
    if (fd >= 0)
        close(fd);
    return found;
}

static void check_maps(void)
{
    int x = xgate_available();
    long off = site_offset();
    EXPECT(off > 0, "no site in " LIBC);
    if (failed)
        return;
    long pg = off & ~4095L, in = off - pg;
    int fd = open(LIBC, O_RDONLY);
    /* mmap(PROT_EXEC) of the file page. */
    unsigned char *m = mmap(NULL, 8192, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, pg);
    EXPECT(m != MAP_FAILED, "mmap exec: %s", strerror(errno));
    if (failed)
        return;
    int mmap_byte = m[in];
    /* mprotect(PROT_EXEC) of a read-only file page. */
    unsigned char *r = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE, fd, pg);
    int rc = mprotect(r, 8192, PROT_READ | PROT_EXEC);
    EXPECT(rc == 0, "mprotect exec of the file page: %s", strerror(errno));
    int mprotect_byte = r[in];
    /* Anonymous copies: a near miss is refused, a restored WRPKRU trapped again. */
    unsigned char *a = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memcpy(a, m, 8192);
    a[in] = 0x0f;
    a[in + 5] = 0x90;
    errno = 0;
    int near = mprotect(a, 8192, PROT_READ | PROT_EXEC), near_errno = errno;
    mprotect(a, 8192, PROT_READ | PROT_WRITE);
    a[in + 5] = 0xc3;
    errno = 0;
    int restored = mprotect(a, 8192, PROT_READ | PROT_EXEC), restored_errno = errno;
    int restored_byte = a[in];
    /* mremap(MREMAP_DONTUNMAP) would leave the old range to refault the file. */
    errno = 0;
    /* the raw syscall: glibc 2.36 passes no new address for DONTUNMAP */
    long moved = syscall(SYS_mremap, m, 8192, 8192, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0);
    int dontunmap_errno = moved == -1 ? errno : 0;
    printf("maps: mmap-exec byte %#x, mprotect-exec byte %#x, near miss %d/%s, restored "
           "WRPKRU %d/%s byte %#x, MREMAP_DONTUNMAP %s\n", mmap_byte, mprotect_byte, near,
           strerror(near_errno), restored, strerror(restored_errno), restored_byte,
           strerror(dontunmap_errno));
    if (x) {
        EXPECT(mmap_byte == 0xcc && mprotect_byte == 0xcc, "site not trapped");
        EXPECT(near < 0 && near_errno == EPERM, "near miss allowed");
        EXPECT(restored == 0 && restored_byte == 0xcc, "restored WRPKRU not trapped");
        EXPECT(dontunmap_errno == EPERM, "MREMAP_DONTUNMAP of code allowed");
    } else {
        EXPECT(mmap_byte == 0x0f && mprotect_byte == 0x0f && near == 0 && restored == 0,
               "without XGates the bytes changed");
    }
    if (!failed)
        printf("ok maps xgates=%d\n", x);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    check = argc > 1 ? argv[1] : "";
    if (!strcmp(check, "pkeys"))
        check_pkeys();
    else if (!strcmp(check, "site"))
        check_site();
    else if (!strcmp(check, "protected"))
        check_protected();
    else if (!strcmp(check, "gp"))
        check_gp();
    else if (!strcmp(check, "preload"))
        check_preload();
    else if (!strcmp(check, "maps"))
        check_maps();
    else {
        fprintf(stderr, "xgate-glibc: unknown check %s\n", check);
        return 2;
    }
    return failed;
}
