"""The warm pool on real VMs (docs/pool.md): `paracell pool serve` keeps VMs
restored and attached; a create it can serve takes one, and the VM is that
container's alone and ends with it. Whatever way the pool's daemon ends,
the VMs it holds end with it and nothing of them is left, while a VM it
handed out runs on. Its memory budget holds under a burst of creates.
Behaviour only: no timing is asserted (that is `paracell bench start`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import PARACELL, state_of, wait_status

pytestmark = pytest.mark.integration

POOL_WAIT_S = 120.0


class PoolDaemon:
    """`paracell pool serve` for a test's runtime root, with its output kept."""

    def __init__(self, runtime, *flags: str) -> None:
        self.runtime = runtime
        self.out = open(runtime.root.parent / "pool.out", "w+b")  # noqa: SIM115
        runtime.root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([PARACELL, "--root", str(runtime.root), "pool", "serve",
                                      *flags], stdin=subprocess.DEVNULL, stdout=self.out,
                                     stderr=subprocess.STDOUT, env=runtime.env)

    def status(self) -> dict:
        """The daemon's own figures; `serving: false` until it listens."""
        result = self.runtime("pool", "status", "--format", "json")
        return json.loads(result.stdout)

    def waiting(self) -> list[str]:
        return [vm["id"] for vm in self.status().get("vms", []) if vm["state"] == "waiting"]

    def wait_waiting(self, count: int) -> list[str]:
        deadline = time.monotonic() + POOL_WAIT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()
            found = self.waiting()
            if len(found) >= count:
                return found
            time.sleep(0.2)
        raise AssertionError(f"the pool never had {count} VMs waiting: {self.output()}")

    def output(self) -> str:
        self.out.seek(0)
        return self.out.read().decode(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)


@pytest.fixture
def pool(runtime):
    daemons: list[PoolDaemon] = []

    def start(*flags: str) -> PoolDaemon:
        daemon = PoolDaemon(runtime, *flags)
        daemons.append(daemon)
        return daemon

    yield start
    for daemon in daemons:
        daemon.stop(signal.SIGKILL)
        daemon.out.close()


def qemu_of(runtime, vm_id: str) -> int:
    return json.loads((runtime.root / vm_id / "state.json").read_text())["vm"]["qemu_pid"]


def pid_gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def wait_for(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"never: {what}")


def pooled_vm(runtime, cid: str) -> str:
    return json.loads((runtime.root / cid / "state.json").read_text())["pool_vm"]


def test_two_pooled_vms_handed_to_two_containers_share_no_state(runtime, make_bundle, pool):
    daemon = pool("--size", "2")
    waiting = set(daemon.wait_waiting(2))
    qemus = {vm: qemu_of(runtime, vm) for vm in waiting}
    for name in ("alpha", "beta"):
        runtime("create", "--bundle", str(make_bundle(["sleep", "300"])), name, check=True)
    taken = {pooled_vm(runtime, "alpha"), pooled_vm(runtime, "beta")}
    assert taken == waiting, "each create takes a VM that waited, and no VM twice"
    for name in ("alpha", "beta"):
        runtime("start", name, check=True)
    # A mark left in one is nowhere in the other: not in its files, its
    # processes or its shared memory; each has its own kernel.
    mark = "echo alpha > /dev/shm/mark; sleep 200 >/dev/null 2>&1 &"
    assert runtime("exec", "alpha", "sh", "-c", mark).returncode == 0
    # Nor is anything of the pool's own there: its VM's pause, its warm-up.
    seen = runtime("exec", "beta", "sh", "-c",
                   "ls /dev/shm | wc -l; ps -o args | grep -c '^sleep 200'; "
                   "ps -o args | grep -c -e '^/pause' -e '^/true'; "
                   "cat /proc/sys/kernel/random/uuid")
    again = runtime("exec", "alpha", "sh", "-c", "cat /proc/sys/kernel/random/uuid")
    lines = seen.stdout.decode().split()
    assert lines[:3] == ["0", "0", "0"], lines
    assert lines[3] != again.stdout.decode().strip(), "the same randomness in two pooled VMs"
    for name in ("alpha", "beta"):
        runtime("delete", "--force", name, check=True)
    for vm, qemu in qemus.items():
        assert pid_gone(qemu), f"{vm}'s QEMU outlived its container"
        assert not (runtime.root / vm).exists(), f"{vm}'s state outlived its container"
    # The pool makes two more, never the ones it handed out.
    assert not set(daemon.wait_waiting(2)) & waiting
    assert daemon.stop() == 0
    runtime.assert_no_leaks()


