"""What the VM must look like from inside: the Ethernet interfaces of the
network namespace the shim sits in, with their MAC, MTU, addresses and
routes, read over rtnetlink with pyroute2.

The namespace is filled by CNI or by whoever handed us its path, so it is
checked and bounded like any other input: names and counts must fit what the
agent takes (proto/agent_proto.h), or create fails with one line.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

from paracell.errors import ParacellError
from paracell.linux import IFNAMSIZ, SIOCGIFHWADDR

ARPHRD_ETHER = 1
RT_TABLE_MAIN = 254
RTN_UNICAST = 1
RTPROT_KERNEL = 2  # made by the kernel for an address; the guest's kernel makes its own
RTNH_F_ONLINK = 4
IFA_F_DADFAILED = 0x08
# Our TAPs (paracell/net/tap.py): never mirrored into the VM themselves.
TAP_PREFIX = "pctap"
# What the kernel's dev_valid_name allows, less the control characters that
# would break the agent's records.
_BAD_NAME_CHARS = set("/:") | {chr(c) for c in range(0x21)} | {"\x7f"}


@dataclass(frozen=True)
class Address:
    address: str  # an IPv4 or IPv6 address, as text
    prefixlen: int


@dataclass(frozen=True)
class Route:
    dst: str  # network address as text; 0.0.0.0 or :: with dst_len 0 is the default
    dst_len: int
    gateway: str  # "" for an on-link route
    metric: int
    onlink: bool


@dataclass
class Interface:
    index: int
    name: str
    mac: str
    mtu: int
    addresses: list[Address] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)


# struct ifreq: the name, then a union whose sockaddr starts with the family.
_IFREQ = struct.Struct(f"{IFNAMSIZ}s24x")


def ethernet_count() -> int:
    """How many interfaces interfaces() finds, without rtnetlink: a shim
    that lives as long as its container never loads pyroute2 (about 25 MiB)
    for the count a VM's shape needs (paracell/net/netlinkchild.py)."""
    count = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            if name.startswith(TAP_PREFIX):
                continue
            try:
                reply = fcntl.ioctl(sock.fileno(), SIOCGIFHWADDR,
                                    _IFREQ.pack(name.encode()[:IFNAMSIZ - 1]))
            except OSError:
                continue  # gone since the list was read
            count += struct.unpack_from("=H", reply, IFNAMSIZ)[0] == ARPHRD_ETHER
    return count


def _limits() -> Any:
    from paracell._native import lib

    return lib


def check_name(name: str) -> str:
    lib = _limits()
    if not 0 < len(name.encode()) <= lib.PC_NET_IFNAME_MAX or name in (".", "..") \
            or any(c in _BAD_NAME_CHARS for c in name) or not name.isascii():
        raise ParacellError(f"network interface name {name[:32]!r} cannot be given to the VM")
    return name


def _check_mtu(name: str, mtu: int) -> int:
    lib = _limits()
    if not lib.PC_NET_MTU_MIN <= mtu <= lib.PC_NET_MTU_MAX:
        raise ParacellError(f"network interface {name}: MTU {mtu} is out of range "
                            f"({lib.PC_NET_MTU_MIN} to {lib.PC_NET_MTU_MAX})")
    return mtu


def _mac(name: str, raw: Any) -> str:
    text = str(raw or "")
    parts = text.split(":")
    if len(parts) != 6 or not all(len(p) == 2 and all(c in "0123456789abcdef" for c in p)
                                  for p in parts):
        raise ParacellError(f"network interface {name}: no Ethernet address ({text[:32]!r})")
    if int(parts[0], 16) & 1 or text == "00:00:00:00:00:00":
        raise ParacellError(f"network interface {name}: {text} is not a unicast MAC address")
    return text


def _links(ipr: Any) -> list[Interface]:
    found = []
    for link in ipr.get_links():
        name = str(link.get("ifname") or "")
        if link["ifi_type"] != ARPHRD_ETHER or name.startswith(TAP_PREFIX):
            # lo, and tunnels a namespace may hold (sit0, tunl0...): not Ethernet,
            # so nothing a virtio-net device could stand for.
            continue
        check_name(name)
        found.append(Interface(index=link["index"], name=name, mac=_mac(name, link.get("address")),
                               mtu=_check_mtu(name, int(link.get("mtu") or 0))))
    return found


def _addresses(ipr: Any, iface: Interface) -> None:
    for msg in ipr.get_addr(index=iface.index):
        family = msg["family"]
        if family not in (socket.AF_INET, socket.AF_INET6) or msg["flags"] & IFA_F_DADFAILED:
            continue
        text = msg.get("local") if family == socket.AF_INET else None
        text = text or msg.get("address")
        address = ipaddress.ip_address(text)
        if address.is_link_local and family == socket.AF_INET6:
            # The guest's kernel derives the same fe80:: address from the same MAC.
            continue
        prefixlen = int(msg["prefixlen"])
        if not 0 <= prefixlen <= address.max_prefixlen:
            raise ParacellError(f"network interface {iface.name}: bad prefix /{prefixlen}")
        iface.addresses.append(Address(str(address), prefixlen))


def _routes(ipr: Any, by_index: dict[int, Interface]) -> None:
    for family in (socket.AF_INET, socket.AF_INET6):
        for msg in ipr.get_routes(family=family, table=RT_TABLE_MAIN):
            if (msg.get("table") != RT_TABLE_MAIN or msg["type"] != RTN_UNICAST
                    or msg["proto"] == RTPROT_KERNEL or msg.get("multipath")):
                # Other tables and types (blackhole, policy routing) and
                # multipath routes are not mirrored; docs/networking.md.
                continue
            iface = by_index.get(msg.get("oif") or 0)
            if iface is None:
                continue
            dst_len = int(msg["dst_len"])
            zero = "0.0.0.0" if family == socket.AF_INET else "::"
            dst = ipaddress.ip_network(f"{msg.get('dst') or zero}/{dst_len}", strict=False)
            gateway = msg.get("gateway") or ""
            if gateway:
                gateway = str(ipaddress.ip_address(gateway))
            iface.routes.append(Route(str(dst.network_address), dst_len, gateway,
                                      int(msg.get("priority") or 0),
                                      bool(msg["flags"] & RTNH_F_ONLINK)))
    for iface in by_index.values():
        # On-link routes first: a gateway must be reachable when its route is added.
        iface.routes.sort(key=lambda r: bool(r.gateway))


def interfaces(ipr: Any) -> list[Interface]:
    """The current namespace's Ethernet interfaces, bounded by the agent's limits."""
    lib = _limits()
    found = _links(ipr)
    if len(found) > lib.PC_NET_MAX_IFACES:
        raise ParacellError(f"the network namespace has {len(found)} interfaces; "
                            f"at most {lib.PC_NET_MAX_IFACES} can be mirrored into the VM")
    for iface in found:
        _addresses(ipr, iface)
    _routes(ipr, {i.index: i for i in found})
    naddrs = sum(len(i.addresses) for i in found)
    nroutes = sum(len(i.routes) for i in found)
    if naddrs > lib.PC_NET_MAX_ADDRS:
        raise ParacellError(f"the network namespace has {naddrs} addresses; "
                            f"at most {lib.PC_NET_MAX_ADDRS} can be given to the VM")
    if nroutes > lib.PC_NET_MAX_ROUTES:
        raise ParacellError(f"the network namespace has {nroutes} routes; "
                            f"at most {lib.PC_NET_MAX_ROUTES} can be given to the VM")
    return found
