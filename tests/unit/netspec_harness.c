/* Runs the agent's network-record parser on the host, for
 * tests/unit/test_agent_netspec.py.  Compiled with the agent's own netspec.c,
 * sandboxspec.c and spec.c, so the tests exercise the code that runs in the guest.
 *
 *   netspec_harness sandbox < PAYLOAD  a SANDBOX payload through sandbox_parse
 *   netspec_harness forked < PAYLOAD   a FORKED payload through sandbox_parse_forked
 *   netspec_harness start < PAYLOAD    a START payload through netspec_parse
 *   netspec_harness spec < PAYLOAD     a launch spec through spec_parse (no network)
 *
 * Prints "ok" and one line per parsed interface, address, route and spare,
 * or "error <text>". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "netspec.h"
#include "sandboxspec.h"
#include "spec.h"

static void mac(const unsigned char *m)
{
    printf("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
}

static void ip(int family, const unsigned char *a)
{
    char text[INET6_ADDRSTRLEN];
    printf("%s", inet_ntop(family, a, text, sizeof text) ? text : "?");
}

static void show(const struct net_spec *n)
{
    puts("ok");
    for (int i = 0; i < n->nifaces; i++) {
        printf("if %s ", n->ifaces[i].name);
        mac(n->ifaces[i].mac);
        printf(" %u", n->ifaces[i].mtu);
        if (n->ifaces[i].has_dev_mac) {
            putchar(' ');
            mac(n->ifaces[i].dev_mac);
        }
        putchar('\n');
    }
    for (int i = 0; i < n->naddrs; i++) {
        printf("addr %d ", n->addrs[i].iface);
        ip(n->addrs[i].family, n->addrs[i].addr);
        printf("/%u\n", n->addrs[i].prefixlen);
    }
    for (int i = 0; i < n->nroutes; i++) {
        const struct net_route *r = &n->routes[i];
        printf("route %d ", r->iface);
        ip(r->family, r->dst);
        printf("/%u via ", r->dst_len);
        if (r->has_gateway)
            ip(r->family, r->gateway);
        else
            printf("-");
        printf(" metric %u onlink %d\n", r->metric, r->onlink);
    }
    for (int i = 0; i < n->nspares; i++) {
        printf("spare ");
        mac(n->spares[i]);
        putchar('\n');
    }
}

int main(int argc, char **argv)
{
    static char buf[4 * PC_MAX_PAYLOAD];
    static struct spec s;
    static struct sandbox_spec sb;
    static struct net_spec n;
    char err[512];
    size_t len = fread(buf, 1, sizeof buf, stdin);
    const char *mode = argc == 2 ? argv[1] : "";
    int rc;
    int forked = !strcmp(mode, "forked");
    if (forked)
        mode = "sandbox";
    if (!strcmp(mode, "sandbox"))
        rc = forked ? sandbox_parse_forked(buf, len, &sb, err, sizeof err)
                    : sandbox_parse(buf, len, &sb, err, sizeof err);
    else if (!strcmp(mode, "start"))
        rc = netspec_parse(buf, len, &n, err, sizeof err);
    else if (!strcmp(mode, "spec"))
        rc = spec_parse(buf, len, &s, err, sizeof err);
    else
        return 2;
    if (rc) {
        printf("error %s\n", err);
        return 0;
    }
    if (!strcmp(mode, "spec")) {
        puts("ok");
        return 0;
    }
    show(!strcmp(mode, "sandbox") ? &sb.net : &n);
    if (!strcmp(mode, "sandbox")) {
        for (int i = 0; i < PC_SANDBOX_MAX_SHARES; i++)
            if (sb.shares[i])
                printf("share %s\n", SANDBOX_SHARES[i].tag);
        if (sb.hostname)
            printf("hostname %s\n", sb.hostname);
        if (sb.has_clock)
            printf("clock %lld.%09ld\n", (long long)sb.clock.tv_sec, sb.clock.tv_nsec);
        if (sb.nentropy)
            printf("entropy %zu\n", sb.nentropy);
        if (sb.container)
            printf("container %s\n", sb.container);
        if (sb.machine_id)
            printf("machineid %s\n", sb.machine_id);
        if (sb.rootdisk)
            printf("rootdisk %s\n", sb.rootdisk == ROOTDISK_RW ? "rw" : "ro");
        for (int i = 0; i < sb.nhostfiles; i++) {
            printf("hostfile %u ", sb.hostfiles[i].slot);
            fwrite(sb.hostfiles[i].bytes, 1, sb.hostfiles[i].len, stdout);
            printf("\n");
        }
    }
    return 0;
}
