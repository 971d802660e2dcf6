/* Stdio/signal relay between local fds and the framed agent channel.
 *
 * Shim mode (listen_fd >= 0): chan_fd is the guest's virtio-serial port. Frames
 * for channel 0 go to the local stdio; other channels belong to exec proxies
 * and control clients that connect to listen_fd.
 * Proxy mode: chan_fd is a connection to the shim; everything is channel 0.
 * A pod member's proxy also serves control clients (start, kill) on
 * control_fd: their requests are for its own process, so they go upstream
 * on channel 0, which the shim maps to the member's channel.
 *
 * In shim mode it also carries port forwarding's streams (csrc/streams.c).
 *
 * Everything the guest sends is hostile: headers are checked before any use,
 * buffers are fixed-size, and queues are bounded with backpressure instead of
 * growing. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "agent_proto.h"
#include "agent_codec.h"
#include "relay.h"
#include "sink.h"
#include "streams.h"

#define MAX_CLIENTS 256
#define CLIENT_GRACE_MS 2000
#define FLUSH_LIMIT_MS 60000
/* While the agent answers a QUIESCE, the channel is read even when a slow
 * reader's queue is full, for this much at most: the agent's own queue
 * (1 MiB, guest/agent/channel.h) and what it read before QUIESCE reached it.
 * A guest that sends more than that fails the quiesce by its timeout. */
#define QUIESCE_OVERRUN_MAX (2u << 20)

/* What a frame handler returns besides 0 (taken) and -1 (a violation): the
 * frame must wait, and so must everything behind it from the same peer. */
#define FRAME_WAIT 1

struct inbuf {
    char *buf;
    size_t len;
};

struct client {
    int fd;
    int chan;  /* 0 until the client binds a process with SECCOMP or SPEC */
    int spec_sent; /* a pod member's init sends SECCOMP, then its SPEC, on one channel */
    int query;     /* its channel carries one STATS or LIMITS and its answer, no process */
    int closing;
    /* Its next frame waits (FRAME_WAIT): it is tried again every round, and
     * nothing more is read from the client meanwhile. */
    int stalled;
    struct inbuf in;
    struct sink out;
};

struct relay {
    const struct pc_relay_cfg *cfg;
    int listen_fd;  /* the shim's socket, or a member proxy's control socket, or -1 */
    struct pc_relay_result *res;
    int shim;
    int (*start_payload)(char *buf, int cap);
    int chan_fd;
    struct inbuf chan_in;
    struct sink to_chan;
    struct sink out, err;
    int in_fd, in_owned, in_is_socket, in_open;
    int sig_fd;
    sigset_t old_mask;
    struct client *clients[MAX_CLIENTS];
    int chan_owner[PC_MAX_CHAN + 1]; /* client index, -1 free, -2 busy without client */
    int done;
    struct fwd *fwd;          /* port forwarding, or NULL */
    /* Port forwarding's listeners that a pooled VM's lease brought, which
     * the relay owns; -1s for none. */
    struct pc_fwd_listeners leased_fwd;
    const char *violation;    /* what was wrong with the guest's last frame */
    int started;  /* stdin waits for START: before it nobody reads, and the
                   * agent would stop reading the port with START queued behind */
    int init_exited;
    long long grace_deadline;
    /* A checkpoint or rollback (docs/snapshots.md): the client that asked
     * for QUIESCE, -1 for none.  From QUIESCE to its RESUME nothing else
     * goes to the guest: clients' requests wait, and whatever else is queued
     * for it (a vanished proxy's SIGKILL, port-forward credit) waits behind
     * a hold in to_chan, so the channel is empty both ways once the agent
     * has answered QUIESCED. */
    int quiesce_client;
    uint32_t quiesce_seq;     /* the number of the last QUIESCE sent */
    int quiesce_answered;     /* its QUIESCED came */
    size_t quiesce_overrun;   /* read past full queues while it was awaited */
    /* Shim mode: STDIN bytes each channel may still send (PC_STDIN_WINDOW);
     * below 0 only for the init's, after a rollback kept held stdin. */
    long stdin_credit[PC_MAX_CHAN + 1];
};

#define ROLLED_BACK_STATUS 137  /* its process was killed (SIGKILL) */

/* The guest does not know of anything that arrived since the checkpoint:
 * every exec session and port-forward stream ends here. */
static void end_sessions_after_rollback(struct relay *r);

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void end_with(struct relay *r, int end, const char *fmt, const char *detail)
{
    if (r->done) return;
    r->done = 1;
    r->res->end = end;
    snprintf(r->res->message, sizeof r->res->message, fmt, detail);
}

