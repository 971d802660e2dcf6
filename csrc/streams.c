/* Port-forward streams, host half (see streams.h and the protocol notes in
 * proto/agent_proto.h).
 *
 * Everything the guest sends is hostile.  A frame for an id the host never
 * opened, DATA beyond the window or after the guest's SHUT, credit for bytes
 * never sent, a second SHUT or CLOSE: each is a protocol violation.  Frames
 * for a stream the host has already closed are a race, not a violation, and
 * are dropped.  The guest can make the host hold at most PC_FWD_WINDOW bytes
 * per stream and PC_FWD_MAX_STREAMS streams, which the host alone opens. */
#define _GNU_SOURCE
#include "streams.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent_codec.h"
#include "fwd_stream.h"

/* Connections accepted per listener per round. */
#define ACCEPT_BURST 8

struct stream {
    int busy;                /* the id is taken: from OPEN until CLOSE went both ways */
    int fd;                  /* the client's connection; -1 once closed */
    struct pc_fwd_flow flow; /* credit and ends, as proto/fwd_stream.h keeps them */
    struct sink out;         /* the guest's bytes that the client has not taken yet */
};

struct fwd {
    int listen[2];
    struct sink *to_chan;
    struct stream s[PC_FWD_MAX_STREAMS + 1];  /* by id; 0 unused */
};

int fwd_is_type(unsigned type)
{
    return type >= PC_FWD_OPEN && type <= PC_FWD_CLOSE;
}

struct fwd *fwd_new(const struct pc_fwd_listeners *l, struct sink *to_chan)
{
    struct fwd *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->listen[0] = l->listen4;
    f->listen[1] = l->listen6;
    f->to_chan = to_chan;
    for (int id = 0; id <= PC_FWD_MAX_STREAMS; id++)
        f->s[id].fd = -1;
    return f;
}

/* ---- one stream ---- */

static void send_ctl(struct fwd *f, unsigned type, int id, const unsigned char *p, size_t n)
{
    sink_frame(f->to_chan, type, (unsigned)id, (const char *)p, n);
}

static void release(struct stream *s)
{
    pc_fwd_close_socket(&s->fd, 1);
    free(s->out.buf);
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

static void send_close(struct fwd *f, int id)
{
    struct stream *s = &f->s[id];
    if (!s->flow.sent_close) {
        send_ctl(f, PC_FWD_CLOSE, id, NULL, 0);
        s->flow.sent_close = 1;
    }
    if (s->flow.got_close)
        release(s);
}

static void abort_stream(struct fwd *f, int id)
{
    pc_fwd_close_socket(&f->s[id].fd, 1);
    send_close(f, id);
}

/* Writes the guest's bytes to the client, gives credit back, passes the
 * guest's SHUT on, and ends the stream when both directions are done. */
static void flush_client(struct fwd *f, int id)
{
    struct stream *s = &f->s[id];
    if (s->fd < 0)
        return;
    size_t before = sink_pending(&s->out);
    if (before && sink_flush(&s->out) < 0) {
        abort_stream(f, id);
        return;
    }
    s->flow.written += (uint32_t)(before - sink_pending(&s->out));
    int drained = !sink_pending(&s->out);
    uint32_t due = pc_fwd_credit_due(&s->flow, drained);
    if (due) {
        unsigned char b[PC_U32_MSG_LEN];
        struct pc_fwd_credit_msg m = {.bytes = due};
        pc_fwd_credit_encode(b, &m);
        send_ctl(f, PC_FWD_CREDIT, id, b, sizeof b);
    }
    if (pc_fwd_shut_due(&s->flow, drained))
        shutdown(s->fd, SHUT_WR);  /* the client reads EOF: a half-close */
    if (pc_fwd_finished(&s->flow, drained)) {
        pc_fwd_close_socket(&s->fd, 0);
        send_close(f, id);
    }
}

static void read_client(struct fwd *f, int id)
{
    struct stream *s = &f->s[id];
    size_t max = s->flow.credit < PC_MAX_PAYLOAD ? s->flow.credit : PC_MAX_PAYLOAD;
    if (s->fd < 0 || !max || !sink_has_room(f->to_chan))
        return;
    ssize_t n = sink_recv_frame(f->to_chan, s->fd, PC_FWD_DATA, (unsigned)id, max);
    if (n > 0) {
        s->flow.credit -= (uint32_t)n;
    } else if (n == 0) {
        send_ctl(f, PC_FWD_SHUT, id, NULL, 0);
        s->flow.sent_shut = 1;
        flush_client(f, id);  /* which ends the stream if the guest is done too */
    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        abort_stream(f, id);
    }
}

/* ---- new connections ---- */

/* The address the client dialled, which the steering kept: loopback only. */
static int dialled(int fd, struct pc_fwd_open_msg *m)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
        return -1;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        m->family = PC_FWD_INET;
        m->port = ntohs(a->sin_port);
        return a->sin_addr.s_addr == htonl(INADDR_LOOPBACK) && m->port ? 0 : -1;
    }
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        m->family = PC_FWD_INET6;
        m->port = ntohs(a->sin6_port);
        return IN6_IS_ADDR_LOOPBACK(&a->sin6_addr) && m->port ? 0 : -1;
    }
    return -1;
}

static int free_id(const struct fwd *f)
{
    for (int id = 1; id <= PC_FWD_MAX_STREAMS; id++)
        if (!f->s[id].busy)
            return id;
    return 0;
}

