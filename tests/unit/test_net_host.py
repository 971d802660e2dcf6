"""The host half of networking without a VM: the namespace plan, what is read
from a real namespace made here, the TAP and tc wiring and its cleanup, from
the shim (release) and after it (reclaim)."""

from __future__ import annotations

import json
import os

import pytest
from paracell._native import lib

from paracell.errors import ParacellError
from paracell.net import device, discover, netns
from tests.netutil import netns as make_netns
from tests.netutil import route, veth


def test_plan_follows_the_spec_and_the_pod_role(tmp_path):
    from paracell.runtime.bundle import podrole

    with make_netns() as ns:
        assert netns.plan({}, False) == netns.NetworkPlan(netns.HOST)
        assert netns.plan({"network": ""}, False) == netns.NetworkPlan(netns.NEW)
        assert netns.plan({"network": "/proc/self/ns/net"}, False).mode == netns.HOST
        assert netns.plan({"network": ns.path}, False) == netns.NetworkPlan(netns.JOIN, ns.path)
        assert netns.plan({"network": ns.path}, True) == netns.NetworkPlan(netns.POD, ns.path)
    # Who is in a pod's network is decided once, by the pod role: podman's pod
    # members carry CRI-O's annotation; its infra container and lone ones do not.
    crio = podrole.CRIO_CONTAINER_TYPE
    assert podrole.role({crio: "container"}, "c").in_pods_network
    assert not podrole.role({crio: "sandbox"}, "c").in_pods_network
    assert not podrole.role({}, "c").in_pods_network
    with pytest.raises(ParacellError, match="^network namespace /nonexistent: No such file"):
        netns.plan({"network": "/nonexistent"}, False)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/null", str(tmp_path)):
        with pytest.raises(ParacellError, match=f"^network namespace {path}: not a namespace"):
            netns.plan({"network": path}, False)


def test_join_refuses_another_kind_of_namespace():
    def body() -> None:
        netns.join("/proc/self/ns/uts")
    with pytest.raises(ParacellError, match="not a network namespace"):
        netns.run_inside("/proc/self/ns/net", body)


def test_discover_reads_mac_mtu_addresses_and_routes():
    with make_netns() as ns, make_netns() as peer:
        veth(ns, "eth0", peer, "p0", mtu=1400, a_addrs=("10.9.0.2/24", "fd09::2/64"),
             b_addrs=("10.9.0.1/24",))
        route(ns, "0.0.0.0/0", "10.9.0.1")
        route(ns, "10.10.0.0/16", "10.9.0.1")
        found = ns.ipr(discover.interfaces)
        assert len(found) == 1
        eth0 = found[0]
        assert (eth0.name, eth0.mac, eth0.mtu) == ("eth0", ns.link("eth0")["mac"], 1400)
        # No fe80:: (the guest derives its own), no kernel-made subnet routes.
        assert eth0.addresses == [discover.Address("10.9.0.2", 24),
                                  discover.Address("fd09::2", 64)]
        assert eth0.routes == [discover.Route("0.0.0.0", 0, "10.9.0.1", 0, False),
                               discover.Route("10.10.0.0", 16, "10.9.0.1", 0, False)]


def test_too_many_interfaces_fail_in_one_line():
    with make_netns() as ns, make_netns() as peer:
        for i in range(lib.PC_NET_MAX_IFACES + 1):
            veth(ns, f"e{i}", peer, f"p{i}")
        with pytest.raises(ParacellError) as err:
            ns.ipr(discover.interfaces)
    assert str(err.value) == (f"the network namespace has {lib.PC_NET_MAX_IFACES + 1} "
                              f"interfaces; at most {lib.PC_NET_MAX_IFACES} can be mirrored "
                              "into the VM")


@pytest.mark.parametrize("name", ["a\x1fb", "a" * 16, "é"])
def test_names_the_agent_cannot_take_are_refused(name):
    with pytest.raises(ParacellError, match="cannot be given to the VM"):
        discover.check_name(name)


def _prepared(ns, state_dir) -> device.NetworkInterfaces:
    state_dir.mkdir(exist_ok=True)
    dev = device.NetworkInterfaces(state_dir, ns.path)
    ns.run(dev.prepare)
    return dev


