"""The suite's outputs: suite.json (every sample), PNGs and report.md with the
paper-comparison table. Everything here works from the JSON alone, so a
report can be rebuilt from a saved run (`report.write(json.load(...), dir)`)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Hashable
from pathlib import Path
from typing import Any

MIB = 1 << 20
SERVER_METRICS: dict[str, list[tuple[str, str]]] = {
    "http": [("page.p50_ms", "page p50 ms"), ("page.p99_ms", "page p99 ms"),
             ("page.rps", "page req/s"), ("1mib.p50_ms", "1 MiB p50 ms"),
             ("1mib.p99_ms", "1 MiB p99 ms"), ("1mib.rps", "1 MiB req/s")],
    "redis": [("get_plain.p50_ms", "GET p50 ms"), ("get_plain.p99_ms", "GET p99 ms"),
              ("get_plain.rps", "GET ops/s"), ("set_plain.rps", "SET ops/s"),
              ("get_pipelined.rps", "GET -P16 ops/s"), ("set_pipelined.rps", "SET -P16 ops/s")],
    "memcached": [("get.p50_ms", "GET p50 ms"), ("get.p99_ms", "GET p99 ms"),
                  ("get.rps", "GET ops/s"), ("set.p50_ms", "SET p50 ms"),
                  ("set.rps", "SET ops/s")],
}
# The latency each workload is judged by: a server's p50 request, a batch's run time.
PRIMARY = {"http": "page.p50_ms", "redis": "get_plain.p50_ms", "memcached": "get.p50_ms"}
COLOURS = {"runc": "#6c757d", "none": "#adb5bd", "pager": "#2a9d8f", "balloon": "#e76f51",
           "xgates": "#264653", "pager_lazy": "#8ab17d",
           "pager_no_backoff": "#e9c46a", "pager_before": "#f4a261",
           "pager_backoff": "#6d597a", "pager_small_aged": "#b5838d",
           "pager_whole_binds": "#52796f"}


def flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def memory_figures(sample: dict[str, Any]) -> dict[str, float] | None:
    """Host-held guest RAM against guest-used over the workload's window:
    mean and peak of each, and the waste (host minus used, never below 0,
    averaged) as a percentage of the mean guest-used."""
    import numpy as np

    if not sample.get("host_ram") or not sample.get("guest_used") or not sample.get("window"):
        return None
    host = np.asarray(sample["host_ram"], dtype=float)
    used = np.asarray(sample["guest_used"], dtype=float)
    begin, end = sample["window"]
    inside = host[(host[:, 0] >= begin) & (host[:, 0] <= end)]
    at = np.searchsorted(used[:, 0], inside[:, 0], side="right") - 1
    keep = at >= 0
    if not keep.any():
        return None
    h, u = inside[keep, 1], used[at[keep], 1]
    gaps = np.diff(used[:, 0])
    return {"guest_interval_s": float(np.median(gaps)) if gaps.size else 0.0,
            "mean_host_mib": float(h.mean() / MIB), "peak_host_mib": float(h.max() / MIB),
            "mean_used_mib": float(u.mean() / MIB), "peak_used_mib": float(u.max() / MIB),
            "waste_pct": float(np.clip(h - u, 0, None).mean() / u.mean() * 100)}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def metric_medians(samples: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each client figure (flattened: `get.p50_ms`) -> its median over these samples."""
    flat = [flatten(s["metrics"]) for s in samples]
    keys = sorted({k for f in flat for k in f})
    return {k: _median([f[k] for f in flat if k in f]) for k in keys}


