"""The Pager's figures for `paracell events --stats`, read straight from the
files its C thread and the guest keep in the container's state directory, so
no request reaches the shim."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paracell.pager.server import SHM_FILE, STATS_FILE

PAGE = 4096
HOST_FIELDS = ("unbind_ranges", "unbind_pages", "unbind_batches", "bind_ranges", "bind_pages",
               "bind_batches", "doorbells", "violations", "vmm_prefault_pages")
GUEST_FIELDS = ("total_pages", "free_pages", "unbound_pages", "reported_pages",
                "bound_ahead_pages", "bound_late_pages", "bind_dropped", "unbind_batches",
                "bind_batches", "inflight_pages")


def _read(path: Path, size: int) -> bytes | None:
    try:
        with open(path, "rb") as f:
            data = f.read(size)
    except OSError:
        return None
    return data if len(data) == size else None


def read(state_dir: Path) -> dict[str, Any] | None:
    """Host counters, and the guest's own (untrusted: shown, never acted on,
    clamped to the guest's size). None when this VM has no Pager."""
    from paracell._native import ffi

    host_raw = _read(state_dir / STATS_FILE, ffi.sizeof("struct pc_pager_stats"))
    shm_raw = _read(state_dir / SHM_FILE, ffi.sizeof("struct pc_pager_shm"))
    if host_raw is None or shm_raw is None:
        return None
    host = ffi.cast("struct pc_pager_stats *", ffi.from_buffer(host_raw))
    shm = ffi.cast("struct pc_pager_shm *", ffi.from_buffer(shm_raw))
    ram_pages = int(shm.ram_size) // PAGE
    guest = {name: min(int(getattr(shm.guest, name)), ram_pages) for name in GUEST_FIELDS
             if name.endswith("_pages")}
    guest.update({name: int(getattr(shm.guest, name)) for name in GUEST_FIELDS
                  if not name.endswith("_pages")})
    return {
        "host": {name: int(getattr(host, name)) for name in HOST_FIELDS}
        | {"last_reclaim_ms": int(host.last_reclaim_ns) / 1e6, "bind_ms": int(host.bind_ns) / 1e6},
        "guest": guest,
    }
