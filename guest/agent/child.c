/* The child side of a container process, from fork to execve.
 *
 * Runs in a copy of the agent, so it must not touch the agent's state, and
 * every failure goes back to the agent as one line on the status pipe (the
 * host shows it as the container's error).  A container's init also builds
 * the container's filesystem view; exec processes join it instead.  Both
 * then share the credential, limit and exec code below. */
#define _GNU_SOURCE
#include "child.h"
#include "../xgate/xgate_abi.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/openat2.h>

#include "caps.h"
#include "copyup.h"
#include "devices.h"
#include "log.h"
#include "userns.h"
#include "vm_proto.h"

/* The kernel's ioprio ABI (linux/ioprio.h is not in every libc's headers). */
#define IOPRIO_CLASS_SHIFT 13
#define IOPRIO_WHO_PROCESS 1
#define AT_RECURSIVE_ 0x8000

/* struct mount_attr of mount_setattr(2); glibc's <sys/mount.h> and
 * <linux/mount.h> do not mix. */
struct mount_attr_ {
    uint64_t attr_set, attr_clr, propagation, userns_fd;
};

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

static const struct child_ctx *ctx;

static void report(const char *fmt, va_list ap)
{
    char buf[ERRTEXT_MAX];
    buf[0] = 'E';
    vsnprintf(buf + 1, sizeof buf - 1, fmt, ap);
    /* One write below PIPE_BUF: the agent reads it whole or not at all. */
    if (write(ctx->status_fd, buf, strlen(buf)) < 0) {
        /* Nobody left to tell. */
    }
}

/* Exit 1 for a setup failure, 127 when execve itself failed (as a shell does). */
static void die_status(int status, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 2, 3)));

static void die_status(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report(fmt, ap);
    va_end(ap);
    _exit(status);
}

#define die(...) die_status(1, __VA_ARGS__)
#define die_exec(...) die_status(127, __VA_ARGS__)

/* ---- filesystem (init only) ---- */

/* Resolution stays inside the container root: a symlink planted in the
 * image cannot send a mount to the guest's own /dev or /proc. */
static int open_in_root(int rootfd, const char *path, int flags)
{
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = (uint64_t)(flags | O_CLOEXEC);
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    return (int)syscall(SYS_openat2, rootfd, path, &how, sizeof how);
}

/* An O_PATH fd for dest, creating missing parents as directories and the last
 * component as a directory or (for a bind mount of a file) an empty file.
 * Each component is created by name under an fd resolved in the root, then the
 * prefix is resolved again in the root, so symlinks never lead outside. */
