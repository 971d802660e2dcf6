"""A micro-VM as a machine plus devices attached one by one, the way
Firecracker's builder composes a VM.

Each device brings its own QEMU arguments, the host resources it needs
(files, sockets, mounts), the fds QEMU inherits, and its cleanup. Its `facts`
are plain JSON that the runtime records before the VM starts, so that
`reclaim` can clean up after an owner that died: a new device is one class in
paracell/vmm/devices.py and one `attach` call, and nothing else changes.
"""

from __future__ import annotations

import os
import signal
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from paracell.errors import ParacellError
from paracell.reclaim import Reclaimable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.vmm.domainxml import DomainParts

# The RTC stays on: without it the kernel spends a second waiting to read the time.
# compaction_proactiveness=0: kcompactd would otherwise wake every 500 ms to
# score fragmentation for huge pages, which this guest never makes (no THP),
# and an idle VM should not wake at all (docs/benchmarks.md, bench density).
KERNEL_CMDLINE = ("console=ttyS0", "quiet", "panic=-1", "mitigations=off",
                  "sysctl.vm.compaction_proactiveness=0")
# QEMU's emulated local APIC timer counts at 1 GHz (its virtual clock in ns).
QEMU_LAPIC_TIMER_KHZ = 1_000_000
# Under TCG only, where busy-wait calibrations are slow and hardware is exact:
# lapic_timer_khz= (guest/idle/0001): the LAPIC timer, the tick, needs no
# calibration (100 ms of busy-waiting against the TSC; TCG has no TSC-deadline
# mode). It used to be noapictimer and a PIT tick, but a tickless guest can
# sleep at most 27 ms on the PIT, so an idle one woke 40 times a second.
# no_timer_check: skip the ~20 ms test of the timer interrupt; microvm wires it.
# noreplace-smp: keep the SMP lock prefixes rather than patching them out.
# tsc=reliable: TCG's TSC is the host's, constant and shared by every vCPU; the
# clocksource watchdog would otherwise check it against jiffies every 500 ms,
# which wakes an idle guest twice a second (and a busy host can fail the check).
# tsc_early_khz= (added when known): the TSC needs no calibration against the
# PIT, which a busy host can make fail; the jiffies-based fallback then waits
# forever on an ACPI microvm, whose PIT never ticks; and cpu_khz is taken
# from it too (guest/idle/0002).
TCG_KERNEL_CMDLINE = (f"lapic_timer_khz={QEMU_LAPIC_TIMER_KHZ}", "no_timer_check",
                      "noreplace-smp", "tsc=reliable")
# Under TCG no part of the guest needs a PIT (the LAPIC ticks and the TSC rate
# is given), and with ACPI the guest never even stops it (hardware-reduced
# ACPI skips the legacy timer setup): QEMU's PIT then keeps its reset-state
# 18.2 Hz square wave going, waking QEMU's main loop 36 times a second.
TCG_MACHINE_OPTIONS = ("pit=off",)
# TCG's translation cache defaults to 1 GiB of host memory; containers need far less.
TCG_TB_SIZE_MIB = 64


class Device(Reclaimable):
    """One device of the VM. Subclasses override what they need; a subclass
    that records facts is registered with @reclaimable (paracell/reclaim.py)."""

    # The -M microvm options the device needs (e.g. memory-backend=...).
    machine_options: ClassVar[tuple[str, ...]] = ()

    def facts(self) -> dict[str, Any]:
        """What `reclaim` needs to clean up after this device: paths, not fds."""
        return {}

    def prepare(self) -> None:
        """Makes the host resources; on failure, leaves none behind."""

    def qemu_args(self) -> list[str]:
        return []

    def host_paths(self) -> dict[str, bool]:
        """The host paths QEMU opens for this device -> whether it writes
        them: what its jail must hold (paracell/vmm/qemu/jail.py). Sockets
        and TAPs come as inherited fds and need none."""
        return {}

    def kernel_args(self) -> list[str]:
        return []

    def sandbox_records(self) -> list[tuple[str, str]]:
        """What the guest attaches for this device after READY, in the
        SANDBOX message (docs/agent-protocol.md): a share to mount, the
        interfaces to configure. Nothing container-specific is in the argv."""
        return []

    def shape(self) -> dict[str, Any]:
        """What a VM template must match of this device (paracell/vmm/templatestore.py):
        what its QEMU device is, never its paths, fds or MACs."""
        return {}

    def pass_fds(self) -> tuple[int, ...]:
        return ()

    @property
    def awaits_vmm(self) -> bool:
        """Whether QEMU connects to this device's socket as it starts (a VMM
        that is not our child gets no fds): `await_vmm` then runs while it does."""
        return False

    def await_vmm(self, timeout_s: float) -> None:
        """Takes QEMU's connection, in a thread of its own during the start."""

    def launched(self) -> None:
        """QEMU holds its copies of our fds now: close ours that it alone needs."""

    def started(self, pid: int) -> None:
        """QEMU runs as `pid`, our child (after `launched`). Not called for a
        QEMU that is libvirtd's: the shim may not see its pid."""

    def release(self) -> None:
        """The owner's cleanup at the end of the VM: close what is open, then
        whatever `reclaim` removes."""
        self.reclaim(self.facts())

    def render_libvirt(self, parts: DomainParts) -> None:
        """The device in a libvirt domain's XML (paracell/vmm/domainxml.py):
        a device that does not say how is refused, never left out silently."""
        raise ParacellError(f"the libvirt backend cannot render the {self.kind} device")


