/* What the in-guest XGates check programs (xgate-test, xgate-glibc,
 * xgate-pitfalls) share: the current check's name and a failure flag, the
 * FAIL/EXPECT reports the integration tests read, RDPKRU, and a fault
 * catcher that turns a SIGSEGV, SIGTRAP or SIGILL into a recorded outcome
 * instead of the program's death.  Static and header-only: each program is
 * one file built into the test rootfs (paracell/bench/xgaterootfs.py). */
#ifndef PARACELL_XGATE_CHECK_H
#define PARACELL_XGATE_CHECK_H

#include <setjmp.h>
#include <signal.h>
#include <stdio.h>

__attribute__((unused)) static const char *check = "";
__attribute__((unused)) static int failed;

#define FAIL(...)                                       \
    do {                                                \
        printf("FAIL %s: ", check);                     \
        printf(__VA_ARGS__);                            \
        printf("\n");                                   \
        fflush(stdout);                                 \
        failed = 1;                                     \
    } while (0)
#define EXPECT(cond, ...)                               \
    do {                                                \
        if (!(cond))                                    \
            FAIL(__VA_ARGS__);                          \
    } while (0)

static inline unsigned rdpkru(void)
{
    unsigned eax, edx;
    __asm__ volatile(".byte 0x0f, 0x01, 0xee" : "=a"(eax), "=d"(edx) : "c"(0));
    return eax;
}

/* The last caught fault: its signal, si_code, and the pkey of a SEGV_PKUERR
 * (-1 for any other). */
static sigjmp_buf jb;
static volatile int seg_sig, seg_code, seg_pkey;

static inline void on_fault(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    seg_sig = sig;
    seg_code = si->si_code;
    seg_pkey = sig == SIGSEGV && si->si_code == SEGV_PKUERR ? (int)si->si_pkey : -1;
    siglongjmp(jb, 1);
}

static inline void catch_faults(int on)
{
    struct sigaction sa = {.sa_sigaction = on_fault, .sa_flags = SA_SIGINFO | SA_NODEFER};
    if (!on)
        sa.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGTRAP, &sa, NULL);
    sigaction(SIGILL, &sa, NULL);
}

/* 0 when the access worked, else the si_code of the fault it took. */
static inline int touch(volatile int *p, int write)
{
    catch_faults(1);
    seg_code = 0;
    if (!sigsetjmp(jb, 1)) {
        if (write)
            *p = 1;
        else
            (void)*p;
    }
    catch_faults(0);
    return seg_code;
}

#endif
