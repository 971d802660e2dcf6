"""`paracell bench agent` (paracell/bench/agent.py) with real VMs: its
workload's own checks catch a sandbox that is not where the search left it,
and a small tree leaves figures for every method that can run here, the
reason for the one that cannot, and nothing running. The figures themselves
are not checked: benchmarks are not timed tests."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import psutil
import pytest

from paracell.bench import agent
from tests.conftest import PARACELL

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (agent.stdlib_dir() / "test" / "test_json").is_dir(),
                       reason="Debian's libpython3.11-testsuite is not installed"),
]
STATE_LINE = re.compile(r"state under (\S+)")


def test_the_tree_order_is_depth_first():
    names = [n.name for n in agent.tree(2, 2)]
    assert names == ["n0", "n0-0", "n0-1", "n1", "n1-0", "n1-1"]
    assert agent.Node((1, 0)).parent.name == "n1" and agent.Node((1,)).parent.name == "root"


def test_a_node_refuses_a_sandbox_not_at_its_parent_and_runs_after_a_rollback(
        runtime, monkeypatch, tmp_path):
    for key in ("PARACELL_ENGINE", "PARACELL_MEMORY_DIR", "PARACELL_TEMPLATES",
                "PARACELL_ROOTDISKS", "PARACELL_CACHE", "PARACELL_VMM"):
        if key in runtime.env:
            monkeypatch.setenv(key, runtime.env[key])
    monkeypatch.setenv("PARACELL_GUEST_MEMORY_MIB", str(agent.GUEST_MIB))
    method = agent.ParacellCheckpoints(runtime.root, agent.bundle(tmp_path, 8), "agent-check")
    try:
        method.start()
        method.checkpoint(agent.Node(()))
        code, out = method.run(agent.node_script(agent.Node((0,))))
        assert code == 0 and out.strip().endswith("OK"), out
        # Its sibling starts from the root: the files are n0's, and so is the memory.
        code, out = method.run(agent.node_script(agent.Node((1,))))
        assert code == 4 and "NODE is n0, not root" in out, out
        code, out = method.run("cd /project && echo root > NODE")
        code, out = method.run(agent.node_script(agent.Node((1,))))
        assert code == 5 and "generation 1, not 0" in out, out
        method.rollback(agent.Node(()))
        code, out = method.run(agent.node_script(agent.Node((1,))))
        assert code == 0 and out.strip().endswith("OK"), out
        code, out = method.run("ls /project; grep -c NODE_ /project/json/__init__.py")
        assert "data-n1.bin" in out and "data-n0.bin" not in out and out.split()[-1] == "1", out
    finally:
        method.close()
    assert runtime.qemu_processes() == []


def test_a_small_tree_gives_every_method_that_runs_its_figures_and_leaves_nothing(
        runtime, tmp_path):
    out = tmp_path / "agent.json"
    done = subprocess.run([PARACELL, "bench", "agent", "--branching", "2", "--depth", "1",
                           "-o", str(out)], env=runtime.env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    methods = result["methods"]
    assert set(methods) == set(agent.METHODS)
    ran = [name for name, m in methods.items() if m["ran"]]
    assert {"paracell", "whole-vm"} <= set(ran)
    for name in ran:
        m = methods[name]
        assert m["ran"] and m["nodes"] == 2 and m["nodes_per_minute"] > 0, m
        # n1 started from a rollback to the root; both nodes checkpointed.
        assert m["rollback_ms"]["n"] == 1 and m["checkpoint_ms"]["n"] == 2, m
        assert m["host_mib"] > 0 and m["saved_mib"] > 0, m
    criu = methods["runc+criu"]
    assert criu["ran"] or criu["why_not"], criu
    if not criu["ran"]:
        assert f"not run: {criu['why_not']}" in done.stdout
    assert len(result["goals"]) == 1
    assert all(isinstance(met, bool) for met in result["goals"].values())
    assert len([line for line in done.stdout.splitlines() if line.startswith("goal ")]) == 1
    assert set(result["paracell_against"]) == set(ran) - {"paracell"}
    for against in result["paracell_against"].values():
        assert set(against) == {"checkpoint_speedup", "rollback_speedup", "nodes_per_minute",
                                "saving_per_node_speedup", "saved_bytes"}
    assert Path(result["plot"]).is_file()
    state = STATE_LINE.search(done.stderr)
    assert state, done.stderr
    assert not Path(state.group(1)).exists(), "the bench's state was left behind"
    assert runtime.qemu_processes() == [], "a QEMU process was left running"
    # runc's container: its processes, its overlay root.
    workloads = [p.pid for p in psutil.process_iter(["cmdline"])
                 if agent.WORKLOAD.name in " ".join(p.info["cmdline"] or [])]
    assert workloads == [], "a container's process was left running"
    with open("/proc/self/mountinfo") as f:
        assert state.group(1) not in f.read(), "a mount of the bench was left behind"
