/* ParaCell guest agent: PID 1 of the micro-VM.
 *
 * Boots the guest's minimal userspace, finds the agent port, then runs one
 * poll() loop that moves frames between the port and the containers'
 * processes.  Nothing here may crash or exit: the death of PID 1 panics the
 * guest, so every bad input is logged and dropped instead. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "agent_codec.h"
#include "channel.h"
#include "container.h"
#include "log.h"
#include "net.h"
#include "portfwd.h"
#include "process.h"
#include "sandbox.h"
#include "seccomp.h"
#include "spec.h"
#include "vm.h"
#include "vm_proto.h"

#define POWEROFF_WAIT_MS 5000
/* After the containers ended, a host that takes nothing for this long is gone. */
#define STUCK_OUTPUT_MS 30000
/* Each frame answered may queue one control frame of at most this size. */
#define FRAME_ROOM (16u * 1024)
/* Frames examined behind a blocked one per round: bounds the work when the
 * buffer holds many tiny frames. */
#define MAX_LOOKAHEAD 256

/* ---- frames from the host ---- */

static int port = -1;
/* The driver reports POLLHUP while no host is connected to the socket. */
static int port_down;
static int ever_connected;
static struct spec spec;
/* Between QUIESCE and RESUME: nothing new is read from the containers or the
 * streams, so nothing new is queued; QUIESCED goes once the queue is empty,
 * carrying the QUIESCE's number. */
static int quiescing, quiesced;
static uint32_t quiesce_seq;

/* seccomp=1 in a SPEC and a PC_SECCOMP frame before it go together. */
static int seccomp_matches(const struct spec *s, const struct seccomp_prog *prog, char *err,
                           size_t errlen)
{
    if (s->seccomp && !prog) {
        snprintf(err, errlen, "spec: seccomp=1, but no SECCOMP frame came before this SPEC");
        return -1;
    }
    if (!s->seccomp && prog) {
        snprintf(err, errlen, "spec: a SECCOMP frame came, but this SPEC has no seccomp=1");
        return -1;
    }
    return 0;
}

/* SANDBOX and FORKED: records applied, answered ATTACHED or ERROR. */
static void handle_attach(const struct host_msg *m,
                          int (*apply)(char *, size_t, char *, size_t))
{
    char err[ERRTEXT_MAX] = "";
    if (apply((char *)m->data, m->len, err, sizeof err) == 0) {
        chan_send(PC_ATTACHED, m->chan, NULL, 0);
        return;
    }
    loghost("%s", err);
    chan_send_text(PC_ERROR, m->chan, err);
}

static void handle_spec(const struct host_msg *m)
{
    char err[ERRTEXT_MAX] = "";
    struct ctr *c = NULL;
    int pid = -1;
    /* Taken whatever happens: a program is for the SPEC right after it. */
    struct seccomp_prog *prog = seccomp_take(m->chan);
    if (!sandbox_attached())
        snprintf(err, sizeof err, "spec: no SANDBOX has attached this VM yet");
    else if (spec_parse((char *)m->data, m->len, &spec, err, sizeof err) == 0 &&
        seccomp_matches(&spec, prog, err, sizeof err) == 0 &&
        proc_chan_free(m->chan, err, sizeof err) == 0 &&
        ctr_claim(spec.container, spec.role, &c, err, sizeof err) == 0) {
        if (c->state == CTR_NEW) {
            c->seccomp = prog; /* the container's now, freed with it */
            prog = NULL;
        }
        pid = proc_spawn(m->chan, &spec, c, err, sizeof err);
    }
    free(prog);
    if (pid > 0) {
        unsigned char b[PC_U32_MSG_LEN];
        struct pc_created_msg msg = {.pid = (uint32_t)pid};
        pc_created_encode(b, &msg);
        chan_send(PC_CREATED, m->chan, b, sizeof b);
        return;
    }
    if (c && c->state == CTR_NEW)
        ctr_abandon(c);
    if (!err[0])
        snprintf(err, sizeof err, "process setup failed");
    loghost("chan %u: %s", m->chan, err);
    chan_send_text(PC_ERROR, m->chan, err);
}

