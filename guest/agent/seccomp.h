/* linux.seccomp in the guest: the BPF program the host compiled with
 * libseccomp (paracell/runtime/inguest/seccomp.py) arrives in a PC_SECCOMP frame
 * just before the init's SPEC, is kept by the container, and is installed in
 * its init and every exec as the last step before execve, as runc does. */
#ifndef PARACELL_AGENT_SECCOMP_H
#define PARACELL_AGENT_SECCOMP_H

#include <stddef.h>
#include <stdint.h>

#include <linux/filter.h>

struct seccomp_prog {
    uint32_t flags; /* SECCOMP_FILTER_FLAG_* for seccomp(2) */
    uint32_t count;
    struct sock_filter insns[];
};

/* Checks a PC_SECCOMP payload and keeps a copy for the next SPEC on chan,
 * replacing any earlier one: 0, or -1 with err set to one line. */
int seccomp_stash(unsigned chan, const unsigned char *p, size_t len, char *err, size_t errlen);
/* The program stashed for chan, now the caller's (free it), or NULL. */
struct seccomp_prog *seccomp_take(unsigned chan);
/* seccomp(SECCOMP_SET_MODE_FILTER): 0, or -1 with errno. */
int seccomp_install(const struct seccomp_prog *p);

#endif