def test_prepare_mirrors_and_release_removes_everything(tmp_path):
    with make_netns() as ns, make_netns() as peer:
        veth(ns, "eth0", peer, "p0", a_addrs=("10.9.0.2/24",))
        dev = _prepared(ns, tmp_path)
        try:
            tap_name = dev.taps[0][1]
            assert tap_name.startswith(discover.TAP_PREFIX)
            assert sorted(ns.ingress_qdiscs()) == sorted(["eth0", tap_name])
            mac = ns.link("eth0")["mac"]
            assert dev.qemu_args() == ["-netdev", f"tap,id=net0,fd={dev.taps[0][0]}",
                                       "-device", f"virtio-net-device,netdev=net0,mac={mac}"]
            assert json.loads((tmp_path / device.RECORD_FILE).read_text())["veths"] \
                == [ns.link("eth0")["index"]]
        finally:
            ns.run(dev.release)
        assert ns.ingress_qdiscs() == []
        assert sorted(ns.link_names()) == ["eth0", "lo"]
        assert not (tmp_path / device.RECORD_FILE).exists()


def test_reclaim_after_a_dead_owner_uses_the_record(tmp_path):
    with make_netns() as ns, make_netns() as peer:
        veth(ns, "eth0", peer, "p0")
        dev = _prepared(ns, tmp_path)
        dev.launched()  # as if QEMU had the TAP, and then died: the TAP goes with the fd
        assert ns.ingress_qdiscs() == ["eth0"]
        device.NetworkInterfaces.reclaim(dev.facts())
        assert ns.ingress_qdiscs() == []
        assert not (tmp_path / device.RECORD_FILE).exists()
    # A namespace that is gone took everything with it.
    device.NetworkInterfaces.reclaim({"netns": "/run/netns/paracell-gone",
                                      "record": "/nonexistent"})


def test_an_interface_already_mirrored_is_refused(tmp_path):
    with make_netns() as ns, make_netns() as peer:
        veth(ns, "eth0", peer, "p0")
        first = _prepared(ns, tmp_path / "a")
        try:
            second = device.NetworkInterfaces(tmp_path, ns.path)
            with pytest.raises(ParacellError, match="already has an ingress qdisc"):
                ns.run(second.prepare)
            assert sorted(ns.ingress_qdiscs()) == sorted(["eth0", first.taps[0][1]])
        finally:
            ns.run(first.release)


def test_the_count_for_a_vms_shape_is_discoverys_without_netlink(tmp_path):
    """ethernet_count() (ioctl, no pyroute2) counts what interfaces() finds:
    Ethernet links but our TAPs; not lo, not a tunnel."""
    with make_netns() as ns, make_netns() as peer:
        assert ns.run(discover.ethernet_count) == 0
        veth(ns, "eth0", peer, "p0")
        veth(ns, "eth1", peer, "p1")
        ns.ipr(lambda ipr: ipr.link("add", ifname="tun9", kind="tuntap", mode="tun"))
        assert "tun9" in ns.link_names()
        dev = _prepared(ns, tmp_path)  # its TAP is an Ethernet link too, but ours
        try:
            assert ns.run(discover.ethernet_count) == len(ns.ipr(discover.interfaces)) == 2
        finally:
            ns.run(dev.release)


def test_prepare_never_loads_pyroute2_in_the_shim(tmp_path):
    """A shim lives as long as its container: the rtnetlink work of a
    networked VM runs in a child, so the shim never holds pyroute2's 25 MiB."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from paracell.net import device, netns\n"
        f"dev = device.NetworkInterfaces(__import__('pathlib').Path({str(tmp_path)!r}), NS)\n"
        "netns.run_inside(NS, dev.prepare)\n"
        "print(len(dev.taps), 'pyroute2' in sys.modules)\n"
        "netns.run_inside(NS, dev.release)\n")
    with make_netns() as ns, make_netns() as peer:
        veth(ns, "eth0", peer, "p0", a_addrs=("10.9.0.2/24",))
        done = subprocess.run([sys.executable, "-c", f"NS = {ns.path!r}\n" + script],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        taps, loaded = done.stdout.split(" ")
        assert (int(taps), loaded.strip()) == (1, "False")
        assert ns.ingress_qdiscs() == []


@pytest.mark.parametrize("garbage", [b"", b"{", b'{"veths": "x", "spares": []}',
                                     b'{"veths": [true, -1, 3], "spares": []}', b"[]"])
def test_a_garbled_record_reads_as_empty_or_clean(tmp_path, garbage):
    path = tmp_path / "net.json"
    path.write_bytes(garbage)
    record = device.Record.read(path)
    assert record.veths in ([], [3])
    assert record.spares == []


def test_spare_mac_is_local_and_unicast():
    for _ in range(100):
        first = int(device.new_mac().split(":")[0], 16)
        assert first & 0x02 and not first & 0x01


@pytest.fixture(autouse=True)
def _root_only():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
