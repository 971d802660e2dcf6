"""A VmBuilder as a libvirt domain: the same kernel, initramfs, command line
and devices as direct QEMU, in libvirt's XML (docs/libvirt.md explains each
element).

libvirt has no `microvm` machine type, so the domain is a q35 machine and its
virtio devices sit on PCIe; the guest kernel has virtio-pci for that. Each
device renders itself (Device.render_libvirt, into paracell/vmm/domainxml.py's
parts), and a device that does not say how is refused: a new device cannot
be left out silently.

Two things libvirt cannot say go to QEMU as raw arguments (<qemu:commandline>),
and only these:
- guest RAM in ParaCell's own file (libvirt puts a file-backed RAM under
  its daemon-wide memory_backing_dir, at a path of its choosing), so that the
  Pager punches holes in the file it knows and `delete` finds it;
- isa-debug-exit, through which the agent powers the VM off at once.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from paracell import __version__
from paracell.vmm.builder import VmBuilder
from paracell.vmm.domainxml import DomainParts, sub

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
PARACELL_NS = "https://paracell.dev/xmlns/libvirt/domain/1.0"
NAME_PREFIX = "paracell-"
# qboot: a firmware that only loads the kernel, as microvm's does; SeaBIOS
# would spend a noticeable part of a TCG boot probing for disks and ROMs.
FIRMWARE = "/usr/share/qemu/qboot.rom"
MACHINE = "q35"

ET.register_namespace("qemu", QEMU_NS)
ET.register_namespace("paracell", PARACELL_NS)


def name_for(key: str) -> str:
    """key: the fixed-length hash of the state root and the container ID
    that names the RAM file too (paracell/vmm/memory.py)."""
    return f"{NAME_PREFIX}{key}"


def render(vm: VmBuilder, name: str, owner: dict[str, str]) -> str:
    """The transient domain's XML."""
    m = vm.machine
    kvm = m.engine == "kvm"
    root = ET.Element("domain", {"type": "kvm" if kvm else "qemu"})
    sub(root, "name", name)
    meta = sub(root, "metadata")
    tag = ET.SubElement(meta, f"{{{PARACELL_NS}}}container")
    for key in ("id", "bundle"):
        ET.SubElement(tag, f"{{{PARACELL_NS}}}{key}").text = owner.get(key, "")
    ET.SubElement(tag, f"{{{PARACELL_NS}}}version").text = __version__
    sub(root, "memory", str(m.memory_mib), unit="MiB")
    sub(root, "vcpu", str(m.vcpus))
    os_ = sub(root, "os")
    sub(os_, "type", "hvm", arch="x86_64", machine=MACHINE)
    sub(os_, "loader", FIRMWARE, type="rom", readonly="yes")
    sub(os_, "kernel", str(m.kernel))
    sub(os_, "initrd", str(m.initramfs))
    sub(os_, "cmdline", vm.kernel_cmdline())
    features = sub(root, "features")
    # The Pager's ivshmem-doorbell and every virtio device are PCIe, which
    # the guest finds through ACPI's MCFG.
    sub(features, "acpi")
    if not kvm:
        from paracell.vmm.builder import TCG_TB_SIZE_MIB

        sub(sub(features, "tcg"), "tb-cache", str(TCG_TB_SIZE_MIB), unit="MiB")
    # TCG's "max" model has PKU, which XGates need; KVM passes the host's CPU through.
    sub(root, "cpu", mode="host-passthrough" if kvm else "maximum")
    clock = sub(root, "clock", offset="utc")
    sub(clock, "timer", name="hpet", present="no")
    # A guest that powers off, reboots or panics ends its VM, as -no-reboot does.
    for event in ("on_poweroff", "on_reboot", "on_crash"):
        sub(root, event, "destroy")
    # QEMU runs as root with no relabelling: its 9p server keeps the
    # container's owners and modes, and a relabel would chown the container's
    # files (docs/libvirt.md).
    label = sub(root, "seclabel", type="static", model="dac", relabel="no")
    sub(label, "label", "+0:+0")
    parts = DomainParts()
    sub(parts.devices, "emulator", m.qemu)
    parts.add("controller", {"type": "usb", "model": "none"})
    for device in vm.devices:
        device.render_libvirt(parts)
    if not parts.balloon:
        parts.add("memballoon", {"model": "none"})
    root.append(parts.devices)
    if parts.qemu_args:
        cmdline = ET.SubElement(root, f"{{{QEMU_NS}}}commandline")
        for arg in parts.qemu_args:
            ET.SubElement(cmdline, f"{{{QEMU_NS}}}arg", {"value": arg})
    return ET.tostring(root, encoding="unicode")


def owner_of(xml: str) -> dict[str, str]:
    """The container a domain's XML says it belongs to ({} for another's domain)."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return {}
    tag = root.find(f"metadata/{{{PARACELL_NS}}}container")
    if tag is None:
        return {}
    return {child.tag.split("}", 1)[1]: child.text or "" for child in tag}
