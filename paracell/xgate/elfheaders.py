"""An ELF file's header and program headers, read with pyelftools' structs.

Only what a loader reads: the ELF header and the program header table, with
the kernel's bound on the table (64 KiB). Section headers are never needed,
so a file with a broken section table reads like any other. pyelftools'
ELFFile builds all of its structs for every file; building them once per
kind of file (class, byte order, type, machine, OS ABI) makes the headers
about ten times cheaper, which is most of the cost of vetting a tree.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

MAX_PHDR_TABLE = 65536  # binfmt_elf's limit: a larger table is never executed


class BadElf(ValueError):
    """Headers a loader would not accept; the message says which part."""


@dataclass(frozen=True)
class ElfHeaders:
    machine: str  # pyelftools' name, "EM_X86_64", or the number as text
    segments: list[Any]  # pyelftools Elf_Phdr containers


@lru_cache(maxsize=8)
def _basic(little_endian: bool, elfclass: int) -> Any:
    from elftools.elf.structs import ELFStructs

    structs = ELFStructs(little_endian=little_endian, elfclass=elfclass)
    structs.create_basic_structs()
    return structs


@lru_cache(maxsize=32)  # hostile headers may name many types: keep it bounded
def _advanced(little_endian: bool, elfclass: int, e_type: Any, machine: Any, osabi: Any) -> Any:
    from elftools.elf.structs import ELFStructs

    structs = ELFStructs(little_endian=little_endian, elfclass=elfclass)
    structs.create_basic_structs()
    structs.create_advanced_structs(e_type, machine, osabi)
    return structs


def _parse(struct: Any, data: bytes, where: str) -> Any:
    from elftools.common.utils import struct_parse

    try:
        return struct_parse(struct, io.BytesIO(data), 0)
    # pyelftools wraps most errors in ELFParseError, but not all of them.
    except Exception as err:  # noqa: BLE001
        raise BadElf(f"{where}: {str(err).splitlines()[0][:80] if str(err) else err!r}") from None


def read_headers(fd: int, machines: tuple[str, ...]) -> ElfHeaders:
    """Program headers of the ELF file `fd`; none for machines not in `machines`."""
    ident = os.pread(fd, 16, 0)
    if len(ident) < 16 or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        raise BadElf("e_ident: no ELF class or byte order")
    little, elfclass = ident[5] == 1, 32 if ident[4] == 1 else 64
    basic = _basic(little, elfclass)
    ehdr = _parse(basic.Elf_Ehdr, os.pread(fd, basic.Elf_Ehdr.sizeof(), 0), "ELF header")
    machine = ehdr["e_machine"]
    if machine not in machines:
        return ElfHeaders(str(machine), [])
    structs = _advanced(little, elfclass, ehdr["e_type"], machine, ehdr["e_ident"]["EI_OSABI"])
    count, size = ehdr["e_phnum"], ehdr["e_phentsize"]
    if count == 0:
        return ElfHeaders(machine, [])
    if size < structs.Elf_Phdr.sizeof() or count * size > MAX_PHDR_TABLE:
        raise BadElf(f"program header table of {count} x {size} bytes")
    table = os.pread(fd, count * size, ehdr["e_phoff"])
    if len(table) < count * size:
        raise BadElf("program header table past the end of the file")
    return ElfHeaders(machine, [_parse(structs.Elf_Phdr, table[i * size:(i + 1) * size],
                                       f"program header {i}") for i in range(count)])
