"""The guest agent's parsers against a hostile host, on the host: a small C
harness (agent_harness.c) is compiled with the agent's own spec.c, channel.c,
container.c and log.c, under AddressSanitizer and UBSan where gcc has them, and
fed launch specs, frame streams and container-table scripts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "guest" / "agent"
HARNESS_SRC = Path(__file__).with_name("agent_harness.c")
AGENT_MODULES = ("spec.c", "netspec.c", "textfields.c", "channel.c", "container.c", "log.c",
                 "seccomp.c", "cgroup.c")
WARNINGS = ["-Wall", "-Wextra", "-Werror"]
SANITIZERS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]

SPEC_ERROR_ID = "spec: container id must be 1 to 255 printable ASCII characters, no '/'"


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("agent") / "agent_harness"
    sources = [str(HARNESS_SRC), *(str(AGENT / m) for m in AGENT_MODULES)]
    base = ["gcc", "-std=gnu11", "-g", "-O1", *WARNINGS, f"-I{REPO / 'proto'}", f"-I{AGENT}",
            "-o", str(exe), *sources]
    built = subprocess.run([*base[:1], *SANITIZERS, *base[1:]], capture_output=True, text=True)
    if built.returncode != 0:
        # A gcc without the sanitizer runtimes still checks every outcome.
        built = subprocess.run(base, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return exe


def run(harness: Path, *args: str, payload: bytes = b"") -> tuple[list[str], str]:
    out = subprocess.run([str(harness), *args], input=payload, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    return out.stdout.decode().splitlines(), out.stderr.decode()


# ---- launch specs ----

def recs(*pairs: tuple[str | bytes, str | bytes]) -> bytes:
    def b(x: str | bytes) -> bytes:
        return x.encode() if isinstance(x, str) else x

    return b"".join(b(k) + b"=" + b(v) + b"\0" for k, v in pairs)


BASE = (("container", "c1"), ("arg", "/bin/true"))


def parse(harness: Path, payload: bytes) -> list[tuple[str, str]] | str:
    lines, _ = run(harness, "spec", payload=payload)
    if lines[0].startswith("error "):
        assert len(lines) == 1
        return lines[0][len("error "):]
    assert lines[0] == "ok"
    return [tuple(ln.split(" ", 1)) for ln in lines[1:]]


def fields(parsed: list[tuple[str, str]] | str, key: str) -> list[str]:
    assert isinstance(parsed, list), parsed
    return [v for k, v in parsed if k == key]


def test_full_init_spec_parses_to_every_field(harness):
    payload = recs(
        ("container", "web-1.a_b+c"), ("arg", "sh"), ("arg", ""), ("arg", "a b\x1fc"),
        ("env", "PATH=/bin"), ("env", "EMPTY="), ("cwd", "/srv"), ("uid", "1000"),
        ("gid", "4294967294"), ("gid+", "0"), ("gid+", "27"), ("umask", "027"),
        ("rlimit", "7 1024 18446744073709551615"), ("nnp", "1"),
        ("cap.bounding", "0x3fffffffff"), ("cap.effective", "0"),
        ("cap.ambient", "FFFFFFFFFFFFFFFF"),
        ("terminal", "1"), ("rows", "65535"), ("cols", "0"), ("hostname", "h" * 64),
        ("root.readonly", "0"),
        ("mount", "/proc\x1fproc\x1fproc\x1f14\x1f"),
        ("mount", "/etc/hosts\x1fbind\x1f/hostshare/0\x1f4096\x1fro,x=y"),
    )
    assert parse(harness, payload) == [
        ("container", "web-1.a_b+c"), ("role", "init"),
        ("arg", "sh"), ("arg", ""), ("arg", "a b\\x1fc"), ("argv_end", "null"),
        ("env", "PATH=/bin"), ("env", "EMPTY="), ("envp_end", "null"),
        ("cwd", "/srv"), ("uid", "1000"), ("gid", "4294967294"), ("gid+", "0"), ("gid+", "27"),
        ("umask", "27"), ("rlimit", "7:1024:18446744073709551615"), ("nnp", "1"),
        ("cap.bounding", "3fffffffff"), ("cap.effective", "0"), ("cap.ambient", "ffffffffffffffff"),
        ("terminal", "1"), ("rows", "65535"), ("cols", "0"), ("hostname", "h" * 64),
        ("root.readonly", "0"),
        ("mount", "/proc|proc|proc|14|"),
        ("mount", "/etc/hosts|bind|/hostshare/0|4096|ro,x=y"),
    ]


def test_exec_spec_has_no_role_until_it_says_so(harness):
    assert fields(parse(harness, recs(*BASE)), "role") == ["any"]
    assert fields(parse(harness, recs(*BASE, ("role", "exec"))), "role") == ["exec"]
    assert fields(parse(harness, recs(*BASE, ("role", "init"))), "role") == ["init"]
    # Keys that only an init applies make the spec an init request.
    assert fields(parse(harness, recs(*BASE, ("root.readonly", "1"))), "role") == ["init"]
    assert fields(parse(harness, recs(*BASE, ("xgates", "on"))), "role") == ["init"]


@pytest.mark.parametrize("value", ["off", "1", "", "ON", "on "])
def test_xgates_is_on_or_absent(harness, value):
    assert parse(harness, recs(*BASE, ("xgates", value))) == "spec: bad value for xgates"


def test_xgates_is_for_an_init_only(harness):
    assert parse(harness, recs(*BASE, ("xgates", "on"), ("role", "exec"))) == \
        "spec: xgates is for a container's init, not for role=exec"
    assert parse(harness, recs(*BASE, ("xgates", "on"), ("xgates", "on"))) == \
        "spec: duplicate key xgates"


@pytest.mark.parametrize("payload, error", [
    (b"", "spec: records must each end with a NUL byte"),
    (b"container=c1\0arg=/bin/true", "spec: records must each end with a NUL byte"),
    (b"container=c1\0arg=/bin/tr", "spec: records must each end with a NUL byte"),
    (b"container=c1", "spec: records must each end with a NUL byte"),
    (b"\0", "spec: record without '='"),
    (b"container=c1\0arg\0", "spec: record without '='"),
    (b"container=c1\0\0arg=x\0", "spec: record without '='"),
    (b"container=c1\0=x\0", "spec: unknown key "),
    (b"container=c1\0bogus=1\0", "spec: unknown key bogus"),
    (b"container=c1\0cap.bogus=1\0", "spec: unknown key cap.bogus"),
    (b"container=c1\0k\x01\xffy=1\0", "spec: unknown key k\\x01\\xffy"),
    (b"container=c1\0" + b"k" * 300 + b"=1\0", "spec: unknown key " + "k" * 40),
    (b"container=c1\0ARG=x\0", "spec: unknown key ARG"),
    (b"container=c1\0 arg=x\0", "spec: unknown key  arg"),
    (recs(("container", "c1")), "spec: no arg given"),
    (recs(("container", "c1"), ("arg", "")), "spec: no arg given"),
    (recs(("arg", "/bin/true")), "spec: no container given"),
    (recs(*BASE, ("uid", "1"), ("uid", "1")), "spec: duplicate key uid"),
    (recs(*BASE, ("container", "c1")), "spec: duplicate key container"),
    (recs(*BASE, ("role", "init"), ("role", "init")), "spec: duplicate key role"),
    (recs(*BASE, ("cap.ambient", "0"), ("cap.ambient", "0")), "spec: duplicate key cap.ambient"),
])
def test_malformed_records(harness, payload, error):
    assert parse(harness, payload) == error


@pytest.mark.parametrize("key, value", [
    # unsigned decimals: no sign, no space, no other base, no overflow
    ("uid", "-1"), ("uid", "+1"), ("uid", " 1"), ("uid", "1 "), ("uid", ""), ("uid", "0x10"),
    ("uid", "4294967295"), ("uid", "99999999999999999999999999"), ("gid", "-0"),
    ("gid+", "4294967296"), ("gid+", "1e3"), ("rows", "65536"), ("cols", "-1"),
    ("umask", "8"), ("umask", "0778"), ("umask", "1000"), ("umask", "-022"), ("umask", ""),
    # capability masks: hex, at most 64 bits
    ("cap.bounding", ""), ("cap.bounding", "0x"), ("cap.bounding", "-1"), ("cap.bounding", "g"),
    ("cap.bounding", "10000000000000000"), ("cap.effective", "0x-1"), ("cap.permitted", " 1"),
    ("cap.inheritable", "ff ff"), ("cap.ambient", "0xx1"),
    # rlimit: "resource soft hard", single spaces, soft <= hard, resource < RLIM_NLIMITS
    ("rlimit", "7 1024"), ("rlimit", "7 1 1 1"), ("rlimit", "7  1 1"), ("rlimit", "16 1 1"),
    ("rlimit", "-1 1 1"), ("rlimit", "7 -1 1"), ("rlimit", "7 2 1"),
    ("rlimit", "7 1 18446744073709551616"), ("rlimit", ""),
    # booleans are exactly 0 or 1
    ("nnp", "2"), ("nnp", ""), ("terminal", "yes"), ("root.readonly", "true"),
    # mounts: five fields, absolute dest, a type, decimal flags within unsigned long
    ("mount", "/a\x1fb\x1fc\x1f0"), ("mount", "/a\x1fb\x1fc\x1f0\x1fd\x1fe"), ("mount", ""),
    ("mount", "a\x1fb\x1fc\x1f0\x1f"), ("mount", "/a\x1f\x1fc\x1f0\x1f"),
    ("mount", "/a\x1fb\x1fc\x1fro\x1f"), ("mount", "/a\x1fb\x1fc\x1f18446744073709551616\x1f"),
    ("mount", "/a\x1fb\x1fc\x1f-1\x1f"),
    # other values
    ("env", "NOEQUALS"), ("env", "=x"), ("cwd", "relative"), ("cwd", ""),
    ("hostname", "h" * 65), ("role", "pod"), ("role", ""),
])
def test_bad_values(harness, key, value):
    assert parse(harness, recs(*BASE, (key, value))) == f"spec: bad value for {key}"


@pytest.mark.parametrize("key, value, limit, noun", [
    ("arg", "x", 4096, "args"),
    ("env", "A=1", 4096, "env entries"),
    ("mount", "/m\x1ftmpfs\x1f\x1f0\x1f", 256, "mounts"),
    ("gid+", "7", 256, "additional gids"),
    ("rlimit", "7 1 1", 64, "rlimits"),
    ("sysctl", "kernel/shmmax=1", 256, "sysctls"),
    ("path.readonly", "/proc/sys", 256, "read-only paths"),
    ("path.masked", "/proc/kcore", 256, "masked paths"),
])
def test_repeated_keys_up_to_their_limit(harness, key, value, limit, noun):
    at_limit = [(key, value)] * (limit - (key == "arg"))
    parsed = parse(harness, recs(*BASE, *at_limit))
    assert len(fields(parsed, key)) == limit
    over = parse(harness, recs(*BASE, *at_limit, (key, value)))
    assert over == f"spec: more than {limit} {noun}"


@pytest.mark.parametrize("cid", [b"", b"a" * 256, b"a/b", b"/", b"a\x01", b"\x7f", b"caf\xc3\xa9",
                                 b"a\nb", b"\x1f", b"tab\there"])
def test_bad_container_ids(harness, cid):
    assert parse(harness, recs(("container", cid), ("arg", "x"))) == SPEC_ERROR_ID


@pytest.mark.parametrize("cid", ["a" * 255, "x", "a b", "~!@#$%^&*()=:;\"'<>?,.|\\"])
def test_container_ids_within_the_rule(harness, cid):
    printed = cid.replace("\\", "\\x5c")
    assert fields(parse(harness, recs(("container", cid), ("arg", "x"))), "container") == [printed]


def test_a_members_limits_make_an_init(harness):
    parsed = parse(harness, recs(*BASE, ("memory.max", str(64 << 20)),
                                 ("pids.max", "9223372036854775807")))
    assert fields(parsed, "role") == ["init"]
    assert fields(parsed, "memory.max") == [str(64 << 20)]
    assert fields(parsed, "pids.max") == ["9223372036854775807"]


@pytest.mark.parametrize("key, value", [
    ("memory.max", "0"), ("memory.max", "-1"), ("memory.max", "max"), ("memory.max", ""),
    ("memory.max", "9223372036854775808"), ("pids.max", "0"), ("pids.max", "1k"),
])
def test_bad_member_limits(harness, key, value):
    assert parse(harness, recs(*BASE, (key, value))) == f"spec: bad value for {key}"


@pytest.mark.parametrize("key, value", [
    ("memory.max", "1"), ("pids.max", "1"),
    ("hostname", "h"), ("root.readonly", "0"), ("mount", "/proc\x1fproc\x1fproc\x1f0\x1f"),
    ("sysctl", "kernel/shmmax=1"), ("path.readonly", "/proc/sys"), ("path.masked", "/proc/kcore"),
])
def test_init_only_keys_contradict_role_exec(harness, key, value):
    assert (parse(harness, recs(*BASE, ("role", "exec"), (key, value)))
            == f"spec: {key} is for a container's init, not for role=exec")


def test_sysctls_paths_and_oom_score_adj_parse(harness):
    parsed = parse(harness, recs(
        *BASE, ("oom_score_adj", "-1000"), ("sysctl", "kernel/sem=250 32000 100 128"),
        ("sysctl", "net/ipv4/conf/eth-0.100/forwarding=x=y"), ("sysctl", "kernel/domainname="),
        ("path.readonly", "/proc/sys"), ("path.masked", "/proc/kcore"),
        ("path.masked", "/../a\x1fb"), ("path.readonly", "/")))
    assert fields(parsed, "role") == ["init"]
    assert fields(parsed, "oom_score_adj") == ["-1000"]
    assert fields(parsed, "sysctl") == ["kernel/sem|250 32000 100 128",
                                        "net/ipv4/conf/eth-0.100/forwarding|x=y",
                                        "kernel/domainname|"]
    assert fields(parsed, "path.readonly") == ["/proc/sys", "/"]
    assert fields(parsed, "path.masked") == ["/proc/kcore", "/../a\\x1fb"]


@pytest.mark.parametrize("value", ["-1000", "-0", "0", "999", "1000"])
def test_oom_score_adj_range_and_any_role(harness, value):
    parsed = parse(harness, recs(*BASE, ("role", "exec"), ("oom_score_adj", value)))
    assert fields(parsed, "oom_score_adj") == [str(int(value))]


@pytest.mark.parametrize("key, value", [
    ("oom_score_adj", "1001"), ("oom_score_adj", "-1001"), ("oom_score_adj", "+1"),
    ("oom_score_adj", "--1"), ("oom_score_adj", "-"), ("oom_score_adj", ""),
    ("oom_score_adj", " 1"), ("oom_score_adj", "0x10"), ("oom_score_adj", "99999999999999999999"),
    # sysctl: path=value, the path [A-Za-z0-9_.-] parts under /proc/sys, both bounded
    ("sysctl", ""), ("sysctl", "kernel/shmmax"), ("sysctl", "=1"), ("sysctl", "/kernel=1"),
    ("sysctl", "kernel/=1"), ("sysctl", "kernel//shmmax=1"), ("sysctl", "../../etc/passwd=1"),
    ("sysctl", "net/./x=1"), ("sysctl", "net/..=1"), ("sysctl", ".=1"),
    ("sysctl", "a b=1"), ("sysctl", "a\x01=1"), ("sysctl", "a\\b=1"),
    ("sysctl", "k\xc3\xa4=1"), ("sysctl", "k" * 256 + "=1"), ("sysctl", "k=" + "v" * 4096),
    # paths: absolute, bounded
    ("path.readonly", ""), ("path.readonly", "proc/sys"), ("path.masked", "."),
    ("path.masked", "/" + "a" * 4095),
])
def test_bad_values_of_the_guest_applied_fields(harness, key, value):
    assert parse(harness, recs(*BASE, (key, value))) == f"spec: bad value for {key}"


def test_bounds_of_the_guest_applied_fields_are_accepted(harness):
    parsed = parse(harness, recs(*BASE, ("sysctl", "k" * 255 + "=" + "v" * 4095),
                                 ("path.masked", "/" + "a" * 4094)))
    assert fields(parsed, "sysctl") == ["k" * 255 + "|" + "v" * 4095]
    assert fields(parsed, "path.masked") == ["/" + "a" * 4094]


def test_oom_score_adj_once(harness):
    assert parse(harness, recs(*BASE, ("oom_score_adj", "1"), ("oom_score_adj", "1"))) == \
        "spec: duplicate key oom_score_adj"


# ---- frames ----

def hdr(length: int, ftype: int, chan: int) -> bytes:
    return length.to_bytes(4, "little") + ftype.to_bytes(2, "little") + chan.to_bytes(2, "little")


def frame(ftype: int, chan: int, payload: bytes = b"") -> bytes:
    return hdr(len(payload), ftype, chan) + payload


def frames(harness: Path, *chunks: bytes) -> tuple[list[str], str]:
    """Each chunk reaches the agent's buffer before the frames in it are read."""
    stream = b"".join(len(c).to_bytes(4, "little") + c for c in chunks)
    return run(harness, "frames", payload=stream)


