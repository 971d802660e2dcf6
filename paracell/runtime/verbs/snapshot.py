"""`paracell sandbox checkpoint|rollback|checkpoints|rm-checkpoint`: a
snapshot-mode sandbox's checkpoints (docs/snapshots.md). The shim does the
work (paracell/runtime/snapshots/service.py); these verbs ask it, and `checkpoints`
reads the store."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

from paracell.errors import ParacellError
from paracell.runtime.context import Context
from paracell.runtime.snapshots import client
from paracell.runtime.snapshots.checkpoints import CheckpointStore, check_name
from paracell.runtime.state import status
from paracell.runtime.state.store import ContainerState


def _running(ctx: Context, container_id: str, verb: str) -> Any:
    state = ctx.store.load(container_id)  # its status settled against the live processes
    status.transition(verb, state.status, container_id)
    _refuse_shared_fork(state)
    return ctx.store.dir(container_id)


def _refuse_shared_fork(state: ContainerState) -> None:
    if state.vm is not None and state.vm.shares_memory_of:
        raise ParacellError(f"container {state.id} is a fork that shares the memory of "
                            f"{state.vm.shares_memory_of}: it has no RAM of its own to "
                            "checkpoint (forks made with --private-memory can be)")


def checkpoint(ctx: Context, container_id: str, name: str | None) -> dict[str, Any]:
    if name is not None:
        check_name(name)
    return client.ask(_running(ctx, container_id, "checkpoint"), container_id, "checkpoint",
                      name=name)


def rollback(ctx: Context, container_id: str, name: str) -> dict[str, Any]:
    check_name(name)
    return client.ask(_running(ctx, container_id, "rollback"), container_id, "rollback",
                      name=name)


def remove(ctx: Context, container_id: str, name: str) -> dict[str, Any]:
    check_name(name)
    state_dir = ctx.store.dir(container_id)
    ctx.store.load(container_id)
    if not (CheckpointStore(state_dir).dir / name).is_dir():
        raise ParacellError(f"container {container_id} has no checkpoint {name!r}")
    return client.ask(state_dir, container_id, "remove", name=name)


def listing(ctx: Context, container_id: str, fmt: str) -> str:
    ctx.store.load(container_id)
    found = CheckpointStore(ctx.store.dir(container_id)).all(
        lambda why: ctx.log.warning(why, to_stderr=True))
    rows = [{"name": c.name, "seq": c.seq, "parent": c.parent, "created": c.created,
             "pages_saved": c.pages_saved, "bytes": c.pages_saved * 4096} for c in found]
    if fmt == "json":
        return json.dumps(rows)
    lines = [f"{'NAME':<24} {'SEQ':>4} {'PARENT':>6} {'SAVED':>10}  CREATED"]
    for r in rows:
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(r["created"]))
        lines.append(f"{r['name']:<24} {r['seq']:>4} {r['parent'] or '-':>6} "
                     f"{r['bytes'] / 2**20:>8.1f}Mi  {when}")
    return "\n".join(lines)


FORK_MAX = 64
FAILURE_MAX = 1024  # bytes of a fork's failure, read back from its create
RUNNING = b"!"  # what a fork's create child says when its fork runs


def fork(ctx: Context, container_id: str, name: str | None, count: int,
         prefix: str | None, private_memory: bool = False,
         netns_paths: Sequence[str] = ()) -> list[str]:
    """COUNT new sandboxes that go on from a checkpoint (taken now without
    NAME), each its own container, made at the same time: their ids, in
    order. They share the checkpoint's memory unless `private_memory` or the
    host cannot (forking.may_share_memory). netns_paths: one network
    namespace per fork, whose interfaces its VM takes; without, a fork of a
    parent with interfaces has loopback only (docs/snapshots.md)."""
    import dataclasses

    from paracell.procfs import process_start_time
    from paracell.runtime.snapshots import forking
    from paracell.runtime.state.ids import check_id
    from paracell.vmm import backends

    if not 1 <= count <= FORK_MAX:
        raise ParacellError(f"--count must be 1..{FORK_MAX}")
    parent = ctx.store.load(container_id)
    status.transition("checkpoint", parent.status, container_id)
    _refuse_shared_fork(parent)
    shim_alive = parent.shim_pid > 0 and process_start_time(parent.shim_pid) == parent.shim_start
    try:
        networks = forking.network_plans(
            parent.vm.config.network, parent.vm.config.net_record,
            f"/proc/{parent.shim_pid}/ns/net" if shim_alive else "", count, list(netns_paths))
    except ParacellError as err:
        raise ParacellError(f"fork of {container_id}: {err}") from None
    if not backends.capabilities_of(parent.vm.config).snapshots:
        raise ParacellError(f"container {container_id}: its backend ({parent.vm.config.vmm}) "
                            "cannot fork a VM")
    if name is not None:
        CheckpointStore(ctx.store.dir(container_id)).load(check_name(name))
    ids = [f"{prefix if prefix is not None else container_id + '-fork-'}{i}"
           for i in range(1, count + 1)]
    for fid in ids:
        check_id(fid)
        if ctx.store.is_container_dir(fid):
            raise ParacellError(f"container {fid} exists already")
    if len(set(ids)) != len(ids):
        raise ParacellError("the forks' ids are not distinct")
    share = False
    if not private_memory:
        why = forking.may_share_memory(parent.vm.config)
        share = not why
        if why:
            ctx.log.warning(f"fork of {container_id}: each fork gets a copy of the "
                            f"checkpoint's memory: {why}")
    if name is None:
        name = checkpoint(ctx, container_id, None)["name"]
    sources = forking.source(ctx.store.dir(container_id), name, ids, share, networks)
    detached = dataclasses.replace(ctx, no_template=True)
    with _StdioToDevnull():
        return _create_together(ctx, detached, parent.bundle, sources)


def _create_together(ctx: Context, detached: Context, bundle: str,
                     sources: list[Any]) -> list[str]:
    """Every fork's create at once, each in a child of this process (forked,
    not exec'd: nothing to import again), so their VMs start in parallel.
    All of them or none: if one fails, the ones made go too, and the first
    failure is raised. SIGINT is held here meanwhile: a Ctrl-C reaches the
    children too (one process group), each ends its own create, and this
    process notes it, removes what was made, and only then takes it."""
    from paracell.runtime.verbs import lifecycle

    _load_ahead()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        children: dict[int, tuple[str, int]] = {}
        spawn_error: OSError | None = None
        for src in sources:
            try:
                pid, read_end = _spawn_create(ctx, detached, bundle, src, held)
            except OSError as err:
                spawn_error = err
                break
            children[pid] = (src.container_id, read_end)
        said = _reap(children)
        # What a child stopped halfway through its create left (its
        # directory, before the rename that names it): the children are gone.
        ctx.store.sweep_abandoned()
        interrupted = signal.SIGINT in signal.sigpending()
        running = [fid for fid, words in said.items() if words == RUNNING]
        if spawn_error is not None or interrupted or len(running) != len(sources):
            for pid, (fid, _) in children.items():
                if _made_by(ctx, fid, pid):
                    with contextlib.suppress(ParacellError):
                        lifecycle.delete(ctx, fid, force=True)
            if spawn_error is not None:
                raise ParacellError(f"starting the forks' creates: {spawn_error.strerror}")
            if interrupted:
                raise KeyboardInterrupt
            fid, words = next((f, w) for f, w in said.items() if f not in running)
            why = words.decode(errors="replace")
            raise ParacellError(f"fork {fid}: {why or 'its create ended without a word'}")
        return [src.container_id for src in sources]
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a held Ctrl-C is taken here


def _made_by(ctx: Context, container_id: str, pid: int) -> bool:
    """Whether the container is there and that create child made it: its
    state names its creator, so a container another caller made under the
    id meanwhile is never taken for a fork (nor one whose child was stopped
    between making it and saying so)."""
    try:
        return ctx.store.load(container_id).creator_pid == pid
    except ParacellError:
        return False


def _spawn_create(ctx: Context, detached: Context, bundle: str, src: Any,
                  mask: set[signal.Signals]) -> tuple[int, int]:
    """One fork's create in a child: (its pid, the read end of its pipe).
    The child writes RUNNING once its fork runs, or why it failed, and never
    returns into the caller's code."""
    from paracell.runtime.verbs import lifecycle

    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise
    if pid != 0:
        os.close(write_end)
        return pid, read_end
    try:
        try:
            os.close(read_end)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            lifecycle.create(detached, src.container_id, bundle, None, None, fork=src)
            mark_running(ctx, src.container_id)
            os.write(write_end, RUNNING)
        except BaseException as err:
            os.write(write_end, (str(err) or type(err).__name__).encode()[:FAILURE_MAX])
    finally:
        os._exit(0)


