"""`paracell bench density`: N idle sandboxes (`sleep`) at once, and what
each costs the host while it idles, against the same N under runc.

ParaCell runs three ways: cold, from the shape's template with RAM mapped
copy-on-write (the default), and from it with RAM copied (as before). The
copy-on-write round also has each sandbox write 32 MiB of its own, and
measures what that adds; `--curve N` starts up to N copy-on-write sandboxes
and records host memory against the count.

Per sandbox: host CPU over a fixed window once all N are up (utime + stime
from /proc/PID/stat of every process the sandbox holds: the shim and QEMU
for ParaCell, the container's process for runc), host memory as PSS (so
that shared pages count once), the host wakeups (context switches) that
CPU comes from, and how long each start took with the ones before it
running. runc has no VM and no shim: its figures are the floor. The two
runtimes take turns, one round each, and which goes first alternates.

Everything a round starts is deleted when the round ends, also after
Ctrl-C or SIGTERM, and the state roots are removed only once they are empty.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paracell import procfs
from paracell.bench import common
from paracell.bench.plot import save_figure
from paracell.runtime.context import Context
from paracell.vmm import probe

# ParaCell runs three ways: cold, and from the shape's template with its RAM
# shared copy-on-write or copied (docs/templates.md).
TEMPLATED = "paracell_template"
COPIED = "paracell_template_copied"
GOAL_CPU_PCT = 0.5  # of one core, per idle sandbox
GOAL_SHARED_MIB = 40.0  # per idle sandbox from a template, copy-on-write
WRITE_MIB = 32  # what each copy-on-write sandbox writes of its own
# Its growth may differ from what it wrote by this much: the guest's own
# page cache and allocator move a little either way.
WRITE_TOLERANCE = 0.10
WRITE_ARGS = ["dd", "if=/dev/zero", "of=/dev/shm/own", "bs=1M", f"count={WRITE_MIB}"]
# Run before the write, which is then measured alone: a restored VM's first
# command pays once for TCG translating the exec path (reported apart).
FIRST_ARGS = ["true"]
CURVE_POINTS = (1, 5, 10, 20, 30, 40, 50, 75, 100, 150, 200)
# After the last start, before the window: the last guest's boot-time work
# (its first page-reporting passes, the agent's start) is not idling yet.
SETTLE_S = 5.0
DEFAULT_COUNT = 20
DEFAULT_WINDOW_S = 30.0
DEFAULT_ROUNDS = 2
QUICK_COUNT = 5
QUICK_WINDOW_S = 10.0
SLEEP_ARGS = ["sleep", "1000000"]


@dataclass
class Sandbox:
    cid: str
    start_s: float
    pids: list[int] = field(default_factory=list)


def _breakdown(pids: list[int]) -> dict[str, float]:
    """Where one ParaCell sandbox's PSS goes, MiB: the shim (Python), and in
    QEMU its TCG translation buffer (its anonymous executable mapping), its
    malloc heap and other anonymous memory, the binary and
    libraries, and guest RAM: its own pages (a RAM file of its own, which the
    shim's Pager maps too, or its private copies), and its share of the
    template's pages it maps copy-on-write."""
    import psutil

    from paracell import settings

    guest = settings.guest_memory_mib() << 20
    parts: dict[str, float] = {}

    def add(key: str, size: int) -> None:
        parts[key] = parts.get(key, 0.0) + size / (1 << 20)

    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            qemu = "qemu-system" in " ".join(proc.cmdline())
            for m in proc.memory_maps(grouped=False):
                lo, hi = (int(x, 16) for x in m.addr.split("-"))
                ram = hi - lo == guest and m.path.startswith("/")
                anonymous = m.path in ("", "[anon]")
                if ram and m.perms.endswith("s"):  # a RAM file of its own (QEMU's, the Pager's)
                    add("guest_ram_own", m.pss)
                elif ram:  # the template's file, copy-on-write
                    add("guest_ram_own", m.anonymous)
                    add("guest_ram_template_share", m.pss - m.anonymous)
                elif not qemu:
                    add("shim", m.pss)
                elif anonymous and "x" in m.perms:  # TCG's generated code
                    add("qemu_tcg_buffer", m.pss)
                elif m.path == "[heap]":
                    add("qemu_heap", m.pss)
                elif m.path.startswith("/"):
                    add("qemu_binary_and_libraries", m.pss)
                else:
                    add("qemu_other_anonymous", m.pss)
    return parts


def _own_ram_mib(pids: list[int]) -> float:
    """The guest-RAM pages a copy-on-write sandbox's QEMU holds of its own."""
    import psutil

    from paracell import settings
    from paracell.vmm import ramview

    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if "qemu-system" in " ".join(psutil.Process(pid).cmdline()):
                ram = ramview.copy_on_write_view(pid, settings.guest_memory_mib() << 20)
                return ram.resident / (1 << 20) if ram else 0.0
    return 0.0


@dataclass
class Round:
    runtime: str
    sandboxes: list[Sandbox]
    cpu_pct: list[float]
    pss_mib: list[float]
    wakeups_per_s: list[float]
    memory_manager: str  # ParaCell's, as its VMs ran; "unknown" for runc
    # Copy-on-write only: each sandbox's PSS after its first command and
    # after it wrote WRITE_MIB of its own, and its own guest-RAM pages idle,
    # before the write and after.
    first_pss_mib: list[float] = field(default_factory=list)
    idle_own_ram_mib: list[float] = field(default_factory=list)
    written_pss_mib: list[float] = field(default_factory=list)
    own_ram_mib: list[float] = field(default_factory=list)
    written_own_ram_mib: list[float] = field(default_factory=list)
    # ParaCell only: each sandbox's PSS by part (_breakdown), while idle.
    breakdown: list[dict[str, float]] = field(default_factory=list)


def plan(quick: bool, count: int | None, window_s: float | None,
         rounds: int | None) -> tuple[int, float, int]:
    """The options a run takes: what was given, else --quick's or the defaults."""
    return (count if count is not None else QUICK_COUNT if quick else DEFAULT_COUNT,
            window_s if window_s is not None else QUICK_WINDOW_S if quick else DEFAULT_WINDOW_S,
            rounds if rounds is not None else 1 if quick else DEFAULT_ROUNDS)


def _say(message: str) -> None:
    common.progress("density", message)


def _context_switches(pids: list[int]) -> dict[tuple[int, int], int]:
    """Each thread's voluntary plus involuntary switches: how often the
    processes woke up (/proc/PID/status counts only the main thread)."""
    counts = {}
    for pid in pids:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/status") as f:
                counts[(pid, int(task))] = sum(
                    int(line.split()[1]) for line in f
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))
    return counts


