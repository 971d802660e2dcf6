/* The VM's network interfaces, configured over rtnetlink.
 *
 * The host mirrors each interface of the container's network namespace onto a
 * virtio-net device with the same MAC (docs/networking.md), so here each
 * device is found by its MAC and given the interface's name, MTU, addresses
 * and routes: from inside, the container sees what runc would have shown it.
 * Every netlink exchange is bounded in size, count and time (SO_RCVTIMEO):
 * PID 1 must never hang on it.
 *
 * A fork (net_fork) is another machine on another wire: every link but
 * loopback is reset, and the fork's interfaces are put on the VM's devices
 * by their place, which the agent keeps from when it configured them. */
#define _GNU_SOURCE
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <linux/if_addr.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "log.h"
#include "vm.h"

/* virtio-net devices are probed before init runs; this only covers a slow probe. */
#define FIND_WAIT_MS 2000
#define FIND_POLL_MS 10
#define LINKS_MAX 64
/* Addresses read per dump when a fork drops them, and dumps at most. */
#define ADDRS_MAX 128
#define ADDR_ROUNDS 16
#define SLOTS_MAX (PC_NET_MAX_IFACES + PC_NET_MAX_SPARES)
/* Reads of one answer; each read is bounded by the socket's timeout. */
#define MAX_READS 256
#define RECV_TIMEOUT_S 2

struct req {
    struct nlmsghdr h;
    union {
        struct ifinfomsg ifi;
        struct ifaddrmsg ifa;
        struct rtmsg rt;
    } u;
    /* Room for the few fixed-size attributes any one request carries. */
    char attrs[256];
};

struct link {
    int index;
    unsigned flags;
    char name[IF_NAMESIZE];
    unsigned char mac[6];
    int has_mac;
};

struct addr {
    int index;
    unsigned char family, prefixlen;
    unsigned char local[16], address[16];
    int has_local, has_address;
};

/* What an exchange keeps of a dump: links or addresses, at most max. */
struct dump {
    struct link *links;
    struct addr *addrs;
    int max, count;
    /* Addresses on these links are not kept: loopback's, which no reset
     * drops, must not fill the buffer ahead of those it must see. */
    const int *skip;
    int nskip;
};

/* The VM's virtio-net devices in the host's order (the SANDBOX's interfaces,
 * then its spares), as this agent configured them: a fork's interfaces take
 * them by place.  parked: in the spares' namespace (make_park). */
static struct {
    int index;
    int parked;
    unsigned char mac[6];
} slots[SLOTS_MAX];
static int nslots;

static int nl = -1;
static unsigned nl_seq;

/* Appends an attribute.  The requests here carry a few fixed-size ones that
 * always fit; the check only keeps a future mistake inside the buffer. */
static void attr(struct req *r, unsigned short type, const void *data, size_t len)
{
    size_t at = NLMSG_ALIGN(r->h.nlmsg_len);
    if (at + RTA_SPACE(len) > sizeof *r)
        return;
    struct rtattr *a = (struct rtattr *)((char *)r + at);
    a->rta_type = type;
    a->rta_len = (unsigned short)RTA_LENGTH(len);
    memcpy(RTA_DATA(a), data, len);
    r->h.nlmsg_len = (unsigned)(at + RTA_ALIGN(a->rta_len));
}

static void start(struct req *r, unsigned short type, unsigned short flags, size_t body)
{
    memset(r, 0, sizeof *r);
    r->h.nlmsg_len = (unsigned)NLMSG_LENGTH(body);
    r->h.nlmsg_type = type;
    r->h.nlmsg_flags = (unsigned short)(NLM_F_REQUEST | flags);
    r->h.nlmsg_seq = ++nl_seq;
}

static void read_link(struct nlmsghdr *m, struct link *l)
{
    struct ifinfomsg *ifi = NLMSG_DATA(m);
    int len = (int)IFLA_PAYLOAD(m);
    memset(l, 0, sizeof *l);
    l->index = ifi->ifi_index;
    l->flags = ifi->ifi_flags;
    for (struct rtattr *a = IFLA_RTA(ifi); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
        size_t n = RTA_PAYLOAD(a);
        if (a->rta_type == IFLA_IFNAME && n > 0 && n <= IF_NAMESIZE) {
            memcpy(l->name, RTA_DATA(a), n);
            l->name[IF_NAMESIZE - 1] = 0;
        } else if (a->rta_type == IFLA_ADDRESS && n == 6) {
            memcpy(l->mac, RTA_DATA(a), 6);
            l->has_mac = 1;
        }
    }
}