def test_whole_frames_decode(harness):
    spec = b"container=c\0arg=x\0"
    stream = (frame(1, 0, spec) + frame(2, 0) + frame(3, 7, b"\xff\x01")
              + frame(4, 1024, (15).to_bytes(4, "little") + (1).to_bytes(4, "little"))
              + frame(5, 3, (24).to_bytes(2, "little") + (80).to_bytes(2, "little"))
              + frame(6, 0))
    lines, _ = frames(harness, stream)
    assert lines == [
        f"frame type=1 chan=0 len=18 data_sum={sum(spec)}",
        "frame type=2 chan=0 len=0 data_sum=0",
        "frame type=3 chan=7 len=2 data_sum=256",
        "frame type=4 chan=1024 len=8 signal=15 flags=1",
        "frame type=5 chan=3 len=4 rows=24 cols=80",
        "frame type=6 chan=0 len=0 data_sum=0",
        "buffered 0",
    ]


def test_split_header_and_payload_wait_for_the_rest(harness):
    whole = frame(3, 2, b"abcdef")
    lines, _ = frames(harness, whole[:1], whole[1:7], whole[7:9], whole[9:], b"")
    assert lines == [
        "buffered 1", "buffered 7", "buffered 9",
        f"frame type=3 chan=2 len=6 data_sum={sum(b'abcdef')}", "buffered 0",
        "buffered 0",
    ]


