"""`paracell bench xgate`: XGates gate calls against syscalls, the vDSO and a
pipe round trip, measured inside a guest (TCG here), plus a syscall-heavy
dynamic program with and without the LD_PRELOAD routing, and real programs
(Debian's python3 on a short workload, the syscall-heavy C program) timed
whole with XGates on and off, with the number of calls the gates answered.
The rootfs and its programs come from paracell.bench.xgaterootfs (the host's
Debian 12 binaries, unmodified)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paracell.bench import common
from paracell.bench.xgaterootfs import gcc, xgate_rootfs
from paracell.errors import ParacellError
from paracell.runtime.bundle import defaultspec

# micro: calls per round (the pipe round trip does a tenth), rounds.
MICRO_CALLS, MICRO_ROUNDS = 20000, 7
IDLOOP_ROUNDS, IDLOOP_REPEATS = 20000, 5
# Real programs, timed whole (fork to exit) inside the guest, PROGRAM_REPEATS times.
PROGRAM_REPEATS = 5
PY_CALLS = 2000
PY_WORK = ("import os, time, json\n"
           f"for i in range({PY_CALLS}):\n"
           "    os.getpid(); os.getuid(); time.monotonic()\n"
           "json.dumps(list(range(1000)))\n")
C_ROUNDS = 5000  # xgate-bench idloop: 7 glibc id calls per round
PRELOAD = "XGATE_PRELOAD_COUNT=1 LD_PRELOAD=/lib/libxgate-preload.so"
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
        # Cold, as every run of this bench was: a template's guest would run
        # its first code untranslated by TCG (docs/templates.md).
        result = subprocess.run([paracell, "--root", root, "--no-template", "run", "--bundle",
                                 str(bundle), cid], capture_output=True, timeout=900)
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


def _programs_script() -> str:
    """PROGRAM_REPEATS interleaved rounds: python3 and the C program, plain and
    with the preload (which counts the calls the gates answered, on stderr)."""
    py = "python3 -c \"$PY\""
    c = f"xgate-bench idloop {C_ROUNDS}"
    one = (f"echo prog py-plain; xgate-bench-static run {py}; "
           f"echo prog py-preload; {PRELOAD} xgate-bench-static run {py} 2>&1; "
           f"echo prog c-plain; xgate-bench-static run {c}; "
           f"echo prog c-preload; {PRELOAD} xgate-bench-static run {c} 2>&1")
    return "PY=$(printf '%s' '" + PY_WORK.replace("'", "'\\''") + "'); " + "; ".join(
        [one] * PROGRAM_REPEATS)


def _programs(out: str) -> dict[str, dict[str, Any]]:
    """{variant: {"ms": [...], "gate_calls": [...]}} from _programs_script's output."""
    found: dict[str, dict[str, Any]] = {}
    for block in out.split("prog ")[1:]:
        name, _, body = block.partition("\n")
        m = re.search(r"^run (\d+) status (\d+)$", body, re.M)
        if not m or m.group(2) != "0":
            raise ParacellError(f"bench program {name} failed: {body[-300:]}")
        entry = found.setdefault(name.strip(), {"ms": [], "gate_calls": []})
        entry["ms"].append(int(m.group(1)) / 1e6)
        calls = [int(x) for x in re.findall(r"^xgate-preload: (\d+) gate calls$", body, re.M)]
        if calls:
            entry["gate_calls"].append(sum(calls))
    return found


def _program_summary(on: dict[str, dict[str, Any]], off: dict[str, dict[str, Any]]
                     ) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for prog in ("py", "c"):
        plain_on = statistics.median(on[f"{prog}-plain"]["ms"])
        preload_on = statistics.median(on[f"{prog}-preload"]["ms"])
        plain_off = statistics.median(off[f"{prog}-plain"]["ms"])
        calls = on[f"{prog}-preload"]["gate_calls"]
        result["python3" if prog == "py" else "xgate-bench idloop (C)"] = {
            "median_ms": {"xgates off": plain_off, "xgates on": plain_on,
                          "xgates on + LD_PRELOAD gates": preload_on},
            "runs": len(on[f"{prog}-plain"]["ms"]),
            "gate_calls_per_run": statistics.median(calls) if calls else 0,
            "on_vs_off": plain_on / plain_off,
            "preload_vs_off": preload_on / plain_off,
        }
    return result


@dataclass(frozen=True)
class PvmCost:
    """The cost of one user->kernel->user round trip under PVM, and where it is published."""

    switch_ns: float
    source: str

    def __post_init__(self) -> None:
        if not math.isfinite(self.switch_ns) or not 0 < self.switch_ns < 1e9:
            raise ParacellError(f"--pvm-switch-ns must be a positive number of ns, "
                                f"not {self.switch_ns}")
        if not self.source.strip():
            raise ParacellError("--pvm-source must say where the switch cost is published")


# The published figure the projection uses unless told another: a get_pid
# syscall (one user->kernel->user round trip) in a PVM guest nested in a cloud
# VM, as ParaCell's hosts are, with PVM's direct switch.
PUBLISHED_PVM = PvmCost(300.0, (
    "Huang et al., \"PVM: Efficient Shadow Paging for Deploying Secure Containers in "
    "Cloud-native Environment\", SOSP 2023, doi:10.1145/3600006.3613158, Table 2 "
    "(execution time of syscall get_pid, KPTI on/off): pvm (NST) with direct switch 0.3/0.3 us, "
    "without it 1.93/1.93 us; kvm (NST) 0.23/0.06 us; Xeon Platinum 8269CY. The authors' PDF: "
    "github.com/virt-pvm/misc sosp2023-pvm-paper.pdf, commit "
    "72e364ae1f0f52e4e3297903603e78e61f9f76cf"))


