/* Containers in this VM, by the id their SPECs name: one slot each, holding
 * the init's pid and namespaces, which exec'd processes join.  The rules are
 * in docs/agent-protocol.md ("Containers"). */
#ifndef PARACELL_AGENT_CONTAINER_H
#define PARACELL_AGENT_CONTAINER_H

#include <stddef.h>
#include <sys/types.h>

#include "agent_proto.h"
#include "cgroup.h"
#include "seccomp.h"
#include "spec.h"

#define CTR_MAX 64

enum ctr_state {
    CTR_FREE,
    CTR_NEW,    /* claimed by a SPEC whose init is being set up */
    CTR_LIVE,   /* the init runs; its namespaces are held open */
    CTR_EXITED, /* the init was reaped, so its pid namespace is empty */
    CTR_ENDED,  /* the init's EXIT is queued; the id is remembered until the slot is reused */
};

enum ctr_ns { CTR_NS_PID, CTR_NS_MNT, CTR_NS_UTS, CTR_NS_IPC, CTR_NS_USER, CTR_NS_COUNT };

struct ctr {
    enum ctr_state state;
    char id[PC_SPEC_MAX_CONTAINER_ID + 1];
    pid_t init_pid;
    int ns[CTR_NS_COUNT];   /* open while CTR_LIVE */
    unsigned procs;         /* process slots that point here; the slot is not reused before 0 */
    int xgates;             /* the init's xgates=on, which every exec inherits */
    int userns;             /* the init has its own user namespace, which execs join */
    struct seccomp_prog *seccomp; /* the init's filter, which every exec gets too; owned */
    unsigned long long ended_seq;
    struct cgroup cg;       /* the init's and its execs' (cgroup.h) */
};

/* The container a SPEC for id with this role runs in: 0 and *out set, to a
 * CTR_LIVE slot (the process is an exec) or a CTR_NEW one (the process is
 * its init, and the caller must end with ctr_started or ctr_abandon); or -1
 * with err set to one line. */
int ctr_claim(const char *id, enum spec_role role, struct ctr **out, char *err, size_t errlen);
/* CTR_NEW -> CTR_LIVE once the init exists: 0, or -1 with errno set when its
 * namespaces cannot be opened (the slot stays CTR_NEW). */
int ctr_started(struct ctr *c, pid_t init_pid);
void ctr_abandon(struct ctr *c);
/* The CTR_LIVE container named id, whose namespaces a pod member may join; or NULL. */
const struct ctr *ctr_find_live(const char *id);
/* A process slot starts or stops pointing at c. */
void ctr_hold(struct ctr *c);
void ctr_release(struct ctr *c);
void ctr_init_exited(struct ctr *c);
void ctr_init_reported(struct ctr *c);
/* 1 once some container existed and every one has ended: the VM's work is done. */
int ctr_all_ended(void);
/* The figures of the container named id (enum pc_stat), whose init runs or
 * ran: an ended one's are its last, until its slot is reused. 0, or -1 with
 * err set. */
int ctr_stats(const char *id, uint64_t v[PC_STAT_COUNT], char *err, size_t errlen);
/* New limits (cg_limit's) on the group of the CTR_LIVE container named id:
 * 0, or -1 with err set. */
int ctr_limit(const char *id, uint64_t memory_max, uint64_t pids_max, char *err, size_t errlen);
/* A fork: the one CTR_LIVE container takes a new id, and its UTS namespace
 * the new hostname.  0, or -1 with err set. */
int ctr_reidentify(const char *id, const char *hostname, char *err, size_t errlen);
/* Sends signo to every process of a CTR_LIVE container: 0, or -1 with errno. */
int ctr_signal_all(const struct ctr *c, int signo);

#endif
