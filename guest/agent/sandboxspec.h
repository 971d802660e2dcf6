/* The SANDBOX payload, parsed: see proto/agent_proto.h for its records. */
#ifndef PARACELL_AGENT_SANDBOXSPEC_H
#define PARACELL_AGENT_SANDBOXSPEC_H

#include <stddef.h>
#include <time.h>

#include "agent_proto.h"
#include "netspec.h"

struct sandbox_share {
    const char *tag, *dir;
};
/* Every share a VM can have, by tag, and where the agent mounts it. */
extern const struct sandbox_share SANDBOX_SHARES[PC_SANDBOX_MAX_SHARES];

struct sandbox_spec {
    int shares[PC_SANDBOX_MAX_SHARES]; /* 1: mount SANDBOX_SHARES[i] */
    const char *hostname;              /* points into the parsed buffer */
    int has_clock;
    struct timespec clock;
    unsigned char entropy[PC_SANDBOX_ENTROPY_MAX];
    size_t nentropy;
    struct net_spec net;
    int rootdisk;                      /* 0: none, else ROOTDISK_RO or ROOTDISK_RW */
    struct {
        unsigned slot;
        const unsigned char *bytes;    /* decoded in place, in the parsed buffer */
        size_t len;
    } hostfiles[PC_SANDBOX_MAX_HOSTFILES];
    int nhostfiles;
    const char *container;             /* FORKED: the container's new id */
    const char *machine_id;            /* FORKED: 32 hex digits */
    int forked;                        /* parsed as FORKED, not SANDBOX */
};

#define ROOTDISK_RO 1
#define ROOTDISK_RW 2

/* buf is modified in place; 0, or -1 with err set to one line. */
int sandbox_parse(char *buf, size_t len, struct sandbox_spec *s, char *err, size_t errlen);
/* The same for a FORKED payload: container and machineid are its keys only. */
int sandbox_parse_forked(char *buf, size_t len, struct sandbox_spec *s, char *err,
                         size_t errlen);

#endif
