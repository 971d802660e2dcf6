"""`paracell exec`: another process in a running container.

Each exec gets a host proxy process: its pid is what --pid-file gets, it
relays the process's stdio and the signals it receives, and it exits with the
process's status, so containerd can reap and signal it like a runc exec.
"""

from __future__ import annotations

import copy
import os
import socket
from pathlib import Path
from typing import Any

from paracell.errors import ParacellError
from paracell.procfs import process_start_time, same_process
from paracell.runtime.agent import channel
from paracell.runtime.agent.console import NEED_CONSOLE_SOCKET
from paracell.runtime.bundle import spec
from paracell.runtime.bundle.spec import read_json_file
from paracell.runtime.configcheck import ConfigError
from paracell.runtime.context import Context
from paracell.runtime.pod import pod
from paracell.runtime.state import status
from paracell.runtime.state.store import CONTROL_SOCKET
from paracell.runtime.verbs.lifecycle import wait_child, write_pid_file
from paracell.runtime.vm import spawn, standin

MAX_PROCESS_JSON = 1 << 20
EXECS_DIR = "execs"


def _load_process_file(path: str) -> dict[str, Any]:
    process = read_json_file(path, MAX_PROCESS_JSON)
    if not isinstance(process, dict):
        raise ParacellError(f"{path}: the process must be a JSON object")
    return process


def _parse_user(user: str) -> dict[str, int]:
    uid, _, gid = user.partition(":")
    try:
        return {"uid": int(uid), "gid": int(gid or 0)}
    except ValueError:
        raise ParacellError(f"invalid --user {user!r}: use UID[:GID]") from None


def _container_process(ctx: Context, container_id: str) -> dict[str, Any]:
    """The container's own process object, from its bundle, or {}."""
    state = ctx.store.load(container_id)
    try:
        base = read_json_file(Path(state.bundle) / "config.json", spec.MAX_CONFIG_BYTES)
        process = base["process"]
    except (ParacellError, KeyError, TypeError):
        return {}
    return process if isinstance(process, dict) else {}


def process_from_args(
    ctx: Context, container_id: str, process_file: str | None, command: tuple[str, ...],
    tty: bool, cwd: str | None, env: tuple[str, ...], user: str | None,
    additional_gids: tuple[int, ...], no_new_privs: bool, caps: tuple[str, ...],
) -> dict[str, Any]:
    if process_file:
        process = _load_process_file(process_file)
        if "capabilities" not in process:
            # runc gives such an exec the container's own sets, not none.
            inherited = _container_process(ctx, container_id).get("capabilities")
            if inherited is not None:
                process["capabilities"] = inherited
    else:
        if not command:
            raise ParacellError("exec: a command or --process is required")
        base = _container_process(ctx, container_id)
        # runc starts from the container's own process and overrides what was given.
        process = copy.deepcopy(base) if isinstance(base, dict) else {}
        process["args"] = list(command)
        process["terminal"] = tty
        process["env"] = list(process.get("env") or []) + list(env)
        if cwd:
            process["cwd"] = cwd
        if user:
            process["user"] = _parse_user(user)
        if additional_gids:
            process.setdefault("user", {})["additionalGids"] = list(additional_gids)
        if no_new_privs:
            process["noNewPrivileges"] = True
        if caps:
            merged = process.setdefault("capabilities", {})
            for kind in ("bounding", "effective", "permitted", "ambient"):
                merged[kind] = sorted(set(merged.get(kind, [])) | set(caps))
    return checked_process(ctx, container_id, process,
                           f"--process {process_file}" if process_file else "exec arguments")


def checked_process(ctx: Context, container_id: str, process: dict[str, Any],
                    source: str) -> dict[str, Any]:
    """An exec's process object, validated as hostile input; `source` names
    where it came from in the one-line error."""
    try:
        warnings = spec.check_process(process)
        spec.exec_launch_spec(container_id, process)
    except ConfigError as err:
        # The fields are the process's, not a config.json's.
        raise ParacellError(f"invalid {source}: {err.detail.removeprefix('process.')}") from None
    for warning in warnings:
        ctx.log.warning(warning)
    return process


def write_exec_marker(marker: Path, pid: int) -> None:
    tmp = marker.with_name(f".{marker.name}.tmp")
    tmp.write_text(str(process_start_time(pid) or 0))
    os.replace(tmp, marker)


