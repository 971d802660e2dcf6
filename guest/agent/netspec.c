/* Network records of the launch spec: checked here as hostile input, so that
 * net.c applies only well-formed, bounded values.
 *
 *   net.if=NAME \x1f MAC \x1f MTU [\x1f DEVICE_MAC]
 *   net.addr=N \x1f ADDRESS/PREFIX
 *   net.route=N \x1f DST/PREFIX \x1f GATEWAY \x1f METRIC \x1f ONLINK
 *   net.spare=MAC
 *
 * N is the place of an interface given before, from 0.  DEVICE_MAC names a
 * spare device (net.spare, in the init's SPEC) that the interface takes over. */
#define _GNU_SOURCE
#include "netspec.h"
#include "launch_spec.h"
#include "textfields.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#define SEP '\x1f'

int netspec_is_key(const char *key)
{
    return !strcmp(key, PC_KEY_NET_IF) || !strcmp(key, PC_KEY_NET_ADDR) || !strcmp(key, PC_KEY_NET_ROUTE) ||
           !strcmp(key, PC_KEY_NET_SPARE);
}


/* Decimal digits only, at most max. */
static int number(const char *s, unsigned long long max, unsigned long long *out)
{
    unsigned long long v = 0;
    if (!*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (max - (unsigned)(*s - '0')) / 10)
            return -1;
        v = v * 10 + (unsigned)(*s - '0');
    }
    *out = v;
    return 0;
}

/* What the kernel's dev_valid_name takes, less control characters. */
static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (!n || n > PC_NET_IFNAME_MAX || !strcmp(s, ".") || !strcmp(s, ".."))
        return 0;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        if (*c <= 0x20 || *c >= 0x7f || *c == '/' || *c == ':')
            return 0;
    return 1;
}

static int hexdigit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* xx:xx:xx:xx:xx:xx, unicast, not all zero. */
static int parse_mac(const char *s, unsigned char mac[6])
{
    if (strlen(s) != 17)
        return -1;
    unsigned char any = 0;
    for (int i = 0; i < 6; i++) {
        int hi = hexdigit(s[3 * i]), lo = hexdigit(s[3 * i + 1]);
        if (hi < 0 || lo < 0 || (i < 5 && s[3 * i + 2] != ':'))
            return -1;
        mac[i] = (unsigned char)(hi << 4 | lo);
        any |= mac[i];
    }
    return (mac[0] & 1) || !any ? -1 : 0;
}

/* An IPv4 or IPv6 address; *family tells which. */
static int parse_ip(const char *s, int *family, unsigned char out[16])
{
    memset(out, 0, 16);
    *family = strchr(s, ':') ? AF_INET6 : AF_INET;
    return inet_pton(*family, s, out) == 1 ? 0 : -1;
}

/* ADDRESS/PREFIX */
static int parse_prefix(char *s, int *family, unsigned char addr[16], unsigned *len)
{
    unsigned long long n;
    char *slash = strchr(s, '/');
    if (!slash)
        return -1;
    *slash = 0;
    if (parse_ip(s, family, addr) || number(slash + 1, *family == AF_INET ? 32 : 128, &n))
        return -1;
    *len = (unsigned)n;
    return 0;
}

/* The kernel refuses a route whose destination has host bits set. */
static int host_bits_clear(const unsigned char dst[16], unsigned len, int family)
{
    unsigned bytes = family == AF_INET ? 4 : 16;
    for (unsigned bit = len; bit < bytes * 8; bit++)
        if (dst[bit / 8] & (0x80 >> (bit % 8)))
            return 0;
    return 1;
}

static int iface_ref(const struct net_spec *n, const char *s, int *out)
{
    unsigned long long v;
    if (number(s, PC_NET_MAX_IFACES - 1, &v) || (int)v >= n->nifaces)
        return -1;
    *out = (int)v;
    return 0;
}

