"""`paracell bench pod`: idle pods of 0, 1 and 3 containers, one VM per pod
against a VM per container (the pause container included, as ParaCell ran
pods before pod VMs), interleaved round by round.

Each pod is made with the runtime's own CLI, in the order containerd's CRI
plugin uses: the sandbox (annotated as CRI annotates it), then each member
created and started. Figures per pod: the time from the sandbox's create to
the last member running, and the host memory of every process the pod
holds (shims, member proxies, QEMUs) as PSS, once the pod has sat idle."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from paracell.bench import common
from paracell.bench.plot import save_figure
from paracell.runtime.bundle import podrole
from paracell.runtime.context import Context

# 0: the sandbox alone, an idle pod VM: what a RuntimeClass's podFixed covers.
SIZES = (0, 1, 3)
MODES = ("pod_vm", "vm_per_container")
# The pod VM also starts from its template (docs/templates.md); the other
# modes boot cold.
TEMPLATED = "pod_vm_template"
IDLE_S = 2.0
# A pod VM must cost at most this share of the VMs it replaces, for 3 containers.
GOAL_MEMORY_RATIO_3 = 0.5
GOAL_TIME_RATIO_3 = 1.0
# A 3-container pod from a template, against the same pod booted cold.
GOAL_TEMPLATE_TIME_RATIO_3 = 0.5


def _bundle(name: str, annotations: dict[str, str]) -> Path:
    directory = common.example_bundle(name, ["sleep", "1000000"])
    config = json.loads((directory / "config.json").read_text())
    config["annotations"] = annotations
    if annotations.get(podrole.CONTAINER_TYPE) == "sandbox":
        # As CRI makes a sandbox: a network namespace of its own (a VM runtime
        # refuses a pod on the host's).
        config["linux"]["namespaces"].append({"type": "network"})
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def _one_pod(paracell: list[str], mode: str, size: int, tag: str,
             env: dict[str, str] | None = None) -> dict[str, float]:
    sandbox_id = f"{tag}-sandbox"
    members = [f"{tag}-c{i}" for i in range(size)]
    pod_vm = mode in ("pod_vm", TEMPLATED)
    sandbox_notes = {podrole.CONTAINER_TYPE: "sandbox"} if pod_vm else {}
    member_notes = ({podrole.CONTAINER_TYPE: "container", podrole.SANDBOX_ID: sandbox_id}
                    if pod_vm else {})
    bundles = {sandbox_id: _bundle("pod-sandbox" if pod_vm else "pod-plain", sandbox_notes)}
    member_bundle = _bundle("pod-member" if pod_vm else "pod-plain", member_notes)
    bundles.update(dict.fromkeys(members, member_bundle))
    began = time.monotonic()
    try:
        for cid, bundle in bundles.items():
            common.run_detached([*paracell, "create", "--bundle", str(bundle), cid], env=env)
            common.run_checked([*paracell, "start", cid])
        ready_s = time.monotonic() - began
        time.sleep(IDLE_S)
        pids = []
        for cid in bundles:
            state = json.loads(common.run_checked([*paracell, "state", cid]).stdout)
            pids.append(int(state["pid"]))
        return {"ready_s": ready_s, "host_mib": common.pss_of_tree(pids) / (1 << 20)}
    finally:
        for cid in [*members, sandbox_id]:
            subprocess.run([*paracell, "delete", "--force", cid], capture_output=True)


def goals(results: dict[str, Any]) -> list[tuple[str, bool]]:
    pod3, plain3 = results["pod_vm"]["3"], results["vm_per_container"]["3"]
    memory_ratio = pod3["host_mib"]["median_mib"] / plain3["host_mib"]["median_mib"]
    time_ratio = pod3["ready_s"]["median_s"] / plain3["ready_s"]["median_s"]
    met = [
        (f"3-container pod: host memory {memory_ratio:.2f}x of a VM per container "
         f"(goal <= {GOAL_MEMORY_RATIO_3})", memory_ratio <= GOAL_MEMORY_RATIO_3),
        (f"3-container pod: time to the last container running {time_ratio:.2f}x "
         f"(goal <= {GOAL_TIME_RATIO_3})", time_ratio <= GOAL_TIME_RATIO_3),
    ]
    warm = results[TEMPLATED]["3"]["ready_s"]["median_s"] / pod3["ready_s"]["median_s"]
    met.append((f"3-container pod from a template: time to the last container running "
                f"{warm:.2f}x cold (goal <= {GOAL_TEMPLATE_TIME_RATIO_3})",
                warm <= GOAL_TEMPLATE_TIME_RATIO_3))
    return met


def run(ctx: Context, rounds: int, output: str) -> str:
    import tempfile

    paracell = [common.paracell_executable(), "--root", common.state_root(), "--engine",
                ctx.engine]
    if ctx.memory_manager:
        paracell += ["--memory-manager", ctx.memory_manager]
    modes = (*MODES, TEMPLATED)
    with tempfile.TemporaryDirectory(prefix="paracell-bench-pod-") as tmp:
        # A template store of the run's own, built before the first round.
        env = dict(os.environ, PARACELL_TEMPLATES=f"{tmp}/templates")
        common.run_checked([*paracell, "template", "build", "--for",
                            str(_bundle("pod-sandbox", {podrole.CONTAINER_TYPE: "sandbox"}))],
                           env=env)
        samples: dict[str, dict[str, dict[str, list[float]]]] = {
            mode: {str(n): {"ready_s": [], "host_mib": []} for n in SIZES} for mode in modes}
        for r in range(rounds):
            # Rotate which mode goes first, so that none always meets a cold cache.
            order = modes if r % 2 == 0 else tuple(reversed(modes))
            for size in SIZES:
                for mode in order:
                    common.progress("pod", f"round {r + 1}/{rounds}: {size} container(s), {mode}")
                    cold = [*paracell, "--no-template"]
                    figures = _one_pod(paracell if mode == TEMPLATED else cold, mode, size,
                                       f"bench-pod-{os.getpid()}-{r}-{size}",
                                       env if mode == TEMPLATED else None)
                    for key, value in figures.items():
                        samples[mode][str(size)][key].append(value)
    results = {mode: {n: {k: common.summarize(v, "mib" if k == "host_mib" else "s")
                          for k, v in by.items()}
                      for n, by in per.items()} for mode, per in samples.items()}
    met = goals(results)
    result = {"benchmark": "idle pods of 1 and 3 containers", "rounds": rounds,
              "engine": ctx.engine, "results": results,
              "goals": [{"goal": text, "met": ok} for text, ok in met]}
    path = common.write_result(output, result)
    _plot(results, path.with_suffix(".png"))
    lines = []
    for size in SIZES:
        for mode in samples:
            fig = results[mode][str(size)]
            mib, ready = fig["host_mib"]["median_mib"], fig["ready_s"]["median_s"]
            lines.append(f"{size} container(s), {mode}: host {mib:.1f} MiB, "
                         f"last running after {ready:.2f} s")
    lines += [f"{text}: {'met' if ok else 'NOT met'}" for text, ok in met]
    return "\n".join([*lines, f"-> {path}"])


def _plot(results: dict[str, Any], output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    modes = list(results)
    width = 0.76 / len(modes)
    for ax, key, unit in ((axes[0], "host_mib", "host MiB (PSS)"),
                          (axes[1], "ready_s", "s to last container running")):
        for i, mode in enumerate(modes):
            xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(SIZES))]
            unit_key = "median_mib" if key == "host_mib" else "median_s"
            ys = [results[mode][str(n)][key][unit_key] for n in SIZES]
            ax.bar(xs, ys, width, label=mode)
        ax.set_xticks(range(len(SIZES)), [f"{n} container(s)" for n in SIZES])
        ax.set_ylabel(unit)
    axes[0].legend()
    fig.suptitle("idle pod: one VM per pod vs a VM per container")
    return save_figure(fig, output)