def _mem_total_mib(runtime, cid: str) -> int:
    result = runtime("exec", cid, "sh", "-c", "grep MemTotal /proc/meminfo")
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[1]) // 1024


def test_one_pool_keeps_vms_of_a_containers_size_and_of_a_pods(runtime, make_bundle, pool):
    """`--containers --pods`: VMs of both sizes wait, and each create takes
    one of the size its own VM would have had, a container's
    (guest_memory_mib) or a pod's sandbox's (pod_memory_mib)."""
    from paracell import settings

    container_mib, pod_mib = settings.guest_memory_mib(), settings.pod_memory_mib()
    assert container_mib != pod_mib
    daemon = pool("--size", "1", "--containers", "--pods")
    waiting = daemon.wait_waiting(2)
    kinds = {vm["id"]: vm["kind"] for vm in daemon.status()["vms"]}
    assert sorted(kinds[vm].rsplit("/", 1)[1] for vm in waiting) == \
        sorted([f"{container_mib}MiB", f"{pod_mib}MiB"])
    sandbox = {"io.kubernetes.cri.container-type": "sandbox",
               "io.kubernetes.cri.sandbox-id": "pod"}
    runtime("create", "--bundle", str(make_bundle(["sleep", "300"])), "plain", check=True)
    runtime("create", "--bundle", str(make_bundle(
        ["sleep", "300"], mutate=_in_netns(annotations=sandbox))), "pod", check=True)
    assert kinds[pooled_vm(runtime, "plain")].endswith(f"/{container_mib}MiB")
    assert kinds[pooled_vm(runtime, "pod")].endswith(f"/{pod_mib}MiB")
    for cid, mib in (("plain", container_mib), ("pod", pod_mib)):
        runtime("start", cid, check=True)
        # The guest's own view: its kernel's total, a little under its RAM.
        assert mib * 0.8 < _mem_total_mib(runtime, cid) <= mib, cid
    assert "2 claimed" in runtime("pool", "status").stdout.decode()
    for cid in ("plain", "pod"):
        runtime("delete", "--force", cid, check=True)
    # Both sizes are made again.
    again = daemon.wait_waiting(2)
    assert not set(again) & set(waiting)
    assert daemon.stop() == 0
    assert not (runtime.root / "~pool").exists()
    runtime.assert_no_leaks()


def run_pooled(runtime, bundle: Path, cid: str) -> tuple[int, str, str]:
    log = runtime.root.parent / f"{cid}.log"
    result = runtime("--debug", "--log", str(log), "run", "--bundle", str(bundle), cid)
    return result.returncode, result.stdout.decode(), log.read_text()


def test_pooled_containers_are_apart_and_give_their_exit_status(runtime, make_bundle, pool):
    daemon = pool("--size", "2")
    daemon.wait_waiting(2)
    script = ("ls /dev/shm | wc -l; echo here > /dev/shm/mark; "
              "od -An -tx1 -N16 /dev/urandom | tr -d ' '; hostname; exit {}")
    seen = {}
    for name, status in (("alpha", 3), ("beta", 4)):
        def mutate(config: dict, name: str = name) -> None:
            config["hostname"] = name
        code, out, log = run_pooled(runtime, make_bundle(["sh", "-c", script.format(status)],
                                                         mutate=mutate), name)
        assert code == status, out
        assert "from the pool" in log
        seen[name] = out.split()
    alpha, beta = seen["alpha"], seen["beta"]
    # No mark from the other container; its own randomness and name.
    assert alpha[0] == beta[0] == "0", seen
    assert alpha[1] != beta[1], "the same /dev/urandom bytes in two pooled VMs"
    assert (alpha[2], beta[2]) == ("alpha", "beta")
    assert daemon.stop() == 0
    runtime.assert_no_leaks()


