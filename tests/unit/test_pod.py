"""Pod membership from CRI's annotations, the pod's memory, and the namespace
paths a member may give: all untrusted input."""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from pathlib import Path

import pytest

from paracell.errors import ParacellError
from paracell.linux import MS_BIND
from paracell.runtime.bundle import podrole, resources
from paracell.runtime.bundle.spec import Bundle
from paracell.runtime.pod import pod
from paracell.runtime.state.store import ContainerState
from paracell.vmm import hostshare

SANDBOX = {podrole.CONTAINER_TYPE: "sandbox"}


def member(sandbox_id: str = "sb") -> dict[str, str]:
    return {podrole.CONTAINER_TYPE: "container", podrole.SANDBOX_ID: sandbox_id}


def test_roles():
    assert podrole.role({}, "c") == podrole.PodRole("none")
    assert podrole.role(SANDBOX, "sb") == podrole.PodRole("sandbox")
    assert podrole.role(member(), "c") == podrole.PodRole("member", "sb")


@pytest.mark.parametrize("notes, error", [
    ({podrole.CONTAINER_TYPE: "pod"}, "expected sandbox or container"),
    ({podrole.CONTAINER_TYPE: "container"}, "is required"),
    (member("../etc"), "invalid container id"),
    (member("c"), "names itself"),
])
def test_bad_roles(notes, error):
    with pytest.raises(ParacellError, match=error):
        podrole.role(notes, "c")


@pytest.mark.parametrize("raw, mib", [("", 512), ("0", 512), (str(256 << 20), 256),
                                      (str((256 << 20) + 1), 257)])
def test_pod_memory(raw, mib):
    assert podrole.pod_memory_mib({podrole.SANDBOX_MEMORY: raw} if raw else {}, 512) == mib


@pytest.mark.parametrize("raw", ["-1", "1e9", "12 ", "9" * 21, str(1 << 20), str(1 << 40)])
def test_bad_pod_memory(raw):
    with pytest.raises(ParacellError, match=podrole.SANDBOX_MEMORY + "|outside"):
        podrole.pod_memory_mib({podrole.SANDBOX_MEMORY: raw}, 512)


def test_member_slots_are_fixed_length_and_distinct():
    slots = {pod.member_slot(cid) for cid in ("a", "b", "x" * 255)}
    assert len(slots) == 3 and {len(s) for s in slots} == {16}


def _bundle(tmp_path: Path, namespaces: list[dict[str, str]]) -> Bundle:
    config = {"linux": {"namespaces": namespaces}}
    return Bundle(tmp_path, config, tmp_path, False, {},
                  namespaces={ns["type"]: ns.get("path", "") for ns in namespaces})


def _sandbox(tmp_path: Path) -> ContainerState:
    """A sandbox whose shim is this process, in this network namespace."""
    return ContainerState(id="sb", shim_pid=os.getpid())


def test_member_joins_map_the_sandboxes_pid_to_its_guest_namespaces(tmp_path: Path):
    me = os.getpid()
    bundle = _bundle(tmp_path, [
        {"type": "ipc", "path": f"/proc/{me}/ns/ipc"},
        {"type": "uts", "path": f"/proc/{me}/ns/uts"},
        {"type": "pid", "path": "/proc/4242/ns/pid"}, {"type": "mount"},
        {"type": "network", "path": f"/proc/{me}/ns/net"}])
    records = pod.member_records("c", bundle, _sandbox(tmp_path), {4242: "other"},
                                 resources.parse(None))
    assert records == [("rootfs", f"/pod/{pod.member_slot('c')}/rootfs"),
                       ("ns.ipc", "sb"), ("ns.uts", "sb"), ("ns.pid", "other")]


@pytest.mark.parametrize("raw, limits", [
    ({"memory": {"limit": 64 << 20}, "pids": {"limit": 20}},
     [("memory.max", str(64 << 20)), ("pids.max", "20")]),
    ({"memory": {"limit": -1}, "pids": {"limit": -1}}, []),  # runc's unlimited
    ({"memory": {"limit": 0}, "cpu": {"shares": 512}}, []),  # unset; CPU is the VM's
])
def test_a_members_memory_and_pids_limits_go_to_its_guest_group(raw, limits):
    assert pod.guest_limits(resources.parse(raw)) == limits


NOT_THE_PODS = "is not one of pod sb's: a pod member can only share its pod's namespaces"
NOT_THE_PODS_NETWORK = "is not pod sb's: the containers of a pod VM share one network"


