"""Shared benchmark plumbing: timing, medians, result files, and runc bundles."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paracell import settings
from paracell.runtime import defaultspec


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


def oci_runtime(name: str) -> str | None:
    """runc or crun from Debian, when installed, as same-run baselines."""
    return shutil.which(name)


def write_result(output: str, result: dict[str, Any]) -> Path:
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
