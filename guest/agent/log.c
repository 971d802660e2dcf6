#define _GNU_SOURCE
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LOGHOST_BURST 20
#define LOGHOST_WINDOW_MS 10000

size_t text_oneline(char *dst, const char *src, size_t cap)
{
    size_t n = strnlen(src, cap);
    for (size_t i = 0; i < n; i++)
        dst[i] = (unsigned char)src[i] < 0x20 || src[i] == 0x7f ? '?' : src[i];
    return n;
}

void logmsg(const char *fmt, ...)
{
    static const char prefix[] = "paracell-agent: ";
    char msg[768 - sizeof prefix], line[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(line, prefix, sizeof prefix - 1);
    size_t n = sizeof prefix - 1 + text_oneline(line + sizeof prefix - 1, msg, sizeof msg - 1);
    line[n++] = '\n';
    /* One write per line keeps lines whole on the console. */
    if (write(2, line, n) < 0) {
        /* No console: nothing else to report to. */
    }
}

long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void loghost(const char *fmt, ...)
{
    static long long window;
    static unsigned count, dropped;
    char buf[ERRTEXT_MAX];
    va_list ap;
    long long now = now_ms();
    if (now - window >= LOGHOST_WINDOW_MS) {
        if (dropped)
            logmsg("%u more messages about bad requests were not logged", dropped);
        window = now;
        count = dropped = 0;
    }
    if (count >= LOGHOST_BURST) {
        dropped++;
        return;
    }
    count++;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    logmsg("%s", buf);
}
