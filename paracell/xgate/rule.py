"""The vetting rule: which byte patterns count, and which of them are offences.

This is the ONE place the rule lives; the guest kernel's vetting
(docs/xgates.md) applies the same one, and both change together.

- WRPKRU (0f 01 ef) writes PKRU from user mode. Only the kernel's gate page may
  run one, and no file ever contains the gate page, so a WRPKRU found in a file
  is an offence, with two exceptions:
- a pkey_set site: WRPKRU followed by `xor eax, eax; ret` (31 c0 c3), the end of
  glibc's pkey_set() since 2.27. The guest kernel maps it with its first byte
  replaced by INT3 and emulates it as a WRPKRU with the kernel key and every
  domain key forced closed (docs/xgates.md, "glibc's pkey_set"). The bytes that
  follow are read from the file, as the kernel reads them, even past the end of
  the executable segment. Reported for information.
- a split site: WRPKRU bytes that no instruction meant, the 0f being the 8-bit
  immediate of a register-form shift or ALU instruction (`c1` or `83`, then a
  ModRM byte with mod = 3) and the `01 ef` the start of `add edi, ebp`
  (libnettle's `rol $0xf,%r15d; add %ebp,%edi`). The guest kernel maps it with
  the `01` turned into INT3 and emulates the add (docs/xgates.md, "Inadvertent
  WRPKRU bytes"). The two bytes before the 0f must lie in the same segment's
  pages, as the kernel, which vets one mapping at a time, requires
  (elfscan applies that bound). Reported for information.
- the guest kernel traps at most MAX_SITES sites (both kinds) in one mapping; a
  segment with more is refused there, so every site past that many is an
  offence here.
- XRSTOR (0f ae /5, memory operand) could load PKRU if XCR0 enabled the PKRU
  state component for user XRSTOR; the XGates guest kernel keeps PKRU out of what
  user-mode XRSTOR can load, so it cannot open the kernel key. glibc's ld.so
  carries XRSTOR in its lazy-binding trampolines: refusing it would refuse every
  dynamic binary. Reported for information.
- XRSTORS (0f c7 /3, memory operand) faults with #GP outside ring 0. Reported for
  information.

The scan is a byte scan, not a disassembly: it finds the patterns at every byte
offset, including bytes that belong to other instructions or to data. Code can
jump into the middle of an instruction, so that is the conservative reading, and
the one the kernel takes too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WRPKRU = "wrpkru"
PKEY_SET = "wrpkru-pkey_set"
SPLIT = "wrpkru-split"
XRSTOR = "xrstor"
XRSTORS = "xrstors"

OFFENCES = frozenset({WRPKRU})
SITES = frozenset({PKEY_SET, SPLIT})  # WRPKRU encodings the guest kernel traps

WHY = {
    WRPKRU: "WRPKRU outside the kernel's gate page",
    PKEY_SET: "glibc pkey_set()'s WRPKRU: the guest kernel maps it as INT3 and emulates it "
              "with the kernel key and the domain keys forced closed",
    SPLIT: "WRPKRU bytes across two instructions (an 8-bit immediate 0f, then add edi, ebp): "
           "the guest kernel maps the add's first byte as INT3 and emulates the add",
    XRSTOR: "XRSTOR cannot load PKRU: the guest kernel keeps PKRU out of user XRSTOR's reach",
    XRSTORS: "XRSTORS faults outside ring 0",
}

# ModRM bytes with reg = 5 (XRSTOR) or reg = 3 (XRSTORS) and mod != 3 (memory).
_REG5_MEM = rb"[\x28-\x2f\x68-\x6f\xa8-\xaf]"
_REG3_MEM = rb"[\x18-\x1f\x58-\x5f\x98-\x9f]"
# No byte after the leading 0f of one match is 0f, so non-overlapping matching
# misses none: a match can never swallow the start of the next.
PATTERN = re.compile(
    rb"\x0f(?:(\x01\xef)|(\xae" + _REG5_MEM + rb")|(\xc7" + _REG3_MEM + rb"))"
)
LONGEST = 3  # bytes of the longest pattern, for scans across segment joins
SITE_TAIL = b"\x31\xc0\xc3"  # xor eax, eax; ret: after a WRPKRU, a pkey_set site
LOOKAHEAD = len(SITE_TAIL)  # bytes past a match that classify may read
# `c1 /r ib` (shift, rotate) or `83 /r ib` (ALU), register form: the two bytes
# before a split site's 0f, which is their immediate.
SPLIT_HEAD = re.compile(rb"[\x83\xc1][\xc0-\xff]")
LOOKBEHIND = 2  # bytes before a match that classify may read
MAX_SITES = 8  # sites the guest kernel traps in one mapping


@dataclass(frozen=True)
class Hit:
    offset: int  # of the first byte, a REX prefix included
    instruction: str  # "wrpkru", "xrstor", "xrstor64", "xrstors", "xrstors64"
    encoding: bytes

    @property
    def kind(self) -> str:
        return self.instruction.removesuffix("64")

    @property
    def offence(self) -> bool:
        return self.kind in OFFENCES


def classify(match: re.Match[bytes], buf: bytes | memoryview | object, base: int) -> Hit:
    """Names one PATTERN match; `base` maps buffer positions to file offsets.
    A WRPKRU is a pkey_set site when buf holds SITE_TAIL right after it, else a
    split site when buf holds a SPLIT_HEAD right before it (buf must start
    where the scanned range starts or earlier than LOOKBEHIND before the match).
    A REX.W prefix just before XRSTOR/XRSTORS makes it the 64-bit form."""
    start = match.start()
    if match.group(1) is not None:
        tail = bytes(buf[match.end():match.end() + LOOKAHEAD])  # type: ignore[index]
        head = bytes(buf[start - LOOKBEHIND:start]) if start >= LOOKBEHIND else b""  # type: ignore[index]
        kind = (PKEY_SET if tail == SITE_TAIL
                else SPLIT if SPLIT_HEAD.fullmatch(head) else WRPKRU)
        return Hit(base + start, kind, match.group(0))
    name = XRSTOR if match.group(2) is not None else XRSTORS
    if start > 0:
        prefix = buf[start - 1]  # type: ignore[index]
        if 0x48 <= prefix <= 0x4F:
            return Hit(base + start - 1, name + "64", bytes([prefix]) + match.group(0))
    return Hit(base + start, name, match.group(0))
