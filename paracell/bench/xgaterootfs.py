"""The rootfs that XGates guests run in tests and benchmarks: busybox, the
host's own Debian 12 binaries and libraries copied in unmodified (glibc and
its loader, python3 with its standard library, bash and coreutils), and the
guest-side XGates programs (guest/xgate/) built from source against them.

Debian's libc.so.6 carries a WRPKRU in pkey_set(); the XGates guest kernel
maps that one site as a trap it emulates with the protected keys closed
(docs/xgates.md, "glibc's pkey_set"), so the libc goes in as Debian ships it."""

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
LOADER = Path("/lib64/ld-linux-x86-64.so.2")
LIBDIR = Path("/lib/x86_64-linux-gnu")
PYTHON = Path("/usr/bin/python3")
# Debian's own dynamically linked programs, copied to the same paths.
DEBIAN_PROGRAMS = [Path("/bin/bash"), *(Path("/usr/bin") / n for n in (
    "ls", "cat", "sort", "wc", "sha256sum", "head", "tr", "seq", "env", "id", "stat"))]
PY_STDLIB_SKIP = {"test", "idlelib", "tkinter", "lib2to3", "ensurepip", "turtledemo",
                  "dist-packages", "site-packages", "config-3.11-x86_64-linux-gnu"}


def gcc(out: Path, sources: list[str], *flags: str) -> None:
    cmd = ["gcc", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{SOURCES}", *flags, "-o", str(out),
           *(str(SOURCES / s) for s in sources)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ParacellError(f"building {out.name} failed: {result.stderr.strip()[-300:]}")


def _copy_lib(path: Path, rootfs: Path) -> None:
    target = rootfs / str(path).lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        shutil.copy2(path.resolve(), target)


def _libs_of(binary: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    return [Path(m) for m in re.findall(r"(/\S+) \(0x", out)]


def xgate_rootfs(rootfs: Path, python: bool = False, checks: bool = True) -> Path:
    """busybox + Debian's glibc + xgate-bench (static and dynamic) and
    /lib/libxgate-preload.so; with checks, xgate-test, xgate-pitfalls, xgate-glibc (dynamic),
    xgate-stray (which carries a WRPKRU on purpose), xgate-split (WRPKRU bytes
    across two instructions, on purpose), bash and coreutils
    (Debian's, at /usr/bin and /bin/bash); with python, Debian's python3."""
    defaultspec.busybox_rootfs(rootfs)
    bin_dir = rootfs / "bin"
    if checks:
        gcc(bin_dir / "xgate-test", ["xgate-test.c", "libxgate.c"], "-static", "-pthread")
        gcc(bin_dir / "xgate-stray", ["xgate-stray.c"], "-static")
        gcc(bin_dir / "xgate-split", ["xgate-split.c", "libxgate.c"], "-static")
        gcc(bin_dir / "xgate-glibc", ["xgate-glibc.c", "libxgate.c"], "-pthread",
            "-mno-red-zone")
        gcc(bin_dir / "xgate-pitfalls", ["xgate-pitfalls.c", "libxgate.c"], "-static",
            "-pthread", "-mno-red-zone")
        for program in DEBIAN_PROGRAMS:
            _add_debian_program(program, rootfs)
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


def _add_debian_program(program: Path, rootfs: Path) -> None:
    """The host's program at its own path (bash replaces busybox's /bin/bash link)."""
    target = rootfs / str(program).lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink():
        target.unlink()
    if not target.exists():
        shutil.copy2(program.resolve(), target)
    for lib in _libs_of(program):
        _copy_lib(lib, rootfs)


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
