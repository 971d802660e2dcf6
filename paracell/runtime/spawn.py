"""Forking the long-lived host processes (the shim, exec proxies).

The child reports one line on a pipe: `ok <pid> ...` once it is ready, or
`error <message>`. Detached children are re-parented away (double fork and
setsid) so they outlive the command that made them, as runc's init does.
"""

from __future__ import annotations

import os
from collections.abc import Callable


def spawn(
    body: Callable[[int], int], detach: bool, on_crash: Callable[[str], None]
) -> tuple[int, str]:
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 255
        try:
            # Inherited descriptors include the container lock: holding it for
            # the process's life would block every later verb.
            os.closerange(3, ready_w)
            os.closerange(ready_w + 1, 65536)
            os.chdir("/")
            if detach:
                if os.fork() != 0:
                    os._exit(0)
                # setsid in the grandchild: a session leader can take a pty
                # as its controlling terminal and so hear SIGWINCH.
                os.setsid()
            else:
                os.setpgid(0, 0)
            status = body(ready_w)
        except BaseException as err:  # never a traceback, never a return into the CLI
            on_crash(f"{type(err).__name__}: {err}")
        finally:
            os._exit(status)
    os.close(ready_w)
    with os.fdopen(ready_r, "rb") as ready:
        line = ready.read(4096).decode(errors="replace").strip()
    if detach:
        os.waitpid(pid, 0)
        parts = line.split()
        return (int(parts[1]) if len(parts) >= 2 and parts[0] == "ok" else 0), line
    if ready_error(line):
        os.waitpid(pid, 0)  # it has cleaned up and is exiting: no zombie left behind
    return pid, line


def report_ready(ready_fd: int, line: str) -> None:
    os.write(ready_fd, f"{line}\n".encode())
    os.close(ready_fd)


def ready_error(line: str) -> str | None:
    if line.startswith("ok "):
        return None
    return line.removeprefix("error ").strip() or "the process died before it was ready"
