"""Which pages of a snapshot-mode VM's RAM its QEMU wrote since the last
look (csrc/dirtylog.h): QEMU's RAM plugin registered its mapping of the RAM
file for asynchronous userfaultfd write-protection, and each look reads the
written pages from QEMU's pagemap and protects them again. A checkpoint
then reads only those pages, and the ones the Pager unbound meanwhile; a
host without it (before Linux 6.7, or a QEMU without the plugin) hashes
every page, as it always did (docs/snapshots.md)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

WRITTEN_PAGES = "written pages"  # the method, as a checkpoint's answer says it
EVERY_PAGE = "every page"


class WriteLog:
    """QEMU's log of writes to guest RAM; `take` is False wherever it cannot
    vouch for every page (then the caller reads them all)."""

    def __init__(self, qemu_pid: int, ram_path: Path, ram_bytes: int,
                 log: Callable[[str], None]) -> None:
        from paracell._native import lib

        self.ram_bytes, self._log = ram_bytes, log
        self.fd, self.va = -1, 0
        try:
            st = os.stat(ram_path)
            self.va = int(lib.pc_find_file_mapping(f"/proc/{qemu_pid}/maps".encode(), st.st_dev,
                                                   st.st_ino, ram_bytes, b"s"))
            if self.va:
                self.fd = os.open(f"/proc/{qemu_pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            self._off(f"QEMU's mapping of guest RAM: {err.strerror}")
        else:
            if not self.va:
                self._off("QEMU's mapping of guest RAM was not found")

    def _off(self, why: str) -> None:
        self._log(f"checkpoints hash every page: {why}")
        self.close()

    def take(self, changed: Any) -> bool:
        """Marks changed[i] for each page written since the last take, and
        protects them again."""
        from paracell._native import ffi, lib

        if self.fd < 0:
            return False
        if swap_in_use():
            # A page the host swaps out leaves QEMU's page tables, and with
            # it the mark that it was written: the log would miss it.
            self._off("the host swaps (/proc/swaps)")
            return False
        if lib.pc_dirty_take(self.fd, self.va, self.ram_bytes, changed) != 0:
            self._off(f"QEMU's written pages could not be read: {os.strerror(ffi.errno)}")
            return False
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.va = -1, 0


def swap_in_use(path: str = "/proc/swaps") -> bool:
    try:
        with open(path, "rb") as swaps:
            return len(swaps.read(4096).splitlines()) > 1  # a header, then one line a device
    except OSError:
        return False