def _reap(children: dict[int, tuple[str, int]]) -> dict[str, bytes]:
    """What each create child said, read to its end (the child's exit), and
    the child reaped; with SIGINT held, nothing here is cut short."""
    said = {}
    for pid, (fid, read_end) in children.items():
        words = b""
        with os.fdopen(read_end, "rb") as pipe:
            while len(words) <= FAILURE_MAX + 1 and (chunk := pipe.read(FAILURE_MAX)):
                words += chunk
        with contextlib.suppress(ChildProcessError):  # a caller's own reaper took it
            os.waitpid(pid, 0)
        said[fid] = words
    return said


# What each fork's create and its shim import on their way (asyncio and the
# QMP client among them): about 130 modules, 40-90 ms of CPU per fork if each
# child loaded them for itself.
_CREATE_PATH_MODULES = (
    "paracell._native", "paracell.net.late", "paracell.pager.server",
    "paracell.runtime.agent.sandboxspec", "paracell.runtime.bundle.spec",
    "paracell.runtime.host.cgroups", "paracell.runtime.host.hooks",
    "paracell.runtime.host.hostside", "paracell.runtime.pod.pod", "paracell.runtime.vm.placement",
    "paracell.runtime.vm.shim", "paracell.runtime.vm.templating", "paracell.vmm.hostclock",
    "paracell.vmm.qemu.qmp", "paracell.vmm.qemu.snapshots", "paracell.xgate.admission",
    "paracell.xgate.support",
)


