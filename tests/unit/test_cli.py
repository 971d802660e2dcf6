"""CLI verbs that need no VM: spec, features, version, refusals, bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import PARACELL


def paracell(*args, cwd=None):
    return subprocess.run([PARACELL, *args], capture_output=True, cwd=cwd, timeout=60)


def test_version_has_runc_shape():
    out = paracell("--version").stdout.decode().splitlines()
    assert out[0].startswith("paracell version ") and out[1].startswith("spec: ")


def test_spec_writes_a_default_config_once(tmp_path):
    assert paracell("spec", cwd=tmp_path).returncode == 0
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["process"]["args"] == ["sh"] and config["root"]["path"] == "rootfs"
    again = paracell("spec", cwd=tmp_path)
    assert again.returncode != 0 and b"exists" in again.stderr


def test_features_is_json():
    features = json.loads(paracell("features").stdout)
    assert "CAP_SYS_ADMIN" in features["linux"]["capabilities"]


def test_refusals_are_one_line(tmp_path):
    root = str(tmp_path / "root")
    for args, text in (
        (["checkpoint", "x"], b"needs --image-path"),
        (["restore", "x"], b"needs --image-path"),
        (["checkpoint", "--image-path", str(tmp_path / "i"), "x"], b"container x does not exist"),
        (["checkpoint", "--image-path", str(tmp_path / "i"), "--pre-dump", "x"],
         b"--pre-dump is not supported"),
        # Accepted by every verb (podman passes it to all); create refuses it
        # where systemd is not PID 1 (tests/integration/test_hostside.py).
        (["--systemd-cgroup", "state", "x"], b"container x does not exist"),
        (["kill", "x", "NOTASIGNAL"], b"invalid signal"),
        (["nosuchverb"], b"No such command"),
    ):
        result = paracell("--root", root, *args)
        assert result.returncode != 0, args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and text in lines[0], (args, lines)
        assert b"Traceback" not in result.stderr


def _host_kvm() -> str:
    """What this host's KVM is, from the host itself: kvm_pvm serves /dev/kvm
    without VMX/SVM; hardware KVM needs them."""
    if not Path("/dev/kvm").exists():
        return "none"
    if Path("/sys/module/kvm_pvm").exists():
        return "pvm-host"
    flags = next((line.split(":", 1)[1].split() for line in
                  Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")),
                 [])
    return "hardware" if {"vmx", "svm"} & set(flags) else "none"


def test_check_reports_the_engine():
    report = json.loads(paracell("check", "--json").stdout)
    kind = _host_kvm()
    assert report["host"]["kvm_kind"] == kind
    # auto takes hardware KVM where there is one, else falls back to TCG.
    assert report["engine"]["engine"] == ("kvm" if kind == "hardware" else "tcg")
