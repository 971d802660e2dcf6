"""Kubernetes' path: containerd's CRI plugin, driven by ParaCell's CRI client,
runs pods whose runtime handler is `paracell`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.caps import NO_CAPS, SHOW_CAPS, cap_masks
from tests.conftest import PARACELL
from tests.e2e.cri import HANDLER, HANDLER_V2, Cri, running_cri

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=[HANDLER, HANDLER_V2])
def cri(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
        busybox_rootfs_module: Path) -> Iterator[Cri]:
    yield from running_cri(tmp_path_factory.mktemp("cri"), busybox_rootfs_module,
                           handler=request.param)


@pytest.fixture(autouse=True)
def no_pod_outlives_its_test(cri: Cri) -> Iterator[None]:
    """The module's containerd serves every test, and the host cgroup parent
    is the session's: a pod that a failing test left behind failed every
    later CRI test (one log-order race once showed as 25 failures)."""
    yield
    for pod in cri.client.pods():
        with contextlib.suppress(Exception):
            cri.client.stop_pod(pod.id)
            cri.client.remove_pod(pod.id)


def test_pod_lifecycle_exit_code_logs_and_nothing_left(cri: Cri):
    client = cri.client
    pod_config = cri.pod_config("lifecycle")
    pod = client.run_pod(pod_config, cri.handler)
    status = client.pod_status(pod)
    assert client.pb.PodSandboxState.Name(status.state) == "SANDBOX_READY"
    assert status.runtime_handler == cri.handler
    ctr = client.create(pod, cri.container_config(
        "exits", ["/bin/sh", "-c", "echo out-line; echo err-line >&2; exit 3"]), pod_config)
    client.start(ctr)
    done = cri.wait_state(ctr, "CONTAINER_EXITED")
    assert done.exit_code == 3
    log = (cri.logs / "lifecycle" / "exits.log").read_text()
    lines = [line.split(" ", 3) for line in log.splitlines()]
    # CRI log lines: time, stream, tag, text; only the container's own output.
    # Each stream keeps its order; between the two there is none (containerd
    # reads each FIFO in a goroutine of its own: CI once saw stderr first).
    assert sorted((stream, text) for _, stream, _, text in lines) == [
        ("stderr", "err-line"), ("stdout", "out-line")], log
    client.remove(ctr)
    cri.remove_pod_and_wait(pod)
    listed = cri.paracell("list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() in ("null", "[]"), listed.stdout


def _anonymous_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no Anonymous: line for pid {pid}")


def test_exec_sync_stats_and_stop_with_grace(cri: Cri):
    client = cri.client
    pod_config = cri.pod_config("grace")
    pod = client.run_pod(pod_config, cri.handler)
    # A shell that traps TERM exits 7 on it: the grace period was honoured.
    # One that ignores TERM is killed once the grace period is over.
    polite, stubborn = cri.running(
        pod, pod_config,
        cri.container_config("polite", ["/bin/sh", "-c",
                                        "trap 'exit 7' TERM; while :; do sleep 0.1; done"]),
        cri.container_config("stubborn", ["/bin/sh", "-c",
                                          "trap '' TERM; while :; do sleep 0.1; done"]))
    reply = client.exec_sync(polite, ["/bin/sh", "-c", "echo from-exec; echo oops >&2; exit 4"])
    assert (reply.stdout, reply.stderr, reply.exit_code) == (b"from-exec\n", b"oops\n", 4)
    stats = client.container_stats(polite)
    assert stats.memory.working_set_bytes.value > 0
    # The pod's figures are its cgroup's, which holds the VM: at least the
    # anonymous memory QEMU allocated (the pod's shims and relays come on
    # top). Not its resident set, nor its unique set: restored from a
    # template, QEMU maps the template's pages from the page cache, charged
    # to whichever cgroup first read them, and they are its alone whenever no
    # other VM of that template runs.
    [qemu] = cri.qemu_pids()
    own = _anonymous_bytes(qemu)
    pod_stats = client.pod_stats(pod)
    assert pod_stats.linux.memory.working_set_bytes.value >= 0.8 * own
    assert pod_stats.linux.memory.working_set_bytes.value > 32 << 20
    client.stop(polite, 10)
    assert cri.wait_state(polite, "CONTAINER_EXITED").exit_code == 7
    began = time.monotonic()
    client.stop(stubborn, 2)
    stopped = cri.wait_state(stubborn, "CONTAINER_EXITED")
    assert stopped.exit_code == 137
    assert time.monotonic() - began >= 2
    cri.remove_pod_and_wait(pod)
    assert client.pods() == []


def test_one_vm_per_pod_shared_localhost_and_dev_shm(cri: Cri):
    client = cri.client
    pod_config = cri.pod_config("shared")
    pod = client.run_pod(pod_config, cri.handler)
    server, writer = cri.running(pod, pod_config, cri.container_config(
        "server", ["/bin/sh", "-c", "echo pod-local > /tmp/index.html; "
                   "exec httpd -f -p 127.0.0.1:8080 -h /tmp"]), cri.container_config(
        "writer", ["/bin/sh", "-c", "echo shared-bytes > /dev/shm/note; exec sleep 1000"]))
    # The sandbox and both members: one VM.
    assert len(cri.qemu_pids()) == 1
    assert cri.fetch_local(writer, "http://127.0.0.1:8080/") == b"pod-local\n"
    assert client.exec_sync(server, ["cat", "/dev/shm/note"]).stdout == b"shared-bytes\n"
    # Each member keeps its own filesystem.
    assert client.exec_sync(writer, ["cat", "/tmp/index.html"]).exit_code != 0
    # Stopping one member leaves the pod VM and the other running.
    client.stop(writer, 0)
    cri.wait_state(writer, "CONTAINER_EXITED")
    client.remove(writer)
    assert len(cri.qemu_pids()) == 1
    assert client.exec_sync(server, ["echo", "alive"]).stdout == b"alive\n"
    cri.remove_pod_and_wait(pod)


def test_a_pods_members_and_execs_are_relays_not_python(cri: Cri):
    """A pod of three containers and two running execs: one VM; on the host,
    under the shim v2, its daemon is the only Python process; the VM's shim,
    its VM restored from its template, is paracell-vmshim; each member and
    exec is a paracell-relay process."""
    client = cri.client
    for attempt in range(2):
        pod_config = cri.pod_config(f"relays{attempt}")
        pod = client.run_pod(pod_config, cri.handler)
        [qemu] = cri.qemu_pids()
        vm_shim = psutil.Process(qemu).parent()
        if vm_shim.exe().endswith("/paracell-vmshim"):
            break
        # The shape's first VM boots cold, saves its template, and keeps its
        # Pager in its Python shim: the next one is restored.
        cri.remove_pod_and_wait(pod)
    else:
        pytest.fail("a pod VM restored from its template kept a Python shim")
    try:
        members = cri.running(pod, pod_config, *(cri.container_config(
            f"m{i}", ["sleep", "1000"]) for i in range(3)))
        for i, member in enumerate(members[:2]):
            started = cri.ctr("task", "exec", "--detach", "--exec-id", f"x{i}", member,
                              "sleep", "1000")
            assert started.returncode == 0, started.stderr
        # An exec's host process is a stand-in until its handshake is done, and
        # only then execs the relay: `ctr task exec --detach` may return first.
        deadline = time.monotonic() + 20
        while True:
            relays = [p for p in psutil.process_iter(["exe", "cmdline"])
                      if (p.info["exe"] or "").endswith("paracell-relay")
                      and str(cri.paracell_root) in " ".join(p.info["cmdline"] or [])]
            if len(relays) >= 5 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(relays) == 5, [p.info["cmdline"] for p in relays]
        # Under the shim v2: the daemon and all it runs; under runc's shim, its VM shim.
        daemon = vm_shim.parent()
        everything = [daemon, *daemon.children(recursive=True)] \
            if cri.handler == HANDLER_V2 else [vm_shim]
        pythons = {p.pid for p in everything if "python" in Path(p.exe()).name}
        assert pythons == ({daemon.pid} if cri.handler == HANDLER_V2 else set())
    except BaseException:
        # The next tests must not meet this pod: they check that nothing is left.
        with contextlib.suppress(Exception):
            cri.remove_pod_and_wait(pod)
        raise
    cri.remove_pod_and_wait(pod)
    assert [p for p in [*relays, vm_shim] if p.is_running()] == []


def _pod_under_v2(cri: Cri, name: str, why_not_runc: str) -> tuple[Any, dict[str, object], str]:
    """A new pod, for a test of what only the shim v2 gives (skipped under
    runc's shim, for why_not_runc): the client, the pod's config and its id."""
    if cri.handler != HANDLER_V2:
        pytest.skip(why_not_runc)
    pod_config = cri.pod_config(name)
    return cri.client, pod_config, cri.client.run_pod(pod_config, cri.handler)


def test_each_member_of_a_pod_has_its_own_memory_figure(cri: Cri):
    """`crictl stats` of a pod's members: each has its own cgroup in the
    pod's VM, so the member whose exec holds 64 MiB grows by that much and its
    idle neighbours do not."""
    client, pod_config, pod = _pod_under_v2(
        cri, "figures", "runc's shim reads a member's host cgroup, which holds only its "
        "relay: a member's own figures come through the shim v2")
    members = cri.running(pod, pod_config, *(cri.container_config(
        f"f{i}", ["sleep", "1000"]) for i in range(3)))

    def working_sets() -> list[int]:
        return [client.container_stats(m).memory.working_set_bytes.value for m in members]

    before = working_sets()
    # dd holds its 64 MiB buffer, filled, while it waits on a reader that never reads.
    started = cri.ctr("task", "exec", "--detach", "--exec-id", "fill", members[0],
                      "sh", "-c", "dd if=/dev/zero bs=64M count=1 2>/dev/null | sleep 1000")
    assert started.returncode == 0, started.stderr
    deadline = time.monotonic() + 60
    while (now := working_sets())[0] - before[0] < 64 << 20:
        assert time.monotonic() < deadline, (before, now)
        time.sleep(0.5)
    assert all(after - was < 8 << 20 for was, after in zip(before[1:], now[1:], strict=True)), \
        (before, now)
    stats = client.container_stats(members[0])
    assert stats.cpu.usage_core_nano_seconds.value > 0
    cri.remove_pod_and_wait(pod)


def test_a_member_over_its_memory_limit_is_oom_killed_in_the_vm(cri: Cri):
    """A member's memory limit holds on its group in the pod's VM: a process
    over it is OOM-killed there, the shim v2 publishes TaskOOM, and CRI
    reports the container OOMKilled; its neighbour runs on."""
    client, pod_config, pod = _pod_under_v2(
        cri, "oom", "runc's shim watches a member's host cgroup, which holds only its relay: "
        "an OOM kill in the pod's VM reaches containerd through the shim v2")
    limited = cri.container_config(
        "greedy", ["sh", "-c", "sleep 5; exec dd if=/dev/zero of=/dev/null bs=64M count=1"],
        linux={"resources": {"memory_limit_in_bytes": 32 << 20}})
    greedy, calm = cri.running(pod, pod_config, limited,
                               cri.container_config("calm", ["sleep", "1000"]))
    done = cri.wait_state(greedy, "CONTAINER_EXITED")
    assert done.exit_code == 137
    deadline = time.monotonic() + 20
    while (reason := client.status(greedy).reason) != "OOMKilled":
        assert time.monotonic() < deadline, reason
        time.sleep(0.2)
    assert client.exec_sync(calm, ["echo", "alive"]).stdout == b"alive\n"
    cri.remove_pod_and_wait(pod)


def test_the_cli_runs_a_pod_in_three_commands(cri: Cri, tmp_path: Path):
    """What the README shows: `paracell cri run`, `exec` and `rmp`."""
    pod_file, ctr_file = tmp_path / "pod.json", tmp_path / "ctr.json"
    pod_file.write_text(json.dumps(cri.pod_config("cli")))
    ctr_file.write_text(json.dumps(cri.container_config("app", ["sleep", "1000"])))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PARACELL, "cri", "--address", str(cri.socket), *args],
                              capture_output=True, text=True, timeout=180)

    ran = cli("run", str(ctr_file), str(pod_file))
    assert ran.returncode == 0, ran.stderr
    container = ran.stdout.strip()
    done = cli("exec", container, "sh", "-c", "echo in-the-pod; exit 5")
    assert (done.returncode, done.stdout) == (5, "in-the-pod\n")
    [pod] = [c.pod_sandbox_id for c in cri.client.containers() if c.id == container]
    shown = cli("inspect", container)
    assert json.loads(shown.stdout)["state"] == "CONTAINER_RUNNING", shown.stderr
    figures = json.loads(cli("statsp", pod).stdout)
    assert int(figures["linux"]["memory"]["workingSetBytes"]["value"]) > 0
    removed = cli("rmp", pod)
    assert removed.returncode == 0, removed.stderr
    assert cri.client.pods() == []
    bad = cli("run", str(tmp_path / "missing.json"), str(pod_file))
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_a_pod_whose_vm_is_killed_ends_cleanly(cri: Cri):
    client = cri.client
    pod_config = cri.pod_config("killed")
    pod = client.run_pod(pod_config, cri.handler)
    [ctr] = cri.running(pod, pod_config, cri.container_config("victim", ["sleep", "1000"]))
    [qemu] = cri.qemu_pids()
    os.kill(qemu, signal.SIGKILL)
    # The member loses its VM: it ends as a process killed by SIGKILL would.
    assert cri.wait_state(ctr, "CONTAINER_EXITED").exit_code == 137
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if client.pb.PodSandboxState.Name(client.pod_status(pod).state) == "SANDBOX_NOTREADY":
            break
        time.sleep(0.2)
    assert client.pb.PodSandboxState.Name(client.pod_status(pod).state) == "SANDBOX_NOTREADY"
    cri.remove_pod_and_wait(pod)
    assert not any(cri.paracell_root.glob("k8s.io/*/pod/*")), "a member's binds were left"


def test_the_host_reaches_a_pod_member_by_the_pod_ip(cri: Cri):
    """CNI gave the pod's namespace a veth on the fixture's bridge; the
    sandbox's VM holds it, and every member serves on it."""
    from tests.e2e.cri import BRIDGE
    from tests.netutil import http_get, wait_route_via

    client = cri.client
    pod_config = cri.pod_config("reach")
    pod = client.run_pod(pod_config, cri.handler)
    cri.running(pod, pod_config, cri.container_config(
        "web", ["/bin/sh", "-c", "echo from-the-pod > /tmp/index.html; "
                "exec httpd -f -p 8080 -h /tmp"]))
    pod_ip = client.pod_status(pod).network.ip
    assert pod_ip.startswith("10.217.0.")
    wait_route_via(pod_ip, BRIDGE)
    assert http_get(None, pod_ip, 8080).endswith(b"from-the-pod\n")
    cri.remove_pod_and_wait(pod)


def test_share_process_namespace_shows_the_pods_processes(cri: Cri):
    """shareProcessNamespace: CRI gives members the sandbox's pid namespace;
    in the pod's VM they join the pause container's, which reaps for them."""
    client = cri.client
    pod_config = cri.pod_config("sharedpid", linux={
        "cgroup_parent": cri.cgroup_parent,
        "security_context": {"namespace_options": {"pid": "POD"}}})
    pod = client.run_pod(pod_config, cri.handler)
    shared = {"linux": {"security_context": {"namespace_options": {"pid": "POD"}}}}
    _, second = cri.running(pod, pod_config,
                            cri.container_config("first", ["sleep", "1000"], **shared),
                            cri.container_config("second", ["sleep", "1001"], **shared))
    seen = client.exec_sync(second, ["ps", "-o", "pid,args"]).stdout.decode()
    assert "/pause" in seen and "sleep 1000" in seen and "sleep 1001" in seen, seen
    assert "1 /pause" in " ".join(seen.split()), seen
    cri.remove_pod_and_wait(pod)


def test_dropping_all_capabilities_leaves_none(cri: Cri):
    """securityContext.capabilities.drop: [ALL]. containerd then writes
    `"capabilities": {}`, every set absent, which must mean every set empty:
    in the init and in an exec."""
    client = cri.client
    pod_config = cri.pod_config("nocaps")
    pod = client.run_pod(pod_config, cri.handler)
    drop = {"linux": {"security_context": {"capabilities": {"drop_capabilities": ["ALL"]}}}}
    [ctr] = cri.running(pod, pod_config, cri.container_config(
        "nocaps", ["/bin/sh", "-c", f"{SHOW_CAPS}; exec sleep 1000"], **drop))
    reply = client.exec_sync(ctr, ["/bin/sh", "-c", SHOW_CAPS])
    assert cap_masks(reply.stdout.decode()) == NO_CAPS, reply.stdout
    log = cri.logs / "nocaps" / "nocaps.log"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and log.read_text().count("Cap") < 5:
        time.sleep(0.1)
    init = "\n".join(line.split(" ", 3)[3] for line in log.read_text().splitlines())
    assert cap_masks(init) == NO_CAPS, init
    cri.remove_pod_and_wait(pod)


@pytest.mark.parametrize("namespace, named", [
    ("network", "host network"), ("ipc", "host IPC"), ("pid", "host PID")])
def test_a_pod_on_a_host_namespace_fails_to_start(cri: Cri, namespace: str, named: str):
    """A hostNetwork, hostIPC or hostPID pod given the VM runtime's handler
    must fail at RunPodSandbox, not run cut off from the node."""
    from paracell.cri.client import CriError

    options = {"pid": "CONTAINER", namespace: "NODE"}
    pod_config = cri.pod_config(f"host-{namespace}", linux={
        "cgroup_parent": cri.cgroup_parent,
        "security_context": {"namespace_options": options}})
    # runc's shim prefixes what its runtime said; a shim v2's words arrive as they are.
    prefix = ("OCI runtime create failed: " if cri.handler == HANDLER
              else "failed to create shim task: ")
    with pytest.raises(CriError, match=f"{prefix}{named} is not supported by a VM runtime"):
        cri.client.run_pod(pod_config, cri.handler)
    assert cri.qemu_pids() == []
    assert [p for p in cri.client.pods() if p.metadata.name == f"host-{namespace}"] == []


def test_a_pod_takes_a_vm_from_the_warm_pool(cri: Cri):
    """`paracell pool serve --pods` on the handler's root (docs/pool.md): the
    pod's sandbox takes a waiting VM, which gets the pod's CNI interface at
    the sandbox's start; the pod's container joins that VM and serves on the
    pod IP; the VM and everything of the pod go with the pod."""
    from tests import poolutil
    from tests.e2e.cri import BRIDGE
    from tests.netutil import http_get, wait_route_via

    root = cri.paracell_root / "k8s.io"
    with poolutil.serving(root, "--pods") as pool:
        (waiting,) = pool.waiting()
        pod_config = cri.pod_config("pooled")
        pod = cri.client.run_pod(pod_config, cri.handler)
        state = json.loads((root / pod / "state.json").read_text())
        assert state["pool_vm"] == waiting
        cri.running(pod, pod_config, cri.container_config(
            "web", ["/bin/sh", "-c", "echo from-the-pooled-pod > /tmp/index.html; "
                    "exec httpd -f -p 8080 -h /tmp"]))
        pod_ip = cri.client.pod_status(pod).network.ip
        wait_route_via(pod_ip, BRIDGE)
        assert http_get(None, pod_ip, 8080).endswith(b"from-the-pooled-pod\n")
        assert pool.status()["claimed"] == 1
    # The pool ended the VM it made next; the one the pod took is the pod's.
    assert (root / waiting).exists()
    cri.remove_pod_and_wait(pod)
    assert not [p for p in root.iterdir() if p.name.startswith(("paracell-pool-", "~pool"))]
