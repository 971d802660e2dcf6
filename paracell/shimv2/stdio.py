"""A task's stdio as containerd names it: FIFO paths, or a terminal.

Without a terminal the FIFOs themselves become the host process's fds 0-2
(runtime/vm/spawn.py), so no byte of the container's output passes through
Python. With one, the stand-in hands its pty master over a console socket,
and this shim copies between the master and the FIFOs, as containerd's runc
shim does.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import struct
import tempfile
import termios
from dataclasses import dataclass, field

from paracell.errors import ParacellError

CONSOLE_WAIT_S = 10.0
COPY_CHUNK = 64 * 1024
MAX_WINSIZE = 0xFFFF


@dataclass(frozen=True)
class StdioPaths:
    stdin: str
    stdout: str
    stderr: str
    terminal: bool

    def check(self) -> None:
        for name in (self.stdin, self.stdout, self.stderr):
            if name and (not os.path.isabs(name) or "\0" in name or len(name) > 4096):
                raise ParacellError(f"stdio path {name[:80]!r}: must be an absolute path")


def _open_fifo(path: str, writing: bool) -> int:
    """Never blocks: a FIFO is opened read-write when its far end may not be
    open yet (containerd keeps its own ends, as runc's shim relies on)."""
    if not path:
        return os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    flags = (os.O_RDWR if writing else os.O_RDONLY | os.O_NONBLOCK) | os.O_CLOEXEC
    fd = os.open(path, flags | os.O_NOFOLLOW)
    if not writing:
        os.set_blocking(fd, True)
    return fd


@dataclass
class OpenedStdio:
    """The fds a host process gets as 0-2; closed here once it has them."""

    fds: tuple[int, int, int]

    def close(self) -> None:
        for fd in set(self.fds):
            with contextlib.suppress(OSError):
                os.close(fd)


def open_pipes(paths: StdioPaths) -> OpenedStdio:
    opened: list[int] = []
    try:
        opened.append(_open_fifo(paths.stdin, writing=False))
        opened.append(_open_fifo(paths.stdout, writing=True))
        opened.append(_open_fifo(paths.stderr, writing=True) if paths.stderr
                      else os.dup(opened[1]))
    except OSError as err:
        for fd in opened:
            os.close(fd)
        raise ParacellError(f"opening the task's stdio: {err.filename}: {err.strerror}") \
            from None
    return OpenedStdio((opened[0], opened[1], opened[2]))


@dataclass
class ConsoleSocket:
    """Where a stand-in sends its pty master: a socket in a private directory."""

    directory: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="paracell-pty-"))
    sock: socket.socket | None = None

    @property
    def path(self) -> str:
        return os.path.join(self.directory, "pty.sock")

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.bind(self.path)
        self.sock.listen(1)

    def receive(self) -> int:
        """The master fd, once the stand-in has sent it (it has, by the time
        its create or exec returned)."""
        assert self.sock is not None
        self.sock.settimeout(CONSOLE_WAIT_S)
        try:
            conn, _ = self.sock.accept()
            with conn:
                _, fds, _, _ = socket.recv_fds(conn, 16, 1)
        except OSError as err:
            raise ParacellError(f"no terminal came back: {err}") from None
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise ParacellError("no terminal came back on the console socket")
        os.set_inheritable(fds[0], False)
        return fds[0]

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)


class Console:
    """A pty master and the copies between it and the task's FIFOs."""

    def __init__(self, master: int, paths: StdioPaths) -> None:
        self.master = master
        self.paths = paths
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        os.set_blocking(self.master, False)
        out = _open_fifo(self.paths.stdout, writing=True) if self.paths.stdout else -1
        self.tasks.append(asyncio.create_task(self._copy_out(out)))
        if self.paths.stdin:
            src = _open_fifo(self.paths.stdin, writing=False)
            self.tasks.append(asyncio.create_task(self._copy_in(src)))

    async def _copy_out(self, out: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    data = os.read(self.master, COPY_CHUNK)
                except BlockingIOError:
                    ready = loop.create_future()
                    loop.add_reader(self.master, ready.set_result, None)
                    try:
                        await ready
                    finally:
                        loop.remove_reader(self.master)
                    continue
                except OSError:  # EIO: the slave side is gone
                    return
                if not data:
                    return
                if out >= 0:
                    await asyncio.to_thread(_write_all, out, data)
        finally:
            if out >= 0:
                os.close(out)

    async def _copy_in(self, src: int) -> None:
        try:
            while True:
                data = await asyncio.to_thread(os.read, src, COPY_CHUNK)
                if not data:
                    return
                await asyncio.to_thread(_write_all, self.master, data, True)
        except OSError:
            return
        finally:
            os.close(src)

    def resize(self, width: int, height: int) -> None:
        if not (0 <= width <= MAX_WINSIZE and 0 <= height <= MAX_WINSIZE):
            raise ParacellError(f"terminal size {width}x{height} is out of range")
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        with contextlib.suppress(OSError):
            os.close(self.master)


def _write_all(fd: int, data: bytes, nonblocking: bool = False) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            if not nonblocking:
                raise
            import select

            select.select([], [fd], [], 1.0)


