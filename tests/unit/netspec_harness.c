/* Runs the agent's network-record parser on the host, for
 * tests/unit/test_agent_netspec.py.  Compiled with the agent's own netspec.c
 * and spec.c, so the tests exercise the code that runs in the guest.
 *
 *   netspec_harness init < PAYLOAD     a whole launch spec through spec_parse
 *   netspec_harness start < PAYLOAD    a START payload through netspec_parse
 *
 * Prints "ok" and one line per parsed interface, address, route and spare,
 * or "error <text>". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "netspec.h"
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
    static struct net_spec n;
    char err[512];
    size_t len = fread(buf, 1, sizeof buf, stdin);
    int init = argc == 2 && !strcmp(argv[1], "init");
    if (argc != 2 || (!init && strcmp(argv[1], "start")))
        return 2;
    if (init ? spec_parse(buf, len, &s, err, sizeof err) : netspec_parse(buf, len, &n, err, sizeof err)) {
        printf("error %s\n", err);
        return 0;
    }
    show(init ? &s.net : &n);
    return 0;
}
