/* Port-forward streams, host half: the connections that csrc/portfwd.c steers
 * to the shim, each carried over the agent channel as PC_FWD_* frames
 * (proto/agent_proto.h).  Run by the shim's relay (csrc/relay.c) in its poll
 * loop; internal to paracell._native, not for cdef. */
#ifndef PARACELL_STREAMS_H
#define PARACELL_STREAMS_H

#include <stdint.h>

#include "agent_proto.h"
#include "portfwd.h"
#include "sink.h"

struct pollfd;
struct fwd;

/* pollfd slots fwd_poll_prepare fills: the two listeners, then the streams. */
#define FWD_POLLFDS (2 + PC_FWD_MAX_STREAMS)

/* Frames go to to_chan; the listeners stay the caller's.  NULL without memory. */
struct fwd *fwd_new(const struct pc_fwd_listeners *l, struct sink *to_chan);
/* Resets every open connection (the channel is gone) and frees f. */
void fwd_free(struct fwd *f);
/* Resets every open connection, sending nothing: after a rollback the
 * guest has no streams (csrc/relay.c). */
void fwd_forget_all(struct fwd *f);
/* Fills exactly FWD_POLLFDS slots; room: to_chan may take another frame. */
void fwd_poll_prepare(struct fwd *f, struct pollfd *pfd, int room);
void fwd_poll_handle(struct fwd *f, const struct pollfd *pfd);
int fwd_is_type(unsigned type);
/* A PC_FWD_* frame from the guest: 0, or -1 with *why set when it breaks
 * the protocol (the relay then ends the VM, as for any bad frame). */
int fwd_on_frame(struct fwd *f, unsigned type, unsigned id, const char *p, uint32_t n,
                 const char **why);

#endif
