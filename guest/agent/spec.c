/* Launch-spec parsing: NUL-terminated key=value records (docs/agent-protocol.md).
 *
 * Everything is checked here, before a process exists, so that the child's
 * setup code can trust the struct.  Unknown keys are rejected rather than
 * skipped: a key we do not understand may be a security setting the host
 * expects us to apply. */
#define _GNU_SOURCE
#include "spec.h"
#include "textfields.h"

#include "launch_spec.h"
#include "vm_proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(err, errlen, "spec: ");
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* Digits only: no sign, no spaces, no empty string, no overflow past max. */
static int parse_uint(const char *s, unsigned base, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (base == 16 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
        s += 2;
    if (!*s)
        return -1;
    for (; *s; s++) {
        unsigned d;
        if (*s >= '0' && *s <= '9')
            d = (unsigned)(*s - '0');
        else if (*s >= 'a' && *s <= 'f')
            d = (unsigned)(*s - 'a' + 10);
        else if (*s >= 'A' && *s <= 'F')
            d = (unsigned)(*s - 'A' + 10);
        else
            return -1;
        /* d > max first: max - d must not wrap (a one-digit "4" against max 3). */
        if (d >= base || d > max || v > (max - d) / base)
            return -1;
        v = v * base + d;
    }
    *out = v;
    return 0;
}

static int parse_bool(const char *s, int *out)
{
    if (strcmp(s, "0") && strcmp(s, "1"))
        return -1;
    *out = s[0] == '1';
    return 0;
}


/* "resource soft hard", single spaces. */
static int parse_rlimit(char *v, struct spec_rlimit *r)
{
    char *f[3];
    uint64_t res;
    if (split_fields(v, ' ', f, 3) || parse_uint(f[0], 10, RLIM_NLIMITS - 1, &res) ||
        parse_uint(f[1], 10, UINT64_MAX, &r->soft) || parse_uint(f[2], 10, UINT64_MAX, &r->hard) ||
        r->soft > r->hard)
        return -1;
    r->resource = (int)res;
    return 0;
}

/* One propagation type, maybe with MS_REC; or 0 where zero is allowed. */
static int propagation_ok(uint64_t v, int zero_ok)
{
    uint64_t type = v & ~(uint64_t)MS_REC;
    if (!v)
        return zero_ok;
    return type == MS_SHARED || type == MS_SLAVE || type == MS_PRIVATE || type == MS_UNBINDABLE;
}

/* The MOUNT_ATTR_* bits the r* options use: rdonly, nosuid, nodev, noexec,
 * the atime bits, nodiratime, nosymfollow. */
#define MOUNT_ATTRS_KNOWN 0x2000ffULL

/* dest \x1f type \x1f source \x1f flags \x1f data, then optionally
 * \x1f propagation \x1f attr_set \x1f attr_clr \x1f copyup (0 or 1). */
static int parse_mount(char *v, struct spec_mount *m)
{
    char *f[9];
    uint64_t flags, prop = 0, set = 0, clr = 0, copyup = 0;
    int n = 0;
    for (const char *c = v; *c; c++)
        n += *c == '\x1f';
    if ((n != 4 && n != 8) || split_fields(v, '\x1f', f, n + 1) || f[0][0] != '/' || !f[1][0] ||
        parse_uint(f[3], 10, (unsigned long)-1, &flags))
        return -1;
    if (n == 8 && (parse_uint(f[5], 10, UINT32_MAX, &prop) || !propagation_ok(prop, 1) ||
                   parse_uint(f[6], 10, MOUNT_ATTRS_KNOWN, &set) || (set & ~MOUNT_ATTRS_KNOWN) ||
                   parse_uint(f[7], 10, MOUNT_ATTRS_KNOWN, &clr) || (clr & ~MOUNT_ATTRS_KNOWN) ||
                   parse_uint(f[8], 10, 1, &copyup)))
        return -1;
    m->dest = f[0];
    m->type = f[1];
    m->source = f[2];
    m->flags = (unsigned long)flags;
    m->data = f[4];
    m->propagation = (unsigned long)prop;
    m->attr_set = set;
    m->attr_clr = clr;
    m->copyup = (int)copyup;
    return 0;
}

/* path \x1f type \x1f major \x1f minor \x1f mode (octal) \x1f uid \x1f gid.  The
 * path stays under /dev, where the container's own tmpfs is: no "..". */
static int parse_device(char *v, struct spec_device *d)
{
    char *f[7];
    uint64_t major, minor, mode, uid, gid;
    if (split_fields(v, '\x1f', f, 7) || strncmp(f[0], "/dev/", 5) || !f[0][5] ||
        strlen(f[0]) > PC_SPEC_MAX_PATH_LEN || strstr(f[0], "/../") ||
        (strlen(f[0]) >= 3 && !strcmp(f[0] + strlen(f[0]) - 3, "/..")) ||
        strlen(f[1]) != 1 || !strchr("cbp", f[1][0]) ||
        parse_uint(f[2], 10, 4095, &major) || parse_uint(f[3], 10, (1u << 20) - 1, &minor) ||
        parse_uint(f[4], 8, 07777, &mode) || parse_uint(f[5], 10, UINT32_MAX - 1, &uid) ||
        parse_uint(f[6], 10, UINT32_MAX - 1, &gid))
        return -1;
    d->path = f[0];
    d->type = f[1][0];
    d->major = (unsigned)major;
    d->minor = (unsigned)minor;
    d->mode = (unsigned)mode;
    d->uid = (uint32_t)uid;
    d->gid = (uint32_t)gid;
    return 0;
}

/* "inside outside size", single spaces; size at least 1, ranges in 32 bits. */
static int parse_idmap(char *v, struct spec_idmap *m)
{
    char *f[3];
    uint64_t in, out, size;
    if (split_fields(v, ' ', f, 3) || parse_uint(f[0], 10, UINT32_MAX - 1, &in) ||
        parse_uint(f[1], 10, UINT32_MAX - 1, &out) || parse_uint(f[2], 10, UINT32_MAX, &size) ||
        !size || in + size > UINT32_MAX || out + size > UINT32_MAX)
        return -1;
    m->inside = (uint32_t)in;
    m->outside = (uint32_t)out;
    m->size = (uint32_t)size;
    return 0;
}

/* "class level": one of the kernel's three classes, level 0..7. */
static int parse_ioprio(char *v, struct spec *s)
{
    char *f[2];
    uint64_t cls, level;
    if (split_fields(v, ' ', f, 2) || parse_uint(f[0], 10, PC_SPEC_IOPRIO_CLASS_IDLE, &cls) ||
        cls < PC_SPEC_IOPRIO_CLASS_RT || parse_uint(f[1], 10, PC_SPEC_IOPRIO_MAX_LEVEL, &level))
        return -1;
    s->ioprio_class = (int)cls;
    s->ioprio_level = (int)level;
    s->has_ioprio = 1;
    return 0;
}

/* "path=value": the path under /proc/sys, parts of [A-Za-z0-9_.-] joined by
 * single slashes, never "." or "..", so that it names a file there and no
 * other; the value is whatever the kernel is to parse, bounded. */
static int parse_sysctl(char *v, struct spec_sysctl *sc)
{
    static const char part_chars[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-";
    char *eq = strchr(v, '=');
    if (!eq || eq == v || (size_t)(eq - v) > PC_SPEC_MAX_SYSCTL_NAME ||
        strlen(eq + 1) > PC_SPEC_MAX_SYSCTL_VALUE)
        return -1;
    *eq = 0;
    for (char *part = v, *end; part; part = *end ? end + 1 : NULL) {
        end = strchrnul(part, '/');
        size_t n = (size_t)(end - part);
        if (!n || strspn(part, part_chars) < n ||
            (n == 1 && part[0] == '.') || (n == 2 && part[0] == '.' && part[1] == '.'))
            return -1;
    }
    sc->path = v;
    sc->value = eq + 1;
    return 0;
}

/* -1000..1000: an optional '-' then digits. */
static int parse_oom_score_adj(const char *v, int *out)
{
    int neg = v[0] == '-';
    uint64_t max = neg ? (uint64_t)-(int64_t)PC_SPEC_OOM_SCORE_ADJ_MIN : PC_SPEC_OOM_SCORE_ADJ_MAX;
    uint64_t n;
    if (parse_uint(v + neg, 10, max, &n))
        return -1;
    *out = neg ? -(int)n : (int)n;
    return 0;
}

/* An absolute path in the container, resolved there in the container's root. */
static int path_ok(const char *v)
{
    return v[0] == '/' && strlen(v) <= PC_SPEC_MAX_PATH_LEN;
}

/* A pod member's root: a directory under the pod share, named without "."
 * or ".." parts, so that it cannot lead out of the share. */
static int pod_path_ok(const char *v)
{
    size_t n = strlen(PC_PODSHARE_DIR);
    if (strncmp(v, PC_PODSHARE_DIR "/", n + 1) || strlen(v) > PC_SPEC_MAX_PATH_LEN)
        return 0;
    for (const char *part = v + n + 1; *part;) {
        size_t len = strcspn(part, "/");
        if (!len || (len == 1 && part[0] == '.') || (len == 2 && !strncmp(part, "..", 2)))
            return 0;
        part += len;
        if (*part)
            part++;
    }
    return v[strlen(v) - 1] != '/';
}

/* The id is only compared and quoted in one-line messages, never used as a
 * path, but '/' is kept out so that it could be one. */
static int container_id_ok(const char *id)
{
    size_t n = strlen(id);
    if (!n || n > PC_SPEC_MAX_CONTAINER_ID)
        return 0;
    for (const unsigned char *c = (const unsigned char *)id; *c; c++)
        if (*c < 0x20 || *c > 0x7e || *c == '/')
            return 0;
    return 1;
}

enum {
    ONCE_CWD, ONCE_UID, ONCE_GID, ONCE_UMASK, ONCE_NNP, ONCE_TERMINAL, ONCE_ROWS, ONCE_COLS,
    ONCE_HOSTNAME, ONCE_READONLY, ONCE_CONTAINER, ONCE_ROLE, ONCE_XGATES, ONCE_OOM,
    ONCE_USERNS, ONCE_ROOTPROP, ONCE_PERSONALITY, ONCE_IOPRIO, ONCE_SECCOMP, ONCE_ROOTFS,
    ONCE_MEMORY_MAX, ONCE_PIDS_MAX,
    ONCE_JOIN0, ONCE_CAP0 = ONCE_JOIN0 + SPEC_JOIN_COUNT,
    ONCE_COUNT = ONCE_CAP0 + SC_COUNT,
};
_Static_assert(ONCE_COUNT <= 32, "the keys seen once fit the parser's bit set");

static const char *const join_keys[SPEC_JOIN_COUNT] = {PC_KEY_NS_IPC, PC_KEY_NS_UTS, PC_KEY_NS_PID};

static const char *const cap_keys[SC_COUNT] = {
    PC_KEY_CAP_BOUNDING, PC_KEY_CAP_EFFECTIVE, PC_KEY_CAP_PERMITTED, PC_KEY_CAP_INHERITABLE,
    PC_KEY_CAP_AMBIENT,
};

int spec_parse(char *buf, size_t len, struct spec *s, char *err, size_t errlen)
{
    unsigned seen = 0;
    uint64_t n;
    /* Named in the error when the spec also says role=exec. */
    const char *init_key = NULL;

    memset(s, 0, sizeof *s);
    if (!len || buf[len - 1])
        return fail(err, errlen, "records must each end with a NUL byte");

    for (char *p = buf, *end = buf + len, *key, *val; p < end;) {
        if (next_record(&p, &key, &val) < 0)
            return fail(err, errlen, "record without '='");

#define ONCE(bit)                                                       \
    do {                                                                \
        if (seen & (1u << (bit)))                                       \
            return fail(err, errlen, "duplicate key %.40s", key);       \
        seen |= 1u << (bit);                                            \
    } while (0)
#define BAD() return fail(err, errlen, "bad value for %.40s", key)

        if (!strcmp(key, PC_KEY_CONTAINER)) {
            ONCE(ONCE_CONTAINER);
            if (!container_id_ok(val))
                return fail(err, errlen,
                            "container id must be 1 to %d printable ASCII characters, no '/'",
                            PC_SPEC_MAX_CONTAINER_ID);
            s->container = val;
        } else if (!strcmp(key, PC_KEY_ROLE)) {
            ONCE(ONCE_ROLE);
            if (!strcmp(val, "init"))
                s->role = SPEC_ROLE_INIT;
            else if (!strcmp(val, "exec"))
                s->role = SPEC_ROLE_EXEC;
            else
                BAD();
        } else if (!strcmp(key, PC_KEY_ARG)) {
            if (s->argc >= PC_SPEC_MAX_ARGS)
                return fail(err, errlen, "more than %d args", PC_SPEC_MAX_ARGS);
            s->argv[s->argc++] = val;
        } else if (!strcmp(key, PC_KEY_ENV)) {
            if (s->envc >= PC_SPEC_MAX_ENV)
                return fail(err, errlen, "more than %d env entries", PC_SPEC_MAX_ENV);
            if (val[0] == '=' || !strchr(val, '='))
                BAD();
            s->envp[s->envc++] = val;
        } else if (!strcmp(key, PC_KEY_CWD)) {
            ONCE(ONCE_CWD);
            if (val[0] != '/')
                BAD();
            s->cwd = val;
        } else if (!strcmp(key, PC_KEY_UID)) {
            ONCE(ONCE_UID);
            if (parse_uint(val, 10, UINT32_MAX - 1, &n))
                BAD();
            s->uid = (uint32_t)n;
        } else if (!strcmp(key, PC_KEY_GID)) {
            ONCE(ONCE_GID);
            if (parse_uint(val, 10, UINT32_MAX - 1, &n))
                BAD();
            s->gid = (uint32_t)n;
        } else if (!strcmp(key, PC_KEY_GID_ADD)) {
            if (s->ngids >= PC_SPEC_MAX_GIDS)
                return fail(err, errlen, "more than %d additional gids", PC_SPEC_MAX_GIDS);
            if (parse_uint(val, 10, UINT32_MAX - 1, &n))
                BAD();
            s->gids[s->ngids++] = (uint32_t)n;
        } else if (!strcmp(key, PC_KEY_UMASK)) {
            ONCE(ONCE_UMASK);
            if (parse_uint(val, 8, 0777, &n))
                BAD();
            s->umask = (unsigned)n;
            s->has_umask = 1;
        } else if (!strcmp(key, PC_KEY_RLIMIT)) {
            if (s->nrlimits >= PC_SPEC_MAX_RLIMITS)
                return fail(err, errlen, "more than %d rlimits", PC_SPEC_MAX_RLIMITS);
            if (parse_rlimit(val, &s->rlimits[s->nrlimits]))
                BAD();
            s->nrlimits++;
        } else if (!strcmp(key, PC_KEY_NNP)) {
            ONCE(ONCE_NNP);
            if (parse_bool(val, &s->nnp))
                BAD();
        } else if (!strncmp(key, PC_KEY_CAP_PREFIX, strlen(PC_KEY_CAP_PREFIX))) {
            int i;
            for (i = 0; i < SC_COUNT && strcmp(key, cap_keys[i]); i++)
                ;
            if (i == SC_COUNT)
                return fail(err, errlen, "unknown key %.40s", key);
            ONCE(ONCE_CAP0 + i);
            if (parse_uint(val, 16, UINT64_MAX, &s->caps[i]))
                BAD();
            s->caps_given |= 1u << i;
        } else if (!strcmp(key, PC_KEY_OOM_SCORE_ADJ)) {
            ONCE(ONCE_OOM);
            if (parse_oom_score_adj(val, &s->oom_score_adj))
                BAD();
            s->has_oom_score_adj = 1;
        } else if (!strcmp(key, PC_KEY_TERMINAL)) {
            ONCE(ONCE_TERMINAL);
            if (parse_bool(val, &s->terminal))
                BAD();
        } else if (!strcmp(key, PC_KEY_ROWS)) {
            ONCE(ONCE_ROWS);
            if (parse_uint(val, 10, UINT16_MAX, &n))
                BAD();
            s->rows = (unsigned)n;
        } else if (!strcmp(key, PC_KEY_COLS)) {
            ONCE(ONCE_COLS);
            if (parse_uint(val, 10, UINT16_MAX, &n))
                BAD();
            s->cols = (unsigned)n;
        } else if (!strcmp(key, PC_KEY_HOSTNAME)) {
            ONCE(ONCE_HOSTNAME);
            if (strlen(val) > 64) /* HOST_NAME_MAX */
                BAD();
            s->hostname = val;
            init_key = init_key ? init_key : PC_KEY_HOSTNAME;
        } else if (!strcmp(key, PC_KEY_ROOT_READONLY)) {
            ONCE(ONCE_READONLY);
            if (parse_bool(val, &s->root_readonly))
                BAD();
            init_key = init_key ? init_key : PC_KEY_ROOT_READONLY;
        } else if (!strcmp(key, PC_KEY_XGATES)) {
            ONCE(ONCE_XGATES);
            if (strcmp(val, "on"))
                BAD();
            s->xgates = 1;
            init_key = init_key ? init_key : PC_KEY_XGATES;
        } else if (!strcmp(key, PC_KEY_ROOTFS)) {
            ONCE(ONCE_ROOTFS);
            if (!pod_path_ok(val))
                BAD();
            s->rootfs = val;
            init_key = init_key ? init_key : PC_KEY_ROOTFS;
        } else if (!strncmp(key, PC_KEY_NS_PREFIX, strlen(PC_KEY_NS_PREFIX))) {
            int i;
            for (i = 0; i < SPEC_JOIN_COUNT && strcmp(key, join_keys[i]); i++)
                ;
            if (i == SPEC_JOIN_COUNT)
                return fail(err, errlen, "unknown key %.40s", key);
            ONCE(ONCE_JOIN0 + i);
            if (!container_id_ok(val))
                BAD();
            s->join[i] = val;
            init_key = init_key ? init_key : key;
        } else if (!strcmp(key, PC_KEY_MOUNT)) {
            if (s->nmounts >= PC_SPEC_MAX_MOUNTS)
                return fail(err, errlen, "more than %d mounts", PC_SPEC_MAX_MOUNTS);
            if (parse_mount(val, &s->mounts[s->nmounts]))
                BAD();
            s->nmounts++;
            init_key = init_key ? init_key : PC_KEY_MOUNT;
        } else if (!strcmp(key, PC_KEY_SYSCTL)) {
            if (s->nsysctls >= PC_SPEC_MAX_SYSCTLS)
                return fail(err, errlen, "more than %d sysctls", PC_SPEC_MAX_SYSCTLS);
            if (parse_sysctl(val, &s->sysctls[s->nsysctls]))
                BAD();
            s->nsysctls++;
            init_key = init_key ? init_key : PC_KEY_SYSCTL;
        } else if (!strcmp(key, PC_KEY_PATH_READONLY) || !strcmp(key, PC_KEY_PATH_MASKED)) {
            int ro = key[5] == 'r';
            int *n = ro ? &s->nreadonly_paths : &s->nmasked_paths;
            if (*n >= PC_SPEC_MAX_PATHS)
                return fail(err, errlen, "more than %d %s", PC_SPEC_MAX_PATHS,
                            ro ? "read-only paths" : "masked paths");
            if (!path_ok(val))
                BAD();
            (ro ? s->readonly_paths : s->masked_paths)[(*n)++] = val;
            init_key = init_key ? init_key : key;
        } else if (!strcmp(key, PC_KEY_DEVICE)) {
            if (s->ndevices >= PC_SPEC_MAX_DEVICES)
                return fail(err, errlen, "more than %d devices", PC_SPEC_MAX_DEVICES);
            if (parse_device(val, &s->devices[s->ndevices]))
                BAD();
            s->ndevices++;
            init_key = init_key ? init_key : PC_KEY_DEVICE;
        } else if (!strcmp(key, PC_KEY_USERNS)) {
            ONCE(ONCE_USERNS);
            if (parse_bool(val, &s->userns))
                BAD();
            init_key = init_key ? init_key : PC_KEY_USERNS;
        } else if (!strcmp(key, PC_KEY_UIDMAP) || !strcmp(key, PC_KEY_GIDMAP)) {
            int uid = key[0] == 'u';
            int *n = uid ? &s->nuidmap : &s->ngidmap;
            if (*n >= PC_SPEC_MAX_ID_MAPS)
                return fail(err, errlen, "more than %d %s lines", PC_SPEC_MAX_ID_MAPS, key);
            if (parse_idmap(val, &(uid ? s->uidmap : s->gidmap)[*n]))
                BAD();
            (*n)++;
            init_key = init_key ? init_key : key;
        } else if (!strcmp(key, PC_KEY_ROOT_PROPAGATION)) {
            ONCE(ONCE_ROOTPROP);
            if (parse_uint(val, 10, UINT32_MAX, &n) || !propagation_ok(n, 0))
                BAD();
            s->root_propagation = (unsigned long)n;
            init_key = init_key ? init_key : PC_KEY_ROOT_PROPAGATION;
        } else if (!strcmp(key, PC_KEY_PERSONALITY)) {
            ONCE(ONCE_PERSONALITY);
            if (parse_uint(val, 10, PC_SPEC_PER_LINUX32, &n) ||
                (n != PC_SPEC_PER_LINUX && n != PC_SPEC_PER_LINUX32))
                BAD();
            s->personality = (unsigned long)n;
            s->has_personality = 1;
            init_key = init_key ? init_key : PC_KEY_PERSONALITY;
        } else if (!strcmp(key, PC_KEY_IOPRIO)) {
            ONCE(ONCE_IOPRIO);
            if (parse_ioprio(val, s))
                BAD();
        } else if (!strcmp(key, PC_KEY_MEMORY_MAX) || !strcmp(key, PC_KEY_PIDS_MAX)) {
            int memory = key[0] == 'm';
            ONCE(memory ? ONCE_MEMORY_MAX : ONCE_PIDS_MAX);
            if (parse_uint(val, 10, INT64_MAX, &n) || !n)
                BAD();
            *(memory ? &s->memory_max : &s->pids_max) = n;
            init_key = init_key ? init_key : key;
        } else if (!strcmp(key, PC_KEY_SECCOMP)) {
            ONCE(ONCE_SECCOMP);
            if (parse_bool(val, &s->seccomp))
                BAD();
            init_key = init_key ? init_key : PC_KEY_SECCOMP;
        } else {
            return fail(err, errlen, "unknown key %.40s", key);
        }
#undef ONCE
#undef BAD
    }

    if (!s->container)
        return fail(err, errlen, "no container given");
    if (init_key) {
        /* Only an init sets up the container's filesystem and hostname; an
         * exec that carried them would silently not get them. */
        if (s->role == SPEC_ROLE_EXEC)
            return fail(err, errlen, "%s is for a container's init, not for role=exec", init_key);
        s->role = SPEC_ROLE_INIT;
    }
    if (!s->argc || !s->argv[0][0])
        return fail(err, errlen, "no arg given");
    /* Both maps or neither, and only with the namespace they are for. */
    if (s->userns != (s->nuidmap > 0) || s->userns != (s->ngidmap > 0))
        return fail(err, errlen, "userns=1 needs uidmap and gidmap lines, and they need userns=1");
    {
        /* The kernel takes a map in one write of less than a page. */
        size_t text[2] = {0, 0};
        char line[48];
        for (int i = 0; i < s->nuidmap; i++)
            text[0] += (size_t)snprintf(line, sizeof line, "%u %u %u\n", s->uidmap[i].inside,
                                        s->uidmap[i].outside, s->uidmap[i].size);
        for (int i = 0; i < s->ngidmap; i++)
            text[1] += (size_t)snprintf(line, sizeof line, "%u %u %u\n", s->gidmap[i].inside,
                                        s->gidmap[i].outside, s->gidmap[i].size);
        if (text[0] > PC_SPEC_MAX_ID_MAP_TEXT || text[1] > PC_SPEC_MAX_ID_MAP_TEXT)
            return fail(err, errlen, "an id map is longer than %d bytes", PC_SPEC_MAX_ID_MAP_TEXT);
    }
    s->argv[s->argc] = NULL;
    s->envp[s->envc] = NULL;
    return 0;
}

/* `max`, or 1..INT64_MAX: 0 and the value, or -1. */
static int parse_limit(const char *v, uint64_t *out)
{
    if (!strcmp(v, "max")) {
        *out = SPEC_NO_LIMIT;
        return 0;
    }
    return parse_uint(v, 10, INT64_MAX, out) || !*out ? -1 : 0;
}

int limits_parse(char *buf, size_t len, struct limits *l, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    if (!len || len > PC_LIMITS_MAX || buf[len - 1]) {
        snprintf(err, errlen, "limits: at most %d bytes of records, each ending with NUL",
                 PC_LIMITS_MAX);
        return -1;
    }
    for (char *p = buf, *end = buf + len, *key, *val; p < end;) {
        if (next_record(&p, &key, &val) < 0) {
            snprintf(err, errlen, "limits: record without '='");
            return -1;
        }
        uint64_t *slot = !strcmp(key, PC_KEY_MEMORY_MAX) ? &l->memory_max
                       : !strcmp(key, PC_KEY_PIDS_MAX) ? &l->pids_max : NULL;
        int ok;
        if (!strcmp(key, PC_KEY_CONTAINER)) {
            ok = !l->container && container_id_ok(val);
            if (ok)
                l->container = val;
        } else {
            ok = slot && !*slot && parse_limit(val, slot) == 0;
        }
        if (!ok) {
            snprintf(err, errlen, "limits: bad or repeated record %.40s", key);
            return -1;
        }
    }
    if (!l->container || (!l->memory_max && !l->pids_max)) {
        snprintf(err, errlen, "limits: a container and at least one limit are needed");
        return -1;
    }
    return 0;
}
