"""A fork: a new sandbox that goes on from a checkpoint of another
(docs/snapshots.md). Its shim launches the VM paused on a RAM file that
holds the checkpoint's pages, has the backend load the checkpoint's device
state from a copy of the parent's store (Snapshots.start_from), and lets it
run; the guest wakes where the checkpoint left it, quiesced, and takes its
new identity (FORKED: the container's id, hostname, machine-id, fresh
entropy and the clock) before its RESUME.

A fork has no memory in common with its parent: guest RAM is a file that
QEMU maps shared, which the Pager and the host's view of guest memory need,
so each fork gets its own copy of the checkpoint's pages, the ones with
data only (holes and zero pages stay holes).
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
    from paracell.vmm.builder import Vm
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

    def hostname(self) -> str:
        """The fork's hostname: its bundle's or its id, where that is a hostname."""
        name = (self.wanted_hostname or self.container_id)[:HOSTNAME_MAX]
        ok = name and all(c.isalnum() or c in "-." for c in name) and name[0].isalnum()
        return name if ok else f"fork-{uuid.uuid4().hex[:12]}"


def source(parent_dir: Path, checkpoint: str, container_id: str) -> ForkSource:
    """Checks that the checkpoint exists and can be read, and finds its root
    disk in the cache by content; the rest is checked against the fork's own
    VM when its shim loads it."""
    from paracell.images import rootdisk

    ckpt = CheckpointStore(parent_dir).load(check_name(checkpoint))
    disk = rootdisk.find(ckpt.rootdisk_sha256)
    if disk is None:
        raise CheckpointError(f"checkpoint {checkpoint}: its root disk is gone from the cache")
    return ForkSource(str(parent_dir), checkpoint, container_id, str(disk))


def identity_payload(fork: ForkSource) -> bytes:
    from paracell import speckeys as K
    from paracell.runtime.agent.sandboxspec import ENTROPY_BYTES, clock_record

    return K.encode([(K.CONTAINER, fork.container_id), (K.HOSTNAME, fork.hostname()),
                           (K.MACHINE_ID, uuid.uuid4().hex),
                           (K.ENTROPY, os.urandom(ENTROPY_BYTES).hex()),
                           clock_record(time.time_ns())])


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
        from paracell._native import ffi, lib

        began = time.monotonic()
        store = CheckpointStore(Path(self.fork.parent_dir))
        ckpt = store.load(self.fork.checkpoint)
        ram = self.ram
        store.verify(ckpt, self.key, ram.size_mib << 20)
        hashes, loc = store.tables(ckpt)
        seed = store.seed()
        seqs, fds = store.page_files()
        copy = self.state_dir / SOURCE_COPY
        try:
            target = os.open(copy, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600)
            try:
                store.copy_vmstate(target)
            finally:
                os.close(target)
        except (OSError, ParacellError) as err:
            for fd in fds:
                os.close(fd)
            copy.unlink(missing_ok=True)
            why = err.strerror if isinstance(err, OSError) else str(err)
            raise CheckpointError(f"checkpoint {ckpt.name}: its device state: {why}") from None

        def fill(target: int) -> None:
            fig = ffi.new("struct pc_ckpt_figures *")
            err = ffi.new("char[]", 256)
            if lib.pc_ckpt_materialize(target, ram.size_mib << 20, seed, hashes, loc,
                                       ffi.new("uint32_t[]", seqs), ffi.new("int[]", fds),
                                       len(fds), fig, err, 256) != 0:
                raise CheckpointError(f"checkpoint {ckpt.name}: "
                                      f"{ffi.string(err).decode(errors='replace')}")

        ram.fill = fill
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
            ram.fill = None
            for fd in fds:
                os.close(fd)
            copy.unlink(missing_ok=True)
        self._debug(f"forked from checkpoint {ckpt.name} of {self.fork.parent_dir} in "
                    f"{time.monotonic() - began:.3f} s (RAM and QEMU ready in "
                    f"{loaded - began:.3f} s)")
        return vm


def identify(agent_fd: int, fork: ForkSource, timeout_s: float) -> None:
    """The guest's new identity, then its RESUME: it wakes as it was at the
    checkpoint, quiesced, with its parent's exec sessions, which it drops."""
    from paracell._native import lib
    from paracell.runtime.agent import channel

    channel.send(agent_fd, lib.PC_FORKED, 0, identity_payload(fork))
    answer = channel.recv(agent_fd, timeout_s, "FORKED")
    if answer.type != lib.PC_ATTACHED:
        why = channel.printable(answer.payload) if answer.type == lib.PC_ERROR else \
            f"frame {answer.type}"
        raise ParacellError(f"the fork did not take its identity: {why}")
    channel.send(agent_fd, lib.PC_RESUME, 0,
                 lib.PC_RESUME_ROLLED_BACK.to_bytes(4, "little"))
