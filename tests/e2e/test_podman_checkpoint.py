"""podman 4.3's `container checkpoint` and `container restore`, with
--export and --import, on paracell (docs/snapshots.md): the container's
files, its process and its memory come back. podman insists on CRIU 3.11 or
later being installed, and on an `inventory.img` in the checkpoint
directory; ParaCell runs no CRIU."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import IMAGE

pytestmark = pytest.mark.e2e

SNAPSHOT = ("--annotation", "io.paracell.snapshot=on")


def init_start(podman, name: str) -> bytes:
    """Field 22 of the init's /proc stat: its start time, which a new process
    would not share."""
    result = podman("exec", name, "cat", "/proc/1/stat")
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[21]


def test_checkpoint_restore_export_import(podman, tmp_path):
    if podman.env.get("PARACELL_VMM") == "libvirt":
        pytest.skip("snapshot mode needs direct QEMU: its checkpoints load device state in "
                    "place, which ParaCell does not ask of libvirt (docs/snapshots.md)")
    started = podman("run", "-d", "--name", "pck", *SNAPSHOT, IMAGE, "sleep", "600")
    assert started.returncode == 0, started.stderr
    try:
        assert podman("exec", "pck", "sh", "-c", "echo before > /state").returncode == 0
        start = init_start(podman, "pck")
        done = podman("container", "checkpoint", "pck")
        assert done.returncode == 0, done.stderr
        assert b"Exited" in podman("ps", "-a", "--format", "{{.Status}}").stdout
        back = podman("container", "restore", "pck")
        assert back.returncode == 0, back.stderr
        assert podman("exec", "pck", "cat", "/state").stdout == b"before\n"
        assert init_start(podman, "pck") == start
        # Exported, removed, imported under its own name and under another.
        assert podman("exec", "pck", "sh", "-c", "echo exported > /state").returncode == 0
        archive = tmp_path / "pck.tar.gz"
        done = podman("container", "checkpoint", "--export", str(archive), "pck")
        assert done.returncode == 0, done.stderr
        assert archive.stat().st_size > 0
        assert podman("rm", "-f", "pck").returncode == 0
        for name in ("pck", "pck2"):
            extra = [] if name == "pck" else ["--name", name]
            back = podman("container", "restore", "--import", str(archive), *extra)
            assert back.returncode == 0, back.stderr
            assert podman("exec", name, "cat", "/state").stdout == b"exported\n"
            assert init_start(podman, name) == start
    finally:
        podman("rm", "-f", "pck", "pck2")


def test_a_container_not_in_snapshot_mode_is_refused_in_one_line(podman):
    if podman.env.get("PARACELL_VMM") == "libvirt":
        pytest.skip("the refusal is direct QEMU's; under libvirt snapshot mode is refused at "
                    "create")
    started = podman("run", "-d", "--name", "pplain", IMAGE, "sleep", "600")
    assert started.returncode == 0, started.stderr
    try:
        done = podman("container", "checkpoint", "--leave-running", "pplain")
        assert done.returncode != 0
        assert b"not in snapshot mode" in done.stderr
        assert podman("exec", "pplain", "true").returncode == 0
    finally:
        podman("rm", "-f", "pplain")