def test_byte_by_byte_stream(harness):
    stream = frame(3, 1, b"xy") + frame(3, 1)
    lines, _ = frames(harness, *(stream[i:i + 1] for i in range(len(stream))))
    assert lines == [f"buffered {n}" for n in range(1, 10)] + [
        f"frame type=3 chan=1 len=2 data_sum={ord('x') + ord('y')}", "buffered 0",
        *(f"buffered {n}" for n in range(1, 8)),
        "frame type=3 chan=1 len=0 data_sum=0", "buffered 0",
    ]


def test_zero_length_frames(harness):
    lines, _ = frames(harness, frame(3, 0) * 3 + frame(2, 5) + frame(1, 9))
    assert lines == ["frame type=3 chan=0 len=0 data_sum=0"] * 3 + [
        "frame type=2 chan=5 len=0 data_sum=0",
        "frame type=1 chan=9 len=0 data_sum=0",
        "buffered 0",
    ]


def test_biggest_frame_is_taken(harness):
    payload = bytes(range(256)) * 256
    assert len(payload) == 65536
    lines, _ = frames(harness, frame(3, 4, payload))
    assert lines == [f"frame type=3 chan=4 len=65536 data_sum={sum(payload)}", "buffered 0"]


@pytest.mark.parametrize("length", [65537, 0x7FFFFFFF, 0xFFFFFFFF])
def test_length_over_the_limit_discards_the_stream(harness, length):
    good = frame(2, 1)
    bad = hdr(length, 3, 1) + b"tail bytes"
    lines, err = frames(harness, good + bad, frame(2, 2))
    # Nothing after the bad length can be trusted: it and its tail are dropped,
    # and later bytes are read as a fresh stream.
    assert lines == ["frame type=2 chan=1 len=0 data_sum=0", "buffered 0",
                     "frame type=2 chan=2 len=0 data_sum=0", "buffered 0"]
    assert (f"paracell-agent: protocol: frame length {length} over the limit, "
            f"discarding 18 buffered bytes") in err


