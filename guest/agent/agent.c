/* ParaCell guest agent: PID 1 of the micro-VM.
 *
 * Boots the guest's minimal userspace, finds the agent port, then runs one
 * poll() loop that moves frames between the port and the container's
 * processes.  Nothing here may crash or exit: the death of PID 1 panics the
 * guest, so every bad input is logged and dropped instead. */
#include "agent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/io.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PORT_NAME PC_AGENT_PORT_NAME
#define ROOTFS PC_ROOTFS_DIR
#define HOSTSHARE PC_HOSTSHARE_DIR
/* access=client: the guest kernel checks permissions for the container's
 * uids itself, whatever user QEMU runs as on the host. */
#define SHARE_OPTS "trans=virtio,version=9p2000.L,msize=262144,cache=mmap,access=client"
/* QEMU's isa-debug-exit; QEMU exits with status (value << 1) | 1. */
#define DEBUG_EXIT_PORT PC_DEBUG_EXIT_PORT
#define POWEROFF_WAIT_MS 5000
/* After the container ended, a host that takes nothing for this long is gone. */
#define STUCK_OUTPUT_MS 30000
/* Each frame answered may queue one control frame of at most this size. */
#define FRAME_ROOM (16u * 1024)
/* A misbehaving host must not flood the console (slow under TCG). */
#define LOGHOST_BURST 20
#define LOGHOST_WINDOW_MS 10000
/* Frames examined behind a blocked one per round: bounds the work when the
 * buffer holds many tiny frames. */
#define MAX_LOOKAHEAD 256

void logmsg(const char *fmt, ...)
{
    char buf[768];
    va_list ap;
    int n = snprintf(buf, sizeof buf, "paracell-agent: ");
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    /* Messages may quote host or container input: keep them one line. */
    for (int i = 0; i < n; i++)
        if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f)
            buf[i] = '?';
    buf[n++] = '\n';
    /* One write per line keeps lines whole on the console. */
    if (write(2, buf, (size_t)n) < 0) {
        /* No console: nothing else to report to. */
    }
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void loghost(const char *fmt, ...)
{
    static long long window;
    static unsigned count, dropped;
    char buf[512];
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

static void power_off(unsigned code) __attribute__((noreturn));

static void power_off(unsigned code)
{
    sync();
    if (ioperm(DEBUG_EXIT_PORT, 4, 1) == 0)
        outl(code, DEBUG_EXIT_PORT);
    /* Without the debug-exit device: a real power-off if the machine has
     * one, else a reboot, which -no-reboot turns into QEMU exiting. */
    logmsg("isa-debug-exit did not stop the VM; trying reboot()");
    reboot(RB_POWER_OFF);
    reboot(RB_AUTOBOOT);
    for (;;)
        pause();
}

/* ---- boot ---- */

static void mount_fs(const char *src, const char *dst, const char *type, unsigned long flags,
                     const char *data)
{
    if (mkdir(dst, 0755) < 0 && errno != EEXIST)
        logmsg("mkdir %s: %s", dst, strerror(errno));
    if (mount(src, dst, type, flags, data) < 0 && errno != EBUSY)
        logmsg("mount %s: %s", dst, strerror(errno));
}

/* pivot_root cannot move the initramfs (its mount has no parent), and the
 * container needs pivot_root to leave nothing of the agent reachable.  So the
 * agent first moves itself onto a tmpfs, as switch_root does. */
static void leave_initramfs(void)
{
    if (mkdir("/newroot", 0755) < 0 && errno != EEXIST)
        goto fail;
    if (mount("tmpfs", "/newroot", "tmpfs", MS_NOSUID, "mode=0755") < 0 || chdir("/newroot") < 0)
        goto fail;
    /* Frees the initramfs copy of this binary; the running image stays. */
    unlink("/init");
    if (mount(".", "/", NULL, MS_MOVE, NULL) < 0 || chroot(".") < 0 || chdir("/") < 0)
        goto fail;
    return;
fail:
    logmsg("cannot move off the initramfs (%s); containers will fail to pivot_root", strerror(errno));
    if (chdir("/") < 0) {
        /* Already at the root. */
    }
}

/* The kernel leaves 0-2 closed when the initramfs has no /dev/console; the
 * first pipe would then become someone's stdio. */
static void ensure_stdio(void)
{
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) >= 0)
            continue;
        int c = open("/dev/console", O_RDWR | O_NOCTTY);
        if (c < 0)
            c = open("/dev/null", O_RDWR);
        if (c >= 0 && c != fd) {
            dup2(c, fd);
            close(c);
        }
    }
}

