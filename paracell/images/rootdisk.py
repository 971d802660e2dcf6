"""The read-only ext4 image of a bundle's rootfs that a snapshot-mode container
boots from (docs/snapshots.md).

A snapshot captures the VM: its RAM and its device state. A rootfs shared
from the host over 9p is neither, and QEMU refuses to save a VM whose guest
has mounted one. So a snapshot-mode container's files come from a block
device instead: this image, read-only, under a writable layer in guest RAM.

Images are cached under the cache dir by a key over the tree: every entry's
path, type, mode, owner, size, inode, mtime and ctime, and each link's
target. Any write to a file changes its ctime, which no caller can set
back, so a changed tree gets a new image and an unchanged one is reused
without reading its contents. An image is built into a temporary file and
renamed into place: a reader sees a whole image or none.

The size is rounded up to a power of two (at least 64 MiB): the guest reads
its disk's capacity at boot, before a template is saved, so the size is part
of the VM's shape, and rounding lets trees of one size class share templates.

Each image's name ends in the SHA-256 of its content, computed as it is
built. A checkpoint records that digest, never a path: a fork or a restore
finds its disk in this cache by the digest and checks the content against
it before QEMU opens it (`find`), and an image from elsewhere brings its
disk, which is copied in and checked the same way (`import_disk`). So a
checkpoint image, whoever wrote it, can never name a host file for QEMU
to open.

A running container holds a shared lock on its image; the cache keeps the
MAX_IMAGES most recently used and never removes one that is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

from paracell import safefs, settings
from paracell.errors import ParacellError

FORMAT = 1
MIN_BYTES = 64 << 20
MAX_BYTES = 64 << 30
MAX_ENTRIES = 2_000_000
MAX_IMAGES = 16
MKFS_TIMEOUT_S = 600
SUFFIX = ".ext4"
DIGEST = re.compile(r"[0-9a-f]{64}")
# Disks brought by a checkpoint image have no tree of this host behind them.
IMPORTED = "imported"


def cache() -> Path:
    return settings.rootdisk_dir()


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result, str]]:
    """Every entry under root, never through a link: (relative path, lstat, link target)."""
    pending = [""]
    while pending:
        rel = pending.pop()
        with os.scandir(root / rel if rel else root) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                path = f"{rel}/{entry.name}" if rel else entry.name
                st = entry.stat(follow_symlinks=False)
                target = os.readlink(entry.path) if stat.S_ISLNK(st.st_mode) else ""
                yield path, st, target
                if stat.S_ISDIR(st.st_mode):
                    pending.append(path)


def tree_key(root: Path) -> tuple[str, int, int]:
    """The tree's key, its bytes in regular files, and its number of entries."""
    digest = hashlib.sha256(f"rootdisk {FORMAT}\0".encode())
    top = os.lstat(root)
    digest.update(f"{top.st_mode} {top.st_uid} {top.st_gid}\0".encode())
    total = entries = 0
    for path, st, target in _walk(root):
        entries += 1
        if entries > MAX_ENTRIES:
            raise ParacellError(f"snapshot mode: the rootfs {root} has more than "
                                f"{MAX_ENTRIES} entries")
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
        digest.update(f"{path}\0{st.st_mode} {st.st_uid} {st.st_gid} {st.st_size} {st.st_ino} "
                      f"{st.st_mtime_ns} {st.st_ctime_ns} {st.st_rdev}\0{target}\0".encode())
    return digest.hexdigest()[:32], total, entries


def image_bytes(content: int, entries: int) -> int:
    """Room for the files, their inodes and ext4's own metadata, rounded up to a
    power of two."""
    need = content * 5 // 4 + entries * 4096 + (16 << 20)
    size = MIN_BYTES
    while size < need:
        size <<= 1
    if size > MAX_BYTES:
        raise ParacellError(f"snapshot mode: the rootfs needs a {need >> 20} MiB image, more "
                            f"than the {MAX_BYTES >> 30} GiB a root disk may have")
    return size


