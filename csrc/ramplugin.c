/* QEMU's side of a VM restored copy-on-write from a template, as a TCG plugin.
 *
 * Such a VM's RAM is QEMU's private mapping of the template's RAM file
 * (memory-backend-file,share=off): every sandbox from one template shares
 * its unchanged pages through the page cache, and owns only the pages it
 * writes, as anonymous copies in its QEMU.  A plugin is QEMU's supported way
 * to run our code in its address space; this one registers no translation
 * callbacks, so TCG's generated code is what it is without it.  Once the
 * machine exists (the first vCPU), it does two things:
 *
 * - It closes every fd QEMU holds on the template's file.  QEMU 7.2 opens
 *   mem-path read-write even for a private mapping (its `rom=off` that opens
 *   it read-only is 8.2's), and the mapping needs no fd once made: from then
 *   on a QEMU a guest took over has no way to write the pages every other
 *   sandbox of the template maps (its jail holds no path to the store).
 * - With the Pager, it serves the Pager's rings (csrc/pager.c).  Only QEMU
 *   can drop its own private copy of a page (MADV_DONTNEED); no other process
 *   can discard another's private pages, and punching the file would free
 *   the template's page under every sandbox.
 *
 * The shim made the eventfds and the stats file and greeted QEMU's ivshmem
 * device with them, exactly as for a shared-RAM VM; QEMU inherits them and
 * the plugin is told their numbers:
 *   -plugin file=PLUGIN,ram=FD,size=BYTES[,split=BYTES,doorbell=FD,irq=FD,
 *           abort=FD,stats=FD]
 * ram is the template file QEMU maps (mem-path=/proc/self/fd/FD), which is
 * how its mapping is found in /proc/self/maps.
 *
 * A snapshot-mode VM's QEMU loads it too, with track=1, for its own shared
 * mapping of its RAM file (ram=FD is an fd on that file, for its identity
 * only): the plugin registers that mapping for asynchronous userfaultfd
 * write-protection and protects all of it.  A write then costs one minor
 * fault per page the first time after each checkpoint, and the shim reads
 * which pages were written from QEMU's pagemap (csrc/dirtylog.c), so a
 * checkpoint hashes only those.  Only QEMU's own mm can be registered: a
 * userfaultfd tracks the process that made it. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dirtylog.h"

#include "pager_proto.h"
#include "pager.h"

/* QEMU's plugin ABI (include/qemu/qemu-plugin.h, version 1 in QEMU 7.2),
 * which Debian does not package: the few declarations used. */
typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t;
typedef void (*qemu_plugin_vcpu_simple_cb_t)(qemu_plugin_id_t id, unsigned int vcpu_index);
void qemu_plugin_register_vcpu_init_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_simple_cb_t cb);
#define PLUGIN_EXPORT __attribute__((visibility("default")))

PLUGIN_EXPORT int qemu_plugin_version = 1;

static struct {
    int ram, doorbell, irq, abort_fd, stats;
    uint64_t size, split, track;
} args = {-1, -1, -1, -1, -1, 0, 0, 0};
static struct pc_pager pager;
static int started;

static int parse_u64(const char *text, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-') return -1;
    *out = v;
    return 0;
}

static int parse_fd(const char *text, int *out)
{
    uint64_t v;
    if (parse_u64(text, &v) < 0 || v < 3 || v > 65535) return -1;
    *out = (int)v;
    return 0;
}

static int parse_arg(const char *arg)
{
    const char *eq = strchr(arg, '=');
    if (!eq) return -1;
    size_t n = (size_t)(eq - arg);
    const char *value = eq + 1;
#define IS(name) (n == sizeof(name) - 1 && memcmp(arg, name, n) == 0)
    if (IS("ram")) return parse_fd(value, &args.ram);
    if (IS("doorbell")) return parse_fd(value, &args.doorbell);
    if (IS("irq")) return parse_fd(value, &args.irq);
    if (IS("abort")) return parse_fd(value, &args.abort_fd);
    if (IS("stats")) return parse_fd(value, &args.stats);
    if (IS("size")) return parse_u64(value, &args.size);
    if (IS("split")) return parse_u64(value, &args.split);
    if (IS("track")) return parse_u64(value, &args.track) < 0 || args.track > 1 ? -1 : 0;
#undef IS
    return -1;
}


/* Every fd on the template's file becomes /dev/null, read-only: the numbers
 * stay taken, so QEMU's own record of its fd names nothing writable. */