static void read_addr(struct nlmsghdr *m, struct addr *a)
{
    struct ifaddrmsg *ifa = NLMSG_DATA(m);
    int len = (int)IFA_PAYLOAD(m);
    size_t want = ifa->ifa_family == AF_INET ? 4 : 16;
    memset(a, 0, sizeof *a);
    a->index = (int)ifa->ifa_index;
    a->family = ifa->ifa_family;
    a->prefixlen = ifa->ifa_prefixlen;
    for (struct rtattr *at = IFA_RTA(ifa); RTA_OK(at, len); at = RTA_NEXT(at, len)) {
        if (RTA_PAYLOAD(at) != want)
            continue;
        if (at->rta_type == IFA_LOCAL) {
            memcpy(a->local, RTA_DATA(at), want);
            a->has_local = 1;
        } else if (at->rta_type == IFA_ADDRESS) {
            memcpy(a->address, RTA_DATA(at), want);
            a->has_address = 1;
        }
    }
}

static void keep(struct nlmsghdr *m, struct dump *d)
{
    if (!d || d->count >= d->max)
        return;
    if (d->links && m->nlmsg_type == RTM_NEWLINK &&
        m->nlmsg_len >= NLMSG_LENGTH(sizeof(struct ifinfomsg)))
        read_link(m, &d->links[d->count++]);
    else if (d->addrs && m->nlmsg_type == RTM_NEWADDR &&
             m->nlmsg_len >= NLMSG_LENGTH(sizeof(struct ifaddrmsg))) {
        const struct ifaddrmsg *ifa = NLMSG_DATA(m);
        if (ifa->ifa_family != AF_INET && ifa->ifa_family != AF_INET6)
            return;
        for (int i = 0; i < d->nskip; i++)
            if ((int)ifa->ifa_index == d->skip[i])
                return;
        read_addr(m, &d->addrs[d->count++]);
    }
}

/* Sends r on sock and reads what answers it: the links or addresses of a
 * dump go into d (at most d->max), NLMSG_DONE ends a dump, NLMSG_ERROR ends
 * a request (its error; 0 is the ACK).  0 or -errno. */
