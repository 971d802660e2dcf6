"""What real containers use from the guest kernel, from inside privileged
containers in real VMs: bridges, veth pairs, TAP/TUN and VXLAN; netfilter's
NAT REDIRECT, TPROXY, MASQUERADE and conntrack through iptables-legacy,
iptables-nft and nft; overlayfs; FUSE (guest/kernel/paracell.config).

The userland is Debian's own, taken from this host: tests/hostroot.py copies
dash, iproute2, util-linux's nsenter and unshare, iptables (legacy and nft),
nftables, conntrack, socat and bindfs, with their shared libraries and
iptables' extensions, onto the busybox rootfs. The scenarios are
guest_kernel.sh, run by dash: busybox's sh would run its own `ip` applet
instead of iproute2. Every namespace and address is made inside the VM, which
has no interface but lo, so no packet leaves the guest."""

from __future__ import annotations

import ipaddress
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from paracell.runtime.bundle import spec
from tests import hostroot

pytestmark = pytest.mark.integration

SCENARIOS = Path(__file__).with_name("guest_kernel.sh")
PROGRAMS = ("dash", "ip", "nsenter", "unshare", "iptables-legacy", "ip6tables-legacy",
            "iptables-nft", "ip6tables-nft", "nft", "conntrack", "socat", "bindfs")
# What socat runs for each connection it accepts: what the accepted socket says.
CONNINFO = '#!/bin/sh\necho "$1 local=$SOCAT_SOCKADDR port=$SOCAT_SOCKPORT peer=$SOCAT_PEERADDR"\n'
BASE_LAYER = "from-the-rootfs-layer"
ALL_CAPS = [f"CAP_{name}" for name in spec.CAPABILITIES]
# What `podman run --privileged --device ...` would give: the devices the
# tools open, and a /run for iptables-legacy's lock on a read-only rootfs.
DEVICES = [{"path": "/dev/net/tun", "type": "c", "major": 10, "minor": 200, "fileMode": 0o666},
           {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229, "fileMode": 0o666}]
IFF_TUN, IFF_TAP = 0x1, 0x2


@pytest.fixture(scope="module")
def tools_rootfs(tmp_path_factory: pytest.TempPathFactory, busybox_rootfs: Path) -> Path:
    root = tmp_path_factory.mktemp("kfeat") / "rootfs"
    shutil.copytree(busybox_rootfs, root, symlinks=True)
    xtables = sorted(Path("/usr/lib").glob("*/xtables"))
    hostroot.install_programs(root, PROGRAMS, plugin_dirs=xtables)
    local_bin = root / "usr" / "local" / "bin"
    local_bin.mkdir(parents=True)
    shutil.copy(SCENARIOS, local_bin / "kfeat")
    (local_bin / "conninfo").write_text(CONNINFO)
    (local_bin / "conninfo").chmod(0o755)
    (root / "layers" / "base").mkdir(parents=True)
    (root / "layers" / "base" / "base-file").write_text(BASE_LAYER + "\n")
    return root


def privileged(config: dict[str, Any]) -> None:
    config["process"]["capabilities"] = {
        kind: ALL_CAPS for kind in ("bounding", "effective", "permitted", "inheritable",
                                    "ambient")}
    config["mounts"].append({"destination": "/run", "type": "tmpfs", "source": "tmpfs",
                             "options": ["nosuid", "nodev", "mode=755"]})
    config["linux"]["devices"] = DEVICES


@pytest.fixture
def scenario(runtime, make_bundle, tools_rootfs):
    """scenario(NAME, ARGS...) -> {KEY: [value, ...]} from guest_kernel.sh's
    "KEY value" lines, run in a privileged container of its own VM."""
    def run(*args: str) -> dict[str, list[str]]:
        bundle = make_bundle(["dash", "/usr/local/bin/kfeat", *args], rootfs=tools_rootfs,
                             mutate=privileged)
        result = runtime("run", "--bundle", str(bundle), "-".join(("kf", *args)), timeout=280)
        out = result.stdout.decode()
        assert result.returncode == 0, (out, result.stderr.decode())
        runtime.assert_no_leaks()
        lines: dict[str, list[str]] = {}
        for line in out.splitlines():
            key, _, value = line.partition(" ")
            lines.setdefault(key, []).append(value.strip())
        return lines
    return run


def test_bridge_veth_tun_and_vxlan(scenario):
    out = scenario("links")
    # The reported failure: busybox's brctl got ENOPKG ("Package not installed").
    assert out["brctl"] == ["brctl0"]
    assert sorted(out["ports"][0].split()) == ["tap0", "v0", "v1"]
    flags = {name: int(value, 16) for name, value in
             (item.split("=") for item in out["tun_flags"][0].split())}
    assert flags["tap0"] & (IFF_TUN | IFF_TAP) == IFF_TAP, flags
    assert flags["tun0"] & (IFF_TUN | IFF_TAP) == IFF_TUN, flags
    # Two namespaces on the bridge reach each other, then over a VXLAN on top.
    assert out["bridged-ping"] == ["ok"]
    assert out["vxlan"] == ["vxlan id 42"]
    assert out["vxlan-ping"] == ["ok"]