static int sink_signal(struct sink *s, unsigned chan, uint32_t signo)
{
    unsigned char buf[PC_SIGNAL_LEN];
    struct pc_signal_msg m = {.signo = signo, .flags = 0};
    pc_signal_encode(buf, &m);
    return sink_frame(s, PC_SIGNAL, chan, (const char *)buf, sizeof buf);
}

/* --- frame parsing ----------------------------------------------------- */

/* Calls handle() for every complete frame until one must wait (FRAME_WAIT,
 * which is returned; that frame stays in the buffer); -1 when a header is
 * invalid or handle() says so. */
typedef int (*frame_fn)(struct relay *r, void *who, unsigned type, unsigned chan,
                        const char *p, uint32_t n);

static int parse_frames(struct relay *r, void *who, struct inbuf *in, frame_fn handle)
{
    size_t pos = 0;
    int rc = 0;
    while (in->len - pos >= PC_HDR_LEN) {
        struct pc_hdr h;
        pc_hdr_decode((const unsigned char *)in->buf + pos, &h);
        if (h.len > PC_MAX_PAYLOAD || h.chan > PC_MAX_CHAN) return -1;
        if (in->len - pos < PC_HDR_LEN + h.len) break;
        rc = handle(r, who, h.type, h.chan, in->buf + pos + PC_HDR_LEN, h.len);
        if (rc < 0) return -1;
        if (rc == FRAME_WAIT) break;
        pos += PC_HDR_LEN + h.len;
        if (r->done) break;
    }
    memmove(in->buf, in->buf + pos, in->len - pos);
    in->len -= pos;
    return rc;
}

/* Returns bytes read, 0 on EOF, -1 on EAGAIN, -2 on error. */
static ssize_t fill(int fd, struct inbuf *in)
{
    ssize_t n = read(fd, in->buf + in->len, INBUF_CAP - in->len);
    if (n > 0) in->len += (size_t)n;
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return -1;
    if (n < 0) return errno == EIO ? 0 : -2;
    return n;
}

/* --- clients (shim mode) ------------------------------------------------ */

/* RESUME goes ahead of everything held since its QUIESCE. */
static int resume_guest(struct relay *r, const struct pc_resume_msg *m)
{
    unsigned char b[PC_U32_MSG_LEN];
    if (m->flags & PC_RESUME_ROLLED_BACK) end_sessions_after_rollback(r);
    r->quiesce_client = -1;
    pc_resume_encode(b, m);
    return sink_release_hold(&r->to_chan, PC_RESUME, 0, (const char *)b, sizeof b);
}

static void client_drop(struct relay *r, int idx)
{
    struct client *c = r->clients[idx];
    if (!c) return;
    /* A proxy that vanished while its process runs was killed by its owner:
     * the process goes with it, as an exec'd process dies with runc's. */
    if (c->chan > 0 && r->chan_owner[c->chan] == idx) {
        if (!c->query)
            sink_signal(&r->to_chan, (unsigned)c->chan, SIGKILL);
        r->chan_owner[c->chan] = -2;  /* free again when the guest answers */
    }
    /* Whoever asked went away without RESUME: the guest goes on. */
    if (r->quiesce_client == idx) resume_guest(r, &(struct pc_resume_msg){0});
    close(c->fd);
    free(c->in.buf);
    free(c->out.buf);
    free(c);
    r->clients[idx] = NULL;
}

static int free_chan(struct relay *r)
{
    for (int ch = 1; ch <= (int)PC_MAX_CHAN; ch++)
        if (r->chan_owner[ch] == -1) return ch;
    return -1;
}

static void client_ack(struct client *c)
{
    sink_frame(&c->out, PC_HOST_ACK, 0, NULL, 0);
    c->closing = 1;
}

/* One line of why, then the client is hung up on. */
static int refuse(struct client *c, const char *why)
{
    sink_frame(&c->out, PC_ERROR, 0, why, strlen(why));
    c->closing = 1;
    return 0;
}

