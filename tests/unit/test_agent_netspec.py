"""The agent's network and SANDBOX records against a hostile host:
netspec_harness.c is compiled with the agent's own netspec.c, sandboxspec.c
and spec.c (under the sanitizers where gcc has them) and fed SANDBOX
payloads, START payloads and launch specs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from paracell._native import lib

from paracell.net import guestconfig
from paracell.net.discover import Address, Interface, Route

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "guest" / "agent"
HARNESS = Path(__file__).with_name("netspec_harness.c")
SEP = "\x1f"
SPEC_BASE = [("container", "c1"), ("arg", "/bin/true")]


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("netspec") / "netspec_harness"
    base = ["gcc", "-std=gnu11", "-g", "-O1", "-Wall", "-Wextra", "-Werror",
            f"-I{REPO / 'proto'}", f"-I{AGENT}", "-o", str(exe), str(HARNESS),
            str(AGENT / "netspec.c"), str(AGENT / "sandboxspec.c"), str(AGENT / "spec.c"),
            str(AGENT / "textfields.c")]
    built = subprocess.run([base[0], "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                            *base[1:]], capture_output=True, text=True)
    if built.returncode != 0:
        built = subprocess.run(base, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return exe


def recs(pairs: list[tuple[str, str]]) -> bytes:
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in pairs)


def parse(harness: Path, mode: str, pairs: list[tuple[str, str]] | bytes) -> list[str] | str:
    payload = pairs if isinstance(pairs, bytes) else recs(pairs)
    out = subprocess.run([str(harness), mode], input=payload, capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    lines = out.stdout.decode().splitlines()
    if lines[0].startswith("error "):
        return lines[0][len("error "):]
    assert lines[0] == "ok"
    return lines[1:]


def iface(name: str = "eth0", mac: str = "02:00:00:00:00:01", mtu: str = "1500") -> tuple:
    return ("net.if", SEP.join([name, mac, mtu]))


def test_what_the_host_sends_parses_back(harness):
    interfaces = [
        Interface(3, "eth0", "0a:58:0a:58:00:05", 1450,
                  [Address("10.88.0.5", 16), Address("fd00::5", 64)],
                  [Route("0.0.0.0", 0, "10.88.0.1", 0, False),
                   Route("::", 0, "fd00::1", 1024, False)]),
        Interface(4, "net1", "02:aa:bb:cc:dd:ee", 9000, [Address("192.168.7.2", 24)],
                  [Route("192.168.0.0", 16, "", 5, False),
                   Route("172.16.0.0", 12, "192.168.7.1", 0, True)]),
    ]
    assert parse(harness, "sandbox", guestconfig.records(interfaces)) == [
        "if eth0 0a:58:0a:58:00:05 1450",
        "if net1 02:aa:bb:cc:dd:ee 9000",
        "addr 0 10.88.0.5/16",
        "addr 0 fd00::5/64",
        "addr 1 192.168.7.2/24",
        "route 0 0.0.0.0/0 via 10.88.0.1 metric 0 onlink 0",
        "route 0 ::/0 via fd00::1 metric 1024 onlink 0",
        "route 1 192.168.0.0/16 via - metric 5 onlink 0",
        "route 1 172.16.0.0/12 via 192.168.7.1 metric 0 onlink 1",
    ]


def test_start_payload_takes_over_a_spare(harness):
    spec = parse(harness, "sandbox", [("net.spare", "02:12:34:56:78:9a")])
    assert spec == ["spare 02:12:34:56:78:9a"]
    interfaces = [Interface(5, "eth0", "0a:58:0a:7b:00:02", 1500, [Address("10.123.0.2", 24)], [])]
    start = guestconfig.records(interfaces, ["02:12:34:56:78:9a"])
    assert parse(harness, "start", start) == [
        "if eth0 0a:58:0a:7b:00:02 1500 02:12:34:56:78:9a", "addr 0 10.123.0.2/24"]


@pytest.mark.parametrize("record", [
    iface(name=""), iface(name="a/b"), iface(name="a:b"), iface(name="a b"),
    iface(name="x" * 16), iface(name="."), iface(name=".."), iface(name="e\x01"),
    iface(mac="01:00:5e:00:00:01"), iface(mac="00:00:00:00:00:00"), iface(mac="02:00:00:00:00"),
    iface(mac="02-00-00-00-00-01"), iface(mac="02:00:00:00:00:0g"),
    iface(mtu="67"), iface(mtu="65536"), iface(mtu=""), iface(mtu="-1"), iface(mtu="1500x"),
    ("net.if", "eth0" + SEP + "02:00:00:00:00:01"),
    ("net.if", SEP.join(["eth0", "02:00:00:00:00:01", "1500", "02:00:00:00:00:02", "x"])),
    ("net.addr", "1" + SEP + "10.0.0.2/24"),
    ("net.addr", "0" + SEP + "10.0.0.2/33"),
    ("net.addr", "0" + SEP + "fd00::2/129"),
    ("net.addr", "0" + SEP + "10.0.0.2"),
    ("net.addr", "0" + SEP + "10.0.0.256/24"),
    ("net.addr", "0" + SEP + "fe80::1%eth0/64"),
    ("net.addr", "-0" + SEP + "10.0.0.2/24"),
    ("net.route", SEP.join(["0", "10.0.0.1/24", "", "0", "0"])),
    ("net.route", SEP.join(["0", "0.0.0.0/0", "fd00::1", "0", "0"])),
    ("net.route", SEP.join(["0", "0.0.0.0/0", "10.0.0.1", "4294967296", "0"])),
    ("net.route", SEP.join(["0", "0.0.0.0/0", "10.0.0.1", "0", "2"])),
    ("net.route", SEP.join(["0", "0.0.0.0/0", "10.0.0.1", "0"])),
    ("net.route", SEP.join(["1", "0.0.0.0/0", "10.0.0.1", "0", "0"])),
    ("net.spare", "ff:ff:ff:ff:ff:ff"),
], ids=repr)
def test_garbled_records_fail_in_one_line(harness, record):
    pairs = [record] if record[0] == "net.if" else [iface(), record]
    assert parse(harness, "sandbox", pairs) == f"spec: bad value for {record[0]}"


def test_no_two_interfaces_share_a_name_or_a_mac(harness):
    assert parse(harness, "sandbox", [iface(), iface(mac="02:00:00:00:00:02")]) \
        == "spec: bad value for net.if"
    assert parse(harness, "sandbox", [iface(), iface(name="eth1")]) \
        == "spec: bad value for net.if"
    assert parse(harness, "sandbox", [("net.spare", "02:00:00:00:00:09")] * 2) \
        == f"spec: more than {lib.PC_NET_MAX_SPARES} spare network devices"


@pytest.mark.parametrize("key, limit, what, make", [
    ("net.if", lib.PC_NET_MAX_IFACES, "network interfaces",
     lambda i: iface(name=f"e{i}", mac=f"02:00:00:00:{i // 256:02x}:{i % 256:02x}")),
    ("net.addr", lib.PC_NET_MAX_ADDRS, "network addresses",
     lambda i: ("net.addr", f"0{SEP}10.0.{i // 256}.{i % 256}/32")),
    ("net.route", lib.PC_NET_MAX_ROUTES, "routes",
     lambda i: ("net.route", SEP.join(["0", f"10.{i // 256}.{i % 256}.0/24", "", "0", "0"]))),
])
def test_counts_are_bounded(harness, key, limit, what, make):
    head = [] if key == "net.if" else [iface()]
    assert isinstance(parse(harness, "sandbox", head + [make(i) for i in range(limit)]), list)
    assert parse(harness, "sandbox", head + [make(i) for i in range(limit + 1)]) \
        == f"spec: more than {limit} {what}"


def test_network_records_belong_to_the_sandbox_not_to_a_container(harness):
    """The VM's interfaces are attached once, by SANDBOX (docs/agent-protocol.md)."""
    assert parse(harness, "spec", SPEC_BASE) == []
    assert parse(harness, "spec", SPEC_BASE + [iface()]) == "spec: unknown key net.if"


