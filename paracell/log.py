"""runc-style logging: errors go to stderr and, with --log, to a file in text or
JSON lines (`{"level":"error","msg":...,"time":...}`), which containerd reads."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass


def rfc3339_now() -> str:
    now = time.time()
    frac = f"{now % 1:.9f}"[1:]
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + frac + "Z"


@dataclass
class RuntimeLog:
    path: str | None = None
    fmt: str = "text"
    debug: bool = False

    def write(self, level: str, msg: str) -> None:
        if not self.path:
            return
        if self.fmt == "json":
            line = json.dumps({"level": level, "msg": msg, "time": rfc3339_now()})
        else:
            line = f'time="{rfc3339_now()}" level={level} msg="{msg}"'
        # A log that cannot be written must never fail the verb that logs.
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError:
            return
        try:
            os.write(fd, (line + "\n").encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    def _tell(self, level: str, msg: str, to_stderr: bool) -> None:
        # One line, whatever a hostile input put into the message.
        msg = msg.replace("\r", "\\r").replace("\n", "\\n")
        self.write(level, msg)
        if to_stderr:
            label = "" if level == "error" else f"{level}: "
            try:
                print(f"paracell: {label}{msg}", file=sys.stderr, flush=True)
            except (OSError, ValueError, AttributeError):
                pass

    def error(self, msg: str, to_stderr: bool = True) -> None:
        self._tell("error", msg, to_stderr)

    def warning(self, msg: str, to_stderr: bool = False) -> None:
        """A notice about how the runtime runs. Only to --log by default: runc
        never writes into the stdio it hands the container, and under
        containerd and podman our stderr is the container's. to_stderr: for
        the commands only a person runs (`sandbox checkpoints`)."""
        self._tell("warning", msg, to_stderr)

    def background_error(self, msg: str) -> None:
        """For shims and proxies: their stderr is the container's, not ours."""
        self.error(msg, to_stderr=False)

    def info(self, msg: str) -> None:
        if self.debug:
            self.write("debug", msg)
