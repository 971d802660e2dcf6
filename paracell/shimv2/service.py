"""containerd's Task service (containerd.task.v2.Task) over the task table:
each method decodes its request, asks `tasks.Tasks`, publishes the event
containerd expects, and encodes the answer. Errors leave as ttrpc statuses
whose codes containerd's errdefs map back (not found, already exists...)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from google.protobuf import empty_pb2, timestamp_pb2

from paracell.errors import ParacellError
from paracell.shimv2 import messages, metrics, rootfs, stdio
from paracell.shimv2.events import Publisher
from paracell.shimv2.tasks import Process, TaskError, Tasks
from paracell.shimv2.ttrpc import Code, TtrpcError, current_call

MAX_SPEC_BYTES = 1 << 20
# Delete waits this long at most for the last look after the init's exit
# (a STATS round trip, which times out in 10 s).
OOM_LAST_LOOK_S = 12.0
SHIM_VERSION = "paracell-shimv2-1"

api = messages.task_api
types = messages.task_types
events = messages.task_events

STATUS = {"created": types.CREATED, "running": types.RUNNING, "stopped": types.STOPPED,
          "paused": types.PAUSED}
CODES = {"not_found": Code.NOT_FOUND, "already_exists": Code.ALREADY_EXISTS,
         "failed_precondition": Code.FAILED_PRECONDITION,
         "invalid_argument": Code.INVALID_ARGUMENT}


def timestamp(at: float) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    if at:
        stamp.FromNanoseconds(int(at * 1e9))
    return stamp


def _json_any(value: Any, what: str) -> dict[str, Any]:
    """containerd sends OCI structs (a Process, LinuxResources) as Any holding JSON."""
    if len(value.value) > MAX_SPEC_BYTES:
        raise TtrpcError(Code.INVALID_ARGUMENT, f"{what}: longer than {MAX_SPEC_BYTES} bytes")
    try:
        data = json.loads(value.value)
    except ValueError as err:
        raise TtrpcError(Code.INVALID_ARGUMENT, f"{what}: not JSON: {err}") from None
    if not isinstance(data, dict):
        raise TtrpcError(Code.INVALID_ARGUMENT, f"{what}: not a JSON object")
    return data


class TaskService:
    def __init__(self, tasks: Tasks, publisher: Publisher, namespace: str,
                 shutdown: Callable[[], None]) -> None:
        self.tasks = tasks
        self.publisher = publisher
        self.namespace = namespace
        self._shutdown = shutdown
        self.oom_watchers: dict[str, asyncio.Task[None]] = {}

    def methods(self) -> dict[str, tuple[type, Callable[[Any], Awaitable[Any]]]]:
        """Method name -> (request class, handler), for ttrpc.Server."""
        return {
            "State": (api.StateRequest, self.state),
            "Create": (api.CreateTaskRequest, self.create),
            "Start": (api.StartRequest, self.start),
            "Delete": (api.DeleteRequest, self.delete),
            "Pids": (api.PidsRequest, self.pids),
            "Pause": (api.PauseRequest, self.pause),
            "Resume": (api.ResumeRequest, self.resume),
            "Checkpoint": (api.CheckpointTaskRequest, self.checkpoint),
            "Kill": (api.KillRequest, self.kill),
            "Exec": (api.ExecProcessRequest, self.exec),
            "ResizePty": (api.ResizePtyRequest, self.resize_pty),
            "CloseIO": (api.CloseIORequest, self.close_io),
            "Update": (api.UpdateTaskRequest, self.update),
            "Wait": (api.WaitRequest, self.wait),
            "Stats": (api.StatsRequest, self.stats),
            "Connect": (api.ConnectRequest, self.connect),
            "Shutdown": (api.ShutdownRequest, self.shutdown),
        }

    def wrap(self, handler: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
        """The runtime's refusals as the statuses containerd expects."""
        async def call(request: Any) -> Any:
            try:
                return await handler(request)
            except TaskError as err:
                raise TtrpcError(CODES.get(err.kind, Code.UNKNOWN), str(err)) from None
            except ParacellError as err:
                raise TtrpcError(Code.UNKNOWN, str(err)) from None
            except OSError as err:
                raise TtrpcError(Code.UNKNOWN, f"{err.filename or ''}: {err.strerror}") \
                    from None
        return call

    def _publish(self, event: Any) -> None:
        self.publisher.publish(event)

    def exited(self, proc: Process) -> None:
        """The reaper's news: containerd learns every exit from this event."""
        self._publish(events.TaskExit(
            container_id=proc.container_id, id=proc.exec_id or proc.container_id,
            pid=proc.pid, exit_status=proc.exit_status or 0,
            exited_at=timestamp(proc.exited_at)))

    async def _watch_oom(self, container_id: str, init: Process) -> None:
        """TaskOOM when the container's OOM kills grew from its start to its
        init's exit, which an OOM kill may have caused: containerd's CRI then
        reports the container OOMKilled. Read at those two moments only: the
        guest reports nothing unasked, and each read wakes it (docs/shim-v2.md,
        "TaskOOM")."""
        # A new container's group starts at 0, read before its init could
        # have been killed; a restored one's count came with the checkpoint.
        try:
            task = self.tasks.tasks.get(container_id)
            seen = max(await self.tasks.oom_kills(container_id), 0) \
                if task is not None and task.restored else 0
            await init.exited.wait()
            if await self.tasks.oom_kills(container_id) > seen:
                self._publish(events.TaskOOM(container_id=container_id))
        finally:
            if self.oom_watchers.get(container_id) is asyncio.current_task():
                del self.oom_watchers[container_id]

    async def _last_oom_look(self, container_id: str) -> None:
        """Before a Delete: the watcher's look after the exit has been had,
        so a TaskOOM goes before the TaskDelete."""
        task = self.tasks.tasks.get(container_id)
        if task is None or not task.init.exited.is_set():
            return  # the Delete refuses a running init; the watcher goes on
        watcher = self.oom_watchers.pop(container_id, None)
        if watcher is not None:
            await asyncio.wait({watcher}, timeout=OOM_LAST_LOOK_S)
            watcher.cancel()

    # ---- the methods

    async def create(self, req: Any) -> Any:
        if req.parent_checkpoint:
            raise TtrpcError(Code.UNIMPLEMENTED, "a checkpoint's parent is not supported: "
                             "ParaCell's checkpoint images are whole")
        # Before anything is mounted: an empty bundle would be the daemon's own directory.
        if not os.path.isabs(req.bundle):
            raise TtrpcError(Code.INVALID_ARGUMENT, "bundle: must be an absolute path")
        if req.checkpoint and not os.path.isabs(req.checkpoint):
            raise TtrpcError(Code.INVALID_ARGUMENT, "checkpoint: must be an absolute path")
        bundle = Path(req.bundle)
        mounts = [rootfs.RootMount(m.type, m.source, tuple(m.options)) for m in req.rootfs]
        paths = stdio.StdioPaths(req.stdin, req.stdout, req.stderr, req.terminal)
        proc = await self.tasks.create(req.id, bundle, mounts, paths, req.checkpoint)
        self._publish(events.TaskCreate(
            container_id=req.id, bundle=req.bundle, rootfs=list(req.rootfs),
            io=events.TaskIO(stdin=req.stdin, stdout=req.stdout, stderr=req.stderr,
                             terminal=req.terminal),
            checkpoint=req.checkpoint, pid=proc.pid))
        return api.CreateTaskResponse(pid=proc.pid)

    async def start(self, req: Any) -> Any:
        proc = await self.tasks.start(req.id, req.exec_id)
        if req.exec_id:
            self._publish(events.TaskExecStarted(
                container_id=req.id, exec_id=req.exec_id, pid=proc.pid))
        else:
            self._publish(events.TaskStart(container_id=req.id, pid=proc.pid))
            self.oom_watchers[req.id] = asyncio.create_task(self._watch_oom(req.id, proc))
        return api.StartResponse(pid=proc.pid)

    async def delete(self, req: Any) -> Any:
        if not req.exec_id:
            await self._last_oom_look(req.id)
        proc = await self.tasks.delete(req.id, req.exec_id)
        if not req.exec_id:
            self._publish(events.TaskDelete(
                container_id=req.id, pid=proc.pid, exit_status=proc.exit_status or 0,
                exited_at=timestamp(proc.exited_at), id=req.id))
        return api.DeleteResponse(pid=proc.pid, exit_status=proc.exit_status or 0,
                                  exited_at=timestamp(proc.exited_at))

    async def state(self, req: Any) -> Any:
        proc = self.tasks.process(req.id, req.exec_id)
        task = self.tasks.task(req.id)
        return api.StateResponse(
            id=req.exec_id or req.id, bundle=str(task.bundle), pid=proc.pid,
            status=STATUS[self.tasks.status_of(proc)], stdin=proc.paths.stdin,
            stdout=proc.paths.stdout, stderr=proc.paths.stderr, terminal=proc.paths.terminal,
            exit_status=proc.exit_status or 0, exited_at=timestamp(proc.exited_at),
            exec_id=req.exec_id)

    async def pids(self, req: Any) -> Any:
        pids = await self.tasks.pids(req.id)
        return api.PidsResponse(processes=[types.ProcessInfo(pid=pid) for pid in pids])

    async def pause(self, req: Any) -> Any:
        await self.tasks.set_paused(req.id, True)
        self._publish(events.TaskPaused(container_id=req.id))
        return empty_pb2.Empty()

    async def resume(self, req: Any) -> Any:
        await self.tasks.set_paused(req.id, False)
        self._publish(events.TaskResumed(container_id=req.id))
        return empty_pb2.Empty()

    async def checkpoint(self, req: Any) -> Any:
        """A snapshot-mode container's whole VM, as `paracell checkpoint
        --image-path` saves it, into the directory containerd archives (or
        the options' image path). containerd passes runc's options."""
        options = messages.runc_options.CheckpointOptions()
        if req.options.type_url:
            try:
                options = messages.unpack_any(req.options, messages.runc_options.CheckpointOptions)
            except ValueError as err:
                raise TtrpcError(Code.INVALID_ARGUMENT, f"checkpoint options: {err}") from None
        path = options.image_path or req.path
        for what, value in (("checkpoint path", path), ("work path", options.work_path)):
            if (value or what == "checkpoint path") and not os.path.isabs(value):
                raise TtrpcError(Code.INVALID_ARGUMENT, f"{what}: must be an absolute path")
        await self.tasks.checkpoint(req.id, path, options.work_path, not options.exit)
        return empty_pb2.Empty()

    async def kill(self, req: Any) -> Any:
        await self.tasks.kill(req.id, req.exec_id, req.signal, req.all)
        return empty_pb2.Empty()

    async def exec(self, req: Any) -> Any:
        if not req.exec_id:
            raise TtrpcError(Code.INVALID_ARGUMENT, "exec: an exec id is required")
        process = _json_any(req.spec, "the exec's process")
        paths = stdio.StdioPaths(req.stdin, req.stdout, req.stderr, req.terminal)
        await self.tasks.add_exec(req.id, req.exec_id, process, paths)
        self._publish(events.TaskExecAdded(container_id=req.id,
                                                                exec_id=req.exec_id))
        return empty_pb2.Empty()

    async def resize_pty(self, req: Any) -> Any:
        self.tasks.resize(req.id, req.exec_id, req.width, req.height)
        return empty_pb2.Empty()

    async def close_io(self, req: Any) -> Any:
        self.tasks.close_stdin(req.id, req.exec_id)
        return empty_pb2.Empty()

    async def update(self, req: Any) -> Any:
        resources = _json_any(req.resources, "resources")
        for notice in await self.tasks.update(req.id, resources):
            self.tasks.ctx.log.warning(f"update {req.id}: {notice}")
        return empty_pb2.Empty()

    async def wait(self, req: Any) -> Any:
        proc = self.tasks.process(req.id, req.exec_id)
        # A caller that went away (containerd restarted) stops the wait: it
        # would hold a call slot until the process ended.
        gone = asyncio.ensure_future(current_call().peer_closed.wait())
        exited = asyncio.ensure_future(proc.exited.wait())
        try:
            await asyncio.wait({gone, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            exited.cancel()
        if not proc.exited.is_set():
            raise TtrpcError(Code.CANCELLED, "the caller went away")
        return api.WaitResponse(exit_status=proc.exit_status or 0,
                                exited_at=timestamp(proc.exited_at))

    async def stats(self, req: Any) -> Any:
        data, version = await self.tasks.stats(req.id)
        convert = metrics.v2_metrics if version == 2 else metrics.v1_metrics
        return api.StatsResponse(stats=messages.pack_any(convert(data)))

    async def connect(self, req: Any) -> Any:
        task = self.tasks.task(req.id)
        return api.ConnectResponse(shim_pid=os.getpid(), task_pid=task.init.pid,
                                   version=SHIM_VERSION)

    async def shutdown(self, req: Any) -> Any:
        # containerd asks after each task it deletes; the pod's shim stays
        # for as long as it serves any task.
        if not self.tasks.tasks:
            self._shutdown()
        return empty_pb2.Empty()
