"""The processes one shim v2 serves, over the runtime's own verbs.

A task is a container (its init process) and its execs. Each is a host
process that stands for a process in the guest (runtime/vm/standin.py): the
container's shim or pod proxy, or an exec proxy. They are detached by the
verbs that make them and re-parented to this process, a subreaper, which
reaps them and so learns each exit status, as containerd's runc shim does
with runc's processes.

Everything that changes a container goes through the same verbs as the CLI
(runtime/verbs/): this module adds no create path and no state machine of
its own, only which process is which and who waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from paracell.errors import NotExistError, ParacellError
from paracell.runtime.agent.signals import exit_status_for_signal
from paracell.runtime.context import Context
from paracell.runtime.state import status
from paracell.shimv2 import rootfs, stdio

T = TypeVar("T")

MAX_EXECS_PER_TASK = 1024
MAX_TASKS = 256


class TaskError(ParacellError):
    """A refusal with the kind containerd's errdefs know it by."""

    kind = "unknown"


class NotFound(TaskError):
    kind = "not_found"


class AlreadyExists(TaskError):
    kind = "already_exists"


class FailedPrecondition(TaskError):
    kind = "failed_precondition"


class InvalidArgument(TaskError):
    kind = "invalid_argument"


# The runtime's statuses as containerd's Task API names them.
CREATED, RUNNING, STOPPED, PAUSED = "created", "running", "stopped", "paused"


@dataclass
class Process:
    container_id: str
    exec_id: str  # "" for the container's init
    paths: stdio.StdioPaths
    process_spec: dict[str, Any] | None = None  # an exec's, until it starts
    pid: int = 0
    exit_status: int | None = None
    exited_at: float = 0.0
    console: stdio.Console | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def started(self) -> bool:
        return self.pid > 0

    def finish(self, exit_status: int) -> None:
        self.exit_status, self.exited_at = exit_status, time.time()
        self.exited.set()


@dataclass
class Task:
    init: Process
    bundle: Path
    mounted_rootfs: Path | None
    execs: dict[str, Process] = field(default_factory=dict)
    # Made from a checkpoint image: its init runs in the guest already, and
    # Start only records it as running (runtime/verbs/snapshot.py).
    restored: bool = False


