"""csrc/checkpoint.c on a RAM file of its own (no VM): with a map of the
pages that changed, a checkpoint reads only those (and holes, which cost no
read), and a rollback rewrites exactly what differs from its target."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from paracell._native import ffi, lib

PAGES = 64
BIG = 1100
PAGE = 4096
SEED = 0x5EED


@pytest.fixture
def ram(tmp_path: Path):
    yield from shm_file(tmp_path, PAGES)


@pytest.fixture
def big_ram(tmp_path: Path):
    """More pages than one system call of a rollback's takes (RUN_PAGES)."""
    yield from shm_file(tmp_path, BIG)


def shm_file(tmp_path: Path, pages: int):
    # /dev/shm: tmpfs, as guest RAM is (holes found with SEEK_DATA).
    path = Path("/dev/shm") / f"paracell-unit-ckpt-{os.getpid()}-{tmp_path.name}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, pages * PAGE)
        yield fd
    finally:
        os.close(fd)
        path.unlink()


def put(fd: int, page: int, byte: int) -> None:
    os.pwrite(fd, bytes([byte]) * PAGE, page * PAGE)


def punch(fd: int, page: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.fallocate(fd, 3, ctypes.c_long(page * PAGE), ctypes.c_long(PAGE)) == 0  # PUNCH|KEEP


class Capture:
    def __init__(self, fd: int, out: Path, seq: int, prev: Capture | None = None,
                 changed: list[int] | None = None, pages: int = PAGES) -> None:
        self.hashes = ffi.new("uint64_t[]", pages)
        self.loc = ffi.new("struct pc_ckpt_loc[]", pages)
        self.fig = ffi.new("struct pc_ckpt_figures *")
        err = ffi.new("char[]", 256)
        changed_map = ffi.NULL
        if changed is not None:
            changed_map = ffi.new("uint8_t[]", PAGES)
            for page in changed:
                changed_map[page] = 1
        out_fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            assert lib.pc_ckpt_capture(fd, ffi.NULL, pages * PAGE, SEED,
                                       prev.hashes if prev else ffi.NULL,
                                       prev.loc if prev else ffi.NULL, changed_map, seq,
                                       self.hashes, self.loc, out_fd, self.fig, err, 256) == 0, \
                ffi.string(err)
        finally:
            os.close(out_fd)


def test_a_map_of_changes_limits_what_is_read_and_what_is_saved(ram: int, tmp_path: Path):
    for page in range(8):
        put(ram, page, 0x10 + page)
    full = Capture(ram, tmp_path / "1.pages", 1)
    assert full.fig.looked == PAGES and full.fig.changed == 8
    put(ram, 3, 0xAA)   # logged
    put(ram, 5, 0xBB)   # not logged: a map that says nothing of it keeps the old hash
    punch(ram, 6)       # a hole where data was: seen without a read
    part = Capture(ram, tmp_path / "2.pages", 2, prev=full, changed=[3])
    assert part.fig.looked == 2  # page 3, and the hole at 6
    assert part.fig.changed == 1 and part.hashes[3] != full.hashes[3]
    assert part.hashes[5] == full.hashes[5] and part.hashes[6] == 0
    assert part.loc[5].seq == 1 and part.loc[3].seq == 2
    # Without a map every page is read, and page 5's change is found.
    every = Capture(ram, tmp_path / "3.pages", 3, prev=full)
    assert every.fig.looked == PAGES and every.hashes[5] != full.hashes[5]


def test_a_rollback_with_a_map_rewrites_what_differs_from_its_target(ram: int,
                                                                     tmp_path: Path):
    for page in range(4):
        put(ram, page, 0x20 + page)
    target = Capture(ram, tmp_path / "1.pages", 1)
    put(ram, 1, 0xCC)
    put(ram, 9, 0xDD)
    later = Capture(ram, tmp_path / "2.pages", 2, prev=target, changed=[1, 9])
    put(ram, 2, 0xEE)  # written since `later`, the base the RAM now goes on from
    changed = ffi.new("uint8_t[]", PAGES)
    changed[2] = 1
    fds = [os.open(tmp_path / f"{n}.pages", os.O_RDONLY) for n in (1, 2)]
    fig = ffi.new("struct pc_ckpt_figures *")
    err = ffi.new("char[]", 256)
    try:
        assert lib.pc_ckpt_revert(ram, ffi.NULL, PAGES * PAGE, SEED, target.hashes, target.loc,
                                  ffi.new("uint32_t[]", [1, 2]), ffi.new("int[]", fds), 2,
                                  later.hashes, changed, fig, err, 256) == 0, ffi.string(err)
    finally:
        for fd in fds:
            os.close(fd)
    # Read: page 2 (written), pages 1 and 9 (base and target differ).
    assert fig.looked == 3 and fig.changed == 3
    for page in range(4):
        assert os.pread(ram, PAGE, page * PAGE) == bytes([0x20 + page]) * PAGE
    assert os.pread(ram, PAGE, 9 * PAGE) == bytes(PAGE)


def page_of(n: int) -> bytes:
    return n.to_bytes(4, "little") * (PAGE // 4)


def test_a_rollback_puts_back_runs_of_holes_and_of_data_whole(big_ram: int, tmp_path: Path):
    """Neighbouring pages are punched, or written back into holes, by one
    system call per run (csrc/checkpoint.c, struct run), runs longer than
    one call takes included; each page ends as its target says."""
    for page in range(1000):
        os.pwrite(big_ram, page_of(page + 1), page * PAGE)
    target = Capture(big_ram, tmp_path / "1.pages", 1, pages=BIG)
    for page in range(10, 701):          # the Pager unbound them: holes to write
        punch(big_ram, page)
    for page in range(800, 806):         # data over data: copied through the mapping
        os.pwrite(big_ram, page_of(0xEEEE), page * PAGE)
    for page in range(1020, 1071):       # data where the target has holes: one punch
        os.pwrite(big_ram, page_of(0xDDDD), page * PAGE)
    fd = os.open(tmp_path / "1.pages", os.O_RDONLY)
    fig = ffi.new("struct pc_ckpt_figures *")
    err = ffi.new("char[]", 256)
    try:
        assert lib.pc_ckpt_revert(big_ram, ffi.NULL, BIG * PAGE, SEED, target.hashes, target.loc,
                                  ffi.new("uint32_t[]", [1]), ffi.new("int[]", [fd]), 1,
                                  ffi.NULL, ffi.NULL, fig, err, 256) == 0, ffi.string(err)
    finally:
        os.close(fd)
    assert fig.changed == 691 + 6 + 51 and fig.bytes == (691 + 6) * PAGE
    for page in range(BIG):
        assert os.pread(big_ram, PAGE, page * PAGE) == (page_of(page + 1) if page < 1000
                                                        else bytes(PAGE)), page
    with pytest.raises(OSError):  # 1000 on is a hole again, not pages of zeros
        os.lseek(big_ram, 1000 * PAGE, os.SEEK_DATA)


def test_a_write_that_stops_short_fails_with_what_was_written(big_ram: int, tmp_path: Path):
    """A file that cannot grow past 100.5 pages (RLIMIT_FSIZE, in a child):
    the batched write goes on from where a short write stopped, then fails
    with the system's reason, its figures counting what reached the file."""
    import resource
    import signal

    for page in range(300):
        os.pwrite(big_ram, page_of(page + 7), page * PAGE)
    target = Capture(big_ram, tmp_path / "1.pages", 1, pages=BIG)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            out = os.open(tmp_path / "new.ram", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(out, BIG * PAGE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (100 * PAGE + PAGE // 2,) * 2)
            fd = os.open(tmp_path / "1.pages", os.O_RDONLY)
            fig = ffi.new("struct pc_ckpt_figures *")
            err = ffi.new("char[]", 256)
            rc = lib.pc_ckpt_materialize(out, BIG * PAGE, SEED, target.hashes, target.loc,
                                         ffi.new("uint32_t[]", [1]), ffi.new("int[]", [fd]), 1,
                                         fig, err, 256)
            said = ffi.string(err).decode()
            written = os.pread(out, 101 * PAGE, 0)
            code = 0 if (rc == -1 and said == "writing guest RAM: File too large" and
                         fig.changed == 100 and fig.bytes == 100 * PAGE + PAGE // 2 and
                         written == b"".join(page_of(n + 7) for n in range(100)) +
                         page_of(107)[:PAGE // 2] + bytes(PAGE // 2)) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_host_that_swaps_turns_the_log_of_writes_off(tmp_path: Path):
    from paracell.runtime.snapshots import writelog

    swaps = tmp_path / "swaps"
    swaps.write_text("Filename\tType\tSize\tUsed\tPriority\n")
    assert not writelog.swap_in_use(str(swaps))
    swaps.write_text("Filename\tType\tSize\tUsed\tPriority\n/dev/vdb partition 1048572 0 -2\n")
    assert writelog.swap_in_use(str(swaps))


def test_this_host_keeps_a_log_of_writes_and_check_says_so():
    """The log QEMU's RAM plugin arms (csrc/dirtylog.c), tried on pages of
    this process's own: one page written, exactly that page reported."""
    from paracell import hostcheck

    kernel = tuple(int(part) for part in os.uname().release.split(".")[:2])
    if kernel < (6, 7):
        pytest.skip(f"Linux {os.uname().release} has no asynchronous write-protection or "
                    "PAGEMAP_SCAN (6.7): checkpoints hash every page there")
    assert lib.pc_dirty_probe() == 0, os.strerror(lib.pc_dirty_probe())
    found = hostcheck.checkpoint_method()
    line = hostcheck._checkpoints_line(found)
    swaps = Path("/proc/swaps").read_text().count("\n") > 1
    assert line.startswith("ckpts:   hash every page" if swaps else
                           "ckpts:   read only the written pages"), line
