"""The VM's network interfaces: one virtio-net device per Ethernet interface
of the container's network namespace, each backed by a TAP that tc mirrors
to the interface (paracell/net/mirror.py).

`prepare` runs in the shim after it joined the namespace (paracell/net/netns.py),
so everything here works on the current namespace. Before it changes anything
it records, in the state directory, which interfaces it is about to take, so
that `reclaim` can take the qdiscs off them after a shim that died. The TAPs
need no such care: they vanish with the last fd, which QEMU holds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from paracell.errors import ParacellError
from paracell.net import discover, guestconfig, mirror, netns, tap
from paracell.vmm.builder import Device, device_kind

RECORD_FILE = "net.json"
RECORD_MAX = 64 << 10


def _netlink_error(err: Exception) -> ParacellError:
    return ParacellError(f"setting up the VM's network: {err}")


def _write_record(path: Path, veths: list[int]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"veths": veths}))
    os.replace(tmp, path)


def _read_record(path: Path) -> list[int]:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(RECORD_MAX))
        veths = data["veths"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [v for v in veths if isinstance(v, int) and not isinstance(v, bool) and v > 0]


def _unmirror(veths: list[int]) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        for index in veths:
            mirror.remove(ipr, index)


@device_kind
class NetworkInterfaces(Device):
    kind = "net"

    def __init__(self, state_dir: Path, netns_path: str) -> None:
        self.record = state_dir / RECORD_FILE
        self.netns_path = netns_path
        self.interfaces: list[discover.Interface] = []
        self.taps: list[tuple[int, str]] = []  # (fd, name), one per interface
        self._veths: list[int] = []

    def facts(self) -> dict[str, Any]:
        return {"netns": self.netns_path, "record": str(self.record)}

    def prepare(self) -> None:
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            with IPRoute() as ipr:
                self.interfaces = discover.interfaces(ipr)
                for iface in self.interfaces:
                    mirror.check_free(ipr, iface.index, iface.name)
                self._veths = [i.index for i in self.interfaces]
                _write_record(self.record, self._veths)
                for iface in self.interfaces:
                    self._attach(ipr, iface)
        except NetlinkError as err:
            self.release()
            raise _netlink_error(err) from None
        except BaseException:
            self.release()
            raise

    def _attach(self, ipr: Any, iface: discover.Interface) -> None:
        fd, name = tap.open_tap()
        self.taps.append((fd, name))
        tap.disable_ipv6(name)
        index = ipr.link_lookup(ifname=name)[0]
        ipr.link("set", index=index, mtu=iface.mtu, state="up")
        mirror.connect(ipr, iface.index, index)

    def guest_records(self) -> list[tuple[str, str]]:
        return guestconfig.records(self.interfaces)

    def pass_fds(self) -> tuple[int, ...]:
        return tuple(fd for fd, _ in self.taps if fd >= 0)

    def qemu_args(self) -> list[str]:
        args = []
        for n, (iface, (fd, _)) in enumerate(zip(self.interfaces, self.taps, strict=True)):
            args += ["-netdev", f"tap,id=net{n},fd={fd}",
                     "-device", f"virtio-net-device,netdev=net{n},mac={iface.mac}"]
        return args

    def launched(self) -> None:
        # QEMU holds the TAPs now; ours would keep them alive after it died.
        for fd, _ in self.taps:
            if fd >= 0:
                os.close(fd)
        self.taps = [(-1, name) for _, name in self.taps]

    def release(self) -> None:
        """In the shim, which is inside the namespace."""
        self.launched()
        if self._veths:
            _unmirror(self._veths)
            self._veths = []
        self.record.unlink(missing_ok=True)

    @classmethod
    def reclaim(cls, facts: dict[str, Any]) -> None:
        """From `delete`, outside the namespace, when the shim died."""
        record = Path(str(facts.get("record", "")))
        veths = _read_record(record)
        if veths and facts.get("netns"):
            # A namespace already gone took its interfaces, and our qdiscs, with it.
            netns.run_inside(str(facts["netns"]), lambda: _unmirror(veths))
        record.unlink(missing_ok=True)


def summary(devices: list[Device]) -> str:
    """For the shim's debug log: which interface each TAP stands for."""
    pairs = [f"{i.name} ({i.mac}) via {name}" for d in devices if isinstance(d, NetworkInterfaces)
             for i, (_, name) in zip(d.interfaces, d.taps, strict=False)]
    return f"network: {', '.join(pairs)}" if pairs else "no network interface"


def launch_spec(base: bytes, devices: list[Device]) -> bytes:
    """The init's launch spec with the interfaces the shim found appended:
    they are known only once the shim is in the namespace."""
    from paracell._native import lib
    from paracell.runtime.spec import encode_records

    extra = [r for d in devices if isinstance(d, NetworkInterfaces) for r in d.guest_records()]
    if not extra:
        return base
    spec = base + encode_records(extra)
    if len(spec) > lib.PC_MAX_PAYLOAD:
        raise ParacellError(f"process spec with the network interfaces is too large for the "
                            f"agent channel ({len(spec)} > {lib.PC_MAX_PAYLOAD} bytes)")
    return spec
