/* The launch spec (docs/agent-protocol.md), parsed and checked before any
 * process exists, so that the code which applies it can trust every field. */
#ifndef PARACELL_AGENT_SPEC_H
#define PARACELL_AGENT_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "agent_proto.h"

enum spec_capset { SC_BOUNDING, SC_EFFECTIVE, SC_PERMITTED, SC_INHERITABLE, SC_AMBIENT, SC_COUNT };

/* What the SPEC asks of its container: create it (its process is the init),
 * join it (an exec), or whichever its existence decides. */
enum spec_role { SPEC_ROLE_ANY, SPEC_ROLE_INIT, SPEC_ROLE_EXEC };

enum spec_join { SPEC_JOIN_IPC, SPEC_JOIN_UTS, SPEC_JOIN_PID, SPEC_JOIN_COUNT };

struct spec_mount {
    const char *dest, *type, *source, *data;
    unsigned long flags;
    /* After the mount, as runc: a propagation change (MS_SHARED, MS_SLAVE,
     * MS_PRIVATE or MS_UNBINDABLE, with MS_REC for the r* options; 0: none),
     * MOUNT_ATTR_* bits set and cleared recursively (rro, rnosuid...), and
     * tmpcopyup (a tmpfs gets a copy of what it covers). */
    unsigned long propagation;
    uint64_t attr_set, attr_clr;
    int copyup;
};

/* linux.devices: a node made in the container's /dev tmpfs. */
struct spec_device {
    const char *path; /* absolute, under /dev */
    char type;        /* 'c', 'b' or 'p' */
    unsigned major, minor, mode;
    uint32_t uid, gid;
};

/* One line of linux.uidMappings or gidMappings. */
struct spec_idmap {
    uint32_t inside, outside, size;
};

/* linux.sysctl: the path under /proc/sys ("kernel/shmmax"), checked to name
 * a file there and no other. */
struct spec_sysctl {
    const char *path, *value;
};

struct spec_rlimit {
    int resource;
    uint64_t soft, hard;
};

struct spec {
    const char *container;
    /* SPEC_ROLE_INIT too when role= is absent but an init-only key is given. */
    enum spec_role role;
    char *argv[PC_SPEC_MAX_ARGS + 1];
    int argc;
    char *envp[PC_SPEC_MAX_ENV + 1];
    int envc;
    const char *cwd;
    uint32_t uid, gid;
    uint32_t gids[PC_SPEC_MAX_GIDS];
    int ngids;
    int has_umask;
    unsigned umask;
    struct spec_rlimit rlimits[PC_SPEC_MAX_RLIMITS];
    int nrlimits;
    int nnp;
    uint64_t caps[SC_COUNT];
    unsigned caps_given; /* bit per enum spec_capset */
    int has_oom_score_adj;
    int oom_score_adj;
    int terminal;
    unsigned rows, cols;
    const char *hostname;
    int root_readonly;
    int xgates; /* xgates=on: every process of the container runs with XGates */
    struct spec_mount mounts[PC_SPEC_MAX_MOUNTS];
    int nmounts;
    struct spec_sysctl sysctls[PC_SPEC_MAX_SYSCTLS];
    int nsysctls;
    /* linux.readonlyPaths and linux.maskedPaths, absolute, in the container. */
    const char *readonly_paths[PC_SPEC_MAX_PATHS];
    int nreadonly_paths;
    const char *masked_paths[PC_SPEC_MAX_PATHS];
    int nmasked_paths;
    struct spec_device devices[PC_SPEC_MAX_DEVICES];
    int ndevices;
    /* userns=1: the init enters a new user namespace with these maps. */
    int userns;
    struct spec_idmap uidmap[PC_SPEC_MAX_ID_MAPS], gidmap[PC_SPEC_MAX_ID_MAPS];
    int nuidmap, ngidmap;
    unsigned long root_propagation; /* linux.rootfsPropagation; 0: none */
    uint64_t memory_max, pids_max;  /* the container's group's limits; 0: none */
    int has_personality;
    unsigned long personality;      /* PER_LINUX or PER_LINUX32 */
    int has_ioprio;
    int ioprio_class, ioprio_level;
    int seccomp; /* seccomp=1: a PC_SECCOMP frame came just before, on this channel */
    /* A pod member's root, under PC_PODSHARE_DIR; NULL: the VM's rootfs share. */
    const char *rootfs;
    /* Pod members: the containers whose namespaces the init joins instead
     * of creating its own (NULL: a new one). */
    const char *join[SPEC_JOIN_COUNT];
};

/* Parses in place (buf is modified and must outlive *s). 0, or -1 with err
 * set to one line that starts with "spec: ". */
int spec_parse(char *buf, size_t len, struct spec *s, char *err, size_t errlen);

/* A limit of `max`: none. */
#define SPEC_NO_LIMIT UINT64_MAX

/* A LIMITS payload (agent_proto.h): pointers into the buffer; a limit is 0
 * when not given, SPEC_NO_LIMIT for `max`. */
struct limits {
    const char *container;
    uint64_t memory_max, pids_max;
};
int limits_parse(char *buf, size_t len, struct limits *l, char *err, size_t errlen);

#endif