def exec_marker_alive(marker: Path) -> bool:
    """Whether the marker's pid is still the proxy that wrote it."""
    from paracell.jsonfile import read_regular

    if not marker.name.isdigit() or len(marker.name) > 10:
        return False
    try:
        # Bounded and non-blocking: a FIFO or a huge file put there costs nothing.
        start = read_regular(str(marker), 24, follow=False)
    except (OSError, ParacellError):
        return False
    return start.isdigit() and len(start) <= 24 and same_process(int(marker.name), int(start))


class ExecProxy:
    """The stand-in for an exec'd process (runtime/vm/standin.py). Nothing records
    its pid but its marker, so it never waits for a commit."""

    needs_commit = False

    def __init__(self, shim_socket: Path, launch: bytes, terminal: bool,
                 console_socket: str | None, execs_dir: Path) -> None:
        self.shim_socket, self.launch = shim_socket, launch
        self.terminal, self.console_socket = terminal, console_socket
        # `ps` lists the live exec proxies from these markers. Each holds its
        # proxy's start time: a marker left by a killed proxy must not vouch
        # for whatever process reuses its pid.
        self.marker = execs_dir / str(os.getpid())
        self.conn: socket.socket | None = None
        self.tty_fd = -1
        # A rollback ended the session before its start: it ends as the
        # sessions a rollback ends after theirs do (docs/snapshots.md).
        self.ended: channel.SessionEnded | None = None

    def open(self) -> spawn.Ready:
        try:
            self.conn, self.tty_fd = channel.open_process(self.shim_socket, self.launch,
                                                          self.terminal, self.console_socket)
        except channel.SessionEnded as ended:
            self.ended = ended
            return spawn.Ready(pid=os.getpid())
        # Started before the caller hears of it, as `runc exec --detach`
        # returns once its process runs. A shim that ended the session answers
        # START with its reason, which the relay reads: a failed send says
        # nothing more.
        from paracell._native import lib

        try:
            channel.send(self.conn.fileno(), lib.PC_START)
        except ParacellError:
            pass
        self.marker.parent.mkdir(exist_ok=True)
        write_exec_marker(self.marker, os.getpid())
        return spawn.Ready(pid=os.getpid())

    def run(self) -> int:

        if self.ended is not None:
            channel.say_on_stderr(str(self.ended))
            return self.ended.status
        assert self.conn is not None
        # The relay runs as long as the process; the marker goes when it ends.
        try:
            channel.exec_relay(self.conn.fileno(), self.tty_fd, unlink=(self.marker,))
        except OSError as err:
            channel.say_on_stderr(f"starting the exec's relay: {standin.describe(err)}")
        return standin.EXIT_RUNTIME_ERROR

    def close(self) -> None:
        self.marker.unlink(missing_ok=True)


def exec_process(
    ctx: Context, container_id: str, process: dict[str, Any], detach: bool,
    pid_file: str | None, console_socket: str | None,
) -> int:
    terminal = bool(process.get("terminal"))
    if terminal and not console_socket and detach:
        raise ParacellError(NEED_CONSOLE_SOCKET)
    pid = spawn_exec(ctx, container_id, process, console_socket, detach)
    if pid_file:
        write_pid_file(pid_file, pid)
    if detach:
        return 0
    return wait_child(pid)


def session_socket(ctx: Context, container_id: str) -> Path:
    """Where an exec session into the container connects, once its status
    allows an exec (runc's refusal otherwise): the shim of the container's
    VM, which for a pod member is its pod's."""
    store = ctx.store
    with store.locked(container_id):
        state = store.load(container_id)
        status.transition("exec", state.status, container_id)
    return pod.sandbox_socket(store, state) or store.dir(container_id) / CONTROL_SOCKET


def spawn_exec(ctx: Context, container_id: str, process: dict[str, Any],
               console_socket: str | None, detach: bool = True) -> int:
    """The exec's host proxy, its process created and started in the guest;
    returns the proxy's pid (detached: re-parented to the caller's subreaper)."""
    terminal = bool(process.get("terminal"))
    launch = spec.exec_launch_spec(container_id, process)
    shim_socket = session_socket(ctx, container_id)
    state_dir = ctx.store.dir(container_id)
    spawned = spawn.spawn(
        lambda handshake: standin.serve(handshake, ExecProxy(
            shim_socket, launch, terminal, console_socket, state_dir / EXECS_DIR)),
        detach, ctx.log.background_error, stdio=ctx.stdio)
    spawned.abandon()
    if spawned.ready.error:
        raise ParacellError(spawned.ready.error)
    return spawned.pid
