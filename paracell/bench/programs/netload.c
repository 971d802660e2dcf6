/* netload: the measuring ends of `paracell bench net`, one static binary for
 * both sides, so that ParaCell and runc run exactly the same code.
 *
 *   netload server PORT            on the host side: serves connections one by one
 *   netload stream ADDR PORT SECS  TCP throughput to the server
 *   netload rr ADDR PORT SECS      request/response round trips of one byte
 *
 * stream prints "stream BYTES SECONDS": bytes the server confirmed reading,
 * from the first write to the server's confirmation.  rr prints
 * "rr COUNT SECONDS MEDIAN_US P99_US" (a round trip over 4 s counts as 4 s).  Every loop is bounded by SECS and
 * every socket by a timeout, so a dead peer ends the run with an error. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (128 * 1024)
#define MAX_SAMPLES 1000000
#define IO_TIMEOUT_S 10
#define MAX_SECS 600

static char buf[CHUNK];
static uint32_t samples[MAX_SAMPLES];

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void die(const char *what)
{
    fprintf(stderr, "netload: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void timeouts(int fd)
{
    struct timeval tv = {IO_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static int full(int fd, void *p, size_t n, int writing)
{
    for (size_t done = 0; done < n;) {
        ssize_t r = writing ? write(fd, (char *)p + done, n - done)
                            : read(fd, (char *)p + done, n - done);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        done += (size_t)r;
    }
    return 0;
}

static int port_of(const char *s)
{
    long v = strtol(s, NULL, 10);
    if (v <= 0 || v > 65535) {
        fprintf(stderr, "netload: bad port %s\n", s);
        exit(2);
    }
    return (int)v;
}

static void serve(int conn)
{
    char mode;
    timeouts(conn);
    if (full(conn, &mode, 1, 0))
        return;
    if (mode == 'S') {
        uint64_t total = 0;
        ssize_t r;
        while ((r = read(conn, buf, sizeof buf)) > 0)
            total += (uint64_t)r;
        full(conn, &total, sizeof total, 1);
    } else if (mode == 'R') {
        char b;
        int one = 1;
        setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        while (full(conn, &b, 1, 0) == 0 && full(conn, &b, 1, 1) == 0)
            ;
    }
}

static __attribute__((noreturn)) void server(int port)
{
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (fd < 0)
        die("socket");
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 16))
        die("bind");
    printf("listening %d\n", port);
    fflush(stdout);
    for (;;) {
        int conn = accept(fd, NULL, NULL);
        if (conn < 0) {
            if (errno == EINTR)
                continue;
            die("accept");
        }
        serve(conn);
        close(conn);
    }
}

static int dial(const char *addr, int port, char mode)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        die("socket");
    if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
        fprintf(stderr, "netload: bad address %s\n", addr);
        exit(2);
    }
    timeouts(fd);
    if (connect(fd, (struct sockaddr *)&a, sizeof a))
        die("connect");
    if (full(fd, &mode, 1, 1))
        die("write");
    return fd;
}

static int by_value(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "server"))
        server(port_of(argv[2]));
    if (argc != 5 || (strcmp(argv[1], "stream") && strcmp(argv[1], "rr"))) {
        fprintf(stderr, "usage: netload server PORT | stream|rr ADDR PORT SECS\n");
        return 2;
    }
    double secs = strtod(argv[4], NULL);
    if (!(secs > 0 && secs <= MAX_SECS)) {
        fprintf(stderr, "netload: SECS must be in (0, %d]\n", MAX_SECS);
        return 2;
    }
    int port = port_of(argv[3]);
    if (!strcmp(argv[1], "stream")) {
        int fd = dial(argv[2], port, 'S');
        uint64_t confirmed = 0;
        double began = now(), end = began + secs;
        memset(buf, 'x', sizeof buf);
        while (now() < end)
            if (full(fd, buf, sizeof buf, 1))
                die("write");
        shutdown(fd, SHUT_WR);
        if (full(fd, &confirmed, sizeof confirmed, 0))
            die("read the server's count");
        printf("stream %llu %.6f\n", (unsigned long long)confirmed, now() - began);
        return 0;
    }
    int fd = dial(argv[2], port, 'R'), one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    size_t n = 0;
    char b = 'r';
    double began = now(), end = began + secs;
    while (n < MAX_SAMPLES) {
        double t = now();
        if (t >= end)
            break;
        if (full(fd, &b, 1, 1) || full(fd, &b, 1, 0))
            die("round trip");
        double ns = (now() - t) * 1e9;
        samples[n++] = ns > 4e9 ? 4000000000u : (uint32_t)ns;
    }
    double took = now() - began;
    qsort(samples, n, sizeof samples[0], by_value);
    printf("rr %zu %.6f %.3f %.3f\n", n, took, n ? samples[n / 2] / 1e3 : 0.0,
           n ? samples[n * 99 / 100] / 1e3 : 0.0);
    return 0;
}
