/* Runs the guest agent's parsers on the host, for tests/unit/test_agent_parsers.py.
 * It is compiled together with the agent's own spec.c, channel.c, container.c
 * log.c and seccomp.c, so the tests exercise the code that runs in the guest.
 *
 *   agent_harness spec < PAYLOAD
 *       "ok" and one "key value" line per parsed field, or "error <text>".
 *   agent_harness frames < CHUNKS
 *       CHUNKS is a series of u32 LE length + bytes.  Writes each chunk into
 *       a pipe that the receive buffer reads from; after each chunk, one line
 *       per whole frame (decoded and consumed), then "buffered N": the bytes
 *       still waiting.
 *   agent_harness seccomp < PAYLOAD
 *       A PC_SECCOMP payload through seccomp_stash and seccomp_take:
 *       "ok FLAGS COUNT FIRST-K LAST-K" or "error <text>".
 *   agent_harness ctr OP...
 *       Runs the container table through OPs (see run_ctr), one output line
 *       each.  A started container's namespaces are the harness's own.
 *
 * Strings are printed with bytes outside 0x20..0x7e (and '\') as \xHH, so
 * every value stays on its line. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent_codec.h"
#include "channel.h"
#include "container.h"
#include "log.h"
#include "seccomp.h"
#include "spec.h"

static void put_str(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p >= 0x7f || *p == '\\')
            printf("\\x%02x", *p);
        else
            putchar(*p);
}

static void put_field(const char *key, const char *value)
{
    printf("%s ", key);
    put_str(value);
    putchar('\n');
}

static const char *const role_names[] = {"any", "init", "exec"};
static const char *const cap_names[SC_COUNT] = {
    "cap.bounding", "cap.effective", "cap.permitted", "cap.inheritable", "cap.ambient",
};

static int run_spec(void)
{
    static char buf[4 * PC_MAX_PAYLOAD];
    static struct spec s;
    char err[ERRTEXT_MAX];
    size_t len = fread(buf, 1, sizeof buf, stdin);

    if (spec_parse(buf, len, &s, err, sizeof err) < 0) {
        put_field("error", err);
        return 0;
    }
    puts("ok");
    put_field("container", s.container);
    printf("role %s\n", role_names[s.role]);
    for (int i = 0; i < s.argc; i++)
        put_field("arg", s.argv[i]);
    printf("argv_end %s\n", s.argv[s.argc] ? "set" : "null");
    for (int i = 0; i < s.envc; i++)
        put_field("env", s.envp[i]);
    printf("envp_end %s\n", s.envp[s.envc] ? "set" : "null");
    if (s.cwd)
        put_field("cwd", s.cwd);
    printf("uid %u\ngid %u\n", s.uid, s.gid);
    for (int i = 0; i < s.ngids; i++)
        printf("gid+ %u\n", s.gids[i]);
    if (s.has_umask)
        printf("umask %o\n", s.umask);
    for (int i = 0; i < s.nrlimits; i++)
        printf("rlimit %d:%llu:%llu\n", s.rlimits[i].resource,
               (unsigned long long)s.rlimits[i].soft, (unsigned long long)s.rlimits[i].hard);
    printf("nnp %d\n", s.nnp);
    for (int i = 0; i < SC_COUNT; i++)
        if (s.caps_given & 1u << i)
            printf("%s %llx\n", cap_names[i], (unsigned long long)s.caps[i]);
    if (s.has_oom_score_adj)
        printf("oom_score_adj %d\n", s.oom_score_adj);
    printf("terminal %d\nrows %u\ncols %u\n", s.terminal, s.rows, s.cols);
    if (s.hostname)
        put_field("hostname", s.hostname);
    printf("root.readonly %d\n", s.root_readonly);
    for (int i = 0; i < s.nmounts; i++) {
        const struct spec_mount *m = &s.mounts[i];
        printf("mount ");
        put_str(m->dest);
        putchar('|');
        put_str(m->type);
        putchar('|');
        put_str(m->source);
        printf("|%lu|", m->flags);
        put_str(m->data);
        putchar('\n');
        if (m->propagation || m->attr_set || m->attr_clr || m->copyup)
            printf("mount+ %lu|%llu|%llu|%d\n", m->propagation,
                   (unsigned long long)m->attr_set, (unsigned long long)m->attr_clr, m->copyup);
    }
    for (int i = 0; i < s.nsysctls; i++) {
        printf("sysctl ");
        put_str(s.sysctls[i].path);
        putchar('|');
        put_str(s.sysctls[i].value);
        putchar('\n');
    }
    for (int i = 0; i < s.nreadonly_paths; i++)
        put_field("path.readonly", s.readonly_paths[i]);
    for (int i = 0; i < s.nmasked_paths; i++)
        put_field("path.masked", s.masked_paths[i]);
    for (int i = 0; i < s.ndevices; i++) {
        const struct spec_device *d = &s.devices[i];
        printf("device ");
        put_str(d->path);
        printf("|%c|%u|%u|%o|%u|%u\n", d->type, d->major, d->minor, d->mode, d->uid, d->gid);
    }
    if (s.userns)
        puts("userns 1");
    for (int i = 0; i < s.nuidmap; i++)
        printf("uidmap %u %u %u\n", s.uidmap[i].inside, s.uidmap[i].outside, s.uidmap[i].size);
    for (int i = 0; i < s.ngidmap; i++)
        printf("gidmap %u %u %u\n", s.gidmap[i].inside, s.gidmap[i].outside, s.gidmap[i].size);
    if (s.root_propagation)
        printf("root.propagation %lu\n", s.root_propagation);
    if (s.memory_max)
        printf("memory.max %llu\n", (unsigned long long)s.memory_max);
    if (s.pids_max)
        printf("pids.max %llu\n", (unsigned long long)s.pids_max);
    if (s.has_personality)
        printf("personality %lu\n", s.personality);
    if (s.has_ioprio)
        printf("ioprio %d %d\n", s.ioprio_class, s.ioprio_level);
    if (s.seccomp)
        puts("seccomp 1");
    if (s.rootfs)
        put_field("rootfs", s.rootfs);
    static const char *const join_names[SPEC_JOIN_COUNT] = {"ns.ipc", "ns.uts", "ns.pid"};
    for (int i = 0; i < SPEC_JOIN_COUNT; i++)
        if (s.join[i])
            put_field(join_names[i], s.join[i]);
    return 0;
}

static int run_seccomp(void)
{
    static unsigned char buf[2 * PC_MAX_PAYLOAD];
    char err[ERRTEXT_MAX];
    size_t len = fread(buf, 1, sizeof buf, stdin);
    if (seccomp_stash(7, buf, len, err, sizeof err) < 0) {
        put_field("error", err);
        return 0;
    }
    struct seccomp_prog *p = seccomp_take(7);
    printf("ok %u %u %u %u\n", p->flags, p->count, p->insns[0].k, p->insns[p->count - 1].k);
    free(p);
    return seccomp_take(7) ? 1 : 0;
}

static int unhex(const char *hex, unsigned char **out, size_t *len)
{
    size_t n = strlen(hex);
    if (n % 2)
        return -1;
    unsigned char *b = malloc(n / 2 + 1);
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) {
            free(b);
            return -1;
        }
        b[i] = (unsigned char)v;
    }
    *out = b;
    *len = n / 2;
    return 0;
}

static void drain_frames(void)
{
    struct frame f;
    struct host_msg m;
    char why[128];
    while (inq_frame_at(0, &f)) {
        printf("frame type=%u chan=%u len=%u", f.hdr.type, f.hdr.chan, f.hdr.len);
        if (frame_decode(&f, &m, why, sizeof why) < 0) {
            printf(" dropped ");
            put_str(why);
        } else if (m.type == PC_SIGNAL) {
            printf(" signal=%u flags=%u", m.signal.signo, m.signal.flags);
        } else if (m.type == PC_RESIZE) {
            printf(" rows=%u cols=%u", m.resize.rows, m.resize.cols);
        } else {
            /* The payload's bytes, summed, show it is the one that was sent. */
            unsigned long sum = 0;
            for (uint32_t i = 0; i < m.len; i++)
                sum += m.data[i];
            printf(" data_sum=%lu", sum);
        }
        putchar('\n');
        inq_consume_head(&f);
    }
}

