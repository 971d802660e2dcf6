"""Snapshot mode on real VMs (docs/snapshots.md): the rootfs is a read-only
ext4 image on virtio-blk under a writable layer in guest RAM, so nothing of
the container is on a 9p share and QEMU can save the VM while it runs. Host
binds are refused, except /etc/hosts, /etc/resolv.conf and /etc/hostname,
which are copied in. Behaviour only: no timing is asserted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import wait_status

pytestmark = pytest.mark.integration

SNAPSHOT = {"io.paracell.snapshot": "on"}
MANAGER = ("--memory-manager", "none")


def snapshot_mode(extra_mounts: list[dict] | None = None):
    def mutate(config: dict) -> None:
        config["annotations"] = dict(SNAPSHOT)
        config["mounts"] = config.get("mounts", []) + (extra_mounts or [])
    return mutate


def vm_of(runtime, cid: str) -> dict:
    return json.loads((runtime.root / cid / "state.json").read_text())["vm"]


def test_the_container_runs_on_its_root_disk_and_its_writes_stay_in_the_vm(
        runtime, make_bundle, writable_rootfs: Path):
    bundle = make_bundle(["sh", "-c", "echo written > /new; cat /new; cat /etc/marker; "
                          "grep ' / ' /proc/mounts | cut -d' ' -f3"],
                         rootfs=writable_rootfs, readonly=False, mutate=snapshot_mode())
    (writable_rootfs / "etc" / "marker").write_text("from the image\n")
    result = runtime(*MANAGER, "run", "--bundle", str(bundle), "snap-rw")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [b"written", b"from", b"the", b"image", b"overlay"]
    # The bundle's rootfs on the host does not see the container's writes.
    assert not (writable_rootfs / "new").exists()
    images = list(Path(runtime.env["PARACELL_ROOTDISKS"]).glob("*.ext4"))
    assert len(images) == 1 and images[0].stat().st_size >= 64 << 20


def test_a_read_only_root_stays_read_only(runtime, make_bundle, writable_rootfs: Path):
    bundle = make_bundle(["sh", "-c", "touch /x 2>&1; echo rc=$?"], rootfs=writable_rootfs,
                         readonly=True, mutate=snapshot_mode())
    result = runtime(*MANAGER, "run", "--bundle", str(bundle), "snap-ro")
    assert result.returncode == 0, result.stderr
    assert b"Read-only file system" in result.stdout and b"rc=1" in result.stdout


def test_a_changed_rootfs_gets_a_new_image_and_an_unchanged_one_reuses_it(
        runtime, make_bundle, writable_rootfs: Path):
    bundle = make_bundle(["cat", "/etc/marker"], rootfs=writable_rootfs, readonly=False,
                         mutate=snapshot_mode())
    disks = Path(runtime.env["PARACELL_ROOTDISKS"])
    outputs = []
    for i, marker in enumerate(["one", "one", "two"]):
        if i != 1:
            (writable_rootfs / "etc" / "marker").write_text(marker)
        result = runtime(*MANAGER, "run", "--bundle", str(bundle), f"snap-key{i}")
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout.strip())
        # A foreground run deletes its container: nothing of it is left to delete.
        assert not (runtime.root / f"snap-key{i}").exists()
        assert len(list(disks.glob("*.ext4"))) == (1 if i < 2 else 2)
    assert outputs == [b"one", b"one", b"two"]


def test_host_binds_are_refused_but_the_hosts_files_are_copied_in(
        runtime, make_bundle, writable_rootfs: Path, tmp_path: Path):
    hosts = tmp_path / "hosts"
    hosts.write_text("10.1.2.3 snapshot-host\n")
    data = tmp_path / "data"
    data.mkdir()
    bind = {"type": "bind", "options": ["rbind", "ro"]}
    refused = make_bundle(["true"], rootfs=writable_rootfs, readonly=False, mutate=snapshot_mode(
        [dict(bind, source=str(data), destination="/data")]))
    result = runtime(*MANAGER, "create", "--bundle", str(refused), "snap-bind")
    assert result.returncode != 0
    line = result.stderr.decode().strip()
    assert "\n" not in line and "cannot be snapshotted" in line and "/data" in line, line
    assert not (runtime.root / "snap-bind").exists()

    copied = make_bundle(["cat", "/etc/hosts"], rootfs=writable_rootfs, readonly=False,
                         mutate=snapshot_mode([dict(bind, source=str(hosts),
                                                    destination="/etc/hosts")]))
    result = runtime(*MANAGER, "run", "--bundle", str(copied), "snap-hosts")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"10.1.2.3 snapshot-host\n"


def test_bad_snapshot_annotations_and_pods_are_refused(runtime, make_bundle):
    def annotated(value: str):
        def mutate(config: dict) -> None:
            config["annotations"] = {"io.paracell.snapshot": value}
        return mutate

    result = runtime("create", "--bundle", str(make_bundle(["true"], mutate=annotated("yes"))),
                     "snap-bad")
    assert result.returncode != 0 and b"io.paracell.snapshot" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_qemu_saves_a_running_snapshot_mode_container_and_it_runs_on(
        runtime, make_bundle, writable_rootfs: Path, tmp_path: Path):
    """What 9p prevents (test_hypervisor.py): the VM is saved while its
    container runs, and the container goes on."""
    from paracell.runtime.state.store import StateStore
    from paracell.vmm import backends

    bundle = make_bundle(["sleep", "1000"], rootfs=writable_rootfs, readonly=False,
                         mutate=snapshot_mode())
    runtime(*MANAGER, "run", "--detach", "--bundle", str(bundle), "snap-save", check=True)
    wait_status(runtime, "snap-save", "running")
    hv = backends.hypervisor_of(StateStore(str(runtime.root)).load("snap-save").vm.config)
    saved = hv.save(tmp_path / "device.state")
    hv.resume()
    assert saved.size_bytes > 0 and (tmp_path / "device.state").stat().st_size > 0
    result = runtime("exec", "snap-save", "sh", "-c", "echo after > /f; cat /f")
    assert result.returncode == 0 and result.stdout == b"after\n", result.stderr
    runtime("kill", "snap-save", "KILL", check=True)
    wait_status(runtime, "snap-save", "stopped")
    runtime("delete", "snap-save", check=True)
    runtime.assert_no_leaks()


def test_a_restored_vm_reads_its_own_disk_not_the_templates(
        runtime, make_bundle, busybox_rootfs: Path, tmp_path: Path):
    """Two trees of one size class share a template; the restored VM mounts
    its own image, not what the template's guest had cached of the first."""
    trees = []
    for name in ("first", "second"):
        tree = tmp_path / f"tree-{name}"
        shutil.copytree(busybox_rootfs, tree, symlinks=True)
        (tree / "etc" / "marker").write_text(name)
        trees.append(tree)
    store = Path(runtime.env["PARACELL_TEMPLATES"])
    for i, tree in enumerate(trees):
        bundle = make_bundle(["cat", "/etc/marker"], rootfs=tree, readonly=False,
                             mutate=snapshot_mode())
        log = tmp_path / f"run{i}.log"
        result = runtime("--debug", "--log", str(log), *MANAGER, "run", "--bundle", str(bundle),
                         f"snap-tpl{i}")
        assert (result.returncode, result.stdout) == (0, tree.name[5:].encode()), result.stderr
    keys = [p.name for p in store.iterdir() if len(p.name) == 32]
    assert len(keys) == 1
    assert f"restored from template {keys[0]}" in (tmp_path / "run1.log").read_text()
