"""State and settings that are broken, hostile or full, on real micro-VMs:
no verb may hang or print a traceback, and `delete --force` must always be
able to remove a container's VM and everything it held."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def one_line(result: subprocess.CompletedProcess[bytes]) -> str:
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, (result.returncode, lines)
    return lines[0]


def running(runtime, make_bundle, cid: str) -> None:
    runtime("create", "--bundle", str(make_bundle(["sleep", "1000"])), cid, check=True)
    runtime("start", cid, check=True)


CORRUPTIONS = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:40]),
    "empty": lambda p: p.write_bytes(b""),
    "binary": lambda p: p.write_bytes(os.urandom(512)),
    "wrongly-typed": lambda p: p.write_text(json.dumps(
        {**json.loads(p.read_text()), "shim_pid": "1"})),
    "empty-object": lambda p: p.write_text("{}"),
    "another-id": lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "id": "x"})),
    "deep": lambda p: p.write_text("[" * 50000 + "]" * 50000),
    "fifo": lambda p: (p.unlink(), os.mkfifo(p)),
    "directory": lambda p: (p.unlink(), p.mkdir()),
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_a_broken_state_json_can_still_be_deleted(runtime, make_bundle, how):
    running(runtime, make_bundle, "victim")
    running(runtime, make_bundle, "bystander")
    CORRUPTIONS[how](runtime.root / "victim" / "state.json")
    for verb in (["state", "victim"], ["kill", "victim", "TERM"], ["exec", "victim", "true"],
                 ["start", "victim"]):
        began = time.monotonic()
        line = one_line(runtime(*verb, timeout=30))
        assert "state of container victim is corrupt" in line, (verb, line)
        assert time.monotonic() - began < 20
    listed = runtime("list", "--format", "json", timeout=30)
    assert listed.returncode == 0
    assert [s["id"] for s in json.loads(listed.stdout)] == ["bystander"]
    assert b"skipping victim" in listed.stderr and len(listed.stderr.splitlines()) == 1
    removed = runtime("delete", "--force", "victim", timeout=60)
    assert removed.returncode == 0, removed.stderr
    assert not (runtime.root / "victim").exists()
    # Only the bystander's VM is left, and it still works.
    assert len(runtime.qemu_processes()) == 1
    assert runtime("exec", "bystander", "true").returncode == 0
    runtime("delete", "--force", "bystander", check=True)
    runtime.assert_no_leaks()


CONFIGS = {
    "bad-json": lambda p: p.write_text("{nope"),
    "deep": lambda p: p.write_text("[" * 30000 + "]" * 30000),
    "fifo": lambda p: os.mkfifo(p),
    "directory": lambda p: p.mkdir(),
    "unknown-key": lambda p: p.write_text('{"no_such_setting": 1}'),
}


@pytest.mark.parametrize("how", sorted(CONFIGS))
def test_a_bad_settings_file_fails_create_only(runtime, make_bundle, tmp_path, how):
    running(runtime, make_bundle, "before")
    config = tmp_path / "paracell.json"
    CONFIGS[how](config)
    runtime.env["PARACELL_CONFIG"] = str(config)
    line = one_line(runtime("create", "--bundle", str(make_bundle(["true"])), "after",
                            timeout=30))
    assert line.startswith(f"paracell: {config}"), line
    for verb in (["state", "before"], ["list"], ["kill", "before", "TERM"],
                 ["delete", "--force", "before"], ["delete", "--force", "never-made"]):
        result = runtime(*verb, timeout=30)
        assert result.returncode == 0, (verb, result.stderr)
    runtime.assert_no_leaks()


def test_every_documented_setting_is_accepted(runtime, make_bundle, tmp_path):
    """README's own example must work: the file is read on every create."""
    from tests.settings_doc import documented_settings

    config = tmp_path / "paracell.json"
    config.write_text(json.dumps(documented_settings()))
    runtime.env["PARACELL_CONFIG"] = str(config)
    ran = runtime("run", "--bundle", str(make_bundle(["true"])), "documented")
    assert ran.returncode == 0, ran.stderr
    runtime.assert_no_leaks()


def test_a_deeply_nested_config_json_is_one_line(runtime, make_bundle):
    bundle = make_bundle(["true"])
    (bundle / "config.json").write_text("[" * 50000 + "]" * 50000)
    line = one_line(runtime("create", "--bundle", str(bundle), "deep"))
    assert line.endswith("is not valid JSON: exceeded max depth"), line
    runtime.assert_no_leaks()


def test_kill_all_of_a_stopped_container_is_silent(runtime, make_bundle):
    runtime("create", "--bundle", str(make_bundle(["true"])), "done", check=True)
    runtime("start", "done", check=True)
    deadline = time.monotonic() + 30
    while json.loads(runtime("state", "done").stdout)["status"] != "stopped":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    for sig in ("9", "15"):
        result = runtime("kill", "--all", "done", sig)
        assert (result.returncode, result.stderr) == (0, b""), result.stderr
    # Without --all, runc's error stays: containerd matches on it.
    assert one_line(runtime("kill", "done", "15")).endswith("container not running")
    runtime("delete", "done", check=True)
    runtime.assert_no_leaks()


@pytest.fixture
def small_root(tmp_path: Path):
    """A state root on a tmpfs of its own, to fill up."""
    root = tmp_path / "small"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "pc-small", str(root)], check=True)
    yield root
    subprocess.run(["umount", "-l", str(root)], check=False)


def fill(directory: Path) -> None:
    with open(directory / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass


def test_a_full_state_filesystem(runtime, make_bundle, small_root):
    runtime.root = small_root / "state"
    bundle = make_bundle(["sleep", "1000"])
    runtime("create", "--bundle", str(bundle), "full", check=True)
    fill(small_root)
    # start: either it ran and the state says so, or it did not and the
    # container is stopped with its VM gone; never a process the state denies.
    started = runtime("start", "full")
    state = json.loads(runtime("state", "full", check=True).stdout)
    if started.returncode == 0:
        assert state["status"] == "running"
    else:
        assert "no space left on device" in started.stderr.decode().lower(), started.stderr
        assert state["status"] == "stopped" and runtime.qemu_processes() == []
    runtime("delete", "--force", "full", check=True)
    # create with the filesystem full: the cause, in one line.
    line = one_line(runtime("create", "--bundle", str(bundle), "nospace"))
    assert "no space left on device" in line.lower(), line
    (small_root / "filler").unlink()
    runtime.assert_no_leaks()