D = TypeVar("D", bound=Device)


@dataclass(frozen=True)
class Machine:
    qemu: str
    engine: str  # "kvm" or "tcg"
    kernel: Path
    initramfs: Path
    memory_mib: int
    vcpus: int
    kernel_args: tuple[str, ...] = ()
    # TCG: the host's TSC rate, which is the guest's (paracell/vmm/hostclock.py).
    tsc_khz: int = 0


def _accel(engine: str) -> list[str]:
    if engine == "kvm":
        return ["-accel", "kvm", "-cpu", "host"]
    # -cpu max exposes PKU/OSPKE under TCG, which XGates need.
    return ["-accel", f"tcg,tb-size={TCG_TB_SIZE_MIB}", "-cpu", "max"]


@dataclass
class VmBuilder:
    machine: Machine
    devices: list[Device] = field(default_factory=list)
    # Whose VM it is ("id", "bundle"): a libvirt domain's <metadata>.
    owner: dict[str, str] = field(default_factory=dict)

    def attach(self, device: D) -> D:
        self.devices.append(device)
        return device

    def record(self) -> list[dict[str, Any]]:
        return [{"kind": d.kind, **d.facts()} for d in self.devices]

    def host_paths(self) -> dict[str, bool]:
        """Every host path QEMU opens -> whether it writes it: its binary,
        the kernel, the initramfs and each device's."""
        m = self.machine
        paths = {m.qemu: False, str(m.kernel): False, str(m.initramfs): False}
        for device in self.devices:
            for path, writes in device.host_paths().items():
                paths[path] = paths.get(path, False) or writes
        return paths

    def sandbox_records(self) -> list[tuple[str, str]]:
        return [r for device in self.devices for r in device.sandbox_records()]

    def kernel_cmdline(self) -> str:
        m = self.machine
        words = [*KERNEL_CMDLINE]
        if m.engine == "tcg":
            words += TCG_KERNEL_CMDLINE
            if m.tsc_khz:
                words.append(f"tsc_early_khz={m.tsc_khz}")
        for device in self.devices:
            words += device.kernel_args()
        return " ".join([*words, *m.kernel_args])

    def _acpi(self) -> bool:
        return any(opt == "acpi=on" for d in self.devices for opt in d.machine_options)

    def _machine_options(self) -> list[str]:
        opts = ["microvm", "x-option-roms=off"]
        for device in self.devices:
            opts += device.machine_options
        if self.machine.engine == "tcg":
            opts += TCG_MACHINE_OPTIONS
        if not self._acpi():
            # Without a PCI device nothing needs ACPI, and parsing it costs boot time.
            opts.append("acpi=off")
        return opts

    def shape(self) -> dict[str, Any]:
        """Everything a VM saved from this one's twin must match to be
        restored into it (paracell/vmm/templatestore.py), as plain JSON."""
        from paracell.vmm.templatestore import binary_identity, source_identity

        m = self.machine
        return {
            "qemu": binary_identity(m.qemu), "kernel": binary_identity(str(m.kernel)),
            "initramfs": binary_identity(str(m.initramfs)), "vmm": source_identity(),
            "machine": self._machine_options(), "accel": _accel(m.engine),
            "memory_mib": m.memory_mib, "vcpus": m.vcpus, "cmdline": self.kernel_cmdline(),
            "devices": [{"kind": d.kind, **d.shape()} for d in self.devices],
        }

    def command_line(self, incoming: bool = False, paused: bool = False) -> list[str]:
        """QEMU's argv; with `incoming`, it waits for a saved state
        (Hypervisor.restore) instead of booting; with `paused`, its vCPUs
        wait for `cont` (a fork loads its checkpoint first)."""
        m = self.machine
        argv = [
            m.qemu,
            "-name", "paracell",
            "-M", ",".join(self._machine_options()),
            *_accel(m.engine),
            "-smp", str(m.vcpus),
            "-m", f"{m.memory_mib}M",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        ]
        # A QEMU that loads a saved VM never boots: the kernel and initramfs
        # are in the guest's RAM already, and fw_cfg would hold a copy of each
        # for the VM's life (3.3 MiB for the kernel alone). The guest has no
        # fw_cfg driver, so it never reads them again.
        if not incoming:
            argv += ["-kernel", str(m.kernel), "-initrd", str(m.initramfs),
                     "-append", self.kernel_cmdline()]
        for device in self.devices:
            argv += device.qemu_args()
        if incoming:
            argv += ["-incoming", "defer"]
        if paused:
            argv += ["-S"]
        return argv

    def launch(self, log_path: Path, before_start: Callable[[], None] | None = None,
               preexec: Callable[[], None] | None = None, incoming: bool = False,
               paused: bool = False) -> Vm:
        """`before_start` runs once the devices' host resources exist (the
        shim's jail); `preexec` in QEMU's child before exec (its privileges)."""
        prepared: list[Device] = []
        try:
            for device in self.devices:
                device.prepare()
                prepared.append(device)
            if before_start is not None:
                before_start()
            proc = _start_qemu(self.command_line(incoming, paused),
                               tuple(fd for d in self.devices for fd in d.pass_fds()), log_path,
                               preexec)
        except BaseException:
            for device in reversed(prepared):
                device.release()
            raise
        for device in self.devices:
            device.launched()
            device.started(proc.pid)
        return QemuChild(proc, self.devices)


