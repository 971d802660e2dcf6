/* A snapshot test's container init (tests/integration/test_checkpoints.py):
 * MIB of memory filled with a pattern of `seed`, and /data holding the seed.
 * SIGUSR1 moves both to seed+1. Every change ends with /report rewritten
 * (atomically): the seed in memory, whether the whole buffer is still that
 * seed's pattern, /data's content, the pid, and the targets of its open fds. */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t bump;
static uint32_t *buf;
static size_t words;
static unsigned seed = 1;

static uint32_t pattern(unsigned s, size_t i)
{
    uint64_t x = (s * 0x9e3779b97f4a7c15ull) ^ (i * 0xbf58476d1ce4e5b9ull);
    x ^= x >> 31;
    return (uint32_t)x;
}

static void fill(void)
{
    for (size_t i = 0; i < words; i++)
        buf[i] = pattern(seed, i);
}

static int intact(void)
{
    for (size_t i = 0; i < words; i++)
        if (buf[i] != pattern(seed, i))
            return 0;
    return 1;
}

static void put(const char *path, const char *text)
{
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    fputs(text, f);
    fclose(f);
    rename(tmp, path);
}

static void append(char *to, size_t cap, const char *what)
{
    strncat(to, what, cap - strlen(to) - 1);
}

static void report(void)
{
    char data[64] = "", fds[512] = "", line[800], link[300], path[64];
    FILE *f = fopen("/data", "r");
    if (f) {
        if (!fgets(data, sizeof data, f))
            data[0] = 0;
        fclose(f);
    }
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n < 0)
            continue;
        link[n] = 0;
        if (strstr(link, "/proc/") || strstr(link, "pipe:") || strstr(link, "socket:"))
            continue;
        append(fds, sizeof fds, e->d_name);
        append(fds, sizeof fds, "=");
        append(fds, sizeof fds, link);
        append(fds, sizeof fds, ",");
    }
    if (d)
        closedir(d);
    snprintf(line, sizeof line, "seed=%u mem=%s data=%s pid=%d fds=%s\n", seed,
             intact() ? "ok" : "BAD", data, getpid(), fds);
    put("/report", line);
}

static void on_usr1(int s)
{
    (void)s;
    bump = 1;
}

int main(int argc, char **argv)
{
    char text[32];
    words = (size_t)atoi(argc > 1 ? argv[1] : "16") * 1024 * 1024 / 4;
    buf = malloc(words * 4);
    FILE *kept = fopen("/kept", "w"); /* an fd that must survive a rollback */
    (void)kept;
    signal(SIGUSR1, on_usr1);
    fill();
    snprintf(text, sizeof text, "%u", seed);
    put("/data", text);
    report();
    for (;;) {
        pause();
        if (!bump)
            continue;
        bump = 0;
        seed++;
        fill();
        snprintf(text, sizeof text, "%u", seed);
        put("/data", text);
        report();
    }
}
