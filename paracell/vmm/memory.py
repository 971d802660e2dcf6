"""Guest RAM backing: a sparse file on tmpfs that the runtime creates and owns.

QEMU maps it shared, so the host can see and (with the Pager) release exactly
the pages the guest has touched, by punching holes in this file.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from paracell import settings


def path_for(root: str, container_id: str) -> Path:
    """One file per (state root, id), since containerd namespaces may reuse an
    id; named by a fixed-length hash, since an id may be 255 bytes long."""
    key = f"{os.path.abspath(root)}\0{container_id}".encode()
    return settings.memory_dir() / f"{hashlib.sha256(key).hexdigest()[:32]}.mem"


def create_at(path: Path, size_mib: int) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size_mib << 20)
    finally:
        os.close(fd)


def resident_bytes(path: Path) -> int:
    """Host memory the guest's RAM holds right now: the file's allocated blocks."""
    try:
        return os.stat(path).st_blocks * 512
    except OSError:
        return 0


def remove(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