static int add_iface(struct net_spec *n, char *val)
{
    char *f[4];
    unsigned long long mtu;
    struct net_iface *i = &n->ifaces[n->nifaces];
    int seps = 0;
    for (const char *c = val; *c; c++)
        seps += *c == SEP;
    int nf = seps == 3 ? 4 : 3;
    if (split_fields(val, SEP, f, nf) || !name_ok(f[0]) || parse_mac(f[1], i->mac) ||
        number(f[2], PC_NET_MTU_MAX, &mtu) || mtu < PC_NET_MTU_MIN)
        return -1;
    i->has_dev_mac = nf == 4;
    if (i->has_dev_mac && parse_mac(f[3], i->dev_mac))
        return -1;
    for (int k = 0; k < n->nifaces; k++)
        if (!strcmp(n->ifaces[k].name, f[0]) || !memcmp(n->ifaces[k].mac, i->mac, 6) ||
            (i->has_dev_mac && n->ifaces[k].has_dev_mac &&
             !memcmp(n->ifaces[k].dev_mac, i->dev_mac, 6)))
            return -1;
    strcpy(i->name, f[0]);
    i->mtu = (unsigned)mtu;
    n->nifaces++;
    return 0;
}

static int add_addr(struct net_spec *n, char *val)
{
    char *f[2];
    struct net_addr *a = &n->addrs[n->naddrs];
    if (split_fields(val, SEP, f, 2) || iface_ref(n, f[0], &a->iface) ||
        parse_prefix(f[1], &a->family, a->addr, &a->prefixlen))
        return -1;
    n->naddrs++;
    return 0;
}

static int add_route(struct net_spec *n, char *val)
{
    char *f[5];
    unsigned long long metric;
    int gw_family;
    struct net_route *r = &n->routes[n->nroutes];
    if (split_fields(val, SEP, f, 5) || iface_ref(n, f[0], &r->iface) ||
        parse_prefix(f[1], &r->family, r->dst, &r->dst_len) ||
        !host_bits_clear(r->dst, r->dst_len, r->family) ||
        number(f[3], UINT32_MAX, &metric) || (strcmp(f[4], "0") && strcmp(f[4], "1")))
        return -1;
    r->has_gateway = f[2][0] != 0;
    if (r->has_gateway && (parse_ip(f[2], &gw_family, r->gateway) || gw_family != r->family))
        return -1;
    r->metric = (uint32_t)metric;
    r->onlink = f[4][0] == '1';
    n->nroutes++;
    return 0;
}

int netspec_add(struct net_spec *n, const char *key, char *val, char *err, size_t errlen)
{
    int rc;
    if (!strcmp(key, PC_KEY_NET_IF)) {
        if (n->nifaces >= PC_NET_MAX_IFACES) {
            snprintf(err, errlen, "spec: more than %d network interfaces", PC_NET_MAX_IFACES);
            return -1;
        }
        rc = add_iface(n, val);
    } else if (!strcmp(key, PC_KEY_NET_ADDR)) {
        if (n->naddrs >= PC_NET_MAX_ADDRS) {
            snprintf(err, errlen, "spec: more than %d network addresses", PC_NET_MAX_ADDRS);
            return -1;
        }
        rc = add_addr(n, val);
    } else if (!strcmp(key, PC_KEY_NET_SPARE)) {
        if (n->nspares >= PC_NET_MAX_SPARES) {
            snprintf(err, errlen, "spec: more than %d spare network devices", PC_NET_MAX_SPARES);
            return -1;
        }
        rc = parse_mac(val, n->spares[n->nspares]);
        for (int k = 0; !rc && k < n->nspares; k++)
            rc = memcmp(n->spares[k], n->spares[n->nspares], 6) ? 0 : -1;
        if (!rc)
            n->nspares++;
    } else {
        if (n->nroutes >= PC_NET_MAX_ROUTES) {
            snprintf(err, errlen, "spec: more than %d routes", PC_NET_MAX_ROUTES);
            return -1;
        }
        rc = add_route(n, val);
    }
    if (rc)
        snprintf(err, errlen, "spec: bad value for %.40s", key);
    return rc;
}

int netspec_parse(char *buf, size_t len, struct net_spec *n, char *err, size_t errlen)
{
    memset(n, 0, sizeof *n);
    if (!len || buf[len - 1]) {
        snprintf(err, errlen, "spec: records must each end with a NUL byte");
        return -1;
    }
    for (char *p = buf, *end = buf + len, *key, *val; p < end;) {
        if (next_record(&p, &key, &val) < 0) {
            snprintf(err, errlen, "spec: record without '='");
            return -1;
        }
        /* Spares are the init's to declare; START only hands them out. */
        if (!netspec_is_key(key) || !strcmp(key, PC_KEY_NET_SPARE)) {
            snprintf(err, errlen, "spec: unknown key %.40s", key);
            return -1;
        }
        if (netspec_add(n, key, val, err, errlen))
            return -1;
    }
    return 0;
}
