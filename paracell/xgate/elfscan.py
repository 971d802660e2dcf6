"""Scans one ELF file's executable bytes for the patterns of rule.py.

What is scanned is what a loader maps executable: each PT_LOAD segment with
PF_X, widened to the whole 4 KiB pages it occupies (mmap maps pages, so the
bytes around a segment in its first and last page execute too), clipped to the
file. Segments that touch in the file are scanned as one run, and so are
segments that touch in memory, so an encoding split across two segments counts.

The per-byte work is re.finditer over the segment bytes (C code); Python only
sees the hits. Files are read with pread, never mmap: a file truncated while it
is scanned gives short data, not SIGBUS.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from paracell.xgate.elfheaders import BadElf, read_headers
from paracell.xgate.rule import (
    LONGEST,
    LOOKAHEAD,
    LOOKBEHIND,
    MAX_SITES,
    PATTERN,
    SITES,
    SPLIT,
    WRPKRU,
    Hit,
    classify,
)

PAGE = 4096
CHUNK = 64 << 20  # bytes per read: bounds memory on huge segments
MAX_HITS = 1000  # findings kept per file: a file of nothing but encodings stays cheap
PT_LOAD = 1
PF_X = 1
X86_MACHINES = ("EM_X86_64", "EM_386")
MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class Span:
    """File bytes [lo, hi) mapped executable at vaddr (None: no program headers)."""

    lo: int
    hi: int
    vaddr: int | None


@dataclass
class ElfScan:
    hits: list[tuple[Hit, int | None]] = field(default_factory=list)  # (hit, vaddr)
    note: str | None = None  # why the scan was partial, skipped or widened


def is_elf(fd: int) -> bool:
    return os.pread(fd, len(MAGIC), 0) == MAGIC


def scan_fd(fd: int, size: int) -> ElfScan:
    """`fd` is an ELF file (is_elf) of `size` bytes. At most MAX_HITS findings
    are kept; past that, the scan goes on only until it has an offence."""
    spans, note = _exec_spans(fd, size)
    result = ElfScan(note=note)
    seen: set[int] = set()
    offence = False
    runs = (hit for lo, hi in _file_runs(spans) for hit in _scan_run(fd, lo, hi))
    for hit in _cap_sites(itertools.chain(runs, _vaddr_joins(fd, spans)), spans):
        if hit.offset in seen:
            continue
        if len(result.hits) >= MAX_HITS:
            result.note = "; ".join(filter(None, [note, f"only the first {MAX_HITS} "
                                                  "encodings (and the first offence) listed"]))
            if offence:
                break
            if not hit.offence:
                continue
        seen.add(hit.offset)
        offence |= hit.offence
        result.hits.append((hit, _vaddr_of(spans, hit.offset)))
    result.hits.sort(key=lambda pair: pair[0].offset)
    return result


def _cap_sites(hits: Iterator[Hit], spans: list[Span]) -> Iterator[Hit]:
    """Sites as the guest kernel traps them, one mapping (a segment) at a
    time: a split site's head must lie in the segment's pages, not only in
    the run it was scanned with, and past MAX_SITES sites in one segment the
    kernel refuses the mapping. Sites that fail either are offences."""
    seen: Counter[int] = Counter()
    for hit in hits:
        if hit.instruction in SITES:
            span = next((i for i, s in enumerate(spans) if s.lo <= hit.offset < s.hi), -1)
            seen[span] += 1
            headless = hit.instruction == SPLIT and (
                span < 0 or hit.offset - LOOKBEHIND < spans[span].lo)
            if headless or seen[span] > MAX_SITES:
                hit = replace(hit, instruction=WRPKRU)
        yield hit


def _scan_run(fd: int, lo: int, hi: int) -> Iterator[Hit]:
    """File bytes [lo, hi), read CHUNK bytes at a time. Each read starts LONGEST
    bytes early, so an encoding cut by the previous read's end is found whole,
    REX prefix included, and LOOKBEHIND more for a split site's head (never
    before lo: the kernel looks no further); matches that end inside that
    overlap were already found.
    Each read also takes LOOKAHEAD bytes past its end (past hi too, as the kernel
    reads a pkey_set site's tail from the file), for classify only: a match must
    lie inside [lo, hi)."""
    for pos in range(lo, hi, CHUNK):
        start = max(lo, pos - LONGEST - LOOKBEHIND)
        stop = min(pos + CHUNK, hi)
        data = os.pread(fd, stop - start + LOOKAHEAD, start)
        for match in PATTERN.finditer(data, 0, min(len(data), stop - start)):
            if start + match.end() > pos:
                yield classify(match, data, start)


def _exec_spans(fd: int, size: int) -> tuple[list[Span], str | None]:
    try:
        elf = read_headers(fd, X86_MACHINES)
    except (BadElf, OSError) as err:
        return [Span(0, size, None)], f"unreadable ELF headers ({err}): whole file scanned"
    if elf.machine not in X86_MACHINES:
        return [], f"{elf.machine} code cannot run on an x86 guest: not scanned"
    headers = elf.segments
    spans, clipped = [], False
    for h in headers:
        if h["p_type"] not in ("PT_LOAD", PT_LOAD) or not h["p_flags"] & PF_X:
            continue
        lo = h["p_offset"] - h["p_offset"] % PAGE
        end = h["p_offset"] + h["p_filesz"]
        hi = min(-(-end // PAGE) * PAGE, size)
        clipped |= end > size
        if lo < hi:
            spans.append(Span(lo, hi, h["p_vaddr"] - (h["p_offset"] - lo)))
    return spans, "a segment runs past the end of the file" if clipped else None


def _file_runs(spans: list[Span]) -> list[tuple[int, int]]:
    """Merges spans that overlap or touch in the file."""
    runs: list[tuple[int, int]] = []
    for span in sorted(spans, key=lambda s: s.lo):
        if runs and span.lo <= runs[-1][1]:
            runs[-1] = (runs[-1][0], max(runs[-1][1], span.hi))
        else:
            runs.append((span.lo, span.hi))
    return runs


def _vaddr_joins(fd: int, spans: list[Span]) -> list[Hit]:
    """Encodings split between two spans that touch in memory but not in the file."""
    hits = []
    ordered = sorted((s for s in spans if s.vaddr is not None), key=lambda s: s.vaddr or 0)
    for a, b in zip(ordered, ordered[1:], strict=False):
        assert a.vaddr is not None
        if b.vaddr != a.vaddr + (a.hi - a.lo) or b.lo == a.hi:
            continue
        tail_lo = max(a.lo, a.hi - (LONGEST - 1))
        tail = os.pread(fd, a.hi - tail_lo, tail_lo)
        joined = tail + os.pread(fd, LONGEST - 1, b.lo)
        for match in PATTERN.finditer(joined):
            if match.start() < len(tail) < match.end():
                hits.append(classify(match, joined, tail_lo))
    return hits


def _vaddr_of(spans: list[Span], offset: int) -> int | None:
    for span in spans:
        if span.lo <= offset < span.hi:
            return None if span.vaddr is None else span.vaddr + offset - span.lo
    return None
