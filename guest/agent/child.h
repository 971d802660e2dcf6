/* The child side of a container process, from fork to execve.  It runs in a
 * copy of the agent and talks back only through the fds it is handed. */
#ifndef PARACELL_AGENT_CHILD_H
#define PARACELL_AGENT_CHILD_H

#include "seccomp.h"
#include "spec.h"

struct child_ctx {
    const struct spec *spec;
    int is_init;
    int stdio[3];     /* fds for 0,1,2; -1 with a terminal */
    int tty;          /* 1: the child opens a pty; its slave becomes stdio */
    int status_fd;    /* CLOEXEC seqpacket socket to the agent: "O" (with the
                       * pty master when tty) or "E<text>", at most ERRTEXT_MAX */
    int start_fd;     /* pipe from the agent: one byte means START */
    int ns_mnt, ns_uts, ns_ipc; /* exec: the container's namespaces; init of a pod
                                 * member: -1, or the uts/ipc namespace it joins */
    int ns_user;      /* exec only: the container's user namespace, or -1 */
    const struct seccomp_prog *seccomp; /* the container's filter, or NULL */
    int xgates;       /* switch XGates on (guest/xgate/) before execve */
    int cgroup_procs; /* the container's cgroup.procs (cgroup.h), or -1 */
};

void child_main(const struct child_ctx *c) __attribute__((noreturn));

#endif
