"""The suite's own network: one bridge on the host, and per container a network
namespace wired to it with a veth pair, as CNI's bridge plugin would.

The host end of the bridge holds BRIDGE_ADDR; each container's namespace gets
the next free address of SUBNET. The load generators on the host talk only to
these addresses (no DNS, no route beyond the bridge's /24). Everything made is
recorded as it is made, so `close()` removes it even after an interrupt.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

from paracell.errors import ParacellError

SUBNET = ipaddress.ip_network("10.213.0.0/24")
BRIDGE_ADDR = "10.213.0.1"
PREFIX = SUBNET.prefixlen
MAX_SLOTS = 200


@dataclass
class Attachment:
    netns: str  # the namespace's name under /run/netns
    path: str
    address: str
    host_ifname: str


@dataclass
class SuiteNetwork:
    tag: str = field(default_factory=lambda: f"{os.getpid() % 100000}")
    bridge: str = ""
    made_bridge: bool = False
    namespaces: list[str] = field(default_factory=list)
    slot: int = 0

    def open(self) -> SuiteNetwork:
        from pyroute2 import IPRoute

        self.bridge = f"pcsuite{self.tag}"[:15]
        with IPRoute() as ipr:
            if ipr.link_lookup(ifname=self.bridge):
                raise ParacellError(f"bench suite: interface {self.bridge} exists already")
            for addr in ipr.get_addr(family=2):
                if ipaddress.ip_address(addr.get_attr("IFA_ADDRESS")) in SUBNET:
                    raise ParacellError(f"bench suite: {SUBNET} is in use on this host; "
                                        "another suite may be running")
            ipr.link("add", ifname=self.bridge, kind="bridge")
            self.made_bridge = True
            index = ipr.link_lookup(ifname=self.bridge)[0]
            ipr.addr("add", index=index, address=BRIDGE_ADDR, prefixlen=PREFIX)
            ipr.link("set", index=index, state="up")
        return self

    def attach(self) -> Attachment:
        """A new namespace with eth0 on the bridge and the next address."""
        from pyroute2 import IPRoute
        from pyroute2 import netns as pr_netns

        from paracell.net import netns

        if self.slot >= MAX_SLOTS:
            raise ParacellError("bench suite: out of addresses on its bridge")
        self.slot += 1
        address = str(SUBNET.network_address + 1 + self.slot)
        name = f"pcsuite-{self.tag}-{self.slot}"
        host_if = f"pcs{self.tag}-{self.slot}"[:15]
        path = f"/run/netns/{name}"
        pr_netns.create(name)
        self.namespaces.append(name)
        with IPRoute() as ipr:
            ipr.link("add", ifname=host_if, kind="veth",
                     peer={"ifname": "eth0", "net_ns_fd": path})
            index = ipr.link_lookup(ifname=host_if)[0]
            bridge = ipr.link_lookup(ifname=self.bridge)[0]
            ipr.link("set", index=index, master=bridge, state="up")

        def inside() -> None:
            with IPRoute() as ipr:
                lo = ipr.link_lookup(ifname="lo")[0]
                ipr.link("set", index=lo, state="up")
                eth = ipr.link_lookup(ifname="eth0")[0]
                ipr.addr("add", index=eth, address=address, prefixlen=PREFIX)
                ipr.link("set", index=eth, state="up")
        netns.run_inside(path, inside)
        return Attachment(name, path, address, host_if)

    def detach(self, attachment: Attachment) -> None:
        from pyroute2 import netns as pr_netns

        if attachment.netns in self.namespaces:
            self.namespaces.remove(attachment.netns)
            # The veth goes with its namespace.
            pr_netns.remove(attachment.netns)

    def close(self) -> None:
        from pyroute2 import IPRoute
        from pyroute2 import netns as pr_netns

        for name in list(self.namespaces):
            try:
                pr_netns.remove(name)
            except OSError:
                pass
            self.namespaces.remove(name)
        if self.made_bridge:
            with IPRoute() as ipr:
                found = ipr.link_lookup(ifname=self.bridge)
                if found:
                    ipr.link("del", index=found[0])
            self.made_bridge = False


def leftovers(tag: str) -> list[str]:
    """What of a suite's network (by tag) still exists: names of namespaces and links."""
    from pyroute2 import IPRoute

    found = [n for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else [])
             if n.startswith(f"pcsuite-{tag}-")]
    with IPRoute() as ipr:
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            if name == f"pcsuite{tag}"[:15] or name.startswith(f"pcs{tag}-"):
                found.append(name)
    return found
