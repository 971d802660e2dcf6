"""containerd 1.6 (Debian) drives paracell through paracell's own shim v2
(paracell/shimv2/): what only the v2 path has, or must do differently.
The ctr verbs common to both paths are in test_containerd.py, which runs
through each."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from google.protobuf import any_pb2, empty_pb2

from paracell.shimv2 import messages
from tests.conftest import PARACELL
from tests.e2e.conftest import IMAGE, SHIM_V2

pytestmark = [pytest.mark.e2e,
              pytest.mark.parametrize("containerd", [("qemu", SHIM_V2)], indirect=True,
                                      ids=["paracell-v2"])]




def _remove(containerd, name: str) -> None:
    containerd.ctr("task", "kill", "-s", "SIGKILL", name)
    containerd.ctr("task", "delete", "--force", name)
    containerd.ctr("containers", "delete", name)


@contextlib.contextmanager
def _task(containerd, name: str) -> Iterator[None]:
    """A running task for the test's body; then removed, leaving nothing."""
    started = containerd.ctr("run", *containerd.run_args(), "-d", IMAGE, name, "sleep", "300")
    assert started.returncode == 0, started.stderr
    try:
        yield
    finally:
        _remove(containerd, name)
    assert containerd.leftovers(name) == []


def _task_status(containerd, name: str) -> str:
    listed = containerd.ctr("task", "ls").stdout.decode()
    for line in listed.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == name:
            return fields[-1]
    return ""


