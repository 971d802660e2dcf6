"""Forking the long-lived host processes (the shim, exec proxies).

The child reports one `Ready` message on a pipe once it is ready, or its
error. Detached children are re-parented away (double fork and setsid) so they
outlive the command that made them, as runc's init does.

Before it is ready, a shim may ask its creator to place a process in the
container's cgroup (`place`): a QEMU that is libvirtd's child has a host pid
that a shim in a PID namespace of its own cannot name, and its creator can.

A child whose record must be durable before it may outlive its creator (the
shim) then waits for `commit`: if the creator dies before it has saved the
child's pid, the commit pipe reads EOF and the child shuts itself down, so no
VM ever runs that no state records.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from typing import Any

from paracell.errors import ParacellError

READY_MAX = 4096
PLACE_MAX = 8  # place requests a child may make before its report
PLACED, NOT_PLACED, COMMIT = b"p", b"!", b"c"


@dataclass(frozen=True)
class Ready:
    """What a spawned process tells its creator: its pid, or why it failed.
    A shim also names its QEMU (pid and /proc start time)."""

    pid: int = 0
    qemu_pid: int = 0
    qemu_start: int = 0
    error: str = ""
    # A shim's VM and its template: "restored KEY", "saved KEY" or ""
    # (runtime/vm/templating.py).
    template: str = ""

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode() + b"\n"

    @classmethod
    def decode(cls, raw: bytes) -> Ready:
        try:
            data = json.loads(raw)
            ready = cls(**data)
            if not all(isinstance(v, int) and not isinstance(v, bool)
                       for v in (ready.pid, ready.qemu_pid, ready.qemu_start)) \
                    or not isinstance(ready.error, str) or not isinstance(ready.template, str) \
                    or len(ready.template) > 64:
                raise TypeError
        except (ValueError, TypeError):
            return cls(error="the process died before it was ready")
        if not ready.error and ready.pid <= 0:
            return cls(error="the process reported no pid")
        return ready


class Handshake:
    """The child's end: report once, then (a shim) wait for the commit."""

    def __init__(self, ready_fd: int, commit_fd: int) -> None:
        self.ready_fd, self.commit_fd = ready_fd, commit_fd

    def place(self, pid: int) -> None:
        """Asks the creator to move `pid` (a host pid) into the container's
        cgroup, and waits for it to be done."""
        os.write(self.ready_fd, json.dumps({"place": pid}).encode() + b"\n")
        answer = os.read(self.commit_fd, 1)
        if answer != PLACED:  # the creator reports why
            raise ParacellError(f"placing QEMU (host pid {pid}) in the container's cgroup failed")

    def report(self, ready: Ready) -> None:
        fd, self.ready_fd = self.ready_fd, -1
        try:
            os.write(fd, ready.encode())
        finally:
            os.close(fd)

    def report_crash(self, why: str) -> None:
        """A body that failed before its report: the creator hears the cause
        (a full state filesystem, say), not that the process died."""
        if self.ready_fd >= 0:
            with contextlib.suppress(OSError):
                self.report(Ready(error=why[:READY_MAX // 2]))

    def no_commit(self) -> None:
        """For children that need no commit (exec proxies)."""
        os.close(self.commit_fd)

    def committed(self) -> bool:
        """Blocks until the creator has recorded us (True) or died (False)."""
        try:
            return os.read(self.commit_fd, 1) == COMMIT
        finally:
            os.close(self.commit_fd)


@dataclass
class Spawned:
    """The creator's end."""

    pid: int
    ready: Ready
    commit_fd: int

    def commit(self) -> None:
        try:
            os.write(self.commit_fd, COMMIT)
        except BrokenPipeError:
            pass  # the child died after its report: the record settles to stopped
        self.abandon()

    def abandon(self) -> None:
        """Without a commit, a waiting child shuts itself down."""
        if self.commit_fd >= 0:
            os.close(self.commit_fd)
            self.commit_fd = -1


def describe_failure(err: BaseException) -> str:
    """One line for an unexpected failure: an OSError names its file."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    return f"{type(err).__name__}: {err}"


def _read_report(pipe: Any, commit_w: int, place: Callable[[int], None] | None) -> Ready:
    """The child's report, serving its place requests on the way. A refused
    place is the child's failure, in the creator's words."""
    refused = ""
    for _ in range(PLACE_MAX):
        line = pipe.readline(READY_MAX)
        try:
            request = json.loads(line)
        except ValueError:
            request = None
        pid = request.get("place") if isinstance(request, dict) else None
        if not isinstance(pid, int) or isinstance(pid, bool):
            ready = Ready.decode(line + pipe.read(READY_MAX))
            return Ready(error=refused) if refused and ready.error else ready
        answer = NOT_PLACED
        if place is not None and pid > 0:
            try:
                place(pid)
                answer = PLACED
            except (ParacellError, OSError) as err:
                why = err if isinstance(err, ParacellError) else describe_failure(err)
                refused = f"placing QEMU in the container's cgroup: {why}"
        else:
            refused = "placing a process: not served by this creator"
        try:
            os.write(commit_w, answer)
        except BrokenPipeError:
            pass
    return Ready(error="the process asked too many times to be placed")


def _default_signals() -> None:
    """A creator with an event loop (the shim v2) has its own handlers and a
    wakeup fd, which the child is about to close: the child starts from the
    defaults, or a signal would make Python write its complaint into the
    container's stderr."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM):
        if callable(signal.getsignal(sig)):
            signal.signal(sig, signal.SIG_DFL)


def spawn(body: Callable[[Handshake], int], detach: bool,
          on_crash: Callable[[str], None],
          pid_namespace: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
          place: Callable[[int], None] | None = None,
          stdio: tuple[int, int, int] | None = None,
          keep: tuple[int, ...] = (),
          ) -> Spawned:
    """`pid_namespace` wraps the fork that makes the body's process, which is
    born in that PID namespace (runtime/host/hostns.py): the second fork when
    detached, else the first, since the caller waits on that child itself.
    `place` serves the child's Handshake.place. `stdio` becomes the child's
    fds 0-2 (else it keeps the caller's). `keep`: other fds the child keeps
    (a pooled VM's lease, which its container holds)."""
    ready_r, ready_w = os.pipe()
    commit_r, commit_w = os.pipe()
    with (contextlib.nullcontext() if detach else pid_namespace()):
        pid = os.fork()
    if pid == 0:
        status = 255
        handshake = None
        try:
            os.close(ready_r)
            os.close(commit_w)
            _default_signals()
            if stdio is not None:
                for target, fd in enumerate(stdio):
                    if fd != target:
                        os.dup2(fd, target)
            # Inherited descriptors include the container lock: holding it for
            # the process's life would block every later verb.
            low = 3
            for fd in sorted({ready_w, commit_r, *keep}):
                os.closerange(low, fd)
                low = fd + 1
            os.closerange(low, 65536)
            os.chdir("/")
            if detach:
                with pid_namespace():
                    if os.fork() != 0:
                        os._exit(0)
                # setsid in the grandchild: a session leader can take a pty
                # as its controlling terminal and so hear SIGWINCH.
                os.setsid()
            else:
                os.setpgid(0, 0)
            handshake = Handshake(ready_w, commit_r)
            status = body(handshake)
        except BaseException as err:  # never a traceback, never a return into the CLI
            on_crash(f"{type(err).__name__}: {err}")
            if handshake is not None:
                handshake.report_crash(describe_failure(err))
        finally:
            os._exit(status)
    os.close(ready_w)
    os.close(commit_r)
    with os.fdopen(ready_r, "rb") as pipe:
        ready = _read_report(pipe, commit_w, place)
    if detach:
        os.waitpid(pid, 0)
        pid = ready.pid
    elif ready.error:
        os.waitpid(pid, 0)  # it has cleaned up and is exiting: no zombie left behind
    spawned = Spawned(pid, ready, commit_w)
    if ready.error:
        spawned.abandon()
    return spawned
