"""A fork: a new sandbox that goes on from a checkpoint of another
(docs/snapshots.md). Its shim launches the VM paused on the checkpoint's
RAM, has the backend load the checkpoint's device state from a copy of the
parent's store (Snapshots.start_from), and lets it run; the guest wakes where
the checkpoint left it, quiesced, and takes its new identity (FORKED: the
container's id, hostname, machine-id, fresh entropy and the clock) before its
RESUME.

Its RAM is one of two kinds:
- shared (the default where QEMU loads the RAM plugin, under TCG): QEMU maps
  the checkpoint's RAM file (CheckpointStore.fork_ram) copy-on-write, as a
  VM restored from a template maps its template's, so all forks of one
  checkpoint share the pages none of them wrote, and the Pager runs inside
  QEMU. Such a fork has no RAM file of its own, so it cannot be checkpointed;
- private (`--private-memory`, a runc restore): a RAM file of its own that
  holds a copy of the checkpoint's pages (holes and zero pages stay holes),
  which QEMU maps shared; the fork checkpoints, rolls back and forks in turn.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paracell.errors import ParacellError
from paracell.runtime.snapshots.checkpoints import CheckpointError, CheckpointStore, check_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.net.netns import NetworkPlan
    from paracell.vmm.builder import Vm
    from paracell.vmm.config import VmConfig
    from paracell.vmm.devices import GuestRam
    from paracell.vmm.hypervisor import Hypervisor

SOURCE_COPY = "fork-source.vmstate"
HOSTNAME_MAX = 64


@dataclass(frozen=True)
class ForkSource:
    parent_dir: str   # the parent's state directory
    checkpoint: str   # the checkpoint it goes on from
    container_id: str  # the fork's own id
    rootdisk: str     # the cached image of the checkpoint's root disk digest
    wanted_hostname: str = ""  # a restore's: its bundle's; a fork's: its id
    shared_ram: str = ""  # the checkpoint's RAM file it maps copy-on-write; "": a copy
    # Where its VM sits (`network_plans`); None: where its bundle says (a restore).
    network: NetworkPlan | None = None

    def shares_memory_of(self) -> str:
        """For its state (VmRecord.shares_memory_of): whose pages it maps, or ""."""
        return (f"checkpoint {self.checkpoint} of {os.path.basename(self.parent_dir)}"
                if self.shared_ram else "")

    def hostname(self) -> str:
        """The fork's hostname: its bundle's or its id, where that is a hostname."""
        name = (self.wanted_hostname or self.container_id)[:HOSTNAME_MAX]
        ok = name and all(c.isalnum() or c in "-." for c in name) and name[0].isalnum()
        return name if ok else f"fork-{uuid.uuid4().hex[:12]}"


def source(parent_dir: Path, checkpoint: str, container_ids: list[str],
           share_memory: bool, networks: list[NetworkPlan] | None = None) -> list[ForkSource]:
    """Checks that the checkpoint exists and can be read, finds its root disk
    in the cache by content, and with `share_memory` makes its RAM file for
    forks; the rest is checked against each fork's own VM when its shim
    loads it. networks: each fork's (network_plans)."""
    from paracell.images import rootdisk

    store = CheckpointStore(parent_dir)
    ckpt = store.load(check_name(checkpoint))
    disk = rootdisk.find(ckpt.rootdisk_sha256)
    if disk is None:
        raise CheckpointError(f"checkpoint {checkpoint}: its root disk is gone from the cache")
    shared = str(store.fork_ram(ckpt)) if share_memory else ""
    plans = networks or [None] * len(container_ids)
    return [ForkSource(str(parent_dir), checkpoint, fid, str(disk), shared_ram=shared,
                       network=plan)
            for fid, plan in zip(container_ids, plans, strict=True)]


def network_plans(parent_net: str, parent_record: str, parent_netns: str, count: int,
                  paths: list[str]) -> list[NetworkPlan]:
    """Where each of COUNT forks' VMs sits, from `fork --netns` (one path per
    fork, or none), all checked before anything is made:
    - a parent with network devices: a fork with a path joins that namespace,
      whose interfaces its devices take; one without sits in a new, empty
      namespace (loopback only). Never the parent's namespace (parent_netns:
      its shim's), never one namespace for two forks;
    - a parent without: the host's, as it was, and no path is taken.
    parent_net: the parent's network mode; parent_record: its net.json."""
    from paracell.net import device, netns

    if paths and len(paths) != count:
        raise ParacellError(f"--netns was given {len(paths)} times for {count} forks: "
                            "give one namespace per fork, or none")
    if parent_net not in (netns.JOIN, netns.NEW):
        if paths:
            raise ParacellError("the parent has no network device (it was created without a "
                                "network namespace of its own): its forks cannot take one")
        return [netns.NetworkPlan(netns.HOST)] * count
    devices = device.Record.read(Path(parent_record)).devices if parent_record else None
    if devices is None:
        raise ParacellError("the parent's network record does not say how many network "
                            "devices its VM has: it cannot be forked")
    if not paths:
        return [netns.NetworkPlan(netns.NEW, devices=devices)] * count
    plans = []
    parent_identity = netns.identity_of(parent_netns) if parent_netns else None
    for path in paths:
        identity = netns.check_given(path)
        if identity == parent_identity:
            raise ParacellError(f"network namespace {path[:200]}: the parent's own (two VMs "
                                "cannot hold one namespace's interfaces)")
        if any(p.identity == identity for p in plans):
            raise ParacellError(f"network namespace {path[:200]}: given to two forks (a "
                                "network namespace serves one VM)")
        plans.append(netns.NetworkPlan(netns.JOIN, path, devices, identity))
    return plans


