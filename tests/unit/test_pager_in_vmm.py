"""The Pager as QEMU's RAM plugin runs it (csrc/pager.c through pc_pager_adopt):
guest RAM is a private, copy-on-write mapping of a template's file, here this
process's own. An UNBIND drops the mapping's private copies, so the range
reads the template again and holds no memory of its own; a BIND populates;
a hostile range is refused; and the template's file is never written."""

from __future__ import annotations

import array
import mmap
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from paracell._native import ffi, lib

from tests.unit.test_pager_server import _guest_writes_the_header

PAGE = 4096
RAM = 16 << 20
TEMPLATE_WORD = 0x5445_4D50_4C41_5445  # what every word of the template holds
GUEST_WORD = 0x4755_4553_5457_524F     # what the "guest" writes over it


@dataclass
class InVmm:
    p: object
    ram: mmap.mmap
    template: Path
    fds: list[int]

    def wake(self) -> int:
        return lib.pc_pager_wakeup(self.p, 1, time.monotonic_ns())

    def publish(self, ring_name: str, *ranges: tuple[int, int]) -> None:
        ring = getattr(self.p.shm, ring_name)
        slots_of = getattr(self.p.shm, f"{ring_name}_ring")
        slots = lib.PC_PAGER_UNBIND_SLOTS if ring_name == "unbind" else lib.PC_PAGER_BIND_SLOTS
        for i, (addr, length) in enumerate(ranges):
            slot = slots_of[(ring.prod + i) % slots]
            slot.addr, slot.len = addr, length
        ring.prod = (ring.prod + len(ranges)) & 0xFFFFFFFF

    def owned(self) -> int:
        """Bytes of this mapping that are private copies (anonymous)."""
        start = int(ffi.cast("uintptr_t", self.p.ram_map))
        lines = Path("/proc/self/smaps").read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith(f"{start:x}-"):
                for field in lines[i + 1:]:
                    if field.startswith("Anonymous:"):
                        return int(field.split()[1]) * 1024
        raise AssertionError("the mapping is not in smaps")


@pytest.fixture
def in_vmm(tmp_path: Path) -> Iterator[InVmm]:
    template = tmp_path / "ram"
    template.write_bytes(array.array("Q", [TEMPLATE_WORD]).tobytes() * (RAM // 8))
    fd = os.open(template, os.O_RDONLY)
    ram = mmap.mmap(fd, RAM, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(fd)
    fds = [os.eventfd(0, os.EFD_NONBLOCK) for _ in range(3)]
    stats = os.open(tmp_path / "stats", os.O_RDWR | os.O_CREAT)
    os.ftruncate(stats, ffi.sizeof("struct pc_pager_stats"))
    fds.append(stats)
    p = ffi.new("struct pc_pager *")
    base = ffi.cast("uint8_t *", ffi.from_buffer(ram))
    assert lib.pc_pager_adopt(p, base, RAM, RAM, *fds) == lib.PC_PAGER_OK
    _guest_writes_the_header(p.shm)
    yield InVmm(p, ram, template, fds)
    lib.pc_pager_close(p)  # leaves the mapping and the eventfds: lent, as QEMU's are
    for fd in fds:
        os.close(fd)


def _template_intact(v: InVmm) -> bool:
    return v.template.read_bytes() == array.array("Q", [TEMPLATE_WORD]).tobytes() * (RAM // 8)


def test_an_unbind_drops_the_private_copies_and_the_range_reads_the_template(
        in_vmm: InVmm) -> None:
    v = in_vmm
    written = array.array("Q", [GUEST_WORD]).tobytes() * (4 << 20 >> 3)
    v.ram[0:len(written)] = written  # 4 MiB the guest wrote: its own copies
    assert v.owned() >= 4 << 20
    v.publish("unbind", (0, 2 << 20))
    assert v.wake() == lib.PC_PAGER_OK
    assert v.p.shm.unbind.cons == 1
    assert v.ram[0:8] == array.array("Q", [TEMPLATE_WORD]).tobytes()
    assert v.ram[2 << 20:(2 << 20) + 8] == array.array("Q", [GUEST_WORD]).tobytes()
    assert v.owned() < 3 << 20
    assert _template_intact(v)
    assert os.eventfd_read(v.fds[1]) == 1  # the guest was interrupted: the ack


def test_a_bind_populates_private_pages_and_the_template_stays(in_vmm: InVmm) -> None:
    v = in_vmm
    before = v.owned()
    v.publish("bind", (4 << 20, 1 << 20))
    assert v.wake() == lib.PC_PAGER_OK
    assert v.owned() >= before + (1 << 20)
    assert v.p.stats.bind_pages == (1 << 20) // PAGE
    assert _template_intact(v)


@pytest.mark.parametrize("addr,length", [
    (lib.PC_PAGER_RING_GPA, PAGE), (RAM - PAGE, 2 * PAGE), (1, PAGE), (0, 0)])
def test_a_hostile_range_is_refused_and_nothing_is_dropped(in_vmm: InVmm, addr: int,
                                                           length: int) -> None:
    v = in_vmm
    v.ram[0:8] = array.array("Q", [GUEST_WORD]).tobytes()
    v.publish("unbind", (0, PAGE), (addr, length))
    assert v.wake() == lib.PC_PAGER_VIOLATION
    assert "pager protocol violation" in ffi.string(v.p.error).decode()
    assert v.ram[0:8] == array.array("Q", [GUEST_WORD]).tobytes()
    assert _template_intact(v)
