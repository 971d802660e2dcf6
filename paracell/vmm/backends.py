"""The registry of backends: the one place a backend's name is read. The
runtime gets Backend objects here and asks them (paracell/vmm/hypervisor.py);
the CLI builds its --vmm choices from NAMES.

A backend's package is imported only when a VM of it is planned or reached
again, and for the kinds of host resource it registers when a record names
one: `delete` of a direct-QEMU container never loads libvirt.
"""

from __future__ import annotations

import importlib

from paracell.errors import ParacellError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.vmm.config import VmConfig
    from paracell.vmm.hypervisor import Backend, Capabilities, Hypervisor

# name -> (module, class, the reclaimable kinds the module registers)
_TABLE: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "qemu": ("paracell.vmm.qemu", "QemuBackend", ("qemu-monitor",)),
    "libvirt": ("paracell.vmm.libvirt", "LibvirtBackend", ("libvirt-domain",)),
}
NAMES = tuple(_TABLE)
DEFAULT = "qemu"
ANNOTATION = "io.paracell.vmm"


def backend_class(name: str) -> type[Backend]:
    try:
        module, cls, _ = _TABLE[name]
    except KeyError:
        raise ParacellError(f"unknown vmm {name[:32]!r}: expected one of "
                            f"{', '.join(NAMES)}") from None
    return getattr(importlib.import_module(module), cls)


def classes() -> list[type[Backend]]:
    return [backend_class(name) for name in NAMES]


def select(name: str, location: str = "") -> Backend:
    return backend_class(name)(location)


def requested(annotations: dict[str, str], flag: str | None) -> str:
    """The backend for a new VM: the annotation for its container, then the
    flag, then $PARACELL_VMM and the settings file; direct QEMU by default."""
    from paracell import settings

    wanted = annotations.get(ANNOTATION)
    if wanted is not None and wanted not in _TABLE:
        raise ParacellError(f"annotation {ANNOTATION}: unknown vmm {wanted[:32]!r}: "
                            f"expected one of {', '.join(NAMES)}")
    return wanted or flag or settings.choice("PARACELL_VMM", "vmm", NAMES, "vmm") or DEFAULT


def hypervisor_of(config: VmConfig, host_proc: int = -1) -> Hypervisor:
    """The hypervisor of a VM that `create` recorded."""
    if not config.control:
        raise ParacellError("the container has no VM of its own (a pod member: its pod's "
                            "sandbox holds the VM)")
    return backend_class(config.vmm).hypervisor(config.control, host_proc)


def capabilities_of(config: VmConfig) -> Capabilities:
    return backend_class(config.vmm).capabilities


def register_reclaimers(records: list[dict[str, object]]) -> None:
    """Imports the backends whose kinds of host resource the records name,
    which registers their cleanup (paracell/reclaim.py)."""
    kinds = {r.get("kind") for r in records if isinstance(r, dict)}
    for module, _, registered in _TABLE.values():
        if kinds.intersection(registered):
            importlib.import_module(module)