static int exchange(int sock, struct req *r, struct dump *d)
{
    static char buf[32768];
    if (send(sock, r, r->h.nlmsg_len, 0) < 0)
        return -errno;
    for (int reads = 0; reads < MAX_READS; reads++) {
        ssize_t got = recv(sock, buf, sizeof buf, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        int len = (int)got;
        for (struct nlmsghdr *m = (struct nlmsghdr *)buf; NLMSG_OK(m, len); m = NLMSG_NEXT(m, len)) {
            if (m->nlmsg_seq != r->h.nlmsg_seq)
                continue;
            if (m->nlmsg_type == NLMSG_DONE)
                return 0;
            if (m->nlmsg_type == NLMSG_ERROR)
                return m->nlmsg_len >= NLMSG_LENGTH(sizeof(struct nlmsgerr))
                           ? ((struct nlmsgerr *)NLMSG_DATA(m))->error
                           : -EIO;
            keep(m, d);
        }
    }
    return -EIO;
}

/* One request on sock, acknowledged: 0 or -errno. */
static int talk_on(int sock, struct req *r)
{
    r->h.nlmsg_flags |= NLM_F_ACK;
    return exchange(sock, r, NULL);
}

static int talk(struct req *r)
{
    return talk_on(nl, r);
}


/* A dump of every object of one kind in sock's namespace, of every family
 * (start zeroes the header: AF_UNSPEC), into d: the count, or -errno. */
static int dump_all(int sock, unsigned short type, size_t header, struct dump *d)
{
    struct req r;
    start(&r, type, NLM_F_DUMP, header);
    int rc = exchange(sock, &r, d);
    return rc ? rc : d->count;
}

/* Every link of sock's namespace, at most max: the count, or -errno. */
static int dump_links(int sock, struct link *out, int max)
{
    struct dump d = {.links = out, .max = max};
    return dump_all(sock, RTM_GETLINK, sizeof(struct ifinfomsg), &d);
}

/* Every IPv4 and IPv6 address of sock's namespace but those on the links
 * in skip, at most max: the count, or -errno. */
static int dump_addrs(int sock, struct addr *out, int max, const int *skip, int nskip)
{
    struct dump d = {.addrs = out, .max = max, .skip = skip, .nskip = nskip};
    return dump_all(sock, RTM_GETADDR, sizeof(struct ifaddrmsg), &d);
}

/* The ifindex of the device with each of the n MACs in sock's namespace,
 * waiting a little for a slow probe: 1 (with *missing set) when one never
 * appears, -errno when the links cannot be listed, else 0. */
static int find_macs(int sock, const unsigned char (*macs)[6], int n, int *index, int *missing)
{
    static struct link links[LINKS_MAX];
    long long deadline = now_ms() + FIND_WAIT_MS;
    for (;;) {
        int count = dump_links(sock, links, LINKS_MAX);
        if (count < 0)
            return count;
        *missing = -1;
        for (int i = 0; i < n; i++) {
            index[i] = 0;
            for (int k = 0; k < count; k++)
                if (links[k].has_mac && !memcmp(links[k].mac, macs[i], 6))
                    index[i] = links[k].index;
            if (!index[i] && *missing < 0)
                *missing = i;
        }
        if (*missing < 0)
            return 0;
        if (now_ms() >= deadline)
            return 1;
        usleep(FIND_POLL_MS * 1000);
    }
}

static void no_device(const unsigned char *m, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "net: no network device with MAC %02x:%02x:%02x:%02x:%02x:%02x%s",
             m[0], m[1], m[2], m[3], m[4], m[5], what);
}

/* The ifindex of each interface's device: by the MAC it has now. */
static int find_devices(const struct net_spec *n, int *index, char *err, size_t errlen)
{
    unsigned char macs[PC_NET_MAX_IFACES][6];
    char what[PC_NET_IFNAME_MAX + 8];
    int missing = 0, rc;
    for (int i = 0; i < n->nifaces; i++)
        memcpy(macs[i], n->ifaces[i].has_dev_mac ? n->ifaces[i].dev_mac : n->ifaces[i].mac, 6);
    rc = find_macs(nl, (const unsigned char (*)[6])macs, n->nifaces, index, &missing);
    if (rc < 0) {
        snprintf(err, errlen, "net: list links: %s", strerror(-rc));
        return -1;
    }
    if (rc > 0) {
        snprintf(what, sizeof what, " for %s", n->ifaces[missing].name);
        no_device(macs[missing], what, err, errlen);
        return -1;
    }
    return 0;
}

/* RTM_NEWLINK on index (or, with index 0, on the link called name);
 * up: 1 up, -1 down, 0 as it is. */
static int set_link(int index, const char *name, const unsigned char *mac, unsigned mtu, int up)
{
    struct req r;
    start(&r, RTM_NEWLINK, 0, sizeof(struct ifinfomsg));
    r.u.ifi.ifi_family = AF_UNSPEC;
    r.u.ifi.ifi_index = index;
    if (name)
        attr(&r, IFLA_IFNAME, name, strlen(name) + 1);
    if (mac)
        attr(&r, IFLA_ADDRESS, mac, 6);
    if (mtu)
        attr(&r, IFLA_MTU, &mtu, sizeof mtu);
    if (up) {
        r.u.ifi.ifi_flags = up > 0 ? IFF_UP : 0;
        r.u.ifi.ifi_change = IFF_UP;
    }
    return talk(&r);
}

/* Down, and out of any bridge or bond a container put it in: a fork's link
 * carries nothing of its parent's. */
static int reset_link(int index)
{
    struct req r;
    uint32_t none = 0;
    start(&r, RTM_NEWLINK, 0, sizeof(struct ifinfomsg));
    r.u.ifi.ifi_family = AF_UNSPEC;
    r.u.ifi.ifi_index = index;
    r.u.ifi.ifi_change = IFF_UP;
    attr(&r, IFLA_MASTER, &none, sizeof none);
    return talk(&r);
}

