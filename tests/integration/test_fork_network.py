"""Forks of a sandbox with a network interface (docs/snapshots.md, "Forks and
the network"): real VMs in namespaces and veth pairs the test makes. A fork
given a namespace answers on that namespace's address, from its peer, and
holds nothing of its parent's; a fork given none has loopback only, in a
namespace of its own; deleting them leaves nothing in any namespace.
Traffic goes only to the addresses made here."""

from __future__ import annotations

import json
import os
import signal
import socket

import pytest

from tests import fwdutil
from tests.conftest import wait_status
from tests.integration.snapshots import SNAPSHOT
from tests.integration.test_network import SHOW, assert_nothing_left
from tests.netutil import Netns, http_get, netns, route, veth

pytestmark = pytest.mark.integration

# The container serves its hostname as it is when asked (a fork's is its id):
# the page says which VM answered.
SERVE = ("mkdir -p /tmp/www/cgi-bin && cd /tmp/www/cgi-bin && echo '#!/bin/sh' > id && "
         "echo 'echo Content-Type: text/plain; echo; hostname' >> id && chmod +x id && "
         "exec httpd -f -p 80 -h /tmp/www")


def whoami(ns: Netns, address: str) -> str:
    page = http_get(ns, address, 80, path="/cgi-bin/id")
    assert page.startswith(b"HTTP/1.") and b" 200 " in page.split(b"\r\n")[0], page
    return page.rsplit(b"\n\n", 1)[-1].rsplit(b"\r\n\r\n", 1)[-1].decode().strip()


def wired(ns: Netns, peer: Netns, net: int, name: str = "eth0", mtu: int = 1500,
          default: bool = True) -> None:
    """NAME in ns at 10.N.0.2 and fdN::2, its peer at .1 (the default route)."""
    veth(ns, name, peer, f"peer{net}", mtu=mtu, a_addrs=(f"10.{net}.0.2/24", f"fd{net}::2/64"),
         b_addrs=(f"10.{net}.0.1/24", f"fd{net}::1/64"))
    if default:
        route(ns, "0.0.0.0/0", f"10.{net}.0.1")


def tcp_to(runtime, cid: str, peer: str, port: int) -> list[str]:
    """The states of the container's TCP connections to peer:port, from
    /proc/net/tcp (01: established)."""
    a, b, c, d = (int(x) for x in peer.split("."))
    remote = f"{d:02X}{c:02X}{b:02X}{a:02X}:{port:04X}"
    table = runtime("exec", cid, "cat", "/proc/net/tcp", check=True).stdout.decode()
    return [row.split()[3] for row in table.splitlines()[1:] if row.split()[2] == remote]


def show(runtime, cid: str) -> str:
    return runtime("exec", cid, "sh", "-c", SHOW, check=True).stdout.decode()


def fork(runtime, parent: str, prefix: str, *netns_args: str) -> list[str]:
    count = max(1, netns_args.count("--netns"))
    result = runtime("sandbox", "fork", "--count", str(count), "--id-prefix", prefix,
                     *netns_args, parent)
    assert result.returncode == 0, result.stderr
    return result.stdout.decode().split()