@pytest.mark.parametrize("stream, why", [
    (frame(0, 0), "unknown frame type 0 (chan 0, 0 bytes)"),
    (frame(10, 1, b"zz"), "unknown frame type 10 (chan 1, 2 bytes)"),
    (frame(16, 0, b"paracell-agent 1"), "unknown frame type 16 (chan 0, 16 bytes)"),
    (frame(21, 0, b"err"), "unknown frame type 21 (chan 0, 3 bytes)"),
    (frame(40, 0), "unknown frame type 40 (chan 0, 0 bytes)"),
    (frame(0xFFFF, 3), "unknown frame type 65535 (chan 3, 0 bytes)"),
    (frame(1, 1025, b"x\0"), "frame type 1 for chan 1025 out of range"),
    (frame(3, 0xFFFF), "frame type 3 for chan 65535 out of range"),
    (frame(99, 2000), "frame type 99 for chan 2000 out of range"),
    (frame(4, 0), "SIGNAL with 0 bytes"),
    (frame(4, 0, b"\x09\0\0\0\0\0\0"), "SIGNAL with 7 bytes"),
    (frame(4, 0, b"\x09" + b"\0" * 8), "SIGNAL with 9 bytes"),
    (frame(5, 0, b"\x18\0\x50"), "RESIZE with 3 bytes"),
    (frame(5, 0, b"\x18\0\x50\0\0"), "RESIZE with 5 bytes"),
    # STATS: on a channel the relay gave it, naming a container id.
    (frame(8, 0, b"c1"), "STATS with 2 bytes on chan 0"),
    (frame(8, 3), "STATS with 0 bytes on chan 3"),
    (frame(8, 3, b"c\0d"), "STATS with 3 bytes on chan 3"),
    (frame(8, 3, b"c" * 256), "STATS with 256 bytes on chan 3"),
    (frame(9, 0, b"container=c\0"), "LIMITS with 12 bytes on chan 0"),
    (frame(9, 2), "LIMITS with 0 bytes on chan 2"),
    (frame(9, 2, b"x" * 513), "LIMITS with 513 bytes on chan 2"),
])
def test_frames_that_break_the_protocol_are_dropped(harness, stream, why):
    lines, _ = frames(harness, stream + frame(2, 0))
    h = stream[:8]
    head = (f"frame type={int.from_bytes(h[4:6], 'little')} chan={int.from_bytes(h[6:8], 'little')}"
            f" len={int.from_bytes(h[:4], 'little')}")
    assert lines == [f"{head} dropped {why}",
                     "frame type=2 chan=0 len=0 data_sum=0", "buffered 0"]


