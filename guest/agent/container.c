#define _GNU_SOURCE
#include "container.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"

static struct ctr ctrs[CTR_MAX];
static unsigned long long ended_count;
static const char *const ns_names[CTR_NS_COUNT] = {"pid", "mnt", "uts", "ipc", "user"};

static struct ctr *find(const char *id)
{
    for (int i = 0; i < CTR_MAX; i++)
        if (ctrs[i].state != CTR_FREE && !strcmp(ctrs[i].id, id))
            return &ctrs[i];
    return NULL;
}

/* A free slot, else the container that ended longest ago and has no
 * process slot left: its id is forgotten, which only matters to a SPEC that
 * names it again. */
static struct ctr *take_slot(void)
{
    struct ctr *best = NULL;
    for (int i = 0; i < CTR_MAX; i++) {
        struct ctr *c = &ctrs[i];
        if (c->state == CTR_FREE)
            return c;
        if (c->state == CTR_ENDED && !c->procs && (!best || c->ended_seq < best->ended_seq))
            best = c;
    }
    return best;
}

int ctr_claim(const char *id, enum spec_role role, struct ctr **out, char *err, size_t errlen)
{
    struct ctr *c = find(id);
    if (!c) {
        if (role == SPEC_ROLE_EXEC) {
            snprintf(err, errlen, "no container %s in this VM", id);
            return -1;
        }
        if (strlen(id) >= sizeof c->id || !(c = take_slot())) {
            snprintf(err, errlen, "no room for container %s: %d containers in this VM", id,
                     CTR_MAX);
            return -1;
        }
        cg_remove(&c->cg); /* an ended container's, if its first try failed */
        memset(c, 0, sizeof *c);
        c->state = CTR_NEW;
        memcpy(c->id, id, strlen(id) + 1);
        for (int i = 0; i < CTR_NS_COUNT; i++)
            c->ns[i] = -1;
        /* Without one the container runs, and only has no figures. */
        cg_create(&c->cg);
        *out = c;
        return 0;
    }
    if (c->state != CTR_LIVE) {
        snprintf(err, errlen, "container %s is not running", id);
        return -1;
    }
    if (role == SPEC_ROLE_INIT) {
        snprintf(err, errlen, "container %s already has an init process", id);
        return -1;
    }
    *out = c;
    return 0;
}

static void close_ns(struct ctr *c)
{
    for (int i = 0; i < CTR_NS_COUNT; i++) {
        if (c->ns[i] >= 0)
            close(c->ns[i]);
        c->ns[i] = -1;
    }
}

int ctr_started(struct ctr *c, pid_t init_pid)
{
    char path[64];
    for (int i = 0; i < CTR_NS_COUNT; i++) {
        snprintf(path, sizeof path, "/proc/%d/ns/%s", (int)init_pid, ns_names[i]);
        c->ns[i] = open(path, O_RDONLY | O_CLOEXEC);
        if (c->ns[i] < 0) {
            int e = errno;
            close_ns(c);
            errno = e;
            return -1;
        }
    }
    c->init_pid = init_pid;
    c->state = CTR_LIVE;
    return 0;
}

const struct ctr *ctr_find_live(const char *id)
{
    const struct ctr *c = find(id);
    return c && c->state == CTR_LIVE ? c : NULL;
}

void ctr_abandon(struct ctr *c)
{
    close_ns(c);
    cg_remove(&c->cg);
    free(c->seccomp);
    memset(c, 0, sizeof *c);
}

void ctr_hold(struct ctr *c)
{
    c->procs++;
}

void ctr_release(struct ctr *c)
{
    if (c->procs)
        c->procs--;
}

void ctr_init_exited(struct ctr *c)
{
    close_ns(c);
    /* No exec can join any more. */
    free(c->seccomp);
    c->seccomp = NULL;
    c->state = CTR_EXITED;
}

void ctr_init_reported(struct ctr *c)
{
    c->state = CTR_ENDED;
    c->ended_seq = ++ended_count;
    /* Its group stays until the slot is reused: the host reads the OOM
     * kills that ended the container after its EXIT. */
}

int ctr_limit(const char *id, uint64_t memory_max, uint64_t pids_max, char *err, size_t errlen)
{
    const struct ctr *c = ctr_find_live(id);
    if (!c) {
        snprintf(err, errlen, "container %s is not running in this VM", id);
        return -1;
    }
    return cg_limit(&c->cg, memory_max, pids_max, err, errlen);
}

int ctr_stats(const char *id, uint64_t v[PC_STAT_COUNT], char *err, size_t errlen)
{
    const struct ctr *c = find(id);
    if (!c || c->state == CTR_NEW) {
        snprintf(err, errlen, "no container %s in this VM", id);
        return -1;
    }
    return cg_read(&c->cg, v, err, errlen);
}

int ctr_all_ended(void)
{
    int ended = 0;
    for (int i = 0; i < CTR_MAX; i++) {
        if (ctrs[i].state == CTR_ENDED)
            ended = 1;
        else if (ctrs[i].state != CTR_FREE)
            return 0;
    }
    return ended;
}

static int live_count(void)
{
    int n = 0;
    for (int i = 0; i < CTR_MAX; i++)
        n += ctrs[i].state == CTR_LIVE;
    return n;
}

int ctr_signal_all(const struct ctr *c, int signo)
{
    if (c->state != CTR_LIVE)
        return 0;
    /* The agent is the VM's PID 1: -1 reaches every process but itself, in
     * one step that no fork can slip past, and with one container every
     * other process belongs to it. */
    if (live_count() == 1)
        return kill(-1, signo) < 0 && errno != ESRCH ? -1 : 0;
    /* Otherwise: every process whose pid namespace is the container's. */
    struct stat want, st;
    if (fstat(c->ns[CTR_NS_PID], &want) < 0)
        return -1;
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    struct dirent *e;
    char path[64];
    int failed = 0;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 1)
            continue;
        snprintf(path, sizeof path, "/proc/%ld/ns/pid", pid);
        if (stat(path, &st) == 0 && st.st_dev == want.st_dev && st.st_ino == want.st_ino &&
            kill((pid_t)pid, signo) < 0 && errno != ESRCH)
            failed = errno;
    }
    closedir(d);
    errno = failed;
    return failed ? -1 : 0;
}

int ctr_reidentify(const char *id, const char *hostname, char *err, size_t errlen)
{
    struct ctr *c = NULL;
    int live = 0;
    for (int i = 0; i < CTR_MAX; i++)
        if (ctrs[i].state == CTR_LIVE) {
            c = &ctrs[i];
            live++;
        }
    if (live != 1) {
        snprintf(err, errlen, "fork: %d live containers, expected 1", live);
        return -1;
    }
    snprintf(c->id, sizeof c->id, "%s", id);
    /* The container's own UTS namespace, from a child: the agent keeps its own. */
    pid_t pid = fork();
    if (pid == 0) {
        if (setns(c->ns[CTR_NS_UTS], CLONE_NEWUTS) < 0 || sethostname(hostname, strlen(hostname)) < 0)
            _exit(1);
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
        snprintf(err, errlen, "fork: the container's hostname could not be set");
        return -1;
    }
    return 0;
}
