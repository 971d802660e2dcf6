/* Framing on the agent port: the bounded queue of frames to the host and the
 * buffer of frames from it.  The port itself (opening it, polling it) belongs
 * to the caller; this module only sees the fd it is handed. */
#ifndef PARACELL_AGENT_CHANNEL_H
#define PARACELL_AGENT_CHANNEL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent_proto.h"

/* Control frames (CREATED, ERROR, EXIT) never wait for process output, so
 * output is read only while this much room stays free after a full frame. */
#define OUTQ_CAP (1u << 20)
#define OUTQ_CTRL_RESERVE (32u * 1024)

/* A whole frame inside the receive buffer, valid until it is consumed. */
struct frame {
    size_t pos; /* offset from the oldest unconsumed byte */
    struct pc_hdr hdr;
    unsigned char *payload;
};

/* A frame from the host that passed frame_decode: the dispatcher needs no
 * further checks of sizes or ranges. */
struct host_msg {
    uint16_t type;
    uint16_t chan;          /* at most PC_MAX_CHAN; a PC_FWD_* stream id 1..PC_FWD_MAX_STREAMS */
    unsigned char *data;    /* the payload: SPEC records (parsed in place), STDIN bytes */
    uint32_t len;
    struct pc_signal_msg signal;
    struct pc_resize_msg resize;
    struct pc_fwd_open_msg fwd_open;     /* port 1..65535, a known family */
    struct pc_fwd_credit_msg credit;
    struct pc_resume_msg resume;
    struct pc_quiesce_msg quiesce;
};

int chan_init(void);
size_t outq_free(void);
size_t outq_pending(void);
int outq_has_data_room(void);
int chan_send(uint16_t type, uint16_t chan, const void *payload, size_t len);
/* One line of text: control characters become '?'. */
int chan_send_text(uint16_t type, uint16_t chan, const char *text);
/* Reads from fd straight into the queue as one frame: >0 bytes, 0 EOF, -1 errno. */
ssize_t outq_read_frame(int fd, uint16_t type, uint16_t chan);
/* The same, reading at most max bytes. */
ssize_t outq_read_frame_max(int fd, uint16_t type, uint16_t chan, size_t max);
/* Writes queued bytes to the port until it would block: 0, or -1 on error. */
int outq_flush(int port);

/* >0 bytes read, 0 host side closed, -1 errno (EAGAIN when empty or full). */
ssize_t inq_fill(int port);
/* 1 and *f filled when a whole frame starts at pos, 0 when more is needed.  A
 * length over PC_MAX_PAYLOAD leaves no way to find the next frame: every
 * byte from pos on is discarded. */
int inq_frame_at(size_t pos, struct frame *f);
void inq_consume_head(const struct frame *f);
/* Marks a frame behind the head as handled; it is skipped when it gets there. */
void inq_mark_done(const struct frame *f);
/* Type 0, which inq_mark_done gives a handled frame. */
#define FRAME_DONE 0
void inq_reset(void);
int inq_has_room(void);
size_t inq_buffered(void);

/* 0 and *m filled, or -1 with why set to one line: the frame breaks the
 * protocol (channel out of range, unknown type, wrong payload size) and is
 * dropped. */
int frame_decode(const struct frame *f, struct host_msg *m, char *why, size_t whylen);

#endif