@pytest.mark.parametrize("payload, parsed", [
    (recs(("container", "m1"), ("memory.max", "33554432")),
     ["ok", "container m1", "memory.max 33554432", "pids.max 0"]),
    (recs(("pids.max", "max"), ("container", "m1")),
     ["ok", "container m1", "memory.max 0", "pids.max max"]),
    (recs(("container", "m1"), ("memory.max", "max"), ("pids.max", "9223372036854775807")),
     ["ok", "container m1", "memory.max max", "pids.max 9223372036854775807"]),
])
def test_limits_name_a_container_and_a_limit_or_max(harness, payload, parsed):
    assert run(harness, "limits", payload=payload)[0] == parsed


@pytest.mark.parametrize("payload, error", [
    (recs(("container", "m1")), "limits: a container and at least one limit are needed"),
    (recs(("memory.max", "1")), "limits: a container and at least one limit are needed"),
    (recs(("container", "m1"), ("memory.max", "0")), "limits: bad or repeated record memory.max"),
    (recs(("container", "m1"), ("memory.max", "-1")), "limits: bad or repeated record memory.max"),
    (recs(("container", "m1"), ("pids.max", "9223372036854775808")),
     "limits: bad or repeated record pids.max"),
    (recs(("container", "m1"), ("pids.max", "1"), ("pids.max", "2")),
     "limits: bad or repeated record pids.max"),
    (recs(("container", "a/b"), ("pids.max", "1")), "limits: bad or repeated record container"),
    (recs(("container", "m1"), ("cpu.max", "1")), "limits: bad or repeated record cpu.max"),
    (b"container=m1\0pids.max=1", "limits: at most 512 bytes of records, each ending with NUL"),
    (recs(("container", "m1"), ("pids.max", "1" * 600)),
     "limits: at most 512 bytes of records, each ending with NUL"),
    (b"container\0", "limits: record without '='"),
])
def test_bad_limits_are_refused(harness, payload, error):
    assert run(harness, "limits", payload=payload)[0] == [f"error {error}"]


