"""A libvirt daemon set up as Debian installs it: private daemons
(tests/libvirtd.py) whose qemu.conf lacks one setting ParaCell needs, or
that have no virtlogd, or whose mount namespace ParaCell's RAM directory does
not reach. `paracell check` and `create` name what is missing in the same one
line and exit non-zero, before any domain exists, and leave nothing behind;
with virtlogd running, a qemu.conf that needs it is fine."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import Runtime, state_of
from tests.libvirtd import QEMU_CONF, SETTINGS, VIRTLOGD, PrivateLibvirtd

pytestmark = pytest.mark.integration


def without(setting: str) -> str:
    return "".join(text for name, text in SETTINGS.items() if name != setting)


@pytest.fixture
def daemon_for(libvirtd):
    """daemon_for(qemu_conf, virtlogd=False, memory_dir=None) -> a Runtime
    bound to a private daemon of its own (beside the session's, which the
    libvirt fixture's skip covers)."""
    made: list[tuple[PrivateLibvirtd, Runtime]] = []

    def start(qemu_conf: str, virtlogd: bool = False, memory_dir: Path | None = None) -> Runtime:
        daemon = PrivateLibvirtd(Path(tempfile.mkdtemp(prefix="pclv-", dir="/tmp")),
                                 qemu_conf=qemu_conf, virtlogd=virtlogd)
        daemon.start()
        base = daemon.workdir / "rt"
        base.mkdir()
        memory = memory_dir or base / "shm"
        env = dict(os.environ, PARACELL_ENGINE="auto", PARACELL_VMM="libvirt",
                   PARACELL_LIBVIRT_URI=daemon.uri, PARACELL_MEMORY_DIR=str(memory),
                   PARACELL_TEMPLATES=str(base / "templates"),
                   PARACELL_ROOTDISKS=str(base / "rootdisks"))
        runtime = Runtime(base / "state", memory, env, libvirtd=daemon)
        made.append((daemon, runtime))
        return runtime

    yield start
    for daemon, runtime in made:
        for cid in (runtime.root.iterdir() if runtime.root.exists() else []):
            runtime("delete", "--force", cid.name)
        subprocess.run(["umount", "-l", str(runtime.memory_dir)], capture_output=True)
        daemon.stop()
        shutil.rmtree(daemon.base, ignore_errors=True)


def refused_alike(runtime: Runtime, bundle: Path, *fragments: str) -> str:
    """check and create both fail with the one line, which names the daemon
    and holds each fragment; create leaves nothing behind."""
    uri = runtime.libvirtd.uri
    check = runtime("check")
    lines = check.stderr.decode().strip().splitlines()
    assert check.returncode != 0 and len(lines) == 1, (check.returncode, lines)
    line = lines[0].removeprefix("paracell: ")
    assert line.startswith(f"libvirt at {uri}: "), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    assert f"create fails: {line}" in check.stdout.decode()
    report = json.loads(runtime("check", "--json").stdout)["libvirt"]
    assert report["refusal"] == line

    create = runtime("create", "--bundle", str(bundle), "lvs1")
    assert create.returncode != 0
    assert create.stderr.decode().strip().splitlines() == [f"paracell: {line}"]
    assert runtime("state", "lvs1").returncode != 0
    runtime.assert_no_leaks()
    return line


def test_a_qemu_conf_without_clear_emulator_capabilities_is_refused(daemon_for, make_bundle):
    runtime = daemon_for(without("clear_emulator_capabilities"))
    refused_alike(runtime, make_bundle(["true"]),
                  "/etc/libvirt/qemu.conf lacks clear_emulator_capabilities = 0",
                  "restart libvirtd", "docs/libvirt.md")


def test_a_qemu_user_that_cannot_open_dev_kvm_is_refused(daemon_for, make_bundle):
    try:
        kvm = os.stat("/dev/kvm")
    except FileNotFoundError:
        pytest.skip("no /dev/kvm: libvirt's default QEMU user costs nothing here")
    if (kvm.st_uid, stat.S_IMODE(kvm.st_mode)) != (0, 0o600):
        pytest.skip("/dev/kvm is not root's alone here: libvirt's QEMU user may open it")
    runtime = daemon_for(without("user"))
    refused_alike(runtime, make_bundle(["true"]), "QEMU's user libvirt-qemu",
                  "cannot open /dev/kvm", 'set user = "root" and group = "root"')


def test_no_virtlogd_is_refused(daemon_for, make_bundle):
    runtime = daemon_for(without("stdio_handler"))
    refused_alike(runtime, make_bundle(["true"]), "virtlogd is not running",
                  "/run/libvirt/virtlogd-sock", "systemctl start virtlogd.socket",
                  'stdio_handler = "file"')


def test_a_ram_directory_the_daemon_does_not_see_is_refused(daemon_for, make_bundle):
    """The directory's mount is private here, so the RAM tmpfs that create
    mounts in it never reaches the daemon: QEMU would fail to connect to
    the agent's socket ("Failed to connect to '...agent'")."""
    private = Path(tempfile.mkdtemp(prefix="pclv-ram-", dir="/tmp"))
    subprocess.run(["mount", "--bind", str(private), str(private)], check=True)
    try:
        subprocess.run(["mount", "--make-private", str(private)], check=True)
        runtime = daemon_for(QEMU_CONF, memory_dir=private / "shm")
        refused_alike(runtime, make_bundle(["true"]),
                      f"does not see ParaCell's RAM directory {private}/shm",
                      f"{private} is not a shared mount", "Mount propagation")
    finally:
        subprocess.run(["umount", "-R", "-l", str(private)], capture_output=True)
        shutil.rmtree(private, ignore_errors=True)


def test_a_qemu_conf_that_needs_virtlogd_runs_with_virtlogd(daemon_for, make_bundle):
    if not os.path.exists(VIRTLOGD):
        pytest.skip(f"{VIRTLOGD} is not installed")
    runtime = daemon_for(without("stdio_handler"), virtlogd=True)
    report = json.loads(runtime("check", "--json", check=True).stdout)["libvirt"]
    assert report["refusal"] is None
    log = next(f for f in report["setup"] if f["name"].startswith("log manager"))
    assert log["present"] is True and "virtlogd answers" in log["detail"]
    runtime("create", "--bundle", str(make_bundle(["sleep", "60"])), "lvs2", check=True)
    runtime("start", "lvs2", check=True)
    assert state_of(runtime, "lvs2")["status"] == "running"
    runtime("delete", "--force", "lvs2", check=True)
    runtime.assert_no_leaks()


def test_a_qemu_conf_changed_after_the_daemon_started_is_unverified(daemon_for, make_bundle):
    """The daemon runs with the file it read at its start: a newer one is
    not evidence either way. check says so; create is not refused for it."""
    runtime = daemon_for(QEMU_CONF)
    conf = runtime.libvirtd.base / "etc" / "qemu.conf"
    later = runtime.libvirtd.base.stat().st_mtime + 3600
    os.utime(conf, (later, later))
    report = json.loads(runtime("check", "--json", check=True).stdout)["libvirt"]
    caps = next(f for f in report["setup"] if "clear_emulator_capabilities" in f["name"])
    assert caps["present"] is None and "changed after libvirtd started" in caps["detail"]
    assert report["refusal"] is None
    assert "clear_emulator_capabilities = 0: unverified" in runtime("check").stdout.decode()
    runtime("create", "--bundle", str(make_bundle(["true"])), "lvs3", check=True)
    runtime("delete", "--force", "lvs3", check=True)
    runtime.assert_no_leaks()
