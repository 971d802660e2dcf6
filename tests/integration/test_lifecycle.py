"""The runc-compatible verbs on real micro-VMs: create/start/state/kill/delete,
exec, ps, pause/resume, concurrency, and faults (QEMU or the shim killed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import PARACELL, REPO, cri_pod, state_of, wait_status

pytestmark = pytest.mark.integration


def create_detached(runtime, bundle, cid, tmp_path):
    pid_file = tmp_path / f"{cid}.pid"
    result = runtime("create", "--bundle", str(bundle), "--pid-file", str(pid_file), cid)
    assert result.returncode == 0, result.stderr
    return int(pid_file.read_text())


@pytest.mark.both_vmms
def test_create_start_state_delete(runtime, make_bundle, tmp_path):
    bundle = make_bundle(["sh", "-c", "sleep 30"])
    pid = create_detached(runtime, bundle, "lc", tmp_path)
    assert (tmp_path / "lc.pid").read_text() == str(pid)  # bare decimal, no newline
    st = state_of(runtime, "lc")
    assert st["status"] == "created" and st["pid"] == pid and st["id"] == "lc"
    assert st["bundle"] == str(bundle)
    assert st["created"].endswith("Z") and "T" in st["created"]
    os.kill(pid, 0)  # the shim pid is a live host process
    assert runtime("start", "lc").returncode == 0
    assert state_of(runtime, "lc")["status"] == "running"
    again = runtime("start", "lc")
    assert again.returncode != 0
    refused = runtime("delete", "lc")
    assert refused.returncode != 0 and b"not stopped" in refused.stderr
    assert runtime("kill", "lc", "KILL").returncode == 0
    wait_status(runtime, "lc", "stopped")
    assert runtime("kill", "lc", "TERM").stderr.strip().endswith(b"container not running")
    # containerd's shim sends this on every stop: runc answers it silently.
    all_killed = runtime("kill", "--all", "lc", "KILL")
    assert (all_killed.returncode, all_killed.stderr) == (0, b"")
    assert runtime("delete", "lc").returncode == 0
    runtime.assert_no_leaks()


@pytest.mark.both_vmms
def test_sigterm_to_the_shim_reaches_the_container(runtime, make_bundle, tmp_path):
    """containerd's view: it is the subreaper the detached shim is reparented
    to, it signals the pid from --pid-file, and it reaps the container's status."""
    script = "trap 'exit 42' TERM; while true; do sleep 0.1; done"
    pid_file = tmp_path / "sig.pid"
    reaper = subprocess.Popen(
        [sys.executable, "-m", "tests.subreaper", str(pid_file), PARACELL, "--root",
         str(runtime.root), "create", "--bundle", str(make_bundle(["sh", "-c", script])),
         "--pid-file", str(pid_file), "sig"],
        stdout=subprocess.PIPE, env=runtime.env, cwd=REPO)
    try:
        assert reaper.stdout.readline() == b"0\n"
        runtime("start", "sig", check=True)
        time.sleep(1.0)  # the trap is set once the shell runs
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
        out, _ = reaper.communicate(timeout=60)
    finally:
        reaper.kill()
    assert out == b"42\n"
    wait_status(runtime, "sig", "stopped")
    runtime("delete", "sig", check=True)
    runtime.assert_no_leaks()


@pytest.mark.both_vmms
def test_exec_ps_and_exit_codes(runtime, make_bundle, tmp_path):
    create_detached(runtime, make_bundle(["sleep", "60"]), "ex", tmp_path)
    runtime("start", "ex", check=True)
    result = runtime("exec", "ex", "sh", "-c", "echo inside; hostname; exit 3")
    assert result.returncode == 3
    assert result.stdout == b"inside\nparacell\n"
    proc = json.dumps({"args": ["cat"], "cwd": "/", "env": ["PATH=/bin"]})
    (tmp_path / "p.json").write_text(proc)
    result = runtime("exec", "--process", str(tmp_path / "p.json"), "ex", input=b"piped")
    assert result.returncode == 0 and result.stdout == b"piped"
    pids = json.loads(runtime("ps", "--format", "json", "ex", check=True).stdout)
    assert pids == [state_of(runtime, "ex")["pid"]]
    runtime("delete", "--force", "ex", check=True)
    runtime.assert_no_leaks()


