"""The parts of a libvirt domain's XML that devices render themselves into
(Device.render_libvirt): its <devices> element and the raw QEMU arguments
for what libvirt cannot say (paracell/vmm/libvirt/domain.py puts the whole
domain together, and docs/libvirt.md explains each element)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

# QEMU's id for ParaCell's RAM backend, which -machine memory-backend= names.
RAM_BACKEND_ID = "paracell-ram"


def sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    element = ET.SubElement(parent, tag, attrs)
    if text is not None:
        element.text = text
    return element


class DomainParts:
    """The domain being rendered: its <devices> and the raw QEMU arguments."""

    def __init__(self) -> None:
        self.devices = ET.Element("devices")
        self.qemu_args: list[str] = []
        self.balloon = False

    def add(self, tag: str, attrs: dict[str, str] | None = None) -> ET.Element:
        return ET.SubElement(self.devices, tag, attrs or {})
