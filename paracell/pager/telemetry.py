"""The Pager's figures for `paracell events --stats`, read straight from the
host counters its C thread keeps in the container's state directory and from
the guest's own, in its rings in guest RAM (paracell/vmm/ramview.py), so no
request reaches the shim."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paracell.pager.server import STATS_FILE

# Reads (offset, size) of guest RAM: paracell.vmm.ramview.GuestRamView.read.
RamReader = Callable[[int, int], "bytes | None"]

PAGE = 4096
HOST_FIELDS = ("unbind_ranges", "unbind_pages", "unbind_batches", "bind_ranges", "bind_pages",
               "bind_batches", "doorbells", "violations", "vmm_prefault_pages")
GUEST_FIELDS = ("total_pages", "free_pages", "unbound_pages", "reported_pages",
                "bound_ahead_pages", "bound_late_pages", "bind_dropped", "unbind_batches",
                "bind_batches", "inflight_pages")


def _read(path: Path, size: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.pread(fd, size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == size else None


def read(state_dir: Path, read_ram: RamReader | None) -> dict[str, Any] | None:
    """Host counters, and the guest's own (untrusted: shown, never acted on,
    clamped to the guest's size; zeros until its driver wrote the rings).
    None when this VM has no Pager."""
    from paracell._native import ffi, lib

    host_raw = _read(state_dir / STATS_FILE, ffi.sizeof("struct pc_pager_stats"))
    shm_size = ffi.sizeof("struct pc_pager_shm")
    shm_raw = read_ram(lib.PC_PAGER_RING_GPA, shm_size) if read_ram else None
    if host_raw is None or shm_raw is None:
        return None
    host = ffi.cast("struct pc_pager_stats *", ffi.from_buffer(host_raw))
    shm = ffi.cast("struct pc_pager_shm *", ffi.from_buffer(shm_raw))
    ram_pages = int(host.ram_pages)
    guest = {name: min(int(getattr(shm.guest, name)), ram_pages) for name in GUEST_FIELDS
             if name.endswith("_pages")}
    guest.update({name: int(getattr(shm.guest, name)) for name in GUEST_FIELDS
                  if not name.endswith("_pages")})
    return {
        "host": {name: int(getattr(host, name)) for name in HOST_FIELDS}
        | {"last_reclaim_ms": int(host.last_reclaim_ns) / 1e6, "bind_ms": int(host.bind_ns) / 1e6},
        "guest": guest,
    }
