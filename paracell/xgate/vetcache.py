"""The verdicts of files the vet found clean, so that `create` does not scan
a rootfs again that it vetted before.

A verdict is keyed by the file's identity: device, inode, size, mtime and
ctime (in ns). Writing a file changes its mtime and ctime; utime(2) can put
the mtime back, but only the kernel sets the ctime, so a file whose content
changed has a new key and is vetted again. The file also records the
scanner it was made by (a hash of rule.py, elfscan.py, elfheaders.py and
pyelftools' version): a change to the rule or the scan drops every verdict.
Only clean verdicts are kept (an ELF file without offences, or a file that
is no ELF file); a file with an offence is scanned, and refused, every time.

A verdict lets a file into a VM unscanned, so the cache must be the
caller's alone: its directory and its file must be owned by the effective
uid, writable by no one else, and neither may be a symlink (O_NOFOLLOW on
each, the file opened relative to the checked directory's fd). A cache that
fails this is treated as empty, with one warning, and never written. A
damaged file (not JSON, the wrong shape, past the bounds) is ignored with one
warning, and replaced by the next save.

Racily clean files: timestamps are coarse (a jiffy on ext4, up to seconds
elsewhere), so a file written in the tick its scan started could be written
again with the same identity. As git does for its index, a verdict is kept
only for a file whose mtime and ctime are RACY_S older than the start of its
scan; a fresher file is scanned at every create until it is that old.

Bounded: MAX_ENTRIES verdicts and MAX_BYTES of file; the verdicts a vet did
not use go first, the oldest first. A save writes a temporary file and renames
it over the old one, so a concurrent create reads the old file or the new one,
never a mix; of two saves at once the last one wins, and the verdicts only the
other had are vetted again later.

This only spares the host's early check its repeated work: the guest kernel
vets every executable mapping itself, and that is the enforcement.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

FORMAT = 1
FILE_NAME = "verdicts.json"
TEMP_PREFIX = ".verdicts."
MAX_ENTRIES = 200_000  # a Debian rootfs has about 10,000 files
MAX_BYTES = 32 << 20
MAX_NOTE = 200  # characters of a note kept with a verdict
RACY_S = 2.0
STALE_TEMP_S = 600  # a temporary file this old was left by a killed save
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Verdict:
    elf: bool  # an ELF file without offences; False: not an ELF file
    note: str | None = None  # what the scan said of it (report.notes)


def identity(st: os.stat_result) -> str:
    return (f"{st.st_dev:x}:{st.st_ino:x}:{st.st_size:x}:"
            f"{st.st_mtime_ns:x}:{st.st_ctime_ns:x}")


def scanner_version() -> str:
    """Changes whenever what a scan finds could change."""
    import elftools

    from paracell.xgate import elfheaders, elfscan, rule

    digest = hashlib.sha256(f"format {FORMAT}; pyelftools {elftools.__version__}".encode())
    for module in (rule, elfscan, elfheaders):
        digest.update(Path(module.__file__ or "").read_bytes())
    return digest.hexdigest()[:32]


class Untrusted(Exception):
    """The cache is not the caller's alone: never read, never written."""


class Damaged(Exception):
    """The cache file cannot be used: ignored, and replaced by the next save."""


def _encode(verdict: Verdict) -> object:
    return [int(verdict.elf), verdict.note] if verdict.note else int(verdict.elf)


def _decode(raw: object) -> Verdict:
    if type(raw) is int and raw in (0, 1):
        return Verdict(bool(raw))
    if (type(raw) is list and len(raw) == 2 and type(raw[0]) is int and raw[0] in (0, 1)
            and type(raw[1]) is str and len(raw[1]) <= MAX_NOTE):
        return Verdict(bool(raw[0]), raw[1])
    raise Damaged("a verdict of the wrong shape")


def _check_owner(st: os.stat_result, what: str) -> None:
    if st.st_uid != os.geteuid():
        raise Untrusted(f"{what} is owned by uid {st.st_uid}, not {os.geteuid()}")
    if st.st_mode & 0o022:
        raise Untrusted(f"{what} is writable by others (mode {stat.S_IMODE(st.st_mode):o})")


