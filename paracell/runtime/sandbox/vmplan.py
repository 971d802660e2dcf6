"""The VM a container gets: which devices are attached, and where their host
resources live. `create` records the plan's facts before the shim boots it."""

from __future__ import annotations

from pathlib import Path

from paracell.guest.artifacts import GuestArtifacts
from paracell.net.device import NetworkInterfaces
from paracell.net.netns import JOIN, NEW, NetworkPlan
from paracell.runtime.bundle.spec import Bundle
from paracell.runtime.sandbox.memorymanager import MemoryPlan
from paracell.vmm import devices
from paracell.vmm.builder import Machine, VmBuilder
from paracell.vmm.config import VmConfig

SHARE_DIR = "share"
POD_SHARE_DIR = "pod"


def container_vm(state_dir: Path, bundle: Bundle, guest: GuestArtifacts, engine: str, qemu: str,
                 memory_file: Path, memory_mib: int, memory: MemoryPlan, vcpus: int,
                 network: NetworkPlan | None = None, pod_share: bool = False,
                 xgates: bool = False) -> tuple[VmBuilder, devices.AgentPort, VmConfig]:
    """The VM's builder, its agent port, and the typed configuration the
    state records: decided here, where each device is chosen."""
    from paracell.vmm import hostclock

    tsc_khz = hostclock.tsc_khz() if engine == "tcg" else 0
    vm = VmBuilder(Machine(qemu=qemu, engine=engine, kernel=guest.kernel,
                           initramfs=guest.initramfs, memory_mib=memory_mib, vcpus=vcpus,
                           tsc_khz=tsc_khz))
    config = VmConfig(engine=engine, memory_mib=memory_mib, vcpus=vcpus,
                      memory_manager=memory.manager, xgates=xgates, ram_file=str(memory_file),
                      network=network.mode if network is not None else "")
    ram = vm.attach(devices.GuestRam(memory_file, memory_mib))
    if memory.manager == "pager":
        vm.attach(devices.PagerChannel(ram, state_dir, memory.kernel_knobs))
    elif memory.manager == "balloon":
        vm.attach(devices.Balloon())
    vm.attach(devices.SerialConsole(state_dir / "console.log"))
    vm.attach(devices.DebugExit())
    agent = vm.attach(devices.AgentPort())
    vm.attach(devices.rootfs_share(bundle.rootfs, bundle.rootfs_readonly))
    if bundle.host_binds:
        vm.attach(devices.HostShare(state_dir / SHARE_DIR,
                                    [(b.source, b.slot) for b in bundle.host_binds]))
    if pod_share:
        config.pod_share = str(vm.attach(devices.PodShare(state_dir / POD_SHARE_DIR)).path)
    config.qmp_socket = str(vm.attach(devices.QmpSocket(state_dir / "qmp.sock")).path)
    if network is not None and network.mode in (JOIN, NEW):
        net = vm.attach(NetworkInterfaces(state_dir, network.path))
        config.net_record = str(net.record)
    return vm, agent, config
