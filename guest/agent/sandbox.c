/* Applying a SANDBOX: the clock, fresh entropy, the hostname, the shares and
 * the interfaces, in that order, once per VM. */
#define _GNU_SOURCE
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/openat2.h>
#include <linux/random.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "container.h"
#include "log.h"
#include "net.h"
#include "sandboxspec.h"
#include "vm_proto.h"

/* Options for every 9p share, as the host exports them. */
#define SHARE_OPTS "trans=virtio,version=9p2000.L,msize=262144,cache=mmap,access=client"
#define BOOT_ID "/proc/sys/kernel/random/boot_id"

static int attached;
static struct sandbox_spec sb;

int sandbox_attached(void)
{
    return attached;
}

/* The host's bytes are credited as entropy, then the CRNG is reseeded at
 * once: every sandbox restored from one template draws its own numbers from
 * the first getrandom() on. */
static int add_entropy(const unsigned char *bytes, size_t n, char *err, size_t errlen)
{
    struct {
        struct rand_pool_info info;
        unsigned char buf[PC_SANDBOX_ENTROPY_MAX];
    } pool;
    pool.info.entropy_count = (int)(n * 8);
    pool.info.buf_size = (int)n;
    memcpy(pool.buf, bytes, n);
    int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
    int rc = fd < 0 ? -1 : ioctl(fd, RNDADDENTROPY, &pool.info);
    if (rc == 0)
        rc = ioctl(fd, RNDRESEEDCRNG);
    int e = errno;
    if (fd >= 0)
        close(fd);
    explicit_bzero(&pool, sizeof pool);
    if (rc < 0) {
        snprintf(err, errlen, "sandbox: entropy: %s", strerror(e));
        return -1;
    }
    return 0;
}

static int failed(char *err, size_t errlen, const char *what, const char *path)
{
    snprintf(err, errlen, "sandbox: %s %s: %s", what, path, strerror(errno));
    return -1;
}

/* The image read-only; with rw, under an overlay whose upper layer is a tmpfs:
 * every write of the container lives in guest RAM, where a snapshot has it. */