def _switches_between(before: dict[tuple[int, int], int],
                      after: dict[tuple[int, int], int]) -> int:
    """Per thread, so that one that exits in between (QEMU's worker threads
    come and go) takes nothing off: a thread born in between counts whole."""
    return sum(count - before.get(thread, 0) for thread, count in after.items())


def _ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        ticks = procfs.cpu_ticks(pid)
        if ticks is None:
            raise RuntimeError(f"process {pid} of an idle sandbox exited during the window")
        total += ticks
    return total


def _memory_manager(pids: list[int]) -> str:
    """What a ParaCell sandbox's VM got, read off QEMU's argv: the Pager's
    ivshmem device, the balloon, or neither."""
    import psutil

    for pid in pids:
        with contextlib.suppress(psutil.Error):
            argv = " ".join(psutil.Process(pid).cmdline())
            if "qemu-system" in argv:
                return ("pager" if "ivshmem" in argv else
                        "balloon" if "virtio-balloon" in argv else "none")
    return "unknown"


class Runner:
    """Starts, finds and deletes one runtime's sandboxes."""

    def __init__(self, runtime: str, cmd: list[str], bundle: Path,
                 env: dict[str, str] | None = None, writes: bool = False):
        self.runtime = runtime
        self.cmd = cmd  # the runtime's argv up to the verb, with its --root
        self.bundle = bundle
        self.env = env
        self.writes = writes  # the round ends with each sandbox writing WRITE_MIB

    def exec(self, cid: str, args: list[str]) -> None:
        common.run_checked([*self.cmd, "exec", cid, *args], env=self.env,
                           stdin=subprocess.DEVNULL)

    def start(self, cid: str) -> float:
        return common.time_call(lambda: common.run_detached(
            [*self.cmd, "run", "--detach", "--bundle", str(self.bundle), cid], env=self.env))

    def pid(self, cid: str) -> int:
        """For ParaCell the shim, which QEMU is a child of; for runc the
        container's process."""
        return int(json.loads(common.run_checked([*self.cmd, "state", cid]).stdout)["pid"])

    def delete(self, cid: str) -> None:
        subprocess.run([*self.cmd, "delete", "--force", cid], stdin=subprocess.DEVNULL,
                       capture_output=True)

    def leftovers(self) -> list[str]:
        listed = subprocess.run([*self.cmd, "list", "--quiet"], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True)
        return listed.stdout.split()


