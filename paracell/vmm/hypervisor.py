"""The Hypervisor interface: everything the runtime asks of a VMM, for one VM.

The runtime never speaks a VMM's own protocol. A verb gets the VM's
hypervisor from its recorded configuration (`for_vm`) and asks it to pause,
resume, stop, resize, report, save or restore; the shim asks it to launch.
Direct QEMU (paracell/vmm/qemu/) is the only backend today; a second one
(libvirt) implements this class and `for_vm` picks it from the record,
without a change to the runtime.
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
               preexec: Callable[[], None] | None = None, incoming: bool = False) -> Vm:
        """Starts the VM (in the shim). With `incoming`, it waits, stopped,
        for `restore` instead of booting."""

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
    def restore(self, path: Path) -> None:
        """Loads a device state saved by `save` into a VM launched with
        `incoming` on the same configuration and a copy of the RAM it was
        saved with; the VM is left stopped."""


def for_vm(config: VmConfig) -> Hypervisor:
    """The hypervisor of a VM that `create` recorded."""
    from paracell.vmm.qemu import QemuHypervisor

    if not config.qmp_socket:
        raise ParacellError("the container has no VM of its own (a pod member: its pod's "
                            "sandbox holds the VM)")
    return QemuHypervisor(Path(config.qmp_socket))
