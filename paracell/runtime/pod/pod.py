"""Pods: one VM per Kubernetes pod.

containerd's CRI plugin says which container is a pod's sandbox (the pause
container) and which belong to it, in annotations. The sandbox boots the pod's
VM, with a pod share attached. A member does not boot a VM: its rootfs and
bind sources are bind-mounted into its own directory of the pod share, and a
proxy process asks the sandbox's shim to start it in the guest, beside the
others. The proxy's pid stands for the member as the shim's does for a VM:
it lives as long as the member, relays its stdio and signals, exits with its
status, and serves its `start` and `kill` on the member's own control socket.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paracell import speckeys as K
from paracell import unixsock, wire
from paracell.errors import ParacellError
from paracell.linux import MS_BIND, MS_RDONLY, MS_REC, MS_REMOUNT
from paracell.runtime.agent import channel
from paracell.runtime.bundle.podrole import CONTAINER_TYPE, SANDBOX_ID
from paracell.runtime.bundle.resources import Resources
from paracell.runtime.bundle.spec import Bundle
from paracell.runtime.state.ids import check_id
from paracell.runtime.state.store import (
    CONTROL_SOCKET,
    ContainerState,
    HostRecord,
    StateStore,
    VmRecord,
)
from paracell.runtime.vm import spawn

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.runtime.context import Context
    from paracell.runtime.host.cgroups import CgroupDir
    from paracell.runtime.pod.poolednet import PooledNetwork
    from paracell.runtime.vm.placement import Container

GUEST_POD_DIR = wire.text("PC_PODSHARE_DIR")
# The guest namespaces a member may share with its pod, by OCI type, and the
# launch-spec key that asks the agent to join them.
JOINABLE = {"ipc": K.NS_IPC, "uts": K.NS_UTS, "pid": K.NS_PID}
NS_PATH = re.compile(r"/proc/(\d{1,10})/ns/([a-z]+)")


def member_slot(container_id: str) -> str:
    """A member's directory name in the pod share: fixed length, whatever the ID."""
    return hashlib.sha256(container_id.encode()).hexdigest()[:16]


def _sandbox(store: StateStore, sandbox_id: str) -> tuple[ContainerState, str]:
    """The pod's sandbox, and the container whose shim holds the pod's VM:
    the sandbox's own, or a pooled VM the sandbox took (runtime/pod/pooled.py)."""
    from paracell.runtime.state import status

    state = store.load(sandbox_id)
    status.transition("join pod", state.status, sandbox_id)
    if state.pool_vm and state.annotations.get(CONTAINER_TYPE) == "sandbox":
        return state, check_id(state.pool_vm)
    if not state.vm.config.pod_share:
        raise ParacellError(f"container {sandbox_id} is not a pod sandbox: "
                            "it was created without the sandbox annotation")
    return state, sandbox_id


def _same_netns(path: str, sandbox: ContainerState) -> bool:
    """Whether path names the network namespace the sandbox's shim sits in:
    the pod's, which its VM holds."""
    try:
        given, pods = os.stat(path), os.stat(f"/proc/{sandbox.shim_pid}/ns/net")
    except OSError:
        return False
    return (given.st_dev, given.st_ino) == (pods.st_dev, pods.st_ino)


def _joins(bundle: Bundle, sandbox: ContainerState, members: dict[int, str],
           own_network: bool) -> list[tuple[str, str]]:
    """A member's namespace paths, as CRI gives them (/proc/PID/ns/TYPE of the
    sandbox's pid), mapped to the guest namespaces of that container.
    own_network: a container in a pooled VM, whose network namespace is its
    own to bring (runtime/pod/pooled.py)."""

    owners = {sandbox.shim_pid: sandbox.id, **members}
    records = []
    for kind, path in bundle.namespaces.items():
        if not path or kind in (K.MOUNT, "cgroup", "user") or (kind == "network" and own_network):
            continue
        if kind == "network":
            # The VM has one network namespace, the pod's: a member can have no other.
            if not _same_netns(path, sandbox):
                raise ParacellError(f"network namespace {path} is not pod {sandbox.id}'s: "
                                    "the containers of a pod VM share one network")
            continue
        match = NS_PATH.fullmatch(path)
        owner = owners.get(int(match.group(1))) if match else None
        if kind not in JOINABLE or owner is None or match.group(2) != kind:
            raise ParacellError(f"namespace path {path} ({kind}) is not one of pod "
                                f"{sandbox.id}'s: a pod member can only share its pod's namespaces")
        records.append((JOINABLE[kind], owner))
    return records


