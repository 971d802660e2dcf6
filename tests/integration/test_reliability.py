"""Faults a hostile operator or a busy host produce: creates killed at any
moment, 255-byte IDs, runtime notices that must stay out of the container's
stdio, and --debug's log, on real micro-VMs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.conftest import PARACELL

pytestmark = pytest.mark.integration


def _settles_clean(runtime, cid):
    """Whatever a killed create left, the ID ends usable and nothing leaks."""
    state = runtime("state", cid)
    if state.returncode == 0:
        assert json.loads(state.stdout)["status"] in ("created", "stopped")
    assert runtime("delete", "--force", cid).returncode == 0
    runtime.assert_no_leaks()


@pytest.mark.parametrize("delay_s", [0.0, 0.05, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5])
def test_create_killed_at_any_moment_leaves_nothing_behind(runtime, make_bundle, delay_s):
    bundle = make_bundle(["sleep", "30"])
    proc = subprocess.Popen(
        [PARACELL, "--root", str(runtime.root), "create", "--bundle", str(bundle), "k"],
        env=runtime.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(delay_s)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # A shim whose create died before committing it shuts its VM down by itself.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        state = runtime("state", "k")
        live = state.returncode == 0 and json.loads(state.stdout)["status"] == "created"
        if live or not runtime.qemu_processes():
            break
        time.sleep(0.1)
    else:
        raise AssertionError("a VM outlived its killed create without being recorded")
    _settles_clean(runtime, "k")
    again = runtime("run", "--bundle", str(make_bundle(["true"])), "k")
    assert again.returncode == 0, again.stderr
    runtime.assert_no_leaks()


def test_ids_of_255_bytes_work(runtime, make_bundle):
    cid = "i" * 255
    result = runtime("create", "--bundle", str(make_bundle(["sleep", "30"])), cid)
    assert result.returncode == 0, result.stderr
    assert json.loads(runtime("state", cid, check=True).stdout)["status"] == "created"
    assert runtime("delete", "--force", cid).returncode == 0
    runtime.assert_no_leaks()


def test_runtime_notices_stay_out_of_the_containers_stderr(runtime, make_bundle, tmp_path):
    """containerd gives the sandbox a read-only /dev/null as stderr; the notice
    goes to --log and the container's stderr holds only its own output."""
    log = tmp_path / "log.json"
    bundle = make_bundle(["sh", "-c", "echo own-output >&2"])
    env = dict(runtime.env, PARACELL_ENGINE="auto")
    with open(os.devnull) as ro_null:
        created = subprocess.run(
            [PARACELL, "--root", str(runtime.root), "--log", str(log), "--log-format", "json",
             "create", "--bundle", str(bundle), "quiet"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=ro_null,
            timeout=120,
        )
    assert created.returncode == 0
    assert runtime("delete", "--force", "quiet").returncode == 0
    err = tmp_path / "err"
    with open(err, "wb") as sink:
        run = subprocess.run(
            [PARACELL, "--root", str(runtime.root), "--log", str(log), "run", "--bundle",
             str(bundle), "quiet2"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink,
            timeout=120,
        )
    assert run.returncode == 0
    assert err.read_bytes() == b"own-output\n"
    runtime.assert_no_leaks()


def test_debug_logs_the_vm_command_line_and_boot_timeline(runtime, make_bundle, tmp_path):
    log = tmp_path / "debug.log"
    result = runtime("--debug", "--log", str(log), "--log-format", "json", "run", "--bundle",
                     str(make_bundle(["true"])), "dbg")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    messages = [entry["msg"] for entry in lines if entry["level"] == "debug"]
    assert any(m.startswith("shim: qemu: ") and "-M microvm" in m for m in messages)
    for step in ("qemu started", "agent ready", "container process created", "relay ended"):
        assert any(step in m for m in messages), f"no {step!r} in the debug log"
    runtime.assert_no_leaks()


def test_delete_during_create_says_not_stopped(runtime, make_bundle):
    """Not 'does not exist', and not a wait for the whole boot."""
    proc = subprocess.Popen(
        [PARACELL, "--root", str(runtime.root), "create", "--bundle",
         str(make_bundle(["sleep", "30"])), "c"],
        env=runtime.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        state = runtime("state", "c")
        if state.returncode == 0 and json.loads(state.stdout)["status"] == "creating":
            break
        time.sleep(0.01)
    else:
        raise AssertionError("never saw the container in creating")
    result = runtime("delete", "c")
    assert result.returncode == 1
    assert result.stderr.decode().strip().endswith(
        "cannot delete container c that is not stopped: creating")
    assert proc.wait(60) == 0
    assert runtime("delete", "--force", "c").returncode == 0
    runtime.assert_no_leaks()
