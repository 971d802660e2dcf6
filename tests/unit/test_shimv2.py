"""The shim v2's own pieces that take containerd's input: flags, bundles,
rootfs mounts, stdio paths, JSON-in-Any, and the stats it sends back. The
shim end to end, with real containerd, is tests/e2e/test_shimv2.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import any_pb2

from paracell.errors import ParacellError
from paracell.shimv2 import command, messages, metrics, rootfs, stdio
from paracell.shimv2.service import MAX_SPEC_BYTES, _json_any
from paracell.shimv2.ttrpc import Code, TtrpcError


def test_containerds_flags_parse_as_go_spells_them():
    args = command.parse(["-namespace", "k8s.io", "-address", "/run/containerd/containerd.sock",
                          "-publish-binary", "/usr/bin/containerd", "-id", "abc", "-debug",
                          "start"])
    assert (args.namespace, args.id, args.debug, args.action) == ("k8s.io", "abc", True, "start")
    command._check(args)


@pytest.mark.parametrize("namespace, task_id", [
    ("", "abc"), ("../etc", "abc"), ("k8s.io", "../x"), ("k8s.io", ""), ("n" * 77, "abc"),
    ("k8s.io", "a/b"),
])
def test_bad_namespaces_and_ids_are_refused(namespace, task_id):
    args = command.parse(["-namespace", namespace, "-id", task_id, "delete"])
    with pytest.raises(ParacellError):
        command._check(args)


def test_the_socket_fits_sun_path_and_differs_per_containerd_namespace_and_group(
        monkeypatch, tmp_path):
    monkeypatch.setenv("PARACELL_SHIM_ROOT", str(tmp_path))
    one = command.socket_path("/run/containerd/containerd.sock", "k8s.io", "pod" * 40)
    assert len(str(one)) < 108 and one.parent == tmp_path / "s"
    assert one != command.socket_path("/other.sock", "k8s.io", "pod" * 40)
    assert one != command.socket_path("/run/containerd/containerd.sock", "default", "pod" * 40)
    assert one != command.socket_path("/run/containerd/containerd.sock", "k8s.io", "other")


def _bundle(tmp_path: Path, annotations: object) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"annotations": annotations}))
    return bundle


def test_a_pods_containers_share_a_group_and_others_are_their_own(tmp_path):
    bundle = _bundle(tmp_path, {command.SANDBOX_ID: "pod1"})
    assert command._group_of(bundle, "member") == "pod1"
    assert command._group_of(tmp_path / "nothing-here", "alone") == "alone"
    (bundle / "config.json").write_text("not json")
    assert command._group_of(bundle, "alone") == "alone"


def test_a_hostile_sandbox_id_is_refused(tmp_path):
    bundle = _bundle(tmp_path, {command.SANDBOX_ID: "../../etc"})
    with pytest.raises(ParacellError):
        command._group_of(bundle, "member")


@pytest.mark.parametrize("mounts, why", [
    ([rootfs.RootMount("overlay", "overlay", ())] * 2, "at most"),
    ([rootfs.RootMount("nfs", "server:/x", ())], "not supported"),
    ([rootfs.RootMount("overlay", "overlay", ("lowerdir=/a\0",))], "NUL"),
    ([rootfs.RootMount("overlay", "overlay", ("x",) * 65)], "too many options"),
])
def test_rootfs_mounts_are_checked_before_anything_is_mounted(mounts, why, tmp_path):
    with pytest.raises(ParacellError, match=why):
        rootfs.mount(mounts, tmp_path)
    assert not (tmp_path / "rootfs").exists()


def test_no_mounts_leave_the_bundles_rootfs_as_it_is(tmp_path):
    assert rootfs.mount([], tmp_path) is None


@pytest.mark.parametrize("path", ["relative/fifo", "/a\0b", "/" + "x" * 5000])
def test_stdio_paths_must_be_absolute_and_sane(path):
    with pytest.raises(ParacellError, match="absolute"):
        stdio.StdioPaths(path, "", "", False).check()


def test_missing_stdio_is_dev_null_and_stderr_defaults_to_stdout(tmp_path):
    import os

    opened = stdio.open_pipes(stdio.StdioPaths("", "", "", False))
    try:
        assert all(os.readlink(f"/proc/self/fd/{fd}") == "/dev/null" for fd in opened.fds)
    finally:
        opened.close()
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    opened = stdio.open_pipes(stdio.StdioPaths("", str(fifo), "", False))
    try:
        assert os.path.samestat(os.fstat(opened.fds[1]), os.fstat(opened.fds[2]))
    finally:
        opened.close()


def test_a_fifo_path_that_is_a_link_is_refused(tmp_path):
    import os

    os.mkfifo(tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ParacellError, match="stdio"):
        stdio.open_pipes(stdio.StdioPaths("", str(tmp_path / "link"), "", False))


@pytest.mark.parametrize("value, why", [
    (b"x" * (MAX_SPEC_BYTES + 1), "longer than"), (b"{not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
])
def test_json_in_any_is_bounded_and_checked(value, why):
    with pytest.raises(TtrpcError, match=why) as raised:
        _json_any(any_pb2.Any(type_url=messages.RUNTIME_SPEC_PROCESS_URL, value=value), "spec")
    assert raised.value.code == Code.INVALID_ARGUMENT


def test_stats_become_cgroups_v1_metrics_with_memory_stat_names():
    data = {
        "cpu": {"usage": {"total": 10, "kernel": 3, "user": 7, "percpu": [4, 6]},
                "throttling": {"periods": 2, "throttledPeriods": 1, "throttledTime": 5}},
        "memory": {"cache": 11, "usage": {"usage": 1 << 20, "limit": 1 << 30, "max": 2 << 20,
                                          "failcnt": 0},
                   "raw": {"rss": 12, "pgpgin": 13, "total_pgmajfault": 14,
                           "total_inactive_file": 15}},
        "pids": {"current": 3, "limit": 123},
    }
    out = metrics.v1_metrics(data)
    assert (out.cpu.usage.total, list(out.cpu.usage.per_cpu)) == (10, [4, 6])
    assert out.cpu.throttling.throttled_periods == 1
    assert (out.memory.usage.usage, out.memory.usage.limit) == (1 << 20, 1 << 30)
    assert (out.memory.rss, out.memory.pg_pg_in, out.memory.total_pg_maj_fault) == (12, 13, 14)
    assert out.memory.total_inactive_file == 15 and out.memory.cache == 11
    assert (out.pids.current, out.pids.limit) == (3, 123)
    packed = messages.pack_any(out)
    assert packed.type_url == "io.containerd.cgroups.v1.Metrics"


def test_hostile_figures_are_clamped_not_trusted():
    data = {"cpu": {"usage": {"total": -5, "user": "many", "percpu": list(range(5000))}},
            "memory": {"usage": {"usage": 1 << 70, "limit": True}, "raw": "not a dict"},
            "pids": ["not", "a", "dict"]}
    out = metrics.v1_metrics(data)
    assert out.cpu.usage.total == 0 and out.cpu.usage.user == 0
    assert len(out.cpu.usage.per_cpu) == 1024
    assert out.memory.usage.usage == metrics.U64_MAX and out.memory.usage.limit == 0
    assert not out.HasField("pids")


def test_a_members_guest_figures_become_cgroups_v2_metrics():
    """A pod member's figures are its guest cgroup's (cgroup v2), so they go
    out as v2 Metrics, whose working set CRI takes as usage - inactive_file."""
    data = {"cpu": {"usage": {"total": 5_000_123, "user": 2_000_000, "kernel": 3_000_000}},
            "memory": {"cache": 11, "usage": {"usage": 70 << 20, "limit": 1 << 30},
                       "raw": {"anon": 64 << 20, "inactive_file": 3 << 20, "pgfault": 9,
                               "not_a_field": 1}},
            "pids": {"current": 4, "limit": 100},
            "paracell": {"memory_events": {"oom": 1, "oom_kill": 2}}}
    out = metrics.v2_metrics(data)
    assert (out.cpu.usage_usec, out.cpu.user_usec, out.cpu.system_usec) == (5000, 2000, 3000)
    assert (out.memory.usage, out.memory.usage_limit) == (70 << 20, 1 << 30)
    assert (out.memory.anon, out.memory.inactive_file, out.memory.pgfault) == (64 << 20,
                                                                               3 << 20, 9)
    assert (out.memory_events.oom, out.memory_events.oom_kill) == (1, 2)
    assert (out.pids.current, out.pids.limit) == (4, 100)
    assert messages.pack_any(out).type_url == "io.containerd.cgroups.v2.Metrics"
    hostile = metrics.v2_metrics({"cpu": "x", "memory": {"raw": {"anon": -1, "file": 1 << 80},
                                                         "usage": []},
                                  "paracell": {"memory_events": {"oom": "many"}}})
    assert (hostile.memory.anon, hostile.memory.file) == (0, metrics.U64_MAX)
    assert hostile.memory_events.oom == 0 and not hostile.HasField("pids")


def test_a_daemon_that_serves_no_task_ends(monkeypatch, tmp_path):
    """containerd died between `start` and Create: the daemon goes after
    two idle checks in a row, and not while it serves a task."""
    import asyncio

    from paracell.log import RuntimeLog
    from paracell.runtime.context import Context
    from paracell.shimv2.tasks import Tasks

    monkeypatch.setattr(command, "IDLE_CHECK_S", 0.02)

    async def watch(busy: bool) -> bool:
        tasks = Tasks(Context(str(tmp_path), RuntimeLog()))
        if busy:
            tasks.tasks["serving"] = object()  # type: ignore[assignment]
        ended = asyncio.Event()
        asyncio.get_running_loop().call_later(command.IDLE_CHECK_S,
                                              command._IdleWatch(tasks, ended.set).check)
        try:
            await asyncio.wait_for(ended.wait(), 0.5)
        except TimeoutError:
            return False
        return True

    assert asyncio.run(watch(busy=False)) is True
    assert asyncio.run(watch(busy=True)) is False


def test_two_starts_of_one_pod_at_once_make_one_daemon_which_a_term_ends(tmp_path):
    """`start` as containerd runs it, twice at once for two containers of one
    pod: one daemon, one address; SIGTERM ends it and takes its socket."""
    import asyncio
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    env = dict(os.environ, PARACELL_SHIM_ROOT=str(tmp_path / "shim"))
    starts = []
    for name in ("sandbox", "member"):
        bundle = tmp_path / name
        bundle.mkdir()
        (bundle / "config.json").write_text(
            json.dumps({"annotations": {command.SANDBOX_ID: "pod1"}}))
        starts.append(subprocess.Popen(
            [sys.executable, "-m", "paracell.shimv2.command", "-namespace", "t", "-address",
             str(tmp_path / "containerd.sock"), "-id", name, "start"], cwd=bundle, env=env,
            stdout=subprocess.PIPE))
    addresses = {proc.communicate(timeout=60)[0].decode() for proc in starts}
    assert len(addresses) == 1
    path = Path(addresses.pop().removeprefix("unix://"))
    assert path.is_socket() and path.stat().st_mode & 0o777 == 0o600
    for name in ("sandbox", "member"):
        assert (tmp_path / name / "address").read_text() == f"unix://{path}"
    daemons = [p for p in psutil.process_iter(["cmdline"])
               if "serve" in (p.info["cmdline"] or [])
               and str(tmp_path / "containerd.sock") in (p.info["cmdline"] or [])]
    assert len(daemons) == 1
    # Serving: a call for a task it does not have is answered NOT_FOUND.
    with pytest.raises(TtrpcError) as answered:
        asyncio.run(_call_connect(path))
    assert answered.value.code == Code.NOT_FOUND
    daemons[0].send_signal(signal.SIGTERM)
    daemons[0].wait(timeout=30)
    deadline = time.monotonic() + 10
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not path.exists()


async def _call_connect(path: Path) -> None:
    from paracell.shimv2.ttrpc import Client

    async with await Client.connect(str(path)) as client:
        await client.call(messages.TASK_SERVICE, "Connect",
                          messages.task_api.ConnectRequest(id="none"),
                          messages.task_api.ConnectResponse, timeout=30)


def test_a_wait_ends_when_its_caller_goes_and_answers_when_the_process_exits(tmp_path):
    import asyncio
    import socket

    from paracell.log import RuntimeLog
    from paracell.runtime.context import Context
    from paracell.shimv2.events import Publisher
    from paracell.shimv2.service import TaskService
    from paracell.shimv2.tasks import Process, Task, Tasks
    from paracell.shimv2.ttrpc import Client, Server

    api = messages.task_api

    async def scenario() -> tuple[int, int, int]:
        tasks = Tasks(Context(str(tmp_path), RuntimeLog()))
        proc = Process("c1", "", stdio.StdioPaths("", "", "", False), pid=1234)
        tasks.tasks["c1"] = Task(proc, tmp_path, None)
        service = TaskService(tasks, Publisher("", "t", RuntimeLog()), "t", lambda: None)
        server = Server()
        server.register(messages.TASK_SERVICE, {
            name: (request, service.wrap(handler))
            for name, (request, handler) in service.methods().items()})
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(tmp_path / "s"))
        serving = asyncio.create_task(server.serve(listener))
        # A caller that goes away: its wait no longer holds a call.
        gone = await Client.connect(str(tmp_path / "s"))
        waiting = asyncio.create_task(gone.call(messages.TASK_SERVICE, "Wait",
                                                api.WaitRequest(id="c1"), api.WaitResponse))
        await asyncio.sleep(0.1)
        held = sum(len(c.calls) for c in server._connections())
        await gone.close()
        waiting.cancel()
        await asyncio.sleep(0.1)
        left = sum(len(c.calls) for c in server._connections())
        # A caller that stays hears the exit.
        async with await Client.connect(str(tmp_path / "s")) as client:
            answer = asyncio.create_task(client.call(messages.TASK_SERVICE, "Wait",
                                                     api.WaitRequest(id="c1"),
                                                     api.WaitResponse, timeout=10))
            await asyncio.sleep(0.1)
            proc.finish(7)
            status = (await answer).exit_status
        await server.shutdown(grace=1)
        await serving
        return held, left, status

    assert asyncio.run(scenario()) == (1, 0, 7)


def test_paracell_check_says_where_the_shim_v2_is_and_whether_containerd_can_find_it(
        monkeypatch):
    import sys

    from paracell import hostcheck

    beside = str(Path(sys.executable).with_name(hostcheck.SHIM_V2))
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    found = hostcheck.shim_v2()
    assert found == {"path": beside, "installed": True, "on_path": beside}
    assert hostcheck._shim_v2_line(found).startswith(f"shim v2: {beside} (")
    monkeypatch.setenv("PATH", "/nonexistent")
    found = hostcheck.shim_v2()
    assert found["installed"] and found["on_path"] is None
    assert "not on PATH" in hostcheck._shim_v2_line(found)


@pytest.mark.parametrize("fields, why", [
    ({"id": "c1", "bundle": ""}, "bundle: must be an absolute path"),
    ({"id": "c1", "bundle": "relative"}, "bundle: must be an absolute path"),
    ({"id": "../c1", "bundle": "/nonexistent-bundle"}, "invalid container id"),
    ({"id": "c1", "bundle": "/nonexistent-bundle", "checkpoint": "rel"},
     "checkpoint: must be an absolute path"),
])
def test_a_create_with_a_bad_bundle_id_or_checkpoint_is_refused_before_anything_is_mounted(
        tmp_path, fields, why):
    import asyncio
    import os

    from paracell.log import RuntimeLog
    from paracell.runtime.context import Context
    from paracell.shimv2.events import Publisher
    from paracell.shimv2.service import TaskService
    from paracell.shimv2.tasks import Tasks

    tasks = Tasks(Context(str(tmp_path), RuntimeLog()))
    service = TaskService(tasks, Publisher("", "t", RuntimeLog()), "t", lambda: None)
    request = messages.task_api.CreateTaskRequest(
        rootfs=[messages.mount_types.Mount(type="overlay", source="overlay")], **fields)
    before = os.listdir(".")
    with pytest.raises(TtrpcError, match=why) as raised:
        asyncio.run(service.wrap(service.create)(request))
    assert raised.value.code == Code.INVALID_ARGUMENT
    assert os.listdir(".") == before and tasks.tasks == {}


def test_paracell_check_says_whether_the_host_relays_are_built(tmp_path):
    from paracell import hostcheck

    found = hostcheck.relays()
    assert [Path(p).name for p in found] == ["paracell-relay", "paracell-vmshim"]
    assert all(found.values()), found  # make venv builds both
    assert hostcheck._relays_line(found) == "relays:  built (paracell-relay, paracell-vmshim)"
    gone = str(tmp_path / "paracell-vmshim")
    line = hostcheck._relays_line({**found, gone: False})
    assert line.startswith(f"relays:  not built: {gone} (run `make venv`")
