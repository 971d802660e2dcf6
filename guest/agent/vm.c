#define _GNU_SOURCE
#include "vm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/io.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <unistd.h>

#include "caps.h"
#include "cgroup.h"
#include "log.h"
#include "vm_proto.h"

/* access=client: the guest kernel checks permissions for the container's
 * uids itself, whatever user QEMU runs as on the host. */

void vm_power_off(unsigned code)
{
    sync();
    if (ioperm(PC_DEBUG_EXIT_PORT, 4, 1) == 0)
        outl(code, PC_DEBUG_EXIT_PORT);
    /* Without the debug-exit device: a real power-off if the machine has
     * one, else a reboot, which -no-reboot turns into QEMU exiting. */
    logmsg("isa-debug-exit did not stop the VM; trying reboot()");
    reboot(RB_POWER_OFF);
    reboot(RB_AUTOBOOT);
    for (;;)
        pause();
}

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

void vm_boot(void)
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
    mkdir(PC_ROOTFS_DIR, 0755);
    mkdir(PC_HOSTSHARE_DIR, 0755);
    mkdir(PC_PODSHARE_DIR, 0755);
    caps_init();
    cg_init();
    /* PID 1 gets no default signal actions anyway; EPIPE is what we want. */
    signal(SIGPIPE, SIG_IGN);
}

int vm_cmdline_has(const char *word)
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
int vm_open_port(void)
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
            if (strcmp(name, PC_AGENT_PORT_NAME))
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