def _load_ahead() -> None:
    """Loads once, here, what every fork's create child would otherwise load
    for itself: the children are forked from this process and inherit it."""
    import importlib

    from paracell.vmm import memory, probe

    for name in _CREATE_PATH_MODULES:
        importlib.import_module(name)
    qemu = probe.probe_host().qemu_path  # remembers QEMU's version for them
    if qemu is not None:
        memory.plugin_loads(qemu)  # and whether it loads the RAM plugin


def mark_running(ctx: Context, container_id: str) -> None:
    """A fork or a restore: its init runs already, with no `start`."""
    with ctx.store.locked(container_id):
        state = ctx.store.load(container_id)
        state.status = status.transition("restored", state.status, container_id)
        ctx.store.save(state)


def runc_checkpoint(ctx: Context, container_id: str, image_path: str, work_path: str | None,
                    leave_running: bool) -> None:
    """runc's `checkpoint --image-path`: a checkpoint flattened into the image
    directory; the container stops after it unless --leave-running."""
    from paracell.runtime.agent.signals import SIGKILL
    from paracell.runtime.snapshots import images
    from paracell.runtime.verbs import kill

    state_dir = _running(ctx, container_id, "checkpoint")
    if not (state_dir / "snap.sock").exists():
        raise ParacellError(f"container {container_id} is not in snapshot mode (it needs the "
                            "annotation io.paracell.snapshot: \"on\" at create); ParaCell "
                            "checkpoints VMs, not processes, and uses no CRIU")
    done = checkpoint(ctx, container_id, None)
    store = CheckpointStore(state_dir)
    try:
        images.export(store, store.load(done["name"]), image_path)
    finally:
        client.ask(state_dir, container_id, "remove", name=done["name"])
    if work_path:
        images.write_log(work_path, "dump.log", f"paracell: checkpoint {done['name']} of "
                         f"{container_id} exported to {image_path}\n")
    if not leave_running:
        kill.deliver(ctx.store, container_id, SIGKILL, False, None)


def runc_restore(ctx: Context, container_id: str, image_path: str, work_path: str | None,
                 bundle: str, detach: bool, pid_file: str | None) -> None:
    """runc's `restore --image-path`: `restore_created`, running at once."""
    from paracell.runtime.snapshots import images

    if not detach:
        raise ParacellError("restore needs --detach: a restored container's stdio is /dev/null")
    with _StdioToDevnull():
        restore_created(ctx, container_id, image_path, bundle, pid_file)
    mark_running(ctx, container_id)
    if work_path:
        images.write_log(work_path, "restore.log", f"paracell: {container_id} restored from "
                         f"{image_path}\n")


def restore_created(ctx: Context, container_id: str, image_path: str, bundle: str,
                    pid_file: str | None) -> ContainerState:
    """A new container, from its bundle, that goes on from the image's
    checkpoint: created, its init already running in the guest, for
    `mark_running` once its client starts it. The image is read into a
    private directory of the root first (paracell/runtime/snapshots/images.py),
    and the fork goes on from that copy."""
    import dataclasses

    from paracell.runtime.bundle import spec
    from paracell.runtime.snapshots import forking, images
    from paracell.runtime.state.ids import check_id
    from paracell.runtime.verbs import lifecycle

    check_id(container_id)
    hostname = spec.load_bundle(bundle).config.get("hostname") or ""
    staging = ctx.store.scratch()
    try:
        store, disk = images.restore_source(image_path, staging / "image")
        source = forking.ForkSource(str(store.dir.parent), images.IMAGE_NAME, container_id,
                                    str(disk), wanted_hostname=hostname)
        return lifecycle.create(dataclasses.replace(ctx, no_template=True), container_id,
                                bundle, pid_file, None, fork=source)
    finally:
        images.discard(staging)


class _StdioToDevnull:
    """A fork's shim keeps the stdio it is given for its container's life; the
    forks' output goes nowhere, and the caller's own stdio stays free."""

    def __enter__(self) -> None:
        import os

        self.saved = [os.dup(fd) for fd in (0, 1, 2)]
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)

    def __exit__(self, *exc: object) -> None:
        import os

        for fd, copy in zip((0, 1, 2), self.saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)
