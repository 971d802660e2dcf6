"""Shared benchmark plumbing: timing, medians, result files, and runc bundles."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from paracell import settings
from paracell.runtime.bundle import defaultspec


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """A bench's settings in this process's environment, for the verbs and
    SDK calls it makes in-process, as its CLI calls have them."""
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """A SIGTERM (a CI timeout, `kill`) cleans up as Ctrl-C does: shims are
    detached and would otherwise keep their VMs running after the bench."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Holds Ctrl-C and SIGTERM until the block ends, then delivers them to
    whatever handles them outside it. Around a spawn: an interrupt between
    fork and exec leaves a child that no Popen object names yet, which then
    goes on to start a VM after the cleanup has run. So the Popen is assigned
    (or registered) inside the block, and the block inside the try whose
    handler waits for the child: the held interrupt is raised on leaving it."""
    held: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        held.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)


def progress(bench: str, message: str) -> None:
    """A long run's progress, on stderr: the summary on stdout stays one block."""
    print(f"{bench}: {message}", file=sys.stderr, flush=True)


def time_call(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def summarize(samples: list[float], unit: str = "s") -> dict[str, float]:
    ordered = sorted(samples)
    return {
        f"median_{unit}": statistics.median(ordered),
        f"min_{unit}": ordered[0],
        f"max_{unit}": ordered[-1],
        "runs": len(ordered),
    }


def median_p95(values: list[float]) -> dict[str, float]:
    """Latencies as the benches report them: median, 95th percentile (the
    nearest rank) and count; zeros for none."""
    if not values:
        return {"median": 0.0, "p95": 0.0, "n": 0}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"median": statistics.median(ordered), "p95": p95, "n": len(ordered)}


def paracell_executable() -> str:
    """The `paracell` next to this interpreter: benchmarks time the real CLI."""
    import sys

    return str(Path(sys.executable).with_name("paracell"))


def state_root() -> str:
    """A private state root, so benchmarks never meet a user's containers."""
    return str(bench_dir() / "root")


def bench_dir() -> Path:
    path = settings.cache_dir() / "bench"
    path.mkdir(parents=True, exist_ok=True)
    return path


def example_bundle(name: str, args: list[str]) -> Path:
    return defaultspec.example_bundle(bench_dir() / name, args, readonly=True)


def run_checked(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run(cmd, capture_output=True, **kw)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {result.stderr.decode(errors='replace')[-300:]}")
    return result


def run_detached(cmd: list[str], env: dict[str, str] | None = None) -> None:
    """Runs a verb that leaves a container running (`create`, `run --detach`)
    with stdio on /dev/null: the shim keeps what it is given open for the
    container's life, so a pipe here would never see EOF. Its stderr goes
    to a file, for the error message."""
    import tempfile

    with tempfile.TemporaryFile() as err:
        proc: subprocess.Popen[bytes] | None = None
        try:
            with interrupts_deferred():
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=err, env=env)
            returncode = proc.wait()
        except KeyboardInterrupt:
            # Killed halfway, it could leave a VM that no state records yet;
            # finished, what it made is the caller's cleanup to delete.
            if proc is not None:
                proc.wait()
            raise
        if returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)}: {err.read().decode(errors='replace')[-300:]}")


def process_tree(pid: int) -> list[int]:
    """The process and all its descendants (a shim and its QEMU); [] once it is gone."""
    import psutil

    try:
        top = psutil.Process(pid)
        return [top.pid, *(child.pid for child in top.children(recursive=True))]
    except psutil.Error:
        return []


def pss_of_tree(pids: list[int]) -> int:
    """Bytes of PSS of these processes and their descendants, each counted once,
    so that pages they share are not counted twice."""
    import psutil

    seen = {pid for top in pids for pid in process_tree(top)}
    total = 0
    for pid in seen:
        try:
            total += psutil.Process(pid).memory_full_info().pss
        except psutil.Error:
            pass
    return total


def oci_runtime(name: str) -> str | None:
    """runc or crun from Debian, when installed, as same-run baselines."""
    return shutil.which(name)


def write_result(output: str, result: dict[str, Any]) -> Path:
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
