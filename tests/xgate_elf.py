"""Minimal ELF64 files for the XGates vetting tests, written byte by byte."""

from __future__ import annotations

import struct
from pathlib import Path

WRPKRU = b"\x0f\x01\xef"
PF_X, PF_R = 1, 4
EM_X86_64, EM_AARCH64 = 62, 183


def make_elf(path: Path, segments: list[tuple[int, int, int, int]], size: int,
             patches: dict[int, bytes] | None = None, machine: int = EM_X86_64) -> Path:
    """A minimal ELF64 executable: segments are (flags, offset, vaddr, filesz)
    PT_LOADs; the rest of the file is zero except for `patches`."""
    data = bytearray(size)
    data[:64] = struct.pack(
        "<4sBBBBB7xHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, 2, machine, 1,
        segments[0][2] if segments else 0, 64, 0, 0, 64, 56, len(segments), 64, 0, 0,
    )
    for i, (flags, offset, vaddr, filesz) in enumerate(segments):
        data[64 + 56 * i:120 + 56 * i] = struct.pack(
            "<IIQQQQQQ", 1, flags, offset, vaddr, vaddr, filesz, filesz, 0x1000)
    for offset, raw in (patches or {}).items():
        data[offset:offset + len(raw)] = raw
    path.write_bytes(bytes(data))
    return path
