"""The task's root filesystem: containerd hands a shim v2 its mounts (an
overlay of the image's snapshots) in Create, and the shim mounts them at
`BUNDLE/rootfs`, where config.json's `root.path` points, before the runtime
reads the bundle."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from paracell.errors import ParacellError
from paracell.linux import (
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REC,
    libc,
)

MAX_MOUNTS = 1  # containerd's snapshotters give one mount for a rootfs
MAX_OPTIONS = 64
MAX_OPTION_BYTES = 64 * 1024
FSTYPES = frozenset({"overlay", "bind", "ext4", "xfs", "btrfs", "tmpfs"})
FLAGS = {"ro": MS_RDONLY, "rw": 0, "bind": MS_BIND, "rbind": MS_BIND | MS_REC,
         "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}


@dataclass(frozen=True)
class RootMount:
    fstype: str
    source: str
    options: tuple[str, ...]


def check(mounts: list[RootMount]) -> None:
    if len(mounts) > MAX_MOUNTS:
        raise ParacellError(f"{len(mounts)} rootfs mounts: this shim takes at most {MAX_MOUNTS}")
    for m in mounts:
        if m.fstype not in FSTYPES:
            raise ParacellError(f"rootfs mount type {m.fstype[:40]!r} is not supported")
        if len(m.options) > MAX_OPTIONS or sum(map(len, m.options)) > MAX_OPTION_BYTES:
            raise ParacellError("rootfs mount: too many options")
        if any("\0" in s for s in (m.source, *m.options)):
            raise ParacellError("rootfs mount: a NUL byte in its source or options")


def mount(mounts: list[RootMount], bundle: Path) -> Path | None:
    """Mounts them at BUNDLE/rootfs; the target, or None when containerd
    gave no mounts (the bundle has its rootfs already)."""
    check(mounts)
    if not mounts:
        return None
    target = bundle / "rootfs"
    target.mkdir(mode=0o711, exist_ok=True)
    for m in mounts:
        flags, data = 0, []
        for option in m.options:
            if option in FLAGS:
                flags |= FLAGS[option]
            else:
                data.append(option)
        fstype = None if flags & MS_BIND else m.fstype.encode()
        rc = libc().mount(m.source.encode(), str(target).encode(), fstype, flags,
                          ",".join(data).encode() if data else None)
        if rc != 0:
            err = ctypes.get_errno()
            raise ParacellError(f"mounting the rootfs ({m.fstype}) at {target}: "
                                f"{os.strerror(err)}")
    return target


def unmount(target: Path) -> None:
    """Detached, so a process still in it does not keep the task from going."""
    libc().umount2(str(target).encode(), MNT_DETACH)
