"""The VM's network interfaces: one virtio-net device per Ethernet interface
of the container's network namespace, each backed by a TAP that tc mirrors
to the interface (paracell/net/mirror.py).

`prepare` runs in the shim after it joined the namespace (paracell/net/netns.py),
so everything here works on the current namespace. Before it changes anything
it records, in the state directory, which interfaces it is about to take, so
that `reclaim` can take the qdiscs off them after a shim that died. The TAPs
need no such care: they vanish with the last fd, which QEMU holds.

In a namespace of its own (the spec's `network` entry has no path), the VM
also gets a spare device: `ctr run --cni` adds the container's veth to the
shim's namespace only between create and start (paracell/net/late.py).

A fork's VM loads its parent's device state, so it has its parent's devices,
counted in the parent's record (`Record.devices`), whatever the fork's own
namespace holds: that namespace's interfaces go onto the first devices, in
order, and the rest get a TAP that leads nowhere. The TAPs stay down until
the guest's agent has dropped its parent's addresses and taken the fork's
on FORKED (docs/snapshots.md, "Forks and the network").
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from paracell import speckeys as K
from paracell.errors import ParacellError
from paracell.net import discover, guestconfig, lent, mirror, netns, tap
from paracell.reclaim import reclaimable
from paracell.vmm.builder import Device

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.vmm.domainxml import DomainParts

RECORD_FILE = "net.json"
RECORD_MAX = 64 << 10


@dataclass
class Spare:
    tap: str
    mac: str


@dataclass
class Record:
    """What the namespace holds of ours: the interfaces we mirror (their
    ifindex) and the spare TAPs with their guest MACs."""

    veths: list[int] = field(default_factory=list)
    spares: list[Spare] = field(default_factory=list)
    # Persistent TAPs of a libvirt domain (paracell/net/lent.py), by name.
    lent: list[str] = field(default_factory=list)
    # The VM's virtio-net devices (interfaces, spares), which its forks must
    # have too; None in a record written before forks could have a network.
    devices: tuple[int, int] | None = None
    # The namespace it was written in (st_dev, st_ino of its nsfs file): a
    # cleanup from outside undoes nothing in another one that a path names
    # by then (a namespace deleted and made again under the same name).
    netns: tuple[int, int] | None = None
    # Where the spares' TAPs still are, and that namespace's identity: a
    # pooled VM's (docs/pool.md), whose TAPs the container's namespace takes
    # at `start` when it has interfaces for them (paracell/net/late.py).
    spares_at: str = ""
    spares_at_id: tuple[int, int] | None = None

    def write(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> Record:
        """Bounded and checked; a missing or garbled record is an empty one."""
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read(RECORD_MAX))
            veths = [v for v in data["veths"]
                     if isinstance(v, int) and not isinstance(v, bool) and v > 0]
            spares = [Spare(str(s["tap"]), str(s["mac"])) for s in data["spares"]]
            lent_taps = [n for n in data.get("lent", []) if lent.valid_name(n)]
            devices = _device_counts(data.get("devices"))
            netns_id = _identity(data.get("netns"))
            spares_at = data.get("spares_at", "")
            spares_at_id = _identity(data.get("spares_at_id"))
            if not isinstance(spares_at, str) or (spares_at and spares_at_id is None):
                spares_at, spares_at_id = "", None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return cls()
        return cls(veths, spares, lent_taps, devices, netns_id, spares_at, spares_at_id)


def _identity(where: Any) -> tuple[int, int] | None:
    """A namespace's (st_dev, st_ino) as JSON holds it, or None."""
    if isinstance(where, list) and len(where) == 2 and all(type(v) is int for v in where):
        return where[0], where[1]
    return None


def _device_counts(value: Any) -> tuple[int, int] | None:
    from paracell._native import lib

    bounds = (lib.PC_NET_MAX_IFACES, lib.PC_NET_MAX_SPARES)
    if not isinstance(value, list) or len(value) != 2:
        return None
    if not all(type(v) is int and 0 <= v <= bound for v, bound in zip(value, bounds,
                                                                      strict=True)):
        return None
    return value[0], value[1]


def netlink_error(err: Exception) -> ParacellError:
    return ParacellError(f"setting up the VM's network: {err}")