static unsigned addr_len(int family)
{
    return family == AF_INET ? 4 : 16;
}

static int add_address(const struct net_addr *a, int index)
{
    struct req r;
    start(&r, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, sizeof(struct ifaddrmsg));
    r.u.ifa.ifa_family = (unsigned char)a->family;
    r.u.ifa.ifa_prefixlen = (unsigned char)a->prefixlen;
    r.u.ifa.ifa_index = (unsigned)index;
    /* The host checked the address is the namespace's own: duplicate
     * detection would only hold it back for a second. */
    r.u.ifa.ifa_flags = a->family == AF_INET6 ? IFA_F_NODAD : 0;
    attr(&r, IFA_LOCAL, a->addr, addr_len(a->family));
    attr(&r, IFA_ADDRESS, a->addr, addr_len(a->family));
    if (a->family == AF_INET && a->prefixlen < 31) {
        unsigned char brd[4];
        for (unsigned i = 0; i < 4; i++) {
            unsigned bits = a->prefixlen > i * 8 ? a->prefixlen - i * 8 : 0;
            unsigned char mask = bits >= 8 ? 0xff : (unsigned char)(0xff00 >> bits);
            brd[i] = (unsigned char)(a->addr[i] | (unsigned char)~mask);
        }
        attr(&r, IFA_BROADCAST, brd, sizeof brd);
    }
    int rc = talk(&r);
    return rc == -EEXIST ? 0 : rc;
}

static int add_route(const struct net_route *rt, int index)
{
    struct req r;
    uint32_t oif = (uint32_t)index;
    start(&r, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, sizeof(struct rtmsg));
    r.u.rt.rtm_family = (unsigned char)rt->family;
    r.u.rt.rtm_dst_len = (unsigned char)rt->dst_len;
    r.u.rt.rtm_table = RT_TABLE_MAIN;
    r.u.rt.rtm_protocol = RTPROT_BOOT;
    r.u.rt.rtm_scope = rt->has_gateway ? RT_SCOPE_UNIVERSE : RT_SCOPE_LINK;
    r.u.rt.rtm_type = RTN_UNICAST;
    r.u.rt.rtm_flags = rt->onlink ? RTNH_F_ONLINK : 0;
    if (rt->dst_len)
        attr(&r, RTA_DST, rt->dst, addr_len(rt->family));
    if (rt->has_gateway)
        attr(&r, RTA_GATEWAY, rt->gateway, addr_len(rt->family));
    attr(&r, RTA_OIF, &oif, sizeof oif);
    if (rt->metric)
        attr(&r, RTA_PRIORITY, &rt->metric, sizeof rt->metric);
    int rc = talk(&r);
    /* Already there: the kernel made it, or the link's router advertised it. */
    return rc == -EEXIST ? 0 : rc;
}

static const char *ip_text(int family, const unsigned char *a, char *buf, size_t len)
{
    return inet_ntop(family, a, buf, (socklen_t)len) ? buf : "?";
}

/* The interfaces n names onto the devices index[] names: renamed, MAC
 * (set_mac: always; else only where a spare takes an interface's), MTU, up,
 * addresses, routes. */
