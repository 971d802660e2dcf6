"""The Pager's host server (csrc/pager.c), driven directly: it takes its rings
in memory, so every malformed request a hostile guest could send is fed to the
real C code, and the guest-RAM file is checked byte for byte afterwards."""

from __future__ import annotations

import array
import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from paracell._native import ffi, lib

PAGE = 4096
RAM = 16 << 20
RING = lib.PC_PAGER_RING_GPA  # the rings' range of guest RAM
RING_END = RING + lib.PC_PAGER_SHM_SIZE


@dataclass
class Server:
    p: object
    ram: Path
    shm: object

    def wake(self, doorbells: int = 1, now_ns: int | None = None) -> int:
        return lib.pc_pager_wakeup(self.p, doorbells, now_ns or time.monotonic_ns())

    @property
    def error(self) -> str:
        return ffi.string(self.p.error).decode()

    def unbind(self, *ranges: tuple[int, int]) -> None:
        self._publish(self.shm.unbind, self.shm.unbind_ring, lib.PC_PAGER_UNBIND_SLOTS, ranges)

    def bind(self, *ranges: tuple[int, int]) -> None:
        self._publish(self.shm.bind, self.shm.bind_ring, lib.PC_PAGER_BIND_SLOTS, ranges)

    @staticmethod
    def _publish(ring: object, slots_of: object, slots: int, ranges: tuple[tuple[int, int], ...]
                 ) -> None:
        for i, (addr, length) in enumerate(ranges):
            slot = slots_of[(ring.prod + i) % slots]
            slot.addr, slot.len = addr, length
        ring.prod = (ring.prod + len(ranges)) & 0xFFFFFFFF


def _pattern(offset: int, length: int) -> bytes:
    """Each 8-byte word holds its own file offset, so any misplaced write shows."""
    return array.array("Q", range(offset, offset + length, 8)).tobytes()