class VetCache:
    """Verdicts by identity; lookup and remember during a vet, then save."""

    def __init__(self, dir_fd: int | None, entries: dict[str, Verdict],
                 scanner: str, racy_s: float = RACY_S) -> None:
        self.dir_fd = dir_fd  # None: nothing will be written
        self.entries = entries
        self.scanner = scanner
        self.racy_ns = int(racy_s * 1e9)
        self.used: dict[str, Verdict] = {}
        self.learned = 0
        self.hits = 0

    def lookup(self, st: os.stat_result) -> Verdict | None:
        key = identity(st)
        verdict = self.entries.get(key)
        if verdict is not None:
            self.used[key] = verdict
            self.hits += 1
        return verdict

    def remember(self, before: os.stat_result, after: os.stat_result, verdict: Verdict,
                 scan_started_ns: int) -> None:
        """A clean verdict of a scan that started at scan_started_ns (time.time_ns)
        with the file at `before` and ended with it at `after`."""
        key = identity(before)
        if key != identity(after):
            return  # changed while it was scanned
        if max(before.st_mtime_ns, before.st_ctime_ns) > scan_started_ns - self.racy_ns:
            return  # could change again within the timestamps' granularity
        note = verdict.note[:MAX_NOTE] if verdict.note else None
        self.used[key] = Verdict(verdict.elf, note)
        self.learned += 1

    def save(self) -> str | None:
        """Writes the verdicts if this vet learned any; returns why not on failure."""
        if self.dir_fd is None or not self.learned:
            return None
        merged = {k: v for k, v in self.entries.items() if k not in self.used}
        merged.update(self.used)  # the verdicts used now go last: evicted last
        keys = list(merged)
        sizes = [len(k) + len(json.dumps(_encode(merged[k]))) + 4 for k in keys]
        budget, drop = MAX_BYTES - 256, max(0, len(keys) - MAX_ENTRIES)
        total = sum(sizes[drop:])
        while total > budget:
            total -= sizes[drop]
            drop += 1
        data = json.dumps({"format": FORMAT, "scanner": self.scanner,
                           "verdicts": {k: _encode(merged[k]) for k in keys[drop:]}},
                          separators=(",", ":")).encode()
        temp = f"{TEMP_PREFIX}{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            self._sweep_temp_files()
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=self.dir_fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.rename(temp, FILE_NAME, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=self.dir_fd)
            return f"not saved: {err.strerror}"
        return None

    def _sweep_temp_files(self) -> None:
        """Temporary files of saves that were killed before their rename."""
        assert self.dir_fd is not None
        old = time.time() - STALE_TEMP_S
        with os.scandir(self.dir_fd) as listing:
            stale = [e.name for e in listing
                     if e.name.startswith(TEMP_PREFIX) and e.name.endswith(".tmp")]
        for name in stale:
            # A concurrent save may rename or sweep it first.
            with contextlib.suppress(FileNotFoundError):
                if os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False).st_mtime < old:
                    os.unlink(name, dir_fd=self.dir_fd)


def _open_directory(directory: Path) -> int:
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(directory, _OPEN_DIR)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Untrusted(f"{directory} is not a directory (a symlink is never followed)") \
                from None
        raise
    try:
        _check_owner(os.fstat(fd), str(directory))
    except Untrusted:
        os.close(fd)
        raise
    return fd


def _read_entries(dir_fd: int, where: str, scanner: str) -> dict[str, Verdict]:
    try:
        fd = os.open(FILE_NAME, _OPEN_FILE, dir_fd=dir_fd)
    except FileNotFoundError:
        return {}
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise Untrusted(f"{where} is a symlink, which is never followed") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{where} is not a regular file")
        _check_owner(st, where)
        if st.st_size > MAX_BYTES:
            raise Damaged(f"larger than {MAX_BYTES} bytes")
        chunks, left = [], MAX_BYTES + 1
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
        raw = b"".join(chunks)
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        raise Damaged(f"larger than {MAX_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise Damaged(f"not JSON ({str(err)[:60]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("verdicts"), dict):
        raise Damaged("not a verdict file")
    if data.get("format") != FORMAT or data.get("scanner") != scanner:
        return {}  # made by another scanner: every file is vetted again
    verdicts = data["verdicts"]
    if len(verdicts) > MAX_ENTRIES:
        raise Damaged(f"more than {MAX_ENTRIES} verdicts")
    return {key: _decode(raw) for key, raw in verdicts.items()}


@contextmanager
def opened(directory: Path, warn: Callable[[str], None],
           racy_s: float = RACY_S) -> Iterator[VetCache]:
    """The cache in `directory`; never raises: a cache that cannot be used is
    empty, and `warn` gets one line saying why."""
    scanner = scanner_version()
    where = str(directory / FILE_NAME)
    dir_fd: int | None = None
    entries: dict[str, Verdict] = {}
    try:
        dir_fd = _open_directory(directory)
        entries = _read_entries(dir_fd, where, scanner)
    except Untrusted as err:
        warn(f"xgates vet cache refused: {err}; every file is vetted")
        if dir_fd is not None:
            os.close(dir_fd)
            dir_fd = None
    except Damaged as err:
        warn(f"xgates vet cache {where} ignored: {err}; every file is vetted")
    except OSError as err:
        warn(f"xgates vet cache {where} unusable: {err.strerror}; every file is vetted")
    cache = VetCache(dir_fd, entries, scanner, racy_s)
    try:
        yield cache
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
