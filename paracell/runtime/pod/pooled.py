"""A container in a VM from the warm pool (docs/pool.md).

A pooled VM is a pod VM that the pool made (runtime/pool/), restored from
its template and attached (READY, then SANDBOX with identity and entropy of
its own), whose own process is pause, and which waits for a container. A create that the
pool can serve claims one, and the container joins it as a pod member
joins its pod's VM: its rootfs and binds go into the VM's pod share, and
its proxy, whose pid stands for the container, asks the VM's shim to create
it. The VM is the container's alone: the proxy holds the VM's lease, so the
VM ends when the container's proxy does, and the container's `delete`
deletes the VM.

The pool serves a create only where a VM of its own would have been the
pooled VM's kind: the default size and settings, and no namespace of
another process to join but a network namespace. A pod's sandbox is served
too: the pod's later containers join the pooled VM as they would have
joined the sandbox's own. Anything else makes a VM of its own, as without a
pool.

The network. A VM of its own would sit in the container's network
namespace, the one the spec names or a new one, and mirror its interfaces.
A pooled VM's shim sits in a namespace of its own, with one spare device
whose TAP leads nowhere. So the container's proxy takes the shim's place:
it enters the container's namespace (the pid that CRI, podman and
`ctr run --cni` look at is the proxy's), and at `start` its relay moves the
spare's TAP into it and mirrors the interfaces found there onto it, as the
shim of a VM of its own does for interfaces that appear after create
(paracell/net/late.py). A namespace with more interfaces than the pooled VM
has spares gets a VM of its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from paracell.errors import ParacellError
from paracell.runtime import poolwire
from paracell.runtime.pod.pod import PodSlot
from paracell.runtime.pod.poolednet import PooledNetwork
from paracell.runtime.state.ids import check_id
from paracell.runtime.state.store import ContainerState, VmRecord
from paracell.runtime.vm.spawn import Spawned

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.runtime.bundle.podrole import PodRole
    from paracell.runtime.bundle.spec import Bundle
    from paracell.runtime.context import Context
    from paracell.runtime.vm.placement import Container

# Annotations that choose what a VM of the container's own would be; a
# container that sets any of them gets one.
OWN_VM_ANNOTATION_PREFIX = "io.paracell."


def kind_of(ctx: Context, memory_mib: int) -> str:
    """What the global flags and settings make of a VM of memory_mib, which
    a pooled VM must match: its backend, engine, memory manager and size."""
    from paracell import settings

    manager = ctx.memory_manager or settings.memory_manager_override() or "default"
    return f"{ctx.backend({}).name}/{ctx.engine}/{manager}/{memory_mib}MiB"


def vm_memory_mib(bundle: Bundle, pod_role: PodRole) -> int:
    """The memory of the VM a container of its own would get, where
    linux.resources do not size it: a pod's (the pod's limit, else
    pod_memory_mib) or a container's (guest_memory_mib)."""
    from paracell import settings
    from paracell.runtime.bundle import podrole

    if pod_role.kind == "sandbox":
        return podrole.pod_memory_mib(bundle.annotations, settings.pod_memory_mib())
    return settings.guest_memory_mib()


def why_not_pooled(ctx: Context, bundle: Bundle, pod_role: PodRole, forked: bool) -> str:
    """Why this create cannot take a pooled VM ("" where it can)."""
    from paracell import settings
    from paracell.runtime.bundle import resources

    if pod_role.kind == "member" or pod_role.in_pods_network:
        return "a pod's container"
    if forked:
        return "a fork"
    if not settings.warm_pool_enabled():
        return "warm_pool is off in the settings"
    if ctx.no_template or not settings.templates_default():
        return "templates are off"
    if any(key.startswith(OWN_VM_ANNOTATION_PREFIX) for key in bundle.annotations):
        return f"an {OWN_VM_ANNOTATION_PREFIX}* annotation"
    if bundle.config.get("process") is None:
        return "no process"
    if any(path for kind, path in bundle.namespaces.items() if kind != "network"):
        return "a namespace to join"
    too_many = _too_many_interfaces(bundle.namespaces)
    if too_many:
        return too_many
    try:
        default_mib, cpus = vm_memory_mib(bundle, pod_role), os.cpu_count() or 1
    except ParacellError as err:
        return str(err)
    linux = bundle.config.get("linux") or {}
    wanted = resources.guest_size(resources.parse(linux.get("resources")), default_mib, cpus)
    pooled = resources.guest_size(resources.parse(None), default_mib, cpus)
    if (wanted.memory_mib, wanted.vcpus) != (pooled.memory_mib, pooled.vcpus):
        return "linux.resources size its VM"
    return ""


