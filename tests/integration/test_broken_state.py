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
    "symlink": lambda p: (p.unlink(), p.symlink_to("/dev/zero")),
    "bad-cgroup-record": lambda p: p.write_text(json.dumps(_nested(
        json.loads(p.read_text()), ["vm", "host", "cgroups"], [{"path": 5}]))),
    "bad-device-record": lambda p: p.write_text(json.dumps(_nested(
        json.loads(p.read_text()), ["vm", "reclaim"], [{"kind": 5}]))),
    "bad-hooks": lambda p: p.write_text(json.dumps(_nested(
        json.loads(p.read_text()), ["hooks"], {"poststop": 5}))),
}


def _nested(data: dict, path: list[str], value: object) -> dict:
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


# The second VM of a shape is restored from the first's template, copy-on-write,
# with no RAM file of its own: a victim like that is found by its state directory.
@pytest.mark.parametrize("how,restored", [*((how, False) for how in sorted(CORRUPTIONS)),
                                          ("truncated", True)])
def test_a_broken_state_json_can_still_be_deleted(runtime, make_bundle, how, restored):
    for cid in ("bystander", "victim") if restored else ("victim", "bystander"):
        running(runtime, make_bundle, cid)
    CORRUPTIONS[how](runtime.root / "victim" / "state.json")
    for verb in (["state", "victim"], ["kill", "victim", "TERM"], ["exec", "victim", "true"],
                 ["start", "victim"]):
        began = time.monotonic()
        line = one_line(runtime(*verb, timeout=30))
        assert "container victim is corrupt" in line, (verb, line)
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


LOCKS = {
    "a-directory": lambda lock: (lock.unlink(), lock.mkdir()),
    "missing": lambda lock: lock.unlink(),
    "a-fifo": lambda lock: (lock.unlink(), os.mkfifo(lock)),
}


@pytest.mark.parametrize("how", sorted(LOCKS))
def test_a_broken_lock_refuses_changes_but_not_delete_force(runtime, make_bundle, how):
    """`state` still reads the container; every verb that would change it
    says why it cannot, in one line; `delete --force` removes it all."""
    running(runtime, make_bundle, "locked")
    LOCKS[how](runtime.root / "locked" / "lock")
    assert json.loads(runtime("state", "locked", check=True).stdout)["status"] == "running"
    for verb in (["kill", "locked", "TERM"], ["exec", "locked", "true"], ["pause", "locked"],
                 ["delete", "locked"]):
        line = one_line(runtime(*verb, timeout=30))
        assert "container locked is corrupt" in line and "lock" in line, (verb, line)
    assert runtime("delete", "--force", "locked", timeout=60).returncode == 0
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
    # The fixture's PARACELL_ENGINE would spare every verb the file's engine.
    runtime.env.pop("PARACELL_ENGINE", None)
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
    runtime.env.pop("PARACELL_ENGINE", None)
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


def fill(directory: Path, leave: int = 0) -> None:
    """Fills the filesystem, then gives `leave` bytes back."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    if leave:
        os.truncate(directory / "filler", max(0, os.path.getsize(directory / "filler") - leave))


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


def test_a_pod_member_with_a_broken_state_is_removed_with_its_proxy(runtime, make_bundle,
                                                                  tmp_path):
    """The member has no QEMU to be found by: its proxy is found by the pid
    file create wrote beside the state, and its pod runs on."""
    from tests.conftest import cri_pod

    sandbox = make_bundle(["sleep", "1000"], mutate=cri_pod("sandbox", "bpod"))
    runtime("create", "--bundle", str(sandbox), "bpod", check=True)
    runtime("start", "bpod", check=True)
    pid_file = tmp_path / "member.pid"
    member = make_bundle(["sleep", "1000"], mutate=cri_pod("container", "bpod"))
    runtime("create", "--bundle", str(member), "--pid-file", str(pid_file), "bmember",
            check=True)
    runtime("start", "bmember", check=True)
    proxy = int(pid_file.read_text())
    (runtime.root / "bmember" / "state.json").write_text("{}")
    assert runtime("delete", "--force", "bmember", timeout=60).returncode == 0
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{proxy}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{proxy}"), "the member's proxy outlived its delete"
    assert not (runtime.root / "bmember").exists()
    assert runtime("exec", "bpod", "true").returncode == 0
    runtime("delete", "--force", "bpod", check=True)
    runtime.assert_no_leaks()


def test_create_on_a_nearly_full_state_filesystem_names_the_cause(runtime, make_bundle,
                                                                   small_root):
    """A few KiB left: enough for state.json, not for what the shim writes."""
    runtime.root = small_root / "state"
    fill(small_root, leave=12 * 1024)
    result = runtime("create", "--bundle", str(make_bundle(["sleep", "1000"])), "tight")
    if result.returncode == 0:
        runtime("delete", "--force", "tight", check=True)
        pytest.skip("12 KiB sufficed for every file create writes here")
    line = one_line(result)
    assert "No space left on device" in line, line
    (small_root / "filler").unlink()
    runtime.assert_no_leaks()