def _after_each(runner: Runner, sandboxes: list[Sandbox], args: list[str]
                ) -> tuple[list[float], list[float]]:
    """Each sandbox's PSS and own guest RAM (MiB), once each ran args and
    the guests settled."""
    for s in sandboxes:
        runner.exec(s.cid, args)
    time.sleep(SETTLE_S)
    return ([common.pss_of_tree([s.pids[0]]) / (1 << 20) for s in sandboxes],
            [_own_ram_mib(s.pids) for s in sandboxes])


def _one_round(runner: Runner, count: int, window_s: float, tag: str) -> Round:
    sandboxes: list[Sandbox] = []
    attempted: list[str] = []
    try:
        for i in range(count):
            cid = f"{tag}-{i}"
            attempted.append(cid)
            took = runner.start(cid)
            pids = common.process_tree(runner.pid(cid))
            if not pids:
                raise RuntimeError(f"{runner.runtime} sandbox {cid} exited right after its start")
            sandboxes.append(Sandbox(cid, took, pids))
            _say(f"{runner.runtime}: {i + 1}/{count} up, that start took {took:.2f} s")
        _say(f"{runner.runtime}: all {count} up; settling {SETTLE_S:.0f} s, "
             f"then measuring {window_s:.0f} s of idle")
        time.sleep(SETTLE_S)
        before = [(_ticks(s.pids), _context_switches(s.pids)) for s in sandboxes]
        began = time.monotonic()
        time.sleep(window_s)
        after = [(_ticks(s.pids), _context_switches(s.pids)) for s in sandboxes]
        elapsed = time.monotonic() - began
        hz = os.sysconf("SC_CLK_TCK")
        cpu = [(a[0] - b[0]) / hz / elapsed * 100 for a, b in zip(after, before, strict=True)]
        wakeups = [_switches_between(b[1], a[1]) / elapsed
                   for a, b in zip(after, before, strict=True)]
        pss = [common.pss_of_tree([s.pids[0]]) / (1 << 20) for s in sandboxes]
        done = Round(runner.runtime, sandboxes, cpu, pss, wakeups,
                     _memory_manager(sandboxes[0].pids))
        if runner.runtime != "runc":
            done.breakdown = [_breakdown(s.pids) for s in sandboxes]
        if runner.writes:
            # The write is measured alone: a restored VM's first command pays
            # once for TCG translating the exec path, whatever it does.
            _say(f"{runner.runtime}: each sandbox runs its first command ({FIRST_ARGS[0]}), "
                 f"then writes {WRITE_MIB} MiB of its own")
            done.idle_own_ram_mib = [_own_ram_mib(s.pids) for s in sandboxes]
            done.first_pss_mib, done.own_ram_mib = _after_each(runner, sandboxes, FIRST_ARGS)
            done.written_pss_mib, done.written_own_ram_mib = _after_each(runner, sandboxes,
                                                                         WRITE_ARGS)
        return done
    finally:
        _say(f"{runner.runtime}: deleting {len(attempted)} sandbox(es)")
        for cid in attempted:
            runner.delete(cid)


