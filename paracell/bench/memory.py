"""`paracell bench memory`: the Pager, virtio-balloon free page reporting and
no memory manager (RunV's behaviour), side by side in one run, interleaved,
and the Pager again on a VM restored copy-on-write from a template
(`pager_template`), where it runs inside QEMU (docs/templates.md).

Each run boots a real container whose workload (paracell/bench/programs/
pagerload.c) prints one line per event, with the guest's own figure of what
its allocator holds. The host samples what it holds of guest RAM every few
milliseconds: the guest-RAM file's allocated blocks, or, copy-on-write, the
pages of the template's mapping QEMU has (its own and the template's it maps,
as a cold VM's file holds both kinds; paracell/vmm/ramview.py), then QEMU's
RssAnon moving from there, which is cheap enough to read that often. A
copy-on-write VM's host faults per page count the Pager's own populating,
which runs in QEMU there (in the shim for a cold VM).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paracell.bench import common, programs
from paracell.bench.plot import save_figure
from paracell.errors import ParacellError
from paracell.procfs import cpu_ns, page_faults
from paracell.runtime.bundle import defaultspec
from paracell.runtime.context import Context

MANAGERS = ("pager", "balloon", "none", "pager_template")
# The Pager's figures on a VM restored copy-on-write may be this much worse
# than on a cold one's and still count as no worse: runs here differ by more.
TEMPLATE_SLACK = 1.25
GUEST_MIB = 512
MIB = 1 << 20
PAGERLOAD = "/usr/local/bin/pagerload"
SAMPLE_S = 0.002
GAP_MS = 2500  # idle after each free: long enough for the balloon's 2 s pacing
RETOUCH_MIB = 64
RECLAIM_WAIT_MS = 3000  # before the re-touch: past the balloon's 2 s pacing too
RETOUCH_PAIRS = 3  # warm/re-touch pairs per VM: this machine's load moves by the second
USERLAND_ROUNDS, USERLAND_ITEMS = 4, 60000


@dataclass
class Event:
    t: float
    words: list[str]


@dataclass
class Mark:
    """What QEMU and the shim (where the Pager's thread runs) had used when
    the workload printed `mark NAME`."""
    name: str
    qemu_faults: int
    qemu_cpu_ns: int
    shim_cpu_ns: int


@dataclass
class Run:
    manager: str
    events: list[Event] = field(default_factory=list)
    samples: list[tuple[float, int]] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    wall_s: float = 0.0


def _rootfs() -> Path:
    return programs.busybox_rootfs_with("pagerload", common.bench_dir() / "memory-rootfs")


def _bundle(name: str, args: list[str], rootfs: Path) -> Path:
    import json

    bundle = common.bench_dir() / name
    bundle.mkdir(exist_ok=True)
    config = defaultspec.default_config(args)
    config["root"] = {"path": str(rootfs), "readonly": True}
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


class HeldMemory:
    """What the host holds of one container's guest RAM, read every SAMPLE_S."""

    def __init__(self, cid: str, ram_file: Path) -> None:
        self.cid, self.ram_file = cid, ram_file
        self.qemu = 0
        self.base: tuple[int, int] | None = None  # (own pages, RssAnon) when first seen

    def now(self) -> int | None:
        try:
            return os.stat(self.ram_file).st_blocks * 512
        except OSError:
            pass
        if not self.qemu:
            self.qemu = _pids(self.cid)[0]
            if not self.qemu:
                return None
        if self.base is None:
            from paracell.vmm import ramview

            ram = ramview.view(self.ram_file, GUEST_MIB * MIB, self.qemu)
            anon = _rss_anon(self.qemu)
            if ram is None or anon is None:
                return None
            self.base = (ram.mapped, anon)
            return ram.mapped
        anon = _rss_anon(self.qemu)
        return None if anon is None else self.base[0] + anon - self.base[1]


def _rss_anon(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _sample(held: HeldMemory, out: list[tuple[float, int]], stop: threading.Event) -> None:
    while not stop.is_set():
        value = held.now()
        if value is not None:
            out.append((time.monotonic(), value))
        time.sleep(SAMPLE_S)


def _pids(cid: str) -> tuple[int, int]:
    """QEMU's and the shim's pids, 0 where not known (yet)."""
    from paracell.runtime.state.store import StateStore

    try:
        state = StateStore(common.state_root()).load(cid)
    except ParacellError:  # not created yet, or gone
        return 0, 0
    return (state.vm.qemu_pid if state.vm else 0) or 0, state.shim_pid or 0


def _mark(name: str, cid: str) -> Mark:
    qemu, shim = _pids(cid)
    return Mark(name, (page_faults(qemu) or 0) if qemu else 0, (cpu_ns(qemu) or 0) if qemu else 0,
                (cpu_ns(shim) or 0) if shim else 0)


def _env(templates: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, PARACELL_GUEST_MEMORY_MIB=str(GUEST_MIB))
    if templates is not None:
        env |= {"PARACELL_TEMPLATES": str(templates), "PARACELL_TEMPLATE_RAM": "shared"}
    return env


def run_one(manager: str, bundle: Path, cid: str, templates: Path | None = None) -> Run:
    """One container to its end; `pager_template` restores it from the
    template in `templates` (copy-on-write), every other manager boots cold,
    as in the suite."""
    from paracell.vmm import memory

    run = Run(manager)
    root = common.state_root()
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(
        HeldMemory(cid, memory.path_for(root, cid)), run.samples, stop), daemon=True)
    sampler.start()
    began = time.monotonic()
    restored = manager == "pager_template"
    cmd = [common.paracell_executable(), "--root", root, "--memory-manager",
           "pager" if restored else manager, *([] if restored else ["--no-template"]),
           "run", "--bundle", str(bundle), cid]
    proc = subprocess.Popen(cmd, env=_env(templates if restored else None),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    for raw in proc.stdout:
        words = raw.decode(errors="replace").split()
        run.events.append(Event(time.monotonic(), words))
        if words[:1] == ["mark"]:
            run.marks.append(_mark(" ".join(words[1:]), cid))
    rc = proc.wait()
    run.wall_s = time.monotonic() - began
    stop.set()
    sampler.join()
    if rc != 0:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise ParacellError(f"bench memory: the {manager} run exited {rc}: "
                            f"{err.strip().splitlines()[-1] if err.strip() else 'no message'}")
    return run


def _resident_at(run: Run, t: float) -> int:
    before = [r for ts, r in run.samples if ts <= t]
    return before[-1] if before else 0


def _guest_used(event: Event) -> int:
    """Guest RAM minus the guest's MemFree: what the host must back at least."""
    return GUEST_MIB * MIB - int(event.words[-1]) * 1024


def trace_figures(run: Run) -> dict[str, Any]:
    frees = [e for e in run.events if e.words[:1] == ["freed"]]
    allocs = [e for e in run.events if e.words[:1] == ["allocated"]]
    peak_used = max(_guest_used(e) for e in allocs)
    waste = [(_resident_at(run, ev.t + 1.0) - _guest_used(ev)) / peak_used * 100 for ev in frees]
    reclaims: list[float | None] = []
    frees_ms: list[float] = []
    lags: list[float | None] = []
    # Timed from the line the workload prints just before it frees. Under TCG the
    # guest's own munmap of 256 MiB takes about as long as the goal (it is the
    # same with no memory manager), so the time from the line it prints once the
    # free returns is recorded too: what the host still lags behind the guest.
    for i, ev in enumerate(run.events):
        if ev.words[:1] != ["freeing"] or int(ev.words[1]) != 256:
            continue
        after = run.events[i + 1] if i + 1 < len(run.events) else None
        start = _resident_at(run, ev.t)
        target = start - 0.9 * 256 * MIB
        hit = next((ts for ts, r in run.samples if ts >= ev.t and r <= target), None)
        reclaims.append((hit - ev.t) * 1000 if hit is not None else None)
        if after is not None and after.words[:1] == ["freed"]:
            frees_ms.append((after.t - ev.t) * 1000)
            lags.append(max(0.0, hit - after.t) * 1000 if hit is not None else None)
    done = [r for r in reclaims if r is not None]
    lagged = [x for x in lags if x is not None]
    return {
        "waste_pct": statistics.mean(waste),
        "reclaim_ms": statistics.median(done) if len(done) == len(reclaims) and done else None,
        "reclaim_ms_each": reclaims,
        "guest_free_ms": statistics.median(frees_ms) if frees_ms else None,
        "guest_free_ms_each": frees_ms,
        "reclaim_after_free_ms": statistics.median(lagged)
        if lagged and len(lagged) == len(lags) else None,
        "reclaim_after_free_ms_each": lags,
        "peak_host_mib": max(r for _, r in run.samples) / MIB,
        "trace_s": run.wall_s,
    }


def _pairs(words: list[str], kind: type) -> dict[str, Any]:
    """`name value name value ...` as a dict."""
    return {k: kind(v) for k, v in zip(words[0::2], words[1::2], strict=False)}


def retouch_figures(run: Run) -> dict[str, Any]:
    """One VM's warm/re-touch pairs: medians of the pairs, and each pair."""
    warm = [float(e.words[1]) for e in run.events if e.words[:1] == ["warm"]]
    cold = [float(e.words[1]) for e in run.events if e.words[:1] == ["retouch"]]
    pages = RETOUCH_MIB * MIB // 4096

    def spans(touch: str) -> list[tuple[Mark, Mark]]:
        starts = [m for m in run.marks if m.name == f"{touch} start"]
        ends = [m for m in run.marks if m.name == f"{touch} end"]
        return list(zip(starts, ends, strict=False))

    faults = [(b.qemu_faults - a.qemu_faults) / pages for a, b in spans("retouch")]
    # CPU per page, whatever the wall clock: QEMU's (the vCPU, and its host
    # faults) and the shim's (the Pager's thread binding, in parallel).
    cpu = {touch: [{"qemu_us_per_page": (b.qemu_cpu_ns - a.qemu_cpu_ns) / 1e3 / pages,
                    "shim_us_per_page": (b.shim_cpu_ns - a.shim_cpu_ns) / 1e3 / pages}
                   for a, b in spans(touch)] for touch in ("warm", "retouch")}
    # Per 2 MiB chunk: a touch slowed on every page has little excess over its
    # median chunk; one slowed by stalls (memory not bound in time) has much.
    chunks = [{"touch": e.words[1]} | _pairs(e.words[3:], float)
              for e in run.events if e.words[:1] == ["chunks"]]
    pager = [_pairs(e.words[1:], int) for e in run.events if e.words[:1] == ["pager"]]
    return {
        "retouch_us_per_page": statistics.median(cold),
        "warm_us_per_page": statistics.median(warm),
        "retouch_ratio": statistics.median(c / w for c, w in zip(cold, warm, strict=True)),
        "host_faults_per_page": statistics.median(faults) if len(faults) == len(cold) else None,
        "pairs": [{"warm_us_per_page": w, "retouch_us_per_page": c, "host_faults_per_page": f}
                  for w, c, f in zip(warm, cold, faults, strict=False)],
        "chunks_2mib": chunks,
        "guest_pager_counters": pager,
        "cpu": cpu,
    }


def userland_figures(run: Run) -> dict[str, Any]:
    took = next(float(e.words[1]) for e in run.events if e.words[:1] == ["workload"])
    held = [r for _, r in run.samples]
    return {"workload_s": took, "mean_host_mib": statistics.mean(held) / MIB,
            "peak_host_mib": max(held) / MIB}


def _plot(runs: dict[str, Run], output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    colours = {"pager": "#2a9d8f", "balloon": "#e76f51", "none": "#6c757d",
               "pager_template": "#264653"}
    for manager, run in runs.items():
        t0 = run.samples[0][0] if run.samples else 0
        ax.plot([t - t0 for t, _ in run.samples], [r / MIB for _, r in run.samples],
                color=colours[manager], label=f"{manager}: host-resident")
        used = [(e.t - t0, _guest_used(e) / MIB) for e in run.events
                if e.words[:1] in (["idle"], ["allocated"], ["freed"])]
        ax.step([t for t, _ in used], [u for _, u in used], where="post", linestyle="--",
                color=colours[manager], alpha=0.6, label=f"{manager}: guest-used")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_title("Guest RAM the host holds vs what the guest uses (bursty trace)")
    ax.legend(fontsize=7, ncol=3)
    return save_figure(fig, output)


def _median_of(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [x[key] for x in rounds]
    return statistics.median(values) if values and None not in values else None


def _ms(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def goals(results: dict[str, dict[str, Any]]) -> list[tuple[str, bool]]:
    p, b, n = results["pager"], results["balloon"], results["none"]
    t = results["pager_template"]

    def ok(value: Any, test: Any) -> bool:
        return value is not None and bool(test(value))

    slack = TEMPLATE_SLACK
    return [
        (f"pager from a template (copy-on-write) no worse than cold, within {slack}x: "
         f"waste {t['waste_pct']:.2f} vs {p['waste_pct']:.2f} %, reclaim "
         f"{_ms(t['reclaim_ms'])} vs {_ms(p['reclaim_ms'])} ms, re-touch ratio "
         f"{t['retouch_ratio']:.2f} vs {p['retouch_ratio']:.2f}",
         ok(t["reclaim_ms"], lambda r: p["reclaim_ms"] is not None
            and r <= slack * p["reclaim_ms"])
         and t["waste_pct"] <= max(slack * p["waste_pct"], p["waste_pct"] + 0.5)
         and t["retouch_ratio"] <= slack * p["retouch_ratio"]),
        ("pager waste_pct <= 1.0 and <= balloon's / 5",
         ok(p["waste_pct"], lambda w: w <= 1.0 and w <= b["waste_pct"] / 5)),
        ("pager reclaim_ms <= 100", ok(p["reclaim_ms"], lambda r: r <= 100)),
        ("pager retouch <= 1.1 x warm (median of the pairs), host faults/page <= 0.1",
         ok(p["host_faults_per_page"], lambda f: f <= 0.1 and p["retouch_ratio"] <= 1.1)),
        ("pager workload_s <= 1.05 x none's",
         ok(p["workload_s"], lambda w: w <= 1.05 * n["workload_s"])),
    ]


def run(ctx: Context, quick: bool, output: str) -> str:
    import shutil
    import tempfile

    templates = Path(tempfile.mkdtemp(prefix="paracell-memory-templates-"))
    try:
        return _run(quick, output, templates)
    finally:
        shutil.rmtree(templates, ignore_errors=True)


def _run(quick: bool, output: str, templates: Path) -> str:
    rounds, bursts = (1, 4) if quick else (3, 8)
    rootfs = _rootfs()
    trace = _bundle("memory-trace", [PAGERLOAD, "trace", str(bursts), str(GAP_MS)], rootfs)
    retouch = _bundle("memory-retouch", [PAGERLOAD, "retouch", str(RETOUCH_MIB),
                                         str(RECLAIM_WAIT_MS), str(RETOUCH_PAIRS)], rootfs)
    agent = None
    if not quick:
        from paracell.bench import userland

        agent = _bundle("memory-userland", userland.command(USERLAND_ROUNDS, USERLAND_ITEMS),
                        userland.rootfs())
    # The three bundles' VMs have one shape, so one template serves them.
    common.run_checked([common.paracell_executable(), "--root", common.state_root(),
                        "--memory-manager", "pager", "template", "build", "--for", str(trace)],
                       env=_env(templates))
    traces: dict[str, list[dict[str, Any]]] = {m: [] for m in MANAGERS}
    touches: dict[str, list[dict[str, Any]]] = {m: [] for m in MANAGERS}
    agents: dict[str, list[dict[str, Any]]] = {m: [] for m in MANAGERS}
    first: dict[str, Run] = {}
    for r in range(rounds):
        # Rotate the order each round so no manager always runs on a cold or hot host.
        order = MANAGERS[r % len(MANAGERS):] + MANAGERS[:r % len(MANAGERS)]
        for manager in order:
            common.progress("memory", f"round {r + 1}/{rounds}: {manager}: the trace, the "
                            f"re-touch{', the agent script' if agent is not None else ''}")
            t = run_one(manager, trace, f"bench-mem-{manager}", templates)
            first.setdefault(manager, t)
            traces[manager].append(trace_figures(t))
            touches[manager].append(retouch_figures(run_one(manager, retouch,
                                                            f"bench-touch-{manager}", templates)))
            if agent is not None:
                agents[manager].append(userland_figures(run_one(manager, agent,
                                                                f"bench-agent-{manager}",
                                                                templates)))
    results: dict[str, dict[str, Any]] = {}
    for manager in MANAGERS:
        tr, to = traces[manager], touches[manager]
        reclaim = [x["reclaim_ms"] for x in tr]
        faults = [x["host_faults_per_page"] for x in to]
        results[manager] = {
            "waste_pct": statistics.median(x["waste_pct"] for x in tr),
            "reclaim_ms": statistics.median(reclaim) if None not in reclaim else None,
            "guest_free_ms": _median_of(tr, "guest_free_ms"),
            "reclaim_after_free_ms": _median_of(tr, "reclaim_after_free_ms"),
            "retouch_us_per_page": statistics.median(x["retouch_us_per_page"] for x in to),
            "warm_us_per_page": statistics.median(x["warm_us_per_page"] for x in to),
            # Each pair's ratio is of two touches seconds apart in one VM: the
            # median over every pair of every round resists the load's swings.
            "retouch_ratio": statistics.median(q["retouch_us_per_page"] / q["warm_us_per_page"]
                                               for x in to for q in x["pairs"]),
            "host_faults_per_page": statistics.median(faults) if None not in faults else None,
            # --quick has no real-userland workload: the bursty trace's run time stands in.
            "workload_s": statistics.median(x["workload_s"] for x in agents[manager])
            if agents[manager] else statistics.median(x["trace_s"] for x in tr),
            "userland_mean_host_mib": statistics.median(x["mean_host_mib"] for x in agents[manager])
            if agents[manager] else None,
            "userland": agents[manager],
            # Each VM's pairs, 2 MiB profiles, guest counters and CPU per page.
            "retouch": to,
            "peak_host_mib": max(x["peak_host_mib"] for x in tr),
            "rounds": tr,
        }
    out = Path(output)
    png = _plot(first, out.with_suffix(".png"))
    checked = goals(results)
    common.write_result(output, {
        "benchmark": "memory", "quick": quick, "guest_mib": GUEST_MIB, "rounds": rounds,
        "workload_s_from": "bursty trace" if quick else
        "Debian python3 agent script (paracell/bench/programs/agent_workload.py)",
        "guest_used": "guest RAM - MemFree: counts kernel image and struct pages, and also "
                      "reserved ranges never touched, so waste_pct reads slightly low",
        "results": results, "goals": {name: met for name, met in checked}, "plot": str(png),
    })
    lines = [f"{'':14} {'waste%':>7} {'reclaim ms':>10} {'retouch us':>10} {'warm us':>8} "
             f"{'ratio':>6} {'faults/pg':>9} {'work s':>7} {'peak MiB':>8} {'agent MiB':>9}"]
    def fmt(v: Any, spec: str) -> str:
        return format(v, spec) if v is not None else "never"

    for manager, x in results.items():
        lines.append(f"{manager:14} {x['waste_pct']:7.2f} {fmt(x['reclaim_ms'], '10.1f')} "
                     f"{x['retouch_us_per_page']:10.2f} {x['warm_us_per_page']:8.2f} "
                     f"{x['retouch_ratio']:6.2f} "
                     f"{fmt(x['host_faults_per_page'], '9.3f')} {x['workload_s']:7.2f} "
                     f"{x['peak_host_mib']:8.1f} {fmt(x['userland_mean_host_mib'], '9.1f')}")
    lines += [f"goal {'met' if met else 'NOT met'}: {name}" for name, met in checked]
    for manager, x in results.items():
        behind = (f"; the host was {fmt(x['reclaim_after_free_ms'], '.1f')} ms behind it"
                  if manager != "none" else " (nothing is reclaimed)")
        lines.append(f"{manager}: the guest's own free of 256 MiB took "
                     f"{fmt(x['guest_free_ms'], '.1f')} ms{behind}")
    lines.append(f"wrote {output} and {png}")
    return "\n".join(lines)
