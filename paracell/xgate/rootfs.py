"""The rootfs that XGates guests run in tests and benchmarks: busybox, glibc,
and the guest-side XGates programs (guest/xgate/) built from source.

Debian's libc.so.6 carries a WRPKRU in pkey_set(); an XGates guest refuses to
map it, so the rootfs gets a copy whose WRPKRU encodings in executable
segments are replaced by UD2+NOP (pkey_set() then traps, which no program
here calls)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from paracell.errors import ParacellError
from paracell.runtime.bundle import defaultspec

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "guest" / "xgate"
WRPKRU = b"\x0f\x01\xef"
UD2_NOP = b"\x0f\x0b\x90"
LOADER = Path("/lib64/ld-linux-x86-64.so.2")
LIBDIR = Path("/lib/x86_64-linux-gnu")
PYTHON = Path("/usr/bin/python3")
PY_STDLIB_SKIP = {"test", "idlelib", "tkinter", "lib2to3", "ensurepip", "turtledemo",
                  "dist-packages", "site-packages", "config-3.11-x86_64-linux-gnu"}


def gcc(out: Path, sources: list[str], *flags: str) -> None:
    cmd = ["gcc", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{SOURCES}", *flags, "-o", str(out),
           *(str(SOURCES / s) for s in sources)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ParacellError(f"building {out.name} failed: {result.stderr.strip()[-300:]}")


def _patched_libc(src: Path, dest: Path) -> int:
    """src with every WRPKRU in an executable PT_LOAD replaced; how many there were."""
    from elftools.elf.elffile import ELFFile

    data = bytearray(src.read_bytes())
    count = 0
    with src.open("rb") as f:
        for seg in ELFFile(f).iter_segments():
            if seg["p_type"] != "PT_LOAD" or not seg["p_flags"] & 1:
                continue
            lo, hi = seg["p_offset"], seg["p_offset"] + seg["p_filesz"]
            for m in re.finditer(re.escape(WRPKRU), bytes(data[lo:hi])):
                data[lo + m.start():lo + m.start() + 3] = UD2_NOP
                count += 1
    dest.write_bytes(bytes(data))
    dest.chmod(0o755)
    return count


def _copy_lib(path: Path, rootfs: Path) -> None:
    target = rootfs / str(path).lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if path.name.startswith("libc.so"):
        _patched_libc(path.resolve(), target)
    elif not target.exists():
        shutil.copy2(path.resolve(), target)


def _libs_of(binary: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    return [Path(m) for m in re.findall(r"(/\S+) \(0x", out)]


def xgate_rootfs(rootfs: Path, python: bool = False, checks: bool = True) -> Path:
    """busybox + glibc (patched) + xgate-bench (static and dynamic) and
    /lib/libxgate-preload.so; with checks, xgate-test and xgate-stray (which
    carries a WRPKRU on purpose); with python, Debian's python3."""
    defaultspec.busybox_rootfs(rootfs)
    bin_dir = rootfs / "bin"
    if checks:
        gcc(bin_dir / "xgate-test", ["xgate-test.c", "libxgate.c"], "-static", "-pthread")
        gcc(bin_dir / "xgate-stray", ["xgate-stray.c"], "-static")
    gcc(bin_dir / "xgate-bench-static", ["xgate-bench.c", "libxgate.c"], "-static")
    gcc(bin_dir / "xgate-bench", ["xgate-bench.c", "libxgate.c"])
    (rootfs / "lib").mkdir(exist_ok=True)
    gcc(rootfs / "lib" / "libxgate-preload.so", ["xgate_preload.c", "libxgate.c"],
         "-shared", "-fPIC")
    for lib in _libs_of(bin_dir / "xgate-bench"):
        _copy_lib(lib, rootfs)
    if python:
        _add_python(rootfs)
    return rootfs


def _add_python(rootfs: Path) -> None:
    exe = PYTHON.resolve()
    target = rootfs / "usr" / "bin" / "python3"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(exe, target)
    for lib in _libs_of(exe):
        _copy_lib(lib, rootfs)
    stdlib = Path(f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}")
    if exe.name != f"python{sys.version_info.major}.{sys.version_info.minor}":
        stdlib = Path("/usr/lib") / exe.name
    dest = rootfs / str(stdlib).lstrip("/")
    if not dest.exists():
        shutil.copytree(stdlib, dest, symlinks=True,
                        ignore=lambda d, names: [n for n in names if n in PY_STDLIB_SKIP])
    dyn = stdlib / "lib-dynload"
    for ext in dyn.glob("*.so") if dyn.is_dir() else []:
        for lib in _libs_of(ext):
            _copy_lib(lib, rootfs)
