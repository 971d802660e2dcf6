"""Checkpoint images and checkpoints handed over by a careless or hostile
operator, on real VMs (docs/snapshots.md, "What an image may do"):
- a restore never boots a disk the image names, and never a host file;
- checkpoint never writes through a link planted in --image-path or --work-path;
- device state that is a link, a FIFO or too large is refused, promptly;
- a damaged checkpoint is skipped with one warning, and a manifest's
  numbers out of range are damage, not internal errors.

The images are tampered with as a user would do it: by finding the files
in the directory, whatever its layout, so each test also shows what the
code before these fixes did (it read the host file, wrote through links,
copied without a bound and failed with RecursionError)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.integration.snapshots import (
    checkpoint,
    report,
    snapshot_bundle,
    started,
)

pytestmark = pytest.mark.integration

SECRET = b"SECRET-HOST-FILE-NOT-FOR-GUESTS"
# A file of the rootfs that no one reads before the checkpoint, so a guest
# restored onto another disk reads it from that disk, not from its page cache.
UNREAD = b"the container's own unread file".ljust(len(SECRET), b".")


def one_line_refusal(result, says: str) -> str:
    line = result.stderr.decode().strip()
    assert result.returncode != 0, line
    assert "\n" not in line and says in line, line
    assert "internal error" not in line and "Traceback" not in line, line
    return line


def make_victim(path: Path, runtime) -> Path:
    """A host file the guest must never see: a copy of the container's own
    disk with the content of its unread file replaced by a secret, so a
    guest that boots it runs, and shows the secret in that file."""
    data = cached_disk(runtime).read_bytes()
    assert data.count(UNREAD) == 1
    path.write_bytes(data.replace(UNREAD, SECRET))
    os.chmod(path, 0o600)
    return path


def image_of(runtime, cid: str, where: Path) -> Path:
    result = runtime("checkpoint", "--image-path", str(where), "--leave-running", cid)
    assert result.returncode == 0, result.stderr
    return where


def vmstate_in(image: Path) -> Path:
    return next(p for p in image.rglob("*") if p.name.endswith("vmstate.qcow2"))


def cached_disk(runtime) -> Path:
    return next(p for p in sorted(Path(runtime.env["PARACELL_ROOTDISKS"]).glob("*.ext4"))
                if not p.name.startswith("."))


def point_every_disk_at(image: Path, victim: Path) -> None:
    """What the issue's attacker did: every JSON field that names the root
    disk, and every disk file the image carries, now lead to the victim."""
    for manifest in image.rglob("*.json"):
        data = json.loads(manifest.read_text())
        inner = data.get("checkpoint") if isinstance(data.get("checkpoint"), dict) else data
        inner["rootdisk"] = str(victim)
        manifest.write_text(json.dumps(data))
    for disk in image.rglob("*.ext4"):
        disk.unlink()
        os.link(victim, disk)  # a hard link: O_NOFOLLOW alone would not stop it


def test_a_restore_never_boots_a_disk_the_image_names(
        runtime, make_bundle, memfill_rootfs: Path, tmp_path: Path):
    (memfill_rootfs / "unread").write_bytes(UNREAD)
    started(runtime, make_bundle, memfill_rootfs, "hi-src")
    image = image_of(runtime, "hi-src", tmp_path / "image")
    victim = make_victim(tmp_path / "victim", runtime)
    point_every_disk_at(image, victim)
    # The cache's copy is gone too, so the image's own disk is all there is.
    for cached in Path(runtime.env["PARACELL_ROOTDISKS"]).glob("*.ext4"):
        cached.unlink()
    bundle = snapshot_bundle(make_bundle, memfill_rootfs, ["memfill", "16"])
    result = runtime("restore", "--image-path", str(image), "--bundle", str(bundle), "-d",
                     "hi-evil")
    if result.returncode == 0:
        seen = runtime("exec", "hi-evil", "cat", "/unread").stdout
        assert SECRET not in seen, "the restored guest read a host file"
    one_line_refusal(result, "digest")
    assert not (runtime.root / "hi-evil").exists()
    assert SECRET in victim.read_bytes()  # the victim is as it was


def test_a_restore_takes_its_disk_from_the_cache_or_from_the_image_checked(
        runtime, make_bundle, memfill_rootfs: Path, tmp_path: Path):
    started(runtime, make_bundle, memfill_rootfs, "hi-disk")
    image = image_of(runtime, "hi-disk", tmp_path / "image")
    bundle = snapshot_bundle(make_bundle, memfill_rootfs, ["memfill", "16"])
    cache = Path(runtime.env["PARACELL_ROOTDISKS"])
    # The cached disk damaged (a byte of it flipped): never used, the image's
    # own disk is copied in, checked, and booted.
    cached = cached_disk(runtime)
    os.chmod(cached, 0o644)
    with open(cached, "r+b") as f:
        f.seek(1024 + 64)
        byte = f.read(1)
        f.seek(1024 + 64)
        f.write(bytes([byte[0] ^ 0xFF]))
    result = runtime("restore", "--image-path", str(image), "--bundle", str(bundle), "-d",
                     "hi-back")
    assert result.returncode == 0, result.stderr
    assert report(runtime, "hi-back")["mem"] == "ok"
    assert runtime("exec", "hi-back", "test", "-x", "/bin/memfill").returncode == 0
    # No disk in the cache at all, and the image's own damaged: refused.
    runtime("delete", "--force", "hi-back", check=True)
    runtime("delete", "--force", "hi-disk", check=True)
    for disk in cache.glob("*.ext4"):
        disk.unlink()
    carried = next(image.glob("*.ext4"))
    with open(carried, "r+b") as f:
        f.seek(4096)
        f.write(b"\x5a" * 16)
    result = runtime("restore", "--image-path", str(image), "--bundle", str(bundle), "-d",
                     "hi-bad")
    one_line_refusal(result, "digest")
    assert not (runtime.root / "hi-bad").exists()
    assert not [p for p in runtime.root.iterdir() if p.name.startswith("~")]


def test_checkpoint_never_writes_through_a_link_planted_in_its_directories(
        runtime, make_bundle, memfill_rootfs: Path, tmp_path: Path):
    started(runtime, make_bundle, memfill_rootfs, "hi-links")
    victims = {name: tmp_path / f"victim-{name}" for name in
               ("paracell-checkpoint.json", "inventory.img", "dump.log")}
    for victim in victims.values():
        victim.write_bytes(b"root's own file\n")
    # --work-path with a link where its log goes.
    work = tmp_path / "work"
    work.mkdir()
    (work / "dump.log").symlink_to(victims["dump.log"])
    result = runtime("checkpoint", "--image-path", str(tmp_path / "image1"), "--work-path",
                     str(work), "--leave-running", "hi-links")
    assert result.returncode == 0, result.stderr
    assert not (work / "dump.log").is_symlink()
    assert b"hi-links" in (work / "dump.log").read_bytes()
    # --image-path, empty when it is checked, with links planted as soon as
    # the checkpoint begins to write there.
    image = tmp_path / "image2"
    image.mkdir()
    stop = threading.Event()

    def plant() -> None:
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            if any(image.iterdir()):
                for name in ("paracell-checkpoint.json", "inventory.img"):
                    try:
                        (image / name).symlink_to(victims[name])
                    except FileExistsError:
                        pass
                return
            time.sleep(0.001)

    planter = threading.Thread(target=plant)
    planter.start()
    try:
        result = runtime("checkpoint", "--image-path", str(image), "--leave-running",
                         "hi-links")
    finally:
        stop.set()
        planter.join()
    for name, victim in victims.items():
        assert victim.read_bytes() == b"root's own file\n", f"{name} was written through"
    one_line_refusal(result, "exists already")
    # What it had written is gone again; the planted links stay, untouched.
    assert sorted(p.name for p in image.iterdir()) == ["inventory.img",
                                                       "paracell-checkpoint.json"]
    assert report(runtime, "hi-links")["mem"] == "ok"


def test_a_restore_refuses_device_state_that_is_a_fifo_a_giant_or_a_link(
        runtime, make_bundle, memfill_rootfs: Path, tmp_path: Path):
    started(runtime, make_bundle, memfill_rootfs, "hi-state")
    image = image_of(runtime, "hi-state", tmp_path / "image")
    bundle = snapshot_bundle(make_bundle, memfill_rootfs, ["memfill", "16"])

    def fifo(path: Path) -> None:
        os.mkfifo(path)

    def giant(path: Path) -> None:
        with open(path, "wb") as f:
            f.truncate(1 << 30)

    def zero(path: Path) -> None:
        path.symlink_to("/dev/zero")

    # In this order: the code before the fix copied a link to /dev/zero
    # until the disk was full, so the cases it failed on first come first.
    for i, make in enumerate((fifo, giant, zero)):
        copy = tmp_path / f"bad{i}"
        shutil.copytree(image, copy, symlinks=True)
        state = vmstate_in(copy)
        state.unlink()
        make(state)
        result = runtime("restore", "--image-path", str(copy), "--bundle", str(bundle), "-d",
                         f"hi-s{i}", timeout=60)
        one_line_refusal(result, "vmstate.qcow2")
        assert not (runtime.root / f"hi-s{i}").exists()
    assert not [p for p in runtime.root.iterdir() if p.name.startswith("~")]


def test_a_damaged_checkpoint_is_skipped_with_one_warning(
        runtime, make_bundle, memfill_rootfs: Path, tmp_path: Path):
    started(runtime, make_bundle, memfill_rootfs, "hi-dmg")
    checkpoint(runtime, "hi-dmg", "good")
    ckdir = runtime.root / "hi-dmg" / "checkpoints"
    meta = json.loads((ckdir / "good" / "meta.json").read_text())
    damage = {
        "deep": "[" * 30000 + "]" * 30000,
        "huge": json.dumps({**meta, "name": "huge"}).replace(
            f'"created": {json.dumps(meta["created"])}', '"created": 1' + "0" * 400),
        "wide": json.dumps({**meta, "name": "wide", "seq": 1 << 40, "parent": 0}),
    }
    for name, text in damage.items():
        shutil.copytree(ckdir / "good", ckdir / name)
        (ckdir / name / "meta.json").write_text(text)
    result = runtime("sandbox", "checkpoints", "-f", "json", "hi-dmg")
    assert result.returncode == 0, result.stderr
    assert [c["name"] for c in json.loads(result.stdout)] == ["good"]
    warnings = result.stderr.decode().strip().splitlines()
    assert len(warnings) == 3 and all("skipped" in w for w in warnings), warnings
    checkpoint(runtime, "hi-dmg", "second")
    result = runtime("sandbox", "fork", "--id-prefix", "hi-dmg-f", "hi-dmg", "good")
    assert result.returncode == 0, result.stderr
    for name in damage:
        one_line_refusal(runtime("sandbox", "rollback", "hi-dmg", name), "meta.json")
    # An image whose manifest's numbers are out of range: damage, in one line.
    image = image_of(runtime, "hi-dmg", tmp_path / "image")
    manifest = image / "paracell-checkpoint.json"
    data = json.loads(manifest.read_text())
    data["checkpoint"]["seq"] = 1 << 40
    manifest.write_text(json.dumps(data))
    bundle = snapshot_bundle(make_bundle, memfill_rootfs, ["memfill", "16"])
    one_line_refusal(runtime("restore", "--image-path", str(image), "--bundle", str(bundle),
                             "-d", "hi-wide"), "out of range")
