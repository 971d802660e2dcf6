"""The VM a container gets: which devices are attached, and where their host
resources live. `create` records the plan's facts before the shim boots it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from paracell.guest.artifacts import GuestArtifacts
from paracell.net.device import NetworkInterfaces
from paracell.net.netns import JOIN, NEW, NetworkPlan
from paracell.runtime.bundle.snapshotmode import SnapshotPlan
from paracell.runtime.bundle.spec import Bundle
from paracell.runtime.sandbox.memorymanager import MemoryPlan
from paracell.vmm import devices
from paracell.vmm.builder import Machine, VmBuilder
from paracell.vmm.config import VmConfig

SHARE_DIR = "share"
POD_SHARE_DIR = "pod"


@dataclass(frozen=True)
class Backend:
    """Who runs the VM (paracell/vmm/hypervisor.py), and where."""

    vmm: str = "qemu"
    libvirt_uri: str = ""


def container_vm(state_dir: Path, bundle: Bundle, guest: GuestArtifacts, engine: str, qemu: str,
                 memory_file: Path, memory_mib: int, memory: MemoryPlan, vcpus: int,
                 network: NetworkPlan | None = None, pod_share: bool = False,
                 xgates: bool = False, backend: Backend = Backend(),
                 owner: dict[str, str] | None = None, snapshot: SnapshotPlan | None = None,
                 ) -> tuple[VmBuilder, devices.AgentPort, VmConfig]:
    """The VM's builder, its agent port, and the typed configuration the
    state records: decided here, where each device is chosen."""
    from paracell.vmm import hostclock

    # libvirt's QEMU is not our child: it gets no fds, and connects to
    # sockets beside the RAM file instead (devices.Rendezvous).
    libvirt = backend.vmm == "libvirt"

    def rendezvous(what: str) -> Path | None:
        return memory_file.with_suffix(f".{what}") if libvirt else None

    tsc_khz = hostclock.tsc_khz() if engine == "tcg" else 0
    vm = VmBuilder(Machine(qemu=qemu, engine=engine, kernel=guest.kernel,
                           initramfs=guest.initramfs, memory_mib=memory_mib, vcpus=vcpus,
                           tsc_khz=tsc_khz), owner=dict(owner or {}))
    config = VmConfig(engine=engine, memory_mib=memory_mib, vcpus=vcpus,
                      memory_manager=memory.manager, xgates=xgates, ram_file=str(memory_file),
                      network=network.mode if network is not None else "")
    ram = vm.attach(devices.GuestRam(memory_file, memory_mib))
    if memory.manager == "pager":
        vm.attach(devices.PagerChannel(ram, state_dir, memory.kernel_knobs,
                                       listen_path=rendezvous("pager")))
    elif memory.manager == "balloon":
        vm.attach(devices.Balloon())
    vm.attach(devices.SerialConsole(state_dir / "console.log"))
    vm.attach(devices.DebugExit())
    agent = vm.attach(devices.AgentPort(rendezvous("agent")))
    if snapshot is not None and snapshot.enabled:
        # The image is built once the rootfs holds its mount points (provision).
        vm.attach(devices.RootDisk(None, writable=not bundle.rootfs_readonly))
        if snapshot.host_files:
            vm.attach(devices.HostFiles(list(snapshot.host_files)))
    else:
        vm.attach(devices.rootfs_share(bundle.rootfs, bundle.rootfs_readonly))
        if bundle.host_binds:
            vm.attach(devices.HostShare(state_dir / SHARE_DIR,
                                        [(b.source, b.entry) for b in bundle.host_binds]))
    if pod_share:
        config.pod_share = str(vm.attach(devices.PodShare(state_dir / POD_SHARE_DIR)).path)
    if not libvirt:
        config.qmp_socket = str(vm.attach(devices.QmpSocket(state_dir / "qmp.sock")).path)
    if network is not None and network.mode in (JOIN, NEW):
        net = vm.attach(NetworkInterfaces(state_dir, network.path,
                                          tap_prefix=memory_file.stem[:8] if libvirt else ""))
        config.net_record = str(net.record)
    if libvirt:
        from paracell.vmm.libvirt import LibvirtDomain, domain

        # Last: the record is reclaimed last-made first, and the domain's
        # QEMU must be gone before its RAM file and sockets are.
        config.vmm, config.libvirt_uri = "libvirt", backend.libvirt_uri
        config.domain = domain.name_for(memory_file.stem)
        vm.attach(LibvirtDomain(backend.libvirt_uri, config.domain))
    return vm, agent, config
