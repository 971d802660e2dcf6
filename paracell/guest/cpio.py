"""A minimal newc cpio writer: the initramfs needs a device node, which a
plain `find | cpio` run as non-root cannot create."""

from __future__ import annotations

import stat
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    name: str
    mode: int
    data: bytes = b""
    rdev_major: int = 0
    rdev_minor: int = 0


def _pad4(n: int) -> bytes:
    return b"\0" * (-n % 4)


def _record(ino: int, entry: Entry) -> bytes:
    name = entry.name.encode() + b"\0"
    fields = (
        ino, entry.mode, 0, 0, 1, 0, len(entry.data), 0, 0,
        entry.rdev_major, entry.rdev_minor, len(name), 0,
    )
    header = b"070701" + b"".join(b"%08X" % f for f in fields)
    head = header + name
    return head + _pad4(len(head)) + entry.data + _pad4(len(entry.data))


def newc_archive(entries: list[Entry]) -> bytes:
    parts = [_record(i + 1, e) for i, e in enumerate(entries)]
    parts.append(_record(0, Entry("TRAILER!!!", 0)))
    return b"".join(parts)


def directory(name: str) -> Entry:
    return Entry(name, stat.S_IFDIR | 0o755)


def char_device(name: str, major: int, minor: int) -> Entry:
    return Entry(name, stat.S_IFCHR | 0o600, rdev_major=major, rdev_minor=minor)


def executable(name: str, data: bytes) -> Entry:
    return Entry(name, stat.S_IFREG | 0o755, data)