/* STATS: a container's figures, on the channel the host's relay gave the request. */
static void handle_stats(const struct host_msg *m)
{
    char id[PC_SPEC_MAX_CONTAINER_ID + 1], err[ERRTEXT_MAX] = "";
    uint64_t v[PC_STAT_COUNT];
    memcpy(id, m->data, m->len); /* frame_decode bounded it, with no NUL inside */
    id[m->len] = 0;
    if (ctr_stats(id, v, err, sizeof err) == 0) {
        unsigned char b[PC_STATS_REPLY_LEN];
        pc_stats_reply_encode(b, v);
        chan_send(PC_STATS_REPLY, m->chan, b, sizeof b);
        return;
    }
    chan_send_text(PC_ERROR, m->chan, err);
}

/* LIMITS: a running container's new limits, answered as STATS is. */
static void handle_limits(const struct host_msg *m)
{
    char err[ERRTEXT_MAX] = "";
    struct limits l;
    if (limits_parse((char *)m->data, m->len, &l, err, sizeof err) == 0 &&
        ctr_limit(l.container, l.memory_max, l.pids_max, err, sizeof err) == 0) {
        chan_send(PC_ATTACHED, m->chan, NULL, 0);
        return;
    }
    loghost("chan %u: %s", m->chan, err);
    chan_send_text(PC_ERROR, m->chan, err);
}

/* A START may carry network records: interfaces that appeared after create
 * (docs/networking.md).  The process must not run without them: on failure
 * it gets ERROR and is killed before it ever execs. */
static int start_network(const struct host_msg *m)
{
    static struct net_spec late;
    char err[ERRTEXT_MAX] = "";
    if (netspec_parse((char *)m->data, m->len, &late, err, sizeof err) == 0 &&
        net_start(&late, err, sizeof err) == 0)
        return 0;
    loghost("chan %u: %s", m->chan, err);
    chan_send_text(PC_ERROR, m->chan, err);
    proc_signal(m->chan, SIGKILL, 0);
    return -1;
}

/* 1 when the frame must wait (its stdin buffer is full), else 0. */
static int dispatch(const struct frame *f)
{
    struct host_msg m;
    char why[128];
    if (frame_decode(f, &m, why, sizeof why) < 0) {
        loghost("protocol: %s", why);
        /* A query's asker waits on its channel: it gets why, and the
         * relay frees the channel, instead of both waiting for nothing. */
        if ((f->hdr.type == PC_STATS || f->hdr.type == PC_LIMITS) && f->hdr.chan >= 1 &&
            f->hdr.chan <= PC_MAX_CHAN)
            chan_send_text(PC_ERROR, f->hdr.chan, why);
        return 0;
    }
    switch (m.type) {
    case PC_SANDBOX:
        handle_attach(&m, sandbox_attach);
        break;
    case PC_SPEC:
        handle_spec(&m);
        break;
    case PC_STATS:
        handle_stats(&m);
        break;
    case PC_LIMITS:
        handle_limits(&m);
        break;
    case PC_SECCOMP: {
        char err[ERRTEXT_MAX];
        if (seccomp_stash(m.chan, m.data, m.len, err, sizeof err) < 0) {
            /* The SPEC that follows fails for want of it, naming the cause here. */
            loghost("chan %u: %s", m.chan, err);
        }
        break;
    }
    case PC_START:
        if (m.len && start_network(&m) < 0)
            break;
        proc_start(m.chan);
        break;
    case PC_STDIN:
        return proc_stdin(m.chan, m.data, m.len);
    case PC_SIGNAL:
        proc_signal(m.chan, m.signal.signo, m.signal.flags);
        break;
    case PC_RESIZE:
        proc_resize(m.chan, m.resize.rows, m.resize.cols);
        break;
    case PC_FWD_OPEN:
    case PC_FWD_DATA:
    case PC_FWD_CREDIT:
    case PC_FWD_SHUT:
    case PC_FWD_CLOSE:
        fwd_handle(&m);
        break;
    case PC_QUIESCE:
        /* A second one (its asker gave up, and the RESUME sent for it is
         * still on its way) gets its own QUIESCED. */
        quiescing = 1;
        quiesced = 0;
        quiesce_seq = m.quiesce.seq;
        break;
    case PC_FORKED:
        handle_attach(&m, sandbox_fork);
        break;
    case PC_RESUME:
        if (!quiesced)
            loghost("protocol: RESUME without QUIESCE");
        quiescing = quiesced = 0;
        if (m.resume.flags & PC_RESUME_ROLLED_BACK) {
            proc_rolled_back();
            fwd_forget_all();
            logmsg("resumed from a checkpoint");
        }
        break;
    case PC_POWEROFF:
        vm_power_off(0);
    }
    return 0;
}