static int apply_links(const struct net_spec *n, const int *index, int set_mac, char *err,
                       size_t errlen)
{
    char tmp[IF_NAMESIZE], text[INET6_ADDRSTRLEN];
    int rc;

    /* Two passes: the kernel already named the devices eth0, eth1..., and
     * the names they are to get may be each other's. */
    for (int i = 0; i < n->nifaces; i++) {
        snprintf(tmp, sizeof tmp, "pcnet%d", i);
        if ((rc = set_link(index[i], tmp, NULL, 0, 0))) {
            snprintf(err, errlen, "net: rename device for %s: %s", n->ifaces[i].name, strerror(-rc));
            return -1;
        }
    }
    for (int i = 0; i < n->nifaces; i++) {
        const struct net_iface *f = &n->ifaces[i];
        const unsigned char *mac = set_mac || f->has_dev_mac ? f->mac : NULL;
        if ((rc = set_link(index[i], f->name, mac, f->mtu, 0)) ||
            (rc = set_link(index[i], NULL, NULL, 0, 1))) {
            snprintf(err, errlen, "net: %s (MTU %u): %s", f->name, f->mtu, strerror(-rc));
            return -1;
        }
    }
    for (int i = 0; i < n->naddrs; i++) {
        const struct net_addr *a = &n->addrs[i];
        if ((rc = add_address(a, index[a->iface]))) {
            snprintf(err, errlen, "net: %s: add address %s/%u: %s", n->ifaces[a->iface].name,
                     ip_text(a->family, a->addr, text, sizeof text), a->prefixlen, strerror(-rc));
            return -1;
        }
    }
    for (int i = 0; i < n->nroutes; i++) {
        const struct net_route *rt = &n->routes[i];
        if ((rc = add_route(rt, index[rt->iface]))) {
            snprintf(err, errlen, "net: %s: add route %s/%u: %s", n->ifaces[rt->iface].name,
                     ip_text(rt->family, rt->dst, text, sizeof text), rt->dst_len, strerror(-rc));
            return -1;
        }
    }
    return 0;
}

/* Each interface's device found by its MAC, then configured: index[] says
 * which device each took. */
static int configure(const struct net_spec *n, int *index, char *err, size_t errlen)
{
    return find_devices(n, index, err, errlen) || apply_links(n, index, 0, err, errlen) ? -1 : 0;
}

