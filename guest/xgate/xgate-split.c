/* An ELF with WRPKRU bytes that no instruction meant, the way libnettle has
 * them: "rol $0xf,%r15d" (41 c1 c7 0f) then "add %ebp,%edi" (01 ef), whose
 * bytes read 0f 01 ef across the two.  tests/integration/test_xgate.py runs
 * it with XGates on and off (patch guest/xgate/0007, docs/xgates.md
 * "Inadvertent WRPKRU bytes").
 *
 *   xgate-split bytes     how the split site is mapped: "0f cc ef" with XGates
 *                         (the add's 01 turned into INT3), "0f 01 ef" without
 *   xgate-split run       normal execution: the add's result, its flags and
 *                         the zero-extension of RDI, for values that set each
 *                         arithmetic flag; a transcript that must be the same
 *                         with XGates on and off
 *   xgate-split mid       a child jumps to the 0f with EAX = ECX = EDX = 0,
 *                         which without XGates is a WRPKRU opening every key
 *   xgate-split mprotect  the same bytes in an anonymous page made executable,
 *                         and with an ALU head (and $0xf): trapped and correct;
 *                         with a memory-form head (not a split site) refused
 *
 * Static, so the only split site in it is its own. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "xgate-check.h"
#include "xgate.h"

/* What split_fn saw after the add: flags, RDI, R15, PKRU. */
unsigned long split_out[4];
unsigned long split_fn(unsigned long a, unsigned b, unsigned r);
void split_jump(void);
extern const unsigned char split_head[];

__asm__(".text\n"
        ".globl split_fn, split_jump, split_head\n"
        "split_fn:\n"
        "  push %rbp\n"
        "  push %r15\n"
        "  mov %esi, %ebp\n"
        "  mov %edx, %r15d\n"
        "split_head:\n"
        "  .byte 0x41, 0xc1, 0xc7, 0x0f\n" /* rol $0xf, %r15d */
        "  .byte 0x01, 0xef\n"             /* add %ebp, %edi */
        "  pushfq\n"
        "  pop %rax\n"
        "  mov %rax, split_out(%rip)\n"
        "  mov %rdi, split_out+8(%rip)\n"
        "  mov %r15, split_out+16(%rip)\n"
        "  xor %ecx, %ecx\n"
        "  .byte 0x0f, 0x01, 0xee\n" /* rdpkru */
        "  mov %rax, split_out+24(%rip)\n"
        "  pop %r15\n"
        "  pop %rbp\n"
        "  ret\n"
        /* Enters at the 0f with split_fn's frame, so that a WRPKRU there (no
         * XGates) runs on through the add and returns. */
        "split_jump:\n"
        "  push %rbp\n"
        "  push %r15\n"
        "  xor %eax, %eax\n"
        "  xor %ecx, %ecx\n"
        "  xor %edx, %edx\n"
        "  jmp split_head+3\n");

/* CF PF AF ZF SF OF */
#define ARITH_FLAGS 0x8d5UL

static void check_bytes(void)
{
    const unsigned char *p = split_head + 3;
    printf("bytes %02x %02x %02x\n", p[0], p[1], p[2]);
    if (xgate_available())
        EXPECT(p[0] == 0x0f && p[1] == 0xcc && p[2] == 0xef, "split site not trapped");
    else
        EXPECT(p[0] == 0x0f && p[1] == 0x01 && p[2] == 0xef, "bytes changed without XGates");
    if (!failed)
        printf("ok bytes %s\n", p[1] == 0xcc ? "trapped (0f cc ef)" : "plain (0f 01 ef)");
}

static void check_run(void)
{
    static const unsigned long cases[][2] = {
        {5, 7},                      /* none */
        {0xffffffff, 1},             /* CF ZF AF PF */
        {0x7fffffff, 1},             /* OF SF AF */
        {0x80000000, 0x80000000},    /* CF OF ZF */
        {0x0f, 0x01},                /* AF */
        {0x12345678, 0x9abcdef0},    /* SF */
        {0xdeadbeef00000003UL, 4},   /* the upper half of RDI is cleared */
    };
    for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        split_fn(cases[i][0], (unsigned)cases[i][1], 0x12345678);
        printf("add %#lx + %#lx -> rdi %#lx flags %#lx r15 %#lx\n", cases[i][0], cases[i][1],
               split_out[1], split_out[0] & ARITH_FLAGS, split_out[2]);
    }
    /* Many times: each one a trap with XGates. */
    unsigned long sum = 0;
    for (unsigned i = 0; i < 20000; i++) {
        split_fn(i, i * 3, i);
        sum += split_out[1] ^ split_out[2];
    }
    printf("20000 calls: sum %#lx\n", sum);
    unsigned pkru = (unsigned)split_out[3];
    if (xgate_available())
        EXPECT(((pkru >> 30) & 3) == 3, "key 15 open after the add: pkru %#x", pkru);
    if (!failed)
        printf("ok run\n");
}

