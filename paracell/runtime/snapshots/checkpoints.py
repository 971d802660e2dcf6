"""A sandbox's checkpoints on disk (docs/snapshots.md), under its state
directory, removed with it:

  checkpoints/.seed          the per-container seed of the page hashes (8 bytes)
  checkpoints/.vmstate.qcow2 QEMU's device states, one internal snapshot per checkpoint
  checkpoints/NAME/meta.json     what the checkpoint is, and the SHA-256 of the two tables
  checkpoints/NAME/hashes.bin    every page's hash (u64 LE, 0 for a hole)
  checkpoints/NAME/loc.bin       where every page's content is kept ((u32 seq, u32 slot) LE)
  checkpoints/NAME/pages.bin     the pages that changed since its parent, in order
  checkpoints/NAME/fork-ram      its RAM whole, made at its first fork that shares
                                 memory: forks map it copy-on-write, read-only

A checkpoint is written into a temporary directory and renamed into place,
so a reader sees a whole one or none. Everything read back is checked
before use: the name, every field of meta.json (numbers within what a VM
can hold), each file's size, the tables' SHA-256, and (in C, before any
page is written back) each page against its hash. The root disk is named
by its content digest, never by a path (paracell/images/rootdisk.py).
A checkpoint that fails these checks is skipped by listings, with one
warning, and refused by name. A checkpoint's fork RAM is made from pages so
checked, and mapped by forks as it is: it is the store's own file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from paracell import safefs
from paracell.errors import ParacellError

FORMAT = 2
DIR = "checkpoints"
# Internal files begin with a dot, which no checkpoint name may.
SEED = ".seed"
VMSTATE = ".vmstate.qcow2"
META, HASHES, LOC, PAGES = "meta.json", "hashes.bin", "loc.bin", "pages.bin"
FORK_RAM = "fork-ram"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_META_BYTES = 1 << 16
# A qcow2 of device states: tens of KiB each, and the qcow2's own tables.
MAX_VMSTATE_BYTES = 64 << 20
DEFAULT_LIMIT = 16
CHECKED_TABLES_KEPT = 4
LIMIT_ANNOTATION = "io.paracell.snapshot.max-checkpoints"
MAX_LIMIT = 256
_TMP = ".new-"
KEPT = ".kept-"
# What a checkpoint's numbers may be: a sequence number fits the page
# tables' u32, RAM is what a guest can have.
MAX_SEQ = (1 << 31) - 1
MAX_RAM_BYTES = 1 << 40
SHA256 = re.compile(r"[0-9a-f]{64}")


class CheckpointError(ParacellError):
    """A checkpoint that cannot be used; the text says why, in one line."""


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        shown = name[:40] if isinstance(name, str) else type(name).__name__
        raise CheckpointError(f"invalid checkpoint name {shown!r}: 1 to 64 letters, digits, "
                              "'_', '.' or '-', starting with a letter or digit")
    return name


def limit_of(annotations: dict[str, str]) -> int:
    """How many checkpoints a sandbox may keep: the annotation, else the default."""
    value = annotations.get(LIMIT_ANNOTATION)
    if value is None:
        return DEFAULT_LIMIT
    if not value.isdigit() or not 1 <= int(value) <= MAX_LIMIT:
        raise ParacellError(f"invalid annotation {LIMIT_ANNOTATION}={value[:32]!r}: expected "
                            f"1..{MAX_LIMIT}")
    return int(value)


@dataclass(frozen=True)
class Checkpoint:
    name: str
    seq: int
    parent: int  # the seq of the checkpoint its unchanged pages come from; 0 for none
    created: float
    key: str  # the VM's shape (templatestore.key_of): a VM of another shape refuses it
    ram_bytes: int
    pages_saved: int
    vmstate_tag: str
    sha256: dict[str, str]  # file name -> digest
    # The content digest of the image the VM's files live on: a fork of it
    # boots the cached image of that content, and no other.
    rootdisk_sha256: str

    @property
    def pages(self) -> int:
        return self.ram_bytes // 4096


def _sha256(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return safefs.sha256_fd(fd)
    finally:
        os.close(fd)


def _regular(path: Path) -> os.stat_result:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path.parent.name}/{path.name} is missing") \
            from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"checkpoint file {path.parent.name}/{path.name} is not a "
                              "regular file")
    return st


def _field(meta: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = meta.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CheckpointError(f"checkpoint meta.json: {key} is missing or of the wrong type")
    return value


def _number(meta: dict[str, Any], key: str, low: int, high: int) -> int:
    value = _field(meta, key, int)
    if not low <= value <= high:
        raise CheckpointError(f"checkpoint meta.json: {key} is out of range")
    return value


def _time(meta: dict[str, Any], key: str) -> float:
    try:
        value = float(_field(meta, key, (int, float)))
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or value < 0:
        raise CheckpointError(f"checkpoint meta.json: {key} is out of range")
    return value


def parse_meta(raw: bytes, name: str) -> Checkpoint:
    """A checkpoint's meta.json, checked field by field: damage of any kind,
    however deep or large, is one CheckpointError."""
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError):
        raise CheckpointError(f"checkpoint {name}: meta.json is not JSON") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {name}: not a format-{FORMAT} checkpoint")
    sha = _field(meta, "sha256", dict)
    if set(sha) != {HASHES, LOC} or not all(
            isinstance(v, str) and SHA256.fullmatch(v) for v in sha.values()):
        raise CheckpointError(f"checkpoint {name}: meta.json has bad digests")
    found = Checkpoint(
        name=name, seq=_number(meta, "seq", 1, MAX_SEQ),
        parent=_number(meta, "parent", 0, MAX_SEQ), created=_time(meta, "created"),
        key=_field(meta, "key", str), ram_bytes=_number(meta, "ram_bytes", 4096, MAX_RAM_BYTES),
        pages_saved=_number(meta, "pages_saved", 0, MAX_RAM_BYTES // 4096),
        vmstate_tag=_field(meta, "vmstate_tag", str), sha256=sha,
        rootdisk_sha256=_field(meta, "rootdisk_sha256", str))
    if _field(meta, "name", str) != name or found.parent >= found.seq \
            or found.ram_bytes % 4096 or found.pages_saved > found.pages \
            or found.vmstate_tag != f"pc-{found.seq}" \
            or not SHA256.fullmatch(found.rootdisk_sha256):
        raise CheckpointError(f"checkpoint {name}: meta.json is inconsistent")
    return found


def meta_json(ckpt: Checkpoint) -> bytes:
    """The one writer of what parse_meta reads."""
    return json.dumps({"format": FORMAT, **asdict(ckpt)}).encode()


class CheckpointStore:
    """One sandbox's checkpoints."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir) / DIR
        # Tables this store wrote or checked, by checkpoint name: the files'
        # identity then, and the tables (checked_tables).
        self._checked: dict[str, tuple[tuple[int, ...], Any, Any]] = {}

    def ensure(self) -> None:
        self.dir.mkdir(mode=0o700, exist_ok=True)
        if self.dir.is_symlink() or not self.dir.is_dir():
            raise CheckpointError(f"{self.dir} is not a directory")

    def seed(self) -> int:
        """The page hashes' seed: random, made once, never leaves the host."""
        self.ensure()
        path = self.dir / SEED
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(8))
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            data = os.read(fd, 9)
        finally:
            os.close(fd)
        if len(data) != 8:
            raise CheckpointError("the checkpoints' seed is damaged")
        return int.from_bytes(data, "little")

    @property
    def vmstate(self) -> Path:
        return self.dir / VMSTATE

    def _open_vmstate(self) -> tuple[int, int]:
        try:
            fd = os.open(self.vmstate, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            raise CheckpointError(f"the device states' qcow2: {err.strerror}") from None
        try:
            st = safefs.check_regular(fd, "the device states' qcow2", MAX_VMSTATE_BYTES)
        except ParacellError as err:
            os.close(fd)
            raise CheckpointError(str(err)) from None
        return fd, st.st_size

    def copy_vmstate(self, target_fd: int) -> str:
        """The device states' qcow2 into target (open for reading too), never
        through a link and bounded by what it can be; the SHA-256 of what was
        copied."""
        fd, size = self._open_vmstate()
        try:
            safefs.sparse_copy(fd, target_fd, size)
        finally:
            os.close(fd)
        return safefs.sha256_fd(target_fd)

    def vmstate_digest(self) -> str:
        fd, _ = self._open_vmstate()
        try:
            return safefs.sha256_fd(fd)
        finally:
            os.close(fd)

    def names(self) -> list[str]:
        if not self.dir.is_dir():
            return []
        return sorted(e.name for e in os.scandir(self.dir)
                      if NAME.fullmatch(e.name) and e.is_dir(follow_symlinks=False))

    def load(self, name: str) -> Checkpoint:
        """The checkpoint, its meta.json checked field by field; the files'
        digests are checked by `verify`."""
        check_name(name)
        where = self.dir / name
        if where.is_symlink() or not where.is_dir():
            raise CheckpointError(f"no checkpoint {name!r}")
        meta_path = where / META
        st = _regular(meta_path)
        if st.st_size > MAX_META_BYTES:
            raise CheckpointError(f"checkpoint {name}: meta.json is larger than "
                                  f"{MAX_META_BYTES} bytes")
        return parse_meta(meta_path.read_bytes(), name)

    def verify(self, ckpt: Checkpoint, key: str, ram_bytes: int, digests: bool = True) -> None:
        """Refuses a checkpoint of another VM, or one whose files are not what
        it wrote: sizes first, then (with `digests`) each file's SHA-256."""
        if ckpt.key != key:
            raise CheckpointError(f"checkpoint {ckpt.name} is of another VM (shape {ckpt.key}, "
                                  f"this VM's is {key}): another guest build or configuration")
        if ckpt.ram_bytes != ram_bytes:
            raise CheckpointError(f"checkpoint {ckpt.name} holds {ckpt.ram_bytes >> 20} MiB of "
                                  f"RAM, this VM has {ram_bytes >> 20} MiB")
        sizes = {HASHES: ckpt.pages * 8, LOC: ckpt.pages * 8, PAGES: ckpt.pages_saved * 4096}
        for file, size in sizes.items():
            path = self.dir / ckpt.name / file
            if _regular(path).st_size != size:
                raise CheckpointError(f"checkpoint {ckpt.name}: {file} is "
                                      f"{os.lstat(path).st_size} bytes, expected {size} "
                                      "(truncated or damaged)")
        for file in (HASHES, LOC) if digests else ():
            if _sha256(self.dir / ckpt.name / file) != ckpt.sha256[file]:
                raise CheckpointError(f"checkpoint {ckpt.name}: {file} does not match its "
                                      "digest (damaged or tampered with)")

    def _identity(self, ckpt: Checkpoint) -> tuple[int, ...]:
        """What changes with any write to the tables: a rewrite (inode),
        a write (size, mtime) or a metadata change (ctime, which no caller
        can set back)."""
        found: list[int] = [ckpt.seq]
        for file in (HASHES, LOC):
            st = os.lstat(self.dir / ckpt.name / file)
            found += [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        return tuple(found)

    def checked_tables(self, ckpt: Checkpoint, key: str, ram_bytes: int) -> tuple[Any, Any]:
        """`verify`, then `tables`; the digests are read again only where
        the files changed since this store last wrote or checked them (a
        rollback's cost is what changed in RAM, not 2 MiB of tables)."""
        try:
            identity = self._identity(ckpt)
        except OSError:
            identity = ()
        known = self._checked.get(ckpt.name)
        fresh = known is not None and bool(identity) and known[0] == identity
        self.verify(ckpt, key, ram_bytes, digests=not fresh)
        if fresh:
            assert known is not None
            return known[1], known[2]
        hashes, loc = self.tables(ckpt)
        self.remember(ckpt, hashes, loc)
        return hashes, loc

    def remember(self, ckpt: Checkpoint, hashes: Any, loc: Any) -> None:
        """The tables of a checkpoint just written or checked; the few most
        recent are kept (2 MiB each for a 512 MiB guest)."""
        try:
            identity = self._identity(ckpt)
        except OSError:
            return
        self._checked.pop(ckpt.name, None)
        self._checked[ckpt.name] = (identity, hashes, loc)
        while len(self._checked) > CHECKED_TABLES_KEPT:
            self._checked.pop(next(iter(self._checked)))

    def tables(self, ckpt: Checkpoint) -> tuple[Any, Any]:
        """Its page hashes and page locations, as the C code takes them."""
        from paracell._native import ffi

        hashes = ffi.new("uint64_t[]", ckpt.pages)
        loc = ffi.new("struct pc_ckpt_loc[]", ckpt.pages)
        for file, table in ((HASHES, hashes), (LOC, loc)):
            with open(self.dir / ckpt.name / file, "rb") as f:
                if f.readinto(ffi.buffer(table)) != ckpt.pages * 8:
                    raise CheckpointError(f"checkpoint {ckpt.name}: {file} is short")
        return hashes, loc

    def materialize(self, ckpt: Checkpoint, target: int) -> None:
        """The checkpoint's RAM, whole, into the empty file `target`: every
        page read from its page file and checked against its hash before any
        is written (csrc/checkpoint.c); holes and zero pages stay holes."""
        from paracell._native import ffi, lib

        hashes, loc = self.tables(ckpt)
        seed = self.seed()
        seqs, fds = self.page_files()
        try:
            fig = ffi.new("struct pc_ckpt_figures *")
            err = ffi.new("char[]", 256)
            if lib.pc_ckpt_materialize(target, ckpt.ram_bytes, seed, hashes, loc,
                                       ffi.new("uint32_t[]", seqs), ffi.new("int[]", fds),
                                       len(fds), fig, err, 256) != 0:
                raise CheckpointError(f"checkpoint {ckpt.name}: "
                                      f"{ffi.string(err).decode(errors='replace')}")
        finally:
            for fd in fds:
                os.close(fd)

    @contextlib.contextmanager
    def held(self, name: str) -> Iterator[int]:
        """The checkpoint's directory, opened without following a link and
        locked (flock): the maker of its fork RAM and its removal take turns."""
        try:
            dir_fd = os.open(self.dir / check_name(name),
                             os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as err:
            raise CheckpointError(f"checkpoint {name}: {err.strerror}") from None
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)
            yield dir_fd
        finally:
            os.close(dir_fd)

    def fork_ram(self, ckpt: Checkpoint) -> Path:
        """The checkpoint's RAM in one file that forks map copy-on-write
        (paracell/runtime/snapshots/forking.py): made at the first fork that
        asks, from its pages, each checked against its hash, renamed into
        place read-only, and never written again; it goes with the
        checkpoint. Later forks map it as it is: it is this store's own
        file, in a directory only its owner writes."""
        self.verify(ckpt, ckpt.key, ckpt.ram_bytes)
        where = self.dir / ckpt.name
        with self.held(ckpt.name) as dir_fd:
            try:
                if os.lstat(where).st_ino != os.fstat(dir_fd).st_ino:
                    raise FileNotFoundError(2, "removed meanwhile")
                try:
                    st = os.stat(FORK_RAM, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    st = None
                if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == ckpt.ram_bytes:
                    return where / FORK_RAM
                if st is not None:  # not what this code makes: never used, never followed
                    os.unlink(FORK_RAM, dir_fd=dir_fd)
                for left in os.listdir(dir_fd):  # what a killed maker left: the lock is ours
                    if left.startswith(f".{FORK_RAM}-"):
                        os.unlink(left, dir_fd=dir_fd)
                tmp = f".{FORK_RAM}-{os.getpid()}"
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o400, dir_fd=dir_fd)
                try:
                    self.materialize(ckpt, fd)
                    os.rename(tmp, FORK_RAM, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                except BaseException:
                    os.unlink(tmp, dir_fd=dir_fd)
                    raise
                finally:
                    os.close(fd)
            except OSError as err:
                raise CheckpointError(f"checkpoint {ckpt.name}: its RAM for forks: "
                                      f"{err.strerror}") from None
        return where / FORK_RAM

    def retained(self) -> list[tuple[int, Path]]:
        """Page files of removed checkpoints that others still build on."""
        found = []
        if self.dir.is_dir():
            for entry in os.scandir(self.dir):
                if entry.name.startswith(KEPT) and entry.name[len(KEPT):].isdigit() \
                        and entry.is_dir(follow_symlinks=False):
                    found.append((int(entry.name[len(KEPT):]), Path(entry.path)))
        return found

    def page_files(self) -> tuple[list[int], list[int]]:
        """Every page file, of live checkpoints and retained ones, opened:
        (seqs, fds). The caller closes the fds."""
        seqs, fds = [], []
        try:
            for ckpt in self.all():
                fds.append(os.open(self.dir / ckpt.name / PAGES,
                                   os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC))
                seqs.append(ckpt.seq)
            for seq, path in self.retained():
                fds.append(os.open(path / PAGES, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC))
                seqs.append(seq)
        except OSError as err:
            for fd in fds:
                os.close(fd)
            raise CheckpointError(f"a checkpoint's page file: {err.strerror}") from None
        return seqs, fds

    def all(self, warn: Callable[[str], None] | None = None) -> list[Checkpoint]:
        """Every checkpoint that can be read, oldest first; a damaged one is
        skipped, and told to `warn` in one line."""
        found = []
        for name in self.names():
            try:
                found.append(self.load(name))
            except (CheckpointError, OSError) as err:
                if warn is not None:
                    why = err.strerror if isinstance(err, OSError) else str(err)
                    warn(f"checkpoint {name} skipped: {why}")
        return sorted(found, key=lambda c: c.seq)

    def next_seq(self) -> int:
        return max((c.seq for c in self.all()), default=0) + 1

    def staging(self) -> Path:
        self.ensure()
        path = self.dir / f"{_TMP}{os.getpid()}-{time.monotonic_ns()}"
        path.mkdir(mode=0o700)
        return path

    def commit(self, staging: Path, ckpt: Checkpoint) -> None:
        with open(staging / META, "xb") as f:
            f.write(meta_json(ckpt))
        target = self.dir / ckpt.name
        if target.exists() or target.is_symlink():
            raise CheckpointError(f"checkpoint {ckpt.name!r} exists already")
        os.rename(staging, target)

    def discard(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def remove_dir(self, name: str) -> None:
        check_name(name)
        shutil.rmtree(self.dir / name, ignore_errors=True)

    def sweep(self) -> None:
        """Temporary directories a killed checkpoint left."""
        if self.dir.is_dir():
            for entry in os.scandir(self.dir):
                if entry.name.startswith(_TMP):
                    shutil.rmtree(entry.path, ignore_errors=True)


def digest(path: Path) -> str:
    return _sha256(path)