def mount_member(bundle: Bundle, member_dir: Path) -> None:
    """The member's rootfs and bind sources, bound into its directory of the
    pod share, where the running VM's 9p server finds them. All or nothing."""
    from paracell.vmm import hostshare

    member_dir.mkdir(mode=0o700)
    try:
        root = member_dir / "rootfs"
        root.mkdir()
        hostshare.mount(bundle.rootfs, root, MS_BIND | MS_REC)
        if bundle.rootfs_readonly:
            # Read-only for QEMU too, as the rootfs share of a VM of its own is.
            hostshare.mount(root, root, MS_BIND | MS_REMOUNT | MS_RDONLY)
        if bundle.host_binds:
            hostshare.mount_binds(member_dir / "binds",
                                  [(b.source, b.entry) for b in bundle.host_binds])
    except BaseException:
        hostshare.remove_tree(member_dir)
        raise


def guest_limits(res: Resources) -> list[tuple[str, str]]:
    """A member's linux.resources that its group in the pod's VM enforces
    (docs/pods.md): the memory and pids limits. The rest are the VM's."""
    limits = []
    if res.memory_limit is not None and res.memory_limit > 0:
        limits.append((K.MEMORY_MAX, str(res.memory_limit)))
    if res.pids_limit is not None and res.pids_limit > 0:
        limits.append((K.PIDS_MAX, str(res.pids_limit)))
    return limits


def member_records(container_id: str, bundle: Bundle, sandbox: ContainerState,
                   members: dict[int, str], res: Resources,
                   own_network: bool = False) -> list[tuple[str, str]]:
    slot = member_slot(container_id)
    return [(K.ROOTFS, f"{GUEST_POD_DIR}/{slot}/rootfs"),
            *_joins(bundle, sandbox, members, own_network), *guest_limits(res)]


class MemberProxy:
    """The stand-in for a pod member's init (runtime/vm/standin.py), in the
    member's own host cgroup: see the module's docstring."""

    needs_commit = True

    def __init__(self, sandbox_socket: Path, control_socket: Path, launch: bytes,
                 terminal: bool, console_socket: str | None, cgroup: list[str],
                 seccomp: bytes | None, lease_fd: int = -1,
                 network: PooledNetwork | None = None) -> None:
        self.sandbox_socket, self.control_socket, self.launch = (sandbox_socket, control_socket,
                                                                 launch)
        self.terminal, self.console_socket = terminal, console_socket
        self.cgroup, self.seccomp = cgroup, seccomp
        # A pooled VM's lease (runtime/pod/pooled.py), held for the member's
        # life: the VM ends when this process does, however it ends.
        self.lease_fd = lease_fd
        # A pooled container's network namespace, which this process sits in
        # as a VM's shim would.
        self.network = network
        self.listener: Any = None
        self.conn: Any = None
        self.tty_fd = -1

    def open(self) -> spawn.Ready:
        import signal

        from paracell.runtime.agent import signals
        from paracell.runtime.host import cgroups
        if self.network is not None:
            self.network.enter(self.lease_fd)
        cgroups.join(self.cgroup)
        self.listener = unixsock.listen(self.control_socket)
        self.conn, self.tty_fd = channel.open_process(
            self.sandbox_socket, self.launch, self.terminal, self.console_socket, self.seccomp)
        # From the moment the pid is published, `kill` may signal us: hold
        # the signals until the relay's signalfd picks them up.
        signal.pthread_sigmask(signal.SIG_BLOCK, signals.FORWARDED)
        return spawn.Ready(pid=os.getpid())

    def run(self) -> int:
        from paracell.runtime.vm import standin

        # The relay serves the member's start and kill on its control socket,
        # which goes when it ends.
        if self.lease_fd >= 0:
            os.set_inheritable(self.lease_fd, True)
        try:
            channel.exec_relay(self.conn.fileno(), self.tty_fd,
                               control_fd=self.listener.fileno(),
                               unlink=(self.control_socket,),
                               net_record=self.network.record if self.network else None)
        except OSError as err:
            channel.say_on_stderr(f"starting the member's relay: {standin.describe(err)}")
        return standin.EXIT_RUNTIME_ERROR

    def close(self) -> None:
        """Closing the connection ends the member in the guest, if it still runs."""
        if self.conn is not None:
            self.conn.close()
        if self.listener is not None:
            self.listener.close()
            unixsock.unlink(self.control_socket)


def member_pids(store: StateStore, sandbox_id: str) -> dict[int, str]:
    """The proxy pids of the pod's live members, whose namespaces a later
    member may name (CRI's TARGET mode)."""
    found = {}
    for other in store.list_ids():
        try:
            state = store.load(other)
        except ParacellError:
            continue
        if state.annotations.get(SANDBOX_ID) == sandbox_id and other != sandbox_id:
            found[state.shim_pid] = other
    return found