def _qemu_child() -> None:
    """QEMU's process between fork and exec, before any preexec of the caller's."""
    from paracell._native import lib

    # If the shim is killed (even with SIGKILL), its VM must not outlive it.
    lib.pc_set_pdeathsig(signal.SIGKILL)
    # QEMU asks for huge pages on its translation buffer and its own tables
    # (MADV_HUGEPAGE). Under TCG that is mostly rounding: without them a VM
    # restored copy-on-write holds 2.3 MiB less PSS, and guest CPU and
    # memory-copy loops ran no slower (docs/benchmarks.md, bench density).
    # Failing is harmless: the VM then holds a little more.
    lib.pc_disable_thp()


def _start_qemu(argv: list[str], fds: tuple[int, ...], log_path: Path,
                preexec: Callable[[], None] | None = None) -> subprocess.Popen[bytes]:
    def child() -> None:
        _qemu_child()
        if preexec is not None:
            preexec()

    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, pass_fds=fds,
            # Its own session: a ^C meant for the container must not kill the VM.
            start_new_session=True, preexec_fn=child,
        )
    except OSError as err:
        raise ParacellError(f"starting {argv[0]}: {err.strerror}") from None
    except subprocess.SubprocessError as err:  # the preexec failed; it logged why
        raise ParacellError(f"starting {argv[0]}: {err} (see qemu.log)") from None
    finally:
        os.close(log_fd)


class Vm(ABC):
    """A running VM as its owner (the shim) holds it."""

    devices: list[Device]

    @property
    @abstractmethod
    def pid(self) -> int:
        """QEMU's pid: in the shim's PID namespace for a child, the host's otherwise."""

    @property
    def child(self) -> bool:
        """Whether QEMU is the shim's own child (direct QEMU) or another's (libvirtd's)."""
        return True

    @abstractmethod
    def describe(self) -> str:
        """How it was started, for the shim's debug log."""

    @abstractmethod
    def stop(self, grace_s: float) -> int:
        """Waits for a VM that was asked to power off, then makes sure it is
        gone: QEMU's exit status, negative for the signal that ended it."""

    @abstractmethod
    def kill(self) -> None:
        """Ends the VM at once (a restore that failed)."""

    def release(self) -> None:
        """After stop: every device's host resources, in reverse order."""
        for device in reversed(self.devices):
            device.release()


@dataclass
class QemuChild(Vm):
    """Direct QEMU: the shim's child process."""

    proc: subprocess.Popen[bytes]
    devices: list[Device]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def describe(self) -> str:
        """The command line it was started with, rendered once at launch."""
        return " ".join(str(a) for a in self.proc.args)

    def stop(self, grace_s: float) -> int:
        try:
            return self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        self.proc.kill()
