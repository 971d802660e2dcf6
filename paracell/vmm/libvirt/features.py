"""What the libvirt backend needs of a daemon: its version and the
features of its QEMU, asked of the daemon itself (its domain capabilities),
and how it is set up (hostsetup.py). For `paracell check`, and for `create`
before it makes anything on the host."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from paracell.vmm.libvirt import connection, domain


@dataclass(frozen=True)
class Feature:
    name: str
    present: bool | None  # None: could not be verified, for the reason in detail
    detail: str
    # For a missing one: the one line's text after "libvirt at URI".
    why: str = ""

    def refusal(self, uri: str) -> str:
        return f"libvirt at {uri}{self.why or f' lacks {self.name}: {self.detail}'}"

    def as_dict(self, uri: str) -> dict[str, Any]:
        found: dict[str, Any] = {"name": self.name, "present": self.present,
                                 "detail": self.detail}
        if self.present is False:
            found["refusal"] = self.refusal(uri)
        return found


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