def test_a_stats_request_names_a_container(harness):
    lines, _ = frames(harness, frame(8, 3, b"c" * 255) + frame(8, 1024, b"member-1"))
    assert lines == [f"frame type=8 chan=3 len=255 data_sum={ord('c') * 255}",
                     f"frame type=8 chan=1024 len=8 data_sum={sum(b'member-1')}", "buffered 0"]


def test_signal_numbers_pass_through_for_the_process_layer_to_judge(harness):
    payload = (0xFFFFFFFF).to_bytes(4, "little") + (0xFFFFFFFF).to_bytes(4, "little")
    lines, _ = frames(harness, frame(4, 0, payload))
    assert lines == ["frame type=4 chan=0 len=8 signal=4294967295 flags=4294967295",
                     "buffered 0"]


# ---- container slots ----

def ctr(harness: Path, *ops: str) -> list[str]:
    return run(harness, "ctr", *ops)[0]


def cid(name: str) -> str:
    return name.encode().hex()


def test_first_spec_creates_later_ones_join(harness):
    a, b = cid("a"), cid("b")
    assert ctr(harness, "allended", f"claim:{a}:any", f"start:{a}", f"state:{a}",
               f"claim:{a}:any", f"claim:{a}:exec", f"claim:{b}:exec", f"claim:{a}:init",
               "allended") == [
        "allended 0", "ok new", "ok", "live", "ok live", "ok live",
        "error no container b in this VM",
        "error container a already has an init process",
        "allended 0",
    ]


