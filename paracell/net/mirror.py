"""The wire between a veth and its TAP: Kata's tcfilter model.

Each side gets an ingress qdisc with one match-everything u32 filter whose
action is `mirred egress redirect` to the other side. What arrives on the
veth from the bridge leaves through the TAP to QEMU, and what the guest sends
into the TAP leaves through the veth, so the namespace's own stack never sees
a packet and the VM answers for the veth's MAC and addresses. No bridge, no
MAC learning, no iptables.
"""

from __future__ import annotations

import errno
from typing import Any

from paracell.errors import ParacellError

# pyroute2 costs ~0.2 s to import: only the verbs that touch a namespace load it.
ETH_P_ALL = 0x0003

INGRESS = 0xFFFF0000  # "ffff:", the one handle an ingress qdisc has
# clsact also hooks ingress (at ffff:fff1); either means someone else is there.
INGRESS_KINDS = ("ingress", "clsact")
FILTER_PRIO = 49152
# u32 wants a class id even on an ingress qdisc, which has no classes: 1:0.
FILTER_CLASSID = 0x10000
MATCH_ALL = ["0x0/0x0+0"]


def check_free(ipr: Any, index: int, name: str) -> None:
    """Refuses an interface whose ingress is already taken, most likely by
    another VM in the same namespace: two redirects cannot share one wire."""
    for qdisc in ipr.get_qdiscs(index=index):
        if qdisc.get_attr("TCA_KIND") in INGRESS_KINDS:
            raise ParacellError(
                f"network interface {name} already has an ingress qdisc: another VM may "
                "mirror it (a network namespace serves one ParaCell VM)")


def redirect(ipr: Any, source: int, target: int) -> None:
    """Everything that arrives on `source` leaves through `target`."""
    ipr.tc("add", "ingress", source, INGRESS)
    ipr.tc("add-filter", "u32", source, parent=INGRESS, prio=FILTER_PRIO,
           protocol=ETH_P_ALL, keys=MATCH_ALL, target=FILTER_CLASSID,
           action={"kind": "mirred", "direction": "egress", "action": "redirect",
                   "ifindex": target})


def connect(ipr: Any, veth: int, tap: int) -> None:
    redirect(ipr, veth, tap)
    redirect(ipr, tap, veth)


def remove(ipr: Any, index: int) -> None:
    """Drops the ingress qdisc, and its filters with it; a link or qdisc
    already gone is not an error."""
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        ipr.tc("del", "ingress", index, INGRESS)
    except NetlinkError as err:
        if err.code not in (errno.ENODEV, errno.EINVAL, errno.ENOENT):
            raise
