/* fwdpeer: the server end of the port-forwarding tests (tests/integration/
 * test_portforward.py), run inside the container, on its loopback only.
 *
 *   fwdpeer PORT   listens on 127.0.0.1 and ::1, at PORT and PORT+1, and
 *                  serves every connection in a child of its own:
 *
 * PORT, echo: sends back every byte it reads; at the client's EOF (a
 *   half-close) it sends "done N\n", N the bytes echoed, and closes.
 * PORT+1, server half-close: sends PATTERN_BYTES bytes of a pattern (byte i
 *   is i % 251), shuts its side down for writing, reads until the client's
 *   EOF, appends "got N FNV\n" (N bytes, their 64-bit FNV-1a in hex) to
 *   /tmp/fwdpeer-got, and closes.
 *
 * Every socket has a timeout, so a stuck peer ends its child with an error. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define PATTERN_BYTES (1 << 20)
#define IO_TIMEOUT_S 60
#define GOT_FILE "/tmp/fwdpeer-got"

static char buf[64 * 1024];

static void die(const char *what)
{
    fprintf(stderr, "fwdpeer: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Bytes read into buf, 0 at the client's EOF. */
static size_t recv_some(int fd)
{
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n >= 0)
            return (size_t)n;
        if (errno != EINTR)
            die("recv");
    }
}

static void echo(int fd)
{
    unsigned long long total = 0;
    for (size_t n; (n = recv_some(fd)) > 0;) {
        if (send_all(fd, buf, n) < 0)
            die("send");
        total += (unsigned long long)n;
    }
    int len = snprintf(buf, sizeof buf, "done %llu\n", total);
    if (send_all(fd, buf, (size_t)len) < 0)
        die("send");
}

static void shut_first(int fd)
{
    for (size_t sent = 0; sent < PATTERN_BYTES;) {
        size_t n = PATTERN_BYTES - sent < sizeof buf ? PATTERN_BYTES - sent : sizeof buf;
        for (size_t i = 0; i < n; i++)
            buf[i] = (char)((sent + i) % 251);
        if (send_all(fd, buf, n) < 0)
            die("send");
        sent += n;
    }
    if (shutdown(fd, SHUT_WR) < 0)
        die("shutdown");
    unsigned long long total = 0;
    uint64_t hash = 0xcbf29ce484222325ull;
    for (size_t n; (n = recv_some(fd)) > 0;) {
        for (size_t i = 0; i < n; i++)
            hash = (hash ^ (unsigned char)buf[i]) * 0x100000001b3ull;
        total += (unsigned long long)n;
    }
    int out = open(GOT_FILE, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out < 0)
        die("open " GOT_FILE);
    int len = snprintf(buf, sizeof buf, "got %llu %016llx\n", total, (unsigned long long)hash);
    if (write(out, buf, (size_t)len) != len)
        die("write " GOT_FILE);
    close(out);
}

static int listener(int family, int port)
{
    int one = 1;
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die("socket");
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port),
                              .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    if (family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    int rc = family == AF_INET ? bind(fd, (struct sockaddr *)&a4, sizeof a4)
                               : bind(fd, (struct sockaddr *)&a6, sizeof a6);
    if (rc < 0 || listen(fd, 64) < 0)
        die("listen");
    return fd;
}

int main(int argc, char **argv)
{
    if (argc != 2 || atoi(argv[1]) < 1 || atoi(argv[1]) > 65534) {
        fprintf(stderr, "usage: fwdpeer PORT\n");
        return 2;
    }
    int port = atoi(argv[1]);
    signal(SIGCHLD, SIG_IGN); /* children are reaped by the kernel */
    struct pollfd pfd[4];
    for (int i = 0; i < 4; i++)
        pfd[i] = (struct pollfd){listener(i % 2 ? AF_INET6 : AF_INET, port + i / 2), POLLIN, 0};
    printf("fwdpeer listening on %d and %d\n", port, port + 1);
    fflush(stdout);
    for (;;) {
        if (poll(pfd, 4, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("poll");
        }
        for (int i = 0; i < 4; i++) {
            if (!(pfd[i].revents & POLLIN))
                continue;
            int fd = accept4(pfd[i].fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd < 0)
                continue;
            if (fork() == 0) {
                struct timeval tv = {IO_TIMEOUT_S, 0};
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
                setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
                if (i / 2 == 0)
                    echo(fd);
                else
                    shut_first(fd);
                close(fd);
                _exit(0);
            }
            close(fd);
        }
    }
}
