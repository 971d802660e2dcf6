/* Port-forward streams, guest half (see portfwd.h).
 *
 * The host is the one that opens streams and keeps the ids; the agent checks
 * its frames all the same, and a frame that breaks the protocol is logged
 * and dropped (or, for a stream that exists, aborts that stream alone): PID 1
 * never exits over it.  Per stream the agent holds at most PC_FWD_WINDOW
 * bytes of the host's DATA, the credit it gave, and reads from its socket
 * only as much as the host's credit allows, straight into the outgoing queue. */
#define _GNU_SOURCE
#include "portfwd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent_codec.h"
#include "fwd_stream.h"
#include "log.h"

/* Reads per stream per round: one busy stream must not starve the rest. */
#define READ_BURST 4

struct stream {
    int busy;                /* from OPEN until CLOSE went both ways */
    int fd;                  /* our connection to the server; -1 once closed */
    int connecting;
    struct pc_fwd_flow flow; /* credit and ends, as proto/fwd_stream.h keeps them */
    unsigned char *buf;      /* the host's bytes the server has not taken; PC_FWD_WINDOW */
    size_t off, len;
};

static struct stream streams[PC_FWD_MAX_STREAMS + 1];  /* by id; 0 unused */

static void release(struct stream *s)
{
    pc_fwd_close_socket(&s->fd, 1);
    free(s->buf);
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

static void send_close(unsigned id)
{
    struct stream *s = &streams[id];
    if (!s->flow.sent_close) {
        chan_send(PC_FWD_CLOSE, (uint16_t)id, NULL, 0);
        s->flow.sent_close = 1;
    }
    if (s->flow.got_close)
        release(s);
}

static void abort_stream(unsigned id)
{
    pc_fwd_close_socket(&streams[id].fd, 1);
    send_close(id);
}

/* Writes what the host sent to the server, gives credit back, passes the
 * host's SHUT on, and ends the stream when both directions are done. */
static void flush_server(unsigned id)
{
    struct stream *s = &streams[id];
    if (s->fd < 0 || s->connecting)
        return;
    while (s->len) {
        ssize_t n = send(s->fd, s->buf + s->off, s->len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            abort_stream(id);
            return;
        }
        s->off += (size_t)n;
        s->len -= (size_t)n;
        s->flow.written += (uint32_t)n;
    }
    if (!s->len)
        s->off = 0;
    uint32_t due = pc_fwd_credit_due(&s->flow, !s->len);
    if (due) {
        unsigned char b[PC_U32_MSG_LEN];
        struct pc_fwd_credit_msg m = {.bytes = due};
        pc_fwd_credit_encode(b, &m);
        chan_send(PC_FWD_CREDIT, (uint16_t)id, b, sizeof b);
    }
    if (pc_fwd_shut_due(&s->flow, !s->len))
        shutdown(s->fd, SHUT_WR);
    if (pc_fwd_finished(&s->flow, !s->len)) {
        pc_fwd_close_socket(&s->fd, 0);
        send_close(id);
    }
}

static void open_stream(unsigned id, const struct pc_fwd_open_msg *o)
{
    struct stream *s = &streams[id];
    if (s->busy) {
        loghost("port forward: OPEN for stream %u, which is open", id);
        return;
    }
    memset(s, 0, sizeof *s);
    s->busy = 1;
    s->fd = -1;
    pc_fwd_flow_init(&s->flow);
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons(o->port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons(o->port),
                              .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int v6 = o->family == PC_FWD_INET6;
    s->fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int rc = s->fd < 0 ? -1
             : v6 ? connect(s->fd, (struct sockaddr *)&a6, sizeof a6)
                  : connect(s->fd, (struct sockaddr *)&a4, sizeof a4);
    if (rc < 0 && errno == EINPROGRESS)
        s->connecting = 1;
    else if (rc < 0)
        abort_stream(id); /* refused: the host resets its client */
}

static void connected(unsigned id)
{
    struct stream *s = &streams[id];
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
        abort_stream(id);
        return;
    }
    s->connecting = 0;
    flush_server(id);
}

static void take_data(unsigned id, const unsigned char *p, uint32_t n)
{
    struct stream *s = &streams[id];
    if (!pc_fwd_data_allowed(&s->flow, n)) {
        loghost("port forward: DATA beyond the window or after the end of stream %u", id);
        abort_stream(id);
        return;
    }
    s->flow.unacked += n;
    if (!s->len && !s->connecting) {
        /* Straight to the server while nothing waits ahead: no copy. */
        ssize_t w = send(s->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            abort_stream(id);
            return;
        }
        if (w > 0) {
            p += w;
            n -= (uint32_t)w;
            s->flow.written += (uint32_t)w;
        }
        if (!n) {
            flush_server(id); /* the credit */
            return;
        }
    }
    if (!s->buf && !(s->buf = malloc(PC_FWD_WINDOW))) {
        logmsg("port forward: out of memory for stream %u", id);
        abort_stream(id);
        return;
    }
    /* unacked bounds what is buffered, so the window always has room. */
    if (s->off + s->len + n > PC_FWD_WINDOW) {
        memmove(s->buf, s->buf + s->off, s->len);
        s->off = 0;
    }
    memcpy(s->buf + s->off + s->len, p, n);
    s->len += n;
    flush_server(id);
}

void fwd_forget_all(void)
{
    for (unsigned id = 1; id <= PC_FWD_MAX_STREAMS; id++)
        if (streams[id].busy)
            release(&streams[id]);
}

void fwd_handle(const struct host_msg *m)
{
    unsigned id = m->chan;
    struct stream *s = &streams[id];
    if (m->type == PC_FWD_OPEN) {
        open_stream(id, &m->fwd_open);
        return;
    }
    if (!s->busy) {
        loghost("port forward: frame type %u for stream %u, which is not open", m->type, id);
        return;
    }
    if (m->type == PC_FWD_CLOSE) {
        switch (pc_fwd_close_kind(&s->flow)) {
        case PC_FWD_CLOSE_FREE:
            release(s);
            break;
        case PC_FWD_CLOSE_FINISH:
            flush_server(id);
            break;
        case PC_FWD_CLOSE_ABORT:
            abort_stream(id);
            break;
        default:
            loghost("port forward: CLOSE twice for stream %u", id);
        }
        return;
    }
    if (s->flow.sent_close)
        return; /* the host had not seen our CLOSE yet */
    switch (m->type) {
    case PC_FWD_DATA:
        take_data(id, m->data, m->len);
        break;
    case PC_FWD_CREDIT:
        if (!pc_fwd_credit_allowed(&s->flow, m->credit.bytes)) {
            loghost("port forward: CREDIT for bytes never sent on stream %u", id);
            abort_stream(id);
            return;
        }
        s->flow.credit += m->credit.bytes;
        break;
    case PC_FWD_SHUT:
        if (s->flow.got_shut) {
            loghost("port forward: SHUT twice for stream %u", id);
            return;
        }
        s->flow.got_shut = 1;
        flush_server(id);
        break;
    }
}

static void read_server(unsigned id)
{
    struct stream *s = &streams[id];
    for (int i = 0; i < READ_BURST && s->fd >= 0 && !s->flow.sent_shut && s->flow.credit &&
                    outq_has_data_room(); i++) {
        ssize_t n = outq_read_frame_max(s->fd, PC_FWD_DATA, (uint16_t)id, s->flow.credit);
        if (n > 0) {
            s->flow.credit -= (uint32_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (n < 0) {
            abort_stream(id);
            return;
        }
        chan_send(PC_FWD_SHUT, (uint16_t)id, NULL, 0);
        s->flow.sent_shut = 1;
        flush_server(id); /* which ends the stream if the host is done too */
    }
}

static unsigned tag_id[PC_FWD_MAX_STREAMS];
static int first_tag, ntags;

int fwd_poll_prepare(struct pollfd *pfd, int n, int max)
{
    int data = outq_has_data_room();
    first_tag = n;
    ntags = 0;
    for (unsigned id = 1; id <= PC_FWD_MAX_STREAMS && n < max; id++) {
        struct stream *s = &streams[id];
        short ev = 0;
        if (s->fd < 0)
            continue;
        if (s->connecting)
            ev = POLLOUT;
        else {
            if (data && !s->flow.sent_shut && !s->flow.sent_close && s->flow.credit)
                ev |= POLLIN;
            if (s->len)
                ev |= POLLOUT;
        }
        /* Nothing wanted: left out, as a hung-up socket would spin the loop. */
        if (!ev)
            continue;
        pfd[n] = (struct pollfd){s->fd, ev, 0};
        tag_id[ntags++] = id;
        n++;
    }
    return n;
}

void fwd_poll_handle(const struct pollfd *pfd, int n)
{
    for (int i = 0; i < ntags && first_tag + i < n; i++) {
        short re = pfd[first_tag + i].revents;
        unsigned id = tag_id[i];
        struct stream *s = &streams[id];
        if (!re || s->fd < 0)
            continue;
        if (s->connecting) {
            connected(id);
            continue;
        }
        if (re & POLLOUT)
            flush_server(id);
        if (re & (POLLIN | POLLHUP | POLLERR))
            read_server(id);
    }
}
