"""What the runtime asks of a VMM: a Backend (what it can do, how a VM's
control is planned and recorded) and, for one VM, its Hypervisor (launch,
pause, resume, stop, resize, report, save, restore) and, where the backend
can, its Snapshots (checkpoints in place, and a paused VM loaded from one).

The runtime never speaks a VMM's own protocol and never compares a
backend's name: it asks the objects, which paracell/vmm/backends.py hands
out. The backends are packages of their own: direct QEMU
(paracell/vmm/qemu/) and libvirt (paracell/vmm/libvirt/).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from paracell.errors import ParacellError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from paracell.vmm.builder import Vm, VmBuilder


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; the runtime decides by these, never by name."""

    # QEMU is the shim's child and inherits fds (sockets, TAPs); otherwise it
    # connects to sockets beside the RAM file as it starts (devices.Rendezvous).
    passes_fds: bool
    # Device state saved and restored into a new VM (VM templates).
    templates: bool
    # Device state saved and loaded in place while guest RAM is the host's to
    # capture and put back, and a paused VM loaded from a copy (checkpoints,
    # rollback, forks: docs/snapshots.md).
    snapshots: bool
    # Guest memory resized while the VM runs (the balloon).
    live_resize: bool


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


def unsupported(backend: str, what: str) -> ParacellError:
    return ParacellError(f"{what} is not supported with the {backend} backend")


class Snapshots(ABC):
    """One running VM's device states, saved and loaded in place under tags,
    in a store the backend keeps at a path the caller gives (and removes with
    its directory). Guest RAM is the caller's: a shared file it reads and
    writes while the vCPUs are stopped, between the backend's steps."""

    @abstractmethod
    def save(self, tag: str, capture: Callable[[], None]) -> None:
        """Stops the vCPUs, runs capture, saves the device state as tag, and
        runs the vCPUs again."""

    @abstractmethod
    def load(self, tag: str, revert: Callable[[], None]) -> None:
        """Stops the vCPUs, runs revert (guest RAM goes back), loads tag's
        device state in place, and runs the vCPUs again."""

    @abstractmethod
    def delete(self, tag: str) -> None:
        """Removes tag's device state from the store."""

    @abstractmethod
    def start_from(self, store: Path, tag: str) -> None:
        """For a VM launched `paused` on a copy of another VM's RAM: loads
        tag's device state from store (another VM's, copied; it is the
        caller's and may go once this returns), then runs the vCPUs."""


class Hypervisor(ABC):
    """One VM under one VMM."""

    @abstractmethod
    def launch(self, vm: VmBuilder, log_path: Path,
               before_start: Callable[[], None] | None = None,
               preexec: Callable[[], None] | None = None, incoming: bool = False,
               settle: Callable[[int], None] | None = None, paused: bool = False) -> Vm:
        """Starts the VM (in the shim). With `incoming`, it waits, stopped,
        for `restore` instead of booting; with `paused`, it has booted
        nothing yet and waits for its snapshot (Snapshots.start_from).
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
        """Stops the vCPUs and writes the device state to a new file at
        `path`; the VM stays stopped (resume lets it go on)."""

    @abstractmethod
    def restore(self, state_fd: int) -> None:
        """Loads a device state saved by `save` (an fd open on it, which the
        caller checked and keeps) into a VM launched with `incoming` on the
        same configuration and a copy of the RAM it was saved with; the VM is
        left stopped."""

    def snapshots(self, store: Path) -> Snapshots:
        """The VM's snapshots, their device states kept at store."""
        raise unsupported(type(self).__name__, "snapshot mode")

    def is_vmm_process(self, pid: int, ram_file: str) -> bool:
        """Whether host pid `pid` is this VM's VMM (one that is not the
        shim's child, which its creator moves into the container's cgroup)."""
        return False


class Backend(ABC):
    """A VMM that runs ParaCell's VMs: what it can do, and how a VM's control
    is planned, recorded and reached again from the record."""

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    # Where the VMM is by default, for a backend that is a daemon (a URI);
    # empty for one that is not.
    default_location: ClassVar[str] = ""

    def __init__(self, location: str = "") -> None:
        self.location = location

    def check(self, qemu: str, engine: str) -> None:  # noqa: B027 (nothing to check: no override)
        """Fails in one line, before anything is made, where this backend
        cannot run a VM of this QEMU and engine (a daemon that is unreachable,
        set up without what ParaCell needs, or lacking a feature)."""

    def report(self, qemu: str | None, engine: str | None) -> dict[str, object]:
        """For `paracell check`, a daemon backend's: whether it is reachable
        at its location, its version, what it has of what ParaCell needs, and
        the line `check` would fail a create with (`refusal`, or None)."""
        return {"uri": self.location, "reachable": True, "refusal": None}

    def rendezvous(self, memory_file: Path, what: str) -> Path | None:
        """Where a device's socket waits for a VMM that gets no fds; None
        where QEMU inherits the device's fd."""
        return None if self.capabilities.passes_fds else memory_file.with_suffix(f".{what}")

    @abstractmethod
    def attach_control(self, vm: VmBuilder, state_dir: Path, memory_file: Path) -> dict[str, str]:
        """Attaches what the VM is controlled through (last: reclaimed
        first), and returns the record its Hypervisor is made from again
        (VmConfig.control), by the shim and by any later verb."""

    @classmethod
    @abstractmethod
    def hypervisor(cls, control: dict[str, str], host_proc: int = -1) -> Hypervisor:
        """The hypervisor of a VM from its control record; host_proc: an fd
        of the host's /proc, for a shim in a PID namespace of its own."""