static int run_frames(void)
{
    int p[2];
    unsigned char lenbuf[4];
    if (chan_init() < 0 || pipe2(p, O_NONBLOCK) < 0)
        return 2;
    while (fread(lenbuf, 1, 4, stdin) == 4) {
        size_t len = pc_get_le32(lenbuf), done = 0;
        unsigned char *chunk = malloc(len + 1);
        if (!chunk || fread(chunk, 1, len, stdin) != len) {
            fprintf(stderr, "short chunk\n");
            return 2;
        }
        /* A pipe holds less than a big frame: feed it in turns. */
        while (done < len) {
            ssize_t n = write(p[1], chunk + done, len - done);
            if (n > 0)
                done += (size_t)n;
            while (inq_has_room() && inq_fill(p[0]) > 0)
                ;
            if (!inq_has_room())
                drain_frames();
        }
        free(chunk);
        drain_frames();
        printf("buffered %zu\n", inq_buffered());
    }
    return 0;
}

static const char *const state_names[] = {"free", "new", "live", "exited", "ended"};

static struct ctr *known[4096];
static int nknown;

static struct ctr *lookup(const char *id)
{
    for (int i = nknown - 1; i >= 0; i--)
        if (known[i]->state != CTR_FREE && !strcmp(known[i]->id, id))
            return known[i];
    return NULL;
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own fd */
}