ENTROPY = "ab" * 32


def test_the_sandbox_records_parse_back(harness):
    assert parse(harness, "sandbox", [("share", "rootfs"), ("share", "podshare"),
                                      ("hostname", "pod-a"), ("clock", "1764576000.000000123"),
                                      ("entropy", ENTROPY), iface()]) == [
        "if eth0 02:00:00:00:00:01 1500", "share rootfs", "share podshare", "hostname pod-a",
        "clock 1764576000.000000123", "entropy 32"]
    assert parse(harness, "sandbox", []) == []


@pytest.mark.parametrize("records, message", [
    ([("share", "etc")], "sandbox: unknown share etc"),
    ([("share", "rootfs"), ("share", "rootfs")], "sandbox: share given twice: rootfs"),
    ([("hostname", "")], "sandbox: bad or repeated hostname"),
    ([("hostname", "a\x01b")], "sandbox: bad or repeated hostname"),
    ([("hostname", "h" * 65)], "sandbox: bad or repeated hostname"),
    ([("hostname", "a"), ("hostname", "b")], "sandbox: bad or repeated hostname"),
    ([("clock", "12")], "sandbox: bad or repeated clock"),
    ([("clock", "12.5")], "sandbox: bad or repeated clock"),
    ([("clock", "-1.000000000")], "sandbox: bad or repeated clock"),
    ([("clock", "9" * 13 + ".000000000")], "sandbox: bad or repeated clock"),
    ([("entropy", "ab" * 31)], "sandbox: bad or repeated entropy"),  # under 32 bytes
    ([("entropy", "ab" * 257)], "sandbox: bad or repeated entropy"),
    ([("entropy", "AB" * 32)], "sandbox: bad or repeated entropy"),
    ([("entropy", "a" * 65)], "sandbox: bad or repeated entropy"),
    ([("entropy", ENTROPY), ("entropy", ENTROPY)], "sandbox: bad or repeated entropy"),
    ([("container", "c1")], "sandbox: unknown key container"),
], ids=repr)
def test_hostile_sandbox_records_fail_in_one_line(harness, records, message):
    assert parse(harness, "sandbox", records) == message