def summarize(result: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """workload -> runtime -> medians over the rounds (of runs without error)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for w in result["workloads"]:
        out[w] = {}
        for r in result["active"]:
            mine = [s for s in result["samples"] if s["workload"] == w and s["runtime"] == r]
            good = [s for s in mine if not s["error"]]
            entry: dict[str, Any] = metric_medians(good)
            for k in ("cold_start_s", "serving_s", "run_s"):
                entry[k] = _median([s[k] for s in good if s[k] is not None])
            mem = [m for m in (memory_figures(s) for s in good) if m]
            for k in ("mean_host_mib", "peak_host_mib", "mean_used_mib", "peak_used_mib",
                      "waste_pct", "guest_interval_s"):
                entry[k] = _median([m[k] for m in mem])
            entry["runs"] = len(good)
            entry["errors"] = [s["error"] for s in mine if s["error"]]
            out[w][r] = entry
    return out


# Issue 30: the Pager costs a server nothing measurable against no memory
# manager, over the rounds' medians. The figures each server is judged by.
SERVER_GOALS = {"http": ("page.p50_ms", "page.p99_ms"),
                "redis": ("get_plain.p50_ms", "get_plain.p99_ms"),
                "memcached": ("get.p50_ms", "get.p99_ms")}
GOAL_P50_RATIO, GOAL_P99_RATIO = 1.05, 1.10


def server_goals(summary: dict[str, dict[str, dict[str, Any]]],
                 samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per server workload run under both `pager` and `none`: whether the
    Pager's p50 and p99 are within the goal's margins of none's, as the
    issue measures it (the ratio of the medians over the rounds). Beside
    it, the median of each round's ratio to its own none: a round's runs
    are minutes apart at most, so a machine that slows for a while slows
    both, where the medians can each come from a different stretch."""
    out = []
    for w, (p50, p99) in SERVER_GOALS.items():
        per = summary.get(w, {})
        if "pager" not in per or "none" not in per:
            continue
        ratios = {k: _ratio(per["pager"].get(k), per["none"].get(k)) for k in (p50, p99)}
        met = all(r is not None for r in ratios.values()) and \
            ratios[p50] <= GOAL_P50_RATIO and ratios[p99] <= GOAL_P99_RATIO  # type: ignore[operator]
        rounds = _round_ratios(samples, w, (p50, p99))
        out.append({"goal": f"{w}: the Pager's p50 within {GOAL_P50_RATIO - 1:.0%} and p99 "
                            f"within {GOAL_P99_RATIO - 1:.0%} of none's",
                    "p50_ratio": ratios[p50], "p99_ratio": ratios[p99],
                    "p50_round_ratio": _median(rounds[p50]),
                    "p99_round_ratio": _median(rounds[p99]),
                    "p50_round_interval": median_interval(rounds[p50]),
                    "p99_round_interval": median_interval(rounds[p99]), "met": met})
    return out


def _round_ratios(samples: list[dict[str, Any]], workload: str,
                  keys: tuple[str, ...]) -> dict[str, list[float]]:
    """Per key, each round's ratio of pager's figure to none's, where both
    ran without error. A round loaded in turns (side by side) counts as the
    median of its turns' ratios, turn i of one against turn i of the other:
    seconds apart."""
    by_round: dict[Hashable, dict[str, dict[str, Any]]] = {}
    for s in samples:
        if s["workload"] == workload and s["runtime"] in ("pager", "none") and not s["error"]:
            by_round.setdefault(s["round"], {})[s["runtime"]] = s
    out: dict[str, list[float]] = {}
    for k in keys:
        each = [_paired_ratio(r["pager"], r["none"], k) for r in by_round.values()
                if len(r) == 2]
        out[k] = [x for x in each if x is not None]
    return out


# Resamples for the interval of a median over rounds; a fixed seed, so that
# the same suite.json always gives the same report.
INTERVAL_RESAMPLES = 4000


def median_interval(values: list[float]) -> list[float] | None:
    """A 95 % bootstrap interval of the median of these rounds' ratios:
    how far this run pins the Pager's cost down. Each turn of a load meets
    the shared host anew (docs/benchmarks.md, "Why 16 turns"), so a handful
    of rounds leaves it wide. None under 3 rounds."""
    if len(values) < 3:
        return None
    import numpy as np

    rng = np.random.default_rng(0)
    picks = rng.choice(np.asarray(values), size=(INTERVAL_RESAMPLES, len(values)))
    lo, hi = np.percentile(np.median(picks, axis=1), [2.5, 97.5])
    return [float(lo), float(hi)]


def _paired_ratio(ours: dict[str, Any], theirs: dict[str, Any], key: str) -> float | None:
    mine, yours = ours.get("turns") or [], theirs.get("turns") or []
    pairs = (list(zip(mine, yours, strict=True)) if mine and len(mine) == len(yours)
             else [(ours["metrics"], theirs["metrics"])])
    each = [_ratio(flatten(a).get(key), flatten(b).get(key)) for a, b in pairs]
    return _median([x for x in each if x is not None])


def goal_lines(goals: list[dict[str, Any]]) -> list[str]:
    return [f"goal {g['goal']}: p50 {_fmt(g['p50_ratio'])}x, p99 {_fmt(g['p99_ratio'])}x "
            f"(each round against its own none, median: {_fmt(g.get('p50_round_ratio'))}x"
            f"{_interval(g.get('p50_round_interval'))}, {_fmt(g.get('p99_round_ratio'))}x"
            f"{_interval(g.get('p99_round_interval'))}): {'met' if g['met'] else 'not met'}"
            for g in goals]


def _interval(bounds: list[float] | None) -> str:
    return f" [95 %: {_fmt(bounds[0])}-{_fmt(bounds[1])}]" if bounds else ""


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"


def primary(workload: str, entry: dict[str, Any]) -> float | None:
    return entry.get(PRIMARY.get(workload, "run_s"))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def _reductions(summary: dict[str, Any], ours: str, theirs: str,
                pick: Any) -> list[tuple[str, float]]:
    """Per workload, how much lower `ours` is than `theirs` (percent; negative: higher)."""
    out = []
    for w, per in summary.items():
        if ours in per and theirs in per:
            ratio = _ratio(pick(w, per[ours]), pick(w, per[theirs]))
            if ratio is not None:
                out.append((w, (1 - ratio) * 100))
    return out


def _span(values: list[tuple[str, float]]) -> str:
    if not values:
        return "not measured (a runtime or workload was left out or failed)"
    best = max(values, key=lambda x: x[1])
    return (f"best {best[1]:+.1f}% ({best[0]}); all: "
            + ", ".join(f"{w} {v:+.1f}%" for w, v in values))


def noise_note(result: dict[str, Any]) -> str:
    """How far one runtime's own primary figure moves between rounds: the
    yardstick a latency ratio has to clear on this machine."""
    if result["rounds"] < 2:
        return (" One round: a single sample per runtime and workload, which on this "
                "noisy machine cannot tell a ratio from noise; more rounds narrow it.")
    spreads = []
    for w in result["workloads"]:
        for r in result["active"]:
            if r == "runc":
                continue
            vals = [v for v in (primary(w, {**flatten(s["metrics"]), "run_s": s["run_s"]})
                                for s in result["samples"] if s["workload"] == w
                                and s["runtime"] == r and not s["error"]) if v]
            if len(vals) >= 2:
                spreads.append(((max(vals) - min(vals)) / statistics.median(vals) * 100, w, r))
    if not spreads:
        return ""
    worst = max(spreads)
    return (f" Between rounds, one runtime's own figure moved by up to {worst[0]:.0f}% "
            f"({worst[1]} under {worst[2]}; median spread "
            f"{statistics.median(x[0] for x in spreads):.0f}%).")


def paper_table(result: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    lat = _reductions(summary, "pager", "none", primary)
    lat_x = _reductions(summary, "xgates", "none", primary)
    vm_cost = [(w, 1 - v / 100) for w, v in _reductions(summary, "pager", "runc", primary)]
    agents = [w for w in summary if w in ("swe", "skills")]
    mem = _reductions({w: summary[w] for w in agents}, "pager", "balloon",
                      lambda w, e: e.get("mean_host_mib"))
    peak = _reductions({w: summary[w] for w in agents}, "pager", "balloon",
                       lambda w, e: e.get("peak_host_mib"))
    waste = [(w, summary[w]["pager"]["waste_pct"]) for w in agents
             if "pager" in summary[w] and summary[w]["pager"].get("waste_pct") is not None]
    bwaste = [(w, summary[w]["balloon"]["waste_pct"]) for w in agents
              if "balloon" in summary[w] and summary[w]["balloon"].get("waste_pct") is not None]
    xg = result["skipped"].get("xgates")
    rows = [
        "| Paper's headline | Paper | Measured here (same run) | What carries over to this "
        "platform, and why |",
        "|---|---|---|---|",
        "| Latency vs RunV, bare metal | up to 33% lower | Pager vs no memory manager, p50 "
        f"latency or run time, lower by: {_span(lat)}.{noise_note(result)} | Partly. RunV's "
        "model is run here as the "
        "same QEMU VM with no memory manager, so this ratio isolates what ParaCell adds on top "
        "of a VM per container. The paper's latency gains come from PVM (guest page-table "
        "updates without exits) and XGates (no world switch per user/kernel transition). Under "
        "TCG no instruction causes a hardware VM exit, so neither has a cost to remove: ratios "
        "near 1.0 are the expected result, and any memory-manager overhead shows directly. |",
        "| Latency vs RunV, nested | up to 88% lower | the same figures: this machine is itself "
        "a guest of a PVM-capable host | Not reproducible here: the nested gain is L0 exits "
        "avoided per L2 exit, and this host gives its guests no VMX, so both run under TCG, "
        "whose cost per guest instruction is the same with or without a nested hypervisor. |",
        "| Latency vs RunV with XGates | (part of the above) | "
        + (f"skipped: {xg}" if xg else f"Pager + XGates vs no memory manager: {_span(lat_x)}")
        + " | XGates replace syscall-path world switches, which exist only under PVM; under TCG "
        "a WRPKRU is one more emulated instruction. |",
        "| Latency vs PVM | up to 57% / 79% lower | not measured: no PVM host kernel and no PVM "
        "guest kernel here. For scale, a VM's latency or run time over runc's (Pager vs runc): "
        + (", ".join(f"{w} {x:.0f}x" for w, x in vm_cost) if vm_cost else "not measured")
        + " | No. `kvm_pvm` is loaded but "
        "needs a PVM-enabled guest kernel; without it no PVM guest runs, so a PVM baseline "
        "cannot be measured. The VM-over-runc figure bounds what any VM runtime costs here. |",
        "| Memory vs HyperAlloc, agent workloads | up to 35.6% less | Pager vs balloon with "
        f"free page reporting, mean host-held guest RAM lower by: {_span(mem)}; peak: "
        f"{_span(peak)} | Partly. HyperAlloc is not available here; balloon with free page "
        "reporting is the mainstream baseline HyperAlloc itself improves on, so a gap against "
        "it overstates the gap against HyperAlloc. Host memory is the guest-RAM file's "
        "allocated blocks, which does not depend on the CPU engine, so the memory side carries "
        "over from TCG better than latency does (TCG only makes the workload slower, which "
        "gives the balloon's 2 s reporting delay less weight). |",
        "| Average waste (host-held minus guest-used) | under 0.4% | Pager: "
        + (", ".join(f"{w} {v:.2f}%" for w, v in waste) or "not measured")
        + "; balloon: " + (", ".join(f"{w} {v:.2f}%" for w, v in bwaste) or "not measured")
        + " | Yes, as a measure: host blocks against the guest's MemFree. Guest-used counts the "
        "kernel, page tables and page cache, as the host must back them. The guest side is "
        "sampled far more coarsely than the host side under TCG (below), which inflates "
        "waste while use grows. |",
    ]
    return rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def markdown(result: dict[str, Any], summary: dict[str, Any]) -> str:
    active = result["active"]
    lines = [
        "# ParaCell bench suite", "",
        f"Run {result['started']}, engine `{result['engine']}`, "
        f"{'--quick' if result['quick'] else 'full'}, {result['rounds']} round(s), "
        f"{result['took_s'] / 60:.1f} min, guest RAM {result['guest_mib']} MiB. Every "
        "workload ran once per round under every runtime, in an order rotated by round and by "
        "workload; each figure is the median over the rounds. Every sample is in "
        "`suite.json`.", "",
        "Runtimes: " + "; ".join(f"`{r}` = {label}" for r, label in result["runtimes"].items())
        + ".", "",
    ]
    goals = goal_lines(server_goals(summary, result["samples"]))
    if goals:
        lines += ["## Goals", "", *(f"- {g}" for g in goals), ""]
    for name, why in result["skipped"].items():
        lines += [f"**Skipped: `{name}`.** {why}", ""]
    lines += ["## What the paper claims and what this run measured", "",
              *paper_table(result, summary), ""]
    lines += ["## Application latency and throughput", ""]
    for w, metrics in SERVER_METRICS.items():
        if w not in summary:
            continue
        lines += [f"### {result['workloads'][w]}", ""]
        header = ["runtime", *(label for _, label in metrics), "cold start s", "serving s"]
        rows = [[r, *(_fmt(summary[w][r].get(k)) for k, _ in metrics),
                 _fmt(summary[w][r]["cold_start_s"]), _fmt(summary[w][r]["serving_s"])]
                for r in active]
        lines += [*_table(header, rows), ""]
    batch = [w for w in summary if w not in SERVER_METRICS]
    if batch:
        lines += ["## Batch and agent workloads: run time", "",
                  "Run time is from the workload's `begin` to its `end` line, timed on the "
                  "host; cold start is from `run` to the container's first line.", ""]
        header = ["workload", *(f"{r} run s" for r in active), *(f"{r} start s" for r in active)]
        rows = [[w, *(_fmt(summary[w][r]["run_s"]) for r in active),
                 *(_fmt(summary[w][r]["cold_start_s"]) for r in active)] for w in batch]
        lines += [*_table(header, rows), ""]
    agents = [w for w in summary if w in ("swe", "skills")]
    if agents:
        gaps = [e["guest_interval_s"] for w in agents for e in summary[w].values()
                if e.get("guest_interval_s")]
        gap = f"{statistics.median(gaps):.2f} s" if gaps else "–"
        lines += ["## Agent workloads: host memory over time", "",
                  "Host-held = the guest-RAM file's allocated blocks (sampled every 50 ms); "
                  "guest-used = guest RAM minus the guest's MemFree (asked every 250 ms; under "
                  f"TCG the guest's sampler got to it every {gap}, median); waste = mean of "
                  "max(0, host-held - guest-used) over mean guest-used, each host sample set "
                  "against the latest guest sample before it, so the guest's lag while its use "
                  "grows counts as waste. runc has no guest RAM file, so no figure.", ""]
        header = ["workload", "runtime", "run s", "mean host MiB", "peak host MiB",
                  "mean used MiB", "peak used MiB", "waste %"]
        rows = [[w, r, *(_fmt(summary[w][r].get(k)) for k in (
            "run_s", "mean_host_mib", "peak_host_mib", "mean_used_mib", "peak_used_mib",
            "waste_pct"))] for w in agents for r in active]
        lines += [*_table(header, rows), ""]
    lines += ["## Start-up", "",
              "Cold start of each workload's container: `run` to its first line of output "
              "(`serving s` above: to the first TCP connection the server accepts). Every VM "
              "here boots cold (`--no-template`); template and pool starts are "
              "`paracell bench start`'s.", ""]
    header = ["workload", *active]
    rows = [[w, *(_fmt(summary[w][r]["cold_start_s"]) for r in active)] for w in summary]
    lines += [*_table(header, rows), ""]
    errors = [(w, r, e) for w in summary for r in active for e in summary[w][r]["errors"]]
    if errors:
        lines += ["## Failed runs", "", *(f"- {w} on {r}: {e}" for w, r, e in errors), ""]
    lines += ["## Plots", "", "- `latency.png`: p50 (bar) and p99 (tick) per workload and "
              "runtime, run time for batch workloads", "- `coldstart.png`: cold start",
              *(f"- `memory-{w}.png`: host-held and guest-used over time, per runtime"
                for w in agents), ""]
    return "\n".join(lines)


def _plots(result: dict[str, Any], summary: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from paracell.bench.plot import save_figure

    active = result["active"]
    made = []
    ws = list(summary)
    if ws and active:
        cols = min(4, len(ws))
        rows = (len(ws) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
        for ax, w in zip(axes.flat, ws, strict=False):
            key = PRIMARY.get(w, "run_s")
            vals = [primary(w, summary[w][r]) or 0 for r in active]
            ax.bar(active, vals, color=[COLOURS.get(r, "#4c72b0") for r in active])
            if w in PRIMARY:
                p99 = [summary[w][r].get(key.replace("p50", "p99")) or 0 for r in active]
                ax.scatter(active, p99, marker="_", s=200, color="black", label="p99")
            ax.set_title(w, fontsize=9)
            ax.set_ylabel("ms (p50)" if w in PRIMARY else "run s", fontsize=8)
            ax.tick_params(axis="x", labelsize=7, rotation=30)
        for ax in list(axes.flat)[len(ws):]:
            ax.axis("off")
        fig.suptitle(f"Latency per workload and runtime ({result['engine']})")
        made.append(save_figure(fig, out / "latency.png"))
        fig, ax = plt.subplots(figsize=(8, 3.5))
        width = 0.8 / len(active)
        for i, r in enumerate(active):
            ax.bar([j + i * width for j in range(len(ws))],
                   [summary[w][r]["cold_start_s"] or 0 for w in ws], width,
                   color=COLOURS.get(r, "#4c72b0"), label=r)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ws))], ws)
        ax.set_ylabel("cold start, s")
        ax.legend(fontsize=7)
        made.append(save_figure(fig, out / "coldstart.png"))
    for w in (w for w in ws if w in ("swe", "skills")):
        fig, ax = plt.subplots(figsize=(8, 4))
        for r in active:
            first = next((s for s in result["samples"] if s["workload"] == w
                          and s["runtime"] == r and not s["error"] and s["host_ram"]), None)
            if first is None:
                continue
            c = COLOURS.get(r, "#4c72b0")
            ax.plot([t for t, _ in first["host_ram"]], [b / MIB for _, b in first["host_ram"]],
                    color=c, label=f"{r}: host-held")
            ax.plot([t for t, _ in first["guest_used"]],
                    [b / MIB for _, b in first["guest_used"]], color=c, linestyle="--",
                    alpha=0.6, label=f"{r}: guest-used")
        ax.set_xlabel("seconds since `run`")
        ax.set_ylabel("MiB")
        ax.set_title(f"{w}: guest RAM the host holds vs what the guest uses")
        ax.legend(fontsize=7, ncol=2)
        made.append(save_figure(fig, out / f"memory-{w}.png"))
    return made