def test_detached_exec_gets_a_host_pid(runtime, make_bundle, tmp_path):
    create_detached(runtime, make_bundle(["sleep", "60"]), "dex", tmp_path)
    runtime("start", "dex", check=True)
    pid_file = tmp_path / "exec.pid"
    result = runtime("exec", "--detach", "--pid-file", str(pid_file), "dex", "sleep", "30")
    assert result.returncode == 0, result.stderr
    exec_pid = int(pid_file.read_text())
    pids = json.loads(runtime("ps", "--format", "json", "dex", check=True).stdout)
    assert exec_pid in pids
    os.kill(exec_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while exec_pid in json.loads(runtime("ps", "--format", "json", "dex").stdout):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    runtime("delete", "--force", "dex", check=True)
    runtime.assert_no_leaks()


@pytest.mark.both_vmms
def test_pause_and_resume(runtime, make_bundle, tmp_path):
    create_detached(runtime, make_bundle(["sleep", "60"]), "pr", tmp_path)
    runtime("start", "pr", check=True)
    runtime("pause", "pr", check=True)
    assert state_of(runtime, "pr")["status"] == "paused"
    runtime("resume", "pr", check=True)
    assert state_of(runtime, "pr")["status"] == "running"
    assert runtime("exec", "pr", "true").returncode == 0
    runtime("delete", "--force", "pr", check=True)
    runtime.assert_no_leaks()


@pytest.mark.both_vmms
def test_qemu_killed_means_stopped(runtime, make_bundle, tmp_path):
    shim = create_detached(runtime, make_bundle(["sleep", "60"]), "fq", tmp_path)
    runtime("start", "fq", check=True)
    qemu = runtime.qemu_processes()
    assert len(qemu) == 1
    os.kill(qemu[0], signal.SIGKILL)
    wait_status(runtime, "fq", "stopped")
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{shim}") and time.monotonic() < deadline:
        time.sleep(0.05)
    runtime("delete", "fq", check=True)
    runtime.assert_no_leaks()


def _native_shim(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe").endswith("/paracell-vmshim")
    except OSError:
        return False


def test_a_restored_vms_shim_relays_in_c_and_ends_as_the_python_one(runtime, make_bundle,
                                                                    tmp_path):
    """Once its container is created, a VM restored from its template needs no
    Python: its shim execs paracell-vmshim in the same pid. It still runs
    execs, forwards signals, reports the container's status, and when QEMU
    is killed it ends with 137 and says why in the log."""
    bundle = make_bundle(["sh", "-c", "trap 'exit 7' TERM; while :; do sleep 1; done"])
    # The first VM of the shape boots cold and saves its template; this one is restored.
    runtime("run", "--bundle", str(make_bundle(["true"])), "cold", check=True, timeout=180)
    assert runtime("run", "--bundle", str(make_bundle(["sh", "-c", "exit 3"])),
                   "three").returncode == 3
    shim = create_detached(runtime, bundle, "warm", tmp_path)
    assert _native_shim(shim), "a restored VM's shim stayed in Python"
    runtime("start", "warm", check=True)
    assert runtime("exec", "warm", "true").returncode == 0
    runtime("kill", "warm", "TERM", check=True)
    wait_status(runtime, "warm", "stopped")
    runtime("delete", "warm", check=True)
    assert not (runtime.root / "warm").exists()

    log = tmp_path / "native.log"
    run = subprocess.Popen([PARACELL, "--root", str(runtime.root), "--log", str(log),
                            "--log-format", "json", "run", "--bundle", str(bundle), "gone"],
                           env=runtime.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (runtime.qemu_processes() and b'"running"' in runtime("state", "gone").stdout):
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.1)
        assert _native_shim(state_of(runtime, "gone")["pid"])
        os.kill(runtime.qemu_processes()[0], signal.SIGKILL)
        assert run.wait(timeout=30) == 137
    finally:
        run.kill()
        run.wait()
    errors = [json.loads(line)["msg"] for line in log.read_text().splitlines()
              if json.loads(line)["level"] == "error"]
    assert any("qemu exit -9" in m for m in errors), errors
    runtime.assert_no_leaks()


@pytest.mark.both_vmms
def test_shim_killed_means_stopped(runtime, make_bundle, tmp_path):
    shim = create_detached(runtime, make_bundle(["sleep", "60"]), "fs", tmp_path)
    runtime("start", "fs", check=True)
    os.kill(shim, signal.SIGKILL)
    wait_status(runtime, "fs", "stopped")
    if runtime.vmm == "qemu":
        # Our child QEMU dies with the shim; a libvirt domain lives on
        # until `delete` destroys it from the record (docs/libvirt.md).
        deadline = time.monotonic() + 10
        while runtime.qemu_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runtime.qemu_processes() == []
    else:
        assert len(runtime.qemu_processes()) == 1
    runtime("delete", "fs", check=True)
    runtime.assert_no_leaks()


def test_ten_parallel_creates(runtime, make_bundle, tmp_path):
    bundle = make_bundle(["sleep", "60"])
    ids = [f"par{i}" for i in range(10)]
    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(
            lambda cid: runtime("create", "--bundle", str(bundle), cid,
                                timeout=600), ids))
    assert [r.returncode for r in results] == [0] * 10, [r.stderr for r in results]
    listed = json.loads(runtime("list", "--format", "json", check=True).stdout)
    assert sorted(s["id"] for s in listed) == ids
    with ThreadPoolExecutor(10) as pool:
        deleted = list(pool.map(lambda cid: runtime("delete", "--force", cid), ids))
    assert [r.returncode for r in deleted] == [0] * 10
    runtime.assert_no_leaks()


def test_concurrent_verbs_on_one_id(runtime, make_bundle, tmp_path):
    create_detached(runtime, make_bundle(["sleep", "60"]), "one", tmp_path)
    verbs = [("start", "one"), ("state", "one"), ("start", "one"), ("state", "one"),
             ("kill", "one", "KILL")]
    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(lambda v: runtime(*v), verbs))
    starts = [r.returncode for v, r in zip(verbs, results, strict=True) if v[0] == "start"]
    assert starts.count(0) <= 1  # never two starts; none if the kill came first
    assert results[-1].returncode == 0, results[-1].stderr
    wait_status(runtime, "one", "stopped")
    for v, r in zip(verbs, results, strict=True):
        if v[0] == "state":
            assert json.loads(r.stdout)["id"] == "one"
    runtime("delete", "--force", "one", check=True)
    runtime.assert_no_leaks()