def _figures(rounds: list[Round]) -> dict[str, Any]:
    """Per-sandbox figures: the mean over a round's sandboxes (what N of
    them cost together, divided by N), summarized over the rounds."""
    return {
        "cpu_pct_per_sandbox": common.summarize(
            [statistics.mean(r.cpu_pct) for r in rounds], "pct"),
        "pss_mib_per_sandbox": common.summarize(
            [statistics.mean(r.pss_mib) for r in rounds], "mib"),
        "wakeups_per_s_per_sandbox": common.summarize(
            [statistics.mean(r.wakeups_per_s) for r in rounds], "per_s"),
        "nth_start_s": common.summarize([r.sandboxes[-1].start_s for r in rounds]),
        "first_start_s": common.summarize([r.sandboxes[0].start_s for r in rounds]),
        "rounds": [{
            "start_s": [s.start_s for s in r.sandboxes],
            "cpu_pct": r.cpu_pct,
            "pss_mib": r.pss_mib,
            "wakeups_per_s": r.wakeups_per_s,
            "pids": [s.pids for s in r.sandboxes],
            **({"first_pss_mib": r.first_pss_mib, "written_pss_mib": r.written_pss_mib,
                "idle_own_ram_mib": r.idle_own_ram_mib, "own_ram_mib": r.own_ram_mib,
                "written_own_ram_mib": r.written_own_ram_mib} if r.written_pss_mib else {}),
        } for r in rounds],
        "pss_breakdown_mib": {part: statistics.median(
            statistics.mean(b.get(part, 0.0) for b in r.breakdown) for r in rounds)
            for part in sorted({k for r in rounds for b in r.breakdown for k in b})},
        **({"growth_mib_per_writer": _growth(rounds, "first_pss_mib", "written_pss_mib"),
            "own_ram_growth_mib_per_writer": _growth(rounds, "own_ram_mib",
                                                     "written_own_ram_mib"),
            "first_command_growth_mib": _growth(rounds, "pss_mib", "first_pss_mib"),
            "first_command_own_ram_growth_mib": _growth(rounds, "idle_own_ram_mib",
                                                        "own_ram_mib")}
           if rounds[0].written_pss_mib else {}),
    }


def _growth(rounds: list[Round], before: str, after: str) -> dict[str, float]:
    """The median sandbox's growth per round, summarized over the rounds."""
    return common.summarize([statistics.median(
        a - b for a, b in zip(getattr(r, after), getattr(r, before), strict=True))
        for r in rounds], "mib")


def goals(results: dict[str, Any], template_mib: float, count: int) -> list[tuple[str, bool]]:
    cpu = results["paracell"]["cpu_pct_per_sandbox"]["median_pct"]
    met = [(f"host CPU per idle sandbox {cpu:.3f}% of a core (goal <= {GOAL_CPU_PCT}%)",
            cpu <= GOAL_CPU_PCT)]
    cold = results["paracell"]["pss_mib_per_sandbox"]["median_mib"]
    copied = results[COPIED]["pss_mib_per_sandbox"]["median_mib"]
    shared = results[TEMPLATED]["pss_mib_per_sandbox"]["median_mib"]
    # The template's RAM file is paid once, whoever maps it, so each sandbox
    # carries 1/count of it. Its PSS already holds its share of the template's
    # pages it maps (_breakdown): that share comes out, or those pages would
    # count twice.
    mapped = results[TEMPLATED]["pss_breakdown_mib"].get("guest_ram_template_share", 0.0)
    with_template = shared - mapped + template_mib / count
    met.append((f"host memory per idle sandbox from a template, copy-on-write: "
                f"{with_template:.1f} MiB ({shared:.1f} PSS - {mapped:.1f} of it the template's "
                f"pages it maps + {template_mib:.1f} MiB template / {count}) (goal <= "
                f"{GOAL_SHARED_MIB:.0f} MiB); copied {copied:.1f}, cold {cold:.1f}",
                with_template <= GOAL_SHARED_MIB))
    templated = results[TEMPLATED]
    growth = templated["growth_mib_per_writer"]["median_mib"]
    own = templated["own_ram_growth_mib_per_writer"]["median_mib"]
    first = templated["first_command_growth_mib"]["median_mib"]
    first_own = templated["first_command_own_ram_growth_mib"]["median_mib"]
    met.append((f"a copy-on-write sandbox that writes {WRITE_MIB} MiB grows by {growth:.1f} MiB "
                f"PSS, of which its own guest RAM {own:.1f} MiB (goal: {WRITE_MIB} MiB and no "
                f"more, within {WRITE_TOLERANCE:.0%}); not counted, its first command "
                f"({FIRST_ARGS[0]}) before it: {first:.1f} MiB PSS, {first_own:.1f} of it guest "
                "RAM", abs(growth - WRITE_MIB) <= WRITE_MIB * WRITE_TOLERANCE))
    return met