static int drop_template_fds(const struct stat *file)
{
    int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    DIR *dir = opendir("/proc/self/fd");
    if (null_fd < 0 || !dir) return -1;
    int dropped = 0;
    struct dirent *entry;
    while ((entry = readdir(dir))) {
        char *end;
        long fd = strtol(entry->d_name, &end, 10);
        struct stat st;
        if (*end || end == entry->d_name || fd == dirfd(dir) || fd == null_fd ||
            fstat((int)fd, &st) < 0 || st.st_dev != file->st_dev || st.st_ino != file->st_ino)
            continue;
        if (dup2(null_fd, (int)fd) < 0) { dropped = -1; break; }
        dropped++;
    }
    closedir(dir);
    close(null_fd);
    return dropped;
}

static void die(const char *why)
{
    fprintf(stderr, "paracell ram plugin: %s\n", why);
    exit(1);
}

/* The userfaultfd stays open for QEMU's life: closing it would end the
 * registration.  A host without asynchronous write-protection on shmem
 * (before Linux 6.7) leaves the mapping as it is, and says so once: the
 * shim's scan then fails and its checkpoints hash every page. */
static void track_writes(uint8_t *ram, uint64_t size)
{
    if (pc_dirty_arm(ram, size) < 0)
        fprintf(stderr, "paracell ram plugin: write tracking unavailable (%s): checkpoints "
                        "hash every page\n", strerror(errno));
}

/* The machine, and so guest RAM, exists once a vCPU does; the guest runs
 * only after every vCPU has been set up, so no doorbell is missed. */
static void vcpu_init(qemu_plugin_id_t id, unsigned int vcpu_index)
{
    (void)id;
    (void)vcpu_index;
    if (__atomic_exchange_n(&started, 1, __ATOMIC_ACQ_REL)) return;
    struct stat file;
    if (fstat(args.ram, &file) < 0) die("the RAM file's fd is not open");
    if (args.track) {
        /* QEMU's shared mapping of the VM's own RAM file. */
        uint8_t *shared = (uint8_t *)(uintptr_t)pc_find_file_mapping(
            "/proc/self/maps", file.st_dev, file.st_ino, args.size, 's');
        if (!shared) die("QEMU's shared mapping of guest RAM not found");
        close(args.ram);
        track_writes(shared, args.size);
        return;
    }
    /* QEMU's private, writable mapping of the whole template file. */
    uint8_t *ram = (uint8_t *)(uintptr_t)pc_find_file_mapping("/proc/self/maps", file.st_dev,
                                                              file.st_ino, args.size, 'p');
    if (!ram) die("QEMU's private mapping of guest RAM not found");
    if (drop_template_fds(&file) < 1) die("QEMU's fds on the template's RAM could not be closed");
    if (args.doorbell < 0) return;  /* no Pager */
    if (pc_pager_adopt(&pager, ram, args.size, args.split, args.doorbell, args.irq,
                       args.abort_fd, args.stats) != PC_PAGER_OK ||
        pc_pager_start(&pager) != PC_PAGER_OK)
        die(pager.error);
}

PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                      char **argv)
{
    (void)info;
    for (int i = 0; i < argc; i++)
        if (parse_arg(argv[i]) < 0) {
            fprintf(stderr, "paracell ram plugin: bad argument %.64s\n", argv[i]);
            return -1;
        }
    int pager_fds = (args.doorbell >= 0) + (args.irq >= 0) + (args.abort_fd >= 0) +
                    (args.stats >= 0);
    if (args.ram < 0 || args.size == 0 || args.size % PC_PAGER_PAGE_SIZE ||
        (pager_fds != 0 && pager_fds != 4) || (args.track && pager_fds)) {
        fprintf(stderr, "paracell ram plugin: it needs ram and size, and the Pager's doorbell, "
                        "irq, abort and stats all or none (none with track)\n");
        return -1;
    }
    if (pager_fds && (args.split == 0 || args.split > args.size ||
                      args.split % PC_PAGER_PAGE_SIZE ||
                      args.split < PC_PAGER_RING_GPA + PC_PAGER_SHM_SIZE)) {
        fprintf(stderr, "paracell ram plugin: bad split for the Pager\n");
        return -1;
    }
    qemu_plugin_register_vcpu_init_cb(id, vcpu_init);
    return 0;
}