@pytest.mark.parametrize("bad_id", ["../x", "a/b", "..", "with space", "x" * 256, ""])
def test_invalid_ids_are_rejected(runtime, make_bundle, bad_id):
    result = runtime("create", "--bundle", str(make_bundle(["true"])), bad_id)
    assert result.returncode != 0
    assert len(result.stderr.decode().strip().splitlines()) == 1
    runtime.assert_no_leaks()


def test_duplicate_id_is_rejected(runtime, make_bundle, tmp_path):
    bundle = make_bundle(["sleep", "60"])
    create_detached(runtime, bundle, "dup", tmp_path)
    result = runtime("create", "--bundle", str(bundle), "dup")
    assert result.returncode != 0 and b"container with id exists: dup" in result.stderr
    assert state_of(runtime, "dup")["status"] == "created"
    runtime("delete", "--force", "dup", check=True)
    runtime.assert_no_leaks()


def test_verbs_on_missing_container(runtime):
    for verb in (["state", "ghost"], ["start", "ghost"], ["kill", "ghost", "9"],
                 ["delete", "ghost"]):
        result = runtime(*verb)
        assert result.returncode != 0
        assert b"container ghost does not exist" in result.stderr
    assert runtime("delete", "--force", "ghost").returncode == 0


def test_json_log_has_runc_shaped_errors(runtime, tmp_path):
    log = tmp_path / "log.json"
    result = runtime("--log", str(log), "--log-format", "json", "state", "ghost")
    assert result.returncode != 0
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["level"] == "error" and "does not exist" in entry["msg"] and entry["time"]


@pytest.mark.both_vmms
def test_pod_sandbox_and_app_container(runtime, make_bundle, tmp_path):
    """containerd CRI creates the pause container and each app container
    separately, tagged with the CRI annotations: the sandbox boots the pod's
    VM and the app container starts inside it (docs/pods.md)."""
    pause = make_bundle(["sleep", "60"], mutate=cri_pod("sandbox", "pod1"))
    app = make_bundle(["sh", "-c", "echo app; sleep 60"], mutate=cri_pod("container", "pod1"))
    create_detached(runtime, pause, "pod1", tmp_path)
    runtime("start", "pod1", check=True)
    create_detached(runtime, app, "app1", tmp_path)
    runtime("start", "app1", check=True)
    for cid, kind in (("pod1", "sandbox"), ("app1", "container")):
        st = state_of(runtime, cid)
        assert st["status"] == "running"
        assert st["annotations"]["io.kubernetes.cri.container-type"] == kind
        assert st["annotations"]["io.kubernetes.cri.sandbox-id"] == "pod1"
    assert len(runtime.qemu_processes()) == 1
    for cid in ("app1", "pod1"):
        runtime("delete", "--force", cid, check=True)
    runtime.assert_no_leaks()


