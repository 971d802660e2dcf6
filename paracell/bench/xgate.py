"""`paracell bench xgate`: XGates gate calls against syscalls, the vDSO and a
pipe round trip, measured inside a guest (TCG here), plus a syscall-heavy
dynamic program with and without the LD_PRELOAD routing.

Also builds the guest-side XGates programs (guest/xgate/) into a rootfs,
which tests/integration/test_xgate.py shares.  Debian's libc.so.6 carries a
WRPKRU in pkey_set(); an XGates guest refuses to map it, so the rootfs gets
a copy whose WRPKRU encodings in executable segments are replaced by
UD2+NOP (pkey_set() then traps, which no program here calls)."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from paracell.bench import common
from paracell.errors import ParacellError
from paracell.runtime import defaultspec

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "guest" / "xgate"
WRPKRU = b"\x0f\x01\xef"
UD2_NOP = b"\x0f\x0b\x90"
LOADER = Path("/lib64/ld-linux-x86-64.so.2")
LIBDIR = Path("/lib/x86_64-linux-gnu")
PYTHON = Path("/usr/bin/python3")
PY_STDLIB_SKIP = {"test", "idlelib", "tkinter", "lib2to3", "ensurepip", "turtledemo",
                  "dist-packages", "site-packages", "config-3.11-x86_64-linux-gnu"}
# micro: calls per round (the pipe round trip does a tenth), rounds.
MICRO_CALLS, MICRO_ROUNDS = 20000, 7
IDLOOP_ROUNDS, IDLOOP_REPEATS = 20000, 5
GOAL_GATE_VS_SYSCALL = 1.0  # a gate call must beat the syscall it replaces


def _gcc(out: Path, sources: list[str], *flags: str) -> None:
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
        _gcc(bin_dir / "xgate-test", ["xgate-test.c", "libxgate.c"], "-static", "-pthread")
        _gcc(bin_dir / "xgate-stray", ["xgate-stray.c"], "-static")
    _gcc(bin_dir / "xgate-bench-static", ["xgate-bench.c", "libxgate.c"], "-static")
    _gcc(bin_dir / "xgate-bench", ["xgate-bench.c", "libxgate.c"])
    (rootfs / "lib").mkdir(exist_ok=True)
    _gcc(rootfs / "lib" / "libxgate-preload.so", ["xgate_preload.c", "libxgate.c"],
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


def _run_guest(ctx: Any, rootfs: Path, script: str, xgates: bool) -> str:
    """One container with XGates on or off, running script; its stdout."""
    paracell = str(Path(sys.executable).with_name("paracell"))
    with tempfile.TemporaryDirectory(prefix="paracell-bench-xgate-") as tmp:
        bundle = Path(tmp) / "bundle"
        bundle.mkdir()
        config = defaultspec.default_config(["sh", "-c", script])
        config["root"] = {"path": str(rootfs), "readonly": True}
        config["annotations"] = {"io.paracell.xgates": "on" if xgates else "off"}
        (bundle / "config.json").write_text(json.dumps(config))
        root = str(common.bench_dir() / "root")
        cid = f"bench-xgate-{os.getpid()}"
        result = subprocess.run([paracell, "--root", root, "run", "--bundle", str(bundle), cid],
                                capture_output=True, timeout=900)
    if result.returncode != 0:
        raise ParacellError(f"bench container failed ({result.returncode}): "
                            f"{result.stderr.decode(errors='replace')[-300:]}")
    return result.stdout.decode()


def _micro(out: str) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    for m in re.finditer(r"^round \d+ (.+) ([\d.]+)$", out, re.M):
        samples.setdefault(m.group(1), []).append(float(m.group(2)))
    return samples


def _summary(values: list[float]) -> dict[str, float]:
    return {"median_ns": statistics.median(values), "min_ns": min(values),
            "max_ns": max(values), "rounds": len(values)}


def run(ctx: Any, output: str) -> str:
    from paracell.vmm import probe

    engine = probe.choose_engine(ctx.engine, probe.probe_host()).engine
    rootfs = common.bench_dir() / "xgate-rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    xgate_rootfs(rootfs, checks=False)
    idloop = [
        f"echo plain; xgate-bench idloop {IDLOOP_ROUNDS}; "
        f"echo preload; LD_PRELOAD=/lib/libxgate-preload.so xgate-bench idloop {IDLOOP_ROUNDS}"
    ] * IDLOOP_REPEATS
    script = f"xgate-bench-static micro {MICRO_CALLS} {MICRO_ROUNDS}; " + "; ".join(idloop)
    out = _run_guest(ctx, rootfs, script, xgates=True)
    if "gate_available 1" not in out:
        raise ParacellError("the guest ran without XGates: no gate page in the bench process")
    micro = {name: _summary(v) for name, v in _micro(out).items()}
    plain = [float(x) for x in re.findall(r"plain\nidloop ([\d.]+)", out)]
    preload = [float(x) for x in re.findall(r"preload\nidloop ([\d.]+)", out)]
    if not micro or len(plain) != IDLOOP_REPEATS or len(preload) != IDLOOP_REPEATS:
        raise ParacellError(f"unexpected bench output: {out[-300:]}")
    # What one WRPKRU costs on this engine, measured without XGates (the
    # program carries WRPKRU, so it gets a rootfs of its own).
    plain_rootfs = common.bench_dir() / "xgate-rootfs-wrpkru"
    shutil.rmtree(plain_rootfs, ignore_errors=True)
    shutil.copytree(rootfs, plain_rootfs, symlinks=True)
    _gcc(plain_rootfs / "bin" / "xgate-wrpkru", ["xgate-wrpkru.c"], "-static")
    found = re.findall(r"wrpkru ([\d.]+) ns",
                       _run_guest(ctx, plain_rootfs, "for i in 1 2 3 4 5; do "
                                  f"xgate-wrpkru {MICRO_CALLS}; done", xgates=False))
    if not found:
        raise ParacellError("xgate-wrpkru printed nothing")
    wrpkru = statistics.median(float(x) for x in found)
    gate = micro["gate getpid"]["median_ns"]
    result: dict[str, Any] = {
        "benchmark": "XGates in a guest",
        "engine": engine,
        "ns_per_call": micro,
        "ratios_to_gate": {name: s["median_ns"] / gate for name, s in micro.items()},
        "idloop_ns_per_round_of_7_calls": {"plain": _summary(plain),
                                           "LD_PRELOAD libxgate": _summary(preload)},
    }
    speedup = statistics.median(plain) / statistics.median(preload)
    result["idloop_speedup_with_preload"] = speedup
    result["wrpkru_ns_without_xgates"] = wrpkru
    ratio = micro["syscall getpid"]["median_ns"] / gate
    result["goal"] = {"gate_vs_syscall_speedup_at_least": GOAL_GATE_VS_SYSCALL,
                      "measured": ratio, "met": ratio > GOAL_GATE_VS_SYSCALL}
    path = common.write_result(output, result)
    _plot(micro, path.with_suffix(".png"))
    parts = [f"{name} {s['median_ns']:.0f} ns" for name, s in micro.items()]
    verdict = "met" if result["goal"]["met"] else "not met"
    return (f"{engine}: {'; '.join(parts)}; one WRPKRU {wrpkru:.0f} ns; syscall/gate "
            f"{ratio:.2f}x (goal >{GOAL_GATE_VS_SYSCALL:.0f}x {verdict}); idloop plain/preload "
            f"{speedup:.2f}x -> {path}")


def _plot(micro: dict[str, dict[str, float]], output: Path) -> None:
    from paracell.bench import plot

    stats = {name.replace(" ", "\n", 1): {"median_s": s["median_ns"], "min_s": s["min_ns"],
                                         "max_s": s["max_ns"]} for name, s in micro.items()}
    plot.bar_chart(stats, "XGates in-guest ns per call (median, min-max)", 1, "ns", output)
