"""The SDK's sandbox: create or connect, run commands, read and write files,
checkpoint, roll back, fork and kill, all from this process: commands go over
the sandbox's own channel (session.py), the rest through the runtime's verbs
in-process. Errors are the typed exceptions of errors.py (docs/sdk.md)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from paracell.errors import NotExistError, ParacellError
from paracell.sandbox import errors, session
from paracell.sandbox.files import Files
from paracell.settings import DEFAULT_ROOT

RUNNING = "running"


@contextlib.contextmanager
def _typed(container_id: str) -> Iterator[None]:
    """The runtime's one-line errors as the SDK's exceptions."""
    try:
        yield
    except errors.SandboxError:
        raise
    except NotExistError:
        raise errors.SandboxNotFound(f"sandbox {container_id} does not exist") from None
    except ParacellError as err:
        raise errors.SandboxError(str(err)) from None


def _with_snapshot_mode(bundle_dir: str, snapshot: bool) -> str | None:
    """A private bundle whose config asks for snapshot mode (or not), its
    rootfs the original's by absolute path; None when the bundle says so
    already. The caller's bundle is never written."""
    from paracell.runtime.bundle import snapshotmode
    from paracell.runtime.bundle.spec import MAX_CONFIG_BYTES, read_json_file

    config = read_json_file(os.path.join(bundle_dir, "config.json"), MAX_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise errors.SandboxError(f"{bundle_dir}/config.json: not a JSON object")
    annotations = config.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise errors.SandboxError(f"{bundle_dir}/config.json: annotations must be an object")
    if (annotations.get(snapshotmode.ANNOTATION) == "on") == snapshot:
        return None
    root = config.get("root") if isinstance(config.get("root"), dict) else {}
    rootfs = str(root.get("path") or "rootfs")
    config["root"] = {**root, "path": os.path.join(bundle_dir, rootfs)}
    config["annotations"] = {**annotations, snapshotmode.ANNOTATION: "on" if snapshot else "off"}
    derived = tempfile.mkdtemp(prefix="paracell-sdk-bundle-")
    with open(os.path.join(derived, "config.json"), "w") as f:
        json.dump(config, f)
    return derived


class Sandbox:
    """A container of the runtime, by its id and state root (runc's --root).
    `Sandbox(id)` and `Sandbox.connect(id)` name one that exists;
    `Sandbox.create(bundle)` makes and starts one. As a context manager, a
    sandbox this process created is killed at the end."""

    def __init__(self, container_id: str, root: str = DEFAULT_ROOT) -> None:
        self.id, self.root = container_id, os.path.abspath(root)
        self._created = False
        self._private_bundle: str | None = None
        self.files = Files(self.run)

    # ---- making and finding

    @classmethod
    def create(cls, bundle: str, container_id: str | None = None, root: str = DEFAULT_ROOT,
               snapshot: bool | None = None) -> Sandbox:
        """Creates and starts a sandbox from an OCI bundle. snapshot=True or
        False overrides the bundle's io.paracell.snapshot annotation; its
        process's stdio is /dev/null."""
        from paracell.runtime.verbs import lifecycle

        box = cls(container_id or f"sandbox-{secrets.token_hex(6)}", root)
        bundle_dir = os.path.abspath(bundle)
        with _typed(box.id):
            if snapshot is not None:
                box._private_bundle = _with_snapshot_mode(bundle_dir, snapshot)
            null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            try:
                ctx = box._ctx(stdio=(null, null, null))
                lifecycle.create(ctx, box.id, box._private_bundle or bundle_dir, None, None)
                box._created = True
                lifecycle.start(ctx, box.id)
            except BaseException:
                box.kill()
                raise
            finally:
                os.close(null)
        return box

    @classmethod
    def connect(cls, container_id: str, root: str = DEFAULT_ROOT) -> Sandbox:
        box = cls(container_id, root)
        box.status()
        return box

    def status(self) -> str:
        """runc's status word: created, running, paused, stopped."""
        with _typed(self.id):
            return self._ctx().store.load(self.id).status

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._created:
            self.kill()

    def kill(self) -> None:
        """Kills the sandbox and removes it, VM, state and all."""
        from paracell.runtime.verbs import lifecycle

        try:
            with _typed(self.id):
                lifecycle.delete(self._ctx(), self.id, force=True)
        finally:
            if self._private_bundle:
                shutil.rmtree(self._private_bundle, ignore_errors=True)
                self._private_bundle = None

    # ---- commands

    def start(self, cmd: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: str | None = None, stdin: bool = False) -> session.Process:
        """Starts a command and returns at once: read its `stdout` and
        `stderr` as it runs, write() its stdin (stdin=True), wait() or kill()
        it. It dies with this process."""
        from paracell.runtime.agent import channel
        from paracell.runtime.bundle import spec
        from paracell.runtime.verbs import execproc

        ctx = self._ctx()
        with _typed(self.id):
            now = ctx.store.load(self.id).status
            if now != RUNNING:
                raise errors.SandboxNotRunning(f"sandbox {self.id} is {now}")
            process = execproc.process_from_args(
                ctx, self.id, None, tuple(cmd), False, cwd,
                tuple(f"{k}={v}" for k, v in (env or {}).items()), None, (), False, ())
            launch = spec.exec_launch_spec(self.id, process)
            socket_path = execproc.session_socket(ctx, self.id)
            try:
                conn, _ = channel.open_process(socket_path, launch, False, None)
            except channel.SessionEnded as ended:
                raise errors.SessionEnded(str(ended)) from None
            except OSError as err:
                raise errors.SandboxNotRunning(
                    f"sandbox {self.id}: its shim is not reachable: {err.strerror}") from None
            try:
                return session.Process(conn, stdin)
            except BaseException:
                conn.close()
                raise

    def run(self, cmd: Sequence[str], timeout: float | None = None,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            stdin: bytes | None = None,
            max_output: int = session.DEFAULT_MAX_OUTPUT) -> session.Result:
        """Runs a command to its end: its stdout, stderr and exit code.
        Killed, with CommandTimeout, after `timeout` seconds; with
        OutputTooLarge past max_output bytes on either stream."""
        proc = self.start(cmd, env, cwd, stdin is not None)
        return session.run_to_end(proc, stdin, timeout, max_output)

    def spawn(self, cmd: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: str | None = None) -> int:
        """A background command that outlives this process, as `paracell
        exec --detach` makes one: the pid of its host relay."""
        from paracell.runtime.verbs import execproc

        ctx = self._ctx()
        with _typed(self.id):
            process = execproc.process_from_args(
                ctx, self.id, None, tuple(cmd), False, cwd,
                tuple(f"{k}={v}" for k, v in (env or {}).items()), None, (), False, ())
            null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            try:
                ctx.stdio = (null, null, null)
                return execproc.spawn_exec(ctx, self.id, process, None, detach=True)
            finally:
                os.close(null)

    # ---- snapshots (docs/snapshots.md)

    def checkpoint(self, name: str | None = None) -> dict[str, Any]:
        """Pauses, saves what changed since the last checkpoint, resumes."""
        from paracell.runtime.verbs import snapshot

        with _typed(self.id):
            return snapshot.checkpoint(self._ctx(), self.id, name)

    def rollback(self, name: str) -> dict[str, Any]:
        """Back to a checkpoint; running commands end (SessionEnded)."""
        from paracell.runtime.verbs import snapshot

        with _typed(self.id):
            return snapshot.rollback(self._ctx(), self.id, name)

    def fork(self, name: str | None = None, count: int = 1,
             id_prefix: str | None = None, private_memory: bool = False,
             netns: Sequence[str] = ()) -> list[Sandbox]:
        """COUNT new sandboxes that go on from the checkpoint (or from now),
        made at once. They share its memory copy-on-write and cannot be
        checkpointed themselves, unless `private_memory`. netns: one network
        namespace path per fork (a CRI or podman sandbox's), whose interfaces
        its VM takes; without, a fork of a sandbox with interfaces has
        loopback only."""
        from paracell.runtime.verbs import snapshot

        if isinstance(netns, str):  # one path would otherwise read as its characters
            raise errors.SandboxError("netns: a list of paths, one per fork")
        with _typed(self.id):
            ids = snapshot.fork(self._ctx(), self.id, name, count, id_prefix, private_memory,
                                list(netns))
        return [Sandbox(i, self.root) for i in ids]

    def checkpoints(self) -> list[dict[str, Any]]:
        from paracell.runtime.verbs import snapshot

        with _typed(self.id):
            return json.loads(snapshot.listing(self._ctx(), self.id, "json"))

    def remove(self, name: str) -> None:
        from paracell.runtime.verbs import snapshot

        with _typed(self.id):
            snapshot.remove(self._ctx(), self.id, name)

    @property
    def state_dir(self) -> Path:
        return Path(self.root) / self.id

    def _ctx(self, stdio: tuple[int, int, int] | None = None) -> Any:
        from paracell.log import RuntimeLog
        from paracell.runtime.context import Context

        return Context(root=self.root, log=RuntimeLog(None, "text", False), stdio=stdio)