static void read_cap_last_cap(void)
{
    char buf[16] = "";
    int fd = open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        int v = n > 0 ? atoi(buf) : 0;
        if (v > 0 && v < 64)
            cap_last_cap = v;
    }
}

static void boot(void)
{
    umask(022);
    if (getpid() == 1)
        leave_initramfs();
    mount_fs("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount_fs("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount_fs("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
    ensure_stdio();
    /* Our own instance: container ptys come from here, and the container's
     * devpts mounts (newinstance too) cannot see or reuse them. */
    mount_fs("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
    mkdir(ROOTFS, 0755);
    mkdir(HOSTSHARE, 0755);
    read_cap_last_cap();
    /* PID 1 gets no default signal actions anyway; EPIPE is what we want. */
    signal(SIGPIPE, SIG_IGN);
}

/* 1 when the kernel command line holds the word `word`. */
static int cmdline_has(const char *word)
{
    char buf[4096];
    int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    size_t wl = strlen(word);
    for (char *p = buf; *p;) {
        p += strspn(p, " \t\n");
        size_t l = strcspn(p, " \t\n");
        if (l == wl && !memcmp(p, word, wl))
            return 1;
        p += l;
    }
    return 0;
}

/* The port's name arrives from QEMU shortly after the device node appears. */
static int open_port(void)
{
    char path[300], name[64], dev[300];
    for (int tries = 0; tries < 100; tries++) {
        DIR *d = opendir("/sys/class/virtio-ports");
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof path, "/sys/class/virtio-ports/%.200s/name", e->d_name);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                continue;
            ssize_t n = read(fd, name, sizeof name - 1);
            close(fd);
            if (n <= 0)
                continue;
            name[n] = 0;
            name[strcspn(name, "\n")] = 0;
            if (strcmp(name, PORT_NAME))
                continue;
            snprintf(dev, sizeof dev, "/dev/%.200s", e->d_name);
            /* Nonblocking is essential: a blocking write spins in the driver
             * until the host has consumed the buffer. */
            fd = open(dev, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
            if (fd >= 0) {
                closedir(d);
                return fd;
            }
        }
        if (d)
            closedir(d);
        usleep(20000);
    }
    return -1;
}

/* ---- frames from the host ---- */

static int port = -1;
/* The driver reports POLLHUP while no host is connected to the socket. */
static int port_down;
static int ever_connected;
static struct spec spec;

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Host directories reach the guest as virtio-9p shares mounted once, in the
 * agent's namespace: the container's root, and (when the host has bind
 * sources outside the rootfs) one share holding a slot per bind source. */
static int mount_share(const char *tag, const char *dir, int *mounted, char *err, size_t errlen)
{
    if (*mounted)
        return 0;
    if (mount(tag, dir, "9p", 0, SHARE_OPTS) < 0) {
        snprintf(err, errlen, "mount %s: %s", tag, strerror(errno));
        return -1;
    }
    *mounted = 1;
    return 0;
}

static int uses_hostshare(const struct spec *s)
{
    size_t n = strlen(HOSTSHARE);
    for (int i = 0; i < s->nmounts; i++)
        if (!strncmp(s->mounts[i].source, HOSTSHARE, n) &&
            (s->mounts[i].source[n] == '/' || !s->mounts[i].source[n]))
            return 1;
    return 0;
}

static int mount_shares(const struct spec *s, char *err, size_t errlen)
{
    static int rootfs_mounted, hostshare_mounted;
    if (mount_share(PC_ROOTFS_TAG, ROOTFS, &rootfs_mounted, err, errlen) < 0)
        return -1;
    if (uses_hostshare(s) && mount_share(PC_HOSTSHARE_TAG, HOSTSHARE, &hostshare_mounted, err, errlen) < 0)
        return -1;
    return 0;
}

static void handle_spec(const struct frame *f)
{
    char err[ERRTEXT_MAX] = "";
    int pid = -1;
    if (spec_parse((char *)f->payload, f->len, &spec, err, sizeof err) == 0 &&
        (f->chan != 0 || mount_shares(&spec, err, sizeof err) == 0))
        pid = proc_spawn(f->chan, &spec, err, sizeof err);
    if (pid > 0) {
        uint32_t v = (uint32_t)pid;
        unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                              (unsigned char)(v >> 24)};
        chan_send(PC_CREATED, f->chan, b, sizeof b);
        return;
    }
    if (!err[0])
        snprintf(err, sizeof err, "process setup failed");
    loghost("chan %u: %s", f->chan, err);
    chan_send_text(PC_ERROR, f->chan, err);
}

/* 1 when the frame must wait (its stdin buffer is full), else 0. */
static int dispatch(const struct frame *f)
{
    const unsigned char *p = f->payload;
    if (f->chan > PC_MAX_CHAN) {
        loghost("protocol: frame type %u for chan %u out of range", f->type, f->chan);
        return 0;
    }
    switch (f->type) {
    case PC_SPEC:
        handle_spec(f);
        break;
    case PC_START:
        proc_start(f->chan);
        break;
    case PC_STDIN:
        return proc_stdin(f->chan, p, f->len);
    case PC_SIGNAL:
        if (f->len != 8)
            loghost("protocol: SIGNAL with %u bytes", f->len);
        else
            proc_signal(f->chan, le32(p), le32(p + 4));
        break;
    case PC_RESIZE:
        if (f->len != 4)
            loghost("protocol: RESIZE with %u bytes", f->len);
        else
            proc_resize(f->chan, (unsigned)(p[0] | p[1] << 8), (unsigned)(p[2] | p[3] << 8));
        break;
    case PC_POWEROFF:
        power_off(0);
    default:
        loghost("protocol: unknown frame type %u (chan %u, %u bytes)", f->type, f->chan, f->len);
    }
    return 0;
}

/* Frames are handled in order, except that a STDIN frame whose process's
 * buffer is full blocks only its own channel: later frames for other
 * channels, and control frames (START, SIGNAL, RESIZE, POWEROFF) for any
 * channel, go ahead, so a process that never reads its stdin can still be
 * signalled.  Within one channel, STDIN and SPEC keep their order. */
static void process_frames(void)
{
    static unsigned char blocked[(PC_MAX_CHAN + 1 + 7) / 8];
    struct frame f;
    size_t pos = 0;
    int nblocked = 0, scanned = 0;

    while (outq_free() >= FRAME_ROOM && scanned < MAX_LOOKAHEAD && inq_frame_at(pos, &f)) {
        size_t next = pos + PC_HDR_LEN + f.len;
        int in_order = f.type == PC_STDIN || f.type == PC_SPEC;
        int chan_ok = f.chan <= PC_MAX_CHAN;
        if (pos)
            scanned++;
        if (f.type == 0) {
            /* already handled out of order */
        } else if (in_order && chan_ok && (blocked[f.chan / 8] >> (f.chan % 8) & 1)) {
            pos = next;
            continue;
        } else if (dispatch(&f)) {
            blocked[f.chan / 8] |= (unsigned char)(1u << (f.chan % 8));
            nblocked++;
            pos = next;
            continue;
        }
        if (pos) {
            inq_mark_done(&f);
            pos = next;
        } else {
            inq_consume_head(&f);
        }
    }
    if (nblocked)
        memset(blocked, 0, sizeof blocked);
}

static void host_down(void)
{
    if (!port_down && ever_connected)
        logmsg("host disconnected from the agent port");
    port_down = 1;
}

static void read_port(void)
{
    while (inq_has_room()) {
        ssize_t n = inq_fill(port);
        if (n > 0)
            continue;
        if (n == 0)
            host_down();
        else if (errno != EAGAIN)
            logmsg("read agent port: %s", strerror(errno));
        return;
    }
}

static void check_port_up(void)
{
    struct pollfd q = {port, POLLOUT, 0};
    if (poll(&q, 1, 0) == 1 && (q.revents & POLLHUP))
        return;
    if (ever_connected)
        logmsg("host reconnected to the agent port");
    ever_connected = 1;
    port_down = 0;
    /* A frame cut off by the disconnect would misparse everything after it. */
    inq_reset();
}

static void flush_port(long long *progress)
{
    size_t before = outq_pending();
    if (outq_flush(port) < 0)
        logmsg("write agent port: %s", strerror(errno));
    if (outq_pending() != before)
        *progress = now_ms();
}

/* ---- main loop ---- */

static struct pollfd pfd[2 + 4 * (PC_MAX_CHAN + 1)];

static void run(int sfd)
{
    long long idle_since = 0, progress = now_ms();
    port_down = 1;

    for (;;) {
        int n = 0, port_idx = -1, timeout = -1;

        if (port_down)
            check_port_up();
        pfd[n++] = (struct pollfd){sfd, POLLIN, 0};
        if (!port_down) {
            short ev = 0;
            if (inq_has_room() && outq_free() >= FRAME_ROOM)
                ev |= POLLIN;
            if (outq_pending())
                ev |= POLLOUT;
            port_idx = n;
            pfd[n++] = (struct pollfd){port, ev, 0};
        } else {
            timeout = 50;
        }
        n = proc_poll_prepare(pfd, n, (int)(sizeof pfd / sizeof pfd[0]));

        /* The container is over: wait for POWEROFF, but not forever. */
        if (proc_init_gone() && !proc_active()) {
            long long now = now_ms();
            if (outq_pending()) {
                idle_since = 0;
                if (now - progress >= STUCK_OUTPUT_MS) {
                    logmsg("host stopped reading; powering off with output unsent");
                    power_off(0);
                }
                if (timeout < 0 || timeout > 1000)
                    timeout = 1000;
            } else {
                if (!idle_since)
                    idle_since = now;
                long long left = idle_since + POWEROFF_WAIT_MS - now;
                if (left <= 0)
                    power_off(0);
                if (timeout < 0 || timeout > left)
                    timeout = (int)left;
            }
        }

        if (poll(pfd, (nfds_t)n, timeout) < 0) {
            if (errno != EINTR) {
                logmsg("poll: %s", strerror(errno));
                usleep(10000);
            }
            continue;
        }

        if (pfd[0].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0)
                ;
            proc_reap();
        }
        if (port_idx >= 0 && pfd[port_idx].revents) {
            short re = pfd[port_idx].revents;
            if (re & POLLOUT)
                flush_port(&progress);
            if (re & (POLLIN | POLLHUP | POLLERR))
                read_port();
            /* Frames already received still count, e.g. a POWEROFF sent just
             * before the host closed its end. */
            if (re & (POLLHUP | POLLERR))
                host_down();
        }
        proc_poll_handle(pfd, n);
        process_frames();
        proc_collect();
        /* Push new output now rather than one poll round later. */
        if (!port_down && outq_pending())
            flush_port(&progress);
    }
}

int main(void)
{
    sigset_t mask;

    boot();
    /* SIGCHLD arrives through the loop, never as an interruption. */
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0 || chan_init() < 0) {
        logmsg("cannot set up: %s", strerror(errno));
        power_off(1);
    }
    port = open_port();
    if (port < 0) {
        logmsg("no virtio-serial port named %s", PORT_NAME);
        power_off(1);
    }
    struct timespec up;
    clock_gettime(CLOCK_BOOTTIME, &up);
    logmsg("ready, %ld.%03ld s after kernel start", (long)up.tv_sec, up.tv_nsec / 1000000);
    /* For timing a bare boot of this kernel and initramfs: no host needed. */
    if (cmdline_has("paracell.exit_on_boot=1"))
        power_off(0);
    chan_send(PC_READY, 0, AGENT_VERSION, strlen(AGENT_VERSION));
    run(sfd);
}
