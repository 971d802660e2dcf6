/* START's payload for interfaces that appeared since create (csrc/latenet.h).
 *
 * Only when something other than lo and our TAPs is in the namespace does
 * it run paracell.net.latestart, in a child in this process's namespaces,
 * which mirrors them onto the spares and prints their records: the common
 * case costs one read of /proc/self/net/dev, not a Python start-up. */
#define _GNU_SOURCE
#include "latenet.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* late.start_payload's rule, in C: set once by pc_late_configure. */
static const char *late_record, *late_tap_prefix, *late_python;

void pc_late_configure(const char *record, const char *tap_prefix, const char *python)
{
    late_record = record;
    late_tap_prefix = tap_prefix;
    late_python = python;
}

#define LATE_TIMEOUT_MS 90000  /* paracell.net.netlinkchild allows its child 60 s */

/* Whether the namespace holds nothing but lo and our TAPs (late._only_ours). */
static int only_ours(void)
{
    FILE *f = fopen("/proc/self/net/dev", "re");
    if (!f) return 0;
    char line[512];
    int n = 0, ours = 1;
    size_t plen = strlen(late_tap_prefix);
    while (ours && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (++n <= 2 || !colon) continue;  /* two header lines */
        *colon = '\0';
        char *name = line + strspn(line, " ");
        ours = strcmp(name, "lo") == 0 || strncmp(name, late_tap_prefix, plen) == 0;
    }
    fclose(f);
    return ours;
}

/* START's payload, made here, never a client's bytes. Only a VM whose
 * namespace may gain interfaces before `start` has one, and only when some
 * are there: paracell.net.latestart, in a child in these namespaces, mirrors
 * them onto the spares and prints their records. */
int pc_late_payload(char *buf, int cap)
{
    if (!late_record || only_ours()) return 0;
    int out[2];
    if (pipe2(out, O_CLOEXEC) < 0) {
        snprintf(buf, (size_t)cap, "start: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    int fork_errno = errno;
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        dup2(null, 0);
        dup2(out[1], 1);
        dup2(null, 2);  /* fd 2 is the container's stderr */
        close_range(3, ~0U, 0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execl(late_python, late_python, "-m", "paracell.net.latestart", late_record,
              (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    int len = 0, timed_out = 0;
    long long deadline = now_ms() + LATE_TIMEOUT_MS;
    if (pid > 0) {
        for (;;) {
            struct pollfd p = {.fd = out[0], .events = POLLIN};
            long long left = deadline - now_ms();
            if (left <= 0) {
                timed_out = 1;
                break;
            }
            int ready = poll(&p, 1, (int)left);
            if (ready < 0 && errno == EINTR) continue;
            if (ready <= 0) continue;
            ssize_t got = read(out[0], buf + len, (size_t)(cap - 1 - len));
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) break;
            len += (int)got;
            if (len == cap - 1) {  /* more than START may carry */
                len = cap + 1;
                break;
            }
        }
    }
    close(out[0]);
    if (pid < 0) {
        snprintf(buf, (size_t)cap, "start: fork: %s", strerror(fork_errno));
        return -1;
    }
    if (timed_out || len > cap) kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (len > cap) return len;
    if (timed_out) {
        snprintf(buf, (size_t)cap, "start: the network helper did not answer in %d s",
                 LATE_TIMEOUT_MS / 1000);
        return -1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        buf[len] = '\0';
        if (len == 0 && WIFEXITED(status))
            snprintf(buf, (size_t)cap, "start: the network helper failed (exit %d)",
                     WEXITSTATUS(status));
        else if (len == 0)
            snprintf(buf, (size_t)cap, "start: the network helper was killed by signal %d",
                     WTERMSIG(status));
        return -1;
    }
    return len;
}
