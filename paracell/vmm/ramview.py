"""What the host holds of one VM's guest RAM, read from outside its processes.

A VM's RAM is either a file of its own that QEMU maps shared (the host's
blocks of it are what it holds), or, restored copy-on-write from a template,
QEMU's private mapping of the template's file: there only the pages QEMU
copied on write (anonymous) are the VM's own; the rest it shares with every
VM of that template (docs/templates.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from paracell.vmm import memory


@dataclass(frozen=True)
class GuestRamView:
    size: int      # bytes of guest RAM
    resident: int  # bytes the host holds for this VM alone
    shared: bool   # copy-on-write from a template
    # Bytes of guest RAM backed at all: its own, and the template's pages it
    # maps (which its siblings share); a RAM file's VM has only its own.
    mapped: int
    _file: Path | None = None
    _mem: tuple[int, int] | None = None  # (QEMU's pid, its mapping's address)

    def read(self, offset: int, size: int) -> bytes | None:
        """size bytes of guest RAM at offset (guest-controlled content), or None."""
        if offset < 0 or size < 0 or offset + size > self.size:
            return None
        if self._file is not None:
            path, at = self._file, offset
        elif self._mem is not None:
            path, at = Path(f"/proc/{self._mem[0]}/mem"), self._mem[1] + offset
        else:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.pread(fd, size, at)  # a hole reads as zeros, allocating nothing
        except OSError:
            return None
        finally:
            os.close(fd)
        return data if len(data) == size else None


def view(ram_file: Path, size: int, qemu_pid: int | None) -> GuestRamView | None:
    """The RAM file's, if the VM has one; else QEMU's private mapping of its
    template's (guest RAM's size, writable, file-backed); None if neither."""
    try:
        st = os.stat(ram_file)
        resident = memory.resident_bytes(ram_file)
        return GuestRamView(st.st_size, resident, False, resident, _file=ram_file)
    except OSError:
        pass
    return copy_on_write_view(qemu_pid, size) if qemu_pid else None


def copy_on_write_view(qemu_pid: int, size: int) -> GuestRamView | None:
    """QEMU's private mapping of a template's RAM file, if it has one."""
    import psutil

    try:
        maps = psutil.Process(qemu_pid).memory_maps(grouped=False)
    except (psutil.Error, OSError):
        return None
    for m in maps:
        if m.size == size and m.perms == "rw-p" and m.path.startswith("/"):
            start = int(m.addr.split("-")[0], 16)
            return GuestRamView(size, m.anonymous, True, m.rss, _mem=(qemu_pid, start))
    return None