def refused(runtime, *args: str) -> str:
    result = runtime("sandbox", "fork", *args)
    assert result.returncode != 0, args
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_forks_take_their_own_namespaces_and_never_the_parents_addresses(
        runtime, make_bundle, writable_rootfs, tmp_path):
    with netns() as pns, netns() as ppeer, netns() as ans, netns() as apeer, \
            netns() as bns, netns() as bpeer, netns() as two:
        wired(pns, ppeer, 81)
        wired(ans, apeer, 82)
        wired(bns, bpeer, 83, name="net1", mtu=1400)
        wired(two, apeer, 84)
        wired(two, bpeer, 85, name="eth1", default=False)

        def mutate(config: dict) -> None:
            config["annotations"] = SNAPSHOT
            config["linux"]["namespaces"].append({"type": "network", "path": pns.path})
            # So that it can add addresses, routes and a bridge of its own.
            for caps in config["process"]["capabilities"].values():
                caps.append("CAP_NET_ADMIN")

        def listen() -> socket.socket:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("10.81.0.1", 0))
            sock.listen(1)
            return sock
        # The parent holds a connection to its peer open across the fork.
        listener = ppeer.run(listen)
        port = listener.getsockname()[1]
        script = f"(sleep 100000 | nc 10.81.0.1 {port} &); {SERVE}"
        bundle = make_bundle(["sh", "-c", script], rootfs=writable_rootfs, readonly=False,
                             mutate=mutate)
        runtime("run", "--detach", "--bundle", str(bundle), "nf-parent", check=True)
        wait_status(runtime, "nf-parent", "running")
        listener.settimeout(60)
        held, _ = listener.accept()
        assert whoami(ppeer, "10.81.0.2") == "paracell"  # the bundle's hostname
        assert tcp_to(runtime, "nf-parent", "10.81.0.1", port) == ["01"]
        # What the container adds goes in a fork too: the agent resets every
        # link, not only what it configured. A bridge named as one fork's
        # interface is to be named moves out of its way; 130 addresses on lo,
        # which no reset drops, do not hide the others from it.
        runtime("exec", "nf-parent", "sh", "-c",
                "ip addr add 10.81.0.9/24 dev eth0 && ip route add 10.99.0.0/16 via 10.81.0.1 "
                "&& brctl addbr br0 && ip addr add 10.81.5.1/24 dev br0 && ip link set br0 up "
                "&& brctl addbr net1 && ip link set net1 up && i=1 && while [ $i -le 130 ]; "
                "do ip addr add 127.1.0.$i/32 dev lo || exit 1; i=$((i + 1)); done",
                check=True)

        # Refused in one line, before anything is made.
        link = tmp_path / "link"
        link.symlink_to(ans.path)
        plain = tmp_path / "plain"
        plain.write_text("")
        for args, says in (
                (["--count", "2", "--netns", ans.path, "nf-parent"], "given 1 times for 2"),
                (["--netns", str(link), "nf-parent"], "symbolic link"),
                (["--netns", str(plain), "nf-parent"], "not a network namespace"),
                (["--netns", "/proc/self/ns/net", "nf-parent"], "symbolic link"),
                (["--netns", "relative", "nf-parent"], "not an absolute path"),
                (["--netns", pns.path, "nf-parent"], "the parent's own"),
                (["--count", "2", "--netns", ans.path, "--netns", ans.path, "nf-parent"],
                 "given to two forks")):
            assert says in refused(runtime, *args), args
        assert len(json.loads(runtime("sandbox", "checkpoints", "-f", "json", "nf-parent",
                                      check=True).stdout)) == 0
        # Two interfaces for a VM with one device: the fork's shim says so.
        assert "2 interfaces, and the fork's VM has 1 network devices" in refused(
            runtime, "--netns", two.path, "--id-prefix", "nf-two", "nf-parent")
        assert not (runtime.root / "nf-two1").exists()
        assert_nothing_left(two)

        forks = fork(runtime, "nf-parent", "nf-f", "--netns", ans.path, "--netns", bns.path)
        assert forks == ["nf-f1", "nf-f2"]
        for fid, (ns, peer, net) in zip(forks, ((ans, apeer, 82), (bns, bpeer, 83)),
                                        strict=True):
            # Its httpd, the parent's process, answers on the fork's address,
            # from the fork's peer, over IPv4 and IPv6.
            for address in (f"10.{net}.0.2", f"fd{net}::2"):
                assert whoami(peer, address) == fid
            seen = show(runtime, fid)
            assert "10.81." not in seen and "fd81:" not in seen and "10.99." not in seen, seen
            assert "link br0 " in seen and " 0\n" in seen.split("link br0 ", 1)[1], seen
            assert f"inet 10.{net}.0.2/24" in seen and f"inet6 fd{net}::2/64" in seen, seen
            assert f"default via 10.{net}.0.1" in seen, seen
            # The parent's connection is there, established, and dead (docs).
            assert tcp_to(runtime, fid, "10.81.0.1", port) == ["01"]
            # Port forwarding: the namespace's loopback (up, as CNI leaves
            # it) leads into the fork.
            fwdutil.lo_up(ns)
            assert whoami(ns, "127.0.0.1") == fid
        a, b = show(runtime, "nf-f1"), show(runtime, "nf-f2")
        assert f"link eth0 {ans.link('eth0')['mac']} 1500 1" in a, a
        assert f"link net1 {bns.link('net1')['mac']} 1400 1" in b, b
        assert "link eth0 " not in b, b
        # The container's bridge net1: out of the way in nf-f2, as it was in nf-f1.
        assert "link pcidle" in b and "link net1 " in a and "link pcidle" not in a, (a, b)
        # The parent keeps its own, and only it answers there.
        assert whoami(ppeer, "10.81.0.2") == "paracell"  # the bundle's hostname
        assert "inet 10.81.0.2/24" in show(runtime, "nf-parent")
        # A fork's shim killed: nothing of it cleans up, so delete takes the
        # qdisc off its namespace's veth from the record.
        shim = json.loads(runtime("state", "nf-f2", check=True).stdout)["pid"]
        os.kill(shim, signal.SIGKILL)
        wait_status(runtime, "nf-f2", "stopped")
        assert "net1" in bns.ingress_qdiscs()
        for fid in forks:
            runtime("delete", "--force", fid, check=True)
        for ns in (ans, bns):
            assert_nothing_left(ns)
            assert [n for n in ns.link_names() if n != "lo"] != []  # their veths stay

        # Without a namespace: loopback only, in a namespace of its own.
        [alone] = fork(runtime, "nf-parent", "nf-lo")
        seen = show(runtime, alone)
        links = sorted(ln for ln in seen.splitlines() if ln.startswith("link "))
        # Every link but lo down: the device, and the container's bridge.
        assert [ln.split()[1] for ln in links] == ["br0", "eth0", "lo", "net1"], links
        assert [ln.split()[-1] for ln in links] == ["0", "0", "1", "0"], links
        assert "10.81." not in seen and "fd81:" not in seen and "default" not in seen \
            and "10.99." not in seen, seen
        assert "inet 127.0.0.1/8" in seen, seen
        qemu = json.loads((runtime.root / alone / "state.json").read_text())["vm"]["qemu_pid"]
        where = os.stat(f"/proc/{qemu}/ns/net")
        for other in ("/proc/self/ns/net", pns.path):
            assert (where.st_dev, where.st_ino) != (os.stat(other).st_dev,
                                                    os.stat(other).st_ino)
        runtime("delete", "--force", alone, check=True)
        runtime("delete", "--force", "nf-parent", check=True)
        held.close()
        listener.close()
        assert_nothing_left(pns)
        runtime.assert_no_leaks()


