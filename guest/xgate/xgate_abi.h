/* The guest kernel's XGates interface (guest/xgate/000*.patch, mirrored from
 * arch/x86/include/asm/xgate.h there).  Shared by the agent and libxgate; the
 * numbers are ABI between this repository's kernel and its programs. */
#ifndef PARACELL_XGATE_ABI_H
#define PARACELL_XGATE_ABI_H

/* prctl(PR_XGATE, cmd, arg3, arg4, 0) */
#define PR_XGATE 0x58474154 /* "XGAT" */
#define PR_XGATE_ENABLE 1   /* this task and its children: XGates from the next execve */
#define PR_XGATE_STATUS 2   /* returns bit 0: enabled for the task, bit 1: active in this mm */
#define PR_XGATE_BASE 3     /* stores the [xgate] page address at (unsigned long *)arg3 */
#define PR_XGATE_DOMAIN 4   /* arg3 pkey, arg4 handler: returns the domain index */

#define XGATE_PKEY 15
#define XGATE_KEY_BITS (3u << (2 * XGATE_PKEY))

/* Gate page: one gate per 256-byte slot, called like a C function. */
#define XGATE_SLOT_SHIFT 8
#define XGATE_G_GETPID 0
#define XGATE_G_GETTID 1
#define XGATE_G_GETPPID 2
#define XGATE_G_GETUID 3
#define XGATE_G_GETEUID 4
#define XGATE_G_GETGID 5
#define XGATE_G_GETEGID 6
#define XGATE_G_GETCPU 7
#define XGATE_G_DCALL 8
#define XGATE_G_CLOCK 9 /* long clock(long clockid, struct timespec *): 0 or -ENOSYS */
#define XGATE_MAX_DOMAINS 4

#endif
