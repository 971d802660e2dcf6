"""`paracell bench cli`: wall time of the verbs containerd calls most often
(`state`, `kill`) on a running container, against runc's own, interleaved."""

from __future__ import annotations

import os
import subprocess
import tempfile
from typing import Any

from paracell.bench import common, plot
from paracell.runtime.context import Context

GOAL_STATE_MEDIAN_S = 0.030


def run(ctx: Context, runs: int, output: str) -> str:
    bundle = common.example_bundle("sleep", ["sleep", "600"])
    paracell = common.paracell_executable()
    root = str(common.bench_dir() / "root")
    runc = common.oci_runtime("runc")
    cid = f"bench-cli-{os.getpid()}"
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL,
             "stderr": subprocess.DEVNULL}
    variants: dict[str, list[str]] = {}
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="paracell-bench-") as tmp:
        runc_root = f"{tmp}/runc"
        # The detached shim keeps the container's stdio: give it /dev/null, not pipes.
        subprocess.run([paracell, "--root", root, "--no-template", "run", "--detach", "--bundle",
                        str(bundle), cid], check=True, **quiet)
        try:
            variants["paracell state"] = [paracell, "--root", root, "state", cid]
            variants["paracell kill"] = [paracell, "--root", root, "kill", cid, "CONT"]
            if runc:
                subprocess.run([runc, "--root", runc_root, "run", "--detach", "--bundle",
                                str(bundle), cid], check=True, **quiet)
                variants["runc state"] = [runc, "--root", runc_root, "state", cid]
                variants["runc kill"] = [runc, "--root", runc_root, "kill", cid, "CONT"]
            samples = {name: [] for name in variants}
            for _ in range(runs):
                for name, cmd in variants.items():
                    samples[name].append(common.time_call(lambda cmd=cmd: common.run_checked(cmd)))
        finally:
            subprocess.run([paracell, "--root", root, "delete", "--force", cid], **quiet)
            if runc:
                subprocess.run([runc, "--root", runc_root, "delete", "--force", cid], **quiet)
    stats = {name: common.summarize(values) for name, values in samples.items()}
    result: dict[str, Any] = {"benchmark": "CLI verb wall time on a running container",
                              "results": stats}
    state_median = stats["paracell state"]["median_s"]
    result["goal"] = {"state_median_s": GOAL_STATE_MEDIAN_S,
                      "met": state_median <= GOAL_STATE_MEDIAN_S}
    if runc:
        result["ratio_to_runc"] = {
            verb: stats[f"paracell {verb}"]["median_s"] / stats[f"runc {verb}"]["median_s"]
            for verb in ("state", "kill")
        }
    path = common.write_result(output, result)
    plot.bar_chart(stats, "CLI verbs on a running container", 1000, "ms",
                   path.with_suffix(".png"))
    parts = [f"{name} {s['median_s'] * 1000:.1f} ms" for name, s in stats.items()]
    verdict = "met" if result["goal"]["met"] else "not met"
    return f"{'; '.join(parts)}; state goal {verdict} -> {path}"