def test_a_failed_init_leaves_no_container(harness):
    a = cid("a")
    assert ctr(harness, f"claim:{a}:any", f"abandon:{a}", f"claim:{a}:exec",
               f"claim:{a}:init", f"state:{a}") == [
        "ok new", "ok", "error no container a in this VM", "ok new", "new",
    ]


def test_ended_container_refuses_every_spec(harness):
    a = cid("a")
    out = ctr(harness, f"claim:{a}:init", f"start:{a}", "fds", f"exited:{a}", "fds",
              f"claim:{a}:any", f"claim:{a}:init", f"claim:{a}:exec", "allended",
              f"reported:{a}", f"state:{a}", f"claim:{a}:any", "allended")
    fds_live, fds_gone = (int(x.split()[1]) for x in out[2:5:2])
    assert fds_live - fds_gone == 5  # the init's pid, mnt, uts, ipc and user namespaces
    assert out[:2] + [out[3]] + out[5:] == [
        "ok new", "ok", "ok",
        "error container a is not running", "error container a is not running",
        "error container a is not running", "allended 0",
        "ok", "ended", "error container a is not running", "allended 1",
    ]


def test_all_ended_needs_every_container_ended(harness):
    a, b = cid("a"), cid("b")
    assert ctr(harness, f"claim:{a}:any", f"start:{a}", f"claim:{b}:any", f"start:{b}",
               f"exited:{a}", f"reported:{a}", "allended", f"exited:{b}", "allended",
               f"reported:{b}", "allended") == [
        "ok new", "ok", "ok new", "ok", "ok", "ok", "allended 0", "ok", "allended 0",
        "ok", "allended 1",
    ]


def test_table_is_bounded_and_reuses_the_oldest_ended_slot(harness):
    x = {i: cid(f"x{i}") for i in (2, 5, 7)}
    y, z = cid("y"), cid("z")
    out = ctr(harness, "fill:64:x", f"claim:{y}:any",
              # x5 ended first, then x2; x7 ended but a process still points at it
              f"hold:{x[5]}", f"exited:{x[5]}", f"reported:{x[5]}",
              f"hold:{x[2]}", f"exited:{x[2]}", f"reported:{x[2]}",
              f"hold:{x[7]}", f"exited:{x[7]}", f"reported:{x[7]}",
              f"claim:{y}:any", f"release:{x[2]}", f"release:{x[5]}",
              f"claim:{y}:any", f"state:{x[5]}", f"state:{x[2]}",
              f"claim:{z}:any", f"claim:{cid('w')}:any", f"state:{x[7]}",
              f"claim:{x[5]}:exec", f"claim:{x[2]}:exec")
    room = "error no room for container {}: 64 containers in this VM"
    assert out == [
        "started 64", room.format("y"),
        "procs 1", "ok", "ok", "procs 1", "ok", "ok", "procs 1", "ok", "ok",
        room.format("y"), "procs 0", "procs 0",
        "ok new", "unknown", "ended",
        "ok new", room.format("w"), "ended",
        "error no container x5 in this VM", "error no container x2 in this VM",
    ]


def test_release_never_goes_below_zero(harness):
    a = cid("a")
    assert ctr(harness, f"claim:{a}:any", f"start:{a}", f"hold:{a}", f"release:{a}",
               f"release:{a}") == ["ok new", "ok", "procs 1", "procs 0", "procs 0"]