def _too_many_interfaces(namespaces: dict[str, str]) -> str:
    """Why a network namespace the spec names cannot be a pooled VM's: more
    Ethernet interfaces than its spares ("" where it can)."""
    from paracell._native import lib
    from paracell.net import discover, netns

    try:
        plan = netns.plan(namespaces, False)
    except ParacellError as err:
        return str(err)
    if plan.mode != netns.JOIN:
        return ""
    try:
        found = netns.run_inside(plan.path, discover.ethernet_count)
    except ParacellError as err:
        return str(err)
    if found is None:
        return f"network namespace {plan.path[:200]} could not be entered"
    if found > lib.PC_NET_MAX_SPARES:
        return f"{found} network interfaces, more than a pooled VM's spares"
    return ""


@dataclass
class PooledSlot:
    """A Placement (runtime/vm/placement.py): the container in a pooled VM,
    as a member of it, holding its lease."""

    slot: PodSlot
    claim: poolwire.Claim
    network: PooledNetwork | None

    @classmethod
    def plan(cls, ctx: Context, container_id: str, bundle: Bundle,
             claim: poolwire.Claim) -> PooledSlot:
        check_id(claim.vm_id)
        return cls(PodSlot.plan(ctx, container_id, bundle, claim.vm_id, own_network=True), claim,
                   PooledNetwork.of(ctx.store, container_id, bundle, claim.vm_id, ctx.log))

    @property
    def xgates_support(self) -> None:
        return None

    def extra_records(self) -> list[tuple[str, str]]:
        return self.slot.extra_records()

    def record(self) -> VmRecord:
        record = self.slot.record()
        if self.network is not None:
            record.reclaim.append(self.network.reclaim_record())
        return record

    def provision(self, ctx: Context) -> None:
        self.slot.provision(ctx)
        self._charge_here(ctx)

    def _charge_here(self, ctx: Context) -> None:
        """The VM's shim and QEMU join the container's host cgroup, where a
        VM of its own would be: the CPU and memory they use from now on are
        the container's (a pod's, under kubelet's limits). What they were
        charged before stays with the pool's cgroup: cgroup v2 does not move
        charges. A failed create kills them there with the container's
        cgroup, as the VM is deleted anyway."""
        from paracell.procfs import same_process
        from paracell.runtime.host import cgroups

        vm = ctx.store.load(self.claim.vm_id)
        paths = [d.path for d in self.slot.cgroup]
        # The shim holds the VM's lease's other end, which we hold: it lives.
        for pid, start in ((vm.shim_pid, vm.shim_start), (vm.vm.qemu_pid, vm.vm.qemu_start)):
            if pid > 0 and same_process(pid, start):
                cgroups.join(paths, pid)

    def describe(self) -> str:
        return f"in VM {self.claim.vm_id} from the pool"

    def spawn(self, ctx: Context, container: Container, detach: bool) -> Spawned:
        from paracell.runtime.pod.pod import MemberProxy
        from paracell.runtime.vm import spawn, standin

        slot = self.slot
        proxy = MemberProxy(slot.sandbox_socket, slot.control_socket, container.launch_spec,
                            container.terminal, container.console_socket,
                            [d.path for d in slot.cgroup], slot.bundle.seccomp,
                            lease_fd=self.claim.lease_fd, network=self.network)
        try:
            return spawn.spawn(lambda handshake: standin.serve(handshake, proxy), detach,
                               ctx.log.background_error, stdio=ctx.stdio,
                               keep=(self.claim.lease_fd,))
        finally:
            # The proxy holds the lease now; ours would keep the VM past it.
            self.claim.release()

    def spawned(self, state: ContainerState, spawned: Spawned) -> None:
        """The VM is the pool's container's: its QEMU is recorded there."""

    def notices(self) -> list[str]:
        from paracell.net import netns

        return [] if self.network is not None else [netns.NOTICES[netns.HOST]]
