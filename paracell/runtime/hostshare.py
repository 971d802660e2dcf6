"""Bind sources outside the rootfs (podman's /etc/hosts, /dev/shm, ...) reach the
guest through one extra virtio-9p share: each source is bind-mounted into a
slot of the container's `share/` directory on the host."""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

from paracell.errors import ParacellError
from paracell.runtime.spec import HostBind

MS_BIND, MS_REC, MNT_DETACH = 0x1000, 0x4000, 2
SHARE_DIR = "share"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount_binds(state_dir: Path, binds: list[HostBind]) -> Path | None:
    if not binds:
        return None
    share = state_dir / SHARE_DIR
    share.mkdir(mode=0o700, exist_ok=True)
    libc = _libc()
    for bind in binds:
        target = share / bind.slot
        if bind.source.is_dir():
            target.mkdir(exist_ok=True)
        else:
            target.touch(exist_ok=True)
        if libc.mount(str(bind.source).encode(), str(target).encode(), None,
                      MS_BIND | MS_REC, None) != 0:
            err = ctypes.get_errno()
            unmount_binds(state_dir)
            raise ParacellError(f"bind mount of {bind.source}: {os.strerror(err)}")
    return share


def _mounts_under(directory: Path) -> list[str]:
    # mountinfo, not os.path.ismount: a file bound onto a file of the same
    # filesystem does not look like a mount point to stat().
    prefix = f"{directory}/"
    with open("/proc/self/mountinfo") as f:
        points = [_unescape(line.split()[4]) for line in f]
    return [p for p in points if p.startswith(prefix)]


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def unmount_binds(state_dir: Path) -> None:
    """Idempotent: delete calls it again after a shim that died mid-way."""
    share = state_dir / SHARE_DIR
    if not share.is_dir():
        return
    libc = _libc()
    for point in sorted(_mounts_under(share), reverse=True):
        libc.umount2(point.encode(), MNT_DETACH)
    for slot in share.iterdir():
        if slot.is_dir() and not slot.is_symlink():
            slot.rmdir()
        else:
            slot.unlink()
    share.rmdir()
