"""The VM a container gets: which devices are attached, and where their host
resources live. `create` records the plan's facts before the shim boots it.

The plan hands out typed handles on the devices the runtime works with
afterwards (PlannedVm): the shim, templates and snapshots take those, and
no one scans the builder's devices for a kind."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from paracell.guest.artifacts import GuestArtifacts
from paracell.net.device import NetworkInterfaces
from paracell.net.netns import JOIN, NEW, NetworkPlan
from paracell.runtime.bundle.snapshotmode import SnapshotPlan
from paracell.runtime.bundle.spec import Bundle
from paracell.runtime.vm.memorymanager import MemoryPlan
from paracell.vmm import devices
from paracell.vmm.builder import Machine, VmBuilder
from paracell.vmm.config import VmConfig

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.vmm.hypervisor import Backend

SHARE_DIR = "share"
POD_SHARE_DIR = "pod"


@dataclass
class PlannedVm:
    """The VM a plan makes: its builder, its recorded configuration, and its
    devices by what they are."""

    builder: VmBuilder
    config: VmConfig
    ram: devices.GuestRam
    agent: devices.AgentPort
    pager: devices.PagerChannel | None = None
    rootdisk: devices.RootDisk | None = None  # snapshot mode's
    nics: NetworkInterfaces | None = None


def container_vm(state_dir: Path, bundle: Bundle, guest: GuestArtifacts, engine: str, qemu: str,
                 memory_file: Path, memory_mib: int, memory: MemoryPlan, vcpus: int,
                 network: NetworkPlan | None = None, pod_share: bool = False,
                 xgates: bool = False, backend: Backend | None = None,
                 owner: dict[str, str] | None = None, snapshot: SnapshotPlan | None = None,
                 ) -> PlannedVm:
    """The VM, and the typed configuration the state records: decided here,
    where each device is chosen."""
    from paracell.vmm import backends, hostclock
    from paracell.vmm import memory as guest_memory

    backend = backend or backends.select(backends.DEFAULT)
    rendezvous = functools.partial(backend.rendezvous, memory_file)

    tsc_khz = hostclock.tsc_khz() if engine == "tcg" else 0
    vm = VmBuilder(Machine(qemu=qemu, engine=engine, kernel=guest.kernel,
                           initramfs=guest.initramfs, memory_mib=memory_mib, vcpus=vcpus,
                           tsc_khz=tsc_khz), owner=dict(owner or {}))
    config = VmConfig(engine=engine, memory_mib=memory_mib, vcpus=vcpus,
                      memory_manager=memory.manager, xgates=xgates, ram_file=str(memory_file),
                      network=network.mode if network is not None else "")
    ram = vm.attach(devices.GuestRam(memory_file, memory_mib))
    planned = PlannedVm(vm, config, ram, devices.AgentPort(rendezvous("agent")))
    if memory.manager == "pager":
        planned.pager = vm.attach(devices.PagerChannel(ram, state_dir, memory.kernel_knobs,
                                                       listen_path=rendezvous("pager")))
    elif memory.manager == "balloon":
        vm.attach(devices.Balloon())
    vm.attach(devices.SerialConsole(state_dir / "console.log"))
    vm.attach(devices.DebugExit())
    vm.attach(planned.agent)
    if snapshot is not None and snapshot.enabled:
        # The image is built once the rootfs holds its mount points (provision).
        planned.rootdisk = vm.attach(devices.RootDisk(None, writable=not bundle.rootfs_readonly))
        # Checkpoints read only the pages QEMU wrote, where its RAM plugin can
        # log them: TCG's plugin, and no balloon (QEMU's own discards of guest
        # RAM would go unlogged; the Pager's are counted, csrc/pager.h).
        ram.track_writes = (engine == "tcg" and memory.manager != "balloon"
                            and guest_memory.plugin_loads(qemu))
        if snapshot.host_files:
            vm.attach(devices.HostFiles(list(snapshot.host_files)))
    else:
        vm.attach(devices.rootfs_share(bundle.rootfs, bundle.rootfs_readonly))
        if bundle.host_binds:
            vm.attach(devices.HostShare(state_dir / SHARE_DIR,
                                        [(b.source, b.entry) for b in bundle.host_binds]))
    if pod_share:
        config.pod_share = str(vm.attach(devices.PodShare(state_dir / POD_SHARE_DIR)).path)
    if network is not None and network.mode in (JOIN, NEW):
        # A VMM that gets no fds opens TAPs by name, lent to its namespace.
        planned.nics = vm.attach(NetworkInterfaces(
            state_dir, network.path,
            tap_prefix="" if backend.capabilities.passes_fds else memory_file.stem[:8],
            fork_devices=network.devices, forked=network.forked))
        config.net_record = str(planned.nics.record)
    # Last: the record is reclaimed last-made first, and a VMM that is a
    # daemon's must be gone before the VM's RAM file and sockets are.
    config.vmm = backend.name
    config.control = backend.attach_control(vm, state_dir, memory_file)
    return planned
