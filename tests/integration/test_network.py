"""The container's network namespace reaches the VM (docs/networking.md): real
VMs, namespaces and veth pairs the test makes itself, checked from inside the
container and from the other end of the wire. Traffic goes only to those
namespaces' addresses."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from paracell.net import discover
from tests.netutil import Netns, Server, http_get, netns, route, veth

pytestmark = pytest.mark.integration

# Inside the container: each interface's MAC, MTU and flags (0x1: IFF_UP; the
# kernel's operstate may still say "down" for up to a second after that), then
# addresses and routes as busybox shows them.
SHOW = ("for i in $(ls /sys/class/net); do echo link $i $(cat /sys/class/net/$i/address) "
        "$(cat /sys/class/net/$i/mtu) $(( $(cat /sys/class/net/$i/flags) & 1 )); done; "
        "ip addr; echo routes; ip route; echo routes6; ip -6 route")


def in_netns(path: str):
    def mutate(config):
        config["linux"]["namespaces"].append({"type": "network", "path": path})
    return mutate


@pytest.fixture
def wired():
    """The container's namespace with eth0 (MTU 1400, IPv4 and IPv6, default
    routes) wired to a peer namespace that plays the bridge's gateway."""
    with netns() as ns, netns() as peer:
        veth(ns, "eth0", peer, "peer0", mtu=1400,
             a_addrs=("10.77.0.2/24", "fd77::2/64"), b_addrs=("10.77.0.1/24", "fd77::1/64"))
        route(ns, "0.0.0.0/0", "10.77.0.1")
        route(ns, "::/0", "fd77::1")
        yield ns, peer


def assert_nothing_left(ns: Netns) -> None:
    assert ns.ingress_qdiscs() == [], "tc qdiscs left behind"
    taps = [n for n in ns.link_names() if n.startswith(discover.TAP_PREFIX)]
    assert taps == [], f"TAP devices left behind: {taps}"


def test_interface_mac_addresses_mtu_and_routes_inside(runtime, make_bundle, wired):
    ns, _ = wired
    eth0 = ns.link("eth0")
    bundle = make_bundle(["sh", "-c", SHOW], mutate=in_netns(ns.path))
    result = runtime("run", "--bundle", str(bundle), "netshow")
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    links = sorted(ln for ln in out.splitlines() if ln.startswith("link "))
    assert links == [f"link eth0 {eth0['mac']} 1400 1", "link lo 00:00:00:00:00:00 65536 1"]
    assert "inet 127.0.0.1/8 scope host lo" in out
    assert "inet 10.77.0.2/24 brd 10.77.0.255 scope global eth0" in out
    assert "inet6 fd77::2/64 scope global" in out
    routes, routes6 = out.split("routes\n", 1)[1].split("routes6\n", 1)
    assert "default via 10.77.0.1 dev eth0" in routes
    assert "10.77.0.0/24 dev eth0 scope link  src 10.77.0.2" in routes
    assert "default via fd77::1 dev eth0" in routes6
    runtime.assert_no_leaks()
    assert_nothing_left(ns)


@pytest.mark.both_vmms
def test_traffic_both_ways_ipv4_and_ipv6(runtime, make_bundle, wired):
    ns, peer = wired
    servers = [Server(peer, addr, b"HTTP/1.0 200 OK\r\n\r\nfrom-peer\n")
               for addr in ("10.77.0.1", "fd77::1")]
    v4, v6 = servers
    script = (f"wget -q -O /tmp/got4 http://10.77.0.1:{v4.port}/ && "
              f"wget -q -O /tmp/got6 http://[fd77::1]:{v6.port}/ && "
              "mkdir /tmp/www && cat /tmp/got4 /tmp/got6 > /tmp/www/index.html && "
              "echo from-vm >> /tmp/www/index.html && exec httpd -f -p 80 -h /tmp/www")
    bundle = make_bundle(["sh", "-c", script], mutate=in_netns(ns.path))
    try:
        started = runtime("run", "-d", "--bundle", str(bundle), "nettraffic")
        assert started.returncode == 0, started.stderr
        # The peer reaches the container's httpd, which serves what the
        # container fetched from the peer: both directions, both families.
        for address in ("10.77.0.2", "fd77::2"):
            page = http_get(peer, address, 80)
            assert page.startswith(b"HTTP/1.") and b"200" in page.split(b"\r\n")[0], page
            assert page.endswith(b"from-peer\nfrom-peer\nfrom-vm\n"), page
        assert all(s.received and s.received[0].startswith(b"GET / ") for s in servers)
    finally:
        for server in servers:
            server.close()
        runtime("kill", "nettraffic", "KILL")
        runtime("delete", "--force", "nettraffic")
    runtime.assert_no_leaks()
    assert_nothing_left(ns)


