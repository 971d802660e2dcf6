"""Turning XGates on: annotations over the operator's config file, the launch
spec record, and the host support matrix that `check` and `create` share."""

from __future__ import annotations

import json
import subprocess

import pytest

from paracell.errors import ParacellError
from paracell.log import RuntimeLog
from paracell.runtime.bundle import spec
from paracell.runtime.bundle.defaultspec import default_config
from paracell.vmm.probe import HostFacts
from paracell.xgate import admission
from paracell.xgate.support import support
from tests.conftest import PARACELL


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    monkeypatch.setenv("PARACELL_CONFIG", str(path))
    return path


def test_annotation_wins_over_the_config_file(config_file):
    assert admission.plan({}).enabled is False
    config_file.write_text(json.dumps({"xgates": True}))
    assert admission.plan({}) == admission.XgatesPlan(True, "refuse", f'"xgates" in {config_file}')
    assert admission.plan({"io.paracell.xgates": "off"}).enabled is False
    config_file.write_text(json.dumps({"xgates": False}))
    plan = admission.plan({"io.paracell.xgates": "on", "io.paracell.xgates.vet": "warn"})
    assert plan.enabled and plan.vet == "warn"


@pytest.mark.parametrize("annotations", [
    {"io.paracell.xgates": "yes"}, {"io.paracell.xgates": "ON"},
    {"io.paracell.xgates": ""}, {"io.paracell.xgates.vet": "ignore"},
])
def test_other_annotation_values_are_refused_in_one_line(config_file, annotations):
    with pytest.raises(ParacellError) as err:
        admission.plan(annotations)
    assert "\n" not in str(err.value) and "io.paracell.xgates" in str(err.value)


@pytest.mark.parametrize("value", [1, "true", None])
def test_config_file_xgates_must_be_a_bool(config_file, value):
    config_file.write_text(json.dumps({"xgates": value}))
    with pytest.raises(ParacellError, match="mistyped setting 'xgates'"):
        admission.plan({})


def test_a_bool_is_still_refused_for_a_number_setting(config_file):
    from paracell import settings

    config_file.write_text(json.dumps({"guest_memory_mib": True}))
    with pytest.raises(ParacellError, match="guest_memory_mib"):
        settings.guest_memory_mib()


def test_the_init_launch_spec_carries_xgates_on_only_when_enabled(tmp_path):
    (tmp_path / "rootfs").mkdir()
    config = default_config(["true"])
    bundle = spec.validate(tmp_path, config)
    on = spec.init_launch_spec("c1", bundle, xgates=True).split(b"\0")
    off = spec.init_launch_spec("c1", bundle).split(b"\0")
    assert b"xgates=on" in on and not any(r.startswith(b"xgates") for r in off)
    assert b"role=init" in on


def _facts(pku: bool, qemu: bool = True) -> HostFacts:
    return HostFacts("hardware", "vmx", pku, "/usr/bin/qemu" if qemu else None, "7.2")


def test_support_matrix():
    assert support("tcg", _facts(pku=False)).supported
    assert support("kvm", _facts(pku=True)).supported
    kvm_without = support("kvm", _facts(pku=False))
    assert not kvm_without.supported and "pku" in kvm_without.reason
    assert not support(None, _facts(pku=True)).supported
    assert not support("tcg", _facts(pku=True, qemu=False)).supported


def test_create_refuses_xgates_where_unsupported(tmp_path):
    plan = admission.XgatesPlan(True, "refuse", "annotation io.paracell.xgates")
    log = RuntimeLog()
    with pytest.raises(ParacellError, match="unsupported with engine kvm: .*lacks pku"):
        admission.admit(plan, support("kvm", _facts(pku=False)), tmp_path, log)
    admission.admit(plan, support("tcg", _facts(pku=False)), tmp_path, log)
    admission.admit(admission.XgatesPlan(False, "refuse", ""), support("kvm", _facts(pku=False)),
                    tmp_path, log)
    admission.admit(plan, None, tmp_path, log)  # a pod's VM, admitted at its own create


def test_check_says_whether_xgates_can_run():
    report = json.loads(subprocess.run([PARACELL, "check", "--json"], capture_output=True,
                                       check=True, timeout=60).stdout)
    assert isinstance(report["xgates"]["supported"], bool) and report["xgates"]["reason"]
    text = subprocess.run([PARACELL, "check"], capture_output=True, check=True,
                          timeout=60).stdout.decode()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("xgates:")]
    assert ("yes" if report["xgates"]["supported"] else "unsupported") in line
    if report["engine"]["engine"] == "tcg":
        assert report["xgates"]["supported"] is True


def test_a_rootfs_past_the_vet_bounds_is_refused_or_warned(tmp_path, monkeypatch):
    from paracell.xgate import vet

    monkeypatch.setattr(vet, "MAX_ENTRIES", 2)
    for i in range(3):
        (tmp_path / f"f{i}").write_bytes(b"x")
    with pytest.raises(ParacellError, match="rootfs not vetted: .*more than 2 entries"):
        admission.vet_rootfs(admission.XgatesPlan(True, "refuse", ""), tmp_path, RuntimeLog())
    log = tmp_path / "log"
    admission.vet_rootfs(admission.XgatesPlan(True, "warn", ""), tmp_path, RuntimeLog(str(log)))
    assert "rootfs not vetted" in log.read_text()
