"""The Hypervisor interface: everything the runtime asks of a VMM, for one VM.

The runtime never speaks a VMM's own protocol. A verb gets the VM's
hypervisor from its recorded configuration (`for_vm`) and asks it to pause,
resume, stop, resize, report, save or restore; the shim asks it to launch.
Two backends implement it: direct QEMU (paracell/vmm/qemu/), the default, and
libvirt (paracell/vmm/libvirt/), where QEMU is libvirtd's child and the VM a
transient domain. `for_vm` picks one from the record.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from paracell.errors import ParacellError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from paracell.vmm.builder import Vm, VmBuilder
    from paracell.vmm.config import VmConfig


BACKENDS = ("qemu", "libvirt")
DEFAULT_BACKEND = "qemu"
ANNOTATION = "io.paracell.vmm"


@dataclass(frozen=True)
class VmStatus:
    running: bool
    detail: str  # the VMM's own word for the state ("paused", "postmigrate", ...)


@dataclass(frozen=True)
class SavedState:
    """A VM's device state on disk. Its RAM is not in it: guest RAM is a
    shared file on tmpfs (paracell/vmm/memory.py) that the caller keeps."""

    path: Path
    size_bytes: int
    seconds: float


class Hypervisor(ABC):
    """One VM under one VMM."""

    @abstractmethod
    def launch(self, vm: VmBuilder, log_path: Path,
               before_start: Callable[[], None] | None = None,
               preexec: Callable[[], None] | None = None, incoming: bool = False,
               settle: Callable[[int], None] | None = None, paused: bool = False) -> Vm:
        """Starts the VM (in the shim). With `incoming`, it waits, stopped,
        for `restore` instead of booting; with `paused`, it has booted
        nothing yet and waits for `resume` (a fork loads its checkpoint).
        `settle(host pid)` runs once QEMU exists and before the guest has
        run, for a QEMU that is not the shim's child (it joins the
        container's cgroup there)."""

    @abstractmethod
    def pause(self) -> None:
        """Stops every vCPU."""

    @abstractmethod
    def resume(self) -> None:
        """Runs the vCPUs again (after pause, save or restore)."""

    @abstractmethod
    def stop(self) -> None:
        """Ends the VM at once, whatever the guest does."""

    @abstractmethod
    def set_memory(self, usable_bytes: int) -> None:
        """Asks the guest to give memory back down to (or take it up to) this
        much usable RAM, through the balloon; returns without waiting."""

    @abstractmethod
    def memory(self) -> int:
        """The guest's usable RAM now, in bytes."""

    @abstractmethod
    def query(self) -> VmStatus:
        """Whether the vCPUs run."""

    @abstractmethod
    def save(self, path: Path) -> SavedState:
        """Stops the vCPUs and writes the device state to `path`; the VM stays
        stopped (resume lets it go on, as a checkpoint does)."""

    @abstractmethod
    def restore(self, state_fd: int) -> None:
        """Loads a device state saved by `save` (an fd open on it, which the
        caller checked and keeps) into a VM launched with `incoming` on the
        same configuration and a copy of the RAM it was saved with; the VM is
        left stopped."""


def for_vm(config: VmConfig, host_proc: int = -1) -> Hypervisor:
    """The hypervisor of a VM that `create` recorded; host_proc: an fd of
    the host's /proc, for a shim in a PID namespace of its own."""
    from paracell.vmm.qemu import QemuHypervisor

    if config.vmm == "libvirt" and config.domain:
        from paracell.vmm.libvirt import LibvirtHypervisor

        return LibvirtHypervisor(config.libvirt_uri, config.domain, host_proc)
    if not config.qmp_socket:
        raise ParacellError("the container has no VM of its own (a pod member: its pod's "
                            "sandbox holds the VM)")
    return QemuHypervisor(Path(config.qmp_socket))