def vm_owner(state: ContainerState) -> str:
    """The container whose shim holds this container's VM: a pod member's
    sandbox, a pooled container's VM (runtime/pod/pooled.py); "" for a
    container whose shim is its VM's."""
    if state.pool_vm:
        return check_id(state.pool_vm)
    if state.annotations.get(CONTAINER_TYPE) != "container":
        return ""
    return check_id(state.annotations.get(SANDBOX_ID, ""))


def sandbox_socket(store: StateStore, state: ContainerState) -> Path | None:
    """Where exec requests for this container go: its VM's shim for a member,
    which for a member of a pod whose sandbox took a pooled VM is that VM's."""
    owner = vm_owner(state)
    if not owner:
        return None
    if not state.pool_vm:
        try:
            owner = store.load(owner).pool_vm or owner
        except ParacellError:
            pass  # the sandbox is gone: so is its socket, which says so
    return store.dir(check_id(owner)) / CONTROL_SOCKET


@dataclass
class PodSlot:
    """A member's place in its pod's running VM (runtime/vm/placement.py's
    Placement): its directory of the pod share, its own host cgroup, and the
    records that join it to its pod's namespaces in the guest."""

    sandbox_id: str
    member_dir: Path
    cgroup: list[CgroupDir]
    bundle: Bundle
    sandbox_socket: Path
    control_socket: Path
    extra: list[tuple[str, str]]
    # The pod's VM exists, and was admitted with its own create.
    xgates_support: None = None

    @classmethod
    def plan(cls, ctx: Context, container_id: str, bundle: Bundle, sandbox_id: str,
             own_network: bool = False) -> PodSlot:
        from paracell import settings
        from paracell.runtime.host import cgroups, hostside

        store = ctx.store
        sandbox, vm_id = _sandbox(store, sandbox_id)
        holder = sandbox if vm_id == sandbox_id else store.load(vm_id)
        share = Path(holder.vm.config.pod_share)
        if bundle.config.get("process") is None:
            # Nothing could start it later: its VM is already running.
            raise ParacellError(f"container {container_id}: a pod member needs a process")
        # The member's own host cgroup holds its relay, so containerd finds
        # one at cgroupsPath; its memory and pids limits are its group's in
        # the pod's VM, the rest the VM's (docs/pods.md).
        host = hostside.plan(bundle, container_id, ctx.systemd_cgroup,
                             settings.guest_memory_mib())
        cgroup = cgroups.adopt_parents(host.cgroup_dirs,
                                       cgroups.from_facts(sandbox.vm.host.cgroups))
        slot = member_slot(container_id)
        bundle.bind_prefix = f"{GUEST_POD_DIR}/{slot}/binds"
        extra = member_records(container_id, bundle, sandbox, member_pids(store, sandbox_id),
                               host.resources, own_network)
        return cls(sandbox_id, share / slot, cgroup, bundle,
                   store.dir(vm_id) / CONTROL_SOCKET,
                   store.dir(container_id) / CONTROL_SOCKET, extra)

    def extra_records(self) -> list[tuple[str, str]]:
        return self.extra

    def record(self) -> VmRecord:
        from paracell.runtime.host import cgroups
        from paracell.runtime.vm.memberdir import PodMemberDir

        return VmRecord(host=HostRecord(cgroups=cgroups.facts(self.cgroup)),
                        reclaim=[PodMemberDir.record(self.member_dir)])

    def provision(self, ctx: Context) -> None:
        from paracell.runtime.bundle import resources
        from paracell.runtime.host import cgroups
        mount_member(self.bundle, self.member_dir)
        cgroups.setup(self.cgroup, resources.parse(None), ctx.log)

    def describe(self) -> str:
        return f"member of pod {self.sandbox_id}"

    def spawn(self, ctx: Context, container: Container, detach: bool) -> spawn.Spawned:
        from paracell.runtime.vm import standin

        proxy = MemberProxy(self.sandbox_socket, self.control_socket, container.launch_spec,
                            container.terminal, container.console_socket,
                            [d.path for d in self.cgroup], self.bundle.seccomp)
        return spawn.spawn(lambda handshake: standin.serve(handshake, proxy), detach,
                           ctx.log.background_error, stdio=ctx.stdio)

    def spawned(self, state: ContainerState, spawned: spawn.Spawned) -> None:
        """A member has no QEMU of its own."""

    def notices(self) -> list[str]:
        return []
