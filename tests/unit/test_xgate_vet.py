"""`paracell xgate vet`: crafted ELFs with encodings where a loader maps code,
real Debian binaries, and hostile input (bad headers, symlink tricks, bounds)."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from paracell.errors import ParacellError
from paracell.xgate import elfscan, vet
from tests.conftest import PARACELL
from tests.xgate_elf import EM_AARCH64, EM_X86_64, PF_R, PF_X, WRPKRU, make_elf


def found(path: Path) -> list[tuple[int, int | None, str, bool]]:
    return [(f.offset, f.vaddr, f.instruction, f.offence)
            for f in vet.vet_paths([str(path)]).findings]


def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([PARACELL, "xgate", "vet", *args], capture_output=True, timeout=120)


# --- where the encodings are ---------------------------------------------------------


def test_aligned_unaligned_and_page_crossing_in_one_segment(tmp_path):
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x2000)], 0x3000,
                   {0x1000: WRPKRU, 0x1003: WRPKRU, 0x1ffe: WRPKRU})
    assert found(elf) == [
        (0x1000, 0x401000, "wrpkru", True),
        (0x1003, 0x401003, "wrpkru", True),
        (0x1ffe, 0x401ffe, "wrpkru", True),  # bytes 0x1ffe..0x2000 cross a page
    ]


def test_bytes_outside_executable_segments_do_not_count(tmp_path):
    elf = make_elf(tmp_path / "a",
                   [(PF_R | PF_X, 0x1000, 0x401000, 0x1000), (PF_R, 0x2000, 0x402000, 0x1000)],
                   0x3000, {0x2010: WRPKRU})
    assert found(elf) == []


def test_whole_pages_of_a_segment_are_scanned_as_the_loader_maps_them(tmp_path):
    """A segment of 0x10 bytes at 0x1800 maps the page 0x1000..0x2000 executable."""
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1800, 0x401800, 0x10)], 0x3000,
                   {0x1100: WRPKRU, 0x1f00: WRPKRU, 0x2100: WRPKRU})
    assert found(elf) == [(0x1100, 0x401100, "wrpkru", True), (0x1f00, 0x401f00, "wrpkru", True)]


@pytest.mark.parametrize("split", [1, 2])
def test_split_across_segments_contiguous_in_the_file(tmp_path, split):
    at = 0x2000 - split
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000),
                                    (PF_R | PF_X, 0x2000, 0x600000, 0x1000)], 0x3000, {at: WRPKRU})
    assert found(elf) == [(at, 0x401000 + at - 0x1000, "wrpkru", True)]


@pytest.mark.parametrize("split", [1, 2])
def test_split_across_segments_contiguous_in_memory_only(tmp_path, split):
    at = 0x2000 - split
    elf = make_elf(tmp_path / "a",
                   [(PF_R | PF_X, 0x1000, 0x401000, 0x1000), (PF_R, 0x2000, 0x700000, 0x1000),
                    (PF_R | PF_X, 0x3000, 0x402000, 0x1000)],
                   0x4000, {at: WRPKRU[:split], 0x3000: WRPKRU[split:]})
    assert found(elf) == [(at, 0x401000 + at - 0x1000, "wrpkru", True)]


def test_split_between_segments_that_touch_nowhere_is_no_encoding(tmp_path):
    elf = make_elf(tmp_path / "a",
                   [(PF_R | PF_X, 0x1000, 0x401000, 0x1000), (PF_R, 0x2000, 0x700000, 0x1000),
                    (PF_R | PF_X, 0x3000, 0x500000, 0x1000)],
                   0x4000, {0x1ffe: WRPKRU[:2], 0x3000: WRPKRU[2:]})
    assert found(elf) == []


def test_xrstor_forms_are_information_and_register_forms_are_not_found(tmp_path):
    code = {
        0x1000: b"\x0f\xae\x2f",  # xrstor (%rdi)
        0x1010: b"\x48\x0f\xae\x6c\x24\x40",  # xrstor64 0x40(%rsp)
        0x1020: b"\x0f\xc7\x1f",  # xrstors (%rdi)
        0x1030: b"\x49\x0f\xc7\x9f",  # xrstors64 disp32(%r15)
        0x1040: b"\x0f\xae\xe8",  # lfence: /5 with mod=3
        0x1050: b"\x0f\xae\x27",  # xsave (%rdi): /4
        0x1060: b"\x0f\xc7\xd8",  # /3 with mod=3 is no XRSTORS
        0x1070: b"\x0f\x01\xee",  # rdpkru reads, never writes
    }
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000, code)
    assert found(elf) == [
        (0x1000, 0x401000, "xrstor", False),
        (0x1010, 0x401010, "xrstor64", False),
        (0x1020, 0x401020, "xrstors", False),
        (0x1030, 0x401030, "xrstors64", False),
    ]


def test_reads_in_chunks_without_missing_or_doubling_an_encoding(tmp_path, monkeypatch):
    monkeypatch.setattr(elfscan, "CHUNK", 64)
    cut = [0x1000 + 64 * n for n in range(1, 12)]
    wrpkrus = [cut[1] - 3, cut[3] - 2, cut[5] - 1, cut[7]]  # before, across, after a cut
    patches = {at: WRPKRU for at in wrpkrus}
    patches[cut[9] - 1] = b"\x48\x0f\xae\x2f"  # REX before the cut, opcode after it
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000, patches)
    assert [(o, i) for o, _, i, _ in found(elf)] == [
        *((at, "wrpkru") for at in wrpkrus), (cut[9] - 1, "xrstor64")]


# --- real binaries ---------------------------------------------------------------------


def _needs(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")


def test_a_static_c_program_is_clean_and_a_patched_copy_is_found(tmp_path):
    from elftools.elf.elffile import ELFFile

    _needs("gcc")
    src = tmp_path / "hello.c"
    src.write_text('#include <stdio.h>\nint main(void) { puts("hi"); return 0; }\n')
    exe = tmp_path / "hello"
    subprocess.run(["gcc", "-static", "-O2", "-o", str(exe), str(src)], check=True)
    assert [f for f in found(exe) if f[3]] == []
    with exe.open("rb") as f:
        text = ELFFile(f).get_section_by_name(".text")
        offset, addr = text["sh_offset"] + 5, text["sh_addr"] + 5
    data = bytearray(exe.read_bytes())
    data[offset:offset + 3] = WRPKRU
    patched = tmp_path / "patched"
    patched.write_bytes(bytes(data))
    assert (offset, addr, "wrpkru", True) in found(patched)


def test_debian_busybox_static_has_no_offence():
    busybox = Path("/bin/busybox")
    if not busybox.is_file():
        pytest.skip("busybox-static is not installed")
    assert vet.vet_paths([str(busybox)]).offences == []


def _python3_closure() -> list[str]:
    python = os.path.realpath("/usr/bin/python3")
    out = subprocess.run(["ldd", python], capture_output=True, text=True, check=True).stdout
    libs = [word for line in out.splitlines() for word in line.split() if word.startswith("/")]
    return [python, *libs]


def _symbol_bounds(path: str, name: str) -> tuple[int, int]:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        for sym in ELFFile(f).get_section_by_name(".dynsym").iter_symbols():
            if sym.name == name:
                return sym["st_value"], sym["st_value"] + sym["st_size"]
    raise AssertionError(f"{name} not in {path}")


def test_debian_python3_and_its_libraries_have_no_offence():
    """What Debian 12 really ships: ld.so's XRSTOR and libc's one WRPKRU, in
    pkey_set(), a pkey_set site that the guest kernel traps: information only."""
    closure = _python3_closure()
    report = vet.vet_paths(closure)
    assert report.elf_files == len(closure)
    assert report.offences == []
    sites = [f for f in report.findings if f.instruction == "wrpkru-pkey_set"]
    assert [os.path.basename(f.path) for f in sites] == ["libc.so.6"], sites
    lo, hi = _symbol_bounds(sites[0].path, "pkey_set")
    assert sites[0].vaddr is not None and lo <= sites[0].vaddr < hi, sites[0]
    assert any(f.instruction.startswith("xrstor") for f in report.findings
               if "ld-linux" in f.path)


SITE = WRPKRU + b"\x31\xc0\xc3"


@pytest.mark.parametrize("tail, instruction, offence", [
    (b"\x31\xc0\xc3", "wrpkru-pkey_set", False),  # glibc's pkey_set
    (b"\x31\xc0\x90", "wrpkru", True),  # one byte off: refused
    (b"\x31\xc0", "wrpkru", True),  # the file ends first: refused
    (b"", "wrpkru", True),
])
def test_pkey_set_site_rule(tmp_path, tail, instruction, offence):
    size = 0x2000
    at = size - 3 - len(tail)
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], size,
                   {0x1100: SITE, at: WRPKRU + tail})
    assert found(elf) == [(0x1100, 0x401100, "wrpkru-pkey_set", False),
                          (at, 0x401000 + at - 0x1000, instruction, offence)]


def test_pkey_set_tail_is_read_past_the_segment_as_the_kernel_does(tmp_path):
    # The WRPKRU ends the executable page; its tail lies in the next, non-executable one.
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000),
                                    (PF_R, 0x2000, 0x402000, 0x1000)], 0x3000,
                   {0x1ffd: SITE})
    assert found(elf) == [(0x1ffd, 0x401ffd, "wrpkru-pkey_set", False)]


def test_pkey_set_site_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(elfscan, "CHUNK", 0x100)
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000,
                   {0x10fe: SITE, 0x11fd: SITE, 0x12ff: WRPKRU + b"\x31\xc0\x90"})
    assert found(elf) == [(0x10fe, 0x4010fe, "wrpkru-pkey_set", False),
                          (0x11fd, 0x4011fd, "wrpkru-pkey_set", False),
                          (0x12ff, 0x4012ff, "wrpkru", True)]


# libnettle.so.8.6's first one: rol $0xf,%r15d (41 c1 c7 0f); add %ebp,%edi (01 ef).
NETTLE = b"\x41\xc1\xc7\x0f\x01\xef"


@pytest.mark.parametrize("head, instruction, offence", [
    (b"\x41\xc1\xc7", "wrpkru-split", False),  # libnettle: rol r15d, 15
    (b"\x83\xe0", "wrpkru-split", False),  # and eax, 15
    (b"\xc1\x47", "wrpkru", True),  # memory form: the 0f may be a displacement
    (b"\xb8\x90", "wrpkru", True),  # no shift or ALU immediate before it
])
def test_split_site_rule(tmp_path, head, instruction, offence):
    at = 0x1200
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000,
                   {at - len(head): head + WRPKRU})
    assert found(elf) == [(at, 0x401000 + at - 0x1000, instruction, offence)]


def test_split_site_head_must_lie_in_the_segment_as_the_kernel_requires(tmp_path):
    # The 0f is the segment's second byte: its head starts a page earlier, which
    # the kernel does not read at mmap, so it refuses; so does the host.
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000,
                   {0xffe: b"\xc1\xc7\x90" + WRPKRU})
    assert found(elf) == [(0x1001, 0x401001, "wrpkru", True)]
    elf = make_elf(tmp_path / "b", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000,
                   {0x1000: b"\xc1\xc7" + WRPKRU})
    assert found(elf) == [(0x1002, 0x401002, "wrpkru-split", False)]


def test_split_site_head_in_the_previous_segment_is_an_offence(tmp_path):
    # Two executable segments that touch in the file are scanned as one run, but
    # the kernel maps (and vets) each on its own: the head is outside the second.
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000),
                                    (PF_R | PF_X, 0x2000, 0x403000, 0x1000)], 0x3000,
                   {0x1ffe: b"\xc1\xc7" + WRPKRU})
    assert found(elf) == [(0x2000, 0x403000, "wrpkru", True)]


def test_split_site_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(elfscan, "CHUNK", 0x100)
    # Reads end at 0x1100, 0x1200, 0x1300: the WRPKRU cut by one, the WRPKRU just
    # after one, the head cut by one.
    patches = {0x10fb: NETTLE, 0x11fd: NETTLE, 0x12fe: NETTLE}
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000, patches)
    assert found(elf) == [(at + 3, 0x400000 + at + 3, "wrpkru-split", False)
                          for at in sorted(patches)]


def test_more_sites_than_the_kernel_traps_are_offences(tmp_path):
    patches = {0x1100 + 0x10 * i: NETTLE if i % 2 else SITE for i in range(10)}
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000, patches)
    kinds = [(instruction, offence) for _, _, instruction, offence in found(elf)]
    assert kinds == [("wrpkru-pkey_set", False), ("wrpkru-split", False)] * 4 + \
        [("wrpkru", True)] * 2


def test_debian_libnettle_has_two_split_sites_and_no_offence():
    path = "/usr/lib/x86_64-linux-gnu/libnettle.so.8.6"
    if not os.path.exists(path):
        pytest.skip("libnettle8 is not installed on this host")
    report = vet.vet_paths([path])
    assert report.offences == []
    assert [(f.offset, f.instruction) for f in report.findings] == \
        [(0x27a71, "wrpkru-split"), (0x27dd9, "wrpkru-split")]


# --- hostile input ---------------------------------------------------------------------


def test_truncated_and_garbage_elf_headers_are_scanned_whole(tmp_path):
    rng = random.Random(8)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x7fELF" + bytes(rng.randrange(256) for _ in range(4000)))
    vet.vet_paths([str(garbage)])  # whatever it holds, no exception
    headless = tmp_path / "headless"
    ident = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    headless.write_bytes(ident + struct.pack("<HH", 2, EM_X86_64) + b"\xff" * 44 + b"\0" * 100
                         + WRPKRU)  # program header table: 65535 entries of 65535 bytes
    report = vet.vet_paths([str(headless)])
    assert [(f.offset, f.vaddr, f.offence) for f in report.findings] == [(164, None, True)]
    assert "whole file scanned" in report.notes[0][1]
    assert vet.vet_paths([str(make_elf(tmp_path / "tiny", [], 64))]).findings == []
    (tmp_path / "four").write_bytes(b"\x7fELF")
    assert vet.vet_paths([str(tmp_path / "four")]).offences == []


def test_a_segment_past_the_end_of_the_file_is_clipped(tmp_path):
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x100000)], 0x1800,
                   {0x17fd: WRPKRU})
    report = vet.vet_paths([str(elf)])
    assert [(f.offset, f.vaddr) for f in report.findings] == [(0x17fd, 0x4017fd)]
    assert "past the end" in report.notes[0][1]


def test_foreign_machine_code_is_not_scanned(tmp_path):
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000,
                   {0x1000: WRPKRU}, machine=EM_AARCH64)
    report = vet.vet_paths([str(elf)])
    assert report.findings == [] and "EM_AARCH64" in report.notes[0][1]


def test_symlink_loops_fifos_and_links_out_of_a_bundle_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    make_elf(outside / "evil", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000,
             {0x1000: WRPKRU})
    bundle = tmp_path / "bundle"
    rootfs = bundle / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2",
                                                    "root": {"path": "rootfs"}}))
    (rootfs / "bin" / "evil").symlink_to(outside / "evil")
    (rootfs / "out").symlink_to(outside)
    (rootfs / "up").symlink_to("../..")
    (rootfs / "loop1").symlink_to("loop2")
    (rootfs / "loop2").symlink_to("loop1")
    (rootfs / "self").symlink_to("self")
    os.mkfifo(rootfs / "fifo")
    shutil.copy("/bin/true", rootfs / "bin" / "true")
    clean = cli(str(bundle))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout.startswith(b"0 offence(s)")
    assert cli(str(outside)).returncode == 1  # the file the links point at is an offence
    from paracell.runtime.bundle import spec

    report = vet.vet_paths([str(bundle)], bundle_rootfs=spec.bundle_rootfs)
    assert report.roots == [str(rootfs)] and report.elf_files == 1


def test_bundle_offence_is_named_by_its_path_in_the_rootfs(tmp_path):
    rootfs = tmp_path / "bundle" / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (tmp_path / "bundle" / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    make_elf(rootfs / "bin" / "evil", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000,
             {0x1234: WRPKRU})
    out = cli("--json", str(tmp_path / "bundle"))
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert doc["clean"] is False and doc["offences"] == 1
    (finding,) = doc["findings"]
    assert finding["inside"] == "/bin/evil" and finding["offset"] == 0x1234
    assert finding["vaddr"] == 0x401234 and finding["bytes"] == "0f 01 ef"


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (tmp_path / "real").mkdir()
    (bundle / "rootfs").symlink_to(tmp_path / "real")
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    (tmp_path / "nojson").mkdir()
    (tmp_path / "nojson" / "config.json").write_text("{")
    os.mkfifo(tmp_path / "fifo")
    for args in ([str(tmp_path / "missing")], [str(bundle)], [str(tmp_path / "nojson")],
                 [str(tmp_path / "fifo")]):
        out = cli(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stdout == b"" and len(out.stderr.decode().strip().splitlines()) == 1


def test_entry_and_depth_bounds_are_errors_not_silence(tmp_path):
    deep = tmp_path / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    for i in range(5):
        (tmp_path / f"f{i}").write_bytes(b"x")
    with pytest.raises(ParacellError, match="more than 3 entries") as err:
        vet.vet_paths([str(tmp_path)], max_entries=3)
    assert err.value.exit_code == 2
    with pytest.raises(ParacellError, match="deeper than 2"):
        vet.vet_paths([str(tmp_path)], max_depth=2)
    assert vet.vet_paths([str(tmp_path)], max_depth=4).offences == []


def test_a_hard_linked_file_is_scanned_once(tmp_path):
    make_elf(tmp_path / "one", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000,
             {0x1000: WRPKRU})
    os.link(tmp_path / "one", tmp_path / "two")
    report = vet.vet_paths([str(tmp_path)])
    assert report.elf_files == 1 and len(report.offences) == 1


def test_a_file_full_of_encodings_lists_a_bounded_number_and_still_its_offence(tmp_path):
    xrstors = b"\x0f\xae\x2f" * 2000
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x3000)], 0x4000,
                   {0x1000: xrstors, 0x1000 + len(xrstors): WRPKRU})
    report = vet.vet_paths([str(elf)])
    assert len(report.findings) == elfscan.MAX_HITS + 1
    assert [(f.offset, f.offence) for f in report.offences] == [(0x1000 + len(xrstors), True)]
    assert "only the first" in report.notes[0][1]
    flood = make_elf(tmp_path / "b", [(PF_R | PF_X, 0x1000, 0x401000, 0x40000)], 0x41000,
                     {0x1000: WRPKRU * 80000})
    assert len(vet.vet_paths([str(flood)]).findings) == elfscan.MAX_HITS


def test_a_broken_section_table_does_not_matter(tmp_path):
    """Loaders read program headers only; so does the vet."""
    garbage_sections = {0x28: b"\xff" * 8, 0x3c: struct.pack("<HH", 0x1234, 0x1233)}
    elf = make_elf(tmp_path / "a", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000,
                   {**garbage_sections, 0x1010: WRPKRU, 0x80: WRPKRU})
    report = vet.vet_paths([str(elf)])
    assert [(f.offset, f.vaddr) for f in report.findings] == [(0x1010, 0x401010)]
    assert report.notes == []