def test_a_pooled_container_serves_exec_and_signals_and_its_vm_goes_with_it(
        runtime, make_bundle, pool):
    daemon = pool("--size", "1")
    (vm,) = daemon.wait_waiting(1)
    qemu = qemu_of(runtime, vm)
    runtime("create", "--bundle", str(make_bundle(["sleep", "300"])), "c1", check=True)
    assert pooled_vm(runtime, "c1") == vm
    # The VM is charged where a VM of the container's own would be.
    state = json.loads((runtime.root / "c1" / "state.json").read_text())
    shim = json.loads((runtime.root / vm / "state.json").read_text())["shim_pid"]
    for path in (d["path"] for d in state["vm"]["host"]["cgroups"]):
        procs = {int(p) for p in Path(path, "cgroup.procs").read_text().split()}
        assert {qemu, shim, state["shim_pid"]} <= procs, path
    runtime("start", "c1", check=True)
    assert state_of(runtime, "c1")["status"] == "running"
    result = runtime("exec", "c1", "sh", "-c", "echo inside; exit 5")
    assert (result.returncode, result.stdout) == (5, b"inside\n")
    runtime("kill", "c1", "KILL", check=True)
    wait_status(runtime, "c1", "stopped")
    runtime("delete", "c1", check=True)
    assert pid_gone(qemu), "the pooled VM outlived its container"
    assert not (runtime.root / vm).exists()
    assert daemon.stop() == 0
    runtime.assert_no_leaks()


def test_creates_the_pool_cannot_serve_get_a_vm_of_their_own(runtime, make_bundle, pool):
    daemon = pool("--size", "1")
    (vm,) = daemon.wait_waiting(1)

    def memory(config: dict) -> None:
        config["linux"]["resources"] = {"memory": {"limit": 128 << 20}}

    def manager(config: dict) -> None:
        config["annotations"] = {"io.paracell.memory-manager": "none"}

    for cid, mutate in (("sized", memory), ("annotated", manager)):
        runtime("create", "--bundle", str(make_bundle(["true"], mutate=mutate)), cid,
                check=True)
        assert pooled_vm(runtime, cid) == ""
        runtime("delete", "--force", cid, check=True)
    assert daemon.waiting() == [vm]
    # An ID in the pool's own namespace is refused, in one line.
    result = runtime("create", "--bundle", str(make_bundle(["true"])), "paracell-pool-x")
    assert result.returncode == 1
    assert b"are the warm pool's" in result.stderr and result.stderr.count(b"\n") == 1
    assert daemon.stop() == 0
    runtime.assert_no_leaks()


def test_the_pools_owner_sigkilled_leaves_nothing_but_the_vm_it_handed_out(
        runtime, make_bundle, pool):
    daemon = pool("--size", "2")
    daemon.wait_waiting(2)
    runtime("run", "--detach", "--bundle", str(make_bundle(["sleep", "300"])), "kept",
            check=True)
    kept_vm = pooled_vm(runtime, "kept")
    waiting = daemon.wait_waiting(2)
    qemus = [qemu_of(runtime, vm) for vm in waiting]
    assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
    for qemu in qemus:
        assert pid_gone(qemu), "a waiting VM outlived the pool's owner"
    wait_for(lambda: sorted(p.name for p in runtime.root.iterdir()) == ["kept", kept_vm],
             f"only the handed-out container and its VM in {runtime.root}")
    with open("/proc/self/mountinfo") as mounts:
        assert not [m for m in mounts if any(vm in m for vm in waiting)]
    # The VM handed out is its container's, and runs on.
    result = runtime("exec", "kept", "echo", "still")
    assert (result.returncode, result.stdout) == (0, b"still\n")
    runtime("delete", "--force", "kept", check=True)
    runtime.assert_no_leaks()


def test_the_memory_budget_holds_under_a_burst_of_20_creates(runtime, make_bundle, pool):
    budget = 150
    daemon = pool("--size", "20", "--budget-mib", str(budget))
    daemon.wait_waiting(1)
    costs: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            status = daemon.status()
            costs.append(status["cost_mib"])
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    pooled = 0
    try:
        bundle = make_bundle(["true"])
        for i in range(20):
            code, out, log = run_pooled(runtime, bundle, f"burst{i}")
            assert code == 0, out
            pooled += "from the pool" in log
    finally:
        done.set()
        sampler.join()
    assert costs and max(costs) <= budget, f"the pool held {max(costs)} MiB of {budget}"
    assert pooled >= 2, "the pool served the burst at least while it had VMs"
    assert daemon.stop() == 0
    runtime.assert_no_leaks()


def test_pool_commands_for_a_new_user(runtime, pool, tmp_path):
    result = runtime("pool", "status")
    assert result.returncode == 1
    assert result.stdout.decode().startswith("no pool serves ")
    result = runtime("pool", "serve", "--size", "99")
    assert result.returncode == 1
    assert result.stderr.decode().strip() == "paracell: pool size 99 is outside 0..64"
    daemon = pool("--size", "0")
    wait_for(lambda: runtime("pool", "status").returncode == 0, "the pool serving")
    second = runtime("pool", "serve", "--size", "0")
    assert second.returncode == 1
    assert b"a pool already serves" in second.stderr
    assert "warm pool: 0 of 0 VMs waiting" in runtime("check").stdout.decode()
    assert daemon.stop() == 0
    assert not (runtime.root / "~pool").exists()
    runtime.assert_no_leaks()