def _member_memory(runtime, cid: str) -> int:
    event = json.loads(runtime("events", "--stats", cid, check=True).stdout)
    return event["data"]["memory"]["usage"]["usage"]


def test_each_pod_member_has_its_own_figures(runtime, make_bundle, tmp_path):
    """A pod member's stats are its own cgroup's in the pod's VM (STATS,
    docs/agent-protocol.md): 64 MiB that an exec of one member holds show in
    its figures and not in its neighbour's."""
    import time

    pause = make_bundle(["sleep", "120"], mutate=cri_pod("sandbox", "fpod"))
    create_detached(runtime, pause, "fpod", tmp_path)
    runtime("start", "fpod", check=True)
    for cid in ("fidle", "fbusy"):
        create_detached(runtime, make_bundle(["sleep", "120"], mutate=cri_pod("container", "fpod")),
                        cid, tmp_path)
        runtime("start", cid, check=True)
    before = {cid: _member_memory(runtime, cid) for cid in ("fidle", "fbusy")}
    # dd holds its 64 MiB buffer, filled, while it waits to write to a reader
    # that never reads.
    runtime("exec", "--detach", "fbusy", "sh", "-c",
            "dd if=/dev/zero bs=64M count=1 2>/dev/null | sleep 120", check=True)
    deadline = time.monotonic() + 60
    while _member_memory(runtime, "fbusy") - before["fbusy"] < 64 << 20:
        assert time.monotonic() < deadline, "the member's figures never grew by 64 MiB"
        time.sleep(0.5)
    assert _member_memory(runtime, "fidle") - before["fidle"] < 8 << 20
    event = json.loads(runtime("events", "--stats", "fbusy", check=True).stdout)
    data = event["data"]
    assert data["memory"]["raw"]["anon"] >= 64 << 20
    assert data["pids"]["current"] >= 3  # the init, sh's pipeline: its execs count too
    assert data["cpu"]["usage"]["total"] > 0
    # The sandbox's figures are still the VM's, from the host.
    assert "host_resident_bytes" in json.loads(
        runtime("events", "--stats", "fpod", check=True).stdout)["data"]["paracell"]
    runtime("delete", "--force", "fbusy", check=True)
    result = runtime("events", "--stats", "fbusy")
    assert result.returncode != 0 and b"does not exist" in result.stderr
    for cid in ("fidle", "fpod"):
        runtime("delete", "--force", cid, check=True)
    runtime.assert_no_leaks()


def test_a_pod_members_memory_and_pids_limits_hold_in_the_vm(runtime, make_bundle, tmp_path):
    """A member's linux.resources memory and pids limits are its group's in
    the pod's VM: an exec that takes more memory than the member may is
    OOM-killed there, and counted, while the pod goes on."""
    pause = make_bundle(["sleep", "120"], mutate=cri_pod("sandbox", "lpod"))
    create_detached(runtime, pause, "lpod", tmp_path)
    runtime("start", "lpod", check=True)

    def limited(config: dict) -> None:
        cri_pod("container", "lpod")(config)
        config["linux"]["resources"] = {"memory": {"limit": 32 << 20}, "pids": {"limit": 16}}

    create_detached(runtime, make_bundle(["sleep", "120"], mutate=limited), "lmem", tmp_path)
    runtime("start", "lmem", check=True)
    data = json.loads(runtime("events", "--stats", "lmem", check=True).stdout)["data"]
    assert data["memory"]["usage"]["limit"] == 32 << 20 and data["pids"]["limit"] == 16
    greedy = runtime("exec", "lmem", "dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1")
    assert greedy.returncode == 137, greedy.stderr
    data = json.loads(runtime("events", "--stats", "lmem", check=True).stdout)["data"]
    assert data["paracell"]["memory_events"]["oom_kill"] >= 1
    assert state_of(runtime, "lmem")["status"] == "running"
    # `update` reaches the member's group: the same exec fits under the new limit.
    updated = runtime("update", "--memory", str(96 << 20), "--pids-limit", "20", "--cpu-shares",
                      "512", "lmem")
    assert updated.returncode == 0, updated.stderr
    assert b"cpu of a pod member is its pod VM's" in updated.stderr
    data = json.loads(runtime("events", "--stats", "lmem", check=True).stdout)["data"]
    assert data["memory"]["usage"]["limit"] == 96 << 20 and data["pids"]["limit"] == 20
    fits = runtime("exec", "lmem", "dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1")
    assert fits.returncode == 0, fits.stderr
    below = runtime("update", "--memory", "4096", "lmem")
    assert below.returncode != 0 and b"is below the" in below.stderr, below.stderr
    assert json.loads(runtime("events", "--stats", "lmem", check=True).stdout)["data"][
        "memory"]["usage"]["limit"] == 96 << 20
    for cid in ("lmem", "lpod"):
        runtime("delete", "--force", cid, check=True)
    runtime.assert_no_leaks()


