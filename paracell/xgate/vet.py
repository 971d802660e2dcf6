"""Vets ELF files, directory trees and OCI bundles (their rootfs).

A tree is walked through directory file descriptors, one per level, and nothing
under a root is opened through a symlink (O_NOFOLLOW on every step): a link
inside a rootfs means something inside the container's root, which the walk
reaches by its real path anyway, and a link that leads out of it must not make
the host scan (or open) host files. Special files are never opened; a file seen
under several names (hard links) is scanned once. The walk is bounded in
entries and depth, and says so in its error.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from paracell.errors import ParacellError
from paracell.xgate import elfscan
from paracell.xgate.rule import WHY

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.xgate.vetcache import VetCache

MAX_ENTRIES = 1_000_000
MAX_DEPTH = 128
BAD_INPUT = 2  # exit status for input the vet cannot take
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


@dataclass(frozen=True)
class Finding:
    path: str  # on the host
    inside: str  # in the scanned root: "/usr/bin/x" (the file's own path for a file argument)
    offset: int
    vaddr: int | None
    instruction: str
    encoding: bytes
    offence: bool

    def as_dict(self) -> dict[str, object]:
        return {
            "path": self.path, "inside": self.inside, "offset": self.offset,
            "vaddr": self.vaddr, "instruction": self.instruction,
            "bytes": self.encoding.hex(" "), "offence": self.offence,
            "why": WHY[self.instruction.removesuffix("64")],
        }


@dataclass
class VetReport:
    roots: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (host path, what happened)
    entries: int = 0
    elf_files: int = 0
    cached: int = 0  # files whose clean verdict came from a VetCache, unscanned

    @property
    def offences(self) -> list[Finding]:
        return [f for f in self.findings if f.offence]


def bad_input(message: str) -> ParacellError:
    return ParacellError(message, exit_code=BAD_INPUT)


class _Walker:
    def __init__(self, report: VetReport, max_entries: int, max_depth: int,
                 cache: VetCache | None = None) -> None:
        self.report = report
        self.max_entries = max_entries
        self.max_depth = max_depth
        self.cache = cache
        self.seen: set[tuple[int, int]] = set()

    def tree(self, root: str) -> None:
        try:
            fd = os.open(root, _OPEN_DIR)
        except OSError as err:
            raise bad_input(f"{root}: {err.strerror}") from None
        try:
            self._directory(fd, root, "", 0)
        finally:
            os.close(fd)

    def file(self, path: str) -> None:
        """A file named on the command line (its symlinks already resolved)."""
        self.report.entries += 1
        self._scan(None, path, path, path)

    def _directory(self, dfd: int, host: str, inside: str, depth: int) -> None:
        try:
            with os.scandir(dfd) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as err:
            self.report.notes.append((host, f"unreadable directory: {err.strerror}"))
            return
        self.report.entries += len(entries)
        if self.report.entries > self.max_entries:
            raise bad_input(f"{host}: more than {self.max_entries} entries to vet; "
                            "vet a smaller tree")
        subdirs = []
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(entry.name)
            elif entry.is_file(follow_symlinks=False) and not self._known_clean(entry, host):
                self._scan(dfd, entry.name, os.path.join(host, entry.name),
                           f"{inside}/{entry.name}")
        for name in subdirs:
            if depth >= self.max_depth:
                raise bad_input(f"{os.path.join(host, name)}: deeper than {self.max_depth} "
                                "directory levels; not vetted")
            try:
                sub = os.open(name, _OPEN_DIR, dir_fd=dfd)
            except OSError as err:  # replaced by a symlink meanwhile: ELOOP/ENOTDIR
                self.report.notes.append((os.path.join(host, name), f"not entered: {err.strerror}"))
                continue
            try:
                self._directory(sub, os.path.join(host, name), f"{inside}/{name}", depth + 1)
            finally:
                os.close(sub)

    def _known_clean(self, entry: os.DirEntry[str], host: str) -> bool:
        """The cache's verdict on a file, from its identity (an lstat), without
        opening it: a file that changed has another identity and is scanned."""
        if self.cache is None:
            return False
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode):
            return False
        verdict = self.cache.lookup(st)
        if verdict is None:
            return False
        key = (st.st_dev, st.st_ino)
        if verdict.elf and key not in self.seen:
            self.seen.add(key)
            self.report.elf_files += 1
            self.report.cached += 1
            if verdict.note:
                self.report.notes.append((os.path.join(host, entry.name), verdict.note))
        return True

    def _scan(self, dfd: int | None, name: str, host: str, inside: str) -> None:
        started = time.time_ns()
        try:
            fd = os.open(name, _OPEN_FILE, dir_fd=dfd)
        except OSError as err:
            self.report.notes.append((host, f"not opened: {err.strerror}"))
            return
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            if not stat.S_ISREG(st.st_mode) or key in self.seen:
                return
            if not elfscan.is_elf(fd):
                self._remember(fd, st, started, elf=False, note=None)
                return
            self.seen.add(key)
            self.report.elf_files += 1
            result = elfscan.scan_fd(fd, st.st_size)
            if not any(hit.offence for hit, _ in result.hits):
                self._remember(fd, st, started, elf=True, note=result.note)
        except OSError as err:
            self.report.notes.append((host, f"not read: {err.strerror}"))
            return
        finally:
            os.close(fd)
        if result.note:
            self.report.notes.append((host, result.note))
        for hit, vaddr in result.hits:
            self.report.findings.append(Finding(host, inside, hit.offset, vaddr, hit.instruction,
                                                hit.encoding, hit.offence))


    def _remember(self, fd: int, before: os.stat_result, started: int, elf: bool,
                  note: str | None) -> None:
        if self.cache is not None:
            from paracell.xgate.vetcache import Verdict

            self.cache.remember(before, os.fstat(fd), Verdict(elf, note), started)


def vet_paths(paths: list[str], max_entries: int = MAX_ENTRIES, max_depth: int = MAX_DEPTH,
              bundle_rootfs: Callable[[Path], Path | None] | None = None) -> VetReport:
    """Each path is an ELF file or a directory; with bundle_rootfs (the
    bundle layer's reader of config.json), a bundle directory stands for its
    rootfs."""
    report = VetReport()
    walker = _Walker(report, max_entries, max_depth)
    for given in paths:
        if not os.path.lexists(given):
            raise bad_input(f"{given}: no such file or directory")
        # A path named by the user is theirs to follow; nothing under it is.
        real = Path(os.path.realpath(given))
        if real.is_dir():
            root = (bundle_rootfs(real) if bundle_rootfs else None) or real
            report.roots.append(str(root))
            walker.tree(str(root))
        elif real.is_file():
            report.roots.append(str(real))
            walker.file(str(real))
        else:
            raise bad_input(f"{given}: not a regular file or directory")
    return report


def vet_rootfs(rootfs: Path, cache: VetCache | None = None) -> VetReport:
    """What `create` runs: the rootfs (already checked by spec.check_rootfs).
    With a cache, a file it knows clean is not scanned (its findings for
    information are then not listed), and clean verdicts are remembered in it."""
    report = VetReport(roots=[str(rootfs)])
    _Walker(report, MAX_ENTRIES, MAX_DEPTH, cache).tree(str(rootfs))
    return report
