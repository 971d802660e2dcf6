/* C encoders and decoders for the fixed-size payloads of proto/agent_proto.h, shared
 * by the guest agent and the host relay.  Explicit little-endian byte order:
 * the payload is a wire format, not a C struct in memory. */
#ifndef PARACELL_PROTO_AGENT_CODEC_H
#define PARACELL_PROTO_AGENT_CODEC_H

#include <stdint.h>

#include "agent_proto.h"

static inline void pc_put_le16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static inline void pc_put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void pc_put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint16_t pc_get_le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t pc_get_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void pc_hdr_encode(unsigned char *p, const struct pc_hdr *h)
{
    pc_put_le32(p, h->len);
    pc_put_le16(p + 4, h->type);
    pc_put_le16(p + 6, h->chan);
}

static inline void pc_hdr_decode(const unsigned char *p, struct pc_hdr *h)
{
    h->len = pc_get_le32(p);
    h->type = pc_get_le16(p + 4);
    h->chan = pc_get_le16(p + 6);
}

/* Each decoder returns 0, or -1 when the payload has the wrong size. */
#define PC_READY_LEN 8
static inline void pc_ready_encode(unsigned char *p, const struct pc_ready_msg *m)
{
    pc_put_le32(p, m->version);
    pc_put_le32(p + 4, m->caps);
}

#define PC_SIGNAL_LEN 8
static inline void pc_signal_encode(unsigned char *p, const struct pc_signal_msg *m)
{
    pc_put_le32(p, m->signo);
    pc_put_le32(p + 4, m->flags);
}

static inline int pc_signal_decode(const unsigned char *p, uint32_t n, struct pc_signal_msg *m)
{
    if (n != PC_SIGNAL_LEN)
        return -1;
    m->signo = pc_get_le32(p);
    m->flags = pc_get_le32(p + 4);
    return 0;
}

#define PC_RESIZE_LEN 4
static inline void pc_resize_encode(unsigned char *p, const struct pc_resize_msg *m)
{
    pc_put_le16(p, m->rows);
    pc_put_le16(p + 2, m->cols);
}

static inline int pc_resize_decode(const unsigned char *p, uint32_t n, struct pc_resize_msg *m)
{
    if (n != PC_RESIZE_LEN)
        return -1;
    m->rows = pc_get_le16(p);
    m->cols = pc_get_le16(p + 2);
    return 0;
}

#define PC_U32_MSG_LEN 4
static inline void pc_created_encode(unsigned char *p, const struct pc_created_msg *m)
{
    pc_put_le32(p, m->pid);
}

static inline void pc_exit_encode(unsigned char *p, const struct pc_exit_msg *m)
{
    pc_put_le32(p, (uint32_t)m->status);
}

static inline int pc_exit_decode(const unsigned char *p, uint32_t n, struct pc_exit_msg *m)
{
    if (n != PC_U32_MSG_LEN)
        return -1;
    m->status = (int32_t)pc_get_le32(p);
    return 0;
}

/* The payloads that are one u32: each decoder below is this check. */
static inline int pc_u32_msg_decode(const unsigned char *p, uint32_t n, uint32_t *v)
{
    if (n != PC_U32_MSG_LEN)
        return -1;
    *v = pc_get_le32(p);
    return 0;
}

static inline void pc_quiesce_encode(unsigned char *p, const struct pc_quiesce_msg *m)
{
    pc_put_le32(p, m->seq);
}

static inline int pc_quiesce_decode(const unsigned char *p, uint32_t n, struct pc_quiesce_msg *m)
{
    return pc_u32_msg_decode(p, n, &m->seq);
}

static inline void pc_stdin_credit_encode(unsigned char *p, const struct pc_stdin_credit_msg *m)
{
    pc_put_le32(p, m->bytes);
}

static inline int pc_stdin_credit_decode(const unsigned char *p, uint32_t n,
                                         struct pc_stdin_credit_msg *m)
{
    return pc_u32_msg_decode(p, n, &m->bytes);
}

static inline void pc_resume_encode(unsigned char *p, const struct pc_resume_msg *m)
{
    pc_put_le32(p, m->flags);
}

static inline int pc_resume_decode(const unsigned char *p, uint32_t n, struct pc_resume_msg *m)
{
    return pc_u32_msg_decode(p, n, &m->flags);
}

#define PC_FWD_OPEN_LEN 4
static inline void pc_fwd_open_encode(unsigned char *p, const struct pc_fwd_open_msg *m)
{
    pc_put_le16(p, m->port);
    pc_put_le16(p + 2, m->family);
}

static inline int pc_fwd_open_decode(const unsigned char *p, uint32_t n, struct pc_fwd_open_msg *m)
{
    if (n != PC_FWD_OPEN_LEN)
        return -1;
    m->port = pc_get_le16(p);
    m->family = pc_get_le16(p + 2);
    return 0;
}

static inline void pc_fwd_credit_encode(unsigned char *p, const struct pc_fwd_credit_msg *m)
{
    pc_put_le32(p, m->bytes);
}

static inline int pc_fwd_credit_decode(const unsigned char *p, uint32_t n,
                                       struct pc_fwd_credit_msg *m)
{
    return pc_u32_msg_decode(p, n, &m->bytes);
}

/* STATS_REPLY: the figures, by enum pc_stat. */
#define PC_STATS_REPLY_LEN (8 * PC_STAT_COUNT)
static inline void pc_stats_reply_encode(unsigned char *p, const uint64_t v[PC_STAT_COUNT])
{
    for (int i = 0; i < PC_STAT_COUNT; i++)
        pc_put_le64(p + 8 * i, v[i]);
}

#endif
