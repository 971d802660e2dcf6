"""The host side of one VM's Pager: a thin owner of csrc/pager.c.

Python opens the files and starts the C thread; the thread drains the rings,
punches and populates guest RAM, and never calls back into Python.
"""

from __future__ import annotations

import os
import select
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
    """Owns the C server's state; `close` is idempotent and ends the thread.

    Without a RAM file (ram_path None) the guest's RAM is QEMU's private
    copy-on-write mapping of a template, which only QEMU can discard pages
    of: the rings are then served inside QEMU by its RAM plugin
    (csrc/ramplugin.c, `plugin_options`), with the eventfds and stats made here."""

    def __init__(self, ram_path: Path | None, ram_bytes: int, state_dir: Path) -> None:
        from paracell._native import ffi, lib

        self._ffi, self._lib = ffi, lib
        self._p = ffi.new("struct pc_pager *")
        if ram_bytes > MAX_RAM_BYTES:
            raise ParacellError(f"the Pager serves guests of up to {MAX_RAM_BYTES >> 20} MiB")
        self.ram_bytes = self.split = ram_bytes
        self.in_vmm = ram_path is None
        self.stats_fd = -1  # kept for QEMU to inherit, when the Pager runs there
        fds = []
        try:
            ram_fd = -1 if ram_path is None else os.open(
                ram_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            fds.append(ram_fd)
            fds.append(_create(state_dir / TOKEN_FILE))
            fds.append(_create(state_dir / STATS_FILE))
            if lib.pc_pager_open(self._p, ram_fd, ram_bytes, self.split, fds[1], fds[2]) != 0:
                raise ParacellError(self.error)
            if self.in_vmm:
                self.stats_fd = fds.pop()
        except OSError as err:
            raise ParacellError(f"setting up the Pager: {err}") from None
        finally:
            for fd in fds:
                if fd >= 0:
                    os.close(fd)

    @property
    def error(self) -> str:
        return self._ffi.string(self._p.error).decode("utf-8", "replace")

    @property
    def abort_fd(self) -> int:
        return int(self._p.abort_fd)

    def plugin_fds(self) -> tuple[int, ...]:
        """What QEMU inherits for the Pager in its RAM plugin."""
        p = self._p
        return (int(p.doorbell_fd), int(p.irq_fd), int(p.abort_fd), self.stats_fd)

    def plugin_options(self) -> list[str]:
        """The Pager's part of QEMU's `-plugin` option (csrc/ramplugin.c)."""
        doorbell, irq, abort, stats = self.plugin_fds()
        return [f"split={self.split}", f"doorbell={doorbell}", f"irq={irq}", f"abort={abort}",
                f"stats={stats}"]

    def launched(self) -> None:
        """QEMU holds its copy of the stats file now."""
        if self.stats_fd >= 0:
            os.close(self.stats_fd)
            self.stats_fd = -1

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

    def take_unbound(self, changed: object) -> None:
        """Marks the pages unbound since the last call (csrc/pager.h); paused."""
        self._lib.pc_pager_take_unbound(self._p, changed)

    def set_vmm(self, pid: int) -> None:
        """QEMU runs as `pid`: bound memory is mapped into its page tables too."""
        self._lib.pc_pager_set_vmm(self._p, pid)

    def failure(self) -> str | None:
        """Why the thread stopped on its own, if it did."""
        if self.in_vmm:
            aborted = select.select([self.abort_fd], [], [], 0)[0] if self.abort_fd >= 0 else []
            return "the Pager in QEMU stopped (qemu.log says why)" if aborted else None
        return self.error or None

    def close(self) -> None:
        self.launched()
        self._lib.pc_pager_close(self._p)