def test_guest_side_hooks_are_refused_and_host_hooks_run(runtime, make_bundle, tmp_path):
    marker = tmp_path / "hook-ran"
    hook = {"path": "/bin/sh", "args": ["sh", "-c", f"cat > {marker}"]}
    bundle = make_bundle(["true"], mutate=lambda c: c.update(hooks={"createRuntime": [hook]}))
    assert runtime("run", "--bundle", str(bundle), "hk").returncode == 0
    assert json.loads(marker.read_text())["id"] == "hk"
    refused = make_bundle(["true"], mutate=lambda c: c.update(hooks={"startContainer": [hook]}))
    result = runtime("run", "--bundle", str(refused), "hk2")
    assert result.returncode != 0 and b"startContainer hooks must run inside" in result.stderr
    runtime.assert_no_leaks()


def test_poststop_runs_even_when_the_bundle_is_gone(runtime, make_bundle, tmp_path):
    marker = tmp_path / "poststop-ran"
    hook = {"path": "/bin/sh", "args": ["sh", "-c", f"cat > {marker}"]}
    bundle = make_bundle(["sleep", "60"], mutate=lambda c: c.update(hooks={"poststop": [hook]}))
    create_detached(runtime, bundle, "ps1", tmp_path)
    runtime("start", "ps1", check=True)
    (bundle / "config.json").unlink()  # clients may remove the bundle before delete
    runtime("delete", "--force", "ps1", check=True)
    assert json.loads(marker.read_text())["id"] == "ps1"
    runtime.assert_no_leaks()


def test_a_relative_root_works(runtime, make_bundle, tmp_path):
    """--root relative to the caller's directory, which the shim leaves."""
    import subprocess

    from tests.conftest import PARACELL

    bundle = make_bundle(["sh", "-c", "exit 4"])
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run([PARACELL, "--root", "state", "run", "--bundle", str(bundle), "rel"],
                          cwd=work, env=runtime.env, capture_output=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 4, done.stderr
    assert list((work / "state").iterdir()) == []


def test_ps_ignores_an_exec_marker_whose_pid_was_reused(runtime, make_bundle, tmp_path):
    """An exec proxy killed before it removed its marker leaves it behind;
    once its pid is another process's, ps must not list that process."""
    shim = create_detached(runtime, make_bundle(["sleep", "60"]), "reuse", tmp_path)
    runtime("start", "reuse", check=True)
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        execs = runtime.root / "reuse" / "execs"
        execs.mkdir(exist_ok=True)
        # The stranger's pid with another process's start time, as after reuse.
        (execs / str(stranger.pid)).write_text("1")
        assert json.loads(runtime("ps", "--format", "json", "reuse", check=True).stdout) == [shim]
        # A live exec is still listed.
        pid_file = tmp_path / "exec.pid"
        runtime("exec", "--detach", "--pid-file", str(pid_file), "reuse", "sleep", "30",
                check=True)
        listed = json.loads(runtime("ps", "--format", "json", "reuse", check=True).stdout)
        assert listed == [shim, int(pid_file.read_text())]
    finally:
        stranger.kill()
        stranger.wait()
    runtime("delete", "--force", "reuse", check=True)
    runtime.assert_no_leaks()
