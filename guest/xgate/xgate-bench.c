/* In-guest XGates microbenchmark (`paracell bench xgate` runs it).
 * `xgate-bench micro N ROUNDS`: ns per call of getpid through the gate, the
 * getpid syscall, clock_gettime through the gate, the vDSO and the
 * syscall, and a one-byte pipe round trip to another process; ROUNDS
 * interleaved rounds of N calls each, one line per round and variant.
 * `xgate-bench idloop N`: N rounds of glibc's getpid/getppid/getuid/
 * geteuid/getgid/getegid/gettid (syscall-heavy, for LD_PRELOAD runs).
 * `xgate-bench run CMD ARG...` (the static build, so that LD_PRELOAD reaches only CMD): runs CMD (its environment passed on) and
 * prints `run NS` (wall time, fork to exit), then CMD's exit status. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "xgate.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static volatile long sink;

static void gate(long n) { for (long i = 0; i < n; i++) sink += xgate_getpid(); }
static void sys_getpid(long n) { for (long i = 0; i < n; i++) sink += syscall(SYS_getpid); }
static void gate_time(long n)
{
    struct timespec ts;
    for (long i = 0; i < n; i++) {
        xgate_clock_gettime(CLOCK_MONOTONIC, &ts);
        sink += ts.tv_nsec;
    }
}
static void vdso_time(long n)
{
    struct timespec ts;
    for (long i = 0; i < n; i++) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        sink += ts.tv_nsec;
    }
}
static void sys_time(long n)
{
    struct timespec ts;
    for (long i = 0; i < n; i++) {
        syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
        sink += ts.tv_nsec;
    }
}

static int to_echo[2], from_echo[2];
static void pipe_rt(long n)
{
    char b = 0;
    for (long i = 0; i < n; i++)
        if (write(to_echo[1], &b, 1) != 1 || read(from_echo[0], &b, 1) != 1)
            exit(3);
}

static void micro(long n, int rounds)
{
    static const struct { const char *name; void (*fn)(long); } v[] = {
        {"gate getpid", gate},
        {"syscall getpid", sys_getpid},
        {"gate clock_gettime", gate_time},
        {"vdso clock_gettime", vdso_time},
        {"syscall clock_gettime", sys_time},
        {"pipe round trip", pipe_rt},
    };
    if (pipe(to_echo) < 0 || pipe(from_echo) < 0)
        exit(3);
    pid_t echo = fork();
    if (echo == 0) {
        char b;
        close(to_echo[1]);
        close(from_echo[0]);
        while (read(to_echo[0], &b, 1) == 1 && write(from_echo[1], &b, 1) == 1)
            ;
        _exit(0);
    }
    printf("gate_available %d\n", xgate_available());
    for (int r = 0; r < rounds; r++)
        for (unsigned i = 0; i < sizeof v / sizeof v[0]; i++) {
            long calls = strcmp(v[i].name, "pipe round trip") ? n : n / 10 + 1;
            double t0 = now_ns();
            v[i].fn(calls);
            printf("round %d %s %.1f\n", r, v[i].name, (now_ns() - t0) / (double)calls);
        }
    close(to_echo[1]);
    close(from_echo[0]);
    waitpid(echo, NULL, 0);
}

static void idloop(long n)
{
    double t0 = now_ns();
    for (long i = 0; i < n; i++)
        sink += getpid() + getppid() + (long)getuid() + (long)geteuid() + (long)getgid() +
                (long)getegid() + gettid();
    printf("idloop %.1f ns per round of 7 calls\n", (now_ns() - t0) / (double)n);
}

static int run(char **cmd)
{
    double t0 = now_ns();
    pid_t pid = fork();
    if (pid == 0) {
        execvp(cmd[0], cmd);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return 1;
    printf("run %.0f status %d\n", now_ns() - t0, WIFEXITED(st) ? WEXITSTATUS(st) : 128);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 3 && !strcmp(argv[1], "run"))
        return run(argv + 2);
    if (argc == 4 && !strcmp(argv[1], "micro"))
        micro(atol(argv[2]), atoi(argv[3]));
    else if (argc == 3 && !strcmp(argv[1], "idloop"))
        idloop(atol(argv[2]));
    else {
        fprintf(stderr, "usage: xgate-bench micro N ROUNDS | idloop N | run CMD ARG...\n");
        return 2;
    }
    return 0;
}
