"""Forks with networking, without a VM (docs/snapshots.md, "Forks and the
network"): every `--netns` path checked as hostile input in one line before
anything is made; a fork's NICs keep its parent's device count whatever its
namespace holds; the shim joins only the namespace that was checked."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from paracell.errors import ParacellError
from paracell.net import device, discover, netns
from paracell.runtime.snapshots import forking
from tests.netutil import netns as make_netns
from tests.netutil import veth


def _record(tmp_path: Path, devices: object) -> str:
    path = tmp_path / "net.json"
    path.write_text(json.dumps({"veths": [], "spares": [], "lent": [], "devices": devices}))
    return str(path)


def test_without_paths_each_fork_gets_a_new_namespace_with_its_parents_devices(tmp_path):
    record = _record(tmp_path, [1, 0])
    plans = forking.network_plans(netns.JOIN, record, "", 3, [])
    assert plans == [netns.NetworkPlan(netns.NEW, devices=(1, 0))] * 3
    # A parent without interfaces: as before, the host's, and no path taken.
    assert forking.network_plans(netns.HOST, "", "", 2, []) == [netns.NetworkPlan(netns.HOST)] * 2
    with make_netns() as ns, pytest.raises(ParacellError,
                                           match="^the parent has no network device"):
        forking.network_plans(netns.HOST, "", "", 1, [ns.path])


@pytest.mark.parametrize("devices", [None, [1], [17, 0], [1, 2], [-1, 0], [True, 0], "1,0"])
def test_a_parent_record_without_a_sound_device_count_is_refused(tmp_path, devices):
    record = _record(tmp_path, devices)
    with pytest.raises(ParacellError, match="^the parent's network record does not say"):
        forking.network_plans(netns.NEW, record, "", 1, [])


def test_paths_become_joins_checked_by_identity(tmp_path):
    record = _record(tmp_path, [1, 0])
    with make_netns() as a, make_netns() as b:
        plans = forking.network_plans(netns.JOIN, record, "", 2, [a.path, b.path])
        assert [(p.mode, p.path, p.devices) for p in plans] == [
            (netns.JOIN, a.path, (1, 0)), (netns.JOIN, b.path, (1, 0))]
        ident = os.stat(a.path)
        assert plans[0].identity == (ident.st_dev, ident.st_ino)
        for paths, says in (([a.path], "given 1 times for 2 forks"),
                            ([a.path, a.path], "given to two forks"),
                            ([a.path, b.path, a.path], "given 3 times for 2 forks")):
            with pytest.raises(ParacellError, match=says):
                forking.network_plans(netns.JOIN, record, "", 2, paths)
        # The parent's own namespace (its shim's) is never a fork's.
        with pytest.raises(ParacellError, match="the parent's own"):
            forking.network_plans(netns.JOIN, record, a.path, 1, [a.path])


def test_hostile_paths_are_refused_in_one_line(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would block: it must never be
    plain = tmp_path / "plain"
    plain.write_text("")
    with make_netns() as ns:
        link = tmp_path / "link"
        link.symlink_to(ns.path)
        cases = [("relative", "not an absolute path"), ("", "not an absolute path"),
                 ("/a\0b", "not an absolute path"), ("/nonexistent", "No such file"),
                 (str(link), "a symbolic link"), ("/proc/self/ns/net", "a symbolic link"),
                 (str(fifo), "not a namespace file"), ("/dev/null", "not a namespace file"),
                 (str(tmp_path), "not a namespace file"),
                 (str(plain), "not a network namespace"), ("x" * 5000, "not an absolute")]
        for path, says in cases:
            with pytest.raises(ParacellError) as err:
                netns.check_given(path)
            assert says in str(err.value), (path, err.value)
            assert "\n" not in str(err.value) and len(str(err.value)) < 400


def test_the_hosts_own_and_other_kinds_of_namespace_are_refused(tmp_path):
    """Through bind mounts, as /run/netns holds them: no link to refuse."""
    mounts = []
    try:
        for kind in ("net", "uts"):
            target = tmp_path / kind
            target.write_text("")
            subprocess.run(["mount", "--bind", f"/proc/self/ns/{kind}", str(target)],
                           check=True)
            mounts.append(target)
        with pytest.raises(ParacellError, match="the runtime's own"):
            netns.check_given(str(tmp_path / "net"))
        with pytest.raises(ParacellError, match="not a network namespace"):
            netns.check_given(str(tmp_path / "uts"))
    finally:
        for target in mounts:
            subprocess.run(["umount", str(target)], check=False)


def test_the_shim_joins_only_the_namespace_that_was_checked():
    with make_netns() as a, make_netns() as b:
        checked = netns.check_given(a.path)
        # The path now names another namespace: never joined.
        with pytest.raises(ParacellError, match="another namespace than the one checked"):
            netns.run_inside("/proc/self/ns/net", lambda: netns.join(b.path, checked))
        assert netns.run_inside("/proc/self/ns/net",
                                lambda: netns.join(a.path, checked)) is None


def up(ns, name: str) -> bool:
    return ns.ipr(lambda ipr: bool(ipr.get_links(ifname=name)[0]["flags"] & 1))


def test_a_forks_nics_keep_the_parents_device_count(tmp_path):
    with make_netns() as ns, make_netns() as peer:
        veth(ns, "eth0", peer, "p0", a_addrs=("10.9.0.2/24",))
        dev = device.NetworkInterfaces(tmp_path, ns.path, fork_devices=(1, 1))
        assert dev.shape() == {"nics": 1, "spares": 1}
        ns.run(dev.prepare)
        try:
            taps = dev.tap_names()
            assert len(taps) == 2 and all(t.startswith(discover.TAP_PREFIX) for t in taps)
            # The namespace's interface on the first device, the second idle.
            assert sorted(ns.ingress_qdiscs()) == sorted(["eth0", taps[0]])
            assert dev.spares == [] and len(dev.idle) == 1
            assert dev.macs() == [ns.link("eth0")["mac"], dev.idle[0]]
            assert [k for k, _ in dev.fork_records()] == ["net.if", "net.addr"]
            # Its own forks have the same devices: the record says so.
            assert device.Record.read(tmp_path / device.RECORD_FILE).devices == (1, 1)
            # Down until the guest has dropped its parent's addresses, then
            # only the wire of the namespace's interface comes up.
            assert [up(ns, t) for t in taps] == [False, False]
            ns.run(dev.fork_ready)
            assert [up(ns, t) for t in taps] == [True, False]
        finally:
            ns.run(dev.release)
        assert ns.ingress_qdiscs() == []
        assert sorted(ns.link_names()) == ["eth0", "lo"]


def test_more_interfaces_than_the_parents_devices_fail_with_nothing_left(tmp_path):
    with make_netns() as ns, make_netns() as peer:
        veth(ns, "eth0", peer, "p0")
        veth(ns, "eth1", peer, "p1")
        dev = device.NetworkInterfaces(tmp_path, ns.path, fork_devices=(1, 0))
        with pytest.raises(ParacellError, match="2 interfaces, and the fork's VM has 1 network "
                                                "devices"):
            ns.run(dev.prepare)
        assert ns.ingress_qdiscs() == []
        assert sorted(ns.link_names()) == ["eth0", "eth1", "lo"]


def test_the_sdk_takes_a_list_of_paths_and_refuses_one_string(tmp_path):
    from paracell.sandbox import Sandbox, SandboxError

    box = Sandbox("nf-sdk", root=str(tmp_path))
    with pytest.raises(SandboxError, match="^netns: a list of paths, one per fork$"):
        box.fork(netns="/run/netns/a")
    with make_netns() as ns, pytest.raises(SandboxError, match="nf-sdk"):
        box.fork(netns=[ns.path])  # no such sandbox: the verb's own line, typed


def test_a_restores_nics_are_its_namespaces_and_wait_for_forked_too(tmp_path):
    with make_netns() as ns, make_netns() as peer:
        veth(ns, "eth0", peer, "p0")
        dev = device.NetworkInterfaces(tmp_path, ns.path, forked=True)
        ns.run(dev.prepare)
        try:
            assert ns.run(dev.shape) == {"nics": 1, "spares": 0}
            assert [up(ns, t) for t in dev.tap_names()] == [False]
            ns.run(dev.fork_ready)
            assert [up(ns, t) for t in dev.tap_names()] == [True]
        finally:
            ns.run(dev.release)
        assert ns.ingress_qdiscs() == []


def test_a_cleanup_undoes_nothing_in_a_namespace_made_again_under_the_same_path(tmp_path):
    """A fork's shim died; its namespace was deleted and another made under
    the same name before `delete`: the record names the namespace it was
    written in, and the cleanup runs in no other."""
    with make_netns() as first:
        written_in = netns.run_inside(
            first.path, lambda: netns.identity_of("/proc/thread-self/ns/net"))
        path = tmp_path / "net.json"
        device.Record([7], [], [], (1, 0), written_in).write(path)
        assert device.Record.read(path).netns == written_in
        ran = []
        assert netns.run_inside(first.path, lambda: ran.append(1) or "in",
                                written_in) == "in"
    with make_netns() as again:
        # The path the record's cleanup would open, now naming another namespace.
        (tmp_path / "ns").touch()
        subprocess.run(["mount", "--bind", again.path, str(tmp_path / "ns")], check=True)
        try:
            assert netns.run_inside(str(tmp_path / "ns"), lambda: ran.append(2),
                                    written_in) is None
            assert ran == [1]
        finally:
            subprocess.run(["umount", str(tmp_path / "ns")], check=True)
