/* paracell-vmshim: what a VM's shim becomes once its container's process is
 * created and the create has recorded its pid. The Python shim boots or
 * restores the VM and attaches the sandbox (runtime/vm/shim.py), then execs
 * this, keeping its pid, its fds, its blocked signals and QEMU as its child.
 * For the rest of the container's life the host holds a relay of a few
 * hundred KiB instead of a second Python process per VM. A shim that runs
 * Python for the VM's life (a Pager thread, the checkpoint service) never
 * execs this. Interfaces that appear before `start` are mirrored by a
 * short-lived Python child at `start`, as the Python shim's netlink child does.
 *
 * argv: AGENT_FD LISTEN_FD TTY_FD ABORT_FD QEMU_PID FWD4 FWD6 FWD_LINK
 *       FORWARD_MASK LOG_FD LOG_FORMAT DEBUG CONTROL_SOCKET NET_RECORD TAP_PREFIX PYTHON
 *       LEASE_FD
 *   AGENT_FD      the VM's agent port
 *   LISTEN_FD     the container's control socket (start, kill, execs, queries)
 *   TTY_FD        the host pty slave to relay, or -1 for fds 0-2
 *   ABORT_FD      readable when the Pager in QEMU stopped, or -1
 *   QEMU_PID      QEMU, this process's child
 *   FWD4 FWD6 FWD_LINK  port forwarding's listeners and link (csrc/portfwd.h), or -1
 *   FORWARD_MASK  bit n: relay signal n to the container
 *   LOG_FD        the runtime's --log, opened for appending, or -1
 *   LOG_FORMAT    "json" or "text", as paracell/log.py writes them
 *   DEBUG         1: --debug, so the relay's end is logged too
 *   CONTROL_SOCKET  removed at the end
 *   NET_RECORD    a VM whose namespace may gain interfaces before `start`: its
 *                 network record (paracell/net/late.py); "-" for none
 *   TAP_PREFIX    the name of our TAPs: with only those and lo in the
 *                 namespace, START carries nothing
 *   PYTHON        the interpreter that runs paracell.net.latestart otherwise
 *   LEASE_FD      a pooled VM's lease (docs/pool.md): the VM powers off when its
 *                 holder is gone; -1 for a VM of a container's own
 *
 * Ends as the Python shim ends (Shim.relay and Shim.shutdown): with the
 * container's status; 137 when QEMU was killed; 255, with the reason in the
 * log, when the VM broke down or broke the protocol. What the devices hold on
 * the host (TAP mirrors, mounts, the RAM file) is recorded in the state, and
 * `delete` reclaims it from there, as it does after a shim that died. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent_proto.h"
#include "execargs.h"
#include "latenet.h"
#include "relay.h"

#define EXIT_USAGE 255
#define EXIT_RUNTIME_ERROR 255
#define EXIT_VM_DIED (128 + 9)
#define HANGUP_GRACE_MS 1000
#define POWEROFF_GRACE_MS 5000

/* QEMU's end as Python's Popen.wait gives it: its exit code, or minus the
 * signal that ended it. Waits up to grace_ms, then kills it. */
