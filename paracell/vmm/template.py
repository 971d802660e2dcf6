"""VM templates: a VM saved at the agent's READY, before anything makes it
one sandbox's, and restored in place of a cold boot (docs/templates.md).

A template is a directory of the template store named by its key:
  meta.json     format, key, the shape it was keyed from, sizes, device MACs
  device.state  QEMU's device state (Hypervisor.save: RAM is not in it)
  ram           guest RAM, sparse: only what the guest had touched
The key hashes everything a restore needs to match (VmBuilder.shape): the
QEMU binary, the kernel and initramfs, the kernel command line, the machine,
RAM, vCPUs and every device's shape. What differs per sandbox (paths, fds,
MACs) is the new QEMU's backend configuration or arrives in SANDBOX.

Templates are built by the creates that find none, under a lock per key,
into a temporary directory renamed into place: a reader sees a whole
template or none. Anything a reader finds wrong is a TemplateError, and the
caller boots cold and removes it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paracell.errors import ParacellError

FORMAT = 1
META, STATE, RAM = "meta.json", "device.state", "ram"
MAX_META_BYTES = 1 << 16
MAX_STATE_BYTES = 64 << 20
# Each template holds up to its guest's touched RAM on disk; the least
# recently used go beyond this many.
MAX_TEMPLATES = 8
KEY = re.compile(r"[0-9a-f]{32}")
MAC = re.compile(r"([0-9a-f]{2}:){5}[0-9a-f]{2}")
_TMP_PREFIX = ".new-"


class TemplateError(ParacellError):
    """A template that cannot be used; the text says why, in one line."""


def key_of(shape: dict[str, Any]) -> str:
    blob = json.dumps(shape, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def binary_identity(path: str) -> list[int | str]:
    """What tells one QEMU binary from another without reading 20 MiB."""
    st = os.stat(path)
    return [os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino]


@functools.lru_cache(maxsize=1)
def source_identity() -> str:
    """The code that decides QEMU's command line and devices: a template made
    by another version of it is another machine."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in (here / "builder.py", here / "devices.py", here.parent / "net" / "device.py"):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def sparse_copy(source_fd: int, target_fd: int) -> int:
    """Copies the data extents of source into target (same size, holes kept);
    the bytes copied. The kernel moves the data (sendfile): one call per extent."""
    size = os.fstat(source_fd).st_size
    os.ftruncate(target_fd, size)
    copied = offset = 0
    while offset < size:
        try:
            offset = os.lseek(source_fd, offset, os.SEEK_DATA)
        except OSError as err:
            if err.errno == errno.ENXIO:  # no data past offset
                break
            raise
        end = os.lseek(source_fd, offset, os.SEEK_HOLE)
        os.lseek(target_fd, offset, os.SEEK_SET)
        while offset < end:
            sent = os.sendfile(target_fd, source_fd, offset, end - offset)
            if sent == 0:
                raise OSError(errno.EIO, "short copy of a sparse file")
            offset += sent
            copied += sent
    return copied


def _open_regular(path: Path, size: int | None = None, limit: int | None = None) -> int:
    """A file of the template, never through a link; its fd."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        raise TemplateError(f"template file {path.name}: {err.strerror}") from None
    st = os.fstat(fd)
    why = ("not a regular file" if not stat.S_ISREG(st.st_mode)
           else f"{st.st_size} bytes, expected {size}" if size is not None and st.st_size != size
           else f"larger than {limit} bytes" if limit is not None and st.st_size > limit
           else "empty" if st.st_size == 0 else "")
    if why:
        os.close(fd)
        raise TemplateError(f"template file {path.name}: {why}")
    return fd


@dataclass(frozen=True)
class Template:
    """A template found whole and consistent with the key it was asked for."""

    path: Path
    meta: dict[str, Any]

    @property
    def key(self) -> str:
        return self.path.name

    @property
    def state(self) -> Path:
        return self.path / STATE

    @property
    def macs(self) -> list[str]:
        return list(self.meta["macs"])

    def copy_ram(self, target_fd: int) -> int:
        fd = _open_regular(self.path / RAM, self.meta["ram_bytes"])
        try:
            return sparse_copy(fd, target_fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class Capture:
    """What a template is saved from: a VM stopped at READY. `save_state`
    writes the device state to a path; the files are the VM's own."""

    save_state: Callable[[Path], object]
    ram: Path
    ram_bytes: int
    macs: list[str]


class TemplateStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._pinned = False

    def pin(self) -> None:
        """Makes the store, opens it, and goes through that directory fd from
        now on (/proc/self/fd/N). The shim pins it before it jails itself:
        the jail makes /var read-only in the shim's mount namespace, and an
        fd opened before still reaches the store's own, writable mount. Only
        the shim holds it (close-on-exec: QEMU never does)."""
        self._check_root(create=True)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.root, self._pinned = Path(f"/proc/self/fd/{fd}"), True

    def _check_root(self, create: bool) -> bool:
        """Whether the store exists; it is a real directory, never a link."""
        if self._pinned:
            return True
        try:
            st = os.lstat(self.root)
        except FileNotFoundError:
            if not create:
                return False
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(self.root)
        if not stat.S_ISDIR(st.st_mode):
            raise ParacellError(f"template store {self.root} is not a directory (a link is "
                                "never followed)")
        return True

    def find(self, key: str, shape: dict[str, Any]) -> Template | None:
        """The template of this key, None if there is none; TemplateError if
        there is one that cannot be used."""
        if not KEY.fullmatch(key) or not self._check_root(create=False):
            return None
        path = self.root / key
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            raise TemplateError(f"template {key} is not a directory")
        meta = self._checked(_read_meta(path), key, shape)
        template = Template(path, meta)
        # Every file is checked before QEMU is asked to read any of them.
        for name, size, limit in ((STATE, None, MAX_STATE_BYTES), (RAM, meta["ram_bytes"], None)):
            os.close(_open_regular(path / name, size, limit))
        with contextlib.suppress(OSError):
            os.utime(path / META)  # recently used: pruned last
        return template

    @staticmethod
    def _checked(meta: Any, key: str, shape: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise TemplateError(f"template {key}: not format {FORMAT}")
        if meta.get("key") != key or meta.get("shape") != shape:
            raise TemplateError(f"template {key}: made for another VM shape")
        ram, macs = meta.get("ram_bytes"), meta.get("macs")
        if ram != shape.get("memory_mib", 0) << 20:
            raise TemplateError(f"template {key}: its RAM size is not the VM's")
        if not isinstance(macs, list) or len(macs) > 64 \
                or not all(isinstance(m, str) and MAC.fullmatch(m) for m in macs):
            raise TemplateError(f"template {key}: bad MACs in {META}")
        return meta

    @contextlib.contextmanager
    def _locked(self, key: str, wait: bool) -> Iterator[bool]:
        """The key's lock: whether it is held (without wait, a holder elsewhere
        means no)."""
        self._check_root(create=True)
        fd = os.open(self.root / f".{key}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _building(self, key: str) -> Iterator[bool]:
        """Whether this process builds the key's template now: a second
        builder of the same key does not wait, it leaves it to the first."""
        with self._locked(key, wait=False) as held:
            yield held and not os.path.lexists(self.root / key)

    def save(self, key: str, shape: dict[str, Any], capture: Capture) -> Template | None:
        """Saves the VM as the key's template, unless another process is
        saving it or it exists; the template, or None when not this one's."""
        if not KEY.fullmatch(key):
            raise ParacellError(f"bad template key {key!r}")
        with self._building(key) as mine:
            if not mine:
                return None
            tmp = self.root / f"{_TMP_PREFIX}{key}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(mode=0o700)
            try:
                capture.save_state(tmp / STATE)
                _copy_new(capture.ram, tmp / RAM)
                meta = {"format": FORMAT, "key": key, "shape": shape, "created": time.time(),
                        "ram_bytes": capture.ram_bytes, "macs": capture.macs}
                (tmp / META).write_text(json.dumps(meta, indent=1))
                os.rename(tmp, self.root / key)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        self.prune()
        return Template(self.root / key, meta)

    def remove(self, key: str) -> bool:
        """Removes one template; whether it existed. Under the key's lock, so
        a create that is building it is not cut short halfway."""
        if not KEY.fullmatch(key) or not self._check_root(create=False):
            return False
        path = self.root / key
        with self._locked(key, wait=True):
            if not os.path.lexists(path):
                return False
            # Renamed away first: a reader sees the whole template or none.
            doomed = self.root / f"{_TMP_PREFIX}{key}-rm-{os.getpid()}"
            os.rename(path, doomed)
        if stat.S_ISDIR(os.lstat(doomed).st_mode):
            shutil.rmtree(doomed, ignore_errors=True)
        else:
            doomed.unlink(missing_ok=True)
        return True

    def entries(self) -> list[dict[str, Any]]:
        """Every template, most recently used first: key, shape, sizes, or the
        reason it cannot be used."""
        if not self._check_root(create=False):
            return []
        found = []
        for path in self.root.iterdir():
            if not KEY.fullmatch(path.name):
                continue
            entry: dict[str, Any] = {"key": path.name}
            try:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    raise TemplateError("not a directory")
                meta = _read_meta(path)
                shape = meta.get("shape") if isinstance(meta, dict) else None
                entry.update(used=os.lstat(path / META).st_mtime,
                             shape=shape if isinstance(shape, dict) else {},
                             disk_bytes=sum(os.lstat(f).st_blocks * 512 for f in path.iterdir()))
            except (OSError, ParacellError) as err:
                entry.update(used=0.0, shape={}, disk_bytes=0, broken=str(err)[:120])
            found.append(entry)
        return sorted(found, key=lambda e: -e["used"])

    def prune(self) -> None:
        for entry in self.entries()[MAX_TEMPLATES:]:
            self.remove(entry["key"])


def _read_meta(path: Path) -> Any:
    fd = _open_regular(path / META, limit=MAX_META_BYTES)
    try:
        raw = os.read(fd, MAX_META_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise TemplateError(f"template {path.name}: {META} is not valid JSON") from None


def _copy_new(source: Path, target: Path) -> int:
    """A sparse copy of source at target, a new file; its size."""
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600)
        try:
            sparse_copy(src, dst)
            return os.fstat(dst).st_size
        finally:
            os.close(dst)
    finally:
        os.close(src)


def store() -> TemplateStore:
    from paracell import settings

    return TemplateStore(settings.template_dir())
