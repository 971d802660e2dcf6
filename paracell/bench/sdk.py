"""`paracell bench sdk`: what a command costs an agent framework, the SDK's
way (paracell.sandbox: over the sandbox's channel from the caller's process)
against shelling out to `paracell exec`, interleaved on one sandbox, with a
file read each way."""

from __future__ import annotations

import subprocess
from typing import Any

from paracell.bench import common, plot
from paracell.runtime.context import Context

GOAL_RATIO = 0.25


def run(ctx: Context, runs: int, output: str) -> str:
    import os

    from paracell.sandbox import Sandbox

    bundle = common.example_bundle("sleep", ["sleep", "600"])
    paracell = common.paracell_executable()
    root = common.state_root()
    cli = [paracell, "--root", root, "exec", f"bench-sdk-{os.getpid()}"]
    variants = {
        "SDK run true": None,
        "CLI exec true": [*cli, "true"],
        "SDK files.read": None,
        "CLI exec cat": [*cli, "cat", "/etc/passwd"],
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    common.progress("sdk", "creating the sandbox")
    with Sandbox.create(str(bundle), f"bench-sdk-{os.getpid()}", root=root,
                        snapshot=False) as box:
        sdk_calls = {"SDK run true": lambda: box.run(["true"], timeout=30),
                     "SDK files.read": lambda: box.files.read("/etc/passwd")}
        for r in range(runs):
            if r % 10 == 0:
                common.progress("sdk", f"round {r + 1}/{runs}")
            for name, cmd in variants.items():
                call = sdk_calls[name] if cmd is None else \
                    (lambda cmd=cmd: common.run_checked(cmd, stdin=subprocess.DEVNULL))
                samples[name].append(common.time_call(call))
    stats = {name: common.summarize(values) for name, values in samples.items()}
    ratio = stats["SDK run true"]["median_s"] / stats["CLI exec true"]["median_s"]
    read_ratio = stats["SDK files.read"]["median_s"] / stats["CLI exec cat"]["median_s"]
    goals = [{"goal": f"a command through the SDK <= {GOAL_RATIO}x `paracell exec`",
              "value": ratio, "met": ratio <= GOAL_RATIO}]
    result: dict[str, Any] = {"benchmark": "a command in a running sandbox: SDK vs CLI",
                              "runs": runs, "engine": ctx.engine, "results": stats,
                              "ratio_run": ratio, "ratio_read": read_ratio, "goals": goals}
    path = common.write_result(output, result)
    plot.bar_chart(stats, "a command in a running sandbox: SDK vs `paracell exec`", 1000, "ms",
                   path.with_suffix(".png"))
    parts = [f"{name} {s['median_s'] * 1000:.1f} ms" for name, s in stats.items()]
    verdicts = [f"{g['goal']}: {'met' if g['met'] else 'NOT met'} ({g['value']:.2f}x)"
                for g in goals]
    return "\n".join(["; ".join(parts), *verdicts, f"-> {path}"])