static int mount_rootdisk(int mode, char *err, size_t errlen)
{
    const char *lower = mode == ROOTDISK_RW ? PC_ROOTDISK_DIR : PC_ROOTFS_DIR;
    if (mkdir(lower, 0755) < 0 && errno != EEXIST)
        return failed(err, errlen, "mkdir", lower);
    /* A VM restored from a template probed the template's disk before READY:
     * what its page cache holds of that disk (the partition scan read its
     * first page, which is this one's superblock) must not be read as this one. */
    int disk = open(PC_ROOTDISK_DEV, O_RDONLY | O_CLOEXEC);
    if (disk < 0 || ioctl(disk, BLKFLSBUF, 0) < 0) {
        int e = errno;
        if (disk >= 0)
            close(disk);
        errno = e;
        return failed(err, errlen, "flush the page cache of", PC_ROOTDISK_DEV);
    }
    close(disk);
    if (mount(PC_ROOTDISK_DEV, lower, "ext4", MS_RDONLY, "") < 0)
        return failed(err, errlen, "mount", PC_ROOTDISK_DEV);
    if (mode == ROOTDISK_RO)
        return 0;
    if (mkdir(PC_ROOTUPPER_DIR, 0700) < 0 && errno != EEXIST)
        return failed(err, errlen, "mkdir", PC_ROOTUPPER_DIR);
    if (mount("rootupper", PC_ROOTUPPER_DIR, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700") < 0)
        return failed(err, errlen, "mount", PC_ROOTUPPER_DIR);
    if (mkdir(PC_ROOTUPPER_DIR "/upper", 0755) < 0 || mkdir(PC_ROOTUPPER_DIR "/work", 0700) < 0)
        return failed(err, errlen, "mkdir in", PC_ROOTUPPER_DIR);
    if (mkdir(PC_ROOTFS_DIR, 0755) < 0 && errno != EEXIST)
        return failed(err, errlen, "mkdir", PC_ROOTFS_DIR);
    const char *opts = "lowerdir=" PC_ROOTDISK_DIR ",upperdir=" PC_ROOTUPPER_DIR "/upper,"
                       "workdir=" PC_ROOTUPPER_DIR "/work";
    if (mount("overlay", PC_ROOTFS_DIR, "overlay", 0, opts) < 0)
        return failed(err, errlen, "mount the overlay on", PC_ROOTFS_DIR);
    return 0;
}

/* The host files (/etc/hosts and the like) in a tmpfs where the host share
 * would be: the container's binds find each at its slot, as on 9p. */
static int write_hostfiles(const struct sandbox_spec *s, char *err, size_t errlen)
{
    if (mkdir(PC_HOSTSHARE_DIR, 0755) < 0 && errno != EEXIST)
        return failed(err, errlen, "mkdir", PC_HOSTSHARE_DIR);
    if (mount("hostfiles", PC_HOSTSHARE_DIR, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") < 0)
        return failed(err, errlen, "mount", PC_HOSTSHARE_DIR);
    int dir = open(PC_HOSTSHARE_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return failed(err, errlen, "open", PC_HOSTSHARE_DIR);
    for (int i = 0; i < s->nhostfiles; i++) {
        char name[16];
        snprintf(name, sizeof name, "%u", s->hostfiles[i].slot);
        int fd = openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        ssize_t n = fd < 0 ? -1 : write(fd, s->hostfiles[i].bytes, s->hostfiles[i].len);
        int e = errno;
        if (fd >= 0)
            close(fd);
        if (n != (ssize_t)s->hostfiles[i].len) {
            close(dir);
            errno = n < 0 ? e : EIO;
            return failed(err, errlen, "write the host file of slot", name);
        }
    }
    close(dir);
    return 0;
}

static int apply(struct sandbox_spec *s, char *err, size_t errlen)
{
    if (s->has_clock && clock_settime(CLOCK_REALTIME, &s->clock) < 0) {
        snprintf(err, errlen, "sandbox: clock: %s", strerror(errno));
        return -1;
    }
    if (s->nentropy && add_entropy(s->entropy, s->nentropy, err, errlen) < 0)
        return -1;
    explicit_bzero(s->entropy, sizeof s->entropy);
    if (s->hostname && sethostname(s->hostname, strlen(s->hostname)) < 0) {
        snprintf(err, errlen, "sandbox: sethostname: %s", strerror(errno));
        return -1;
    }
    if (s->rootdisk && mount_rootdisk(s->rootdisk, err, errlen) < 0)
        return -1;
    if (s->nhostfiles && write_hostfiles(s, err, errlen) < 0)
        return -1;
    for (int i = 0; i < PC_SANDBOX_MAX_SHARES; i++) {
        const struct sandbox_share *share = &SANDBOX_SHARES[i];
        if (s->shares[i] && mount(share->tag, share->dir, "9p", 0, SHARE_OPTS) < 0) {
            snprintf(err, errlen, "sandbox: mount %s: %s", share->tag, strerror(errno));
            return -1;
        }
    }
    return net_configure(&s->net, err, errlen);
}

/* /etc/machine-id of the container's rootfs, where the image has one: the
 * path resolved inside the rootfs, so a link in the image cannot lead out. */
static int write_machine_id(const char *hex, char *err, size_t errlen)
{
    int root = open(PC_ROOTFS_DIR, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0)
        return failed(err, errlen, "open", PC_ROOTFS_DIR);
    struct open_how how = {.flags = O_WRONLY | O_TRUNC | O_CLOEXEC, .resolve = RESOLVE_IN_ROOT};
    int fd = (int)syscall(SYS_openat2, root, "etc/machine-id", &how, sizeof how);
    int e = errno;
    close(root);
    if (fd < 0) {
        if (e == ENOENT)
            return 0;
        errno = e;
        return failed(err, errlen, "open", "/etc/machine-id");
    }
    char line[34];
    snprintf(line, sizeof line, "%s\n", hex);
    ssize_t n = write(fd, line, 33);
    e = errno;
    close(fd);
    if (n != 33) {
        errno = n < 0 ? e : EIO;
        return failed(err, errlen, "write", "/etc/machine-id");
    }
    return 0;
}

/* A fork is another machine: a boot_id of its own.  Any write makes the
 * guest kernel draw a new one (guest/bootid/), from the CRNG just reseeded
 * with this fork's entropy; only PID 1 of the VM may write it. */
static int renew_boot_id(char *err, size_t errlen)
{
    int fd = open(BOOT_ID, O_WRONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : write(fd, "\n", 1);
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (n != 1) {
        errno = n < 0 ? e : EIO;
        return failed(err, errlen, "renew", BOOT_ID);
    }
    return 0;
}

int sandbox_fork(char *buf, size_t len, char *err, size_t errlen)
{
    struct sandbox_spec f;
    if (!attached) {
        snprintf(err, errlen, "fork: this VM was never attached");
        return -1;
    }
    if (sandbox_parse_forked(buf, len, &f, err, errlen) < 0)
        return -1;
    if (!f.container || !f.hostname || !f.nentropy || !f.machine_id || f.rootdisk ||
        f.nhostfiles || f.shares[0] || f.shares[1] || f.shares[2]) {
        snprintf(err, errlen, "fork: needs container, hostname, entropy and machineid only");
        return -1;
    }
    if (f.has_clock && clock_settime(CLOCK_REALTIME, &f.clock) < 0) {
        snprintf(err, errlen, "fork: clock: %s", strerror(errno));
        return -1;
    }
    int rc = add_entropy(f.entropy, f.nentropy, err, errlen);
    explicit_bzero(f.entropy, sizeof f.entropy);
    if (rc < 0)
        return -1;
    if (renew_boot_id(err, errlen) < 0)
        return -1;
    if (sethostname(f.hostname, strlen(f.hostname)) < 0) {
        snprintf(err, errlen, "fork: sethostname: %s", strerror(errno));
        return -1;
    }
    if (ctr_reidentify(f.container, f.hostname, err, errlen) < 0)
        return -1;
    if (write_machine_id(f.machine_id, err, errlen) < 0)
        return -1;
    if (net_fork(&f.net, err, errlen) < 0)
        return -1;
    logmsg("forked: now container %s, %d network interface(s)", f.container, f.net.nifaces);
    return 0;
}

int sandbox_attach(char *buf, size_t len, char *err, size_t errlen)
{
    if (attached) {
        snprintf(err, errlen, "sandbox: this VM is attached already");
        return -1;
    }
    if (sandbox_parse(buf, len, &sb, err, errlen) < 0)
        return -1;
    /* Attached even when applying fails half-way: a second try would meet
     * mounts and devices the first one made. */
    attached = 1;
    if (apply(&sb, err, errlen) < 0)
        return -1;
    logmsg("sandbox attached");
    return 0;
}
