"""Sandboxes and containers: the objects every create goes through.

A **Sandbox** is one VM: its devices, shares, NICs, memory manager, engine,
vCPUs and RAM, with the lifecycle plan -> provision -> boot -> attach ->
stop -> reclaim. `plan` decides everything and touches nothing, so the
state can record every host resource before any exists; `provision` makes
the host side (cgroup, limits); the shim boots the VM and attaches it
(READY, then SANDBOX: runtime/sandbox/shim.py); `stop` and `reclaim` undo it, from
the recorded state alone when the shim has died (lifecycle._destroy).

A **Container** is a process tree in a sandbox. A lone container is a
Container in a Sandbox of its own; a pod member is a Container in its pod's
running Sandbox (a `PodSlot`, runtime/pod/pod.py). Both are a `Placement`:
`lifecycle.create` is the one create path, and asks the placement only what
differs between them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from paracell.runtime.sandbox.spawn import Spawned
from paracell.runtime.state.store import ContainerState, VmRecord

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.net.netns import NetworkPlan
    from paracell.runtime.bundle.podrole import PodRole
    from paracell.runtime.bundle.spec import Bundle
    from paracell.runtime.context import Context
    from paracell.runtime.host.hostside import HostPlan
    from paracell.runtime.sandbox.memorymanager import MemoryPlan
    from paracell.vmm.builder import VmBuilder
    from paracell.vmm.config import VmConfig
    from paracell.vmm.devices import AgentPort
    from paracell.xgate.admission import XgatesPlan


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
class Sandbox:
    """One VM, planned (see the module's docstring)."""

    state_dir: Path
    builder: VmBuilder
    agent: AgentPort
    config: VmConfig
    host: HostPlan
    network: NetworkPlan
    memory: MemoryPlan
    xgates: XgatesPlan
    bundle: Bundle
    templates: bool = False  # restore from a VM template (runtime/sandbox/templating.py)
    engine_notice: str = ""
    fork: Any = None  # the checkpoint a fork goes on from (paracell/sandbox/forking.py)

    @classmethod
    def plan(cls, ctx: Context, container_id: str, bundle: Bundle, pod_role: PodRole,
             xgates_plan: XgatesPlan) -> Sandbox:
        """Decides the VM from the bundle, the settings and the host; touches
        nothing on the host yet."""
        from paracell import settings
        from paracell.guest import artifacts
        from paracell.net import netns
        from paracell.runtime.bundle import podrole, snapshotmode
        from paracell.runtime.host import hostside
        from paracell.runtime.sandbox import memorymanager, templating, vmplan
        from paracell.vmm import memory, probe
        from paracell.xgate import admission

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
            from paracell.errors import ParacellError

            raise ParacellError(f"{probe.QEMU_BINARY} not found: install qemu-system-x86")
        choice = probe.choose_engine(ctx.engine, facts)
        admission.require_support(xgates_plan, choice.engine, facts)
        # Before prepare_rootfs, which writes mount points into the rootfs: a
        # refused create leaves nothing behind, not even there.
        admission.vet_rootfs(xgates_plan, bundle.rootfs, ctx.log)
        network = netns.plan(bundle.namespaces, pod_role.in_pods_network)
        snapshot = snapshotmode.plan(bundle, pod_sandbox)
        if snapshot.enabled and ctx.vmm(bundle.annotations) != "qemu":
            from paracell.errors import ParacellError

            raise ParacellError("snapshot mode needs direct QEMU (--vmm qemu): its checkpoints "
                                "load device state in place, which ParaCell does not ask of "
                                "libvirt")
        state_dir = ctx.store.dir(container_id)
        vmm = ctx.vmm(bundle.annotations)
        backend = vmplan.Backend(vmm, ctx.libvirt_uri if vmm == "libvirt" else "")
        if vmm == "libvirt":
            from paracell.vmm.libvirt import connection, features

            connection.check_uri(backend.libvirt_uri)
            # The daemon, its setup and its QEMU's features, in one line if
            # anything is missing: before anything exists on the host.
            features.require(backend.libvirt_uri, facts.qemu_path, choice.engine,
                             str(settings.memory_dir()))
        builder, agent, config = vmplan.container_vm(
            state_dir, bundle, artifacts.current(), choice.engine, facts.qemu_path,
            memory.path_for(ctx.root, container_id), host.size.memory_mib, memory_plan,
            vcpus=host.size.vcpus, network=network, pod_share=pod_sandbox,
            xgates=xgates_plan.enabled, backend=backend,
            owner={"id": container_id, "bundle": str(bundle.path)}, snapshot=snapshot)
        # Templates are saved and restored by direct QEMU only (docs/libvirt.md).
        templates = vmm == "qemu" and templating.wanted(ctx.no_template, bundle.annotations)
        return cls(state_dir, builder, agent, config, host, network, memory_plan, xgates_plan,
                   bundle, templates=templates, engine_notice=choice.notice)

    def extra_records(self) -> list[tuple[str, str]]:
        return []

    def record(self) -> VmRecord:
        return VmRecord(config=self.config, host=self.host.record(),
                        reclaim=self.builder.record())

    def provision(self, ctx: Context) -> None:
        from paracell.vmm.devices import RootDisk

        disk = next((d for d in self.builder.devices if isinstance(d, RootDisk)), None)
        if disk is not None and self.fork is not None:
            disk.image = Path(self.fork.rootdisk)  # its parent's files, whatever the tree is now
        elif disk is not None:
            disk.build(self.bundle.rootfs)
        self.host.setup(self.config.engine, ctx.log, self.state_dir,
                        Path(self.config.ram_file), self.bundle)

    def describe(self) -> str:
        size = self.host.size
        return (f"vmm {self.config.vmm}, engine {self.config.engine}, "
                f"{size.memory_mib} MiB, {size.vcpus} vCPU "
                f"({size.reason}), memory manager {self.memory.manager}, "
                f"xgates {'on' if self.xgates.enabled else 'off'}")

    def spawn(self, ctx: Context, container: Container, detach: bool) -> Spawned:
        """The shim: it boots the VM, attaches it, and creates the init."""
        from paracell.runtime.sandbox import shim, spawn
        from paracell.runtime.sandbox.shim import ShimPlan

        plan = ShimPlan(state_dir=self.state_dir, vm=self.builder, config=self.config,
                        agent=self.agent, launch_spec=container.launch_spec,
                        hostname=self.bundle.config.get("hostname") or "",
                        console_socket=container.console_socket, terminal=container.terminal,
                        log=ctx.log, seccomp=self.bundle.seccomp, network=self.network,
                        isolation=self.host.isolation,
                        templates=self.templates and self.fork is None,
                        checkpoint_limit=self._checkpoint_limit(), fork=self.fork)
        return spawn.spawn(
            lambda handshake: shim.serve(plan, handshake, ctx.log.background_error),
            detach, ctx.log.background_error,
            pid_namespace=self.host.isolation.pid_namespace_for_child, place=self._place)

    def _checkpoint_limit(self) -> int:
        from paracell.sandbox import checkpoints
        from paracell.vmm.devices import RootDisk

        if self.config.vmm != "qemu" or not any(isinstance(d, RootDisk)
                                                for d in self.builder.devices):
            return 0
        return checkpoints.limit_of(self.bundle.annotations)

    def _place(self, pid: int) -> None:
        """A libvirt QEMU (host pid), on its shim's request: into the container's cgroup."""
        from paracell.errors import ParacellError
        from paracell.runtime.host import cgroups
        from paracell.vmm.libvirt import find_qemu

        if self.config.vmm != "libvirt":
            raise ParacellError("only a libvirt domain's QEMU is placed by its creator")
        proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            # The pid must be this domain's QEMU, never another process.
            if find_qemu(proc, self.config.domain, self.config.ram_file) != pid:
                raise ParacellError(f"pid {pid} is not the QEMU of {self.config.domain}")
        finally:
            os.close(proc)
        cgroups.join(self.host.isolation.cgroup_dirs, pid)

    def spawned(self, state: ContainerState, spawned: Spawned) -> None:
        state.vm.qemu_pid, state.vm.qemu_start = spawned.ready.qemu_pid, spawned.ready.qemu_start
        state.vm.template = spawned.ready.template

    def notices(self) -> list[str]:
        from paracell.net import netns

        found = [self.engine_notice] if self.engine_notice else []
        if self.network.mode in netns.NOTICES:
            found.append(netns.NOTICES[self.network.mode])
        return found