def test_a_host_short_of_memory_gets_its_waiting_vms_back(runtime, pool):
    from paracell.runtime.pool.daemon import available_mib

    floor = available_mib() - 400
    daemon = pool("--size", "2", "--min-available-mib", str(floor))
    waiting = daemon.wait_waiting(2)
    qemus = [qemu_of(runtime, vm) for vm in waiting]
    # 800 MiB written by another process: the host's available memory falls
    # below the pool's floor, whatever its two VMs hold.
    hog = subprocess.Popen(["python3", "-c", "import sys, time; b = b'x' * (800 << 20); "
                            "print(flush=True); time.sleep(120)"], stdout=subprocess.PIPE)
    try:
        assert hog.stdout is not None and hog.stdout.readline() == b"\n"
        wait_for(lambda: daemon.status()["vms"] == [], "the pool ending its VMs")
        for qemu in qemus:
            assert pid_gone(qemu), "a VM the pool ended still runs"
        assert "the host is short of memory" in daemon.output()
    finally:
        hog.kill()
        hog.wait()
    # Memory back: the pool fills again.
    daemon.wait_waiting(2)
    assert daemon.stop() == 0
    runtime.assert_no_leaks()


def test_a_vm_whose_create_died_before_it_recorded_it_is_deleted(runtime, pool):
    """A create that claims a VM and is killed before its state names it:
    the VM's lease dies with it, the VM powers off, and the pool deletes
    what is left of it. Here the test is that create, from the claim on."""
    from paracell.runtime import poolwire
    from paracell.runtime.pool import report

    daemon = pool("--size", "1")
    (vm,) = daemon.wait_waiting(1)
    qemu = qemu_of(runtime, vm)
    (kind,) = report.ask(str(runtime.root))["kinds"]
    claim = poolwire.claim(str(runtime.root), kind)
    assert claim is not None and claim.vm_id == vm
    claim.release()
    assert pid_gone(qemu), "the VM outlived its lease"
    wait_for(lambda: not (runtime.root / vm).exists(), f"{vm} deleted")
    assert "no container took it" in daemon.output()
    assert daemon.stop() == 0
    runtime.assert_no_leaks()


def test_a_pool_stopped_while_its_worker_warms_a_vm_up_leaves_nothing(runtime, pool):
    """Stopped while a VM's warm-up runs in it: the worker goes, and so does
    all it made, the warm-up's member included (CI once found it left)."""
    daemon = pool("--size", "3")
    daemon.wait_waiting(1)
    deadline = time.monotonic() + 60
    while not any(p.name.endswith("-warm-up") for p in runtime.root.iterdir()):
        assert time.monotonic() < deadline, "no warm-up seen"
        time.sleep(0.005)
    assert daemon.stop() == 0
    runtime.assert_no_leaks()


def _in_netns(path: str = "", annotations: dict | None = None):
    """The spec's network namespace: the one at path, or a new one."""
    def mutate(config: dict) -> None:
        config["linux"]["namespaces"].append({"type": "network", **({"path": path} if path
                                                                       else {})})
        if annotations:
            config["annotations"] = annotations
    return mutate


def _no_mirror_left(ns) -> None:
    from paracell.net import discover

    assert ns.ingress_qdiscs() == [], "tc qdiscs left behind"
    assert [n for n in ns.link_names() if n.startswith(discover.TAP_PREFIX)] == []


