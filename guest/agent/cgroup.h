/* The guest's cgroup v2 hierarchy: each container of the VM, its init and
 * its execs, in a group of its own, so that its figures (STATS) are its own
 * and not its pod's.  A guest where the hierarchy cannot be set up still
 * runs containers; they only have no figures. */
#ifndef PARACELL_AGENT_CGROUP_H
#define PARACELL_AGENT_CGROUP_H

#include <stddef.h>
#include <stdint.h>

#include "agent_proto.h"
#include "spec.h"

struct cgroup {
    char name[24];  /* under the root; empty: none */
    int procs_fd;   /* its cgroup.procs, open for writing; a child writes "0" to join */
    int dir_fd;
};

/* Mounts the hierarchy and hands the memory and pids controllers down. */
void cg_init(void);
/* A new group for a container: 0, or -1 (logged) with g left empty. */
int cg_create(struct cgroup *g);
/* Closes g and removes it; a group that still holds a process keeps its
 * name, for the next call to try again (logged). An ended container's group
 * goes when its slot is reused. */
void cg_remove(struct cgroup *g);
/* Writes memory.max and pids.max (0: leave it as it is; SPEC_NO_LIMIT: max):
 * 0, or -1 with err set. */
int cg_limit(const struct cgroup *g, uint64_t memory_max, uint64_t pids_max, char *err,
             size_t errlen);
/* g's figures by enum pc_stat: 0, or -1 with err set. */
int cg_read(const struct cgroup *g, uint64_t v[PC_STAT_COUNT], char *err, size_t errlen);

#endif
