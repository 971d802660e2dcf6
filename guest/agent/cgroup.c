#define _GNU_SOURCE
#include "cgroup.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

#define CG_ROOT "/sys/fs/cgroup"
/* memory.stat is about 1.5 KiB in Linux 6.1. */
#define CG_FILE_MAX 8192

static int root_fd = -1;
static unsigned long long made;

void cg_init(void)
{
    /* favordynmods: every exec moves a process into its container's group,
     * and without it each move waits out an RCU grace period, which TCG makes
     * long; forks pay a little more instead. */
    if (mount("cgroup2", CG_ROOT, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "favordynmods") < 0) {
        logmsg("mount %s: %s; containers get no figures", CG_ROOT, strerror(errno));
        return;
    }
    root_fd = open(CG_ROOT, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int fd = root_fd < 0 ? -1 : openat(root_fd, "cgroup.subtree_control", O_WRONLY | O_CLOEXEC);
    /* One write per controller: a kernel without one still gets the other. */
    static const char *const controllers[] = {"+memory", "+pids"};
    for (size_t i = 0; fd >= 0 && i < sizeof controllers / sizeof controllers[0]; i++)
        if (write(fd, controllers[i], strlen(controllers[i])) < 0)
            logmsg("cgroup: %s: %s", controllers[i], strerror(errno));
    if (fd >= 0)
        close(fd);
    else
        logmsg("cgroup: %s: %s", CG_ROOT, strerror(errno));
}

int cg_create(struct cgroup *g)
{
    memset(g, 0, sizeof *g);
    g->procs_fd = g->dir_fd = -1;
    if (root_fd < 0)
        return -1;
    snprintf(g->name, sizeof g->name, "c%llu", ++made);
    if (mkdirat(root_fd, g->name, 0755) < 0) {
        logmsg("cgroup %s: %s", g->name, strerror(errno));
        g->name[0] = 0;
        return -1;
    }
    g->dir_fd = openat(root_fd, g->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (g->dir_fd >= 0)
        g->procs_fd = openat(g->dir_fd, "cgroup.procs", O_WRONLY | O_CLOEXEC);
    if (g->procs_fd < 0) {
        logmsg("cgroup %s: %s", g->name, strerror(errno));
        cg_remove(g);
        return -1;
    }
    return 0;
}

void cg_remove(struct cgroup *g)
{
    if (!g->name[0])
        return;
    if (g->procs_fd >= 0)
        close(g->procs_fd);
    if (g->dir_fd >= 0)
        close(g->dir_fd);
    g->procs_fd = g->dir_fd = -1;
    /* A process killed a moment ago may not have left it yet: the name
     * stays for the next try. */
    if (unlinkat(root_fd, g->name, AT_REMOVEDIR) < 0 && errno != ENOENT) {
        logmsg("cgroup %s stays for now: %s", g->name, strerror(errno));
        return;
    }
    g->name[0] = 0;
}

static int read_text(int dir, const char *file, char *buf, size_t cap);
static uint64_t number(const char *text);

static int write_limit(const struct cgroup *g, const char *file, uint64_t value, char *err,
                       size_t errlen)
{
    char text[24];
    int len = value == SPEC_NO_LIMIT ? snprintf(text, sizeof text, "max")
                                   : snprintf(text, sizeof text, "%llu", (unsigned long long)value);
    int fd = g->dir_fd < 0 ? -1 : openat(g->dir_fd, file, O_WRONLY | O_CLOEXEC);
    int ok = fd >= 0 && write(fd, text, (size_t)len) == len;
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (ok)
        return 0;
    if (g->dir_fd < 0)
        snprintf(err, errlen, "%s: this VM keeps no cgroup for the container", file);
    else
        snprintf(err, errlen, "%s: %s", file, strerror(e));
    return -1;
}

int cg_limit(const struct cgroup *g, uint64_t memory_max, uint64_t pids_max, char *err,
             size_t errlen)
{
    /* Below what the group holds, the kernel's write would reclaim and
     * OOM-kill until it fits, with PID 1 inside the write the whole time. */
    static char now[32];
    if (memory_max && memory_max != SPEC_NO_LIMIT && g->dir_fd >= 0 &&
        read_text(g->dir_fd, "memory.current", now, sizeof now) == 0 &&
        number(now) > memory_max) {
        snprintf(err, errlen, "memory.max %llu is below the %llu bytes the container holds",
                 (unsigned long long)memory_max, (unsigned long long)number(now));
        return -1;
    }
    if (memory_max && write_limit(g, "memory.max", memory_max, err, errlen) < 0)
        return -1;
    if (pids_max && write_limit(g, "pids.max", pids_max, err, errlen) < 0)
        return -1;
    return 0;
}

/* The file's text, NUL-terminated; -1 when it cannot be read. */
static int read_text(int dir, const char *file, char *buf, size_t cap)
{
    int fd = openat(dir, file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = 0;
    ssize_t n;
    while (len < cap - 1 && (n = read(fd, buf + len, cap - 1 - len)) > 0)
        len += (size_t)n;
    close(fd);
    buf[len] = 0;
    return 0;
}

/* "max" (no limit) is 0, as the protocol says; so is anything unreadable. */
static uint64_t number(const char *text)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    return errno || end == text ? 0 : (uint64_t)v;
}

struct key {
    const char *name;
    enum pc_stat stat;
};

/* Lines of "key value": the keys asked for land at their index. */
static void keyed(char *text, const struct key *keys, size_t n, uint64_t v[PC_STAT_COUNT])
{
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *sp = strchr(line, ' ');
        if (!sp)
            continue;
        *sp = 0;
        for (size_t i = 0; i < n; i++)
            if (!strcmp(line, keys[i].name))
                v[keys[i].stat] = number(sp + 1);
    }
}

#define N(a) (sizeof(a) / sizeof((a)[0]))

static const struct key cpu_keys[] = {
    {"usage_usec", PC_STAT_USAGE_USEC},
    {"user_usec", PC_STAT_USER_USEC},
    {"system_usec", PC_STAT_SYSTEM_USEC},
};
static const struct key memory_keys[] = {
    {"anon", PC_STAT_ANON},
    {"file", PC_STAT_FILE},
    {"kernel_stack", PC_STAT_KERNEL_STACK},
    {"slab", PC_STAT_SLAB},
    {"sock", PC_STAT_SOCK},
    {"shmem", PC_STAT_SHMEM},
    {"file_mapped", PC_STAT_FILE_MAPPED},
    {"file_dirty", PC_STAT_FILE_DIRTY},
    {"file_writeback", PC_STAT_FILE_WRITEBACK},
    {"inactive_anon", PC_STAT_INACTIVE_ANON},
    {"active_anon", PC_STAT_ACTIVE_ANON},
    {"inactive_file", PC_STAT_INACTIVE_FILE},
    {"active_file", PC_STAT_ACTIVE_FILE},
    {"unevictable", PC_STAT_UNEVICTABLE},
    {"pgfault", PC_STAT_PGFAULT},
    {"pgmajfault", PC_STAT_PGMAJFAULT},
};
static const struct key event_keys[] = {
    {"oom", PC_STAT_OOM},
    {"oom_kill", PC_STAT_OOM_KILL},
};
/* Files of one number. */
static const struct key single_files[] = {
    {"memory.current", PC_STAT_MEMORY_CURRENT},
    {"memory.max", PC_STAT_MEMORY_MAX},
    {"pids.current", PC_STAT_PIDS_CURRENT},
    {"pids.max", PC_STAT_PIDS_MAX},
};

int cg_read(const struct cgroup *g, uint64_t v[PC_STAT_COUNT], char *err, size_t errlen)
{
    static char buf[CG_FILE_MAX];
    memset(v, 0, PC_STAT_COUNT * sizeof *v);
    if (g->dir_fd < 0) {
        snprintf(err, errlen, "this VM keeps no cgroup for the container");
        return -1;
    }
    if (read_text(g->dir_fd, "cpu.stat", buf, sizeof buf) < 0) {
        snprintf(err, errlen, "cgroup %s: cpu.stat: %s", g->name, strerror(errno));
        return -1;
    }
    keyed(buf, cpu_keys, N(cpu_keys), v);
    for (size_t i = 0; i < N(single_files); i++)
        if (read_text(g->dir_fd, single_files[i].name, buf, sizeof buf) == 0)
            v[single_files[i].stat] = number(buf);
    if (read_text(g->dir_fd, "memory.stat", buf, sizeof buf) == 0)
        keyed(buf, memory_keys, N(memory_keys), v);
    if (read_text(g->dir_fd, "memory.events", buf, sizeof buf) == 0)
        keyed(buf, event_keys, N(event_keys), v);
    return 0;
}