static char *next_field(char **s)
{
    char *f = *s, *sep = f ? strchr(f, ':') : NULL;
    if (sep)
        *sep++ = 0;
    *s = sep;
    return f;
}

static struct ctr *claim(const char *id, enum spec_role role)
{
    char err[ERRTEXT_MAX];
    struct ctr *c = NULL;
    if (ctr_claim(id, role, &c, err, sizeof err) < 0) {
        put_field("error", err);
        return NULL;
    }
    known[nknown++ % 4096] = c;
    return c;
}

/* OPs, one output line each: claim:ID:ROLE (ROLE any|init|exec), start:ID,
 * abandon:ID, hold:ID, release:ID, exited:ID, reported:ID, state:ID,
 * allended, fds, and fill:N:PREFIX, which claims and starts N containers
 * named PREFIX0, PREFIX1, ...  An ID is given in hex, so it may hold any byte. */
static int run_ctr(int argc, char **argv)
{
    static const enum spec_role roles[] = {SPEC_ROLE_ANY, SPEC_ROLE_INIT, SPEC_ROLE_EXEC};
    for (int i = 0; i < argc; i++) {
        char *rest = argv[i];
        char *op = next_field(&rest), *arg = next_field(&rest), *arg2 = next_field(&rest);
        char id[1024] = "";
        if (!strcmp(op, "fill")) {
            int n = atoi(arg), started = 0;
            for (int k = 0; k < n; k++) {
                snprintf(id, sizeof id, "%s%d", arg2, k);
                struct ctr *c = claim(id, SPEC_ROLE_ANY);
                if (!c)
                    break;
                started += ctr_started(c, getpid()) == 0;
            }
            printf("started %d\n", started);
            continue;
        }
        if (arg) {
            unsigned char *raw;
            size_t n;
            if (unhex(arg, &raw, &n) < 0 || n >= sizeof id) {
                fprintf(stderr, "bad id in op %d\n", i);
                return 2;
            }
            memcpy(id, raw, n);
            free(raw);
        }
        if (!strcmp(op, "claim")) {
            int r = 0;
            while (r < 2 && strcmp(arg2, role_names[r]))
                r++;
            struct ctr *c = claim(id, roles[r]);
            if (c)
                printf("ok %s\n", state_names[c->state]);
            continue;
        }
        struct ctr *c = arg ? lookup(id) : NULL;
        if (arg && !c) {
            printf("unknown\n");
        } else if (!strcmp(op, "start")) {
            printf("%s\n", ctr_started(c, getpid()) == 0 ? "ok" : strerror(errno));
        } else if (!strcmp(op, "abandon")) {
            ctr_abandon(c);
            puts("ok");
        } else if (!strcmp(op, "hold")) {
            ctr_hold(c);
            printf("procs %u\n", c->procs);
        } else if (!strcmp(op, "release")) {
            ctr_release(c);
            printf("procs %u\n", c->procs);
        } else if (!strcmp(op, "exited")) {
            ctr_init_exited(c);
            puts("ok");
        } else if (!strcmp(op, "reported")) {
            ctr_init_reported(c);
            puts("ok");
        } else if (!strcmp(op, "state")) {
            printf("%s\n", state_names[c->state]);
        } else if (!strcmp(op, "allended")) {
            printf("allended %d\n", ctr_all_ended());
        } else if (!strcmp(op, "fds")) {
            printf("fds %d\n", open_fds());
        } else {
            fprintf(stderr, "unknown op %s\n", op);
            return 2;
        }
    }
    return 0;
}

/* A LIMITS payload on stdin: "error TEXT", or "ok", the container and each
 * limit (max for SPEC_NO_LIMIT, 0 for none given). */
static int run_limits(void)
{
    static char buf[2 * PC_LIMITS_MAX];
    struct limits l;
    char err[ERRTEXT_MAX];
    size_t len = fread(buf, 1, sizeof buf, stdin);

    if (limits_parse(buf, len, &l, err, sizeof err) < 0) {
        put_field("error", err);
        return 0;
    }
    puts("ok");
    put_field("container", l.container);
    const uint64_t values[] = {l.memory_max, l.pids_max};
    const char *const names[] = {"memory.max", "pids.max"};
    for (int i = 0; i < 2; i++) {
        if (values[i] == SPEC_NO_LIMIT)
            printf("%s max\n", names[i]);
        else
            printf("%s %llu\n", names[i], (unsigned long long)values[i]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && !strcmp(argv[1], "spec"))
        return run_spec();
    if (argc >= 2 && !strcmp(argv[1], "frames"))
        return run_frames();
    if (argc >= 2 && !strcmp(argv[1], "ctr"))
        return run_ctr(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "seccomp"))
        return run_seccomp();
    if (argc >= 2 && !strcmp(argv[1], "limits"))
        return run_limits();
    fprintf(stderr, "usage: agent_harness spec|frames|ctr|seccomp|limits ...\n");
    return 2;
}