def test_a_fork_takes_its_parents_hidden_spare_and_forks_again(
        runtime, make_bundle, writable_rootfs):
    """A parent in a namespace of its own (`network` without a path) has a
    spare device, hidden from its containers: a fork given a namespace
    takes it; that fork, with memory of its own, forks into another."""
    with netns() as ans, netns() as apeer, netns() as bns, netns() as bpeer:
        wired(ans, apeer, 86)
        wired(bns, bpeer, 87, name="eth5")

        def mutate(config: dict) -> None:
            config["annotations"] = SNAPSHOT
            config["linux"]["namespaces"].append({"type": "network"})
        bundle = make_bundle(["sh", "-c", SERVE], rootfs=writable_rootfs, readonly=False,
                             mutate=mutate)
        runtime("run", "--detach", "--bundle", str(bundle), "nf-new", check=True)
        wait_status(runtime, "nf-new", "running")
        assert [ln for ln in show(runtime, "nf-new").splitlines() if ln.startswith("link ")] \
            == ["link lo 00:00:00:00:00:00 65536 1"]
        [child] = fork(runtime, "nf-new", "nf-n", "--private-memory", "--netns", ans.path)
        assert whoami(apeer, "10.86.0.2") == child
        [grandchild] = fork(runtime, child, "nf-nn", "--netns", bns.path)
        assert whoami(bpeer, "10.87.0.2") == grandchild
        seen = show(runtime, grandchild)
        assert f"link eth5 {bns.link('eth5')['mac']} 1500 1" in seen, seen
        assert "10.86." not in seen and "link eth0" not in seen, seen
        assert whoami(apeer, "10.86.0.2") == child  # its parent runs on, on its own
        for cid in (grandchild, child, "nf-new"):
            runtime("delete", "--force", cid, check=True)
        for ns in (ans, bns):
            assert_nothing_left(ns)
        runtime.assert_no_leaks()


def test_a_runc_restore_takes_the_network_its_bundle_names(
        runtime, make_bundle, writable_rootfs, tmp_path):
    """A restore is a fork into its bundle's namespace: reset and configured
    from there, never with the checkpointed guest's addresses."""
    with netns() as ons, netns() as opeer, netns() as rns, netns() as rpeer:
        wired(ons, opeer, 88)
        wired(rns, rpeer, 89)

        def bundle_in(ns: Netns):
            def mutate(config: dict) -> None:
                config["annotations"] = SNAPSHOT
                config["linux"]["namespaces"].append({"type": "network", "path": ns.path})
            return make_bundle(["sh", "-c", SERVE], rootfs=writable_rootfs, readonly=False,
                               mutate=mutate)
        runtime("run", "--detach", "--bundle", str(bundle_in(ons)), "nf-orig", check=True)
        wait_status(runtime, "nf-orig", "running")
        assert whoami(opeer, "10.88.0.2") == "paracell"
        image = tmp_path / "image"
        runtime("checkpoint", "--image-path", str(image), "--leave-running", "nf-orig",
                check=True)
        runtime("restore", "--image-path", str(image), "--bundle", str(bundle_in(rns)),
                "--detach", "nf-rest", check=True)
        assert whoami(rpeer, "10.89.0.2") == "paracell"
        seen = show(runtime, "nf-rest")
        assert "inet 10.89.0.2/24" in seen and "10.88." not in seen, seen
        assert whoami(opeer, "10.88.0.2") == "paracell"  # the original runs on
        for cid in ("nf-rest", "nf-orig"):
            runtime("delete", "--force", cid, check=True)
        for ns in (ons, rns):
            assert_nothing_left(ns)
        runtime.assert_no_leaks()