# ---- the agent's shape ----

def _module_graph() -> dict[str, set[str]]:
    """Module (a .c with its .h) -> the agent modules it includes."""
    import re

    names = {p.stem for p in AGENT.glob("*.[ch]")}
    graph: dict[str, set[str]] = {n: set() for n in names}
    for path in AGENT.glob("*.[ch]"):
        for inc in re.findall(r'^#include "([\w.]+)\.h"', path.read_text(), re.M):
            if inc in names and inc != path.stem:
                graph[path.stem].add(inc)
    return graph


def test_agent_modules_include_each_other_without_a_cycle():
    graph = _module_graph()
    assert {"log", "spec", "channel", "container", "process", "child", "caps"} <= set(graph)
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"include cycle: {' -> '.join((*path, node))}"
        if node in done:
            return
        for dep in graph[node]:
            visit(dep, (*path, node))
        done.add(node)

    for node in graph:
        visit(node, ())
    # The launch-spec parser stands alone; its network records have their own
    # module, and both split compound values with the one splitter.
    assert graph["log"] == set() and graph["spec"] <= {"netspec", "textfields"}
    assert graph["netspec"] <= {"textfields"} and graph["textfields"] == set()


def test_agent_has_one_copy_of_each_helper():
    import re

    text = {p.name: p.read_text() for p in AGENT.glob("*.[ch]")}
    for helper in ("le16", "le32", "now_ms", "logmsg", "loghost", "text_oneline", "split_fields"):
        defs = [n for n, t in text.items()
                if re.search(rf"^[\w ]*\b{helper}\([^;]*\)\s*\{{", t, re.M)]
        assert len(defs) <= 1, f"{helper} defined in {defs}"
    assert not any(re.search(r"\ble(16|32)\(", t) for t in text.values())
    assert not any(re.search(r"#define\s+(ROOTFS|HOSTSHARE|PORT_NAME)\b", t)
                   for t in text.values())
    assert sum("cap_last_cap" in t for t in text.values()) <= 1


# ---- pod members (docs/pods.md) ----

def test_a_pod_members_root_and_joins_make_an_init(harness):
    parsed = parse(harness, recs(*BASE, ("rootfs", "/pod/0123abcd/rootfs"), ("ns.ipc", "sb"),
                                 ("ns.uts", "sb"), ("ns.pid", "other-member")))
    assert fields(parsed, "role") == ["init"]
    assert fields(parsed, "rootfs") == ["/pod/0123abcd/rootfs"]
    assert (fields(parsed, "ns.ipc"), fields(parsed, "ns.uts"), fields(parsed, "ns.pid")) == \
        (["sb"], ["sb"], ["other-member"])


@pytest.mark.parametrize("key, value", [
    ("rootfs", ""), ("rootfs", "/pod"), ("rootfs", "/pod/"), ("rootfs", "/rootfs"),
    ("rootfs", "/podx/a"), ("rootfs", "pod/a"), ("rootfs", "/pod/../etc"), ("rootfs", "/pod/a/.."),
    ("rootfs", "/pod/./a"), ("rootfs", "/pod//a"), ("rootfs", "/pod/a/"),
    ("rootfs", "/pod/" + "a" * 4091),
    ("ns.ipc", ""), ("ns.uts", "a/b"), ("ns.pid", "x" * 256), ("ns.pid", "a\x01"),
])
def test_bad_pod_member_values(harness, key, value):
    assert parse(harness, recs(*BASE, (key, value))) == f"spec: bad value for {key}"


@pytest.mark.parametrize("key", ["ns.net", "ns.", "ns.mnt"])
def test_only_ipc_uts_and_pid_can_be_joined(harness, key):
    assert parse(harness, recs(*BASE, (key, "sb"))) == f"spec: unknown key {key}"


@pytest.mark.parametrize("key, value", [("rootfs", "/pod/a/rootfs"), ("ns.ipc", "sb")])
def test_pod_member_keys_are_once_and_init_only(harness, key, value):
    assert parse(harness, recs(*BASE, (key, value), (key, value))) == f"spec: duplicate key {key}"
    assert (parse(harness, recs(*BASE, ("role", "exec"), (key, value)))
            == f"spec: {key} is for a container's init, not for role=exec")
