"""`paracell bench suite`: the orchestration. Each round runs every workload
once under every runtime, in an order that rotates from round to round and
workload to workload, so that drift on this noisy machine hits all alike.

One run is one container, cold: created with `run` (foreground, its stdout
read line by line with host timestamps), fed by a host client when it is a
server, then killed and deleted. A server's round starts its container under
every runtime, one after another, then loads them in turns, seconds apart:
their ratios then compare loads that met the same host. Everything a run
makes (the container, its network namespace) is recorded before it is made
and removed in a `finally`, and the suite's bridge and state roots go at the
end; SIGTERM is turned into the same KeyboardInterrupt as Ctrl-C, and both
are held off while the cleanup runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from paracell.bench import common
from paracell.bench.suite import network, report
from paracell.bench.suite.runtimes import RUNTIMES, XGATES_ANNOTATION, Invoker, Runtime
from paracell.bench.suite.workloads import (
    FULL,
    PACKAGES,
    QUICK,
    READY_TIMEOUT_S,
    WORKLOADS,
    ServerWorkload,
    Size,
    Workload,
    load_turn,
    merge_turns,
    wait_listening,
    write_files,
)
from paracell.errors import ParacellError

GUEST_MIB = 512
MIB = 1 << 20
RAM_SAMPLE_S = 0.05
BATCH_TIMEOUT_S = 600
QUICK_ROUNDS, FULL_ROUNDS = 1, 3
# Before the first run has been timed: a guess per run for "time left".
GUESS_RUN_S = 15.0


@dataclass
class Sample:
    workload: str
    runtime: str
    round: int
    cold_start_s: float | None = None
    serving_s: float | None = None
    run_s: float | None = None
    wall_s: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    host_ram: list[tuple[float, int]] = field(default_factory=list)  # (s since spawn, bytes)
    guest_used: list[tuple[float, int]] = field(default_factory=list)
    window: tuple[float, float] | None = None  # begin..end, s since spawn
    error: str | None = None
    # A server under the Pager: its host counters and QEMU's page faults over
    # the client's load (the Pager's traffic while it served).
    pager_during_load: dict[str, float] = field(default_factory=dict)
    # A server loaded side by side with other runtimes: each turn's metrics
    # (`metrics` merges them), in the order the turns ran.
    turns: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Run:
    """One container while it lives: what Suite._end undoes."""
    wl: Workload
    rt: Runtime
    cid: str
    sample: Sample
    err: Any  # the `run` process's stderr, a temporary file
    attachment: network.Attachment | None = None
    proc: subprocess.Popen[bytes] | None = None
    reader: threading.Thread | None = None
    threads: list[threading.Thread] = field(default_factory=list)
    lines: list[tuple[float, str]] = field(default_factory=list)  # (s since spawn, line)
    stop: threading.Event = field(default_factory=threading.Event)
    t0: float = 0.0

    def failed(self, error: ParacellError) -> None:
        exited = self.proc is not None and self.proc.poll() is not None
        self.sample.error = str(error) + (f" (the container said{_stderr_tail(self.err)})"
                                          if exited and "exited" in str(error) else "")


@dataclass
class Plan:
    quick: bool
    rounds: int
    runtimes: list[str]
    workloads: list[str]

    @property
    def size(self) -> Size:
        return QUICK if self.quick else FULL


def make_plan(quick: bool, runtimes: list[str] | None, workloads: list[str] | None,
              rounds: int | None) -> Plan:
    """Validates the CLI's choices: known names, no repeats, a sane round count."""
    chosen_rt = runtimes or [name for name, rt in RUNTIMES.items() if rt.by_default]
    chosen_wl = workloads or list(WORKLOADS)
    for kind, chosen, known in (("runtime", chosen_rt, RUNTIMES), ("workload", chosen_wl,
                                                                    WORKLOADS)):
        unknown = [c for c in chosen if c not in known]
        if unknown:
            raise ParacellError(f"paracell bench suite: unknown {kind} {unknown[0][:40]!r}; "
                                f"choose from {', '.join(known)}")
        if len(set(chosen)) != len(chosen):
            raise ParacellError(f"paracell bench suite: a {kind} named twice")
    n = rounds if rounds is not None else QUICK_ROUNDS if quick else FULL_ROUNDS
    if not 1 <= n <= 20:
        raise ParacellError("paracell bench suite: --rounds 1..20")
    # Keep the registry's order, whatever order they were given in.
    return Plan(quick, n, [r for r in RUNTIMES if r in chosen_rt],
                [w for w in WORKLOADS if w in chosen_wl])


