"""`paracell bench start`: start-to-exit of /bin/true in a micro-VM, against a
raw QEMU boot of the same kernel and initramfs and against runc, interleaved in
one run so that machine noise hits every variant alike."""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from paracell.bench import common, plot
from paracell.guest import artifacts
from paracell.runtime.context import Context
from paracell.vmm import backends, devices, hostclock, probe
from paracell.vmm.builder import Machine, VmBuilder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.vmm.hypervisor import Backend

GOAL_MEDIAN_S = 1.0
GOAL_RATIO = 1.2
# From a template (issue 17): the median, and against the same VM booted cold.
GOAL_TEMPLATE_MEDIAN_S = 0.30
GOAL_TEMPLATE_RATIO = 0.4
# The libvirt backend (issue 16): what it may add to a cold start under TCG.
GOAL_LIBVIRT_ADDED_S = 0.3
# From the warm pool (issue 30, docs/pool.md): create to exit, through the CLI.
GOAL_POOL_MEDIAN_S = 0.30
POOL_WAIT_S = 120.0
POOLED_LINE = "from the pool"


def _raw_boot(engine: str, qemu_path: str, workdir: Path, kernel: Path | None = None) -> float:
    """The same VM with the agent told to power off as soon as it is up;
    `kernel`, when given, in place of the built one."""
    guest = artifacts.current()
    vm = VmBuilder(Machine(qemu=qemu_path, engine=engine, kernel=kernel or guest.kernel,
                           initramfs=guest.initramfs, memory_mib=256, vcpus=1,
                           kernel_args=("paracell.exit_on_boot=1",),
                           tsc_khz=hostclock.tsc_khz() if engine == "tcg" else 0))
    # In a directory of its own: the RAM directory's lock file sits beside
    # that directory, so inside workdir it goes with it.
    vm.attach(devices.GuestRam(workdir / "ram" / "raw.mem", 256))
    vm.attach(devices.SerialConsole(workdir / "console.log"))
    vm.attach(devices.DebugExit())
    vm.attach(devices.AgentPort())
    vm.attach(devices.rootfs_share(workdir, readonly=True))
    backends.select(backends.DEFAULT).attach_control(vm, workdir, workdir / "ram" / "raw.mem")

    def boot() -> None:
        booted = vm.launch(workdir / "qemu.log")
        booted.stop(120)
        booted.release()

    return common.time_call(boot)


