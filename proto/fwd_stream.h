/* The rules of a port-forward stream (proto/agent_proto.h, PC_FWD_*), which
 * both ends keep: the host relay (csrc/streams.c) and the agent
 * (guest/agent/portfwd.c).  One definition, so the two cannot disagree on
 * what the window allows, when credit is due or when a stream has ended.
 * Each side brings its own socket and queue; "drained" below means that
 * side's queue of the peer's bytes is empty. */
#ifndef PARACELL_PROTO_FWD_STREAM_H
#define PARACELL_PROTO_FWD_STREAM_H

#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent_proto.h"

/* Credit goes back once this much was written, or when the queue empties. */
#define PC_FWD_CREDIT_BATCH (PC_FWD_WINDOW / 4)

struct pc_fwd_flow {
    uint32_t credit;   /* DATA bytes this side may still send */
    uint32_t unacked;  /* DATA bytes received and not yet credited back */
    uint32_t written;  /* of those, written to the socket since the last CREDIT */
    unsigned char sent_shut, got_shut, shut_wr, sent_close, got_close;
};

static inline void pc_fwd_flow_init(struct pc_fwd_flow *f)
{
    memset(f, 0, sizeof *f);
    f->credit = PC_FWD_WINDOW;
}

/* Whether the peer may send DATA of n bytes now. */
static inline int pc_fwd_data_allowed(const struct pc_fwd_flow *f, uint32_t n)
{
    return n > 0 && !f->got_shut && !f->got_close && n <= PC_FWD_WINDOW - f->unacked;
}

/* Whether the peer may give back this much credit: no more than was sent. */
static inline int pc_fwd_credit_allowed(const struct pc_fwd_flow *f, uint32_t bytes)
{
    return bytes > 0 && !f->got_close && bytes <= PC_FWD_WINDOW - f->credit;
}

/* Bytes to give back in a CREDIT now (and counted as given), or 0. */
static inline uint32_t pc_fwd_credit_due(struct pc_fwd_flow *f, int drained)
{
    uint32_t n = f->written;
    if (!n || f->got_close || (n < PC_FWD_CREDIT_BATCH && !drained))
        return 0;
    f->unacked -= n;
    f->written = 0;
    return n;
}

/* Whether to shut the socket down for writing now: the peer's SHUT came
 * and everything before it is written.  True once. */
static inline int pc_fwd_shut_due(struct pc_fwd_flow *f, int drained)
{
    if (!f->got_shut || f->shut_wr || !drained)
        return 0;
    f->shut_wr = 1;
    return 1;
}

/* The normal end: both SHUTs went and every byte of the peer's is written. */
static inline int pc_fwd_finished(const struct pc_fwd_flow *f, int drained)
{
    return !f->sent_close && f->sent_shut && f->got_shut && drained;
}

/* What a CLOSE from the peer means; -1 when it is a second one. */
enum pc_fwd_close_kind { PC_FWD_CLOSE_FREE, PC_FWD_CLOSE_FINISH, PC_FWD_CLOSE_ABORT };
static inline int pc_fwd_close_kind(struct pc_fwd_flow *f)
{
    if (f->got_close)
        return -1;
    f->got_close = 1;
    if (f->sent_close)
        return PC_FWD_CLOSE_FREE;   /* both sides are done: the id is free */
    if (f->sent_shut && f->got_shut)
        return PC_FWD_CLOSE_FINISH; /* finish writing, then CLOSE */
    return PC_FWD_CLOSE_ABORT;      /* before both SHUTs: reset the socket */
}

/* Closes a stream's socket; reset: with an RST, so its peer sees the failure
 * rather than a clean end. */
static inline void pc_fwd_close_socket(int *fd, int reset)
{
    if (*fd < 0)
        return;
    if (reset) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(*fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(*fd);
    *fd = -1;
}

#endif
