/* ParaCell agent channel: framing shared by the guest agent and the host relay.
 * The wire format is documented in docs/agent-protocol.md; keep both in step. */
#ifndef PARACELL_PROTOCOL_H
#define PARACELL_PROTOCOL_H

#include <stdint.h>

#define PC_PROTO_VERSION 1
/* A frame larger than this is a protocol violation, never a reason to allocate. */
#define PC_MAX_PAYLOAD 65536u
#define PC_HDR_LEN 8u
/* Channel 0 is the container's init process; exec'd processes get 1..PC_MAX_CHAN. */
#define PC_MAX_CHAN 1024u

/* All fields little-endian. */
struct pc_hdr {
    uint32_t len;   /* payload bytes that follow the header */
    uint16_t type;  /* enum pc_type */
    uint16_t chan;  /* process the frame is about */
};

enum pc_type {
    /* host -> guest */
    PC_SPEC = 1,      /* launch spec records; guest answers CREATED or ERROR */
    PC_START = 2,     /* let the created process execve */
    PC_STDIN = 3,     /* stdin bytes; an empty payload is EOF */
    PC_SIGNAL = 4,    /* u32 signo, u32 flags (PC_SIGNAL_ALL) */
    PC_RESIZE = 5,    /* u16 rows, u16 cols */
    PC_POWEROFF = 6,  /* host has read everything; guest may power off */

    /* guest -> host */
    PC_READY = 16,    /* agent is up; payload: version text */
    PC_CREATED = 17,  /* u32 guest pid of the created process */
    PC_STDOUT = 18,   /* stdout bytes (the pty's output with a terminal) */
    PC_STDERR = 19,   /* stderr bytes */
    PC_EXIT = 20,     /* i32 status: exit code, or 128+signal; all output sent before */
    PC_ERROR = 21,    /* text: why the request for this channel failed */
};

#define PC_SIGNAL_ALL 1u

#endif