def _blocks(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _guest_writes_the_header(shm: object) -> None:
    """What the guest driver does at probe: zeroed rings, then the header."""
    ffi.memmove(shm, bytes(lib.PC_PAGER_SHM_SIZE), lib.PC_PAGER_SHM_SIZE)
    shm.version = lib.PC_PAGER_VERSION
    shm.unbind_slots, shm.bind_slots = lib.PC_PAGER_UNBIND_SLOTS, lib.PC_PAGER_BIND_SLOTS
    shm.magic = lib.PC_PAGER_MAGIC


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    shm_dir = Path("/dev/shm") / f"paracell-pager-unit-{os.getpid()}-{tmp_path.name}"
    shm_dir.mkdir()
    ram = shm_dir / "guest.mem"
    ram.write_bytes(_pattern(0, RAM))  # tmpfs, as in production: punched pages read as zero
    p = ffi.new("struct pc_pager *")
    fds = [os.open(ram, os.O_RDWR), os.open(tmp_path / "shm", os.O_RDWR | os.O_CREAT),
           os.open(tmp_path / "stats", os.O_RDWR | os.O_CREAT)]
    try:
        assert lib.pc_pager_open(p, fds[0], RAM, RAM, fds[1], fds[2]) == lib.PC_PAGER_OK
    finally:
        for fd in fds:
            os.close(fd)
    _guest_writes_the_header(p.shm)
    yield Server(p, ram, p.shm)
    lib.pc_pager_close(p)
    ram.unlink()
    shm_dir.rmdir()


def _assert_untouched(server: Server) -> None:
    """Guest RAM outside the rings, which the test itself writes."""
    assert _blocks(server.ram) == RAM
    data = server.ram.read_bytes()
    assert data[:RING] == _pattern(0, RING)
    assert data[RING_END:] == _pattern(RING_END, RAM - RING_END)


def test_the_rings_are_the_guest_ram_at_their_address(server: Server) -> None:
    assert int(ffi.cast("uintptr_t", server.shm)) - int(ffi.cast("uintptr_t", server.p.ram_map)) \
        == RING
    with open(server.ram, "rb") as f:
        f.seek(RING)
        assert struct.unpack("<I", f.read(4))[0] == lib.PC_PAGER_MAGIC


def test_a_doorbell_before_the_guest_wrote_its_rings_is_a_violation(server: Server) -> None:
    server.shm.magic = 0
    assert server.wake() == lib.PC_PAGER_VIOLATION
    assert server.error.startswith("pager protocol violation: no Pager rings at 0xf00000")
    _assert_untouched(server)


def test_a_restored_guest_continues_its_rings_from_the_last_hosts_indices(
        server: Server) -> None:
    """A VM restored from a template: its rings, in guest RAM, hold the
    indices the template's host had reached; the new host starts there."""
    server.shm.unbind.prod = server.shm.unbind.cons = 0xFFFFFFFE
    server.shm.bind.prod = server.shm.bind.cons = 77
    server.unbind((0, PAGE), (2 * PAGE, PAGE), (4 * PAGE, PAGE))  # wraps past 2^32
    assert server.wake() == lib.PC_PAGER_OK
    assert server.shm.unbind.cons == 1
    assert _blocks(server.ram) == RAM - 3 * PAGE
    # Taken once: a guest that rewrites the host's index later is not believed.
    server.shm.unbind.cons = 0
    server.unbind((8 * PAGE, PAGE))
    assert server.wake() == lib.PC_PAGER_OK
    assert server.p.unbind_cons == 2 and server.shm.unbind.cons == 2


@pytest.mark.parametrize("addr,length", [(RING, PAGE), (RING - PAGE, 2 * PAGE),
                                         (RING_END - PAGE, PAGE)])
def test_a_range_over_the_rings_is_refused(server: Server, addr: int, length: int) -> None:
    server.unbind((addr, length))
    assert server.wake() == lib.PC_PAGER_VIOLATION
    assert "outside the rings" in server.error
    _assert_untouched(server)


def test_unbind_punches_exactly_the_ranges_and_acks(server: Server) -> None:
    server.unbind((1 << 20, 64 * PAGE), (4 << 20, 2 * PAGE))
    assert server.wake() == lib.PC_PAGER_OK
    assert server.shm.unbind.cons == 2
    assert _blocks(server.ram) == RAM - 66 * PAGE
    data = server.ram.read_bytes()
    assert data[1 << 20:(1 << 20) + 64 * PAGE] == bytes(64 * PAGE)
    assert data[:1 << 20] == _pattern(0, 1 << 20)
    end = (1 << 20) + 64 * PAGE
    assert data[end:4 << 20] == _pattern(end, (4 << 20) - end)
    ack = os.read(server.p.irq_fd, 8)
    assert struct.unpack("<Q", ack)[0] == 1
    assert server.p.stats.unbind_pages == 66


def test_bind_populates_what_was_punched(server: Server) -> None:
    server.unbind((0, 256 * PAGE))
    server.wake()
    assert _blocks(server.ram) == RAM - 256 * PAGE
    server.bind((0, 256 * PAGE))
    assert server.wake() == lib.PC_PAGER_OK
    assert _blocks(server.ram) == RAM
    assert server.shm.bind.cons == 1
    assert server.ram.read_bytes()[:256 * PAGE] == bytes(256 * PAGE)


@pytest.mark.parametrize("addr,length", [
    (RAM, PAGE),                 # just past guest RAM
    (RAM - PAGE, 2 * PAGE),      # straddles the end
    (PAGE + 512, PAGE),          # unaligned start
    (PAGE, 100),                 # unaligned length
    (PAGE, 0),                   # empty
    (2**64 - PAGE, 2 * PAGE),    # wraps around
    (1 << 32, PAGE),             # above 4 GiB, where this guest has no RAM
    (0, (lib.PC_PAGER_MAX_RANGE_PAGES + 1) * PAGE),  # oversized range
])
def test_bad_unbind_range_is_refused_and_nothing_is_touched(server: Server, addr: int,
                                                           length: int) -> None:
    server.unbind((0, PAGE), (addr, length))
    assert server.wake() == lib.PC_PAGER_VIOLATION
    assert server.error.startswith("pager protocol violation: UNBIND range")
    assert server.shm.unbind.cons == 0
    _assert_untouched(server)


def test_bad_bind_range_is_refused(server: Server) -> None:
    server.bind((RAM, PAGE))
    assert server.wake() == lib.PC_PAGER_VIOLATION
    assert server.error.startswith("pager protocol violation: BIND range")
    _assert_untouched(server)


def test_overlapping_unbinds_in_one_batch_are_refused_whole(server: Server) -> None:
    server.unbind((8 * PAGE, PAGE), (0, 2 * PAGE), (PAGE, PAGE))
    assert server.wake() == lib.PC_PAGER_VIOLATION
    assert "overlap" in server.error
    _assert_untouched(server)


def test_oversized_batch_and_garbage_index_are_refused(server: Server) -> None:
    server.shm.unbind.prod = lib.PC_PAGER_UNBIND_SLOTS + 1
    assert server.wake() == lib.PC_PAGER_VIOLATION
    assert "oversized UNBIND batch of 65 entries" in server.error
    server.shm.unbind.prod = 0xFFFFFFFF  # "behind" the host's 0
    assert server.wake() == lib.PC_PAGER_VIOLATION
    assert "UNBIND ring index 4294967295 is behind" in server.error
    server.shm.unbind.prod = 0
    server.shm.bind.prod = lib.PC_PAGER_BIND_SLOTS + 7
    assert server.wake() == lib.PC_PAGER_VIOLATION
    assert "oversized BIND batch" in server.error
    _assert_untouched(server)


def test_bind_work_per_wakeup_is_bounded(server: Server) -> None:
    server.bind(*[(i * PAGE, PAGE) for i in range(lib.PC_PAGER_BIND_SLOTS)])
    assert server.wake() == 1  # more left
    assert server.shm.bind.cons == lib.PC_PAGER_MAX_BIND_PER_WAKEUP
    for _ in range(lib.PC_PAGER_BIND_SLOTS // lib.PC_PAGER_MAX_BIND_PER_WAKEUP - 1):
        server.wake(0)
    assert server.shm.bind.cons == lib.PC_PAGER_BIND_SLOTS
    assert server.wake(0) == lib.PC_PAGER_OK


def test_doorbell_storm_is_a_violation_but_a_busy_guest_is_not(server: Server) -> None:
    t0 = 10**12
    limit = lib.PC_PAGER_MAX_IDLE_WAKEUPS
    assert server.wake(limit - 1, t0) == lib.PC_PAGER_OK
    # A new second starts a new window.
    assert server.wake(limit - 1, t0 + 1_000_000_001) == lib.PC_PAGER_OK
    # Doorbells that bring work never count.
    for i in range(50):
        server.unbind((i * PAGE, PAGE))
        assert server.wake(limit, t0 + 1_000_000_002) == lib.PC_PAGER_OK
    assert server.wake(2, t0 + 1_000_000_003) == lib.PC_PAGER_VIOLATION
    assert "doorbell storm" in server.error


def test_greeting_follows_the_ivshmem_server_protocol(server: Server) -> None:
    ours, qemus = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, qemus:
        assert lib.pc_pager_greet(server.p, ours.fileno()) == lib.PC_PAGER_OK
        got = []
        for _ in range(5):
            data, fds, _, _ = socket.recv_fds(qemus, 8, 1)
            got.append((struct.unpack("<q", data)[0], len(fds)))
            for fd in fds:
                os.close(fd)
    assert got == [(0, 0), (lib.PC_PAGER_GUEST_PEER, 0), (-1, 1),
                   (lib.PC_PAGER_GUEST_PEER, 1), (lib.PC_PAGER_HOST_PEER, 1)]


def test_the_thread_serves_doorbells_and_close_releases_everything(tmp_path: Path) -> None:
    def open_fds() -> set[str]:
        return set(os.listdir("/proc/self/fd"))

    ram = Path("/dev/shm") / f"paracell-pager-unit-{os.getpid()}-thread.mem"
    ram.write_bytes(bytes(RAM))
    before = open_fds()
    p = ffi.new("struct pc_pager *")
    fds = [os.open(ram, os.O_RDWR), os.open(tmp_path / "shm", os.O_RDWR | os.O_CREAT),
           os.open(tmp_path / "stats", os.O_RDWR | os.O_CREAT)]
    assert lib.pc_pager_open(p, fds[0], RAM, RAM, fds[1], fds[2]) == lib.PC_PAGER_OK
    for fd in fds:
        os.close(fd)
    tasks_before = set(os.listdir("/proc/self/task"))
    try:
        assert lib.pc_pager_start(p) == lib.PC_PAGER_OK
        # Signals for the shim must reach its relay's signalfd, never this thread.
        (tid,) = set(os.listdir("/proc/self/task")) - tasks_before
        status = Path(f"/proc/self/task/{tid}/status").read_text()
        mask = next(ln for ln in status.splitlines() if ln.startswith("SigBlk:")).split()[1]
        blocked = int(mask, 16)
        assert blocked & (1 << (15 - 1)) and blocked & (1 << (28 - 1))  # SIGTERM, SIGWINCH
        _guest_writes_the_header(p.shm)
        p.shm.unbind_ring[0].addr, p.shm.unbind_ring[0].len = 0, RING
        p.shm.unbind.prod = 1
        os.write(p.doorbell_fd, struct.pack("<Q", 1))
        deadline = time.monotonic() + 5
        while p.shm.unbind.cons != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.shm.unbind.cons == 1
        assert _blocks(ram) == RAM - RING
        # A violation stops the thread and makes abort_fd readable.
        p.shm.unbind.prod = 1000
        os.write(p.doorbell_fd, struct.pack("<Q", 1))
        deadline = time.monotonic() + 5
        while p.stats.violations == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.read(p.abort_fd, 8) == struct.pack("<Q", 1)
    finally:
        lib.pc_pager_close(p)
        lib.pc_pager_close(p)  # idempotent
        ram.unlink()
    assert open_fds() == before


def test_a_checkpoint_learns_what_was_unbound_and_the_rings(server: Server) -> None:
    """What a checkpoint with QEMU's log of writes adds to it
    (pc_pager_take_unbound): every page unbound since the last call, and the
    rings' pages, which this server writes itself; then it starts afresh."""
    pages = RAM // PAGE
    changed = ffi.new("uint8_t[]", pages)
    server.unbind((0, 2 * PAGE), (8 * PAGE, PAGE))
    assert server.wake() == lib.PC_PAGER_OK
    lib.pc_pager_take_unbound(server.p, changed)
    rings = set(range(RING // PAGE, RING_END // PAGE))
    assert {i for i in range(pages) if changed[i]} == {0, 1, 8} | rings
    again = ffi.new("uint8_t[]", pages)
    lib.pc_pager_take_unbound(server.p, again)
    assert {i for i in range(pages) if again[i]} == rings
