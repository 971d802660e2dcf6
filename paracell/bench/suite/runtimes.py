"""The runtimes the suite sets side by side, and how each is invoked."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Runtime:
    name: str
    label: str
    vm: bool
    memory_manager: str | None = None
    xgates: bool = False
    # Pager knobs (runtime/vm/memorymanager.py), as a bundle's annotations.
    pager_knobs: tuple[tuple[str, str], ...] = ()
    by_default: bool = True  # run without --runtimes; else only when named


RUNTIMES: dict[str, Runtime] = {r.name: r for r in (
    Runtime("runc", "runc (no VM)", vm=False),
    Runtime("none", "ParaCell, no memory manager (RunV's model)", vm=True, memory_manager="none"),
    Runtime("pager", "ParaCell + Pager (default)", vm=True, memory_manager="pager"),
    Runtime("balloon", "ParaCell + balloon, free page reporting", vm=True,
            memory_manager="balloon"),
    Runtime("xgates", "ParaCell + Pager + XGates", vm=True, memory_manager="pager", xgates=True),
    # What a server's cost under the Pager is made of (docs/pager.md,
    # "Servers"): the Pager as it was before blocks waited to be reported
    # (every block at once, backing off under churn), as it was before it
    # backed off, with the back-off on as well as the wait, binding the whole
    # of a reported block an allocation takes from, binding ahead of every
    # late bind rather than of a burst's pace, with only blocks under a
    # pageblock waiting (whole pageblocks at once), with freed pages always
    # reported after 1 s instead of 10 ms, and after 60 s: nothing during a
    # load, which leaves the device and the guest's hooks alone.
    Runtime("pager_before", "ParaCell + Pager, the defaults until 2026-12-03 22:00: every block "
            "at once, bound whole, backing off under churn",
            vm=True, memory_manager="pager",
            pager_knobs=(("io.paracell.pager.min-free-age-ms", "0"),
                         ("io.paracell.pager.churn-max-delay-ms", "1000"),
                         ("io.paracell.pager.split-bind-kb", "0")), by_default=False),
    Runtime("pager_no_backoff", "ParaCell + Pager, every block at once, bound whole, no back-off",
            vm=True, memory_manager="pager",
            pager_knobs=(("io.paracell.pager.min-free-age-ms", "0"),
                         ("io.paracell.pager.churn-max-delay-ms", "0"),
                         ("io.paracell.pager.split-bind-kb", "0")), by_default=False),
    Runtime("pager_backoff", "ParaCell + Pager, backing off under churn too", vm=True,
            memory_manager="pager",
            pager_knobs=(("io.paracell.pager.churn-max-delay-ms", "1000"),), by_default=False),
    Runtime("pager_whole_binds", "ParaCell + Pager, an allocation from a reported block binds "
            "all of it", vm=True, memory_manager="pager",
            pager_knobs=(("io.paracell.pager.split-bind-kb", "0"),), by_default=False),
    Runtime("pager_eager_window", "ParaCell + Pager, any late bind opens the bind-ahead window",
            vm=True, memory_manager="pager",
            pager_knobs=(("io.paracell.pager.burst-late-kb", "0"),), by_default=False),
    Runtime("pager_small_aged", "ParaCell + Pager, only blocks under a pageblock wait",
            vm=True, memory_manager="pager",
            pager_knobs=(("io.paracell.pager.min-free-age-batch-kb", "0"),), by_default=False),
    Runtime("pager_idle", "ParaCell + Pager, reporting after 60 s: its device and hooks, no "
            "traffic", vm=True, memory_manager="pager",
            pager_knobs=(("io.paracell.pager.delay-ms", "60000"),), by_default=False),
    Runtime("pager_lazy", "ParaCell + Pager, reporting after 1 s", vm=True,
            memory_manager="pager", pager_knobs=(("io.paracell.pager.delay-ms", "1000"),),
            by_default=False),
)}
XGATES_ANNOTATION = "io.paracell.xgates"


class Invoker:
    """Each runtime's argv up to the verb, with a state root of the suite's own."""

    def __init__(self, base: Path, paracell: str, runc: str | None, engine: str):
        self.base = base
        self.paracell = paracell
        self.runc = runc
        self.engine = engine

    def argv(self, runtime: Runtime) -> list[str]:
        if not runtime.vm:
            if self.runc is None:
                raise RuntimeError("runc is not installed")
            return [self.runc, "--root", str(self.base / "runc")]
        # Cold boots for every memory manager: a template (docs/templates.md)
        # restores the Pager and none copy-on-write but the balloon copied,
        # and the suite compares the memory managers, not the start paths
        # (`paracell bench start` does).
        return [self.paracell, "--root", str(self.base / "paracell"), "--engine", self.engine,
                "--memory-manager", str(runtime.memory_manager), "--no-template"]

    def kill(self, runtime: Runtime, cid: str) -> None:
        subprocess.run([*self.argv(runtime), "kill", cid, "KILL"], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60)

    def delete(self, runtime: Runtime, cid: str) -> None:
        subprocess.run([*self.argv(runtime), "delete", "--force", cid],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=120)

    def listed(self) -> dict[str, list[str]]:
        """Containers still listed under the suite's roots, per runtime family."""
        out = {}
        for family, runtime in (("paracell", RUNTIMES["pager"]), ("runc", RUNTIMES["runc"])):
            if family == "runc" and self.runc is None:
                continue
            res = subprocess.run([*self.argv(runtime), "list", "--quiet"],
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 timeout=60)
            out[family] = res.stdout.split()
        return out
