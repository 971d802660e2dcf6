"""VM templates: a VM saved at the agent's READY, before anything makes it
one sandbox's, and restored in place of a cold boot (docs/templates.md).

A template is a directory of the template store named by its key:
  meta.json     format, key, the shape it was keyed from, sizes, device MACs,
                whether its RAM may be mapped copy-on-write, and the digests
                of the other two, written last
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

A template is checked as one unit: meta.json holds the SHA-256 of
device.state and the digest of ram's pages (csrc/ramcopy.c), so RAM from
another save, truncated or written over fails its restore before the guest
runs; each file is opened once, and what was checked is what QEMU gets. A
restored guest runs the template's memory and QEMU parses its device
state, so the store, and every template in it, must be writable by its
owner alone, who must be the caller (as sshd's StrictModes): anything else
is refused in one line.
"""

from __future__ import annotations

import contextlib
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

from paracell import safefs
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


def summary(shape: Any) -> dict[str, Any]:
    """What `template list` shows of a template's shape (VmBuilder.shape),
    which may come from a damaged meta.json: RAM, vCPUs, the memory manager,
    NICs, and whether it is a pod's VM."""
    shape = shape if isinstance(shape, dict) else {}
    found = [d for d in shape.get("devices") or [] if isinstance(d, dict)] \
        if isinstance(shape.get("devices"), list) else []
    kinds = [d.get("kind") for d in found]
    nics = sum(d.get("nics", 0) + d.get("spares", 0) for d in found if d.get("kind") == "net")
    return {"memory_mib": shape.get("memory_mib"), "vcpus": shape.get("vcpus"),
            "memory_manager": next((k for k in ("pager", "balloon") if k in kinds), "none"),
            "nics": nics, "pod": "pod-share" in kinds}


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


def owned_by_caller(st: os.stat_result, what: str) -> None:
    """Refuses what anyone but the caller could have written."""
    me = os.geteuid()
    if st.st_uid != me or st.st_mode & 0o022:
        raise ParacellError(f"{what} is writable by others (owner uid {st.st_uid}, mode "
                            f"{stat.S_IMODE(st.st_mode):04o}): refused, as only uid {me} may "
                            "write what it restores")


def check_ancestors(path: Path) -> None:
    """Every directory above path: owned by root or the caller, and writable
    by nobody else, unless sticky and root's (/tmp), where no one else can
    rename what is ours."""
    me = os.geteuid()
    for parent in Path(os.path.abspath(path)).parents:
        st = os.stat(parent)
        sticky_root = st.st_mode & stat.S_ISVTX and st.st_uid == 0
        if st.st_uid not in (0, me) or (st.st_mode & 0o022 and not sticky_root):
            raise ParacellError(f"template store {path}: {parent} is writable by others "
                                f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): "
                                "refused")


def _open_in(dir_fd: int, name: str, key: str, size: int | None = None,
             limit: int | None = None) -> int:
    """A file of a template, never through a link, the caller's alone; its fd."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=dir_fd)
    except OSError as err:
        raise TemplateError(f"template {key}: {name}: {err.strerror}") from None
    st = os.fstat(fd)
    why = ("not a regular file" if not stat.S_ISREG(st.st_mode)
           else f"{st.st_size} bytes, expected {size}" if size is not None and st.st_size != size
           else f"larger than {limit} bytes" if limit is not None and st.st_size > limit
           else "empty" if st.st_size == 0 else "")
    try:
        if why:
            raise TemplateError(f"template {key}: {name}: {why}")
        owned_by_caller(st, f"template {key}: {name}")
    except ParacellError as err:
        os.close(fd)
        raise TemplateError(str(err)) from None
    return fd


def ram_copy(source_fd: int, target_fd: int, size: int) -> str:
    """Copies guest RAM (pages that are not zero) and returns its digest
    (csrc/ramcopy.c); target_fd -1 only digests."""
    from paracell._native import ffi, lib

    out = ffi.new("struct pc_ram_digest *")
    err = ffi.new("char[]", 256)
    if lib.pc_ram_copy(source_fd, target_fd, size, out, err, 256) != 0:
        raise TemplateError(f"copying guest RAM: {ffi.string(err).decode(errors='replace')}")
    return f"{out.high:016x}{out.low:016x}"




@dataclass
class Template:
    """A template found whole and consistent with the key it was asked for,
    its files open: what was checked is what is used (close() ends it)."""

    path: Path
    meta: dict[str, Any]
    state_fd: int = -1  # device.state, its SHA-256 checked
    ram_fd: int = -1    # ram, checked against its digest as it is copied

    @property
    def key(self) -> str:
        return self.path.name

    @property
    def macs(self) -> list[str]:
        return list(self.meta["macs"])

    @property
    def shareable(self) -> bool:
        return self.meta.get("shareable") is True

    def copy_ram(self, target_fd: int) -> None:
        """The template's RAM into a new VM's RAM file; a TemplateError, and
        nothing a guest may run on, if it is not the RAM that was saved."""
        self._check(ram_copy(self.ram_fd, target_fd, self.meta["ram_bytes"]))

    def check_ram(self) -> None:
        """The same check, for a VM that maps the template's RAM itself
        (copy-on-write): the file QEMU maps is ram_fd's."""
        self._check(ram_copy(self.ram_fd, -1, self.meta["ram_bytes"]))

    def _check(self, digest: str) -> None:
        if digest != self.meta["ram_digest"]:
            raise TemplateError(f"template {self.key}: ram does not match its digest (damaged, "
                                "or not the RAM its device state was saved with)")

    def close(self) -> None:
        for fd in (self.state_fd, self.ram_fd):
            if fd >= 0:
                os.close(fd)
        self.state_fd = self.ram_fd = -1


