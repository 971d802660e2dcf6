"""Forks under stress, on real VMs (docs/snapshots.md, "Fork"): a fork's shim
killed, a fork of a fork of a fork, and more forks than their memory has
room for. Each ends in a clean result or one clear line, and nothing is
left. Behaviour only: no timing is asserted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_status
from tests.integration.snapshots import bump, checkpoint, report, started

pytestmark = pytest.mark.integration


def _state(runtime, cid: str) -> dict:
    return json.loads((runtime.root / cid / "state.json").read_text())


def _fork(runtime, *args: str, env: dict[str, str] | None = None):
    if env is None:
        return runtime("sandbox", "fork", *args)
    saved = runtime.env
    runtime.env = env
    try:
        return runtime("sandbox", "fork", *args)
    finally:
        runtime.env = saved


def test_a_forks_shim_killed_stops_only_that_fork(runtime, make_bundle, memfill_rootfs: Path):
    started(runtime, make_bundle, memfill_rootfs, "fr-parent")
    checkpoint(runtime, "fr-parent", "seed")
    done = _fork(runtime, "--count", "2", "--id-prefix", "fr-f", "fr-parent", "seed")
    assert done.returncode == 0, done.stderr
    victim = _state(runtime, "fr-f1")
    qemu = psutil.Process(victim["vm"]["qemu_pid"])
    os.kill(victim["shim_pid"], signal.SIGKILL)
    wait_status(runtime, "fr-f1", "stopped")
    qemu.wait(30)  # its QEMU dies with its shim
    # The parent and the sibling go on, each with its own memory.
    for cid in ("fr-parent", "fr-f2"):
        assert bump(runtime, cid, 2)["mem"] == "ok"
    # Another fork of the same checkpoint still maps its RAM.
    done = _fork(runtime, "--id-prefix", "fr-g", "fr-parent", "seed")
    assert done.returncode == 0, done.stderr
    assert report(runtime, "fr-g1")["seed"] == "1"
    runtime("delete", "fr-f1", check=True)
    for cid in ("fr-f2", "fr-g1", "fr-parent"):
        runtime("delete", "--force", cid, check=True)
    runtime.assert_no_leaks()


def test_a_fork_of_a_fork_of_a_fork(runtime, make_bundle, memfill_rootfs: Path):
    """Generations: the first two with memory of their own (so each can be
    checkpointed in turn), the last sharing its parent's checkpoint; each
    starts from its parent's checkpoint, not from where the parent went on."""
    started(runtime, make_bundle, memfill_rootfs, "fr-g0")
    parent, seed = "fr-g0", 1
    for gen in (1, 2, 3):
        checkpoint(runtime, parent, f"at{gen}")
        bump(runtime, parent, seed + 1)  # the parent moves on after its checkpoint
        private = ["--private-memory"] if gen < 3 else []
        done = _fork(runtime, *private, "--id-prefix", f"fr-g{gen}-", parent, f"at{gen}")
        assert done.returncode == 0, done.stderr
        child = f"fr-g{gen}-1"
        got = report(runtime, child)
        assert (got["seed"], got["mem"]) == (str(seed), "ok"), (child, got)
        assert _state(runtime, child)["vm"]["shares_memory_of"] == \
            ("" if private else f"checkpoint at3 of {parent}")
        parent = child
    # The last generation shares memory: it cannot be forked in turn.
    refused = _fork(runtime, parent)
    assert refused.returncode != 0 and refused.stderr.decode().count("\n") == 1
    # Deleting them from the oldest leaves each younger one running.
    for cid in ("fr-g0", "fr-g1-1", "fr-g2-1"):
        runtime("delete", "--force", cid, check=True)
        assert bump(runtime, "fr-g3-1", int(report(runtime, "fr-g3-1")["seed"]) + 1)["mem"] \
            == "ok"
    runtime("delete", "--force", "fr-g3-1", check=True)
    runtime.assert_no_leaks()


def test_more_forks_than_their_memory_holds_fail_whole_in_one_line(
        runtime, make_bundle, memfill_rootfs: Path, tmp_path: Path):
    """Forks with private copies whose RAM files do not all fit where RAM
    files go: refused as one, none left; forks that share the checkpoint's
    RAM need no room there, and all run."""
    started(runtime, make_bundle, memfill_rootfs, "fr-big", mib=32)
    seed = checkpoint(runtime, "fr-big", "seed")
    small = tmp_path / "small-shm"
    small.mkdir()
    # Room for one private copy of what the checkpoint holds, not for four.
    room = seed["bytes"] * 3 // 2
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={room},mode=0700", "fr-small",
                    str(small)], check=True)
    try:
        env = dict(runtime.env, PARACELL_MEMORY_DIR=str(small))
        qemus = len(runtime.qemu_processes())
        done = _fork(runtime, "--private-memory", "--count", "4", "--id-prefix", "fr-p",
                     "fr-big", "seed", env=env)
        assert done.returncode != 0
        said = done.stderr.decode()
        assert said.count("\n") == 1 and "No space left on device" in said, said
        assert [p.name for p in runtime.root.iterdir()] == ["fr-big"]
        assert len(runtime.qemu_processes()) == qemus
        assert list(small.iterdir()) == []
        # Sharing the checkpoint's RAM, four fit where one private copy barely does.
        done = _fork(runtime, "--count", "4", "--id-prefix", "fr-s", "fr-big", "seed", env=env)
        assert done.returncode == 0, done.stderr
        for i in range(1, 5):
            assert report(runtime, f"fr-s{i}")["mem"] == "ok"
        for i in range(1, 5):
            runtime("delete", "--force", f"fr-s{i}", check=True)
        assert list(small.iterdir()) == []
    finally:
        for cid in (p.name for p in runtime.root.iterdir()):
            runtime("delete", "--force", cid)
        subprocess.run(["umount", "-l", str(small)], capture_output=True)
    runtime.assert_no_leaks()