static void check_mid(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        split_jump();
        printf("mid: returned, pkru %#lx\n", split_out[3]);
        fflush(stdout);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status))
        printf("mid: killed by signal %d\n", WTERMSIG(status));
    else
        printf("mid: exited %d\n", WEXITSTATUS(status));
    if (xgate_available())
        EXPECT(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
               "the jump into the middle was not killed by SIGSEGV");
    if (!failed)
        printf("ok mid\n");
}

/* push rbp; mov ebp, esi; push r15; HEAD 0f 01 ef; pop r15; pop rbp; mov eax, edi; ret */
static unsigned char *anon_fn(const unsigned char head[3])
{
    static const unsigned char code[] = {0x55, 0x89, 0xf5, 0x41, 0x57, 0, 0, 0, 0x0f, 0x01,
                                         0xef, 0x41, 0x5f, 0x5d, 0x89, 0xf8, 0xc3};
    unsigned char *a = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                            -1, 0);
    if (a == MAP_FAILED)
        return NULL;
    memcpy(a + 0x100, code, sizeof code);
    memcpy(a + 0x105, head, 3);
    return a;
}

static void check_mprotect(void)
{
    int x = xgate_available();
    static const unsigned char rol[3] = {0x41, 0xc1, 0xc7};  /* rol $0xf, %r15d */
    static const unsigned char and[3] = {0x41, 0x83, 0xe7};  /* and $0xf, %r15d */
    static const unsigned char mem[3] = {0x41, 0xc1, 0x47};  /* rol $1, 0xf(%r15): no site */
    unsigned char *a = anon_fn(rol), *c = anon_fn(and), *b = anon_fn(mem);
    EXPECT(a && b && c, "mmap: %s", strerror(errno));
    if (failed)
        return;
    errno = 0;
    int rc = mprotect(a, 4096, PROT_READ | PROT_EXEC), rc_errno = errno;
    errno = 0;
    int rc_and = mprotect(c, 4096, PROT_READ | PROT_EXEC), and_errno = errno;
    errno = 0;
    int near = mprotect(b, 4096, PROT_READ | PROT_EXEC), near_errno = errno;
    unsigned sum = 0, sum_and = 0;
    if (rc == 0)
        sum = ((unsigned (*)(unsigned, unsigned))(a + 0x100))(40, 2);
    if (rc_and == 0)
        sum_and = ((unsigned (*)(unsigned, unsigned))(c + 0x100))(40, 3);
    printf("mprotect: split %d/%s byte %#x sum %u, alu form %d/%s byte %#x sum %u, "
           "memory form %d/%s\n", rc, strerror(rc_errno), a[0x109], sum, rc_and,
           strerror(and_errno), c[0x109], sum_and, near, strerror(near_errno));
    EXPECT(rc == 0 && sum == 42 && rc_and == 0 && sum_and == 43, "split site in anonymous code");
    if (x) {
        EXPECT(a[0x109] == 0xcc && c[0x109] == 0xcc, "split site in anonymous code not trapped");
        EXPECT(near < 0 && near_errno == EPERM, "memory-form head allowed");
    } else {
        EXPECT(a[0x109] == 0x01 && c[0x109] == 0x01 && near == 0,
               "without XGates the bytes or rights changed");
    }
    if (!failed)
        printf("ok mprotect xgates=%d\n", x);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    check = argc > 1 ? argv[1] : "";
    if (!strcmp(check, "bytes"))
        check_bytes();
    else if (!strcmp(check, "run"))
        check_run();
    else if (!strcmp(check, "mid"))
        check_mid();
    else if (!strcmp(check, "mprotect"))
        check_mprotect();
    else {
        fprintf(stderr, "xgate-split: unknown check %s\n", check);
        return 2;
    }
    return failed;
}