static int on_client_frame(struct relay *r, void *who, unsigned type, unsigned chan,
                           const char *p, uint32_t n)
{
    int idx = (int)(intptr_t)who;
    struct client *c = r->clients[idx];
    (void)chan;
    if (r->quiesce_client == idx) {
        struct pc_resume_msg m;
        if (type != PC_RESUME || pc_resume_decode((const unsigned char *)p, n, &m) < 0) {
            c->closing = 1; /* its hang-up resumes the guest */
            return 0;
        }
        if (resume_guest(r, &m) < 0) return -1;
        client_ack(c);
        return 0;
    }
    /* Another's checkpoint or rollback: every request waits for its RESUME. */
    if (r->quiesce_client >= 0) return FRAME_WAIT;
    if (c->chan == 0) {
        if ((type == PC_SPEC || type == PC_SECCOMP) && !r->shim) {
            c->closing = 1; /* a member proxy runs one process: its own */
            return 0;
        }
        if (type == PC_SPEC || type == PC_SECCOMP) {
            int ch = r->init_exited ? -1 : free_chan(r);
            if (ch < 0)
                return refuse(c, r->init_exited ? "container not running"
                                                : "too many processes in this container");
            c->chan = ch;
            c->spec_sent = type == PC_SPEC;
            r->chan_owner[ch] = idx;
            r->stdin_credit[ch] = PC_STDIN_WINDOW;
            return sink_frame(&r->to_chan, type, (unsigned)ch, p, n);
        }
        if (type == PC_START) {
            /* A control client's payload is never used: the process that
             * sits in the container's network namespace (the shim, or a
             * pooled container's proxy) makes it, or START carries nothing. */
            static char made[PC_MAX_PAYLOAD];
            int len = r->start_payload ? r->start_payload(made, (int)sizeof made) : 0;
            if (len < 0 || len > (int)sizeof made) {
                made[sizeof made - 1] = 0;
                return refuse(c, len < 0 ? made : "start payload too large");
            }
            p = made;
            n = (uint32_t)len;
        }
        if ((type == PC_STATS || type == PC_LIMITS) && r->shim) {
            /* The guest answers on the channel given here; the payload is
             * the agent's to check. */
            int ch = free_chan(r);
            if (ch < 0) return refuse(c, "too many requests in this VM");
            c->chan = ch;
            c->query = 1;
            r->chan_owner[ch] = idx;
            return sink_frame(&r->to_chan, type, (unsigned)ch, p, n);
        }
        if (type == PC_QUIESCE && r->shim) {
            if (r->init_exited) return refuse(c, "container not running");
            /* The relay numbers each QUIESCE; the client's payload is not used. */
            unsigned char b[PC_U32_MSG_LEN];
            pc_quiesce_encode(b, &(struct pc_quiesce_msg){++r->quiesce_seq});
            r->quiesce_client = idx;
            r->quiesce_answered = 0;
            r->quiesce_overrun = 0;
            if (sink_frame(&r->to_chan, PC_QUIESCE, 0, (const char *)b, sizeof b) < 0) return -1;
            sink_hold(&r->to_chan);
            return 0;
        }
        if (type == PC_START || type == PC_SIGNAL) {
            if (sink_frame(&r->to_chan, type, 0, p, n) < 0) return -1;
            if (type == PC_START) r->started = 1;
            client_ack(c);
            return 0;
        }
        c->closing = 1; /* not a request we serve: hang up on that client */
        return 0;
    }
    if (c->query) {  /* one request per connection */
        c->closing = 1;
        return 0;
    }
    if (type == PC_SPEC && !c->spec_sent) {  /* the one SPEC after a SECCOMP */
        c->spec_sent = 1;
        return sink_frame(&r->to_chan, type, (unsigned)c->chan, p, n);
    }
    if (c->spec_sent && type == PC_STDIN && r->shim) {
        /* Beyond the channel's window it waits for the agent's credit, and
         * holds back only this client. */
        if ((long)n > r->stdin_credit[c->chan]) return FRAME_WAIT;
        r->stdin_credit[c->chan] -= (long)n;
    }
    if (c->spec_sent &&
        (type == PC_START || type == PC_STDIN || type == PC_SIGNAL || type == PC_RESIZE))
        return sink_frame(&r->to_chan, type, (unsigned)c->chan, p, n);
    c->closing = 1;
    return 0;
}

/* The client's complete frames, up to one that must wait; -1: hang up on it. */
static int client_parse(struct relay *r, int idx)
{
    struct client *c = r->clients[idx];
    int rc = parse_frames(r, (void *)(intptr_t)idx, &c->in, on_client_frame);
    c->stalled = rc == FRAME_WAIT;
    return rc < 0 ? -1 : 0;
}