def test_two_interfaces(runtime, make_bundle):
    with netns() as ns, netns() as peer_a, netns() as peer_b:
        veth(ns, "eth0", peer_a, "pa", a_addrs=("10.78.0.2/24",), b_addrs=("10.78.0.1/24",))
        veth(ns, "eth1", peer_b, "pb", mtu=9000, a_addrs=("10.79.0.2/24",),
             b_addrs=("10.79.0.1/24",))
        route(ns, "10.80.0.0/16", "10.79.0.1")
        server = Server(peer_b, "10.79.0.1", b"HTTP/1.0 200 OK\r\n\r\nvia-eth1\n")
        macs = {name: ns.link(name)["mac"] for name in ("eth0", "eth1")}
        script = (SHOW + f"; wget -q -O - http://10.79.0.1:{server.port}/")
        bundle = make_bundle(["sh", "-c", script], mutate=in_netns(ns.path))
        try:
            result = runtime("run", "--bundle", str(bundle), "nettwo")
        finally:
            server.close()
        assert result.returncode == 0, result.stderr
        out = result.stdout.decode()
        assert f"link eth0 {macs['eth0']} 1500 1" in out
        assert f"link eth1 {macs['eth1']} 9000 1" in out
        assert "inet 10.78.0.2/24" in out and "inet 10.79.0.2/24" in out
        assert "10.80.0.0/16 via 10.79.0.1 dev eth1" in out
        assert out.endswith("via-eth1\n")
        runtime.assert_no_leaks()
        assert_nothing_left(ns)


@pytest.mark.parametrize("with_path", [True, False], ids=["netns-with-lo", "new-netns"])
def test_namespace_with_only_lo(runtime, make_bundle, with_path):
    with netns() as ns:
        def mutate(config):
            config["linux"]["namespaces"].append(
                {"type": "network", **({"path": ns.path} if with_path else {})})
        bundle = make_bundle(["sh", "-c", "ls /sys/class/net; ip addr show lo"], mutate=mutate)
        result = runtime("run", "--bundle", str(bundle), "netlo")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.decode().splitlines()
        assert lines[0] == "lo"
        assert "inet 127.0.0.1/8 scope host lo" in result.stdout.decode()
        assert ns.link_names() == ["lo"]
        runtime.assert_no_leaks()


def only_lo_and_logged(runtime, bundle, cid: str, log_dir, why: str) -> None:
    """The container sees lo alone, and the runtime's log says why."""
    log = log_dir / f"{cid}.log.json"
    result = runtime("--log", str(log), "--log-format", "json", "run", "--bundle", str(bundle),
                     cid)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"lo\n"
    messages = [json.loads(line)["msg"] for line in log.read_text().splitlines()]
    assert any(why in m for m in messages), messages


def test_host_network_namespace_gives_no_interface(runtime, make_bundle, tmp_path):
    """No network namespace in the spec is runc's host network: a VM cannot
    share the host's stack, so it gets only its own lo, and the log says so."""
    only_lo_and_logged(runtime, make_bundle(["ls", "/sys/class/net"]), "nethost", tmp_path,
                       "host's network namespace")


@pytest.mark.both_vmms
def test_killed_shim_leaves_nothing_after_delete(runtime, make_bundle, wired):
    ns, _ = wired
    bundle = make_bundle(["sleep", "300"], mutate=in_netns(ns.path))
    created = runtime("create", "--bundle", str(bundle), "netkill")
    assert created.returncode == 0, created.stderr
    qdiscs = sorted(ns.ingress_qdiscs())
    assert len(qdiscs) == 2 and qdiscs[0] == "eth0" and qdiscs[1].startswith("pctap")
    state = json.loads(runtime("state", "netkill", check=True).stdout)
    os.kill(state["pid"], signal.SIGKILL)
    if runtime.vmm == "qemu":
        deadline = time.monotonic() + 20
        while ns.ingress_qdiscs() != ["eth0"] and time.monotonic() < deadline:
            time.sleep(0.1)
        # QEMU died with the shim and its TAP with it; the veth's qdisc is ours to take off.
        assert ns.ingress_qdiscs() == ["eth0"]
    # A libvirt domain runs on, its persistent TAP in place, until delete.
    deleted = runtime("delete", "--force", "netkill")
    assert deleted.returncode == 0, deleted.stderr
    runtime.assert_no_leaks()
    assert_nothing_left(ns)


def test_second_vm_in_one_namespace_is_refused(runtime, make_bundle, wired):
    ns, _ = wired
    first = make_bundle(["sleep", "300"], mutate=in_netns(ns.path))
    assert runtime("create", "--bundle", str(first), "netfirst").returncode == 0
    try:
        second = make_bundle(["true"], mutate=in_netns(ns.path))
        result = runtime("create", "--bundle", str(second), "netsecond")
        assert result.returncode != 0
        assert result.stderr.decode().strip().splitlines() == [
            "paracell: network interface eth0 already has an ingress qdisc: another VM may "
            "mirror it (a network namespace serves one ParaCell VM)"]
        # The refusal took nothing away from the first VM.
        assert sorted(ns.ingress_qdiscs()) == sorted(["eth0", "pctap0"])
    finally:
        runtime("delete", "--force", "netfirst")
    runtime.assert_no_leaks()
    assert_nothing_left(ns)