def may_share_memory(config: VmConfig) -> str:
    """Why forks of a VM like this one cannot map their checkpoint's RAM
    copy-on-write, or "": the same conditions as a template's
    (runtime/vm/templating.py): TCG, whose RAM plugin serves the Pager inside
    QEMU, a QEMU that loads it, no balloon (QEMU 7.2 would punch the shared
    file), and the operator's template_ram setting not "copied"."""
    from paracell import settings
    from paracell.vmm import memory, probe

    if config.engine != "tcg":
        return f"the {config.engine} engine has no RAM plugin"
    if config.memory_manager == "balloon":
        return "the balloon would free the shared file's pages"
    try:
        if settings.template_ram() != "shared":
            return "the operator's template_ram setting is \"copied\""
    except ParacellError as err:
        return str(err)
    qemu = probe.probe_host().qemu_path
    if qemu is None or not memory.plugin_loads(qemu):
        return "this QEMU does not load the RAM plugin"
    return ""


def identity_payload(fork: ForkSource, network: list[tuple[str, str]]) -> bytes:
    """FORKED's records. network: the interfaces of the fork's namespace
    (NetworkInterfaces.fork_records), which the agent puts on the VM's
    devices in place of the parent's; with none, it keeps only lo."""
    from paracell import speckeys as K
    from paracell.runtime.agent.sandboxspec import ENTROPY_BYTES, clock_record

    return K.encode([(K.CONTAINER, fork.container_id), (K.HOSTNAME, fork.hostname()),
                     (K.MACHINE_ID, uuid.uuid4().hex),
                     (K.ENTROPY, os.urandom(ENTROPY_BYTES).hex()),
                     clock_record(time.time_ns()), *network])


class ForkRestore:
    """The fork's VM, in its shim: launched held, loaded, running."""

    def __init__(self, fork: ForkSource, state_dir: Path, ram: GuestRam, key: str,
                 hypervisor: Hypervisor, launch: Callable[[], Vm],
                 debug: Callable[[str], None]) -> None:
        """ram: the fork's RAM device; key: its VM's shape key, which the
        checkpoint's must be."""
        self.fork, self.state_dir, self.ram, self.key = fork, state_dir, ram, key
        self.hypervisor, self._launch, self._debug = hypervisor, launch, debug

    def restore(self) -> Vm:
        began = time.monotonic()
        store = CheckpointStore(Path(self.fork.parent_dir))
        ckpt = store.load(self.fork.checkpoint)
        ram = self.ram
        store.verify(ckpt, self.key, ram.size_mib << 20)
        copy = self.state_dir / SOURCE_COPY
        shared = -1
        if self.fork.shared_ram:
            try:
                shared = self._open_shared(ram.size_mib << 20)
            except (OSError, ParacellError) as err:
                why = err.strerror if isinstance(err, OSError) else str(err)
                raise CheckpointError(f"checkpoint {ckpt.name}: its RAM: {why}") from None
        try:
            target = os.open(copy, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600)
            try:
                store.copy_vmstate(target)
            finally:
                os.close(target)
        except (OSError, ParacellError) as err:
            if shared >= 0:
                os.close(shared)
            copy.unlink(missing_ok=True)
            why = err.strerror if isinstance(err, OSError) else str(err)
            raise CheckpointError(f"checkpoint {ckpt.name}: its device state: {why}") from None
        if shared >= 0:
            ram.shared_from = shared
        else:
            ram.fill = lambda target: store.materialize(ckpt, target)
        vm = None
        try:
            vm = self._launch()
            loaded = time.monotonic()
            self.hypervisor.snapshots(store.vmstate).start_from(copy, ckpt.vmstate_tag)
        except BaseException:
            if vm is not None:
                vm.kill()
                vm.stop(5)
                vm.release()
            raise
        finally:
            # QEMU has its own fd on the shared RAM now; ram.shared_from stays
            # set: the VM's RAM is copy-on-write for its whole life.
            ram.fill = None
            if shared >= 0:
                os.close(shared)
            copy.unlink(missing_ok=True)
        how = "RAM shared" if shared >= 0 else "RAM copied"
        self._debug(f"forked from checkpoint {ckpt.name} of {self.fork.parent_dir} in "
                    f"{time.monotonic() - began:.3f} s ({how} and QEMU ready in "
                    f"{loaded - began:.3f} s)")
        return vm

    def _open_shared(self, ram_bytes: int) -> int:
        """The checkpoint's RAM file for forks, never through a link, of this
        VM's RAM size."""
        from paracell import safefs

        fd = os.open(self.fork.shared_ram, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            safefs.check_regular(fd, "the checkpoint's RAM", ram_bytes, exact=ram_bytes)
        except BaseException:
            os.close(fd)
            raise
        return fd


def identify(agent_fd: int, fork: ForkSource, timeout_s: float,
             network: list[tuple[str, str]]) -> None:
    """The guest's new identity and network, then its RESUME: it wakes as
    it was at the checkpoint, quiesced, with its parent's exec sessions,
    which it drops, and its parent's addresses, which FORKED replaces."""
    from paracell._native import lib
    from paracell.runtime.agent import channel

    channel.send(agent_fd, lib.PC_FORKED, 0, identity_payload(fork, network))
    answer = channel.recv(agent_fd, timeout_s, "FORKED")
    if answer.type != lib.PC_ATTACHED:
        why = channel.printable(answer.payload) if answer.type == lib.PC_ERROR else \
            f"frame {answer.type}"
        raise ParacellError(f"the fork did not take its identity: {why}")
    channel.send(agent_fd, lib.PC_RESUME, 0,
                 lib.PC_RESUME_ROLLED_BACK.to_bytes(4, "little"))