static int open_netlink(int *sock, char *err, size_t errlen)
{
    struct timeval tv = {RECV_TIMEOUT_S, 0};
    *sock = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (*sock < 0 || setsockopt(*sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0) {
        snprintf(err, errlen, "net: netlink socket: %s", strerror(errno));
        if (*sock >= 0)
            close(*sock);
        *sock = -1;
        return -1;
    }
    return 0;
}

/* Spare devices wait in a network namespace of their own, which only the
 * agent holds (an fd, and a netlink socket made inside it), so that no
 * container sees a device that is not its interface yet. */
static int root_ns = -1, park_ns = -1, park_nl = -1;

static int make_park(char *err, size_t errlen)
{
    if (park_ns >= 0)
        return 0;
    root_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (root_ns < 0 || unshare(CLONE_NEWNET) < 0) {
        snprintf(err, errlen, "net: new namespace for spare devices: %s", strerror(errno));
        return -1;
    }
    park_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int made = park_ns >= 0 ? open_netlink(&park_nl, err, errlen) : -1;
    if (setns(root_ns, CLONE_NEWNET) < 0) {
        /* Every container would start in the wrong namespace: stop here. */
        logmsg("cannot return to the VM's network namespace: %s", strerror(errno));
        vm_power_off(1);
    }
    if (park_ns < 0 || made < 0) {
        if (park_ns < 0)
            snprintf(err, errlen, "net: open spare namespace: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* Moves the device with each MAC from the namespace sock lives in to ns_fd,
 * where dest_sock lives: moved[] gets their ifindex there. */
static int move_devices(int sock, const unsigned char (*macs)[6], int n, int ns_fd,
                        int dest_sock, int *moved, char *err, size_t errlen)
{
    int index[PC_NET_MAX_IFACES], missing = 0, rc;
    rc = find_macs(sock, macs, n, index, &missing);
    if (rc > 0) {
        no_device(macs[missing], " (spare)", err, errlen);
        return -1;
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        struct req r;
        uint32_t fd = (uint32_t)ns_fd;
        /* A name of its own where it goes, unique by its index here: its
         * kernel name (eth1) may be taken there, and configure renames it. */
        char name[IF_NAMESIZE];
        snprintf(name, sizeof name, "pcmv%d", index[i]);
        start(&r, RTM_NEWLINK, 0, sizeof(struct ifinfomsg));
        r.u.ifi.ifi_family = AF_UNSPEC;
        r.u.ifi.ifi_index = index[i];
        attr(&r, IFLA_NET_NS_FD, &fd, sizeof fd);
        attr(&r, IFLA_IFNAME, name, strlen(name) + 1);
        rc = talk_on(sock, &r);
    }
    if (rc || (rc = find_macs(dest_sock, macs, n, moved, &missing)) != 0) {
        snprintf(err, errlen, "net: move spare device: %s", rc > 0 ? "lost" : strerror(-rc));
        return -1;
    }
    return 0;
}

static void add_slot(int index, int parked, const unsigned char *mac)
{
    if (nslots == SLOTS_MAX)
        return;
    slots[nslots].index = index;
    slots[nslots].parked = parked;
    memcpy(slots[nslots].mac, mac, 6);
    nslots++;
}

static int lo_up, configured;

int net_configure(const struct net_spec *n, char *err, size_t errlen)
{
    int index[PC_NET_MAX_IFACES], spare[PC_NET_MAX_SPARES];
    int rc;

    if (lo_up && !n->nifaces && !n->nspares)
        return 0;
    if ((n->nifaces || n->nspares) && configured) {
        snprintf(err, errlen, "net: this VM's network interfaces are already configured");
        return -1;
    }
    if (nl < 0 && open_netlink(&nl, err, errlen))
        return -1;
    if (!lo_up) {
        /* As runc does for a new network namespace. */
        if ((rc = set_link(0, "lo", NULL, 0, 1))) {
            snprintf(err, errlen, "net: lo up: %s", strerror(-rc));
            return -1;
        }
        lo_up = 1;
    }
    if (n->nspares && (make_park(err, errlen) ||
                       move_devices(nl, (const unsigned char (*)[6])n->spares, n->nspares,
                                    park_ns, park_nl, spare, err, errlen)))
        return -1;
    if (n->nifaces && configure(n, index, err, errlen))
        return -1;
    for (int i = 0; i < n->nifaces; i++)
        add_slot(index[i], 0, n->ifaces[i].mac);
    for (int i = 0; i < n->nspares; i++)
        add_slot(spare[i], 1, n->spares[i]);
    configured = n->nifaces || n->nspares;
    return 0;
}

int net_start(const struct net_spec *n, char *err, size_t errlen)
{
    unsigned char macs[PC_NET_MAX_IFACES][6];
    int nmacs = 0, index[PC_NET_MAX_IFACES];
    if (!n->nifaces)
        return 0;
    for (int i = 0; i < n->nifaces; i++)
        if (n->ifaces[i].has_dev_mac)
            memcpy(macs[nmacs++], n->ifaces[i].dev_mac, 6);
    if (nmacs && park_nl < 0) {
        snprintf(err, errlen, "net: this VM has no spare network device");
        return -1;
    }
    if (nmacs && move_devices(park_nl, (const unsigned char (*)[6])macs, nmacs, root_ns,
                              nl, index, err, errlen))
        return -1;
    if (configure(n, index, err, errlen))
        return -1;
    /* The spares these took are in the VM's namespace now, with their MACs. */
    for (int i = 0; i < n->nifaces; i++)
        for (int s = 0; s < nslots; s++)
            if (n->ifaces[i].has_dev_mac && slots[s].parked &&
                !memcmp(slots[s].mac, n->ifaces[i].dev_mac, 6)) {
                slots[s].index = index[i];
                slots[s].parked = 0;
                memcpy(slots[s].mac, n->ifaces[i].mac, 6);
            }
    return 0;
}

/* Every address of a link that is not loopback, deleted: a dump at a time,
 * so that no count of addresses a container made escapes it. */
static int drop_addresses(const struct link *links, int nlinks, char *err, size_t errlen)
{
    static struct addr addrs[ADDRS_MAX];
    static int loopbacks[LINKS_MAX];
    int nloop = 0;
    for (int k = 0; k < nlinks && nloop < LINKS_MAX; k++)
        if (links[k].flags & IFF_LOOPBACK)
            loopbacks[nloop++] = links[k].index;
    for (int round = 0; round < ADDR_ROUNDS; round++) {
        int count = dump_addrs(nl, addrs, ADDRS_MAX, loopbacks, nloop), dropped = 0;
        if (count < 0) {
            snprintf(err, errlen, "net: list addresses: %s", strerror(-count));
            return -1;
        }
        for (int i = 0; i < count; i++) {
            const struct addr *a = &addrs[i];
            struct req r;
            start(&r, RTM_DELADDR, 0, sizeof(struct ifaddrmsg));
            r.u.ifa.ifa_family = a->family;
            r.u.ifa.ifa_prefixlen = a->prefixlen;
            r.u.ifa.ifa_index = (unsigned)a->index;
            if (a->has_local)
                attr(&r, IFA_LOCAL, a->local, addr_len(a->family));
            if (a->has_address)
                attr(&r, IFA_ADDRESS, a->address, addr_len(a->family));
            int rc = talk(&r);
            /* Gone already: IPv6 addresses leave with the link's down. */
            if (rc && rc != -EADDRNOTAVAIL && rc != -ENODEV) {
                snprintf(err, errlen, "net: drop address: %s", strerror(-rc));
                return -1;
            }
            dropped++;
        }
        if (count < ADDRS_MAX && !dropped)
            return 0;
    }
    snprintf(err, errlen, "net: addresses keep coming back");
    return -1;
}

/* A link the fork's interfaces do not take keeps its name (an idle device,
 * one the container made): where that is a name they are to get, or one of
 * apply_links's temporary names, it gets one of its own (down already). */
static int clear_names(const struct net_spec *n, const int *taken, const struct link *links,
                       int count, char *err, size_t errlen)
{
    for (int k = 0; k < count; k++) {
        int clash = !strncmp(links[k].name, "pcnet", 5), rc;
        for (int i = 0; i < n->nifaces; i++) {
            if (taken[i] == links[k].index) {
                clash = 0;
                break;
            }
            clash |= !strcmp(links[k].name, n->ifaces[i].name);
        }
        if (!clash || (links[k].flags & IFF_LOOPBACK))
            continue;
        char name[IF_NAMESIZE];
        snprintf(name, sizeof name, "pcidle%d", links[k].index);
        if ((rc = set_link(links[k].index, name, NULL, 0, 0))) {
            snprintf(err, errlen, "net: rename %s out of the way: %s", links[k].name,
                     strerror(-rc));
            return -1;
        }
    }
    return 0;
}

int net_fork(const struct net_spec *n, char *err, size_t errlen)
{
    static struct link links[LINKS_MAX];
    int index[PC_NET_MAX_IFACES], rc;

    if (n->nifaces > nslots) {
        snprintf(err, errlen, "net: %d interfaces for the fork, and this VM has %d network "
                 "devices", n->nifaces, nslots);
        return -1;
    }
    if (nl < 0 && open_netlink(&nl, err, errlen))
        return -1;
    /* A spare a fork's interface takes comes out of hiding first. */
    for (int i = 0; i < n->nifaces; i++) {
        if (!slots[i].parked)
            continue;
        if (park_nl < 0) {
            snprintf(err, errlen, "net: a spare device, and no namespace it waits in");
            return -1;
        }
        if (move_devices(park_nl, (const unsigned char (*)[6]) & slots[i].mac, 1, root_ns, nl,
                         &slots[i].index, err, errlen))
            return -1;
        slots[i].parked = 0;
    }
    int count = dump_links(nl, links, LINKS_MAX);
    if (count < 0 || count == LINKS_MAX) {
        snprintf(err, errlen, "net: list links: %s",
                 count < 0 ? strerror(-count) : "too many links to reset");
        return -1;
    }
    /* Down first: the routes through a link, and its neighbours, go with it. */
    for (int k = 0; k < count; k++) {
        if (links[k].flags & IFF_LOOPBACK)
            continue;
        if ((rc = reset_link(links[k].index))) {
            snprintf(err, errlen, "net: reset %s: %s", links[k].name, strerror(-rc));
            return -1;
        }
    }
    if (drop_addresses(links, count, err, errlen))
        return -1;
    for (int i = 0; i < n->nifaces; i++)
        index[i] = slots[i].index;
    if (clear_names(n, index, links, count, err, errlen))
        return -1;
    if (n->nifaces && apply_links(n, index, 1, err, errlen))
        return -1;
    for (int i = 0; i < n->nifaces; i++)
        memcpy(slots[i].mac, n->ifaces[i].mac, 6);
    configured = 1;
    return 0;
}
