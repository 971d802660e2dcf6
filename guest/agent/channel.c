/* Framing on the virtio-serial port and the two bounded queues around it.
 *
 * Outgoing bytes live in one ring so that process output can be read straight
 * into place behind a reserved header (no second copy, which matters under
 * TCG).  Incoming bytes live in a linear buffer big enough for a whole frame
 * plus what arrives behind it; a frame stays there until the agent can act on
 * it, which is how a full stdin buffer holds back the port (once this buffer
 * is full too). */
#define _GNU_SOURCE
#include "channel.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "agent_codec.h"
#include "log.h"

static unsigned char *oq;
static size_t oq_head, oq_len;

/* Beyond the frame at the head, room to look ahead for control frames while
 * a full stdin buffer holds the head back. */
#define INQ_CAP (512u * 1024)
static unsigned char *iq;
static size_t iq_off, iq_len;

int chan_init(void)
{
    oq = malloc(OUTQ_CAP);
    iq = malloc(INQ_CAP);
    return oq && iq ? 0 : -1;
}

size_t outq_free(void) { return OUTQ_CAP - oq_len; }
size_t outq_pending(void) { return oq_len; }

int outq_has_data_room(void)
{
    return outq_free() >= PC_HDR_LEN + PC_MAX_PAYLOAD + OUTQ_CTRL_RESERVE;
}

/* pos is counted from the oldest queued byte. */
static void oq_put_at(size_t pos, const void *src, size_t n)
{
    size_t at = (oq_head + pos) % OUTQ_CAP;
    size_t first = OUTQ_CAP - at;
    if (first > n)
        first = n;
    memcpy(oq + at, src, first);
    memcpy(oq, (const unsigned char *)src + first, n - first);
}

static void put_hdr(size_t pos, uint32_t len, uint16_t type, uint16_t chan)
{
    unsigned char b[PC_HDR_LEN];
    struct pc_hdr h = {.len = len, .type = type, .chan = chan};
    pc_hdr_encode(b, &h);
    oq_put_at(pos, b, sizeof b);
}

int chan_send(uint16_t type, uint16_t chan, const void *payload, size_t len)
{
    if (len > PC_MAX_PAYLOAD || PC_HDR_LEN + len > outq_free()) {
        /* Only reachable if the reserve arithmetic is wrong; losing a frame
         * beats overwriting queued output. */
        logmsg("outgoing queue full, dropped frame type %u chan %u", type, chan);
        return -1;
    }
    put_hdr(oq_len, (uint32_t)len, type, chan);
    if (len)
        oq_put_at(oq_len + PC_HDR_LEN, payload, len);
    oq_len += PC_HDR_LEN + len;
    return 0;
}

int chan_send_text(uint16_t type, uint16_t chan, const char *text)
{
    /* The text may quote container-controlled names; the host gets one line. */
    char line[ERRTEXT_MAX];
    return chan_send(type, chan, line, text_oneline(line, text, sizeof line));
}

ssize_t outq_read_frame(int fd, uint16_t type, uint16_t chan)
{
    return outq_read_frame_max(fd, type, chan, PC_MAX_PAYLOAD);
}

ssize_t outq_read_frame_max(int fd, uint16_t type, uint16_t chan, size_t max)
{
    size_t room = outq_free();
    if (room <= PC_HDR_LEN || !max) {
        errno = EAGAIN;
        return -1;
    }
    room -= PC_HDR_LEN;
    if (room > PC_MAX_PAYLOAD)
        room = PC_MAX_PAYLOAD;
    if (room > max)
        room = max;

    size_t at = (oq_head + oq_len + PC_HDR_LEN) % OUTQ_CAP;
    size_t first = OUTQ_CAP - at;
    struct iovec iov[2];
    int cnt = 1;
    iov[0].iov_base = oq + at;
    if (first >= room) {
        iov[0].iov_len = room;
    } else {
        iov[0].iov_len = first;
        iov[1].iov_base = oq;
        iov[1].iov_len = room - first;
        cnt = 2;
    }
    ssize_t n;
    do
        n = readv(fd, iov, cnt);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return n;
    put_hdr(oq_len, (uint32_t)n, type, chan);
    oq_len += PC_HDR_LEN + (size_t)n;
    return n;
}

int outq_flush(int port)
{
    while (oq_len) {
        size_t first = OUTQ_CAP - oq_head;
        if (first > oq_len)
            first = oq_len;
        /* The driver takes at most 32 KiB per write; a nonblocking port never
         * spins in the kernel waiting for the host to consume the buffer. */
        ssize_t n = write(port, oq + oq_head, first);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN ? 0 : -1;
        }
        if (n == 0)
            return 0;
        oq_head = (oq_head + (size_t)n) % OUTQ_CAP;
        oq_len -= (size_t)n;
    }
    /* Restarting at 0 keeps later frames contiguous, so fewer split reads. */
    oq_head = 0;
    return 0;
}

int inq_has_room(void)
{
    return iq_len < INQ_CAP;
}

ssize_t inq_fill(int port)
{
    /* The driver hands out at most a page per read; keep at least that much
     * contiguous room by sliding the unparsed tail down. */
    if (iq_off && INQ_CAP - iq_off - iq_len < 4096) {
        memmove(iq, iq + iq_off, iq_len);
        iq_off = 0;
    }
    size_t room = INQ_CAP - iq_off - iq_len;
    if (!room) {
        errno = EAGAIN;
        return -1;
    }
    ssize_t n;
    do
        n = read(port, iq + iq_off + iq_len, room);
    while (n < 0 && errno == EINTR);
    if (n > 0)
        iq_len += (size_t)n;
    return n;
}

