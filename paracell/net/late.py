"""Interfaces that appear between create and start.

`ctr run --cni` creates the task, then runs CNI on /proc/PID/ns/net of the
pid it was given, which is our shim in the namespace it made for itself, and
only then starts the task. The VM was built with a spare virtio-net device
for this (paracell/net/device.py), hidden by the agent. `start` looks in the
shim's namespace: when `start` asks, the shim (the process that sits in the
namespace; its relay calls back here) mirrors an interface found there onto
the spare's TAP, and its configuration rides on the START frame, so the
container's process runs only once its interface is up (docs/networking.md).
"""

from __future__ import annotations

from pathlib import Path

from paracell import speckeys
from paracell.errors import ParacellError
from paracell.net import device, discover, guestconfig, mirror, netns, tap

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.vmm.config import VmConfig


def _take_spares(record_path: Path) -> list[tuple[str, str]]:
    """In the shim's namespace: mirrors the interfaces found there onto the
    spares, and returns their records for the agent. In a child, which loads
    pyroute2 in the shim's place (paracell/net/netlinkchild.py)."""
    from paracell.net import netlinkchild

    def work() -> tuple[list[tuple[str, str]], list[int]]:
        return _mirror_onto_spares(record_path), []

    return netlinkchild.run(work)[0]


def _mirror_onto_spares(record_path: Path) -> list[tuple[str, str]]:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    record = device.Record.read(record_path)
    try:
        with IPRoute() as ipr:
            found = [i for i in discover.interfaces(ipr) if i.index not in record.veths]
            if not found:
                return []
            if len(found) > len(record.spares):
                raise ParacellError(
                    f"{len(found)} network interfaces appeared after create; the VM has "
                    f"{len(record.spares)} spare device(s) for them")
            for iface in found:
                mirror.check_free(ipr, iface.index, iface.name)
            fetched = bool(record.spares_at)
            if fetched:
                _fetch_spares(record)
            record.veths += [i.index for i in found]
            record.write(record_path)
            for iface, spare in zip(found, record.spares, strict=False):
                indexes = ipr.link_lookup(ifname=spare.tap)
                if not indexes:
                    # A pooled VM's TAP goes with its QEMU: the VM has ended.
                    raise ParacellError(f"the VM's spare network device ({spare.tap}) is gone")
                tap_index = indexes[0]
                if fetched:
                    # A move takes a link down and gives it the new
                    # namespace's IPv6 defaults.
                    tap.disable_ipv6(spare.tap)
                    ipr.link("set", index=tap_index, mtu=iface.mtu, state="up")
                else:
                    ipr.link("set", index=tap_index, mtu=iface.mtu)
                mirror.connect(ipr, iface.index, tap_index)
    except NetlinkError as err:
        raise device.netlink_error(err) from None
    return guestconfig.records(found, [s.mac for s in record.spares])


def _fetch_spares(record: device.Record) -> None:
    """A pooled VM's spares (docs/pool.md), from its shim's namespace into
    this one, the container's, where they are mirrored. Only once: the
    record says they are here from then on."""
    import os

    from paracell.net import lent

    here = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        moved = netns.run_inside(record.spares_at,
                                 lambda: lent.move([s.tap for s in record.spares], here),
                                 record.spares_at_id)
    finally:
        os.close(here)
    if moved is None:
        raise ParacellError("the pooled VM's network namespace is gone: its VM has ended")
    record.spares_at, record.spares_at_id = "", None


def _only_ours() -> bool:
    """True when the namespace holds nothing but lo and our TAPs: the common
    case, answered from /proc without loading pyroute2."""
    try:
        with open("/proc/self/net/dev") as f:
            names = [line.split(":", 1)[0].strip() for line in f.readlines()[2:]]
    except OSError:
        return False
    return all(n == "lo" or n.startswith(discover.TAP_PREFIX) for n in names)


def may_grow(config: VmConfig) -> bool:
    """Whether interfaces may still appear for the VM to take at `start`:
    its shim then mirrors them, itself or, as paracell-vmshim, through
    paracell/net/latestart.py."""
    return config.network == netns.NEW and bool(config.net_record)


def start_payload(config: VmConfig) -> bytes:
    """The START frame's payload: network records, or nothing. Runs in the
    shim, the process that sits in the namespace, when `start` asks (the
    relay calls it). Only a namespace of the VM's own can gain interfaces
    after create."""

    if not may_grow(config) or _only_ours():
        return b""
    return payload_for(Path(config.net_record))


def payload_for(record_path: Path) -> bytes:
    """START's payload once interfaces other than ours are in the namespace:
    they are mirrored onto the spares, and their records go to the agent."""
    records = _take_spares(record_path)
    return speckeys.encode(records) if records else b""
