/* SANDBOX records (docs/agent-protocol.md): parsed and bounded in full
 * before anything is applied (sandbox.c), so a bad one leaves the VM as it
 * was.  Pure parsing: tests/unit/netspec_harness.c runs it on the host. */
#define _GNU_SOURCE
#include "sandboxspec.h"
#include "textfields.h"

#include <stdio.h>
#include <string.h>

#include "launch_spec.h"
#include "vm_proto.h"

const struct sandbox_share SANDBOX_SHARES[PC_SANDBOX_MAX_SHARES] = {
    {PC_ROOTFS_TAG, PC_ROOTFS_DIR},
    {PC_HOSTSHARE_TAG, PC_HOSTSHARE_DIR},
    {PC_PODSHARE_TAG, PC_PODSHARE_DIR},
};

static int fail(char *err, size_t errlen, const char *what, const char *key)
{
    snprintf(err, errlen, "sandbox: %s%s%.40s", what, key ? " " : "", key ? key : "");
    return -1;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Lowercase hex, an even number of digits. */
static int parse_hex(const char *v, unsigned char *out, size_t max, size_t *n)
{
    size_t len = strlen(v);
    if (len % 2 || len / 2 > max)
        return -1;
    for (size_t i = 0; i < len / 2; i++) {
        int hi = hexval(v[2 * i]), lo = hexval(v[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    *n = len / 2;
    return 0;
}

/* "SEC.NSEC": decimal seconds, then exactly nine digits. */
static int parse_clock(const char *v, struct timespec *ts)
{
    const char *dot = strchr(v, '.');
    if (!dot || dot == v || dot - v > 12 || strlen(dot + 1) != 9)
        return -1;
    long long sec = 0, nsec = 0;
    for (const char *p = v; p < dot; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        sec = sec * 10 + (*p - '0');
    }
    for (const char *p = dot + 1; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        nsec = nsec * 10 + (*p - '0');
    }
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)nsec;
    return 0;
}

static int valid_hostname(const char *v)
{
    size_t n = strlen(v);
    if (!n || n > PC_SANDBOX_HOSTNAME_MAX)
        return 0;
    for (const char *p = v; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
            return 0;
    return 1;
}

/* "SLOT:HEX", decoded over its own text: the bytes stay in the buffer. */
static int add_hostfile(struct sandbox_spec *s, char *val, char *err, size_t errlen)
{
    char *colon = strchr(val, ':');
    if (s->nhostfiles == PC_SANDBOX_MAX_HOSTFILES || !colon || colon == val || colon - val > 2)
        return fail(err, errlen, "bad or too many", PC_KEY_HOSTFILE);
    unsigned slot = 0;
    for (const char *p = val; p < colon; p++) {
        if (*p < '0' || *p > '9')
            return fail(err, errlen, "bad slot in", PC_KEY_HOSTFILE);
        slot = slot * 10 + (unsigned)(*p - '0');
    }
    for (int i = 0; i < s->nhostfiles; i++)
        if (s->hostfiles[i].slot == slot)
            return fail(err, errlen, "slot given twice in", PC_KEY_HOSTFILE);
    size_t n;
    unsigned char *out = (unsigned char *)colon + 1;
    if (parse_hex(colon + 1, out, PC_SANDBOX_HOSTFILE_MAX, &n))
        return fail(err, errlen, "bad content in", PC_KEY_HOSTFILE);
    s->hostfiles[s->nhostfiles].slot = slot;
    s->hostfiles[s->nhostfiles].bytes = out;
    s->hostfiles[s->nhostfiles].len = n;
    s->nhostfiles++;
    return 0;
}

static int add_record(struct sandbox_spec *s, const char *key, char *val, char *err, size_t errlen)
{
    if (!strcmp(key, PC_KEY_SHARE)) {
        for (int i = 0; i < PC_SANDBOX_MAX_SHARES; i++) {
            if (!strcmp(val, SANDBOX_SHARES[i].tag)) {
                if (s->shares[i])
                    return fail(err, errlen, "share given twice:", val);
                s->shares[i] = 1;
                return 0;
            }
        }
        return fail(err, errlen, "unknown share", val);
    }
    if (!strcmp(key, PC_KEY_HOSTNAME)) {
        if (s->hostname || !valid_hostname(val))
            return fail(err, errlen, "bad or repeated", key);
        s->hostname = val;
        return 0;
    }
    if (!strcmp(key, PC_KEY_CLOCK)) {
        if (s->has_clock || parse_clock(val, &s->clock))
            return fail(err, errlen, "bad or repeated", key);
        s->has_clock = 1;
        return 0;
    }
    if (!strcmp(key, PC_KEY_ENTROPY)) {
        if (s->nentropy || parse_hex(val, s->entropy, sizeof s->entropy, &s->nentropy) ||
            s->nentropy < PC_SANDBOX_ENTROPY_MIN)
            return fail(err, errlen, "bad or repeated", key);
        return 0;
    }
    if (!strcmp(key, PC_KEY_ROOTDISK)) {
        int mode = !strcmp(val, "ro") ? ROOTDISK_RO : !strcmp(val, "rw") ? ROOTDISK_RW : 0;
        if (s->rootdisk || !mode)
            return fail(err, errlen, "bad or repeated", key);
        s->rootdisk = mode;
        return 0;
    }
    if (!strcmp(key, PC_KEY_HOSTFILE))
        return add_hostfile(s, val, err, errlen);
    if (!s->forked && (!strcmp(key, PC_KEY_CONTAINER) || !strcmp(key, PC_KEY_MACHINE_ID)))
        return fail(err, errlen, "unknown key", key);
    if (!strcmp(key, PC_KEY_CONTAINER)) {
        size_t n = strlen(val);
        if (s->container || !n || n > PC_SPEC_MAX_CONTAINER_ID || !valid_hostname(val))
            return fail(err, errlen, "bad or repeated", key);
        s->container = val;
        return 0;
    }
    if (!strcmp(key, PC_KEY_MACHINE_ID)) {
        if (s->machine_id || strlen(val) != 32 || strspn(val, "0123456789abcdef") != 32)
            return fail(err, errlen, "bad or repeated", key);
        s->machine_id = val;
        return 0;
    }
    if (netspec_is_key(key)) {
        return netspec_add(&s->net, key, val, err, errlen);
    }
    return fail(err, errlen, "unknown key", key);
}

static int parse(char *buf, size_t len, struct sandbox_spec *s, int forked, char *err,
                 size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->forked = forked;
    if (len && buf[len - 1])
        return fail(err, errlen, "records must each end with a NUL byte", NULL);
    for (char *p = buf, *end = buf + len, *key, *val; p < end;) {
        if (next_record(&p, &key, &val) < 0)
            return fail(err, errlen, "record without '='", NULL);
        if (add_record(s, key, val, err, errlen))
            return -1;
    }
    /* A snapshot-mode VM has its rootfs on the disk and its host files copied
     * in, never a share in their place. */
    if (s->rootdisk && s->shares[0])
        return fail(err, errlen, "a rootdisk and a rootfs share", NULL);
    if (s->nhostfiles && (!s->rootdisk || s->shares[1]))
        return fail(err, errlen, "hostfile records without a rootdisk, or with the host share",
                    NULL);
    /* A fork's interfaces go on the VM's devices by place (net_fork): it
     * names no spare and no device to find by MAC. */
    int dev_mac = 0;
    for (int i = 0; i < s->net.nifaces; i++)
        dev_mac |= s->net.ifaces[i].has_dev_mac;
    if (forked && (s->net.nspares || dev_mac))
        return fail(err, errlen, "a fork's interfaces name no spare and no device MAC", NULL);
    return 0;
}


int sandbox_parse(char *buf, size_t len, struct sandbox_spec *s, char *err, size_t errlen)
{
    return parse(buf, len, s, 0, err, errlen);
}

int sandbox_parse_forked(char *buf, size_t len, struct sandbox_spec *s, char *err,
                         size_t errlen)
{
    return parse(buf, len, s, 1, err, errlen);
}
