"""The QEMU command line for one micro-VM, built from a plain description."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Guest writes here make QEMU exit at once; the agent powers off through it.
DEBUG_EXIT_PORT = 0xF4
AGENT_PORT_NAME = "paracell.agent"
ROOTFS_TAG = "rootfs"
HOSTSHARE_TAG = "hostshare"
# The RTC stays on: without it the kernel spends a second waiting to read the time.
KERNEL_CMDLINE = "console=ttyS0 quiet panic=-1 mitigations=off"
# Under TCG only, where busy-wait calibrations are slow and hardware is exact:
# noapictimer: the tick comes from the PIT; calibrating the LAPIC timer
# busy-waits ~200 ms under TCG (and its check often fails there anyway).
# no_timer_check: skip the ~20 ms test of the PIT interrupt; microvm wires it.
# noreplace-smp: keep the SMP lock prefixes rather than patching them out.
TCG_KERNEL_CMDLINE = "noapictimer no_timer_check noreplace-smp"
# TCG's translation cache defaults to 1 GiB of host memory; containers need far less.
TCG_TB_SIZE_MIB = 64


@dataclass(frozen=True)
class VmSpec:
    qemu: str
    engine: str  # "kvm" or "tcg"
    kernel: Path
    initramfs: Path
    memory_mib: int
    vcpus: int
    memory_file: Path
    rootfs: Path
    rootfs_readonly: bool
    console_log: Path
    agent_fd: int  # connected socket: QEMU's end of the agent channel
    qmp_fd: int  # listening socket for QMP
    hostshare: Path | None = None
    extra_cmdline: str = ""


def _fsdev(tag: str, path: Path, readonly: bool) -> list[str]:
    # passthrough keeps the container's uids/modes on the host files, as runc would.
    opts = f"local,id={tag},path={path},security_model=passthrough"
    if readonly:
        opts += ",readonly=on"
    return ["-fsdev", opts, "-device", f"virtio-9p-device,fsdev={tag},mount_tag={tag}"]


def _accel(engine: str) -> list[str]:
    if engine == "kvm":
        return ["-accel", "kvm", "-cpu", "host"]
    # -cpu max exposes PKU/OSPKE under TCG, which XGates need.
    return ["-accel", f"tcg,tb-size={TCG_TB_SIZE_MIB}", "-cpu", "max"]


def _cmdline(spec: VmSpec) -> str:
    parts = [KERNEL_CMDLINE, TCG_KERNEL_CMDLINE if spec.engine == "tcg" else "", spec.extra_cmdline]
    return " ".join(p for p in parts if p)


def command_line(spec: VmSpec) -> list[str]:
    mem = f"{spec.memory_mib}M"
    argv = [
        spec.qemu,
        "-name", "paracell",
        "-M", "microvm,acpi=off,x-option-roms=off,memory-backend=mem",
        *_accel(spec.engine),
        "-smp", str(spec.vcpus),
        "-m", mem,
        # A file the runtime owns, shared, so the Pager can punch holes in it.
        "-object",
        f"memory-backend-file,id=mem,size={mem},mem-path={spec.memory_file},share=on,prealloc=off",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        "-kernel", str(spec.kernel),
        "-initrd", str(spec.initramfs),
        "-append", _cmdline(spec),
        "-chardev", f"file,id=console,path={spec.console_log}",
        "-serial", "chardev:console",
        "-device", f"isa-debug-exit,iobase={DEBUG_EXIT_PORT:#x},iosize=4",
        "-device", "virtio-serial-device,max_ports=2",
        "-chardev", f"socket,id=agent,fd={spec.agent_fd}",
        "-device", f"virtserialport,chardev=agent,name={AGENT_PORT_NAME}",
        *_fsdev(ROOTFS_TAG, spec.rootfs, spec.rootfs_readonly),
        "-chardev", f"socket,id=qmp,fd={spec.qmp_fd},server=on,wait=off",
        "-mon", "chardev=qmp,mode=control",
    ]
    if spec.hostshare is not None:
        argv += _fsdev(HOSTSHARE_TAG, spec.hostshare, readonly=False)
    return argv