static int open_target(int rootfd, const char *dest, int want_dir)
{
    char path[PATH_MAX];
    int fd = open_in_root(rootfd, dest, O_PATH);
    if (fd >= 0 || errno != ENOENT)
        return fd;
    size_t dl = strlen(dest);
    if (dl >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(path, dest, dl + 1);

    int parent = fcntl(rootfd, F_DUPFD_CLOEXEC, 3);
    if (parent < 0)
        return -1;
    char *p = path;
    for (;;) {
        while (*p == '/')
            p++;
        char *comp = p;
        while (*p && *p != '/')
            p++;
        char saved = *p;
        *p = 0;
        const char *rest = p + (saved ? 1 : 0);
        rest += strspn(rest, "/");
        int last = !*rest;

        int r;
        if (!last || want_dir) {
            r = mkdirat(parent, comp, 0755);
        } else {
            r = openat(parent, comp, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
            if (r >= 0)
                r = close(r);
        }
        if (r < 0 && errno != EEXIST) {
            close(parent);
            return -1;
        }
        int next = open_in_root(rootfd, path, O_PATH | (last ? 0 : O_DIRECTORY));
        close(parent);
        if (next < 0 || last)
            return next;
        parent = next;
        *p = saved;
    }
}

static int mount_at_fd(const char *src, int fd, const char *type, unsigned long flags, const char *data)
{
    char p[40];
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    return mount(src, p, type, flags, data);
}

/* A mount made through /proc/self/fd/N lands on top of N's dentry; later
 * changes must address the new mount, so the target is resolved again. */
static int change_mount(int rootfd, const char *dest, unsigned long flags)
{
    int fd = open_in_root(rootfd, dest, O_PATH);
    if (fd < 0)
        return -1;
    int r = mount_at_fd(NULL, fd, NULL, flags, NULL);
    int e = errno;
    close(fd);
    errno = e;
    return r;
}

/* runc's r* options: mount_setattr(2) on the new mount and all below it. */
static void set_recursive_attrs(int rootfd, const struct spec_mount *m)
{
    struct mount_attr_ attr = {.attr_set = m->attr_set, .attr_clr = m->attr_clr};
    int fd = open_in_root(rootfd, m->dest, O_PATH);
    if (fd < 0 || syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH | AT_RECURSIVE_, &attr,
                          sizeof attr) < 0)
        die("mount %s: set recursive attributes: %s", m->dest, strerror(errno));
    close(fd);
}

static void apply_mount(int rootfd, const struct spec_mount *m)
{
    const unsigned long propagation = MS_SHARED | MS_SLAVE | MS_PRIVATE | MS_UNBINDABLE;
    unsigned long prop = m->flags & propagation;
    unsigned long flags = m->flags & ~propagation;
    int bind = (flags & MS_BIND) != 0;
    int want_dir = 1;
    int r;

    if (bind) {
        struct stat st;
        if (stat(m->source, &st) < 0)
            die("mount %s: stat %s: %s", m->dest, m->source, strerror(errno));
        want_dir = S_ISDIR(st.st_mode);
    }
    int fd = open_target(rootfd, m->dest, want_dir);
    if (fd < 0)
        die("mount %s: %s", m->dest, strerror(errno));
    /* tmpcopyup: the directory the tmpfs is about to cover, still reachable
     * through this fd once it is covered. */
    int below = -1;
    if (m->copyup && (below = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        die("mount %s: tmpcopyup: %s", m->dest, strerror(errno));

    if (bind) {
        r = mount_at_fd(m->source, fd, NULL, MS_BIND | (flags & MS_REC), NULL);
        /* A bind ignores per-mount flags such as MS_RDONLY; only a remount
         * of the new mount applies them. */
        unsigned long rest = flags & ~(MS_BIND | MS_REC | MS_REMOUNT);
        if (r == 0 && rest)
            r = change_mount(rootfd, m->dest, MS_REMOUNT | MS_BIND | rest);
    } else {
        r = mount_at_fd(m->source[0] ? m->source : m->type, fd, m->type, flags,
                        m->data[0] ? m->data : NULL);
    }
    int e = errno;
    close(fd);
    if (r < 0) {
        if (!strncmp(m->type, "cgroup", 6)) {
            /* A guest without a cgroup hierarchy is still a working container. */
            logmsg("skipping %s mount on %s: %s", m->type, m->dest, strerror(e));
            return;
        }
        die("mount %s: %s", m->dest, strerror(e));
    }
    if (prop && change_mount(rootfd, m->dest, prop | (flags & MS_REC)) < 0)
        die("mount %s: set propagation: %s", m->dest, strerror(errno));
    if (m->propagation && change_mount(rootfd, m->dest, m->propagation) < 0)
        die("mount %s: set propagation: %s", m->dest, strerror(errno));
    if (m->attr_set || m->attr_clr)
        set_recursive_attrs(rootfd, m);
    if (below >= 0) {
        int top = open_in_root(rootfd, m->dest, O_RDONLY | O_DIRECTORY);
        if (top < 0 || copy_tree(below, top) < 0)
            die("mount %s: tmpcopyup: %s", m->dest, strerror(errno));
        close(top);
        close(below);
    }
}

/* A container id as the VM's kernel sees it, through the container's map
 * when it has a user namespace; an id the map lacks is left as it is. */
static uint32_t outside_id(const struct spec_idmap *map, int n, uint32_t id)
{
    for (int i = 0; i < n; i++)
        if (id >= map[i].inside && id - map[i].inside < map[i].size)
            return map[i].outside + (id - map[i].inside);
    return id;
}

/* linux.devices, before the defaults so that a spec's node takes a default's
 * place, as in runc; missing directories under /dev are made.  The owner is
 * a container id (runtime spec), so it goes through the id maps. */
static void make_devices(int rootfd, const struct spec *s)
{
    char dir[PATH_MAX];
    struct stat devst;
    int devfd = s->ndevices ? open_in_root(rootfd, "/dev", O_PATH | O_DIRECTORY) : -1;
    if (s->ndevices && (devfd < 0 || fstat(devfd, &devst) < 0))
        die("create devices: open /dev: %s", strerror(errno));
    if (devfd >= 0)
        close(devfd);
    dev_t dev_fs = s->ndevices ? devst.st_dev : 0;
    for (int i = 0; i < s->ndevices; i++) {
        struct spec_device dev = s->devices[i];
        const struct spec_device *d = &dev;
        dev.uid = outside_id(s->uidmap, s->nuidmap, dev.uid);
        dev.gid = outside_id(s->gidmap, s->ngidmap, dev.gid);
        const char *slash = strrchr(d->path, '/');
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - d->path), d->path);
        int dirfd = open_target(rootfd, dir, 1);
        struct stat st;
        if (dirfd < 0 || fstat(dirfd, &st) < 0)
            die("create device %s: %s", d->path, strerror(errno));
        /* Only in the /dev tmpfs itself: a bind of an image directory under
         * /dev is the host's, through 9p (whose statfs reports the host's
         * filesystem, so st_dev is what tells), and a node there would be
         * made on the host. */
        if (st.st_dev != dev_fs)
            die("create device %s: %s is not the container's /dev filesystem", d->path, dir);
        if (device_make(dirfd, slash + 1, d) < 0)
            die("create device %s: %s", d->path, strerror(errno));
        close(dirfd);
    }
}

/* OCI runtimes must provide these whatever the image holds; only done when
 * the spec gives the container its own /dev, so the image is never written. */
static void populate_dev(int rootfd)
{
    static const struct { const char *name; unsigned maj, min; } nodes[] = {
        {"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7},
        {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0},
    };
    static const struct { const char *name, *target; } links[] = {
        {"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"}, {"stdout", "/proc/self/fd/1"},
        {"stderr", "/proc/self/fd/2"}, {"ptmx", "pts/ptmx"},
    };
    int dev = open_in_root(rootfd, "/dev", O_PATH | O_DIRECTORY);
    if (dev < 0)
        die("open /dev: %s", strerror(errno));
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++)
        if (mknodat(dev, nodes[i].name, S_IFCHR | 0666, makedev(nodes[i].maj, nodes[i].min)) < 0 &&
            errno != EEXIST)
            die("mknod /dev/%s: %s", nodes[i].name, strerror(errno));
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++)
        if (symlinkat(links[i].target, dev, links[i].name) < 0 && errno != EEXIST)
            die("symlink /dev/%s: %s", links[i].name, strerror(errno));
    close(dev);
}

