"""Host directories and files outside the rootfs (podman's /etc/hosts,
/dev/shm, ...) reach the guest through one extra virtio-9p share: each source is
bind-mounted into a numbered slot of a share directory on the host, under
its own name (`bind_entry`)."""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

from paracell.errors import ParacellError
from paracell.linux import MNT_DETACH, MS_BIND, MS_REC, MS_SHARED, libc


def mount(source: Path | None, target: Path, flags: int) -> None:
    """mount(2) without a filesystem type: a bind, a remount or a propagation
    change; one line on failure."""
    src = str(source).encode() if source is not None else None
    if libc().mount(src, str(target).encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise ParacellError(f"mount of {source or target}: {os.strerror(err)}")


# The longest name a bind gets in its slot: any one name of a path (NAME_MAX).
NAME_MAX = 255


def bind_entry(slot: str, source: Path) -> str:
    """Where a bind source sits in the share: `SLOT/NAME`, NAME being the
    source's own name. The guest's /proc/self/mountinfo shows the bind's root
    as that path, so its last component is the source's, as under runc, where
    tools such as findmnt and runtime-tools' mount checks look. The slot, a
    number, keeps two sources of one name apart."""
    return f"{slot}/{_share_name(source.name)}"


def _share_name(name: str) -> str:
    # The name travels in a launch-spec record, which holds no control
    # characters, and as UTF-8, which a name of other bytes is not (Path keeps
    # them as lone surrogates): either becomes "_". "/" has no name.
    safe = "".join(c if c.isprintable() and c != "/" else "_" for c in name)
    safe = safe.encode()[:NAME_MAX].decode(errors="ignore")
    return "_" if safe in ("", ".", "..") else safe


def _split_entry(entry: str) -> tuple[str, str]:
    slot, _, name = entry.partition("/")
    if not (slot.isascii() and slot.isdigit()) or _share_name(name) != name:
        raise ParacellError(f"invalid host share entry {entry!r}")
    return slot, name


def mount_binds(share: Path, binds: list[tuple[Path, str]]) -> None:
    """Bind-mounts each (source, entry) at share/entry, an entry being
    `bind_entry`'s SLOT/NAME; all or nothing."""
    share.mkdir(mode=0o700, exist_ok=True)
    try:
        for source, entry in binds:
            slot, name = _split_entry(entry)
            (share / slot).mkdir(mode=0o700, exist_ok=True)
            target = share / slot / name
            if source.is_dir():
                target.mkdir(exist_ok=True)
            else:
                target.touch(exist_ok=True)
            mount(source, target, MS_BIND | MS_REC)
    except BaseException:
        remove_tree(share)
        raise


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


def make_shared(directory: Path) -> None:
    """directory becomes a mount point of its own, in a shared peer group, so
    that mounts made below it later reach the namespaces that copied it."""
    try:
        mount(directory, directory, MS_BIND)
        mount(None, directory, MS_SHARED)
    except ParacellError:
        remove_tree(directory)
        raise


def _is_mount_point(directory: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(_unescape(line.split()[4]) == str(directory) for line in f)


def remove_tree(directory: Path) -> None:
    """Unmounts everything under directory, then removes what is left with
    rmdir and unlink only: a mount that would not go leaves its directory
    non-empty, and nothing behind it is ever deleted. Idempotent."""
    if not directory.is_dir() or directory.is_symlink():
        return
    lib = libc()
    for point in sorted(_mounts_under(directory), reverse=True):
        lib.umount2(point.encode(), MNT_DETACH)
    while _is_mount_point(directory):  # a bind of itself, perhaps stacked
        if lib.umount2(str(directory).encode(), MNT_DETACH) != 0:
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