def test_sandbox_records_must_end_with_nul(harness):
    assert parse(harness, "sandbox", recs([("share", "rootfs")])[:-1]) == \
        "sandbox: records must each end with a NUL byte"
    assert parse(harness, "sandbox", b"share\0") == "sandbox: record without '='"


@pytest.mark.parametrize("payload, message", [
    (recs([("net.spare", "02:00:00:00:00:01")]), "spec: unknown key net.spare"),
    (recs([("arg", "/bin/sh")]), "spec: unknown key arg"),
    (recs([iface()])[:-1], "spec: records must each end with a NUL byte"),
    (b"net.if\0", "spec: record without '='"),
])
def test_start_payload_holds_interface_records_only(harness, payload, message):
    assert parse(harness, "start", payload) == message


def test_a_snapshot_mode_sandbox_has_a_root_disk_and_copied_host_files(harness):
    got = parse(harness, "sandbox", [("rootdisk", "rw"), ("hostfile", "0:" + b"127.0.0.1 x".hex()),
                                     ("hostfile", "2:" + b"nameserver 10.0.0.1".hex())])
    assert got == ["rootdisk rw", "hostfile 0 127.0.0.1 x", "hostfile 2 nameserver 10.0.0.1"]
    assert parse(harness, "sandbox", [("rootdisk", "ro")]) == ["rootdisk ro"]


@pytest.mark.parametrize("pairs, why", [
    ([("rootdisk", "rw"), ("rootdisk", "rw")], "bad or repeated rootdisk"),
    ([("rootdisk", "yes")], "bad or repeated rootdisk"),
    ([("rootdisk", "rw"), ("share", "rootfs")], "a rootdisk and a rootfs share"),
    ([("hostfile", "0:41")], "hostfile records without a rootdisk"),
    ([("rootdisk", "rw"), ("share", "hostshare"), ("hostfile", "0:41")],
     "hostfile records without a rootdisk, or with the host share"),
    ([("rootdisk", "rw"), ("hostfile", "0:41"), ("hostfile", "0:42")], "slot given twice"),
    ([("rootdisk", "rw"), ("hostfile", "x:41")], "bad slot"),
    ([("rootdisk", "rw"), ("hostfile", "123:41")], "bad or too many"),
    ([("rootdisk", "rw"), ("hostfile", "0:4")], "bad content"),
    ([("rootdisk", "rw"), ("hostfile", "0:zz")], "bad content"),
    ([("rootdisk", "rw"), ("hostfile", "0:" + "41" * (lib.PC_SANDBOX_HOSTFILE_MAX + 1))],
     "bad content"),
    ([("rootdisk", "rw")] + [("hostfile", f"{i}:41") for i in range(4)], "bad or too many"),
])
def test_bad_snapshot_mode_records_are_refused(harness, pairs, why):
    got = parse(harness, "sandbox", pairs)
    assert isinstance(got, str) and why in got, got


def test_a_forks_identity_parses_and_its_keys_are_refused_in_a_sandbox(harness):
    pairs = [("container", "fork-1"), ("hostname", "fork-1"), ("machineid", "ab" * 16),
             ("entropy", "00" * 32)]
    got = parse(harness, "forked", pairs)
    assert "container fork-1" in got and f"machineid {'ab' * 16}" in got
    assert parse(harness, "sandbox", pairs) == "sandbox: unknown key container"
    for bad in ([("machineid", "xy" * 16)], [("machineid", "ab")],
                [("container", "a/b" * 100)], [("container", "c"), ("container", "d")]):
        got = parse(harness, "forked", bad)
        assert isinstance(got, str) and "bad or repeated" in got, (bad, got)


def test_a_forks_network_parses_and_names_no_spare_or_device(harness):
    """What the host sends in FORKED (forking.identity_payload, with a
    namespace's records) parses back; a spare or a device MAC, which only a
    SANDBOX or START may name, is refused."""
    from paracell.net.discover import Address, Interface, Route
    from paracell.net.guestconfig import records
    from paracell.runtime.snapshots.forking import ForkSource, identity_payload

    eth = Interface(3, "net1", "02:00:00:00:00:07", 1400, [Address("10.83.0.2", 24)],
                    [Route("0.0.0.0", 0, "10.83.0.1", 0, False)])
    source = ForkSource("/p", "c", "fork-1", "/d")
    got = parse(harness, "forked", identity_payload(source, records([eth])))
    assert "if net1 02:00:00:00:00:07 1400" in got[0] and "container fork-1" in got, got
    assert any("10.83.0.2/24" in line for line in got), got
    identity = [("container", "fork-1"), ("hostname", "fork-1"), ("machineid", "ab" * 16),
                ("entropy", "00" * 32)]
    for bad in ([("net.spare", "02:00:00:00:00:08")],
                [("net.if", SEP.join(["eth0", "02:00:00:00:00:01", "1500",
                                      "02:00:00:00:00:02"]))]):
        got = parse(harness, "forked", identity + bad)
        assert got == "sandbox: a fork's interfaces name no spare and no device MAC", got
        assert isinstance(parse(harness, "sandbox", bad), list)  # a SANDBOX's to name