/* Frames are handled in order, except that a STDIN frame whose process's
 * buffer is full blocks only its own channel: later frames for other
 * channels, and control frames (START, SIGNAL, RESIZE, POWEROFF) for any
 * channel, go ahead, so a process that never reads its stdin can still be
 * signalled.  Within one channel, STDIN and SPEC keep their order. */
static void process_frames(void)
{
    static unsigned char blocked[(PC_MAX_CHAN + 1 + 7) / 8];
    struct frame f;
    size_t pos = 0;
    int nblocked = 0, scanned = 0;

    while (outq_free() >= FRAME_ROOM && scanned < MAX_LOOKAHEAD && inq_frame_at(pos, &f)) {
        size_t next = pos + PC_HDR_LEN + f.hdr.len;
        uint16_t type = f.hdr.type, chan = f.hdr.chan;
        int in_order = type == PC_STDIN || type == PC_SPEC || type == PC_SECCOMP ||
                       type == PC_SANDBOX;
        int chan_ok = chan <= PC_MAX_CHAN;
        if (pos)
            scanned++;
        if (type == FRAME_DONE) {
            /* already handled out of order */
        } else if (in_order && chan_ok && (blocked[chan / 8] >> (chan % 8) & 1)) {
            pos = next;
            continue;
        } else if (dispatch(&f)) {
            blocked[chan / 8] |= (unsigned char)(1u << (chan % 8));
            nblocked++;
            pos = next;
            continue;
        }
        if (pos) {
            inq_mark_done(&f);
            pos = next;
        } else {
            inq_consume_head(&f);
        }
    }
    if (nblocked)
        memset(blocked, 0, sizeof blocked);
}

static void host_down(void)
{
    if (!port_down && ever_connected)
        logmsg("host disconnected from the agent port");
    port_down = 1;
}

static void read_port(void)
{
    while (inq_has_room()) {
        ssize_t n = inq_fill(port);
        if (n > 0)
            continue;
        if (n == 0)
            host_down();
        else if (errno != EAGAIN)
            logmsg("read agent port: %s", strerror(errno));
        return;
    }
}

static void check_port_up(void)
{
    struct pollfd q = {port, POLLOUT, 0};
    if (poll(&q, 1, 0) == 1 && (q.revents & POLLHUP))
        return;
    if (ever_connected)
        logmsg("host reconnected to the agent port");
    ever_connected = 1;
    port_down = 0;
    /* A frame cut off by the disconnect would misparse everything after it. */
    inq_reset();
}

static void flush_port(long long *progress)
{
    size_t before = outq_pending();
    if (outq_flush(port) < 0)
        logmsg("write agent port: %s", strerror(errno));
    if (outq_pending() != before)
        *progress = now_ms();
}

/* ---- main loop ---- */

static struct pollfd pfd[2 + 4 * (PC_MAX_CHAN + 1) + PC_FWD_MAX_STREAMS];