@pytest.mark.parametrize("entry, message", [
    ({"type": "ipc", "path": "/proc/1/ns/ipc"}, NOT_THE_PODS),       # not a pod member's pid
    ({"type": "ipc", "path": "/proc/{me}/ns/uts"}, NOT_THE_PODS),    # type mismatch
    ({"type": "uts", "path": "/var/run/netns/x"}, NOT_THE_PODS),     # not a /proc path
    ({"type": "ipc", "path": "/proc/{me}/ns/ipc/../net"}, NOT_THE_PODS),
    ({"type": "network", "path": "/proc/{other}/ns/net"}, NOT_THE_PODS_NETWORK),  # its own
    ({"type": "network", "path": "/nonexistent"}, NOT_THE_PODS_NETWORK),
])
def test_member_namespaces_outside_the_pod_are_refused(tmp_path: Path, entry, message):
    other = subprocess.Popen(["unshare", "--net", "sleep", "30"])
    try:
        own = os.stat("/proc/self/ns/net").st_ino
        for _ in range(100):  # until unshare has made its namespace, at most 5 s
            if os.stat(f"/proc/{other.pid}/ns/net").st_ino != own:
                break
            time.sleep(0.05)
        entry = {k: v.format(me=os.getpid(), other=other.pid) for k, v in entry.items()}
        with pytest.raises(ParacellError) as refused:
            pod.member_records("c", _bundle(tmp_path, [entry]), _sandbox(tmp_path), {},
                               resources.parse(None))
        path = entry["path"]
        expected = (f"network namespace {path} {message}" if entry["type"] == "network"
                    else f"namespace path {path} ({entry['type']}) {message}")
        assert str(refused.value) == expected
    finally:
        other.kill()
        other.wait()


def test_remove_tree_unbinds_and_never_deletes_what_was_bound(tmp_path: Path):
    source = tmp_path / "data"
    source.mkdir()
    (source / "precious").write_text("keep me")
    tree = tmp_path / "pod" / "slot" / "rootfs"
    tree.mkdir(parents=True)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mount(str(source).encode(), str(tree).encode(), None, MS_BIND, None) == 0
    hostshare.remove_tree(tmp_path / "pod")
    assert not (tmp_path / "pod").exists()
    assert (source / "precious").read_text() == "keep me"
    hostshare.remove_tree(tmp_path / "pod")  # idempotent


def test_a_shared_pod_share_goes_with_everything_bound_below_it(tmp_path: Path):
    source = tmp_path / "data"
    source.mkdir()
    (source / "precious").write_text("keep me")
    share = tmp_path / "pod"
    share.mkdir()
    hostshare.make_shared(share)
    member_root = share / "slot" / "rootfs"
    member_root.mkdir(parents=True)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mount(str(source).encode(), str(member_root).encode(), None, MS_BIND, None) == 0
    hostshare.remove_tree(share)
    assert not share.exists()
    assert (source / "precious").read_text() == "keep me"
    with open("/proc/self/mountinfo") as f:
        assert str(share) not in f.read()


def test_members_adopt_the_pod_parent_their_sandbox_made():
    from paracell.runtime.host.cgroups import CgroupDir, adopt_parents

    mem, v2, pids = "/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/pids"
    sandbox = [CgroupDir(f"{mem}/pod/sb", 1, ("memory",), f"{mem}/pod"),
               CgroupDir(f"{v2}/pod/sb", 2, (), f"{v2}/pod")]
    member = [CgroupDir(f"{mem}/pod/c", 1, ("memory",), f"{mem}/pod/c"),
              CgroupDir(f"{v2}/pod/c", 2, (), f"{v2}/pod/c"),
              CgroupDir(f"{pids}/other/c", 1, ("pids",), f"{pids}/other/c")]
    adopted = adopt_parents(member, sandbox)
    assert [d.made_from for d in adopted] == [f"{mem}/pod", f"{v2}/pod", f"{pids}/other/c"]
    # A parent the sandbox did not make (it was there) is never taken.
    assert adopt_parents(member, [CgroupDir(sandbox[0].path, 1, ("memory",), "")]) == member


@pytest.mark.parametrize("missing, named", [
    ("network", "host network"), ("ipc", "host IPC"), ("pid", "host PID")])
def test_a_sandbox_that_asks_for_a_host_namespace_is_refused(missing: str, named: str):
    namespaces = {"network": "", "ipc": "", "pid": "", "uts": "", "mount": ""}
    podrole.refuse_host_namespaces(namespaces)  # every one of its own: fine
    del namespaces[missing]
    with pytest.raises(ParacellError, match=f"^{named} is not supported by a VM runtime"):
        podrole.refuse_host_namespaces(namespaces)


def test_a_sandbox_in_the_runtimes_own_network_namespace_is_refused():
    """runc's "host" network is also a path to the runtime's own namespace."""
    with pytest.raises(ParacellError, match="^host network is not supported by a VM runtime"):
        podrole.refuse_host_namespaces({"network": "/proc/self/ns/net", "ipc": "", "pid": ""})