def test_a_pods_sandbox_takes_a_pooled_vm_with_its_interface_and_members_join_it(
        runtime, make_bundle, pool):
    """A CRI pod from the pool: the pooled VM takes the pod's interface (its
    spare, moved into the pod's namespace at the sandbox's start), traffic
    flows both ways, port forwarding reaches it, the pod's containers run and
    exec in that VM, and nothing is left in the pod's namespace."""
    from tests import fwdutil
    from tests.netutil import Server, http_get, netns, route, veth

    # A pool serves the creates whose own VM would be its size: here, a pod
    # whose limit containerd passes (1.7 on), as big as the pool's VMs.
    daemon = pool("--size", "1", "--memory-mib", "256")
    (vm,) = daemon.wait_waiting(1)
    qemu = qemu_of(runtime, vm)
    with netns() as ns, netns() as peer:
        veth(ns, "eth0", peer, "peer0", mtu=1400, a_addrs=("10.78.0.2/24",),
             b_addrs=("10.78.0.1/24",))
        route(ns, "0.0.0.0/0", "10.78.0.1")
        fwdutil.lo_up(ns)
        mac = ns.link("eth0")["mac"]
        server = Server(peer, "10.78.0.1", b"HTTP/1.0 200 OK\r\n\r\nfrom-peer\n")

        def cri(kind: str):
            return _in_netns(ns.path, {"io.kubernetes.cri.container-type": kind,
                                       "io.kubernetes.cri.sandbox-id": "pod",
                                       "io.kubernetes.cri.sandbox-memory": str(256 << 20)})
        try:
            runtime("create", "--bundle", str(make_bundle(["sleep", "300"],
                                                          mutate=cri("sandbox"))),
                    "pod", check=True)
            assert pooled_vm(runtime, "pod") == vm
            runtime("start", "pod", check=True)
            assert sorted(ns.ingress_qdiscs()) == ["eth0", f"{vm_tap(ns)}"]
            script = (f"cat /sys/class/net/eth0/address /sys/class/net/eth0/mtu; "
                      f"wget -q -O - http://10.78.0.1:{server.port}/; mkdir /tmp/www; "
                      "echo from-pod > /tmp/www/index.html; exec httpd -f -p 80 -h /tmp/www")
            runtime("run", "--detach", "--bundle",
                    str(make_bundle(["sh", "-c", script], mutate=cri("container"))),
                    "member", check=True)
            assert pooled_vm(runtime, "member") == ""
            page = http_get(peer, "10.78.0.2", 80)
            assert page.endswith(b"from-pod\n"), page
            # kubectl port-forward's way in: loopback in the pod's namespace.
            assert http_get(ns, "127.0.0.1", 80).endswith(b"from-pod\n")
            assert server.received and server.received[0].startswith(b"GET / ")
            result = runtime("exec", "member", "cat", "/sys/class/net/eth0/address")
            assert (result.returncode, result.stdout.decode().strip()) == (0, mac)
            member_vm = json.loads((runtime.root / "member" / "state.json").read_text())["vm"]
            assert member_vm.get("qemu_pid", 0) == 0, "a pod member runs in its pod's VM"
            runtime("delete", "--force", "member", check=True)
            runtime("delete", "--force", "pod", check=True)
            assert pid_gone(qemu)
            _no_mirror_left(ns)
        finally:
            server.close()
            for cid in ("member", "pod"):
                runtime("delete", "--force", cid)
    assert daemon.stop() == 0
    runtime.assert_no_leaks()


def vm_tap(ns) -> str:
    from paracell.net import discover

    (tap,) = [n for n in ns.link_names() if n.startswith(discover.TAP_PREFIX)]
    return tap


def test_an_interface_added_to_a_pooled_containers_namespace_before_start_is_its(
        runtime, make_bundle, pool, tmp_path):
    """As `ctr run --cni` does: the pid create reports (the proxy) sits in a
    new namespace of its own, never the host's, and the interface the caller
    adds there before start reaches the pooled VM."""
    from tests.netutil import Netns, http_get, netns, veth

    daemon = pool("--size", "1")
    daemon.wait_waiting(1)
    host_links = sorted(os.listdir("/sys/class/net"))
    with netns() as peer:
        pid_file = tmp_path / "pid"
        bundle = make_bundle(["sh", "-c", "mkdir /tmp/www; ip addr > /tmp/www/index.html; "
                              "exec httpd -f -p 80 -h /tmp/www"], mutate=_in_netns())
        try:
            runtime("create", "--bundle", str(bundle), "--pid-file", str(pid_file), "late",
                    check=True)
            assert pooled_vm(runtime, "late")
            proxy_ns = Netns("proxy", f"/proc/{pid_file.read_text()}/ns/net")
            assert proxy_ns.link_names() == ["lo"], "the proxy's namespace is a new one"
            veth(proxy_ns, "eth0", peer, "peer0", a_addrs=("10.79.0.2/24",),
                 b_addrs=("10.79.0.1/24",))
            runtime("start", "late", check=True)
            page = http_get(peer, "10.79.0.2", 80).decode()
            assert "inet 10.79.0.2/24" in page, page
        finally:
            runtime("delete", "--force", "late")
    assert sorted(os.listdir("/sys/class/net")) == host_links
    assert daemon.stop() == 0
    runtime.assert_no_leaks()
