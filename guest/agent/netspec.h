/* The launch spec's network records (docs/agent-protocol.md, docs/networking.md):
 * the interfaces of the container's network namespace, each to be found by
 * its MAC among the VM's virtio-net devices, with its addresses and routes.
 * Parsed and checked with the rest of the spec, before anything is applied. */
#ifndef PARACELL_AGENT_NETSPEC_H
#define PARACELL_AGENT_NETSPEC_H

#include <stddef.h>
#include <stdint.h>

#include "agent_proto.h"

struct net_iface {
    char name[PC_NET_IFNAME_MAX + 1];
    unsigned char mac[6];
    unsigned mtu;
    /* Set when the device now has another MAC: a spare the host attached at
     * create, for an interface that appeared before START (ctr run --cni). */
    int has_dev_mac;
    unsigned char dev_mac[6];
};

struct net_addr {
    int iface;              /* index into net_spec.ifaces */
    int family;             /* AF_INET or AF_INET6 */
    unsigned char addr[16];
    unsigned prefixlen;
};

struct net_route {
    int iface;
    int family;
    unsigned char dst[16];  /* host bits zero; all zero with dst_len 0: the default route */
    unsigned dst_len;
    int has_gateway;
    unsigned char gateway[16];
    uint32_t metric;
    int onlink;
};

struct net_spec {
    struct net_iface ifaces[PC_NET_MAX_IFACES];
    int nifaces;
    struct net_addr addrs[PC_NET_MAX_ADDRS];
    int naddrs;
    struct net_route routes[PC_NET_MAX_ROUTES];
    int nroutes;
    /* net.spare: devices with no interface yet, hidden from the containers
     * until a START names them. */
    unsigned char spares[PC_NET_MAX_SPARES][6];
    int nspares;
};

/* 1 when key is one of the network records. */
int netspec_is_key(const char *key);
/* A START payload: network records only (net.if, net.addr, net.route), each
 * NUL-terminated; buf is modified in place.  0, or -1 with err set. */
int netspec_parse(char *buf, size_t len, struct net_spec *n, char *err, size_t errlen);
/* Adds one record (key=val, val modified in place): 0, or -1 with err set to
 * one line that starts with "spec: ". */
int netspec_add(struct net_spec *n, const char *key, char *val, char *err, size_t errlen);

#endif