def _template_mib(store: Path) -> float:
    """The RAM files of the run's template store: what the templates hold on the host."""
    return sum(p.stat().st_blocks * 512 for p in store.glob("*/ram")) / (1 << 20)


def _curve(runner: Runner, top: int, tag: str) -> list[dict[str, float]]:
    """Starts copy-on-write sandboxes one by one up to `top`, and at each
    point of CURVE_POINTS (and at top) the host memory of all of them."""
    points, attempted = [], []
    marks = {n for n in CURVE_POINTS if n <= top} | {top}
    try:
        for i in range(top):
            cid = f"{tag}-{i}"
            attempted.append(cid)
            runner.start(cid)
            if i + 1 in marks:
                time.sleep(SETTLE_S)
                pss = common.pss_of_tree([runner.pid(c) for c in attempted]) / (1 << 20)
                points.append({"count": i + 1, "pss_mib": pss, "per_sandbox_mib": pss / (i + 1)})
                _say(f"curve: {i + 1} up, {pss:.0f} MiB PSS in all, "
                     f"{pss / (i + 1):.1f} MiB each")
    finally:
        _say(f"curve: deleting {len(attempted)} sandbox(es)")
        for cid in attempted:
            runner.delete(cid)
    return points


def run(ctx: Context, count: int, window_s: float, rounds: int, output: str,
        curve: int = 0) -> str:
    runc = common.oci_runtime("runc")
    if runc is None:
        raise RuntimeError("bench density needs runc (Debian's `runc`) for its floor")
    bundle = common.example_bundle("density", SLEEP_ARGS)
    base = Path(tempfile.mkdtemp(prefix="paracell-density-"))
    engine = probe.choose_engine(ctx.engine, probe.probe_host()).engine
    paracell = [common.paracell_executable(), "--root", str(base / "paracell"),
                "--engine", engine]
    if ctx.memory_manager:
        paracell += ["--memory-manager", ctx.memory_manager]
    runners = {"paracell": Runner("paracell", [*paracell, "--no-template"], bundle),
               "runc": Runner("runc", [runc, "--root", str(base / "runc")], bundle)}
    # A template store of the run's own, built before the first round.
    env = dict(os.environ, PARACELL_TEMPLATES=str(base / "templates"))
    common.run_checked([*paracell, "template", "build", "--for", str(bundle)], env=env)
    template_mib = _template_mib(base / "templates")
    runners[TEMPLATED] = Runner(TEMPLATED, paracell, bundle,
                                dict(env, PARACELL_TEMPLATE_RAM="shared"), writes=True)
    runners[COPIED] = Runner(COPIED, paracell, bundle, dict(env, PARACELL_TEMPLATE_RAM="copied"))
    names = tuple(runners)
    done: dict[str, list[Round]] = {name: [] for name in names}
    points: list[dict[str, float]] = []
    _say(f"{count} idle sandboxes per runtime, {rounds} round(s), state under {base}")
    try:
        with common.sigterm_as_interrupt():
            for r in range(rounds):
                order = names if r % 2 == 0 else names[::-1]
                for name in order:
                    _say(f"round {r + 1}/{rounds}: {name}")
                    done[name].append(_one_round(runners[name], count, window_s,
                                                 f"density-{os.getpid()}-{r}"))
            if curve:
                _say(f"curve: up to {curve} copy-on-write sandboxes")
                points = _curve(runners[TEMPLATED], curve, f"curve-{os.getpid()}")
    finally:
        left = {name: runner.leftovers() for name, runner in runners.items()}
        if any(left.values()):
            # Keep the roots: removing them would orphan what still runs.
            raise RuntimeError(f"bench density: still listed after delete: {left} (in {base})")
        shutil.rmtree(base, ignore_errors=True)
    results = {name: _figures(done[name]) for name in names}
    met = goals(results, template_mib, count)
    result = {
        "benchmark": "idle sandboxes: host CPU, memory and start time per sandbox",
        "engine": engine,
        "memory_manager": done["paracell"][0].memory_manager,
        "count": count, "window_s": window_s, "rounds": rounds, "args": SLEEP_ARGS,
        "template_ram_mib": template_mib, "write_mib": WRITE_MIB,
        "results": results,
        "curve": points,
        "goals": [{"goal": text, "met": ok} for text, ok in met],
    }
    path = common.write_result(output, result)
    _plot(results, count, points, path.with_suffix(".png"))
    lines = []
    for name in names:
        fig = results[name]
        lines.append(
            f"{name}: {fig['cpu_pct_per_sandbox']['median_pct']:.3f}% of a core, "
            f"{fig['pss_mib_per_sandbox']['median_mib']:.1f} MiB PSS, "
            f"{fig['wakeups_per_s_per_sandbox']['median_per_s']:.1f} wakeups/s per sandbox; "
            f"start {count} took {fig['nth_start_s']['median_s']:.2f} s "
            f"(the first {fig['first_start_s']['median_s']:.2f} s)")
    if points:
        last = points[-1]
        lines.append(f"curve: {last['count']} copy-on-write sandboxes hold "
                     f"{last['pss_mib']:.0f} MiB PSS, {last['per_sandbox_mib']:.1f} MiB each")
    lines += [f"{text}: {'met' if ok else 'NOT met'}" for text, ok in met]
    return "\n".join([*lines, f"-> {path}"])


