"""`paracell bench xgate`: XGates gate calls against syscalls, the vDSO and a
pipe round trip, measured inside a guest (TCG here), plus a syscall-heavy
dynamic program with and without the LD_PRELOAD routing.
The rootfs and its programs come from paracell.xgate.rootfs."""

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
from paracell.runtime.bundle import defaultspec
from paracell.xgate.rootfs import gcc, xgate_rootfs

# micro: calls per round (the pipe round trip does a tenth), rounds.
MICRO_CALLS, MICRO_ROUNDS = 20000, 7
IDLOOP_ROUNDS, IDLOOP_REPEATS = 20000, 5
GOAL_GATE_VS_SYSCALL = 1.0  # a gate call must beat the syscall it replaces


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
    gcc(plain_rootfs / "bin" / "xgate-wrpkru", ["xgate-wrpkru.c"], "-static")
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
