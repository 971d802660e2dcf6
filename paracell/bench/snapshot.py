"""`paracell bench snapshot`: checkpoint and rollback of a running
snapshot-mode sandbox (docs/snapshots.md), for a Debian python3 process
that has touched 16, 64 and 256 MiB.

For each size, one sandbox: a full first checkpoint, then ROUNDS rounds of
(4 MiB changed, an incremental checkpoint, and as the baseline the whole VM
saved as a template is: device state plus a sparse copy of its RAM) and then ROUNDS rollbacks to the
first checkpoint, each after another 4 MiB change; then forks of the
first checkpoint, one at a time, and ten at once, sharing its memory (the
default) and with a copy each (--private-memory), interleaved. Latencies
are the shim's (pause to resume), the SDK's (`paracell.sandbox`, request
to running: what an agent framework waits for) and the CLI's (with its
process start).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from paracell.bench import common, userland
from paracell.runtime.context import Context
from paracell.runtime.snapshots.checkpoints import FORK_RAM

SIZES_MIB = (16, 64, 256)
GUEST_MIB = 512
CHANGE_MIB = 4
ROUNDS = 10
FORK_MODES = ("shared", "private")  # the forks' memory: the default, and --private-memory
FORK_ROUNDS = 3
WORKLOAD = Path(__file__).resolve().parent / "programs" / "snapshot_workload.py"
# Published figures to set beside ours (docs/snapshots.md has the sources).
ANCHORS = {
    "DeltaBox (arXiv 2605.22781)": {"checkpoint_ms": 14, "rollback_ms": 5,
                                    "rollback_v2_ms": 1.86},
    "CubeSandbox on a PVM cloud VM": {"snapshot_ms": [42, 258], "restore_ms": [54, 83],
                                      "rollback_ms": 90},
}


class Box:
    """One sandbox of the bench, driven through the CLI and the SDK."""

    def __init__(self, root: Path, env: dict[str, str], cid: str) -> None:
        self.root, self.env, self.cid = root, env, cid
        self.cli = [common.paracell_executable(), "--root", str(root)]
        self.generation = 0

    def run(self, bundle: Path) -> None:
        common.run_detached([*self.cli, "run", "--detach", "--bundle", str(bundle), self.cid],
                            env=self.env)
        self.wait(0)

    def wait(self, generation: int) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self._gen() == generation:
                return
            time.sleep(0.2)
        raise RuntimeError(f"bench snapshot: the workload never reached generation {generation}")

    def _gen(self) -> int:
        import subprocess

        out = subprocess.run([*self.cli, "exec", self.cid, "cat", "/gen"], env=self.env,
                             capture_output=True, text=True, stdin=subprocess.DEVNULL)
        return int(out.stdout) if out.returncode == 0 and out.stdout.strip().isdigit() else -1

    def change(self) -> None:
        self.generation += 1
        common.run_checked([*self.cli, "kill", self.cid, "USR1"], env=self.env)
        self.wait(self.generation)

    def api(self, op: Literal["checkpoint", "rollback"], name: str
            ) -> tuple[dict[str, Any], float]:
        """A checkpoint or a rollback through the SDK, in this process: what
        it said, and the time from the call to its return."""
        from paracell.sandbox import Sandbox

        call = getattr(Sandbox(self.cid, str(self.root)), op)
        with common.environment(self.env):
            began = time.perf_counter()
            done = call(name)
            return done, time.perf_counter() - began

    def cli_time(self, *verb: str) -> float:
        began = time.perf_counter()
        common.run_checked([*self.cli, "sandbox", *verb], env=self.env)
        return time.perf_counter() - began

    def full_save(self, path: Path) -> float:
        """The baseline, a whole VM saved the way templates are
        (runtime/vm/templating.py): stopped, its device state saved to a file
        by its backend, every page it has copied (holes kept), then resumed.
        Not through QEMU's RAM migration: reading the guest's holes would
        allocate them."""
        from paracell import safefs
        from paracell.runtime.state.store import StateStore
        from paracell.vmm import backends

        config = StateStore(str(self.root)).load(self.cid).vm.config
        vmm = backends.hypervisor_of(config)
        copy = path.with_suffix(".ram")
        began = time.perf_counter()
        try:
            vmm.save(path)
            src = os.open(config.ram_file, os.O_RDONLY | os.O_CLOEXEC)
            dst = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                safefs.sparse_copy(src, dst)
            finally:
                os.close(src)
                os.close(dst)
        finally:
            vmm.resume()
        took = time.perf_counter() - began
        path.unlink(missing_ok=True)
        copy.unlink(missing_ok=True)
        return took

    def fork_api(self, count: int, prefix: str, private: bool) -> tuple[list[str], float]:
        """`count` forks of the first checkpoint through the SDK, in this
        process: their ids and the time until all run."""
        from paracell.sandbox import Sandbox

        with common.environment(self.env):
            began = time.perf_counter()
            forks = Sandbox(self.cid, str(self.root)).fork("base", count, id_prefix=prefix,
                                                           private_memory=private)
            took = time.perf_counter() - began
        return [f.id for f in forks], took

    def delete(self, cid: str | None = None) -> None:
        import subprocess

        subprocess.run([*self.cli, "delete", "--force", cid or self.cid], env=self.env,
                       capture_output=True)


def _bundle(base: Path, mib: int) -> Path:
    from paracell.runtime.bundle import defaultspec

    rootfs = userland.rootfs()
    dest = rootfs / "usr" / "local" / "bin" / WORKLOAD.name
    dest.write_bytes(WORKLOAD.read_bytes())
    bundle = base / f"bundle-{mib}"
    bundle.mkdir()
    config = defaultspec.default_config([str(userland.PYTHON.resolve()), "-B",
                                         f"/usr/local/bin/{WORKLOAD.name}", str(mib),
                                         str(CHANGE_MIB)])
    config["root"] = {"path": str(rootfs), "readonly": False}
    config["annotations"] = {"io.paracell.snapshot": "on",
                             "io.paracell.snapshot.max-checkpoints": str(ROUNDS + 4)}
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def _one_size(base: Path, env: dict[str, str], mib: int, rounds: int) -> dict[str, Any]:
    box = Box(base / "root", env, f"bench-snap-{mib}")
    box.run(_bundle(base, mib))
    out: dict[str, Any] = {"touched_mib": mib, "changed_mib": CHANGE_MIB}
    try:
        first, first_api = box.api("checkpoint", name="base")
        out["first"] = {"paused_ms": first["paused_s"] * 1e3, "api_ms": first_api * 1e3,
                        "bytes": first["bytes"]}
        ck_paused, ck_api, ck_cli, sizes, full = [], [], [], [], []
        for r in range(rounds):
            common.progress("snapshot", f"{mib} MiB: checkpoint round {r + 1}/{rounds}")
            box.change()
            if r % 2 == 0:
                done, took = box.api("checkpoint", name=f"r{r}")
                ck_api.append(took * 1e3)
            else:
                ck_cli.append(box.cli_time("checkpoint", "--name", f"r{r}", box.cid) * 1e3)
                done = json.loads((box.root / box.cid / "checkpoints" / f"r{r}" /
                                   "meta.json").read_text())
                done = {"paused_s": None, "bytes": done["pages_saved"] * 4096}
            if done["paused_s"] is not None:
                ck_paused.append(done["paused_s"] * 1e3)
            sizes.append(done["bytes"])
            full.append(box.full_save(base / "full.state") * 1e3)
        rb_paused, rb_api, rb_cli = [], [], []
        for r in range(rounds):
            common.progress("snapshot", f"{mib} MiB: rollback round {r + 1}/{rounds}")
            box.change()
            if r % 2 == 0:
                done, took = box.api("rollback", name="base")
                rb_paused.append(done["paused_s"] * 1e3)
                rb_api.append(took * 1e3)
            else:
                rb_cli.append(box.cli_time("rollback", box.cid, "base") * 1e3)
            box.generation = 0  # the workload is back at the first checkpoint
        out.update(_forks(box, rounds))
        stats = common.median_p95
        out.update({
            "checkpoint_paused_ms": stats(ck_paused), "checkpoint_api_ms": stats(ck_api),
            "checkpoint_cli_ms": stats(ck_cli), "checkpoint_bytes": stats(sizes),
            "baseline_full_save_ms": stats(full),
            "checkpoint_vs_full_save": statistics.median(ck_paused) / statistics.median(full),
            "rollback_paused_ms": stats(rb_paused), "rollback_api_ms": stats(rb_api),
            "rollback_cli_ms": stats(rb_cli)})
    finally:
        box.delete()
    return out


def host_bytes(root: Path, cid: str) -> int:
    """What a sandbox holds on the host: the guest-RAM file's allocated blocks
    (a private fork's copied pages are there before QEMU maps any of them, so
    its PSS alone would not show them) plus the PSS of everything else its
    shim and QEMU map. A fork that shares its checkpoint's RAM has no RAM
    file, and that checkpoint's file is left out here: `_forks` counts it
    once, whole, for all of them."""
    import psutil

    state = json.loads((root / cid / "state.json").read_text())
    ram = state["vm"]["config"]["ram_file"]
    total = os.stat(ram).st_blocks * 512 if not state["vm"].get("shares_memory_of") else 0
    for pid in common.process_tree(state["shim_pid"]):
        try:
            total += sum(m.pss for m in psutil.Process(pid).memory_maps(grouped=True)
                         if m.path != ram and os.path.basename(m.path) != FORK_RAM)
        except psutil.Error:
            pass
    return total


def _forks(box: Box, rounds: int) -> dict[str, Any]:
    """Forks of the first checkpoint: one at a time through the CLI; then ten
    at once through the SDK, sharing the checkpoint's memory and with
    a private copy each, rounds interleaved, and ten shared through the CLI;
    the host memory of the ten (`host_bytes`) against the parent's."""
    one = []
    for r in range(max(2, rounds // 3)):
        common.progress("snapshot", f"{box.cid}: fork 1, round {r + 1}")
        one.append(box.cli_time("fork", "--count", "1", "--id-prefix", f"{box.cid}-one{r}-",
                                box.cid, "base") * 1e3)
        box.delete(f"{box.cid}-one{r}-1")
    ten: dict[str, list[float]] = {mode: [] for mode in FORK_MODES}
    memory: dict[str, float] = {}
    parent = host_bytes(box.root, box.cid)
    for r in range(FORK_ROUNDS):
        for mode in FORK_MODES:
            common.progress("snapshot", f"{box.cid}: 10 forks at once, memory {mode}, "
                            f"round {r + 1}/{FORK_ROUNDS}")
            ids, took = box.fork_api(10, f"{box.cid}-{mode}{r}-", mode == "private")
            try:
                ten[mode].append(took * 1e3)
                if mode not in memory:
                    time.sleep(2)  # let each fork's Pager settle what the restore left
                    memory[mode] = sum(host_bytes(box.root, fid) for fid in ids)
                    shared = box.root / box.cid / "checkpoints" / "base" / FORK_RAM
                    if mode == "shared" and shared.exists():  # the RAM they map: once, whole
                        memory[mode] += min(shared.stat().st_blocks * 512, shared.stat().st_size)
            finally:
                for fid in ids:
                    box.delete(fid)
    common.progress("snapshot", f"{box.cid}: 10 forks at once through the CLI")
    cli_ten = box.cli_time("fork", "--count", "10", "--id-prefix", f"{box.cid}-cli-", box.cid,
                           "base") * 1e3
    for i in range(1, 11):
        box.delete(f"{box.cid}-cli-{i}")
    return {"fork_1_ms": common.median_p95(one), "fork_10_cli_ms": cli_ten,
            **{f"fork_10_{mode}_api_ms": common.median_p95(ten[mode]) for mode in FORK_MODES},
            "parent_host_mib": parent / 2**20,
            **{f"forks_10_{mode}_host_mib": memory[mode] / 2**20 for mode in FORK_MODES},
            **{f"forks_10_{mode}_vs_one": memory[mode] / parent for mode in FORK_MODES}}


def goals(results: dict[int, dict[str, Any]]) -> list[tuple[str, bool | None]]:
    """Each goal and whether it is met; None where the run did not measure it
    (its sizes left out 64 MiB)."""
    mid = results.get(64)
    checks = [
        ("checkpoint <= 50 ms (pause to resume), 64 MiB touched, 4 MiB changed",
         lambda m: m["checkpoint_paused_ms"]["median"] <= 50),
        ("rollback <= 100 ms (request to running, SDK), 64 MiB touched",
         lambda m: m["rollback_api_ms"]["median"] <= 100),
        ("checkpoint <= 20 ms (p50, SDK), 64 MiB touched, 4 MiB changed",
         lambda m: m["checkpoint_api_ms"]["median"] <= 20),
        ("rollback <= 15 ms (p50, SDK), 64 MiB touched",
         lambda m: m["rollback_api_ms"]["median"] <= 15),
        ("10 forks all running within 1 s (p50, SDK), 64 MiB touched",
         lambda m: m["fork_10_shared_api_ms"]["median"] <= 1000),
        ("10 forks < 3x the host memory of their parent, 64 MiB touched",
         lambda m: m["forks_10_shared_vs_one"] < 3),
    ]
    return [(name, None if mid is None else bool(met(mid))) for name, met in checks]


def run(ctx: Context, rounds: int, output: str, sizes: tuple[int, ...] = SIZES_MIB) -> str:
    base = Path(tempfile.mkdtemp(prefix="paracell-snapbench-"))
    env = dict(os.environ, PARACELL_GUEST_MEMORY_MIB=str(GUEST_MIB),
               PARACELL_TEMPLATES=str(base / "templates"))
    results: dict[int, dict[str, Any]] = {}
    with common.sigterm_as_interrupt():
        for mib in sizes:
            common.progress("snapshot", f"{mib} MiB touched: starting its sandbox")
            results[mib] = _one_size(base, env, mib, rounds)
    checked = goals(results)
    png = _plot(results, Path(output).with_suffix(".png"))
    common.write_result(output, {
        "benchmark": "snapshot", "guest_mib": GUEST_MIB, "rounds": rounds,
        "results": {str(k): v for k, v in results.items()}, "anchors": ANCHORS,
        "goals": {name: met for name, met in checked}, "plot": str(png)})
    lines = [f"{'touched':>8} {'ckpt ms':>8} {'p95':>6} {'api ms':>7} {'cli ms':>7} "
             f"{'MiB':>6} {'full save':>9} {'ratio':>6} {'rollback':>9} {'p95':>6} "
             f"{'api ms':>7} {'cli ms':>7}"]
    for mib, x in results.items():
        lines.append(
            f"{mib:>6}Mi {x['checkpoint_paused_ms']['median']:8.1f} "
            f"{x['checkpoint_paused_ms']['p95']:6.1f} {x['checkpoint_api_ms']['median']:7.1f} "
            f"{x['checkpoint_cli_ms']['median']:7.1f} "
            f"{x['checkpoint_bytes']['median'] / 2**20:6.2f} "
            f"{x['baseline_full_save_ms']['median']:9.1f} {x['checkpoint_vs_full_save']:6.3f} "
            f"{x['rollback_paused_ms']['median']:9.1f} {x['rollback_paused_ms']['p95']:6.1f} "
            f"{x['rollback_api_ms']['median']:7.1f} {x['rollback_cli_ms']['median']:7.1f}")
    lines.append(f"{'touched':>8} {'fork 1 cli':>10} {'10 shared':>9} {'cli':>6} "
                 f"{'10 private':>10} {'parent MiB':>10} {'shared MiB':>10} {'ratio':>6} "
                 f"{'private MiB':>11} {'ratio':>6}")
    for mib, x in results.items():
        lines.append(f"{mib:>6}Mi {x['fork_1_ms']['median']:10.0f} "
                     f"{x['fork_10_shared_api_ms']['median']:9.0f} {x['fork_10_cli_ms']:6.0f} "
                     f"{x['fork_10_private_api_ms']['median']:10.0f} "
                     f"{x['parent_host_mib']:10.1f} {x['forks_10_shared_host_mib']:10.1f} "
                     f"{x['forks_10_shared_vs_one']:6.2f} {x['forks_10_private_host_mib']:11.1f} "
                     f"{x['forks_10_private_vs_one']:6.2f}")
    for name, met in checked:
        said = "not measured (64 MiB is not among --sizes)" if met is None else \
            "met" if met else "NOT met"
        lines.append(f"goal {said}: {name}")
    lines.append(f"wrote {output} and {png}")
    return "\n".join(lines)


def _plot(results: dict[int, dict[str, Any]], output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from paracell.bench.plot import save_figure

    sizes = list(results)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.25
    xs = range(len(sizes))
    for k, (key, label) in enumerate((("checkpoint_paused_ms", "checkpoint (pause to resume)"),
                                      ("rollback_api_ms", "rollback (request to running)"),
                                      ("baseline_full_save_ms", "whole-VM save (baseline)"))):
        ax.bar([x + (k - 1) * width for x in xs], [results[s][key]["median"] for s in sizes],
               width, label=label)
    ax.axhline(14, color="gray", ls=":", lw=1)
    ax.text(len(sizes) - 0.5, 15, "DeltaBox checkpoint 14 ms", fontsize=7, ha="right")
    ax.axhline(90, color="gray", ls="--", lw=1)
    ax.text(len(sizes) - 0.5, 92, "CubeSandbox rollback ~90 ms", fontsize=7, ha="right")
    ax.set_xticks(list(xs), [f"{s} MiB touched" for s in sizes])
    ax.set_yscale("log")
    ax.set_ylabel("ms (median, log scale)")
    ax.set_title(f"Snapshot-mode sandbox under TCG: {CHANGE_MIB} MiB changed per round")
    ax.legend(fontsize=8)
    return save_figure(fig, output)
