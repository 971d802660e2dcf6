"""Where a container's processes run: the objects every create goes through.

An **OwnVm** is a VM of one container's own: its devices, shares, NICs,
memory manager, engine, vCPUs and RAM, with the lifecycle plan -> provision
-> boot -> attach -> stop -> reclaim. `plan` decides everything, a fork
and its checkpoints included, and touches nothing, so the state can record
every host resource before any exists; `provision` makes the host side
(cgroup, limits, the root disk); the shim boots the VM and attaches it
(READY, then SANDBOX: runtime/vm/shim.py); `stop` and `reclaim` undo it,
from the recorded state alone when the shim has died (lifecycle._destroy).

A **Container** is a process tree in a VM. A lone container is a Container
in an OwnVm; a pod member is a Container in its pod's running VM (a
`PodSlot`, runtime/pod/pod.py). Both are a `Placement`: `lifecycle.create`
is the one create path, and asks the placement only what differs between
them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from paracell.errors import ParacellError
from paracell.runtime.state.store import ContainerState, VmRecord
from paracell.runtime.vm.spawn import Spawned

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.net.netns import NetworkPlan
    from paracell.runtime.bundle.podrole import PodRole
    from paracell.runtime.bundle.spec import Bundle
    from paracell.runtime.context import Context
    from paracell.runtime.host.hostside import HostPlan
    from paracell.runtime.snapshots.forking import ForkSource
    from paracell.runtime.vm.memorymanager import MemoryPlan
    from paracell.runtime.vm.vmplan import PlannedVm
    from paracell.vmm.hypervisor import Backend
    from paracell.xgate.admission import XgatesPlan
    from paracell.xgate.support import XgatesSupport


@dataclass(frozen=True)
class Container:
    """What `create` makes, whatever holds it: the process tree's launch spec
    and how its stdio reaches the caller."""

    id: str
    bundle: Bundle
    launch_spec: bytes  # the init's SPEC; empty for a spec without a process
    terminal: bool
    console_socket: str | None


class Placement(Protocol):
    """Where a container's processes run: a VM of its own, or a pod's."""

    # Whether this create's VM can give the guest XGates; None where the VM
    # exists already (a pod's, admitted at its own create).
    xgates_support: XgatesSupport | None

    def extra_records(self) -> list[tuple[str, str]]:
        """Launch-spec records the placement adds to the init's SPEC."""

    def record(self) -> VmRecord:
        """What the state holds before anything exists."""

    def provision(self, ctx: Context) -> None:
        """The host side, once the state is on disk; undone by reclaim."""

    def describe(self) -> str:
        """The create line of the log."""

    def spawn(self, ctx: Context, container: Container, detach: bool) -> Spawned:
        """The host process that stands for the container's init."""

    def spawned(self, state: ContainerState, spawned: Spawned) -> None:
        """Records what the spawned process reported."""

    def notices(self) -> list[str]:
        """Warnings for --log once the container exists."""


