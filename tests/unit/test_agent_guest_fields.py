"""The agent's parsers for the records of issue 9's in-guest fields (mount
propagation and attributes, devices, id maps, ioprio, personality, seccomp)
and for PC_SECCOMP frames, against hostile values, through the same C
harness as test_agent_parsers.py."""

from __future__ import annotations

import struct

import pytest

from tests.unit.test_agent_parsers import BASE, fields, harness, parse, recs, run  # noqa: F401

MS_REC, MS_PRIVATE, MS_SHARED = 0x4000, 1 << 18, 1 << 20
U = "\x1f"


def test_new_records_parse_to_their_fields(harness):  # noqa: F811
    parsed = parse(harness, recs(
        *BASE,
        ("mount", U.join(["/mnt", "tmpfs", "tmpfs", "0", "", str(MS_SHARED | MS_REC),
                          "1", "112", "1"])),
        ("device", U.join(["/dev/net/tun", "c", "10", "200", "666", "0", "5"])),
        ("device", U.join(["/dev/fifo", "p", "0", "0", "600", "4294967294", "0"])),
        ("userns", "1"), ("uidmap", "0 100000 65536"), ("gidmap", "0 100000 1"),
        ("gidmap", "1 200000 4294967295"[:0] + "1 200000 10"),
        ("root.propagation", str(MS_PRIVATE | MS_REC)), ("personality", "8"),
        ("ioprio", "1 7"), ("seccomp", "1")))
    assert fields(parsed, "mount+") == [f"{MS_SHARED | MS_REC}|1|112|1"]
    assert fields(parsed, "device") == ["/dev/net/tun|c|10|200|666|0|5",
                                        "/dev/fifo|p|0|0|600|4294967294|0"]
    assert fields(parsed, "uidmap") == ["0 100000 65536"]
    assert fields(parsed, "gidmap") == ["0 100000 1", "1 200000 10"]
    assert fields(parsed, "root.propagation") == [str(MS_PRIVATE | MS_REC)]
    assert fields(parsed, "personality") == ["8"]
    assert fields(parsed, "ioprio") == ["1 7"]
    assert fields(parsed, "seccomp") == ["1"]
    assert fields(parsed, "role") == ["init"]
    # ioprio is a process field: an exec may have it.
    assert fields(parse(harness, recs(*BASE, ("role", "exec"), ("ioprio", "3 0"))),
                  "ioprio") == ["3 0"]


@pytest.mark.parametrize("key, value", [
    ("mount", U.join(["/m", "tmpfs", "", "0", "", "0", "0", "0"])),  # 8 fields
    ("mount", U.join(["/m", "tmpfs", "", "0", "", str(MS_SHARED | MS_PRIVATE), "0", "0", "0"])),
    ("mount", U.join(["/m", "tmpfs", "", "0", "", "1", "0", "0", "0"])),
    ("mount", U.join(["/m", "tmpfs", "", "0", "", "0", "256", "0", "0"])),
    ("mount", U.join(["/m", "tmpfs", "", "0", "", "0", "0", "0", "2"])),
    ("device", U.join(["/dev/../etc/x", "c", "1", "3", "666", "0", "0"])),
    ("device", U.join(["/dev/a/..", "c", "1", "3", "666", "0", "0"])),
    ("device", U.join(["/etc/x", "c", "1", "3", "666", "0", "0"])),
    ("device", U.join(["/dev/", "c", "1", "3", "666", "0", "0"])),
    ("device", U.join(["/dev/x", "u", "1", "3", "666", "0", "0"])),
    ("device", U.join(["/dev/x", "c", "4096", "3", "666", "0", "0"])),
    ("device", U.join(["/dev/x", "c", "1", "1048576", "666", "0", "0"])),
    ("device", U.join(["/dev/x", "c", "1", "3", "17777", "0", "0"])),
    ("device", U.join(["/dev/x", "c", "1", "3", "666", "4294967295", "0"])),
    ("uidmap", "0 0 0"), ("uidmap", "0 1 4294967295"), ("uidmap", "-1 0 1"), ("uidmap", "0 0"),
    ("root.propagation", "0"), ("root.propagation", str(MS_REC)), ("root.propagation", "x"),
    ("personality", "1"), ("personality", "0x8"), ("ioprio", "0 0"), ("ioprio", "4 0"),
    ("ioprio", "2 8"), ("ioprio", "2"), ("seccomp", "2"),
])
def test_hostile_values_are_refused(harness, key, value):  # noqa: F811
    records = [*BASE, (key, value)]
    if key == "uidmap":
        records += [("userns", "1"), ("gidmap", "0 0 1")]
    assert parse(harness, recs(*records)) == f"spec: bad value for {key}"


