"""`paracell run` boots a real micro-VM (QEMU, TCG here) and runs the bundle's process."""

from __future__ import annotations

import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.caps import NO_CAPS, SHOW_CAPS, cap_masks

pytestmark = pytest.mark.integration


@pytest.mark.both_vmms
def test_exit_code_zero_and_output(runtime, make_bundle):
    bundle = make_bundle(["sh", "-c", "echo hello from the guest"])
    result = runtime("run", "--bundle", str(bundle), "c0")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"hello from the guest\n"
    runtime.assert_no_leaks()


@pytest.mark.both_vmms
def test_exit_code_seven(runtime, make_bundle):
    result = runtime("run", "--bundle", str(make_bundle(["sh", "-c", "exit 7"])), "c7")
    assert result.returncode == 7
    runtime.assert_no_leaks()


@pytest.mark.both_vmms
def test_death_by_sigkill_is_137(runtime, make_bundle):
    # The container's process is PID 1 of its PID namespace, as with runc, so
    # SIGKILL has to come from outside: `paracell kill` while `run` waits.
    bundle = make_bundle(["sleep", "60"])
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(runtime, "run", "--bundle", str(bundle), "ck")
        deadline = time.monotonic() + 60
        while runtime("state", "ck").stdout.find(b'"running"') < 0:
            assert time.monotonic() < deadline and not running.done()
            time.sleep(0.1)
        assert runtime("kill", "ck", "KILL").returncode == 0
        assert running.result().returncode == 137
    runtime.assert_no_leaks()


def test_args_env_cwd_hostname(runtime, make_bundle):
    script = 'printf "%s|" "$0" "$1" "$FOO" "$(pwd)" "$(hostname)"'
    bundle = make_bundle(
        ["sh", "-c", script, "arg zero", "arg one"],
        env=["PATH=/bin", "FOO=bar baz"], cwd="/tmp",
        mutate=lambda c: c.update(hostname="guesthost"),
    )
    result = runtime("run", "--bundle", str(bundle), "cargs")
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == "arg zero|arg one|bar baz|/tmp|guesthost|"


@pytest.mark.both_vmms
def test_uid_gid_and_additional_gids(runtime, make_bundle):
    bundle = make_bundle(["sh", "-c", "id -u; id -g; id -G"],
                         user={"uid": 1234, "gid": 5678, "additionalGids": [42, 43]})
    result = runtime("run", "--bundle", str(bundle), "cuid")
    assert result.returncode == 0, result.stderr
    uid, gid, groups = result.stdout.decode().split("\n")[:3]
    assert (uid, gid) == ("1234", "5678")
    assert set(groups.split()) == {"5678", "42", "43"}


def test_readonly_rootfs_refuses_writes(runtime, make_bundle):
    bundle = make_bundle(["sh", "-c", "touch /newfile 2>&1; echo rc=$?"], readonly=True)
    result = runtime("run", "--bundle", str(bundle), "cro")
    assert b"Read-only file system" in result.stdout
    assert b"rc=1" in result.stdout


@pytest.mark.both_vmms
def test_writable_rootfs_writes_reach_the_host(runtime, make_bundle, writable_rootfs):
    bundle = make_bundle(["sh", "-c", "echo data > /written"], rootfs=writable_rootfs,
                         readonly=False)
    assert runtime("run", "--bundle", str(bundle), "crw").returncode == 0
    assert (writable_rootfs / "written").read_text() == "data\n"


def test_stdout_and_stderr_stay_separate(runtime, make_bundle):
    bundle = make_bundle(["sh", "-c", "echo out; echo err >&2; echo out2"])
    result = runtime("run", "--bundle", str(bundle), "csep")
    assert result.stdout == b"out\nout2\n"
    assert result.stderr.endswith(b"err\n")


def test_16_mib_of_stdout_arrives_intact(runtime, make_bundle):
    # The guest generates the data and prints its own checksum on stderr.
    script = ("head -c 16777216 /dev/urandom > /tmp/blob; "
              "sha256sum /tmp/blob >&2; cat /tmp/blob")
    bundle = make_bundle(["sh", "-c", script])
    result = runtime("run", "--bundle", str(bundle), "cbig", timeout=300)
    assert result.returncode == 0, result.stderr[-300:]
    assert len(result.stdout) == 16 << 20
    guest_sum = result.stderr.split()[-2].decode()
    assert hashlib.sha256(result.stdout).hexdigest() == guest_sum


@pytest.mark.both_vmms
def test_stdin_is_forwarded_with_eof(runtime, make_bundle):
    data = bytes(range(256)) * 4096 + b"tail without newline"
    bundle = make_bundle(["sh", "-c", "cat; echo; echo EOF-SEEN"])
    result = runtime("run", "--bundle", str(bundle), "cin", input=data)
    assert result.returncode == 0, result.stderr
    assert result.stdout == data + b"\nEOF-SEEN\n"


def test_rlimits_umask_and_no_new_privs(runtime, make_bundle):
    bundle = make_bundle(
        ["sh", "-c", "ulimit -n; umask; grep NoNewPrivs /proc/self/status"],
        rlimits=[{"type": "RLIMIT_NOFILE", "soft": 321, "hard": 654}],
        user={"uid": 0, "gid": 0, "umask": 0o027}, noNewPrivileges=True,
    )
    result = runtime("run", "--bundle", str(bundle), "crl")
    lines = result.stdout.decode().split("\n")
    assert lines[0] == "321"
    assert lines[1] == "0027"
    assert lines[2].split() == ["NoNewPrivs:", "1"]