@dataclass(frozen=True)
class Capture:
    """What a template is saved from: a VM stopped at READY. `save_state`
    writes the device state to a new file at a path; the files are the VM's own."""

    save_state: Callable[[Path], object]
    ram: Path
    ram_bytes: int
    macs: list[str]
    # Whether VMs may map its RAM copy-on-write: this QEMU loads the RAM plugin.
    shareable: bool = False


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
        try:
            owned_by_caller(os.fstat(fd), f"template store {self.root}")
        except BaseException:
            os.close(fd)
            raise
        self.root, self._pinned = Path(f"/proc/self/fd/{fd}"), True

    def _check_root(self, create: bool) -> bool:
        """Whether the store exists; it is a real directory, never a link,
        that only the caller can write, under directories no one else can."""
        if self._pinned:
            return True
        check_ancestors(self.root)
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
        owned_by_caller(st, f"template store {self.root}")
        return True

    def find(self, key: str, shape: dict[str, Any]) -> Template | None:
        """The template of this key, open, None if there is none; TemplateError
        if there is one that cannot be used. The caller closes it."""
        if not KEY.fullmatch(key) or not self._check_root(create=False):
            return None
        path = self.root / key
        try:
            dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise TemplateError(f"template {key} is not a directory ({err.strerror})") from None
        template = Template(path, {})
        try:
            try:
                owned_by_caller(os.fstat(dir_fd), f"template {key}")
            except ParacellError as err:
                raise TemplateError(str(err)) from None
            template.meta = self._checked(_read_meta(dir_fd, key), key, shape)
            # Every file is checked before QEMU is asked to read any of them.
            template.state_fd = _open_in(dir_fd, STATE, key, limit=MAX_STATE_BYTES)
            template.ram_fd = _open_in(dir_fd, RAM, key, size=template.meta["ram_bytes"])
            if safefs.sha256_fd(template.state_fd) != template.meta["state_sha256"]:
                raise TemplateError(f"template {key}: device.state does not match its digest "
                                    "(damaged, or from another save)")
            with contextlib.suppress(OSError):
                os.utime(META, dir_fd=dir_fd)  # recently used: pruned last
        except BaseException:
            template.close()
            raise
        finally:
            os.close(dir_fd)
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
        if not isinstance(meta.get("state_sha256"), str) \
                or not isinstance(meta.get("ram_digest"), str):
            raise TemplateError(f"template {key}: {META} has no digests of its files")
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
                state_fd = os.open(tmp / STATE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    state_sha256 = safefs.sha256_fd(state_fd)
                finally:
                    os.close(state_fd)
                ram_digest = _copy_ram_new(capture.ram, tmp / RAM, capture.ram_bytes)
                meta = {"format": FORMAT, "key": key, "shape": shape, "created": time.time(),
                        "ram_bytes": capture.ram_bytes, "macs": capture.macs,
                        "state_sha256": state_sha256, "ram_digest": ram_digest,
                        "shareable": capture.shareable}
                # Last: a template is whole once its digests are written.
                fd = os.open(tmp / META, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(meta, indent=1))
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
                dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                 | os.O_CLOEXEC)
                try:
                    meta = _read_meta(dir_fd, path.name)
                finally:
                    os.close(dir_fd)
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


def _read_meta(dir_fd: int, key: str) -> Any:
    fd = _open_in(dir_fd, META, key, limit=MAX_META_BYTES)
    try:
        raw = os.read(fd, MAX_META_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise TemplateError(f"template {key}: {META} is not valid JSON") from None


def _copy_ram_new(source: Path, target: Path, size: int) -> str:
    """The VM's RAM copied to target, a new file; the copy's digest."""
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600)
        try:
            return ram_copy(src, dst, size)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def store() -> TemplateStore:
    from paracell import settings

    return TemplateStore(settings.template_dir())
