/* Output queues of the host relay (csrc/relay.c, csrc/streams.c): bytes bound
 * for one fd, kept in a growing buffer while the fd takes nothing, and
 * written out as it drains.  Internal to paracell._native; not for cdef. */
#ifndef PARACELL_SINK_H
#define PARACELL_SINK_H

#include <stddef.h>
#include <sys/types.h>

#include "agent_proto.h"

#define FRAME_MAX (PC_HDR_LEN + PC_MAX_PAYLOAD)
#define INBUF_CAP (2 * FRAME_MAX)
/* A sink may hold this much before the relay stops reading what feeds it. */
#define QUEUE_LIMIT (4u << 20)

enum sink_kind { SINK_NONE, SINK_NONBLOCK, SINK_SOCKET, SINK_BLOCKING };

struct sink {
    int fd;
    int owned;  /* fd was opened here and must be closed here */
    enum sink_kind kind;
    char *buf;
    size_t off, len, cap;
    int dead;   /* the reader went away: drop further output, as a broken pipe would */
    /* sink_hold: the last `held` bytes queued wait for sink_release_hold;
     * only what came before them is written. */
    int holding;
    size_t held;
};

/* fd reopened (or kept) so that this process alone sees it non-blocking. */
int private_nonblocking(int fd, int flags, int *owned, enum sink_kind *kind);
void sink_init_local(struct sink *s, int fd);
void sink_init_socket(struct sink *s, int fd);
size_t sink_pending(const struct sink *s);
/* What sink_flush may write now: the pending bytes before any held ones. */
size_t sink_flushable(const struct sink *s);
int sink_has_room(const struct sink *s);
/* Writes as much as the fd takes now; returns -1 when the reader is gone. */
int sink_flush(struct sink *s);
int sink_append(struct sink *s, const char *p, size_t n);
int sink_frame(struct sink *s, unsigned type, unsigned chan, const char *p, size_t n);
/* Receives at most max bytes from socket fd straight into the queue, as the
 * payload of one frame: the bytes read, 0 at EOF, -1 with errno (EAGAIN). */
ssize_t sink_recv_frame(struct sink *s, int fd, unsigned type, unsigned chan, size_t max);
void sink_release(struct sink *s);
/* From now on, what is queued waits behind everything queued so far. */
void sink_hold(struct sink *s);
/* Puts one frame ahead of the held bytes, then lets them go. */
int sink_release_hold(struct sink *s, unsigned type, unsigned chan, const char *p, size_t n);
/* Drops the held frames keep() refuses (sink_frame and sink_recv_frame queue
 * whole frames, so the held bytes are a run of them). */
void sink_filter_held(struct sink *s, int (*keep)(void *arg, unsigned type, unsigned chan,
                                                 size_t len),
                      void *arg);

#endif
