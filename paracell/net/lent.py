"""TAPs lent to another network namespace: libvirt's QEMU opens each TAP by
name (<interface type='ethernet'> with managed='no') in libvirtd's namespace,
which is not the container's.

So for a libvirt domain each TAP is made persistent in the container's
namespace, moved for the domain's start to the one the runtime was called in
(the host's, where libvirtd runs), and moved back once QEMU holds it, where tc mirrors it
to its interface as for direct QEMU (paracell/net/mirror.py). An fd keeps
the TAP attached to QEMU across the moves. Being persistent, the TAPs are
deleted by name when the VM ends, or by `reclaim` from the record; a TAP in
a namespace that dies goes with it.
"""

from __future__ import annotations

import os
import re

from paracell.errors import ParacellError
from paracell.net import netns
from paracell.net.discover import TAP_PREFIX

# pctap + 7 hex digits of the VM's key + a 2-digit index: 14 of IFNAMSIZ's 15.
_NAME = re.compile(rf"{TAP_PREFIX}[0-9a-f]{{7}}[0-9]{{2}}")


def name_for(prefix: str, index: int) -> str:
    return f"{TAP_PREFIX}{prefix[:7]}{index:02d}"


def valid_name(name: object) -> bool:
    return isinstance(name, str) and bool(_NAME.fullmatch(name))


def open_vmm_netns() -> int:
    """The namespace the shim left for the container's (netns.enter)."""
    left = netns.left_fd()
    if left < 0:
        raise ParacellError("internal: the shim kept no handle on the host's network namespace")
    return os.dup(left)


def move(names: list[str], to_fd: int) -> bool:
    """From the current namespace into to_fd's, those of `names` found here."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        for name in names:
            found = ipr.link_lookup(ifname=name)
            if found:
                ipr.link("set", index=found[0], net_ns_fd=to_fd)
    return True


def lend(names: list[str], vmm_fd: int) -> None:
    """From the container's namespace (the current one) to the VMM's."""
    move(names, vmm_fd)


def take_back(names: list[str], vmm_fd: int) -> None:
    """From the VMM's namespace into the current one."""
    here = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        netns.run_inside(f"/proc/self/fd/{vmm_fd}", lambda: move(names, here))
    finally:
        os.close(here)


def delete(names: list[str]) -> None:
    """In the current namespace, those of `names` found there."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        for name in names:
            if valid_name(name):
                for index in ipr.link_lookup(ifname=name):
                    ipr.link("del", index=index)


def delete_in(path: str, names: list[str]) -> None:
    """In the namespace at path (an fd path or a netns file)."""
    netns.run_inside(path, lambda: delete(names))
