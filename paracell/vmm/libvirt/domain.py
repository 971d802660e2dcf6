"""A VmBuilder as a libvirt domain: the same kernel, initramfs, command line
and devices as direct QEMU, in libvirt's XML (docs/libvirt.md explains each
element).

libvirt has no `microvm` machine type, so the domain is a q35 machine and its
virtio devices sit on PCIe; the guest kernel has virtio-pci for that. Every
device of paracell/vmm/devices.py has one renderer here, found by its class,
and a device with none is refused: a new device cannot be left out silently.

Two things libvirt cannot say go to QEMU as raw arguments (<qemu:commandline>),
and only these:
- guest RAM in ParaCell's own file (libvirt puts a file-backed RAM under
  its daemon-wide memory_backing_dir, at a path of its choosing), so that the
  Pager punches holes in the file it knows and `delete` finds it;
- isa-debug-exit, through which the agent powers the VM off at once.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from paracell import __version__, wire
from paracell.errors import ParacellError
from paracell.net.device import NetworkInterfaces
from paracell.vmm import devices as dev
from paracell.vmm.builder import Device, VmBuilder

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
PARACELL_NS = "https://paracell.dev/xmlns/libvirt/domain/1.0"
NAME_PREFIX = "paracell-"
# qboot: a firmware that only loads the kernel, as microvm's does; SeaBIOS
# would spend a noticeable part of a TCG boot probing for disks and ROMs.
FIRMWARE = "/usr/share/qemu/qboot.rom"
MACHINE = "q35"
# QEMU's id for ParaCell's RAM backend, which -machine memory-backend= names.
RAM_BACKEND_ID = "paracell-ram"

ET.register_namespace("qemu", QEMU_NS)
ET.register_namespace("paracell", PARACELL_NS)

Renderer = Callable[[Any, "Parts"], None]
_RENDERERS: dict[type[Device], Renderer] = {}


def name_for(key: str) -> str:
    """key: the fixed-length hash of the state root and the container ID
    that names the RAM file too (paracell/vmm/memory.py)."""
    return f"{NAME_PREFIX}{key}"


class Parts:
    """The domain being rendered: its <devices> and the raw QEMU arguments."""

    def __init__(self) -> None:
        self.devices = ET.Element("devices")
        self.qemu_args: list[str] = []
        self.balloon = False

    def add(self, tag: str, attrs: dict[str, str] | None = None) -> ET.Element:
        return ET.SubElement(self.devices, tag, attrs or {})


def renders(kind: type[Device]) -> Callable[[Renderer], Renderer]:
    def register(fn: Renderer) -> Renderer:
        _RENDERERS[kind] = fn
        return fn
    return register


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    element = ET.SubElement(parent, tag, attrs)
    if text is not None:
        element.text = text
    return element


@renders(dev.GuestRam)
def _guest_ram(ram: dev.GuestRam, parts: Parts) -> None:
    parts.qemu_args += ["-object", f"memory-backend-file,id={RAM_BACKEND_ID},"
                        f"size={ram.size_mib}M,mem-path={ram.path},share=on,prealloc=off,"
                        "align=2M", "-machine", f"memory-backend={RAM_BACKEND_ID}"]


@renders(dev.SerialConsole)
def _console(console: dev.SerialConsole, parts: Parts) -> None:
    serial = parts.add("serial", {"type": "file"})
    _sub(serial, "source", path=str(console.path), append="on")
    _sub(serial, "target", port="0")


@renders(dev.DebugExit)
def _debug_exit(_: dev.DebugExit, parts: Parts) -> None:
    from paracell._native import lib

    parts.qemu_args += ["-device", f"isa-debug-exit,iobase={lib.PC_DEBUG_EXIT_PORT:#x},iosize=4"]


@renders(dev.AgentPort)
def _agent(agent: dev.AgentPort, parts: Parts) -> None:
    if agent.listen_path is None:
        raise ParacellError("internal: the agent port of a libvirt domain needs a socket path")
    channel = parts.add("channel", {"type": "unix"})
    # QEMU connects to the shim's listener: nothing else can take the port first.
    _sub(channel, "source", mode="connect", path=str(agent.listen_path))
    _sub(channel, "target", type="virtio", name=wire.text("PC_AGENT_PORT_NAME"))


def _share(share: dev.Share, parts: Parts) -> None:
    attrs = {"type": "mount", "accessmode": "passthrough"}
    if share.multidevs:
        attrs["multidevs"] = "remap"
    fs = parts.add("filesystem", attrs)
    _sub(fs, "driver", type="path")
    _sub(fs, "source", dir=str(share.path))
    _sub(fs, "target", dir=share.tag)
    if share.readonly:
        _sub(fs, "readonly")


for _kind in (dev.Share, dev.HostShare, dev.PodShare):
    renders(_kind)(_share)


@renders(dev.PagerChannel)
def _pager(pager: dev.PagerChannel, parts: Parts) -> None:
    from paracell._native import lib

    if pager.listen_path is None:
        raise ParacellError("internal: the Pager of a libvirt domain needs a socket path")
    shmem = parts.add("shmem", {"name": "paracell-pager"})
    _sub(shmem, "model", type="ivshmem-doorbell")
    _sub(shmem, "server", path=str(pager.listen_path))
    _sub(shmem, "msi", vectors=str(lib.PC_PAGER_VECTORS), ioeventfd="on")


@renders(dev.Balloon)
def _balloon(_: dev.Balloon, parts: Parts) -> None:
    parts.balloon = True
    balloon = parts.add("memballoon", {"model": "virtio", "freePageReporting": "on"})
    # No statistics polling: it would wake an idle guest.
    _sub(balloon, "stats", period="0")


@renders(NetworkInterfaces)
def _nics(nics: NetworkInterfaces, parts: Parts) -> None:
    for mac, name in zip(nics.macs(), nics.tap_names(), strict=True):
        iface = parts.add("interface", {"type": "ethernet"})
        # managed='no': the TAP is ParaCell's, lent to libvirtd's namespace
        # for the start and taken back once QEMU holds it (paracell/net/lent.py).
        _sub(iface, "target", dev=name, managed="no")
        _sub(iface, "model", type="virtio")
        _sub(iface, "mac", address=mac)


def render(vm: VmBuilder, name: str, owner: dict[str, str]) -> str:
    """The transient domain's XML."""
    m = vm.machine
    kvm = m.engine == "kvm"
    root = ET.Element("domain", {"type": "kvm" if kvm else "qemu"})
    _sub(root, "name", name)
    meta = _sub(root, "metadata")
    tag = ET.SubElement(meta, f"{{{PARACELL_NS}}}container")
    for key in ("id", "bundle"):
        ET.SubElement(tag, f"{{{PARACELL_NS}}}{key}").text = owner.get(key, "")
    ET.SubElement(tag, f"{{{PARACELL_NS}}}version").text = __version__
    _sub(root, "memory", str(m.memory_mib), unit="MiB")
    _sub(root, "vcpu", str(m.vcpus))
    os_ = _sub(root, "os")
    _sub(os_, "type", "hvm", arch="x86_64", machine=MACHINE)
    _sub(os_, "loader", FIRMWARE, type="rom", readonly="yes")
    _sub(os_, "kernel", str(m.kernel))
    _sub(os_, "initrd", str(m.initramfs))
    _sub(os_, "cmdline", vm.kernel_cmdline())
    features = _sub(root, "features")
    # The Pager's ivshmem-doorbell and every virtio device are PCIe, which
    # the guest finds through ACPI's MCFG.
    _sub(features, "acpi")
    if not kvm:
        from paracell.vmm.builder import TCG_TB_SIZE_MIB

        _sub(_sub(features, "tcg"), "tb-cache", str(TCG_TB_SIZE_MIB), unit="MiB")
    # TCG's "max" model has PKU, which XGates need; KVM passes the host's CPU through.
    _sub(root, "cpu", mode="host-passthrough" if kvm else "maximum")
    clock = _sub(root, "clock", offset="utc")
    _sub(clock, "timer", name="hpet", present="no")
    # A guest that powers off, reboots or panics ends its VM, as -no-reboot does.
    for event in ("on_poweroff", "on_reboot", "on_crash"):
        _sub(root, event, "destroy")
    # QEMU runs as root with no relabelling: its 9p server keeps the
    # container's owners and modes, and a relabel would chown the container's
    # files (docs/libvirt.md).
    label = _sub(root, "seclabel", type="static", model="dac", relabel="no")
    _sub(label, "label", "+0:+0")
    parts = Parts()
    _sub(parts.devices, "emulator", m.qemu)
    parts.add("controller", {"type": "usb", "model": "none"})
    for device in vm.devices:
        renderer = _RENDERERS.get(type(device))
        if renderer is None:
            raise ParacellError(f"the libvirt backend cannot render the {device.kind} device")
        renderer(device, parts)
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
