"""Mount points missing from a rootfs, created on the host before it is shared.

A read-only rootfs is exported read-only to the guest, so the guest agent
cannot create what the image lacks (a busybox tarball without /tmp, a pause
image without /etc/resolv.conf). runc creates these before it remounts the
root read-only; here the host does the same, inside the rootfs directory:

- a bind mount of a file gets an empty file (0644), every other mount a
  directory; missing parents are directories (0755, as runc);
- a destination is resolved as runc's securejoin does: symlinks in the rootfs
  are followed as if the rootfs were /, and `..` stops at the rootfs. The walk
  is one name at a time, relative to directory fds opened with O_NOFOLLOW, so
  no host path outside the rootfs is ever looked up;
- a destination under an earlier mount whose filesystem is not the rootfs
  (a tmpfs, /proc, /sys, a host bind) is left to the guest agent, which
  creates it in that filesystem; one under an earlier bind of a rootfs
  directory is created in that directory, where the guest will find it;
- whatever already exists is left alone, of whichever kind: a mismatch fails
  at mount time in the guest, as it does with runc.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from paracell.errors import ParacellError

MAX_SYMLINKS = 40  # the kernel's limit on one lookup, and securejoin's
DIR_MODE = 0o755
FILE_MODE = 0o644
INVALID_ROOTFS = "invalid rootfs: not an absolute path, or a symlink"


@dataclass(frozen=True)
class MountPoint:
    """One spec mount, as far as its mount point is concerned."""

    dest: str  # absolute and normalised, in the container
    directory: bool  # what to create when missing: a directory, or an empty file
    # A bind of a path inside the rootfs: that path (absolute, in the rootfs).
    # None for every other mount: its filesystem is not the rootfs.
    rootfs_source: str | None = None


def _within(path: str, top: str) -> bool:
    return top == "/" or path == top or path.startswith(top + "/")


def _locate(path: str, earlier: Sequence[MountPoint]) -> str | None:
    """Where `path` of the container lies in the rootfs once `earlier` are
    mounted in order, or None when it lies in another filesystem."""
    for i in range(len(earlier) - 1, -1, -1):
        mount = earlier[i]
        if _within(path, mount.dest):
            if mount.rootfs_source is None:
                return None
            rest = path[len(mount.dest):] if mount.dest != "/" else path
            # The guest resolves the bind's source with the mounts before it in place.
            return _locate(mount.rootfs_source.rstrip("/") + rest or "/", earlier[:i])
    return path


def open_rootfs(rootfs: Path) -> int:
    """An O_PATH fd of the rootfs, refused unless it is still the symlink-free
    path that validation checked (no component swapped for a symlink since)."""
    try:
        fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP or os.path.islink(rootfs):
            raise ParacellError(INVALID_ROOTFS) from None
        raise ParacellError(f"invalid rootfs: {rootfs}: {err.strerror}") from None
    if os.readlink(f"/proc/self/fd/{fd}") != str(rootfs):
        os.close(fd)
        raise ParacellError(INVALID_ROOTFS)
    return fd


def create_in_root(rootfd: int, path: str, directory: bool) -> None:
    """Creates `path` (resolved in the root `rootfd`) if nothing is there: a
    directory or an empty file, with missing parents as directories."""
    todo = [c for c in reversed(path.split("/")) if c not in ("", ".")]
    fds = [rootfd]  # fds[-1] is the directory being walked; fds[0] is the caller's
    links = 0
    try:
        while todo:
            name = todo.pop()
            if name == "..":
                if len(fds) > 1:
                    os.close(fds.pop())
                continue
            last = not todo
            fd = _open_or_create(fds[-1], name, directory or not last)
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                os.close(fd)
                links += 1
                if links > MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                target = os.readlink(name, dir_fd=fds[-1])
                if target.startswith("/"):
                    while len(fds) > 1:
                        os.close(fds.pop())
                todo += [c for c in reversed(target.split("/")) if c not in ("", ".")]
            elif last or not stat.S_ISDIR(mode):
                # There already, or a non-directory where a parent should be:
                # left alone either way, and the guest's mount reports it.
                os.close(fd)
                return
            else:
                fds.append(fd)
    finally:
        for fd in fds[1:]:
            os.close(fd)


def _open_or_create(dirfd: int, name: str, directory: bool) -> int:
    """An O_PATH fd of `name` in `dirfd` itself (a symlink is not followed),
    made first as a directory or an empty file if nothing is there."""
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=dirfd)
    except FileNotFoundError:
        pass
    try:
        if directory:
            os.mkdir(name, DIR_MODE, dir_fd=dirfd)
        else:
            os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW
                             | os.O_CLOEXEC, FILE_MODE, dir_fd=dirfd))
    except FileExistsError:
        pass  # made by someone else meanwhile: take what is there
    return os.open(name, flags, dir_fd=dirfd)


def create_mount_points(rootfs: Path, mounts: Sequence[MountPoint]) -> None:
    """Creates, inside `rootfs`, the mount points of `mounts` that are missing
    and belong to the rootfs."""
    rootfd = open_rootfs(rootfs)
    try:
        for i, mount in enumerate(mounts):
            path = _locate(mount.dest, mounts[:i])
            if path is None:
                continue
            try:
                create_in_root(rootfd, path, mount.directory)
            except OSError as err:
                raise ParacellError(
                    f"mount {mount.dest}: create mount point: {err.strerror}") from None
    finally:
        os.close(rootfd)