def _say(message: str) -> None:
    common.progress("suite", message)


@contextlib.contextmanager
def _shielded() -> Iterator[None]:
    """Cleanup runs to its end: a second Ctrl-C or SIGTERM must not leave VMs behind."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


class Progress:
    def __init__(self, total: int):
        self.total = total
        self.done = 0
        self.began = time.monotonic()
        self.took: dict[tuple[str, str], float] = {}

    def left_s(self, pending: list[tuple[str, str]]) -> float:
        """Each pending (workload, runtime) run at what it took in an earlier
        round, else what that workload took under the other runtimes so far,
        else the mean run so far."""
        def mean(values: list[float]) -> float | None:
            return sum(values) / len(values) if values else None

        overall = mean(list(self.took.values())) or GUESS_RUN_S
        total = 0.0
        for w, r in pending:
            total += (self.took.get((w, r))
                      or mean([t for (w2, _), t in self.took.items() if w2 == w]) or overall)
        return total

    def start(self, workload: str, runtime: str, rnd: int, rounds: int,
              pending: list[tuple[str, str]]) -> None:
        left = self.left_s(pending)
        _say(f"[{self.done + 1}/{self.total}] {workload} on {runtime}, round {rnd + 1}/{rounds}; "
             f"elapsed {self._fmt(time.monotonic() - self.began)}, about {self._fmt(left)} left")

    def finish(self, workload: str, runtime: str, took: float) -> None:
        self.done += 1
        self.took[(workload, runtime)] = took

    @staticmethod
    def _fmt(seconds: float) -> str:
        return f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


class Suite:
    def __init__(self, plan: Plan, engine: str, output_dir: Path,
                 image: Callable[[], Path] | None = None):
        self.plan = plan
        self.engine = engine
        self.output_dir = output_dir
        self._image = image
        self.base = Path(tempfile.mkdtemp(prefix="paracell-suite-"))
        self.invoker = Invoker(self.base, common.paracell_executable(),
                               common.oci_runtime("runc"), engine)
        self.net = network.SuiteNetwork()
        self.live: dict[str, Runtime] = {}  # container id -> its runtime, until deleted
        self.procs: list[subprocess.Popen[bytes]] = []
        self.samples: list[Sample] = []
        self.skipped: dict[str, str] = {}
        self.counter = 0
        self.rootfs: Path | None = None

    # --- the whole run -----------------------------------------------------

    def run(self) -> dict[str, Any]:
        began = time.time()
        try:
            with common.sigterm_as_interrupt():
                return self._run(began)
        finally:
            with _shielded():
                self.cleanup()

    def _run(self, began: float) -> dict[str, Any]:
        _say("the Debian image (built once, then cached)")
        self.rootfs = self._image() if self._image else _default_image()
        # The /bench mount point, made once here rather than by each runtime
        # inside the cached image at its first mount.
        (self.rootfs / "bench").mkdir(exist_ok=True)
        for w in self.plan.workloads:
            (self.base / "files" / w).mkdir(parents=True, exist_ok=True)
            write_files(self.base / "files" / w, WORKLOADS[w].files(self.plan.size))
        if "runc" in self.plan.runtimes and self.invoker.runc is None:
            self.skipped["runc"] = "runc is not installed (Debian's `runc`)"
        if "xgates" in self.plan.runtimes:
            reason = self.probe_xgates()
            if reason:
                self.skipped["xgates"] = reason
        for name, why in self.skipped.items():
            _say(f"skipping {name}: {why}")
        active = [r for r in self.plan.runtimes if r not in self.skipped]
        if any(isinstance(WORKLOADS[w], ServerWorkload) for w in self.plan.workloads):
            self.net.open()
        order = self.order(active)
        progress = Progress(len(order))
        for rnd, w, rts in self.steps(order):
            pending = [(x[1], x[2]) for x in order[progress.done:]]
            progress.start(w, ", ".join(rts) + (" side by side" if len(rts) > 1 else ""),
                           rnd, self.plan.rounds, pending)
            t0 = time.monotonic()
            wl = WORKLOADS[w]
            samples = (self.run_side_by_side(wl, [RUNTIMES[r] for r in rts], rnd)
                       if isinstance(wl, ServerWorkload)
                       else [self._run_batch(wl, RUNTIMES[rts[0]], rnd)])
            took = (time.monotonic() - t0) / len(rts)
            for r, sample in zip(rts, samples, strict=True):
                progress.finish(w, r, took)
                self.samples.append(sample)
                if sample.error:
                    _say(f"  {w} on {r} failed: {sample.error}")
        return self.result(began, active)

    @staticmethod
    def steps(order: list[tuple[int, str, str]]) -> list[tuple[int, str, list[str]]]:
        """The order as what runs at once: a server's round under all its
        runtimes side by side, a batch workload's runs one by one."""
        out: list[tuple[int, str, list[str]]] = []
        for rnd, w, r in order:
            if (out and out[-1][:2] == (rnd, w)
                    and isinstance(WORKLOADS[w], ServerWorkload)):
                out[-1][2].append(r)
            else:
                out.append((rnd, w, [r]))
        return out

    def order(self, active: list[str]) -> list[tuple[int, str, str]]:
        """(round, workload, runtime): every pair once a round, the runtimes'
        order rotated by round and by workload."""
        out = []
        for rnd in range(self.plan.rounds):
            for wi, w in enumerate(self.plan.workloads):
                k = (rnd + wi) % len(active) if active else 0
                for r in active[k:] + active[:k]:
                    out.append((rnd, w, r))
        return out

    def result(self, began: float, active: list[str]) -> dict[str, Any]:
        return {
            "benchmark": "paracell bench suite", "engine": self.engine,
            "quick": self.plan.quick, "rounds": self.plan.rounds, "guest_mib": GUEST_MIB,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began)),
            "took_s": time.time() - began,
            "runtimes": {r: RUNTIMES[r].label for r in self.plan.runtimes},
            "active": active, "skipped": self.skipped,
            "workloads": {w: WORKLOADS[w].title for w in self.plan.workloads},
            "size": asdict(self.plan.size), "image_packages": list(PACKAGES),
            "rootfs": str(self.rootfs),
            "samples": [asdict(s) for s in self.samples],
        }

    # --- XGates: can it run this image's programs? ---------------------------

    def probe_xgates(self) -> str | None:
        """None when an XGates guest runs a dynamically linked Debian program
        from the image, else why not (what the runtime said)."""
        cid = self._cid()
        rt = RUNTIMES["xgates"]
        bundle = self._bundle(cid, ["/usr/bin/env", "true"], None, rt, files=None)
        self.live[cid] = rt
        try:
            res = subprocess.run([*self.invoker.argv(rt), "run", "--bundle", str(bundle), cid],
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 timeout=180, env=self._env())
        except subprocess.TimeoutExpired:
            return "the XGates probe (/usr/bin/env true) did not finish in 180 s"
        finally:
            self.invoker.delete(rt, cid)
            self.live.pop(cid, None)
        if res.returncode == 0:
            return None
        said = (res.stderr.strip() or res.stdout.strip()).splitlines()
        return ("an XGates guest cannot run the image's dynamically linked programs yet "
                f"(issue 19): `/usr/bin/env true` exited {res.returncode}"
                + (f": {said[-1][:300]}" if said else ""))

    # --- one run -------------------------------------------------------------

    def _cid(self) -> str:
        self.counter += 1
        return f"suite-{os.getpid()}-{self.counter}"

    def _env(self) -> dict[str, str]:
        return dict(os.environ, PARACELL_GUEST_MEMORY_MIB=str(GUEST_MIB))

    def _bundle(self, cid: str, args: list[str], netns_path: str | None, rt: Runtime,
                files: Path | None) -> Path:
        from paracell.runtime.bundle import defaultspec

        assert self.rootfs is not None
        bundle = self.base / "bundles" / cid
        bundle.mkdir(parents=True)
        config = defaultspec.default_config(args)
        config["root"] = {"path": str(self.rootfs), "readonly": True}
        config["process"]["env"].append("HOME=/tmp")
        config["mounts"].append({"destination": "/run", "type": "tmpfs", "source": "tmpfs",
                                 "options": ["nosuid", "nodev", "mode=755"]})
        if files is not None:
            config["mounts"].append({"destination": "/bench", "type": "bind",
                                     "source": str(files), "options": ["bind", "ro"]})
        config["linux"]["namespaces"].append(
            {"type": "network", "path": netns_path} if netns_path else {"type": "network"})
        config["annotations"] = {XGATES_ANNOTATION: "on" if rt.xgates else "off",
                                 **dict(rt.pager_knobs)}
        (bundle / "config.json").write_text(json.dumps(config, indent=2))
        return bundle

    def _run_batch(self, wl: Workload, rt: Runtime, rnd: int) -> Sample:
        run = self._start(wl, rt, rnd)
        try:
            if not run.sample.error:
                self._await_batch(run)
        except ParacellError as e:
            run.failed(e)
        finally:
            self._end(run)
        return run.sample

    @staticmethod
    def _await_batch(run: _Run) -> None:
        assert run.proc is not None and run.reader is not None
        try:
            rc = run.proc.wait(BATCH_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise ParacellError(f"ran past {BATCH_TIMEOUT_S} s") from e
        run.reader.join(10)
        if rc != 0:
            raise ParacellError(f"exited {rc}{_stderr_tail(run.err)}")
        run.sample.metrics = run.wl.parse(_results(run.lines))
        run.sample.window, run.sample.run_s = _window(run.lines)

    def run_side_by_side(self, wl: ServerWorkload, rts: list[Runtime],
                         rnd: int) -> list[Sample]:
        """A round of a server under several runtimes: each container
        started in turn (so their cold starts do not overlap), then their
        loads in turns (Size.turns), the order rotated each turn.
        The runtimes are loaded seconds apart, not minutes, so a slow
        stretch of this shared host weighs on all of them."""
        runs: list[_Run] = []
        try:
            for rt in rts:
                runs.append(self._start(wl, rt, rnd))
            self._load(wl, [r for r in runs if not r.sample.error])
        finally:
            # Every run is ended even when one's end fails; the first failure
            # then goes on up, to the suite's cleanup.
            failed: BaseException | None = None
            for run in runs:
                try:
                    self._end(run)
                except BaseException as e:  # noqa: BLE001 - re-raised below
                    failed = failed or e
            if failed is not None:
                raise failed
        return [r.sample for r in runs]

    def _load(self, wl: ServerWorkload, runs: list[_Run]) -> None:
        turns = self.plan.size.turns if len(runs) > 1 else 1
        size = load_turn(self.plan.size) if turns > 1 else self.plan.size
        before = {r.cid: self._pager_counters(r.cid, r.rt) for r in runs}
        for turn in range(turns):
            k = turn % len(runs)
            for run in runs[k:] + runs[:k]:
                if run.sample.error:
                    continue
                assert run.attachment is not None
                try:
                    run.sample.turns.append(wl.client(run.attachment.address, size))
                except ParacellError as e:
                    run.failed(e)
        for run in runs:
            if run.sample.error:
                continue
            after = self._pager_counters(run.cid, run.rt)
            run.sample.pager_during_load = {k: after[k] - before[run.cid][k] for k in after
                                            if k in before[run.cid]}
            run.sample.metrics = merge_turns(run.sample.turns)
            if turns == 1:
                run.sample.turns = []

    def _start(self, wl: Workload, rt: Runtime, rnd: int) -> _Run:
        """The container spawned and, by return, ready and (a server)
        listening; or the sample's error says why not. Whatever it made is
        in the _Run for _end, even when this raises."""
        run = _Run(wl, rt, self._cid(), Sample(wl.name, rt.name, rnd),
                   tempfile.TemporaryFile())  # noqa: SIM115 - closed by _end
        try:
            run.attachment = self.net.attach() if isinstance(wl, ServerWorkload) else None
            bundle = self._bundle(run.cid, wl.args(self.plan.size),
                                  run.attachment.path if run.attachment else None, rt,
                                  self.base / "files" / wl.name)
            self.live[run.cid] = rt
            run.t0 = time.monotonic()
            if rt.vm and wl.agent:
                from paracell.vmm import memory

                ram = memory.path_for(str(self.base / "paracell"), run.cid)
                run.threads.append(threading.Thread(
                    target=_sample_ram, daemon=True,
                    args=(ram, run.t0, run.sample.host_ram, run.stop)))
            with common.interrupts_deferred():  # the run process is always cleaned up
                run.proc = subprocess.Popen([*self.invoker.argv(rt), "run", "--bundle",
                                             str(bundle), run.cid],
                                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                            stderr=run.err, env=self._env(),
                                            start_new_session=True)
                self.procs.append(run.proc)
            ready = threading.Event()
            run.reader = threading.Thread(target=_read_lines, daemon=True,
                                          args=(run.proc, run.t0, run.lines, ready))
            run.threads.append(run.reader)
            for t in run.threads:
                t.start()
            ready.wait(READY_TIMEOUT_S)
            at = next((t for t, line in list(run.lines) if line == "ready"), None)
            if at is None:
                raise ParacellError(f"no `ready` from the container in {READY_TIMEOUT_S} s"
                                    f"{_stderr_tail(run.err)}")
            run.sample.cold_start_s = at
            if isinstance(wl, ServerWorkload):
                assert run.attachment is not None
                proc = run.proc
                listening = wait_listening(run.attachment.address, wl.port, READY_TIMEOUT_S,
                                           alive=lambda: proc.poll() is None)
                run.sample.serving_s = listening - run.t0
        except ParacellError as e:
            run.failed(e)
        except BaseException:
            self._end(run)
            raise
        return run

    def _end(self, run: _Run) -> None:
        """The container gone, its network detached; the sample's last figures."""
        run.sample.guest_used = [(t, (GUEST_MIB << 20) - int(words[1]) * 1024)
                                 for t, words in ((t, line.split()) for t, line in run.lines)
                                 if words[:1] == ["mem"] and len(words) == 2
                                 and words[1].isdigit()]
        run.stop.set()
        try:
            self._finish(run.cid, run.rt, run.proc)
        finally:
            if run.attachment is not None:
                self.net.detach(run.attachment)
            run.err.close()
            run.sample.wall_s = time.monotonic() - (run.t0 or time.monotonic())

    def _pager_counters(self, cid: str, rt: Runtime) -> dict[str, float]:
        """The Pager's host counters and QEMU's page faults now; {} without the Pager."""
        from paracell.procfs import page_faults

        if rt.memory_manager != "pager":
            return {}
        res = subprocess.run([*self.invoker.argv(rt), "events", "--stats", cid],
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        if res.returncode != 0:
            return {}
        figures = json.loads(res.stdout)["data"]["paracell"]
        keys = ("unbound_total_bytes", "bound_total_bytes", "unbind_batches", "bind_batches",
                "bind_ms")
        out = {k: float(figures[k]) for k in keys if isinstance(figures.get(k), (int, float))}
        # The guest's side: what it bound ahead of its allocator, and what
        # the allocator met unbound (docs/pager.md, "Servers").
        guest = figures.get("guest") if isinstance(figures.get("guest"), dict) else {}
        for k in ("bound_ahead_pages", "bound_late_pages"):
            if isinstance(guest.get(k), int):
                out[f"guest_{k}"] = float(guest[k])
        state = json.loads((self.base / "paracell" / cid / "state.json").read_text())
        faults = page_faults(state["vm"]["qemu_pid"])
        if faults is not None:
            out["qemu_page_faults"] = float(faults)
        return out

    def _finish(self, cid: str, rt: Runtime, proc: subprocess.Popen[bytes] | None) -> None:
        """The container killed and deleted, its `run` process reaped."""
        if proc is not None and proc.poll() is None:
            self.invoker.kill(rt, cid)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        self.invoker.delete(rt, cid)
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            self.procs.remove(proc)
        self.live.pop(cid, None)

    # --- cleanup -------------------------------------------------------------

    def cleanup(self) -> None:
        for cid, rt in list(self.live.items()):
            with contextlib.suppress(Exception):
                self.invoker.delete(rt, cid)
            self.live.pop(cid, None)
        for proc in list(self.procs):
            with contextlib.suppress(Exception):
                proc.kill()
                proc.wait(10)
        self.procs.clear()
        with contextlib.suppress(Exception):
            self.net.close()
        try:
            left = self.invoker.listed()
        except Exception:  # noqa: BLE001 - the listing itself failed; keep the roots
            left = {"unknown": ["(list failed)"]}
        if any(left.values()):
            _say(f"still listed after delete: {left}; keeping {self.base}")
            return
        shutil.rmtree(self.base, ignore_errors=True)


def _default_image() -> Path:
    from paracell.images import debian_rootfs

    return debian_rootfs(PACKAGES)


def _sample_ram(path: Path, t0: float, out: list[tuple[float, int]],
                stop: threading.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError):
            out.append((time.monotonic() - t0, os.stat(path).st_blocks * 512))
        stop.wait(RAM_SAMPLE_S)


def _read_lines(proc: subprocess.Popen[bytes], t0: float, lines: list[tuple[float, str]],
                ready: threading.Event) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        text = raw.decode(errors="replace").rstrip("\n")
        lines.append((time.monotonic() - t0, text))
        if text == "ready":
            ready.set()
    ready.set()  # a container that exits before `ready` does not keep the wait


def _stderr_tail(err: Any) -> str:
    err.seek(0)
    said = err.read().decode(errors="replace").strip().splitlines()
    return f": {said[-1][:300]}" if said else ""


def _results(lines: list[tuple[float, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for _, line in lines:
        words = line.split()
        if words[:1] == ["result"] and len(words) >= 2:
            out[words[1]] = words[2:]
    return out


def _window(lines: list[tuple[float, str]]) -> tuple[tuple[float, float], float]:
    marks = {line: t for t, line in lines if line in ("begin", "end")}
    if "begin" not in marks or "end" not in marks:
        raise ParacellError("the workload printed no begin/end")
    return (marks["begin"], marks["end"]), marks["end"] - marks["begin"]


def run(ctx: Any, plan: Plan, output_dir: str) -> str:
    from paracell.vmm import probe

    engine = probe.choose_engine(ctx.engine, probe.probe_host()).engine
    out = Path(output_dir)
    suite = Suite(plan, engine, out)
    _say(f"{len(plan.workloads)} workload(s) x {len(plan.runtimes)} runtime(s), "
         f"{plan.rounds} round(s), {'quick' if plan.quick else 'full'} (pid {os.getpid()}); "
         f"state under {suite.base}")
    result = suite.run()
    summary = report.write(result, out)
    return summary
