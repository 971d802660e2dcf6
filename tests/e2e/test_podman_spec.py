"""What podman puts in config.json besides the process, applied in the guest:
its default seccomp profile (which podman always sends), a profile of the
user's own, --device, --tmpfs (with runc's tmpcopyup) and --uidmap."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import IMAGE

pytestmark = pytest.mark.e2e

ENOMSG = "No message of desired type"


def lines(result) -> list[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    return [" ".join(ln.split()) for ln in result.stdout.decode().splitlines()]


def test_default_seccomp_profile_applies(podman):
    # swapon needs CAP_SYS_ADMIN in podman's profile: refused with EPERM.
    result = podman("run", "--rm", IMAGE, "sh", "-c",
                    "grep -E '^Seccomp(_filters)?:' /proc/self/status; swapon /tmp 2>&1; true")
    assert lines(result) == ["Seccomp: 2", "Seccomp_filters: 1",
                             "swapon: /tmp: Operation not permitted"]
    result = podman("run", "--rm", "--security-opt", "seccomp=unconfined", IMAGE,
                    "grep", "^Seccomp:", "/proc/self/status")
    assert lines(result) == ["Seccomp: 0"]


def test_own_seccomp_profile_and_exec(podman, tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 42}],
    }))
    started = podman("run", "-d", "--name", "sc", "--security-opt", f"seccomp={profile}", IMAGE,
                     "sleep", "300")
    assert started.returncode == 0, started.stderr
    try:
        # An exec gets the container's filter, as with runc.
        result = podman("exec", "sc", "sh", "-c", "mkdir /tmp/x 2>&1; true")
        assert lines(result) == [f"mkdir: can't create directory '/tmp/x': {ENOMSG}"]
    finally:
        podman("rm", "-f", "-t", "0", "sc")


def test_device_tmpfs_and_uidmap(podman):
    result = podman("run", "--rm", "--device", "/dev/null:/dev/mynull", "--tmpfs", "/etc",
                    "--uidmap", "0:100000:65536", "--gidmap", "0:100000:65536", IMAGE, "sh", "-c",
                    "cat /proc/self/uid_map; stat -c '%t:%T %u' /dev/mynull;"
                    " echo x > /dev/mynull && echo wrote; head -1 /etc/passwd;"
                    " stat -c %u /bin/busybox; touch /made && stat -c %u /made")
    assert lines(result) == ["0 100000 65536", "1:3 0", "wrote", "root:x:0:0:root:/root:/bin/sh",
                             "0", "0"]