/* linux.sysctl, written as runc writes it: after the hostname, through
 * /proc/sys, which shows the writer's own IPC, UTS and network namespaces
 * whatever procfs it is reached by, so the agent's /proc serves before the
 * container has one.  The host allowed only namespaced names. */
static void write_sysctls(const struct spec *s)
{
    char path[16 + PC_SPEC_MAX_SYSCTL_NAME];
    for (int i = 0; i < s->nsysctls; i++) {
        const struct spec_sysctl *sc = &s->sysctls[i];
        snprintf(path, sizeof path, "/proc/sys/%s", sc->path);
        int fd = open(path, O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            die("open %s: %s", path, strerror(errno));
        size_t n = strlen(sc->value);
        ssize_t w = write(fd, sc->value, n);
        if (w < 0 || (size_t)w != n)
            die("write %s: %s", path, w < 0 ? strerror(errno) : "short write");
        close(fd);
    }
}

/* linux.readonlyPaths, as runc's readonlyPath: a recursive bind of the path
 * onto itself, remounted read-only keeping nosuid, nodev and noexec.  A
 * path the container lacks is skipped. */
static void readonly_path(int rootfd, const char *path)
{
    char src[40];
    int fd = open_in_root(rootfd, path, O_PATH);
    if (fd < 0) {
        if (errno == ENOENT)
            return;
        die("can't make \"%s\" read-only: %s", path, strerror(errno));
    }
    snprintf(src, sizeof src, "/proc/self/fd/%d", fd);
    if (mount_at_fd(src, fd, NULL, MS_BIND | MS_REC, NULL) < 0)
        die("can't make \"%s\" read-only: mount: %s", path, strerror(errno));
    close(fd);
    /* The bind is on top of the old fd's dentry; the remount needs the new mount. */
    struct statfs sf;
    fd = open_in_root(rootfd, path, O_PATH);
    if (fd < 0 || fstatfs(fd, &sf) < 0)
        die("can't make \"%s\" read-only: statfs: %s", path, strerror(errno));
    unsigned long keep = (unsigned long)sf.f_flags & (MS_NOSUID | MS_NODEV | MS_NOEXEC);
    if (mount_at_fd(NULL, fd, NULL, keep | MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) < 0)
        die("can't make \"%s\" read-only: remount: %s", path, strerror(errno));
    close(fd);
}

/* linux.maskedPaths, as runc's maskPath: /dev/null bound over a file, an
 * empty read-only tmpfs over a directory; a path the container lacks is
 * skipped.  The agent's /dev/null, since the container may have none. */
static void mask_path(int rootfd, const char *path)
{
    struct stat st;
    int fd = open_in_root(rootfd, path, O_PATH);
    if (fd < 0) {
        if (errno == ENOENT)
            return;
        die("can't mask path %s: %s", path, strerror(errno));
    }
    if (fstat(fd, &st) < 0)
        die("can't mask path %s: stat: %s", path, strerror(errno));
    int r = S_ISDIR(st.st_mode) ? mount_at_fd("tmpfs", fd, "tmpfs", MS_RDONLY, NULL)
                                : mount_at_fd("/dev/null", fd, NULL, MS_BIND, NULL);
    if (r < 0)
        die("can't mask path %s: %s", path, strerror(errno));
    close(fd);
}

/* ---- terminal (init and exec) ---- */

static int master_fd = -1, slave_fd = -1;

/* The pty master, from the container's devpts as runc takes it: its
 * /dev/ptmx (rootfd < 0: the root we are in).  Opened O_NONBLOCK, as the
 * agent uses it, and checked, since the container may have put anything
 * there. */
static int open_ptmx(int rootfd)
{
    const int flags = O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC;
    int fd = rootfd >= 0 ? open_in_root(rootfd, "/dev/ptmx", flags) : open("/dev/ptmx", flags);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISCHR(st.st_mode) || st.st_rdev != makedev(5, 2))) {
        close(fd);
        errno = ENOTTY;
        return -1;
    }
    return fd;
}

