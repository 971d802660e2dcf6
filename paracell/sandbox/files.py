"""Files in a running sandbox, through its own tools (sh, cat, find, rm):
each call is one command over the sandbox's channel (session.py), so it
sees the container's filesystem as its processes do. In an image without
those tools the call fails as any command would: SandboxError, with runc's
`executable file not found`."""

from __future__ import annotations

import os
from collections.abc import Callable

from paracell.sandbox import errors
from paracell.sandbox.session import DEFAULT_MAX_OUTPUT, Result

MAX_PATH = 4095


def _checked(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path \
            or len(path.encode()) > MAX_PATH:
        raise errors.FileError(f"{path!r}: a path in the sandbox must be absolute, at most "
                               f"{MAX_PATH} bytes, without NUL")
    return path


def _why(result: Result) -> str:
    lines = result.stderr.decode(errors="replace").strip().splitlines()
    text = lines[-1] if lines else f"exit status {result.exit_code}"
    return "".join(c if c.isprintable() else " " for c in text)[:200]


class Files:
    """`run` is the sandbox's (box.py): a command to its end."""

    def __init__(self, run: Callable[..., Result]) -> None:
        self._runner = run

    def _run(self, path: str, cmd: list[str], **kwargs: object) -> Result:
        result = self._runner(cmd, **kwargs)
        if result.exit_code != 0:
            raise errors.FileError(f"{path}: {_why(result)}")
        return result

    def read(self, path: str, max_bytes: int = DEFAULT_MAX_OUTPUT) -> bytes:
        return self._run(path, ["cat", "--", _checked(path)], max_output=max_bytes).stdout

    def write(self, path: str, data: bytes) -> None:
        """Creates or truncates the file, as the container's user."""
        self._run(path, ["sh", "-c", 'cat > "$1"', "sh", _checked(path)], stdin=bytes(data))

    def list(self, path: str) -> list[str]:
        """The names in a directory, sorted."""
        out = self._run(path, ["find", _checked(path), "-mindepth", "1", "-maxdepth", "1",
                               "-print0"]).stdout
        return sorted(os.path.basename(p.decode(errors="surrogateescape"))
                      for p in out.split(b"\0") if p)

    def remove(self, path: str, recursive: bool = False) -> None:
        self._run(path, ["rm", *(["-r"] if recursive else []), "--", _checked(path)])