class PoolForRun:
    """`paracell pool serve` on a root of the run's own, so that only the
    pool's series takes its VMs; ended with the run."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv, self.env = argv, env
        self.proc = subprocess.Popen([*argv, "pool", "serve", "--size", "1"], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

    def wait_for_a_vm(self) -> None:
        import json
        import time

        deadline = time.monotonic() + POOL_WAIT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"paracell pool serve exited with {self.proc.returncode}")
            found = subprocess.run([*self.argv, "pool", "status", "--format", "json"],
                                   capture_output=True, env=self.env)
            vms = json.loads(found.stdout or b"{}").get("vms", [])
            if any(vm.get("state") == "waiting" for vm in vms):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the pool had no VM waiting within {POOL_WAIT_S:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=120)


def run(ctx: Context, runs: int, output: str, baseline_kernel: Path | None = None,
        also: Backend | None = None) -> str:
    """baseline_kernel: another kernel (say, one built before a config change)
    booted raw in the same rounds, in alternating order, with the same initramfs.
    also: a backend under which every round's container starts too
    (paracell_NAME: libvirt's at its URI), next to the default's (paracell),
    both cold."""
    facts = probe.probe_host()
    choice = probe.choose_engine(ctx.engine, facts)
    bundle = common.example_bundle("true", ["/bin/true"])
    paracell = common.paracell_executable()
    root = common.state_root()
    runc = common.oci_runtime("runc")
    # paracell runs with its default memory manager, the Pager, whose PCIe bus
    # and ACPI cost boot time; paracell_none shows that cost in the same run.
    # Both boot cold; paracell_template and paracell_none_template are the
    # same two VMs restored from their templates (docs/templates.md).
    # paracell_pool: the same VM as paracell_template, waiting in the warm
    # pool; cli_startup: what the `paracell` process itself takes to start
    # (`list` on an empty root), which every series includes.
    samples: dict[str, list[float]] = {"paracell": [], "paracell_template": [],
                                       "paracell_pool": [], "cli_startup": [],
                                       "paracell_none": [], "paracell_none_template": [],
                                       "raw_qemu": []}
    pooled = 0
    if runc:
        samples["runc"] = []
    if baseline_kernel:
        samples["raw_qemu_baseline"] = []
    other = f"paracell_{also.name}" if also else ""
    if also:
        also.check(facts.qemu_path or "", choice.engine)  # one line now, not a traceback mid-run
        samples[other] = []
    with tempfile.TemporaryDirectory(prefix="paracell-bench-") as tmp:
        # A template store of the run's own, built before the first round.
        templated = dict(os.environ, PARACELL_TEMPLATES=f"{tmp}/templates")
        pager = [paracell, "--root", root, "--engine", choice.engine]
        none = [*pager, "--memory-manager", "none"]
        for argv in (pager, none):
            common.run_checked([*argv, "template", "build", "--for", str(bundle)], env=templated)
        pool_argv = [paracell, "--root", f"{root}-pool", "--engine", choice.engine]
        pool = PoolForRun(pool_argv, templated)
        try:
            for i in range(runs):
                cid = f"bench-start-{os.getpid()}-{i}"
                common.progress("start", f"round {i + 1}/{runs}")
                series: list[tuple[str, list[str]]] = [("paracell", [])]
                if also:
                    where = ["--libvirt-uri", also.location] if also.location else []
                    series.append((other, ["--vmm", also.name, *where]))
                # Alternating first: neither backend always meets a warm or a cold host.
                for name, flags in series[::-1] if i % 2 else series:
                    samples[name].append(common.time_call(
                        lambda cid=cid, flags=flags: common.run_checked(
                            [*pager, *flags, "--no-template", "run", "--bundle", str(bundle), cid],
                            stdin=subprocess.DEVNULL)))
                for name, argv in (("paracell_template", pager), ("paracell_none_template", none)):
                    samples[name].append(common.time_call(
                        lambda cid=cid, argv=argv: common.run_checked(
                            [*argv, "run", "--bundle", str(bundle), cid], stdin=subprocess.DEVNULL,
                            env=templated)))
                samples["paracell_none"].append(common.time_call(lambda cid=cid: common.run_checked(
                    [*none, "--no-template", "run", "--bundle", str(bundle), cid],
                    stdin=subprocess.DEVNULL)))
                kernels: list[tuple[str, Path | None]] = [("raw_qemu", None)]
                if baseline_kernel:
                    kernels.append(("raw_qemu_baseline", baseline_kernel))
                for name, kernel in kernels[::-1] if i % 2 else kernels:
                    samples[name].append(_raw_boot(choice.engine, facts.qemu_path or "", Path(tmp),
                                                   kernel))
                if runc:
                    samples["runc"].append(common.time_call(lambda cid=cid: common.run_checked(
                        [runc, "--root", f"{tmp}/runc", "run", "--bundle", str(bundle), cid],
                        stdin=subprocess.DEVNULL)))
                # The warm pool's VM: it has had the rest of the round to be made.
                pool.wait_for_a_vm()
                log = Path(tmp) / f"{cid}.pool.log"
                samples["paracell_pool"].append(common.time_call(
                    lambda cid=cid, log=log: common.run_checked(
                        [*pool_argv, "--debug", "--log", str(log), "run", "--bundle",
                         str(bundle), cid], stdin=subprocess.DEVNULL, env=templated)))
                pooled += POOLED_LINE in log.read_text()
                samples["cli_startup"].append(common.time_call(lambda: common.run_checked(
                    [paracell, "--root", f"{tmp}/empty", "list"])))
        finally:
            pool.stop()
    stats = {name: common.summarize(values) for name, values in samples.items()}
    ratio = stats["paracell"]["median_s"] / stats["raw_qemu"]["median_s"]
    template_s = stats["paracell_template"]["median_s"]
    template_ratio = template_s / stats["paracell"]["median_s"]
    result: dict[str, Any] = {
        "benchmark": "start-to-exit of /bin/true",
        "engine": choice.engine,
        "results": stats,
        "ratio_paracell_to_raw_qemu": ratio,
        "goal": {"median_s": GOAL_MEDIAN_S, "ratio_to_raw_qemu": GOAL_RATIO,
                 "met": stats["paracell"]["median_s"] <= GOAL_MEDIAN_S and ratio <= GOAL_RATIO},
        "ratio_template_to_cold": template_ratio,
        "template_goal": {"median_s": GOAL_TEMPLATE_MEDIAN_S,
                          "ratio_to_cold": GOAL_TEMPLATE_RATIO,
                          "median_met": template_s <= GOAL_TEMPLATE_MEDIAN_S,
                          "ratio_met": template_ratio <= GOAL_TEMPLATE_RATIO},
    }
    pool_s = stats["paracell_pool"]["median_s"]
    result["pool"] = {"median_s": pool_s, "served_by_the_pool": pooled, "runs": runs,
                      "cli_startup_median_s": stats["cli_startup"]["median_s"],
                      "ratio_to_template": pool_s / template_s}
    result["goals"] = [
        {"goal": f"cold: median <= {GOAL_MEDIAN_S:.2f} s and <= {GOAL_RATIO:.1f}x a raw "
                 "QEMU boot", "met": result["goal"]["met"]},
        {"goal": f"from the warm pool: median <= {GOAL_POOL_MEDIAN_S:.2f} s, CLI included, "
                 "every run served by the pool",
         "met": pool_s <= GOAL_POOL_MEDIAN_S and pooled == runs},
        {"goal": f"from a template: <= {GOAL_TEMPLATE_RATIO:.1f}x cold",
         "met": result["template_goal"]["ratio_met"]},
    ]
    if runc:
        result["ratio_paracell_to_runc"] = stats["paracell"]["median_s"] / stats["runc"]["median_s"]
    if also:
        added = statistics.median(lv - direct for lv, direct in
                                  zip(samples[other], samples["paracell"], strict=True))
        result[also.name] = {
            "uri": also.location, "added_median_s": added,
            "ratio_to_direct": stats[other]["median_s"] / stats["paracell"]["median_s"],
            "goal_added_s": GOAL_LIBVIRT_ADDED_S, "met": added <= GOAL_LIBVIRT_ADDED_S}
    if baseline_kernel:
        # Paired by round: both boots of a round saw the same machine noise.
        diffs = [new - old for new, old in
                 zip(samples["raw_qemu"], samples["raw_qemu_baseline"], strict=True)]
        result["baseline_kernel"] = str(baseline_kernel)
        result["raw_qemu_minus_baseline_median_ms"] = statistics.median(diffs) * 1000
    path = common.write_result(output, result)
    plot.bar_chart(stats, f"start to exit of /bin/true ({choice.engine})", 1000, "ms",
                   path.with_suffix(".png"))
    line = (f"paracell run /bin/true ({choice.engine}): median "
            f"{stats['paracell']['median_s']:.3f} s (Pager), "
            f"{stats['paracell_none']['median_s']:.3f} s (--memory-manager none), "
            f"{template_s:.3f} s (Pager, from a template: {template_ratio:.2f}x cold; goals "
            f"<= {GOAL_TEMPLATE_MEDIAN_S:.2f} s "
            f"{'met' if result['template_goal']['median_met'] else 'not met'}, "
            f"<= {GOAL_TEMPLATE_RATIO:.1f}x "
            f"{'met' if result['template_goal']['ratio_met'] else 'not met'}), "
            f"{stats['paracell_none_template']['median_s']:.3f} s (none, from a template); "
            f"{pool_s:.3f} s from the warm pool ({pooled}/{runs} served by it; goal <= "
            f"{GOAL_POOL_MEDIAN_S:.2f} s {'met' if result['goals'][1]['met'] else 'not met'}), "
            f"of which the CLI's own start-up {stats['cli_startup']['median_s']:.3f} s; "
            f"raw QEMU boot "
            f"{stats['raw_qemu']['median_s']:.3f} s ({ratio:.2f}x)")
    if runc:
        line += f"; runc {stats['runc']['median_s']:.3f} s"
    if also:
        lv = result[also.name]
        line += (f"; {also.name} {stats[other]['median_s']:.3f} s "
                 f"({lv['ratio_to_direct']:.2f}x direct, adds {lv['added_median_s']:+.3f} s, "
                 f"median of the rounds' differences; goal <= {GOAL_LIBVIRT_ADDED_S:.1f} s "
                 f"{'met' if lv['met'] else 'not met'})")
    if baseline_kernel:
        line += (f"; baseline kernel's raw boot {stats['raw_qemu_baseline']['median_s']:.3f} s "
                 f"(this kernel {result['raw_qemu_minus_baseline_median_ms']:+.1f} ms, "
                 "median of the rounds' differences)")
    return f"{line}; goal {'met' if result['goal']['met'] else 'not met'} -> {path}"