/* fallback: a master from the agent's devpts, opened while it was still
 * reachable, used when the container has no pty device of its own. */
static void open_terminal(int rootfd, int fallback)
{
    const struct spec *s = ctx->spec;
    int unlock = 0;
    int m = open_ptmx(rootfd);
    if (m < 0) {
        if (fallback < 0)
            die("open /dev/ptmx: %s", strerror(errno));
        m = fallback;
    } else if (fallback >= 0) {
        close(fallback);
    }
    if (ioctl(m, TIOCSPTLCK, &unlock) < 0)
        die("unlock pty: %s", strerror(errno));
    /* The peer ioctl opens this master's slave, not whatever a name finds. */
    slave_fd = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (slave_fd < 0)
        die("open pty slave: %s", strerror(errno));
    if (s->rows || s->cols) {
        struct winsize ws = {(unsigned short)s->rows, (unsigned short)s->cols, 0, 0};
        ioctl(m, TIOCSWINSZ, &ws);
    }
    master_fd = m;
}

static int open_agent_ptmx(void)
{
    return open("/dev/pts/ptmx", O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
}

/* As runc does: /dev/console is the process's terminal.  The slave's mount
 * is the devpts it came from, in this namespace, so it may be bound. */
static void mount_console(int rootfd)
{
    char src[40];
    int fd = open_target(rootfd, "/dev/console", 0);
    if (fd < 0)
        die("mount /dev/console: %s", strerror(errno));
    snprintf(src, sizeof src, "/proc/self/fd/%d", slave_fd);
    if (mount_at_fd(src, fd, NULL, MS_BIND, NULL) < 0)
        die("mount /dev/console: %s", strerror(errno));
    close(fd);
}

static int is_dev(const char *dest)
{
    size_t n = strlen(dest);
    while (n > 1 && dest[n - 1] == '/')
        n--;
    return n == 4 && !memcmp(dest, "/dev", 4);
}

static void setup_rootfs(const struct spec *s)
{
    int has_dev = 0;

    /* Nothing done below may leak back into the agent's mount namespace. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        die("make / private: %s", strerror(errno));
    const char *root = s->rootfs ? s->rootfs : PC_ROOTFS_DIR;
    /* A pod member's root is a directory of the pod share; pivot_root needs
     * a mount point, and a private one, so it is bound onto itself. */
    if (s->rootfs && mount(root, root, NULL, MS_BIND | MS_REC, NULL) < 0)
        die("bind %s: %s", root, strerror(errno));
    int rootfd = open(root, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (rootfd < 0)
        die("open %s: %s", root, strerror(errno));

    for (int i = 0; i < s->nmounts; i++) {
        apply_mount(rootfd, &s->mounts[i]);
        has_dev |= is_dev(s->mounts[i].dest);
    }
    /* Never in the rootfs: that is the host's directory, through 9p. */
    if (s->ndevices && !has_dev)
        die("create device %s: the spec has no /dev mount of its own", s->devices[0].path);
    make_devices(rootfd, s);
    if (has_dev)
        populate_dev(rootfd);
    /* Before pivot_root, while the agent's devpts is still a fallback. */
    if (ctx->tty) {
        open_terminal(rootfd, open_agent_ptmx());
        if (has_dev)
            mount_console(rootfd);
    }

    if (s->hostname && sethostname(s->hostname, strlen(s->hostname)) < 0)
        die("sethostname: %s", strerror(errno));
    /* runc's order: hostname, sysctls, read-only paths, masked paths. */
    write_sysctls(s);
    for (int i = 0; i < s->nreadonly_paths; i++)
        readonly_path(rootfd, s->readonly_paths[i]);
    for (int i = 0; i < s->nmasked_paths; i++)
        mask_path(rootfd, s->masked_paths[i]);
    close(rootfd);

    /* pivot_root(".", ".") stacks the old root on the new one; detaching it
     * leaves no path back to the agent's filesystem (unlike chroot). */
    int oldroot = open("/", O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    int fd = open(root, O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (oldroot < 0 || fd < 0 || fchdir(fd) < 0)
        die("chdir %s: %s", root, strerror(errno));
    if (syscall(SYS_pivot_root, ".", ".") < 0)
        die("pivot_root: %s", strerror(errno));
    /* As runc: "." must be the old root here, or MS_REC would turn the
     * container's own mounts into slaves and lose their propagation. */
    if (fchdir(oldroot) < 0)
        die("pivot_root: chdir old root: %s", strerror(errno));
    close(oldroot);
    if (mount(NULL, ".", NULL, MS_SLAVE | MS_REC, NULL) < 0)
        die("pivot_root: make old root slave: %s", strerror(errno));
    if (umount2(".", MNT_DETACH) < 0)
        die("pivot_root: detach old root: %s", strerror(errno));
    if (chdir("/") < 0)
        die("chdir /: %s", strerror(errno));
    close(fd);
    /* runc applies linux.rootfsPropagation to the new / once it is root. */
    if (s->root_propagation && mount(NULL, "/", NULL, s->root_propagation, NULL) < 0)
        die("set propagation of /: %s", strerror(errno));

    /* Last, so that mount targets could still be created above. */
    if (s->root_readonly && mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) < 0)
        die("remount / read-only: %s", strerror(errno));
}

/* ---- credentials and limits (init and exec) ---- */

/* The init's user namespace: unshared here, its maps written by a helper
 * left outside it (userns.c says why), whose failure it reports itself.
 * piddir is this process's directory in the agent's procfs. */
static void enter_userns(const struct spec *s, int piddir)
{
    int go[2];
    char err[ERRTEXT_MAX], b;
    if (pipe2(go, O_CLOEXEC) < 0)
        die("create user namespace: pipe: %s", strerror(errno));
    pid_t helper = fork();
    if (helper < 0)
        die("create user namespace: fork: %s", strerror(errno));
    if (helper == 0) {
        close(go[1]);
        if (read(go[0], &b, 1) != 1)
            _exit(1); /* the namespace was not made; the parent reports why */
        if (userns_write_maps(piddir, s, err, sizeof err) < 0)
            die("create user namespace: %s", err);
        _exit(0);
    }
    close(go[0]);
    int r = unshare(CLONE_NEWUSER);
    int e = errno;
    if (r == 0 && write(go[1], "u", 1) != 1)
        r = -1;
    close(go[1]);
    int st;
    while (waitpid(helper, &st, 0) < 0 && errno == EINTR)
        ;
    if (r < 0)
        die("create user namespace: %s", strerror(e));
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        _exit(1); /* the helper sent the error */
}

/* runc's order: without no_new_privs, loading a filter needs CAP_SYS_ADMIN,
 * so it is done before the credentials change; with it, as late as
 * possible, so that the fewest of the agent's own syscalls pass through it. */
static void load_seccomp(const struct seccomp_prog *p)
{
    if (p && seccomp_install(p) < 0)
        die("error loading seccomp filter into kernel: %s", strerror(errno));
}

static void set_oom_score_adj(int adj)
{
    char buf[16];
    int n = snprintf(buf, sizeof buf, "%d", adj);
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, buf, (size_t)n) != n)
        die("failed to update /proc/self/oom_score_adj: %s", strerror(errno));
    close(fd);
}

static void setup_user(const struct spec *s)
{
    const unsigned eip = 1u << SC_EFFECTIVE | 1u << SC_PERMITTED | 1u << SC_INHERITABLE;
    int set_eip = (s->caps_given & eip) != 0;
    gid_t gids[PC_SPEC_MAX_GIDS];
    int cap;

    /* Needs CAP_SETPCAP, so before the uid change can take it away. */
    if (s->caps_given & 1u << SC_BOUNDING && caps_drop_bounding(s->caps[SC_BOUNDING], &cap) < 0)
        die("drop bounding capability %d: %s", cap, strerror(errno));

    /* Without this, setuid to a non-root user empties the permitted set and
     * the requested capabilities could not be set afterwards. */
    if (set_eip && prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0)
        die("keep capabilities: %s", strerror(errno));
    for (int i = 0; i < s->ngids; i++)
        gids[i] = s->gids[i];
    if (setgroups((size_t)s->ngids, gids) < 0)
        die("setgroups: %s", strerror(errno));
    if (setresgid(s->gid, s->gid, s->gid) < 0)
        die("setgid %u: %s", s->gid, strerror(errno));
    if (setresuid(s->uid, s->uid, s->uid) < 0)
        die("setuid %u: %s", s->uid, strerror(errno));
    if (set_eip) {
        if (caps_set(s->caps[SC_EFFECTIVE], s->caps[SC_PERMITTED], s->caps[SC_INHERITABLE]) < 0)
            die("capset: %s", strerror(errno));
        if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) < 0)
            die("keep capabilities: %s", strerror(errno));
    }
    if (s->caps_given & 1u << SC_AMBIENT && caps_set_ambient(s->caps[SC_AMBIENT]) < 0)
        die("clear ambient capabilities: %s", strerror(errno));
    if (s->nnp && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        die("set no_new_privs: %s", strerror(errno));
}

