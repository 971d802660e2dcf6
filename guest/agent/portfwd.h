/* Port-forward streams, guest half: each stream the host opens (PC_FWD_OPEN)
 * is a connection from the agent to 127.0.0.1 or ::1 at the port the host's
 * client dialled, in the VM's network namespace, which is the containers'.
 * The protocol is in proto/agent_proto.h and docs/agent-protocol.md. */
#ifndef PARACELL_AGENT_PORTFWD_H
#define PARACELL_AGENT_PORTFWD_H

#include "channel.h"

struct pollfd;

/* A PC_FWD_* frame that passed frame_decode. */
void fwd_handle(const struct host_msg *m);
/* Adds the fds the loop should wait on; returns the new count. */
int fwd_poll_prepare(struct pollfd *pfd, int n, int max);
void fwd_poll_handle(const struct pollfd *pfd, int n);
/* After a rollback: every stream is closed without a frame (the host ended them). */
void fwd_forget_all(void);

#endif