static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int stop_qemu(pid_t pid, int grace_ms)
{
    int status = 0;
    long long deadline = now_ms() + grace_ms;
    for (;;) {
        pid_t got = waitpid(pid, &status, WNOHANG);
        if (got == pid) break;
        if (got < 0 && errno != EINTR) return 0;  /* reaped already: as Popen.wait says */
        if (now_ms() >= deadline) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
            break;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

/* POWEROFF, unless the guest stopped reading: a full channel must not keep
 * the shim, and so QEMU, alive. */
static void send_poweroff(int agent)
{
    struct pollfd p = {.fd = agent, .events = POLLOUT};
    if (poll(&p, 1, 1000) == 1 && (p.revents & POLLOUT))
        pc_send_frame(agent, PC_POWEROFF, 0, NULL, 0);
}

struct log {
    int fd;
    int json;
    int debug;
};

/* One line in the runtime's log, as RuntimeLog.write writes it. */
static void log_line(const struct log *log, const char *level, const char *fmt, ...)
{
    if (log->fd < 0 || (!log->debug && strcmp(level, "debug") == 0)) return;
    int fd = log->fd;
    char msg[512], escaped[1100], when[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* As RuntimeLog._tell and json.dumps write it: \r and \n as two
     * characters, so the message is one line whatever its text; in JSON,
     * quotes, backslashes and control characters escaped. Bytes past ASCII
     * become '?': a UTF-8 sequence that vsnprintf cut would be invalid. */
    size_t j = 0;
    for (const unsigned char *p = (const unsigned char *)msg; *p && j + 8 < sizeof escaped; p++) {
        int json_escape = log->json && (*p == '"' || *p == '\\');
        if (*p == '\n' || *p == '\r') {
            if (log->json) escaped[j++] = '\\';
            escaped[j++] = '\\';
            escaped[j++] = *p == '\n' ? 'n' : 'r';
        } else if (*p >= 0x80) {
            escaped[j++] = '?';
        } else if (json_escape) {
            escaped[j++] = '\\';
            escaped[j++] = (char)*p;
        } else if (*p < 0x20 && log->json) {
            j += (size_t)snprintf(escaped + j, sizeof escaped - j, "\\u%04x", *p);
        } else {
            escaped[j++] = (char)*p;
        }
    }
    escaped[j] = '\0';
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    if (log->json)
        dprintf(fd, "{\"level\": \"%s\", \"msg\": \"%s\", \"time\": \"%s.%09ldZ\"}\n",
                level, escaped, when, now.tv_nsec);
    else
        dprintf(fd, "time=\"%s.%09ldZ\" level=%s msg=\"%s\"\n", when, now.tv_nsec, level,
                escaped);
}

static int readable(int fd)
{
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

int main(int argc, char **argv)
{
    long long agent, listen_fd, tty, abort_fd, qemu, fwd4, fwd6, link, log_fd, debug, lease;
    unsigned long long mask;
    if (argc != 18 || pc_arg_long(argv[1], 0, INT_MAX, &agent) ||
        pc_arg_long(argv[2], 0, INT_MAX, &listen_fd) || pc_arg_long(argv[3], -1, INT_MAX, &tty) ||
        pc_arg_long(argv[4], -1, INT_MAX, &abort_fd) || pc_arg_long(argv[5], 1, INT_MAX, &qemu) ||
        pc_arg_long(argv[6], -1, INT_MAX, &fwd4) || pc_arg_long(argv[7], -1, INT_MAX, &fwd6) ||
        pc_arg_long(argv[8], -1, INT_MAX, &link) || pc_arg_long(argv[10], -1, INT_MAX, &log_fd) ||
        pc_arg_long(argv[12], 0, 1, &debug) || pc_arg_mask(argv[9], &mask) ||
        pc_arg_long(argv[17], -1, INT_MAX, &lease)) {
        fprintf(stderr, "paracell-vmshim: usage: AGENT_FD LISTEN_FD TTY_FD ABORT_FD QEMU_PID "
                        "FWD4 FWD6 FWD_LINK FORWARD_MASK LOG_FD LOG_FORMAT DEBUG CONTROL_SOCKET "
                        "NET_RECORD TAP_PREFIX PYTHON LEASE_FD\n");
        return EXIT_USAGE;
    }
    struct log log = {(int)log_fd, strcmp(argv[11], "json") == 0, (int)debug};
    /* Whatever the exec'ing shim left: a write to a gone reader is an error
     * to the relay, not the end of the VM; QEMU's exit is waited for. */
    signal(SIGPIPE, SIG_IGN);
    signal(SIGCHLD, SIG_DFL);

    struct pc_fwd_listeners fwd = {(int)fwd4, (int)fwd6, (int)link};
    struct pc_relay_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.chan_fd = (int)agent;
    cfg.listen_fd = (int)listen_fd;
    cfg.control_fd = -1;
    cfg.abort_fd = (int)abort_fd;
    cfg.lease_fd = (int)lease;
    cfg.forward_mask = mask;
    cfg.fwd = fwd4 >= 0 ? &fwd : NULL;
    pc_late_configure(strcmp(argv[14], "-") == 0 ? NULL : argv[14], argv[15], argv[16]);
    cfg.start_payload = pc_late_payload;
    pc_relay_stdio(&cfg, (int)tty);
    struct pc_relay_result res;
    memset(&res, 0, sizeof res);
    if (pc_relay(&cfg, &res) < 0) {
        res.end = PC_END_ERROR;
        snprintf(res.message, sizeof res.message, "relay setup: out of memory");
    }
    res.message[sizeof res.message - 1] = '\0';
    log_line(&log, "debug", "shim: relay ended: kind %d, status %d, '%s' (paracell-vmshim)",
             res.end, res.status, res.message);

    /* From here on, as Shim.relay decides and Shim.shutdown tears down. */
    int status, untrusted = 0, qemu_done = 0;
    if (readable((int)abort_fd) && res.end != PC_END_EXIT) {
        /* The guest broke the Pager's protocol: it gets no say in its end. */
        untrusted = 1;
        status = EXIT_RUNTIME_ERROR;
        log_line(&log, "error", "the Pager in QEMU stopped (qemu.log says why)");
    } else if (res.end == PC_END_EXIT) {
        status = res.status & 0xFF;
    } else if (res.end == PC_END_RELEASED) {
        status = 0;  /* a pool's VM, ended as its holder asked by leaving */
        log_line(&log, "debug", "shim: %s: powering the VM off", res.message);
    } else if (res.end == PC_END_HANGUP) {
        int code = stop_qemu((pid_t)qemu, HANGUP_GRACE_MS);
        qemu_done = 1;
        status = code == -SIGKILL ? EXIT_VM_DIED : EXIT_RUNTIME_ERROR;
        log_line(&log, "error", "%s (qemu exit %d)", res.message, code);
    } else {
        status = EXIT_RUNTIME_ERROR;
        log_line(&log, "error", "%s", res.message);
    }
    if (cfg.fwd) pc_fwd_detach(&fwd);  /* first: a client is refused, not left waiting */
    if (!untrusted && !qemu_done) send_poweroff((int)agent);
    if (!qemu_done) stop_qemu((pid_t)qemu, untrusted ? 0 : POWEROFF_GRACE_MS);
    close((int)listen_fd);
    unlink(argv[13]);
    return status;
}