static void setup_rlimits(const struct spec *s)
{
    for (int i = 0; i < s->nrlimits; i++) {
        const struct spec_rlimit *r = &s->rlimits[i];
        struct rlimit rl = {(rlim_t)r->soft, (rlim_t)r->hard};
        if (setrlimit((__rlimit_resource_t)r->resource, &rl) < 0)
            die("setrlimit %d: %s", r->resource, strerror(errno));
    }
}

/* Like Go's exec.LookPath, which is what runc reports from. */
static const char *lookup(const char *file, char *const envp[], char *buf, size_t n)
{
    struct stat st;
    if (strchr(file, '/')) {
        if (stat(file, &st) < 0)
            die("exec: \"%s\": stat %s: %s", file, file, strerror(errno));
        if (S_ISDIR(st.st_mode))
            die("exec: \"%s\": is a directory", file);
        if (!(st.st_mode & 0111))
            die("exec: \"%s\": permission denied", file);
        return file;
    }
    const char *path = DEFAULT_PATH;
    for (char *const *e = envp; *e; e++)
        if (!strncmp(*e, "PATH=", 5)) {
            path = *e + 5;
            break;
        }
    for (const char *p = path;;) {
        const char *colon = strchrnul(p, ':');
        int dl = (int)(colon - p);
        int len = dl ? snprintf(buf, n, "%.*s/%s", dl, p, file) : snprintf(buf, n, "./%s", file);
        if (len > 0 && (size_t)len < n && stat(buf, &st) == 0 && !S_ISDIR(st.st_mode) &&
            st.st_mode & 0111)
            return buf;
        if (!*colon)
            break;
        p = colon + 1;
    }
    die("exec: \"%s\": executable file not found in $PATH", file);
}

