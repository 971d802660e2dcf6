/* PC_SECCOMP frames: checked, kept per channel until their SPEC takes them,
 * and installed in a container process (proto/agent_proto.h). */
#define _GNU_SOURCE
#include "seccomp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/seccomp.h>

#include "agent_codec.h"
#include "agent_proto.h"

/* The host sends a frame and its SPEC back to back, so a few kept at once
 * is plenty; the bound keeps a confused host from filling guest memory. */
#define MAX_STASHED 8

static struct seccomp_prog *stashed[PC_MAX_CHAN + 1];
static int nstashed;

struct seccomp_prog *seccomp_take(unsigned chan)
{
    if (chan > PC_MAX_CHAN || !stashed[chan])
        return NULL;
    struct seccomp_prog *p = stashed[chan];
    stashed[chan] = NULL;
    nstashed--;
    return p;
}

int seccomp_stash(unsigned chan, const unsigned char *p, size_t len, char *err, size_t errlen)
{
    if (chan > PC_MAX_CHAN) {
        snprintf(err, errlen, "seccomp: chan %u out of range", chan);
        return -1;
    }
    free(seccomp_take(chan));
    if (len < PC_SECCOMP_HDR_LEN) {
        snprintf(err, errlen, "seccomp: frame of %zu bytes has no header", len);
        return -1;
    }
    uint32_t flags = pc_get_le32(p), count = pc_get_le32(p + 4);
    if (flags & ~(uint32_t)PC_SECCOMP_FLAGS_ALLOWED) {
        snprintf(err, errlen, "seccomp: flags %#x not allowed", flags);
        return -1;
    }
    if (!count || count > PC_SECCOMP_MAX_INSNS ||
        len != PC_SECCOMP_HDR_LEN + (size_t)count * sizeof(struct sock_filter)) {
        snprintf(err, errlen, "seccomp: %u instructions in %zu bytes", count, len);
        return -1;
    }
    if (nstashed >= MAX_STASHED) {
        snprintf(err, errlen, "seccomp: %d programs already wait for their SPEC", MAX_STASHED);
        return -1;
    }
    struct seccomp_prog *prog = malloc(sizeof *prog + (size_t)count * sizeof(struct sock_filter));
    if (!prog) {
        snprintf(err, errlen, "seccomp: out of memory");
        return -1;
    }
    prog->flags = flags;
    prog->count = count;
    const unsigned char *in = p + PC_SECCOMP_HDR_LEN;
    for (uint32_t i = 0; i < count; i++, in += 8) {
        prog->insns[i].code = pc_get_le16(in);
        prog->insns[i].jt = in[2];
        prog->insns[i].jf = in[3];
        prog->insns[i].k = pc_get_le32(in + 4);
    }
    stashed[chan] = prog;
    nstashed++;
    return 0;
}

int seccomp_install(const struct seccomp_prog *p)
{
    struct sock_fprog fp = {.len = (unsigned short)p->count,
                            .filter = (struct sock_filter *)p->insns};
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, p->flags, &fp);
}