static int is_socket(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

/* What the lease brought (relay.h: PC_LEASE_FORWARD_*): 1 when its holder
 * is gone, so the VM ends; 0 otherwise. Listeners are taken once, by a shim
 * without its own; anything else that comes with a message is closed. */
static int lease_event(struct relay *r)
{
    unsigned char count = 0;
    int fds[PC_LEASE_FORWARD_MAX_FDS + 1];
    int got = 0;
    union {
        char buf[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {&count, 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                       .msg_controllen = sizeof ctl.buf};
    ssize_t n = recvmsg(r->cfg->lease_fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) return errno != EAGAIN && errno != EINTR;
    if (n == 0) return 1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < k && got < (int)(sizeof fds / sizeof fds[0]); i++)
            memcpy(&fds[got++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    int usable = r->shim && !r->fwd && !(m.msg_flags & MSG_CTRUNC) && got == count &&
                 count >= PC_LEASE_FORWARD_MIN_FDS && count <= PC_LEASE_FORWARD_MAX_FDS;
    for (int i = 0; usable && i < got; i++) usable = is_socket(fds[i]) || i == got - 1;
    if (usable) {
        struct pc_fwd_listeners l = {fds[0], count == 3 ? fds[1] : -1, fds[got - 1]};
        r->fwd = fwd_new(&l, &r->to_chan);
        if (r->fwd) {
            r->leased_fwd = l;
            return 0;
        }
    }
    for (int i = 0; i < got; i++) close(fds[i]);
    return 0;
}

static void accept_client(struct relay *r)
{
    int fd = accept4(r->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    for (int i = 0; i < MAX_CLIENTS; i++) {
        if (r->clients[i]) continue;
        struct client *c = calloc(1, sizeof *c);
        char *buf = malloc(INBUF_CAP);
        if (!c || !buf) {
            free(c);
            free(buf);
            break;
        }
        c->fd = fd;
        c->in.buf = buf;
        sink_init_socket(&c->out, fd);
        r->clients[i] = c;
        return;
    }
    close(fd);
}

/* --- channel frames ------------------------------------------------------ */

static int to_client(struct relay *r, unsigned chan, unsigned type, const char *p, uint32_t n,
                     int finished)
{
    int idx = r->chan_owner[chan];
    if (idx >= 0 && r->clients[idx]) {
        struct client *c = r->clients[idx];
        sink_frame(&c->out, type, 0, p, n);
        if (finished) {
            c->closing = 1;
            c->chan = 0;
        }
    }
    if (finished) r->chan_owner[chan] = -1;
    return 0;
}

/* Credit for the channel's stdin (PC_STDIN_WINDOW).  Credit for a session
 * that has ended crossed its end; more than the window is clamped: a guest
 * that lies about it only floods its own buffers. */
static int on_stdin_credit(struct relay *r, unsigned chan, const char *p, uint32_t n)
{
    struct pc_stdin_credit_msg m;
    if (!r->shim || pc_stdin_credit_decode((const unsigned char *)p, n, &m) < 0) {
        r->violation = "STDIN_CREDIT with a bad payload";
        return -1;
    }
    if (chan > 0 && r->chan_owner[chan] == -1) return 0;
    long credit = r->stdin_credit[chan] + (long)m.bytes;
    r->stdin_credit[chan] = credit > PC_STDIN_WINDOW ? PC_STDIN_WINDOW : credit;
    return 0;
}

static int on_chan_frame(struct relay *r, void *who, unsigned type, unsigned chan,
                         const char *p, uint32_t n)
{
    (void)who;
    if (type == PC_STDIN_CREDIT) return on_stdin_credit(r, chan, p, n);
    if (r->shim && fwd_is_type(type)) {
        if (r->fwd) return fwd_on_frame(r->fwd, type, chan, p, n, &r->violation);
        r->violation = "port-forward frame, but this VM forwards no ports";
        return -1;
    }
    if (r->shim && chan > 0) {
        switch (type) {
        case PC_STDOUT: case PC_STDERR: case PC_CREATED:
            return to_client(r, chan, type, p, n, 0);
        case PC_EXIT: case PC_ERROR: case PC_STATS_REPLY: case PC_ATTACHED:
            return to_client(r, chan, type, p, n, 1);
        case PC_READY:
            return 0;
        default:
            return -1;
        }
    }
    switch (type) {
    case PC_STDOUT:
        sink_append(&r->out, p, n);
        return 0;
    case PC_STDERR:
        sink_append(&r->err, p, n);
        return 0;
    case PC_EXIT: {
        struct pc_exit_msg m;
        if (pc_exit_decode((const unsigned char *)p, n, &m) < 0) return -1;
        r->res->status = m.status;
        r->res->end = PC_END_EXIT;
        r->init_exited = 1;
        r->grace_deadline = now_ms() + CLIENT_GRACE_MS;
        return 0;
    }
    case PC_ERROR: {
        /* execve failed after START; EXIT 127 follows. runc would print this
         * on the stderr it shares with the container, so do we. */
        char text[256];
        size_t k = n < sizeof text - 12 ? n : sizeof text - 12;
        memcpy(text, "paracell: ", 10);
        memcpy(text + 10, p, k);
        for (size_t i = 10; i < 10 + k; i++)
            if ((unsigned char)text[i] < 0x20) text[i] = ' ';
        memcpy(r->res->error, text + 10, k);
        r->res->error[k] = 0;
        text[10 + k] = '\n';
        sink_append(&r->err, text, 11 + k);
        return 0;
    }
    case PC_READY: case PC_CREATED:
        return 0;
    case PC_QUIESCED: {
        struct pc_quiesce_msg m;
        int q = r->quiesce_client;
        if (!r->shim) return 0;
        if (pc_quiesce_decode((const unsigned char *)p, n, &m) < 0) return -1;
        /* One whose asker left (RESUME was sent for it), or that answers an
         * earlier QUIESCE, or a second answer, is no answer to this one. */
        if (q < 0 || !r->clients[q] || m.seq != r->quiesce_seq || r->quiesce_answered) return 0;
        r->quiesce_answered = 1;
        return sink_frame(&r->clients[q]->out, PC_QUIESCED, 0, NULL, 0);
    }
    default:
        return -1;
    }
}

/* Of what waited behind QUIESCE: the init's frames stay (counting its
 * stdin), those of the sessions and streams that end here go. */
static int kept_after_rollback(void *arg, unsigned type, unsigned chan, size_t len)
{
    if (fwd_is_type(type) || chan > 0) return 0;
    if (type == PC_STDIN) *(long *)arg += (long)len;
    return 1;
}

static void end_sessions_after_rollback(struct relay *r)
{
    unsigned char b[PC_U32_MSG_LEN];
    long held_stdin = 0;
    sink_filter_held(&r->to_chan, kept_after_rollback, &held_stdin);
    /* The init's window restarts from the agent's count (its STDIN_CREDIT
     * after the RESUME), less what is still to go. */
    r->stdin_credit[0] = -held_stdin;
    pc_exit_encode(b, &(struct pc_exit_msg){ROLLED_BACK_STATUS});
    for (unsigned ch = 1; ch <= PC_MAX_CHAN; ch++) {
        if (r->chan_owner[ch] == -1) continue;
        to_client(r, ch, PC_ERROR, PC_ROLLED_BACK_MSG, sizeof PC_ROLLED_BACK_MSG - 1, 0);
        to_client(r, ch, PC_EXIT, (const char *)b, sizeof b, 1);
    }
    fwd_forget_all(r->fwd);
}

/* --- local input and signals -------------------------------------------- */

/* How much of the local stdin may go now: in shim mode the init's window. */
static size_t stdin_room(const struct relay *r)
{
    if (!r->shim) return PC_MAX_PAYLOAD;
    long credit = r->stdin_credit[0];
    return credit <= 0 ? 0 : credit > PC_MAX_PAYLOAD ? PC_MAX_PAYLOAD : (size_t)credit;
}

static void read_stdin(struct relay *r)
{
    char buf[PC_MAX_PAYLOAD];
    size_t room = stdin_room(r);
    if (!room) return;
    ssize_t n = r->in_is_socket ? recv(r->in_fd, buf, room, MSG_DONTWAIT)
                                : read(r->in_fd, buf, room);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        /* EOF (or a hung-up tty): the process sees its stdin close. */
        sink_frame(&r->to_chan, PC_STDIN, 0, NULL, 0);
        r->in_open = 0;
        return;
    }
    if (r->shim) r->stdin_credit[0] -= n;
    sink_frame(&r->to_chan, PC_STDIN, 0, buf, (size_t)n);
}

static void send_winsize(struct relay *r)
{
    struct winsize ws;
    unsigned char buf[PC_RESIZE_LEN];
    if (r->cfg->tty_fd < 0 || ioctl(r->cfg->tty_fd, TIOCGWINSZ, &ws) < 0) return;
    struct pc_resize_msg m = {.rows = ws.ws_row, .cols = ws.ws_col};
    pc_resize_encode(buf, &m);
    sink_frame(&r->to_chan, PC_RESIZE, 0, (const char *)buf, sizeof buf);
}

static void read_signals(struct relay *r)
{
    struct signalfd_siginfo si;
    while (read(r->sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
        if ((int)si.ssi_signo == SIGWINCH) {
            send_winsize(r);
            continue;
        }
        sink_signal(&r->to_chan, 0, si.ssi_signo);
    }
}

static int setup_signals(struct relay *r)
{
    sigset_t set;
    sigemptyset(&set);
    for (int s = 1; s < 64; s++)
        if (r->cfg->forward_mask & (1ull << s)) sigaddset(&set, s);
    if (r->cfg->tty_fd >= 0) sigaddset(&set, SIGWINCH);
    r->sig_fd = -1;
    if (sigprocmask(SIG_BLOCK, &set, &r->old_mask) < 0) return -1;
    r->sig_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    return r->sig_fd < 0 ? -1 : 0;
}

/* --- main loop ------------------------------------------------------------ */

static int all_sinks_have_room(struct relay *r)
{
    if (!sink_has_room(&r->out) || !sink_has_room(&r->err)) return 0;
    for (int i = 0; i < MAX_CLIENTS; i++)
        if (r->clients[i] && !sink_has_room(&r->clients[i]->out)) return 0;
    return 1;
}

static int live_exec_clients(struct relay *r)
{
    for (int i = 0; i < MAX_CLIENTS; i++)
        if (r->clients[i] && r->clients[i]->chan > 0) return 1;
    return 0;
}

enum { P_CHAN, P_LISTEN, P_STDIN, P_SIG, P_OUT, P_ERR, P_ABORT, P_LEASE, P_FIXED };

static void add_pollfd(struct pollfd *pfd, int slot, int fd, short events)
{
    pfd[slot].fd = events ? fd : -1;
    pfd[slot].events = events;
    pfd[slot].revents = 0;
}

static void run_loop(struct relay *r)
{
    /* The fixed slots, the clients', then port forwarding's. */
    enum { P_FWD = P_FIXED + MAX_CLIENTS, P_ALL = P_FWD + FWD_POLLFDS };
    struct pollfd pfd[P_ALL];
    int chan_open = 1;
    while (!r->done) {
        if (r->init_exited && (!live_exec_clients(r) || now_ms() >= r->grace_deadline)) break;
        /* Requests that waited (for credit, or for a RESUME) go when they can. */
        for (int i = 0; i < MAX_CLIENTS && sink_has_room(&r->to_chan); i++)
            if (r->clients[i] && r->clients[i]->stalled && !r->clients[i]->closing &&
                client_parse(r, i) < 0)
                client_drop(r, i);
        int room_to_chan = sink_has_room(&r->to_chan) && r->quiesce_client < 0;
        short chan_ev = 0;
        /* The agent's answer to QUIESCE comes behind what it had queued,
         * which is read even while a slow reader's queue is full. */
        int overrun = r->quiesce_client >= 0 && !r->quiesce_answered &&
                      r->quiesce_overrun < QUIESCE_OVERRUN_MAX && !all_sinks_have_room(r);
        if (chan_open && (all_sinks_have_room(r) || overrun)) chan_ev |= POLLIN;
        if (sink_flushable(&r->to_chan)) chan_ev |= POLLOUT;
        add_pollfd(pfd, P_CHAN, r->chan_fd, chan_ev);
        add_pollfd(pfd, P_LISTEN, r->listen_fd,
                   r->listen_fd >= 0 && room_to_chan && !r->init_exited ? POLLIN : 0);
        add_pollfd(pfd, P_STDIN, r->in_fd,
                   r->in_open && r->started && room_to_chan && stdin_room(r) ? POLLIN : 0);
        add_pollfd(pfd, P_SIG, r->sig_fd, r->sig_fd >= 0 && room_to_chan ? POLLIN : 0);
        add_pollfd(pfd, P_OUT, r->out.fd,
                   sink_pending(&r->out) && r->out.kind == SINK_NONBLOCK ? POLLOUT : 0);
        add_pollfd(pfd, P_ERR, r->err.fd,
                   sink_pending(&r->err) && r->err.kind == SINK_NONBLOCK ? POLLOUT : 0);
        add_pollfd(pfd, P_ABORT, r->cfg->abort_fd, r->cfg->abort_fd >= 0 ? POLLIN : 0);
        add_pollfd(pfd, P_LEASE, r->cfg->lease_fd, r->cfg->lease_fd >= 0 ? POLLIN | POLLRDHUP : 0);
        for (int i = 0; i < MAX_CLIENTS; i++) {
            struct client *c = r->clients[i];
            short ev = 0;
            if (c && !c->closing && !c->stalled &&
                (room_to_chan || (i == r->quiesce_client && sink_has_room(&r->to_chan))))
                ev |= POLLIN;
            /* A stalled client is not read, but its hang-up is still seen. */
            if (c && !c->closing && c->stalled) ev |= POLLRDHUP;
            if (c && sink_pending(&c->out)) ev |= POLLOUT;
            add_pollfd(pfd, P_FIXED + i, c ? c->fd : -1, ev);
        }
        for (int i = 0; !r->fwd && i < FWD_POLLFDS; i++) add_pollfd(pfd, P_FWD + i, -1, 0);
        if (r->fwd) fwd_poll_prepare(r->fwd, pfd + P_FWD, room_to_chan);
        int timeout = r->init_exited ? 100 : 1000;
        if (poll(pfd, P_ALL, timeout) < 0) {
            if (errno == EINTR) continue;
            end_with(r, PC_END_ERROR, "poll: %s", strerror(errno));
            break;
        }
        if (pfd[P_ABORT].revents) {
            end_with(r, PC_END_ERROR, "%s", "a VM service failed");
            break;
        }
        if (pfd[P_LEASE].revents && lease_event(r)) {
            end_with(r, PC_END_RELEASED, "%s", "the VM's lease ended");
            break;
        }
        if (pfd[P_CHAN].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = fill(r->chan_fd, &r->chan_in);
            if (n > 0 && overrun) r->quiesce_overrun += (size_t)n;
            if (n == 0 || n == -2) {
                chan_open = 0;
                if (!r->init_exited)
                    end_with(r, PC_END_HANGUP, "%s", r->shim ? "virtual machine exited unexpectedly"
                                                              : "container shim went away");
                break;
            }
            if (n > 0 && parse_frames(r, NULL, &r->chan_in, on_chan_frame) < 0) {
                end_with(r, PC_END_VIOLATION, "agent protocol violation: %s",
                         r->violation ? r->violation
                         : r->shim ? "malformed frame from the guest" : "malformed frame from the shim");
                break;
            }
        }
        if (pfd[P_CHAN].revents & POLLOUT) sink_flush(&r->to_chan);
        if (pfd[P_OUT].revents) sink_flush(&r->out);
        if (pfd[P_ERR].revents) sink_flush(&r->err);
        if (pfd[P_STDIN].revents) read_stdin(r);
        if (pfd[P_SIG].revents) read_signals(r);
        if (pfd[P_LISTEN].revents & POLLIN) accept_client(r);
        for (int i = 0; i < MAX_CLIENTS; i++) {
            struct client *c = r->clients[i];
            short ev = pfd[P_FIXED + i].revents;
            if (!c) continue;
            if (ev & POLLOUT) sink_flush(&c->out);
            if (c->stalled && !c->closing && ev & (POLLRDHUP | POLLHUP | POLLERR)) {
                client_drop(r, i);  /* what it left waiting goes with it */
                continue;
            }
            if (ev & (POLLIN | POLLHUP | POLLERR) && !c->closing && !c->stalled) {
                ssize_t n = fill(c->fd, &c->in);
                if (n == 0 || n == -2 || (n > 0 && client_parse(r, i) < 0)) {
                    client_drop(r, i);
                    continue;
                }
            }
            if (c->out.dead || (c->closing && sink_pending(&c->out) == 0)) client_drop(r, i);
        }
        if (r->fwd) fwd_poll_handle(r->fwd, pfd + P_FWD);
        /* A peer that hangs up right after EXIT may leave our last frames
         * (stdin, signals) unsent; the exit it reported stands. */
        if (r->to_chan.dead && !r->done && !r->init_exited) {
            if (r->shim) {
                end_with(r, PC_END_HANGUP, "%s", "virtual machine exited unexpectedly");
                break;
            }
            /* The shim ended this session and closed it; what it sent first
             * (the EXIT, or why not) is still to be read, up to its EOF. */
            r->in_open = 0;
        }
    }
}

/* Output that arrived before the exit must reach the caller before we report it. */
static void drain_local(struct relay *r)
{
    long long deadline = now_ms() + FLUSH_LIMIT_MS;
    while ((sink_pending(&r->out) || sink_pending(&r->err)) && now_ms() < deadline) {
        struct pollfd pfd[2];
        add_pollfd(pfd, 0, r->out.fd, sink_pending(&r->out) ? POLLOUT : 0);
        add_pollfd(pfd, 1, r->err.fd, sink_pending(&r->err) ? POLLOUT : 0);
        if (poll(pfd, 2, 1000) < 0 && errno != EINTR) break;
        if (pfd[0].revents) sink_flush(&r->out);
        if (pfd[1].revents) sink_flush(&r->err);
    }
}

int pc_relay(const struct pc_relay_cfg *cfg, struct pc_relay_result *res)
{
    struct relay *r = calloc(1, sizeof *r);
    if (!r) return -1;
    memset(res, 0, sizeof *res);
    res->end = PC_END_HANGUP;
    res->status = -1;
    r->cfg = cfg;
    r->res = res;
    r->shim = cfg->listen_fd >= 0;
    r->start_payload = cfg->start_payload;
    r->listen_fd = r->shim ? cfg->listen_fd : cfg->control_fd;
    /* An exec proxy's process was started before its relay; a member's
     * waits for `start`, which arrives on its control socket. */
    r->started = !r->shim && cfg->control_fd < 0;
    r->chan_fd = cfg->chan_fd;
    for (unsigned ch = 0; ch <= PC_MAX_CHAN; ch++) {
        r->chan_owner[ch] = -1;
        r->stdin_credit[ch] = PC_STDIN_WINDOW;
    }
    r->quiesce_client = -1;
    r->leased_fwd = (struct pc_fwd_listeners){-1, -1, -1};
    r->chan_in.buf = malloc(INBUF_CAP);
    fcntl(r->chan_fd, F_SETFL, fcntl(r->chan_fd, F_GETFL) | O_NONBLOCK);
    sink_init_socket(&r->to_chan, r->chan_fd);
    sink_init_local(&r->out, cfg->out_fd);
    sink_init_local(&r->err, cfg->err_fd);
    r->in_fd = -1;
    if (cfg->in_fd >= 0) {
        enum sink_kind kind;
        r->in_fd = private_nonblocking(cfg->in_fd, O_RDONLY, &r->in_owned, &kind);
        r->in_is_socket = kind == SINK_SOCKET;
        r->in_open = r->in_fd >= 0;
    }
    if (r->shim && cfg->fwd) r->fwd = fwd_new(cfg->fwd, &r->to_chan);
    if (!r->chan_in.buf || (r->shim && cfg->fwd && !r->fwd) || setup_signals(r) < 0) {
        end_with(r, PC_END_ERROR, "relay setup: %s", strerror(errno));
    } else {
        if (cfg->tty_fd >= 0) send_winsize(r);
        run_loop(r);
        sink_flush(&r->to_chan);
        drain_local(r);
    }
    for (int i = 0; i < MAX_CLIENTS; i++) client_drop(r, i);
    fwd_free(r->fwd);
    pc_fwd_detach(&r->leased_fwd);
    if (r->sig_fd >= 0) close(r->sig_fd);
    sigprocmask(SIG_SETMASK, &r->old_mask, NULL);
    if (r->in_owned) close(r->in_fd);
    sink_release(&r->out);
    sink_release(&r->err);
    free(r->to_chan.buf);
    free(r->chan_in.buf);
    free(r);
    return 0;
}

/* --- blocking control I/O -------------------------------------------------- */

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == ENOTSOCK) w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            poll(&pfd, 1, 1000);
            continue;
        }
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int pc_send_frame(int fd, unsigned type, unsigned chan, const char *buf, unsigned len)
{
    unsigned char hdr[PC_HDR_LEN];
    if (len > PC_MAX_PAYLOAD || chan > PC_MAX_CHAN) {
        errno = EMSGSIZE;
        return -1;
    }
    struct pc_hdr h = {.len = len, .type = (uint16_t)type, .chan = (uint16_t)chan};
    pc_hdr_encode(hdr, &h);
    if (write_all(fd, (const char *)hdr, sizeof hdr) < 0) return -1;
    return write_all(fd, buf, len);
}

static int read_exact(int fd, char *p, size_t n, long long deadline)
{
    while (n > 0) {
        int wait = deadline < 0 ? -1 : (int)(deadline - now_ms());
        if (deadline >= 0 && wait <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, wait);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) return -1;
        if (pr == 0) continue;
        ssize_t got = read(fd, p, n);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got < 0) return -1;
        if (got == 0) return -2;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

int pc_recv_frame(int fd, unsigned *type, unsigned *chan, char *buf, unsigned cap,
                  int timeout_ms)
{
    unsigned char hdr[PC_HDR_LEN];
    long long deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    int rc = read_exact(fd, (char *)hdr, sizeof hdr, deadline);
    if (rc < 0) return rc;
    struct pc_hdr h;
    pc_hdr_decode(hdr, &h);
    uint32_t n = h.len;
    *type = h.type;
    *chan = h.chan;
    if (n > PC_MAX_PAYLOAD || n > cap || *chan > PC_MAX_CHAN) {
        errno = EPROTO;
        return -1;
    }
    rc = read_exact(fd, buf, n, deadline);
    if (rc < 0) return rc == -2 ? -2 : -1;
    return (int)n;
}

int pc_set_pdeathsig(int sig)
{
    return prctl(PR_SET_PDEATHSIG, sig);
}

int pc_disable_thp(void)
{
    return prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
}