def unmirror(veths: list[int]) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        for index in veths:
            mirror.remove(ipr, index)


def new_mac() -> str:
    """Locally administered, unicast: never a vendor's, never a veth's from CNI
    (which the spare takes over at start anyway)."""
    raw = bytearray(secrets.token_bytes(6))
    raw[0] = (raw[0] & 0xFC) | 0x02
    return ":".join(f"{b:02x}" for b in raw)


@reclaimable
class NetworkInterfaces(Device):
    kind = "net"

    def __init__(self, state_dir: Path, netns_path: str, tap_prefix: str = "",
                 fork_devices: tuple[int, int] | None = None, forked: bool = False) -> None:
        """netns_path: the namespace the shim joins; "" for a new one of its own.
        tap_prefix: for a VMM that is not our child (libvirt), which opens
        each TAP by name in its own namespace, the TAPs are persistent, named
        from this prefix, and lent to that namespace until QEMU holds them.
        fork_devices: a fork's, its parent's (interfaces, spares).
        forked: a fork's or a restore's, whose TAPs wait for `fork_ready`."""
        self.record = state_dir / RECORD_FILE
        self.netns_path = netns_path
        self.tap_prefix = tap_prefix
        self.fork_devices = fork_devices
        self.forked = forked or fork_devices is not None
        self.interfaces: list[discover.Interface] = []
        self.spares: list[Spare] = []
        # A fork's devices that no interface of its namespace takes: their MACs.
        self.idle: list[str] = []
        self.taps: list[tuple[int, str]] = []  # (fd, name): the interfaces', then the spares'
        self._veths: list[int] = []
        # libvirt: the VMM's namespace, where the TAPs are lent until QEMU holds them.
        self._vmm_netns = -1
        # A VM restored from a template has the template's devices, MACs and
        # all: the interfaces' then the spares', in order. The agent finds each
        # device by that MAC and gives it the interface's own.
        self.device_macs: list[str] | None = None

    def shape(self) -> dict[str, Any]:
        """How many virtio-net devices: the namespace's interfaces now (the
        shim is inside it), and the spares a namespace of our own gets."""
        nics, spares = self.fork_devices or (discover.ethernet_count(), self._spare_count())
        return {"nics": nics, "spares": spares}

    def _spare_count(self) -> int:
        from paracell._native import lib

        return 0 if self.netns_path else lib.PC_NET_MAX_SPARES

    def tap_names(self) -> list[str]:
        return [name for _, name in self.taps]

    def macs(self) -> list[str]:
        """The devices' MACs as the guest sees them, in order."""
        return self.device_macs or ([i.mac for i in self.interfaces]
                                    + [s.mac for s in self.spares] + self.idle)

    def facts(self) -> dict[str, Any]:
        return {"netns": self.netns_path, "record": str(self.record)}

    def prepare(self) -> None:
        """Mirrors the namespace's interfaces onto new TAPs: rtnetlink work,
        done in a child (paracell/net/netlinkchild.py), which hands back what
        it found and the TAPs' fds."""
        from paracell.net import netlinkchild

        def work() -> tuple[tuple[Any, ...], list[int]]:
            self._prepare()
            found = (self.interfaces, self._veths, self.spares, self.idle, self.tap_names())
            return found, [fd for fd, _ in self.taps if fd >= 0] + \
                ([self._vmm_netns] if self._vmm_netns >= 0 else [])

        (self.interfaces, self._veths, self.spares, self.idle, names), fds = \
            netlinkchild.run(work)
        if self.tap_prefix:
            self.taps = [(-1, name) for name in names]
            self._vmm_netns = fds[0] if fds else -1
        else:
            self.taps = list(zip(fds, names, strict=True))

    def _prepare(self) -> None:
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            with IPRoute() as ipr:
                self.interfaces = discover.interfaces(ipr)
                self._check_restored_macs()
                self._check_fork_devices()
                for iface in self.interfaces:
                    mirror.check_free(ipr, iface.index, iface.name)
                self._veths = [i.index for i in self.interfaces]
                self._write_record()
                for iface in self.interfaces:
                    index = self._tap(ipr, iface.mtu)
                    if not self.tap_prefix:  # a lent TAP is mirrored once it is back
                        mirror.connect(ipr, iface.index, index)
                if self.fork_devices is not None:
                    self._add_idle(ipr)
                elif not self.netns_path:
                    self._add_spares(ipr)
            if self.tap_prefix:
                self._vmm_netns = lent.open_vmm_netns()
                lent.lend(self.tap_names(), self._vmm_netns)
        except NetlinkError as err:
            self.release()
            raise netlink_error(err) from None
        except BaseException:
            self.release()
            raise

    def _check_restored_macs(self) -> None:
        spares = self._spare_count()
        if self.device_macs is not None and len(self.device_macs) != len(self.interfaces) + spares:
            raise ParacellError("the network namespace changed while its VM was being made: "
                                f"{len(self.interfaces)} interfaces now")

    def _check_fork_devices(self) -> None:
        if self.fork_devices is not None and len(self.interfaces) > sum(self.fork_devices):
            raise ParacellError(f"network namespace {self.netns_path}: "
                                f"{len(self.interfaces)} interfaces, and the fork's VM has "
                                f"{sum(self.fork_devices)} network devices (its parent's)")

    def _add_idle(self, ipr: Any) -> None:
        """A fork's devices beyond its namespace's interfaces: a TAP each,
        connected to nothing; the agent keeps them down."""
        assert self.fork_devices is not None
        for _ in range(sum(self.fork_devices) - len(self.interfaces)):
            self._tap(ipr, 1500)
            self.idle.append(new_mac())

    def _write_record(self, lent_names: list[str] | None = None) -> None:
        # The devices the VM is given: what it was shaped from, found again.
        devices = self.fork_devices or (len(self.interfaces), self._spare_count())
        Record(self._veths, self.spares, self._lent() if lent_names is None else lent_names,
               devices, netns.identity_of("/proc/thread-self/ns/net")).write(self.record)

    def _tap(self, ipr: Any, mtu: int) -> int:
        """A new TAP, up (a fork's: down, until `fork_ready`): its ifindex."""
        if self.tap_prefix:
            name = lent.name_for(self.tap_prefix, len(self.taps))
            # Recorded before it exists: a persistent TAP outlives everyone.
            self._record_lent([*self.tap_names(), name])
            tap.make_persistent_tap(name)
            self.taps.append((-1, name))
        else:
            fd, name = tap.open_tap()
            self.taps.append((fd, name))
        tap.disable_ipv6(name)
        index = ipr.link_lookup(ifname=name)[0]
        if not self.forked:
            ipr.link("set", index=index, mtu=mtu, state="up")
        else:
            # A fork's guest runs with its parent's addresses until FORKED
            # has reset them: a TAP that is down drops what it sends (and
            # mirred drops what the veth sends it) until then.
            ipr.link("set", index=index, mtu=mtu)
        return index

    def fork_ready(self) -> None:
        """Once a fork's (or a restore's) guest holds only its own addresses:
        the wire of each of its namespace's interfaces is connected (idle
        devices' and spares' TAPs stay down). In the shim, in the namespace;
        no netlink."""
        for _, name in self.taps[:len(self.interfaces)]:
            tap.bring_up(name)

    def _add_spares(self, ipr: Any) -> None:
        from paracell._native import lib

        given = (self.device_macs or [])[len(self.interfaces):]
        for n in range(lib.PC_NET_MAX_SPARES):
            self._tap(ipr, 1500)
            self.spares.append(Spare(self.taps[-1][1], given[n] if given else new_mac()))
        self._write_record()

    def _lent(self) -> list[str]:
        return self.tap_names() if self.tap_prefix else []

    def _record_lent(self, names: list[str]) -> None:
        self._write_record(names)

    def sandbox_records(self) -> list[tuple[str, str]]:
        device_macs = self.device_macs[:len(self.interfaces)] if self.device_macs else None
        return [*guestconfig.records(self.interfaces, device_macs),
                *((K.NET_SPARE, s.mac) for s in self.spares)]

    def fork_records(self) -> list[tuple[str, str]]:
        """FORKED's records: the namespace's interfaces, the n-th on the VM's
        n-th device, each with its own MAC, which the agent gives the device."""
        return guestconfig.records(self.interfaces)

    def pass_fds(self) -> tuple[int, ...]:
        return tuple(fd for fd, _ in self.taps if fd >= 0)

    def qemu_args(self) -> list[str]:
        args = []
        for n, (mac, (fd, _)) in enumerate(zip(self.macs(), self.taps, strict=True)):
            args += ["-netdev", f"tap,id=net{n},fd={fd}",
                     "-device", f"virtio-net-device,netdev=net{n},mac={mac}"]
        return args

    def launched(self) -> None:
        # QEMU holds the TAPs now; ours would keep them alive after it died.
        for fd, _ in self.taps:
            if fd >= 0:
                os.close(fd)
        self.taps = [(-1, name) for _, name in self.taps]
        if self._vmm_netns >= 0:
            self._take_back()

    def _take_back(self) -> None:
        """The lent TAPs, home again now that QEMU holds them: up, and mirrored."""
        from paracell.net import netlinkchild

        lent.take_back(self.tap_names(), self._vmm_netns)
        os.close(self._vmm_netns)
        self._vmm_netns = -1

        def work() -> tuple[None, list[int]]:
            self._mirror_lent()
            return None, []

        netlinkchild.run(work)

    def _mirror_lent(self) -> None:
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            with IPRoute() as ipr:
                for n, name in enumerate(self.tap_names()):
                    tap.disable_ipv6(name)
                    index = ipr.link_lookup(ifname=name)[0]
                    ipr.link("set", index=index, state="up")
                    if n < len(self.interfaces):
                        mirror.connect(ipr, self.interfaces[n].index, index)
        except (NetlinkError, IndexError) as err:
            raise netlink_error(err) from None

    def release(self) -> None:
        """In the shim, which is inside the namespace. `start` may have
        mirrored more interfaces onto the spares: the record says which."""
        for fd, _ in self.taps:
            if fd >= 0:
                os.close(fd)
        self.taps = [(-1, name) for _, name in self.taps]
        veths = sorted(set(self._veths) | set(Record.read(self.record).veths))
        if veths:
            unmirror(veths)
        self._veths = []
        if self.tap_prefix:
            names = self.tap_names()
            if self._vmm_netns >= 0:  # still lent: a start that failed
                lent.delete_in(f"/proc/self/fd/{self._vmm_netns}", names)
                os.close(self._vmm_netns)
                self._vmm_netns = -1
            lent.delete(names)
        self.record.unlink(missing_ok=True)

    def render_libvirt(self, parts: DomainParts) -> None:
        from paracell.vmm.domainxml import sub

        for mac, name in zip(self.macs(), self.tap_names(), strict=True):
            iface = parts.add("interface", {"type": "ethernet"})
            # managed='no': the TAP is ParaCell's, lent to libvirtd's namespace
            # for the start and taken back once QEMU holds it (paracell/net/lent.py).
            sub(iface, "target", dev=name, managed="no")
            sub(iface, "model", type="virtio")
            sub(iface, "mac", address=mac)

    @classmethod
    def reclaim(cls, facts: dict[str, Any]) -> None:
        """From `delete`, outside the namespace, when the shim died. A
        namespace of the shim's own died with it and QEMU, interfaces and all."""
        record = Path(str(facts.get("record", "")))
        found = Record.read(record)
        veths = found.veths
        if facts.get("netns") and (veths or found.lent):
            # A namespace already gone took its interfaces, and our qdiscs, with it.
            def undo() -> None:
                if veths:
                    unmirror(veths)
                lent.delete(found.lent)

            netns.run_inside(str(facts["netns"]), undo, found.netns)
        if found.lent:
            # Lent to the host's namespace, where delete runs, when the shim died.
            lent.delete(found.lent)
        record.unlink(missing_ok=True)


def summary(nics: NetworkInterfaces | None) -> str:
    """For the shim's debug log: which interface each TAP stands for."""
    if nics is None:
        return "no network interface"
    pairs = [f"{i.name} ({i.mac}) via {name}"
             for i, (_, name) in zip(nics.interfaces, nics.taps, strict=False)]
    pairs += [f"spare ({s.mac}) via {s.tap}" for s in nics.spares]
    pairs += [f"idle ({mac}) via {name}" for mac, (_, name) in
              zip(nics.idle, nics.taps[len(nics.interfaces):], strict=False)]
    return f"network: {', '.join(pairs)}" if pairs else "no network interface"