def test_bounding_capabilities_are_dropped(runtime, make_bundle):
    bundle = make_bundle(["sh", "-c", "grep CapBnd /proc/self/status"],
                         capabilities={"bounding": ["CAP_KILL", "CAP_CHOWN"]})
    result = runtime("run", "--bundle", str(bundle), "ccap")
    mask = int(result.stdout.split()[-1], 16)
    assert mask == (1 << 5) | (1 << 0)


def test_an_empty_capabilities_object_leaves_no_capability(runtime, make_bundle):
    """containerd's spec for a container that drops ALL: every set absent.
    runc takes each absent set as empty, in the init and in every exec."""
    init = runtime("run", "--bundle", str(make_bundle(["sh", "-c", SHOW_CAPS],
                                                      capabilities={})), "cnone-init")
    assert cap_masks(init.stdout.decode()) == NO_CAPS, init.stdout
    bundle = make_bundle(["sleep", "1000"], capabilities={})
    runtime("create", "--bundle", str(bundle), "cnone", check=True)
    runtime("start", "cnone", check=True)
    try:
        shown = runtime("exec", "cnone", "sh", "-c", SHOW_CAPS, check=True).stdout.decode()
        assert cap_masks(shown) == NO_CAPS, shown
    finally:
        runtime("delete", "--force", "cnone")


def test_an_exec_process_file_without_capabilities_gets_the_containers(runtime, make_bundle,
                                                                       tmp_path):
    """runc gives an `exec --process` without capabilities the container's
    own sets, not every capability and not none."""
    bundle = make_bundle(["sleep", "1000"], capabilities={
        k: ["CAP_KILL", "CAP_CHOWN"] for k in ("bounding", "effective", "permitted")})
    runtime("create", "--bundle", str(bundle), "cexec", check=True)
    runtime("start", "cexec", check=True)
    process = tmp_path / "p.json"
    process.write_text(json.dumps({"args": ["sh", "-c", SHOW_CAPS], "cwd": "/"}))
    try:
        shown = runtime("exec", "--process", str(process), "cexec", check=True).stdout.decode()
    finally:
        runtime("delete", "--force", "cexec")
    masks = cap_masks(shown)
    assert masks["CapBnd"] == masks["CapEff"] == masks["CapPrm"] == (1 << 5) | (1 << 0), shown
    assert masks["CapInh"] == masks["CapAmb"] == 0


def test_an_unknown_capability_is_ignored_with_a_warning(runtime, make_bundle, tmp_path):
    bundle = make_bundle(["sh", "-c", SHOW_CAPS],
                         capabilities={"bounding": ["CAP_KILL", "CAP_NOT_A_CAP"]})
    log = tmp_path / "log.json"
    ran = runtime("--log", str(log), "--log-format", "json", "run", "--bundle", str(bundle),
                  "cunknown")
    assert ran.returncode == 0, ran.stderr
    assert cap_masks(ran.stdout.decode())["CapBnd"] == 1 << 5
    warned = [json.loads(line) for line in log.read_text().splitlines()]
    assert {"level": "warning", "msg": "ignoring unknown or unavailable capabilities: "
            "['CAP_NOT_A_CAP']"}.items() <= next(
        w for w in warned if "capabilities" in w["msg"]).items()


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing-config", "config.json: no such file or directory"),
        ("bad-json", "is not valid JSON"),
        ("missing-rootfs", "does not exist"),
        ("escaping-mount", "escapes the container's rootfs"),
        ("unknown-user", "unknown user"),
        ("bad-uid", "process.user.uid"),
    ],
)
@pytest.mark.both_vmms
def test_bad_bundles_fail_cleanly(runtime, make_bundle, case, expected):
    bundle = make_bundle(["true"])
    config = json.loads((bundle / "config.json").read_text())
    if case == "missing-config":
        (bundle / "config.json").unlink()
    elif case == "bad-json":
        (bundle / "config.json").write_text('{"ociVersion": "1.0.2", "process": ')
    elif case == "missing-rootfs":
        config["root"]["path"] = str(bundle / "nope")
    elif case == "escaping-mount":
        config["mounts"].append({"destination": "/../../etc", "type": "tmpfs", "source": "x"})
    elif case == "unknown-user":
        config["process"]["user"] = {"username": "nosuchuser"}
    elif case == "bad-uid":
        config["process"]["user"] = {"uid": "root", "gid": 0}
    if case not in ("missing-config", "bad-json"):
        (bundle / "config.json").write_text(json.dumps(config))
    result = runtime("run", "--bundle", str(bundle), f"bad-{case}")
    assert result.returncode != 0
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert expected in lines[0]
    assert "Traceback" not in lines[0]
    runtime.assert_no_leaks()


@pytest.mark.both_vmms
def test_missing_executable_is_reported(runtime, make_bundle):
    result = runtime("run", "--bundle", str(make_bundle(["/no/such/binary"])), "cnoexe")
    assert result.returncode != 0
    assert b"no/such/binary" in result.stderr
    runtime.assert_no_leaks()