static void run(int sfd)
{
    long long idle_since = 0, progress = now_ms();
    port_down = 1;

    for (;;) {
        int n = 0, port_idx = -1, timeout = -1;

        if (port_down)
            check_port_up();
        pfd[n++] = (struct pollfd){sfd, POLLIN, 0};
        if (!port_down) {
            short ev = 0;
            if (inq_has_room() && outq_free() >= FRAME_ROOM)
                ev |= POLLIN;
            if (outq_pending())
                ev |= POLLOUT;
            port_idx = n;
            pfd[n++] = (struct pollfd){port, ev, 0};
        } else {
            timeout = 50;
        }
        if (!quiescing)
            n = proc_poll_prepare(pfd, n, (int)(sizeof pfd / sizeof pfd[0]));
        int procs_end = n;
        if (!quiescing)
            n = fwd_poll_prepare(pfd, n, (int)(sizeof pfd / sizeof pfd[0]));

        /* The containers are over: wait for POWEROFF, but not forever. */
        if (quiescing) {
            idle_since = 0;
        } else if (ctr_all_ended() && !proc_active()) {
            long long now = now_ms();
            if (outq_pending()) {
                idle_since = 0;
                if (now - progress >= STUCK_OUTPUT_MS) {
                    logmsg("host stopped reading; powering off with output unsent");
                    vm_power_off(0);
                }
                if (timeout < 0 || timeout > 1000)
                    timeout = 1000;
            } else {
                if (!idle_since)
                    idle_since = now;
                long long left = idle_since + POWEROFF_WAIT_MS - now;
                if (left <= 0)
                    vm_power_off(0);
                if (timeout < 0 || timeout > left)
                    timeout = (int)left;
            }
        } else {
            /* A container created meanwhile starts the wait afresh. */
            idle_since = 0;
        }

        if (poll(pfd, (nfds_t)n, timeout) < 0) {
            if (errno != EINTR) {
                logmsg("poll: %s", strerror(errno));
                usleep(10000);
            }
            continue;
        }

        if (pfd[0].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0)
                ;
            proc_reap();
        }
        if (port_idx >= 0 && pfd[port_idx].revents) {
            short re = pfd[port_idx].revents;
            if (re & POLLOUT)
                flush_port(&progress);
            if (re & (POLLIN | POLLHUP | POLLERR))
                read_port();
            /* Frames already received still count, e.g. a POWEROFF sent just
             * before the host closed its end. */
            if (re & (POLLHUP | POLLERR))
                host_down();
        }
        if (!quiescing) {
            proc_poll_handle(pfd, procs_end);
            fwd_poll_handle(pfd, n);
        }
        process_frames();
        if (!quiescing) {
            /* Before any EXIT: a channel's credit never follows its end. */
            proc_send_credits();
            proc_collect();
        }
        /* Push new output now rather than one poll round later. */
        if (!port_down && outq_pending())
            flush_port(&progress);
        /* Only after that flush: when it empties the queue, nothing else may
         * ever wake this loop (no output is read, the host sends nothing),
         * so QUIESCED must go in this round. */
        if (quiescing && !quiesced && !port_down && !outq_pending()) {
            unsigned char b[PC_U32_MSG_LEN];
            pc_quiesce_encode(b, &(struct pc_quiesce_msg){quiesce_seq});
            chan_send(PC_QUIESCED, 0, b, sizeof b);
            quiesced = 1;
            flush_port(&progress);
        }
    }
}

int main(void)
{
    sigset_t mask;

    vm_boot();
    /* SIGCHLD arrives through the loop, never as an interruption. */
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0 || chan_init() < 0) {
        logmsg("cannot set up: %s", strerror(errno));
        vm_power_off(1);
    }
    port = vm_open_port();
    if (port < 0) {
        logmsg("no virtio-serial port named %s", PC_AGENT_PORT_NAME);
        vm_power_off(1);
    }
    struct timespec up;
    clock_gettime(CLOCK_BOOTTIME, &up);
    logmsg("ready, %ld.%03ld s after kernel start", (long)up.tv_sec, up.tv_nsec / 1000000);
    /* For timing a bare boot of this kernel and initramfs: no host needed. */
    if (vm_cmdline_has("paracell.exit_on_boot=1"))
        vm_power_off(0);
    unsigned char ready[PC_READY_LEN];
    pc_ready_encode(ready, &(struct pc_ready_msg){PC_PROTO_VERSION, PC_AGENT_CAPS});
    chan_send(PC_READY, 0, ready, sizeof ready);
    run(sfd);
}