/* The child starts with every fd of the agent: the agent port, other
 * processes' pipes.  A container process could take them from it (through
 * /proc/PID/fd or pidfd_getfd) while it waits for START, so they go first. */
static void close_other_fds(const struct child_ctx *c)
{
    int keep[] = {c->stdio[0], c->stdio[1], c->stdio[2], c->status_fd, c->start_fd,
                  c->ns_mnt, c->ns_uts, c->ns_ipc, c->ns_user};
    int n = (int)(sizeof keep / sizeof keep[0]);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && keep[j - 1] > keep[j]; j--) {
            int t = keep[j];
            keep[j] = keep[j - 1];
            keep[j - 1] = t;
        }
    unsigned lo = 3; /* 0-2 are the console until stdio is set up */
    for (int i = 0; i < n; i++) {
        if (keep[i] < (int)lo)
            continue;
        if ((unsigned)keep[i] > lo)
            close_range(lo, (unsigned)keep[i] - 1, 0);
        lo = (unsigned)keep[i] + 1;
    }
    close_range(lo, ~0u, 0);
}

/* "O", with the pty master when there is one: the agent relays it. */
static void report_ready(void)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } cm;
    struct iovec iov = {"O", 1};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    memset(&cm, 0, sizeof cm);
    if (master_fd >= 0) {
        mh.msg_control = cm.b;
        mh.msg_controllen = sizeof cm.b;
        struct cmsghdr *h = CMSG_FIRSTHDR(&mh);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(h), &master_fd, sizeof master_fd);
    }
    if (sendmsg(ctx->status_fd, &mh, MSG_NOSIGNAL) != 1)
        _exit(1);
    if (master_fd >= 0)
        close(master_fd);
    master_fd = -1;
}

