"""The host side of one VM's Pager: a thin owner of csrc/pager.c.

Python opens the files and starts the C thread; the thread drains the rings,
punches and populates guest RAM, and never calls back into Python.
"""

from __future__ import annotations

import os
from pathlib import Path

from paracell.errors import ParacellError

# BAR2 of QEMU's ivshmem device: a page the guest never maps (proto/pager_proto.h).
TOKEN_FILE = "pager.token"
STATS_FILE = "pager.stats"


# Guest RAM splits around the 4 GiB hole on QEMU's microvm at a point that
# depends on its version; every version keeps at least 1 GiB below it. The
# Pager serves guests that fit there, so the split is never guessed.
MAX_RAM_BYTES = 1 << 30


def _create(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


class PagerServer:
    """Owns the C server's state; `close` is idempotent and ends the thread."""

    def __init__(self, ram_path: Path, ram_bytes: int, state_dir: Path) -> None:
        from paracell._native import ffi, lib

        self._ffi, self._lib = ffi, lib
        self._p = ffi.new("struct pc_pager *")
        if ram_bytes > MAX_RAM_BYTES:
            raise ParacellError(f"the Pager serves guests of up to {MAX_RAM_BYTES >> 20} MiB")
        split = ram_bytes
        fds = []
        try:
            fds.append(os.open(ram_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC))
            fds.append(_create(state_dir / TOKEN_FILE))
            fds.append(_create(state_dir / STATS_FILE))
            if lib.pc_pager_open(self._p, fds[0], ram_bytes, split, fds[1], fds[2]) != 0:
                raise ParacellError(self.error)
        except OSError as err:
            raise ParacellError(f"setting up the Pager: {err}") from None
        finally:
            for fd in fds:
                os.close(fd)

    @property
    def error(self) -> str:
        return self._ffi.string(self._p.error).decode("utf-8", "replace")

    @property
    def abort_fd(self) -> int:
        return int(self._p.abort_fd)

    def greet(self, sock_fd: int) -> None:
        if self._lib.pc_pager_greet(self._p, sock_fd) != 0:
            raise ParacellError(self.error)

    def start(self) -> None:
        if self._lib.pc_pager_start(self._p) != 0:
            raise ParacellError(self.error)

    def pause(self) -> None:
        """Holds the thread off between two wakeups (csrc/pager.h)."""
        self._lib.pc_pager_pause(self._p)

    def resume(self, reattach: bool) -> None:
        self._lib.pc_pager_resume(self._p, 1 if reattach else 0)

    def set_vmm(self, pid: int) -> None:
        """QEMU runs as `pid`: bound memory is mapped into its page tables too."""
        self._lib.pc_pager_set_vmm(self._p, pid)

    def failure(self) -> str | None:
        """Why the thread stopped on its own, if it did."""
        return self.error or None

    def close(self) -> None:
        self._lib.pc_pager_close(self._p)
