"""The Hypervisor interface on real QEMU: pause and resume, and a VM saved at
the agent's READY and restored into a new QEMU from a copy of its RAM, which
then starts a container process as a freshly booted one does."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from paracell._native import lib

from paracell.guest import artifacts
from paracell.runtime.agent import channel, sandboxspec
from paracell.runtime.bundle import spec
from paracell.runtime.bundle.defaultspec import default_config
from paracell.safefs import sparse_copy
from paracell.vmm import devices, hostclock, probe
from paracell.vmm.builder import Machine, VmBuilder
from paracell.vmm.hypervisor import VmStatus
from paracell.vmm.qemu import QemuHypervisor
from paracell.vmm.qemu.monitor import QmpSocket

pytestmark = pytest.mark.integration


def copy(source: Path, target_fd: int) -> int:
    """Only the data extents of the source: what the guest has touched."""
    with open(source, "rb") as src:
        return sparse_copy(src.fileno(), target_fd)

GUEST_MIB = 256


class GuestVm:
    """A VM of the project's kernel and agent, built as the shim builds one."""

    def __init__(self, work: Path, rootfs: Path, tag: str, ram: Path,
                 saved_ram: Path | None = None) -> None:
        facts = probe.probe_host()
        engine = probe.choose_engine("auto", facts).engine
        guest = artifacts.current()
        self.builder = VmBuilder(Machine(
            qemu=facts.qemu_path, engine=engine, kernel=guest.kernel,
            initramfs=guest.initramfs, memory_mib=GUEST_MIB, vcpus=1,
            tsc_khz=hostclock.tsc_khz() if engine == "tcg" else 0))
        guest_ram = self.builder.attach(devices.GuestRam(ram, GUEST_MIB))
        if saved_ram is not None:
            guest_ram.fill = lambda fd: copy(saved_ram, fd)
        self.builder.attach(devices.SerialConsole(work / f"console-{tag}.log"))
        self.builder.attach(devices.DebugExit())
        self.agent = self.builder.attach(devices.AgentPort())
        self.rootfs = rootfs
        self.builder.attach(devices.rootfs_share(rootfs, readonly=True))
        qmp = self.builder.attach(QmpSocket(work / f"qmp-{tag}.sock"))
        self.hypervisor = QemuHypervisor(qmp.path)
        self.log = work / f"qemu-{tag}.log"
        self.vm = None

    def launch(self, incoming: bool = False) -> None:
        self.vm = self.hypervisor.launch(self.builder, self.log, incoming=incoming)

    @property
    def fd(self) -> int:
        return self.agent.host_end.fileno()

    def start_process(self) -> int:
        """What the shim sends after READY: the sandbox, then a container
        init; the guest pid."""
        channel.attach_sandbox(self.fd, sandboxspec.payload(self.builder, "restored"), 60)
        config = default_config(["true"])
        config["root"] = {"path": str(self.rootfs), "readonly": True}
        bundle = spec.validate(self.rootfs.parent, config)
        channel.send(self.fd, lib.PC_SPEC, 0, spec.init_launch_spec("restored", bundle))
        return channel.expect_created(self.fd, 60)

    def power_off(self) -> int:
        channel.send(self.fd, lib.PC_POWEROFF)
        code = self.vm.stop(30)
        self.vm.release()
        return code


@pytest.fixture
def work(tmp_path: Path) -> Path:
    memory = Path("/dev/shm") / f"paracell-hv-{os.getpid()}-{tmp_path.name}"
    memory.mkdir()
    yield memory
    shutil.rmtree(memory, ignore_errors=True)
    memory.with_name(f".{memory.name}.lock").unlink(missing_ok=True)


def test_pause_resume_and_query(work: Path, busybox_rootfs: Path):
    guest = GuestVm(work, busybox_rootfs, "a", work / "a.mem")
    guest.launch()
    try:
        channel.expect_ready(guest.fd, 60)
        assert guest.hypervisor.query().running
        guest.hypervisor.pause()
        assert guest.hypervisor.query() == VmStatus(False, "paused")
        guest.hypervisor.resume()
        assert guest.hypervisor.query().running
        assert guest.start_process() > 0
    finally:
        guest.power_off()


def test_a_vm_saved_at_ready_restores_into_a_new_qemu(work: Path, busybox_rootfs: Path):
    first = GuestVm(work, busybox_rootfs, "first", work / "first.mem")
    first.launch()
    try:
        channel.expect_ready(first.fd, 60)
        saved = first.hypervisor.save(work / "device.state")
        # Device state only: guest RAM stays in its shared file.
        assert 0 < saved.size_bytes < 1 << 20, saved
        assert not first.hypervisor.query().running
        with open(work / "saved.mem", "wb") as saved_ram:
            copied = copy(work / "first.mem", saved_ram.fileno())
        assert 0 < copied < GUEST_MIB << 20
    finally:
        first.vm.proc.kill()
        first.vm.stop(10)
        first.vm.release()
    assert not (work / "first.mem").exists()

    second = GuestVm(work, busybox_rootfs, "second", work / "second.mem",
                     saved_ram=work / "saved.mem")
    second.launch(incoming=True)
    try:
        assert second.hypervisor.query().detail == "inmigrate"
        state_fd = os.open(work / "device.state", os.O_RDONLY)
        try:
            second.hypervisor.restore(state_fd)
        finally:
            os.close(state_fd)
        second.hypervisor.resume()
        assert second.hypervisor.query().running
        # The agent goes on from READY: it mounts the rootfs share only now,
        # and starts the process.
        assert second.start_process() > 0
    finally:
        second.power_off()


def test_a_save_never_follows_a_link_or_overwrites(work: Path, busybox_rootfs: Path,
                                                   tmp_path: Path):
    guest = GuestVm(work, busybox_rootfs, "link", work / "link.mem")
    guest.launch()
    try:
        channel.expect_ready(guest.fd, 60)
        victim = tmp_path / "victim"
        victim.write_text("keep")
        (work / "state-link").symlink_to(victim)
        with pytest.raises(FileExistsError):
            guest.hypervisor.save(work / "state-link")
        assert victim.read_text() == "keep"
        assert guest.hypervisor.query().running
    finally:
        guest.power_off()


def test_qemu_refuses_to_save_once_the_guest_has_mounted_a_9p_share(work: Path,
                                                                     busybox_rootfs: Path):
    """The reason templates are taken at READY and snapshots need a rootfs
    that is not 9p (DESIGN.md): the refusal is one clear error, and the VM
    runs on."""
    from paracell.errors import ParacellError

    guest = GuestVm(work, busybox_rootfs, "ninep", work / "ninep.mem")
    guest.launch()
    try:
        channel.expect_ready(guest.fd, 60)
        assert guest.start_process() > 0  # the agent has mounted the rootfs share
        with pytest.raises(ParacellError, match="9p|VirtFS|virtfs") as refused:
            guest.hypervisor.save(work / "refused.state")
        assert "\n" not in str(refused.value)
        assert not (work / "refused.state").exists()
        guest.hypervisor.resume()
        assert guest.hypervisor.query().running
    finally:
        guest.power_off()
