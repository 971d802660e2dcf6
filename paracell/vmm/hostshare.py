"""Host directories and files outside the rootfs (podman's /etc/hosts,
/dev/shm, ...) reach the guest through one extra virtio-9p share: each source is
bind-mounted into a numbered slot of a share directory on the host."""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

from paracell.errors import ParacellError
from paracell.linux import MNT_DETACH, MS_BIND, MS_REC, MS_SHARED


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount_binds(share: Path, binds: list[tuple[Path, str]]) -> None:
    """Bind-mounts each (source, slot) at share/slot; all or nothing."""
    share.mkdir(mode=0o700, exist_ok=True)
    libc = _libc()
    for source, slot in binds:
        target = share / slot
        if source.is_dir():
            target.mkdir(exist_ok=True)
        else:
            target.touch(exist_ok=True)
        if libc.mount(str(source).encode(), str(target).encode(), None,
                      MS_BIND | MS_REC, None) != 0:
            err = ctypes.get_errno()
            unmount_binds(share)
            raise ParacellError(f"bind mount of {source}: {os.strerror(err)}")


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


def unmount_binds(share: Path) -> None:
    """Idempotent: delete calls it again after a shim that died mid-way."""
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


def make_shared(directory: Path) -> None:
    """directory becomes a mount point of its own, in a shared peer group, so
    that mounts made below it later reach the namespaces that copied it."""
    libc = _libc()
    path = str(directory).encode()
    if libc.mount(path, path, None, MS_BIND, None) != 0 or \
            libc.mount(None, path, None, MS_SHARED, None) != 0:
        err = ctypes.get_errno()
        remove_tree(directory)
        raise ParacellError(f"making {directory} a shared mount: {os.strerror(err)}")


def _is_mount_point(directory: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(_unescape(line.split()[4]) == str(directory) for line in f)


def remove_tree(directory: Path) -> None:
    """Unmounts everything under directory, then removes what is left with
    rmdir and unlink only: a mount that would not go leaves its directory
    non-empty, and nothing behind it is ever deleted. Idempotent."""
    if not directory.is_dir() or directory.is_symlink():
        return
    libc = _libc()
    for point in sorted(_mounts_under(directory), reverse=True):
        libc.umount2(point.encode(), MNT_DETACH)
    while _is_mount_point(directory):  # a bind of itself, perhaps stacked
        if libc.umount2(str(directory).encode(), MNT_DETACH) != 0:
            break
    left = _mounts_under(directory) + ([str(directory)] if _is_mount_point(directory) else [])
    if left:
        # What is below a mount is somebody's data: never walk into it.
        raise ParacellError(f"cannot unmount {left[0]}: {directory} is left in place")
    for top, dirs, files in os.walk(directory, topdown=False):
        for name in files:
            os.unlink(os.path.join(top, name))
        for name in dirs:
            path = os.path.join(top, name)
            if os.path.islink(path):
                os.unlink(path)
            else:
                os.rmdir(path)
    directory.rmdir()