def pvm_projection(programs: dict[str, dict[str, Any]], pvm: PvmCost) -> dict[str, Any]:
    """What the measured gate calls would save per run if each replaced one PVM
    round trip of pvm.switch_ns: a projection, never a measurement. The gate's
    own cost on hardware (two WRPKRU, tens of cycles) is left out, so this is
    an upper bound on the saving for that switch cost."""
    return {
        "label": "PROJECTION, not a measurement: nothing here ran under PVM",
        "switch_ns": pvm.switch_ns,
        "source": pvm.source,
        "assumes": "each gate call replaces one user->kernel->user round trip costing "
                   "switch_ns; the gate's own hardware cost is not subtracted",
        "saved_ms_per_run": {name: p["gate_calls_per_run"] * pvm.switch_ns / 1e6
                             for name, p in programs.items()},
    }


def run(ctx: Any, output: str, pvm: PvmCost = PUBLISHED_PVM) -> str:
    from paracell.vmm import probe

    engine = probe.choose_engine(ctx.engine, probe.probe_host()).engine
    rootfs = common.bench_dir() / "xgate-rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    xgate_rootfs(rootfs, python=True, checks=False)
    idloop = [
        f"echo plain; xgate-bench idloop {IDLOOP_ROUNDS}; "
        f"echo preload; LD_PRELOAD=/lib/libxgate-preload.so xgate-bench idloop {IDLOOP_ROUNDS}"
    ] * IDLOOP_REPEATS
    script = (f"xgate-bench-static micro {MICRO_CALLS} {MICRO_ROUNDS}; " + "; ".join(idloop)
              + "; " + _programs_script())
    out = _run_guest(ctx, rootfs, script, xgates=True)
    programs_on = _programs(out)
    if "gate_available 1" not in out:
        raise ParacellError("the guest ran without XGates: no gate page in the bench process")
    micro = {name: _summary(v) for name, v in _micro(out).items()}
    plain = [float(x) for x in re.findall(r"^plain\nidloop ([\d.]+)", out, re.M)]
    preload = [float(x) for x in re.findall(r"^preload\nidloop ([\d.]+)", out, re.M)]
    if not micro or len(plain) != IDLOOP_REPEATS or len(preload) != IDLOOP_REPEATS:
        raise ParacellError(f"unexpected bench output: {out[-300:]}")
    # What one WRPKRU costs on this engine, measured without XGates (the
    # program carries WRPKRU, so it gets a rootfs of its own).
    plain_rootfs = common.bench_dir() / "xgate-rootfs-wrpkru"
    shutil.rmtree(plain_rootfs, ignore_errors=True)
    shutil.copytree(rootfs, plain_rootfs, symlinks=True)
    gcc(plain_rootfs / "bin" / "xgate-wrpkru", ["xgate-wrpkru.c"], "-static")
    off_out = _run_guest(ctx, plain_rootfs, "for i in 1 2 3 4 5; do "
                         f"xgate-wrpkru {MICRO_CALLS}; done; " + _programs_script(),
                         xgates=False)
    found = re.findall(r"wrpkru ([\d.]+) ns", off_out)
    programs_off = _programs(off_out)
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
    result["programs"] = _program_summary(programs_on, programs_off)
    result["programs_note"] = (
        "wall time of each program, fork to exit, inside the guest; XGates on and off in two "
        "guests of the same build; gate calls counted by libxgate-preload.so. Under TCG a "
        "gate costs more than the syscall it replaces (QEMU flushes its TLB on WRPKRU), so "
        "the preload makes these programs slower here.")
    result["pvm_projection"] = pvm_projection(result["programs"], pvm)
    ratio = micro["syscall getpid"]["median_ns"] / gate
    result["goal"] = {"gate_vs_syscall_speedup_at_least": GOAL_GATE_VS_SYSCALL,
                      "measured": ratio, "met": ratio > GOAL_GATE_VS_SYSCALL}
    path = common.write_result(output, result)
    _plot(micro, path.with_suffix(".png"))
    parts = [f"{name} {s['median_ns']:.0f} ns" for name, s in micro.items()]
    verdict = "met" if result["goal"]["met"] else "not met"
    progs = "; ".join(
        f"{name} off/on/on+preload "
        + "/".join(f"{v:.0f}" for v in p["median_ms"].values())
        + f" ms, {p['gate_calls_per_run']:.0f} gate calls"
        for name, p in result["programs"].items())
    projected = result["pvm_projection"]
    saved = ", ".join(f"{name} {ms:.2f} ms saved per run"
                      for name, ms in projected["saved_ms_per_run"].items())
    progs += f"; PROJECTION at {pvm.switch_ns:.0f} ns per PVM syscall round trip: {saved}"
    return (f"{engine}: {'; '.join(parts)}; one WRPKRU {wrpkru:.0f} ns; syscall/gate "
            f"{ratio:.2f}x (goal >{GOAL_GATE_VS_SYSCALL:.0f}x {verdict}); idloop plain/preload "
            f"{speedup:.2f}x; {progs} -> {path}")


def _plot(micro: dict[str, dict[str, float]], output: Path) -> None:
    from paracell.bench import plot

    stats = {name.replace(" ", "\n", 1): {"median_s": s["median_ns"], "min_s": s["min_ns"],
                                         "max_s": s["max_ns"]} for name, s in micro.items()}
    plot.bar_chart(stats, "XGates in-guest ns per call (median, min-max)", 1, "ns", output)