class Tasks:
    """The table of tasks, and the verbs that change it. Verbs that fork
    (create, exec) run one at a time on one thread: a fork from a process
    whose other threads hold locks would hand the child those locks held."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        # Told of every reaped process: the service publishes its TaskExit.
        self.on_exit: Callable[[Process], None] = lambda proc: None
        self.tasks: dict[str, Task] = {}
        self.by_pid: dict[int, Process] = {}
        # Processes of deleted tasks still ending (an exec whose VM just
        # went): reaped with no event, so that none is left a zombie.
        self.orphans: set[int] = set()
        self.forking = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fork")

    async def _in_thread(self, fn: Callable[[], T], forks: bool = False) -> T:
        if forks:
            return await asyncio.get_running_loop().run_in_executor(self.forking, fn)
        return await asyncio.to_thread(fn)

    # ---- lookup

    def task(self, container_id: str) -> Task:
        try:
            return self.tasks[container_id]
        except KeyError:
            raise NotFound(f"container {container_id}: not found") from None

    def process(self, container_id: str, exec_id: str) -> Process:
        task = self.task(container_id)
        if not exec_id:
            return task.init
        try:
            return task.execs[exec_id]
        except KeyError:
            raise NotFound(f"process {exec_id} of {container_id}: not found") from None

    def status_of(self, proc: Process) -> str:
        if proc.exit_status is not None:
            return STOPPED
        if not proc.started:
            return CREATED
        if proc.exec_id:
            return RUNNING
        try:
            now = self.ctx.store.load(proc.container_id).status
        except ParacellError:
            return STOPPED
        return {status.PAUSED: PAUSED, status.CREATED: CREATED}.get(now, RUNNING)

    # ---- reaping

    def reap(self) -> None:
        """Reaps the processes this shim serves that have ended. Only those:
        the verbs' own children (the hooks' subprocesses, a spawn's first
        fork) are theirs to wait for."""
        for pid in list(self.orphans):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            self.orphans.discard(pid)
        for pid in list(self.by_pid):
            try:
                done, raw = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, raw = pid, -1  # not ours after all: it is gone either way
            if done != pid:
                continue
            proc = self.by_pid.pop(pid)
            if raw == -1:
                code = exit_status_for_signal(signal.SIGKILL)
            elif os.WIFSIGNALED(raw):
                code = exit_status_for_signal(os.WTERMSIG(raw))
            else:
                code = os.WEXITSTATUS(raw)
            proc.finish(code)
            self.on_exit(proc)

    def _track(self, proc: Process, pid: int) -> None:
        proc.pid = pid
        self.by_pid[pid] = proc
        # It may have ended before we knew its pid: its SIGCHLD came early.
        self.reap()

    # ---- verbs

    async def create(self, container_id: str, bundle: Path, mounts: list[rootfs.RootMount],
                     paths: stdio.StdioPaths, checkpoint: str = "") -> Process:
        """A new container; from `checkpoint`, a checkpoint image of a
        snapshot-mode container, when given (containerd's restore)."""
        from paracell.runtime.state.ids import check_id
        from paracell.runtime.verbs import lifecycle, snapshot

        try:
            check_id(container_id)
        except ParacellError as err:
            raise InvalidArgument(str(err)) from None
        if container_id in self.tasks:
            raise AlreadyExists(f"container {container_id}: already exists")
        if len(self.tasks) >= MAX_TASKS:
            raise FailedPrecondition(f"this shim serves {MAX_TASKS} tasks at most")
        paths.check()
        proc = Process(container_id, "", paths)

        def work() -> tuple[int, Path | None, stdio.Console | None]:
            mounted = rootfs.mount(mounts, bundle)

            made = []

            def make(ctx: Context, sock: str | None) -> int:
                if checkpoint:
                    pid = snapshot.restore_created(ctx, container_id, checkpoint, str(bundle),
                                                   None).shim_pid
                else:
                    pid = lifecycle.create(ctx, container_id, str(bundle), None, sock).shim_pid
                made.append(pid)
                return pid

            try:
                pid, console = self._spawn(paths, make)
            except BaseException:
                # A container made before its terminal failed goes too; never
                # one this create did not make (an ID that exists already).
                if made:
                    with contextlib.suppress(ParacellError):
                        lifecycle.delete(self.ctx, container_id, force=True)
                if mounted is not None:
                    rootfs.unmount(mounted)
                raise
            return pid, mounted, console

        pid, mounted, proc.console = await self._in_thread(work, forks=True)
        self.tasks[container_id] = Task(proc, bundle, mounted, restored=bool(checkpoint))
        if proc.console is not None:
            proc.console.start()
        self._track(proc, pid)
        return proc

    def _spawn(self, paths: stdio.StdioPaths,
               make: Callable[[Context, str | None], int]) -> tuple[int, stdio.Console | None]:
        """Runs a verb that spawns a stand-in with the task's stdio: the
        FIFOs as its fds 0-2, or a terminal whose master comes back here."""
        if paths.terminal:
            sock = stdio.ConsoleSocket()
            try:
                ctx = dataclasses.replace(self.ctx, stdio=None)
                pid = make(ctx, sock.path)
                try:
                    return pid, stdio.Console(sock.receive(), paths)
                except ParacellError:
                    # Made but unreachable: it must not run on untracked.
                    os.kill(pid, signal.SIGKILL)
                    raise
            finally:
                sock.close()
        pipes = stdio.open_pipes(paths)
        try:
            return make(dataclasses.replace(self.ctx, stdio=pipes.fds), None), None
        finally:
            pipes.close()

    async def start(self, container_id: str, exec_id: str) -> Process:
        from paracell.runtime.verbs import execproc, lifecycle, snapshot

        proc = self.process(container_id, exec_id)
        if not exec_id:
            if self.task(container_id).restored:
                await self._in_thread(lambda: snapshot.mark_running(self.ctx, container_id))
            else:
                await self._in_thread(lambda: lifecycle.start(self.ctx, container_id))
            return proc
        if proc.started:
            raise FailedPrecondition(f"process {exec_id}: already started")
        spec = proc.process_spec
        assert spec is not None
        pid, proc.console = await self._in_thread(lambda: self._spawn(
            proc.paths, lambda ctx, sock: execproc.spawn_exec(ctx, container_id, spec, sock)),
            forks=True)
        if proc.console is not None:
            proc.console.start()
        self._track(proc, pid)
        return proc

    async def add_exec(self, container_id: str, exec_id: str, process: dict[str, Any],
                       paths: stdio.StdioPaths) -> Process:
        from paracell.runtime.state.ids import check_id
        from paracell.runtime.verbs import execproc

        task = self.task(container_id)
        try:
            check_id(exec_id)
        except ParacellError as err:
            raise InvalidArgument(f"exec id: {err}") from None
        if exec_id in task.execs:
            raise AlreadyExists(f"process {exec_id}: already exists")
        if len(task.execs) >= MAX_EXECS_PER_TASK:
            raise FailedPrecondition(f"container {container_id} has {MAX_EXECS_PER_TASK} "
                                     "execs already")
        if task.init.exit_status is not None:
            raise FailedPrecondition(f"container {container_id} is not running")
        paths.check()
        if bool(process.get("terminal")) != paths.terminal:
            process = dict(process, terminal=paths.terminal)
        checked = execproc.checked_process(self.ctx, container_id, process,
                                           "the exec's process")
        proc = Process(container_id, exec_id, paths, process_spec=checked)
        task.execs[exec_id] = proc
        return proc

    async def kill(self, container_id: str, exec_id: str, sig: int, all_processes: bool) -> None:
        from paracell.runtime.verbs import kill

        if not 0 < sig < 65:
            raise InvalidArgument(f"signal {sig} is out of range")
        proc = self.process(container_id, exec_id)
        if proc.exit_status is not None:
            raise NotFound("process already finished")
        if exec_id:
            if not proc.started:
                raise FailedPrecondition(f"process {exec_id}: not started")
            # As runc's shim signals an exec: its host process, which relays.
            os.kill(proc.pid, sig)
            return
        try:
            await self._in_thread(lambda: kill.kill(self.ctx, container_id, sig, all_processes))
        except NotExistError:
            raise NotFound("process already finished") from None

    async def delete(self, container_id: str, exec_id: str) -> Process:
        from paracell.runtime.verbs import lifecycle

        task = self.task(container_id)
        proc = self.process(container_id, exec_id)
        if exec_id:
            if proc.started and proc.exit_status is None:
                raise FailedPrecondition(f"process {exec_id} is still running")
            del task.execs[exec_id]
            if proc.console is not None:
                proc.console.close()
            return proc
        if proc.started and proc.exit_status is None and self.status_of(proc) != CREATED:
            raise FailedPrecondition(f"cannot delete container {container_id}: it is running")

        def work() -> None:
            # force: a created container may go, as runc allows, and a record
            # whose shim this process has reaped reads stopped either way.
            with contextlib.suppress(NotExistError):
                lifecycle.delete(self.ctx, container_id, force=True)
            if task.mounted_rootfs is not None:
                rootfs.unmount(task.mounted_rootfs)

        await self._in_thread(work)
        for other in [*task.execs.values(), proc]:
            if other.console is not None:
                other.console.close()
            if self.by_pid.pop(other.pid, None) is not None:
                self.orphans.add(other.pid)
        self.reap()
        if proc.exit_status is None:
            # Never started, or killed with the VM just now: it exited here.
            proc.finish(exit_status_for_signal(signal.SIGKILL))
        del self.tasks[container_id]
        return proc

    async def checkpoint(self, container_id: str, image_path: str, work_path: str,
                         leave_running: bool) -> None:
        """runc's checkpoint of a snapshot-mode container: its whole VM, into
        an image containerd archives (runtime/verbs/snapshot.py)."""
        from paracell.runtime.verbs import pause, snapshot

        task = self.task(container_id)
        # containerd pauses a task before it checkpoints it. ParaCell's
        # checkpoint quiesces the guest through its agent, which a stopped
        # VM cannot answer: the VM runs for the checkpoint and is paused again.
        paused = self.status_of(task.init) == PAUSED

        def work() -> None:
            if paused:
                pause.resume(self.ctx, container_id)
            try:
                snapshot.runc_checkpoint(self.ctx, container_id, image_path, work_path or None,
                                         leave_running)
            finally:
                if paused and leave_running:
                    pause.pause(self.ctx, container_id)

        await self._in_thread(work)

    async def set_paused(self, container_id: str, paused: bool) -> None:
        from paracell.runtime.verbs import pause

        self.task(container_id)
        verb = pause.pause if paused else pause.resume
        await self._in_thread(lambda: verb(self.ctx, container_id))

    async def update(self, container_id: str, resources: dict[str, Any]) -> list[str]:
        from paracell.runtime.verbs import update

        self.task(container_id)
        return await self._in_thread(
            lambda: update.update_resources(self.ctx, container_id, resources))

    async def pids(self, container_id: str) -> list[int]:
        from paracell.runtime.verbs import query

        self.task(container_id)
        state = await self._in_thread(lambda: self.ctx.store.load(container_id))
        return query.host_pids(self.ctx, state)

    async def stats(self, container_id: str) -> tuple[dict[str, Any], int]:
        """runc's stats of the container, as `paracell events --stats` reads
        them (a pod member's are its own cgroup's in the pod's VM), and the
        cgroup version they are in."""
        from paracell.runtime.verbs import events

        self.task(container_id)

        def work() -> tuple[dict[str, Any], int]:
            state = self.ctx.store.load(container_id)
            return (events.stats(self.ctx, container_id)["data"],
                    events.figures_cgroup_version(state))

        return await self._in_thread(work)

    async def oom_kills(self, container_id: str) -> int:
        """OOM kills of the container so far (-1: none to read)."""
        from paracell.runtime.verbs import events

        return await self._in_thread(lambda: events.oom_kills(self.ctx, container_id))

    def close_stdin(self, container_id: str, exec_id: str) -> None:
        """The FIFO's writer closing is the container's EOF: the stand-in
        reads the FIFO itself. A terminal's copy ends at the same EOF."""
        self.process(container_id, exec_id)

    def resize(self, container_id: str, exec_id: str, width: int, height: int) -> None:
        proc = self.process(container_id, exec_id)
        if proc.console is None:
            raise FailedPrecondition("the process has no terminal")
        proc.console.resize(width, height)

    def shutdown(self) -> None:
        self.forking.shutdown(wait=False)