def test_id_maps_need_the_namespace_and_stay_bounded(harness):  # noqa: F811
    need = "spec: userns=1 needs uidmap and gidmap lines, and they need userns=1"
    assert parse(harness, recs(*BASE, ("uidmap", "0 0 1"), ("gidmap", "0 0 1"))) == need
    assert parse(harness, recs(*BASE, ("userns", "1"), ("uidmap", "0 0 1"))) == need
    lines = [("uidmap", f"{i} {i} 1") for i in range(341)]
    assert parse(harness, recs(*BASE, ("userns", "1"), *lines, ("gidmap", "0 0 1"))) == \
        "spec: more than 340 uidmap lines"
    # 340 lines of big numbers are over the kernel's one page.
    big = [("gidmap", f"{4000000000 + i} {4000000000 + i} 1") for i in range(200)]
    assert parse(harness, recs(*BASE, ("userns", "1"), ("uidmap", "0 0 1"), *big)) == \
        "spec: an id map is longer than 4095 bytes"


def test_init_only_keys_refuse_role_exec(harness):  # noqa: F811
    for key, value in (("device", U.join(["/dev/x", "p", "0", "0", "600", "0", "0"])),
                       ("userns", "1"), ("personality", "0"), ("seccomp", "1"),
                       ("root.propagation", str(MS_SHARED))):
        assert parse(harness, recs(*BASE, ("role", "exec"), (key, value))) == \
            f"spec: {key} is for a container's init, not for role=exec"


def test_device_count_is_bounded(harness):  # noqa: F811
    devs = [("device", U.join([f"/dev/d{i}", "p", "0", "0", "600", "0", "0"])) for i in range(257)]
    assert parse(harness, recs(*BASE, *devs)) == "spec: more than 256 devices"


def seccomp(harness, payload: bytes) -> str:  # noqa: F811
    lines, _ = run(harness, "seccomp", payload=payload)
    return lines[0]


def insns(n: int) -> bytes:
    # BPF_RET|BPF_K SECCOMP_RET_ALLOW, with k counting up so both ends show.
    return b"".join(struct.pack("<HBBI", 0x06, 0, 0, i) for i in range(n))


def test_seccomp_frames(harness):  # noqa: F811
    assert seccomp(harness, struct.pack("<II", 6, 3) + insns(3)) == "ok 6 3 0 2"
    assert seccomp(harness, struct.pack("<II", 0, 4096) + insns(4096)) == "ok 0 4096 0 4095"
    assert seccomp(harness, b"") == "error seccomp: frame of 0 bytes has no header"
    assert seccomp(harness, struct.pack("<II", 0, 0)) == "error seccomp: 0 instructions in 8 bytes"
    assert seccomp(harness, struct.pack("<II", 0, 4097) + insns(4097)) == \
        "error seccomp: 4097 instructions in 32784 bytes"
    assert seccomp(harness, struct.pack("<II", 0, 3) + insns(2)) == \
        "error seccomp: 3 instructions in 24 bytes"
    assert seccomp(harness, struct.pack("<II", 0, 1) + insns(1) + b"x") == \
        "error seccomp: 1 instructions in 17 bytes"
    # TSYNC (1) and NEW_LISTENER (8) are not taken from the host.
    assert seccomp(harness, struct.pack("<II", 8, 1) + insns(1)) == \
        "error seccomp: flags 0x8 not allowed"
    assert seccomp(harness, struct.pack("<II", 1, 1) + insns(1)) == \
        "error seccomp: flags 0x1 not allowed"
