"""`paracell bench density`'s plumbing, with real VMs and Debian's runc: what
it writes, and that nothing it started is left running, after a full run
and after an interrupt. The figures themselves are not checked: benchmarks
are not timed tests."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import psutil
import pytest

from tests.conftest import PARACELL

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed"),
]
STATE_LINE = re.compile(r"state under (\S+)")


def _bench(out: Path, *args: str) -> list[str]:
    return [PARACELL, "bench", "density", "--rounds", "1", "-o", str(out), *args]


def _state_dir(stderr: str) -> Path:
    match = STATE_LINE.search(stderr)
    assert match, stderr
    return Path(match.group(1))


def _assert_nothing_left(runtime, state: Path, pids: list[int]) -> None:
    assert runtime.qemu_processes() == [], "a QEMU process was left running"
    assert not state.exists(), f"state left behind in {state}"
    alive = [pid for pid in pids if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"processes of the sandboxes still running: {alive}"


def test_two_sandboxes_per_runtime_give_both_runtimes_figures_and_leave_nothing(
        runtime, tmp_path):
    out = tmp_path / "density.json"
    done = subprocess.run(_bench(out, "--count", "2", "--window", "1", "--curve", "2"),
                          env=runtime.env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert set(result["results"]) == {"paracell", "paracell_template",
                                      "paracell_template_copied", "runc"}
    # The copy-on-write round also measured its sandboxes after their first
    # command and after each wrote its own; the write is judged alone.
    templated = result["results"]["paracell_template"]
    for key in ("first_pss_mib", "written_pss_mib", "idle_own_ram_mib", "written_own_ram_mib"):
        assert len(templated["rounds"][0][key]) == 2, key
    assert "first_command_growth_mib" in templated and "growth_mib_per_writer" in templated
    assert [p["count"] for p in result["curve"]] == [1, 2]
    assert result["count"] == 2 and result["memory_manager"] in ("pager", "balloon", "none")
    pids = []
    for name, figures in result["results"].items():
        (only_round,) = figures["rounds"]
        for key in ("start_s", "cpu_pct", "pss_mib", "wakeups_per_s", "pids"):
            assert len(only_round[key]) == 2, (name, key)
        assert all(value >= 0 for value in only_round["cpu_pct"] + only_round["wakeups_per_s"])
        assert all(value > 0 for value in only_round["start_s"] + only_round["pss_mib"])
        # ParaCell's sandbox is its shim and QEMU at least; runc's is the container's process.
        assert all(len(tree) >= (1 if name == "runc" else 2) for tree in only_round["pids"])
        pids += [pid for tree in only_round["pids"] for pid in tree]
    for goal in result["goals"]:  # idle CPU, a restored sandbox's memory, and a writer's
        assert isinstance(goal["met"], bool)
        assert f"{goal['goal']}: {'met' if goal['met'] else 'NOT met'}" in done.stdout
    assert len(result["goals"]) == 3
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    _assert_nothing_left(runtime, _state_dir(done.stderr), pids)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_mid_run_removes_every_sandbox_it_started(runtime, tmp_path, sig):
    out = tmp_path / "density.json"
    proc = subprocess.Popen(_bench(out, "--count", "3", "--window", "60"), env=runtime.env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines: list[str] = []
    first_up = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "paracell: 1/3 up" in line:
                first_up.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert first_up.wait(180), "".join(lines)
        # Mid-run: one sandbox up, the second one starting.
        proc.send_signal(sig)
        assert proc.wait(120) != 0
    finally:
        proc.kill()
        proc.wait()
    reader.join(10)
    assert not out.exists()
    _assert_nothing_left(runtime, _state_dir("".join(lines)), [])