static void accept_clients(struct fwd *f, int lfd)
{
    for (int i = 0; i < ACCEPT_BURST; i++) {
        int id = free_id(f);
        if (!id || !sink_has_room(f->to_chan))
            return;
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        struct pc_fwd_open_msg m;
        if (dialled(fd, &m) < 0) {
            close(fd);
            continue;
        }
        struct stream *s = &f->s[id];
        memset(s, 0, sizeof *s);
        s->busy = 1;
        s->fd = fd;
        pc_fwd_flow_init(&s->flow);
        sink_init_socket(&s->out, fd);
        s->out.kind = SINK_SOCKET;  /* send(MSG_NOSIGNAL): a gone client is no SIGPIPE */
        unsigned char b[PC_FWD_OPEN_LEN];
        pc_fwd_open_encode(b, &m);
        send_ctl(f, PC_FWD_OPEN, id, b, sizeof b);
    }
}

/* ---- the relay's hooks ---- */

static void slot(struct pollfd *p, int fd, short events)
{
    /* An fd with nothing wanted is left out: a hung-up socket would report
     * POLLHUP on every round and spin the loop. */
    p->fd = events ? fd : -1;
    p->events = events;
    p->revents = 0;
}

void fwd_poll_prepare(struct fwd *f, struct pollfd *pfd, int room)
{
    int any_free = free_id(f) != 0;
    for (int i = 0; i < 2; i++)
        slot(&pfd[i], f->listen[i], f->listen[i] >= 0 && room && any_free ? POLLIN : 0);
    for (int id = 1; id <= PC_FWD_MAX_STREAMS; id++) {
        struct stream *s = &f->s[id];
        short ev = 0;
        if (s->fd >= 0 && !s->flow.sent_shut && !s->flow.sent_close && s->flow.credit && room)
            ev |= POLLIN;
        if (s->fd >= 0 && sink_pending(&s->out))
            ev |= POLLOUT;
        slot(&pfd[1 + id], s->fd, ev);
    }
}

void fwd_poll_handle(struct fwd *f, const struct pollfd *pfd)
{
    for (int id = 1; id <= PC_FWD_MAX_STREAMS; id++) {
        short re = pfd[1 + id].revents;
        if (re & POLLOUT)
            flush_client(f, id);
        if (re & (POLLIN | POLLHUP | POLLERR))
            read_client(f, id);
    }
    for (int i = 0; i < 2; i++)
        if (pfd[i].revents & POLLIN)
            accept_clients(f, f->listen[i]);
}

int fwd_on_frame(struct fwd *f, unsigned type, unsigned id, const char *p, uint32_t n,
                 const char **why)
{
    struct pc_fwd_credit_msg credit;
    if (id < 1 || id > PC_FWD_MAX_STREAMS || !f->s[id].busy) {
        *why = "port-forward frame for a stream the host did not open";
        return -1;
    }
    struct stream *s = &f->s[id];
    struct pc_fwd_flow *flow = &s->flow;
    /* The guest may still be answering a stream the host has closed: its
     * frames crossed our CLOSE, and are dropped whatever they hold. */
    int stale = flow->sent_close && type != PC_FWD_CLOSE;
    switch (type) {
    case PC_FWD_DATA:
        if (stale)
            return 0;
        if (!pc_fwd_data_allowed(flow, n)) {
            *why = "port-forward DATA beyond the window or after the stream's end";
            return -1;
        }
        flow->unacked += n;
        if (sink_append(&s->out, p, n) < 0)
            abort_stream(f, (int)id);
        else
            flush_client(f, (int)id);
        return 0;
    case PC_FWD_CREDIT:
        if (stale)
            return 0;
        if (pc_fwd_credit_decode((const unsigned char *)p, n, &credit) < 0 ||
            !pc_fwd_credit_allowed(flow, credit.bytes)) {
            *why = "port-forward CREDIT for bytes never sent";
            return -1;
        }
        flow->credit += credit.bytes;
        return 0;
    case PC_FWD_SHUT:
        if (stale)
            return 0;
        if (n != 0 || flow->got_shut || flow->got_close) {
            *why = "port-forward SHUT twice or with a payload";
            return -1;
        }
        flow->got_shut = 1;
        flush_client(f, (int)id);
        return 0;
    case PC_FWD_CLOSE:
        if (n != 0) {
            *why = "port-forward CLOSE twice or with a payload";
            return -1;
        }
        switch (pc_fwd_close_kind(flow)) {
        case PC_FWD_CLOSE_FREE:
            release(s);
            return 0;
        case PC_FWD_CLOSE_FINISH:
            flush_client(f, (int)id);
            return 0;
        case PC_FWD_CLOSE_ABORT:
            abort_stream(f, (int)id);
            return 0;
        }
        *why = "port-forward CLOSE twice or with a payload";
        return -1;
    default: /* PC_FWD_OPEN: the host alone opens streams */
        *why = "port-forward OPEN from the guest";
        return -1;
    }
}

void fwd_forget_all(struct fwd *f)
{
    for (int id = 1; f && id <= PC_FWD_MAX_STREAMS; id++)
        release(&f->s[id]);
}

void fwd_free(struct fwd *f)
{
    if (!f)
        return;
    for (int id = 1; id <= PC_FWD_MAX_STREAMS; id++)
        release(&f->s[id]);
    free(f);
}
