"""What the libvirt backend needs of a daemon, asked of the daemon itself
(its version and its domain capabilities for ParaCell's QEMU): for
`paracell check`, and before `create` defines anything."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from paracell.errors import ParacellError
from paracell.vmm.libvirt import connection, domain


@dataclass(frozen=True)
class Feature:
    name: str
    present: bool
    detail: str


def _values(caps: ET.Element, path: str) -> set[str]:
    return {v.text or "" for v in caps.findall(f"{path}/value")}


def probe(conn: Any, qemu: str, engine: str) -> list[Feature]:
    """Every feature the domain's XML uses, for this QEMU binary and engine."""
    libvirt = connection.libvirt_module()
    virt_type = "kvm" if engine == "kvm" else "qemu"
    try:
        caps = ET.fromstring(conn.getDomainCapabilities(qemu, "x86_64", domain.MACHINE,
                                                        virt_type))
    except libvirt.libvirtError as err:
        return [Feature(f"{domain.MACHINE} machine for {qemu} ({virt_type})", False,
                        connection.describe(err))]
    except ET.ParseError:
        return [Feature("domain capabilities", False, "unreadable answer")]
    machine = caps.findtext("machine") or ""
    cpu_mode = "host-passthrough" if engine == "kvm" else "maximum"
    modes = {m.get("name"): m.get("supported") == "yes" for m in caps.findall("cpu/mode")}
    fs_drivers = _values(caps, "devices/filesystem/enum[@name='driverType']")
    loaders = _values(caps, "os/loader/enum[@name='type']")
    return [
        Feature(f"{domain.MACHINE} machine", machine.startswith("pc-q35"), machine or "none"),
        Feature(f"cpu mode {cpu_mode}", modes.get(cpu_mode, False),
                "yes" if modes.get(cpu_mode) else "not offered"),
        Feature("9p filesystem (driver path)", "path" in fs_drivers,
                ", ".join(sorted(fs_drivers)) or "none"),
        Feature("rom firmware loader", "rom" in loaders, ", ".join(sorted(loaders)) or "none"),
    ]


def require(conn: Any, uri: str, qemu: str, engine: str) -> None:
    """One line naming the first missing feature."""
    for feature in probe(conn, qemu, engine):
        if not feature.present:
            raise ParacellError(f"libvirt at {uri} lacks {feature.name}: {feature.detail}")


def report(uri: str, qemu: str | None, engine: str | None) -> dict[str, Any]:
    """For `paracell check`: reachable or why not, the version, each feature."""
    try:
        conn = connection.open_uri(uri)
    except ParacellError as err:
        return {"uri": uri, "reachable": False, "detail": str(err)}
    try:
        version = connection.version_text(conn.getLibVersion())
        features = probe(conn, qemu, engine or "tcg") if qemu else []
    finally:
        conn.close()
    return {"uri": uri, "reachable": True, "version": version,
            "features": [{"name": f.name, "present": f.present, "detail": f.detail}
                         for f in features]}
