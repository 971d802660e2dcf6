/* Output queues of the host relay: see sink.h. */
#define _GNU_SOURCE
#include "sink.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent_codec.h"

/* Pipes and ttys we were handed are shared with other processes (the caller's
 * terminal, containerd's pipes): setting O_NONBLOCK on them would change them
 * for everyone. Reopening through /proc gives a private open file description
 * that can be non-blocking on its own. */
int private_nonblocking(int fd, int flags, int *owned, enum sink_kind *kind)
{
    struct stat st;
    char path[64];
    *owned = 0;
    if (fstat(fd, &st) < 0) return -1;
    if (S_ISSOCK(st.st_mode)) {
        *kind = SINK_SOCKET;
        return fd;
    }
    if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        int nfd = open(path, flags | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
        if (nfd >= 0) {
            *owned = 1;
            *kind = SINK_NONBLOCK;
            return nfd;
        }
    }
    *kind = SINK_BLOCKING;
    return fd;
}

void sink_init_local(struct sink *s, int fd)
{
    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->kind = SINK_NONE;
    if (fd < 0) return;
    s->fd = private_nonblocking(fd, O_WRONLY, &s->owned, &s->kind);
    if (s->fd < 0) s->kind = SINK_NONE;
}

void sink_init_socket(struct sink *s, int fd)
{
    memset(s, 0, sizeof *s);
    s->fd = fd;
    s->kind = SINK_NONBLOCK;
}

size_t sink_pending(const struct sink *s)
{
    return s->len - s->off;
}

size_t sink_flushable(const struct sink *s)
{
    return sink_pending(s) - s->held;
}

int sink_has_room(const struct sink *s)
{
    return s->kind == SINK_NONE || s->dead || s->kind == SINK_BLOCKING ||
           sink_pending(s) + INBUF_CAP <= QUEUE_LIMIT;
}

static ssize_t sink_write(struct sink *s, const char *p, size_t n)
{
    if (s->kind == SINK_SOCKET) return send(s->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    return write(s->fd, p, n);
}

int sink_flush(struct sink *s)
{
    while (sink_flushable(s) > 0) {
        ssize_t w = sink_write(s, s->buf + s->off, sink_flushable(s));
        if (w > 0) {
            s->off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        s->dead = 1;
        s->off = s->len = s->held = 0;
        return -1;
    }
    if (!s->held) s->off = s->len = 0;
    return 0;
}

/* Room for n more bytes at the end of the queue. */
static int sink_reserve(struct sink *s, size_t n)
{
    if (s->off > 0 && s->off == s->len) s->off = s->len = 0;
    if (s->len + n <= s->cap) return 0;
    if (s->off > 0) {
        memmove(s->buf, s->buf + s->off, s->len - s->off);
        s->len -= s->off;
        s->off = 0;
    }
    if (s->len + n <= s->cap) return 0;
    size_t cap = s->cap ? s->cap : 65536;
    while (cap < s->len + n) cap *= 2;
    char *nb = realloc(s->buf, cap);
    if (!nb) return -1;
    s->buf = nb;
    s->cap = cap;
    return 0;
}

int sink_append(struct sink *s, const char *p, size_t n)
{
    if (s->kind == SINK_NONE || s->dead || n == 0) return 0;
    if (s->kind == SINK_BLOCKING) {
        while (n > 0) {
            ssize_t w = write(s->fd, p, n);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                s->dead = 1;
                return -1;
            }
            p += w;
            n -= (size_t)w;
        }
        return 0;
    }
    if (sink_reserve(s, n) < 0) return -1;
    memcpy(s->buf + s->len, p, n);
    s->len += n;
    if (s->holding) s->held += n;
    return 0;
}

int sink_frame(struct sink *s, unsigned type, unsigned chan, const char *p, size_t n)
{
    unsigned char hdr[PC_HDR_LEN];
    struct pc_hdr h = {.len = (uint32_t)n, .type = (uint16_t)type, .chan = (uint16_t)chan};
    pc_hdr_encode(hdr, &h);
    if (sink_append(s, (const char *)hdr, sizeof hdr) < 0) return -1;
    return sink_append(s, p, n);
}

ssize_t sink_recv_frame(struct sink *s, int fd, unsigned type, unsigned chan, size_t max)
{
    if (max > PC_MAX_PAYLOAD) max = PC_MAX_PAYLOAD;
    if (sink_reserve(s, PC_HDR_LEN + max) < 0) {
        errno = ENOMEM;
        return -1;
    }
    ssize_t n;
    do
        n = recv(fd, s->buf + s->len + PC_HDR_LEN, max, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n <= 0) return n;
    struct pc_hdr h = {.len = (uint32_t)n, .type = (uint16_t)type, .chan = (uint16_t)chan};
    pc_hdr_encode((unsigned char *)s->buf + s->len, &h);
    s->len += PC_HDR_LEN + (size_t)n;
    if (s->holding) s->held += PC_HDR_LEN + (size_t)n;
    return n;
}

void sink_release(struct sink *s)
{
    if (s->owned && s->fd >= 0) close(s->fd);
    free(s->buf);
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

void sink_hold(struct sink *s)
{
    s->holding = 1;
}

int sink_release_hold(struct sink *s, unsigned type, unsigned chan, const char *p, size_t n)
{
    size_t held = s->held;
    s->holding = 0;
    s->held = 0;
    if (s->kind == SINK_NONE || s->dead) return 0;
    if (sink_reserve(s, PC_HDR_LEN + n) < 0) return -1;
    char *at = s->buf + s->len - held;
    memmove(at + PC_HDR_LEN + n, at, held);
    struct pc_hdr h = {.len = (uint32_t)n, .type = (uint16_t)type, .chan = (uint16_t)chan};
    pc_hdr_encode((unsigned char *)at, &h);
    if (n) memcpy(at + PC_HDR_LEN, p, n);
    s->len += PC_HDR_LEN + n;
    return 0;
}

void sink_filter_held(struct sink *s, int (*keep)(void *arg, unsigned type, unsigned chan,
                                                 size_t len),
                      void *arg)
{
    char *from = s->buf + s->len - s->held, *end = s->buf + s->len, *to = from;
    while (end - from >= PC_HDR_LEN) {
        struct pc_hdr h;
        pc_hdr_decode((const unsigned char *)from, &h);
        size_t size = PC_HDR_LEN + h.len;
        if (size > (size_t)(end - from)) break;  /* never: only whole frames are queued */
        if (keep(arg, h.type, h.chan, h.len)) {
            memmove(to, from, size);
            to += size;
        }
        from += size;
    }
    memmove(to, from, (size_t)(end - from));
    to += end - from;
    size_t dropped = (size_t)(end - to);
    s->len -= dropped;
    s->held -= dropped;
}