@pytest.mark.parametrize("path, message", [
    ("/run/netns/paracell-no-such-netns",
     "paracell: network namespace /run/netns/paracell-no-such-netns: No such file or directory"),
    ("/proc/self/ns/uts", None),
])
def test_bad_network_namespace_path_fails_in_one_line(runtime, make_bundle, path, message):
    bundle = make_bundle(["true"], mutate=in_netns(path))
    result = runtime("run", "--bundle", str(bundle), "netbad")
    assert result.returncode != 0
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    if message:
        assert lines[0] == message
    else:
        assert "not a network namespace" in lines[0], lines
    runtime.assert_no_leaks()


def test_interface_added_between_create_and_start(runtime, make_bundle, tmp_path):
    """As `ctr run --cni` does: the spec asks for a new network namespace,
    and the caller adds the veth to the pid that create reported (our shim)
    before it calls start. The VM's spare device takes the interface over."""
    with netns() as peer:
        server = Server(peer, "10.77.0.1", b"HTTP/1.0 200 OK\r\n\r\nfrom-peer\n")
        script = (f"mkdir /tmp/www && ({SHOW}; wget -q -O - http://10.77.0.1:{server.port}/) "
                  "> /tmp/www/index.html 2>&1; exec httpd -f -p 80 -h /tmp/www")

        def new_netns(config):
            config["linux"]["namespaces"].append({"type": "network"})
        bundle = make_bundle(["sh", "-c", script], mutate=new_netns)
        pid_file = tmp_path / "pid"
        try:
            created = runtime("create", "--bundle", str(bundle), "--pid-file", str(pid_file),
                              "netlate")
            assert created.returncode == 0, created.stderr
            shim_ns = Netns("shim", f"/proc/{pid_file.read_text()}/ns/net")
            assert shim_ns.ingress_qdiscs() == []  # the spare waits, unmirrored
            veth(shim_ns, "eth0", peer, "peer0", mtu=1450, a_addrs=("10.77.0.2/24",),
                 b_addrs=("10.77.0.1/24",))
            route(shim_ns, "0.0.0.0/0", "10.77.0.1")
            mac = shim_ns.link("eth0")["mac"]
            started = runtime("start", "netlate")
            assert started.returncode == 0, started.stderr
            page = http_get(peer, "10.77.0.2", 80).decode()
        finally:
            server.close()
            runtime("delete", "--force", "netlate")
        links = sorted(ln for ln in page.splitlines() if ln.startswith("link "))
        assert links == [f"link eth0 {mac} 1450 1", "link lo 00:00:00:00:00:00 65536 1"], page
        assert "inet 10.77.0.2/24 brd 10.77.0.255 scope global eth0" in page
        assert "default via 10.77.0.1 dev eth0" in page
        assert page.endswith("from-peer\n")
        runtime.assert_no_leaks()


def test_podman_pod_app_container_joins_the_infra_namespace_without_interfaces(
        runtime, make_bundle, wired, tmp_path):
    """A podman pod (CRI-O's annotation): a VM per container, the infra
    container's VM takes the pod's interfaces; an app container joining its
    namespace runs, with lo only, and the log says why. (containerd's CRI pods
    run in one VM: test_containerd_pod_member_shares_the_pod_vms_interfaces.)"""
    ns, _ = wired

    def member(kind):
        def mutate(config):
            in_netns(ns.path)(config)
            config["annotations"] = {"io.kubernetes.cri-o.ContainerType": kind}
        return mutate
    sandbox = make_bundle(["sleep", "300"], mutate=member("sandbox"))
    assert runtime("create", "--bundle", str(sandbox), "netsandbox").returncode == 0
    try:
        app = make_bundle(["ls", "/sys/class/net"], mutate=member("container"))
        only_lo_and_logged(runtime, app, "netapp", tmp_path, "pod's network namespace")
        assert sorted(ns.ingress_qdiscs()) == sorted(["eth0", "pctap0"])
    finally:
        runtime("delete", "--force", "netsandbox")
    runtime.assert_no_leaks()
    assert_nothing_left(ns)


def test_containerd_pod_member_shares_the_pod_vms_interfaces(runtime, make_bundle, wired):
    """containerd's CRI pods run in one VM (docs/pods.md): a member in the
    sandbox's network namespace sees the pod's interface, and no second TAP
    is made."""
    ns, _ = wired

    def annotate(kind):
        def mutate(config):
            in_netns(ns.path)(config)
            config["annotations"] = {"io.kubernetes.cri.container-type": kind,
                                     "io.kubernetes.cri.sandbox-id": "netpod"}
        return mutate
    sandbox = make_bundle(["sleep", "300"], mutate=annotate("sandbox"))
    assert runtime("create", "--bundle", str(sandbox), "netpod").returncode == 0
    try:
        runtime("start", "netpod", check=True)
        app = make_bundle(["ls", "/sys/class/net"], mutate=annotate("container"))
        result = runtime("run", "--bundle", str(app), "netmember")
        assert (result.returncode, result.stdout) == (0, b"eth0\nlo\n"), result.stderr
        assert sorted(ns.ingress_qdiscs()) == sorted(["eth0", "pctap0"])
        assert len(runtime.qemu_processes()) == 1
    finally:
        runtime("delete", "--force", "netpod")
    runtime.assert_no_leaks()
    assert_nothing_left(ns)