# A saved suite.json is read whole: bounded, as any file handed to the CLI.
MAX_RESULT_BYTES = 64 << 20


def load_result(path: Path) -> dict[str, Any]:
    """A saved run's suite.json, checked for what pooling reads."""
    from paracell.errors import ParacellError

    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_RESULT_BYTES + 1)
        if len(raw) > MAX_RESULT_BYTES:
            raise ValueError("too large")
        result = json.loads(raw)
        if result.get("benchmark") != "paracell bench suite":
            raise ValueError("not a suite result")
        for s in result["samples"]:
            for key, kind in (("workload", str), ("runtime", str), ("round", int),
                              ("metrics", dict), ("error", (str, type(None)))):
                if not isinstance(s[key], kind):
                    raise ValueError(f"a sample's {key}")
            if not isinstance(s.get("turns", []), list) or \
                    not all(isinstance(t, dict) for t in s.get("turns", [])):
                raise ValueError("a sample's turns")
    except OSError as e:
        raise ParacellError(f"{path}: {e.strerror or e}") from e
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ParacellError(f"{path}: not a `paracell bench suite` result ({e})") from e
    return result


def pooled_goals(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The server goals over the rounds of several runs at once: a round
    stays paired with its own none, and the interval narrows with the
    rounds that a single run (at most 20) cannot afford. It reads only what
    load_result checked: the samples' names, rounds, errors and metrics."""
    samples = [{**s, "round": (i, s["round"])}
               for i, r in enumerate(results) for s in r["samples"]]
    summary = {w: {r: metric_medians([s for s in samples if s["workload"] == w
                                      and s["runtime"] == r and not s["error"]])
                   for r in ("pager", "none")}
               for w in SERVER_GOALS if any(s["workload"] == w for s in samples)}
    goals = server_goals(summary, samples)
    rounds = {w: len({s["round"] for s in samples if s["workload"] == w}) for w in SERVER_GOALS}
    return {"benchmark": "paracell bench suite-pool", "runs": len(results),
            "started": [r.get("started") for r in results], "rounds": rounds, "goals": goals}


def write(result: dict[str, Any], out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(result)
    goals = server_goals(summary, result["samples"])
    result = {**result, "summary": summary, "goals": goals}
    (out / "suite.json").write_text(json.dumps(result, indent=1) + "\n")
    pngs = _plots(result, summary, out)
    (out / "report.md").write_text(markdown(result, summary))
    lines = []
    for w, per in summary.items():
        parts = [f"{r} {_fmt(primary(w, e))}" for r, e in per.items()]
        unit = "ms p50" if w in PRIMARY else "s"
        lines.append(f"{w} ({unit}): " + ", ".join(parts))
    lines += goal_lines(goals)
    for name, why in result["skipped"].items():
        lines.append(f"skipped {name}: {why}")
    failed = sum(1 for s in result["samples"] if s["error"])
    if failed:
        lines.append(f"{failed} run(s) failed: see report.md")
    lines.append(f"-> {out / 'report.md'}, {out / 'suite.json'}, "
                 + ", ".join(p.name for p in pngs))
    return "\n".join(lines)