def _wait_status(containerd, name: str, want: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while _task_status(containerd, name) != want:
        assert time.monotonic() < deadline, f"{name} never became {want}"
        time.sleep(0.2)


def _shim_socket(containerd) -> Path:
    sockets = list((containerd.runc_root / "s").iterdir())
    assert len(sockets) == 1, sockets
    return sockets[0]


def test_one_shim_serves_the_task_and_paracell_list_sees_it(containerd):
    with _task(containerd, "v2-list"):
        pids = containerd.shim_pids()
        assert len(pids) == 1
        listed = subprocess.run([PARACELL, "--root", str(containerd.runc_root / "default"),
                                 "list", "--format", "json"], capture_output=True, check=True)
        states = {s["id"]: s for s in json.loads(listed.stdout)}
        assert states["v2-list"]["status"] == "running"
        task_pid = int(containerd.ctr("task", "ls").stdout.split()[-2])
        assert states["v2-list"]["pid"] == task_pid
        # The task's process is the shim's child: it reaps it for its exit status.
        assert psutil.Process(task_pid).ppid() == pids[0]


def test_containerd_restarted_finds_the_running_task_again(containerd):
    with _task(containerd, "v2-restart"):
        (shim,) = containerd.shim_pids()
        containerd.restart()
        assert containerd.shim_pids() == [shim]
        assert _task_status(containerd, "v2-restart") == "RUNNING"
        ex = containerd.ctr("task", "exec", "--exec-id", "r1", "v2-restart", "echo", "again")
        assert ex.returncode == 0 and ex.stdout == b"again\n", ex.stderr
        exits = _exits(containerd, lambda: containerd.ctr("task", "kill", "-s", "SIGKILL",
                                                          "v2-restart"), "v2-restart")
        assert [e["exit_status"] for e in exits] == [137]


def test_the_shims_socket_is_for_root_only(containerd):
    with _task(containerd, "v2-perm"):
        sock = _shim_socket(containerd)
        assert stat.S_IMODE(sock.stat().st_mode) & 0o077 == 0
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700


def test_pause_resume_update_stats(containerd):
    with _task(containerd, "v2-pause"):
        assert containerd.ctr("task", "pause", "v2-pause").returncode == 0
        assert _task_status(containerd, "v2-pause") == "PAUSED"
        assert containerd.ctr("task", "resume", "v2-pause").returncode == 0
        assert _task_status(containerd, "v2-pause") == "RUNNING"
        # ctr 1.6 has no `task update`: the call containerd's UpdateTask makes.
        _call(containerd, "Update", messages.task_api.UpdateTaskRequest(
            id="v2-pause", resources=any_pb2.Any(
                type_url=messages.RUNTIME_SPEC_LINUX_RESOURCES_URL,
                value=json.dumps({"pids": {"limit": 123}}).encode())),
            empty_pb2.Empty)
        metrics = containerd.ctr("task", "metrics", "--format", "json", "v2-pause")
        assert metrics.returncode == 0, metrics.stderr
        data = json.loads(metrics.stdout)
        # The host cgroup's limit, as update set it, and the VM's memory in use.
        assert data["pids"]["limit"] == 123
        assert data["memory"]["usage"]["usage"] > 0


def test_exec_with_a_terminal(containerd):
    with _task(containerd, "v2-exec-t"):
        result = containerd.ctr("task", "exec", "-t", "--exec-id", "t1", "v2-exec-t", "sh", "-c",
                                "tty; exit 4", tty=True)
        assert result.returncode == 4, result.stdout + result.stderr
        assert b"/dev/pts/" in result.stdout


def _call(containerd, method: str, request, response_type):
    from paracell.shimv2.ttrpc import Client

    async def call():
        async with await Client.connect(str(_shim_socket(containerd))) as client:
            return await client.call(messages.TASK_SERVICE, method, request, response_type,
                                     timeout=60)

    return asyncio.run(call())


def test_checkpoint_and_restore_of_a_snapshot_mode_task_through_containerd(containerd):
    """`ctr containers checkpoint --task` and `restore --live`: containerd
    pauses the task, the shim checkpoints its whole VM into the image
    containerd archives, and a new task goes on from it."""
    name, ref = "v2-ckpt", "localhost/v2-ckpt:1"
    started = containerd.ctr("run", *containerd.run_args(), "-d", "--annotation",
                             "io.paracell.snapshot=on", IMAGE, name, "sh", "-c",
                             "head -c 16 /dev/urandom | od -An -tx1 > /tmp/mark; sleep 300")
    assert started.returncode == 0, started.stderr
    try:
        for attempt in range(50):  # the shell writes it once it runs
            mark = containerd.ctr("task", "exec", "--exec-id", f"m{attempt}", name, "cat",
                                  "/tmp/mark")
            if len(mark.stdout.split()) == 16:
                break
            time.sleep(0.1)
        assert mark.returncode == 0 and len(mark.stdout.split()) == 16, mark.stderr
        saved = containerd.ctr("containers", "checkpoint", "--task", "--image", name, ref)
        assert saved.returncode == 0, saved.stderr
        assert _task_status(containerd, name) == "RUNNING"
        _remove(containerd, name)
        restored = containerd.ctr("containers", "restore", "--live", name, ref)
        assert restored.returncode == 0, restored.stderr
        assert _task_status(containerd, name) == "RUNNING"
        again = containerd.ctr("task", "exec", "--exec-id", "again", name, "cat", "/tmp/mark")
        assert again.stdout == mark.stdout, again.stderr
    finally:
        _remove(containerd, name)
        containerd.ctr("images", "rm", ref)
    assert containerd.leftovers(name) == []


def _frame(payload: bytes, stream: int = 1, kind: int = 1) -> bytes:
    return struct.pack(">IIBB", len(payload), stream, kind, 0) + payload


def test_hostile_ttrpc_leaves_the_shim_serving(containerd):
    with _task(containerd, "v2-hostile"):
        path = str(_shim_socket(containerd))
        # A peer that connects and never reads.
        idle = socket.socket(socket.AF_UNIX)
        idle.connect(path)
        request = messages.ttrpc_wire.Request(
            service=messages.TASK_SERVICE, method="State",
            payload=messages.task_api.StateRequest(id="v2-hostile").SerializeToString())
        for _ in range(50):
            idle.send(_frame(request.SerializeToString()))
        hostile = [
            _frame(b"\0" * 64, stream=3) [:10] + struct.pack(">I", 0),  # truncated frame
            struct.pack(">IIBB", 64 << 20, 5, 1, 0),  # longer than the limit
            _frame(b"\xff\xff\xff garbage", stream=7),  # not a request
            _frame(messages.ttrpc_wire.Request(service="no.Such", method="X")
                   .SerializeToString(), stream=9),
            _frame(messages.ttrpc_wire.Request(service=messages.TASK_SERVICE, method="Create",
                                               payload=b"\x0a\xff\xff\xff\xff")
                   .SerializeToString(), stream=11),
        ]
        for data in hostile:
            with socket.socket(socket.AF_UNIX) as peer:
                peer.settimeout(5)
                peer.connect(path)
                peer.sendall(data)
                peer.shutdown(socket.SHUT_WR)
                try:
                    while peer.recv(65536):
                        pass
                except OSError:
                    pass
        # The shim still answers containerd.
        assert _task_status(containerd, "v2-hostile") == "RUNNING"
        ex = containerd.ctr("task", "exec", "--exec-id", "h1", "v2-hostile", "echo", "still")
        assert ex.returncode == 0 and ex.stdout == b"still\n", ex.stderr
        idle.close()


def _exits(containerd, act, name: str, timeout_s: float = 60) -> list[dict]:
    """The /tasks/exit events containerd publishes for the init of `name` while `act`
    runs and until the task is gone from `ctr task ls`."""
    watcher = subprocess.Popen(["ctr", "--address", str(containerd.socket), "events"],
                               stdout=subprocess.PIPE, env=containerd.env)
    try:
        time.sleep(0.5)
        act()
        deadline = time.monotonic() + timeout_s
        while _task_status(containerd, name) not in ("", "STOPPED"):
            assert time.monotonic() < deadline, f"{name} never stopped"
            time.sleep(0.2)
        time.sleep(1)
    finally:
        watcher.terminate()
        out, _ = watcher.communicate(timeout=10)
    found = []
    for line in out.decode().splitlines():
        if " /tasks/exit " in line:
            event = json.loads(line.split(" /tasks/exit ", 1)[1])
            # The init's: an exec's exit names its exec id.
            if event.get("container_id") == name and event.get("id") == name:
                found.append(event)
    return found


def test_shim_killed_the_task_reports_137_once_and_nothing_is_left(containerd):
    with _task(containerd, "v2-shimkill"):
        (shim,) = containerd.shim_pids()
        exits = _exits(containerd, lambda: os.kill(shim, signal.SIGKILL), "v2-shimkill")
        # containerd ran `containerd-shim-paracell-v2 delete` and published the exit.
        assert [e["exit_status"] for e in exits] == [137]


def test_qemu_killed_the_task_exits_and_nothing_is_left(containerd):
    with _task(containerd, "v2-qemukill"):
        qemus = [p for p in psutil.process_iter(["cmdline"])
                 if "qemu-system" in " ".join(p.info["cmdline"] or [])
                 and str(containerd.runc_root) in " ".join(p.info["cmdline"] or [])]
        assert len(qemus) == 1
        exits = _exits(containerd, qemus[0].kill, "v2-qemukill")
        assert [e["exit_status"] for e in exits] == [137]
        deleted = containerd.ctr("task", "delete", "v2-qemukill")
        assert deleted.returncode == 0, deleted.stderr
    assert containerd.shim_pids() == []