size_t inq_buffered(void)
{
    return iq_len;
}

int inq_frame_at(size_t pos, struct frame *f)
{
    struct pc_hdr h;
    if (iq_len < pos + PC_HDR_LEN)
        return 0;
    unsigned char *p = iq + iq_off + pos;
    pc_hdr_decode(p, &h);
    if (h.len > PC_MAX_PAYLOAD) {
        /* The length is the only way to find the next frame, so the stream
         * cannot be resynchronised: drop everything from here on. */
        loghost("protocol: frame length %u over the limit, discarding %zu buffered bytes",
               h.len, iq_len - pos);
        iq_len = pos;
        if (!iq_len)
            iq_off = 0;
        return 0;
    }
    if (iq_len < pos + PC_HDR_LEN + h.len)
        return 0;
    f->pos = pos;
    f->hdr = h;
    f->payload = p + PC_HDR_LEN;
    return 1;
}

void inq_consume_head(const struct frame *f)
{
    iq_off += PC_HDR_LEN + f->hdr.len;
    iq_len -= PC_HDR_LEN + f->hdr.len;
    if (!iq_len)
        iq_off = 0;
}

void inq_mark_done(const struct frame *f)
{
    struct pc_hdr h = f->hdr;
    /* Type 0 is no message: skipped when it reaches the head. */
    h.type = FRAME_DONE;
    pc_hdr_encode(iq + iq_off + f->pos, &h);
}

void inq_reset(void)
{
    iq_off = iq_len = 0;
}

/* A port-forward frame: its stream id and its payload's size and values. */
static int fwd_decode(const struct frame *f, struct host_msg *m, char *why, size_t whylen)
{
    const struct pc_hdr *h = &f->hdr;
    int ok;
    if (h->chan < 1 || h->chan > PC_FWD_MAX_STREAMS) {
        snprintf(why, whylen, "port-forward frame type %u for stream %u out of range", h->type,
                 h->chan);
        return -1;
    }
    switch (h->type) {
    case PC_FWD_OPEN:
        ok = pc_fwd_open_decode(f->payload, h->len, &m->fwd_open) == 0 && m->fwd_open.port &&
             (m->fwd_open.family == PC_FWD_INET || m->fwd_open.family == PC_FWD_INET6);
        break;
    case PC_FWD_CREDIT:
        ok = pc_fwd_credit_decode(f->payload, h->len, &m->credit) == 0;
        break;
    case PC_FWD_DATA:
        ok = h->len > 0;
        break;
    default: /* SHUT, CLOSE */
        ok = h->len == 0;
    }
    if (!ok)
        snprintf(why, whylen, "port-forward frame type %u for stream %u with a bad payload (%u bytes)",
                 h->type, h->chan, h->len);
    return ok ? 0 : -1;
}

int frame_decode(const struct frame *f, struct host_msg *m, char *why, size_t whylen)
{
    const struct pc_hdr *h = &f->hdr;
    memset(m, 0, sizeof *m);
    m->type = h->type;
    m->chan = h->chan;
    m->data = f->payload;
    m->len = h->len;
    if (h->chan > PC_MAX_CHAN) {
        snprintf(why, whylen, "frame type %u for chan %u out of range", h->type, h->chan);
        return -1;
    }
    switch (h->type) {
    case PC_SPEC:
    case PC_SANDBOX: /* records, checked by sandbox_attach */
    case PC_SECCOMP: /* checked by seccomp_stash */
    case PC_START:
    case PC_STDIN:
    case PC_POWEROFF:
    case PC_FORKED: /* records, checked by sandbox_fork */
        return 0;
    case PC_STATS:
        if (h->chan >= 1 && h->len >= 1 && h->len <= PC_SPEC_MAX_CONTAINER_ID &&
            !memchr(f->payload, 0, h->len))
            return 0;
        snprintf(why, whylen, "STATS with %u bytes on chan %u", h->len, h->chan);
        return -1;
    case PC_LIMITS: /* records, checked by limits_parse */
        if (h->chan >= 1 && h->len >= 1 && h->len <= PC_LIMITS_MAX)
            return 0;
        snprintf(why, whylen, "LIMITS with %u bytes on chan %u", h->len, h->chan);
        return -1;
    case PC_QUIESCE:
        if (h->chan == 0 && pc_quiesce_decode(f->payload, h->len, &m->quiesce) == 0)
            return 0;
        snprintf(why, whylen, "QUIESCE with %u bytes on chan %u", h->len, h->chan);
        return -1;
    case PC_RESUME:
        if (h->chan == 0 && pc_resume_decode(f->payload, h->len, &m->resume) == 0)
            return 0;
        snprintf(why, whylen, "RESUME with %u bytes on chan %u", h->len, h->chan);
        return -1;
    case PC_SIGNAL:
        if (pc_signal_decode(f->payload, h->len, &m->signal) == 0)
            return 0;
        snprintf(why, whylen, "SIGNAL with %u bytes", h->len);
        return -1;
    case PC_RESIZE:
        if (pc_resize_decode(f->payload, h->len, &m->resize) == 0)
            return 0;
        snprintf(why, whylen, "RESIZE with %u bytes", h->len);
        return -1;
    case PC_FWD_OPEN:
    case PC_FWD_DATA:
    case PC_FWD_CREDIT:
    case PC_FWD_SHUT:
    case PC_FWD_CLOSE:
        return fwd_decode(f, m, why, whylen);
    default:
        snprintf(why, whylen, "unknown frame type %u (chan %u, %u bytes)", h->type, h->chan,
                 h->len);
        return -1;
    }
}
