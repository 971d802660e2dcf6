/* Declarations shared by the guest agent's parts:
 *   agent.c     PID 1 duties, the event loop, dispatch of host frames
 *   channel.c   framing on the virtio-serial port, bounded queues
 *   spec.c      launch-spec parsing and validation
 *   process.c   agent side of a container process: spawn, stdio relay, reaping
 *   container.c child side: namespaces, mounts, credentials, execve */
#ifndef PARACELL_AGENT_H
#define PARACELL_AGENT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent_proto.h"
#include "vm_proto.h"

#define AGENT_VERSION "paracell-agent 1"

/* One line of text for ERROR frames and the child's failure reports; it must
 * fit one pipe write (PIPE_BUF) so the agent always reads it whole. */
#define ERRTEXT_MAX 512

void logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* For problems caused by the host's requests: rate-limited. */
void loghost(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- channel.c ---- */

/* Control frames (CREATED, ERROR, EXIT) never wait for process output, so
 * output is read only while this much room stays free after a full frame. */
#define OUTQ_CAP (1u << 20)
#define OUTQ_CTRL_RESERVE (32u * 1024)

struct frame {
    size_t pos; /* offset from the oldest unconsumed byte */
    uint16_t type;
    uint16_t chan;
    uint32_t len;
    unsigned char *payload;
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
/* Writes queued bytes to the port until it would block: 0, or -1 on error. */
int outq_flush(int port);

/* >0 bytes read, 0 host side closed, -1 errno (EAGAIN when empty or full). */
ssize_t inq_fill(int port);
/* 1 and *f filled when a whole frame starts at pos, 0 when more is needed. */
int inq_frame_at(size_t pos, struct frame *f);
void inq_consume_head(const struct frame *f);
/* Marks a frame behind the head as handled; it is skipped when it gets there. */
void inq_mark_done(const struct frame *f);
void inq_reset(void);
int inq_has_room(void);

/* ---- spec.c ---- */

#define SPEC_MAX_ARGS PC_SPEC_MAX_ARGS
#define SPEC_MAX_ENV PC_SPEC_MAX_ENV
#define SPEC_MAX_MOUNTS PC_SPEC_MAX_MOUNTS
#define SPEC_MAX_GIDS PC_SPEC_MAX_GIDS
#define SPEC_MAX_RLIMITS PC_SPEC_MAX_RLIMITS

enum spec_capset { SC_BOUNDING, SC_EFFECTIVE, SC_PERMITTED, SC_INHERITABLE, SC_AMBIENT, SC_COUNT };

struct spec_mount {
    const char *dest, *type, *source, *data;
    unsigned long flags;
};

struct spec_rlimit {
    int resource;
    uint64_t soft, hard;
};

struct spec {
    char *argv[SPEC_MAX_ARGS + 1];
    int argc;
    char *envp[SPEC_MAX_ENV + 1];
    int envc;
    const char *cwd;
    uint32_t uid, gid;
    uint32_t gids[SPEC_MAX_GIDS];
    int ngids;
    int has_umask;
    unsigned umask;
    struct spec_rlimit rlimits[SPEC_MAX_RLIMITS];
    int nrlimits;
    int nnp;
    uint64_t caps[SC_COUNT];
    unsigned caps_given; /* bit per enum spec_capset */
    int terminal;
    unsigned rows, cols;
    const char *hostname;
    int root_readonly;
    struct spec_mount mounts[SPEC_MAX_MOUNTS];
    int nmounts;
};

/* Parses in place (buf is modified and must outlive *s). 0, or -1 with err set. */
int spec_parse(char *buf, size_t len, struct spec *s, char *err, size_t errlen);

/* ---- container.c ---- */

struct child_ctx {
    const struct spec *spec;
    int is_init;
    int stdio[3];     /* fds for 0,1,2; -1 with a terminal */
    int tty;          /* 1: the child opens a pty; its slave becomes stdio */
    int status_fd;    /* CLOEXEC seqpacket socket to the agent: "O" (with the
                       * pty master when tty) or "E<text>" */
    int start_fd;     /* pipe from the agent: one byte means START */
    int ns_mnt, ns_uts, ns_ipc; /* exec only: init's namespaces */
};

/* Runs in the forked child; never returns. */
void child_main(const struct child_ctx *c) __attribute__((noreturn));

/* ---- process.c ---- */

struct pollfd;

/* Highest capability the running kernel knows, read once at boot. */
extern int cap_last_cap;

int proc_spawn(unsigned chan, const struct spec *s, char *err, size_t errlen);
void proc_start(unsigned chan);
/* 0: taken (or dropped); 1: stdin buffer full, retry the frame later. */
int proc_stdin(unsigned chan, const unsigned char *data, size_t len);
void proc_signal(unsigned chan, uint32_t signo, uint32_t flags);
void proc_resize(unsigned chan, unsigned rows, unsigned cols);
void proc_reap(void);
/* Adds the fds the loop should wait on; returns the new count. */
int proc_poll_prepare(struct pollfd *pfd, int n, int max);
void proc_poll_handle(const struct pollfd *pfd, int n);
/* Sends EXIT for every process that has ended and whose output is drained. */
void proc_collect(void);
int proc_init_exists(void);
int proc_init_gone(void); /* the container's init has ended and been reported */
int proc_active(void);

#endif
