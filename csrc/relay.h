/* Host-side hot path of ParaCell: frame I/O and the stdio/signal relay that the
 * shim and the exec proxies run for the whole life of a process. Loaded from
 * Python with cffi; csrc/build_native.py hands this header to cffi's cdef, so
 * keep it in the subset cdef reads (integer #defines; cdef drops the #include,
 * and reads portfwd.h first). */
#ifndef PARACELL_RELAY_H
#define PARACELL_RELAY_H

#include "portfwd.h"

/* How a relay ended. */
#define PC_END_EXIT 0       /* the process exited; status is valid */
#define PC_END_HANGUP 1     /* the channel closed before an EXIT frame */
#define PC_END_VIOLATION 2  /* the peer broke the protocol; message says how */
#define PC_END_ERROR 3      /* a local I/O error; message says which */
/* A pooled VM's lease ended: whoever held it (its pool, then the container
 * that took the VM) is gone. */
#define PC_END_RELEASED 4

/* The one message a lease carries, from its holder to the pooled VM's shim,
 * at most once: the port forwarding listeners (csrc/portfwd.h) of the
 * network namespace the container that took the VM sits in (docs/pool.md).
 * One byte, the count of fds that SCM_RIGHTS carries with it: listen4,
 * listen6 when the namespace has IPv6, then the link. */
#define PC_LEASE_FORWARD_MIN_FDS 2
#define PC_LEASE_FORWARD_MAX_FDS 3

struct pc_relay_cfg {
    int chan_fd;    /* guest port (shim mode) or shim socket (proxy mode) */
    int listen_fd;  /* shim mode: exec/control socket; -1 in proxy mode */
    int control_fd; /* proxy mode: a pod member's start/kill socket; -1 for none */
    int in_fd;      /* process stdin source, -1 for none */
    int out_fd;     /* process stdout sink, -1 to discard */
    int err_fd;     /* process stderr sink, -1 to discard */
    int tty_fd;     /* host pty slave whose size follows SIGWINCH, -1 for none */
    int abort_fd;   /* readable: a VM service (the Pager) failed; end at once. -1 for none */
    /* A pooled VM's lease (docs/pool.md): hung up once its holder is gone,
     * and the VM ends; before that it may bring port forwarding's listeners
     * (PC_LEASE_FORWARD_*), which a shim without its own then serves.
     * -1 for none. */
    int lease_fd;
    unsigned long long forward_mask;  /* bit n: relay signal n to the process */
    /* shim mode: port forwarding's listeners (csrc/portfwd.h), or NULL for none */
    const struct pc_fwd_listeners *fwd;
    /* What a control client's START carries (the init's, or a pooled
     * container's), made by this process when `start` asks (interfaces that
     * appeared in its network namespace since create): the payload's length,
     * or -1 with a NUL-terminated reason in buf. NULL: START carries nothing. */
    int (*start_payload)(char *buf, int cap);
};

/* What a shim says to a session it ends because the VM was rolled back to a
 * checkpoint (docs/snapshots.md): its ERROR, then EXIT 137. */
#define PC_ROLLED_BACK_MSG "the sandbox was rolled back to a checkpoint: this session ended"

struct pc_relay_result {
    int end;
    int status;
    char message[256];
    /* Proxy mode: the last ERROR the shim sent for the process (why its
     * execve failed, or why the shim ended the session), also written to
     * err_fd; empty for none. */
    char error[256];
};

int pc_relay(const struct pc_relay_cfg *cfg, struct pc_relay_result *res);

/* Blocking frame I/O for the short control exchanges around a relay.
 * pc_recv_frame returns the payload length, -1 on error/timeout (errno set;
 * EPROTO for a frame over PC_MAX_PAYLOAD or larger than cap), -2 on EOF. */
int pc_send_frame(int fd, unsigned type, unsigned chan, const char *buf, unsigned len);
int pc_recv_frame(int fd, unsigned *type, unsigned *chan, char *buf, unsigned cap,
                  int timeout_ms);

int pc_set_pdeathsig(int sig);
/* Transparent huge pages off for this process and what it execs. */
int pc_disable_thp(void);

#endif