@dataclass
class OwnVm:
    """A container's VM of its own, planned (see the module's docstring)."""

    state_dir: Path
    vm: PlannedVm
    backend: Backend
    host: HostPlan
    network: NetworkPlan
    memory: MemoryPlan
    xgates: XgatesPlan
    xgates_support: XgatesSupport | None
    bundle: Bundle
    templates: bool  # restore from a VM template (runtime/vm/templating.py)
    checkpoint_limit: int  # snapshot mode: how many checkpoints it keeps; 0: not in it
    fork: ForkSource | None  # the checkpoint a fork or a restore goes on from
    engine_notice: str = ""
    pool_root: str = ""  # a pooled VM: the --root of the pool that holds its lease

    @classmethod
    def plan(cls, ctx: Context, container_id: str, bundle: Bundle, pod_role: PodRole,
             xgates_plan: XgatesPlan, fork: ForkSource | None = None,
             pool_root: str = "") -> OwnVm:
        """Decides the VM from the bundle, the settings and the host; touches
        nothing on the host yet."""
        from paracell import settings
        from paracell.guest import artifacts
        from paracell.net import netns
        from paracell.runtime.bundle import podrole, snapshotmode
        from paracell.runtime.host import hostside
        from paracell.runtime.snapshots import checkpoints
        from paracell.runtime.vm import memorymanager, templating, vmplan
        from paracell.vmm import memory, probe
        from paracell.xgate.support import support

        # Host side: VM size from linux.resources, cgroup, namespaces
        # (docs/host-isolation.md). A pod's VM holds every container of the
        # pod: its default size is the pod's.
        pod_sandbox = pod_role.kind == "sandbox"
        default_mib = (podrole.pod_memory_mib(bundle.annotations, settings.pod_memory_mib())
                       if pod_sandbox else settings.guest_memory_mib())
        host = hostside.plan(bundle, container_id, ctx.systemd_cgroup, default_mib)
        memory_plan = memorymanager.choose(ctx.memory_manager, settings.memory_manager_override(),
                                           bundle.annotations, host.size.memory_mib)
        facts = probe.probe_host()
        if facts.qemu_path is None:
            raise ParacellError(f"{probe.QEMU_BINARY} not found: install qemu-system-x86")
        choice = probe.choose_engine(ctx.engine, facts)
        # A fork's namespace is the one `fork` was given for it, or a new one:
        # never its parent's, which the bundle names. A restore's is its bundle's.
        network = fork.network if fork is not None and fork.network is not None \
            else netns.plan(bundle.namespaces, pod_role.in_pods_network)
        if fork is not None:
            network = replace(network, forked=True)
        snapshot = snapshotmode.plan(bundle, pod_sandbox)
        backend = ctx.backend(bundle.annotations)
        if snapshot.enabled and not backend.capabilities.snapshots:
            raise ParacellError(f"snapshot mode is not supported with the {backend.name} "
                                "backend: its checkpoints load device state in place, which "
                                "ParaCell does not ask of it (--vmm qemu)")
        if fork is not None:
            if not snapshot.enabled:
                raise ParacellError("only a snapshot-mode sandbox of its own can be forked or "
                                    "restored (annotation io.paracell.snapshot: \"on\")")
            process = bundle.config.get("process") or {}
            if process.get("terminal"):
                raise ParacellError("a forked or restored container has no terminal yet")
        # One line, before anything exists on the host, where the backend
        # cannot run this VM (a daemon's setup, its QEMU's features).
        backend.check(facts.qemu_path, choice.engine)
        state_dir = ctx.store.dir(container_id)
        planned = vmplan.container_vm(
            state_dir, bundle, artifacts.current(), choice.engine, facts.qemu_path,
            memory.path_for(ctx.root, container_id), host.size.memory_mib, memory_plan,
            vcpus=host.size.vcpus, network=network, pod_share=pod_sandbox,
            xgates=xgates_plan.enabled, backend=backend,
            owner={"id": container_id, "bundle": str(bundle.path)}, snapshot=snapshot)
        # A fork goes on from its checkpoint: never from a template.
        templates = (backend.capabilities.templates and fork is None
                     and templating.wanted(ctx.no_template, bundle.annotations))
        # A fork that shares its checkpoint's RAM has no RAM file to checkpoint.
        limit = checkpoints.limit_of(bundle.annotations) \
            if snapshot.enabled and not (fork is not None and fork.shared_ram) else 0
        return cls(state_dir, planned, backend, host, network, memory_plan, xgates_plan,
                   support(choice.engine, facts), bundle, templates, limit, fork,
                   engine_notice=choice.notice or "", pool_root=pool_root)

    def extra_records(self) -> list[tuple[str, str]]:
        return []

    def record(self) -> VmRecord:
        return VmRecord(config=self.vm.config, host=self.host.record(),
                        reclaim=self.vm.builder.record())

    def provision(self, ctx: Context) -> None:
        disk = self.vm.rootdisk
        if disk is not None and self.fork is not None:
            disk.image = Path(self.fork.rootdisk)  # its parent's files, whatever the tree is now
        elif disk is not None:
            disk.build(self.bundle.rootfs)
        self.host.setup(self.vm.config.engine, ctx.log, self.state_dir,
                        Path(self.vm.config.ram_file), self.bundle)

    def describe(self) -> str:
        size = self.host.size
        return (f"vmm {self.backend.name}, engine {self.vm.config.engine}, "
                f"{size.memory_mib} MiB, {size.vcpus} vCPU "
                f"({size.reason}), memory manager {self.memory.manager}, "
                f"xgates {'on' if self.xgates.enabled else 'off'}")

    def spawn(self, ctx: Context, container: Container, detach: bool) -> Spawned:
        """The shim: it boots the VM, attaches it, and creates the init."""
        from paracell.runtime.vm import shim, spawn
        from paracell.runtime.vm.shim import ShimPlan

        plan = ShimPlan(state_dir=self.state_dir, vm=self.vm, launch_spec=container.launch_spec,
                        hostname=self.bundle.config.get("hostname") or "",
                        console_socket=container.console_socket, terminal=container.terminal,
                        log=ctx.log, seccomp=self.bundle.seccomp, network=self.network,
                        isolation=self.host.isolation, templates=self.templates,
                        checkpoint_limit=self.checkpoint_limit, fork=self.fork,
                        pool_root=self.pool_root)
        return spawn.spawn(
            lambda handshake: shim.serve(plan, handshake, ctx.log.background_error),
            detach, ctx.log.background_error,
            pid_namespace=self.host.isolation.pid_namespace_for_child, place=self._place,
            stdio=ctx.stdio)

    def _place(self, pid: int) -> None:
        """A VMM that is not the shim's child (host pid), on its shim's
        request: into the container's cgroup, once it is known to be this
        VM's and no other process."""
        from paracell.runtime.host import cgroups
        from paracell.vmm import backends

        hypervisor = backends.hypervisor_of(self.vm.config)
        if not hypervisor.is_vmm_process(pid, self.vm.config.ram_file):
            raise ParacellError(f"pid {pid} is not this VM's VMM")
        cgroups.join(self.host.isolation.cgroup_dirs, pid)

    def spawned(self, state: ContainerState, spawned: Spawned) -> None:
        state.vm.qemu_pid, state.vm.qemu_start = spawned.ready.qemu_pid, spawned.ready.qemu_start
        state.vm.template = spawned.ready.template
        state.vm.shares_memory_of = self.fork.shares_memory_of() if self.fork else ""

    def notices(self) -> list[str]:
        from paracell.net import netns

        found = [self.engine_notice] if self.engine_notice else []
        if self.network.mode in netns.NOTICES:
            found.append(netns.NOTICES[self.network.mode])
        return found
