"""`containerd-shim-paracell-v2`: the binary containerd runs for the runtime
`io.containerd.paracell.v2`, with containerd 1.6's shim contract:

- `start`, in the task's bundle: make sure the shim of the task's group (its
  pod, by `io.kubernetes.cri.sandbox-id`, else the task itself) runs, and
  print its ttrpc address. containerd then speaks ttrpc to it;
- `delete`, after a shim died: remove what it left of the task, and print a
  DeleteResponse;
- `serve` (ours): the resident daemon, started by `start`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from paracell.errors import ParacellError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.shimv2.tasks import Tasks

SANDBOX_ID = "io.kubernetes.cri.sandbox-id"
NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,75}")
ADDRESS_FILE = "address"
LOG_FIFO = "log"
SOCKET_DIR_MODE = 0o700
MAX_CONFIG_BYTES = 4 << 20
DRAIN_S = 2.0
IDLE_CHECK_S = 30.0


def parse(argv: list[str]) -> argparse.Namespace:
    # containerd's flag names, single dash, as Go's flag package spells them.
    parser = argparse.ArgumentParser(prog="containerd-shim-paracell-v2", allow_abbrev=False)
    parser.add_argument("-namespace", default="")
    parser.add_argument("-address", default="")
    parser.add_argument("-publish-binary", dest="publish_binary", default="")
    parser.add_argument("-id", dest="id", default="")
    parser.add_argument("-bundle", default="")
    parser.add_argument("-debug", action="store_true")
    parser.add_argument("-socket-fd", dest="socket_fd", type=int, default=-1)
    parser.add_argument("action", choices=("start", "delete", "serve"))
    return parser.parse_args(argv)


def _check(args: argparse.Namespace) -> None:
    from paracell.runtime.state.ids import check_id

    if not NAMESPACE.fullmatch(args.namespace):
        raise ParacellError(f"invalid namespace {args.namespace[:80]!r}")
    check_id(args.id)


def state_root(namespace: str) -> str:
    from paracell import settings

    return os.path.join(settings.shim_root(), namespace)


def socket_path(containerd_address: str, namespace: str, group: str) -> Path:
    """One per shim: a digest keeps it short enough for sun_path (108 bytes)
    whatever the names, and apart for every containerd, namespace and group."""
    from paracell import settings

    digest = hashlib.sha256(f"{containerd_address}\0{namespace}\0{group}".encode()).hexdigest()
    return Path(settings.shim_root()) / "s" / digest[:32]


def _group_of(bundle: Path, task_id: str) -> str:
    """The task's pod, so that a pod's containers share one shim."""
    from paracell.jsonfile import read_regular
    from paracell.runtime.state.ids import check_id

    try:
        config = json.loads(read_regular(str(bundle / "config.json"), MAX_CONFIG_BYTES))
        sandbox = config.get("annotations", {}).get(SANDBOX_ID)
    except (OSError, ValueError, AttributeError, ParacellError):
        return task_id
    if not isinstance(sandbox, str) or not sandbox:
        return task_id
    check_id(sandbox)
    return sandbox


def _serving(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def _write_address(bundle: Path, address: str) -> None:
    """containerd reads it again when it restarts, to reconnect."""
    tmp = bundle / f".{ADDRESS_FILE}.tmp"
    tmp.write_text(address)
    os.replace(tmp, bundle / ADDRESS_FILE)


def start(args: argparse.Namespace) -> int:
    bundle = Path(args.bundle or os.getcwd()).absolute()
    group = _group_of(bundle, args.id)
    path = socket_path(args.address, args.namespace, group)
    address = f"unix://{path}"
    path.parent.mkdir(mode=SOCKET_DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path.parent, SOCKET_DIR_MODE)
    # Two starts of one pod at once must not both make a daemon: the second
    # would take the socket's name from the first. The sockets' directory is
    # the lock (a start holds it for the daemon's spawn only); a lock file
    # per group could never be removed safely.
    lock = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _serving(path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)
            try:
                listener.bind(str(path))
            finally:
                os.umask(old)
            listener.listen(128)
            _spawn_daemon(args, bundle, listener)
            listener.close()
    finally:
        os.close(lock)
    _write_address(bundle, address)
    print(address, end="", flush=True)
    return 0


def _spawn_daemon(args: argparse.Namespace, bundle: Path, listener: socket.socket) -> None:
    """The daemon outlives `start` in a session of its own, its stderr on the
    bundle's log FIFO, which containerd reads."""
    import subprocess

    fd = listener.fileno()
    argv = [sys.executable, "-m", "paracell.shimv2.command", "-namespace", args.namespace,
            "-address", args.address, "-publish-binary", args.publish_binary, "-id", args.id,
            "-bundle", str(bundle), "-socket-fd", str(fd)]
    argv += ["-debug"] if args.debug else []
    argv.append("serve")
    log = LOG_FIFO if (bundle / LOG_FIFO).exists() else os.devnull
    try:
        err = os.open(bundle / log if log == LOG_FIFO else log,
                      os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        err = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        subprocess.Popen(argv, cwd=bundle, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=err, pass_fds=(fd,), start_new_session=True)
    finally:
        os.close(err)


def delete(args: argparse.Namespace) -> int:
    """containerd's clean-up after a shim that died: the task's VM, cgroups,
    RAM file and state go, as `paracell delete --force` removes them."""
    from paracell.log import RuntimeLog
    from paracell.runtime.agent.signals import SIGKILL, exit_status_for_signal
    from paracell.runtime.context import Context
    from paracell.runtime.verbs import lifecycle
    from paracell.shimv2 import messages, rootfs

    bundle = Path(args.bundle or os.getcwd()).absolute()
    ctx = Context(state_root(args.namespace), RuntimeLog(str(bundle / "log.json"), "json"))
    lifecycle.delete(ctx, args.id, force=True)
    if os.path.ismount(bundle / "rootfs"):
        rootfs.unmount(bundle / "rootfs")
    # A shim that was killed left its socket: gone, unless another shim of
    # the group serves on it.
    path = socket_path(args.address, args.namespace, _group_of(bundle, args.id))
    if not _serving(path):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    response = messages.task_api.DeleteResponse(exit_status=exit_status_for_signal(SIGKILL))
    response.exited_at.FromNanoseconds(time.time_ns())
    sys.stdout.buffer.write(response.SerializeToString())
    sys.stdout.flush()
    return 0


class _IdleWatch:
    """A daemon that serves no task for two checks in a row ends: its
    containerd died between `start` and Create, or before its Shutdown."""

    def __init__(self, tasks: Tasks, shutdown: Callable[[], None]) -> None:
        self.tasks, self.shutdown, self.idle_before = tasks, shutdown, False

    def check(self) -> None:
        idle = not self.tasks.tasks
        if idle and self.idle_before:
            self.shutdown()
            return
        self.idle_before = idle
        asyncio.get_running_loop().call_later(IDLE_CHECK_S, self.check)


async def _serve(args: argparse.Namespace) -> int:
    from paracell import linux
    from paracell.log import RuntimeLog
    from paracell.runtime.context import Context
    from paracell.shimv2 import messages
    from paracell.shimv2.events import Publisher
    from paracell.shimv2.service import TaskService
    from paracell.shimv2.tasks import Tasks
    from paracell.shimv2.ttrpc import Server

    linux.become_subreaper()
    bundle = Path(args.bundle)
    log = RuntimeLog(str(bundle / "log.json"), "json", debug=args.debug)
    ctx = Context(state_root(args.namespace), log)
    Path(ctx.root).mkdir(mode=0o711, parents=True, exist_ok=True)
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def shutdown() -> None:
        if not done.done():
            done.set_result(None)

    publisher = Publisher(os.environ.get("TTRPC_ADDRESS", ""), args.namespace, log)
    tasks = Tasks(ctx)
    service = TaskService(tasks, publisher, args.namespace, shutdown)
    tasks.on_exit = service.exited
    loop.add_signal_handler(signal.SIGCHLD, tasks.reap)
    idle = _IdleWatch(tasks, shutdown)
    loop.call_later(IDLE_CHECK_S, idle.check)
    # containerd kills its shims with SIGKILL; a TERM is an operator's stop.
    loop.add_signal_handler(signal.SIGTERM, shutdown)
    publisher.start()
    server = Server()
    server.register(messages.TASK_SERVICE, {
        name: (request, service.wrap(handler))
        for name, (request, handler) in service.methods().items()})
    listener = socket.socket(fileno=args.socket_fd)
    path = listener.getsockname()
    serving = asyncio.create_task(server.serve(listener))
    try:
        await done
        await publisher.drain(DRAIN_S)
    finally:
        # First: from here a `start` for this group makes a new shim.
        with contextlib.suppress(OSError):
            os.unlink(path)
        await server.shutdown(grace=DRAIN_S)
        await serving
        await publisher.close()
        tasks.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        _check(args)
        if args.action == "start":
            return start(args)
        if args.action == "delete":
            return delete(args)
        if args.socket_fd < 3:
            raise ParacellError("serve: the shim's listening socket (-socket-fd) is missing")
        return asyncio.run(_serve(args))
    except ParacellError as err:
        print(f"containerd-shim-paracell-v2: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