void child_main(const struct child_ctx *c)
{
    const struct spec *s = c->spec;
    sigset_t none;
    char pathbuf[PATH_MAX];
    int stdio[3] = {c->stdio[0], c->stdio[1], c->stdio[2]};

    ctx = c;
    /* First, so that all the process holds is its container's; in a cgroup
     * namespace of its own, where that group is the root, as runc's
     * containers on cgroup v2 are. */
    if (c->cgroup_procs >= 0 &&
        (write(c->cgroup_procs, "0", 1) != 1 || unshare(CLONE_NEWCGROUP) < 0))
        die("join the container's cgroup: %s", strerror(errno));
    /* Until execve, nobody in the container may ptrace this copy of the
     * agent or open its /proc files (runc does the same). */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    close_other_fds(c);
    /* The agent blocks SIGCHLD for its signalfd and ignores SIGPIPE; both
     * survive execve and would confuse the container's programs. */
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    umask(0);

    /* Before namespaces and credentials, as runc's nsexec does: lowering it
     * needs CAP_SYS_RESOURCE, and the agent's /proc names this process. */
    if (s->has_oom_score_adj)
        set_oom_score_adj(s->oom_score_adj);
    /* As root, before any namespace: the real-time class needs CAP_SYS_ADMIN. */
    if (s->has_ioprio &&
        syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0,
                s->ioprio_class << IOPRIO_CLASS_SHIFT | s->ioprio_level) < 0)
        die("failed to set io priority: %s", strerror(errno));
    /* The agent's procfs names this process until pivot_root hides it. */
    int piddir = -1;
    if (c->is_init && s->userns &&
        (piddir = open("/proc/self", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
        die("open /proc/self: %s", strerror(errno));

    if (c->is_init) {
        int flags = CLONE_NEWNS | (c->ns_uts < 0 ? CLONE_NEWUTS : 0) |
                    (c->ns_ipc < 0 ? CLONE_NEWIPC : 0);
        if (unshare(flags) < 0)
            die("unshare namespaces: %s", strerror(errno));
        /* A pod member shares these with the pod's sandbox, as CRI asks. */
        if ((c->ns_uts >= 0 && setns(c->ns_uts, CLONE_NEWUTS) < 0) ||
            (c->ns_ipc >= 0 && setns(c->ns_ipc, CLONE_NEWIPC) < 0))
            die("join the pod's namespaces: %s", strerror(errno));
    } else {
        int fallback = c->tty ? open_agent_ptmx() : -1;
        /* Joining the mount namespace also moves root and cwd to its root,
         * which is the container's root since init pivoted there. */
        if (setns(c->ns_mnt, CLONE_NEWNS) < 0 || setns(c->ns_uts, CLONE_NEWUTS) < 0 ||
            setns(c->ns_ipc, CLONE_NEWIPC) < 0)
            die("join container namespaces: %s", strerror(errno));
        close(c->ns_mnt);
        close(c->ns_uts);
        close(c->ns_ipc);
        if (c->tty)
            open_terminal(-1, fallback);
    }
    if (setsid() < 0)
        die("setsid: %s", strerror(errno));

    if (c->is_init)
        setup_rootfs(s);
    if (c->tty)
        stdio[0] = stdio[1] = stdio[2] = slave_fd;
    /* Before the user namespace: raising a hard limit needs the VM's root. */
    setup_rlimits(s);
    if (piddir >= 0) {
        enter_userns(s, piddir);
        close(piddir);
        /* Copies of the mount and UTS namespaces, owned by the new user
         * namespace as under runc, so that the container's root may mount
         * and set the hostname; the mounts made above come along locked
         * (masked paths stay masked).  IPC and PID stay the VM's: a new IPC
         * namespace would drop the sysctls and orphan /dev/mqueue. */
        if (unshare(CLONE_NEWNS | CLONE_NEWUTS) < 0)
            die("unshare namespaces in the user namespace: %s", strerror(errno));
    } else if (c->ns_user >= 0) {
        if (setns(c->ns_user, CLONE_NEWUSER) < 0)
            die("join container user namespace: %s", strerror(errno));
        close(c->ns_user);
    }
    if (!s->nnp)
        load_seccomp(c->seccomp);
    /* Lets the process reopen its own stdio (/dev/stdout) as a non-root user. */
    if (s->uid)
        for (int i = 0; i < 3; i++)
            if (fchown(stdio[i], s->uid, s->gid) < 0) {
                /* Best effort, as in runc. */
            }
    setup_user(s);
    if (s->has_personality && personality(s->personality) < 0)
        die("unable to set personality: %s", strerror(errno));
    umask(s->has_umask ? s->umask : 022);
    if (chdir(s->cwd ? s->cwd : "/") < 0)
        die("chdir %s: %s", s->cwd ? s->cwd : "/", strerror(errno));
    const char *exe = lookup(s->argv[0], s->envp, pathbuf, sizeof pathbuf);

    for (int i = 0; i < 3; i++)
        if (stdio[i] != i && dup2(stdio[i], i) < 0)
            die("set up stdio: %s", strerror(errno));
    if (c->tty && ioctl(0, TIOCSCTTY, 0) < 0)
        die("set controlling terminal: %s", strerror(errno));

    /* The kernel applies XGates from the next execve on, to this process
     * and all its descendants.  A kernel that cannot is an error, never a
     * silent run without. */
    if (c->xgates && prctl(PR_XGATE, PR_XGATE_ENABLE, 0, 0, 0) < 0)
        die("switch on XGates: %s", strerror(errno));
    /* Before the filter, which might refuse close_range. */
    close_range(3, ~0u, CLOSE_RANGE_CLOEXEC);
    if (s->nnp)
        load_seccomp(c->seccomp);
    report_ready();
    char b;
    ssize_t r;
    do
        r = read(c->start_fd, &b, 1);
    while (r < 0 && errno == EINTR);
    if (r != 1)
        _exit(1); /* the agent gave up on this process */

    execve(exe, s->argv, s->envp);
    die_exec("exec %s: %s", exe, strerror(errno));
}