def _address(text: str) -> str:
    """socat's "[fd99:0000:...:0001]" or "10.99.0.1", compressed."""
    return ipaddress.ip_address(text.strip("[]")).compressed


def _connection(value: str) -> tuple[str, dict[str, str]]:
    """conninfo's "NAME local=A port=P peer=B" as (NAME, fields)."""
    name, *fields = value.split()
    parsed = dict(field.split("=", 1) for field in fields)
    return name, {k: v if k == "port" else _address(v) for k, v in parsed.items()}


@pytest.mark.parametrize("front", ["legacy", "nft", "nftables"],
                         ids=["iptables-legacy", "iptables-nft", "nft"])
def test_netfilter_nat_redirect_tproxy_masquerade_and_conntrack(scenario, front):
    out = scenario("netfilter", front)
    got = {key: _connection(out[key][0]) for key in
           ("redirect4", "redirect6", "tproxy4", "tproxy6", "masquerade4", "masquerade6")}
    # Nothing listens on 8080: REDIRECT took the connections to 9090.
    assert got["redirect4"] == ("redirect", {"local": "10.99.0.1", "port": "9090",
                                             "peer": "10.99.0.2"})
    name, fields = got["redirect6"]
    assert (name, fields["port"], fields["peer"]) == ("redirect", "9090", "fd99::2")
    assert fields["local"] in ("fd99::1", "fd99::3")  # REDIRECT picks an address of v0
    # 10.98.0.7 and fd98::7 are no one's: TPROXY handed the connections to the
    # transparent listener on 9191, whose socket keeps the original destination.
    assert got["tproxy4"] == ("tproxy", {"local": "10.98.0.7", "port": "80",
                                         "peer": "10.99.0.2"})
    assert got["tproxy6"] == ("tproxy", {"local": "fd98::7", "port": "80", "peer": "fd99::2"})
    # The client bound 10.99.0.3 and fd99::3; MASQUERADE gave the peer v0's own address.
    assert got["masquerade4"][1]["peer"] == "10.99.0.1"
    assert got["masquerade6"][1]["peer"] == "fd99::1"
    # conntrack holds the REDIRECTed connections: sent to 8080, answered from 9090.
    assert len(out["conntrack4"]) == 1 and re.search(
        r"src=10\.99\.0\.2 dst=10\.99\.0\.1 sport=(\d+) dport=8080 "
        r"src=10\.99\.0\.1 dst=10\.99\.0\.2 sport=9090 dport=\1 ", out["conntrack4"][0]), out
    assert len(out["conntrack6"]) == 1 and re.search(
        r"src=fd99::2 dst=fd99::1 sport=(\d+) dport=8080 "
        r"src=fd99::[13] dst=fd99::2 sport=9090 dport=\1 ", out["conntrack6"][0]), out
    # The socket match (the TPROXYed connections' later packets), the
    # conntrack and the state matches all counted packets.
    families = ("inet",) if front == "nftables" else ("ip", "ip6")
    counts = {tuple(value.split()[:2]): int(value.split()[2]) for value in out["count"]}
    assert set(counts) == {(f, m) for f in families for m in ("socket", "established", "new")}
    assert all(n > 0 for n in counts.values()), counts
    # Each front end went through its own kernel interface.
    tables = out.get("nft-tables", [""])[0].split("table ")
    nft_tables = sorted(t.strip() for t in tables if t.strip())
    if front == "legacy":
        assert nft_tables == []
        assert sorted(out["legacy-tables"][0].split()) == ["filter", "mangle", "nat"]
    elif front == "nft":
        assert nft_tables == sorted(f"{f} {t}" for f in ("ip", "ip6")
                                    for t in ("filter", "mangle", "nat")), nft_tables
    else:
        assert nft_tables == ["inet mesh"]


def test_overlayfs_stacks_a_rootfs_layer_under_a_tmpfs_one(scenario):
    out = scenario("overlay")
    assert out["mounted"] == ["overlay overlay"]
    assert sorted(out["merged"][0].split()) == ["a", "base-file", "c"]
    assert out["merged/a"] == ["from-tmpfs-layer appended"]
    assert out["merged/base-file"] == [BASE_LAYER]
    # Copy-up left the lower layer alone; the removal is a whiteout in the upper.
    assert out["lower/a"] == ["from-tmpfs-layer"]
    assert sorted(out["upper"][0].split()) == ["a", "b", "c"]
    assert out["whiteout"] == ["character special file 0:0"]


def test_fuse_mount_served_by_bindfs(scenario):
    """bindfs (Debian's, on libfuse3) rather than a test program: what data
    tools do, and an owner and mode that only the daemon can have answered."""
    out = scenario("fuse")
    assert out["mounted"] == ["/tmp/src fuse"]
    assert out["stat"] == ["4242 4343 640 source 0 0 644"]
    assert out["read"] == ["hello-fuse"]
    assert out["source/g"] == ["written-through-fuse"]
    assert out["after-umount"] == ["0"]