def _plot(results: dict[str, Any], count: int, points: list[dict[str, float]],
          output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4 if points else 3, figsize=(16 if points else 12, 3.6))
    colours = {"paracell": "#4c72b0", "runc": "#6c757d", TEMPLATED: "#2a9d8f",
               COPIED: "#e9c46a"}
    names = list(results)
    for ax, key, unit, label in (
            (axes[0], "cpu_pct_per_sandbox", "pct", "% of a core per sandbox"),
            (axes[1], "pss_mib_per_sandbox", "mib", "MiB PSS per sandbox")):
        values = [results[n][key][f"median_{unit}"] for n in names]
        ax.bar(names, values, color=[colours[n] for n in names])
        for i, v in enumerate(values):
            ax.annotate(f"{v:.2f}", (i, v), ha="center", va="bottom", xytext=(0, 3),
                        textcoords="offset points")
        ax.set_ylabel(label)
    axes[0].axhline(GOAL_CPU_PCT, color="#e76f51", linestyle="--", label="goal")
    axes[0].legend()
    for name in names:
        for i, r in enumerate(results[name]["rounds"]):
            axes[2].plot(range(1, len(r["start_s"]) + 1), r["start_s"], marker=".",
                         color=colours[name], label=name if i == 0 else None)
    axes[2].set_xlabel("sandbox (the ones before it running)")
    axes[2].set_ylabel("start, s")
    axes[2].legend()
    if points:
        axes[3].plot([p["count"] for p in points], [p["pss_mib"] for p in points], marker="o",
                     color=colours[TEMPLATED])
        axes[3].set_xlabel("copy-on-write sandboxes running")
        axes[3].set_ylabel("MiB PSS, all of them")
    fig.suptitle(f"{count} idle sandboxes")
    return save_figure(fig, output)