@contextlib.contextmanager
def _locked(directory: Path, name: str) -> Iterator[None]:
    fd = os.open(directory / f".{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
                 | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _usable(path: Path, size: int) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == size


def _named(directory: Path, prefix: str = "", suffix: str = SUFFIX) -> list[Path]:
    """The cache's images whose names start and end so (no temporaries)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [directory / n for n in sorted(names)
            if n.startswith(prefix) and n.endswith(suffix) and not n.startswith(".")]


def digest_of(path: Path) -> str:
    """The content digest an image's name carries."""
    digest = path.name.removesuffix(SUFFIX).rpartition("-")[2]
    if not DIGEST.fullmatch(digest):
        raise ParacellError(f"root disk {path.name} carries no content digest")
    return digest


def image_for(rootfs: Path) -> Path:
    """The cached image of this tree, built if the cache has none."""
    key, content, entries = tree_key(rootfs)
    size = image_bytes(content, entries)
    directory = cache()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    prefix = f"{key}-{size >> 20}M-"
    found = next((p for p in _named(directory, prefix) if _usable(p, size)), None)
    if found is None:
        with _locked(directory, key):
            found = next((p for p in _named(directory, prefix) if _usable(p, size)), None)
            if found is None:
                found = _build(rootfs, directory, prefix, size, entries)
        _evict(directory, keep=found)
    os.utime(found, follow_symlinks=False)
    return found


def _open_image(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ParacellError(f"root disk {path.name} is not a regular file")
    return fd


def find(digest: str) -> Path | None:
    """The cached image with this content, checked byte for byte against the
    digest; None if the cache has none whose content matches its name."""
    if not DIGEST.fullmatch(digest):
        raise ParacellError("a root disk digest must be 64 hex digits")
    for path in _named(cache(), suffix=f"-{digest}{SUFFIX}"):
        try:
            fd = _open_image(path)
        except (OSError, ParacellError):
            continue
        try:
            matches = safefs.sha256_fd(fd) == digest
        finally:
            os.close(fd)
        if matches:
            os.utime(path, follow_symlinks=False)
            return path
    return None


def import_disk(source_fd: int, digest: str) -> Path:
    """A root disk from elsewhere (a checkpoint image), copied into the cache
    and checked against its digest there, so QEMU opens only the cache's copy."""
    if not DIGEST.fullmatch(digest):
        raise ParacellError("a root disk digest must be 64 hex digits")
    size = safefs.check_regular(source_fd, "the image's root disk", MAX_BYTES).st_size
    if size < MIN_BYTES or size & (size - 1):
        raise ParacellError(f"the image's root disk is {size} bytes: a root disk is a power "
                            f"of two from {MIN_BYTES >> 20} MiB")
    directory = cache()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{IMPORTED}-{size >> 20}M-{digest}{SUFFIX}"
    with _locked(directory, digest[:32]):
        # A damaged copy of the same name is replaced (a VM using it keeps its inode).
        tmp = path.with_name(f".new-{os.getpid()}-{path.name}")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
            try:
                safefs.sparse_copy(source_fd, fd, size)
                if safefs.sha256_fd(fd) != digest:
                    raise ParacellError("the image's root disk does not match its digest "
                                        "(damaged or tampered with)")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.chmod(tmp, 0o444)
            os.rename(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    _evict(directory, keep=path)
    return path


def _build(rootfs: Path, directory: Path, prefix: str, size: int, entries: int) -> Path:
    tmp = directory / f".new-{os.getpid()}-{prefix}{SUFFIX}"
    try:
        with open(tmp, "xb") as f:
            f.truncate(size)
        # No journal: the image is only ever mounted read-only.
        cmd = ["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-m", "0", "-b", "4096",
               "-N", str(entries + 1024), "-L", "paracell-root", "-d", str(rootfs), str(tmp)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=MKFS_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise ParacellError("snapshot mode needs mkfs.ext4: install e2fsprogs") from None
        except subprocess.TimeoutExpired:
            raise ParacellError(f"snapshot mode: mkfs.ext4 of {rootfs} took over "
                                f"{MKFS_TIMEOUT_S} s") from None
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise ParacellError(f"snapshot mode: building the root disk of {rootfs}: {why}")
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
            path = directory / f"{prefix}{safefs.sha256_fd(fd)}{SUFFIX}"
        finally:
            os.close(fd)
        os.chmod(tmp, 0o444)
        os.rename(tmp, path)
        return path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def hold(path: Path) -> int:
    """An fd that marks the image in use for as long as it is open."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def _evict(directory: Path, keep: Path) -> None:
    images = []
    for entry in os.scandir(directory):
        if entry.name.endswith(SUFFIX) and not entry.name.startswith(".") \
                and entry.is_file(follow_symlinks=False):
            images.append((entry.stat(follow_symlinks=False).st_mtime_ns, Path(entry.path)))
    images.sort(reverse=True)
    for _, path in images[MAX_IMAGES:]:
        if path == keep:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a running container's disk
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        finally:
            os.close(fd)
